"""Prewarm on a real GPU: prewarmed kernels launch with no further compile, fork()ed children
launch them after a prewarm that left CUDA untouched in the parent, and one kernel runs on
two GPUs (module loaded per device)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import nvrtc_engine as ne
from nvrtc_engine import reference
from nvrtc_engine.core.kernel import runs_on
from nvrtc_engine.tools.prewarm import prewarm

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

from test_gpu_gelu import run_and_check  # noqa: E402  (needs torch, skipped above without)

TESTS = Path(__file__).resolve().parent


def _arch(device: int) -> str:
    return ne.core.driver.get_device(device).arch


def _scale(key):
    return 2.0 if key.scaling == "tensor" else None


def test_prewarm_then_launch_without_compiling_again():
    device = torch.cuda.current_device()
    entry = {"op": "gelu", "in_dtype": ["bf16", "fp16"], "out_dtype": ["bf16", "fp8_e4m3"],
             "hidden_size": [4096, "any"]}  # fmt: skip
    report = prewarm([entry], workers=2, progress=False)
    assert report.ok, report.summary()
    keys = report.compiled + report.cached
    assert len(keys) == 8 and {k.arch for k in keys} == {_arch(device)}
    compiles = ne.cache_info().compiles
    rng = np.random.default_rng()
    for key in keys:
        kernel = ne.get_kernel("gelu", in_dtype=key.in_dtype, out_dtype=key.out_dtype,
                               hidden_size=key.hidden_size)  # fmt: skip
        assert kernel.key == key
        x_host = reference.sample_input((96, 4096), key.in_dtype, rng)
        run_and_check(kernel, x_host, key.out_dtype, scale=_scale(key))
    assert ne.cache_info().compiles == compiles


_FORK_AFTER_PREWARM = textwrap.dedent("""
    import json, multiprocessing, sys
    sys.path.insert(0, sys.argv[1])
    import nvrtc_engine as ne
    from nvrtc_engine.core import driver
    from nvrtc_engine.tools.prewarm import prewarm

    report = prewarm([{"op": "gelu", "in_dtype": "bf16", "out_dtype": ["bf16", "fp8_e4m3"]}],
                     progress=False)
    assert report.ok, report.summary()
    keys = report.compiled + report.cached
    parent_cuda = driver._init_pid is not None

    def child(i):
        import numpy as np
        from test_gpu_gelu import run_and_check
        from nvrtc_engine import reference
        key = keys[i]
        before = ne.cache_info().compiles  # the counter is inherited from the parent
        kernel = ne.get_kernel(key)
        x = reference.sample_input((257, 1000), "bf16", np.random.default_rng())
        run_and_check(kernel, x, key.out_dtype, scale=2.0 if key.scaling == "tensor" else None)
        return kernel.origin, ne.cache_info().compiles - before

    with multiprocessing.get_context("fork").Pool(2) as pool:
        results = pool.map_async(child, [0, 1]).get(timeout=300)  # a dead child: no hang
    print(json.dumps({"parent_cuda": parent_cuda, "arch": keys[0].arch, "results": results}))
""")


def test_fork_after_prewarm_children_launch(tmp_path):
    """The parent prewarms with the arch read from the GPU, yet never initializes CUDA itself,
    so fork()ed children (DataLoader-style workers) can use CUDA and launch the kernels."""
    env = {**os.environ, "NVRTC_ENGINE_CACHE_DIR": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-c", _FORK_AFTER_PREWARM, str(TESTS)], env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["parent_cuda"] is False
    assert result["arch"] == _arch(torch.cuda.current_device())
    assert [r[1] for r in result["results"]] == [0, 0]  # no compiles: the parent's kernels


def test_one_kernel_on_two_gpus():
    count = torch.cuda.device_count()
    if count < 2:
        pytest.skip(f"needs 2 GPUs, {count} visible")
    rng = np.random.default_rng()
    per_device = [ne.get_kernel("gelu", dtype="fp8", hidden_size=4096, device=d) for d in (0, 1)]
    assert [k.key.arch for k in per_device] == [_arch(0), _arch(1)]
    for d, kernel in enumerate(per_device):  # each device gets its own arch's cubin
        with torch.cuda.device(d):
            run_and_check(kernel, reference.sample_input((64, 4096), "bf16", rng), "fp8_e4m3",
                          scale=2.0)  # fmt: skip
    if not runs_on(_arch(0), _arch(1)):
        pytest.skip(f"devices 0 and 1 are {_arch(0)} and {_arch(1)}: no common cubin")
    kernel = per_device[0]
    for d in (0, 1):
        with torch.cuda.device(d):
            x_host = reference.sample_input((128, 4096), "bf16", rng)
            run_and_check(kernel, x_host, "fp8_e4m3", scale=1.5)
    assert set(kernel._loaded) == {0, 1}
    assert kernel.loaded(0).module is not kernel.loaded(1).module
