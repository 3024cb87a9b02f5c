"""Compilation with NVRTC (no GPU needed): every GELU variant for sm_80/89/90/100a."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest

import nvrtc_engine as ne
from nvrtc_engine import CompileError, HeaderNotFoundError, VariantError, make_key
from nvrtc_engine.core import config
from nvrtc_engine.core.nvrtc import (
    CompileOptions,
    compile_source,
    compile_target,
    find_cuda_include_dir,
    nvrtc_version,
    supported_archs,
)
from nvrtc_engine.core.render import helper_headers

ARCHS = ["sm_80", "sm_89", "sm_90", "sm_100a"]
PAIRS = list(
    itertools.product(["fp32", "fp16", "bf16"], ["fp32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2"])
)


@pytest.mark.matrix
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize(("in_dtype", "out_dtype"), PAIRS)
@pytest.mark.parametrize("hidden_size", [None, 4096])
def test_every_gelu_variant_compiles(arch, in_dtype, out_dtype, hidden_size):
    k = make_key("gelu", in_dtype=in_dtype, out_dtype=out_dtype, hidden_size=hidden_size, arch=arch)
    kernel = ne.get_kernel(k)
    image = kernel.artifact.image
    assert kernel.artifact.kind == "cubin"
    assert image[:4] == b"\x7fELF"  # a cubin is an ELF file
    assert str(k).encode() in image  # the extern "C" symbol, unmangled
    assert kernel.artifact.options[0] == f"-arch={arch}"


def test_compile_target_cubin_and_ptx_fallback():
    assert compile_target("sm_90", [80, 90, 100]) == ("sm_90", "cubin")
    assert compile_target("sm_90a", [80, 90, 100]) == ("sm_90a", "cubin")
    # a device newer than anything this NVRTC knows: PTX for the newest arch
    assert compile_target("sm_120", [80, 90, 100]) == ("compute_100", "ptx")
    with pytest.raises(VariantError, match="cannot compile for sm_86") as err:
        compile_target("sm_86", [80, 90, 100])
    assert err.value.field == "arch" and err.value.allowed == "sm_80, sm_90, sm_100"


def test_ptx_output_when_asked():
    k = make_key("gelu", dtype="bf16", arch="sm_90")
    from nvrtc_engine.core.render import render

    r = render(k)
    result = compile_source(r.name, r.source, r.headers, CompileOptions(arch="compute_90"))
    assert result.kind == "ptx" and b".entry " + str(k).encode() in result.image


def test_versions():
    major, _minor = map(int, nvrtc_version().split("."))
    assert major >= 12
    assert 90 in supported_archs()


def test_options_flags_are_the_hashed_list():
    o = CompileOptions(arch="sm_90", defines=(("X", "1"),), extra=("-lineinfo",))
    assert o.flags() == (
        "-arch=sm_90",
        "-std=c++17",
        "-minimal",
        "-default-device",
        "-DX=1",
        "-lineinfo",
    )
    assert CompileOptions(arch="compute_90").output == "ptx"


def test_compile_error_carries_log_options_versions_and_source(tmp_path):
    bad = 'extern "C" __global__ void k() { this is not cuda; }\n'
    with pytest.raises(CompileError) as info:
        compile_source(
            "broken.cu", bad, helper_headers(), CompileOptions(arch="sm_90"), key="broken_key"
        )
    err = info.value
    assert err.key == "broken_key"
    assert "error" in err.log and err.first_error
    assert err.options[0] == "-arch=sm_90"
    assert err.nvrtc_version == nvrtc_version()
    assert err.header_version is None
    assert err.source_path and Path(err.source_path).read_text() == bad
    assert "broken_key" in str(err) and isinstance(err, RuntimeError)
    import pickle

    again = pickle.loads(pickle.dumps(err))
    assert again.log == err.log and again.source_path == err.source_path


def test_header_discovery_and_override(tmp_path, monkeypatch):
    found = find_cuda_include_dir()
    assert (found.path / "cuda_fp8.h").is_file()
    assert found.version[0].isdigit()
    find_cuda_include_dir.cache_clear()
    try:
        monkeypatch.setenv("NVRTC_ENGINE_CUDA_INCLUDE_DIR", str(tmp_path))
        config.reset()
        with pytest.raises(HeaderNotFoundError) as info:
            find_cuda_include_dir()
        assert str(tmp_path) in str(info.value)
        assert nvrtc_version() in str(info.value)
        assert "NVRTC_ENGINE_CUDA_INCLUDE_DIR" in str(info.value)
        # a variant that needs CUDA headers fails with that error; others do not need them
        with pytest.raises(HeaderNotFoundError):
            ne.get_kernel("gelu", dtype="fp8", arch="sm_80")
        ne.get_kernel("gelu", dtype="fp8", arch="sm_90")
        # an override that points at real headers is used
        monkeypatch.setenv("NVRTC_ENGINE_CUDA_INCLUDE_DIR", str(found.path))
        config.reset()
        find_cuda_include_dir.cache_clear()
        assert find_cuda_include_dir().path == found.path
    finally:
        find_cuda_include_dir.cache_clear()


def test_dump_source(tmp_path, monkeypatch):
    monkeypatch.setenv("NVRTC_ENGINE_DUMP_SOURCE", "1")
    config.reset()
    k = make_key("gelu", dtype="bf16", arch="sm_90")
    ne.get_kernel(k)
    dumped = tmp_path / "debug" / f"{k}.cu"
    assert dumped.is_file() and str(k) in dumped.read_text()
    assert os.environ["NVRTC_ENGINE_DEBUG_DIR"] == str(tmp_path / "debug")


def test_dump_source_to_an_unusable_debug_dir_warns_once_and_compiles(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    debug = blocker / "debug"  # cannot be made, whoever runs the test (root included)
    monkeypatch.setenv("NVRTC_ENGINE_DUMP_SOURCE", "1")
    monkeypatch.setenv("NVRTC_ENGINE_DEBUG_DIR", str(debug))
    config.reset()
    with pytest.warns(RuntimeWarning) as record:
        first = ne.get_kernel("gelu", dtype="bf16", arch="sm_90")
        second = ne.get_kernel("gelu", dtype="fp16", arch="sm_90")
    assert first.origin == second.origin == "compiled"
    ours = [w for w in record if "cannot write rendered sources" in str(w.message)]
    assert len(ours) == 1, [str(w.message) for w in record]
    message = str(ours[0].message)
    assert f"cannot write rendered sources to {debug} (" in message
    assert "NotADirectoryError" in message or "FileExistsError" in message
    assert "NVRTC_ENGINE_DEBUG_DIR" in message


@pytest.mark.parametrize(
    ("op", "fields", "lever"),
    [
        ("gelu", {"dtype": "fp8", "arch": "sm_80"}, "minimal"),
        ("gelu", {"dtype": "fp8", "arch": "sm_90"}, "minimal"),
        ("gelu", {"dtype": "fp8", "arch": "sm_90"}, "default_device"),
        ("rmsnorm_fwd", {"dtype": "bf16", "hidden_size": 4096, "arch": "sm_90"}, "default_device"),
    ],
)
def test_option_levers_keep_the_cubin_identical(op, fields, lever):
    """-minimal only skips declarations, -default-device only names unannotated functions'
    execution space (the norm forward's generic lambda): neither may change the cubin."""
    from nvrtc_engine.core.render import render

    r = render(make_key(op, **fields))
    arch = fields["arch"]
    images = [
        compile_source(
            r.name,
            r.source,
            r.headers,
            CompileOptions(arch=arch, **{lever: on}),
            cuda_headers=r.cuda_headers,
        ).image
        for on in (True, False)
    ]
    assert images[0] == images[1]


@pytest.mark.parametrize("arch", ["sm_90", "compute_90"])
def test_an_empty_log_leaves_python_shared_bytes_alone(arch):
    # NVRTC writes a one-byte log (its NUL) when there is nothing to say; a b" " * 1 buffer
    # is CPython's shared one-byte b" ", and print's separators became NULs process-wide
    result = compile_source("empty.cu", 'extern "C" __global__ void k() {}', [],
                            CompileOptions(arch=arch))  # fmt: skip
    assert result.log == ""
    assert bytes((32,))[0] == 32 and " ".encode("ascii")[0] == 32
    assert result.image.startswith(b"\x7fELF" if arch == "sm_90" else b"//")
