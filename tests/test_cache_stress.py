"""The disk cache under stress: processes racing on cold keys, writers killed mid-store,
damaged and unreadable entries, read-only and missing directories, the size cap, stale
locks, and what the digest does and does not depend on."""

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

import nvrtc_engine as ne
from nvrtc_engine import CacheWarning, config, make_key
from nvrtc_engine.cache import MAGIC, DiskCache, decode_entry
from nvrtc_engine.engine import Engine, default_engine
from nvrtc_engine.kernel import Artifact

ROOT = Path(__file__).resolve().parent.parent
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def _env(cache_dir, **extra):
    env = {**os.environ, "NVRTC_ENGINE_CACHE_DIR": str(cache_dir), **extra}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return env


def _last_json(text):
    return json.loads(text.strip().splitlines()[-1])


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
    from nvrtc_engine.prewarm import prewarm
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


def test_eight_processes_racing_on_twenty_cold_keys_compile_each_once(isolated_cache, tmp_path):
    go = tmp_path / "go"
    procs = []
    for i in range(8):  # six get_kernel loops and two prewarms (with two workers each)
        args = ["prewarm" if i % 4 == 3 else "get", str(i), str(go), json.dumps(RACE_KEYS)]
        procs.append(subprocess.Popen([sys.executable, "-c", _RACER, *args],
                                      env=_env(isolated_cache), stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))  # fmt: skip
    time.sleep(0.5)
    go.touch()
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        results.append(_last_json(out)["compiles"])
    assert sum(results) == len(RACE_KEYS), results
    disk = DiskCache.open(isolated_cache, 1 << 30)
    assert len(disk) == len(RACE_KEYS)
    assert disk.verify(fix=False).bad == ()
    assert sorted(h["key"] for _, h, _ in disk.entries()) == sorted(RACE_KEYS)


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
    from test_cache_stress import _artifact_for
    from nvrtc_engine.cache import DiskCache
    disk = DiskCache.open(Path(sys.argv[1]), 1 << 30)
    print("ready", flush=True)
    for n in itertools.count():
        i = n % 24
        disk.put(f"k{i}", _artifact_for(i))
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
    disk = DiskCache.open(directory, 1 << 30)
    assert disk is not None
    found = 0
    for digest in list(disk.digests()):
        artifact = disk.get(digest)
        if artifact is not None:
            i = int(digest, 16)
            assert artifact.image == _image(i) and artifact.symbols == (f"k{i}",)
            found += 1
    assert found > 0
    report = disk.verify(fix=True)  # value files orphaned by killed writers are removed
    assert report.bad == ()
    assert all(p.startswith(("unknown file", "empty directory")) for p in report.problems)
    assert disk.verify(fix=False).problems == ()
    assert disk.put("k99", _artifact_for(99)) and disk.get(_digest(99)).image == _image(99)


# -- damaged, unreadable and foreign entries --------------------------------------------------


def _engine_with_file_values():
    engine = Engine()
    engine.disk()._store.reset("disk_min_file_size", 0)  # every value in its own file
    return engine


def test_unreadable_value_file_is_a_miss_that_recompiles(monkeypatch):
    """What a non-root reader meets for a chmod 000 file or another user's 0600 file,
    simulated so that it also runs as root (which reads any file)."""
    import diskcache.core

    import nvrtc_engine.index as index_mod

    k = make_key("gelu", dtype="fp16", arch="sm_90")
    first = _engine_with_file_values().get(k)
    real_open = open

    def deny(path, *args, **kwargs):
        if str(path).endswith(".val") and "r" in (args[0] if args else kwargs.get("mode", "r")):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(diskcache.core, "open", deny, raising=False)
    monkeypatch.setattr(index_mod, "open", deny, raising=False)  # the key index reads it too
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
    store = engine.disk()._store

    def broken(*args, **kwargs):
        raise sqlite3.DatabaseError("database disk image is malformed")

    monkeypatch.setattr(store, "get", broken)
    engine.disk().index.clear()  # else the key index reads the entry without SQLite
    assert engine.get(k).origin == "compiled"


