"""Compilation: CUDA source to cubin (or PTX) with NVRTC through ``cuda.bindings.nvrtc``.

Always a cubin for the exact arch (``-arch=sm_90``, ``-arch=sm_90a``); PTX only when the
arch is newer than the newest one this NVRTC supports, for that newest arch (the driver
compiles it at load; PTX from an NVRTC newer than the driver would not load, a cubin does).
Keys get such an arch only from a GPU newer than every known arch (``key.DeviceArch``): an
arch a caller names must be a known one, which NVRTC 13 compiles as a cubin.
Needs no GPU. The project's helpers are in-memory headers; CUDA toolkit headers (only
``cuda_fp8.h`` on archs without FP8 conversion instructions) are searched for in order:
``NVRTC_ENGINE_CUDA_INCLUDE_DIR``, the ``nvidia-cuda-runtime`` wheel (through
``cuda.pathfinder``), ``CUDA_HOME``/``CUDA_PATH``, ``/usr/local/cuda``.
"""

from __future__ import annotations

import functools
import os
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from . import config
from .errors import CompileError, HeaderNotFoundError, VariantError, warn_once
from .key import KNOWN_ARCH_NUMBERS, arch_number

__all__ = [
    "CompileOptions",
    "CompileResult",
    "CudaIncludeDir",
    "compile_options",
    "compile_source",
    "compile_target",
    "find_cuda_include_dir",
    "nvrtc_identity",
    "nvrtc_version",
    "supported_archs",
    "target_arch",
]


def _nvrtc() -> Any:
    from cuda.bindings import nvrtc

    return nvrtc


def _check(result: Any, call: str) -> Any:
    err = result[0] if isinstance(result, tuple) else result
    if int(err) != 0:
        nvrtc = _nvrtc()
        _, msg = nvrtc.nvrtcGetErrorString(err)
        raise RuntimeError(f"{call} failed: {msg.decode() if isinstance(msg, bytes) else msg}")
    if not isinstance(result, tuple) or len(result) == 1:
        return None
    return result[1] if len(result) == 2 else result[1:]


@functools.cache
def nvrtc_version() -> str:
    """The NVRTC library version as ``"major.minor"`` (e.g. ``"13.0"``); loads NVRTC once."""
    major, minor = _check(_nvrtc().nvrtcVersion(), "nvrtcVersion")
    return f"{major}.{minor}"


# Where the NVRTC wheels keep libnvrtc, below a site-packages directory (cuda.pathfinder's
# first search step, which cuda.bindings loads through): CUDA 13's, then CUDA 12's.
_WHEEL_DIRS = ("nvidia/cu13/lib", "nvidia/cuda_nvrtc/lib")
_BUILTINS = re.compile(r"libnvrtc-builtins\.so\.(\d+\.\d+)")


@functools.cache
def _wheel_version() -> str | None:
    """The NVRTC version of the wheel cuda.pathfinder finds first, without loading it: NVRTC
    loads its builtins library by ``major.minor`` (``libnvrtc-builtins.so.13.5``), and the
    wheel ships it beside libnvrtc. None where no wheel, or several versions, are found."""
    import site

    found: set[str] = set()
    user = [site.getusersitepackages()] if site.ENABLE_USER_SITE else []
    for base in [*site.getsitepackages(), *user]:
        for sub in _WHEEL_DIRS:
            try:
                names = os.listdir(os.path.join(base, sub))
            except OSError:
                continue
            if any(n.startswith("libnvrtc.so.") for n in names):
                found.update(m[1] for n in names if (m := _BUILTINS.fullmatch(n)))
    return found.pop() if len(found) == 1 else None


def nvrtc_identity() -> str:
    """The version of the NVRTC this process compiles with, as :func:`nvrtc_version` gives it,
    cheaply: the loaded library's once NVRTC is loaded, before that the NVRTC wheel's
    (:func:`_wheel_version`; Linux), else loaded to ask (a CUDA toolkit's libnvrtc)."""
    if nvrtc_version.cache_info().currsize:
        return nvrtc_version()
    return _wheel_version() or nvrtc_version()


@functools.cache
def supported_archs() -> tuple[int, ...]:
    """Compute capabilities this NVRTC can emit cubins for, ascending (e.g. ``(75, ..., 121)``)."""
    return tuple(sorted(_check(_nvrtc().nvrtcGetSupportedArchs(), "nvrtcGetSupportedArchs")))


def compile_target(arch: str, supported: Sequence[int] | None = None) -> tuple[str, str]:
    """The NVRTC ``-arch`` value and output kind for a key's arch.

    Returns ``("sm_90a", "cubin")`` when NVRTC supports the arch, and
    ``("compute_120", "ptx")`` (the newest supported arch) when the arch is newer than all
    it supports (a key's arch is only that where it came from such a GPU, see
    :func:`~nvrtc_engine.make_key`). An older unsupported arch raises
    :class:`~nvrtc_engine.VariantError`.
    """
    archs = tuple(supported) if supported is not None else supported_archs()
    number = arch_number(arch)
    if number in archs:
        return arch, "cubin"
    newest = max(archs)
    if number > newest:
        return f"compute_{newest}", "ptx"
    raise VariantError(
        "arch",
        arch,
        [f"sm_{a}" for a in archs if a >= KNOWN_ARCH_NUMBERS[0]],
        f"NVRTC {nvrtc_version()} cannot compile for {arch}",
    )


