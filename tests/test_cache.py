"""The cache: the digest's inputs, verified entries, the tiers (memory, disk, read-only),
hits across processes, damage recovery, unusable and full directories."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import textwrap
import threading
import zipfile
from pathlib import Path

import pytest

import nvrtc_engine as ne
from nvrtc_engine import CacheWarning, make_key
from nvrtc_engine.core import cache, config, nvrtc, render
from nvrtc_engine.core.cache import SCHEMA, check_entry, digest, encode_entry
from nvrtc_engine.core.engine import Engine, default_engine
from nvrtc_engine.core.kernel import Artifact
from nvrtc_engine.core.tiers import DiskTier, ReadOnlyTier

ROOT = Path(__file__).resolve().parent.parent
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
GELU = make_key("gelu", dtype="fp8", arch="sm_90")


def _env(cache_dir, **extra):
    env = {**os.environ, "NVRTC_ENGINE_CACHE_DIR": str(cache_dir), **extra}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return env


def _last_json(text):
    return json.loads(text.strip().splitlines()[-1])


# -- the digest: from the inputs, every input in it, nothing else ---------------------------


def _headers(version):
    return lambda: nvrtc.CudaIncludeDir(Path("/x"), version)


@pytest.mark.parametrize(
    ("what", "change"),
    [
        ("NVRTC version", lambda mp: mp.setattr(nvrtc, "nvrtc_identity", lambda: "99.1")),
        ("schema", lambda mp: mp.setattr(cache, "SCHEMA", SCHEMA + 1)),
        ("code", lambda mp: mp.setattr(render, "code_fingerprint", lambda: "0" * 64)),
        ("options", lambda mp: mp.setattr(
            nvrtc, "compile_options", lambda arch: nvrtc.CompileOptions(arch=arch, minimal=False))),
        ("symbols", lambda mp: mp.setattr(type(GELU.spec), "symbols", lambda self, k: ("x",))),
    ],
)  # fmt: skip
def test_the_digest_differs_on_every_input(monkeypatch, what, change):
    before = digest(GELU)
    change(monkeypatch)
    assert digest(GELU) != before, what


def test_the_digest_differs_on_every_key_field_and_the_header_version(monkeypatch):
    keys = [
        GELU,
        make_key("gelu", dtype="fp8", arch="sm_90a"),
        make_key("gelu", dtype="fp8", arch="sm_100a"),
        make_key("gelu", dtype="bf16", arch="sm_90"),
        make_key("gelu", dtype="fp8", hidden_size=4096, arch="sm_90"),
        make_key("gelu", dtype="fp8", scaling="mxfp8", arch="sm_90"),
        make_key("layernorm_fwd", dtype="bf16", arch="sm_90"),
        make_key("layernorm_fwd", dtype="bf16", arch="sm_90", zero_centered_gamma=True),
    ]
    assert len({digest(k) for k in keys}) == len(keys)
    soft = make_key("gelu", dtype="fp8", arch="sm_80")  # FP8 in software: cuda_fp8.h
    assert soft.spec.cuda_headers(soft) and not GELU.spec.cuda_headers(GELU)
    monkeypatch.setattr(nvrtc, "find_cuda_include_dir", _headers("13.0"))
    first, plain = digest(soft), digest(GELU)
    monkeypatch.setattr(nvrtc, "find_cuda_include_dir", _headers("13.1"))
    assert digest(soft) != first and digest(GELU) == plain  # only where headers are used


def test_the_digest_is_the_same_for_the_same_kernel_spelled_otherwise():
    same = [GELU, make_key("GELU", dtype="fp8_e4m3", arch=90),
            make_key("gelu", in_dtype="bf16", out_dtype="fp8", scaling="tensor", arch="sm_90"),
            ne.KernelKey.parse(str(GELU))]  # fmt: skip
    assert len({digest(k) for k in same}) == 1 and len(digest(GELU)) == 64


def test_a_norm_configuration_reaches_the_digest_through_the_symbols(monkeypatch):
    """A norm kernel's configuration (a script patching ``norm.norm_config``) is another
    digest: its label ends the symbols, which the digest hashes; other families' are the same."""
    from nvrtc_engine.families.norm import spec as norm

    key = make_key("rmsnorm_fwd", dtype="bf16", hidden_size=4096, arch="sm_90")
    before, gelu = digest(key), digest(GELU)
    monkeypatch.setattr(norm, "norm_config", lambda k: norm.ForwardConfig(4, rows=2))
    assert digest(key) != before and digest(GELU) == gelu


