"""Block-scaled quantization: ``quantize`` with ``scaling="mxfp8"`` or ``scaling="nvfp4"``.

Part of the cast family (template ``templates/cast.cu.j2``, quantize section).

- MXFP8 (``out_dtype`` fp8_e4m3 / fp8_e5m2): 32-element blocks along rows (rowwise) and/or
  down columns (columnwise), one E8M0 scale each (templates/include/nve_mx.cuh); both data
  tensors keep the input's shape ``(M, K)``.
- NVFP4 (``out_dtype`` fp4_e2m1): 16-element blocks, E4M3 block scales and an fp32 tensor
  scale from the tensor's amax (templates/include/nve_fp4.cuh); data two values per byte,
  the first in the low nibble; columnwise data is the transpose, ``(K, ceil(M/2))`` bytes.

Scale tensors use :mod:`.blockscale`'s padded layouts; the kernel writes zeros into the
padding. MXFP8 columnwise / both calls without padding (M and K multiples of 128, aligned
data) run the activation family's tiled kernel with the identity activation instead, the
same bytes (:data:`MX_FAST_PATH`). Layouts, formulas and examples: ``docs/cast.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from ...core.dtypes import DTYPES
from ...core.errors import ArgumentError, VariantError
from ...core.key import LAYOUTS, arch_number
from ...core.signature import CallArgs, Signature, i32, i64, ptr
from ...core.spec import FP8, HIGH_PRECISION, HW_FP8_ARCH, OpSpec
from ..shared.blockscale import BlockScaledOutput, mxfp8_scale_shape, nvfp4_scale_shape
from ..shared.tiles import (
    MAX_GRID,
    TILE,
    TileConfig,
    fp32_literal,
    tile_config,
    tile_render_context,
)
from .common import CastKernelBase, aligned16, ceil_div, validate_sets

if TYPE_CHECKING:
    from ...core.kernel import Kernel
    from ...core.key import KernelKey
    from ...core.launch import LaunchSpec

__all__ = [
    "AMAX",
    "AMAX_FINAL",
    "HW_FP4_ARCHS",
    "MX_FAST_PATH",
    "QUANTIZE",
    "QUANTIZE_SPEC",
    "QuantizeConfig",
    "QuantizeKernel",
    "QuantizeResult",
    "QuantizeSpec",
    "hardware_fp4",
    "mx_tile_config",
    "quantize_config",
]

# Archs whose arch-specific targets (sm_100a, sm_120f, ...) have cvt.rn.satfinite.e2m1x2.f32
# (checked with NVRTC 13.5; the plain sm_100 / sm_120 targets and sm_90 do not).
HW_FP4_ARCHS: tuple[int, ...] = (100, 101, 103, 107, 110, 120, 121)
TILE_ROWS, TILE_COLS, THREADS = 64, 128, 256  # a block's tile and threads
AMAX_THREADS, AMAX_UNROLL, AMAX_MAX_BLOCKS = 256, 4, 1024
PAD_MAX_BLOCKS = 64
# The kernels' parameters (templates/cast.cu.j2, quantize section): the quantize kernel, the
# NVFP4 amax kernel and its final reduction (the MXFP8 fast path's is activation.TILE); the
# arguments of a call.
QUANTIZE = Signature(
    ptr("x", "IS", const=True), ptr("data_r", "unsigned char"), ptr("scale_r", "unsigned char"),
    ptr("data_c", "unsigned char"), ptr("scale_c", "unsigned char"),
    ptr("amax_ptr", "float", const=True), ptr("scale_inv_ptr", "float"), i64("M"), i64("K"),
    i64("pcol_r"), i64("prow_r"), i64("pcol_c"), i64("prow_c"), i64("tiles"), i32("vec"),
)  # fmt: skip
AMAX = Signature(ptr("x", "IS", const=True), i64("n"), ptr("partial", "float"), i32("aligned"))
AMAX_FINAL = Signature(ptr("partial", "float", const=True), i32("count"), ptr("amax", "float"))
_ARGS = CallArgs(("x", "rowwise_data", "rowwise_scale_inv", "columnwise_data",
                  "columnwise_scale_inv", "amax", "scale_inv", "workspace"))  # fmt: skip

# MXFP8 fast path (docs/cast.md): keys with a ``_tile`` function (MXFP8 columnwise and both)
# run the activation family's tiled kernel with the identity activation
# (templates/mxfp8_tile.j2) for calls with M % 128 == 0, K % 128 == 0 and 16-byte aligned
# data; other calls, and every call with MX_FAST_PATH = False, the quantize kernel. Same
# bytes either way (tests/test_cast_emulated.py, tests/test_gpu_cast.py). Read per call
# (call keys include it); it changes no generated code.
MX_FAST_PATH = True
MX_FAST_ALIGN = 128  # M and K multiples of this: the scale tensors have no padding


class QuantizeConfig(NamedTuple):
    """How the quantize kernel maps threads to a tile (``templates/cast.cu.j2``, quantize
    section): 256 threads per 64 x 128 tile, each thread 16 columns of two rows (both loaded
    first); columnwise blocks go through the tile kept in shared memory.
    ``__launch_bounds__(256, 4)``: 64 registers or fewer (ptxas, sm_90).

    Measured on the H200 (bf16 16384 x 8192): MXFP8 both 71.0% of copy bandwidth, rowwise
    89.7%; a warp-per-32x64-piece mapping without shared memory measured 41.7-46.6% and was
    removed.
    """

    @property
    def threads(self) -> int:
        return THREADS

    @property
    def tile(self) -> tuple[int, int]:
        """(rows, columns) of a block's tile."""
        return TILE_ROWS, TILE_COLS


