"""nvrtc_engine: CUDA kernels specialized at run time, compiled with NVRTC, cached on disk.

    >>> import nvrtc_engine as ne
    >>> k = ne.get_kernel("gelu", dtype="fp8")          # bf16 -> fp8_e4m3, tensor scaling
    >>> y = k(x, scale=scale, amax=amax, scale_inv=scale_inv)

Importing the package starts neither CUDA nor NVRTC; both start on first use. See
:mod:`nvrtc_engine.core.errors` for the exception tree.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._version import __version__

if TYPE_CHECKING:  # (for type checkers; at run time each name is imported on first use)
    from .api import CacheInfo, cache_info, clear_cache, get_kernel
    from .core.config import configure
    from .core.driver import DeviceBuffer
    from .core.dtypes import DTYPES, DType
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
    from .core.make import make_key
    from .core.registry import registered_ops
    from .families.shared.blockscale import BlockScaledOutput
    from .families.shared.blockscale import BlockScaledOutput as MXFP8Output
    from .tools.prewarm import PrewarmReport, prewarm

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


# Where each public name lives: the package imports a module when one of its names is first
# asked for, so `import nvrtc_engine` (and the command line, which imports what its command
# needs) starts nothing it does not use.
_ERRORS = ("ArgumentError ArgumentTypeError BundleError CacheWarning CompileError CudaError "
           "HeaderNotFoundError NoDeviceError NvrtcEngineError SettingsError SettingsTypeError "
           "VariantError VariantListError VariantTypeError")  # fmt: skip
_WHERE = {
    **dict.fromkeys(("CacheInfo", "cache_info", "clear_cache", "get_kernel"), "api"),
    "configure": "core.config",
    "DeviceBuffer": "core.driver",
    **dict.fromkeys(("DTYPES", "DType"), "core.dtypes"),
    **dict.fromkeys(_ERRORS.split(), "core.errors"),
    "Kernel": "core.kernel",
    "KernelKey": "core.key",
    "make_key": "core.make",
    "registered_ops": "core.registry",
    # one result type served every family; MXFP8Output is its name from before
    **dict.fromkeys(("BlockScaledOutput", "MXFP8Output"), "families.shared.blockscale"),
    **dict.fromkeys(("prewarm", "PrewarmReport"), "tools.prewarm"),
}


def __getattr__(name: str) -> Any:
    """A public name, from its module (:data:`_WHERE`), imported on first use."""
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    module = importlib.import_module(f"{__name__}.{where}")
    value = getattr(module, "BlockScaledOutput" if name == "MXFP8Output" else name)
    globals()[name] = value  # (asked once)
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