@pytest.mark.skipif(IS_ROOT, reason="root reads chmod 000 files; the simulated test covers it")
def test_chmod_000_entry_is_a_miss(isolated_cache):
    k = make_key("gelu", dtype="fp32", arch="sm_90")
    _engine_with_file_values().get(k)
    (value,) = list(isolated_cache.rglob("*.val"))
    value.chmod(0)
    engine = Engine()
    assert engine.get(k).origin == "compiled" and engine.compiles == 1


def _runs_as_nobody() -> bool:
    try:
        done = subprocess.run([sys.executable, "-c", "pass"], preexec_fn=_become_nobody,
                              capture_output=True, timeout=60)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def _become_nobody():
    os.setgid(65534)
    os.setuid(65534)


_FOREIGN = textwrap.dedent("""
    import json, nvrtc_engine as ne
    k = ne.get_kernel("gelu", dtype="fp8", arch="sm_90")
    print(json.dumps({"origin": k.origin, "compiles": ne.cache_info().compiles}))
""")


@pytest.mark.skipif(not IS_ROOT, reason="needs root to run a process as another user")
def test_entry_owned_by_another_user_is_a_miss_for_this_one():
    """A shared cache directory where root wrote an entry file readable only by root:
    user nobody recompiles and stores its own entry, which root then reads."""
    if not _runs_as_nobody():
        pytest.skip("this Python cannot run as user nobody here (interpreter not readable)")
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
        for value in cache.rglob("*.val"):
            value.chmod(0o600)  # root's own, unreadable to others
        env = _env(cache, HOME=str(shared), NVRTC_ENGINE_DEBUG_DIR=str(shared / "debug"))
        runs = []
        for _ in range(2):
            done = subprocess.run([sys.executable, "-c", _FOREIGN], env=env, check=True,
                                  preexec_fn=_become_nobody, capture_output=True, text=True,
                                  timeout=300)  # fmt: skip
            runs.append(_last_json(done.stdout))
        assert runs[0] == {"origin": "compiled", "compiles": 1}
        assert runs[1] == {"origin": "disk", "compiles": 0}
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


def test_read_only_database_is_memory_only(monkeypatch):
    """A read-only mount or directory as SQLite reports it (simulated: root writes anyway)."""
    import sqlite3

    import diskcache

    def read_only(*args, **kwargs):
        raise sqlite3.OperationalError("attempt to write a readonly database")

    monkeypatch.setattr(diskcache, "Cache", read_only)
    ne.clear_cache()
    _two_kernels_with_one_warning("readonly database")


