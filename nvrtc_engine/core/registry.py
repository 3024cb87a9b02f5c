"""The op registry: every op the engine can build, by family, listed explicitly.

:data:`FAMILIES` is the one table: a family's module and the names of the ops it defines, one
entry per family. A family is imported on first use of one of its ops (``importlib``), or by
:func:`load_families`, which the API's import calls: importing the package imports no family,
and ``make_key("gelu", ...)`` alone imports the activation family only. A family module
defines ``SPECS``, a tuple of :class:`~nvrtc_engine.core.spec.OpSpec` (one per op, named as
in its entry here).

Importing this module installs it as the registry :class:`~nvrtc_engine.KernelKey` validates
through (:func:`nvrtc_engine.core.key.use_registry`); the key module does not import it.
"""

from __future__ import annotations

import importlib
import threading
from typing import TYPE_CHECKING

from . import key as _key
from .errors import VariantError, VariantTypeError, did_you_mean

if TYPE_CHECKING:
    from .spec import OpSpec

__all__ = ["FAMILIES", "get_spec", "load_families", "register_family", "registered_ops"]

# family module -> its ops (space-separated); adding a family is one entry here
FAMILIES: dict[str, str] = {
    "nvrtc_engine.families.activation": (
        "gelu qgelu silu relu srelu sigmoid cast dgelu dqgelu dsilu drelu dsrelu dsigmoid "
        "glu geglu qgeglu swiglu reglu sreglu clamped_swiglu dglu dgeglu dqgeglu dswiglu dreglu "
        "dsreglu dclamped_swiglu"
    ),
    "nvrtc_engine.families.norm": (
        "layernorm_fwd layernorm_bwd rmsnorm_fwd rmsnorm_bwd rmsnorm_bwd_add"
    ),
    "nvrtc_engine.families.cast": (
        "quantize transpose cast_transpose cast_transpose_dbias cast_transpose_dbias_dgelu "
        "cast_transpose_dbias_dqgelu cast_transpose_dbias_dsilu cast_transpose_dbias_drelu "
        "cast_transpose_dbias_dsrelu dgeglu_cast_transpose dqgeglu_cast_transpose "
        "dswiglu_cast_transpose dreglu_cast_transpose dsreglu_cast_transpose multi_cast_transpose"
    ),
}

_family_of: dict[str, str] = {}  # op -> family module, from FAMILIES
_specs: dict[str, OpSpec] = {}  # op -> spec, for the families imported so far
_lock = threading.Lock()


def register_family(module: str, ops: str) -> None:
    """Add a family: ``module`` (an importable module path defining ``SPECS``) and its ops'
    names, space-separated; what an entry of :data:`FAMILIES` does, for a family outside the
    package. Nothing is imported until one of its ops is used.

    Raises:
        ValueError: if an op is already registered by another family.
    """
    with _lock:
        _index(module, ops)
        FAMILIES[module] = ops


def _index(module: str, ops: str) -> None:
    for op in ops.split():
        other = _family_of.get(op)
        if other is not None and other != module:
            raise ValueError(f"op {op!r} of {module} is already registered by {other}")
        _family_of[op] = module


def registered_ops() -> tuple[str, ...]:
    """Names of every op, sorted (imports no family)."""
    return tuple(sorted(_family_of))


def _load(module: str) -> None:
    """Import a family and index its specs; checks them against its entry."""
    specs = importlib.import_module(module).SPECS
    names = {spec.name for spec in specs}
    listed = {op for op, family in _family_of.items() if family == module}
    if names != listed:
        raise RuntimeError(
            f"family {module} defines the ops {sorted(names)} but is registered with "
            f"{sorted(listed)}: make its entry in FAMILIES list its ops"
        )
    with _lock:
        for spec in specs:
            _specs[spec.name] = spec


def load_families() -> None:
    """Import every family registered so far, as their ops' first use would (the API's import
    does this for the built-in ones: a key is then checked without importing anything)."""
    for module, ops in list(FAMILIES.items()):
        if ops.split()[0] not in _specs:
            _load(module)


def get_spec(op: str) -> OpSpec:
    """The spec of ``op``, named in any case (``GELU`` is ``gelu``); ``spec.name`` is the
    canonical lower-case name. Imports the op's family on first use. Raises
    :class:`~nvrtc_engine.VariantError` listing known ops, with the closest one for a
    misspelled name, or for a kernel name (``str(key)``) the way to pass it."""
    spec = _specs.get(op) if isinstance(op, str) else None
    if spec is not None:
        return spec
    if not isinstance(op, str):
        raise VariantTypeError("op", op, registered_ops(), "not a string")
    text = op.strip().lower()
    module = _family_of.get(text)
    if module is None:
        ops = registered_ops()
        hint = _kernel_name_hint(text) or did_you_mean(text, ops, n=2)  # gleu: glu or gelu
        raise VariantError("op", op, ops, hint)
    if text not in _specs:
        _load(module)
    return _specs[text]


def _kernel_name_hint(text: str) -> str:
    """The hint for a whole kernel name given as the op, or ``""``."""
    try:
        _key.KernelKey.parse(text)
    except VariantError:
        return ""
    return "a kernel name, not an op: pass ne.KernelKey.parse(name) to get_kernel"


for _module, _ops in FAMILIES.items():
    _index(_module, _ops)
_key.use_registry(get_spec, registered_ops)
