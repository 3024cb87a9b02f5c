"""Environment variables: typed, validated, overridable in code."""

from __future__ import annotations

from pathlib import Path

import pytest

import nvrtc_engine as ne
from nvrtc_engine.core import config
from nvrtc_engine.core.errors import SettingsTypeError


def test_defaults_and_parsing():
    s = config.from_environment({})
    assert s.cache_dir is None and not s.disable_disk_cache and s.cache_size_limit == 512 << 20
    s = config.from_environment(
        {
            "NVRTC_ENGINE_CACHE_DIR": "~/k",
            "NVRTC_ENGINE_DISABLE_DISK_CACHE": "yes",
            "NVRTC_ENGINE_CACHE_SIZE_LIMIT": "2G",
            "NVRTC_ENGINE_WORKERS": "4",
            "NVRTC_ENGINE_CUDA_INCLUDE_DIR": "/opt/cuda/include",
        }
    )
    assert s.cache_dir == Path("~/k").expanduser() and s.disable_disk_cache
    assert s.cache_size_limit == 2 << 30 and s.workers == 4
    assert s.cuda_include_dir == Path("/opt/cuda/include")
    mib = config.from_environment({"NVRTC_ENGINE_CACHE_SIZE_LIMIT": "512MiB"})
    assert mib.cache_size_limit == 512 << 20


@pytest.mark.parametrize(
    ("var", "value"),
    [
        ("NVRTC_ENGINE_DISABLE_DISK_CACHE", "maybe"),
        ("NVRTC_ENGINE_CACHE_SIZE_LIMIT", "lots"),
        ("NVRTC_ENGINE_CACHE_SIZE_LIMIT", "-1"),
        ("NVRTC_ENGINE_WORKERS", "0"),
        ("NVRTC_ENGINE_DUMP_SOURCE", "2"),
        ("NVRTC_ENGINE_LOCK_TIMEOUT", "soon"),
        ("NVRTC_ENGINE_LOCK_TIMEOUT", "-1"),
        ("NVRTC_ENGINE_LOCK_TIMEOUT", "inf"),
    ],
)
def test_malformed_values_name_the_variable(var, value):
    with pytest.raises(ne.SettingsError, match=var) as info:
        config.from_environment({var: value})
    assert isinstance(info.value, ValueError) and isinstance(info.value, ne.NvrtcEngineError)


def test_configure_values_raise_settings_errors():
    with pytest.raises(ne.SettingsError, match="workers"):
        config.configure(workers=0)
    with pytest.raises(ne.SettingsError, match="lock_timeout"):
        config.configure(lock_timeout=-1)
    config.reset()


def test_configure_and_reset(tmp_path):
    s = config.configure(cache_dir=str(tmp_path))
    assert s.cache_dir == tmp_path and config.settings().cache_dir == tmp_path
    with pytest.raises(SettingsTypeError, match="unknown setting"):
        config.configure(cache_directory=tmp_path)
    config.reset()
    assert config.settings().cache_dir != tmp_path


@pytest.mark.parametrize(
    "field, value, expected",
    [
        ("cache_size_limit", "512M", 512 << 20),  # the environment variable's spelling
        ("cache_size_limit", 1 << 20, 1 << 20),  # the minimum
        ("cache_size_limit", "1MiB", 1 << 20),
        ("disable_disk_cache", "no", False),
        ("disable_disk_cache", True, True),
        ("workers", "2", 2),
        ("workers", None, None),
        ("lock_timeout", 5, 5.0),
        ("dump_source", "on", True),
    ],
)
def test_configure_takes_the_variables_spellings(field, value, expected):
    try:
        assert getattr(config.configure(**{field: value}), field) == expected
    finally:
        config.reset()


