"""Helpers for GPU tests: exact host <-> torch copies of every dtype, and poisoned outputs.

Importing this module skips the importing test module where torch is missing.
"""

from __future__ import annotations

import numpy as np
import pytest

import nvrtc_engine as ne

torch = pytest.importorskip("torch")


def to_torch(host: np.ndarray, dtype_name: str):
    """A CUDA tensor holding exactly the host values (bf16 through its uint16 bits)."""
    d = ne.DTYPES[dtype_name]
    if dtype_name == "bf16":
        return torch.from_numpy(host.view(np.int16).copy()).cuda().view(torch.bfloat16)
    return torch.from_numpy(host.astype(d.numpy())).cuda()


def to_host(t, dtype_name: str) -> np.ndarray:
    """The tensor's values as numpy (ml_dtypes for bf16 and FP8; FP8 may be uint8 storage)."""
    d = ne.DTYPES[dtype_name]
    if d.itemsize == 1:
        raw = t.view(torch.uint8).cpu().numpy()
    elif dtype_name == "bf16":
        raw = t.view(torch.int16).cpu().numpy().view(np.uint16)
    else:
        return t.cpu().numpy()
    return raw.view(d.numpy())


def poisoned(shape, dtype_name):
    """An output tensor whose every byte is 0xFF (NaN in every float format)."""
    t = torch.empty(shape, dtype=getattr(torch, ne.DTYPES[dtype_name].torch_name), device="cuda")
    t.view(torch.uint8).fill_(0xFF)
    return t


def poisoned_bytes(shape):
    """A uint8 tensor of 0xFF bytes (an E8M0 NaN: never a scale a kernel writes)."""
    return torch.full(shape, 0xFF, dtype=torch.uint8, device="cuda")
