"""Activation family: every activation of TransformerEngine, forward and backward, plain and
gated, and the plain cast (the identity activation); see :mod:`.spec`. Template:
``templates/activation.cu.j2``; reference: :mod:`.reference`."""

from .spec import ACTIVATION_SPECS, CAST_SPEC

SPECS = (*ACTIVATION_SPECS, CAST_SPEC)
