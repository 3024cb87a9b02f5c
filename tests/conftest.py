"""Shared fixtures: an isolated cache per test, and the `gpu` marker's skip rule."""

from __future__ import annotations

import pytest

import nvrtc_engine as ne
from nvrtc_engine.core import config


def _gpu_count() -> int:
    from nvrtc_engine.core import driver

    return driver.device_count()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not any("gpu" in item.keywords for item in items):
        return
    if _gpu_count() > 0:
        return
    skip = pytest.mark.skip(reason="no CUDA device visible")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def stub_kernel_cache(tmp_path_factory):
    """One disk cache for the subprocesses that launch against the stub libcuda
    (tests/stub_driver.py): the kernels they share compile once per session."""
    return tmp_path_factory.mktemp("stub-kernels")


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path, monkeypatch):
    """Each test gets its own empty cache directory and a fresh engine."""
    cache_dir = tmp_path / "kernel-cache"
    monkeypatch.setenv("NVRTC_ENGINE_CACHE_DIR", str(cache_dir))
    monkeypatch.setenv("NVRTC_ENGINE_DEBUG_DIR", str(tmp_path / "debug"))
    for var in (
        "NVRTC_ENGINE_DISABLE_DISK_CACHE",
        "NVRTC_ENGINE_CACHE_SIZE_LIMIT",
        "NVRTC_ENGINE_CUDA_INCLUDE_DIR",
        "NVRTC_ENGINE_DUMP_SOURCE",
        "NVRTC_ENGINE_REMOTE_CACHE",
        "NVRTC_ENGINE_CACHE_KEY",
        "NVRTC_ENGINE_CACHE_KEY_FILE",
        "NVRTC_ENGINE_ANY_NVRTC",
    ):
        monkeypatch.delenv(var, raising=False)
    config.reset()
    ne.clear_cache(disk=False)
    ne.clear_cache(memory=False)
    yield cache_dir
    ne.clear_cache(disk=False)
    ne.clear_cache(memory=False)
    config.reset()


@pytest.fixture
def read_only_diskcache(monkeypatch):
    """A function that makes ``diskcache`` refuse to open a cache as it does in a read-only
    directory (root, who runs some CI, ignores permissions) and has the default engine open
    its directory again (which it then finds unusable)."""

    def apply() -> None:
        import sqlite3

        import diskcache

        def refuse(*args, **kwargs):
            raise sqlite3.OperationalError("attempt to write a readonly database")

        monkeypatch.setattr(diskcache, "Cache", refuse)
        config.reset()
        ne.clear_cache(disk=False)

    return apply
