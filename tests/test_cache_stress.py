"""The disk cache under stress: processes racing on cold keys, writers killed mid-store,
damaged and unreadable entries, unusable directories, the size cap, stale locks, and what
entries are never shared across."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
from test_cache import IS_ROOT, ROOT, _env, _last_json, as_nobody

import nvrtc_engine as ne
from nvrtc_engine import CacheWarning, make_key
from nvrtc_engine.core import config, nvrtc
from nvrtc_engine.core.cache import MAGIC, check_entry, digest, encode_entry, entries
from nvrtc_engine.core.engine import Engine, default_engine
from nvrtc_engine.core.kernel import Artifact
from nvrtc_engine.core.tiers import DiskTier

# -- many processes, one cold cache ---------------------------------------------------------

RACE_KEYS = [
    str(make_key("gelu", in_dtype=i, out_dtype=o, arch=a))
    for a in ("sm_90", "sm_100a")
    for i in ("bf16", "fp16")
    for o in ("fp32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2")
]

_RACER = textwrap.dedent("""
    import json, os, random, sys, time
    import nvrtc_engine as ne
    from nvrtc_engine.tools.prewarm import prewarm
    mode, seed, go, names = sys.argv[1], int(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4])
    keys = [ne.KernelKey.parse(n) for n in names]
    random.Random(seed).shuffle(keys)
    while not os.path.exists(go):  # start together
        time.sleep(0.002)
    if mode == "prewarm":
        report = prewarm(keys, workers=2, progress=False)
        assert report.ok, report.summary()
    else:
        for k in keys:
            ne.get_kernel(k)
    print(json.dumps({"compiles": ne.cache_info().compiles}))
""")


def _race(cache_dir, go, runs):
    """Start one racer per ``(mode, keys)`` of ``runs``, let them go together; their compiles."""
    procs = [subprocess.Popen([sys.executable, "-c", _RACER, mode, str(i), str(go),
                               json.dumps(keys)], env=_env(cache_dir), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
             for i, (mode, keys) in enumerate(runs)]  # fmt: skip
    time.sleep(0.5)
    go.touch()
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        results.append(_last_json(out)["compiles"])
    return results


@pytest.mark.matrix
def test_eight_processes_racing_on_twenty_cold_keys_compile_each_once(isolated_cache, tmp_path):
    # six get_kernel loops and two prewarms (with two workers each)
    runs = [("prewarm" if i % 4 == 3 else "get", RACE_KEYS) for i in range(8)]
    results = _race(isolated_cache, tmp_path / "go", runs)
    assert sum(results) == len(RACE_KEYS), results
    disk = DiskTier(isolated_cache, 1 << 30)
    assert len(disk) == len(RACE_KEYS)
    found = [answer for _, answer in entries(disk)]
    assert sorted(header["key"] for header, _ in found) == sorted(RACE_KEYS)


def test_two_processes_racing_on_one_cold_key_compile_it_once(isolated_cache, tmp_path):
    """The default tier's share of the race above: get_kernel in two processes at once."""
    results = _race(isolated_cache, tmp_path / "go", [("get", RACE_KEYS[:1])] * 2)
    assert sorted(results) == [0, 1]


# -- writers killed at random moments -------------------------------------------------------


