"""What a fleet trusts, without a server: the remote cache's settings, signed entries (HMAC)
in bundles and read-only caches, and entries of another NVRTC version taken on request,
loaded once on a GPU before use (the GPU stood in for here)."""

from __future__ import annotations

import json
import re
import warnings

import pytest

import nvrtc_engine as ne
from nvrtc_engine import CacheWarning, make_key
from nvrtc_engine.core import config, engine, errors, nvrtc
from nvrtc_engine.core.cache import check_entry, digest, sign_entry
from nvrtc_engine.core.engine import default_engine
from nvrtc_engine.core.errors import CudaError
from nvrtc_engine.tools import bundle
from nvrtc_engine.tools.bundle import BundleError, export_bundle, import_bundle
from nvrtc_engine.tools.cli import main
from nvrtc_engine.tools.prewarm import prewarm

KEYS = [make_key("gelu", dtype="bf16", hidden_size=h, arch="sm_90") for h in (1024, 2048)]
SECRET = "a-fleet-secret-of-32-characters!"
OTHER = "another-key-of-the-same-length!!"


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch):
    monkeypatch.setattr(errors, "_warned_once", set())


# -- settings ------------------------------------------------------------------------------


def test_the_remote_settings_are_read_and_typed(tmp_path):
    key_file = tmp_path / "key"
    key_file.write_text(SECRET + "\n")
    s = config.from_environment({
        "NVRTC_ENGINE_REMOTE_CACHE": "redis://cache.internal:6380/2",
        "NVRTC_ENGINE_REMOTE_PREFIX": "team-a", "NVRTC_ENGINE_REMOTE_TTL": "0",
        "NVRTC_ENGINE_REMOTE_TIMEOUT": "0.02", "NVRTC_ENGINE_REMOTE_WAIT": "5",
        "NVRTC_ENGINE_REMOTE_RETRY": "10", "NVRTC_ENGINE_CACHE_KEY_FILE": str(key_file),
        "NVRTC_ENGINE_ANY_NVRTC": "yes",
    })  # fmt: skip
    assert (s.remote_cache, s.remote_prefix, s.remote_ttl) == ("redis://cache.internal:6380/2",
                                                               "team-a", 0.0)  # fmt: skip
    assert (s.remote_timeout, s.remote_wait, s.remote_retry, s.any_nvrtc) == (0.02, 5, 10, True)
    assert s.signing_key() == SECRET.encode()  # the file's newline dropped
    d = config.from_environment({})
    assert d.remote_cache is None and d.signing_key() is None and not d.any_nvrtc
    assert (d.remote_prefix, d.remote_timeout, d.remote_wait) == ("nvrtc_engine", 0.05, 10.0)
    both = config.from_environment({"NVRTC_ENGINE_CACHE_KEY": OTHER,
                                    "NVRTC_ENGINE_CACHE_KEY_FILE": str(key_file)})  # fmt: skip
    assert both.signing_key() == OTHER.encode()  # the variable wins


@pytest.mark.parametrize(
    ("var", "value"),
    [
        ("NVRTC_ENGINE_REMOTE_CACHE", "http://cache:6379"),
        ("NVRTC_ENGINE_REMOTE_CACHE", "redis://cache:99999/0"),
        ("NVRTC_ENGINE_REMOTE_CACHE", "redis://cache:6379/zero"),
        ("NVRTC_ENGINE_REMOTE_PREFIX", "two words"),
        ("NVRTC_ENGINE_REMOTE_TIMEOUT", "0"),
        ("NVRTC_ENGINE_REMOTE_WAIT", "-1"),
        ("NVRTC_ENGINE_REMOTE_TTL", "forever"),
        ("NVRTC_ENGINE_CACHE_KEY", "short"),
        ("NVRTC_ENGINE_ANY_NVRTC", "maybe"),
    ],
)
def test_malformed_remote_settings_name_the_variable(var, value):
    with pytest.raises(ne.SettingsError, match=var):
        config.from_environment({var: value})


