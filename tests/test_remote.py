"""The remote cache against a real redis-server (started here on a free port, in a temporary
directory, and stopped): nodes share kernels, compile each key once between them, and keep
working when the server is killed, paused, restarted or full; bad and wrongly signed remote
entries are refused and replaced; a killed compiler's lease expires."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest

import nvrtc_engine as ne
from nvrtc_engine import CacheWarning, make_key
from nvrtc_engine.core import config, errors, nvrtc
from nvrtc_engine.core.cache import SCHEMA, check_entry, digest
from nvrtc_engine.core.engine import default_engine

redis = pytest.importorskip("redis", reason="the redis client (the redis extra) is not installed")
SERVER = shutil.which("redis-server")
pytestmark = pytest.mark.skipif(SERVER is None, reason="redis-server is not installed")

ROOT = Path(__file__).resolve().parent.parent
KEYS = [make_key("gelu", dtype="bf16", hidden_size=h, arch="sm_90") for h in (1024, 2048)]
SECRET = "a-fleet-secret-of-32-characters!"


class Server:
    """A redis-server of this test's own, on a free port, without persistence."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.start()

    def start(self) -> None:
        command = [SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                   "--appendonly", "no", "--dir", str(self.directory)]  # fmt: skip
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while True:
            try:
                self.client().ping()
                return
            except redis.exceptions.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.01)

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=5)

    def entries(self) -> dict[str, bytes]:
        """The entries under the default prefix, by digest."""
        c = self.client()
        prefix = f"nvrtc_engine:{SCHEMA}:"
        names = [n for n in c.scan_iter(prefix + "*") if len(n) == len(prefix) + 64]
        return {n.decode()[len(prefix) :]: c.get(n) for n in names}

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)  # (a paused server cannot die otherwise)
            self.process.kill()
            self.process.wait()


@pytest.fixture
def server(tmp_path, monkeypatch):
    monkeypatch.setattr(errors, "_warned_once", set())  # (a port, so a URL, may come again)
    s = Server(tmp_path / "redis")
    yield s
    s.kill()


def _node(server: Server, cache_dir: Path, **settings: object) -> None:
    """This process as a node: its own disk cache, the shared server, a fresh engine."""
    config.configure(**{"cache_dir": cache_dir, "remote_cache": server.url, **settings})
    ne.clear_cache(disk=False)


def _env(cache_dir: Path, server: Server, **extra: str) -> dict[str, str]:
    env = {**os.environ, "NVRTC_ENGINE_CACHE_DIR": str(cache_dir),
           "NVRTC_ENGINE_REMOTE_CACHE": server.url, **extra}  # fmt: skip
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return env


_NODE = textwrap.dedent("""
    import json, os, sys, time, warnings
    warnings.simplefilter("always")
    import nvrtc_engine as ne
    names = sys.argv[1:]
    while os.environ.get("GO") and not os.path.exists(os.environ["GO"]):
        time.sleep(0.002)
    kernels = [ne.get_kernel(ne.KernelKey.parse(n)) for n in names]
    print(json.dumps({"origins": [k.origin for k in kernels], **ne.cache_info()._asdict()}))
""")


