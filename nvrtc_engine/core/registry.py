"""The op registry: every op the engine can build, one spec each, listed explicitly."""

from __future__ import annotations

from ..errors import VariantError, VariantTypeError, did_you_mean
from .activation import ACTIVATION_SPECS
from .base import OpSpec
from .cast import CAST_SPECS
from .norm import NORM_SPECS

__all__ = ["OpSpec", "get_spec", "registered_ops"]

_REGISTRY: dict[str, OpSpec] = {
    spec.name: spec for spec in (*ACTIVATION_SPECS, *NORM_SPECS, *CAST_SPECS)
}


def registered_ops() -> tuple[str, ...]:
    """Names of every op, sorted."""
    return tuple(sorted(_REGISTRY))


def get_spec(op: str) -> OpSpec:
    """The spec of ``op``, named in any case (``GELU`` is ``gelu``); ``spec.name`` is the
    canonical lower-case name. Raises :class:`~nvrtc_engine.VariantError` listing known ops,
    with the closest one for a misspelled name, or for a kernel name (``str(key)``) the way
    to pass it."""
    spec = _REGISTRY.get(op) if isinstance(op, str) else None
    if spec is None and isinstance(op, str):
        spec = _REGISTRY.get(op.strip().lower())
    if spec is None:
        ops = registered_ops()
        if not isinstance(op, str):
            raise VariantTypeError("op", op, ops, "not a string")
        text = op.strip().lower()
        hint = _kernel_name_hint(text) or did_you_mean(text, ops, n=2)  # gleu: glu or gelu
        raise VariantError("op", op, ops, hint)
    return spec


def _kernel_name_hint(text: object) -> str:
    """The hint for a whole kernel name given as the op, or ``""``."""
    from ..key import KernelKey  # (an error path; key.py imports this module)

    if not isinstance(text, str):
        return ""
    try:
        KernelKey.parse(text)
    except VariantError:
        return ""
    return "a kernel name, not an op: pass ne.KernelKey.parse(name) to get_kernel"
