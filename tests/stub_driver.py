"""A stub ``libcuda.so.1`` (tests/host_cuda/libcuda_stub.c) for running the real launch path
(cuda.bindings and ctypes included) without a GPU.

Load it before anything opens the CUDA driver, and only in a process of its own (a
subprocess): once loaded, the process sees one fake sm_90 device, so GPU tests there would not
be skipped. :func:`load` builds it with the compiled launcher's compiler and
build step (``nvrtc_engine.launcher.compile_shared``; ``CC`` picks the compiler) into a cache
directory and returns a :class:`Stub` reading what the last ``cuLaunchKernel`` was given.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import tempfile
from pathlib import Path

from nvrtc_engine import launcher

SOURCE = Path(__file__).resolve().parent / "host_cuda" / "libcuda_stub.c"
CONTEXT = 0xC0DE0000


def compiler() -> list[str] | None:
    """The C compiler to build the stub with (the compiled launcher's), or None."""
    return launcher.compiler()


def build(directory: str | os.PathLike[str] | None = None) -> Path:
    """Compile the stub (once per source version) and return the library's path."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    base = Path(directory or Path(tempfile.gettempdir()) / f"nvrtc_engine_stub_{os.getuid()}")
    out = base / digest / "libcuda.so.1"
    if not out.exists():
        launcher.compile_shared(SOURCE, out, ["-Wl,-soname,libcuda.so.1"], ["-ldl"])
    return out


class Stub:
    """The loaded stub: what its ``cuLaunchKernel`` saw."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.lib = lib

    def _u64(self, name: str) -> int:
        return ctypes.c_uint64.in_dll(self.lib, name).value

    @property
    def launches(self) -> int:
        return self._u64("stub_launches")

    @property
    def context_sets(self) -> int:
        return self._u64("stub_ctx_set_calls")

    def fail(self, launch: int = 0, ctx_set: int = 0) -> None:
        """Make cuLaunchKernel / cuCtxSetCurrent return these CUresults (0: succeed)."""
        ctypes.c_int.in_dll(self.lib, "stub_launch_error").value = launch
        ctypes.c_int.in_dll(self.lib, "stub_ctx_set_error").value = ctx_set

    def record_params(self, count: int, function: object = None) -> None:
        """Copy ``count`` 8-byte parameter slots at each launch of ``function`` (a
        ``CUfunction``), or of any function not given a count."""
        if function is None:
            ctypes.c_int.in_dll(self.lib, "stub_param_count").value = count
        else:
            self.lib.stub_count_params(ctypes.c_size_t(int(function)), ctypes.c_int(count))

    def last(self) -> dict[str, object]:
        """The last launch: function, grid, block, shmem, stream, recorded param slots and
        whether it was a programmatic dependent launch (cuLaunchKernelEx)."""
        grid = (ctypes.c_uint64 * 3).in_dll(self.lib, "stub_last_grid")
        block = (ctypes.c_uint64 * 3).in_dll(self.lib, "stub_last_block")
        count = ctypes.c_int.in_dll(self.lib, "stub_last_count").value
        params = (ctypes.c_uint64 * 64).in_dll(self.lib, "stub_params")
        return {
            "function": ctypes.c_size_t.in_dll(self.lib, "stub_last_function").value,
            "grid": tuple(grid),
            "block": tuple(block),
            "shmem": self._u64("stub_last_shmem"),
            "stream": ctypes.c_size_t.in_dll(self.lib, "stub_last_stream").value,
            "params": tuple(params[:count]),
            "dependent": bool(ctypes.c_int.in_dll(self.lib, "stub_last_dependent").value),
        }


def load(directory: str | os.PathLike[str] | None = None) -> Stub:
    """Build and load the stub as this process's libcuda.so.1."""
    return Stub(ctypes.CDLL(str(build(directory)), mode=ctypes.RTLD_GLOBAL))
