"""The public surface, lazy imports, and the wheel: templates inside, no compiled kernels."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import stub_driver

import nvrtc_engine as ne

ROOT = Path(__file__).resolve().parent.parent


def test_public_surface_is_sorted_and_exported():
    assert list(ne.__all__) == sorted(ne.__all__)
    for name in ne.__all__:
        assert hasattr(ne, name), name


def test_version_matches_pyproject():
    import re

    text = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'^version = "([^"]+)"', text, re.M).group(1) == ne.__version__


def test_import_starts_nothing_heavy():
    code = (
        "import sys, nvrtc_engine; "
        "print(sorted(m for m in ('cuda.bindings.nvrtc', 'cuda.bindings.driver', 'jinja2', "
        "'diskcache', 'numpy', 'torch') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def build_wheel(out: Path, **env: str) -> Path:
    """The wheel `pip wheel` builds from this checkout into ``out`` (``env``: more
    environment variables)."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(out),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
        timeout=600,
        env={**os.environ, **env},
    )
    (path,) = out.glob("nvrtc_engine-*.whl")
    return path


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    return build_wheel(tmp_path_factory.mktemp("wheel"))


def test_a_build_without_a_c_compiler_is_a_pure_wheel(tmp_path):
    path = build_wheel(tmp_path, CC="false")  # (a compiler that always fails)
    assert path.name.endswith("-py3-none-any.whl"), path.name
    assert not [n for n in zipfile.ZipFile(path).namelist() if n.endswith(".so")]


def test_wheel_carries_templates_and_no_kernels(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert "nvrtc_engine/templates/activation.cu.j2" in names
    assert "nvrtc_engine/templates/include/nve_types.cuh" in names
    assert "nvrtc_engine/py.typed" in names
    assert not [n for n in names if n.endswith((".cubin", ".ptx", ".fatbin", ".o", ".c"))]
    assert not [n for n in names if n.startswith(("tests/", "bench/"))]
    assert "nvrtc_engine/_build_hook.py" not in names
    # the templates compiled by Jinja2 (render.precompile), one entry per template
    templates = [n for n in names if n.startswith("nvrtc_engine/templates/") and n.endswith(".j2")]
    compiled = [n for n in names if n.startswith("nvrtc_engine/_templates_bytecode/")]
    assert len(compiled) == len(templates) > 0, compiled
    # the one compiled piece: the launcher, built with the limited API (one wheel for every
    # CPython from 3.10 on); a pure wheel where the build had no C compiler
    libraries = [n for n in names if n.endswith(".so")]
    if stub_driver.compiler() is None:
        assert not libraries and wheel.name.endswith("-py3-none-any.whl"), wheel.name
    else:
        assert libraries == ["nvrtc_engine/core/_native_launch.abi3.so"], libraries
        assert "-cp310-abi3-linux_" in wheel.name, wheel.name


def test_installed_wheel_works_from_any_directory(wheel, tmp_path):
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "-q",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
        capture_output=True,
        timeout=600,
    )
    code = (
        "import jinja2; compiled = []; compile_ = jinja2.Environment.compile; "
        "jinja2.Environment.compile = lambda *a, **k: compiled.append(1) or compile_(*a, **k); "
        "import nvrtc_engine, pathlib; "
        "from nvrtc_engine.core.render import templates_dir; "
        "from nvrtc_engine.core import native_launch; "
        "k = nvrtc_engine.get_kernel('gelu', dtype='fp8', arch='sm_90'); "
        "print(templates_dir(), len(k.artifact.image), native_launch.loaded(), len(compiled))"
    )
    env = {
        **os.environ,
        "PYTHONPATH": str(target),
        "NVRTC_ENGINE_CACHE_DIR": str(tmp_path / "cache"),
    }
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    tdir, size, native, compiled = out.stdout.split()
    assert Path(tdir).is_relative_to(target) and int(size) > 1000
    assert compiled == "0"  # the wheel's precompiled templates were used
    assert native == str(stub_driver.compiler() is not None)  # the wheel's launcher loads


def test_every_error_is_exported_from_the_package_and_errors():
    """Every exception class the package raises on purpose (VariantListError and
    BundleError included) is in nvrtc_engine's and nvrtc_engine.core.errors' __all__ and is the
    one the raising module defines; BundleError is exported lazily (see the next test)."""
    from nvrtc_engine.core import errors
    from nvrtc_engine.tools import bundle, variants

    for name in ("VariantListError", "BundleError"):
        assert name in ne.__all__ and name in errors.__all__
    assert ne.VariantListError is errors.VariantListError is variants.VariantListError
    assert ne.BundleError is errors.BundleError is bundle.BundleError
    assert set(errors.__all__) - {"CacheWarning"} <= set(ne.__all__)
    for name in errors.__all__:
        cls = getattr(errors, name)
        assert issubclass(cls, errors.NvrtcEngineError) or name == "CacheWarning", name
    with pytest.raises(AttributeError, match="has no attribute 'NoSuchError'"):
        errors.NoSuchError  # noqa: B018
    with pytest.raises(AttributeError, match="has no attribute 'NoSuchError'"):
        ne.NoSuchError  # noqa: B018


def test_the_error_exports_import_nothing_more():
    """Every error class lives in nvrtc_engine.core.errors: naming VariantListError or
    BundleError imports neither the variant lists nor the bundles (and their zipfile)."""
    code = (
        "import sys, nvrtc_engine as ne; v = ne.VariantListError, ne.BundleError; "
        "print(sorted(m for m in ('nvrtc_engine.tools.bundle', 'nvrtc_engine.tools.variants', "
        "'zipfile') if m in sys.modules), ne.BundleError.__module__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[0] == "[] nvrtc_engine.core.errors"
