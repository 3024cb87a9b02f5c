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


def _compiles(monkeypatch) -> list[str]:
    """Names Jinja2 compiles from source in this test (a bytecode hit compiles nothing)."""
    seen: list[str] = []
    compile_ = jinja2.Environment.compile

    def counting(self, source, name=None, filename=None, raw=False, defer_init=False):
        seen.append(name)
        return compile_(self, source, name, filename, raw, defer_init)

    monkeypatch.setattr(jinja2.Environment, "compile", counting)
    return seen


def test_precompiled_templates_render_the_same_source_without_compiling(tmp_path, monkeypatch):
    from nvrtc_engine.core import render as r

    assert r.precompile(tmp_path) == len([n for n in r.template_files() if n.endswith(".j2")])
    keys = [
        make_key("gelu", dtype="fp8", arch="sm_90"),
        make_key("rmsnorm_fwd", dtype="bf16", hidden_size=4096, arch="sm_90"),
        make_key("cast_transpose", dtype="fp8", hidden_size=4096, arch="sm_90"),
    ]
    expected = [render(k).source for k in keys]
    seen = _compiles(monkeypatch)
    monkeypatch.setattr(r, "BYTECODE_DIR", tmp_path)
    r.environment.cache_clear()
    try:
        assert [render(k).source for k in keys] == expected
        assert seen == []
    finally:
        r.environment.cache_clear()


def test_stale_or_broken_bytecode_is_compiled_in_memory_and_never_written(tmp_path, monkeypatch):
    from nvrtc_engine.core import render as r

    old, new, store = tmp_path / "old", tmp_path / "new", tmp_path / "bytecode"
    store.mkdir()
    for folder, text in ((old, "old {{ x }}"), (new, "new {{ x }}")):
        folder.mkdir()
        (folder / "t.cu.j2").write_text(text)
    writer = r._environment(str(old), r._bytecode_cache(store, write=True))
    assert writer.get_template("t.cu.j2").render(x=1) == "old 1"
    entries = {p: p.read_bytes() for p in store.iterdir()}
    assert len(entries) == 1
    seen = _compiles(monkeypatch)
    reader = r._environment(str(new), r._bytecode_cache(store, write=False))
    assert reader.get_template("t.cu.j2").render(x=1) == "new 1"  # the source's SHA-1 differs
    assert seen == ["t.cu.j2"]
    assert {p: p.read_bytes() for p in store.iterdir()} == entries
    for path in entries:
        path.write_bytes(b"not bytecode")
    reader = r._environment(str(old), r._bytecode_cache(store, write=False))
    assert reader.get_template("t.cu.j2").render(x=2) == "old 2"
