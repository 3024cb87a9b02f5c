"""Cast / transpose family: the quantization kernels that feed FP8 and FP4 GEMMs.

Ops (names as in TransformerEngine's C API, without the ``nvte_`` prefix):

- ``cast``: ``x -> q`` to fp32/fp16/bf16, or FP8 with tensor scaling. An element-wise op:
  it is the activation family's kernel with the identity function
  (``templates/activation.cu.j2``), so the measured launch shapes there apply.
- ``transpose``: ``x [M, K] -> xt [K, M]``, any dtype (FP8 moves as raw bytes).
- ``cast_transpose``: ``x -> (q [M, K], qt [K, M])`` in one pass; tensor scaling shares
  ``scale``, ``amax`` and ``scale_inv`` between both outputs.
- ``cast_transpose_dbias``: also ``dbias [K]`` = column sums of ``x`` in fp32, returned in the
  input dtype.
- ``cast_transpose_dbias_d{gelu,qgelu,silu,relu,srelu}``: ``(grad, act_input) -> (q, qt,
  dbias)`` of ``grad * act'(act_input)``.
- ``d{geglu,swiglu,reglu,qgeglu,sreglu}_cast_transpose``: gated backward, ``(grad [M, H],
  act_input [M, 2H]) -> (q [M, 2H], qt [2H, M])`` of ``[grad * act'(a) * b, grad * act(a)]``
  with ``a, b = act_input[:, :H], act_input[:, H:]``.
- ``multi_cast_transpose``: a list of ``x`` (one dtype) to a list of ``(q, qt)``, many tensors
  per launch.
- ``quantize``: MXFP8 and NVFP4 block scaling, see :mod:`.quantize`.

Template: ``templates/cast.cu.j2``. References: :mod:`nvrtc_engine.families.cast.reference`.
Layouts and semantics: ``docs/cast.md``.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from ...core.dtypes import DTYPES
from ...core.errors import ArgumentError, ArgumentTypeError, VariantError
from ...core.record import Checked
from ...core.signature import CallArgs, Signature, i32, i64, ptr
from ...core.spec import FP8, HIGH_PRECISION, OpSpec
from .common import INT32_MAX, CastKernelBase, aligned16, ceil_div, validate_sets

if TYPE_CHECKING:
    from ...core.kernel import Kernel
    from ...core.key import KernelKey

__all__ = [
    "CAST_SPECS",
    "DACT_OPS",
    "DBIAS",
    "GATED_OPS",
    "MAX_TENSORS",
    "CastTransposeKernel",
    "MultiCastTransposeKernel",
    "TILE",
    "TileConfig",
    "TileSpec",
    "TransposeKernel",
    "TransposeSpec",
    "tile_config",
]

# Backward op -> (forward activation, derivative) device functions (templates/include/nve_act.cuh).
DACT_OPS: dict[str, str] = {
    "cast_transpose_dbias_dgelu": "dgelu",
    "cast_transpose_dbias_dqgelu": "dqgelu",
    "cast_transpose_dbias_dsilu": "dsilu",
    "cast_transpose_dbias_drelu": "drelu",
    "cast_transpose_dbias_dsrelu": "dsrelu",
}
GATED_OPS: dict[str, str] = {
    "dgeglu_cast_transpose": "gelu",
    "dswiglu_cast_transpose": "silu",
    "dreglu_cast_transpose": "relu",
    "dqgeglu_cast_transpose": "qgelu",
    "dsreglu_cast_transpose": "srelu",
}
MAX_TENSORS = 60  # multi_cast_transpose entries per launch: 60 * 64 + 8 bytes of parameters


class _TileFields(NamedTuple):
    threads: int
    tile_rows: int
    tile_cols: int
    chunk: int
    min_blocks: int
    load_group: int = 0
    prefetch: bool = False
    gather4: bool = False
    strip: int = 0


class TileConfig(Checked, _TileFields):
    """Block shape of the tiled transpose kernels (``templates/cast.cu.j2``, tile section).

    A block of ``threads`` handles a ``tile_rows x tile_cols`` tile; each thread reads
    ``chunk`` consecutive elements of a row per step (16 bytes of the narrower of input and
    output, so both sides use 16-byte accesses) and writes 16 bytes of a transposed row.

    Chosen by sweeps on the H200 (bf16 16384 x 8192 and 8192 x 28672 to fp8, % of copy
    bandwidth; the chosen shapes' figures today: ``bench/bandwidth.py --family cast``,
    bench/results/cast_bandwidth.json). 128-row x 128-column tiles for FP8 output from 16-bit
    or FP8 input (half the blocks of 64-row tiles: half the amax updates, twice the bytes in
    flight per block); 16-bit outputs 64 rows, fp32 ones 32 (shared memory: at most 32 KB
    per block). Without column sums, 4 blocks per SM: 16-bit -> FP8 256 threads with
    ``gather4`` (89.6%, against 86.8% for 512 threads without), other 128-row tiles 512
    threads, the rest 256. With column sums (dbias, gated ops), chunks loaded one at a time
    (``load_group`` 1): 128 threads and 4 blocks per SM (67.2%, against 57.4% with all
    loads first), 256 threads and 2 blocks per SM where act_input is also read (dbias_dgelu
    59.5%, against 42.6%); from 16-bit input to FP8 with ``prefetch``, and the dbias kernels
    (not the gated ops, not ``multi_cast_transpose``) with 256 threads and ``strip`` 2, or 4
    with an activation (cast_transpose_dbias 84.4%, dbias_dgelu 76.8%).

    ``load_group`` (0: all): a thread's ``tile_rows / (threads / (tile_cols / chunk))``
    chunks are loaded and processed in groups of this many, two stages (the loads of the
    next group are issued before the current group is computed), so about twice this many
    chunks are live instead of all of them. Results are the same bytes for every value: each
    thread adds its rows to the column sums in the same order.

    ``prefetch`` (on for 16-bit -> FP8 dbias kernels): each thread first asks L2 for its
    chunks after the first (``prefetch.global.L2``, no registers), so that loads which
    ptxas issues late under register pressure hit L2 instead of waiting a DRAM latency.
    Same results.

    ``gather4`` (on for 16-bit -> FP8 without dbias; 1-byte outputs only): phase 2 reads the shared
    tile in 4-byte words (4 columns of a row) and transposes 4 x 4 bytes with byte
    permutes, instead of one shared-memory load per byte. Same results.

    ``strip`` (0: off; on for the 16-bit -> FP8 dbias kernels, above; not
    ``multi_cast_transpose``, not the gated ops' default): a
    block takes ``strip`` consecutive tiles down one column strip (fewer at the bottom
    edge) instead of one tile. The column sums run on in registers over the block's tiles
    and are reduced (butterfly, warp partials, workspace row) once per block, not once per
    tile, into ``ceil(ceil(M / tile_rows) / strip)`` workspace rows; amax is block-reduced
    once per block too. The shared tile alternates between two buffers where both fit the
    48 KB of static shared memory, so consecutive tiles need one barrier, not two. q, qt
    and amax the same bytes as without; dbias is deterministic but adds the rows in another
    order (within ``dbias_depth``'s bound). The symbols carry ``_st<strip>``.
    """

    __slots__ = ()

    def _checked(self) -> TileConfig:
        if self.strip < 0:
            raise ValueError(f"TileConfig.strip must be >= 0, got {self.strip}")
        return self

    @property
    def tag(self) -> str:
        """Symbol suffix of ``strip`` (empty when it is off)."""
        return f"_st{self.strip}" if self.strip else ""

    def tile_blocks(self, tiles_m: int, tiles_c: int) -> int:
        """Blocks of a launch over ``tiles_m x tiles_c`` tiles (``strip`` tiles a block)."""
        return ceil_div(tiles_m, self.strip or 1) * tiles_c


def tile_config(key: KernelKey) -> TileConfig:
    """The tiled kernels' block shape for ``key`` (see :class:`TileConfig`)."""
    isz, osz = key.input.itemsize, key.output.itemsize
    spec = key.spec
    sums = isinstance(spec, TileSpec) and (spec.dbias or spec.gated)
    reads_act = isinstance(spec, TileSpec) and (spec.dact is not None or spec.gated)
    rows = 128 if osz == 1 and isz <= 2 else 64 if max(isz, osz) <= 2 else 32
    measured = isz == 2 and osz == 1  # the 16-bit -> FP8 case the sweeps measured
    if sums:  # see the class docstring
        strip = measured and spec.dbias and not spec.gated and not spec.multi
        return TileConfig(
            threads=256 if reads_act or strip else 128,
            tile_rows=rows,
            tile_cols=128,
            chunk=16 // min(isz, osz),
            min_blocks=2 if reads_act else 4,
            load_group=1,
            prefetch=measured,
            strip=(4 if reads_act else 2) if strip else 0,
        )
    return TileConfig(
        threads=256 if measured else 512 if rows == 128 else 256,
        tile_rows=rows,
        tile_cols=128,
        chunk=16 // min(isz, osz),
        min_blocks=4,
        gather4=measured,
    )


class TileSpec(OpSpec):
    """A tiled cast + transpose op (``cast_transpose`` and its fused and multi-tensor forms).

    ``hidden_size`` (if given) is the number of columns of ``x`` (``H`` of ``grad [M, H]``
    for gated ops), compiled in; ``multi_cast_transpose`` takes every size at run time.
    """

    family = "cast"

    def __init__(
        self, name: str, doc: str, *, dbias: bool = False, dact: str | None = None,
        act: str | None = None, multi: bool = False,
    ) -> None:  # fmt: skip
        self.name = name
        self.doc = doc
        self.dbias = dbias
        self.dact = dact
        self.act = act  # forward activation of a gated op
        self.multi = multi

    @property
    def gated(self) -> bool:
        return self.act is not None

    def validate(self, key: KernelKey) -> None:
        super().validate(key)
        if self.multi and key.hidden_size is not None:
            raise VariantError("hidden_size", key.hidden_size, [None],
                               f"{self.name} takes each tensor's size at run time")  # fmt: skip

    def symbols(self, key: KernelKey) -> tuple[str, ...]:
        main = f"{key}{tile_config(key).tag}"
        return (main, f"{main}_dbias") if self.dbias else (main,)

    def render_context(self, key: KernelKey) -> dict[str, Any]:
        ctx = super().render_context(key)
        cfg = tile_config(key)
        if cfg.strip and self.multi:
            raise ValueError(f"TileConfig.strip does not apply to {self.name}")
        ctx.update(
            section="tile", raw=False, has_q=True, dbias=self.dbias, dact=self.dact,
            act=self.act, gated=self.gated, multi=self.multi, max_tensors=MAX_TENSORS,
            tensor_scaling=key.scaling == "tensor", threads=cfg.threads,
            tile_rows=cfg.tile_rows, tile_cols=cfg.tile_cols, chunk=cfg.chunk,
            min_blocks=cfg.min_blocks, load_group=cfg.load_group, prefetch=cfg.prefetch,
            gather4=cfg.gather4, strip=cfg.strip, mx=False, fp4=False, hw_fp4=False,
            params=TILE.c_params(), dbias_params=DBIAS.c_params(),
        )  # fmt: skip
        return ctx

    def kernel_class(self) -> type[Kernel]:
        return MultiCastTransposeKernel if self.multi else CastTransposeKernel


class TransposeSpec(TileSpec):
    """``transpose``: ``x [M, K] -> xt [K, M]`` of any dtype; ``out_dtype`` equals ``in_dtype``
    (FP8 data moves as raw bytes, its scale_inv stays valid)."""

    in_dtypes = HIGH_PRECISION + FP8
    out_dtypes = HIGH_PRECISION + FP8
    scalings = ("none",)

    def default_scaling(self, out_dtype: str) -> str:
        return "none"

    def validate(self, key: KernelKey) -> None:
        validate_sets(self, key)
        if key.out_dtype != key.in_dtype:
            raise VariantError(
                "out_dtype",
                key.out_dtype,
                [key.in_dtype],
                "transpose keeps the dtype (pass in_dtype= and out_dtype= alike)",
            )

    def cuda_headers(self, key: KernelKey) -> bool:
        return False  # bytes are moved, never converted

    def render_context(self, key: KernelKey) -> dict[str, Any]:
        ctx = super().render_context(key)
        ctx.update(raw=True, has_q=False)
        return ctx

    def kernel_class(self) -> type[Kernel]:
        return TransposeKernel


# The tiled kernels' parameters (templates/cast.cu.j2, tile section; transpose too) and the
# dbias kernels' (the column sums of the workspace's rows); the arguments of a call.
TILE = Signature(
    ptr("x", "IS", const=True, restrict=False), ptr("act", "IS", const=True, restrict=False),
    ptr("q", "OS", restrict=False), ptr("qt", "OS", restrict=False),
    ptr("partial", "float", restrict=False), ptr("scale_ptr", "float", const=True, restrict=False),
    ptr("amax_ptr", "float", restrict=False), ptr("scale_inv_ptr", "float", restrict=False),
    i64("M"), i64("K"), i32("vec"),
)  # fmt: skip
DBIAS = Signature(ptr("partial", "float", const=True), i64("rows"), i64("K"), ptr("dbias", "IS"))
_TRANSPOSE_ARGS = CallArgs(("x", "out"))
_ARGS = CallArgs(("x", "act_input", "out", "out_t", "dbias", "workspace", "scale", "amax",
                  "scale_inv"))  # fmt: skip
_X, _X_OUT = _TRANSPOSE_ARGS.mask("x"), _TRANSPOSE_ARGS.mask("x", "out")  # call key tags


class TransposeKernel(CastKernelBase):
    """``xt = x.T``: ``kernel(x, out=None, *, stream=None) -> out``.

    Args:
        x: CUDA array ``(M, K)`` of ``in_dtype`` (FP8 may be uint8 storage), C-contiguous.
        out: ``(K, M)`` of the same dtype; allocated with ``x``'s library when omitted.
        stream: where to launch (see :mod:`nvrtc_engine.core.interop`).

    Any ``M, K >= 1``; tiles that do not fill a tile, or unaligned rows, take a
    bounds-checked path. Raises :class:`~nvrtc_engine.ArgumentError` /
    :class:`~nvrtc_engine.ArgumentTypeError` before launching when an argument is wrong.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._config = tile_config(self.key)
        self._dtype = self.key.input

    def __call__(self, x: Any, out: Any = None, *, stream: Any = None) -> Any:
        if out is None:
            done = self._fast1(_X, x, (), stream)
            if done is not None:  # launched through its prepared launch
                return done[0]
        elif self._fast2(_X_OUT, x, out, (), stream) is not None:
            return out
        given = (x, out)
        xa = self._input(x, "x", self._dtype)
        m, k = self._matrix(xa, "x")
        out, oa = self._output(out, "out", xa, (k, m), self._dtype)
        if m == 0 or k == 0:
            return out
        size = self._dtype.itemsize
        vec = aligned16(xa.ptr, oa.ptr, k * size, m * size)
        cfg = self._config
        grid = cfg.tile_blocks(ceil_div(m, cfg.tile_rows), ceil_div(k, cfg.tile_cols))
        _check_grid(grid, "x")
        a = _TRANSPOSE_ARGS
        values = TILE.bind(x=a.x, act=0, q=0, qt=a.out, partial=0, scale_ptr=0, amax_ptr=0,
                           scale_inv_ptr=0, M=m, K=k, vec=int(vec))  # fmt: skip
        launch = (0, grid, cfg.threads, TILE, values)
        self._submit(given, (x, out), (xa.ptr, oa.ptr), (), stream, xa, [launch])
        return out


class CastTransposeKernel(CastKernelBase):
    """Cast + transpose in one pass, optionally fused with dbias and an activation backward.

    Call: ``kernel(x, act_input=None, *, out=None, out_t=None, dbias=None, workspace=None,
    scale=None, amax=None, scale_inv=None, stream=None)``.

    Args:
        x: ``(M, K)`` of ``in_dtype``, C-contiguous: the input, or for the backward ops the
            incoming gradient (``(M, H)`` for gated ops).
        act_input: backward ops only: the activation's forward input, ``(M, K)``, or
            ``(M, 2H)`` for gated ops, of ``in_dtype``.
        out: ``(M, K)`` (gated: ``(M, 2H)``) of ``out_dtype``; allocated when omitted.
        out_t: the transpose of ``out``, ``(K, M)`` (gated: ``(2H, M)``); allocated when
            omitted.
        dbias: dbias ops only: ``(K,)`` of ``in_dtype``, the column sums; allocated when
            omitted.
        workspace: dbias ops only: fp32 ``(kernel.workspace_rows(M), K)``, one row of column
            sums per block (``ceil(ceil(M / tile_rows) / strip)``, ``strip`` 1 when off; see
            :meth:`workspace_rows`); allocated when omitted.
        scale / amax / scale_inv: tensor scaling only: fp32 device arrays (element 0): the
            scale multiplied in, the amax max-reduced (atomically, zero it first) with
            ``max |value|`` before scaling, and ``1/scale`` (optional).
        stream: where to launch (see :mod:`nvrtc_engine.core.interop`).

    Returns ``(out, out_t)``, or ``(out, out_t, dbias)`` for the dbias ops.

    Math: as TransformerEngine's ``cast_transpose`` family: values in fp32, FP8 output
    ``fp8_satfinite(value * scale)``; dbias summed in fp32 in a fixed order (deterministic)
    and rounded once to ``in_dtype``; gated outputs ``[grad * act'(a) * b, grad * act(a)]``.
    Raises :class:`~nvrtc_engine.ArgumentError` / :class:`~nvrtc_engine.ArgumentTypeError`
    before launching when an argument is wrong.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        spec = self.key.spec
        assert isinstance(spec, TileSpec)
        self._config = tile_config(self.key)
        self._in = self.key.input
        self._out = self.key.output
        self._dbias = spec.dbias
        self._dact = spec.dact is not None
        self._gated = spec.gated

    def workspace_rows(self, rows: int) -> int:
        """Rows of the dbias workspace for an input of ``rows`` rows (one per block of a
        column strip: ``TileConfig.strip`` tiles share one)."""
        return ceil_div(ceil_div(rows, self._config.tile_rows), self._config.strip or 1)

    def dbias_depth(self, rows: int) -> int:
        """An upper bound on the fp32 additions any term of dbias passes through (for error
        bounds): per-thread rows (over ``strip`` tiles), the warp butterfly, the warps, then
        the finalize kernel."""
        cfg = self._config
        per_thread = cfg.tile_rows * (cfg.tile_cols // cfg.chunk) // cfg.threads
        per_thread *= cfg.strip or 1
        return per_thread + 5 + cfg.threads // 32 + ceil_div(self.workspace_rows(rows), 8) + 8

    def __call__(
        self, x: Any, act_input: Any = None, *, out: Any = None, out_t: Any = None,
        dbias: Any = None, workspace: Any = None, scale: Any = None, amax: Any = None,
        scale_inv: Any = None, stream: Any = None,
    ) -> tuple[Any, ...]:  # fmt: skip
        given = (x, act_input, out, out_t, dbias, workspace, scale, amax, scale_inv)
        done = self._fastn(given, (), stream)
        if done is not None:  # launched through its prepared launch, which allocated these
            made = iter(done)
            out = next(made) if out is None else out
            out_t = next(made) if out_t is None else out_t
            if not self._dbias:
                return out, out_t
            return out, out_t, next(made) if dbias is None else dbias
        key = self.key
        xa = self._input(x, "x", self._in)
        m, k = self._matrix(xa, "x")
        width = 2 * k if self._gated else k
        act_ptr = 0
        if self._dact:
            if act_input is None:
                raise ArgumentError("act_input", f"is required for {key.op}: the activation's "
                                    f"forward input, shape {(m, width)}")  # fmt: skip
            aa = self._input(act_input, "act_input", self._in)
            if aa.shape != (m, width):
                what = "(M, 2H) for grad (M, H)" if self._gated else "x's shape"
                raise ArgumentError("act_input", f"has shape {aa.shape}; expected {(m, width)}, "
                                    f"{what}")  # fmt: skip
            self._same_device(aa, "act_input", xa)
            act_ptr = aa.ptr
        elif act_input is not None:
            raise ArgumentError("act_input", f"{key.op} takes no act_input")
        scale_ptr, amax_ptr, scale_inv_ptr = self._tensor_scaling(scale, amax, scale_inv, xa)
        out, oa = self._output(out, "out", xa, (m, width), self._out)
        out_t, ta = self._output(out_t, "out_t", xa, (width, m), self._out)
        partial_ptr = dbias_ptr = 0
        if self._dbias:
            dbias, da = self._output(dbias, "dbias", xa, (k,), self._in)
            rows = self.workspace_rows(m)
            workspace, wa = self._output(workspace, "workspace", xa, (rows, k), DTYPES["fp32"])
            partial_ptr, dbias_ptr = wa.ptr, da.ptr
        elif dbias is not None or workspace is not None:
            raise ArgumentError("dbias", f"{key.op} computes no dbias")
        result = (out, out_t, dbias) if self._dbias else (out, out_t)
        if k == 0:
            return result
        launches = []
        a = _ARGS
        if m > 0:
            isz, osz = self._in.itemsize, self._out.itemsize
            vec = aligned16(xa.ptr, act_ptr, oa.ptr, ta.ptr, k * isz, k * osz, m * osz)
            cfg = self._config
            grid = cfg.tile_blocks(ceil_div(m, cfg.tile_rows), ceil_div(k, cfg.tile_cols))
            _check_grid(grid, "x")
            values = TILE.bind(x=a.x, act=a.act_input, q=a.out, qt=a.out_t, partial=a.workspace,
                               scale_ptr=a.scale, amax_ptr=a.amax, scale_inv_ptr=a.scale_inv,
                               M=m, K=k, vec=int(vec))  # fmt: skip
            launches.append((0, grid, cfg.threads, TILE, values))
        if self._dbias:
            values = DBIAS.bind(partial=a.workspace, rows=self.workspace_rows(m), K=k,
                                dbias=a.dbias)  # fmt: skip
            launches.append((1, ceil_div(k, 32), 256, DBIAS, values))
        tensors = (x, act_input, out, out_t, dbias, workspace, scale, amax, scale_inv)
        ptrs = (xa.ptr, act_ptr, oa.ptr, ta.ptr, dbias_ptr, partial_ptr, scale_ptr, amax_ptr,
                scale_inv_ptr)  # fmt: skip
        self._submit(given, tensors, ptrs, (), stream, xa, launches)
        return result


# Entry of the multi-tensor table: x, q, qt, scale, amax, scale_inv, M, K, tile_start, vec.
_ENTRY = struct.Struct("<QQQQQQiiii")
_TABLE_BYTES = _ENTRY.size * MAX_TENSORS + 8


class _TablePack:
    """The multi-tensor table as the kernel's single by-value parameter, in a per-thread
    buffer (cuLaunchKernel copies it at launch, so it is reused right away)."""

    def __init__(self) -> None:
        self._local = threading.local()

    def buffers(self) -> tuple[Any, int]:
        try:
            return self._local.slots
        except AttributeError:
            import ctypes  # (first launch in this thread: not imported with the package)

            data = ctypes.create_string_buffer(_TABLE_BYTES)
            ptrs = (ctypes.c_void_p * 1)(ctypes.addressof(data))
            self._local.keep = (data, ptrs)
            self._local.slots = (data, ctypes.addressof(ptrs))
            return self._local.slots


class MultiCastTransposeKernel(CastKernelBase):
    """Cast + transpose of many tensors of one dtype, :data:`MAX_TENSORS` per launch.

    Call: ``kernel(xs, *, outs=None, scales=None, amaxes=None, scale_invs=None,
    stream=None) -> list of (q, qt)``.

    Args:
        xs: a list or tuple of 2-D CUDA arrays ``(M_i, K_i)``, all of ``in_dtype`` and on one
            device; shapes may differ.
        outs: optional list of ``(q, qt)`` pairs (``(M_i, K_i)`` and ``(K_i, M_i)`` of
            ``out_dtype``); allocated when omitted (or where a pair is None).
        scales / amaxes / scale_invs: tensor scaling only: lists of fp32 device arrays, one
            per tensor (``scale_invs`` optional, or None entries), as in
            :class:`CastTransposeKernel`.
        stream: where to launch.

    Math: each tensor as :class:`CastTransposeKernel` without dbias. Raises
    :class:`~nvrtc_engine.ArgumentError` / :class:`~nvrtc_engine.ArgumentTypeError` naming
    the list entry (``xs[3]``) before any launch.
    """

    _table = _TablePack()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._config = tile_config(self.key)
        self._in = self.key.input
        self._out = self.key.output

    def __call__(
        self, xs: Sequence[Any], *, outs: Sequence[Any] | None = None,
        scales: Sequence[Any] | None = None, amaxes: Sequence[Any] | None = None,
        scale_invs: Sequence[Any] | None = None, stream: Any = None,
    ) -> list[tuple[Any, Any]]:  # fmt: skip
        if xs is None:
            raise ArgumentTypeError("xs", "expected a list or tuple of CUDA arrays, got None")
        n = _sequence_len(xs, "xs", None)
        tensor = self.key.scaling == "tensor"
        _sequence_len(outs, "outs", n)
        if tensor:
            for seq, name in ((scales, "scales"), (amaxes, "amaxes")):
                if seq is None:
                    raise ArgumentError(name, "is required for tensor scaling: one fp32 device "
                                        "array per tensor")  # fmt: skip
        for seq, name in ((scales, "scales"), (amaxes, "amaxes"), (scale_invs, "scale_invs")):
            _sequence_len(seq, name, n)
        results: list[tuple[Any, Any]] = []
        entries: list[tuple[int, ...]] = []
        first = None
        cfg = self._config
        isz, osz = self._in.itemsize, self._out.itemsize
        for i in range(n):
            xa = self._input(xs[i], f"xs[{i}]", self._in)
            if first is None:
                first = xa
            self._same_device(xa, f"xs[{i}]", first)
            m, k = self._matrix(xa, f"xs[{i}]")
            if m > INT32_MAX or k > INT32_MAX:
                raise ArgumentError(f"xs[{i}]", f"has shape {xa.shape}; each side must be < 2**31")
            pair = outs[i] if outs is not None else None
            if pair is not None and (not isinstance(pair, (tuple, list)) or len(pair) != 2):
                raise ArgumentTypeError(f"outs[{i}]", "expected a (q, qt) pair")
            q, qa = self._output(pair[0] if pair else None, f"outs[{i}][0]", xa, (m, k), self._out)
            qt, ta = self._output(pair[1] if pair else None, f"outs[{i}][1]", xa, (k, m),
                                  self._out)  # fmt: skip
            ptrs = self._tensor_scaling(
                scales[i] if scales is not None else None,
                amaxes[i] if amaxes is not None else None,
                scale_invs[i] if scale_invs is not None else None,
                xa,
                (f"scales[{i}]", f"amaxes[{i}]", f"scale_invs[{i}]"),
            )  # fmt: skip
            results.append((q, qt))
            tiles = ceil_div(m, cfg.tile_rows) * ceil_div(k, cfg.tile_cols)
            if tiles:
                vec = aligned16(xa.ptr, qa.ptr, ta.ptr, k * isz, k * osz, m * osz)
                entries.append((xa.ptr, qa.ptr, ta.ptr, *ptrs, m, k, tiles, int(vec)))
        if first is None or not entries:
            return results
        calls = []
        for group in _groups(entries):
            data, address = self._table.buffers()
            start = 0
            for j, (*head, tiles, vec) in enumerate(group):
                _ENTRY.pack_into(data, j * _ENTRY.size, *head, start, vec)
                start += tiles
            struct.pack_into("<ii", data, _ENTRY.size * MAX_TENSORS, len(group), 0)
            calls.append((0, start, cfg.threads, address))
            # (one group at a time: the table buffer is reused by the next group)
            self._launch_packed(first, stream, calls)
            calls.clear()
        return results


def _groups(entries: list[tuple[int, ...]]) -> list[list[tuple[int, ...]]]:
    """Consecutive runs of at most MAX_TENSORS entries and 2**31 - 1 tiles."""
    groups: list[list[tuple[int, ...]]] = [[]]
    tiles = 0
    for entry in entries:
        if entry[-2] > INT32_MAX:
            raise ArgumentError("xs", f"a tensor of {entry[-2]} tiles is too large for one launch")
        if len(groups[-1]) == MAX_TENSORS or tiles + entry[-2] > INT32_MAX:
            groups.append([])
            tiles = 0
        groups[-1].append(entry)
        tiles += entry[-2]
    return groups


def _sequence_len(seq: Any, name: str, n: int | None) -> int:
    if seq is None:
        return 0
    if isinstance(seq, (str, bytes)) or not isinstance(seq, Sequence):
        raise ArgumentTypeError(name, f"expected a list or tuple, got {type(seq).__qualname__}")
    if n is not None and len(seq) != n:
        raise ArgumentError(name, f"has {len(seq)} entries; expected one per tensor ({n})")
    return len(seq)


def _check_grid(grid: int, name: str) -> None:
    if grid > INT32_MAX:
        raise ArgumentError(name, f"needs {grid} tiles, more than one launch holds (2**31 - 1)")


CAST_SPECS: tuple[OpSpec, ...] = (
    TransposeSpec("transpose", "transpose of any dtype (FP8 as raw bytes)"),
    TileSpec("cast_transpose", "cast and transpose in one pass, shared FP8 scale/amax"),
    TileSpec("cast_transpose_dbias", "cast_transpose plus column sums (dbias)", dbias=True),
    *(
        TileSpec(op, f"cast_transpose_dbias of grad * {fn[1:]}'(act_input)", dbias=True, dact=fn)
        for op, fn in DACT_OPS.items()
    ),
    *(
        TileSpec(
            op,
            f"gated backward of {act}: [g*{act}'(a)*b, g*{act}(a)], cast+transposed",
            dact=f"d{act}",
            act=act,
        )
        for op, act in GATED_OPS.items()
    ),
    TileSpec("multi_cast_transpose", "cast_transpose of a list of tensors", multi=True),
)