def _run_node(env: dict[str, str], keys=KEYS) -> dict:
    done = subprocess.run([sys.executable, "-c", _NODE, *map(str, keys)], env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


# -- a fleet shares kernels -----------------------------------------------------------------


def test_two_nodes_with_their_own_disks_share_one_redis(server, tmp_path):
    first = _run_node(_env(tmp_path / "a", server))
    assert first["compiles"] == 2 and first["origins"] == ["compiled", "compiled"]
    assert set(server.entries()) == {digest(k) for k in KEYS}
    second = _run_node(_env(tmp_path / "b", server))
    assert second["compiles"] == 0 and second["remote_hits"] == 2
    assert second["origins"] == ["remote", "remote"] and second["entries"] == 2  # copied to disk
    server.client().flushall()
    third = _run_node(_env(tmp_path / "b", server))  # from its own disk now
    assert third["compiles"] == 0 and third["disk_hits"] == 2 and third["remote_hits"] == 0


def test_nodes_missing_a_key_at_once_compile_it_once(server, tmp_path):
    go = tmp_path / "go"
    nodes = [subprocess.Popen([sys.executable, "-c", _NODE, *map(str, KEYS)],
                              env=_env(tmp_path / f"n{i}", server, GO=str(go)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(3)]  # fmt: skip
    time.sleep(1.0)  # (each has imported nvrtc_engine and waits)
    go.touch()
    results = []
    for node in nodes:
        out, err = node.communicate(timeout=120)
        assert node.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert sum(r["compiles"] for r in results) == len(KEYS), results
    assert sum(r["remote_hits"] for r in results) == 2 * len(KEYS)
    assert not any(server.client().scan_iter("*:lease"))  # every lease given back


def test_prewarm_remote_fills_the_server_and_reports_it(server, tmp_path, capsys):
    from nvrtc_engine.tools.cli import main

    names = tmp_path / "v.json"
    names.write_text(json.dumps([str(k) for k in KEYS]))
    _node(server, tmp_path / "a", remote_cache=None)  # compiled without the remote cache
    assert main(["prewarm", str(names), "--workers", "1"]) == 0
    assert server.entries() == {}
    _node(server, tmp_path / "a")
    assert main(["prewarm", str(names), "--workers", "1", "--remote"]) == 0
    assert "2 of 2 kernels written" in capsys.readouterr().out
    assert set(server.entries()) == {digest(k) for k in KEYS}
    assert main(["cache", "info"]) == 0
    assert f"remote:     {server.url}: reachable, 2 entries" in capsys.readouterr().out
    config.configure(remote_cache=None)
    assert main(["prewarm", str(names), "--remote"]) == 2
    assert "NVRTC_ENGINE_REMOTE_CACHE" in capsys.readouterr().err


# -- faults never stop a launch ------------------------------------------------------------


def test_redis_killed_mid_prewarm_and_restarted(server, tmp_path):
    """The server dies while a node prewarms; the node finishes from NVRTC with one warning,
    finds the restarted server again (NVRTC_ENGINE_REMOTE_RETRY) and writes nothing bad."""
    keys = [
        make_key("gelu", dtype="bf16", hidden_size=1024 * h, arch="sm_90") for h in range(1, 15)
    ]
    names = tmp_path / "v.json"
    names.write_text(json.dumps([str(k) for k in keys]))
    env = _env(tmp_path / "a", server, NVRTC_ENGINE_REMOTE_RETRY="0.2")
    command = [
        sys.executable,
        "-m",
        "nvrtc_engine.tools.cli",
        "prewarm",
        str(names),
        "--workers",
        "1",
    ]
    node = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip
    deadline = time.monotonic() + 60
    while len(server.entries()) < 2:  # (each entry is one compile, tens of ms)
        assert node.poll() is None and time.monotonic() < deadline, "the prewarm ended first"
        time.sleep(0.002)
    server.kill()
    time.sleep(0.3)
    server.start()
    out, err = node.communicate(timeout=120)
    assert node.returncode == 0, err
    assert "14 compiled" in out
    assert err.count("warning:") == 1 and "failed" in err, err  # one warning
    for stored, value in server.entries().items():  # nothing half-written or bad
        assert isinstance(check_entry(value, stored), tuple)
    verify = subprocess.run([*command[:3], "cache", "verify"], env=env, capture_output=True,
                            text=True, timeout=60)  # fmt: skip
    assert verify.returncode == 0 and "checked 14 entries: 0 bad" in verify.stdout
    refill = subprocess.run([*command, "--remote"], env=env, capture_output=True, text=True,
                            timeout=120)  # fmt: skip
    assert refill.returncode == 0 and "14 of 14 kernels written" in refill.stdout, refill.stderr
    assert _run_node(_env(tmp_path / "b", server), keys)["compiles"] == 0


def test_a_paused_server_costs_a_bounded_wait_once(server, tmp_path):
    _node(server, tmp_path / "a", remote_timeout=0.05, remote_retry=60)
    remote = default_engine().tiers().remote
    server.process.send_signal(signal.SIGSTOP)
    try:
        with pytest.warns(CacheWarning, match=r"remote cache at .* failed \(TimeoutError"):
            start = time.perf_counter()
            assert remote.get("0" * 64) is None
            first = time.perf_counter() - start
        start = time.perf_counter()
        with remote.lock("0" * 64, 1) as held:  # backed off: no lease, no wait, no warning
            assert remote.get("0" * 64) is None and not held
        again = time.perf_counter() - start
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no second warning
            assert ne.get_kernel(KEYS[0]).origin == "compiled"
    finally:
        server.process.send_signal(signal.SIGCONT)
    assert first < 1.0  # two tries of 50 ms, with room for a busy machine
    assert again < 0.01  # backed off: not asked


def test_an_unreachable_server_is_one_warning_and_compiles(tmp_path):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        url = f"redis://127.0.0.1:{s.getsockname()[1]}/0"
    config.configure(remote_cache=url)
    with pytest.warns(CacheWarning, match="failed"):
        kernels = [ne.get_kernel(k) for k in KEYS]
    assert [k.origin for k in kernels] == ["compiled", "compiled"]
    assert ne.cache_info().compiles == 2


def test_a_full_server_refuses_writes_with_one_warning_and_is_still_read(server, tmp_path):
    _node(server, tmp_path / "a")
    ne.get_kernel(KEYS[0])  # stored there while it had room
    server.client().config_set("maxmemory-policy", "noeviction")
    server.client().config_set("maxmemory", "1")  # below what it uses: every write is OOM
    _node(server, tmp_path / "b")
    with pytest.warns(CacheWarning, match="refuses writes .*OutOfMemoryError") as record:
        kernels = [ne.get_kernel(k) for k in KEYS]
    assert len(record) == 1
    assert [k.origin for k in kernels] == ["remote", "compiled"]
    assert set(server.entries()) == {digest(KEYS[0])}


def test_without_the_redis_package_one_warning(server, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "redis", None)  # import redis raises ImportError
    _node(server, tmp_path / "a")
    with pytest.warns(
        CacheWarning, match=r"redis package is not installed .*nvrtc-engine\[redis\]"
    ):
        assert ne.get_kernel(KEYS[0]).origin == "compiled"
    assert default_engine().tiers().remote is None


# -- bad and wrongly signed entries ----------------------------------------------------------


@pytest.mark.parametrize("damage", ["flip", "truncate", "garbage"])
def test_a_damaged_remote_entry_is_a_miss_and_is_replaced(server, tmp_path, damage):
    _node(server, tmp_path / "a")
    ne.get_kernel(KEYS[0])
    name = f"nvrtc_engine:{SCHEMA}:{digest(KEYS[0])}"
    good = server.client().get(name)
    bad = {"flip": good[:-20] + bytes([good[-20] ^ 1]) + good[-19:], "truncate": good[:-100],
           "garbage": b"not an entry"}[damage]  # fmt: skip
    server.client().set(name, bad)
    _node(server, tmp_path / "b")
    with pytest.warns(CacheWarning, match="holds a bad entry .* it is replaced"):
        assert ne.get_kernel(KEYS[0]).origin == "compiled"
    replaced = server.client().get(name)
    assert isinstance(check_entry(replaced, digest(KEYS[0]), KEYS[0]), tuple)


def test_signed_entries_and_the_wrong_key(server, tmp_path):
    _node(server, tmp_path / "a", cache_key=SECRET)
    ne.get_kernel(KEYS[0])
    name = f"nvrtc_engine:{SCHEMA}:{digest(KEYS[0])}"
    signed = server.client().get(name)
    assert isinstance(check_entry(signed, None, secret=SECRET.encode()), tuple)
    _node(server, tmp_path / "b", cache_key=SECRET)  # same key: used
    assert ne.get_kernel(KEYS[0]).origin == "remote"
    _node(server, tmp_path / "c", cache_key="another-key-of-the-same-length!!")
    with pytest.warns(CacheWarning, match="signed with another key"):
        kernel = ne.get_kernel(KEYS[0])
    assert kernel.origin == "compiled"  # the refused bytes never became a kernel
    _node(server, tmp_path / "d", cache_key=None)  # no key: signatures are not asked for
    assert ne.get_kernel(KEYS[0]).origin == "remote"


def test_an_unsigned_or_altered_entry_is_refused_where_a_key_is_set(server, tmp_path):
    _node(server, tmp_path / "a")  # no key: writes unsigned entries
    ne.get_kernel(KEYS[0])
    _node(server, tmp_path / "b", cache_key=SECRET)
    with pytest.warns(CacheWarning, match="unsigned, and a signing key is configured"):
        assert ne.get_kernel(KEYS[0]).origin == "compiled"  # ...and replaced, signed
    name = f"nvrtc_engine:{SCHEMA}:{digest(KEYS[0])}"
    signed = server.client().get(name)
    altered = signed.replace(b'"-arch=sm_90"', b'"-arch=sm_80"')  # a signed field, same length
    assert altered != signed
    server.client().set(name, altered)
    _node(server, tmp_path / "c", cache_key=SECRET)
    errors._warned_once.clear()  # (another node: a process of its own would warn again)
    with pytest.warns(CacheWarning, match="signed with another key, or altered"):
        assert ne.get_kernel(KEYS[0]).origin == "compiled"


# -- one compile per key: the lease ----------------------------------------------------------

_HOLD = textwrap.dedent("""
    import sys, time
    import nvrtc_engine as ne
    from nvrtc_engine.core.engine import default_engine
    remote = default_engine().tiers().remote
    with remote.lock(sys.argv[1], float(sys.argv[2])) as held:
        print(held, flush=True)
        time.sleep(120)
""")


def test_a_killed_compilers_lease_expires(server, tmp_path):
    d = digest(KEYS[0])
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, d, "1.5"],
                              env=_env(tmp_path / "h", server), stdout=subprocess.PIPE,
                              text=True)  # fmt: skip
    assert holder.stdout.readline().strip() == "True"  # it holds the lease
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    holder.stdout.close()
    assert server.client().get(f"nvrtc_engine:{SCHEMA}:{d}:lease") is not None
    _node(server, tmp_path / "a", remote_wait=60)
    start = time.perf_counter()
    assert ne.get_kernel(KEYS[0]).origin == "compiled"  # took the lease once it expired
    assert time.perf_counter() - start < 10  # the lease's 1.5 s, not the wait's 60 s
    assert server.client().get(f"nvrtc_engine:{SCHEMA}:{d}:lease") is None  # given back
    assert digest(KEYS[0]) in server.entries()


def test_a_node_waits_for_a_live_holder_up_to_the_bound(server, tmp_path):
    d = digest(KEYS[0])
    server.client().set(f"nvrtc_engine:{SCHEMA}:{d}:lease", "another node", px=60_000)
    _node(server, tmp_path / "a", remote_wait=0.3)
    start = time.perf_counter()
    with pytest.warns(CacheWarning, match=r"waited 0\.3 s for another node compiling"):
        assert ne.get_kernel(KEYS[0]).origin == "compiled"
    assert 0.3 <= time.perf_counter() - start < 5
    assert server.client().get(f"nvrtc_engine:{SCHEMA}:{d}:lease") == b"another node"


def test_only_the_owner_gives_a_lease_back(server, tmp_path):
    _node(server, tmp_path / "a")
    remote = default_engine().tiers().remote
    name = f"nvrtc_engine:{SCHEMA}:{'0' * 64}:lease"
    first = remote.lock("0" * 64, 0.2)
    assert first.__enter__()
    token = server.client().get(name)
    waited = pytest.warns(CacheWarning, match=r"waited 0\.01 s for another node compiling")
    with waited, remote.lock("0" * 64, 0.01) as held:
        assert not held  # held by the first
    time.sleep(0.3)  # expired
    second = remote.lock("0" * 64, 10)
    assert second.__enter__() and server.client().get(name) not in (None, token)
    token = server.client().get(name)
    first.__exit__(None, None, None)  # too late: another node's now
    assert server.client().get(name) == token
    second.__exit__(None, None, None)
    assert server.client().get(name) is None


# -- entries of another NVRTC, on request; what `cache info` says ------------------------------


def test_a_remote_entry_of_another_nvrtc_is_used_on_request(server, tmp_path, monkeypatch):
    _node(server, tmp_path / "a")
    built = ne.get_kernel(KEYS[0]).artifact.nvrtc_version  # stored remotely by this NVRTC
    monkeypatch.setattr(nvrtc, "nvrtc_identity", lambda: "13.0")  # a node with another NVRTC
    _node(server, tmp_path / "b", any_nvrtc=True)
    kernel = ne.get_kernel(KEYS[0])  # no GPU here to load it on: unchecked
    assert kernel.origin == "unchecked" and kernel.artifact.nvrtc_version == built
    info = ne.cache_info()
    assert info.compiles == 0 and info.remote_hits == 1 and info.entries == 1
    filed = default_engine().tiers().disk.get(digest(KEYS[0]))  # under this NVRTC's digest
    header = check_entry(filed, digest(KEYS[0]), KEYS[0], "13.0")[0]
    assert (header["adopted_for"], header["checked"]) == ("13.0", False)


def test_cache_info_says_whether_the_server_answers(server, tmp_path, capsys):
    from nvrtc_engine.tools.cli import main

    url = f"redis://me:hunter2@127.0.0.1:{server.port}/0"
    config.configure(remote_cache=url, cache_key=SECRET)
    assert main(["cache", "info"]) == 0
    out = capsys.readouterr().out
    assert f"remote:     redis://me:***@127.0.0.1:{server.port}/0: " in out and "hunter2" not in out
    assert "signing:    on" in out
    server.kill()
    assert main(["cache", "info", "--json"]) == 0
    state = json.loads(capsys.readouterr().out)
    assert state["remote_state"]["reachable"] is False and state["remote"].count("***") == 1
