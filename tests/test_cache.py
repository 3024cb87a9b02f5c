"""The caches: digest axes, verified entries, disk hits across processes, damage recovery,
unwritable directories."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading

import pytest

import nvrtc_engine as ne
from nvrtc_engine import CacheWarning, make_key
from nvrtc_engine.cache import SCHEMA, compute_digest, decode_entry, encode_entry
from nvrtc_engine.engine import Engine, default_engine
from nvrtc_engine.kernel import Artifact

BASE = dict(
    source="src",
    headers=(("a.cuh", "x"),),
    flags=("-arch=sm_90",),
    nvrtc_version="13.0",
    header_version=None,
)


@pytest.mark.parametrize(
    ("field", "other"),
    [
        ("source", "src2"),
        ("headers", (("a.cuh", "y"),)),
        ("headers", (("b.cuh", "x"),)),
        ("flags", ("-arch=sm_100a",)),
        ("flags", ("-arch=sm_90", "-lineinfo")),
        ("nvrtc_version", "13.1"),
        ("header_version", "13.0"),
    ],
)
def test_digest_differs_on_every_axis(field, other):
    assert compute_digest(**{**BASE, field: other}) != compute_digest(**BASE)


def test_digest_same_for_same_inputs():
    assert compute_digest(**BASE) == compute_digest(**dict(BASE))
    assert len(compute_digest(**BASE)) == 64


def test_keys_that_differ_only_in_arch_get_different_digests():
    e = default_engine()
    d90 = e.artifact_digest(make_key("gelu", dtype="fp8", arch="sm_90"))[3]
    d90a = e.artifact_digest(make_key("gelu", dtype="fp8", arch="sm_90a"))[3]
    d100 = e.artifact_digest(make_key("gelu", dtype="fp8", arch="sm_100a"))[3]
    assert len({d90, d90a, d100}) == 3


def _artifact(image=b"\x7fELF-image-bytes"):
    return Artifact(
        image=image,
        kind="cubin",
        symbols=("k",),
        digest="d" * 64,
        nvrtc_version="13.0",
        options=("-arch=sm_90",),
        compile_ms=12.5,
    )


def test_artifact_repr_is_short():
    """The repr names the image's size, not its bytes (a cubin runs to hundreds of KB)."""
    text = repr(_artifact(image=b"\0" * 300_000))
    assert "300000 bytes" in text and "symbols=('k',)" in text and len(text) < 200


def test_entry_round_trip_and_damage():
    art = _artifact()
    value = encode_entry("k", art)
    header, again = decode_entry(value, art.digest)
    assert again == art and header["schema"] == SCHEMA and header["key"] == "k"
    assert decode_entry(value, "e" * 64) is None  # stored under another digest
    assert decode_entry(value[:-1], art.digest) is None  # truncated image
    assert decode_entry(value[:20], art.digest) is None  # truncated header
    flipped = bytearray(value)
    flipped[-3] ^= 0x01
    assert decode_entry(bytes(flipped), art.digest) is None  # corrupted image
    assert decode_entry(b"garbage" * 10, art.digest) is None
    assert decode_entry(12345, art.digest) is None


def test_memory_hit_returns_same_object_and_counts():
    k1 = ne.get_kernel("gelu", dtype="fp8", arch="sm_90")
    k2 = ne.get_kernel("gelu", dtype="fp8", arch="sm_90")
    k3 = ne.get_kernel(make_key("gelu", dtype="fp8", arch="sm_90"))
    assert k1 is k2 is k3
    info = ne.cache_info()
    assert (info.compiles, info.misses, info.hits, info.disk_hits) == (1, 1, 2, 0)
    assert info.memory_entries == 1 and info.entries == 1 and info.bytes > 0


def test_disk_hit_in_a_fresh_engine_compiles_nothing():
    k = make_key("gelu", dtype="bf16", arch="sm_90")
    first = Engine().get(k)
    second_engine = Engine()
    second = second_engine.get(k)
    assert second.origin == "disk" and first.origin == "compiled"
    assert second.artifact.image == first.artifact.image
    assert (second_engine.compiles, second_engine.disk_hits) == (0, 1)