@pytest.mark.parametrize(
    "field, value, error",
    [
        ("cache_size_limit", 0, ValueError),
        ("cache_size_limit", -1, ValueError),
        ("cache_size_limit", "lots", ValueError),
        ("cache_size_limit", True, TypeError),
        ("cache_size_limit", 1.5, TypeError),
        ("disable_disk_cache", 1, TypeError),
        ("disable_disk_cache", "maybe", ValueError),
        ("workers", 0, ValueError),
        ("workers", "-2", ValueError),
        ("lock_timeout", "abc", ValueError),
        ("lock_timeout", float("inf"), ValueError),
        ("lock_timeout", -1, ValueError),
        ("cache_dir", 123, TypeError),
        ("debug_dir", b"/tmp", TypeError),
    ],
)
def test_configure_checks_values_and_keeps_the_settings(field, value, error):
    before = config.settings()
    with pytest.raises(error, match=field):
        config.configure(**{field: value})
    assert config.settings() == before


@pytest.mark.parametrize("xdg", [None, "", "   ", "/tmp/xdg-cache", "relative/cache"])
def test_default_cache_dir_is_platform_user_cache(monkeypatch, xdg):
    import platformdirs

    if xdg is None:
        monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    else:
        monkeypatch.setenv("XDG_CACHE_HOME", xdg)
    expected = platformdirs.user_cache_dir("nvrtc_engine", appauthor=False)
    assert config.default_cache_dir() == expected
    if Path(expected).is_absolute():
        assert config.from_environment({}).resolved_cache_dir() == Path(expected)


def test_lock_timeout():
    assert config.from_environment({}).lock_timeout == 60.0
    assert config.from_environment({"NVRTC_ENGINE_LOCK_TIMEOUT": "2.5"}).lock_timeout == 2.5


def test_no_home_for_the_default_cache_dir_is_an_error_not_a_relative_path(monkeypatch):
    monkeypatch.setattr(config, "default_cache_dir", lambda: "~/.cache/nvrtc_engine")
    with pytest.raises(OSError, match="no home directory"):
        config.from_environment({}).resolved_cache_dir()


@pytest.mark.parametrize("raw", ["512", "1e3", "4096", "1023K", "0.5M", "512b"])
def test_a_size_limit_below_the_minimum_is_refused_naming_the_variable(raw):
    # an empty diskcache already takes ~32 kB: below 1 MiB every store was evicted at once
    with pytest.raises(ne.SettingsError, match=r"NVRTC_ENGINE_CACHE_SIZE_LIMIT.*minimum.*1 MiB"):
        config.from_environment({"NVRTC_ENGINE_CACHE_SIZE_LIMIT": raw})
    assert config.from_environment({"NVRTC_ENGINE_CACHE_SIZE_LIMIT": "1M"}).cache_size_limit == (
        config.MIN_SIZE_LIMIT
    )


def test_a_unit_less_size_limit_says_it_is_bytes():
    with pytest.raises(ne.SettingsError, match="without a unit is bytes.*512M"):
        config.from_environment({"NVRTC_ENGINE_CACHE_SIZE_LIMIT": "512"})


@pytest.mark.parametrize("value", [512, "1e3", (1 << 20) - 1])
def test_configure_refuses_a_size_limit_below_the_minimum(value):
    before = config.settings()
    with pytest.raises(ne.SettingsError, match=r"configure\(cache_size_limit=.*minimum.*1 MiB"):
        config.configure(cache_size_limit=value)
    assert config.settings() == before


@pytest.mark.parametrize("raw", ["inf", "nan", "1e400"])
def test_an_infinite_size_limit_is_a_settings_error(raw):
    with pytest.raises(ne.SettingsError, match="NVRTC_ENGINE_CACHE_SIZE_LIMIT"):
        config.from_environment({"NVRTC_ENGINE_CACHE_SIZE_LIMIT": raw})


