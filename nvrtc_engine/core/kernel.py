"""A compiled kernel variant: its image, its per-device functions, and the launch helpers.

:class:`Kernel` is what :func:`~nvrtc_engine.get_kernel` returns. Each kernel family
subclasses it with a ``__call__`` that binds arrays to parameters; this module holds what
they share: lazy per-device loading, device checks, and the launch.

A family's ``__call__`` first reads the call's key from its tensors (:meth:`Kernel._fast1`,
``_fast2``, ``_fast3`` by hand, :meth:`Kernel._fastn` for any number): a call whose key was
seen before launches through the key's prepared launch (:mod:`nvrtc_engine.core.launch`); any
other takes the family's checked path, which checks every argument, raises the errors, and
hands its launches to :meth:`Kernel._submit`, which also prepares them for the key.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from typing import TYPE_CHECKING, Any, NamedTuple

from . import driver
from .errors import ArgumentError, NoDeviceError
from .interop import TORCH_TYPES, Array, allocate_like, as_array, stream_handle
from .key import arch_number
from .launch import MAX_PREPARED, call_key, launch, prepare

if TYPE_CHECKING:
    from collections.abc import Sequence

    from .dtypes import DType
    from .key import KernelKey
    from .launch import LaunchSpec

__all__ = ["Artifact", "Kernel", "Loaded", "try_load"]


class Artifact(NamedTuple):
    """What the cache stores for one variant.

    Attributes: ``image`` (cubin, or PTX for archs newer than NVRTC), ``kind``
    (``"cubin"``/``"ptx"``), ``symbols`` (kernel names in the image), ``digest`` (the cache
    digest), ``nvrtc_version``, ``options`` (NVRTC flags) and ``compile_ms``.
    """

    image: bytes
    kind: str
    symbols: tuple[str, ...]
    digest: str
    nvrtc_version: str
    options: tuple[str, ...]
    compile_ms: float

    def __repr__(self) -> str:  # the image's bytes would run to hundreds of KB
        return (
            f"Artifact({self.kind}, {len(self.image)} bytes, symbols={self.symbols!r}, "
            f"digest={self.digest[:12]!r}..., nvrtc={self.nvrtc_version}, "
            f"compile_ms={self.compile_ms:.1f})"
        )


class Loaded(NamedTuple):
    """A kernel loaded on one device: the device, its module and its functions
    (``CUfunction``, in the order of the artifact's symbols)."""

    device: driver.Device
    functions: tuple[Any, ...]
    module: Any


def runs_on(key_arch: str, device_arch: str) -> bool:
    """Whether a cubin built for ``key_arch`` runs on a device of ``device_arch``.

    Same major version and a minor version no newer than the device's; an ``a``/``f``
    (arch-specific) cubin only on exactly its arch (``f``: same family, newer minor).
    """
    k, d = arch_number(key_arch), arch_number(device_arch)
    if key_arch.endswith("a"):
        return k == d
    return k // 10 == d // 10 and k <= d


def try_load(key: KernelKey, artifact: Artifact) -> bool:
    """Load ``artifact`` once on the first GPU here whose arch runs ``key``'s
    (``cuModuleLoadData``, then unloaded): True; False where no GPU here runs it (none, or
    none of that arch). Raises :class:`~nvrtc_engine.CudaError` where the driver refuses it."""
    for ordinal in range(driver.device_count()):
        dev = driver.get_device(ordinal)
        if artifact.kind == "cubin" and not runs_on(key.arch, dev.arch):
            continue
        module, _function = driver.load_function(dev, artifact.image, artifact.symbols[0])
        with contextlib.suppress(Exception):  # (an unload that fails only leaks a module)
            driver._drv().cuModuleUnload(module)
        return True
    return False


class Kernel:
    """A compiled variant of one op, loadable on any device of its arch.

    Attributes: ``key`` (:class:`~nvrtc_engine.KernelKey`), ``artifact``
    (:class:`Artifact`: image, symbols, digest...), ``origin`` (how this process got it:
    ``"compiled"``; ``"disk"`` from the disk cache or a read-only cache; ``"remote"``;
    ``"unchecked"``: built by another NVRTC, not loaded on a GPU here yet), ``config`` (the
    family's launch configuration). Calling it
    launches it; see the family's ``__call__``.
    Loading on a device happens on the first launch there, once.
    """

    def __init__(self, key: KernelKey, artifact: Artifact, origin: str) -> None:
        self.key = key
        self.artifact = artifact
        self.origin = origin
        self._loaded: dict[int, Loaded] = {}
        self._lock = threading.Lock()
        self._prepared: dict[Any, Any] = {}  # call key -> prepared run (nvrtc_engine.core.launch)
        self._dependent = self._dependent_launch()  # decided once, when the kernel is made
        from . import native_launch  # (here: a process that makes no kernel loads no launcher)

        self._native = native_launch.bind(self)  # the compiled launcher's _fast1... (or not)

    def __repr__(self) -> str:
        config = getattr(self, "_config", None)  # its label (tag) as the symbol carries it
        tag = getattr(config, "label", None) or getattr(config, "tag", None)
        return (f"<Kernel {self.key}{f' [{tag}]' if tag else ''} {self.artifact.kind} "
                f"{len(self.artifact.image)} B ({self.origin})>")  # fmt: skip

    @property
    def name(self) -> str:
        """The canonical variant name, ``str(key)``."""
        return str(self.key)

    @property
    def config(self) -> Any:
        """The launch configuration this kernel was rendered and is launched with, chosen
        from its key when the kernel was made (read-only; each family sets ``_config``): an
        activation kernel's ``ActivationConfig``, a norm kernel's ``norm.ForwardConfig`` or
        ``norm.BackwardConfig``, a cast kernel's ``TileConfig``, ``quantize``'s
        ``QuantizeConfig``."""
        return self._config

    def loaded(self, device: int = 0) -> Loaded:
        """The kernel's functions on ``device`` (a CUDA device ordinal; 0 by default, as for a
        norm kernel's ``residency``), loading the image there on first use.

        Raises :class:`~nvrtc_engine.ArgumentError` when the device's arch cannot run this
        image or ``device`` is no visible device's ordinal (a negative one or one beyond
        2**31 - 1 without asking the driver; :class:`~nvrtc_engine.ArgumentTypeError` for one
        that is not an int), :class:`~nvrtc_engine.CudaError` when loading fails,
        :class:`~nvrtc_engine.NoDeviceError` without a driver or device (naming the kernel and
        saying that compiling needs neither).
        """
        got = self._loaded.get(device)
        if got is not None:
            return got
        try:
            dev = driver.get_device(device)
        except NoDeviceError as exc:  # (residency, launch_grid and the like ask here first)
            raise NoDeviceError(
                f"{self.artifact.symbols[0]} cannot be loaded on device {device}: "
                f"{str(exc).rstrip('. ')} "
                "(loading a kernel, to run it or to ask for its occupancy, needs a CUDA "
                "device; compiling and caching it do not)"
            ) from None
        if self.artifact.kind == "cubin" and not runs_on(self.key.arch, dev.arch):
            raise ArgumentError(
                "device",
                f"device {device} is {dev.name} ({dev.arch}); this kernel is a cubin for "
                f"{self.key.arch}. Get one for that device: get_kernel(..., arch='{dev.arch}')",
            )
        with self._lock:
            got = self._loaded.get(device)
            if got is None:
                module, first = driver.load_function(
                    dev, self.artifact.image, self.artifact.symbols[0]
                )
                functions = [first]
                for symbol in self.artifact.symbols[1:]:
                    functions.append(driver.check(
                        driver._drv().cuModuleGetFunction(module, symbol.encode()),
                        "cuModuleGetFunction"))  # fmt: skip
                drv = driver._drv()
                attr = drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
                for function, size in zip(functions, self._shared, strict=False):
                    if size:  # above 48 KB a function must opt in before it is launched
                        driver.check(drv.cuFuncSetAttribute(function, attr, size),
                                     "cuFuncSetAttribute")  # fmt: skip
                got = Loaded(dev, tuple(functions), module)
                self._loaded[device] = got
        return got

    def _shared_bytes(self) -> tuple[int, ...]:
        """Dynamic shared memory (bytes) of each function at launch, in the order of the
        artifact's symbols; empty (the default) where none takes any. A family that
        overrides it gets the opt-in attribute set when the image is loaded."""
        return ()

    @functools.cached_property
    def _shared(self) -> tuple[int, ...]:
        """:meth:`_shared_bytes`, worked out once per kernel (launches read it)."""
        return self._shared_bytes()

    def _waits_for_grid(self) -> bool:
        """Whether every function of this kernel calls ``nve::grid_dependency_wait()``
        before its first access to global memory (templates/include/nve_memory.cuh), so
        that it may be launched as a programmatic dependent launch. False (the default)
        unless a family's template does."""
        return False

    def _dependent_launch(self) -> bool:
        """Whether to launch with CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        (``self._dependent``, set when the kernel is made; launches read it): the kernel
        waits for its grid dependency (:meth:`_waits_for_grid`), its arch is sm_90 or newer
        (where ``griddepcontrol`` exists) and ``NVRTC_ENGINE_DEPENDENT_LAUNCH`` is on."""
        from . import config

        if not (self._waits_for_grid() and config.settings().dependent_launch):
            return False
        try:
            return arch_number(self.key.arch) >= 90
        except ValueError:  # an arch that names no compute capability
            return False

    # Launching: prepared launches, and the checked path's launches ----------------------------
    # _fast1/_fast2/_fast3 read the call key (nvrtc_engine.core.launch.call_key) of one, two or
    # three given tensors by hand, _fastn of any number: the families' __call__ picks one by
    # the arguments given. Each returns what the prepared launch allocated (a tuple, empty when
    # nothing), or None when the call has no prepared launch (then the checked path runs).

    def _fast1(self, tag: Any, a: Any, floats: Sequence[float],
               stream: Any) -> tuple[Any, ...] | None:  # fmt: skip
        """Launch a call of one given tensor ``a`` (``tag``: its CallArgs mask, see
        :func:`~launch.call_key`) through its key's prepared launch, if there is one."""
        if type(a) in TORCH_TYPES:
            pa = a.data_ptr()
            run = self._prepared.get((tag, a.dtype, a.shape, a.get_device(), a.is_contiguous(),
                                      pa & 15))  # fmt: skip
            if run is not None:
                return run((a,), (pa,), floats, stream)
        return None

    def _fast2(self, tag: Any, a: Any, b: Any, floats: Sequence[float],
               stream: Any) -> tuple[Any, ...] | None:  # fmt: skip
        """:meth:`_fast1` for two given tensors, in CallArgs order."""
        if type(a) in TORCH_TYPES and type(b) in TORCH_TYPES:
            pa, pb = a.data_ptr(), b.data_ptr()
            run = self._prepared.get((
                tag, a.dtype, a.shape, a.get_device(), a.is_contiguous(), pa & 15,
                b.dtype, b.shape, b.get_device(), b.is_contiguous(), pb & 15,
            ))  # fmt: skip
            if run is not None:
                return run((a, b), (pa, pb), floats, stream)
        return None

    def _fast3(self, tag: Any, a: Any, b: Any, c: Any, floats: Sequence[float],
               stream: Any) -> tuple[Any, ...] | None:  # fmt: skip
        """:meth:`_fast1` for three given tensors, in CallArgs order."""
        if type(a) in TORCH_TYPES and type(b) in TORCH_TYPES and type(c) in TORCH_TYPES:
            pa, pb, pc = a.data_ptr(), b.data_ptr(), c.data_ptr()
            run = self._prepared.get((
                tag, a.dtype, a.shape, a.get_device(), a.is_contiguous(), pa & 15,
                b.dtype, b.shape, b.get_device(), b.is_contiguous(), pb & 15,
                c.dtype, c.shape, c.get_device(), c.is_contiguous(), pc & 15,
            ))  # fmt: skip
            if run is not None:
                return run((a, b, c), (pa, pb, pc), floats, stream)
        return None

    def _fastn(self, given: Sequence[Any], floats: Sequence[float], stream: Any,
               extra: Any = None) -> tuple[Any, ...] | None:  # fmt: skip
        """:meth:`_fast1` for any array arguments ``given`` (CallArgs order, None where
        omitted; the tag is their mask, with ``extra``: anything else, hashable, the checked
        path's outcome depends on)."""
        got = call_key(given, extra)
        if got is not None:
            key, tensors, ptrs = got
            run = self._prepared.get(key)
            if run is not None:
                return run(tensors, ptrs, floats, stream)
        return None

    def _submit(
        self, given: Sequence[Any], tensors: Sequence[Any], ptrs: Sequence[int],
        floats: Sequence[float], stream: Any, like: Array, launches: Sequence[LaunchSpec],
        extra: Any = None, prepared: bool = True,
    ) -> None:  # fmt: skip
        """Launch what a family's checked path computed, in order, on one stream.

        ``launches``: ``(function index, grid, block, signature, values bound by name)``
        each (:mod:`nvrtc_engine.core.signature`). ``given`` are the array arguments as passed,
        ``tensors`` as used (outputs allocated), ``ptrs`` their addresses (0 for None), in
        the family's :class:`~signature.CallArgs` order; ``floats`` its float arguments.
        When ``prepared`` and the call has a key (:func:`~launch.call_key` of ``given`` and
        ``extra``), the launches also become the key's prepared launch (:func:`~launch.prepare`)
        for later calls."""
        loaded = self.loaded(like.device)
        got = call_key(given, extra) if prepared and launches else None
        if got is not None:
            run = prepare(self, loaded, given, tensors, ptrs, len(floats), launches)
            if run is not None:
                table = self._prepared
                if len(table) >= MAX_PREPARED:  # evict the oldest (another thread may be too)
                    with contextlib.suppress(KeyError, RuntimeError, StopIteration):
                        del table[next(iter(table))]
                table[got[0]] = run
        handle = stream_handle(stream, like)
        shared, dependent = self._shared, self._dependent
        with driver.on_device(loaded.device):
            for index, grid, block, sig, bound in launches:
                params = sig.pack(bound, ptrs, floats)
                launch(loaded.functions[index], grid, block, shared[index] if shared else 0,
                       dependent, handle, params)  # fmt: skip

    def _launch_packed(
        self, like: Array, stream: Any, calls: list[tuple[int, int, int, int]]
    ) -> None:
        """Launch ``(function index, grid, block, params)`` in order on one stream
        (``params``: a ``void*[]`` address, for a kernel whose parameter is a by-value
        struct the family packs itself)."""
        handle = stream_handle(stream, like)
        loaded = self.loaded(like.device)
        shared, dependent = self._shared, self._dependent
        with driver.on_device(loaded.device):
            for index, grid, block, params in calls:
                launch(loaded.functions[index], grid, block, shared[index] if shared else 0,
                       dependent, handle, params)  # fmt: skip

    # Shared argument checks, used by the families' __call__ -----------------------------

    def _input(self, obj: Any, name: str, dtype: DType) -> Array:
        a = as_array(obj, name)
        if dtype.name not in a.dtypes:
            raise ArgumentError(name, f"has dtype {a.dtype_text}; {self.key} takes {dtype.name}")
        if not a.contiguous:
            raise ArgumentError(name, "must be C-contiguous (call .contiguous() first)")
        _check_address(a, name, dtype.itemsize)
        if a.device < 0:
            a.device = _device_of(a, name)
        return a

    def _output(
        self, obj: Any, name: str, like: Array, shape: tuple[int, ...], dtype: DType
    ) -> tuple[Any, Array]:
        if obj is None:
            obj = allocate_like(like, shape, dtype, name)
        a = self._input(obj, name, dtype)
        if a.shape != shape:
            raise ArgumentError(name, f"has shape {a.shape}; expected {shape}")
        if a.device != like.device:
            raise ArgumentError(name, f"is on device {a.device}, the input on {like.device}")
        return obj, a

    def _tensor_scaling(
        self,
        scale: Any,
        amax: Any,
        scale_inv: Any,
        like: Array,
        names: tuple[str, str, str] = ("scale", "amax", "scale_inv"),
    ) -> tuple[int, int, int]:
        """Pointers of the tensor-scaling buffers ``(scale, amax, scale_inv)``.

        Tensor-scaled output needs ``scale`` and ``amax`` (``scale_inv`` optional, 0 when
        omitted); any other scaling takes none of them (all 0). Raises
        :class:`~nvrtc_engine.ArgumentError` naming the argument at fault (``names`` gives
        the names to use, e.g. ``scales[3]`` for a list argument).
        """
        key = self.key
        if key.scaling != "tensor":
            for value, name in zip((scale, amax, scale_inv), names, strict=True):
                if value is not None:
                    why = {"mxfp8": "MXFP8 scales are computed per block",
                           "nvfp4": "NVFP4 scales are computed per block"}.get(
                        key.scaling, "its output is not scaled")  # fmt: skip
                    raise ArgumentError(name, f"{key} has no scaling argument ({why}); "
                                        "scale/amax/scale_inv are only for tensor-scaled FP8 "
                                        "outputs")  # fmt: skip
            return 0, 0, 0
        if scale is None:
            raise ArgumentError(names[0], f"is required for tensor-scaled {key.out_dtype} "
                                "output (fp32 device array, element 0)")  # fmt: skip
        if amax is None:
            raise ArgumentError(names[1], "is required for tensor scaling (fp32 device array "
                                "to max-reduce into; zero it first)")  # fmt: skip
        scale_ptr = self._scalar_buffer(scale, names[0], like)
        amax_ptr = self._scalar_buffer(amax, names[1], like)
        if scale_inv is None:
            return scale_ptr, amax_ptr, 0
        return scale_ptr, amax_ptr, self._scalar_buffer(scale_inv, names[2], like)

    def _scalar_buffer(self, obj: Any, name: str, like: Array) -> int:
        """A device fp32 buffer of at least one element (scale, amax, scale_inv)."""
        a = as_array(obj, name)
        if "fp32" not in a.dtypes:
            raise ArgumentError(name, f"must be a float32 device tensor, got {a.dtype_text}")
        if a.numel < 1:
            raise ArgumentError(name, "must have at least one element")
        _check_address(a, name, 4)
        if a.device < 0:
            a.device = _device_of(a, name)
        if a.device != like.device:
            raise ArgumentError(name, f"is on device {a.device}, the input on {like.device}")
        return a.ptr


def _check_address(a: Array, name: str, itemsize: int) -> None:
    """Refuse what no kernel may read: a null address for elements, or one not a multiple of
    the element size (a load from it would stop the CUDA context with a misaligned-address
    error, for every later call too). Arrays of torch and CuPy always pass; an
    ``__cuda_array_interface__`` or DLPack view into bytes may not."""
    if a.ptr % itemsize:
        raise ArgumentError(name, f"address {a.ptr:#x} is not a multiple of its element size "
                                  f"({itemsize} bytes)")  # fmt: skip
    if a.ptr == 0 and a.numel:
        raise ArgumentError(name, f"is a null pointer with {a.numel} elements")


def _device_of(a: Array, name: str) -> int:
    try:
        return driver.pointer_device(a.ptr)
    except ValueError as exc:
        raise ArgumentError(name, str(exc)) from None
    except NoDeviceError as exc:  # the first question a call asks the driver
        raise NoDeviceError(
            f"running a kernel needs a CUDA device, and {name} cannot be placed on one: {exc} "
            "(compiling and caching work without one: get_kernel(..., arch='sm_90'), prewarm)"
        ) from None