class CompileOptions(NamedTuple):
    """NVRTC options, one field per flag. :meth:`flags` is the list hashed into cache keys.

    Attributes: ``arch`` (``-arch``: ``sm_90``, ``sm_90a``, or ``compute_XX`` for PTX),
    ``std`` (``-std``), ``minimal`` (``-minimal``: skip declarations kernels here never use,
    a few ms less per compile), ``default_device`` (``-default-device``: unannotated functions
    are device code; NVRTC 13.0 takes a generic lambda's call operator in a kernel for host
    code without it), ``defines`` (``-D``), ``extra`` (any other flags, verbatim).
    The CUDA include directory is not a field: it is machine-specific, so the compiler adds
    ``-I`` for it and the cache digest records the header *version* instead.
    """

    arch: str
    std: str = "c++17"
    minimal: bool = True
    default_device: bool = True
    defines: tuple[tuple[str, str], ...] = ()
    extra: tuple[str, ...] = ()

    @property
    def output(self) -> str:
        """``"cubin"`` for an ``sm_`` target, ``"ptx"`` for ``compute_``."""
        return "ptx" if self.arch.startswith("compute_") else "cubin"

    def flags(self) -> tuple[str, ...]:
        out = [f"-arch={self.arch}", f"-std={self.std}"]
        if self.minimal:
            out.append("-minimal")
        if self.default_device:
            out.append("-default-device")
        out += [f"-D{name}={value}" for name, value in self.defines]
        out += list(self.extra)
        return tuple(out)


@functools.lru_cache(maxsize=64)
def compile_options(arch: str) -> CompileOptions:
    """The NVRTC options kernels are compiled with for ``-arch=arch`` (the one place)."""
    return CompileOptions(arch=arch)


def target_arch(flags: Sequence[str]) -> str:
    """The ``-arch`` in NVRTC ``flags`` (``sm_90a``, ``compute_120``), or ``"?"``."""
    return next((f[len("-arch=") :] for f in flags if f.startswith("-arch=")), "?")


class CompileResult(NamedTuple):
    """A compiled kernel image.

    Attributes: ``image`` (cubin or PTX bytes), ``kind`` (``"cubin"``/``"ptx"``), ``log``
    (NVRTC's log, usually empty), ``seconds`` (wall time of the compile) and
    ``header_version`` (CUDA header version used, or ``None``).
    """

    image: bytes
    kind: str
    log: str
    seconds: float
    header_version: str | None


class CudaIncludeDir(NamedTuple):
    """A directory of CUDA toolkit headers and their version (``CUDART_VERSION``, "13.0").

    ``origin`` says which search step found it.
    """

    path: Path
    version: str
    origin: str = ""


def _header_version(directory: Path) -> str | None:
    try:
        text = (directory / "cuda_runtime_api.h").read_text(errors="replace")
    except OSError:
        return None
    m = re.search(r"#define\s+CUDART_VERSION\s+(\d+)", text)
    if m is None:
        return None
    v = int(m.group(1))
    return f"{v // 1000}.{(v % 1000) // 10}"


def _candidate_dirs() -> list[tuple[str, Path]]:
    found: list[tuple[str, Path]] = []
    override = config.settings().cuda_include_dir
    if override is not None:
        return [("NVRTC_ENGINE_CUDA_INCLUDE_DIR", override)]
    try:
        from cuda import pathfinder

        located = pathfinder.find_nvidia_header_directory("cudart")
        if located:
            found.append(("cuda.pathfinder (cudart)", Path(located)))
    except Exception:  # pathfinder missing or failing: fall through to the environment
        pass
    for var in ("CUDA_HOME", "CUDA_PATH"):
        root = os.environ.get(var)
        if root:
            found.append((var, Path(root) / "include"))
    found.append(("default", Path("/usr/local/cuda/include")))
    return found


@functools.cache
def find_cuda_include_dir() -> CudaIncludeDir:
    """Find CUDA headers that provide ``cuda_fp8.h`` (see the module docstring for the order).

    Raises :class:`~nvrtc_engine.HeaderNotFoundError` naming the NVRTC version, any header
    version found without ``cuda_fp8.h``, and every directory searched.
    """
    searched: list[str] = []
    versions: list[str] = []
    for origin, directory in _candidate_dirs():
        searched.append(f"{directory} ({origin})")
        if (directory / "cuda_fp8.h").is_file():
            return CudaIncludeDir(directory, _header_version(directory) or "unknown", origin)
        v = _header_version(directory)
        if v:
            versions.append(f"{v} at {directory}")
    found = f"; headers found without cuda_fp8.h: {', '.join(versions)}" if versions else ""
    raise HeaderNotFoundError(
        f"CUDA headers (cuda_fp8.h) not found for NVRTC {nvrtc_version()}{found}. Searched: "
        + "; ".join(searched)
        + ". Install nvidia-cuda-runtime or set NVRTC_ENGINE_CUDA_INCLUDE_DIR.",
        tuple(searched),
        nvrtc_version(),
    )


