"""The nvrtc-engine command line: demo without a GPU, cache info/clear, exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from nvrtc_engine import driver
from nvrtc_engine.cli import main


def test_demo_compiles_then_hits_the_cache(capsys, isolated_cache):
    assert main(["demo", "--arch", "sm_90", "--no-run"]) == 0
    out = capsys.readouterr().out
    assert "gelu_bf16_e4m3_tensor_rowwise_h14336_sm90" in out
    assert out.count("compiled") == 4
    assert main(["demo", "--arch", "sm_90", "--no-run"]) == 0
    assert capsys.readouterr().out.count("memory hit") == 4


def test_cache_info_and_clear(capsys):
    main(["demo", "--arch", "sm_89", "--no-run"])
    capsys.readouterr()
    assert main(["cache", "info", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["entries"] == 4 and info["bytes"] > 0
    assert main(["cache", "clear"]) == 0
    assert "cleared 4 entries" in capsys.readouterr().out
    main(["cache", "info"])
    assert "entries:   0" in capsys.readouterr().out


def test_bad_arch_exits_2(capsys):
    assert main(["demo", "--arch", "sm_70", "--no-run"]) == 2
    assert "arch='sm_70' is not allowed" in capsys.readouterr().err


def test_console_script_runs_in_a_fresh_process(isolated_cache, tmp_path):
    env = {**os.environ, "NVRTC_ENGINE_CACHE_DIR": str(isolated_cache)}
    args = [sys.executable, "-m", "nvrtc_engine.cli", "demo", "--no-run", "--tokens", "64"]
    if driver.device_count() == 0:
        args += ["--arch", "sm_90"]
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "gelu_bf16_bf16_none_rowwise_h4096" in done.stdout
