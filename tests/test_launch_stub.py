"""The real launch path (cuda.bindings, contexts, streams, parameter buffers) against a stub
libcuda (tests/host_cuda/libcuda_stub.c), with fake torch tensors, in a subprocess of its own
(the stub's fake device must not be seen by this process's GPU tests).

For each call: the generic path's launch (the first call with torch tensors), the launch
that builds the plan and the planned launch must give the driver the same function, grid,
block, stream and parameter bytes; refused launches and context switches raise CudaError. It
runs once with the compiled launcher (nvrtc_engine/launcher.py) and once through cuda.bindings.
"""

from __future__ import annotations

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
    import sys, threading
    import stub_driver, fake_torch
    stub = stub_driver.load()
    torch = fake_torch.module(current_stream=0x5000)
    sys.modules["torch"] = torch
    import nvrtc_engine as ne
    from nvrtc_engine.ops.blockscale import nvfp4_scale_shape

    D = fake_torch.DTYPES
    base = [0x7A0000000000]

    def T(shape, dtype="bfloat16", offset=0):
        base[0] += 1 << 24
        return fake_torch.Tensor(shape, D[dtype], ptr=base[0] + offset)

    def launches_of(call, *nparams):
        kernel = call.__defaults__[0] if call.__defaults__ else None
        for function, n in zip(kernel.loaded(0).functions, nparams):
            stub.record_params(n, function)
        seen = []
        for _ in range(3):  # generic path, planning, planned
            before = stub.launches
            call()
            seen.append((stub.launches - before, stub.last()))
        assert seen[0] == seen[1] == seen[2], seen
        return seen[0]

    x, y = T((4, 96)), T((4, 96))
    gelu = ne.get_kernel("gelu", dtype="bf16")
    count, last = launches_of(lambda k=gelu: k(x, y), 7)
    assert count == 1 and last["params"] == (x.data_ptr(), y.data_ptr(), 384, 0, 0, 0, 1)
    assert last["stream"] == 0x5000 and last["grid"] == (1, 1, 1) and last["block"][0] == 128
    assert not last["dependent"]  # the activations do not wait for their grid dependency
    assert len(gelu._launch_plans) == 1
    xu = T((4, 96), offset=2)
    count, last = launches_of(lambda k=gelu: k(xu, y), 7)
    assert last["params"][-1] == 0 and last["grid"][0] == 3

    s, a = T((1,), "float32"), T((1,), "float32")
    cases = [
        (lambda k=ne.get_kernel("gelu", dtype="fp8"), y8=T((4, 96), "uint8"):
            k(x, y8, scale=s, amax=a), 7),
        (lambda k=ne.get_kernel("clamped_swiglu", dtype="bf16"), h=T((6, 256)), o=T((6, 128)):
            k(h, o, limit=3.5, alpha=1.25), 17),
        (lambda k=ne.get_kernel("rmsnorm_fwd", in_dtype="bf16", hidden_size=64), xr=T((4, 64)),
            w=T((64,)), z=T((4, 64)), r=T((4,), "float32"): k(xr, w, 1e-6, z, r), 17),
        (lambda k=ne.get_kernel("transpose", dtype="fp16"), xt=T((100, 70), "float16"),
            o=T((70, 100), "float16"): k(xt, o), 11),
    ]
    for call, nparams in cases:
        _, last = launches_of(call, nparams)
        # the norms are programmatic dependent launches on the stub's sm_90, on every path
        assert last["dependent"] == (call is cases[2][0]), last
    # launch_grid says what the forward launches: a one-pass grid, the general kernel's and
    # a staged (persistent) FP8 one
    rk = cases[2][0].__defaults__[0]
    assert rk.launch_grid(4) == launches_of(cases[2][0], 17)[1]["grid"][0]
    gen = ne.get_kernel("layernorm_fwd", in_dtype="bf16")
    xg, zg, wg = T((3000, 200)), T((3000, 200)), T((200,))
    mg, rg = T((3000,), "float32"), T((3000,), "float32")
    last = launches_of(lambda k=gen: k(xg, wg, wg, 1e-5, zg, mg, rg), 17)[1]
    assert gen.launch_grid(3000, 200) == last["grid"][0]
    st = ne.get_kernel("layernorm_fwd", in_dtype="bf16", out_dtype="fp8", hidden_size=4096)
    assert st.config.staging  # TUNED's staged kernel on the stub's sm_90
    xs, zs, ws8 = T((16384, 4096)), T((16384, 4096), "uint8"), T((4096,))
    ms, rss = T((16384,), "float32"), T((16384,), "float32")
    last = launches_of(lambda k=st: k(xs, ws8, ws8, 1e-5, zs, ms, rss, scale=s, amax=a), 17)[1]
    assert st.launch_grid(16384) == last["grid"][0] < 16384

    lb = ne.get_kernel("layernorm_bwd", in_dtype="bf16")
    dz, xb, wb, mb, rb = T((8, 200)), T((8, 200)), T((200,)), T((8,), "float32"), T((8,), "float32")
    dxb, dgb, dbb = T((8, 200)), T((200,)), T((200,))
    ws = T((lb.workspace_elements(8, 200),), "float32")
    count, last = launches_of(
        lambda k=lb: k(dz, xb, mb, rb, wb, dxb, dgb, dbb, workspace=ws), 18, 18, 18
    )
    assert count == 3 and last["params"][7] < last["params"][8] < ws.data_ptr() + ws.numel() * 4
    assert last["dependent"]  # the finalize kernel too
    # NVRTC_ENGINE_DEPENDENT_LAUNCH off: kernels made afterwards launch ordinarily
    ne.configure(dependent_launch=False)
    ne.clear_cache(disk=False)
    plain = ne.get_kernel("rmsnorm_fwd", in_dtype="bf16", hidden_size=64)
    _, last = launches_of(lambda k=plain, xr=T((4, 64)), w=T((64,)), z=T((4, 64)),
                          r=T((4,), "float32"): k(xr, w, 1e-6, z, r), 17)
    assert not last["dependent"], last
    ne.configure(dependent_launch=True)

    q = ne.get_kernel("quantize", dtype="fp4_e2m1", layout="rowwise")
    xq, am = T((64, 128)), T((1,), "float32")
    rd, rs = T((64, 64), "uint8"), T(nvfp4_scale_shape(64, 128, "rowwise"), "uint8")
    count, last = launches_of(
        lambda k=q: k(xq, rowwise_data=rd, rowwise_scale_inv=rs, amax=am), 15, 4, 3
    )
    assert count == 3 and last["params"][:3] == (xq.data_ptr(), rd.data_ptr(), rs.data_ptr())

    # explicit streams, torch's current stream, another thread (no current context there)
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
    assert stub.context_sets == sets + 1 and stub.last()["params"][0] == x.data_ptr()
    y2 = gelu(x)
    assert stub.last()["params"][1] == y2.data_ptr()

    # a refused launch and a refused context switch are CudaErrors, planned or not
    from nvrtc_engine import launcher
    for call in (lambda: gelu(x, y), lambda: ne.get_kernel("gelu", dtype="fp16")(
            T((2, 8), "float16"), T((2, 8), "float16"))):
        stub.fail(launch=700)
        try:
            call()
        except ne.CudaError as exc:
            assert exc.code == 700 and exc.call == "cuLaunchKernel", exc
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

    # the compiled fast path (plans.py): planned kernels use it, and it reads the same plan
    # keys as the Python one, for every kind of argument
    from nvrtc_engine import plans
    from types import SimpleNamespace
    compiled = launcher.status().startswith("compiled")
    assert ("_fast" in vars(gelu)) == compiled and ("_fast" in vars(lb)) == compiled
    if compiled:
        c_fast = launcher.extension().fast
        cpu = fake_torch.Tensor((4, 96), D["bfloat16"], device=-1)
        strided = fake_torch.Tensor((4, 96), D["bfloat16"], strides=(1, 4))
        for args, extra in [((None, x, y, None, None, None), None), ((None, xu, y, s, a, None), 3),
                            ((x, None), ("mx", 1)), ((x, strided), None), ((cpu, x), None),
                            ((x, cpu), None), ((x, object()), None), ((None,), 0)]:
            for floats in [(), (1e-5,)]:
                holder = SimpleNamespace(_last_plan=plans.NO_PLAN, _launch_plans={})
                want = plans.fast_path(len(args))(holder, args, floats, None, extra)
                got = c_fast(holder, args, floats, None, extra)
                assert got == want and (want[1] is None or got[0] is None), (args, got, want)
        # planned calls launch what the Python plan launches: new pointers, per-call floats
        rk = cases[2][0].__defaults__[0]
        for eps in (1e-6, 0.25, 3.0e-3):
            xr2, z2, r2 = T((4, 64)), T((4, 64)), T((4,), "float32")
            seen = []
            for path in ("python", "compiled"):
                fast = vars(rk).pop("_fast")
                if path == "compiled":
                    rk._fast = fast
                rk(xr2, cases[2][0].__defaults__[2], eps, z2, r2)
                rk._fast = fast
                seen.append(stub.last())
            assert seen[0] == seen[1] and seen[0]["params"][0] == xr2.data_ptr(), seen
        y3 = gelu(x)
        assert stub.last()["params"][1] == y3.data_ptr() != y2.data_ptr()
    print("OK", stub.launches, launcher.status())
    """
)


@pytest.mark.skipif(stub_driver.compiler() is None, reason="no C compiler for the stub libcuda")
@pytest.mark.parametrize("mode", ["compiled", "bindings"])
def test_real_bindings_against_the_stub_driver(tmp_path, mode):
    env = dict(os.environ)
    env["NVRTC_ENGINE_LAUNCHER"] = mode
    env["PYTHONPATH"] = os.pathsep.join(
        [str(HERE), str(HERE.parent), *filter(None, [env.get("PYTHONPATH")])]
    )
    env["NVRTC_ENGINE_CACHE_DIR"] = str(tmp_path / "cache")
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    ok, _, status = done.stdout.split(" ", 2)
    assert ok == "OK", done.stdout
    assert status.startswith({"compiled": "compiled (", "bindings": "cuda.bindings ("}[mode])
