"""Two GPUs (skipped with fewer): every family launched on device 1 after device 0 in one
process, with the other device current too, and from two threads at once, against the float64
references; one process per GPU (``torch.multiprocessing`` spawn) sharing one disk cache, each
key compiled once in all; the PyTorch modules on ``cuda:1`` forward and backward, and moved from
``cuda:0`` to ``cuda:1``; prewarm, then every visible device launching with no compile; a launch
on another device's tensors leaves the caller's current device as it was.

    python -m pytest -p no:benchmark -m gpu tests/test_gpu_multi.py -v

The CPU side of the same rules runs against the stub libcuda's fake devices
(tests/test_launch_multi_device.py) and the torch stand-ins (tests/test_torch.py).
"""

from __future__ import annotations

import json
import threading
import zlib
from pathlib import Path

import numpy as np
import pytest
from gpu_util import torch
from test_gpu_activation import check_mxfp8, check_unscaled_or_tensor, make_inputs
from test_gpu_cast import _check_mxfp8, _check_nvfp4, _run_cast_transpose
from test_gpu_gelu import run_and_check
from test_gpu_norm import run_backward, run_forward
from test_gpu_torch import BF16, E4M3, F64, H, _check_fp8, _compare, _copy_params

import nvrtc_engine as ne
import nvrtc_engine.torch as net
from nvrtc_engine import reference
from nvrtc_engine.core.kernel import runs_on
from nvrtc_engine.tools.prewarm import prewarm
from nvrtc_engine.torch import _kernels

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs"),
]


def _activation(op: str, lead: tuple[int, ...], cols: int, mx: bool = False):
    def check(kernel, rng):
        x, grad = make_inputs(op, kernel.key.in_dtype, lead, cols, rng)
        if mx:
            check_mxfp8(kernel, x, grad)
        else:
            check_unscaled_or_tensor(kernel, x, grad, rng)

    return check


def _norm(run, rows: int, hidden: int):
    def check(kernel, rng):
        run(kernel, reference.sample_input((rows, hidden), kernel.key.in_dtype, rng))

    return check


# name -> (op, key fields, check(kernel, rng)): one representative call of each family, its
# tensors made on torch's current device and checked against the float64 reference
CASES = {
    "gelu fp8 tensor": ("gelu", dict(dtype="fp8"), lambda k, rng: run_and_check(
        k, reference.sample_input((96, 1000), "bf16", rng), "fp8_e4m3", scale=2.0)),
    "dgelu bf16": ("dgelu", dict(dtype="bf16"), _activation("dgelu", (33,), 1000)),
    "swiglu fp8 tensor": ("swiglu", dict(dtype="fp8"), _activation("swiglu", (3, 5), 512)),
    "dswiglu bf16": ("dswiglu", dict(dtype="bf16"), _activation("dswiglu", (33,), 512)),
    "swiglu mxfp8 both": ("swiglu", dict(dtype="fp8", scaling="mxfp8", layout="both"),
                          _activation("swiglu", (128,), 256, mx=True)),
    "layernorm_fwd bf16": ("layernorm_fwd", dict(in_dtype="bf16", hidden_size=1024),
                           _norm(run_forward, 257, 1024)),
    "rmsnorm_fwd fp8 tensor": ("rmsnorm_fwd", dict(in_dtype="bf16", out_dtype="fp8_e4m3",
                                                   hidden_size=4096),
                               _norm(run_forward, 300, 4096)),
    "rmsnorm_fwd mxfp8": ("rmsnorm_fwd", dict(in_dtype="bf16", out_dtype="fp8_e4m3",
                                              scaling="mxfp8", hidden_size=1024),
                          _norm(run_forward, 64, 1024)),
    "layernorm_bwd general": ("layernorm_bwd", dict(in_dtype="bf16"),
                              _norm(run_backward, 300, 1000)),
    "rmsnorm_bwd bf16": ("rmsnorm_bwd", dict(in_dtype="bf16", hidden_size=4096),
                         _norm(run_backward, 128, 4096)),
    "rmsnorm_bwd_add bf16": ("rmsnorm_bwd_add", dict(in_dtype="bf16", hidden_size=1024),
                             _norm(run_backward, 64, 1024)),
    "cast_transpose fp8": ("cast_transpose", dict(dtype="fp8"),
                           lambda k, rng: _run_cast_transpose(k, rng, (96, 320))),
    "cast_transpose_dbias fp8": ("cast_transpose_dbias", dict(dtype="fp8"),
                                 lambda k, rng: _run_cast_transpose(k, rng, (256, 512))),
    "quantize mxfp8 both": ("quantize", dict(dtype="fp8", layout="both"),
                            lambda k, rng: _check_mxfp8(k, rng, (64, 4096))),
    "quantize nvfp4 both": ("quantize", dict(dtype="fp4_e2m1", layout="both"),
                            lambda k, rng: _check_nvfp4(k, rng, (64, 4096))),
}  # fmt: skip