def _warn_debug_dir(directory: Path, exc: OSError) -> None:
    """Warn (``RuntimeWarning``) that rendered sources cannot be written, once per directory."""
    warn_once(
        "debug dir", str(directory),
        f"nvrtc_engine: cannot write rendered sources to {directory} ({type(exc).__name__}: "
        f"{exc}); kernels still compile, without their sources written. Set "
        "NVRTC_ENGINE_DEBUG_DIR to a writable directory.",
        RuntimeWarning,
    )  # fmt: skip


def write_debug_source(name: str, source: str) -> str | None:
    """Write a rendered source for inspection; returns its path, or None if unwritable.

    The first failure for a directory warns (``RuntimeWarning``, naming the directory and
    the reason); the compile goes on either way.
    """
    directory = config.settings().resolved_debug_dir()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / name
        path.write_text(source, encoding="utf-8")
        return str(path)
    except OSError as exc:
        _warn_debug_dir(directory, exc)
        return None


def warm_up() -> None:
    """Compile an empty kernel and drop it: NVRTC's first compile in a process loads its
    builtins and the CUDA driver (hundreds of ms of waiting, little CPU), which a caller about
    to compile many kernels overlaps with rendering them. Never raises."""
    try:
        nvrtc = _nvrtc()
        prog = _check(
            nvrtc.nvrtcCreateProgram(
                b'extern "C" __global__ void nve_warm_up() {}', b"warm_up.cu", 0, [], []
            ),
            "nvrtcCreateProgram",
        )
        try:
            nvrtc.nvrtcCompileProgram(prog, 1, [b"-arch=compute_75"])
        finally:
            nvrtc.nvrtcDestroyProgram(prog)
    except Exception:  # the real compiles report what is wrong
        pass


def compile_source(
    name: str,
    source: str,
    headers: Sequence[tuple[str, str]],
    options: CompileOptions,
    *,
    cuda_headers: bool = False,
    key: str | None = None,
) -> CompileResult:
    """Compile one translation unit with NVRTC.

    Args:
        name: file name for diagnostics (``gelu_..._sm90.cu``).
        source: CUDA C++ source.
        headers: in-memory headers as ``(include name, text)`` pairs.
        options: the NVRTC options; ``options.output`` picks cubin or PTX.
        cuda_headers: the source includes CUDA toolkit headers; adds ``-I`` for them.
        key: the variant name, carried by a :class:`CompileError`.

    Raises :class:`~nvrtc_engine.CompileError` with the whole log and the path of the source
    written for debugging; :class:`~nvrtc_engine.HeaderNotFoundError` when CUDA headers are
    needed and missing.
    """
    nvrtc = _nvrtc()
    flags = list(options.flags())
    header_version = None
    if cuda_headers:
        include = find_cuda_include_dir()
        flags.append(f"-I{include.path}")
        header_version = include.version
    if config.settings().dump_source:
        write_debug_source(name, source)
    start = time.perf_counter()
    prog = _check(
        nvrtc.nvrtcCreateProgram(
            source.encode(),
            name.encode(),
            len(headers),
            [text.encode() for _, text in headers],
            [include_name.encode() for include_name, _ in headers],
        ),
        "nvrtcCreateProgram",
    )
    try:
        encoded = [f.encode() for f in flags]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(encoded), encoded)
        log_size = _check(nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
        # bytearrays, not b" " * n: for n == 1 (an empty log) that is CPython's shared
        # one-byte object b" ", and NVRTC's terminating NUL would overwrite it process-wide
        log_buf = bytearray(log_size)
        _check(nvrtc.nvrtcGetProgramLog(prog, log_buf), "nvrtcGetProgramLog")
        log = bytes(log_buf).rstrip(b"\x00 ").decode(errors="replace")
        if int(err) != 0:
            raise CompileError(
                key=key,
                log=log or str(err),
                options=tuple(flags),
                nvrtc_version=nvrtc_version(),
                header_version=header_version,
                source_path=write_debug_source(name, source),
            )
        if options.output == "cubin":
            size = _check(nvrtc.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize")
            buffer = bytearray(size)
            _check(nvrtc.nvrtcGetCUBIN(prog, buffer), "nvrtcGetCUBIN")
        else:
            size = _check(nvrtc.nvrtcGetPTXSize(prog), "nvrtcGetPTXSize")
            buffer = bytearray(size)
            _check(nvrtc.nvrtcGetPTX(prog, buffer), "nvrtcGetPTX")
        image = bytes(buffer)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    return CompileResult(
        image=image,
        kind=options.output,
        log=log,
        seconds=time.perf_counter() - start,
        header_version=header_version,
    )