def test_messages_never_show_the_secret_or_a_password(tmp_path):
    with pytest.raises(ne.SettingsError) as info:
        config.from_environment({"NVRTC_ENGINE_REMOTE_CACHE": "redis://u:hunter2@h:6379/x"})
    assert "hunter2" not in str(info.value) and "***" in str(info.value)
    with pytest.raises(ne.SettingsError) as info:
        config.configure(cache_key="secret-too-shor")
    assert "secret-too-shor" not in str(info.value)
    shown = repr(config.configure(cache_key=SECRET))
    assert SECRET not in shown and "cache_key=" not in shown  # (str() is repr())
    assert shown.startswith("Settings(cache_dir=") and "cache_key_file=None" in shown
    (tmp_path / "k").write_text("tiny")
    with pytest.raises(ne.SettingsError, match="NVRTC_ENGINE_CACHE_KEY_FILE.*4 characters"):
        config.configure(cache_key=None, cache_key_file=tmp_path / "k").signing_key()
    with pytest.raises(ne.SettingsError, match="NVRTC_ENGINE_CACHE_KEY_FILE.*cannot be read"):
        config.configure(cache_key_file=tmp_path / "missing").signing_key()


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [("remote_cache", "redis://h:1/0", "redis://h:1/0"), ("remote_cache", None, None),
     ("remote_ttl", "60", 60.0), ("remote_wait", 2, 2.0), ("any_nvrtc", "on", True),
     ("cache_key", SECRET, SECRET), ("remote_prefix", "p", "p")],
)  # fmt: skip
def test_configure_takes_the_remote_settings(field, value, expected):
    assert getattr(config.configure(**{field: value}), field) == expected


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [("remote_cache", 6379, TypeError), ("remote_cache", "redis:/h", ValueError),
     ("remote_timeout", 0, ValueError), ("remote_retry", "soon", ValueError),
     ("cache_key", b"bytes-are-not-text!!", TypeError), ("remote_prefix", None, TypeError)],
)  # fmt: skip
def test_configure_checks_the_remote_settings(field, value, error):
    before = config.settings()
    with pytest.raises(error, match=field):
        config.configure(**{field: value})
    assert config.settings() == before


# -- signed entries --------------------------------------------------------------------------


def _entry(key=KEYS[0]):
    ne.get_kernel(key)
    return default_engine().tiers().disk.get(digest(key))


def test_a_signature_covers_the_header_fields_that_matter():
    value = _entry()
    signed = sign_entry(value, SECRET.encode())
    assert isinstance(check_entry(signed, digest(KEYS[0]), KEYS[0], secret=SECRET.encode()), tuple)
    assert check_entry(signed, None, secret=OTHER.encode()) == (
        "signed with another key, or altered after signing")  # fmt: skip
    assert check_entry(value, None, secret=SECRET.encode()).startswith("unsigned")
    assert isinstance(check_entry(signed, None), tuple)  # no key configured: not asked for
    for field, to in (
        (b'"-arch=sm_90"', b'"-arch=sm_80"'),
        (b'"kind": "cubin"', b'"kind": "cubiX"'),
    ):
        assert check_entry(signed.replace(field, to), None, secret=SECRET.encode()) == (
            "signed with another key, or altered after signing")  # fmt: skip
    # a field the signature leaves out (the compile time) changes nothing that is loaded
    digit = lambda m: m[1] + (b"2" if m[2] == b"1" else b"1")  # noqa: E731
    unsigned_field = re.sub(rb'("compile_ms": )(\d)', digit, signed, count=1)
    assert unsigned_field != signed
    assert isinstance(check_entry(unsigned_field, None, secret=SECRET.encode()), tuple)


def test_a_signed_bundle_is_checked_on_import_and_as_a_read_only_cache(tmp_path):
    config.configure(cache_key=SECRET)
    prewarm(KEYS, workers=1, progress=False)
    path = tmp_path / "signed.zip"
    export_bundle(path)
    config.configure(cache_dir=tmp_path / "same-key")
    ne.clear_cache(disk=False)
    assert len(import_bundle(path).keys) == 2
    config.configure(cache_dir=tmp_path / "other-key", cache_key=OTHER)
    with pytest.raises(BundleError, match="does not verify \\(signed with another key"):
        import_bundle(path)
    assert ne.cache_info().entries == 0
    config.configure(cache_dir=tmp_path / "other-key-ro", readonly_cache=[path])
    ne.clear_cache(disk=False)
    with pytest.warns(CacheWarning, match="read-only cache .* holds a bad entry .*another key"):
        assert ne.get_kernel(KEYS[0]).origin == "compiled"


def test_an_unsigned_bundle_is_refused_where_a_key_is_configured(tmp_path):
    prewarm(KEYS, workers=1, progress=False)
    export_bundle(tmp_path / "plain.zip")
    config.configure(cache_dir=tmp_path / "keyed", cache_key=SECRET)
    with pytest.raises(BundleError, match="unsigned, and a signing key is configured"):
        import_bundle(tmp_path / "plain.zip")


def test_the_disk_cache_is_not_signed(tmp_path):
    """The user's own directory: its entries are stored as they come and read without a
    signature (whoever may write it may change the installed package as well)."""
    config.configure(cache_key=SECRET)
    value = _entry()
    assert b'"signature": null' in value
    ne.clear_cache(disk=False)
    assert ne.get_kernel(KEYS[0]).origin == "disk"


# -- entries of another NVRTC, on request ----------------------------------------------------


