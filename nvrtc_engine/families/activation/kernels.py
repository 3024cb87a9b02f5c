"""Activation family, host side: the kernel structures' configurations (:class:`LaunchConfig`,
:class:`ActivationConfig`, the shared :class:`TileConfig`), their parameters and the kernel
classes that check arguments and launch (:class:`ActivationKernel`, ...). Imported when a
kernel is made or rendered (:meth:`~.spec.ActivationSpec.kernel_class`,
:meth:`~.spec.ActivationSpec.render_context`): validating a key, or finding a cached kernel's
digest, needs :mod:`.spec` only."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, NamedTuple

from ...core import driver
from ...core.errors import ArgumentError, ArgumentTypeError
from ...core.interop import Array, stream_handle
from ...core.kernel import Kernel
from ...core.signature import CallArgs, Signature, i32, i64, ptr
from ..shared.blockscale import MXFP8_BLOCK, BlockScaledOutput
from ..shared.mxfp8 import MXFP8Output, bind_mxfp8_output, zero_fresh_scales
from ..shared.tiles import (
    MAX_GRID,
    TILE,
    TileConfig,
    fp32_literal,
    tile_config,
    tile_render_context,
)

if TYPE_CHECKING:
    from ...core.key import KernelKey
    from .spec import ActivationSpec

__all__ = [
    "CLAMPED_SWIGLU_ALPHA",
    "CLAMPED_SWIGLU_LINEAR_OFFSET",
    "FLAT",
    "FLAT_GRAD",
    "ROWS",
    "TILE",
    "ActivationConfig",
    "ActivationGradKernel",
    "ActivationKernel",
    "ClampedSwiGLUGradKernel",
    "ClampedSwiGLUKernel",
    "LaunchConfig",
    "MXFP8Output",
    "TileConfig",
    "fp32_literal",
    "launch_config",
    "magic",
    "row_config",
    "tile_config",
    "tile_render_context",
]

CLAMPED_SWIGLU_ALPHA = 1.702  # clamped SwiGLU's defaults (run-time arguments of its kernels)
CLAMPED_SWIGLU_LINEAR_OFFSET = 1.0

# The flat and row-flat kernels' parameters (templates/activation.cu.j2); the tiled kernel's
# are shared (..shared.tiles.TILE).
FLAT = Signature(
    ptr("x", "In::storage", const=True), ptr("y", "Out::storage"), i64("n"),
    ptr("scale_ptr", "float", const=True), ptr("amax_ptr", "float"), ptr("scale_inv_ptr", "float"),
    i32("aligned"),
)  # fmt: skip
FLAT_GRAD = FLAT.extend(ptr("grad", "In::storage", const=True))
ROWS = TILE.extend(i64("ur"), i64("uq"), i64("sr"), i64("sq"), i64("div_magic_arg"),
                   i32("div_shift_arg"), i32("compact"))  # fmt: skip
# A call's arguments, in the order every activation kernel hands them to the launch, and the
# call key tags of the calls without scaling arguments (Kernel._fast1...)
_ARGS = CallArgs(("grad", "x", "out", "scale", "amax", "scale_inv"),
                 ("limit", "alpha", "linear_offset"))  # fmt: skip
_X, _X_OUT = _ARGS.mask("x"), _ARGS.mask("x", "out")
_GRAD_X, _GRAD_X_OUT = _ARGS.mask("grad", "x"), _ARGS.mask("grad", "x", "out")


class LaunchConfig(NamedTuple):
    """Flat and row-flat kernels: threads per block and input chunks per thread; the grid
    covers the data in one pass (one block per ``threads * unroll`` chunks).
    :func:`launch_config` gives the flat kernel's (plain ops, ``none``/``tensor``),
    :func:`row_config` the row-flat kernel's (gated ops, MXFP8 rowwise).

    A chunk is 16 input bytes (one access). FP8 outputs are stored as 32-bit words built from
    the paired conversions (``nve::convert_fp8_words``), not a byte array the compiler repacks
    byte by byte: the same bytes, fewer instructions (count them in the sm_90 SASS with
    ``bench/tuning/sass.py gelu dtype=fp8``).

    The flat kernel's, measured on the H200 (16384 x 8192 bf16; today's figures in
    docs/performance.md, ``bench/bandwidth.py activation``): a single
    pass beat a grid capped at 4-16 blocks per SM and looped over, for every block size (the
    capped loop reached 75% of copy bandwidth even for the identity function, one pass
    88-90%). Without amax, small blocks with one chunk each are best (128 x 1: 91.5% of copy
    for GELU bf16->bf16). With tensor scaling every block ends with an atomicMax on the one
    amax word, so blocks must be few: 512 threads x 4 chunks (75.8%, against 45% for 128 x
    1). 32-byte chunks, streaming cache hints and an unguarded amax atomic measured no better
    in the bandwidth benchmarks (92-93% of copy against 96-101% for 512 x 4) and were removed.
    """

    threads: int
    unroll: int
    # Row-flat kernel, plain ops with MXFP8 rowwise output only: each thread owns whole
    # 32-value blocks (``unroll`` of them: 64 contiguous bf16 bytes in, 32 FP8 bytes out, one
    # E8M0 scale, no shuffles) instead of one 16-byte chunk per lane.
    owner: bool = False

    def vec(self, itemsize: int) -> int:
        """Elements per 16-byte chunk."""
        return 16 // itemsize


def launch_config(key: KernelKey) -> LaunchConfig:
    """The flat kernel's launch configuration for ``key`` (see :class:`LaunchConfig`)."""
    if key.scaling == "tensor":
        return LaunchConfig(threads=512, unroll=4)
    return LaunchConfig(threads=128, unroll=1)


