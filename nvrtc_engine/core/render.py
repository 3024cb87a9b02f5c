"""Rendering: a :class:`~nvrtc_engine.KernelKey` to CUDA source, with Jinja2.

Templates live in ``templates/`` (``<family>.cu.j2``) and the project's device helpers in
``templates/include/*.cuh``; the helpers go to NVRTC as in-memory headers. A family outside
the package may keep its templates in its own folder (``OpSpec.templates``). In an installed
wheel the templates sit inside the package (``nvrtc_engine/templates``); in a source checkout
they are found beside the package.

Every template file is read once per process (:func:`template_files`) and rendering only ever
sees those bytes: the code fingerprint the cache's digest holds (:func:`code_fingerprint`)
hashes the same snapshot, so a digest always belongs to the templates a kernel is rendered
from. A template edited while a process runs is seen by the next process.

Jinja2 compiles each template to Python code once per process, the largest part of a cold
prewarm's rendering. Installing the package (the build hook) stores the compiled templates in
``nvrtc_engine/_templates_bytecode`` (:func:`precompile`), as pip stores ``.pyc`` files, and
rendering loads them through Jinja2's bytecode cache. Jinja2 checks each entry's Python version
and the SHA-1 of the template's source before using it, so an edited template, another Python
or a missing folder only means compiling in memory; rendering never writes there.
"""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from collections.abc import Callable

    import jinja2

    from .key import KernelKey

__all__ = [
    "RenderedSource",
    "code_fingerprint",
    "environment",
    "folder_files",
    "helper_headers",
    "precompile",
    "render",
    "template_files",
    "templates_digest",
    "templates_dir",
]


class RenderedSource(NamedTuple):
    """One rendered kernel: its CUDA source and what NVRTC needs beside it.

    Attributes: ``name`` (a file name for NVRTC diagnostics), ``source`` (CUDA C++),
    ``symbols`` (the ``extern "C"`` kernels it defines), ``headers`` (in-memory headers as
    sorted ``(include name, text)`` pairs) and ``cuda_headers`` (whether it includes CUDA
    toolkit headers such as ``cuda_fp8.h``, which then must be found on disk).
    """

    name: str
    source: str
    symbols: tuple[str, ...]
    headers: tuple[tuple[str, str], ...]
    cuda_headers: bool


@functools.cache
def templates_dir() -> Path:
    """The directory holding ``*.cu.j2`` templates (inside the wheel, or the source tree)."""
    here = Path(__file__).resolve().parent.parent  # nvrtc_engine/
    for candidate in (here / "templates", here.parent / "templates"):
        if (candidate / "include").is_dir():
            return candidate
    raise FileNotFoundError(
        f"nvrtc_engine templates not found in {here / 'templates'} or {here.parent / 'templates'};"
        " the installation is incomplete"
    )


@functools.cache
def folder_files(root: str) -> dict[str, bytes]:
    """Every file under ``root`` (relative POSIX names such as ``"include/nve_act.cuh"``,
    sorted) with its bytes, read once per process; ``__pycache__`` left out."""
    names = []
    for folder, subfolders, files in os.walk(root):  # (os.walk: a third of rglob's cost)
        subfolders[:] = [d for d in subfolders if d != "__pycache__"]
        relative = os.path.relpath(folder, root).replace(os.sep, "/")
        names += [name if relative == "." else f"{relative}/{name}" for name in files]
    out = {}
    for name in sorted(names):
        with open(os.path.join(root, name), "rb") as f:
            out[name] = f.read()
    return out


def template_files() -> dict[str, bytes]:
    """Every file under :func:`templates_dir` (``"gelu.cu.j2"``, ``"include/nve_act.cuh"``)
    with its bytes, read once per process (:func:`folder_files`)."""
    return folder_files(str(templates_dir()))


