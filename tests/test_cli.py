"""The nvrtc-engine command line: demo without a GPU, cache info/clear, exit codes."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys

import pytest

from nvrtc_engine.core import driver
from nvrtc_engine.core.nvrtc import nvrtc_version
from nvrtc_engine.tools import cli
from nvrtc_engine.tools.cli import _one_line_warning, main


def test_demo_compiles_then_hits_the_cache(capsys, isolated_cache):
    assert main(["demo", "--arch", "sm_90", "--no-run"]) == 0
    out = capsys.readouterr().out
    assert "gelu_bf16_e4m3_tensor_rowwise_h14336_sm90" in out
    assert out.count("compiled") == 4
    assert main(["demo", "--arch", "sm_90", "--no-run"]) == 0
    assert capsys.readouterr().out.count("memory hit") == 4


def test_demo_memory_only_counts_the_kernels_it_holds(capsys, monkeypatch, isolated_cache):
    import nvrtc_engine as ne
    from nvrtc_engine.core import config

    monkeypatch.setenv("NVRTC_ENGINE_DISABLE_DISK_CACHE", "1")
    config.reset()
    ne.clear_cache(disk=False)
    assert main(["demo", "--arch", "sm_90", "--no-run"]) == 0
    out = capsys.readouterr().out
    assert "cache: memory only (" in out and "kernels held in this process)" in out
    held = int(out.split("cache: memory only (")[1].split()[0])
    assert held >= 4


def test_cache_info_and_clear(capsys):
    main(["demo", "--arch", "sm_89", "--no-run"])
    capsys.readouterr()
    assert main(["cache", "info", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["entries"] == 4 and info["bytes"] > 0
    assert main(["cache", "clear"]) == 0
    assert "cleared 4 entries" in capsys.readouterr().out
    main(["cache", "info"])
    out = capsys.readouterr().out
    assert "entries:    0" in out and "launcher" not in out
    assert "on disk, its SQLite database included" in out  # (an empty cache is not 0 bytes)
    assert cli._size(32768) == "32.8 kB" and cli._size(5) == "5 B"
    assert cli._size(1 << 30) == "1.07 GB" and cli._size(2_500_000) == "2.5 MB"


def test_cache_commands_without_a_disk_cache_say_why(capsys, monkeypatch, isolated_cache):
    import warnings

    import nvrtc_engine as ne
    from nvrtc_engine.core import config

    monkeypatch.setenv("NVRTC_ENGINE_DISABLE_DISK_CACHE", "1")
    config.reset()
    ne.clear_cache(disk=False)
    for command in (["clear"], ["verify"], ["list"], ["info"], ["info", "--json"],
                    ["export", "b.zip"]):  # fmt: skip
        assert main(["cache", *command]) == 2, command
        captured = capsys.readouterr()
        assert "the disk cache is disabled (NVRTC_ENGINE_DISABLE_DISK_CACHE=1" in captured.err
        assert captured.out == "", command
    # the command line prints warnings on one line (_one_line_warning); Python's format is
    # back afterwards
    before = warnings.formatwarning
    monkeypatch.setenv("NVRTC_ENGINE_DISABLE_DISK_CACHE", "0")
    monkeypatch.setenv("NVRTC_ENGINE_CACHE_DIR", "/proc/nvrtc-engine-test")
    config.reset()
    ne.clear_cache(disk=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the engine's one CacheWarning (tested elsewhere)
        for command in (["clear"], ["info"], ["export", "b.zip"]):
            assert main(["cache", *command]) == 2
            err = capsys.readouterr().err
            assert "the disk cache at /proc/nvrtc-engine-test is unusable" in err, command
    assert warnings.formatwarning is before
    line = _one_line_warning(UserWarning("disk cache at X is unusable"), UserWarning, "f", 1)
    assert line == "nvrtc-engine: warning: disk cache at X is unusable\n"


def test_cli_warnings_carry_one_prefix(tmp_path):
    env = {**os.environ, "NVRTC_ENGINE_CACHE_DIR": "/proc/nvrtc-engine-test"}
    args = [sys.executable, "-m", "nvrtc_engine.tools.cli", "cache", "info"]
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "nvrtc-engine: warning: disk cache at /proc/nvrtc-engine-test is unusable" in (
        done.stderr)  # fmt: skip
    assert ("nvrtc-engine cache info: error: the disk cache at /proc/nvrtc-engine-test is "
            "unusable") in done.stderr  # fmt: skip
    assert "nvrtc_engine:" not in done.stderr
    line = _one_line_warning(UserWarning("nvrtc_engine: disk cache at X"), UserWarning, "f", 1)
    assert line == "nvrtc-engine: warning: disk cache at X\n"


def test_bad_arch_exits_2(capsys, tmp_path):
    assert main(["demo", "--arch", "sm_70", "--no-run"]) == 2
    captured = capsys.readouterr()
    assert "nvrtc-engine demo: error: argument --arch: sm_70 is older than Ampere: " in captured.err
    assert captured.err.startswith("usage: nvrtc-engine demo ")  # as --tokens 0 has
    assert captured.out == ""  # the error comes before the demo prints anything
    # demo and prewarm parse --arch alike: the same line for the same value
    assert main(["prewarm", _variant_file(tmp_path), "--arch", "sm_91"]) == 2
    prewarm_err = capsys.readouterr().err
    assert prewarm_err.startswith("usage: nvrtc-engine prewarm ")
    assert main(["demo", "--arch", "sm_91", "--no-run"]) == 2
    demo_err = capsys.readouterr().err.splitlines()[-1]
    assert demo_err.replace("demo:", "prewarm:", 1) == prewarm_err.splitlines()[-1]


@pytest.mark.parametrize("value", ["0", "-1", "two", "1025"])
def test_bad_workers_is_an_argparse_error(capsys, tmp_path, value):
    with pytest.raises(SystemExit) as info:
        main(["prewarm", _variant_file(tmp_path), "--workers", value])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert (
        f"error: argument --workers: expected a positive integer up to 1024, got {value}\n" in err
    )


@pytest.mark.parametrize(
    ("option", "value", "expected"),
    [("--seed", "-1", "an integer >= 0 (numpy's seeds are not negative)"),
     ("--seed", "x", "an integer >= 0 (numpy's seeds are not negative)"),
     ("--tokens", "0", "a positive integer up to 65536"),
     ("--tokens", "99999999999999999999", "a positive integer up to 65536"),
     ("--tokens", "\u0663", "a positive integer up to 65536"),  # ARABIC-INDIC DIGIT THREE
     ("--tokens", "\uff18", "a positive integer up to 65536"),  # FULLWIDTH DIGIT EIGHT
     ("--seed", "\u0967", "an integer >= 0 (numpy's seeds are not negative)"),  # DEVANAGARI 1
     ("--tokens", "+8", "a positive integer up to 65536"),
     ("--tokens", " 8", "a positive integer up to 65536"),
     ("--tokens", "1_0", "a positive integer up to 65536"),
     ("--seed", "-\u0663", "an integer >= 0 (numpy's seeds are not negative)")],
)  # fmt: skip
def test_bad_demo_numbers_are_argparse_errors(capsys, option, value, expected):
    """Refused before the demo compiles anything: a negative seed would fail in numpy after
    the compiles, and a huge --tokens in the host's float64 reference. Only ASCII digits:
    int() takes any Unicode decimal digit (and '+', blanks, '_'), the messages promise
    integers as written in ASCII."""
    with pytest.raises(SystemExit) as info:
        main(["demo", "--no-run", option, value])
    assert info.value.code == 2
    captured = capsys.readouterr()
    assert f"error: argument {option}: expected {expected}, got {value}\n" in captured.err
    assert captured.out == ""


def test_a_warm_prewarm_command_imports_no_launch_code(isolated_cache, tmp_path):
    """The command over a warm disk cache reads and verifies each kernel and makes none: no
    family's host code (activation and norm kernels), compiled launcher, ctypes, NVRTC or
    Jinja2 is imported, for a list of every family."""
    listing = tmp_path / "families.toml"
    listing.write_text(VARIANTS + '[[variants]]\nop = "rmsnorm_fwd"\nin_dtype = "bf16"\n'
                       'hidden_size = 4096\n[[variants]]\nop = "cast_transpose"\n'
                       'in_dtype = "bf16"\nout_dtype = "fp8_e4m3"\n')  # fmt: skip
    assert main(["prewarm", str(listing), "--no-progress"]) == 0
    code = ("import sys; from nvrtc_engine.tools.cli import main; "
            f"code = main(['prewarm', {str(listing)!r}, '--json', '--no-progress']); "
            "print(code, sorted(m for m in ('ctypes', 'jinja2', 'cuda.bindings.nvrtc', "
            "'nvrtc_engine.core.native_launch', 'nvrtc_engine.families.activation.kernels', "
            "'nvrtc_engine.families.norm.kernels') if m in sys.modules))")  # fmt: skip
    env = {**os.environ, "NVRTC_ENGINE_CACHE_DIR": str(isolated_cache)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=300, check=True)  # fmt: skip
    report, last = done.stdout.rsplit("}", 1)
    assert len(json.loads(report + "}")["cached"]) == 4
    assert last.strip() == "0 []"


def test_console_script_runs_in_a_fresh_process(isolated_cache, tmp_path):
    env = {**os.environ, "NVRTC_ENGINE_CACHE_DIR": str(isolated_cache)}
    args = [sys.executable, "-m", "nvrtc_engine.tools.cli", "demo", "--no-run", "--tokens", "64"]
    if driver.device_count() == 0:
        args += ["--arch", "sm_90"]
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "gelu_bf16_bf16_none_rowwise_h4096" in done.stdout


VARIANTS = """
[defaults]
arch = "sm_90"
[[variants]]
op = "gelu"
in_dtype = "bf16"
out_dtype = ["bf16", "fp8_e4m3"]
"""


def test_prewarm_exit_codes(capsys, tmp_path, monkeypatch):
    good = tmp_path / "v.toml"
    good.write_text(VARIANTS)
    assert main(["prewarm", str(good), "--workers", "2", "--no-progress"]) == 0
    assert "2 variants: 2 compiled, 0 already cached, 0 failed" in capsys.readouterr().out
    assert main(["prewarm", str(good), "--arch", "sm_90", "sm_100a", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert len(report["cached"]) == 2 and len(report["compiled"]) == 2
    bad = tmp_path / "bad.toml"
    bad.write_text(VARIANTS.replace('arch = "sm_90"', 'arch = "sm_70"'))
    assert main(["prewarm", str(bad)]) == 2
    assert "entry 0" in capsys.readouterr().err
    assert main(["prewarm", str(tmp_path / "missing.toml")]) == 2
    # a variant that fails to compile: exit 1, the others still built
    include = tmp_path / "include"
    include.mkdir()
    (include / "cuda_fp8.h").write_text("#error broken\n")
    monkeypatch.setenv("NVRTC_ENGINE_CUDA_INCLUDE_DIR", str(include))
    from nvrtc_engine.core import config, nvrtc

    config.reset()
    nvrtc.find_cuda_include_dir.cache_clear()
    try:
        assert main(["prewarm", str(good), "--arch", "sm_80", "sm_89", "--no-progress"]) == 1
    finally:
        nvrtc.find_cuda_include_dir.cache_clear()
    out = capsys.readouterr().out
    assert "3 compiled" in out and "1 failed" in out
    assert "FAILED gelu_bf16_e4m3_tensor_rowwise_hany_sm80" in out


def test_prewarm_a_file_that_is_not_utf8_names_the_file(capsys, tmp_path):
    """As every other file error: the file named, exit code 2, nothing compiled."""
    bad = tmp_path / "b.toml"
    bad.write_bytes(b"\xff\xfe[[variants]]\nop = 'gelu'\n")
    assert main(["prewarm", str(bad), "--arch", "sm_90", "--no-progress"]) == 2
    assert capsys.readouterr().err == f"nvrtc-engine prewarm: error: {bad}: not UTF-8 text: " + (
        "'utf-8' codec can't decode byte 0xff in position 0: invalid start byte\n"
    )


def test_prewarm_bad_arch_option_names_the_option_not_the_file(capsys, tmp_path):
    good = tmp_path / "v.toml"
    good.write_text(VARIANTS)
    for archs, says in ((["sm_95"], "names no GPU ("),
                        (["sm_90", "sm_80a"], "cannot take the 'a' suffix: "),
                        (["sm_900"], "is newer than every arch this library knows (a typo?); "
                                     "known archs: sm_80, ")):  # fmt: skip
        assert main(["prewarm", str(good), "--arch", *archs, "--no-progress"]) == 2
        captured = capsys.readouterr()
        assert f"nvrtc-engine prewarm: error: argument --arch: {archs[-1]} {says}" in captured.err
        assert "entry 0" not in captured.err and str(good) not in captured.err
        assert captured.out == ""  # refused before anything compiled


def _assert_columns_line_up(lines, left=(), right=()):
    """Every row's left-aligned columns start, and its right-aligned ones end, where the
    header's names do."""
    header, *rows = lines
    for row in rows:
        for name in left:
            start = header.index(name)
            assert row[start - 2 : start] == "  " and row[start] != " ", (name, row)
        for name in right:
            end = header.index(name) + len(name)
            assert row[end - 1] != " " and row[end : end + 2] in ("  ", ""), (name, row)


