"""Hatchling build hook, run when a wheel is built or the project is installed editable: compiles
nvrtc_engine/core/_native_launch.c (the compiled launcher, see nvrtc_engine/core/native_launch.py)
and the Jinja2 templates (``nvrtc_engine/_templates_bytecode``, see nvrtc_engine/core/render.py).

Only the build runs a C compiler, never the package: ``$CC``, else the compiler Python was
built with, else ``cc``. The extension uses Python's limited API (3.10 on), so a wheel built
with one Python is tagged ``cp310-abi3-<platform>`` and loads on every later CPython; it needs
neither CUDA headers nor libcuda to build. Without a compiler or Python's headers the build
still succeeds, as a pure-Python wheel, with a warning: the package then launches through its
pure-Python path. ``NVRTC_ENGINE_BUILD_NATIVE=0`` builds the pure wheel on purpose.

An editable install writes the extension beside its source (``nvrtc_engine/``, git-ignored),
where the editable import path finds it; a wheel carries it at the same place. Not shipped.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import warnings
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

SOURCE = Path(__file__).resolve().parent / "core" / "_native_launch.c"
NAME = "_native_launch.abi3.so"
LIMITED_API = "cp310"  # the source's Py_LIMITED_API (0x030A0000)
_OFF = ("0", "false", "no", "off")


def source_digest() -> str:
    """The digest the extension is built with (native_launch.py compares it with its source)."""
    return hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]


def compile_extension(out: Path) -> str | None:
    """Compile the extension into ``out``; None when done, else why not (the compiler's
    output or the missing piece)."""
    cc = shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc")
    include = sysconfig.get_paths()["include"]
    if not Path(include, "Python.h").is_file():
        return f"no Python.h in {include} (install Python's development headers)"
    command = [*cc, "-O2", "-shared", "-fPIC", "-fvisibility=hidden", f"-I{include}",
               f'-DSOURCE_DIGEST="{source_digest()}"', str(SOURCE), "-o", str(out)]  # fmt: skip
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    except OSError as exc:
        return f"{shlex.join(command)}: {exc}"
    if done.returncode:
        return f"{shlex.join(command)} failed:\n{(done.stderr or done.stdout).strip()}"
    return None


class NativeLaunchHook(BuildHookInterface):
    """Adds the compiled launcher to the wheel (or beside its source, editable)."""

    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel":
            return
        self._tmp = tempfile.TemporaryDirectory()
        self._templates(version, build_data)
        if os.environ.get("NVRTC_ENGINE_BUILD_NATIVE", "1").strip().lower() in _OFF:
            return
        if version == "editable":  # built beside the source under another name, then renamed
            out = SOURCE.with_name(f".{NAME}.{os.getpid()}.tmp")
        else:
            out = Path(self._tmp.name, NAME)
        why = compile_extension(out)
        if why is not None:
            out.unlink(missing_ok=True)
            # (one left beside the source by an earlier build of another version of it is not
            # loaded: native_launch.py compares their digests)
            message = (f"nvrtc_engine: the compiled launcher was not built ({why}); the "
                       "package launches through its pure-Python path")  # fmt: skip
            warnings.warn(message, stacklevel=1)
            return
        if version == "editable":
            os.replace(out, SOURCE.with_name(NAME))
        else:
            build_data["force_include"][str(out)] = f"nvrtc_engine/core/{NAME}"
            build_data["pure_python"] = False
            platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
            build_data["tag"] = f"{LIMITED_API}-abi3-{platform}"

    def _templates(self, version: str, build_data: dict[str, Any]) -> None:
        """The compiled templates: beside the source (editable) or into the wheel. Without them
        the package compiles its templates in memory, once per process."""
        sys.path.insert(0, str(SOURCE.parent.parent.parent))
        try:
            from nvrtc_engine.core import render

            if version == "editable":
                shutil.rmtree(render.BYTECODE_DIR, ignore_errors=True)
                render.precompile()
            else:
                out = Path(self._tmp.name, "templates_bytecode")
                render.precompile(out)
                build_data["force_include"][str(out)] = "nvrtc_engine/_templates_bytecode"
        except Exception as exc:  # (a build never fails for want of the speed-up)
            warnings.warn(f"nvrtc_engine: templates not precompiled ({exc})", stacklevel=1)
        finally:
            sys.path.pop(0)

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        tmp = getattr(self, "_tmp", None)
        if tmp is not None:
            tmp.cleanup()