def magic(d: int) -> tuple[int, int]:
    """The magic pair ``(m, s)`` for unsigned division by ``d`` (1 <= d < 2^31) of any
    ``0 <= n < 2^31``: ``n // d == (((n * m) >> 32) + n) >> s`` (``nve::magic_div``), with
    ``s = ceil(log2 d)`` and ``m = floor(2^32 (2^s - d) / d) + 1`` (Granlund and Montgomery's
    round-up method; ``m`` is never 0, which the kernels read as "no magic")."""
    if not 1 <= d < 2**31:
        raise ValueError(f"divisor must be in [1, 2^31), got {d}")
    s = (d - 1).bit_length()
    return (2**32 * (2**s - d)) // d + 1, s


def row_config(key: KernelKey) -> LaunchConfig:
    """The row-flat kernel's configuration for ``key`` (gated and dgated ops without MXFP8,
    MXFP8 rowwise outputs): threads per block and 16-byte input chunks in flight per thread
    (an MXFP8 block of 32 values is whole chunks). The grid covers the chunks in one pass.

    Chosen by sweeps on the H200 (bf16 input, 16384 x 8192 outputs, gated inputs 2 x 8192,
    % of copy bandwidth; the figures of the chosen shapes today: ``bench/bandwidth.py
    activation``, bench/results/activation_bandwidth.json):

    - no scaling: 256 threads x 1 chunk (swiglu 102.7%, geglu 103.1%, dswiglu 102.3%);
    - tensor scaling: 128 x 4 (swiglu 102.1%; 1024 x 1 gave 70.5%: every block's amax
      atomic costs);
    - MXFP8 rowwise, gated ops: 128 x 2 (swiglu 100.0% against 99.3% for 128 x 4); their
      gradients 128 x 4 (dswiglu 101.5%);
    - MXFP8 rowwise, plain ops with 16-bit input: ``owner`` mode, 128 x 2 (gelu 96.5%, dgelu
      100.6%, against 95.3% / 99.2% in lane mode). Other input dtypes keep lane mode.
    """
    if key.scaling == "none":
        return LaunchConfig(threads=256, unroll=1)
    kind = getattr(key.spec, "kind", None)  # (an ActivationSpec's; no other spec has one)
    if key.scaling == "mxfp8" and kind in ("act", "dact") and key.input.itemsize == 2:
        return LaunchConfig(threads=128, unroll=2, owner=True)
    if key.scaling == "mxfp8" and kind == "gated":
        return LaunchConfig(threads=128, unroll=2)
    return LaunchConfig(threads=128, unroll=4)


