"""A stub ``libcuda.so.1`` (tests/host_cuda/libcuda_stub.c) for running the real launch path
(cuda.bindings included) without a GPU.

Load it before anything opens the CUDA driver, and only in a process of its own (a
subprocess): once loaded, the process sees fake devices (one sm_90 device unless
:func:`load` is given others), so GPU tests there would not be skipped. :func:`load` builds it
with the system's C compiler (``$CC``, else ``cc``, ``gcc`` or ``clang``: test tooling only,
the package itself never compiles C) into a cache directory and returns a :class:`Stub`
reading what the driver's launch functions were given; :func:`run` runs a test script in such
a subprocess.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

TESTS = Path(__file__).resolve().parent
SOURCE = TESTS / "host_cuda" / "libcuda_stub.c"
CONTEXT = 0xC0DE0000  # device 0's primary context; device d's is CONTEXT + d * 0x100
MAX_PARAMS, LOG, BLOB = 64, 16, 4096  # the stub's STUB_MAX_PARAMS, STUB_LOG, STUB_BLOB
MAX_DEVICES = 8  # the stub's STUB_MAX_DEVICES
DEVICES_VARIABLE = "STUB_CUDA_DEVICES"  # read by the stub when it is loaded


def context(device: int) -> int:
    """The handle of fake ``device``'s primary context."""
    return CONTEXT + device * 0x100


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

    @property
    def device_count(self) -> int:
        return ctypes.c_int.in_dll(self.lib, "stub_device_count").value

    def module_loads(self, device: int) -> int:
        """Modules loaded into ``device``'s primary context so far."""
        return (ctypes.c_uint64 * MAX_DEVICES).in_dll(self.lib, "stub_module_loads")[device]

    def device_launches(self, device: int) -> int:
        """Launches on ``device`` (in its primary context) so far."""
        return (ctypes.c_uint64 * MAX_DEVICES).in_dll(self.lib, "stub_device_launches")[device]

    def place(self, low: int, high: int, device: int) -> None:
        """Have ``cuPointerGetAttribute`` put addresses ``low`` to ``high - 1`` on ``device``
        (at most 16 ranges; any other address is on device 0)."""
        self.lib.stub_pointer_device(ctypes.c_uint64(low), ctypes.c_uint64(high),
                                     ctypes.c_int(device))  # fmt: skip

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


def devices_spec(devices: list[tuple[str, int]]) -> str:
    """The stub's ``STUB_CUDA_DEVICES`` value for ``devices``: ``(arch, SM count)`` each,
    e.g. ``[("sm_90", 132), ("sm_80", 108)]``. Raises ValueError for more than
    :data:`MAX_DEVICES`, an arch that is no ``sm_XY`` or an SM count below 1."""
    if not 1 <= len(devices) <= MAX_DEVICES:
        raise ValueError(f"1 to {MAX_DEVICES} devices, got {len(devices)}")
    entries = []
    for arch, sms in devices:
        digits = arch.removeprefix("sm_")
        if not (arch.startswith("sm_") and digits.isdigit() and len(digits) in (2, 3)):
            raise ValueError(f"an arch such as sm_90, got {arch!r}")
        if sms < 1:
            raise ValueError(f"an SM count >= 1, got {sms}")
        entries.append(f"{digits}:{sms}")
    return ",".join(entries)


def load(
    directory: str | os.PathLike[str] | None = None,
    devices: list[tuple[str, int]] | None = None,
) -> Stub:
    """Build and load the stub as this process's libcuda.so.1.

    ``devices``: the fake devices, ``(arch, SM count)`` each (:func:`devices_spec`); by
    default what ``$STUB_CUDA_DEVICES`` says, else one sm_90 device of 132 SMs."""
    if devices is not None:
        os.environ[DEVICES_VARIABLE] = devices_spec(devices)  # the stub reads it when loaded
    return Stub(ctypes.CDLL(str(build(directory)), mode=ctypes.RTLD_GLOBAL))


def run(
    script: str, cache: str | os.PathLike[str], devices: list[tuple[str, int]] | None = None
) -> str:
    """Run Python ``script`` in a subprocess of its own, tests/ and the repository on its path,
    ``cache`` its NVRTC_ENGINE_CACHE_DIR and, with ``devices``, those fake devices for the stub
    it loads (:func:`devices_spec`); returns its output. Raises AssertionError with the
    output's tail when it fails or does not print ``OK`` last."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(TESTS), str(TESTS.parent), *filter(None, [env.get("PYTHONPATH")])]
    )
    env["NVRTC_ENGINE_CACHE_DIR"] = str(cache)
    if devices is not None:
        env[DEVICES_VARIABLE] = devices_spec(devices)
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-5000:]
    assert done.stdout.split()[-1:] == ["OK"], done.stdout[-2000:]
    return done.stdout
