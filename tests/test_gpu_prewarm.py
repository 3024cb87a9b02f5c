"""Prewarm on a real GPU: prewarmed kernels launch with no further compile, in the process
and in worker processes started after it (two GPUs: tests/test_gpu_multi.py)."""

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


_WORKERS_AFTER_PREWARM = textwrap.dedent("""
    import json, multiprocessing
    import nvrtc_engine as ne
    from nvrtc_engine.tools.prewarm import prewarm

    def child(key):
        import numpy as np
        from test_gpu_gelu import run_and_check
        from nvrtc_engine import reference
        kernel = ne.get_kernel(key)
        x = reference.sample_input((257, 1000), "bf16", np.random.default_rng())
        run_and_check(kernel, x, key.out_dtype, scale=2.0 if key.scaling == "tensor" else None)
        return kernel.origin, ne.cache_info().compiles

    if __name__ == "__main__":
        report = prewarm([{"op": "gelu", "in_dtype": "bf16", "out_dtype": ["bf16", "fp8_e4m3"]}],
                         progress=False)
        assert report.ok, report.summary()
        keys = report.compiled + report.cached
        # NVRTC initializes the CUDA driver in the process that compiles: workers that use
        # CUDA start with spawn (as torch.multiprocessing's do)
        with multiprocessing.get_context("spawn").Pool(2) as pool:
            results = pool.map_async(child, keys).get(timeout=300)  # a dead child: no hang
        print(json.dumps({"arch": keys[0].arch, "results": results}))
""")


def test_workers_spawned_after_prewarm_launch_without_compiling(tmp_path):
    """The parent prewarms with the arch read from the GPU; workers spawned after it (a data
    loader's, one per GPU) find every kernel in the disk cache and launch it."""
    script = tmp_path / "workers_after_prewarm.py"
    script.write_text(_WORKERS_AFTER_PREWARM)
    path = [str(TESTS), str(TESTS.parent), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "NVRTC_ENGINE_CACHE_DIR": str(tmp_path / "cache"),
           "PYTHONPATH": os.pathsep.join(filter(None, path))}  # fmt: skip
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["arch"] == _arch(torch.cuda.current_device())
    assert result["results"] == [["disk", 0], ["disk", 0]]  # no compiles in the workers