def quantize_config(key: KernelKey) -> QuantizeConfig:
    """The quantize kernel's thread mapping for ``key`` (see :class:`QuantizeConfig`)."""
    del key  # one mapping for every key
    return QuantizeConfig()


def mx_tile_config(key: KernelKey) -> TileConfig | None:
    """The MXFP8 fast path's tiled-kernel configuration for ``key`` (the activation family's
    :func:`~nvrtc_engine.families.shared.tiles.tile_config`), or None: no fast path (NVFP4,
    MXFP8 rowwise, whose quantize kernel measured as fast, a compiled-in K not a multiple of
    128)."""
    if key.scaling != "mxfp8" or key.layout == "rowwise":
        return None
    if key.hidden_size is not None and key.hidden_size % MX_FAST_ALIGN:
        return None  # no call could take it
    return tile_config(key)


def hardware_fp4(arch: str) -> bool:
    """Whether kernels for ``arch`` use the hardware E2M1 conversion."""
    return arch[-1] in "af" and arch_number(arch) in HW_FP4_ARCHS


class QuantizeSpec(OpSpec):
    """``quantize``: MXFP8 or NVFP4 block scaling of ``x (M, K)``, rowwise, columnwise or both.

    ``get_kernel("quantize", dtype="fp8")`` is bf16 -> MXFP8 E4M3 rowwise;
    ``get_kernel("quantize", dtype="fp4_e2m1", layout="both")`` is bf16 -> NVFP4 both.
    ``hidden_size`` (if given) is ``K``, compiled in.
    """

    name = "quantize"
    family = "cast"
    doc = "MXFP8 / NVFP4 block-scaled quantization, rowwise / columnwise / both"
    in_dtypes = HIGH_PRECISION
    out_dtypes = (*FP8, "fp4_e2m1")
    scalings = ("mxfp8", "nvfp4")
    layouts = LAYOUTS

    def default_scaling(self, out_dtype: str) -> str:
        return "nvfp4" if DTYPES[out_dtype].is_fp4 else "mxfp8"

    def validate(self, key: KernelKey) -> None:
        validate_sets(self, key)
        want = "nvfp4" if key.output.is_fp4 else "mxfp8"
        if key.scaling != want:
            raise VariantError("scaling", key.scaling, [want], f"{key.out_dtype} output")

    def symbols(self, key: KernelKey) -> tuple[str, ...]:
        main = str(key)
        if key.scaling == "nvfp4":
            return (main, f"{main}_amax", f"{main}_amax_final")
        return (main, f"{main}_tile") if mx_tile_config(key) is not None else (main,)

    def cuda_headers(self, key: KernelKey) -> bool:
        return arch_number(key.arch) < HW_FP8_ARCH  # E4M3 / E5M2 conversions, block scales too

    def render_context(self, key: KernelKey) -> dict[str, Any]:
        ctx = super().render_context(key)
        fp4 = key.scaling == "nvfp4"
        ctx.update(
            params=QUANTIZE.c_params(), amax_params=AMAX.c_params(),
            amax_final_params=AMAX_FINAL.c_params(), tile_params=TILE.c_params(),
        )  # fmt: skip
        ctx.update(
            section="quantize", mx=not fp4, fp4=fp4, dact=None,
            rowwise=key.layout in ("rowwise", "both"), colwise=key.layout in ("columnwise", "both"),
            hw_fp4=fp4 and hardware_fp4(key.arch), max_norm=f"{key.output.max_finite:.1f}",
        )  # fmt: skip
        tile = mx_tile_config(key)
        ctx.update(mx_tile=tile is not None)
        if tile is not None:  # the activation template's context for the identity op
            ctx.update(
                kind="act", gated=False, bwd=False, vec=16 // key.input.itemsize,
                max_norm_rcp=fp32_literal(1.0 / key.output.max_finite),
                **tile_render_context(key, tile),
            )  # fmt: skip
        return ctx

    def kernel_class(self) -> type[Kernel]:
        return QuantizeKernel


