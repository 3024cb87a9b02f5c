"""The real launch path (cuda.bindings, contexts, streams, parameter buffers) against a stub
libcuda (tests/host_cuda/libcuda_stub.c), with fake torch tensors, in a subprocess of its own
(the stub's fake device must not be seen by this process's GPU tests).

Every family's representative calls (tests/launch_record.py) give the driver the same
function, grid, block, stream and parameter bytes on the checked path (which prepares the
launch) and on two later calls, which launch through the prepared launch without the checked
path where the call can be prepared; each parameter, read back by the name the
kernel's signature gives it, holds the argument the family binds to that name; refused
launches and context switches raise CudaError; another context made current in between is
switched back.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import stub_driver

HERE = Path(__file__).resolve().parent

SCRIPT = textwrap.dedent(
    """
    import json, sys, threading
    import launch_record as lr
    stub, torch, T, ne = lr.stub, lr.torch, lr.T, lr.ne
    from nvrtc_engine.core import native_launch
    from nvrtc_engine.core.render import render

    native = ne.core.config.settings().native_launch
    assert native_launch.loaded() or not native, native_launch.unavailable
    recorded = lr.record_all()
    # the launcher asked for ran every prepared launch: the C Launcher's key reads and Plans,
    # or the pure-Python ones
    for name, (launches, kernels, again) in recorded.items():
        for kernel in kernels:
            assert kernel._native == native, name
            for run in kernel._prepared.values():
                assert (type(run).__name__ == "Plan") == native, name
    # the parameter lists the templates render are the signatures' (no list written twice)
    for name, (launches, kernels, _) in recorded.items():
        for kernel in kernels:
            source = render(kernel.key).source
            for symbol in kernel.artifact.symbols:
                assert f"{symbol}(" in source, symbol
    # every call of torch tensors is prepared (its second and third calls launch through the
    # prepared launch, not the checked path), except MXFP8 activation outputs (their scales
    # are zeroed first) and multi_cast_transpose (a table per call)
    for name, (launches, kernels, again) in recorded.items():
        unprepared = name.startswith(("gelu mxfp8", "swiglu mxfp8", "multi_cast"))
        assert again == (2 if unprepared else 0), (name, again)
        assert all(bool(k._prepared) != unprepared for k in kernels), name

    def params(name, launch=0):
        return recorded[name][0][launch]["params"]

    def pointers(name, launch=0):
        return {k: v for k, v in params(name, launch).items() if isinstance(v, str)}

    # each parameter holds what the family binds to its name
    assert params("gelu flat") == {"x": "x+0", "y": "y+0", "n": 384, "scale_ptr": 0,
                                   "amax_ptr": 0, "scale_inv_ptr": 0, "aligned": 1}
    assert params("gelu flat unaligned")["aligned"] == 0
    assert recorded["gelu flat unaligned"][0][0]["grid"] == [3, 1, 1]
    assert pointers("gelu fp8 tensor") == {"x": "x+0", "y": "y8+0", "scale_ptr": "scale+0",
                                           "amax_ptr": "amax+0", "scale_inv_ptr": "scale_inv+0"}
    assert pointers("dgelu flat") == {"x": "x+0", "y": "y+0", "grad": "grad+0"}
    assert pointers("swiglu rows") == {"x": "h+0", "y": "o+0"}
    assert params("clamped_swiglu rows")["limit"] == 3.5
    assert params("clamped_swiglu rows")["alpha"] == 1.25
    assert params("clamped_swiglu rows")["linear_offset"] == 1.0
    assert pointers("dclamped_swiglu rows") == {"x": "h+0", "grad": "o+0", "y": "dh+0"}
    assert pointers("gelu mxfp8 both tile") == {"x": "xm+0", "y": "mxb_row+0",
        "y_col": "mxb_col+0", "s_row": "mxb_row_s+0", "s_col": "mxb_col_s+0"}
    assert pointers("transpose") == {"x": "xt+0", "qt": "ot+0"}
    assert pointers("cast_transpose_dbias") == {"x": "xc+0", "q": "q+0", "qt": "qt+0",
        "partial": "ws+0", "scale_ptr": "scale+0", "amax_ptr": "amax+0",
        "scale_inv_ptr": "scale_inv+0"}
    assert pointers("cast_transpose_dbias", 1) == {"partial": "ws+0", "dbias": "dbias+0"}
    assert pointers("cast_transpose_dbias_dgelu")["act"] == "act+0"
    table = params("multi_cast_transpose")["t"]
    assert table["count"] == 2 and table["entries"][1][:5] == ["m2+0", "m2q+0", "m2t+0",
                                                              "scale2+0", "amax2+0"]
    assert pointers("quantize mxfp8 both fast") == {"x": "xq+0", "y": "qr+0", "y_col": "qc+0",
        "s_row": "qrs+0", "s_col": "qcs+0"}
    assert pointers("quantize mxfp8 both padded") == {"x": "xq2+0", "data_r": "qr2+0",
        "scale_r": "qrs2+0", "data_c": "qc2+0", "scale_c": "qcs2+0"}
    nvfp4 = [launch["symbol"].rsplit("_", 2)[-2:] for launch in recorded["quantize nvfp4 both"][0]]
    assert pointers("quantize nvfp4 both") == {"x": "xf+0", "partial": "wsf+0"}
    assert pointers("quantize nvfp4 both", 1) == {"partial": "wsf+0", "amax": "amax_f+0"}
    assert pointers("quantize nvfp4 both", 2) == {"x": "xf+0", "data_r": "fr+0",
        "scale_r": "frs+0", "data_c": "fc+0", "scale_c": "fcs+0", "amax_ptr": "amax_f+0",
        "scale_inv_ptr": "scale_inv+0"}
    assert len(recorded["quantize nvfp4 both no amax"][0]) == 1
    assert params("rmsnorm_fwd regs") | {"x": 0} == {"x": 0, "gamma": "gamma+0", "beta": 0,
        "z": "z+0", "mu_out": 0, "rs_out": "rsigma+0", "scale_ptr": 0, "amax_ptr": 0,
        "scale_inv_ptr": 0, "mx_scale": 0, "rows": 4, "hidden": 64,
        "eps": params("rmsnorm_fwd regs")["eps"], "vec": 1, "tpr": 0, "mx_stride": 0,
        "mx_rows": 0}
    assert abs(params("rmsnorm_fwd regs")["eps"] - 1e-6) < 1e-12
    assert params("rmsnorm_fwd regs allocates")["eps"] == 0.5
    assert pointers("rmsnorm_fwd mxfp8")["mx_scale"] == "smx+0"
    # stats=False: null mu_out and rs_out, nothing allocated for them, none returned
    for name in ("rmsnorm_fwd no stats", "layernorm_fwd no stats", "layernorm_fwd no stats, out"):
        assert params(name)["mu_out"] == 0 and params(name)["rs_out"] == 0, name
        beta = {"beta"} if name.startswith("layernorm") else set()
        assert set(pointers(name)) == {"x", "gamma", "z"} | beta, name
    assert pointers("layernorm_fwd no stats, out")["z"] == "z+0"
    rms_ns, ln_ns = recorded["rmsnorm_fwd no stats"][1][0], recorded["layernorm_fwd no stats"][1][0]
    xr, wr, br = T("xr", (4, 64)), T("gamma", (64,)), T("beta", (64,))
    for _ in range(2):  # the checked path, then the prepared launch
        got = rms_ns(xr, wr, 1e-6, stats=False)
        assert got.rsigma is None and got.z.shape == (4, 64), got
        got = ln_ns(xr, wr, br, 1e-5, stats=False)
        assert got.mu is None and got.rsigma is None and got.z.shape == (4, 64), got
        assert rms_ns(xr, wr, 1e-6).rsigma.shape == (4,)  # the same kernel, stats written
    for given in ({"rsigma": T("rs4", (4,), "float32")}, {"mu": T("mu4", (4,), "float32")}):
        try:
            ln_ns(xr, wr, br, 1e-5, stats=False, **given)
        except ne.ArgumentError as exc:
            assert list(given)[0] in str(exc) and "stats=False" in str(exc), exc
        else:
            raise AssertionError(f"{given} with stats=False was taken")
    assert params("rmsnorm_fwd mxfp8")["scale_inv_ptr"] == 0
    assert pointers("layernorm_fwd staged fp8")["scale_inv_ptr"] == "scale_inv+0"
    bwd = recorded["layernorm_bwd loop"][0]
    assert len(bwd) == 3 and all(launch["dependent"] for launch in bwd)
    assert len({str(launch["params"]) for launch in bwd}) == 1  # one parameter list for all
    ws_stats = pointers("layernorm_bwd loop")["ws_stats"]
    assert ws_stats.startswith("wsb+") and int(ws_stats[4:]) > 0
    assert pointers("layernorm_bwd loop")["ws_part"] == "wsb+0"
    assert pointers("rmsnorm_bwd_add in place")["add"] == pointers("rmsnorm_bwd_add in place")["dx"]
    assert not any(launch["dependent"] for launch in recorded["gelu flat"][0])

    # an MXFP8 norm forward's z is a BlockScaledOutput, returned, or given as out: one launch
    rmx = recorded["rmsnorm_fwd mxfp8"][1][0]
    xq, wq, rq = T("xq3", (64, 128)), T("wq3", (128,)), T("rq3", (64,), "float32")
    zq, sq = T("zq3", (64, 128), "uint8"), T("sq3", (128, 4), "uint8")
    runs = [lr.record(lambda: rmx(xq, wq, 1e-5, zq, rq, scale_inv=sq), rmx),
            lr.record(lambda: rmx(xq, wq, 1e-5, ne.BlockScaledOutput(zq, sq), rq), rmx)]
    assert runs[0] == runs[1]
    res = rmx(xq, wq, 1e-5, ne.BlockScaledOutput(zq, sq), rq)
    assert res.z.rowwise_data is zq and res.z.rowwise_scale_inv is sq and res[-1] is sq

    # NVRTC_ENGINE_DEPENDENT_LAUNCH off: kernels made afterwards launch ordinarily
    x, y = T("x2", (4, 96)), T("y2", (4, 96))
    ne.configure(dependent_launch=False)
    ne.clear_cache(disk=False)
    plain = ne.get_kernel("rmsnorm_fwd", in_dtype="bf16", hidden_size=64)
    xr, w, z, r = T("xr2", (4, 64)), T("w2", (64,)), T("z2", (4, 64)), T("r2", (4,), "float32")
    launches = lr.record(lambda: plain(xr, w, 1e-6, z, r), plain)
    assert not launches[0]["dependent"]
    ne.configure(dependent_launch=True)

    # explicit streams, torch's current stream, another thread (no current context there),
    # another context made current on this thread: the device's context is made current for
    # the launch and the thread's own (or none) current again after it
    gelu = ne.get_kernel("gelu", dtype="bf16")
    lr.record(lambda: gelu(x, y), gelu)  # (the stub keeps its parameters from here on)
    for _ in range(2):
        gelu(x, y)
    assert gelu._prepared
    gelu(x, y, stream=0x42)
    assert stub.last()["stream"] == 0x42
    gelu(x, y, stream=torch.cuda.Stream(0x43))
    assert stub.last()["stream"] == 0x43
    torch.streams[0] = 0x44
    gelu(x, y)
    assert stub.last()["stream"] == 0x44
    sets = stub.context_sets
    thread = threading.Thread(target=lambda: gelu(x, y))
    thread.start()
    thread.join()
    assert stub.context_sets == sets + 2 and stub.last()["params"][0] == x.data_ptr()
    from cuda.bindings import driver as cu
    cu.cuCtxSetCurrent(cu.CUcontext(0xBAD0000))  # another context (the stub's launch refuses it)
    sets = stub.context_sets
    gelu(x, y)
    assert stub.context_sets == sets + 2 and stub.last()["params"][1] == y.data_ptr()
    assert int(cu.cuCtxGetCurrent()[1]) == 0xBAD0000
    y2 = gelu(x)
    assert stub.last()["params"][1] == y2.data_ptr()
    y3 = gelu(x)
    assert stub.last()["params"][1] == y3.data_ptr() != y2.data_ptr()
    cu.cuCtxSetCurrent(cu.CUcontext(0))  # (no device has that context: get_kernel would ask)

    # a refused launch and a refused context switch are CudaErrors, prepared or not
    for call in (lambda: gelu(x, y), lambda: ne.get_kernel("gelu", dtype="fp16")(
            T("h16", (2, 8), "float16"), T("o16", (2, 8), "float16"))):
        stub.fail(launch=700)
        try:
            call()
        except ne.CudaError as exc:
            assert exc.code == 700 and exc.call == "cuLaunchKernelEx", exc
        else:
            raise AssertionError("no CudaError")
        stub.fail()
    errors = []
    def switch():
        stub.fail(ctx_set=201)
        try:
            gelu(x, y)
        except ne.CudaError as exc:
            errors.append(exc)
        stub.fail()
    thread = threading.Thread(target=switch)
    thread.start()
    thread.join()
    assert len(errors) == 1 and errors[0].code == 201 and "cuCtxSetCurrent" in errors[0].call
    gelu(x, y)

    # bad input after the good calls' launches were prepared: each is refused before anything
    # is launched, with the checked path's error (compared between the two launchers)
    y16, y_short = T("y16", (4, 96), "float16"), T("y_short", (4, 95))
    strided = lr.fake_torch.Tensor((4, 96), lr.D["bfloat16"], strides=(1, 4))
    elsewhere = lr.fake_torch.Tensor((4, 96), lr.D["bfloat16"], device=1)
    g8 = ne.get_kernel("gelu", dtype="fp8")
    y8, s8 = T("y8b", (4, 96), "uint8"), T("s8", (1,), "float32")
    gelu(x)
    bad = {
        "dtype": lambda: gelu(x, y16), "shape": lambda: gelu(x, y_short),
        "non-contiguous x": lambda: gelu(strided, y),
        "non-contiguous out": lambda: gelu(x, strided), "device": lambda: gelu(x, elsewhere),
        "misaligned": lambda: gelu(T("xo", (4, 96), offset=1)),
        "no tensor": lambda: gelu([1.0]), "stream": lambda: gelu(x, y, stream="s"),
        "missing amax": lambda: g8(x, y8, scale=s8), "missing scale": lambda: g8(x, y8),
        "scale on bf16": lambda: gelu(x, y, scale=s8),
    }
    errors = {}
    for what, call in bad.items():
        before = stub.launches
        try:
            call()
        except Exception as exc:
            errors[what] = [type(exc).__name__, str(exc)]
        else:
            errors[what] = None
        assert stub.launches == before, what
    if native:  # a Plan is also called as the pure path's run
        tag = lr.ne.families.activation.kernels._X_OUT
        run = gelu._prepared[(tag, x.dtype, x.shape, 0, True, 0, y.dtype, y.shape, 0, True, 0)]
        assert run((x, y), (x.data_ptr(), y.data_ptr()), (), 0x46) == ()
        assert stub.last()["stream"] == 0x46 and stub.last()["params"][:2] == (x.data_ptr(),
                                                                                y.data_ptr())
    launches = {name: launches for name, (launches, _, _) in recorded.items()}
    print("OK", stub.launches)
    print(json.dumps({"launches": launches, "errors": errors}))
    """
)


@pytest.mark.skipif(stub_driver.compiler() is None, reason="no C compiler for the stub libcuda")
def test_real_bindings_against_the_stub_driver(stub_kernel_cache):
    """The script above, once through the compiled launcher and once through the pure-Python
    path (both at once, each in a process of its own): the same launches, parameter bytes and
    errors."""
    runs = {}
    for native in ("1", "0"):
        env = dict(os.environ, NVRTC_ENGINE_NATIVE_LAUNCH=native)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(HERE), str(HERE.parent), *filter(None, [env.get("PYTHONPATH")])]
        )
        env["NVRTC_ENGINE_CACHE_DIR"] = str(stub_kernel_cache)  # (shared: compiled once)
        runs[native] = subprocess.Popen(
            [sys.executable, "-c", SCRIPT], env=env, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
    done = {native: process.communicate(timeout=600) for native, process in runs.items()}
    results = {}
    for native, (out, err) in done.items():  # (both read first: no pipe left open)
        shown = f"NVRTC_ENGINE_NATIVE_LAUNCH={native}\n{out[-5000:]}{err[-5000:]}"
        assert runs[native].returncode == 0, shown
        assert out.startswith("OK"), out
        results[native] = json.loads(out.splitlines()[-1])
    compiled, pure = results["1"], results["0"]
    assert compiled["launches"] == pure["launches"]
    assert compiled["errors"] == pure["errors"]
    assert all(compiled["errors"].values()), compiled["errors"]  # every bad call refused


TORCH_SCRIPT = textwrap.dedent(
    """
    import stub_driver
    stub = stub_driver.load()
    import nvrtc_engine as ne
    from nvrtc_engine.core import driver
    driver.make_current(driver.get_device(0))
    import torch
    # CPU tensors taken as device 0's: get_device patched onto the class before any call (a
    # method that is no builtin one is called as such)
    torch.Tensor.get_device = int
    torch.Tensor.is_cuda = True
    if not hasattr(torch._C, "_cuda_getCurrentRawStream"):  # a CPU build of PyTorch
        torch._C._cuda_getCurrentRawStream = lambda device: 0x5000
    gelu = ne.get_kernel("gelu", dtype="bf16")
    assert gelu._native == ne.core.config.settings().native_launch
    stub.record_params(7)  # x, y, n, scale, amax, scale_inv, aligned
    bf16 = torch.bfloat16
    x, out = torch.zeros(8, 1024, dtype=bf16), torch.zeros(8, 1024, dtype=bf16)
    p = torch.nn.Parameter(torch.zeros(8, 1024, dtype=bf16), requires_grad=False)
    flat = torch.zeros(8 * 1024 + 1, dtype=bf16)
    odd = flat[1:].view(8, 1024)  # 2 bytes past a 16-byte boundary
    wide = torch.zeros(4, 2048, dtype=bf16)

    def params(t, y, aligned=1):
        return (t.data_ptr(), y.data_ptr(), 8192, 0, 0, 0, aligned)

    for _ in range(3):  # the checked path, then each key's prepared launch
        for t in (x, p, odd, wide):
            y = gelu(t)
            assert type(y) is torch.Tensor and y.shape == t.shape and y.dtype == bf16
            assert stub.last()["params"] == params(t, y, int(t is not odd)), stub.last()
        assert gelu(x, out) is out and stub.last()["params"] == params(x, out)
        assert gelu(odd, out) is out and stub.last()["params"] == params(odd, out, 0)
    assert len(gelu._prepared) == 5  # (x and p: one key)
    # after the keys were prepared, each of these differs from one of them only in what a
    # call's key reads from the tensor itself, and is refused before anything is launched
    bad = {"non-contiguous": lambda: gelu(torch.zeros(1024, 8, dtype=bf16).t()),
           "dtype": lambda: gelu(x, out.float()), "shape": lambda: gelu(x, wide)}
    launches = stub.launches
    for what, call in bad.items():
        try:
            call()
        except ne.ArgumentError:
            pass
        else:
            raise AssertionError(what)
    assert stub.launches == launches

    # nvrtc_engine.torch's norm modules: their eager forwards launch through the kernel's own
    # prepared launches (under the call-key tags its _call_tags name), with mu/rsigma where a
    # graph is built and without them (null pointers) under no_grad
    import nvrtc_engine.torch as net
    from nvrtc_engine.torch import _kernels

    _kernels.DEVICE_TYPE = "cpu"
    stub.record_params(6)  # x, gamma, beta, z, mu_out, rs_out
    xs = torch.randn(4, 64, dtype=bf16)
    xg = xs.clone().requires_grad_()
    for module in (net.RMSNorm(64, dtype=bf16), net.LayerNorm(64, dtype=bf16)):
        rms = isinstance(module, net.RMSNorm)
        for i in range(3):  # the checked path, then the prepared launches alone
            with torch.no_grad():
                y = module(xs)
            assert stub.last()["params"][3:] == (y.data_ptr(), 0, 0), stub.last()
            y = module(xg)
            saved = y.grad_fn.saved_tensors
            mu, rsigma = (None, saved[1]) if rms else saved[1:3]
            assert rsigma.shape == (4,) and rsigma.dtype == torch.float32
            assert stub.last()["params"][3:] == (
                y.data_ptr(), 0 if rms else mu.data_ptr(), rsigma.data_ptr()), stub.last()
            (k,) = module._kernel_cache.values()
            if i == 0:
                assert {key[0] for key in k._prepared} == set(k._call_tags.values())
                k._checked_forward = None  # (a later call of the checked path fails)
    print("OK")
    """
)


@pytest.mark.skipif(stub_driver.compiler() is None, reason="no C compiler for the stub libcuda")
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="no PyTorch")
@pytest.mark.parametrize("native", ["1", "0"])
def test_torch_tensors_against_the_stub_driver(stub_kernel_cache, native):
    """PyTorch's own (CPU) tensors through the compiled launcher, which calls their
    data_ptr, get_device and is_contiguous methods' C functions itself, and through the
    pure-Python path: the parameters of each call, prepared or not, are the call's."""
    env = dict(os.environ, NVRTC_ENGINE_NATIVE_LAUNCH=native)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(HERE), str(HERE.parent), *filter(None, [env.get("PYTHONPATH")])]
    )
    env["NVRTC_ENGINE_CACHE_DIR"] = str(stub_kernel_cache)
    done = subprocess.run([sys.executable, "-c", TORCH_SCRIPT], env=env, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0 and done.stdout.split()[-1:] == ["OK"], (
        done.stdout[-3000:] + done.stderr[-3000:]
    )


def test_the_compiled_launcher_is_built():
    """Wherever there is a C compiler, the install built the compiled launcher (the wheel's
    build and `pip install -e .` do; NVRTC_ENGINE_BUILD_NATIVE=0 builds without it)."""
    if stub_driver.compiler() is None or os.environ.get("NVRTC_ENGINE_BUILD_NATIVE") == "0":
        pytest.skip("no C compiler, or built without the compiled launcher on purpose")
    from nvrtc_engine.core import native_launch

    assert native_launch.loaded(), f"{native_launch.unavailable}: run pip install -e ."
