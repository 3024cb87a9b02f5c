"""Several devices on the real launch path, against the stub libcuda reporting four fake
devices (tests/host_cuda/libcuda_stub.c: each with its own primary context; a function
launched in another context than its module's fails with CUDA_ERROR_INVALID_HANDLE, as on a
GPU), in subprocesses of their own.

Devices: 0 and 1 are sm_90 with 132 SMs, 2 is sm_90 with 114 SMs, 3 is sm_80. Every family's
representative calls (tests/launch_record.py) launch on device 1 after device 0 what they
launch on device 0, through device 1's module, context and current stream, each module
loaded once per device, and leave the thread's current context as they found it; two
threads launch on two devices at once; grids and workspaces follow each device's SM count; a
cubin never loads on a device of another arch; prewarmed kernels launch on every device
without a compile; the PyTorch layer fetches a kernel per device, for its arch. The same on
real GPUs: tests/test_gpu_multi.py.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import stub_driver

DEVICES = [("sm_90", 132), ("sm_90", 132), ("sm_90", 114), ("sm_80", 108)]

pytestmark = pytest.mark.skipif(
    stub_driver.compiler() is None, reason="no C compiler for the stub libcuda"
)

PRELUDE = textwrap.dedent(
    """
    import threading, types
    import stub_driver
    import launch_record as lr  # loads the stub (STUB_CUDA_DEVICES) and fake torch
    stub, torch, ne, fake_torch = lr.stub, lr.torch, lr.ne, lr.fake_torch
    from cuda.bindings import driver as cu
    from nvrtc_engine.core import driver

    def current():
        # the handle of this thread's current context (0: none)
        return int(cu.cuCtxGetCurrent()[1])

    assert driver.device_count() == stub.device_count == 4
    assert [driver.get_device(d).arch for d in range(4)] == ["sm_90"] * 3 + ["sm_80"]
    STREAMS = {d: 0x5000 + 0x100 * d for d in range(4)}  # torch's current stream per device
    torch.streams.update(STREAMS)
    BF16, F32, U8 = (fake_torch.DTYPES[n] for n in ("bfloat16", "float32", "uint8"))

    def tensor(shape, device, dtype=BF16):
        return fake_torch.Tensor(shape, dtype, device=device)

    def functions_on(kernels, device):
        return {int(f) for k in kernels for f in k.loaded(device).functions}

    def launches_of(call):
        # (the launches `call` made, oldest first; how many ran on each device)
        before, counts = stub.launches, [stub.device_launches(d) for d in range(4)]
        call()
        return stub.since(before), [stub.device_launches(d) - c for d, c in enumerate(counts)]

    def prepared_devices(kernel):
        # the devices of each prepared launch's key (every tensor's device index)
        return {tuple(key[3::5]) for key in kernel._prepared}
    """
)

EVERY_FAMILY = textwrap.dedent(
    """
    def cases_on(device):
        # launch_record's cases with every tensor on `device`
        real = lr.fake_torch
        lr.fake_torch = types.SimpleNamespace(
            Tensor=lambda *a, **kw: real.Tensor(*a, device=device, **kw))
        try:
            return lr.cases()
        finally:
            lr.fake_torch = real

    class OnDevice:  # a kernel as launch_record reads it, with its functions on `device`
        def __init__(self, kernel, device):
            self.key, self.artifact = kernel.key, kernel.artifact
            self._loaded = kernel.loaded(device)

        def loaded(self, device=0):
            return self._loaded

    cases0 = lr.cases()
    cases1 = cases_on(1)
    kernels = {k for _, *ks in cases0.values() for k in ks}
    assert stub.module_loads(1) == 0
    for name, (call0, *ks) in cases0.items():
        call1, *ks1 = cases1[name]
        assert ks1 == ks, name  # one sm_90 cubin for both devices: the same Kernel objects
        want = lr.record(call0, *ks)  # device 0: the checked path, then prepared calls
        assert {launch["stream"] for launch in want} == {STREAMS[0]}, name
        # device 1 after device 0: its first call loads the modules there (the stub needs
        # their handles to keep the parameters: they are read from the calls after it)
        new = sum(1 not in k._loaded for k in ks)
        loads = stub.module_loads(1)
        raw = []
        for _ in range(4):
            got, per_device = launches_of(call1)
            assert per_device == [0, len(got), 0, 0] and got, (name, per_device)
            assert {launch["function"] for launch in got} <= functions_on(ks, 1), name
            raw.append(got)
            if len(raw) == 1:
                assert stub.module_loads(1) == loads + new, name
                for k in ks:
                    lr._register(OnDevice(k, 1))
                    for key in [key for key in k._prepared if 1 in key[3::5]]:
                        del k._prepared[key]  # the next call takes the checked path again
        raw = raw[1:]
        decoded = [[lr._decode(launch) for launch in got] for got in raw]
        assert decoded[0] == decoded[1] == decoded[2], name
        # the same launches as on device 0, on device 1's stream
        assert decoded[0] == [{**launch, "stream": STREAMS[1]} for launch in want], name
        for k in ks:
            devices = prepared_devices(k)
            if devices:  # prepared per device: device 0's prepared launch is not device 1's
                assert any(set(d) == {0} for d in devices), (name, devices)
                assert any(set(d) == {1} for d in devices), (name, devices)
                assert all(len(set(d)) == 1 for d in devices), (name, devices)
    for k in kernels:
        assert set(k._loaded) == {0, 1}, k
        assert [k.loaded(d).device.ordinal for d in (0, 1)] == [0, 1]
        assert int(k.loaded(1).device.context) == stub_driver.context(1)
        assert k.loaded(0).module != k.loaded(1).module
    # each module loaded once per device, by its first call (or query) there
    assert stub.module_loads(0) == stub.module_loads(1) == len(kernels), len(kernels)
    # every load and launch in its device's context, none left current afterwards
    assert current() == 0

    # alternating devices with device 0's context current (torch's current device 0): each
    # call switches to its device's context and back, device 0's calls switch nothing
    driver.make_current(driver.get_device(0))
    for name, (call0, *ks) in cases0.items():
        call1 = cases1[name][0]
        for device, call in ((0, call0), (1, call1), (0, call0), (1, call1)):
            sets = stub.context_sets
            got, per_device = launches_of(call)
            assert per_device[device] == len(got) == sum(per_device) > 0, (name, device)
            assert {launch["function"] for launch in got} <= functions_on(ks, device), name
            assert {launch["stream"] for launch in got} == {STREAMS[device]}, name
            assert current() == stub_driver.context(0), (name, device)
            assert (stub.context_sets > sets) == (device == 1), (name, device)
    assert stub.module_loads(0) == stub.module_loads(1) == len(kernels)

    # arrays that are not torch tensors (the checked path each call): a CuPy-like array
    # names its device, a Numba-like one is placed by its pointer (cuPointerGetAttribute)
    from fakes import FakeCaiArray, FakeCupyArray
    gelu = ne.get_kernel("gelu", dtype="bf16")
    for kind in (FakeCupyArray, FakeCaiArray):
        x = kind((4, 96), "<u2", ptr=0x6A0000000000, device=1)
        y = kind((4, 96), "<u2", ptr=0x6A0000100000, device=1)
        if kind is FakeCaiArray:
            stub.place(0x6A0000000000, 0x6A0000200000, 1)
        got, per_device = launches_of(lambda: gelu(x, y))
        assert per_device == [0, 1, 0, 0], (kind, per_device)
        assert got[0]["function"] in functions_on([gelu], 1) and got[0]["stream"] == 0

    # MXFP8 scales the kernel allocates are zeroed (cuMemsetD8Async) before the launch, both
    # in device 1's context, from a thread with none current
    cu.cuCtxSetCurrent(cu.CUcontext(0))
    gm = ne.get_kernel("gelu", dtype="fp8", scaling="mxfp8")
    got, per_device = launches_of(lambda: gm(tensor((64, 128), 1)))
    assert per_device == [0, 1, 0, 0] and current() == 0, (per_device, hex(current()))
    print("OK")
    """
)

TWO_THREADS = textwrap.dedent(
    """
    from nvrtc_engine.families.shared.blockscale import mxfp8_scale_shape

    def calls_on(device):
        # one call of each family on `device`, its outputs given or allocated
        k = ne.get_kernel
        gelu, rms = k("gelu", dtype="bf16"), k("rmsnorm_fwd", in_dtype="bf16", hidden_size=1024)
        ct, q = k("cast_transpose", dtype="fp8"), k("quantize", dtype="fp8", layout="both")
        x, y, w = tensor((64, 1024), device), tensor((64, 1024), device), tensor((1024,), device)
        r = tensor((64,), device, F32)
        s, a = tensor((1,), device, F32), tensor((1,), device, F32)
        q_out = dict(
            rowwise_data=tensor((64, 1024), device, U8),
            rowwise_scale_inv=tensor(mxfp8_scale_shape(64, 1024, "rowwise"), device, U8),
            columnwise_data=tensor((64, 1024), device, U8),
            columnwise_scale_inv=tensor(mxfp8_scale_shape(64, 1024, "columnwise"), device, U8),
        )
        kernels = [gelu, rms, ct, q]
        return kernels, [lambda: gelu(x, y), lambda: gelu(x), lambda: rms(x, w, 1e-5, y, r),
                         lambda: ct(x, scale=s, amax=a), lambda: q(x, **q_out)]

    calls_on(0)  # compile here, so that the threads race on loading only
    ne.clear_cache(disk=False)  # fresh Kernel objects (from disk): nothing loaded anywhere
    N = 200
    errors, barrier = [], threading.Barrier(2)
    plan = {d: calls_on(d) for d in (0, 1)}
    fresh = plan[0][0]
    assert plan[1][0] == fresh and not any(k._loaded for k in fresh)
    loads = [stub.module_loads(d) for d in (0, 1)]
    before = [stub.device_launches(d) for d in range(4)]

    def worker(device):
        try:
            if device == 1:  # device 1's tensors while device 0 is current (as torch's)
                driver.make_current(driver.get_device(0))
            start = current()
            barrier.wait()
            for _ in range(N):
                for call in plan[device][1]:
                    call()
            # the thread's current context (none on thread 0) is as it was
            assert current() == start == (stub_driver.context(0) if device else 0)
        except BaseException as exc:
            errors.append((device, exc))

    threads = [threading.Thread(target=worker, args=(d,)) for d in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    launched = [stub.device_launches(d) - b for d, b in enumerate(before)]
    # launches one round of calls makes on a device, counted on this thread afterwards
    per_round = launches_of(lambda: [call() for call in plan[0][1]])[1][0]
    assert launched == [N * per_round, N * per_round, 0, 0], (launched, per_round)
    assert [stub.module_loads(d) - n for d, n in zip((0, 1), loads)] == [len(fresh)] * 2
    for k in fresh:
        assert set(k._loaded) == {0, 1}
        assert {tuple(set(d)) for d in prepared_devices(k)} == {(0,), (1,)}, k
    print("OK")
    """
)

ARCHS_AND_SMS = textwrap.dedent(
    """
    # a cubin runs only on a device of its arch: device 3 (sm_80) refuses an sm_90 cubin
    # before anything is loaded or launched
    k90 = ne.get_kernel("gelu", dtype="bf16", arch="sm_90")
    x3, y3 = tensor((4, 96), 3), tensor((4, 96), 3)
    loads, launches = stub.module_loads(3), stub.launches
    for attempt in (lambda: k90.loaded(3), lambda: k90(x3, y3), lambda: k90(x3)):
        try:
            attempt()
        except ne.ArgumentError as exc:
            assert exc.argument == "device" and "(sm_80)" in str(exc), exc
            assert "arch='sm_80'" in str(exc), exc
        else:
            raise AssertionError("no ArgumentError")
    assert stub.module_loads(3) == loads and stub.launches == launches
    assert 3 not in k90._loaded and not any(3 in d for d in prepared_devices(k90))
    # the device's own kernel: another key (arch), another cache entry
    k80 = ne.get_kernel("gelu", dtype="bf16", device=3)
    assert k80.key.arch == "sm_80" and k80 is not k90
    assert k80.artifact.digest != k90.artifact.digest
    got, per_device = launches_of(lambda: k80(x3, y3))
    assert per_device == [0, 0, 0, 1] and got[0]["function"] in functions_on([k80], 3)
    try:
        k80.loaded(0)
    except ne.ArgumentError as exc:
        assert exc.argument == "device" and "cubin for sm_80" in str(exc), exc
    else:
        raise AssertionError("an sm_80 cubin loaded on sm_90")
    # without an arch, the current device's: the memo follows a device switch
    driver.make_current(driver.get_device(3))
    assert ne.get_kernel("gelu", dtype="bf16") is k80
    driver.make_current(driver.get_device(0))
    assert ne.get_kernel("gelu", dtype="bf16") is k90
    # from the disk cache each device's arch finds its own entry
    digests = {k.key.arch: k.artifact.digest for k in (k80, k90)}
    ne.clear_cache(disk=False)
    for device, arch in ((3, "sm_80"), (0, "sm_90")):
        k = ne.get_kernel("gelu", dtype="bf16", device=device)
        assert (k.origin, k.key.arch, k.artifact.digest) == ("disk", arch, digests[arch])
    # an ordinal beyond the visible devices
    try:
        k90.loaded(4)
    except ne.ArgumentError as exc:
        assert "device 4 does not exist; 4 visible" in str(exc), exc
    else:
        raise AssertionError("device 4 loaded")

    # grids and workspaces follow each device's SM count (device 2: 114 SMs, 0: 132)
    st = ne.get_kernel("layernorm_fwd", in_dtype="bf16", out_dtype="fp8", hidden_size=4096)
    assert st.residency(0)["sm_count"] == 132 and st.residency(2)["sm_count"] == 114
    grids = {d: st.launch_grid(16384, device=d) for d in (0, 2)}
    assert grids[0] != grids[2], grids  # a persistent grid
    for device in (0, 2):
        scale, amax = tensor((1,), device, F32), tensor((1,), device, F32)
        x, w = tensor((16384, 4096), device), tensor((4096,), device)
        z = tensor((16384, 4096), device, U8)
        mu, rs = tensor((16384,), device, F32), tensor((16384,), device, F32)
        for _ in range(3):  # checked, then prepared
            got, per_device = launches_of(
                lambda: st(x, w, w, 1e-5, z, mu, rs, scale=scale, amax=amax))
            assert per_device[device] == 1 == sum(per_device)
            assert got[0]["grid"][0] == grids[device], (device, got[0]["grid"], grids)
    bwd = ne.get_kernel("layernorm_bwd", in_dtype="bf16")
    rows, hidden = 16384, 200
    need = {d: bwd.workspace_elements(rows, hidden, device=d) for d in (0, 2)}
    assert need[2] < need[0], need
    for device in (2, 0):
        dz, x = tensor((rows, hidden), device), tensor((rows, hidden), device)
        mu, rs = tensor((rows,), device, F32), tensor((rows,), device, F32)
        w, dx = tensor((hidden,), device), tensor((rows, hidden), device)
        dg, db = tensor((hidden,), device), tensor((hidden,), device)
        ws = tensor((need[2],), device, F32)  # device 2's size: too small on device 0
        call = lambda: bwd(dz, x, mu, rs, w, dx, dg, db, workspace=ws)
        if device == 2:
            got, per_device = launches_of(call)
            assert per_device[2] == len(got) == sum(per_device) > 0
        else:
            try:
                call()
            except ne.ArgumentError as exc:
                assert exc.argument == "workspace", exc
            else:
                raise AssertionError("device 2's workspace taken on device 0")
    print("OK")
    """
)


PREWARM = textwrap.dedent(
    """
    # prewarm for each visible device's arch (sm_90 and sm_80 here): afterwards every device
    # launches the kernels of its arch with no compile, each module loaded there once, on
    # its first use, in the device's context
    from nvrtc_engine.tools.prewarm import prewarm

    entries = [{"op": ["gelu", "rmsnorm_fwd"], "in_dtype": "bf16", "hidden_size": 1024},
               {"op": "gelu", "in_dtype": "bf16", "out_dtype": "fp8_e4m3", "hidden_size": 1024}]
    archs = sorted({driver.get_device(d).arch for d in range(driver.device_count())})
    assert archs == ["sm_80", "sm_90"]
    report = prewarm(entries, arch=archs, workers=1, progress=False)
    keys = report.compiled + report.cached
    assert report.ok and len(keys) == 6, report.summary()
    compiles, loads = ne.cache_info().compiles, [stub.module_loads(d) for d in range(4)]
    for device in (1, 3, 0, 2):
        k = ne.get_kernel
        gelu = k("gelu", dtype="bf16", hidden_size=1024, device=device)
        g8 = k("gelu", dtype="fp8", hidden_size=1024, device=device)
        rms = k("rmsnorm_fwd", in_dtype="bf16", hidden_size=1024, device=device)
        assert {gelu.key, g8.key, rms.key} <= set(keys), device
        x, y, w = tensor((64, 1024), device), tensor((64, 1024), device), tensor((1024,), device)
        y8, r = tensor((64, 1024), device, U8), tensor((64,), device, F32)
        s, a = tensor((1,), device, F32), tensor((1,), device, F32)
        for _ in range(3):  # checked, then prepared
            got, per_device = launches_of(
                lambda: (gelu(x, y), g8(x, y8, scale=s, amax=a), rms(x, w, 1e-5, y, r)))
            assert per_device[device] == len(got) == sum(per_device) == 3, (device, per_device)
            assert {launch["function"] for launch in got} <= functions_on([gelu, g8, rms], device)
    assert ne.cache_info().compiles == compiles
    assert [stub.module_loads(d) - n for d, n in enumerate(loads)] == [3, 3, 3, 3]
    assert current() == 0
    print("OK")
    """
)

TORCH_LAYER = textwrap.dedent(
    """
    # nvrtc_engine.torch keeps one kernel per (op, dtypes, hidden size, device): fetched for
    # the device's arch and loaded there when first needed, never another device's
    import torch  # the real one (CPU build): the layer's kernels are fetched without tensors
    import stub_driver
    stub = stub_driver.load()
    from cuda.bindings import driver as cu
    from nvrtc_engine.core import driver
    from nvrtc_engine.torch import _kernels

    fetched = {}
    for device in (0, 1, 3, 2, 0, 1, 3):
        key = ("gelu", torch.bfloat16, None, 1024, device, ())
        k = fetched.setdefault(device, _kernels.kernel(key, lambda: None))
        assert _kernels.kernel(key, lambda: None) is k
        assert k.key.arch == driver.get_device(device).arch and device in k._loaded, device
        assert int(cu.cuCtxGetCurrent()[1]) == 0  # loaded in the device's context, none left
    assert fetched[0] is fetched[1] is fetched[2] and fetched[3].key.arch == "sm_80"
    modules = {int(fetched[d].loaded(d).module) for d in range(4)}
    assert len(modules) == 4  # a module per device
    assert [stub.module_loads(d) for d in range(4)] == [1, 1, 1, 1]
    assert len(_kernels._KERNELS) == 4
    print("OK")
    """
)


def _run(body: str, cache: Path) -> None:
    stub_driver.run(PRELUDE + body, cache, DEVICES)


def test_every_family_on_device_1_after_device_0(stub_kernel_cache):
    _run(EVERY_FAMILY, stub_kernel_cache)


def test_two_threads_launch_on_two_devices_at_once(stub_kernel_cache):
    _run(TWO_THREADS, stub_kernel_cache)


def test_archs_and_sm_counts_per_device(stub_kernel_cache):
    _run(ARCHS_AND_SMS, stub_kernel_cache)


def test_prewarmed_kernels_launch_on_every_device_without_compiling(stub_kernel_cache):
    _run(PREWARM, stub_kernel_cache)


def test_the_torch_layer_fetches_a_kernel_per_device(stub_kernel_cache):
    pytest.importorskip("torch")
    stub_driver.run(TORCH_LAYER, stub_kernel_cache, DEVICES)