def _rng(*parts) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(repr(parts).encode()))


def _kernel(name: str, device: int) -> ne.Kernel:
    op, fields, _ = CASES[name]
    return ne.get_kernel(op, **fields, device=device)


class Elsewhere:
    """A kernel called while device ``other`` is torch's current device (its tensors are on
    another): the launch goes to the tensors' device and leaves ``other`` current."""

    def __init__(self, kernel: ne.Kernel, other: int) -> None:
        self._kernel, self._other = kernel, other

    def __getattr__(self, name: str):
        return getattr(self._kernel, name)

    def __call__(self, *args, **kwargs):
        with torch.cuda.device(self._other):
            out = self._kernel(*args, **kwargs)
            assert torch.cuda.current_device() == self._other
        return out


@pytest.mark.parametrize("name", list(CASES))
def test_every_family_on_device_1_after_device_0(name):
    """Each device's kernel (one object where both devices have one arch, a module loaded per
    device), run on each device in turn: on its first call (checked path), again (prepared),
    and with the other device current."""
    kernels = {d: _kernel(name, d) for d in (0, 1)}
    check = CASES[name][2]
    rng = _rng(name)
    for device in (0, 1, 0, 1):
        with torch.cuda.device(device):
            for kernel in (
                kernels[device],
                kernels[device],
                Elsewhere(kernels[device], 1 - device),
            ):
                check(kernel, rng)
            assert torch.cuda.current_device() == device
    for d, kernel in kernels.items():
        assert kernel.loaded(d).device.ordinal == d
    if kernels[0] is kernels[1]:
        assert set(kernels[0]._loaded) == {0, 1}
        assert kernels[0].loaded(0).module != kernels[0].loaded(1).module
    elif runs_on(kernels[0].key.arch, ne.driver.get_device(1).arch):
        with torch.cuda.device(1):  # device 0's cubin, where device 1 can run it too
            check(kernels[0], rng)


