"""The MXFP8 tiled kernel's host side, shared by the activation family (its ``tile``
structure) and ``quantize``'s MXFP8 fast path (the identity activation): its parameters
(:data:`TILE`, ``templates/mxfp8_tile.j2``), its configuration (:class:`TileConfig`) and
what the template needs from it."""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Any, NamedTuple

from ...core.signature import Signature, f32, i32, i64, ptr

if TYPE_CHECKING:
    from ...core.key import KernelKey

__all__ = ["MAX_GRID", "TILE", "TileConfig", "fp32_literal", "tile_config", "tile_render_context"]

MAX_GRID = 2**31 - 1  # CUDA's limit on gridDim.x; the kernels loop over what is left
# The tiled kernel's parameters (templates/mxfp8_tile.j2).
TILE = Signature(
    ptr("x", "In::storage", const=True), ptr("grad", "In::storage", const=True),
    ptr("y", "Out::storage"), ptr("y_col", "Out::storage"), ptr("s_row", "unsigned char"),
    ptr("s_col", "unsigned char"), i64("rows"), i64("cols_arg"), i64("s_row_stride"),
    i64("s_col_stride"), ptr("scale_ptr", "float", const=True), ptr("amax_ptr", "float"),
    ptr("scale_inv_ptr", "float"), f32("limit"), f32("alpha"), f32("linear_offset"),
    i32("aligned"),
)  # fmt: skip


class TileConfig(NamedTuple):
    """Tiled kernel (MXFP8 ``columnwise`` and ``both`` outputs): ``threads`` per block,
    ``chunks_per_row`` 16-byte input chunks along a tile row (the tile is
    ``chunks_per_row * 16 / itemsize`` positions wide) and ``iters`` chunks per thread and
    input (the tile is ``iters * threads / chunks_per_row`` rows high: exactly 32, one
    columnwise block). The grid covers the tiles in one pass.

    Every load of a tile comes before its math, one tile per block. Loads are clamped, not
    bounds-checked: rows % 32 == 0 here (MXFP8 columnwise and both), so only a chunk past the
    last column can be outside the tensor; it loads column 0 instead, whose values reach no
    stored byte. Columnwise scales: one thread per tile column computes the E8M0 byte and
    its multiplier (shared memory) for the threads of that column. FP8 outputs are stored as
    32-bit words (see :class:`LaunchConfig`).

    Measured on the H200 (bf16 16384 x 8192 outputs, MXFP8 both): 128 threads with 16 chunks
    per row and 4 each is best for every op (swiglu 96.3% of copy bandwidth, geglu 96.1%,
    dswiglu 93.5%, gelu 84.5% with H at run time; with bounds-checked loads 93.1% / 90.7% /
    80.3% / 82.1% at best). Several tiles per block (software pipelining) and rowwise scales
    split over a block's lanes measured no faster and were removed.
    """

    threads: int
    chunks_per_row: int
    iters: int

    def tile_rows(self) -> int:
        return self.iters * self.threads // self.chunks_per_row

    def tile_cols(self, vec: int) -> int:
        return self.chunks_per_row * vec


def tile_config(key: KernelKey) -> TileConfig:
    """The tiled kernel's configuration for ``key`` (see :class:`TileConfig`)."""
    del key  # one shape for every key (measured: see TileConfig)
    return TileConfig(threads=128, chunks_per_row=16, iters=4)


def tile_render_context(key: KernelKey, cfg: TileConfig) -> dict[str, Any]:
    """What ``templates/mxfp8_tile.j2`` (the MXFP8 tiled kernel) needs from ``cfg`` beside
    the op's values: for the activation family's ``tile`` structure and for ``quantize``'s
    MXFP8 fast path (:mod:`.quantize`, the identity activation)."""
    return dict(threads=cfg.threads, chunks_per_row=cfg.chunks_per_row, iters=cfg.iters,
                fp8_words=key.output.itemsize == 1)  # fmt: skip


def fp32_literal(value: float) -> str:
    """A C++ hex float literal holding fp32(value) exactly."""
    (f32,) = struct.unpack("<f", struct.pack("<f", value))
    return f"{f32.hex()}f"
