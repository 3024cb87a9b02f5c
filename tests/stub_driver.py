"""A stub ``libcuda.so.1`` (tests/host_cuda/libcuda_stub.c) for running the real launch path
(cuda.bindings included) without a GPU.

Load it before anything opens the CUDA driver, and only in a process of its own (a
subprocess): once loaded, the process sees one fake sm_90 device, so GPU tests there would not
be skipped. :func:`load` builds it with the system's C compiler (``$CC``, else ``cc``, ``gcc``
or ``clang``: test tooling only, the package itself never compiles C) into a cache directory
and returns a :class:`Stub` reading what the driver's launch functions were given.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shlex
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

SOURCE = Path(__file__).resolve().parent / "host_cuda" / "libcuda_stub.c"
CONTEXT = 0xC0DE0000
MAX_PARAMS, LOG, BLOB = 64, 16, 4096  # the stub's STUB_MAX_PARAMS, STUB_LOG, STUB_BLOB


def compiler() -> list[str] | None:
    """The C compiler command: ``$CC`` when set, else the first of ``cc``, ``gcc``,
    ``clang`` on the PATH; None when there is none."""
    explicit = shlex.split(os.environ.get("CC", ""))
    if explicit:
        return explicit
    for name in ("cc", "gcc", "clang"):
        if shutil.which(name):
            return [name]
    return None


def compile_shared(source: Path, out: Path, flags: list[str], libs: list[str]) -> Path:
    """Compile C ``source`` into the shared library ``out``, written to a temporary name
    and renamed (so concurrent test processes each see a whole file). Raises RuntimeError
    with the compiler's output when it fails."""
    cc = compiler()
    if cc is None:
        raise RuntimeError("no C compiler (set CC, or install cc/gcc/clang)")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    command = [*cc, "-O2", "-shared", "-fPIC", *flags, str(source), "-o", str(tmp), *libs]
    done = subprocess.run(command, capture_output=True, timeout=120)
    if done.returncode != 0:
        tmp.unlink(missing_ok=True)
        output = (done.stderr or done.stdout).decode(errors="replace").strip()
        raise RuntimeError(f"{shlex.join(command)} failed ({done.returncode}):\n{output}")
    os.replace(tmp, out)
    return out


def build(directory: str | os.PathLike[str] | None = None) -> Path:
    """Compile the stub (once per source version) and return the library's path."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    base = Path(directory or Path(tempfile.gettempdir()) / f"nvrtc_engine_stub_{os.getuid()}")
    out = base / digest / "libcuda.so.1"
    if not out.exists():
        compile_shared(SOURCE, out, ["-Wl,-soname,libcuda.so.1"], ["-ldl"])
    return out


class _Record(ctypes.Structure):
    """One launch of the stub's log (its ``stub_record_t``)."""

    _fields_ = [
        ("function", ctypes.c_size_t), ("stream", ctypes.c_size_t),
        ("grid", ctypes.c_uint64 * 3), ("block", ctypes.c_uint64 * 3), ("shmem", ctypes.c_uint64),
        ("dependent", ctypes.c_int), ("count", ctypes.c_int), ("blob_bytes", ctypes.c_int),
        ("params", ctypes.c_uint64 * MAX_PARAMS), ("blob", ctypes.c_ubyte * BLOB),
    ]  # fmt: skip


class Stub:
    """The loaded stub: what its ``cuLaunchKernel``/``cuLaunchKernelEx`` saw."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.lib = lib
        size = ctypes.c_int.in_dll(lib, "stub_record_size").value
        if size != ctypes.sizeof(_Record):
            raise RuntimeError(f"stub record of {size} bytes, reader's {ctypes.sizeof(_Record)}")
        self._log = (_Record * LOG).in_dll(lib, "stub_log")

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

    def record_blob(self, function: object, nbytes: int) -> None:
        """Keep the ``nbytes`` bytes of ``function``'s one by-value parameter at each launch."""
        self.lib.stub_blob_param(ctypes.c_size_t(int(function)), ctypes.c_int(nbytes))

    @staticmethod
    def _entry(r: _Record) -> dict[str, object]:
        return {
            "function": r.function, "grid": tuple(r.grid), "block": tuple(r.block),
            "shmem": r.shmem, "stream": r.stream, "params": tuple(r.params[: r.count]),
            "dependent": bool(r.dependent), "blob": bytes(r.blob[: r.blob_bytes]),
        }  # fmt: skip

    def last(self) -> dict[str, object]:
        """The last launch: function, grid, block, shmem, stream, recorded param slots,
        whether it was a programmatic dependent launch (cuLaunchKernelEx) and the bytes of a
        by-value struct parameter (:meth:`record_blob`; else empty)."""
        return self._entry(self._log[(self.launches - 1) % LOG])

    def since(self, count: int) -> list[dict[str, object]]:
        """The launches after the first ``count`` (``launches`` read before), oldest first
        (at most the log's 16)."""
        now = self.launches
        if now - count > LOG:
            raise RuntimeError(f"{now - count} launches since; the stub's log keeps {LOG}")
        return [self._entry(self._log[n % LOG]) for n in range(count, now)]


def load(directory: str | os.PathLike[str] | None = None) -> Stub:
    """Build and load the stub as this process's libcuda.so.1."""
    return Stub(ctypes.CDLL(str(build(directory)), mode=ctypes.RTLD_GLOBAL))
