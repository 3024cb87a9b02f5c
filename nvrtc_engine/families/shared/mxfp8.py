"""MXFP8 outputs of a kernel: binding a :class:`~.blockscale.BlockScaledOutput` to a launch.

A kernel with ``scaling="mxfp8"`` writes FP8 data in the output's shape and E8M0 scale bytes
in TransformerEngine's compact layout (:mod:`.blockscale`), for the directions of its
``layout``: ``rowwise``, ``columnwise`` or ``both``. The caller may pass any of the
buffers; the kernel allocates the others with the input's library (torch or CuPy). Scale
tensors it allocates have the padded shape and are zeroed on the launch stream, so their
padding holds zeros; kernels write only the unpadded region of a scale tensor.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from ...core import driver
from ...core.errors import ArgumentError, ArgumentTypeError
from ...core.interop import Array, allocate_bytes, as_array
from .blockscale import BlockScaledOutput, mxfp8_scale_shape

if TYPE_CHECKING:
    from collections.abc import Callable

    from ...core.dtypes import DType

__all__ = ["BoundMXFP8", "MXFP8Output", "bind_mxfp8_output", "zero_fresh_scales"]


MXFP8Output = BlockScaledOutput  # the name MXFP8 activations' outputs had; one type


class BoundMXFP8(NamedTuple):
    """What a launch needs from a :class:`BlockScaledOutput`: device pointers (0 for a
    direction not written), scale row strides in bytes, and the scale tensors allocated here
    (``(pointer, bytes)``, to zero on the launch stream with :func:`zero_fresh_scales`)."""

    result: BlockScaledOutput
    rowwise: int
    rowwise_scale: int
    rowwise_scale_stride: int
    columnwise: int
    columnwise_scale: int
    columnwise_scale_stride: int
    fresh: tuple[tuple[int, int], ...]


_DIRECTIONS = {"rowwise": ("rowwise",), "columnwise": ("columnwise",),
               "both": ("rowwise", "columnwise")}  # fmt: skip


def _is_bytes(a: Array) -> bool:
    # uint8 arrays describe themselves as raw FP8 storage (both formats); torch also has a
    # dedicated E8M0 dtype.
    return set(a.dtypes) == {"fp8_e4m3", "fp8_e5m2"} or a.dtype_text == "torch.float8_e8m0fnu"


def _scale_buffer(
    obj: Any, name: str, like: Array, rows: int, cols: int, direction: str
) -> tuple[Any, int, int, bool]:
    """(array, pointer, row stride in bytes, allocated here) for one scale tensor."""
    padded = mxfp8_scale_shape(rows, cols, direction)
    if obj is None:
        obj = allocate_bytes(
            like, padded, name, "the MXFP8 scales (pass a BlockScaledOutput with every buffer)"
        )
        return obj, as_array(obj, name).ptr, padded[1], True
    a = as_array(obj, name)
    if not _is_bytes(a):
        raise ArgumentError(name, f"has dtype {a.dtype_text}; E8M0 scales are uint8")
    compact = mxfp8_scale_shape(rows, cols, direction, padded=False)
    if a.shape not in (padded, compact):
        raise ArgumentError(name, f"has shape {a.shape}; expected {padded} (padded, as "
                            f"TransformerEngine allocates it) or {compact}")  # fmt: skip
    if not a.contiguous:
        raise ArgumentError(name, "must be C-contiguous")
    if a.device < 0:
        try:
            a.device = driver.pointer_device(a.ptr)
        except ValueError as exc:
            raise ArgumentError(name, str(exc)) from None
    if a.device != like.device:
        raise ArgumentError(name, f"is on device {a.device}, the input on {like.device}")
    return obj, a.ptr, a.shape[1], False


def bind_mxfp8_output(
    out: Any,
    like: Array,
    shape: tuple[int, ...],
    dtype: DType,
    layout: str,
    output: Callable[[Any, str, Array, tuple[int, ...], DType], tuple[Any, Array]],
) -> BoundMXFP8:
    """Check or allocate the MXFP8 buffers of an output of ``shape`` and ``dtype``.

    ``out`` is None or a :class:`BlockScaledOutput` (or any 4-tuple in the order of its
    first four fields); its None fields of the layout's directions are allocated. ``output``
    checks or allocates one data array (``Kernel._output``). Raises
    :class:`~nvrtc_engine.ArgumentError` naming the buffer (``out.rowwise_scale_inv``, ...)
    when one has the wrong shape, dtype or device, or when ``out`` holds a buffer of a
    direction the layout does not write.
    """
    if out is None:
        given = BlockScaledOutput()
    elif isinstance(out, BlockScaledOutput):
        given = out
    elif isinstance(out, tuple) and len(out) == 4:
        given = BlockScaledOutput(*out)
    else:
        raise ArgumentTypeError("out", "for MXFP8 output, expected None or a BlockScaledOutput, "
                                f"got {type(out).__name__}")  # fmt: skip
    directions = _DIRECTIONS[layout]
    for direction in ("rowwise", "columnwise"):
        buffers = (getattr(given, direction + "_data"), getattr(given, direction + "_scale_inv"))
        if direction not in directions and any(b is not None for b in buffers):
            raise ArgumentError(
                f"out.{direction}_data",
                f"is given, but this kernel's layout is {layout!r}; it writes only "
                f"{' and '.join(directions)}",
            )
    rows = 1
    for s in shape[:-1]:
        rows *= s
    cols = shape[-1]
    fields: dict[str, Any] = {}
    ptrs = {"rowwise": (0, 0, 0), "columnwise": (0, 0, 0)}
    fresh = []
    for direction in directions:
        data, da = output(getattr(given, direction + "_data"), f"out.{direction}_data", like,
                          shape, dtype)  # fmt: skip
        name = f"out.{direction}_scale_inv"
        scale, sptr, stride, new = _scale_buffer(
            getattr(given, direction + "_scale_inv"), name, like, rows, cols, direction
        )
        if new:
            h, w = mxfp8_scale_shape(rows, cols, direction)
            fresh.append((sptr, h * w))
        fields[direction + "_data"] = data
        fields[direction + "_scale_inv"] = scale
        ptrs[direction] = (da.ptr, sptr, stride)
    return BoundMXFP8(
        BlockScaledOutput(**fields), *ptrs["rowwise"], *ptrs["columnwise"], tuple(fresh)
    )


def zero_fresh_scales(bound: BoundMXFP8, stream: int) -> None:
    """Zero the scale tensors allocated by :func:`bind_mxfp8_output`, on ``stream`` (so that
    the zeroing is ordered before the kernel). The device's context must be current."""
    drv = driver._drv()
    for ptr, nbytes in bound.fresh:
        driver.check(drv.cuMemsetD8Async(ptr, 0, nbytes, stream), "cuMemsetD8Async")
