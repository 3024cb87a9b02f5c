"""Activation family: element-wise activations with high-precision or tensor-scaled FP8 output.

Template: ``templates/activation.cu.j2``. Math: see ``templates/include/nve_act.cuh`` and
:mod:`nvrtc_engine.reference`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import driver
from ..errors import ArgumentError
from ..interop import stream_handle
from ..kernel import Kernel
from .base import OpSpec

if TYPE_CHECKING:
    from ..key import KernelKey

__all__ = ["ACTIVATION_SPECS", "ActivationKernel", "ActivationSpec"]

# Launch configuration: 256 threads, each with 4 chunks of 16 input bytes in flight
# (64 bytes per thread, 16 KiB per block), grid capped at 8 blocks per SM (full occupancy
# at 256 threads) and looped over: enough bytes in flight to cover HBM latency on Hopper,
# and few enough blocks that the amax atomics (one per block) stay negligible.
_THREADS = 256
_UNROLL = 4


class ActivationSpec(OpSpec):
    """An element-wise activation ``y = act(x)`` over a contiguous array of any shape.

    ``hidden_size`` (if given) must equal the last dimension of ``x``; element-wise ops use
    the same code for any size, so it only checks the shape.
    """

    family = "activation"

    def __init__(self, name: str, device_fn: str, doc: str) -> None:
        self.name = name
        self.device_fn = device_fn
        self.doc = doc

    def render_context(self, key: KernelKey) -> dict[str, Any]:
        ctx = super().render_context(key)
        ctx.update(
            act=self.device_fn,
            threads=_THREADS,
            unroll=_UNROLL,
            vec=16 // key.input.itemsize,
            tensor_scaling=key.scaling == "tensor",
        )
        return ctx

    def kernel_class(self) -> type[Kernel]:
        return ActivationKernel


class ActivationKernel(Kernel):
    """``y = act(x)``, optionally FP8 with per-tensor scaling.

    Call: ``kernel(x, out=None, *, scale=None, amax=None, scale_inv=None, stream=None)``.

    Args:
        x: CUDA array of ``in_dtype``, any shape ``(..., hidden_size)``, C-contiguous.
        out: CUDA array of ``out_dtype`` and ``x``'s shape (FP8 may be uint8 storage); when
            omitted it is allocated with ``x``'s library (torch or CuPy).
        scale: tensor scaling only: fp32 device array, element 0 is the scale.
        amax: tensor scaling only: fp32 device array; element 0 is max-reduced (atomically)
            with ``max|act(x)|`` before scaling. Zero it before the first launch.
        scale_inv: tensor scaling only, optional: fp32 device array; element 0 gets ``1/scale``.
        stream: where to launch (see :mod:`nvrtc_engine.interop`).

    Returns ``out``. Raises :class:`~nvrtc_engine.ArgumentError` /
    :class:`~nvrtc_engine.ArgumentTypeError` before launching when an argument is wrong.
    """

    threads = _THREADS
    _params = driver.ParamPack("PPqPPPi")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        key = self.key
        self._in = key.input
        self._out = key.output
        self._vec = 16 // key.input.itemsize
        self._per_block = _THREADS * _UNROLL * self._vec
        self._tensor = key.scaling == "tensor"

    def __call__(
        self,
        x: Any,
        out: Any = None,
        *,
        scale: Any = None,
        amax: Any = None,
        scale_inv: Any = None,
        stream: Any = None,
    ) -> Any:
        xa = self._input(x, "x", self._in)
        shape = xa.shape
        key = self.key
        if not shape:
            raise ArgumentError("x", "must have at least one dimension")
        if key.hidden_size is not None and shape[-1] != key.hidden_size:
            raise ArgumentError(
                "x", f"last dimension is {shape[-1]}, but this kernel is specialized for "
                f"hidden_size={key.hidden_size} (use hidden_size=None for any size)",
            )  # fmt: skip
        out, oa = self._output(out, "out", xa, shape, self._out)
        scale_ptr = amax_ptr = scale_inv_ptr = 0
        if self._tensor:
            if scale is None:
                raise ArgumentError("scale", f"is required for tensor-scaled {key.out_dtype} "
                                    "output (fp32 device array, element 0)")  # fmt: skip
            if amax is None:
                raise ArgumentError("amax", "is required for tensor scaling (fp32 device array "
                                    "to max-reduce into; zero it first)")  # fmt: skip
            scale_ptr = self._scalar_buffer(scale, "scale", xa)
            amax_ptr = self._scalar_buffer(amax, "amax", xa)
            if scale_inv is not None:
                scale_inv_ptr = self._scalar_buffer(scale_inv, "scale_inv", xa)
        elif scale is not None or amax is not None or scale_inv is not None:
            raise ArgumentError("scale", f"{key} has no scaling; scale/amax/scale_inv are only "
                                "for tensor-scaled FP8 outputs")  # fmt: skip
        n = xa.numel
        if n == 0:
            return out
        handle = stream_handle(stream, xa)
        loaded = self.loaded(xa.device)
        aligned = ((xa.ptr | oa.ptr) & 15) == 0
        per_block = self._per_block if aligned else _THREADS
        grid = min(-(-n // per_block), loaded.max_blocks)
        params = self._params.pack(xa.ptr, oa.ptr, n, scale_ptr, amax_ptr, scale_inv_ptr,
                                   int(aligned))  # fmt: skip
        driver.make_current(loaded.device)
        driver.launch(loaded.functions[0], grid, _THREADS, handle, params)
        return out


ACTIVATION_SPECS: tuple[ActivationSpec, ...] = (
    ActivationSpec("gelu", "gelu", "tanh-approximated GELU, as in TransformerEngine"),
)