def _newer_gpu(monkeypatch, arch="sm_130"):
    """A stand-in GPU newer than every known arch (the arch read in this process)."""
    from nvrtc_engine.core import make
    from nvrtc_engine.core.key import DeviceArch

    monkeypatch.setattr(make, "device_arch", lambda device: DeviceArch(arch))
    monkeypatch.setattr(driver, "device_count", lambda: 1)
    monkeypatch.setattr(driver, "current_device", lambda: 0)
    monkeypatch.setattr(driver, "get_device", lambda ordinal: type("D", (), {"arch": arch})())


def test_cache_list_columns_hold_for_long_arch_names_and_ptx(capsys, tmp_path, monkeypatch):
    variants = tmp_path / "v.toml"
    variants.write_text(VARIANTS)
    archs = ["sm_90", "sm_100a", "sm_120f"]
    assert main(["prewarm", str(variants), "--arch", *archs, "--no-progress"]) == 0
    # a GPU newer than this NVRTC knows: PTX, whose arch prints as compute_1xx
    _newer_gpu(monkeypatch)
    variants.write_text(VARIANTS.replace('arch = "sm_90"', ""))
    assert main(["prewarm", str(variants), "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["cache", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == "8 entries"
    header = lines[0].split()
    assert header == ["key", "arch", "kind", "size", "compile", "NVRTC", "digest", "current"]
    assert any(" compute_1" in line and " ptx " in line for line in lines)
    assert any(" sm_120f " in line and " cubin " in line for line in lines)
    _assert_columns_line_up(lines[:-1], left=("arch", "kind", "NVRTC", "digest", "current"),
                            right=("size", "compile"))  # fmt: skip
    assert all(line.endswith(" yes") for line in lines[1:-1])


def test_cache_list_marks_superseded_entries(capsys, monkeypatch, isolated_cache):
    """An entry of a key whose code has changed since (here: another code fingerprint, as
    another version of the templates has) stays on disk beside the new one until evicted;
    ``cache list`` marks which one get_kernel uses now (current yes) and counts the
    superseded."""
    import nvrtc_engine as ne
    from nvrtc_engine.core import render

    old = ne.get_kernel("gelu", dtype="bf16", arch="sm_90")
    with monkeypatch.context() as mp:
        mp.setattr(render, "code_fingerprint", lambda: "0" * 64)
        ne.clear_cache(disk=False)
        new = ne.get_kernel("gelu", dtype="bf16", arch="sm_90")
    ne.clear_cache(disk=False)
    assert new.artifact.digest != old.artifact.digest
    assert main(["cache", "list", "--json"]) == 0
    rows = {r["digest"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows[old.artifact.digest]["current"] is True
    assert rows[new.artifact.digest]["current"] is False
    assert main(["cache", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == "2 entries, 1 superseded"
    marks = {line.split()[-2]: line.split()[-1] for line in lines[1:-1]}
    assert marks == {old.artifact.digest[:12]: "yes", new.artifact.digest[:12]: "no"}


def test_demo_sizes_are_images_with_their_kind(capsys, monkeypatch):
    _newer_gpu(monkeypatch)
    assert main(["demo", "--no-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    table = [line for line in lines if line.startswith(("variant", "gelu_"))]
    assert table[0].split() == ["variant", "source", "ms", "kind", "image", "bytes"]
    assert "cubin B" not in "\n".join(lines)
    assert all(row.split()[-2] == "ptx" for row in table[1:])
    _assert_columns_line_up(table, left=("source", "kind"), right=("ms", "image bytes"))


def test_cache_list_verify_export_import(capsys, tmp_path, isolated_cache):
    main(["prewarm", _variant_file(tmp_path), "--no-progress"])
    capsys.readouterr()
    assert main(["cache", "list"]) == 0
    out = capsys.readouterr().out
    assert "gelu_bf16_e4m3_tensor_rowwise_hany_sm90" in out and "2 entries" in out
    assert out.splitlines()[0].split()[:3] == ["key", "arch", "kind"]
    assert main(["cache", "list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["arch"] for r in rows} == {"sm_90"} and all(r["bytes"] > 0 for r in rows)
    assert main(["cache", "verify"]) == 0
    assert "checked 2 entries: 0 bad" in capsys.readouterr().out
    bundle = tmp_path / "k.bundle"
    assert main(["cache", "export", str(bundle)]) == 0
    assert "exported 2 kernels" in capsys.readouterr().out
    # damage one entry: verify reports it, removes it, exits 1; then the cache is clean
    from nvrtc_engine.core.engine import default_engine

    disk = default_engine().tiers().disk
    digest = next(iter(disk.digests()))
    disk.put(digest, b"garbage")
    assert main(["cache", "verify"]) == 1
    assert f"removed {digest[:12]}: not an nvrtc_engine entry" in capsys.readouterr().out
    assert main(["cache", "verify"]) == 0
    capsys.readouterr()
    assert main(["cache", "import", str(bundle)]) == 0
    out = capsys.readouterr().out
    assert out == (f"imported 2 kernels (NVRTC {nvrtc_version()}) from {bundle}: 1 new, 1 "
                   "already in the cache\n")  # (1 removed above)  # fmt: skip
    assert main(["cache", "import", str(bundle)]) == 0
    assert ": 0 new, 2 already in the cache\n" in capsys.readouterr().out
    assert main(["cache", "info", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["entries"] == 2
    # an existing file is not overwritten without --force
    assert main(["cache", "export", str(bundle)]) == 2
    assert f"error: {bundle}: exists; nvrtc-engine cache export --force" in (
        capsys.readouterr().err)  # fmt: skip
    assert main(["cache", "export", str(bundle), "--force"]) == 0
    assert "exported 2 kernels" in capsys.readouterr().out
    bundle.write_bytes(bundle.read_bytes()[:200])
    assert main(["cache", "import", str(bundle)]) == 2
    assert "cannot open as a zip" in capsys.readouterr().err
    assert main(["cache", "import", str(tmp_path / "missing.zip")]) == 2
    assert f"error: {tmp_path / 'missing.zip'}: does not exist\n" in capsys.readouterr().err


def _variant_file(tmp_path):
    path = tmp_path / "variants.toml"
    path.write_text(VARIANTS)
    return str(path)


def test_cli_arch_number_version_and_os_errors(capsys, tmp_path):
    assert main(["demo", "--arch", "90", "--no-run"]) == 0
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert "nvrtc-engine" in capsys.readouterr().out
    assert main(["cache", "export", str(tmp_path)]) == 2  # a directory, not a file name
    assert "is a directory" in capsys.readouterr().err
    missing = tmp_path / "no-such-dir" / "x.zip"
    assert main(["cache", "export", str(missing)]) == 2  # not created, as cp would not
    captured = capsys.readouterr()
    assert captured.err == (
        f"nvrtc-engine cache export: error: {missing}: cannot write: {missing.parent} does not "
        "exist\n"
    )
    assert captured.out == "" and not missing.parent.exists()


def test_verify_keeps_lock_files(isolated_cache, capsys):
    import nvrtc_engine as ne

    ne.get_kernel("gelu", dtype="bf16", arch="sm_90")
    locks = list((isolated_cache / "locks").glob("*.lock"))
    assert locks
    assert main(["cache", "verify"]) == 0
    assert "lock" not in capsys.readouterr().out
    assert all(p.exists() for p in locks)


def test_malformed_environment_is_one_error_for_prewarm(monkeypatch, capsys, tmp_path):
    from nvrtc_engine.core import config

    listing = tmp_path / "v.toml"
    listing.write_text("[[variants]]\nop = 'gelu'\nout_dtype = ['bf16', 'fp16']\n")
    monkeypatch.setenv("NVRTC_ENGINE_WORKERS", "0")
    monkeypatch.setattr(config, "_current", None)  # read the environment again
    assert main(["prewarm", str(listing), "--arch", "sm_90", "--no-progress"]) == 2
    assert "NVRTC_ENGINE_WORKERS" in capsys.readouterr().err
    monkeypatch.delenv("NVRTC_ENGINE_WORKERS")  # before the cache fixture reads it again
    monkeypatch.setattr(config, "_current", None)


def test_output_into_a_closed_pipe_is_not_an_error(monkeypatch):
    """``nvrtc-engine cache list | head``: the reader stops early; exit 0, no error line."""
    from nvrtc_engine.tools import cli

    parser = cli.build_parser()

    def closed(args):
        raise BrokenPipeError(32, "Broken pipe")

    real = parser.parse_args
    monkeypatch.setattr(cli, "build_parser", lambda *_: parser)
    monkeypatch.setattr(parser, "parse_args", lambda argv: real(argv).__class__(func=closed))
    assert cli.main(["cache", "info"]) == 0


def test_prewarm_without_a_gpu_hints_at_the_arch_option(capsys, tmp_path, monkeypatch):
    """The command line's hint is --arch sm_90; the Python API's stays arch='sm_90'."""
    import nvrtc_engine as ne

    prewarm_module = importlib.import_module("nvrtc_engine.tools.prewarm")  # (not ne.prewarm)

    def no_device() -> int:
        raise ne.NoDeviceError("no usable CUDA driver or device")

    monkeypatch.setattr(driver, "current_device", no_device)
    variants = tmp_path / "v.toml"
    variants.write_text(VARIANTS.replace('arch = "sm_90"', ""))
    assert main(["prewarm", str(variants)]) == 2
    err = capsys.readouterr().err
    assert "pass --arch sm_90 (or another arch) to compile without a GPU" in err
    assert "arch='sm_90'" not in err
    with pytest.raises(ne.NoDeviceError, match="pass arch='sm_90'"):
        prewarm_module.prewarm(str(variants))


def test_prewarm_file_after_the_archs(tmp_path, capsys, isolated_cache):
    """`prewarm --arch sm_90 FILE` (the file after --arch's values) reads FILE as the variant
    file, and a bad arch in that order names --arch; no file at all is a clear exit 2."""
    good = tmp_path / "v.toml"
    good.write_text(VARIANTS)
    assert main(["prewarm", "--arch", "sm_90", str(good), "--json", "--no-progress"]) == 0
    assert json.loads(capsys.readouterr().out)["failed"] == []
    assert main(["prewarm", "--arch", "sm_95", str(good), "--no-progress"]) == 2
    assert "argument --arch: sm_95 names no GPU" in capsys.readouterr().err
    assert main(["prewarm", "--arch", "sm_90"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: nvrtc-engine prewarm [-h] FILE [FILE ...] [--arch ARCH "
                          "[ARCH ...]]")  # fmt: skip
    assert err.splitlines()[-1] == "nvrtc-engine prewarm: error: the variant file FILE is missing"


def test_prewarm_takes_several_variant_files(tmp_path, capsys, isolated_cache):
    """``nvrtc-engine prewarm docs/examples/*.toml``: every file's variants, before or after
    --arch; a bad entry names its file; a count of one is "1 variant"."""
    a, b = tmp_path / "a.toml", tmp_path / "b.json"
    a.write_text(VARIANTS)
    b.write_text('[{"op": "silu", "dtype": "bf16", "arch": "sm_90"}]')
    for argv in ([str(a), str(b)], ["--arch", "sm_90", str(a), str(b)],
                 [str(a), "--arch", "sm_90", str(b)]):  # fmt: skip
        assert main(["prewarm", *argv, "--json", "--no-progress"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert report["compiled"] + report["cached"] == [
            "gelu_bf16_bf16_none_rowwise_hany_sm90", "gelu_bf16_e4m3_tensor_rowwise_hany_sm90",
            "silu_bf16_bf16_none_rowwise_hany_sm90"]  # fmt: skip
    assert main(["prewarm", str(b), "--no-progress"]) == 0
    assert capsys.readouterr().out.startswith("prewarm: 1 variant: 0 compiled, 1 already cached")
    b.write_text('[{"op": "silu", "dtype": "bf16", "arch": "sm_900"}]')
    assert main(["prewarm", str(a), str(b), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"{b}, entry 0: " in err and "newer than every arch this library knows" in err


def test_cache_commands_where_diskcache_cannot_open_the_directory(
    capsys, isolated_cache, tmp_path, monkeypatch, read_only_diskcache
):
    """A read-only cache directory (diskcache opens a cache for writing): every cache
    command exits 2 saying so; its kernels, exported as a bundle, are served read-only."""
    import warnings

    import nvrtc_engine as ne

    main(["demo", "--arch", "sm_90", "--no-run"])
    bundle = tmp_path / "k.zip"
    assert main(["cache", "export", str(bundle)]) == 0
    names = [line.split()[0] for line in _listed(capsys)]
    monkeypatch.setenv("NVRTC_ENGINE_READONLY_CACHE", str(bundle))
    read_only_diskcache()
    capsys.readouterr()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the engine's one CacheWarning (tested elsewhere)
        for command in (["list"], ["info"], ["verify"], ["clear"], ["export", "x.zip"],
                        ["import", str(bundle)]):  # fmt: skip
            assert main(["cache", *command]) == 2, command
            err = capsys.readouterr().err
            assert f"the disk cache at {isolated_cache} is unusable" in err, command
        kernels = [ne.get_kernel(ne.KernelKey.parse(name)) for name in names]
    assert {k.origin for k in kernels} == {"disk"} and ne.cache_info().compiles == 0
    assert ne.cache_info().readonly == (str(bundle),)


def _listed(capsys):
    """The entry lines of ``cache list``."""
    capsys.readouterr()
    assert main(["cache", "list"]) == 0
    return capsys.readouterr().out.splitlines()[1:-1]


@pytest.mark.parametrize("why", ["unusable", "disabled"])
def test_prewarm_without_a_disk_cache_exits_2_and_compiles_nothing(
    why, capsys, monkeypatch, tmp_path
):
    """The command line's prewarm is for a warm disk cache: without one its kernels would
    stay in this process's memory only, which ends with the command."""
    import warnings

    import nvrtc_engine as ne
    from nvrtc_engine.core import config

    good = tmp_path / "v.toml"
    good.write_text(VARIANTS)
    if why == "unusable":
        monkeypatch.setenv("NVRTC_ENGINE_CACHE_DIR", "/proc/nvrtc-engine-test")
    else:
        monkeypatch.setenv("NVRTC_ENGINE_DISABLE_DISK_CACHE", "1")
    config.reset()
    ne.clear_cache(disk=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the engine's one CacheWarning (tested elsewhere)
        assert main(["prewarm", str(good), "--workers", "2", "--no-progress"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "nothing was compiled" in captured.err
    assert ("is unusable" if why == "unusable" else "the disk cache is disabled") in captured.err
    assert ne.cache_info().compiles == 0 and ne.cache_info().memory_entries == 0


def test_prewarm_onto_a_full_disk_names_it_and_clear_frees_it(capsys, isolated_cache, tmp_path):
    """Kernels compiled but not stored for want of space: exit 1 naming ENOSPC (not the size
    limit); and `cache clear` frees a full cache, even one the disk keeps from opening."""
    import errno
    import sqlite3
    import warnings

    import diskcache

    import nvrtc_engine as ne
    from nvrtc_engine.core import config

    both = tmp_path / "both.toml"
    both.write_text(VARIANTS)
    main(["demo", "--arch", "sm_90", "--no-run"])

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    def cannot_open(self, *args, **kwargs):
        raise sqlite3.OperationalError("database or disk is full")

    capsys.readouterr()
    with warnings.catch_warnings(), pytest.MonkeyPatch.context() as mp:
        warnings.simplefilter("ignore")  # put's CacheWarning (tested elsewhere)
        mp.setattr(diskcache.Cache, "set", full)
        assert main(["prewarm", str(both), "--workers", "1", "--no-progress"]) == 1
        captured = capsys.readouterr()
        assert "2 compiled, 0 already cached, 0 failed" in captured.out
        assert ("did not keep them (no space left on device (ENOSPC); OSError: [Errno 28] No "
                "space left on device)") in captured.err  # fmt: skip
        assert "kernels compiled but not stored: 2 of 2" in captured.err
        mp.setattr(diskcache.Cache, "__init__", cannot_open)
        config.reset()
        ne.clear_cache(disk=False)
        assert main(["cache", "clear"]) == 0
    assert "its store, which could not be opened (no space left" in capsys.readouterr().out
    assert not (isolated_cache / "entries").exists()


def test_prewarm_fails_for_kernels_the_size_limit_evicted(capsys, isolated_cache, tmp_path):
    """A writable cache that does not keep what the prewarm compiled (its size limit evicted
    the entries): exit 1, saying how many and why."""
    import warnings

    import diskcache

    both = tmp_path / "both.toml"
    both.write_text(VARIANTS)
    with warnings.catch_warnings(), pytest.MonkeyPatch.context() as mp:
        warnings.simplefilter("ignore")  # put's CacheWarning for an entry evicted at once
        # every store evicted at once: what a limit far too small for the kernels does
        mp.setattr(diskcache.Cache, "__contains__", lambda self, digest: False)
        assert main(["prewarm", str(both), "--workers", "1", "--no-progress"]) == 1
    captured = capsys.readouterr()
    assert "2 compiled, 0 already cached, 0 failed" in captured.out
    assert f"the disk cache at {isolated_cache} did not keep them (its size limit" in captured.err
    assert "kernels compiled but not stored: 2 of 2" in captured.err
    assert main(["prewarm", str(both), "--no-progress"]) == 0  # stored: warm, and exit 0


def test_ascii_workers_digits_only(capsys, tmp_path):
    with pytest.raises(SystemExit):
        main(["prewarm", _variant_file(tmp_path), "--workers", "\u0662"])
    assert "expected a positive integer up to 1024, got \u0662\n" in capsys.readouterr().err
    assert cli._positive_int("1024") == 1024 and cli._seed("-0") == 0


def test_cache_clear_reports_the_entries_bytes_not_the_database(capsys, isolated_cache):
    """An empty cache still has its SQLite database (~32 kB): clearing it frees nothing."""
    assert main(["cache", "info", "--json"]) == 0  # creates the (empty) cache
    assert json.loads(capsys.readouterr().out)["bytes"] > 0
    assert main(["cache", "clear"]) == 0
    out = capsys.readouterr().out
    assert out == f"cleared 0 entries from {isolated_cache}\n"
    import nvrtc_engine as ne

    empty = ne.cache_info().bytes
    main(["demo", "--arch", "sm_90", "--no-run"])
    capsys.readouterr()
    held = ne.cache_info().bytes - empty
    assert held > 0
    assert main(["cache", "clear"]) == 0
    out = capsys.readouterr().out
    assert out == f"cleared 4 entries ({held} bytes) from {isolated_cache}\n"


def test_cache_export_says_each_skip_reason_once(capsys, tmp_path, isolated_cache, monkeypatch):
    """Entries of another NVRTC are left out of a bundle with one line for all of them."""
    import nvrtc_engine as ne
    from nvrtc_engine.core import nvrtc

    ne.get_kernel("gelu", dtype="bf16", arch="sm_90")
    with monkeypatch.context() as m:
        m.setattr(nvrtc, "nvrtc_identity", lambda: "99.0")
        m.setattr(nvrtc, "nvrtc_version", lambda: "99.0")
        for dtype in ("fp16", "fp32", "fp8"):
            ne.core.engine.Engine().get(ne.make_key("gelu", dtype=dtype, arch="sm_90"))
    assert main(["cache", "export", str(tmp_path / "b.nve")]) == 0
    lines = capsys.readouterr().out.splitlines()
    skipped = [line for line in lines if line.startswith("skipped ")]
    assert len(skipped) == 1 and " and 2 more: built by NVRTC 99.0" in skipped[0], lines
    assert "exported 1 kernel" in lines[-1]
