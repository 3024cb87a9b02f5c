"""Warnings of nvrtc_engine name the caller's line, however deep in the engine they arise."""

from __future__ import annotations

import inspect
import warnings

import pytest

import nvrtc_engine as ne
from nvrtc_engine import CacheWarning
from nvrtc_engine.core import config, errors


def _line_after() -> int:
    """The line after the caller's: where the call under test is."""
    return inspect.currentframe().f_back.f_lineno + 1


def test_warn_skips_the_package_frames(monkeypatch):
    """errors.warn called through package frames (here: as if cache.py called it from
    engine.py from api.py) is attributed to the first frame outside the package."""
    code = compile(
        "def inner(warn):\n    warn('deep', UserWarning)\ndef outer(warn):\n    inner(warn)\n",
        errors._PACKAGE_DIR + "_pretend.py",
        "exec",
    )
    namespace: dict = {}
    exec(code, namespace)
    with pytest.warns(UserWarning, match="deep") as record:
        line = _line_after()
        namespace["outer"](errors.warn)
    assert (record[0].filename, record[0].lineno) == (__file__, line)


@pytest.mark.parametrize("call", ["get_kernel", "get_kernel(key)", "prewarm", "cache_info"])
def test_an_unusable_cache_directory_warns_at_the_callers_line(call, tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    monkeypatch.setenv("NVRTC_ENGINE_CACHE_DIR", str(blocker / "cache"))
    config.reset()
    ne.clear_cache(disk=False)
    key = ne.make_key("gelu", dtype="bf16", arch="sm_90")
    with pytest.warns(CacheWarning, match="memory only") as record:
        if call == "get_kernel":
            line = _line_after()
            ne.get_kernel("gelu", dtype="bf16", arch="sm_90")
        elif call == "get_kernel(key)":
            line = _line_after()
            ne.get_kernel(key)
        elif call == "prewarm":
            line = _line_after()
            ne.prewarm([key], workers=1, progress=False)
        else:
            line = _line_after()
            ne.cache_info()
    assert len(record) == 1
    assert (record[0].filename, record[0].lineno) == (__file__, line)


def test_an_unusable_debug_directory_warns_at_the_callers_line(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("NVRTC_ENGINE_DUMP_SOURCE", "1")
    monkeypatch.setenv("NVRTC_ENGINE_DEBUG_DIR", str(blocker / "debug"))
    config.reset()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        line = _line_after()
        ne.get_kernel("gelu", dtype="bf16", arch="sm_90")
    ours = [w for w in record if "cannot write rendered sources" in str(w.message)]
    assert len(ours) == 1
    assert (ours[0].filename, ours[0].lineno) == (__file__, line)


def test_variant_list_and_bundle_errors_pickle_round_trip():
    """The two errors defined beside their modules survive pickling (process pools), with
    their attributes, as every other error of the package does."""
    import pickle

    for err in (
        ne.VariantListError("v.toml", 3, "op='gelu': bad"),
        ne.VariantListError("v.json", None, "duplicate key 'op'"),
        ne.BundleError("k.zip", "gelu_bf16_bf16_none_rowwise_hany_sm90", "sha256 differs"),
        ne.BundleError("k.zip", None, "no manifest.json"),
    ):
        again = pickle.loads(pickle.dumps(err))
        assert type(again) is type(err) and str(again) == str(err)
        assert again.__dict__ == err.__dict__ and again.entry == err.entry
        assert isinstance(again, ne.NvrtcEngineError) and isinstance(again, ValueError)
