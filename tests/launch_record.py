"""What every family launches for a representative set of calls, as the stub libcuda sees it.

    python tests/launch_record.py OUT.json    # record, e.g. before and after a change

Import it only in a process of its own (tests/test_launch_stub.py runs it in a subprocess):
importing it loads the stub driver (tests/stub_driver.py) and fake torch (tests/fake_torch.py).
Each call is made three times (first call, the call that prepares its launch, a prepared
call); the launches of the three must be equal, and are written once:
symbol, grid, block, shared memory, dependent flag and each parameter by its name in the
rendered source, the bytes the driver reads (4 for int/float, 8 for pointers and long long),
pointers normalised to ``name+offset`` of the test's arrays (``alloc(bytes)+offset`` for
outputs the kernel allocated).
"""

from __future__ import annotations

import json
import re
import struct
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import fake_torch  # noqa: E402
import stub_driver  # noqa: E402

stub = stub_driver.load()
torch = fake_torch.module(current_stream=0x5000)
sys.modules["torch"] = torch

import nvrtc_engine as ne  # noqa: E402
from nvrtc_engine.core.render import render  # noqa: E402
from nvrtc_engine.families.shared.blockscale import mxfp8_scale_shape, nvfp4_scale_shape  # noqa: E402

D = fake_torch.DTYPES
NAMED: list[tuple[int, int, str]] = []  # (start, end, name)
ALLOCATED: list[tuple[int, int]] = []
_base = [0x7A0000000000]
_allocate = fake_torch._allocate


def _recording_allocate(nbytes: int) -> int:
    address = _allocate(nbytes)
    ALLOCATED.append((address, nbytes))
    return address


fake_torch._allocate = _recording_allocate


def T(name: str, shape: tuple[int, ...], dtype: str = "bfloat16", offset: int = 0):
    """A named tensor at a fresh address (plus ``offset`` bytes)."""
    _base[0] += 1 << 28
    t = fake_torch.Tensor(shape, D[dtype], ptr=_base[0] + offset)
    NAMED.append((t.data_ptr(), t.data_ptr() + max(t.nbytes, 1), name))
    return t


def _pointer(value: int) -> object:
    for start, end, name in NAMED:
        if start <= value <= end:  # (one past the end: an empty region at the end)
            return f"{name}+{value - start}"
    for start, nbytes in ALLOCATED:
        if start <= value <= start + nbytes:
            return f"alloc({nbytes})+{value - start}"
    return value


def _parameters(source: str, symbol: str) -> list[tuple[str, str]]:
    """``(type, name)`` of each parameter of kernel ``symbol`` in the rendered source."""
    match = re.search(r"__global__[^;{]*?\b" + re.escape(symbol) + r"\(", source)
    assert match, symbol
    depth, start = 1, match.end()
    i = start
    while depth:
        depth += {"(": 1, ")": -1}.get(source[i], 0)
        i += 1
    params = []
    for decl in source[start : i - 1].split(","):
        decl = " ".join(decl.split())
        name = re.findall(r"\w+", decl)[-1]
        params.append((decl[: -len(name)].strip(), name))
    return params


_SIGNATURES: dict[int, tuple[str, list[tuple[str, str]]]] = {}


def _register(kernel) -> None:
    source = render(kernel.key).source
    for symbol, function in zip(kernel.artifact.symbols, kernel.loaded(0).functions, strict=True):
        params = _parameters(source, symbol)
        _SIGNATURES[int(function)] = (symbol, params)
        if len(params) == 1 and "Table" in params[0][0]:
            stub.record_blob(function, 60 * 64 + 8)  # cast.cu.j2's Table: 60 entries, count
            stub.record_params(0, function)
        else:
            stub.record_params(len(params), function)