_CHILD = textwrap.dedent("""
    import json, sys
    import nvrtc_engine as ne
    if sys.argv[1] == "forbid":
        from cuda.bindings import nvrtc
        def refuse(*a, **k):
            raise AssertionError("NVRTC compile called in the second process")
        nvrtc.nvrtcCompileProgram = refuse
    k = ne.get_kernel("gelu", dtype="fp8", hidden_size=4096, arch="sm_90")
    print(json.dumps({**ne.cache_info().__dict__, "origin": k.origin,
                      "size": len(k.artifact.image)}))
""")


def _child(mode, env):
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, mode],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_cache_hit_across_two_processes_with_zero_nvrtc_compiles(isolated_cache):
    env = {**os.environ, "NVRTC_ENGINE_CACHE_DIR": str(isolated_cache)}
    first = _child("allow", env)
    second = _child("forbid", env)
    assert (first["compiles"], first["origin"]) == (1, "compiled")
    assert (second["compiles"], second["disk_hits"], second["origin"]) == (0, 1, "disk")
    assert second["size"] == first["size"] and second["entries"] == 1


def _only_entry(engine):
    disk = engine.disk()
    (digest,) = list(disk.digests())
    return disk, digest


@pytest.mark.parametrize("damage", ["truncate", "garbage", "flip", "other-digest"])
def test_damaged_entry_is_removed_and_recompiled(damage):
    k = make_key("gelu", dtype="fp16", arch="sm_90")
    good = Engine().get(k).artifact
    engine = Engine()
    disk, digest = _only_entry(engine)
    value = disk.raw(digest)
    if damage == "truncate":
        bad = value[: len(value) // 2]
    elif damage == "garbage":
        bad = os.urandom(len(value))
    elif damage == "flip":
        b = bytearray(value)
        b[len(b) // 2] ^= 0xFF
        bad = bytes(b)
    else:
        bad = encode_entry(str(k), Artifact(**{**good.__dict__, "digest": "0" * 64}))
    disk._store.set(digest, bad)
    kernel = engine.get(k)
    assert kernel.origin == "compiled" and engine.compiles == 1
    assert kernel.artifact.image == good.image
    # the bad entry was replaced by a good one
    assert Engine().get(k).origin == "disk"


def test_truncated_file_on_disk_is_a_miss(isolated_cache):
    k = make_key("gelu", dtype="fp32", arch="sm_90")
    engine = Engine()
    disk = engine.disk()
    disk._store.reset("disk_min_file_size", 0)  # store values as files, not inline in SQLite
    engine.get(k)
    files = list(isolated_cache.rglob("*.val"))
    assert len(files) == 1
    files[0].write_bytes(files[0].read_bytes()[:100])
    again = Engine()
    assert again.get(k).origin == "compiled" and again.compiles == 1
    assert Engine().get(k).origin == "disk"


def test_unwritable_cache_dir_degrades_to_memory_with_one_warning(tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the cache directory should be")
    monkeypatch.setenv("NVRTC_ENGINE_CACHE_DIR", str(blocker / "cache"))
    ne.config.reset()
    ne.clear_cache()
    with pytest.warns(CacheWarning, match="memory only") as record:
        k1 = ne.get_kernel("gelu", dtype="fp8", arch="sm_90")
        k2 = ne.get_kernel("gelu", dtype="bf16", arch="sm_90")
    assert len(record) == 1
    assert k1.origin == k2.origin == "compiled"
    info = ne.cache_info()
    assert info.directory is None and info.entries == 0 and info.compiles == 2


@pytest.mark.skipif(
    hasattr(os, "geteuid") and os.geteuid() == 0, reason="root ignores directory permissions"
)
def test_read_only_cache_dir_degrades_to_memory(tmp_path, monkeypatch):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    monkeypatch.setenv("NVRTC_ENGINE_CACHE_DIR", str(ro / "cache"))
    ne.config.reset()
    ne.clear_cache()
    with pytest.warns(CacheWarning):
        assert ne.get_kernel("gelu", dtype="bf16", arch="sm_90").origin == "compiled"


def _files(directory):
    """``{relative path: (size, mtime_ns)}`` of the files under ``directory`` (SQLite's
    ``-shm``/``-wal`` files of a read-only reader aside)."""
    return {
        str(p.relative_to(directory)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in directory.rglob("*")
        if p.is_file() and not p.name.endswith(("-shm", "-wal"))
    }


def _read_only_cache(directory):
    """Two kernels (bf16, fp16) in ``directory``'s disk cache, without their key index
    records (so that lookups go through the database); the keys of those and of a third."""
    keys = [make_key("gelu", dtype=d, arch="sm_90") for d in ("bf16", "fp16", "fp32")]
    writer = Engine()
    for k in keys[:2]:
        writer.get(k)
    writer.disk().close()
    shutil.rmtree(directory / "index", ignore_errors=True)  # (none: a racy fingerprint)
    return keys


def _check_read_only(directory, keys):
    """A fresh engine reads the two stored kernels, compiles the third into memory only,
    warns once, and writes nothing to ``directory``."""
    before = _files(directory)
    engine = Engine()
    with pytest.warns(CacheWarning, match="is read-only .*kernels already there are read") as w:
        origins = [engine.get(k).origin for k in keys]
        again = Engine().get(keys[2])  # a new kernel again: compiled, not found
    assert len(w) == 1
    assert origins == ["disk", "disk", "compiled"] and again.origin == "compiled"
    assert (engine.compiles, engine.disk_hits) == (1, 2)
    info = engine.info()
    assert info.read_only and info.directory == str(directory) and info.entries == 2
    assert info.bytes > 0 and info.size_limit == ne.config.settings().cache_size_limit
    disk = engine.disk()
    assert sorted(h["key"] for _d, h, _a in disk.entries()) == sorted(map(str, keys[:2]))
    assert disk.verify().checked == 2 and disk.clear() == 0
    assert _files(directory) == before


def test_a_cache_diskcache_cannot_open_for_writing_is_read_read_only(
    isolated_cache, read_only_diskcache
):
    """diskcache opens a cache for writing (it writes its settings on open); where that fails
    and the database can be read, the cache is read without it."""
    keys = _read_only_cache(isolated_cache)
    read_only_diskcache()
    _check_read_only(isolated_cache, keys)


@pytest.mark.skipif(not hasattr(os, "statvfs"), reason="no statvfs")
def test_a_read_only_mount_is_named_in_the_warning(isolated_cache, read_only_diskcache,
                                                   monkeypatch):  # fmt: skip
    """On a read-only file system SQLite says only "unable to open database file": the
    warning names the cause the system reports (statvfs's read-only flag)."""
    keys = _read_only_cache(isolated_cache)
    read_only_diskcache()
    real = os.statvfs

    class Mounted:
        def __init__(self, path):
            self._stat = real(path)
            self.f_flag = self._stat.f_flag | os.ST_RDONLY

    monkeypatch.setattr(os, "statvfs", Mounted)
    with pytest.warns(CacheWarning, match="is read-only .read-only file system; "):
        assert Engine().get(keys[0]).origin == "disk"


@pytest.mark.skipif(
    hasattr(os, "geteuid") and os.geteuid() == 0, reason="root ignores directory permissions"
)
def test_a_read_only_cache_directory_is_read(isolated_cache):
    keys = _read_only_cache(isolated_cache)
    modes = {}
    for path in [isolated_cache, *isolated_cache.rglob("*")]:
        modes[path] = path.stat().st_mode
        path.chmod(modes[path] & ~0o222)
    try:
        _check_read_only(isolated_cache, keys)
    finally:
        for path, mode in modes.items():
            path.chmod(mode)


def test_disable_disk_cache(monkeypatch, isolated_cache):
    monkeypatch.setenv("NVRTC_ENGINE_DISABLE_DISK_CACHE", "1")
    ne.config.reset()
    ne.clear_cache()
    ne.get_kernel("gelu", dtype="bf16", arch="sm_90")
    assert ne.cache_info().directory is None
    assert not isolated_cache.exists()


def test_clear_cache_empties_memory_and_disk():
    ne.get_kernel("gelu", dtype="bf16", arch="sm_90")
    assert ne.cache_info().entries == 1
    ne.clear_cache()
    info = ne.cache_info()
    assert (info.entries, info.memory_entries, info.compiles) == (0, 0, 0)
    assert ne.get_kernel("gelu", dtype="bf16", arch="sm_90").origin == "compiled"


def test_configured_directory_takes_over_and_the_old_one_keeps_its_entries(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    try:
        ne.configure(cache_dir=first)
        ne.clear_cache(memory=True, disk=False)
        ne.get_kernel("gelu", dtype="bf16", arch="sm_90")
        assert ne.cache_info().directory == str(first)
        ne.configure(cache_dir=second)  # no clear_cache needed to switch
        ne.clear_cache(disk=False)
        assert ne.get_kernel("gelu", dtype="bf16", arch="sm_90").origin == "compiled"
        info = ne.cache_info()
        assert info.directory == str(second) and info.entries == 1
        ne.clear_cache()  # clears the configured directory, b ...
        assert ne.cache_info().entries == 0
        ne.configure(cache_dir=first)  # ... and a still holds its kernel
        ne.clear_cache(disk=False)
        assert ne.cache_info().entries == 1
        assert ne.get_kernel("gelu", dtype="bf16", arch="sm_90").origin == "disk"
    finally:
        ne.config.reset()
        ne.clear_cache(disk=False)


def test_memory_only_cache_info_reports_the_configured_size_limit(monkeypatch, isolated_cache):
    monkeypatch.setenv("NVRTC_ENGINE_DISABLE_DISK_CACHE", "1")
    monkeypatch.setenv("NVRTC_ENGINE_CACHE_SIZE_LIMIT", "2G")
    ne.config.reset()
    ne.clear_cache(disk=False)
    info = ne.cache_info()
    assert info.directory is None and info.size_limit == 2 << 30


def test_single_flight_one_compile_for_concurrent_callers(monkeypatch):
    import nvrtc_engine.engine as engine_mod

    calls = []
    real = engine_mod.compile_source
    gate = threading.Event()

    def slow_compile(*args, **kwargs):
        calls.append(1)
        gate.wait(5)
        return real(*args, **kwargs)

    monkeypatch.setattr(engine_mod, "compile_source", slow_compile)
    engine = Engine()
    k = make_key("gelu", dtype="fp16", arch="sm_89")
    results = []
    threads = [threading.Thread(target=lambda: results.append(engine.get(k))) for _ in range(8)]
    for t in threads:
        t.start()
    gate.set()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len(results) == 8 and all(r is results[0] for r in results)


def test_failed_compile_is_raised_to_every_waiter_and_not_cached(monkeypatch):
    import nvrtc_engine.engine as engine_mod

    def fail(*args, **kwargs):
        raise ne.CompileError(
            key="k",
            log="error: boom",
            options=(),
            nvrtc_version="13.0",
            header_version=None,
            source_path=None,
        )

    real = engine_mod.compile_source
    monkeypatch.setattr(engine_mod, "compile_source", fail)
    engine = Engine()
    k = make_key("gelu", dtype="fp16", arch="sm_90")
    with pytest.raises(ne.CompileError):
        engine.get(k)
    monkeypatch.setattr(engine_mod, "compile_source", real)
    assert engine.get(k).origin == "compiled"


def test_a_store_evicted_at_once_is_not_reported_as_stored(tmp_path):
    from nvrtc_engine.cache import DiskCache

    disk = DiskCache.open(tmp_path / "tiny", 40_000)  # below an empty store plus the entry
    big = _artifact(b"\x7fELF" + os.urandom(100_000))
    with pytest.warns(CacheWarning, match="evicted as soon as it was stored.*size limit") as w:
        assert not disk.put("big", big)
        assert not disk.put("big", big)  # warned once per directory
    assert len(w) == 1 and big.digest not in disk and len(disk) == 0
    roomy = DiskCache.open(tmp_path / "roomy", 1 << 20)  # ... and writes go on elsewhere
    assert roomy.put("big", big) and big.digest in roomy


def test_a_kernel_evicted_at_once_gets_no_key_index_record():
    engine = Engine()
    disk = engine.disk()
    disk._store.reset("size_limit", 1000)  # as a cap below an empty store's size would
    with pytest.warns(CacheWarning, match="evicted as soon as it was stored"):
        kernel = engine.get(make_key("gelu", dtype="bf16", arch="sm_90"))
    assert kernel.origin == "compiled" and len(disk) == 0
    assert not list(disk.index.directory.glob("*.json"))


def test_cache_info_creates_no_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ne.configure(cache_dir="relative_dir_test")
    ne.clear_cache(disk=False)
    try:
        info = ne.cache_info()
        assert not (tmp_path / "relative_dir_test").exists()
        assert (info.entries, info.bytes, info.read_only) == (0, 0, False)
        assert info.directory == str(tmp_path / "relative_dir_test")
        assert info.size_limit == ne.config.settings().cache_size_limit
        ne.get_kernel("gelu", dtype="bf16", arch="sm_90")  # the first store creates it
        assert ne.cache_info().entries == 1 and (tmp_path / "relative_dir_test").is_dir()
    finally:
        ne.config.reset()
        ne.clear_cache(disk=False)


def test_clear_cache_resets_the_counters_and_says_so():
    ne.get_kernel("gelu", dtype="bf16", arch="sm_90")
    ne.get_kernel("gelu", dtype="bf16", arch="sm_90")
    before = ne.cache_info()
    assert (before.hits, before.misses, before.compiles) == (1, 1, 1)
    ne.clear_cache(memory=False)  # the disk only: the counters stay
    assert ne.cache_info().hits == 1
    ne.clear_cache(disk=False)
    info = ne.cache_info()
    assert (info.hits, info.disk_hits, info.misses, info.compiles) == (0, 0, 0, 0)
    assert "counters" in ne.clear_cache.__doc__


@pytest.mark.parametrize("damage", ["truncated", "not a database"])
def test_a_damaged_database_is_replaced_by_a_new_one(tmp_path, damage):
    """A corrupt SQLite database (truncated), or a file that is none (a bundle exported over
    it), is replaced on open by an empty store, with one CacheWarning; the cache then works
    and the damaged store is gone."""
    from nvrtc_engine.cache import ENTRIES_DIR, DiskCache

    disk = DiskCache.open(tmp_path, 1 << 20)
    for i in range(40):  # a database of several pages, so that half of it is a corrupt one
        assert disk.put(f"k{i}", _artifact(b"\x7fELF" + bytes([i]) * 100))
    disk._store.close()
    db = tmp_path / ENTRIES_DIR / "cache.db"
    if damage == "truncated":
        data = db.read_bytes()
        assert len(data) >= 8192
        db.write_bytes(data[: len(data) // 2])
    else:
        db.write_bytes(b"PK\x03\x04 a zip file, not a database" * 100)
    with pytest.warns(CacheWarning, match="database at .* was damaged .*replaced by a new"):
        again = DiskCache.open(tmp_path, 1 << 20)
    assert again is not None and not again.read_only and len(again) == 0
    assert again.put("k", _artifact()) and again.get(_artifact().digest) == _artifact()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(ENTRIES_DIR)] == [ENTRIES_DIR]


def test_a_damaged_database_replaced_meanwhile_is_not_replaced_again(tmp_path, monkeypatch):
    """Two processes finding the same damage: the second, once it holds the lock, finds the
    store the first made and keeps it (no rename, no warning)."""
    import sqlite3
    import warnings

    from nvrtc_engine import cache

    calls = []
    real = cache._open_store

    def first_damaged(directory, size_limit):
        calls.append(directory)
        if len(calls) == 1:
            raise sqlite3.DatabaseError("database disk image is malformed")
        return real(directory, size_limit)

    monkeypatch.setattr(cache, "_open_store", first_damaged)
    monkeypatch.setattr(cache.os, "rename", lambda *a: pytest.fail("renamed a healthy store"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning: nothing was replaced
        disk = cache.DiskCache.open(tmp_path, 1 << 20)
    assert disk is not None and len(calls) == 2


@pytest.mark.parametrize(
    "kwargs", [dict(memory="no", disk="no"), dict(disk="no"), dict(disk=None), dict(memory=0),
               dict(memory=1), dict(disk="False")],
)  # fmt: skip
def test_clear_cache_requires_bools_and_clears_nothing_otherwise(kwargs):
    """'no' is truthy: clear_cache(disk="no") deleted every disk entry; disk=None was False."""
    ne.get_kernel("gelu", dtype="bf16", arch="sm_90")
    before = ne.cache_info()
    assert (before.entries, before.memory_entries) == (1, 1)
    name = next(field for field, value in kwargs.items() if not isinstance(value, bool))
    with pytest.raises(ne.ArgumentTypeError, match=rf"^{name}: expected True or False") as info:
        ne.clear_cache(**kwargs)
    assert info.value.argument == name and isinstance(info.value, TypeError)
    after = ne.cache_info()
    assert (after.entries, after.memory_entries, after.compiles) == (1, 1, before.compiles)
