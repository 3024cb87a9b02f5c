"""What the cast / transpose family's kernels share: matrix and byte-array arguments,
tensor-scaling buffers, and the launch call.

Every check here raises :class:`~nvrtc_engine.ArgumentError` or
:class:`~nvrtc_engine.ArgumentTypeError` naming the argument, before anything is launched.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...core import driver
from ...core.errors import ArgumentError, VariantError
from ...core.interop import Array, allocate_bytes, as_array
from ...core.kernel import Kernel

if TYPE_CHECKING:
    from ...core.key import KernelKey
    from ...core.spec import OpSpec

__all__ = [
    "BYTE_DTYPES",
    "INT32_MAX",
    "CastKernelBase",
    "aligned16",
    "ceil_div",
    "validate_sets",
]

INT32_MAX = 2**31 - 1
# Arrays whose elements are single bytes (uint8 storage, FP8, packed FP4): what the engine
# accepts for E8M0 / E4M3 scale bytes and packed E2M1 data.
BYTE_DTYPES = frozenset({"fp8_e4m3", "fp8_e5m2", "fp4_e2m1"})


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def validate_sets(spec: OpSpec, key: KernelKey) -> None:
    """Check the key's dtypes, scaling and layout against the spec's closed sets only (for
    specs whose dtype/scaling rules differ from :meth:`OpSpec.validate`'s)."""
    for field, value, allowed in (
        ("in_dtype", key.in_dtype, spec.in_dtypes),
        ("out_dtype", key.out_dtype, spec.out_dtypes),
        ("scaling", key.scaling, spec.scalings),
        ("layout", key.layout, spec.layouts),
    ):
        if value not in allowed:
            raise VariantError(field, value, allowed, f"for op {spec.name!r}")


def aligned16(*ptrs: int) -> bool:
    """Whether every pointer is a multiple of 16 bytes (0 counts as aligned)."""
    acc = 0
    for p in ptrs:
        acc |= p
    return (acc & 15) == 0


class CastKernelBase(Kernel):
    """Shared argument handling of the cast / transpose / quantize kernels. Their ``config``
    (``Kernel.config``) is the ``TileConfig`` of :func:`nvrtc_engine.families.cast.spec.tile_config`
    (transpose, the cast-transpose kernels) or the ``QuantizeConfig`` of
    :func:`nvrtc_engine.families.cast.quantize.quantize_config` (``quantize``)."""

    def _matrix(self, a: Array, name: str) -> tuple[int, int]:
        """``(rows, cols)`` of a 2-D array; checks the key's ``hidden_size`` against cols."""
        if len(a.shape) != 2:
            raise ArgumentError(
                name, f"must be 2-D (rows, cols), got shape {a.shape}; reshape it, e.g. "
                "x.reshape(-1, x.shape[-1])",
            )  # fmt: skip
        rows, cols = a.shape
        hidden = self.key.hidden_size
        if hidden is not None and cols != hidden:
            raise ArgumentError(
                name, f"has {cols} columns, but this kernel is specialized for "
                f"hidden_size={hidden} (use hidden_size=None for any size)",
            )  # fmt: skip
        return rows, cols

    def _same_device(self, a: Array, name: str, like: Array) -> None:
        if a.device != like.device:
            raise ArgumentError(name, f"is on device {a.device}, the input on {like.device}")

    def _bytes(self, obj: Any, name: str, like: Array, shape: tuple[int, ...]) -> tuple[Any, Array]:
        """A byte array (uint8 storage) of exactly ``shape``; allocated (uninitialized) with
        the input's library when ``obj`` is None."""
        if obj is None:
            obj = allocate_bytes(like, shape, name)
        a = as_array(obj, name)
        if not BYTE_DTYPES.intersection(a.dtypes):
            raise ArgumentError(name, f"must hold bytes (uint8), got {a.dtype_text}")
        if not a.contiguous:
            raise ArgumentError(name, "must be C-contiguous")
        if a.shape != shape:
            raise ArgumentError(name, f"has shape {a.shape}; expected {shape}")
        if a.device < 0:
            a.device = _device_of(a, name)
        self._same_device(a, name, like)
        return obj, a


def _device_of(a: Array, name: str) -> int:
    try:
        return driver.pointer_device(a.ptr)
    except ValueError as exc:
        raise ArgumentError(name, str(exc)) from None