def _decode(launch: dict) -> dict:
    symbol, params = _SIGNATURES[launch["function"]]
    values: dict[str, object] = {}
    if launch["blob"]:
        blob = launch["blob"]
        entries = []
        count = struct.unpack_from("<i", blob, 60 * 64)[0]
        for j in range(count):
            e = struct.unpack_from("<QQQQQQiiii", blob, 64 * j)
            entries.append([_pointer(v) if v >= 2**32 else v for v in e])
        values["t"] = {"count": count, "entries": entries}
        params = []
    for (ctype, name), slot in zip(params, launch["params"], strict=True):
        if "*" in ctype or "long long" in ctype:
            values[name] = _pointer(slot) if slot >= 2**32 else slot
        elif "float" in ctype:
            values[name] = struct.unpack("<f", struct.pack("<I", slot & 0xFFFFFFFF))[0]
        else:
            values[name] = struct.unpack("<i", struct.pack("<I", slot & 0xFFFFFFFF))[0]
    return {"symbol": symbol, "grid": list(launch["grid"]), "block": list(launch["block"]),
            "shmem": launch["shmem"], "dependent": launch["dependent"],
            "stream": launch["stream"], "params": values}  # fmt: skip


CHECKED: list[int] = [0]  # calls of the checked path's launches (Kernel._submit, _launch_packed)


def _counted(kernel) -> None:
    """Count ``kernel``'s checked launches in :data:`CHECKED` (once per kernel object)."""
    for name in ("_submit", "_launch_packed"):
        if name in vars(kernel):
            continue
        launch = getattr(kernel, name)

        def counted(*args, _launch=launch, **kwargs):
            CHECKED[0] += 1
            return _launch(*args, **kwargs)

        setattr(kernel, name, counted)


def record(call, *kernels, again: list | None = None) -> list[dict]:
    """The launches of ``call`` (of ``kernels``), decoded; made three times (the checked
    path, which prepares the call's launches where it can, unless an earlier call of the same
    key did, then twice more), which must launch the same. ``again``, a list, gets the number
    of the second and third calls that took the checked path (0 for a prepared call, 2 for
    one that cannot be)."""
    for kernel in kernels:
        _register(kernel)
        _counted(kernel)
    runs, checked = [], [CHECKED[0]]
    for _ in range(3):
        before = stub.launches
        call()
        runs.append([_decode(launch) for launch in stub.since(before)])
        checked.append(CHECKED[0])
    if again is not None:
        again.append(checked[3] - checked[1])
    assert runs[0] == runs[1] == runs[2], json.dumps(runs, indent=1)
    return runs[0]


def record_all() -> dict[str, tuple[list[dict], tuple, int]]:
    """Every case of :func:`cases`: its launches, its kernels and how many of its second and
    third calls took the checked path."""
    out = {}
    for name, (call, *kernels) in cases().items():
        again: list[int] = []
        out[name] = (record(call, *kernels, again=again), tuple(kernels), again[0])
    return out