def _image(i: int) -> bytes:
    """A deterministic image per digest; every third one is big enough to be stored as a
    file (>= 32 KiB), the others inline in SQLite."""
    size = 40_000 if i % 3 == 0 else 3_000
    return (hashlib.sha256(str(i).encode()).digest() * (size // 32 + 1))[:size]


def _digest(i: int) -> str:
    return f"{i:064x}"


_WRITER = textwrap.dedent("""
    import itertools, sys
    from pathlib import Path
    sys.path.insert(0, sys.argv[2])
    from test_cache_stress import _artifact_for, _digest
    from nvrtc_engine.core.cache import encode_entry
    from nvrtc_engine.core.tiers import DiskTier
    disk = DiskTier(Path(sys.argv[1]), 1 << 30)
    print("ready", flush=True)
    for n in itertools.count():
        i = n % 24
        disk.put(_digest(i), encode_entry(f"k{i}", _artifact_for(i)))
""")


def _artifact_for(i: int) -> Artifact:
    return Artifact(
        image=_image(i),
        kind="cubin",
        symbols=(f"k{i}",),
        digest=_digest(i),
        nvrtc_version="13.0",
        options=("-arch=sm_90",),
        compile_ms=1.0,
    )


def test_writer_killed_during_stores_never_leaves_an_entry_that_loads_wrong(tmp_path):
    directory = tmp_path / "cache"
    rng = random.Random(1234)
    for _ in range(20):
        p = subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(directory), str(Path(__file__).parent)],
            env=_env(directory), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert p.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.0, 0.08))
        p.send_signal(signal.SIGKILL)
        p.communicate(timeout=60)  # also closes the pipes
    disk = DiskTier(directory, 1 << 30)
    found = 0
    for stored, answer in entries(disk):
        header, artifact = answer  # every entry there verifies ...
        i = int(stored, 16)  # ... and is the one stored under its digest
        assert artifact.image == _image(i) and header["key"] == f"k{i}"
        found += 1
    assert found > 0
    problems = disk.check(fix=True)  # value files orphaned by killed writers are removed
    assert all(p.startswith(("unknown file", "empty directory")) for p in problems), problems
    assert disk.check(fix=False) == []
    assert disk.put(_digest(99), encode_entry("k99", _artifact_for(99)))
    assert check_entry(disk.get(_digest(99)), _digest(99))[1].image == _image(99)


# -- damaged, unreadable and foreign entries --------------------------------------------------


def _engine_with_file_values():
    engine = Engine()
    engine.tiers().disk._store.reset("disk_min_file_size", 0)  # every value in its own file
    return engine


def test_unreadable_value_file_is_a_miss_that_recompiles(monkeypatch):
    """What a non-root reader meets for a chmod 000 file or another user's 0600 file,
    simulated so that it also runs as root (which reads any file)."""
    import diskcache.core

    k = make_key("gelu", dtype="fp16", arch="sm_90")
    first = _engine_with_file_values().get(k)
    real_open = open

    def deny(path, *args, **kwargs):
        if str(path).endswith(".val") and "r" in (args[0] if args else kwargs.get("mode", "r")):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(diskcache.core, "open", deny, raising=False)
    engine = Engine()
    again = engine.get(k)
    assert again.origin == "compiled" and engine.compiles == 1
    assert again.artifact.image == first.artifact.image
    monkeypatch.undo()
    assert Engine().get(k).origin == "disk"  # the replacement entry is readable


def test_database_error_on_read_is_a_miss(monkeypatch):
    import sqlite3

    k = make_key("gelu", dtype="bf16", arch="sm_90")
    Engine().get(k)
    engine = Engine()
    store = engine.tiers().disk._store

    def broken(*args, **kwargs):
        raise sqlite3.DatabaseError("database disk image is malformed")

    monkeypatch.setattr(store, "get", broken)
    assert engine.get(k).origin == "compiled"


def test_an_error_reading_the_database_removes_no_entry(monkeypatch):
    """An error that may pass (a busy or damaged read) is a miss, never a bad entry to remove:
    the entry another process stored is there for the next reader."""
    import sqlite3

    k = make_key("gelu", dtype="fp16", arch="sm_89")
    Engine().get(k)
    engine = Engine()

    def busy(*args, **kwargs):
        raise sqlite3.OperationalError("database is locked")

    monkeypatch.setattr(engine.tiers().disk._store, "get", busy)
    assert engine.cached(k) is None
    monkeypatch.undo()
    assert Engine().cached(k).origin == "disk"


@pytest.mark.skipif(IS_ROOT, reason="root reads chmod 000 files; the simulated test covers it")
def test_chmod_000_entry_is_a_miss(isolated_cache):
    k = make_key("gelu", dtype="fp32", arch="sm_90")
    _engine_with_file_values().get(k)
    (value,) = list(isolated_cache.rglob("*.val"))
    value.chmod(0)
    engine = Engine()
    assert engine.get(k).origin == "compiled" and engine.compiles == 1


def _two_engines_as_nobody(cache):
    """(In the child) two fresh engines of user nobody ask for one kernel."""
    os.environ["NVRTC_ENGINE_CACHE_DIR"] = str(cache)
    config.reset()
    runs = []
    for _ in range(2):
        engine = Engine()
        runs.append([engine.get(make_key("gelu", dtype="fp8", arch="sm_90")).origin,
                     engine.compiles])  # fmt: skip
    return runs


