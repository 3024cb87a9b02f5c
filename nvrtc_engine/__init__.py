"""nvrtc_engine: CUDA kernels specialized at run time, compiled with NVRTC, cached on disk.

    >>> import nvrtc_engine as ne
    >>> k = ne.get_kernel("gelu", dtype="fp8")          # bf16 -> fp8_e4m3, tensor scaling
    >>> y = k(x, scale=scale, amax=amax, scale_inv=scale_inv)

Importing the package starts neither CUDA nor NVRTC; both start on first use. See
:mod:`nvrtc_engine.errors` for the exception tree.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._version import __version__
from .api import cache_info, clear_cache, get_kernel, make_key
from .config import configure
from .driver import DeviceBuffer
from .dtypes import DTYPES, DType
from .engine import CacheInfo
from .errors import (
    ArgumentError,
    ArgumentTypeError,
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
from .kernel import Kernel
from .key import KernelKey
from .ops import registered_ops
from .ops.mxfp8 import MXFP8Output
from .prewarm import PrewarmReport, prewarm  # the function shadows the submodule's name

if TYPE_CHECKING:
    from .bundle import BundleError

__all__ = [
    "ArgumentError",
    "ArgumentTypeError",
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
    """``BundleError`` on first use (:mod:`nvrtc_engine.bundle`, with its zip and disk cache
    modules, is not imported with the package)."""
    if name == "BundleError":
        from .bundle import BundleError

        return BundleError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
