"""Norm family: LayerNorm and RMSNorm, forward and backward (:mod:`.spec`), their host code
(:mod:`.kernels`), configuration as data (:mod:`.config`) and reference (:mod:`.reference`).
Templates: ``templates/norm*.j2``."""

from .spec import NORM_SPECS

SPECS = NORM_SPECS