def cases() -> dict[str, tuple]:
    k = ne.get_kernel
    s, a, si = (
        T("scale", (1,), "float32"),
        T("amax", (1,), "float32"),
        T("scale_inv", (1,), "float32"),
    )
    x = T("x", (4, 96))
    y = T("y", (4, 96))
    xu = T("xu", (4, 96), offset=2)
    g = T("grad", (4, 96))
    y8 = T("y8", (4, 96), "uint8")
    h, o = T("h", (6, 256)), T("o", (6, 128))
    dh = T("dh", (6, 256))
    c = {}
    gelu = k("gelu", dtype="bf16")
    c["gelu flat"] = (lambda: gelu(x, y), gelu)
    c["gelu flat unaligned"] = (lambda: gelu(xu, y), gelu)
    c["gelu flat allocates"] = (lambda: gelu(x), gelu)
    g8 = k("gelu", dtype="fp8")
    c["gelu fp8 tensor"] = (lambda: g8(x, y8, scale=s, amax=a, scale_inv=si), g8)
    dg = k("dgelu", dtype="bf16")
    c["dgelu flat"] = (lambda: dg(g, x, y), dg)
    c["dgelu flat allocates"] = (lambda: dg(g, x), dg)
    sw = k("swiglu", dtype="bf16")
    c["swiglu rows"] = (lambda: sw(h, o), sw)
    dsw = k("dswiglu", dtype="bf16")
    c["dswiglu rows"] = (lambda: dsw(o, h, dh), dsw)
    cs = k("clamped_swiglu", dtype="bf16")
    c["clamped_swiglu rows"] = (lambda: cs(h, o, limit=3.5, alpha=1.25), cs)
    dcs = k("dclamped_swiglu", dtype="bf16")
    c["dclamped_swiglu rows"] = (lambda: dcs(o, h, dh, limit=7.0), dcs)
    xm = T("xm", (64, 128))
    gm = k("gelu", dtype="fp8", scaling="mxfp8")
    out_mx = ne.families.activation.spec.MXFP8Output(
        T("mx_row", (64, 128), "uint8"),
        T("mx_row_s", mxfp8_scale_shape(64, 128, "rowwise"), "uint8"),
    )
    c["gelu mxfp8 rowwise rows"] = (lambda: gm(xm, out_mx), gm)
    gb = k("gelu", dtype="fp8", scaling="mxfp8", layout="both")
    out_b = ne.families.activation.spec.MXFP8Output(
        T("mxb_row", (64, 128), "uint8"),
        T("mxb_row_s", mxfp8_scale_shape(64, 128, "rowwise"), "uint8"),
        T("mxb_col", (64, 128), "uint8"),
        T("mxb_col_s", mxfp8_scale_shape(64, 128, "columnwise"), "uint8"),
    )
    c["gelu mxfp8 both tile"] = (lambda: gb(xm, out_b), gb)
    swb = k("swiglu", dtype="fp8", scaling="mxfp8", layout="both")
    hb = T("hb", (64, 256))
    out_swb = ne.families.activation.spec.MXFP8Output(
        T("swb_row", (64, 128), "uint8"),
        T("swb_row_s", mxfp8_scale_shape(64, 128, "rowwise"), "uint8"),
        T("swb_col", (64, 128), "uint8"),
        T("swb_col_s", mxfp8_scale_shape(64, 128, "columnwise"), "uint8"),
    )
    c["swiglu mxfp8 both tile"] = (lambda: swb(hb, out_swb), swb)
    cast8 = k("cast", dtype="fp8")
    c["cast fp8 tensor"] = (lambda: cast8(x, y8, scale=s, amax=a), cast8)
    # cast / transpose
    xt, ot = T("xt", (100, 70), "float16"), T("ot", (70, 100), "float16")
    tr = k("transpose", dtype="fp16")
    c["transpose"] = (lambda: tr(xt, ot), tr)
    c["transpose allocates"] = (lambda: tr(xt), tr)
    xc = T("xc", (160, 320))
    q, qt = T("q", (160, 320), "uint8"), T("qt", (320, 160), "uint8")
    ct = k("cast_transpose", dtype="fp8")
    c["cast_transpose"] = (lambda: ct(xc, out=q, out_t=qt, scale=s, amax=a), ct)
    db = k("cast_transpose_dbias", dtype="fp8")
    dbias = T("dbias", (320,))
    ws = T("ws", (db.workspace_rows(160), 320), "float32")
    c["cast_transpose_dbias"] = (
        lambda: db(xc, out=q, out_t=qt, dbias=dbias, workspace=ws, scale=s, amax=a, scale_inv=si),
        db,
    )
    c["cast_transpose_dbias allocates"] = (lambda: db(xc, scale=s, amax=a), db)
    dbg = k("cast_transpose_dbias_dgelu", dtype="fp8")
    act = T("act", (160, 320))
    wsg = T("wsg", (dbg.workspace_rows(160), 320), "float32")
    c["cast_transpose_dbias_dgelu"] = (
        lambda: dbg(xc, act, out=q, out_t=qt, dbias=dbias, workspace=wsg, scale=s, amax=a),
        dbg,
    )
    gct = k("dswiglu_cast_transpose", dtype="fp8")
    gg, ga = T("gg", (160, 160)), T("ga", (160, 320))
    c["dswiglu_cast_transpose"] = (lambda: gct(gg, ga, out=q, out_t=qt, scale=s, amax=a), gct)
    mct = k("multi_cast_transpose", dtype="fp8")
    m1, m2 = T("m1", (64, 128)), T("m2", (32, 96))
    mo = [
        (T("m1q", (64, 128), "uint8"), T("m1t", (128, 64), "uint8")),
        (T("m2q", (32, 96), "uint8"), T("m2t", (96, 32), "uint8")),
    ]
    s2, a2 = T("scale2", (1,), "float32"), T("amax2", (1,), "float32")
    c["multi_cast_transpose"] = (
        lambda: mct([m1, m2], outs=mo, scales=[s, s2], amaxes=[a, a2]),
        mct,
    )
    # quantize
    xq = T("xq", (256, 384))
    qm = k("quantize", dtype="fp8", layout="both")
    outs = dict(
        rowwise_data=T("qr", (256, 384), "uint8"),
        rowwise_scale_inv=T("qrs", mxfp8_scale_shape(256, 384, "rowwise"), "uint8"),
        columnwise_data=T("qc", (256, 384), "uint8"),
        columnwise_scale_inv=T("qcs", mxfp8_scale_shape(256, 384, "columnwise"), "uint8"),
    )
    c["quantize mxfp8 both fast"] = (lambda: qm(xq, **outs), qm)
    xq2 = T("xq2", (200, 96))
    outs2 = dict(
        rowwise_data=T("qr2", (200, 96), "uint8"),
        rowwise_scale_inv=T("qrs2", mxfp8_scale_shape(200, 96, "rowwise"), "uint8"),
        columnwise_data=T("qc2", (200, 96), "uint8"),
        columnwise_scale_inv=T("qcs2", mxfp8_scale_shape(200, 96, "columnwise"), "uint8"),
    )
    c["quantize mxfp8 both padded"] = (lambda: qm(xq2, **outs2), qm)
    qr = k("quantize", dtype="fp8", layout="rowwise")
    c["quantize mxfp8 rowwise allocates"] = (lambda: qr(xq2), qr)
    qf = k("quantize", dtype="fp4_e2m1", layout="both")
    xf = T("xf", (64, 128))
    amf = T("amax_f", (1,), "float32")
    outs4 = dict(
        rowwise_data=T("fr", (64, 64), "uint8"),
        rowwise_scale_inv=T("frs", nvfp4_scale_shape(64, 128, "rowwise"), "uint8"),
        columnwise_data=T("fc", (128, 32), "uint8"),
        columnwise_scale_inv=T("fcs", nvfp4_scale_shape(64, 128, "columnwise"), "uint8"),
    )
    wsf = T("wsf", (1024,), "float32")
    c["quantize nvfp4 both"] = (lambda: qf(xf, amax=amf, workspace=wsf, scale_inv=si, **outs4), qf)
    c["quantize nvfp4 both no amax"] = (lambda: qf(xf, amax=amf, compute_amax=False, **outs4), qf)
    # norms
    xr, wr, br = T("xr", (4, 64)), T("gamma", (64,)), T("beta", (64,))
    zr, mr, rr = T("z", (4, 64)), T("mu", (4,), "float32"), T("rsigma", (4,), "float32")
    rms = k("rmsnorm_fwd", in_dtype="bf16", hidden_size=64)
    c["rmsnorm_fwd regs"] = (lambda: rms(xr, wr, 1e-6, zr, rr), rms)
    c["rmsnorm_fwd regs allocates"] = (lambda: rms(xr, wr, 0.5), rms)
    x1 = T("x1", (64,))  # one row: rsigma is 0-d
    c["rmsnorm_fwd one row allocates"] = (lambda: rms(x1, wr, 0.5), rms)
    ln = k("layernorm_fwd", in_dtype="bf16", hidden_size=64)
    c["layernorm_fwd regs"] = (lambda: ln(xr, wr, br, 1e-5, zr, mr, rr), ln)
    c["layernorm_fwd regs allocates"] = (lambda: ln(xr, wr, br, 0.25), ln)
    # stats=False: neither mu nor rsigma written (null pointers), z allocated or given
    c["rmsnorm_fwd no stats"] = (lambda: rms(xr, wr, 1e-6, stats=False), rms)
    c["layernorm_fwd no stats"] = (lambda: ln(xr, wr, br, 1e-5, stats=False), ln)
    c["layernorm_fwd no stats, out"] = (lambda: ln(xr, wr, br, 1e-5, zr, stats=False), ln)
    gen = k("layernorm_fwd", in_dtype="bf16")
    xg, zg, wg = T("xg", (3000, 200)), T("zg", (3000, 200)), T("gammag", (200,))
    mg, rg = T("mug", (3000,), "float32"), T("rsg", (3000,), "float32")
    c["layernorm_fwd loop"] = (lambda: gen(xg, wg, wg, 1e-5, zg, mg, rg), gen)
    st = k("layernorm_fwd", in_dtype="bf16", out_dtype="fp8", hidden_size=4096)
    xs, zs, ws8 = T("xs", (16384, 4096)), T("zs", (16384, 4096), "uint8"), T("gammas", (4096,))
    ms, rss = T("mus", (16384,), "float32"), T("rss", (16384,), "float32")
    c["layernorm_fwd staged fp8"] = (
        lambda: st(xs, ws8, ws8, 1e-5, zs, ms, rss, scale=s, amax=a, scale_inv=si),
        st,
    )
    rmx = k("rmsnorm_fwd", in_dtype="bf16", out_dtype="fp8", scaling="mxfp8", hidden_size=128)
    xmx, zmx = T("xmx", (64, 128)), T("zmx", (64, 128), "uint8")
    rsx, smx = T("rsx", (64,), "float32"), T("smx", mxfp8_scale_shape(64, 128, "rowwise"), "uint8")
    wmx = T("gammamx", (128,))
    c["rmsnorm_fwd mxfp8"] = (lambda: rmx(xmx, wmx, 1e-5, zmx, rsx, scale_inv=smx), rmx)
    lb = k("layernorm_bwd", in_dtype="bf16")
    dz, xb = T("dz", (8, 200)), T("xb", (8, 200))
    wb, mb, rb = T("gammab", (200,)), T("mub", (8,), "float32"), T("rsb", (8,), "float32")
    dxb, dgb, dbb = T("dx", (8, 200)), T("dgamma", (200,)), T("dbeta", (200,))
    wsb = T("wsb", (lb.workspace_elements(8, 200),), "float32")
    c["layernorm_bwd loop"] = (lambda: lb(dz, xb, mb, rb, wb, dxb, dgb, dbb, workspace=wsb), lb)
    lr = k("layernorm_bwd", in_dtype="bf16", hidden_size=1024)
    dz2, x2 = T("dz2", (64, 1024)), T("x2", (64, 1024))
    w2, m2_, r2 = T("gamma2", (1024,)), T("mu2", (64,), "float32"), T("rs2", (64,), "float32")
    dx2, dg2, db2 = T("dx2", (64, 1024)), T("dgamma2", (1024,)), T("dbeta2", (1024,))
    ws2 = T("ws2", (lr.workspace_elements(64, 1024),), "float32")
    c["layernorm_bwd regs"] = (lambda: lr(dz2, x2, m2_, r2, w2, dx2, dg2, db2, workspace=ws2), lr)
    rb_ = k("rmsnorm_bwd", in_dtype="bf16", hidden_size=1024)
    c["rmsnorm_bwd regs allocates"] = (lambda: rb_(dz2, x2, r2, w2), rb_)
    ra = k("rmsnorm_bwd_add", in_dtype="bf16", hidden_size=1024)
    add = T("add", (64, 1024))
    ws3 = T("ws3", (ra.workspace_elements(64, 1024),), "float32")
    c["rmsnorm_bwd_add regs"] = (lambda: ra(dz2, x2, r2, w2, add, dx2, dg2, workspace=ws3), ra)
    c["rmsnorm_bwd_add in place"] = (lambda: ra(dz2, x2, r2, w2, add, add, dg2, workspace=ws3), ra)
    return c


def main() -> int:
    out = {name: launches for name, (launches, _, _) in record_all().items()}
    Path(sys.argv[1]).write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print("recorded", len(out), "calls,", sum(map(len, out.values())), "launches")
    return 0


if __name__ == "__main__":
    sys.exit(main())
