"""torch is an optional extra: ``import nvrtc_engine`` never needs it, and
``import nvrtc_engine.torch`` without it says what to install (both in a subprocess where
``import torch`` fails, installed or not)."""

from __future__ import annotations

import subprocess
import sys

BLOCK_TORCH = "import sys; sys.modules['torch'] = None\n"  # 'import torch' raises ImportError


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", BLOCK_TORCH + code], capture_output=True, text=True, timeout=120
    )


def test_package_imports_and_compiles_without_torch():
    done = _run(
        "import nvrtc_engine as ne\n"
        "k = ne.get_kernel('swiglu', dtype='bf16', hidden_size=256, arch='sm_90')\n"
        "print(k.name, 'torch' in sys.modules and sys.modules['torch'] is not None)\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["swiglu_bf16_bf16_none_rowwise_h256_sm90", "False"]


def test_torch_layer_without_torch_names_the_extra():
    done = _run(
        "try:\n"
        "    import nvrtc_engine.torch\n"
        "except ImportError as exc:\n"
        "    print(type(exc).__name__, exc)\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ImportError nvrtc_engine.torch needs PyTorch")
    assert "pip install 'nvrtc-engine[torch]'" in done.stdout