@pytest.mark.skipif(not IS_ROOT, reason="needs root to run a process as another user")
def test_entry_owned_by_another_user_is_a_miss_for_this_one():
    """A shared cache directory where root wrote an entry file readable only by root:
    user nobody recompiles and stores its own entry, which root then reads."""
    shared = Path(tempfile.mkdtemp(prefix="nvrtc-engine-shared-"))
    try:
        shared.chmod(0o777)
        cache = shared / "cache"
        config.configure(cache_dir=cache)
        ne.clear_cache()
        _engine_with_file_values().get(make_key("gelu", dtype="fp8", arch="sm_90"))
        ne.clear_cache(disk=False)
        for path in [cache, *cache.rglob("*")]:
            path.chmod(0o777 if path.is_dir() else 0o666)
        values = list(cache.rglob("*.val"))
        assert values
        for value in values:
            value.chmod(0o600)  # root's own, unreadable to others
        code, runs = as_nobody(lambda: _two_engines_as_nobody(cache))
        assert code == 0, runs
        assert runs == [["compiled", 1], ["disk", 0]]
        config.configure(cache_dir=cache)
        assert Engine().get(make_key("gelu", dtype="fp8", arch="sm_90")).origin == "disk"
    finally:
        shutil.rmtree(shared, ignore_errors=True)


# -- unusable directories: one warning, memory only -----------------------------------------


def _two_kernels_with_one_warning(match):
    with pytest.warns(CacheWarning, match=match) as record:
        a = ne.get_kernel("gelu", dtype="bf16", arch="sm_90")
        b = ne.get_kernel("gelu", dtype="fp16", arch="sm_90")
    assert len(record) == 1 and a.origin == b.origin == "compiled"
    info = ne.cache_info()
    assert info.directory is None and info.compiles == 2