def _other_nvrtc_bundle(tmp_path, monkeypatch):
    """A bundle built here (this NVRTC), and this process turned into one whose NVRTC is
    "13.0" (the digest's input and what bundles compare with) and whose disk cache is empty."""
    built = nvrtc.nvrtc_identity()
    prewarm(KEYS, workers=1, progress=False)
    path = tmp_path / "built-elsewhere.zip"
    export_bundle(path)
    assert built != "13.0"
    monkeypatch.setattr(nvrtc, "nvrtc_identity", lambda: "13.0")
    monkeypatch.setattr(bundle, "nvrtc_version", lambda: "13.0")
    config.configure(cache_dir=tmp_path / "gpu-host")
    ne.clear_cache(disk=False)
    return path, built


def test_another_nvrtcs_bundle_is_refused_unless_asked_for(tmp_path, monkeypatch, capsys):
    path, built = _other_nvrtc_bundle(tmp_path, monkeypatch)
    with pytest.raises(BundleError, match=f"built with NVRTC {built}.*--any-nvrtc"):
        import_bundle(path)
    assert main(["cache", "import", "--any-nvrtc", str(path)]) == 0
    out = capsys.readouterr().out
    assert "0 loaded on this machine's GPU, 2 unchecked" in out
    assert main(["cache", "list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {(r["nvrtc"], r["other_nvrtc"], r["current"]) for r in rows} == {
        (built, "unchecked", True)}  # fmt: skip
    assert main(["cache", "list"]) == 0
    assert f"{built} (other NVRTC, unchecked)" in capsys.readouterr().out
    kernels = [ne.get_kernel(k) for k in KEYS]  # no GPU here: stays unchecked, not compiled
    assert {k.origin for k in kernels} == {"unchecked"} and ne.cache_info().compiles == 0
    assert {k.artifact.nvrtc_version for k in kernels} == {built}


def test_an_imported_kernel_is_loaded_once_on_a_gpu_then_trusted(tmp_path, monkeypatch, capsys):
    path, _ = _other_nvrtc_bundle(tmp_path, monkeypatch)
    import_bundle(path, any_nvrtc=True)
    loads = []
    monkeypatch.setattr(engine, "try_load", lambda key, artifact: loads.append(key) or True)
    assert ne.get_kernel(KEYS[0]).origin == "disk" and loads == [KEYS[0]]
    assert ne.get_kernel(KEYS[0]).origin == "disk" and loads == [KEYS[0]]  # once
    ne.clear_cache(disk=False)
    assert ne.get_kernel(KEYS[0]).origin == "disk" and loads == [KEYS[0]]  # the disk says so
    assert main(["cache", "list", "--json"]) == 0
    marks = {r["key"]: r["other_nvrtc"] for r in json.loads(capsys.readouterr().out)}
    assert marks == {str(KEYS[0]): "loads", str(KEYS[1]): "unchecked"}


def test_an_imported_kernel_the_driver_refuses_is_compiled_here(tmp_path, monkeypatch):
    path, _ = _other_nvrtc_bundle(tmp_path, monkeypatch)
    import_bundle(path, any_nvrtc=True)

    def refuse(key, artifact):
        raise CudaError("cuModuleLoadData", 209, "CUDA_ERROR_NO_BINARY_FOR_GPU")

    monkeypatch.setattr(engine, "try_load", refuse)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        kernel = ne.get_kernel(KEYS[0])
    assert kernel.origin == "compiled" and ne.cache_info().compiles == 1
    assert any("does not load here" in str(w.message) for w in record)
    monkeypatch.setattr(bundle, "try_load", refuse)  # and a GPU refusing it at import
    config.configure(cache_dir=tmp_path / "third")
    with pytest.raises(BundleError, match="does not load on this machine's GPU"):
        import_bundle(path, any_nvrtc=True)


def test_a_read_only_cache_of_another_nvrtc_is_used_on_request(tmp_path, monkeypatch):
    path, _ = _other_nvrtc_bundle(tmp_path, monkeypatch)
    config.configure(readonly_cache=[path], any_nvrtc=True)
    ne.clear_cache(disk=False)
    assert {ne.get_kernel(k).origin for k in KEYS} == {"unchecked"}
    assert ne.cache_info().compiles == 0 and ne.cache_info().entries == 2  # filed on disk
    config.configure(cache_dir=tmp_path / "not-asked", any_nvrtc=False)
    ne.clear_cache(disk=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CacheWarning)  # (NVRTC 13.x is no "13.0": not stored)
        assert ne.get_kernel(KEYS[0]).origin == "compiled"


def test_try_load_without_a_gpu_is_false():
    from nvrtc_engine.core import driver

    if driver.device_count():
        pytest.skip("a GPU is present")
    ne.get_kernel(KEYS[0])
    assert engine.try_load(KEYS[0], ne.get_kernel(KEYS[0]).artifact) is False
