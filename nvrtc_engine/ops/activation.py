"""Activation family: element-wise activations with high-precision or tensor-scaled FP8 output.

Template: ``templates/activation.cu.j2``. Math: see ``templates/include/nve_act.cuh`` and
:mod:`nvrtc_engine.reference`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import driver
from ..errors import ArgumentError
from ..interop import stream_handle
from ..kernel import Kernel
from .base import OpSpec

if TYPE_CHECKING:
    from ..key import KernelKey

__all__ = [
    "ACTIVATION_SPECS",
    "ActivationKernel",
    "ActivationSpec",
    "LaunchConfig",
    "launch_config",
]

MAX_GRID = 2**31 - 1  # CUDA's limit on gridDim.x; the kernel loops over what is left


@dataclass(frozen=True)
class LaunchConfig:
    """Threads per block and 16-byte input chunks per thread; the grid covers the data in
    one pass (one block per ``threads * unroll`` chunks).

    Measured on the H200 (bench/activation_tuning.py, 16384 x 8192 bf16, see
    docs/performance.md): a single pass beat a grid capped at 4-16 blocks per SM and looped
    over, for every block size (the capped loop reached 75% of copy bandwidth even for the
    identity function, one pass 88-90%). Without amax, small blocks with one chunk each
    are best (128 x 1: 91.5% of copy for GELU bf16->bf16). With tensor scaling every
    block ends with an atomicMax on the one amax word, so blocks must be few: 512 threads x
    4 chunks (75.8%, against 45% for 128 x 1).
    """

    threads: int
    unroll: int


def launch_config(key: KernelKey) -> LaunchConfig:
    """The activation family's launch configuration for ``key`` (see :class:`LaunchConfig`)."""
    if key.scaling == "tensor":
        return LaunchConfig(threads=512, unroll=4)
    return LaunchConfig(threads=128, unroll=1)


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
        cfg = launch_config(key)
        ctx.update(
            act=self.device_fn,
            threads=cfg.threads,
            unroll=cfg.unroll,
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

    _params = driver.ParamPack("PPqPPPi")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        key = self.key
        cfg = launch_config(key)
        self._in = key.input
        self._out = key.output
        self._threads = cfg.threads
        self._per_block = cfg.threads * cfg.unroll * (16 // key.input.itemsize)
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
            scale_ptr, amax_ptr, scale_inv_ptr = self._tensor_scaling(scale, amax, scale_inv, xa)
        elif scale is not None or amax is not None or scale_inv is not None:
            raise ArgumentError("scale", f"{key} has no scaling; scale/amax/scale_inv are only "
                                "for tensor-scaled FP8 outputs")  # fmt: skip
        n = xa.numel
        if n == 0:
            return out
        handle = stream_handle(stream, xa)
        loaded = self.loaded(xa.device)
        aligned = ((xa.ptr | oa.ptr) & 15) == 0
        per_block = self._per_block if aligned else self._threads
        grid = min(-(-n // per_block), MAX_GRID)
        params = self._params.pack(xa.ptr, oa.ptr, n, scale_ptr, amax_ptr, scale_inv_ptr,
                                   int(aligned))  # fmt: skip
        driver.make_current(loaded.device)
        driver.launch(loaded.handles[0], grid, self._threads, handle, params)
        return out


ACTIVATION_SPECS: tuple[ActivationSpec, ...] = (
    ActivationSpec("gelu", "gelu", "tanh-approximated GELU, as in TransformerEngine"),
)
