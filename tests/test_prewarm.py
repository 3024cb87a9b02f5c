"""prewarm(): parallel compiles on compile threads (started once, longest compiles first),
report, memory cache filled (no second disk read), failures that do not stop the rest, thread
count from CPUs and cgroup quota, fork after prewarm."""

from __future__ import annotations

import importlib
import json
import multiprocessing
import os
import subprocess
import sys
import textwrap
import threading
import warnings

import pytest

import nvrtc_engine as ne
from nvrtc_engine import make_key
from nvrtc_engine.core import config
from nvrtc_engine.core import cpus as cpus_mod
from nvrtc_engine.core.engine import default_engine
from nvrtc_engine.tools.prewarm import PrewarmReport, default_workers, prewarm
from nvrtc_engine.tools.variants import VariantListError

prewarm_mod = importlib.import_module(
    "nvrtc_engine.tools.prewarm"
)  # the package exports the function

PAIRS = [("bf16", "bf16"), ("bf16", "fp8_e4m3"), ("fp16", "fp16"), ("fp32", "fp8_e5m2")]


def gelu_keys(arch="sm_90", hidden=(None,)):
    return [
        make_key("gelu", in_dtype=i, out_dtype=o, hidden_size=h, arch=arch)
        for i, o in PAIRS
        for h in hidden
    ]


def test_prewarm_in_threads_fills_memory_and_disk():
    keys = gelu_keys()
    report = prewarm(keys, workers=2, progress=False)
    assert isinstance(report, PrewarmReport) and report.ok
    assert report.compiled == tuple(keys) and report.cached == () and report.workers == 2
    assert report.median_compile_ms > 0 and report.wall_s > 0
    info = ne.cache_info()
    assert (info.compiles, info.misses, info.memory_entries, info.entries) == (4, 4, 4, 4)
    # later lookups are memory hits, whatever form they take
    k = ne.get_kernel("gelu", dtype="fp8", arch="sm_90")
    assert k.key == keys[1] and k.origin == "compiled" and ne.cache_info().compiles == 4
    assert ne.get_kernel(keys[0]) is default_engine().cached(keys[0])
    again = prewarm(keys, workers=2, progress=False)
    assert again.cached == tuple(keys) and again.compiled == () and again.workers == 0
    assert "4 variants: 0 compiled, 4 already cached, 0 failed" in again.summary()


def test_prewarm_leaves_its_kernels_in_memory_no_second_disk_read(monkeypatch):
    """Kernels a prewarm compiled (in its threads) or read from disk are in this process's
    memory cache: the get_kernel calls that follow read no tier and compile nothing."""
    from nvrtc_engine.core.tiers import DiskTier

    keys = gelu_keys("sm_90")
    prewarm(keys[:2], workers=1, progress=False)  # two on disk
    ne.clear_cache(disk=False)
    reads: list[str] = []
    get = DiskTier.get
    monkeypatch.setattr(DiskTier, "get", lambda self, digest: reads.append(digest) or get(
        self, digest))  # fmt: skip
    report = prewarm(keys, workers=2, progress=False)
    assert report.cached == tuple(keys[:2]) and report.compiled == tuple(keys[2:])
    assert report.workers == 2
    read, before = len(reads), ne.cache_info()
    kernels = [ne.get_kernel(k) for k in keys]
    assert ne.get_kernel("gelu", dtype="fp8", arch="sm_90") is kernels[1]
    after = ne.cache_info()
    assert len(reads) == read and after.compiles == before.compiles == 2
    assert after.hits - before.hits == 5 and after.disk_hits == before.disk_hits
    assert [k.origin for k in kernels] == ["disk", "disk", "compiled", "compiled"]


def test_prewarm_without_memory_fills_the_disk_and_makes_no_kernel():
    """memory=False (the command line's): each kernel is compiled and stored, or found and
    verified, and none is kept in memory; a bad entry on disk is compiled again."""
    from nvrtc_engine.core import cache

    keys = gelu_keys("sm_90")[:3]
    report = prewarm(keys, workers=2, progress=False, memory=False)
    assert report.compiled == tuple(keys) and report.workers == 2 and report.ok
    info = ne.cache_info()
    assert (info.compiles, info.memory_entries, info.entries) == (3, 0, 3)
    again = prewarm(keys, workers=2, progress=False, memory=False)
    assert again.cached == tuple(keys) and again.compiled == () and again.workers == 0
    assert (ne.cache_info().compiles, ne.cache_info().memory_entries) == (3, 0)
    default_engine().tiers().disk.put(cache.digest(keys[1]), b"not an entry")
    mended = prewarm(keys, progress=False, memory=False)
    assert mended.compiled == (keys[1],) and mended.cached == (keys[0], keys[2])
    assert ne.get_kernel(keys[1]).origin == "disk"  # stored again, and good


