"""Rendering: a :class:`~nvrtc_engine.KernelKey` to CUDA source, with Jinja2.

Templates live in ``templates/`` (``<family>.cu.j2``) and the project's device helpers in
``templates/include/*.cuh``; the helpers go to NVRTC as in-memory headers, so their bytes are
part of every cache digest. In an installed wheel the templates sit inside the package
(``nvrtc_engine/templates``); in a source checkout they are found beside the package.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import jinja2

    from .key import KernelKey

__all__ = ["RenderedSource", "environment", "helper_headers", "render", "templates_dir"]


@dataclass(frozen=True)
class RenderedSource:
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
    here = Path(__file__).resolve().parent
    for candidate in (here / "templates", here.parent / "templates"):
        if (candidate / "include").is_dir():
            return candidate
    raise FileNotFoundError(
        f"nvrtc_engine templates not found in {here / 'templates'} or {here.parent / 'templates'};"
        " the installation is incomplete"
    )


@functools.cache
def helper_headers() -> tuple[tuple[str, str], ...]:
    """The project's device helpers, ``(include name, text)``, read once per process."""
    include = templates_dir() / "include"
    return tuple((p.name, p.read_text(encoding="utf-8")) for p in sorted(include.glob("*.cuh")))


@functools.cache
def environment() -> jinja2.Environment:
    """The Jinja2 environment: strict about undefined names, no autoescaping."""
    import jinja2

    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )


def render(key: KernelKey) -> RenderedSource:
    """Render the CUDA source for ``key`` from its family's template.

    The template receives only values the op spec derives from the validated key.
    """
    spec = key.spec
    context: dict[str, Any] = spec.render_context(key)
    template = environment().get_template(f"{spec.family}.cu.j2")
    source = template.render(**context)
    return RenderedSource(
        name=f"{key}.cu",
        source=source,
        symbols=spec.symbols(key),
        headers=helper_headers(),
        cuda_headers=bool(context["cuda_headers"]),
    )
