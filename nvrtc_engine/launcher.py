"""The compiled launcher: ``cuLaunchKernel`` called from C instead of through cuda.bindings.

cuda.bindings converts each of ``cuLaunchKernel``'s eleven arguments into its own object on
every call, which costs more host time than the driver's own launch work
(``bench/launch_overhead.py``; docs/performance.md#launch-overhead). This module builds a
small CPython extension (``_launch.c``, next to this file) with the system's C compiler and
the Python headers, the way Triton builds its launchers, and imports it as
``nvrtc_engine._nve_launch``. Its ``launch(function, grid, block, shmem, stream, params,
context, flags)`` takes plain ints, makes ``context`` current when it is not, and calls the
driver through the function pointers that cuda.bindings' ``cuGetProcAddress`` gives (the
same driver, the same default-stream mode: ``CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM``);
``flags`` 1 launches through ``cuLaunchKernelEx`` as a programmatic dependent launch.

The extension is built once per machine and Python: into ``<cache dir>/launcher/<digest>/``
(the digest covers the C source, the Python version and the extension suffix), written to a
temporary name and renamed, so processes racing to build it each get a whole file. With the
disk cache disabled or its directory not writable, it is built into a temporary directory,
once per process. A file there that does not import (truncated, from another build) is
rebuilt.

``NVRTC_ENGINE_LAUNCHER`` (:mod:`nvrtc_engine.config`) chooses: ``auto`` (the default) uses
the compiled launcher when it builds, else cuda.bindings (no compiler or no Python headers:
silently; a compiler that fails, or a ``$CC`` that names no program: one
:class:`RuntimeWarning` with the reason), ``compiled`` raises
:class:`~nvrtc_engine.LauncherError` on every launch when it cannot be built (the build is
tried once per process), ``bindings`` never builds it. :func:`status` says which is in use
and why. Results are identical either way: the same function, grid, block, stream and
parameter bytes reach the driver (tests/test_launch_stub.py runs the launch path both ways
against a stub libcuda; tests/test_launcher.py tests the extension and its build).
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import config
from .errors import LauncherError, warn

__all__ = [
    "SOURCE", "build", "cached_path", "compile_shared", "compiler", "compiler_command",
    "extension", "get", "reset", "status",
]  # fmt: skip

SOURCE = Path(__file__).with_name("_launch.c")
MODULE = "nvrtc_engine._nve_launch"
BUILD_TIMEOUT = 120.0  # seconds for the C compiler

_lock = threading.Lock()
_resolved = False
_launch: Any = None  # the bound launch function, or None (cuda.bindings)
_module: Any = None  # the extension whose launch _launch is
_error: LauncherError | None = None  # NVRTC_ENGINE_LAUNCHER=compiled and the build failed
_why = "not yet resolved (resolved on the first launch)"


def compiler() -> list[str] | None:
    """The C compiler command: ``$CC`` when it is set (even when it names no program: the
    build then says so), else the first of the one Python was built with (``sysconfig``'s
    ``CC``), ``cc``, ``gcc`` and ``clang`` whose program is on the PATH; None when there is
    none."""
    explicit = shlex.split(os.environ.get("CC", ""))
    if explicit:
        return explicit
    for candidate in (sysconfig.get_config_var("CC") or "", "cc", "gcc", "clang"):
        words = shlex.split(candidate)
        if words and shutil.which(words[0]):
            return words
    return None


def _quiet_fallback() -> bool:
    """Whether a failed build falls back without a warning: no compiler anywhere (and no
    ``$CC`` asked for one) or no Python headers, the usual state of a machine without build
    tools."""
    return compiler() is None or not _python_includes()


def _python_includes() -> list[str]:
    """The directories holding ``Python.h`` and ``pyconfig.h``; empty when not installed."""
    paths = sysconfig.get_paths()
    found = dict.fromkeys(p for p in (paths.get("include"), paths.get("platinclude")) if p)
    if not any((Path(p) / "Python.h").is_file() for p in found):
        return []
    return list(found)


def _digest() -> str:
    h = hashlib.sha256(SOURCE.read_bytes())
    h.update(sys.version.encode())
    h.update(str(sysconfig.get_config_var("EXT_SUFFIX")).encode())
    return h.hexdigest()[:16]


def _library_name() -> str:
    return "_nve_launch" + (sysconfig.get_config_var("EXT_SUFFIX") or ".so")


def build(directory: Path) -> Path:
    """Compile the extension into ``directory`` (made if missing) unless a file is there;
    return its path. Raises :class:`LauncherError` when there is no compiler or no Python
    headers, or the compiler fails (with its output), ``OSError`` when ``directory`` cannot
    be written."""
    out = directory / _library_name()
    if out.is_file():
        return out
    compiler_command()  # no compiler: say so before asking for the headers
    includes = _python_includes()
    if not includes:
        raise LauncherError(
            f"no Python headers (Python.h) for {sys.executable}: install the python3-dev "
            "(Debian/Ubuntu) or python3-devel (Fedora/RHEL) package"
        )
    return compile_shared(SOURCE, out, [f"-I{p}" for p in includes])


def compiler_command() -> list[str]:
    """:func:`compiler`, or :class:`LauncherError` saying why there is none to run."""
    cc = compiler()
    if cc is None:
        raise LauncherError("no C compiler (set CC, or install cc/gcc/clang)")
    if shutil.which(cc[0]) is None:
        raise LauncherError(f"CC={shlex.join(cc)!r} names no program on the PATH")
    return cc


def compile_shared(source: Path, out: Path, flags: Sequence[str], libs: Sequence[str] = ()) -> Path:
    """Compile C ``source`` into the shared library ``out`` (``-O2 -shared -fPIC`` plus
    ``flags``, then ``libs``) with :func:`compiler_command`'s compiler: written to a
    temporary name in ``out``'s directory (made if missing) and renamed, so processes racing
    to build it each see a whole file. Raises :class:`LauncherError` with the compiler's
    output when it fails or writes nothing."""
    cc = compiler_command()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    command = [*cc, "-O2", "-shared", "-fPIC", *flags, str(source), "-o", str(tmp), *libs]
    try:
        done = subprocess.run(command, capture_output=True, timeout=BUILD_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as exc:
        tmp.unlink(missing_ok=True)
        raise LauncherError(f"{shlex.join(command)}: {exc}") from None
    if done.returncode != 0:
        tmp.unlink(missing_ok=True)
        output = (done.stderr or done.stdout).decode(errors="replace").strip()
        raise LauncherError(f"{shlex.join(command)} failed ({done.returncode}):\n{output}")
    if not tmp.is_file():
        raise LauncherError(f"{shlex.join(command)} exited 0 but wrote no {tmp.name}")
    os.replace(tmp, out)
    return out


def cached_path() -> Path | None:
    """The compiled launcher built for this Python in the configured cache directory
    (``<cache dir>/launcher/<digest>/``), or None: not built there yet, or no disk cache."""
    s = config.settings()
    if s.disable_disk_cache:
        return None
    try:
        path = s.resolved_cache_dir() / "launcher" / _digest() / _library_name()
    except OSError:
        return None
    return path if path.is_file() else None


def _load(path: Path) -> Any:
    """Import the extension at ``path`` (as :data:`MODULE`)."""
    loader = importlib.machinery.ExtensionFileLoader(MODULE, str(path))
    spec = importlib.util.spec_from_file_location(MODULE, path, loader=loader)
    if spec is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def _built_module() -> Any:
    """Build (or find) and import the extension: in the cache directory if it can be
    written, else in a temporary directory (removed once imported)."""
    s = config.settings()
    if not s.disable_disk_cache:
        try:
            directory = s.resolved_cache_dir() / "launcher" / _digest()
            try:
                return _load(build(directory))
            except ImportError:  # a broken file from an earlier build: build it again
                (directory / _library_name()).unlink(missing_ok=True)
                return _load(build(directory))
        except OSError:
            pass  # not writable (or no home directory): a private temporary directory
    scratch = Path(tempfile.mkdtemp(prefix="nvrtc_engine_launcher_"))
    try:
        module = _load(build(scratch))
        module._nve_where = "built in a temporary directory, removed once imported"
        return module
    finally:  # an imported extension stays mapped once its file is gone
        shutil.rmtree(scratch, ignore_errors=True)


def _bind(module: Any) -> None:
    """Hand the extension the driver functions cuda.bindings uses."""
    from . import driver

    drv = driver._drv()
    flags = drv.CUdriverProcAddress_flags
    ptds = os.environ.get("CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM", "0").strip()
    flag = (flags.CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM if ptds not in ("", "0")
            else flags.CU_GET_PROC_ADDRESS_LEGACY_STREAM)  # fmt: skip
    addresses = []
    for symbol in ("cuLaunchKernel", "cuCtxGetCurrent", "cuCtxSetCurrent", "cuLaunchKernelEx"):
        optional = symbol == "cuLaunchKernelEx"  # without it dependent launches are ordinary
        try:
            err, pfn, _ = drv.cuGetProcAddress(symbol.encode(), 12000, flag)
        except Exception as exc:  # a driver too old for it, or none
            if optional:
                break
            raise LauncherError(f"cuGetProcAddress({symbol}): {exc}") from None
        if int(err) != 0 or not int(pfn):
            if optional:
                break
            raise LauncherError(f"cuGetProcAddress({symbol}) found no driver function ({err})")
        addresses.append(int(pfn))
    module.bind(*addresses)


def get() -> Any:
    """The compiled ``launch`` function, bound to the driver, or None to launch through
    cuda.bindings; built, imported and bound on the first call of a process (the driver must
    be initialized by then), then remembered.

    Raises :class:`LauncherError` when ``NVRTC_ENGINE_LAUNCHER=compiled`` and it cannot be
    built; under ``auto`` that is one ``RuntimeWarning`` (none when there is no compiler or
    no Python headers) and None.
    """
    if _resolved and _error is None:
        return _launch
    return _resolve()


def _resolve() -> Any:
    global _resolved, _launch, _module, _why, _error
    warning = None
    with _lock:
        if _resolved:
            if _error is not None:
                raise LauncherError(str(_error))
            return _launch
        mode = config.settings().launcher
        launch = module = error = None
        if mode == "bindings":
            why = "cuda.bindings (NVRTC_ENGINE_LAUNCHER=bindings)"
        else:
            try:
                module = _built_module()
                _bind(module)
                launch = module.launch
                where = getattr(module, "_nve_where", None) or module.__file__ or MODULE
                why = f"compiled ({where})"
            except (LauncherError, ImportError, OSError) as exc:
                module = None
                why = f"cuda.bindings (the compiled launcher cannot be built: {exc})"
                if mode == "compiled":
                    error = LauncherError(f"the compiled launcher cannot be built: {exc}")
                    why = f"none (NVRTC_ENGINE_LAUNCHER=compiled, and {error})"
                elif not _quiet_fallback():
                    warning = (
                        f"nvrtc_engine launches through cuda.bindings, with more host "
                        f"time per launch: the compiled launcher cannot be built: {exc}"
                    )
        # remembered before anything is raised or warned: one build attempt per process
        _launch, _module, _why, _error, _resolved = launch, module, why, error, True
    if error is not None:
        raise error
    if warning is not None:
        warn(warning, RuntimeWarning)
    return launch


def extension() -> Any:
    """The imported extension whose ``launch`` :func:`get` returned (its ``fast`` is
    ``Kernel._fast`` in C: :mod:`nvrtc_engine.plans`), or None: launches go through
    cuda.bindings, or :func:`get` has not resolved the choice yet."""
    return _module if _resolved else None


def status() -> str:
    """Which launch path this process uses and why: ``"compiled (<path of the extension>)"``,
    ``"cuda.bindings (NVRTC_ENGINE_LAUNCHER=bindings)"``, ``"cuda.bindings (the compiled
    launcher cannot be built: <reason>)"``, ``"none (NVRTC_ENGINE_LAUNCHER=compiled, and
    ...)"``; ``"not yet resolved (...)"`` before the first launch, and after :func:`reset`."""
    return _why


def reset() -> None:
    """Forget the choice, so the next launch resolves it again;
    :func:`nvrtc_engine.configure` calls it when it changes ``launcher``. Launch plans made
    before keep the launch path they were made with (a kernel's ``_launch_plans.clear()``
    drops them)."""
    global _resolved, _launch, _module, _why, _error
    with _lock:
        _resolved, _launch, _module, _error = False, None, None, None
        _why = "not yet resolved (resolved on the first launch)"
