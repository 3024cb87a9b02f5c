"""nvrtc_engine: CUDA kernels specialized at run time, compiled with NVRTC, cached on disk.

    >>> import nvrtc_engine as ne
    >>> k = ne.get_kernel("gelu", dtype="fp8")          # bf16 -> fp8_e4m3, tensor scaling
    >>> y = k(x, scale=scale, amax=amax, scale_inv=scale_inv)

Importing the package starts neither CUDA nor NVRTC; both start on first use. See
:mod:`nvrtc_engine.core.errors` for the exception tree.
"""

from __future__ import annotations

from typing import Any

from ._version import __version__
from .api import cache_info, clear_cache, get_kernel, make_key
from .core.config import configure
from .core.driver import DeviceBuffer
from .core.dtypes import DTYPES, DType
from .core.engine import CacheInfo
from .core.errors import (
    ArgumentError,
    ArgumentTypeError,
    BundleError,
    CacheWarning,
    CompileError,
    CudaError,
    HeaderNotFoundError,
    NoDeviceError,
    NvrtcEngineError,
    SettingsError,
    SettingsTypeError,
    VariantError,
    VariantListError,
    VariantTypeError,
)
from .core.kernel import Kernel
from .core.key import KernelKey
from .core.registry import registered_ops

__all__ = [
    "ArgumentError",
    "ArgumentTypeError",
    "BlockScaledOutput",
    "BundleError",
    "CacheInfo",
    "CacheWarning",
    "CompileError",
    "CudaError",
    "DTYPES",
    "DType",
    "DeviceBuffer",
    "HeaderNotFoundError",
    "Kernel",
    "KernelKey",
    "MXFP8Output",
    "NoDeviceError",
    "NvrtcEngineError",
    "PrewarmReport",
    "SettingsError",
    "SettingsTypeError",
    "VariantError",
    "VariantListError",
    "VariantTypeError",
    "__version__",
    "cache_info",
    "clear_cache",
    "configure",
    "get_kernel",
    "make_key",
    "prewarm",
    "registered_ops",
]


def __getattr__(name: str) -> Any:
    """The names whose modules are imported on first use, not with the package:
    ``BlockScaledOutput`` (also ``MXFP8Output``, its name before one type served every
    family; no family code is imported with the package), ``prewarm`` and ``PrewarmReport``
    (:mod:`nvrtc_engine.tools.prewarm`)."""
    if name in ("BlockScaledOutput", "MXFP8Output"):
        from .families.shared.blockscale import BlockScaledOutput as value
    elif name in ("prewarm", "PrewarmReport"):
        from .tools import prewarm as module

        value = getattr(module, name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # (asked once)
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