def test_threads_start_once_and_each_builds_many(monkeypatch):
    """Six kernels on two threads: two threads (not the caller's) build them all."""
    built: list[int] = []
    build = prewarm_mod._build
    monkeypatch.setattr(prewarm_mod, "_build", lambda engine, key, memory: built.append(
        threading.get_ident()) or build(engine, key, memory))  # fmt: skip
    keys = gelu_keys("sm_90", hidden=(None, 1024))[:6]
    report = prewarm(keys, workers=2, progress=False)
    assert len(report.compiled) == 6 and report.workers == 2 and len(built) == 6
    assert len(set(built)) == 2 and threading.get_ident() not in built
    assert threading.active_count() == 1  # none left running after the call


def test_longest_compiles_start_first_when_threads_are_fewer_than_kernels(monkeypatch):
    from nvrtc_engine.core.render import render

    keys = [make_key("dswiglu", dtype="bf16", hidden_size=1024, arch="sm_90"),
            make_key("gelu", dtype="bf16", arch="sm_90"),
            make_key("quantize", out_dtype="fp8_e4m3", scaling="mxfp8", layout="both",
                     hidden_size=4096, arch="sm_100a"),
            make_key("rmsnorm_fwd", dtype="bf16", hidden_size=4096, arch="sm_90")]  # fmt: skip
    ordered = prewarm_mod._longest_first(keys)
    sizes = [len(render(k).source) for k in ordered]
    assert sorted(ordered, key=str) == sorted(keys, key=str) and sizes == sorted(sizes)[::-1]
    assert ordered != keys  # the input order is not already the answer
    queued: list[list] = []
    order = prewarm_mod._longest_first
    monkeypatch.setattr(prewarm_mod, "_longest_first", lambda k: queued.append(order(k)) or
                        queued[-1])  # fmt: skip
    assert prewarm(keys, workers=2, progress=False).compiled == tuple(keys)
    assert queued == [ordered]
    prewarm(gelu_keys("sm_89")[:2], workers=2, progress=False)  # one each: no estimate
    assert len(queued) == 1


def test_prewarm_warns_once_for_its_threads_when_sources_cannot_be_dumped(
    tmp_path, monkeypatch, capfd
):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("NVRTC_ENGINE_DUMP_SOURCE", "1")
    monkeypatch.setenv("NVRTC_ENGINE_DEBUG_DIR", str(blocker / "debug"))
    config.reset()
    with pytest.warns(RuntimeWarning, match="cannot write rendered sources to") as record:
        report = prewarm(gelu_keys("sm_87"), workers=2, progress=False)
    assert report.ok and len(report.compiled) == 4 and report.workers == 2
    assert sum("cannot write rendered sources" in str(w.message) for w in record) == 1
    # and not once more per compile thread, nor on stderr past the warnings module
    assert "cannot write rendered sources" not in capfd.readouterr().err


def test_an_empty_list_is_nothing_to_do_an_empty_file_an_error(tmp_path):
    """prewarm([]) returns an empty report (a list built by code may well be empty); a
    variant file without variants is a VariantListError (docs/variants.md)."""
    report = prewarm([])
    assert report.compiled == report.cached == report.failed == () and report.workers == 0
    empty = tmp_path / "none.toml"
    empty.write_text("variants = []\n")
    with pytest.raises(VariantListError, match="non-empty list"):
        prewarm(str(empty))


def test_prewarm_in_a_fresh_engine_loads_from_disk_verified():
    keys = gelu_keys("sm_89")
    prewarm(keys, workers=1, progress=False)
    ne.clear_cache(disk=False)
    report = prewarm(keys, progress=False)
    assert report.cached == tuple(keys) and report.workers == 0
    info = ne.cache_info()
    assert (info.compiles, info.disk_hits, info.memory_entries) == (0, 4, 4)
    assert all(ne.get_kernel(k).origin == "disk" for k in keys)


