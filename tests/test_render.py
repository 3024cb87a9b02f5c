"""Rendering: strict templates, in-memory helpers, CUDA headers only where needed."""

from __future__ import annotations

import jinja2
import pytest

from nvrtc_engine import make_key
from nvrtc_engine.core.render import environment, helper_headers, render, templates_dir


def test_render_defines_the_symbol_and_uses_helpers():
    k = make_key("gelu", dtype="fp8", hidden_size=4096, arch="sm_90")
    r = render(k)
    assert r.symbols == (str(k),)
    assert f"{k}(" in r.source and 'extern "C"' in r.source
    assert '#include "nve_types.cuh"' in r.source
    assert not r.cuda_headers and "cuda_fp8.h" not in r.source
    names = [name for name, _ in r.headers]
    assert "nve_types.cuh" in names and "nve_act.cuh" in names
    assert r.headers == helper_headers()


def test_fp8_on_ampere_uses_cuda_headers():
    r = render(make_key("gelu", dtype="fp8", arch="sm_80"))
    assert r.cuda_headers and "#include <cuda_fp8.h>" in r.source
    r = render(make_key("gelu", dtype="bf16", arch="sm_80"))
    assert not r.cuda_headers


def test_rendering_is_deterministic_and_key_dependent():
    a = render(make_key("gelu", dtype="fp8", arch="sm_90")).source
    b = render(make_key("gelu", dtype="fp8", arch="sm_90")).source
    c = render(make_key("gelu", dtype="e5m2", arch="sm_90")).source
    assert a == b and a != c


def test_environment_is_strict():
    env = environment()
    assert env.undefined is jinja2.StrictUndefined
    with pytest.raises(jinja2.UndefinedError):
        env.from_string("{{ missing }}").render()


def test_templates_found_with_include_dir():
    d = templates_dir()
    assert (d / "activation.cu.j2").is_file()
    assert (d / "include").is_dir()