@pytest.mark.parametrize(
    "field, value",
    [
        ("workers", True),
        ("workers", 2.0),
        ("cache_size_limit", 1.5),
        ("cache_size_limit", True),
        ("dependent_launch", 2),
        ("disable_disk_cache", 1),
        ("cache_dir", 3),
        ("debug_dir", b"/tmp"),
        ("lock_timeout", [1]),
    ],
)
def test_configure_type_errors_are_settings_type_errors(field, value):
    before = config.settings()
    with pytest.raises(SettingsTypeError, match=rf"configure\({field}=") as info:
        config.configure(**{field: value})
    assert isinstance(info.value, TypeError) and isinstance(info.value, ne.SettingsError)
    assert config.settings() == before


@pytest.mark.parametrize("field", ["cache_dir", "cuda_include_dir", "debug_dir"])
def test_configure_refuses_an_empty_path(field):
    before = config.settings()
    with pytest.raises(ne.SettingsError, match=rf"configure\({field}=''\): .*empty.*None"):
        config.configure(**{field: ""})
    assert config.settings() == before
    assert getattr(config.configure(**{field: None}), field) is None  # None: the default
    config.reset()


@pytest.mark.parametrize("raw", ["9223372036854775807", "1e30", "4611686018427387905", "8E18"])
def test_a_size_limit_above_the_maximum_is_refused_naming_the_variable(raw):
    # diskcache stores the limit in SQLite, whose INTEGER ends at 2**63 - 1: a larger limit
    # broke the first open ("Python int too large to convert to SQLite INTEGER")
    with pytest.raises(ne.SettingsError, match=r"NVRTC_ENGINE_CACHE_SIZE_LIMIT.*maximum"):
        config.from_environment({"NVRTC_ENGINE_CACHE_SIZE_LIMIT": raw})
    top = config.from_environment({"NVRTC_ENGINE_CACHE_SIZE_LIMIT": str(config.MAX_SIZE_LIMIT)})
    assert top.cache_size_limit == config.MAX_SIZE_LIMIT == 1 << 62


@pytest.mark.parametrize("value", [10**40, 2**63, config.MAX_SIZE_LIMIT + 1, "1e30"])
def test_configure_refuses_a_size_limit_above_the_maximum(value):
    before = config.settings()
    with pytest.raises(ne.SettingsError, match=r"configure\(cache_size_limit=.*maximum"):
        config.configure(cache_size_limit=value)
    assert config.settings() == before


def test_a_size_limit_at_the_maximum_opens_a_disk_cache(tmp_path):
    from nvrtc_engine.core.tiers import DiskTier

    disk, _why = DiskTier.open(tmp_path / "c", config.MAX_SIZE_LIMIT)
    assert disk is not None and disk.size_limit == config.MAX_SIZE_LIMIT
    disk.close()


@pytest.mark.parametrize("field", ["cache_dir", "cuda_include_dir", "debug_dir"])
def test_a_nul_in_a_path_setting_is_refused(field):
    var = f"NVRTC_ENGINE_{field.upper()}"
    with pytest.raises(ne.SettingsError, match=rf"{var}=.*NUL"):
        config.from_environment({var: "a\0b"})
    before = config.settings()
    for value in ("a\0b", Path("/tmp/a\0b")):
        with pytest.raises(ne.SettingsError, match=rf"configure\({field}=.*NUL"):
            config.configure(**{field: value})
    assert config.settings() == before


def test_workers_are_capped_as_the_command_line_caps_them():
    with pytest.raises(ne.SettingsError, match=r"NVRTC_ENGINE_WORKERS='2000'.*up to 1024"):
        config.from_environment({"NVRTC_ENGINE_WORKERS": "2000"})
    assert config.from_environment({"NVRTC_ENGINE_WORKERS": "1024"}).workers == 1024
    before = config.settings()
    for value in (2000, "2000", 10**30):
        with pytest.raises(ne.SettingsError, match=r"configure\(workers=.*up to 1024"):
            config.configure(workers=value)
    assert config.settings() == before
    assert config.MAX_WORKERS == 1024