def test_prewarm_with_disk_cache_disabled_still_fills_memory(monkeypatch):
    monkeypatch.setenv("NVRTC_ENGINE_DISABLE_DISK_CACHE", "1")
    config.reset()
    ne.clear_cache()
    report = prewarm(gelu_keys("sm_100a")[:2], workers=2, progress=False)
    assert len(report.compiled) == 2
    info = ne.cache_info()
    assert info.directory is None and info.memory_entries == 2 and info.compiles == 2


@pytest.fixture
def broken_cuda_headers(tmp_path, monkeypatch):
    """CUDA headers whose cuda_fp8.h fails to compile: sm_80 FP8 keys (which include it)
    fail in NVRTC, every other key compiles."""
    include = tmp_path / "include"
    include.mkdir()
    (include / "cuda_fp8.h").write_text('#error "deliberately broken header"\n')
    (include / "cuda_runtime_api.h").write_text("#define CUDART_VERSION 13000\n")
    monkeypatch.setenv("NVRTC_ENGINE_CUDA_INCLUDE_DIR", str(include))
    config.reset()
    from nvrtc_engine.core import nvrtc

    nvrtc.find_cuda_include_dir.cache_clear()
    yield
    nvrtc.find_cuda_include_dir.cache_clear()


@pytest.mark.parametrize("workers", [1, 2])
def test_a_failing_variant_does_not_stop_the_rest(broken_cuda_headers, workers):
    bad = make_key("gelu", dtype="fp8", arch="sm_80")
    good = gelu_keys("sm_90")[:2]
    report = prewarm([good[0], bad, good[1]], workers=workers, progress=False)
    assert not report.ok and report.compiled == tuple(good)
    (failure,) = report.failed
    assert failure.key == bad and failure.exception == "CompileError"
    assert "error" in failure.error and "deliberately broken header" in failure.error
    assert "FAILED gelu_bf16_e4m3_tensor_rowwise_hany_sm80" in report.summary()
    assert json.loads(json.dumps(report.to_dict()))["failed"][0]["key"] == str(bad)
    assert ne.cache_info().memory_entries == 2


def test_bad_variant_list_raises_before_compiling(tmp_path):
    path = tmp_path / "v.toml"
    path.write_text("[[variants]]\nop = 'gelu'\narch = 'sm_90'\n[[variants]]\nop = 'gelu'\n"
                    "arch = 'sm_90'\nlayout = 'diagonal'\n")  # fmt: skip
    with pytest.raises(VariantListError, match="entry 1: .*layout='diagonal'"):
        prewarm(path, progress=False)
    assert ne.cache_info().compiles == 0
    with pytest.raises(ValueError, match="workers"):
        prewarm(gelu_keys(), workers=0)
    with pytest.raises(ne.ArgumentError, match="workers: must be 1 to 1024 .*got 2000"):
        prewarm(gelu_keys(), workers=2000)  # the command line's and NVRTC_ENGINE_WORKERS' cap


def test_bad_arguments_are_the_librarys_typed_errors(tmp_path):
    """Each bad argument is an NvrtcEngineError naming it, and still the builtin a caller
    would catch: no raw "'NoneType' object is not iterable" or UnicodeDecodeError."""
    import numpy as np

    one = [{"op": "gelu", "dtype": "bf16", "arch": "sm_90"}]
    for variants in (None, 3, b"ok.json", one[0]):
        with pytest.raises(ne.ArgumentTypeError, match="variants: expected a variant file"):
            prewarm(variants, progress=False)
    with pytest.raises(ne.ArgumentTypeError, match=r"wrap a single variant in a list, \[\{"):
        prewarm(one[0], progress=False)
    with pytest.raises(ne.VariantTypeError, match=r"arch=90\.0 is not an arch"):
        prewarm(one, arch=90.0, progress=False)
    with pytest.raises(ne.VariantError, match=r"arch=\[\] is empty") as info:
        prewarm(one, arch=[], progress=False)
    assert isinstance(info.value, ValueError) and not isinstance(info.value, TypeError)
    with pytest.raises(VariantListError, match=r"entry 0: hidden_size=\[\] is an empty list"):
        prewarm([{**one[0], "hidden_size": []}], progress=False)
    for workers in (0, -1, np.int64(0)):
        with pytest.raises(ne.ArgumentError, match="workers: must be 1 to 1024") as info:
            prewarm(one, workers=workers)
        assert isinstance(info.value, ValueError)
    for workers in (True, 2.0, "2"):
        with pytest.raises(ne.ArgumentTypeError, match="workers: must be an int") as info:
            prewarm(one, workers=workers)
        assert isinstance(info.value, TypeError)
    not_utf8 = tmp_path / "b.toml"
    not_utf8.write_bytes(b"\xff[[variants]]\n")
    with pytest.raises(VariantListError, match=f"^{not_utf8}: not UTF-8 text"):
        prewarm(not_utf8, progress=False)
    assert ne.cache_info().compiles == 0
    # numpy's ints are ints: one kernel to compile, so it compiles here
    report = prewarm(one, workers=np.int64(2), progress=False)
    assert report.ok and len(report.compiled) == 1 and report.workers == 0