def test_home_unset_and_no_password_entry_is_memory_only(tmp_path, monkeypatch):
    import pwd

    for var in ("NVRTC_ENGINE_CACHE_DIR", "HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)

    def no_entry(uid):
        raise KeyError(f"getpwuid(): uid not found: {uid}")

    monkeypatch.setattr(pwd, "getpwuid", no_entry)
    monkeypatch.chdir(tmp_path)
    config.reset()
    ne.clear_cache()
    _two_kernels_with_one_warning("home directory")
    assert list(tmp_path.iterdir()) == []  # no relative "~/.cache" made in the working dir


def test_home_unusable_is_memory_only(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.write_text("a file where the home directory should be")  # fails even for root
    monkeypatch.delenv("NVRTC_ENGINE_CACHE_DIR")
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(home))
    config.reset()
    ne.clear_cache()
    _two_kernels_with_one_warning("memory only")


def test_writes_failing_later_keep_kernels_in_memory_with_one_warning(monkeypatch):
    engine = default_engine()
    store = engine.tiers().disk._store

    def full(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(store, "set", full)
    with pytest.warns(CacheWarning, match="cannot be written .*Read-only file system") as record:
        ne.get_kernel("gelu", dtype="bf16", arch="sm_89")
        ne.get_kernel("gelu", dtype="fp16", arch="sm_89")
    assert len(record) == 1 and ne.cache_info().compiles == 2


# -- size cap ---------------------------------------------------------------------------------


def _put(disk, i):
    return disk.put(_digest(i), encode_entry(f"k{i}", _artifact_for(i)))


def test_size_cap_evicts_least_recently_used(tmp_path):
    """Least recently used first, a use counted once a day: an entry read on a new day is
    stored again (diskcache evicts the least recently stored)."""
    limit = 400_000
    disk = DiskTier(tmp_path / "capped", limit)
    assert disk.size_limit == limit
    store = disk._store
    real = time.time
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(time, "time", lambda: real() - 86400)  # stored yesterday
        for i in range(1, 31):  # 3 KB entries (inline in SQLite)
            assert _put(disk, 3 * i + 1)
    assert disk.get(_digest(4)) is not None  # k1, stored first, is now the most recently used
    assert disk.get(_digest(4)) is not None  # (today's second use is not counted again)
    count = len(disk)
    for i in range(31, 1000):  # until the cap makes the first eviction
        _put(disk, 3 * i + 1)
        if len(disk) <= count:
            break
        count = len(disk)
    else:
        pytest.fail("nothing was evicted")
    assert disk.volume() <= limit + 40_000
    assert _digest(4) in store  # k1 survived (`in` does not count as a use)
    assert _digest(7) not in store  # k2, the least recently used, was evicted first


def test_size_limit_setting_reaches_the_cache(monkeypatch):
    monkeypatch.setenv("NVRTC_ENGINE_CACHE_SIZE_LIMIT", "64M")
    config.reset()
    ne.clear_cache()
    assert ne.cache_info().size_limit == 64 << 20


# -- the per-key lock ------------------------------------------------------------------------

_HOLDER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from nvrtc_engine.core.tiers import DiskTier
    disk = DiskTier(Path(sys.argv[1]), 1 << 30)
    with disk.lock(sys.argv[2], 10) as held:
        assert held
        print("locked", flush=True)
        time.sleep(120)
""")


def _hold_lock(cache_dir, digest):
    p = subprocess.Popen([sys.executable, "-c", _HOLDER, str(cache_dir), digest],
                         env=_env(cache_dir), stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert p.stdout.readline().strip() == "locked"
    return p


def test_lock_of_a_killed_holder_is_free_at_once(isolated_cache, monkeypatch):
    monkeypatch.setenv("NVRTC_ENGINE_LOCK_TIMEOUT", "600")
    config.reset()
    k = make_key("gelu", dtype="fp8", arch="sm_89")
    holder = _hold_lock(isolated_cache, digest(k))
    holder.kill()
    holder.communicate(timeout=60)
    # no CacheWarning (warnings are errors here): the lock was taken, not waited out
    assert ne.get_kernel(k).origin == "compiled"


def test_live_holder_past_the_timeout_is_passed_over(isolated_cache, monkeypatch):
    monkeypatch.setenv("NVRTC_ENGINE_LOCK_TIMEOUT", "0.3")
    config.reset()
    k = make_key("gelu", dtype="fp8", arch="sm_100a")
    holder = _hold_lock(isolated_cache, digest(k))
    try:
        with pytest.warns(CacheWarning, match="waited 0.3 s"):
            kernel = ne.get_kernel(k)
        assert kernel.origin == "compiled"
        assert Engine().get(k).origin == "disk"
    finally:
        holder.kill()
        holder.communicate(timeout=60)


def test_lock_files_are_bounded_stripes(isolated_cache):
    for pair in [("bf16", "bf16"), ("fp16", "fp16"), ("fp32", "fp32")]:
        ne.get_kernel("gelu", in_dtype=pair[0], out_dtype=pair[1], arch="sm_90")
    names = [p.name for p in (isolated_cache / "locks").iterdir()]
    assert names and all(len(n) == len("abc.lock") for n in names)


# -- what entries are (not) shared across ------------------------------------------------------


def test_other_nvrtc_version_never_reads_this_entry(monkeypatch):
    """An NVRTC upgrade is a miss (another digest), never a wrong kernel: and an entry that
    names another NVRTC under this process's digest is a bad entry."""
    k = make_key("gelu", dtype="bf16", arch="sm_90")
    old = Engine().get(k).artifact
    monkeypatch.setattr(nvrtc, "nvrtc_identity", lambda: "99.9")
    monkeypatch.setattr(nvrtc, "nvrtc_version", lambda: "99.9")
    other = Engine()
    kernel = other.get(k)
    assert kernel.origin == "compiled" and kernel.artifact.nvrtc_version == "99.9"
    assert other.disk_hits == 0 and ne.cache_info().entries == 2
    forged = old._replace(digest=digest(k))  # an old entry under the new digest
    default_engine().tiers().disk.put(digest(k), encode_entry(str(k), forged))
    third = Engine()
    assert third.get(k).artifact.nvrtc_version == "99.9" and third.compiles == 1


def test_other_schema_never_reads_this_entry(monkeypatch):
    import nvrtc_engine.core.cache as cache_mod

    k = make_key("gelu", dtype="bf16", arch="sm_90")
    Engine().get(k)
    old_digest = digest(k)
    monkeypatch.setattr(cache_mod, "SCHEMA", cache_mod.SCHEMA + 1)
    assert digest(k) != old_digest
    value = Engine().tiers().disk.get(old_digest)
    assert "schema" in check_entry(value, old_digest)  # not read as the next schema
    assert Engine().get(k).origin == "compiled"


def test_each_arch_gets_its_own_entry_from_a_shared_directory():
    archs = ("sm_80", "sm_89", "sm_90", "sm_90a", "sm_100a")
    kernels = [Engine().get(make_key("gelu", dtype="fp8", arch=a)) for a in archs]
    assert len({k.artifact.digest for k in kernels}) == len(archs)
    assert [Engine().get(make_key("gelu", dtype="fp8", arch=a)).origin for a in archs] == [
        "disk"
    ] * len(archs)
    assert all(f"-arch={a}" in k.artifact.options for a, k in zip(archs, kernels, strict=True))


_WHERE = textwrap.dedent("""
    import json, nvrtc_engine as ne
    from nvrtc_engine.core.engine import default_engine
    k = ne.get_kernel("gelu", dtype="fp8", arch="sm_90")
    print(json.dumps({"file": ne.__file__, "origin": k.origin, "digest": k.artifact.digest}))
""")


def test_reinstalling_the_same_version_elsewhere_keeps_the_entries(isolated_cache, tmp_path):
    """Two installs of the same package in different directories share entries: the digest
    holds no install path."""
    runs = []
    for name in ("site-a", "site-b"):
        site = tmp_path / name
        shutil.copytree(ROOT / "nvrtc_engine", site / "nvrtc_engine",
                        ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
        shutil.copytree(ROOT / "templates", site / "nvrtc_engine" / "templates")
        env = {**os.environ, "NVRTC_ENGINE_CACHE_DIR": str(isolated_cache), "PYTHONPATH": str(site)}
        done = subprocess.run([sys.executable, "-c", _WHERE], env=env, cwd=tmp_path, check=True,
                              capture_output=True, text=True, timeout=300)  # fmt: skip
        runs.append(_last_json(done.stdout))
    assert runs[0]["file"].startswith(str(tmp_path / "site-a"))
    assert runs[1]["file"].startswith(str(tmp_path / "site-b"))
    assert runs[0]["origin"] == "compiled" and runs[1]["origin"] == "disk"
    assert runs[0]["digest"] == runs[1]["digest"]
    assert digest(make_key("gelu", dtype="fp8", arch="sm_90")) == runs[0]["digest"]


def test_entry_header_and_hash_survive_round_trip_through_the_store(tmp_path):
    disk = DiskTier(tmp_path / "c", 1 << 30)
    art = _artifact_for(3)
    assert disk.put(art.digest, encode_entry("k3", art))
    value = disk.get(art.digest)
    header, again = check_entry(value, art.digest)
    assert again == art and header["key"] == "k3"
    assert value.startswith(MAGIC) and value.endswith(art.image)


def test_verify_names_each_bad_entry_and_why(tmp_path, capsys, monkeypatch):
    from nvrtc_engine.tools.cli import main

    monkeypatch.setenv("NVRTC_ENGINE_CACHE_DIR", str(tmp_path / "c"))
    config.reset()
    ne.clear_cache(disk=False)
    disk = default_engine().tiers().disk
    values = {}
    for i in range(1, 7):
        _put(disk, 3 * i + 1)
        values[i] = disk.get(_digest(3 * i + 1))
    damaged = {
        2: values[2][:-7],
        3: values[3][:-7] + b"\x00" * 7,
        4: b"garbage",
        5: values[5].replace(b'"schema": 2', b'"schema": 9'),
        6: MAGIC + b"\x02\x00\x00\x00{}",
    }
    for i, value in damaged.items():
        disk.put(_digest(3 * i + 1), value)
    assert main(["cache", "verify"]) == 1
    out = capsys.readouterr().out
    assert sorted(line for line in out.splitlines() if line.startswith("removed")) == [
        f"removed {_digest(10)[:12]}: image SHA-256 mismatch (corrupted)",
        f"removed {_digest(13)[:12]}: not an nvrtc_engine entry (garbage or another format)",
        f"removed {_digest(16)[:12]}: schema 9, this version reads 2",
        f"removed {_digest(19)[:12]}: schema None, this version reads 2",
        f"removed {_digest(7)[:12]}: truncated image (2993 of 3000 bytes)",
    ]
    assert "checked 6 entries: 5 bad (removed)" in out
    assert list(disk.digests()) == [_digest(4)]