def test_every_family_on_two_threads_at_once():
    """Two threads, one per device, run every case three times together; the kernels come
    fresh from the disk cache, so that both threads load the same kernels at once. The
    thread of device 1 makes every other call with device 0 current."""
    for name in CASES:
        for d in (0, 1):
            _kernel(name, d)  # compile here: the threads race on loading and launching
    ne.clear_cache(disk=False)
    kernels = {(name, d): _kernel(name, d) for name in CASES for d in (0, 1)}
    assert not any(k._loaded for k in kernels.values())
    errors: list = []
    barrier = threading.Barrier(2)

    def work(device: int) -> None:
        name = None
        try:
            torch.cuda.set_device(device)
            rng = _rng("threads", device)
            barrier.wait()
            for round_ in range(3):
                for name, (_, _, check) in CASES.items():
                    kernel = kernels[name, device]
                    check(Elsewhere(kernel, 0) if device and round_ % 2 else kernel, rng)
            assert torch.cuda.current_device() == device
        except BaseException as exc:  # reported below
            errors.append((device, name, exc))

    threads = [threading.Thread(target=work, args=(d,)) for d in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for (name, d), kernel in kernels.items():
        assert kernel.loaded(d).device.ordinal == d, name


def _one_process(rank: int, names: list[str], barrier, out: str) -> None:
    """One process per GPU (torch.multiprocessing.spawn): every case on device ``rank``,
    both processes starting together on the same cold disk cache (the parent's
    NVRTC_ENGINE_CACHE_DIR); writes its counters and keys to ``out/rank.json``."""
    torch.cuda.set_device(rank)
    rng = _rng("process", rank)
    barrier.wait()
    keys = []
    for name in names:
        kernel = _kernel(name, rank)
        CASES[name][2](kernel, rng)
        keys.append(str(kernel.key))
    info = ne.cache_info()
    result = {"compiles": info.compiles, "disk_hits": info.disk_hits, "keys": keys,
              "directory": info.directory, "device": torch.cuda.current_device()}  # fmt: skip
    (Path(out) / f"{rank}.json").write_text(json.dumps(result))


def test_one_process_per_gpu_shares_one_disk_cache(tmp_path):
    """Data-parallel layout: a process per GPU, one disk cache; each key compiles once in all
    (the other process waits for it, then reads it from disk)."""
    mp = torch.multiprocessing
    barrier = mp.get_context("spawn").Barrier(2)
    names = list(CASES)
    mp.spawn(_one_process, args=(names, barrier, str(tmp_path)), nprocs=2, join=True)
    results = [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in (0, 1)]
    assert [r["device"] for r in results] == [0, 1]
    keys = {k for r in results for k in r["keys"]}
    assert sum(r["compiles"] for r in results) == len(keys), results
    for r in results:
        assert r["compiles"] + r["disk_hits"] == len(names), r
    info = ne.cache_info()  # this process's cache directory (conftest's isolated_cache)
    assert {r["directory"] for r in results} == {info.directory} and info.entries == len(keys)


def test_torch_modules_on_cuda_1_forward_and_backward():
    """The modules on cuda:1 against PyTorch's in float64, with device 0 current: the kernels
    are fetched for device 1 and device 0 stays current."""
    x = torch.randn(4, 64, H, device="cuda:1") * 2 + 0.5
    before = set(_kernels._KERNELS)
    with torch.cuda.device(0):
        for mine, theirs in [
            (net.LayerNorm(H, device="cuda:1", dtype=BF16),
             torch.nn.LayerNorm(H, device="cuda:1", dtype=F64)),
            (net.RMSNorm(H, device="cuda:1", dtype=BF16),
             torch.nn.RMSNorm(H, device="cuda:1", dtype=F64)),
        ]:  # fmt: skip
            _copy_params(mine, theirs)
            _compare(mine, theirs, x, BF16, list(mine.parameters()), list(theirs.parameters()))
        _compare(net.GELU(), lambda t: torch.nn.functional.gelu(t, approximate="tanh"), x, BF16)
        _compare(net.SwiGLU(), lambda t: torch.nn.functional.silu(t[..., : H // 2])
                 * t[..., H // 2 :], x, BF16)  # fmt: skip
        assert torch.cuda.current_device() == 0
    assert all(key[4] == 1 for key in set(_kernels._KERNELS) - before)
    ops = {key[0] for key in _kernels._KERNELS if key[4] == 1}
    assert ops >= {"layernorm_fwd", "layernorm_bwd", "rmsnorm_fwd", "rmsnorm_bwd", "gelu",
                   "dgelu", "swiglu", "dswiglu"}, ops  # fmt: skip


def test_a_module_moved_from_cuda_0_to_cuda_1():
    """A module used on cuda:0, then moved with .to("cuda:1"): its kernels are fetched again
    for device 1 (a module keeps its kernels per device), the FP8 buffers follow it and stay
    float32."""
    mine = net.RMSNorm(H, eps=1e-6, device="cuda:0", dtype=BF16)
    theirs = torch.nn.RMSNorm(H, eps=1e-6, device="cuda:0", dtype=F64)
    _copy_params(mine, theirs)
    fp8 = net.RMSNorm(H, eps=1e-6, device="cuda:0", dtype=BF16, out_dtype=E4M3)
    for device in ("cuda:0", "cuda:1"):
        for module in (mine, theirs, fp8):
            module.to(device)
        x = torch.randn(256, H, device=device)
        _compare(mine, theirs, x, BF16, [mine.weight], [theirs.weight])
        fp8.scale.fill_(4.0)
        fp8.amax.zero_()
        assert fp8.scale.device == fp8.amax.device == x.device and fp8.amax.dtype == torch.float32
        with torch.no_grad():
            xb = x.to(BF16)
            out = fp8(xb)
        ref = torch.nn.functional.rms_norm(xb.double(), (H,), fp8.weight.double(), 1e-6)
        _check_fp8(out, ref, 4.0, fp8.amax, E4M3, f"RMSNorm(out_dtype) on {device}")
    fetched = {key[4] for key in _kernels._KERNELS if key[0].startswith("rmsnorm")}
    assert fetched >= {0, 1}, fetched


def test_prewarm_then_every_visible_device_launches_without_compiling():
    """Prewarm for each visible device's arch, then each device launches the kernels with no
    compile, loading each module there on first use."""
    count = torch.cuda.device_count()
    archs = sorted({ne.driver.get_device(d).arch for d in range(count)})
    entries = [{"op": "gelu", "in_dtype": "bf16", "out_dtype": ["bf16", "fp8_e4m3"],
                "hidden_size": 4096},
               {"op": "layernorm_fwd", "in_dtype": "bf16", "hidden_size": 4096}]  # fmt: skip
    report = prewarm(entries, arch=archs, workers=2, progress=False)
    assert report.ok and len(report.compiled + report.cached) == 3 * len(archs), report.summary()
    compiles = ne.cache_info().compiles
    rng = _rng("prewarm")
    for device in range(count):
        with torch.cuda.device(device):
            g8 = ne.get_kernel("gelu", dtype="fp8", hidden_size=4096, device=device)
            g16 = ne.get_kernel("gelu", dtype="bf16", hidden_size=4096, device=device)
            ln = ne.get_kernel("layernorm_fwd", in_dtype="bf16", hidden_size=4096, device=device)
            x_host = reference.sample_input((64, 4096), "bf16", rng)
            run_and_check(g8, x_host, "fp8_e4m3", scale=2.0)
            run_and_check(g16, x_host, "bf16")
            run_forward(ln, x_host)
            assert all(device in k._loaded for k in (g8, g16, ln))
    assert ne.cache_info().compiles == compiles


def test_a_launch_on_device_1_leaves_device_0_current():
    """As a PyTorch op does: torch's current device, and where device="cuda" allocates, stay
    device 0 after kernels ran on device 1's tensors (checked path, prepared, allocating),
    and a thread with no current device gets none from a launch."""
    kernel = ne.get_kernel("gelu", dtype="bf16")
    x = torch.randn(64, 1024, device="cuda:1").to(BF16)
    with torch.cuda.device(0):
        outs = [kernel(x) for _ in range(3)] + [kernel(x, torch.empty_like(x))]
        assert torch.cuda.current_device() == 0
        assert torch.empty(1, device="cuda").device == torch.device("cuda:0")
        kernel(x.to("cuda:0"))
    assert all(y.device == x.device and torch.equal(y, outs[0]) for y in outs)
    assert {key[3] for key in kernel._prepared} == {0, 1}  # a prepared launch per device
    want = torch.nn.functional.gelu(x.double(), approximate="tanh")
    torch.testing.assert_close(outs[0].double(), want, rtol=2**-7, atol=2**-8)
    from cuda.bindings import driver as cu

    seen = []

    def fresh_thread() -> None:
        cu.cuCtxSetCurrent(cu.CUcontext(0))  # no current context on this thread
        kernel(x)
        seen.append(int(cu.cuCtxGetCurrent()[1]))

    t = threading.Thread(target=fresh_thread)
    t.start()
    t.join()
    assert seen == [0]
