"""The key index: a warm process finds its kernels without rendering or loading NVRTC, and
never a stale or foreign entry (edited templates, another NVRTC, wrong or damaged records)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import nvrtc_engine as ne
from nvrtc_engine import _loaded, config, index, make_key, render
from nvrtc_engine.engine import Engine, default_engine
from nvrtc_engine.index import environment_fingerprint

ROOT = Path(__file__).resolve().parent.parent
KEY = make_key("gelu", dtype="fp8", arch="sm_90")
OTHER = make_key("gelu", dtype="bf16", arch="sm_90")


@pytest.fixture(autouse=True)
def settled_install():
    """Run each test as a process that imported the package after its files settled.

    The index stays off in a process whose package files (or site-packages) changed within
    ``index.RACY_S`` of its import (test_files_newer_than_the_import_disable_the_index checks
    that). A test session started right after ``pip install`` is such a process; these tests
    are about every other one, so they wait until the files are ``RACY_S`` old and move the
    recorded import time to now.
    """
    package = Path(index.__file__).resolve().parent
    paths = [*package.glob("*.py"), *(package / "ops").glob("*.py")]
    paths += [Path(p) for p in (*index._site_dirs(), index._jinja2_init()) if p]
    newest = max(p.stat().st_mtime for p in paths if p.exists())
    wait = newest + index.RACY_S + 0.05 - time.time()
    if wait > 0:
        time.sleep(wait)
    saved = _loaded.IMPORTED_AT
    _loaded.IMPORTED_AT = max(saved, time.time())
    index.reset()
    yield
    _loaded.IMPORTED_AT = saved
    index.reset()


def _index_file(cache_dir, key):
    return Path(cache_dir) / "index" / f"{key}.json"


def _records(cache_dir, key):
    return json.loads(_index_file(cache_dir, key).read_text())["records"]


def _rewrite_records(cache_dir, key, change):
    path = _index_file(cache_dir, key)
    data = json.loads(path.read_text())
    for record in data["records"]:
        change(record)
    path.write_text(json.dumps(data))


@pytest.fixture
def no_render(monkeypatch):
    """Make rendering (and so the digest's full path) fail loudly."""
    import nvrtc_engine.engine as engine_mod

    def refuse(*args, **kwargs):
        raise AssertionError("rendered although the key index had the key")

    monkeypatch.setattr(engine_mod, "render", refuse)


def test_fingerprint_is_stable_and_covers_the_schema(monkeypatch):
    import nvrtc_engine.cache as cache_mod

    fp = environment_fingerprint()
    assert fp is not None, "package files modified within 2 s of this test's import?"
    assert environment_fingerprint() == fp
    monkeypatch.setattr(cache_mod, "SCHEMA", cache_mod.SCHEMA + 1)
    assert environment_fingerprint() != fp


_WARM = textwrap.dedent("""
    import json, sys
    import nvrtc_engine as ne
    import nvrtc_engine.engine as engine_mod
    if sys.argv[1] == "forbid":
        def refuse(*a, **k):
            raise AssertionError("rendered or compiled in the warm process")
        engine_mod.render = refuse
        engine_mod.compile_source = refuse
    k = ne.get_kernel("gelu", dtype="fp8", arch="sm_90")
    loaded = [m for m in ("jinja2", "cuda.bindings.nvrtc", "cuda.pathfinder", "diskcache",
                          "sqlite3") if m in sys.modules]
    info = ne.cache_info()  # (opens the disk cache)
    print(json.dumps({"origin": k.origin, "compiles": info.compiles,
                      "disk_hits": info.disk_hits, "digest": k.artifact.digest,
                      "loaded": loaded}))
""")


def _run(mode, cache_dir):
    env = {**os.environ, "NVRTC_ENGINE_CACHE_DIR": str(cache_dir)}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", _WARM, mode], env=env, capture_output=True,
                          text=True, timeout=300, check=True)  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_warm_process_neither_renders_nor_loads_nvrtc(isolated_cache):
    cold = _run("allow", isolated_cache)
    assert cold["origin"] == "compiled" and "jinja2" in cold["loaded"]
    assert _index_file(isolated_cache, KEY).is_file()
    warm = _run("forbid", isolated_cache)
    assert (warm["origin"], warm["compiles"], warm["disk_hits"]) == ("disk", 0, 1)
    assert warm["digest"] == cold["digest"]
    assert warm["loaded"] == []  # no Jinja2, no NVRTC bindings, no diskcache/SQLite


