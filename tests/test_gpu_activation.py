"""Every activation op on a real GPU against the float64 reference: forward and backward,
plain and gated, every input x output dtype pair, tensor-scaled FP8 and MXFP8 in every
layout, odd shapes and unaligned tails, user buffers, streams, graphs and the grid loop.

Inputs are fresh each run (normal values, outliers of both signs, exact zeros; clamp bounds
for clamped SwiGLU); the seed is printed, so a failure can be replayed. Outputs are
poisoned (0xFF bytes) before the launch, so unwritten elements fail.
"""

from __future__ import annotations

import secrets

import numpy as np
import pytest
from gpu_util import poisoned, poisoned_bytes, to_host, to_torch, torch

import nvrtc_engine as ne
from nvrtc_engine import ArgumentError, reference
from nvrtc_engine.families.activation import kernels as activation_ops
from nvrtc_engine.families.activation.kernels import MXFP8Output
from nvrtc_engine.families.shared.blockscale import mxfp8_scale_shape

pytestmark = pytest.mark.gpu

KIND = reference.ACTIVATION_OPS
FORWARD = [op for op, kind in KIND.items() if kind in ("act", "gated")]
BACKWARD = [op for op, kind in KIND.items() if kind in ("dact", "dgated")]
IN = ["fp32", "fp16", "bf16"]
OUT = ["fp32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2"]
LAYOUTS = ["rowwise", "columnwise", "both"]
LIMIT = 7.0  # clamped SwiGLU's limit in these tests (exact in every input dtype)


@pytest.fixture
def rng():
    seed = secrets.randbits(32)
    print(f"input seed: {seed}")  # shown by pytest when the test fails
    return np.random.default_rng(seed)


def is_gated(op: str) -> bool:
    return KIND[op] in ("gated", "dgated")


def is_backward(op: str) -> bool:
    return KIND[op] in ("dact", "dgated")


