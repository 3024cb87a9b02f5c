"""The compiled launcher (nvrtc_engine/launcher.py, nvrtc_engine/_launch.c): what its launch
hands the driver, its error codes and argument checks (in a subprocess, against ctypes
stand-ins for the driver functions), and how it is built, found, rebuilt and given up on.

The whole launch path through it, against the stub libcuda, is test_launch_stub.py's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import nvrtc_engine as ne
from nvrtc_engine import config, launcher
from nvrtc_engine.errors import LauncherError

needs_cc = pytest.mark.skipif(
    launcher.compiler() is None or not launcher._python_includes(),
    reason="no C compiler or no Python headers",
)

DRIVER_STANDIN = textwrap.dedent(
    """
    import ctypes, sys, threading
    from pathlib import Path
    from nvrtc_engine import launcher

    module = launcher._load(launcher.build(Path(sys.argv[1])))
    try:
        module.launch(1, 1, 1, 0, 0, 0, 0)
    except RuntimeError as exc:
        assert "before bind" in str(exc)
    else:
        raise AssertionError("launch before bind")

    calls = []
    state = {"context": 0, "launch": 0, "get": 0, "set": 0}
    LAUNCH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, *[ctypes.c_uint] * 7,
                              ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
    GET = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_void_p))
    SET = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)

    def launch(f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra):
        calls.append(("launch", f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra,
                      state["context"]))
        return state["launch"]

    def get(out):
        calls.append(("get",))
        out[0] = state["context"]
        return state["get"]

    def set_(ctx):
        calls.append(("set", ctx))
        if state["set"]:
            return state["set"]
        state["context"] = ctx
        return 0

    fns = (LAUNCH(launch), GET(get), SET(set_))
    addr = [ctypes.cast(f, ctypes.c_void_p).value for f in fns]
    for bad in ((addr[0], 0, addr[2]), (addr[0], addr[1])):
        try:
            module.bind(*bad)
        except (ValueError, TypeError):
            pass
        else:
            raise AssertionError(f"bind{bad}")
    module.bind(*addr)

    CTX, F, S, P = 0xC0DE0000, 0x1234, 0x5000, 0x7F00AB00
    # the context is made current, then the launch; a second launch finds it current
    assert module.launch(F, 132, 256, 4096, S, P, CTX) == 0
    assert calls == [("get",), ("set", CTX), ("launch", F, 132, 1, 1, 256, 1, 1, 4096, S, P,
                                               None, CTX)], calls
    calls.clear()
    assert module.launch(F, 2**32 - 1, 1024, 0, 0, P, CTX) == 0
    assert calls == [("get",), ("launch", F, 2**32 - 1, 1, 1, 1024, 1, 1, 0, None, P, None,
                                CTX)], calls
    calls.clear()
    # context 0: leave the context alone
    assert module.launch(F, 1, 32, 0, S, P, 0) == 0 and [c[0] for c in calls] == ["launch"]
    calls.clear()
    # errors: the launch's CUresult; minus the context query's or switch's, nothing launched
    state["launch"] = 700
    assert module.launch(F, 1, 32, 0, S, P, CTX) == 700
    state["launch"], state["get"] = 0, 201
    calls.clear()
    assert module.launch(F, 1, 32, 0, S, P, CTX) == -201 and calls == [("get",)]
    state["get"], state["set"], state["context"] = 0, 709, 0
    calls.clear()
    assert module.launch(F, 1, 32, 0, S, P, CTX) == -709 and [c[0] for c in calls] == ["get",
                                                                                       "set"]
    state["set"] = 0
    # argument checks, before any driver call
    calls.clear()
    bad = [((F, 1, 32, 0, S, P), TypeError), ((F, -1, 32, 0, S, P, 0), OverflowError),
           ((F, 2**32, 32, 0, S, P, 0), OverflowError), ((F, 1, 32, 0, "s", P, 0), TypeError),
           ((F, 1.5, 32, 0, S, P, 0), TypeError), ((F, 1, 32, 0, S, P, 0, -1), OverflowError),
           ((F, 1, 32, 0, S, P, 0, 1, 2), TypeError)]
    for args, error in bad:
        try:
            module.launch(*args)
        except error:
            pass
        else:
            raise AssertionError(f"launch{args}")
    assert calls == []
    # the GIL is released around the driver calls: another thread runs the driver function
    done = []
    threads = [threading.Thread(target=lambda: done.append(module.launch(F, 1, 32, 0, S, P, 0)))
               for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert done == [0] * 8 and len(calls) == 8
    # flags 1 (a dependent launch) without cuLaunchKernelEx bound: an ordinary launch
    calls.clear()
    assert module.launch(F, 7, 64, 0, S, P, 0, 1) == 0 and calls[0][:3] == ("launch", F, 7)

    # with cuLaunchKernelEx: a CUlaunchConfig with the programmatic serialization attribute
    class Attr(ctypes.Structure):
        _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4),
                    ("value", ctypes.c_int), ("rest", ctypes.c_char * 60)]

    class Config(ctypes.Structure):
        _fields_ = [("dims", ctypes.c_uint * 7), ("stream", ctypes.c_void_p),
                    ("attrs", ctypes.POINTER(Attr)), ("num_attrs", ctypes.c_uint)]

    EX = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(Config), ctypes.c_void_p,
                          ctypes.c_void_p, ctypes.c_void_p)

    def launch_ex(config, f, params, extra):
        c = config.contents
        attrs = [(c.attrs[i].id, c.attrs[i].value) for i in range(c.num_attrs)]
        calls.append(("ex", f, tuple(c.dims), c.stream, attrs, params, extra))
        return state["launch"]

    ex = EX(launch_ex)
    module.bind(*addr, ctypes.cast(ex, ctypes.c_void_p).value)
    calls.clear()
    assert module.launch(F, 132, 256, 4096, S, P, 0, 1) == 0
    assert calls == [("ex", F, (132, 1, 1, 256, 1, 1, 4096), S, [(6, 1)], P, None)], calls
    calls.clear()
    assert module.launch(F, 132, 256, 4096, S, P, 0, 0) == 0 and calls[0][0] == "launch"
    state["launch"] = 719
    assert module.launch(F, 1, 32, 0, S, P, 0, 1) == 719
    state["launch"] = 0
    print("OK")
    """
)


@needs_cc
def test_compiled_launch_hands_the_driver_what_it_was_given(tmp_path):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(__file__).resolve().parent.parent), *filter(None, [env.get("PYTHONPATH")])]
    )
    done = subprocess.run(
        [sys.executable, "-c", DRIVER_STANDIN, str(tmp_path / "build")], env=env,
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == "OK"


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    """Launcher state forgotten before and after; the cache in tmp_path."""
    monkeypatch.setenv("NVRTC_ENGINE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("NVRTC_ENGINE_LAUNCHER", raising=False)
    config.reset()
    launcher.reset()
    yield tmp_path
    launcher.reset()
    config.reset()


def failing_compiler(tmp_path: Path, body: str = "echo 'fatal error: something is wrong' >&2\n"
                     "exit 3") -> str:  # fmt: skip
    """A C compiler that fails (``body``: its shell script), counting its runs in
    ``tmp_path/runs``."""
    cc = tmp_path / "bad-cc"
    cc.write_text(f"#!/bin/sh\necho run >> {tmp_path / 'runs'}\n{body}\n")
    cc.chmod(0o755)
    return str(cc)


def runs(tmp_path: Path) -> int:
    path = tmp_path / "runs"
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_without_a_compiler_it_launches_through_bindings_quietly(fresh, monkeypatch):
    monkeypatch.setattr(launcher, "compiler", lambda: None)
    assert launcher.get() is None  # no warning (warnings are errors here)
    assert launcher.status().startswith("cuda.bindings (the compiled launcher cannot be built")
    assert "no C compiler" in launcher.status()
    with pytest.raises(LauncherError, match="no C compiler"):
        launcher.build(fresh / "b")


def test_without_python_headers_it_launches_through_bindings_quietly(fresh, monkeypatch):
    monkeypatch.setattr(launcher, "_python_includes", lambda: [])
    assert launcher.get() is None
    assert "python3-dev" in launcher.status()


@needs_cc
def test_a_failing_compiler_warns_once_and_falls_back(fresh, monkeypatch):
    monkeypatch.setenv("CC", failing_compiler(fresh))
    with pytest.warns(RuntimeWarning, match="(?s)through cuda.bindings.*something is wrong"):
        assert launcher.get() is None
    assert launcher.get() is None  # resolved once: no second warning, no second build
    assert "failed (3)" in launcher.status() and runs(fresh) == 1


@needs_cc
def test_the_fallback_is_remembered_even_when_the_warning_raises(fresh, monkeypatch):
    # warnings as errors (this suite's own setting): the first launch raises the warning,
    # later ones go through cuda.bindings without building again
    import warnings

    monkeypatch.setenv("CC", failing_compiler(fresh))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(RuntimeWarning):
            launcher.get()
        assert launcher.get() is None
    assert runs(fresh) == 1 and launcher.status().startswith("cuda.bindings (")


@needs_cc
def test_compiler_output_that_is_not_utf8(fresh, monkeypatch):
    monkeypatch.setenv("CC", failing_compiler(fresh, "printf '\\377\\376 bad bytes' >&2\nexit 1"))
    with pytest.warns(RuntimeWarning, match="bad bytes"):
        assert launcher.get() is None


@needs_cc
def test_a_compiler_that_writes_nothing(fresh, monkeypatch):
    monkeypatch.setenv("CC", failing_compiler(fresh, "exit 0"))
    with pytest.warns(RuntimeWarning, match="exited 0 but wrote no"):
        assert launcher.get() is None
    assert runs(fresh) == 1


def test_a_cc_naming_no_program_is_not_passed_over(fresh, monkeypatch):
    monkeypatch.setenv("CC", str(fresh / "no-such-cc"))
    with pytest.warns(RuntimeWarning, match="names no program on the PATH"):
        assert launcher.get() is None
    launcher.reset()
    ne.configure(launcher="compiled")
    with pytest.raises(LauncherError, match="names no program"):
        launcher.get()


@needs_cc
def test_compiled_mode_raises_at_every_launch_and_builds_once(fresh, monkeypatch):
    monkeypatch.setenv("CC", failing_compiler(fresh))
    ne.configure(launcher="compiled")
    for _ in range(3):
        with pytest.raises(LauncherError, match="(?s)cannot be built.*something is wrong") as info:
            launcher.get()
        assert isinstance(info.value, ne.NvrtcEngineError)
    assert runs(fresh) == 1
    assert launcher.status().startswith("none (NVRTC_ENGINE_LAUNCHER=compiled")
    assert ne.LauncherError is LauncherError and "LauncherError" in ne.__all__


def test_configure_launcher_takes_effect_at_the_next_launch(fresh):
    ne.configure(launcher="bindings")
    assert launcher.get() is None and launcher.status().endswith("=bindings)")
    ne.configure(cache_size_limit="1G")  # another field: the choice stands
    assert launcher.status().endswith("=bindings)")
    ne.configure(launcher="auto")
    assert launcher.status().startswith("not yet resolved")


def test_bindings_mode_never_builds(fresh, monkeypatch):
    def no_build(directory):
        raise AssertionError("built")

    monkeypatch.setattr(launcher, "build", no_build)
    monkeypatch.setenv("NVRTC_ENGINE_LAUNCHER", "bindings")
    config.reset()
    assert launcher.get() is None
    assert launcher.status() == "cuda.bindings (NVRTC_ENGINE_LAUNCHER=bindings)"


@needs_cc
def test_built_once_into_the_cache_directory_and_a_broken_file_rebuilt(fresh):
    module = launcher._built_module()
    path = Path(module.__file__)
    assert path.parent == fresh / "cache" / "launcher" / launcher._digest()
    assert hasattr(module, "launch") and hasattr(module, "bind")
    built = path.stat().st_mtime_ns
    assert Path(launcher.build(path.parent)) == path and path.stat().st_mtime_ns == built
    leftovers = [p.name for p in path.parent.iterdir() if p != path]
    assert leftovers == []  # the temporary name was renamed into place

    # a truncated file (another build's crash, a full disk) is rebuilt, not fatal
    broken = fresh / "cache2" / "launcher" / launcher._digest()
    broken.mkdir(parents=True)
    (broken / path.name).write_bytes(b"\x7fELF truncated")
    config.configure(cache_dir=fresh / "cache2")
    module = launcher._built_module()
    assert Path(module.__file__).parent == broken
    assert (broken / path.name).stat().st_size > 1000


@needs_cc
def test_without_a_disk_cache_it_is_built_in_a_temporary_directory(fresh, monkeypatch):
    import tempfile

    made = []
    real = tempfile.mkdtemp

    def recording(*args, **kwargs):
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(tempfile, "mkdtemp", recording)
    config.configure(disable_disk_cache=True)
    module = launcher._built_module()
    assert hasattr(module, "launch") and "temporary directory" in module._nve_where
    assert len(made) == 1 and not os.path.exists(made[0])  # removed once imported
    assert not (fresh / "cache").exists()


def test_the_digest_covers_source_and_python(monkeypatch):
    first = launcher._digest()
    monkeypatch.setattr(sys, "version", sys.version + " (another build)")
    assert launcher._digest() != first


def test_launcher_setting():
    assert config.from_environment({}).launcher == "auto"
    for raw, value in (("compiled", "compiled"), (" Bindings ", "bindings"), ("AUTO", "auto")):
        assert config.from_environment({"NVRTC_ENGINE_LAUNCHER": raw}).launcher == value
    with pytest.raises(ValueError, match="NVRTC_ENGINE_LAUNCHER='c'.*auto, compiled, bindings"):
        config.from_environment({"NVRTC_ENGINE_LAUNCHER": "c"})
    try:
        assert ne.configure(launcher="bindings").launcher == "bindings"
        with pytest.raises(ValueError, match="configure"):
            ne.configure(launcher="fast")
        with pytest.raises(TypeError, match="auto"):
            ne.configure(launcher=1)
        assert config.settings().launcher == "bindings"
    finally:
        config.reset()