def test_writes_failing_later_keep_kernels_in_memory_with_one_warning(monkeypatch):
    engine = default_engine()
    store = engine.disk()._store

    def full(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(store, "set", full)
    with pytest.warns(CacheWarning, match="write failed") as record:
        ne.get_kernel("gelu", dtype="bf16", arch="sm_89")
        ne.get_kernel("gelu", dtype="fp16", arch="sm_89")
    assert len(record) == 1 and ne.cache_info().compiles == 2


# -- size cap ---------------------------------------------------------------------------------


def test_size_cap_evicts_least_recently_used(tmp_path):
    limit = 400_000
    disk = DiskCache.open(tmp_path / "capped", limit)
    assert disk.size_limit == limit
    store = disk._store
    for i in range(1, 31):  # 3 KB entries (inline in SQLite)
        assert disk.put(f"k{i}", _artifact_for(3 * i + 1))
    time.sleep(0.01)
    assert disk.get(_digest(4)) is not None  # k1, stored first, is now the most recently used
    count = len(disk)
    for i in range(31, 1000):  # until the cap makes the first eviction
        disk.put(f"k{i}", _artifact_for(3 * i + 1))
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
    from nvrtc_engine.cache import DiskCache
    disk = DiskCache.open(Path(sys.argv[1]), 1 << 30)
    lock = disk.lock(sys.argv[2], 10)
    assert lock.held
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
    digest = default_engine().artifact_digest(k)[3]
    holder = _hold_lock(isolated_cache, digest)
    holder.kill()
    holder.communicate(timeout=60)
    # no CacheWarning (warnings are errors here): the lock was taken, not waited out
    assert ne.get_kernel(k).origin == "compiled"


def test_live_holder_past_the_timeout_is_passed_over(isolated_cache, monkeypatch):
    monkeypatch.setenv("NVRTC_ENGINE_LOCK_TIMEOUT", "0.3")
    config.reset()
    k = make_key("gelu", dtype="fp8", arch="sm_100a")
    holder = _hold_lock(isolated_cache, default_engine().artifact_digest(k)[3])
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
    import nvrtc_engine.engine as engine_mod

    k = make_key("gelu", dtype="bf16", arch="sm_90")
    Engine().get(k)
    monkeypatch.setattr(engine_mod, "_nvrtc_version", lambda: "99.9")
    other = Engine()
    kernel = other.get(k)
    assert kernel.origin == "compiled" and kernel.artifact.nvrtc_version == "99.9"
    assert other.disk_hits == 0 and ne.cache_info().entries == 2


def test_other_schema_never_reads_this_entry(monkeypatch):
    import nvrtc_engine.cache as cache_mod

    k = make_key("gelu", dtype="bf16", arch="sm_90")
    Engine().get(k)
    old_digest = default_engine().artifact_digest(k)[3]
    monkeypatch.setattr(cache_mod, "SCHEMA", cache_mod.SCHEMA + 1)
    assert default_engine().artifact_digest(k)[3] != old_digest
    value = Engine().disk().raw(old_digest)
    assert decode_entry(value, old_digest) is None  # a schema-1 entry is not read as schema 2
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
    from nvrtc_engine.engine import default_engine
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
    assert (
        default_engine().artifact_digest(make_key("gelu", dtype="fp8", arch="sm_90"))[3]
        == (runs[0]["digest"])
    )


def test_entry_header_and_hash_survive_round_trip_through_the_store(tmp_path):
    disk = DiskCache.open(tmp_path / "c", 1 << 30)
    art = _artifact_for(3)
    assert disk.put("k3", art)
    value = disk.raw(art.digest)
    header, again = decode_entry(value, art.digest)
    assert again == art and header["key"] == "k3"
    assert value.startswith(MAGIC) and value.endswith(art.image)
    assert disk.get(art.digest) == art


def test_verify_names_each_bad_entry_and_why(tmp_path):
    import nvrtc_engine.cache as cache_mod

    disk = DiskCache.open(tmp_path / "c", 1 << 30)
    values = {}
    for i in range(1, 7):
        art = _artifact_for(3 * i + 1)
        disk.put(f"k{i}", art)
        values[i] = disk.raw(art.digest)
    damaged = {
        2: values[2][:-7],
        3: values[3][:-7] + b"\x00" * 7,
        4: b"garbage",
        5: values[5].replace(b'"schema": 1', b'"schema": 9'),
        6: cache_mod.MAGIC + b"\x02\x00\x00\x00{}",
    }
    for i, value in damaged.items():
        disk._store.set(_digest(3 * i + 1), value)
    report = disk.verify(fix=True)
    assert report.checked == 6
    why = {b.digest: (b.key, b.reason) for b in report.bad}
    assert why == {
        _digest(7): ("k2", "truncated image (2993 of 3000 bytes)"),
        _digest(10): ("k3", "image SHA-256 mismatch (corrupted)"),
        _digest(13): ("?", "not an nvrtc_engine entry (garbage or another format)"),
        _digest(16): ("k5", "schema 9, this version reads 1"),
        _digest(19): ("?", "schema None, this version reads 1"),
    }
    assert list(disk.digests()) == [_digest(4)]