_DIGEST = textwrap.dedent("""
    import json, sys
    import nvrtc_engine as ne
    from nvrtc_engine.core import engine, render
    def refuse(*args, **kwargs):
        raise AssertionError("rendered")
    render.render = engine.render = refuse
    from nvrtc_engine.core.cache import digest
    keys = [ne.make_key("gelu", dtype="fp8", arch="sm_90"),
            ne.make_key("rmsnorm_fwd", dtype="bf16", hidden_size=4096, arch="sm_100a")]
    print(json.dumps({"digests": [digest(k) for k in keys], "modules": sorted(
        m for m in ("jinja2", "cuda.bindings.nvrtc", "cuda.pathfinder") if m in sys.modules)}))
""")


def test_the_digest_renders_nothing_loads_no_nvrtc_and_holds_no_path(tmp_path):
    """Computed in a new process from another copy of the package, with another HOME and
    cache directory: the same digest, without Jinja2 or NVRTC."""
    import shutil

    copy = tmp_path / "site" / "nvrtc_engine"
    shutil.copytree(ROOT / "nvrtc_engine", copy, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "templates", copy / "templates")
    env = {**os.environ, "PYTHONPATH": str(copy.parent), "HOME": str(tmp_path),
           "NVRTC_ENGINE_CACHE_DIR": str(tmp_path / "elsewhere")}  # fmt: skip
    done = subprocess.run([sys.executable, "-c", _DIGEST], env=env, cwd=tmp_path, check=True,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    got = _last_json(done.stdout)
    assert got["modules"] == []
    keys = [GELU, make_key("rmsnorm_fwd", dtype="bf16", hidden_size=4096, arch="sm_100a")]
    assert got["digests"] == [digest(k) for k in keys]


def test_the_nvrtc_wheel_names_the_loaded_nvrtc_version():
    """The cheap NVRTC version (from the wheel's builtins library, no NVRTC loaded) is the
    one nvrtcVersion() gives."""
    code = (
        "from nvrtc_engine.core import nvrtc; import sys; w = nvrtc._wheel_version(); assert "
        "'cuda.bindings.nvrtc' not in sys.modules; print(w, nvrtc.nvrtc_version())"
    )
    done = subprocess.run([sys.executable, "-c", code], env=_env("/nonexistent"), check=True,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    wheel, loaded = done.stdout.split()
    assert wheel == loaded and wheel.count(".") == 1


def test_without_a_wheel_nvrtc_is_asked(monkeypatch):
    monkeypatch.setattr(nvrtc, "_wheel_version", lambda: None)
    nvrtc.nvrtc_version.cache_clear()
    assert nvrtc.nvrtc_identity() == nvrtc.nvrtc_version()


# -- entries ----------------------------------------------------------------------------------


def _artifact(image=b"\x7fELF-image-bytes", digest="d" * 64, arch="sm_90"):
    return Artifact(image=image, kind="cubin", symbols=("k",), digest=digest, nvrtc_version="13.0",
                    options=nvrtc.compile_options(arch).flags(), compile_ms=12.5)  # fmt: skip


def test_artifact_repr_is_short():
    """The repr names the image's size, not its bytes (a cubin runs to hundreds of KB)."""
    text = repr(_artifact(image=b"\0" * 300_000))
    assert "300000 bytes" in text and "symbols=('k',)" in text and len(text) < 200


def test_an_entry_verifies_its_hash_digest_key_arch_and_nvrtc():
    art = _artifact()
    value = encode_entry(str(GELU), art)
    header, again = check_entry(value, art.digest, GELU, "13.0")
    assert again == art and header["schema"] == SCHEMA and header["key"] == str(GELU)
    assert header["signature"] is None  # room for an HMAC where a secret is configured
    flipped = bytearray(value)
    flipped[-3] ^= 0x01
    other_arch = encode_entry(str(GELU), _artifact(arch="sm_100a"))
    bad = {
        "stored under another digest": check_entry(value, "e" * 64),
        "truncated image": check_entry(value[:-1], art.digest),
        "header": check_entry(value[:20], art.digest),
        "SHA-256 mismatch": check_entry(bytes(flipped), art.digest),
        "not an nvrtc_engine entry": check_entry(b"garbage" * 10, art.digest),
        "not an nvrtc_engine entry ": check_entry(12345, art.digest),
        "the entry of": check_entry(value, art.digest, make_key("gelu", arch="sm_90")),
        "compiled for sm_100a": check_entry(other_arch, art.digest, GELU),
        "built by NVRTC 13.0; this is NVRTC 13.1": check_entry(value, art.digest, None, "13.1"),
    }
    for why, got in bad.items():
        assert isinstance(got, str) and why.strip() in got, (why, got)


# -- memory and disk ---------------------------------------------------------------------------


def test_memory_hit_returns_same_object_and_counts():
    k1 = ne.get_kernel("gelu", dtype="fp8", arch="sm_90")
    k2 = ne.get_kernel("gelu", dtype="fp8", arch="sm_90")
    k3 = ne.get_kernel(GELU)
    assert k1 is k2 is k3
    info = ne.cache_info()
    assert (info.compiles, info.misses, info.hits, info.disk_hits) == (1, 1, 2, 0)
    assert info.memory_entries == 1 and info.entries == 1 and info.bytes > 0


def test_disk_hit_in_a_fresh_engine_compiles_nothing():
    first = Engine().get(GELU)
    second_engine = Engine()
    second = second_engine.get(GELU)
    assert second.origin == "disk" and first.origin == "compiled"
    assert second.artifact.image == first.artifact.image
    assert (second_engine.compiles, second_engine.disk_hits) == (0, 1)


_WARM = textwrap.dedent("""
    import json, sys
    import nvrtc_engine as ne
    from nvrtc_engine.core import engine, render
    forbid = sys.argv[1] == "forbid"
    if forbid:  # a warm process renders nothing (where the engine would) and compiles nothing
        def refuse(*args, **kwargs):
            raise AssertionError("rendered in a warm process")
        render.render = engine.render = refuse
    keys, get_kernel = [ne.KernelKey.parse(n) for n in sys.argv[2:]], ne.get_kernel
    before = set(sys.modules)  # the API's import and the keys brought all but kernel classes
    kernels = [get_kernel(k) for k in keys]
    print(json.dumps({**ne.cache_info()._asdict(), "origins": [k.origin for k in kernels],
                      "imported": sorted(set(sys.modules) - before),
                      "loaded": sorted(m for m in ("jinja2", "cuda.bindings.nvrtc", "redis",
                                                   "nvrtc_engine.core.remote", "dataclasses",
                                                   "inspect")
                                       if m in sys.modules)}))
""")

WARM_KEYS = [str(GELU), str(make_key("rmsnorm_fwd", dtype="fp8", hidden_size=4096, arch="sm_90")),
             str(make_key("cast_transpose", dtype="fp8", arch="sm_100a"))]  # fmt: skip


def _warm(mode, env, keys=WARM_KEYS):
    done = subprocess.run([sys.executable, "-c", _WARM, mode, *keys], env=env, check=True,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    return _last_json(done.stdout)


def test_a_warm_process_renders_nothing_and_loads_no_nvrtc(isolated_cache):
    """Nor the remote cache's module, or redis, with no remote cache configured, nor
    dataclasses or inspect (records are NamedTuples: docs/architecture.md); and its lookups
    import nothing but the named families' kernel modules (the API's import brought the
    engine, diskcache and the launcher; parsing the keys, the families' specs)."""
    env = _env(isolated_cache)
    first = _warm("allow", env)
    second = _warm("forbid", env)
    assert first["compiles"] == 3 and first["origins"] == ["compiled"] * 3
    assert (second["compiles"], second["disk_hits"], second["entries"]) == (0, 3, 3)
    assert second["origins"] == ["disk"] * 3 and second["loaded"] == []
    assert "nvrtc_engine.families.norm.kernels" in second["imported"]
    stdlib = {"importlib.machinery"}  # (the code fingerprint finds jinja2's file with it)
    assert all(m.startswith("nvrtc_engine.families.") or m in stdlib for m in second["imported"])


@pytest.mark.parametrize("damage", ["truncate", "garbage", "flip", "other-digest", "other-key"])
def test_a_damaged_entry_is_removed_and_recompiled(damage):
    k = make_key("gelu", dtype="fp16", arch="sm_90")
    good = Engine().get(k).artifact
    engine = Engine()
    disk, key_digest = engine.tiers().disk, digest(k)
    value = disk.get(key_digest)
    if damage == "truncate":
        bad = value[: len(value) // 2]
    elif damage == "garbage":
        bad = os.urandom(len(value))
    elif damage == "flip":
        bad = bytearray(value)
        bad[len(bad) // 2] ^= 0xFF
        bad = bytes(bad)
    elif damage == "other-digest":
        bad = encode_entry(str(k), good._replace(digest="0" * 64))
    else:  # a well-formed entry of another kernel under this digest
        bad = encode_entry(str(GELU), good)
    disk.put(key_digest, bad)
    kernel = engine.get(k)
    assert kernel.origin == "compiled" and engine.compiles == 1
    assert kernel.artifact.image == good.image
    assert Engine().get(k).origin == "disk"  # the bad entry was replaced by a good one


def test_unwritable_cache_dir_degrades_to_memory_with_one_warning(tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the cache directory should be")
    monkeypatch.setenv("NVRTC_ENGINE_CACHE_DIR", str(blocker / "cache"))
    config.reset()
    ne.clear_cache()
    with pytest.warns(CacheWarning, match="memory only") as record:
        k1 = ne.get_kernel("gelu", dtype="fp8", arch="sm_90")
        k2 = ne.get_kernel("gelu", dtype="bf16", arch="sm_90")
    assert len(record) == 1
    assert k1.origin == k2.origin == "compiled"
    info = ne.cache_info()
    assert info.directory is None and info.entries == 0 and info.compiles == 2


def test_a_directory_diskcache_cannot_open_for_writing_names_the_read_only_tier(monkeypatch):
    """A read-only directory or mount, as SQLite reports it (simulated: root writes
    anyway): memory only, one warning pointing at NVRTC_ENGINE_READONLY_CACHE."""
    import sqlite3

    import diskcache

    def read_only(*args, **kwargs):
        raise sqlite3.OperationalError("attempt to write a readonly database")

    monkeypatch.setattr(diskcache, "Cache", read_only)
    ne.clear_cache()
    with pytest.warns(CacheWarning, match="readonly database.*NVRTC_ENGINE_READONLY_CACHE") as w:
        assert ne.get_kernel("gelu", dtype="bf16", arch="sm_90").origin == "compiled"
        assert ne.get_kernel("gelu", dtype="fp16", arch="sm_90").origin == "compiled"
    assert len(w) == 1 and ne.cache_info().directory is None


def as_nobody(scenario):
    """Run ``scenario()`` in a fork()ed child that has become user and group nobody (65534):
    ``(exit code, its JSON-able result)``; an exception is exit code 1 and its repr. What the
    child needs that only root may read (NVRTC, the templates, the package's files) is
    loaded here first."""
    import jinja2  # noqa: F401

    nvrtc.nvrtc_version(), nvrtc.supported_archs(), render.template_files()
    render.code_fingerprint()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            os.close(read)
            os.setgid(65534)
            os.setuid(65534)
            result, code = scenario(), 0
        except BaseException as exc:
            result = repr(exc)
        with os.fdopen(write, "w") as out:
            json.dump(result, out)
        os._exit(code)
    os.close(write)
    with os.fdopen(read) as got:
        text = got.read()
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), json.loads(text)


def _memory_only_as_nobody(env):
    """The scenario of a process whose cache directory it cannot reach (in the child)."""
    import warnings

    for name, value in env.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    config.reset()
    ne.clear_cache(disk=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        info = ne.cache_info()
        kernel = ne.get_kernel("gelu", dtype="bf16", arch="sm_90")
        again = ne.cache_info()
    return {"origin": kernel.origin, "directory": [info.directory, again.directory],
            "warnings": [str(w.message) for w in caught]}  # fmt: skip


@pytest.mark.skipif(not IS_ROOT, reason="needs root to run a process as another user")
@pytest.mark.parametrize("how", ["HOME", "NVRTC_ENGINE_CACHE_DIR"])
def test_a_cache_under_a_directory_this_user_cannot_enter_is_memory_only(tmp_path, how):
    """A service run as another user with HOME still root's, or a root-made 0700 shared
    directory: get_kernel and cache_info() work, from memory, with one warning."""
    private = tmp_path / "root-only"
    private.mkdir(mode=0o700)
    env = {"HOME": str(private), "NVRTC_ENGINE_CACHE_DIR": None, "XDG_CACHE_HOME": None}
    if how == "NVRTC_ENGINE_CACHE_DIR":
        env = {"NVRTC_ENGINE_CACHE_DIR": str(private / "shared" / "cache")}
    code, got = as_nobody(lambda: _memory_only_as_nobody(env))
    assert code == 0, got
    assert got["origin"] == "compiled" and got["directory"] == [None, None]
    assert len(got["warnings"]) == 1 and "memory only" in got["warnings"][0]
    assert "Permission denied" in got["warnings"][0]


def test_disable_disk_cache(monkeypatch, isolated_cache):
    monkeypatch.setenv("NVRTC_ENGINE_DISABLE_DISK_CACHE", "1")
    config.reset()
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
        config.reset()
        ne.clear_cache(disk=False)


def test_memory_only_cache_info_reports_the_configured_size_limit(monkeypatch, isolated_cache):
    monkeypatch.setenv("NVRTC_ENGINE_DISABLE_DISK_CACHE", "1")
    monkeypatch.setenv("NVRTC_ENGINE_CACHE_SIZE_LIMIT", "2G")
    config.reset()
    ne.clear_cache(disk=False)
    info = ne.cache_info()
    assert info.directory is None and info.size_limit == 2 << 30


def test_single_flight_one_compile_for_concurrent_callers(monkeypatch):
    import nvrtc_engine.core.engine as engine_mod

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
    import nvrtc_engine.core.engine as engine_mod

    def fail(*args, **kwargs):
        raise ne.CompileError(key="k", log="error: boom", options=(), nvrtc_version="13.0",
                              header_version=None, source_path=None)  # fmt: skip

    real = engine_mod.compile_source
    monkeypatch.setattr(engine_mod, "compile_source", fail)
    engine = Engine()
    k = make_key("gelu", dtype="fp16", arch="sm_90")
    with pytest.raises(ne.CompileError):
        engine.get(k)
    monkeypatch.setattr(engine_mod, "compile_source", real)
    assert engine.get(k).origin == "compiled"


def test_a_store_evicted_at_once_is_not_reported_as_stored(tmp_path):
    disk = DiskTier(tmp_path / "tiny", 40_000)  # below an empty store plus the entry
    big = encode_entry("big", _artifact(b"\x7fELF" + os.urandom(100_000)))
    with pytest.warns(CacheWarning, match="evicted as soon as it was stored.*size limit") as w:
        assert not disk.put("d" * 64, big)
        assert not disk.put("d" * 64, big)  # warned once per directory
    assert len(w) == 1 and "d" * 64 not in disk and len(disk) == 0
    assert "raise it" in disk.refused
    roomy = DiskTier(tmp_path / "roomy", 1 << 20)  # ... and writes go on elsewhere
    assert roomy.put("d" * 64, big) and "d" * 64 in roomy


def test_cache_info_creates_no_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ne.configure(cache_dir="relative_dir_test")
    ne.clear_cache(disk=False)
    try:
        info = ne.cache_info()
        assert not (tmp_path / "relative_dir_test").exists()
        assert (info.entries, info.bytes) == (0, 0)
        assert info.directory == str(tmp_path / "relative_dir_test")
        assert info.size_limit == config.settings().cache_size_limit
        ne.get_kernel("gelu", dtype="bf16", arch="sm_90")  # the first store creates it
        assert ne.cache_info().entries == 1 and (tmp_path / "relative_dir_test").is_dir()
    finally:
        config.reset()
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
    disk = DiskTier(tmp_path, 1 << 20)
    for i in range(40):  # a database of several pages, so that half of it is a corrupt one
        assert disk.put(f"{i:064x}", encode_entry("k", _artifact(b"\x7fELF" + bytes([i]) * 100)))
    disk.close()
    db = tmp_path / "entries" / "cache.db"
    if damage == "truncated":
        data = db.read_bytes()
        assert len(data) >= 8192
        db.write_bytes(data[: len(data) // 2])
    else:
        db.write_bytes(b"PK\x03\x04 a zip file, not a database" * 100)
    with pytest.warns(CacheWarning, match="database at .* was damaged .*replaced by an empty one"):
        again, why = DiskTier.open(tmp_path, 1 << 20)
    assert again is not None and why == "" and len(again) == 0
    value = encode_entry("k", _artifact())
    assert again.put("d" * 64, value) and again.get("d" * 64) == value
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("entries")] == ["entries"]


def test_a_damaged_database_replaced_meanwhile_is_not_replaced_again(tmp_path, monkeypatch):
    """Two processes finding the same damage: the second, once it holds the lock, finds the
    store the first made and keeps it (nothing removed, no warning)."""
    import sqlite3
    import warnings

    from nvrtc_engine.core import tiers

    calls = []
    real = DiskTier.__init__

    def first_damaged(self, directory, size_limit):
        calls.append(directory)
        if len(calls) == 1:
            raise sqlite3.DatabaseError("database disk image is malformed")
        real(self, directory, size_limit)

    monkeypatch.setattr(DiskTier, "__init__", first_damaged)
    monkeypatch.setattr(tiers, "remove_store", lambda *a: pytest.fail("removed a healthy store"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning: nothing was replaced
        disk, _why = DiskTier.open(tmp_path, 1 << 20)
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


# -- a full disk --------------------------------------------------------------------------------


def test_a_full_disk_is_named_and_kernels_stay_in_memory(monkeypatch):
    import diskcache

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(diskcache.Cache, "set", full)
    with pytest.warns(CacheWarning, match=r"no space left on device \(ENOSPC\).*cache clear") as w:
        a = ne.get_kernel("gelu", dtype="bf16", arch="sm_89")
        b = ne.get_kernel("gelu", dtype="fp16", arch="sm_89")
    assert len(w) == 1 and a.origin == b.origin == "compiled" and ne.cache_info().compiles == 2
    assert default_engine().tiers().disk.refused.startswith("no space left on device")


def test_clear_frees_a_cache_a_full_disk_keeps_from_opening(isolated_cache, monkeypatch):
    import sqlite3

    import diskcache

    ne.get_kernel("gelu", dtype="bf16", arch="sm_90")
    assert ne.cache_info().entries == 1
    real = diskcache.Cache.__init__

    def full(self, *args, **kwargs):
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(diskcache.Cache, "__init__", full)
    config.reset()
    ne.clear_cache(disk=False)
    with pytest.warns(CacheWarning, match="no space left on device"):
        assert ne.cache_info().directory is None
    ne.clear_cache()  # removes the store it cannot open
    assert not (isolated_cache / "entries").exists()
    monkeypatch.setattr(diskcache.Cache, "__init__", real)  # space again
    assert ne.get_kernel("gelu", dtype="bf16", arch="sm_90").origin == "compiled"
    assert ne.cache_info().entries == 1


# -- read-only tiers -----------------------------------------------------------------------------


def _bundle(path, keys):
    from nvrtc_engine.tools.bundle import export_bundle

    ne.prewarm(keys, workers=1, progress=False)
    export_bundle(path)
    ne.clear_cache()
    return path


def _unzipped(bundle, directory):
    with zipfile.ZipFile(bundle) as zf:
        zf.extractall(directory)
    return directory


@pytest.mark.parametrize("form", ["bundle", "directory"])
def test_a_read_only_tier_made_from_a_bundle_serves_a_new_process(tmp_path, form):
    """The cache baked into an image: a new process with an empty disk cache (or none)
    gets every kernel from the read-only tier with 0 compiles, renders nothing, and copies
    the kernels up into its disk cache."""
    bundle = _bundle(tmp_path / "kernels.zip", WARM_KEYS)
    served = bundle if form == "bundle" else _unzipped(bundle, tmp_path / "baked")
    for path in [served, *served.rglob("*")]:
        path.chmod(0o555 if path.is_dir() else 0o444)
    env = _env(tmp_path / "node-cache", NVRTC_ENGINE_READONLY_CACHE=str(served))
    first = _warm("forbid", env)
    assert (first["compiles"], first["disk_hits"], first["origins"]) == (0, 3, ["disk"] * 3)
    assert first["readonly"] == [str(served)] and first["entries"] == 3  # copied up
    no_disk = _warm("forbid", {**env, "NVRTC_ENGINE_DISABLE_DISK_CACHE": "1"})
    assert (no_disk["compiles"], no_disk["directory"], no_disk["loaded"]) == (0, None, [])


def test_a_bad_read_only_entry_is_skipped_with_one_warning(tmp_path, monkeypatch):
    keys = [GELU, make_key("gelu", dtype="bf16", arch="sm_90")]
    baked = _unzipped(_bundle(tmp_path / "k.zip", keys), tmp_path / "baked")
    for entry in (baked / "entries").iterdir():
        entry.write_bytes(entry.read_bytes()[:-9])  # truncated: both bad
    monkeypatch.setenv("NVRTC_ENGINE_READONLY_CACHE", f"{tmp_path / 'missing.zip'}:{baked}")
    config.reset()
    ne.clear_cache(disk=False)  # (the tiers open at the next lookup)
    with pytest.warns(CacheWarning) as w:
        origins = [ne.get_kernel(k).origin for k in keys]
    assert origins == ["compiled", "compiled"]
    messages = sorted(str(x.message) for x in w)
    assert len(messages) == 2
    assert "holds a bad entry" in messages[0] and "truncated image" in messages[0]
    assert "missing.zip cannot be read" in messages[1]
    assert len(list((baked / "entries").iterdir())) == 2  # left as it was


def test_a_read_only_tier_lists_its_digests_and_never_writes(tmp_path):
    bundle = _bundle(tmp_path / "k.zip", [GELU])
    tier = ReadOnlyTier(bundle)
    (stored,) = list(tier.digests())
    assert stored == digest(GELU) and tier.get("0" * 64) is None
    assert not tier.put(stored, b"x") and not tier.writable
    assert isinstance(check_entry(tier.get(stored), stored, GELU), tuple)
    with pytest.raises(zipfile.BadZipFile):
        ReadOnlyTier(Path(__file__))


def test_the_read_only_caches_setting():
    """NVRTC_ENGINE_READONLY_CACHE: paths separated by os.pathsep (empty parts skipped), made
    absolute; configure() takes a path, a separated string or a list, checked alike."""
    got = config.from_environment(
        {"NVRTC_ENGINE_READONLY_CACHE": f"/a.zip{os.pathsep}{os.pathsep}b"}
    )
    assert got.readonly_cache == (Path("/a.zip"), Path("b").absolute())
    assert config.from_environment({}).readonly_cache == ()
    with pytest.raises(ne.SettingsError, match="NVRTC_ENGINE_READONLY_CACHE=.*NUL"):
        config.from_environment({"NVRTC_ENGINE_READONLY_CACHE": "/a\0b"})
    try:
        assert ne.configure(readonly_cache="/x.zip").readonly_cache == (Path("/x.zip"),)
        assert ne.configure(readonly_cache=[Path("/y"), "/z"]).readonly_cache == (
            Path("/y"),
            Path("/z"),
        )
        assert ne.configure(readonly_cache=()).readonly_cache == ()
        with pytest.raises(ne.SettingsTypeError, match="readonly_cache=3"):
            ne.configure(readonly_cache=3)
        with pytest.raises(ne.SettingsError, match="an empty path"):
            ne.configure(readonly_cache=[""])
    finally:
        config.reset()