QuantizeResult = BlockScaledOutput  # the name quantize's result had; one type


class QuantizeKernel(CastKernelBase):
    """MXFP8 / NVFP4 quantization of ``x (M, K)``.

    Call: ``kernel(x, *, rowwise_data=None, rowwise_scale_inv=None, columnwise_data=None,
    columnwise_scale_inv=None, amax=None, scale_inv=None, compute_amax=True, workspace=None,
    stream=None) -> BlockScaledOutput``.

    Args:
        x: ``(M, K)`` of ``in_dtype``, C-contiguous; any ``M, K >= 1`` (a partial last block
            uses the elements it has).
        rowwise_data / columnwise_data: outputs for the key's layout (see
            :class:`~nvrtc_engine.BlockScaledOutput` for shapes); allocated with ``x``'s
            library when omitted.
        rowwise_scale_inv / columnwise_scale_inv: uint8, exactly the padded shapes of
            :func:`~nvrtc_engine.families.shared.blockscale.mxfp8_scale_shape` /
            :func:`~nvrtc_engine.families.shared.blockscale.nvfp4_scale_shape`; padding is zeroed.
        amax: NVFP4 only: fp32 device array, element 0. With ``compute_amax`` (default) it
            is overwritten with ``max |x|`` first (allocated when omitted); with
            ``compute_amax=False`` it must hold the tensor's amax already.
        scale_inv: NVFP4 only, optional: fp32, element 0 gets ``1 / S_enc``.
        workspace: NVFP4 with ``compute_amax`` only, optional: fp32, at least 1024 elements
            for the per-block maxima.
        stream: where to launch.

    Math: MXFP8 as TransformerEngine (E8M0 from the block amax, data
    ``fp8_satfinite(x * 2^(127 - e))``); NVFP4 as TransformerEngine's ``core_nvfp4.cuh``
    (formulas in ``templates/include/nve_fp4.cuh`` and docs/cast.md). Raises
    :class:`~nvrtc_engine.ArgumentError` / :class:`~nvrtc_engine.ArgumentTypeError` before
    launching when an argument is wrong.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        key = self.key
        self._in = key.input
        self._out = key.output
        self._fp4 = key.scaling == "nvfp4"
        self._rowwise = key.layout in ("rowwise", "both")
        self._colwise = key.layout in ("columnwise", "both")
        self._shape_fn = nvfp4_scale_shape if self._fp4 else mxfp8_scale_shape
        self._config = quantize_config(key)
        self._tile = None if self._fp4 else mx_tile_config(key)

    def _data_shape(self, m: int, k: int, direction: str) -> tuple[int, int]:
        if not self._fp4:
            return (m, k)
        return (m, ceil_div(k, 2)) if direction == "rowwise" else (k, ceil_div(m, 2))

    def __call__(
        self, x: Any, *, rowwise_data: Any = None, rowwise_scale_inv: Any = None,
        columnwise_data: Any = None, columnwise_scale_inv: Any = None, amax: Any = None,
        scale_inv: Any = None, compute_amax: bool = True, workspace: Any = None,
        stream: Any = None,
    ) -> BlockScaledOutput:  # fmt: skip
        args = (x, rowwise_data, rowwise_scale_inv, columnwise_data, columnwise_scale_inv, amax,
                scale_inv, workspace)  # fmt: skip
        extra = bool(compute_amax) if self._tile is None else (bool(compute_amax), MX_FAST_PATH)
        done = self._fastn(args, (), stream, extra)
        if done is not None:  # launched through its prepared launch, which allocated these
            made, row, col = iter(done), self._rowwise, self._colwise
            return BlockScaledOutput(
                next(made) if rowwise_data is None and row else rowwise_data,
                next(made) if rowwise_scale_inv is None and row else rowwise_scale_inv,
                next(made) if columnwise_data is None and col else columnwise_data,
                next(made) if columnwise_scale_inv is None and col else columnwise_scale_inv,
                next(made) if amax is None and self._fp4 else amax,
                scale_inv,
            )
        key = self.key
        xa = self._input(x, "x", self._in)
        m, k = self._matrix(xa, "x")
        res = BlockScaledOutput()
        ptrs = {"rowwise": [0, 0], "columnwise": [0, 0]}
        pads: dict[str, tuple[int, int]] = {"rowwise": (0, 0), "columnwise": (0, 0)}
        pad_items = 0
        given = {
            "rowwise": (rowwise_data, rowwise_scale_inv),
            "columnwise": (columnwise_data, columnwise_scale_inv),
        }
        for direction, wanted in (("rowwise", self._rowwise), ("columnwise", self._colwise)):
            data, scales = given[direction]
            if not wanted:
                if data is not None or scales is not None:
                    raise ArgumentError(f"{direction}_data", f"{key} (layout={key.layout}) "
                                        f"writes no {direction} output")  # fmt: skip
                continue
            shape = self._data_shape(m, k, direction)
            if self._fp4:
                data, da = self._bytes(data, f"{direction}_data", xa, shape)
            else:
                data, da = self._output(data, f"{direction}_data", xa, shape, self._out)
            padded = self._shape_fn(m, k, direction)
            real = self._shape_fn(m, k, direction, padded=False)
            scales, sa = self._bytes(scales, f"{direction}_scale_inv", xa, padded)
            ptrs[direction] = [da.ptr, sa.ptr]
            pads[direction] = padded
            pad_items = max(pad_items, padded[0] * padded[1] - real[0] * real[1])
            setattr(res, f"{direction}_data", data)
            setattr(res, f"{direction}_scale_inv", scales)
        amax_ptr = scale_inv_ptr = ws_ptr = 0
        launches: list[LaunchSpec] = []
        if self._fp4:
            if amax is None:
                if not compute_amax:
                    raise ArgumentError("amax", "is required with compute_amax=False (fp32 "
                                        "device array holding the tensor's amax)")  # fmt: skip
                amax, _ = self._output(None, "amax", xa, (1,), DTYPES["fp32"])
            amax_ptr = self._scalar_buffer(amax, "amax", xa)
            res.amax = amax
            if scale_inv is not None:
                scale_inv_ptr = self._scalar_buffer(scale_inv, "scale_inv", xa)
                res.scale_inv = scale_inv
            if compute_amax:
                workspace, ws_ptr, calls = self._amax_calls(xa, m * k, workspace)
                launches += calls
            elif workspace is not None:
                raise ArgumentError("workspace", "is only used with compute_amax=True")
        else:
            for value, name in ((amax, "amax"), (scale_inv, "scale_inv"), (workspace, "workspace")):
                if value is not None:
                    raise ArgumentError(name, "is only for NVFP4 (MXFP8 has no tensor scale)")
            if not compute_amax:
                raise ArgumentError("compute_amax", "is only for NVFP4")
        threads, (tile_rows, tile_cols) = self._config.threads, self._config.tile
        tiles = ceil_div(m, tile_rows) * ceil_div(k, tile_cols)
        pad_blocks = min(ceil_div(pad_items, threads), PAD_MAX_BLOCKS)
        if self._tile_fits(xa.ptr, ptrs, pads, m, k):
            launches.append(self._tile_launch(xa.ptr, ptrs, pads, m, k))
        elif tiles + pad_blocks:
            vec = self._vec(xa.ptr, ptrs, m, k)
            a = _ARGS
            values = QUANTIZE.bind(
                x=a.x, data_r=a.rowwise_data, scale_r=a.rowwise_scale_inv,
                data_c=a.columnwise_data, scale_c=a.columnwise_scale_inv, amax_ptr=a.amax,
                scale_inv_ptr=a.scale_inv, M=m, K=k, pcol_r=pads["rowwise"][1],
                prow_r=pads["rowwise"][0], pcol_c=pads["columnwise"][1],
                prow_c=pads["columnwise"][0], tiles=tiles, vec=int(vec),
            )  # fmt: skip
            launches.append((0, tiles + pad_blocks, threads, QUANTIZE, values))
        if launches:
            tensors = (x, res.rowwise_data, res.rowwise_scale_inv, res.columnwise_data,
                       res.columnwise_scale_inv, res.amax, res.scale_inv, workspace)  # fmt: skip
            addresses = (xa.ptr, *ptrs["rowwise"], *ptrs["columnwise"], amax_ptr, scale_inv_ptr,
                         ws_ptr)  # fmt: skip
            self._submit(args, tensors, addresses, (), stream, xa, launches, extra)
        return res

    def _tile_fits(self, x_ptr: int, ptrs: dict[str, list[int]],
                   pads: dict[str, tuple[int, int]], m: int, k: int) -> bool:  # fmt: skip
        """Whether this call takes the MXFP8 fast path (see :data:`MX_FAST_PATH`): the key has
        the tile function, the switch is on, no scale padding (M, K multiples of 128, so
        the padded scale tensors are exactly (M, K/32) and (M/32, K)), aligned data."""
        if self._tile is None or not MX_FAST_PATH or m <= 0 or k <= 0:
            return False
        if m % MX_FAST_ALIGN or k % MX_FAST_ALIGN:
            return False
        for direction, (rows, cols) in (("rowwise", (m, k // 32)), ("columnwise", (m // 32, k))):
            if ptrs[direction][0] and pads[direction] != (rows, cols):
                return False  # cannot happen for M, K multiples of 128; checked all the same
        return aligned16(x_ptr, ptrs["rowwise"][0], ptrs["columnwise"][0])

    def _tile_launch(self, x_ptr: int, ptrs: dict[str, list[int]],
                     pads: dict[str, tuple[int, int]], m: int, k: int) -> LaunchSpec:  # fmt: skip
        """The fast path's launch: function 1 (``<key>_tile``), the activation tile kernel's
        grid (one pass over the 32-row tiles, one tile per block)."""
        cfg = self._tile
        assert cfg is not None
        tile_cols = cfg.tile_cols(16 // self._in.itemsize)
        tiles = ceil_div(m, cfg.tile_rows()) * ceil_div(k, tile_cols)
        grid = max(1, min(tiles, MAX_GRID))
        a = _ARGS
        values = TILE.bind(
            x=a.x, grad=0, y=a.rowwise_data, y_col=a.columnwise_data, s_row=a.rowwise_scale_inv,
            s_col=a.columnwise_scale_inv, rows=m, cols_arg=k, s_row_stride=pads["rowwise"][1],
            s_col_stride=pads["columnwise"][1], scale_ptr=0, amax_ptr=0, scale_inv_ptr=0,
            limit=0.0, alpha=0.0, linear_offset=0.0, aligned=1,
        )  # fmt: skip
        return (1, grid, cfg.threads, TILE, values)

    def _vec(self, x_ptr: int, ptrs: dict[str, list[int]], m: int, k: int) -> bool:
        """16-byte accesses: aligned pointers and rows (NVFP4 data rows of K/2 bytes take
        8-byte stores, the transposed rows of M/2 bytes 16-byte stores)."""
        ok = aligned16(x_ptr, ptrs["rowwise"][0], ptrs["columnwise"][0], k * self._in.itemsize)
        return ok and k % 16 == 0 and not (self._fp4 and self._colwise and m % 32)

    def _amax_calls(self, xa: Any, n: int, workspace: Any) -> tuple[Any, int, list[LaunchSpec]]:
        """The workspace (allocated when None), its address and the two amax launches."""
        if workspace is not None:
            wa = self._input(workspace, "workspace", DTYPES["fp32"])
            self._same_device(wa, "workspace", xa)
            if wa.numel < AMAX_MAX_BLOCKS:
                raise ArgumentError("workspace", f"has {wa.numel} elements; needs at least "
                                    f"{AMAX_MAX_BLOCKS} (fp32)")  # fmt: skip
        per_block = AMAX_THREADS * AMAX_UNROLL * (16 // self._in.itemsize)
        sms = self.loaded(xa.device).device.sm_count if n else 1
        blocks = max(1, min(ceil_div(n, per_block), 4 * sms, AMAX_MAX_BLOCKS))
        if workspace is None:
            workspace, wa = self._output(None, "workspace", xa, (blocks,), DTYPES["fp32"])
        aligned = aligned16(xa.ptr)
        a = _ARGS
        calls: list[LaunchSpec] = [
            (1, blocks, AMAX_THREADS, AMAX,
             AMAX.bind(x=a.x, n=n, partial=a.workspace, aligned=int(aligned))),
            (2, 1, 1024, AMAX_FINAL, AMAX_FINAL.bind(partial=a.workspace, count=blocks,
                                                     amax=a.amax)),
        ]  # fmt: skip
        return workspace, wa.ptr, calls


QUANTIZE_SPEC = QuantizeSpec()