def test_index_hit_in_process_renders_nothing(isolated_cache, monkeypatch):
    first = Engine().get(KEY)
    index.reset()  # as a new process would
    import nvrtc_engine.engine as engine_mod

    calls = []
    real = engine_mod.render
    monkeypatch.setattr(engine_mod, "render", lambda key: calls.append(key) or real(key))
    engine = Engine()
    again = engine.get(KEY)
    assert again.origin == "disk" and calls == [] and engine.compiles == 0
    assert again.artifact == first.artifact


@pytest.fixture
def template_copy(tmp_path, monkeypatch):
    """The templates copied to a temporary directory that rendering reads from; returns a
    function that starts over as a new process would (re-reads them, forgets the index's
    fingerprint)."""
    copy = tmp_path / "templates"
    shutil.copytree(render.templates_dir(), copy)

    def new_process():
        for cached in (render.template_files, render.templates_digest, render.helper_headers,
                       render.environment):  # fmt: skip
            cached.cache_clear()
        index.reset()

    monkeypatch.setattr(render, "templates_dir", lambda: copy)
    new_process()
    yield copy, new_process
    monkeypatch.undo()
    new_process()


@pytest.mark.parametrize("same_size_and_mtime", [False, True])
def test_an_edited_template_is_rendered_and_compiled_never_the_stale_cubin(
    template_copy, same_size_and_mtime
):
    copy, new_process = template_copy
    old = Engine().get(KEY)
    new_process()
    assert Engine().get(KEY).origin == "disk"  # the index works with the copy
    path = copy / "activation.cu.j2"
    text = path.read_text()
    st = path.stat()
    marker = "// edited template"
    if same_size_and_mtime:  # an edit that stat() cannot see: same size, same mtime
        first_line, rest = text.split("\n", 1)
        edited = first_line[: -len(marker)] + marker + "\n" + rest
        assert len(edited) == len(text)
    else:
        edited = text + marker + "\n"
    path.write_text(edited)
    if same_size_and_mtime:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert (path.stat().st_size, path.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    new_process()
    engine = Engine()
    kernel = engine.get(KEY)
    assert kernel.origin == "compiled" and engine.compiles == 1
    assert kernel.artifact.digest != old.artifact.digest
    assert kernel.artifact.digest == default_engine().artifact_digest(KEY)[3]
    assert "// edited template" in render.render(KEY).source
    new_process()
    assert Engine().get(KEY).artifact.digest == kernel.artifact.digest  # re-indexed


def _wrong_record(case, cache_dir):
    other = Engine().get(OTHER).artifact
    other_file = _records(cache_dir, OTHER)[0]["file"]
    if case == "other key's digest and file":
        return lambda r: r.update(digest=other.digest, file=other_file)
    if case == "other key's file":
        return lambda r: r.update(file=other_file)
    if case == "missing digest":
        return lambda r: r.update(digest="0" * 64, file="ab/cd/" + "e" * 28 + ".val")
    if case == "missing file":
        return lambda r: r.update(file="ab/cd/" + "e" * 28 + ".val")
    if case == "path outside the cache":
        return lambda r: r.update(file="../../../../etc/passwd")
    if case == "fields missing":
        return lambda r: r.pop("nvrtc")
    raise AssertionError(case)


@pytest.mark.parametrize(
    "case",
    [
        "other key's digest and file",
        "other key's file",
        "missing digest",
        "missing file",
        "path outside the cache",
        "fields missing",
    ],
)
def test_a_wrong_record_falls_back_and_is_repaired(isolated_cache, case):
    good = Engine().get(KEY).artifact
    _rewrite_records(isolated_cache, KEY, _wrong_record(case, isolated_cache))
    index.reset()
    engine = Engine()
    assert engine._from_index(KEY) is None
    kernel = engine.get(KEY)
    assert kernel.origin == "disk" and engine.compiles == 0  # found by digest, not compiled
    assert kernel.artifact == good
    (record,) = _records(isolated_cache, KEY)
    assert record["digest"] == good.digest  # repaired
    assert Engine()._from_index(KEY) == good


@pytest.mark.parametrize("damage", [b"", b"{not json", b'{"format": 1}', b"[1, 2]"])
def test_a_damaged_index_file_is_a_miss(isolated_cache, damage):
    good = Engine().get(KEY).artifact
    _index_file(isolated_cache, KEY).write_bytes(damage)
    engine = Engine()
    assert engine.get(KEY).artifact == good and engine.compiles == 0
    assert Engine()._from_index(KEY) == good


def test_an_entry_replaced_by_another_keys_bytes_is_not_loaded(isolated_cache):
    """Even a value file that verifies (it is a whole entry) is refused when its own header
    names another key."""
    good = Engine().get(KEY).artifact
    Engine().get(OTHER)
    (mine,) = _records(isolated_cache, KEY)
    (theirs,) = _records(isolated_cache, OTHER)
    entries = isolated_cache / "entries"
    shutil.copyfile(entries / theirs["file"], entries / mine["file"])
    _rewrite_records(isolated_cache, KEY, lambda r: r.update(digest=theirs["digest"]))
    engine = Engine()
    assert engine._from_index(KEY) is None
    assert engine.get(KEY).artifact.image == good.image


def test_another_nvrtc_library_misses(isolated_cache, monkeypatch):
    """An upgraded libnvrtc (same path, new size/mtime) or another search environment: the
    record is not used, the full path runs (here it finds the same digest: same NVRTC)."""
    Engine().get(KEY)
    (record,) = _records(isolated_cache, KEY)
    lib = record["nvrtc"]["path"]
    index.reset()
    assert Engine()._from_index(KEY) is not None
    real = index._stat
    size, mtime = real(lib)
    monkeypatch.setattr(index, "_stat", lambda p: [size + 1, mtime] if p == lib else real(p))
    assert Engine()._from_index(KEY) is None
    monkeypatch.setattr(index, "_stat", lambda p: [size, mtime + 1] if p == lib else real(p))
    assert Engine()._from_index(KEY) is None
    monkeypatch.setattr(index, "_stat", real)
    assert Engine()._from_index(KEY) is not None
    monkeypatch.setenv("LD_LIBRARY_PATH", "/opt/other-cuda/lib64")
    assert Engine()._from_index(KEY) is None


def test_this_process_nvrtc_must_be_the_records(isolated_cache, monkeypatch):
    import nvrtc_engine.engine as engine_mod

    Engine().get(KEY)
    monkeypatch.setattr(engine_mod, "_nvrtc_version", lambda: "99.9")  # NVRTC is loaded here
    assert Engine()._from_index(KEY) is None


def test_cuda_headers_are_part_of_the_record(isolated_cache, monkeypatch, tmp_path):
    key = make_key("gelu", dtype="fp8", arch="sm_80")  # includes cuda_fp8.h
    Engine().get(key)
    (record,) = _records(isolated_cache, key)
    assert record["cuda_headers"] is not None
    assert Engine()._from_index(key) is not None
    monkeypatch.setenv("NVRTC_ENGINE_CUDA_INCLUDE_DIR", str(tmp_path))
    config.reset()
    assert Engine()._from_index(key) is None
    monkeypatch.delenv("NVRTC_ENGINE_CUDA_INCLUDE_DIR")
    config.reset()
    real = index._stat
    path = record["cuda_headers"]["path"]
    monkeypatch.setattr(index, "_stat", lambda p: None if p == path else real(p))
    assert Engine()._from_index(key) is None


def test_files_newer_than_the_import_disable_the_index(isolated_cache, monkeypatch):
    monkeypatch.setattr(_loaded, "IMPORTED_AT", 0.0)  # as if every file changed since
    index.reset()
    assert environment_fingerprint() is None
    engine = Engine()
    assert engine.get(KEY).origin == "compiled"
    assert not _index_file(isolated_cache, KEY).exists()
    monkeypatch.undo()
    index.reset()
    assert Engine().get(KEY).origin == "disk"  # the full path, which writes the record now
    assert _index_file(isolated_cache, KEY).is_file()


def test_an_old_record_reads_through_diskcache_and_is_refreshed(isolated_cache):
    good = Engine().get(KEY).artifact
    _rewrite_records(isolated_cache, KEY, lambda r: r.update(used=0))
    engine = Engine()
    assert engine._from_index(KEY) == good
    assert engine._disk is not None  # went through diskcache (a counted use)
    (record,) = _records(isolated_cache, KEY)
    assert record["used"] > 1e9


def test_records_of_other_environments_are_kept(isolated_cache):
    """Another fingerprint, or the same one with another libnvrtc (a host or container sharing
    the directory): both records stay, each process uses its own."""
    Engine().get(KEY)
    (mine,) = _records(isolated_cache, KEY)
    elsewhere = {**mine, "fingerprint": "elsewhere"}
    other_lib = {**mine, "nvrtc": {**mine["nvrtc"], "stat": [1, 2]}, "digest": "f" * 64}
    data = {"format": 1, "key": str(KEY), "records": [other_lib, elsewhere]}
    _index_file(isolated_cache, KEY).write_text(json.dumps(data))
    index.reset()
    engine = Engine()
    assert engine.get(KEY).origin == "disk" and engine.compiles == 0
    records = _records(isolated_cache, KEY)
    assert [(r["fingerprint"], r["digest"]) for r in records] == [
        (mine["fingerprint"], mine["digest"]),
        (mine["fingerprint"], "f" * 64),
        ("elsewhere", mine["digest"]),
    ]
    assert Engine()._from_index(KEY).digest == mine["digest"]


@pytest.mark.parametrize("found_via", ["site-packages", "system-search"])
def test_ld_so_cache_matters_only_outside_site_packages(isolated_cache, monkeypatch, found_via):
    Engine().get(KEY)
    _rewrite_records(
        isolated_cache, KEY, lambda r: r["nvrtc"].update(found_via=found_via, ld_so_cache=[1, 2])
    )
    real = index._stat
    monkeypatch.setattr(index, "_stat", lambda p: [1, 3] if p == "/etc/ld.so.cache" else real(p))
    hit = Engine()._from_index(KEY) is not None
    assert hit == (found_via == "site-packages")


def test_verify_drops_records_of_missing_entries_and_clear_removes_the_index(isolated_cache):
    Engine().get(KEY)
    Engine().get(OTHER)
    disk = default_engine().disk()
    disk.delete(Engine().artifact_digest(OTHER)[3])
    report = disk.verify(fix=True)
    assert report.bad == ()
    assert any(str(OTHER) in p and "missing entry" in p for p in report.problems)
    assert not _index_file(isolated_cache, OTHER).exists()
    assert _index_file(isolated_cache, KEY).exists()
    assert disk.verify(fix=True).problems == ()


def test_clear_in_an_engine_that_only_used_the_index_clears_the_disk(isolated_cache):
    import nvrtc_engine.engine as engine_mod

    Engine().get(KEY)
    engine = Engine()
    assert engine.get(KEY).origin == "disk" and engine._disk is engine_mod._UNOPENED
    engine.clear()
    assert not _index_file(isolated_cache, KEY).exists()
    assert ne.cache_info().entries == 0


def test_bundle_import_writes_the_index(isolated_cache, tmp_path):
    from nvrtc_engine.bundle import export_bundle, import_bundle

    Engine().get(KEY)
    export_bundle(tmp_path / "k.zip")
    config.configure(cache_dir=tmp_path / "elsewhere")
    ne.clear_cache()
    import_bundle(tmp_path / "k.zip")
    assert _index_file(tmp_path / "elsewhere", KEY).is_file()
    engine = Engine()
    assert engine._from_index(KEY) is not None
