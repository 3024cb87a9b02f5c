"""The core: the key, rendering, NVRTC compilation, the cache and its tiers, the driver and
the one launch path. It imports no family: ops are found through the registry
(:mod:`.registry`), which is imported here so that every key validates through it."""

from . import registry as registry