class ActivationConfig(NamedTuple):
    """An activation kernel's configuration, as ``kernel.config`` returns it: ``structure``,
    the kernel structure of its key (:meth:`ActivationSpec.structure`: ``flat``, ``rows`` for
    the row-flat kernel, ``tile``), and ``launch``, that structure's configuration as the
    kernel was rendered and is launched with: the :class:`LaunchConfig` of
    :func:`launch_config` (flat) or :func:`row_config` (rows), or the :class:`TileConfig` of
    :func:`tile_config` (tile).

    ``launch`` is the object those functions returned; ``owner`` acts on the row-flat
    kernel only.
    """

    structure: str
    launch: LaunchConfig | TileConfig

    @property
    def threads(self) -> int:
        """Threads per block (CTA)."""
        return self.launch.threads


class _Launcher(Kernel):
    """Argument binding and launch shared by every activation kernel class. Their ``config``
    (``Kernel.config``) is an :class:`ActivationConfig`, e.g. ``ActivationConfig(
    structure='flat', launch=LaunchConfig(threads=128, unroll=1, ...))``."""

    _config: ActivationConfig

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        key = self.key
        spec: ActivationSpec = key.spec  # type: ignore[assignment]
        self._in = key.input
        self._out = key.output
        self._kind = spec.kind
        self._gated = spec.gated
        self._backward = spec.backward
        self._tensor = key.scaling == "tensor"
        self._mx = key.scaling == "mxfp8"
        self._structure = spec.structure(key)
        self._vec = 16 // key.input.itemsize
        if self._structure == "tile":
            cfg = tile_config(key)
            self._threads = cfg.threads
            self._tile_rows = cfg.tile_rows()
            self._tile_cols = cfg.tile_cols(self._vec)
            self._config = ActivationConfig(self._structure, cfg)
        else:
            flat = launch_config(key) if self._structure == "flat" else row_config(key)
            self._vec = flat.vec(key.input.itemsize)
            self._threads = flat.threads
            self._unroll = flat.unroll
            self._owner = self._structure == "rows" and flat.owner
            # positions per block and iteration: chunks, or in owner mode 32-value blocks
            self._per_block = flat.threads * flat.unroll * (32 if self._owner else self._vec)
            self._config = ActivationConfig(self._structure, flat)

    # -- checks ---------------------------------------------------------------------------

    def _shapes(self, xa: Array) -> tuple[int, int, tuple[int, ...]]:
        """(rows, cols, output shape) of input ``x``; cols is H for gated ops."""
        shape = xa.shape
        key = self.key
        if not shape:
            raise ArgumentError("x", "must have at least one dimension")
        last = shape[-1]
        if self._gated:
            if last % 2:
                raise ArgumentError("x", f"last dimension is {last}; {key.op} takes "
                                    "(..., 2 * hidden_size), activation half first, so it "
                                    "must be even")  # fmt: skip
            cols = last // 2
        else:
            cols = last
        hs = key.hidden_size
        if hs is not None and cols != hs:
            size = f"2 * {hs} = {2 * hs}" if self._gated else str(hs)
            raise ArgumentError("x", f"last dimension is {last}, but this kernel is specialized "
                                f"for hidden_size={hs} (last dimension {size}; use "
                                "hidden_size=None for any size)")  # fmt: skip
        rows = math.prod(shape[:-1])
        out_shape = (*shape[:-1], cols) if self._kind == "gated" else shape
        if self._mx:
            self._check_mx_dims(rows, cols, out_shape)
        return rows, cols, out_shape

    def _check_mx_dims(self, rows: int, cols: int, out_shape: tuple[int, ...]) -> None:
        key = self.key
        what = "hidden size H" if self._gated else "last dimension"
        if cols % MXFP8_BLOCK:
            raise ArgumentError(
                "x",
                f"MXFP8 output needs the {what} to be a multiple of {MXFP8_BLOCK} "
                f"(32-element blocks along rows); it is {cols}",
            )
        if key.layout != "rowwise" and rows % MXFP8_BLOCK:
            raise ArgumentError("x", f"MXFP8 {key.layout} output needs the number of rows (the "
                                f"product of the leading dimensions of {out_shape}) to be a "
                                f"multiple of {MXFP8_BLOCK} (32-element blocks down columns); "
                                f"it is {rows}")  # fmt: skip

    def _grad(self, grad: Any, xa: Array, cols: int) -> Array:
        ga = self._input(grad, "grad", self._in)
        want = (*xa.shape[:-1], cols)
        if ga.shape != want:
            raise ArgumentError("grad", f"has shape {ga.shape}; expected {want} (the shape of "
                                f"{self.key.op}'s forward output)")  # fmt: skip
        if ga.device != xa.device:
            raise ArgumentError("grad", f"is on device {ga.device}, x on {xa.device}")
        return ga

    # -- launch ---------------------------------------------------------------------------

    def _grid(self, rows: int, cols: int, aligned: bool) -> int:
        """Blocks to launch for ``rows x cols`` positions (flat: ``rows`` = all elements,
        ``cols`` = 1): one pass over the chunks (``flat``, ``rows``; over the positions when
        not ``aligned``) or the tiles (``tile``), at most :data:`MAX_GRID` (the kernels loop
        over what is left)."""
        if self._structure == "tile":
            blocks = -(-rows // self._tile_rows) * -(-cols // self._tile_cols)
        elif aligned:  # rows: cols % vec == 0 here
            blocks = -(-(rows * cols) // self._per_block)
        else:
            blocks = -(-(rows * cols) // self._threads)
        return max(1, min(blocks, MAX_GRID))

    def _row_steps(self, rows: int, cols: int, grid: int, aligned: bool,
                   s_row_stride: int) -> dict[str, int]:  # fmt: skip
        """The row-flat kernel's per-shape values (all fixed by the call key), by parameter
        name: the steps
        ``(ur, uq)`` of ``threads`` chunks and ``(sr, sq)`` of one grid iteration as (rows,
        chunk columns), the magic pair for its one division per thread (by the chunks per
        row, in owner mode by the 32-value blocks per row; 0 when a dividend could reach
        2^31), and whether the MXFP8 scales are compact (row stride ``cols / 32``: block k
        has scale k)."""
        if not aligned:  # the per-position path divides by itself
            return dict.fromkeys(("ur", "uq", "sr", "sq", "div_magic_arg", "div_shift_arg",
                                  "compact"), 0)  # fmt: skip
        per = 32 if self._owner else self._vec
        cpr = cols // per
        units = rows * cpr
        stride = grid * self._threads * self._unroll
        ur, uq = divmod(self._threads, cpr)
        sr, sq = divmod(stride, cpr)
        m, s = magic(cpr) if units + stride < 2**31 else (0, 0)
        compact = int(self._mx and not self._gated and s_row_stride == cols // MXFP8_BLOCK)
        return dict(ur=ur, uq=uq, sr=sr, sq=sq, div_magic_arg=m, div_shift_arg=s,
                    compact=compact)  # fmt: skip

    def _call(self, grad: Any, x: Any, out: Any, scale: Any, amax: Any, scale_inv: Any,
              floats: tuple[float, ...], stream: Any) -> Any:  # fmt: skip
        """A call of any activation kernel class (``grad`` None for a forward op;
        ``floats``: clamped SwiGLU's ``(limit, alpha, linear_offset)``, else empty): through
        its call key's prepared launch if it has one (read by hand for the calls without
        scaling arguments), else the checked path (:meth:`_run`). ``ActivationKernel`` and
        ``ActivationGradKernel`` read those calls' keys in their ``__call__`` (a call of
        this method is a Python frame more per call)."""
        if scale is None and amax is None and scale_inv is None:
            if grad is None:
                if out is None:
                    done = self._fast1(_X, x, floats, stream)
                else:
                    done = self._fast2(_X_OUT, x, out, floats, stream)
            elif out is None:
                done = self._fast2(_GRAD_X, grad, x, floats, stream)
            else:
                done = self._fast3(_GRAD_X_OUT, grad, x, out, floats, stream)
        else:
            done = self._fastn((grad, x, out, scale, amax, scale_inv), floats, stream)
        if done is None:
            return self._run(grad, x, out, scale, amax, scale_inv, stream, floats)
        return out if out is not None else done[0]  # launched through its prepared launch

    def _run(self, grad: Any, x: Any, out: Any, scale: Any, amax: Any, scale_inv: Any,
             stream: Any, floats: tuple[float, ...]) -> Any:  # fmt: skip
        """The checked path of :meth:`_call`: check every argument, then launch."""
        given = (grad, x, out, scale, amax, scale_inv)
        prepared = True
        xa = self._input(x, "x", self._in)
        rows, cols, out_shape = self._shapes(xa)
        g_ptr = self._grad(grad, xa, cols).ptr if self._backward else 0
        bound = None
        if self._mx:
            prepared = False  # the scale tensors it allocates are zeroed first
            bound = bind_mxfp8_output(out, xa, out_shape, self._out, self.key.layout,
                                      self._output)  # fmt: skip
            out = bound.result
            y_ptr, y_col_ptr = bound.rowwise, bound.columnwise
            for name, ptr in (("x", xa.ptr), ("grad", g_ptr), ("out.rowwise_data", y_ptr),
                              ("out.columnwise_data", y_col_ptr)):  # fmt: skip
                if ptr & 15:
                    raise ArgumentError(name, "must be 16-byte aligned for MXFP8 output (the "
                                        "kernel moves 16-byte vectors)")  # fmt: skip
        else:
            if isinstance(out, BlockScaledOutput):
                raise ArgumentTypeError("out", f"{self.key} is not MXFP8; pass an array")
            out, oa = self._output(out, "out", xa, out_shape, self._out)
            y_ptr, y_col_ptr = oa.ptr, 0
        scale_ptr, amax_ptr, scale_inv_ptr = self._tensor_scaling(scale, amax, scale_inv, xa)
        if rows == 0 or cols == 0:
            return out
        a = _ARGS
        # MXFP8 outputs: their own addresses (these calls are not prepared)
        y, y_col = (y_ptr, y_col_ptr) if bound else (a.out, 0)
        scaling = dict(scale_ptr=a.scale, amax_ptr=a.amax, scale_inv_ptr=a.scale_inv)
        if self._structure != "flat":
            aligned = ((xa.ptr | g_ptr | y_ptr | y_col_ptr) & 15) == 0 and cols % self._vec == 0
            grid = self._grid(rows, cols, aligned)
            s_row = (bound.rowwise_scale, bound.rowwise_scale_stride) if bound else (0, 0)
            s_col = (bound.columnwise_scale, bound.columnwise_scale_stride) if bound else (0, 0)
            clamp = (a.limit, a.alpha, a.linear_offset) if floats else (0.0, 0.0, 0.0)
            values = dict(
                x=a.x, grad=a.grad, y=y, y_col=y_col, s_row=s_row[0], s_col=s_col[0], rows=rows,
                cols_arg=cols, s_row_stride=s_row[1], s_col_stride=s_col[1], **scaling,
                limit=clamp[0], alpha=clamp[1], linear_offset=clamp[2], aligned=int(aligned),
            )  # fmt: skip
            sig = TILE
            if self._structure == "rows":
                sig = ROWS
                values.update(self._row_steps(rows, cols, grid, aligned, s_row[1]))
        else:
            n = xa.numel
            aligned = ((xa.ptr | g_ptr | y_ptr) & 15) == 0
            grid = self._grid(n, 1, aligned)
            sig = FLAT_GRAD if self._backward else FLAT
            values = dict(x=a.x, y=y, n=n, **scaling, aligned=int(aligned))
            if self._backward:
                values["grad"] = a.grad
        if bound is not None and bound.fresh:  # zeroed on the launch stream, before the kernel
            handle = stream_handle(stream, xa)
            with driver.on_device(self.loaded(xa.device).device):
                zero_fresh_scales(bound, handle)
            stream = handle
        tensors = (grad, x, out, scale, amax, scale_inv)
        ptrs = (g_ptr, xa.ptr, y_ptr, scale_ptr, amax_ptr, scale_inv_ptr)
        launches = [(0, grid, self._threads, sig, sig.bind(**values))]
        self._submit(given, tensors, ptrs, floats, stream, xa, launches, prepared=prepared)
        return out


_FP32_OVERFLOW = 3.4028235677973366e38  # the least magnitude that rounds to inf in fp32


def _clamp_params(limit: Any, alpha: Any, linear_offset: Any) -> tuple[float, float, float]:
    """Clamped SwiGLU's float arguments, checked on every call: real numbers (no bool) that
    stay finite as fp32 (the kernels take them as fp32), ``limit`` > 0. Raises
    :class:`~nvrtc_engine.ArgumentTypeError` / :class:`~nvrtc_engine.ArgumentError`
    naming the argument."""
    if (type(limit) is float and type(alpha) is float and type(linear_offset) is float
            and 0.0 < limit < _FP32_OVERFLOW and abs(alpha) < _FP32_OVERFLOW
            and abs(linear_offset) < _FP32_OVERFLOW):  # fmt: skip
        return limit, alpha, linear_offset  # the common case, at once
    if limit is None:
        raise ArgumentError("limit", "is required for clamped SwiGLU (a float > 0, e.g. 7.0)")
    values = []
    for name, v in (("limit", limit), ("alpha", alpha), ("linear_offset", linear_offset)):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ArgumentTypeError(name, f"must be a real number, got {type(v).__name__}")
        try:
            value = float(v)
        except OverflowError:  # an int beyond any float
            value = math.inf
        if not abs(value) < _FP32_OVERFLOW:
            raise ArgumentError(name, f"must be finite as fp32 (magnitude below 3.4028235e+38; "
                                f"kernels take it as fp32), got {v}")  # fmt: skip
        values.append(value)
    if values[0] <= 0:
        raise ArgumentError("limit", f"must be > 0, got {limit}")
    return values[0], values[1], values[2]


class ActivationKernel(_Launcher):
    """A forward activation: ``y = act(x)`` (plain ops) or ``y = act(a) * b`` (gated ops).

    Call: ``kernel(x, out=None, *, scale=None, amax=None, scale_inv=None, stream=None)``.

    Args:
        x: CUDA array of ``in_dtype``, C-contiguous; plain ops: any shape
            ``(..., hidden_size)``; gated ops: ``(..., 2 * hidden_size)``, the activation
            input ``a`` in the first half of the last dimension, the linear input ``b`` in
            the second.
        out: plain ops: ``x``'s shape; gated ops: ``(..., hidden_size)``. An array of
            ``out_dtype`` (FP8 may be uint8 storage), or for MXFP8 a
            :class:`~nvrtc_engine.BlockScaledOutput` whose None fields are allocated; when
            omitted everything is allocated with ``x``'s library (torch or CuPy).
        scale: tensor scaling only: fp32 device array, element 0 is the scale.
        amax: tensor scaling only: fp32 device array; element 0 is max-reduced (atomically)
            with the max of ``|y|`` before scaling. Zero it before the first launch.
        scale_inv: tensor scaling only, optional: fp32 device array; element 0 gets ``1/scale``.
        stream: where to launch (see :mod:`nvrtc_engine.core.interop`).

    Returns ``out``: the array, or for MXFP8 a :class:`~nvrtc_engine.BlockScaledOutput`
    (``rowwise_data``/``columnwise_data`` in the output's shape, E8M0 ``rowwise_scale_inv``/
    ``columnwise_scale_inv`` in TransformerEngine's padded compact layout, see
    :mod:`nvrtc_engine.families.shared.blockscale`).

    Raises :class:`~nvrtc_engine.ArgumentError` / :class:`~nvrtc_engine.ArgumentTypeError`
    before launching when an argument is wrong: no dimension, an odd last dimension (gated),
    a size other than the kernel's ``hidden_size``, MXFP8 dimensions not multiples of 32
    (the last dimension, or H; and the rows for columnwise and both), wrong dtypes, shapes
    or devices, missing ``scale``/``amax`` with tensor scaling.

    Math: as TransformerEngine's activations (``templates/include/nve_act.cuh``), in fp32.

    Attribute ``config`` (read-only; every activation kernel class has it): the kernel
    structure and launch configuration the key chose, an :class:`ActivationConfig`:
    ``kernel.config.structure`` is ``"flat"``, ``"rows"`` or ``"tile"``,
    ``kernel.config.threads`` the threads per block and ``kernel.config.launch`` the whole
    :class:`LaunchConfig` (flat, rows) or :class:`TileConfig` (tile).
    """

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
        if scale is None and amax is None and scale_inv is None:  # (_call's step, here at once)
            if out is None:
                done = self._fast1(_X, x, (), stream)
                if done is not None:  # launched through its prepared launch
                    return done[0]
            elif self._fast2(_X_OUT, x, out, (), stream) is not None:
                return out
            return self._run(None, x, out, None, None, None, stream, ())
        return self._call(None, x, out, scale, amax, scale_inv, (), stream)


class ActivationGradKernel(_Launcher):
    """A backward activation: ``dx = grad * act'(x)`` (plain ops), or for gated ops with
    ``x = [a | b]``: ``dx = [grad * act'(a) * b | grad * act(a)]``.

    Call: ``kernel(grad, x, out=None, *, scale=None, amax=None, scale_inv=None, stream=None)``.

    Args:
        grad: CUDA array of ``in_dtype``, the gradient of the forward output: ``x``'s shape
            for plain ops, ``(..., hidden_size)`` for gated ops.
        x: the forward input, as for :class:`ActivationKernel`.
        out: ``x``'s shape (gated: ``(..., 2 * hidden_size)``, ``d/da`` first), an array of
            ``out_dtype`` or for MXFP8 a :class:`~nvrtc_engine.BlockScaledOutput`; allocated
            when omitted.
        scale, amax, scale_inv, stream: as for :class:`ActivationKernel` (amax of ``dx``).

    Returns ``out`` (an :class:`~..shared.blockscale.BlockScaledOutput` for MXFP8). Raises as
    :class:`ActivationKernel` does, and when ``grad``'s shape, dtype or device is wrong.
    MXFP8 output of a gated op needs H to be a multiple of 32 (so no block straddles the
    two halves).

    Math: as TransformerEngine's ``dact``/``dgated_act`` kernels, in fp32.
    """

    def __call__(
        self,
        grad: Any,
        x: Any,
        out: Any = None,
        *,
        scale: Any = None,
        amax: Any = None,
        scale_inv: Any = None,
        stream: Any = None,
    ) -> Any:
        if scale is None and amax is None and scale_inv is None:  # (_call's step, here at once)
            if out is None:
                done = self._fast2(_GRAD_X, grad, x, (), stream)
                if done is not None:  # launched through its prepared launch
                    return done[0]
            elif self._fast3(_GRAD_X_OUT, grad, x, out, (), stream) is not None:
                return out
            return self._run(grad, x, out, None, None, None, stream, ())
        return self._call(grad, x, out, scale, amax, scale_inv, (), stream)


class ClampedSwiGLUKernel(_Launcher):
    """Clamped SwiGLU (GPT-OSS): for ``x = [a | b]`` of shape ``(..., 2H)``,
    ``y = a' * sigmoid(alpha * a') * (clamp(b, -limit, limit) + linear_offset)`` with
    ``a' = min(a, limit)``; shape ``(..., H)``.

    Call: ``kernel(x, out=None, *, limit, alpha=1.702, linear_offset=1.0, scale=None,
    amax=None, scale_inv=None, stream=None)``. ``limit`` (> 0), ``alpha`` and
    ``linear_offset`` are run-time floats, used as fp32. Other arguments, return value and
    errors as :class:`ActivationKernel`; a missing or non-positive ``limit`` is an
    :class:`~nvrtc_engine.ArgumentError`.

    Math: TransformerEngine's ``clamped_swiglu`` (``ClampedSwiGLUParam``).
    """

    def __call__(
        self,
        x: Any,
        out: Any = None,
        *,
        limit: float | None = None,
        alpha: float = CLAMPED_SWIGLU_ALPHA,
        linear_offset: float = CLAMPED_SWIGLU_LINEAR_OFFSET,
        scale: Any = None,
        amax: Any = None,
        scale_inv: Any = None,
        stream: Any = None,
    ) -> Any:
        floats = _clamp_params(limit, alpha, linear_offset)
        return self._call(None, x, out, scale, amax, scale_inv, floats, stream)


class ClampedSwiGLUGradKernel(_Launcher):
    """Backward of clamped SwiGLU: grad ``(..., H)``, x ``(..., 2H)`` -> ``(..., 2H)``:
    ``[grad * gate'(a) * lin(b) | grad * gate(a)]``, with zero gradient where clamped
    (``a > limit`` in the first half, ``|b| > limit`` in the second).

    Call: ``kernel(grad, x, out=None, *, limit, alpha=1.702, linear_offset=1.0, scale=None,
    amax=None, scale_inv=None, stream=None)``; see :class:`ActivationGradKernel` and
    :class:`ClampedSwiGLUKernel`.

    Math: TransformerEngine's ``clamped_dswiglu``.
    """

    def __call__(
        self,
        grad: Any,
        x: Any,
        out: Any = None,
        *,
        limit: float | None = None,
        alpha: float = CLAMPED_SWIGLU_ALPHA,
        linear_offset: float = CLAMPED_SWIGLU_LINEAR_OFFSET,
        scale: Any = None,
        amax: Any = None,
        scale_inv: Any = None,
        stream: Any = None,
    ) -> Any:
        floats = _clamp_params(limit, alpha, linear_offset)
        return self._call(grad, x, out, scale, amax, scale_inv, floats, stream)