def make_inputs(op, in_dtype, lead, cols, rng):
    """Host inputs ``x`` (and ``grad`` for backward ops); ``cols`` is H for gated ops."""
    x = reference.sample_input((*lead, 2 * cols if is_gated(op) else cols), in_dtype, rng)
    if "clamped" in op:  # values exactly on the clamp bounds, where the gradient is kept
        flat = x.reshape(-1)
        picks = rng.choice(flat.size, size=max(4, flat.size // 50), replace=False)
        flat[picks] = rng.choice([-LIMIT, LIMIT], size=picks.size)
    grad = None
    if is_backward(op):
        grad = reference.sample_input((*lead, cols), in_dtype, rng, outliers=4.0)
    return x, grad


def tie_budget(n: int) -> int:
    """Elements that may round the other way than the float64 value: those within the fp32
    error of a rounding midpoint. A numpy fp32 emulation of the kernels' math gives up to
    0.04% for fp16 output (dgelu); systematic rounding errors would give 10-50%."""
    return max(4, n // 200)


def call(kernel, x, grad, out=None, **kwargs):
    """Launch with the op's signature: (x, out) forward, (grad, x, out) backward."""
    op = kernel.key.op
    if "clamped" in op:
        kwargs.setdefault("limit", LIMIT)
    if is_backward(op):
        return kernel(grad, x, out, **kwargs)
    return kernel(x, out, **kwargs)


def expected(op, x, grad, **params):
    return reference.op_values(op, x, grad, limit=params.get("limit", LIMIT),
                               **{k: v for k, v in params.items() if k != "limit"})  # fmt: skip


def device_inputs(kernel, x, grad):
    dt = kernel.key.in_dtype
    return to_torch(x, dt), (None if grad is None else to_torch(grad, dt))


def check_unscaled_or_tensor(kernel, x, grad, rng, *, xt=None, gt=None, out=None, **params):
    """Run a none/tensor-scaled kernel and check out (and amax, scale_inv) against the
    reference. Returns the output tensor."""
    key = kernel.key
    ref = expected(key.op, x, grad, **params)
    if xt is None:
        xt, gt = device_inputs(kernel, x, grad)
    out = poisoned(ref.y.shape, key.out_dtype) if out is None else out
    kwargs = dict(params)
    scale = 1.0
    if key.scaling == "tensor":
        scale = float(np.float32(rng.uniform(0.5, 8.0)))
        kwargs.update(
            scale=torch.tensor([scale], dtype=torch.float32, device="cuda"),
            amax=torch.zeros(1, dtype=torch.float32, device="cuda"),
            scale_inv=torch.full((1,), float("nan"), device="cuda"),
        )
    got = call(kernel, xt, gt, out, **kwargs)
    assert got is out
    torch.cuda.synchronize()
    n, at_ties = reference.check_close(
        to_host(out, key.out_dtype), ref.y * scale, key.out_dtype, ref.tolerance * scale
    )
    if key.out_dtype != "fp32":  # fp32 output is checked to a tolerance, not bit for bit
        assert at_ties <= tie_budget(n), f"{at_ties} of {n} elements at rounding ties"
    if key.scaling == "tensor":
        # the kernel's amax is the max of fp32 values, each within its tolerance of y
        lo = np.float32(np.max(np.maximum(np.abs(ref.y) - ref.tolerance, 0.0)))
        hi = np.float32(np.max(np.abs(ref.y) + ref.tolerance))
        amax = kwargs["amax"].item()
        assert lo * (1 - 2**-22) <= amax <= hi * (1 + 2**-22), (lo, amax, hi)
        assert kwargs["scale_inv"].item() == float(np.float32(1.0) / np.float32(scale))
    return out


def directions(layout):
    return ("rowwise", "columnwise") if layout == "both" else (layout,)


def check_mxfp8(kernel, x, grad, *, out=None, **params):
    """Run an MXFP8 kernel and check data and scales of every direction of its layout."""
    key = kernel.key
    ref = expected(key.op, x, grad, **params)
    xt, gt = device_inputs(kernel, x, grad)
    res = call(kernel, xt, gt, out, **params)
    assert isinstance(res, MXFP8Output)
    torch.cuda.synchronize()
    cols = ref.y.shape[-1]
    y = ref.y.reshape(-1, cols)
    tol = ref.tolerance.reshape(y.shape)
    rows = y.shape[0]
    for direction in ("rowwise", "columnwise"):
        data, scales = getattr(res, direction + "_data"), getattr(res, direction + "_scale_inv")
        if direction not in directions(key.layout):
            assert data is None and scales is None
            continue
        assert tuple(data.shape) == ref.y.shape
        assert scales.dtype == torch.uint8 and scales.dim() == 2
        h, w = mxfp8_scale_shape(rows, cols, direction, padded=False)
        n, at_ties, on_boundary = reference.check_mxfp8(
            to_host(data, key.out_dtype).reshape(rows, cols), scales.cpu().numpy()[:h, :w],
            y, tol, key.out_dtype, direction, name=str(key),
        )  # fmt: skip
        assert at_ties <= tie_budget(n), f"{direction}: {at_ties} of {n} at ties"
        # Blocks on a power-of-two boundary are still checked (either neighbouring exponent,
        # with data matching the kernel's own scale); with bf16 inputs they are common, so
        # their number is not bounded.
        assert on_boundary <= h * w
    return res


# -- every op x dtype pair ----------------------------------------------------------------


@pytest.mark.parametrize("out_dtype", OUT)
@pytest.mark.parametrize("in_dtype", IN)
@pytest.mark.parametrize("op", FORWARD + BACKWARD)
def test_every_op_and_dtype_pair(op, in_dtype, out_dtype, rng):
    """High-precision and tensor-scaled FP8 output. Two shapes: a last dimension (or H) that
    is not a multiple of the vector width, with several leading dimensions (scalar tails);
    and an aligned one whose rows do not fill the last tile."""
    kernel = ne.get_kernel(op, in_dtype=in_dtype, out_dtype=out_dtype)
    for lead, cols in [((3, 5), 67), ((33,), 512)]:
        x, grad = make_inputs(op, in_dtype, lead, cols, rng)
        check_unscaled_or_tensor(kernel, x, grad, rng)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("out_dtype", ["fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("in_dtype", IN)
@pytest.mark.parametrize("op", FORWARD + BACKWARD)
def test_every_op_mxfp8(op, in_dtype, out_dtype, layout, rng):
    """MXFP8 in every layout: scales bit-exact (but at power-of-two boundaries, see
    reference.check_mxfp8), data exact but at rounding ties. Rowwise with a row count that
    is not a multiple of 32; a width (or H) of 96, which leaves half of the last tile
    empty; several leading dimensions."""
    kernel = ne.get_kernel(op, in_dtype=in_dtype, out_dtype=out_dtype, scaling="mxfp8",
                           layout=layout)  # fmt: skip
    lead = (37,) if layout == "rowwise" else (2, 32)
    x, grad = make_inputs(op, in_dtype, lead, 96, rng)
    check_mxfp8(kernel, x, grad)


# -- kernel structure: specialization, alignment, grid loop ---------------------------------


@pytest.mark.parametrize(
    ("op", "fields"),
    [
        ("swiglu", dict(dtype="fp8")),
        ("dgeglu", dict(in_dtype="fp16", out_dtype="bf16")),
        ("dclamped_swiglu", dict(dtype="fp8", scaling="mxfp8", layout="both")),
        ("srelu", dict(in_dtype="fp32", out_dtype="e5m2", scaling="mxfp8", layout="columnwise")),
    ],
)
def test_hidden_size_specialized_equals_general(op, fields, rng):
    """Both kernels against the reference on the same inputs, and the specialized one
    refuses another size."""
    hidden = 256
    special = ne.get_kernel(op, hidden_size=hidden, **fields)
    general = ne.get_kernel(op, **fields)
    assert special.key.hidden_size == hidden and general.key.hidden_size is None
    x, grad = make_inputs(op, special.key.in_dtype, (64,), hidden, rng)
    for kernel in (special, general):
        if kernel.key.scaling == "mxfp8":
            check_mxfp8(kernel, x, grad)
        else:
            check_unscaled_or_tensor(kernel, x, grad, rng)
    with pytest.raises(ArgumentError, match=f"hidden_size={hidden}"):
        call(special, *make_inputs_t(special, op, (4,), hidden + 32, rng))


def make_inputs_t(kernel, op, lead, cols, rng):
    return device_inputs(kernel, *make_inputs(op, kernel.key.in_dtype, lead, cols, rng))


@pytest.mark.parametrize("op", ["geglu", "dswiglu", "dclamped_swiglu", "dsilu"])
@pytest.mark.parametrize("out_dtype", ["bf16", "fp8_e4m3"])
def test_unaligned_pointers_take_the_scalar_path(op, out_dtype, rng):
    kernel = ne.get_kernel(op, dtype=out_dtype)
    x, grad = make_inputs(op, "bf16", (9,), 128, rng)
    # views that start one element into their storage: no 16-byte vectors
    xt = to_torch(np.concatenate([x.reshape(-1)[:1], x.reshape(-1)]), "bf16")[1:].view(x.shape)
    gt = None
    if grad is not None:
        g = grad.reshape(-1)
        gt = to_torch(np.concatenate([g[:1], g]), "bf16")[1:].view(grad.shape)
    assert xt.data_ptr() % 16 != 0
    ref_shape = expected(op, x, grad).y.shape
    out = poisoned((int(np.prod(ref_shape)) + 1,), out_dtype)[1:].view(ref_shape)
    check_unscaled_or_tensor(kernel, x, grad, rng, xt=xt, gt=gt, out=out)


@pytest.mark.parametrize(
    ("op", "fields"),
    [
        ("swiglu", dict(dtype="fp8")),
        ("dreglu", dict(dtype="bf16")),
        ("dgelu", dict(dtype="fp8", scaling="mxfp8", layout="both")),
        ("dqgeglu", dict(dtype="fp8", scaling="mxfp8", layout="both")),
        ("glu", dict(dtype="e5m2", scaling="mxfp8", layout="rowwise")),
    ],
)
def test_grid_smaller_than_the_tiles_loops(op, fields, rng, monkeypatch):
    """With the grid capped at 3 blocks, each block loops over many tiles (shared memory
    reused between tiles): the result is the same as with one block per tile."""
    kernel = ne.get_kernel(op, **fields)
    x, grad = make_inputs(op, kernel.key.in_dtype, (96,), 160, rng)
    monkeypatch.setattr(activation_ops, "MAX_GRID", 3)
    if kernel.key.scaling == "mxfp8":
        check_mxfp8(kernel, x, grad)
    else:
        check_unscaled_or_tensor(kernel, x, grad, rng)


@pytest.mark.parametrize(
    "config", [(256, 1), (128, 4), (1024, 2), (64, 8), (128, 2, True), (256, 1, True)]
)
@pytest.mark.parametrize(
    ("op", "fields"),
    [
        ("swiglu", dict(dtype="bf16")),
        ("dswiglu", dict(dtype="fp8")),
        ("clamped_swiglu", dict(in_dtype="fp16", out_dtype="fp32")),
        ("gelu", dict(dtype="fp8", scaling="mxfp8")),
        ("dgeglu", dict(in_dtype="fp32", out_dtype="fp8_e5m2", scaling="mxfp8")),
    ],
)
def test_row_flat_kernel_steps_across_rows(op, fields, config, rng, monkeypatch):
    """The row-flat kernel (gated ops, MXFP8 rowwise) walks chunks row by row: with several
    launch configurations (any the launch heuristic may pick), rows
    of fewer chunks than a block, of a number of chunks that does not divide the block's,
    and of more; one pass and a grid capped at 3 blocks that loop. Plain ops with MXFP8 also
    in owner mode (a thread per 32-value block), and with compact scale rows (H a multiple
    of 128: block k has scale k) as well as padded ones."""
    from nvrtc_engine.core import config as ne_config
    from nvrtc_engine.core.engine import Engine

    threads, unroll, owner = (*config, False)[:3]
    cfg = activation_ops.LaunchConfig(threads, unroll, owner=owner)
    monkeypatch.setattr(activation_ops, "row_config", lambda key: cfg)
    # memory only: the disk cache holds this key with the default configuration
    monkeypatch.setattr(ne_config, "_current", ne_config.settings()._replace(
                                                       disable_disk_cache=True))  # fmt: skip
    key = ne.make_key(op, **fields)
    assert key.spec.structure(key) == "rows"
    mx = key.scaling == "mxfp8"
    if owner and key.spec.gated:
        pytest.skip("owner mode is for plain ops")
    for cap in (activation_ops.MAX_GRID, 3):
        monkeypatch.setattr(activation_ops, "MAX_GRID", cap)
        kernel = Engine().get(key)  # a new kernel: no launch plan from another grid cap
        assert kernel._threads == threads
        shapes = [((5,), 32), ((3, 7), 96), ((11,), 1056), ((2,), 4128), ((1,), 128),
                  ((37,), 4096)]  # fmt: skip
        for lead, cols in shapes:
            if not mx and cols > 1000:
                cols += 8  # not a multiple of 32 (still of 8)
            x, grad = make_inputs(op, key.in_dtype, lead, cols, rng)
            if mx:
                check_mxfp8(kernel, x, grad)
            else:
                check_unscaled_or_tensor(kernel, x, grad, rng)


# -- MXFP8 buffers ------------------------------------------------------------------------


def test_mxfp8_user_buffers_padded_and_compact(rng):
    kernel = ne.get_kernel("dswiglu", dtype="fp8", scaling="mxfp8", layout="both")
    x, grad = make_inputs("dswiglu", "bf16", (64,), 64, rng)  # output (64, 128)
    rows, cols = 64, 128
    padded = MXFP8Output(
        poisoned((rows, cols), "fp8_e4m3"),
        poisoned_bytes(mxfp8_scale_shape(rows, cols, "rowwise")),
        poisoned((rows, cols), "fp8_e4m3"),
        poisoned_bytes(mxfp8_scale_shape(rows, cols, "columnwise")),
    )
    res = check_mxfp8(kernel, x, grad, out=padded)
    for got, given in zip(res, padded, strict=True):
        assert got is given
    rs, cs = padded.rowwise_scale_inv.cpu().numpy(), padded.columnwise_scale_inv.cpu().numpy()
    assert (rs[rows:] == 0xFF).all() and (rs[:, cols // 32 :] == 0xFF).all()  # padding kept
    assert (cs[rows // 32 :] == 0xFF).all() and (cs[:, cols:] == 0xFF).all()

    # data allocated, scales given in the compact shape
    def unpadded(direction):
        return poisoned_bytes(mxfp8_scale_shape(rows, cols, direction, padded=False))

    compact = MXFP8Output(
        rowwise_scale_inv=unpadded("rowwise"), columnwise_scale_inv=unpadded("columnwise")
    )
    res2 = check_mxfp8(kernel, x, grad, out=compact)
    assert res2.rowwise_scale_inv is compact.rowwise_scale_inv
    assert torch.equal(res2.rowwise_scale_inv, padded.rowwise_scale_inv[:rows, : cols // 32])
    assert torch.equal(
        res2.columnwise_data.view(torch.uint8), padded.columnwise_data.view(torch.uint8)
    )


@pytest.mark.parametrize("owner", [False, True])
@pytest.mark.parametrize("op", ["gelu", "dsrelu"])
def test_plain_mxfp8_rowwise_compact_and_padded_scales_agree(op, owner, rng, monkeypatch):
    """Plain ops, MXFP8 rowwise: scales in a compact buffer (row stride cols / 32, the flat
    index) and in a padded one (the row computed) are bit for bit the same, in owner mode
    and not, and the data too; odd row counts, one row, H of 3 and of 33 blocks."""
    from nvrtc_engine.core import config as ne_config
    from nvrtc_engine.core.engine import Engine

    cfg = activation_ops.LaunchConfig(128, 2, owner=owner)
    monkeypatch.setattr(activation_ops, "row_config", lambda key: cfg)
    monkeypatch.setattr(ne_config, "_current", ne_config.settings()._replace(
                                                       disable_disk_cache=True))  # fmt: skip
    kernel = Engine().get(ne.make_key(op, dtype="fp8", scaling="mxfp8"))
    for rows, cols in [(1, 96), (7, 96), (129, 1056), (3, 32)]:
        x, grad = make_inputs(op, "bf16", (rows,), cols, rng)
        shape = mxfp8_scale_shape(rows, cols, "rowwise")
        padded = MXFP8Output(rowwise_scale_inv=poisoned_bytes(shape))
        shape = mxfp8_scale_shape(rows, cols, "rowwise", padded=False)
        compact = MXFP8Output(rowwise_scale_inv=poisoned_bytes(shape))
        a = check_mxfp8(kernel, x, grad, out=padded)
        b = check_mxfp8(kernel, x, grad, out=compact)
        assert torch.equal(a.rowwise_scale_inv[:rows, : cols // 32], b.rowwise_scale_inv)
        assert torch.equal(a.rowwise_data.view(torch.uint8), b.rowwise_data.view(torch.uint8))
        ps = a.rowwise_scale_inv.cpu().numpy()
        assert (ps[rows:] == 0xFF).all() and (ps[:, cols // 32 :] == 0xFF).all()


@pytest.mark.parametrize("layout", ["both", "columnwise"])
@pytest.mark.parametrize("op", ["gelu", "swiglu", "dswiglu"])
def test_tile_shapes_agree_bit_for_bit(op, layout, rng, monkeypatch):
    """MXFP8 columnwise and both: several tile shapes (threads x chunks per row x chunks
    per thread) give the same bytes, checked against the reference, with partial column
    tiles (H = 160) and a grid capped at 3 blocks (the blocks loop over the tiles)."""
    from nvrtc_engine.core import config as ne_config
    from nvrtc_engine.core.engine import Engine

    monkeypatch.setattr(ne_config, "_current", ne_config.settings()._replace(
                                                       disable_disk_cache=True))  # fmt: skip
    key = ne.make_key(op, dtype="fp8", scaling="mxfp8", layout=layout)
    results = []
    for shape in [(64, 8, 4), (128, 16, 4), (256, 32, 4)]:
        cfg = activation_ops.TileConfig(*shape)
        monkeypatch.setattr(activation_ops, "tile_config", lambda key, cfg=cfg: cfg)
        for cap in (activation_ops.MAX_GRID, 3):
            monkeypatch.setattr(activation_ops, "MAX_GRID", cap)
            kernel = Engine().get(key)  # a new kernel: reads MAX_GRID afresh
            x, grad = make_inputs(op, "bf16", (160,), 160, np.random.default_rng(7))
            res = check_mxfp8(kernel, x, grad)
            results.append([t.view(torch.uint8).cpu() for t in res if t is not None])
    for got in results[1:]:
        for a, b in zip(results[0], got, strict=True):
            assert torch.equal(a, b)


@pytest.mark.parametrize("op", ["gelu", "dgelu", "swiglu", "dswiglu"])
def test_row_flat_modes_agree_bit_for_bit(op, monkeypatch):
    """MXFP8 rowwise (row-flat kernel): lane mode at several block shapes and, for plain
    ops, owner mode give the same bytes, checked against the reference, with compact and
    padded scale rows (H of 4 and of 33 blocks), several rows per block and a grid capped
    at 3 blocks."""
    from nvrtc_engine.core import config as ne_config
    from nvrtc_engine.core.engine import Engine

    monkeypatch.setattr(ne_config, "_current", ne_config.settings()._replace(
                                                       disable_disk_cache=True))  # fmt: skip
    key = ne.make_key(op, dtype="fp8", scaling="mxfp8")
    lc = activation_ops.LaunchConfig
    configs = [lc(128, 4), lc(256, 8), lc(64, 4)]
    if op in ("gelu", "dgelu"):
        configs.append(lc(128, 2, owner=True))
    cases = [(lead, cols, padded) for lead, cols in [((7,), 128), ((129,), 1056), ((3,), 32)]
             for padded in (False, True)]  # fmt: skip
    results: dict = {case: [] for case in cases}
    for cap in (activation_ops.MAX_GRID, 3):
        monkeypatch.setattr(activation_ops, "MAX_GRID", cap)
        for cfg in configs:  # one kernel per configuration and grid cap, every case
            monkeypatch.setattr(activation_ops, "row_config", lambda key, cfg=cfg: cfg)
            kernel = Engine().get(key)
            for lead, cols, padded in cases:
                x, grad = make_inputs(op, "bf16", lead, cols, np.random.default_rng(11))
                out_cols = 2 * cols if op == "dswiglu" else cols
                shape = mxfp8_scale_shape(lead[0], out_cols, "rowwise", padded=padded)
                out = MXFP8Output(rowwise_scale_inv=poisoned_bytes(shape))
                res = check_mxfp8(kernel, x, grad, out=out)
                results[(lead, cols, padded)].append(
                    [res.rowwise_data.view(torch.uint8).cpu(), res.rowwise_scale_inv.cpu()]
                )
    for case, got in results.items():
        for other in got[1:]:
            for a, b in zip(got[0], other, strict=True):
                assert torch.equal(a, b), case


def test_mxfp8_allocated_scales_are_padded_with_zeros_on_a_side_stream(rng):
    kernel = ne.get_kernel("gelu", dtype="fp8", scaling="mxfp8", layout="both")
    x, _ = make_inputs("gelu", "bf16", (32,), 64, rng)  # padding: 96 rows, 2 + 64 columns
    xt = to_torch(x, "bf16")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        torch.cuda._sleep(1_000_000)  # the zeroing must be ordered on the launch stream
        res = kernel(xt)
    stream.synchronize()
    assert res.rowwise_scale_inv.shape == (128, 4) and res.columnwise_scale_inv.shape == (4, 128)
    rs, cs = res.rowwise_scale_inv.cpu().numpy(), res.columnwise_scale_inv.cpu().numpy()
    assert (rs[32:] == 0).all() and (rs[:, 2:] == 0).all()
    assert (cs[1:] == 0).all() and (cs[:, 64:] == 0).all()
    assert (rs[:32, :2] > 100).all() and (cs[:1, :64] > 100).all()  # real scales
    assert res.rowwise_data.dtype == torch.float8_e4m3fn
    ref = expected("gelu", x, None)
    reference.check_mxfp8(to_host(res.rowwise_data, "fp8_e4m3"), rs[:32, :2], ref.y, ref.tolerance,
                          "fp8_e4m3", "rowwise")  # fmt: skip


# -- clamped SwiGLU parameters, amax, graphs, errors ----------------------------------------


@pytest.mark.parametrize("op", ["clamped_swiglu", "dclamped_swiglu"])
def test_clamped_swiglu_runtime_parameters(op, rng):
    kernel = ne.get_kernel(op, in_dtype="fp32", out_dtype="fp32")
    x, grad = make_inputs(op, "fp32", (16,), 96, rng)
    for params in (dict(limit=LIMIT), dict(limit=2.5, alpha=1.0, linear_offset=0.0),
                   dict(limit=0.75, alpha=3.0, linear_offset=-0.5)):  # fmt: skip
        check_unscaled_or_tensor(kernel, x, grad, rng, **params)


def test_amax_accumulates_across_gated_launches():
    kernel = ne.get_kernel("swiglu", dtype="fp8")
    amax = torch.zeros(1, device="cuda")
    s = torch.ones(1, device="cuda")
    x = torch.full((4, 256), 3.0, dtype=torch.bfloat16, device="cuda")
    kernel(x, scale=s, amax=amax)
    kernel(x * 0.5, scale=s, amax=amax)
    torch.cuda.synchronize()
    want = float(reference.silu(np.array([3.0]))[0] * 3.0)
    assert amax.item() == pytest.approx(want, rel=1e-6)


def test_cuda_graph_capture_of_a_tiled_kernel(rng):
    kernel = ne.get_kernel("dswiglu", dtype="fp8", scaling="mxfp8", layout="both")
    x, grad = make_inputs("dswiglu", "bf16", (64,), 128, rng)
    xt, gt = device_inputs(kernel, x, grad)
    out = MXFP8Output(
        poisoned((64, 256), "fp8_e4m3"), poisoned_bytes((128, 8)),
        poisoned((64, 256), "fp8_e4m3"), poisoned_bytes((4, 256)),
    )  # fmt: skip
    kernel(gt, xt, out)  # load the module before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kernel(gt, xt, out)
    for t in out:
        t.view(torch.uint8).fill_(0xFF)
    graph.replay()
    torch.cuda.synchronize()
    ref = expected("dswiglu", x, grad)
    scales = out.columnwise_scale_inv.cpu().numpy()[:2]
    data = to_host(out.columnwise_data, "fp8_e4m3")
    reference.check_mxfp8(data, scales, ref.y, ref.tolerance, "fp8_e4m3", "columnwise")


def test_errors_before_launch_with_real_tensors():
    swiglu = ne.get_kernel("swiglu", dtype="bf16")
    with pytest.raises(ArgumentError, match="must be even"):
        swiglu(torch.zeros(4, 7, dtype=torch.bfloat16, device="cuda"))
    mx = ne.get_kernel("gelu", dtype="fp8", scaling="mxfp8", layout="both")
    with pytest.raises(ArgumentError, match="number of rows"):
        mx(torch.zeros(48, 64, dtype=torch.bfloat16, device="cuda"))
    dgelu = ne.get_kernel("dgelu", dtype="bf16")
    x = torch.zeros(4, 64, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ArgumentError, match="grad: has dtype torch.float32"):
        dgelu(torch.zeros(4, 64, device="cuda"), x)
    with pytest.raises(ArgumentError, match=r"grad: has shape \(4, 63\)"):
        dgelu(torch.zeros(4, 63, dtype=torch.bfloat16, device="cuda"), x)


def test_empty_inputs_launch_nothing():
    assert ne.get_kernel("swiglu", dtype="bf16")(
        torch.empty(0, 64, dtype=torch.bfloat16, device="cuda")
    ).shape == (0, 32)
    res = ne.get_kernel("gelu", dtype="fp8", scaling="mxfp8", layout="both")(
        torch.empty(0, 64, dtype=torch.bfloat16, device="cuda")
    )
    assert res.rowwise_data.shape == (0, 64) and res.columnwise_scale_inv.shape == (0, 128)


def test_cupy_arrays():
    cupy = pytest.importorskip("cupy")
    rng = np.random.default_rng(secrets.randbits(32))
    kernel = ne.get_kernel("dgeglu", in_dtype="fp16", out_dtype="fp8", scaling="mxfp8",
                           layout="both")  # fmt: skip
    x, grad = make_inputs("dgeglu", "fp16", (64,), 64, rng)
    res = kernel(cupy.asarray(grad), cupy.asarray(x))  # uint8 data and scales from CuPy
    cupy.cuda.get_current_stream().synchronize()
    ref = expected("dgeglu", x, grad)
    data = cupy.asnumpy(res.rowwise_data).view(ne.DTYPES["fp8_e4m3"].numpy())
    reference.check_mxfp8(data, cupy.asnumpy(res.rowwise_scale_inv)[:64, :4], ref.y, ref.tolerance,
                          "fp8_e4m3", "rowwise")  # fmt: skip