def test_default_workers_honours_cpus_and_the_variable(monkeypatch):
    monkeypatch.setattr(prewarm_mod, "available_cpus", lambda: 3)
    assert [default_workers(n) for n in (0, 1, 2, 3, 50)] == [0, 1, 2, 3, 3]
    monkeypatch.setenv("NVRTC_ENGINE_WORKERS", "5")
    config.reset()
    assert default_workers(50) == 5 and default_workers(4) == 4


def _cgroup_tree(tmp_path, files: dict[str, str], proc: str):
    for rel, text in files.items():
        path = tmp_path / "sys" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (tmp_path / "cgroup").write_text(proc)
    return cpus_mod.cgroup_cpu_limit(tmp_path / "cgroup", tmp_path / "sys")


def test_cgroup_v2_quota_smallest_on_the_path(tmp_path):
    proc = "0::/kubepods/pod1/ctr\n"
    assert _cgroup_tree(tmp_path, {"kubepods/pod1/ctr/cpu.max": "150000 100000\n",
                                   "kubepods/cpu.max": "400000 100000\n",
                                   "cpu.max": "max 100000\n"}, proc) == 1.5  # fmt: skip
    assert _cgroup_tree(tmp_path, {"kubepods/pod1/ctr/cpu.max": "max 100000\n",
                                   "kubepods/cpu.max": "max 100000\n"}, proc) is None  # fmt: skip


def test_cgroup_v2_namespaced_container_reads_the_mount_root(tmp_path):
    assert _cgroup_tree(tmp_path, {"cpu.max": "200000 100000\n"}, "0::/\n") == 2.0


def test_cgroup_v1_quota_and_unlimited(tmp_path):
    proc = "4:memory:/x\n3:cpu,cpuacct:/docker/abc\n0::/\n"
    files = {"cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "250000\n",
             "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n"}  # fmt: skip
    assert _cgroup_tree(tmp_path, files, proc) == 2.5
    files["cpu,cpuacct/docker/abc/cpu.cfs_quota_us"] = "-1\n"
    assert _cgroup_tree(tmp_path, files, proc) is None
    assert cpus_mod.cgroup_cpu_limit(tmp_path / "no-such-file") is None


def test_available_cpus_floors_the_quota_at_one(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    monkeypatch.setattr(cpus_mod, "cgroup_cpu_limit", lambda: 2.7)
    assert cpus_mod.available_cpus() == 2
    monkeypatch.setattr(cpus_mod, "cgroup_cpu_limit", lambda: 0.5)
    assert cpus_mod.available_cpus() == 1
    monkeypatch.setattr(cpus_mod, "cgroup_cpu_limit", lambda: None)
    assert cpus_mod.available_cpus() == 4


class _Bar:
    made: list[_Bar] = []

    def __init__(self, **kwargs):
        self.kwargs, self.n, self.closed = kwargs, 0, False
        _Bar.made.append(self)

    def update(self, n):
        self.n += n

    def close(self):
        self.closed = True


def test_progress_bar_only_on_a_terminal(monkeypatch):
    import tqdm

    monkeypatch.setattr(tqdm, "tqdm", _Bar)
    _Bar.made.clear()
    prewarm(gelu_keys("sm_90")[:2], workers=1, progress=True)  # stderr is not a TTY here
    assert _Bar.made == []
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    prewarm(gelu_keys("sm_89")[:2], workers=1, progress=False)
    assert _Bar.made == []
    prewarm(gelu_keys("sm_100a")[:2], workers=1, progress=True)
    (bar,) = _Bar.made
    assert bar.n == 2 and bar.closed and bar.kwargs["total"] == 2


def _child_get(args):
    name, new = args
    engine = default_engine()
    before = engine.compiles
    kernel = ne.get_kernel(ne.KernelKey.parse(name))
    fresh = ne.get_kernel(ne.KernelKey.parse(new))
    return kernel.origin, fresh.origin, engine.compiles - before, os.getpid()


def _open_files_under(directory) -> list[str]:
    names = (os.path.join("/proc/self/fd", fd) for fd in os.listdir("/proc/self/fd"))
    return [t for t in (os.path.realpath(n) for n in names) if t.startswith(str(directory))]


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="lists open files through /proc")
def test_prewarm_threads_leave_no_connection_to_cross_a_fork(isolated_cache):
    # SQLite connections must not be open across fork(); those of ended threads wait for the
    # garbage collector, so each compile thread closes its own; fork closes the caller's
    assert prewarm(gelu_keys("sm_90"), workers=2, progress=False).ok
    from nvrtc_engine.core import engine as engine_mod

    engine_mod._before_fork()
    assert _open_files_under(isolated_cache) == []