@functools.cache
def templates_digest(folder: str | None = None) -> str:
    """SHA-256 (hex) over the names and bytes of :func:`template_files`, or of the files
    under ``folder`` (a family outside the package: ``OpSpec.templates``)."""
    h = hashlib.sha256()
    for name, data in (template_files() if folder is None else folder_files(folder)).items():
        h.update(f"{name}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


# The core's Python that decides what the templates render (with every file of families/).
_CODE = ("dtypes.py", "key.py", "nvrtc.py", "render.py", "signature.py", "spec.py")


@functools.cache
def code_fingerprint() -> str:
    """SHA-256 (hex) of the contents of what shapes generated code, read once per process:
    :func:`templates_digest`, :data:`_CODE`, ``families/`` but the float64 references and
    jinja2's ``__init__.py`` (it names its version)."""
    from importlib.machinery import PathFinder

    core = os.path.dirname(os.path.abspath(__file__))
    h = hashlib.sha256(templates_digest().encode())
    for name in _CODE:
        with open(os.path.join(core, name), "rb") as f:
            h.update(f"\0{name}\0".encode() + f.read())
    for name, data in folder_files(os.path.join(os.path.dirname(core), "families")).items():
        if not name.endswith("reference.py"):  # (the float64 references render nothing)
            h.update(f"\0families/{name}\0".encode() + data)
    jinja2 = PathFinder.find_spec("jinja2")
    with open(jinja2.origin if jinja2 and jinja2.origin else os.devnull, "rb") as f:
        h.update(b"\0jinja2\0" + f.read())
    return h.hexdigest()


@functools.cache
def helper_headers() -> tuple[tuple[str, str], ...]:
    """The project's device helpers, ``(include name, text)``, from :func:`template_files`."""
    return tuple(
        (name[len("include/") :], data.decode("utf-8"))
        for name, data in template_files().items()
        if name.startswith("include/") and name.endswith(".cuh") and name.count("/") == 1
    )


BYTECODE_DIR = Path(__file__).resolve().parent.parent / "_templates_bytecode"
_OPTIONS: dict[str, Any] = {
    "trim_blocks": True,
    "lstrip_blocks": True,
    "keep_trailing_newline": True,
    "autoescape": False,
}


def _bytecode_cache(directory: Path, *, write: bool) -> jinja2.BytecodeCache:
    """Jinja2's file bytecode cache in ``directory``, entries named by template name only (the
    checksum of the source guards them, wherever the templates sit) and by what else shapes
    the compiled code: the options and Jinja2's version."""
    import jinja2

    shape = hashlib.sha256(f"{sorted(_OPTIONS.items())}{jinja2.__version__}".encode())

    class Bytecode(jinja2.FileSystemBytecodeCache):
        def get_cache_key(self, name: str, filename: str | None = None) -> str:
            return hashlib.sha1(name.encode("utf-8")).hexdigest()

        def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
            if write:
                super().dump_bytecode(bucket)

    return Bytecode(str(directory), f"%s-{shape.hexdigest()[:12]}.cache")


def precompile(directory: Path = BYTECODE_DIR) -> int:
    """Compile every template of the package (:func:`template_files`) into Jinja2 bytecode in
    ``directory`` (created), for :func:`environment` to load; the build hook calls it when the
    package is installed. Returns the number of templates compiled. Raises ``OSError`` where
    ``directory`` cannot be written and ``jinja2.TemplateError`` for a broken template."""
    directory.mkdir(parents=True, exist_ok=True)
    env = _environment(None, _bytecode_cache(directory, write=True))
    names = [name for name in template_files() if name.endswith(".j2")]
    for name in names:
        env.get_template(name)
    return len(names)


def _loader(folder: str | None) -> Callable[[str], tuple[str, str, Any] | None]:
    roots = [str(templates_dir())] if folder is None else [folder, str(templates_dir())]

    def load(name: str) -> tuple[str, str, Any] | None:
        for root in roots:
            data = folder_files(root).get(name)
            if data is not None:
                return data.decode("utf-8"), os.path.join(root, name), lambda: True
        return None

    return load


@functools.cache
def environment(folder: str | None = None) -> jinja2.Environment:
    """The Jinja2 environment: strict about undefined names, no autoescaping; templates come
    from :func:`template_files`, or first from ``folder`` (a family's own templates, see
    :attr:`~nvrtc_engine.core.spec.OpSpec.templates`), never re-read while the process runs;
    compiled templates from :data:`BYTECODE_DIR` where :func:`precompile` left them."""
    return _environment(folder, _bytecode_cache(BYTECODE_DIR, write=False))


def _environment(folder: str | None, bytecode: jinja2.BytecodeCache) -> jinja2.Environment:
    import jinja2

    return jinja2.Environment(
        loader=jinja2.FunctionLoader(_loader(folder)),
        undefined=jinja2.StrictUndefined,
        bytecode_cache=bytecode,
        **_OPTIONS,
    )


def render(key: KernelKey) -> RenderedSource:
    """Render the CUDA source for ``key`` from its family's template.

    The template receives only values the op spec derives from the validated key.
    """
    spec = key.spec
    context: dict[str, Any] = spec.render_context(key)
    template = environment(spec.templates).get_template(f"{spec.family}.cu.j2")
    source = template.render(**context)
    return RenderedSource(
        name=f"{key}.cu",
        source=source,
        symbols=spec.symbols(key),
        headers=helper_headers(),
        cuda_headers=spec.cuda_headers(key),
    )