def test_fork_after_prewarm_children_get_and_compile(isolated_cache):
    keys = gelu_keys("sm_90")
    assert prewarm(keys, workers=2, progress=False).ok
    new = [make_key("gelu", dtype="bf16", hidden_size=h, arch="sm_90") for h in (1024, 2048)]
    ctx = multiprocessing.get_context("fork")
    with warnings.catch_warnings():
        # Python 3.12+ warns when forking a process with other OS threads (BLAS, CUDA)
        warnings.simplefilter("ignore", DeprecationWarning)
        pool = ctx.Pool(2)
    with pool:
        args = [(str(keys[0]), str(new[0])), (str(keys[1]), str(new[1]))]
        results = pool.map_async(_child_get, args).get(timeout=300)
    assert [r[0] for r in results] == ["compiled", "compiled"]  # inherited from memory
    assert [r[1] for r in results] == ["compiled", "compiled"] and [r[2] for r in results] == [1, 1]
    assert all(r[3] != os.getpid() for r in results)
    # the children stored their kernels in the shared disk cache; the parent's cache still works
    found = [default_engine().cached(k) for k in new]
    assert [k and k.origin for k in found] == ["disk", "disk"], (ne.cache_info(), results)
    assert ne.cache_info().entries == 6


def test_fork_while_another_thread_holds_the_engine_lock():
    engine = default_engine()
    prewarm(gelu_keys("sm_90")[:1], workers=1, progress=False)
    held, release = threading.Event(), threading.Event()

    def hold():
        with engine._lock:
            held.set()
            release.wait(10)

    thread = threading.Thread(target=hold)
    thread.start()
    held.wait(10)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads: 3.12+
            pid = os.fork()
        if pid == 0:  # child: the lock was re-created, the cache works
            code = 1
            try:
                k = ne.get_kernel("gelu", dtype="fp16", arch="sm_90", hidden_size=512)
                code = 0 if k.origin == "compiled" else 1
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        release.set()
        thread.join()


_UNGUARDED_SCRIPT = textwrap.dedent("""
    # a training script that prewarms at top level, without `if __name__ == "__main__":`
    import sys
    with open(sys.argv[1], "a") as runs:
        runs.write("ran\\n")
    import nvrtc_engine as ne
    from nvrtc_engine.tools.prewarm import prewarm
    keys = [ne.make_key("gelu", dtype=d, arch="sm_90") for d in ("bf16", "fp16", "fp32")]
    report = prewarm(keys, workers=2, progress=False)
    print(report.workers, len(report.compiled))
""")


def test_prewarm_does_not_run_the_calling_script_again(tmp_path, isolated_cache):
    script = tmp_path / "train.py"
    script.write_text(_UNGUARDED_SCRIPT)
    runs = tmp_path / "runs.txt"
    env = {**os.environ, "NVRTC_ENGINE_CACHE_DIR": str(isolated_cache)}
    done = subprocess.run([sys.executable, str(script), str(runs)], env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["2", "3"]
    assert runs.read_text() == "ran\n"  # the workers did not execute train.py


def test_the_summary_names_the_archs_built_and_where_it_compiled():
    hopper = ne.make_key("gelu", dtype="bf16", arch="sm_90")
    blackwell = ne.make_key("gelu", dtype="bf16", arch="sm_100a")
    cold = PrewarmReport((blackwell,), (hopper,), (), 1.25, 45.6, 2).summary()
    assert cold.endswith("in 1.25 s (2 threads; median compile 45.6 ms; sm_90, sm_100a)")
    warm = PrewarmReport((), (hopper,), (), 0.05, None, 0).summary()
    assert warm.endswith("0 failed in 0.05 s (sm_90)")
    assert PrewarmReport((), (), (), 0.0, None, 0).summary().endswith("failed in 0.00 s")
