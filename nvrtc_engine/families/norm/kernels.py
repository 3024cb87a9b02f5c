"""The norm family's kernels on the host: argument checks, grids and launches of the
LayerNorm/RMSNorm forwards and backwards (:class:`LayerNormFwdKernel` to
:class:`RMSNormBwdAddKernel`) and the results they return. The configuration each was
compiled for is its ``config`` (``NormSpec.config``, that is :func:`.norm_config.norm_config`).
"""

from __future__ import annotations

import math
import numbers
import sys
import warnings
from typing import TYPE_CHECKING, Any, NamedTuple, NoReturn

from ...core import driver
from ...core.dtypes import DTYPES, DType
from ...core.errors import ArgumentError, ArgumentTypeError, CudaError
from ...core.interop import TORCH_TYPES, Array, allocate_like
from ...core.kernel import Kernel, Loaded
from ...core.signature import CallArgs, Signature, f32, i32, i64, ptr
from ..shared.blockscale import BlockScaledOutput, mxfp8_scale_shape
from .config import (
    BWD_CTAS_PER_SM,
    FINALIZE_BLOCK,
    LOOP_BLOCK,
    MAX_GRID,
    TILE_BLOCK,
    TILE_CTAS_PER_SM,
    NormConfig,
    gamma_dtype,
    loop_threads_per_row,
    norm_spec,
    shared_bytes,
    vector_width,
)

if TYPE_CHECKING:
    from ...core.launch import LaunchSpec

__all__ = [
    "BWD",
    "FWD",
    "LayerNormBwdKernel",
    "LayerNormFwdKernel",
    "LayerNormGrads",
    "LayerNormOutput",
    "RMSNormBwdAddKernel",
    "RMSNormBwdKernel",
    "RMSNormFwdKernel",
    "RMSNormGrads",
    "RMSNormOutput",
]

_FP32 = DTYPES["fp32"]
_BYTES = DTYPES["fp8_e4m3"]  # uint8 storage: E8M0 scale bytes are accepted like FP8 data
# The forward kernels' parameters (templates/norm_fwd.j2, norm_loop.j2) and the arguments of
# a forward call they are bound to.
FWD = Signature(
    ptr("x", "In::storage", const=True), ptr("gamma", "Wt::storage", const=True),
    ptr("beta", "Wt::storage", const=True), ptr("z", "Out::storage"), ptr("mu_out", "float"),
    ptr("rs_out", "float"), ptr("scale_ptr", "float", const=True), ptr("amax_ptr", "float"),
    ptr("scale_inv_ptr", "float"), ptr("mx_scale", "unsigned char"), i64("rows"), i32("hidden"),
    f32("eps"), i32("vec"), i32("tpr"), i32("mx_stride"), i64("mx_rows"),
)  # fmt: skip
_FWD_ARGS = CallArgs(("x", "gamma", "beta", "out", "mu", "rsigma", "scale", "amax", "scale_inv"),
                     ("eps",))  # fmt: skip
# call key tags of forward calls that give no outputs or scaling buffers (Kernel._fast2, 3)
_X_GAMMA, _X_GAMMA_BETA = _FWD_ARGS.mask("x", "gamma"), _FWD_ARGS.mask("x", "gamma", "beta")
# the call key's extra of a forward call with stats=False (mu and rsigma not written), and
# those calls' tags
_NO_STATS = "no_stats"
_X_GAMMA_NS, _X_GAMMA_BETA_NS = (_X_GAMMA, _NO_STATS), (_X_GAMMA_BETA, _NO_STATS)
# Every backward function's parameters (templates/norm_bwd.j2, norm_loop.j2, the finalize
# kernel in norm.cu.j2): dx may be add (in place), so neither is __restrict__.
BWD = Signature(
    ptr("dz", "In::storage", const=True), ptr("x", "In::storage", const=True),
    ptr("mu", "float", const=True), ptr("rsigma", "float", const=True),
    ptr("gamma", "Wt::storage", const=True), ptr("add", "In::storage", const=True, restrict=False),
    ptr("dx", "In::storage", restrict=False), ptr("ws_part", "float"), ptr("ws_stats", "float"),
    ptr("dgamma", "Wt::storage"), ptr("dbeta", "Wt::storage"), i64("rows"), i32("hidden"),
    i32("vec"), i32("tpr"), i32("parts"), i64("chunk_rows"), i32("ntiles"),
)  # fmt: skip
_BWD_ARGS = CallArgs(("dz", "x", "mu", "rsigma", "gamma", "add", "dx", "dgamma", "dbeta",
                      "workspace"))  # fmt: skip


class _LayerNormFields(NamedTuple):
    z: Any
    mu: Any
    rsigma: Any
    scale_inv: Any


class _RMSNormFields(NamedTuple):
    z: Any
    rsigma: Any
    scale_inv: Any


def _scale_inv(out: tuple[Any, ...]) -> Any:
    """The last field, with a ``DeprecationWarning`` where ``z`` is block-scaled (MXFP8)."""
    if isinstance(out[0], BlockScaledOutput):
        warnings.warn("the scale_inv of an MXFP8 norm output is deprecated: use "
                      "z.rowwise_scale_inv (z is a BlockScaledOutput); scale_inv goes in the "
                      "next release", DeprecationWarning, stacklevel=3)  # fmt: skip
    return out[-1]


class LayerNormOutput(_LayerNormFields):
    """``layernorm_fwd`` results: ``z``, ``mu``, ``rsigma``, and ``scale_inv`` (the tensor-
    scaling buffer that was passed, or None). With MXFP8 output ``z`` is a
    :class:`~..shared.blockscale.BlockScaledOutput` (``rowwise_data``, ``rowwise_scale_inv``)
    and ``scale_inv``, the same scale tensor, is deprecated."""

    __slots__ = ()
    scale_inv = property(_scale_inv)  # type: ignore[assignment]


class RMSNormOutput(_RMSNormFields):
    """``rmsnorm_fwd`` results: ``z``, ``rsigma``, ``scale_inv`` (see :class:`LayerNormOutput`)."""

    __slots__ = ()
    scale_inv = property(_scale_inv)  # type: ignore[assignment]


class LayerNormGrads(NamedTuple):
    """``layernorm_bwd`` results: ``dx``, ``dgamma``, ``dbeta``."""

    dx: Any
    dgamma: Any
    dbeta: Any


class RMSNormGrads(NamedTuple):
    """``rmsnorm_bwd``/``rmsnorm_bwd_add`` results: ``dx``, ``dgamma``."""

    dx: Any
    dgamma: Any


class _Device(NamedTuple):
    """What the grids need on one device: SM count and each function's CTAs per SM."""

    sm_count: int
    occupancy: tuple[int, ...]
    clusters: int = 0  # clusters of the main function that fit the device at once (0: no cluster)


def _occupancy(function: Any, threads: int, shmem: int = 0) -> int:
    drv = driver._drv()
    try:
        n = driver.check(
            drv.cuOccupancyMaxActiveBlocksPerMultiprocessor(function, threads, shmem),
            "cuOccupancyMaxActiveBlocksPerMultiprocessor",
        )
    except CudaError:
        return 1
    return max(1, int(n))


def _active_clusters(function: Any, threads: int, shmem: int, cluster: int) -> int:
    """Clusters of ``cluster`` CTAs of a function (with compile-time cluster dimensions) that
    can be resident at once: fewer than SMs x occupancy / cluster where a GPC's SMs do not
    divide into whole clusters (a persistent grid of more would run a second wave). 0 where
    the driver does not say (the grid then assumes SMs x occupancy / cluster)."""
    drv = driver._drv()
    config = drv.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = cluster, 1, 1
    config.blockDimX, config.blockDimY, config.blockDimZ = threads, 1, 1
    config.sharedMemBytes = shmem
    config.numAttrs = 0
    try:
        n = driver.check(drv.cuOccupancyMaxActiveClusters(function, config),
                         "cuOccupancyMaxActiveClusters")  # fmt: skip
    except CudaError:
        return 0
    return max(0, int(n))


def _persistent(dev: _Device, cluster: int, per_sm: int, groups: int) -> int:
    """Clusters (CTAs where ``cluster`` is 1) of a persistent grid over ``groups`` row groups
    with at most ``per_sm`` CTAs per SM: never more clusters than are resident at once
    (``dev.clusters``, where the driver says) nor than row groups, at least one."""
    n = dev.sm_count * per_sm // cluster
    if dev.clusters:  # whole clusters per GPC: at most what is resident at once
        n = min(n, dev.clusters)
    return max(1, min(n, groups))


def _aligned(arrays: list[tuple[Array | None, int]]) -> bool:
    """Whether every array's address is a multiple of its access size (at most 16 bytes)."""
    return all(a is None or a.ptr % min(16, size) == 0 for a, size in arrays)


class _NormKernel(Kernel):
    """What the norm kernels share: configuration, per-device grids, argument checks. Their
    ``config`` (``Kernel.config``) is the :class:`~.norm_config.ForwardConfig` or
    :class:`~.norm_config.BackwardConfig` their image was compiled for, ``NormSpec.config(key)``
    when the kernel was made; ``config.label`` ends its symbols."""

    _config: NormConfig

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        key = self.key
        spec = norm_spec(key)
        self.spec = spec
        self._config = spec.config(key)
        self._vec_width = vector_width(key, self._config)
        self._in = key.input
        self._out = key.output
        self._w = DTYPES[gamma_dtype(key)]
        self._mx = key.scaling == "mxfp8"
        self._devices: dict[int, _Device] = {}

    def _device(self, loaded: Loaded) -> _Device:
        got = self._devices.get(loaded.device.ordinal)
        if got is None:
            shared = self._shared or (0,) * len(loaded.functions)
            cfg = self.config
            clusters = 0
            with driver.on_device(loaded.device):
                occ = tuple(_occupancy(f, t, b) for f, t, b in zip(
                    loaded.functions, self._function_threads(), shared, strict=True))  # fmt: skip
                if cfg.cluster > 1:
                    clusters = _active_clusters(loaded.functions[0], cfg.threads, shared[0],
                                                cfg.cluster)  # fmt: skip
            got = _Device(loaded.device.sm_count, occ, clusters)
            self._devices[loaded.device.ordinal] = got
        return got

    def _function_threads(self) -> tuple[int, ...]:
        """Threads per CTA of each function in ``loaded.functions``."""
        raise NotImplementedError

    def residency(self, device: int = 0) -> dict[str, Any]:
        """What ``device`` holds of this kernel (loads it there): ``sm_count``;
        ``ctas_per_sm``, the driver's occupancy of each function (resident CTAs per SM with
        this kernel's threads and dynamic shared memory; the backward's second function is
        its finalize kernel); ``clusters``, the main function's clusters of
        ``config.cluster`` CTAs resident at once (``cuOccupancyMaxActiveClusters``), 0 for
        a kernel without a cluster or where the driver does not say. A persistent grid
        takes at most that many clusters (fewer where the configuration caps its CTAs per
        SM, ``config.staging.ctas_per_sm``), and how clusters fit a GPU's GPCs can differ
        between GPUs of one model, so bench/bandwidth.py records it beside each timing.

        Raises :class:`~nvrtc_engine.NoDeviceError` without a driver or device,
        ``ValueError`` for an ordinal that does not exist, and
        :class:`~nvrtc_engine.ArgumentError` where the device's arch cannot run the image.
        """
        dev = self._device(self.loaded(device))
        return {"sm_count": dev.sm_count, "ctas_per_sm": list(dev.occupancy),
                "clusters": dev.clusters}  # fmt: skip

    def _waits_for_grid(self) -> bool:
        """Every norm kernel (forward, backward and finalize) starts with
        ``nve::grid_dependency_wait()``: on sm_90+ they are launched as programmatic
        dependent launches (``NVRTC_ENGINE_DEPENDENT_LAUNCH``; bench/tuning/pdl_probe.py measured
        1.4-1.8 us saved per kernel boundary on an H200)."""
        return True

    def _shared_bytes(self) -> tuple[int, ...]:
        """A staged kernel's dynamic shared memory (:func:`.norm_config.shared_bytes`) for the
        main kernel, none for the others (the backward's finalize); () for other kernels."""
        size = shared_bytes(self.key, self.config)
        return (size,) + (0,) * (len(self._function_threads()) - 1) if size else ()

    def _rows(self, xa: Array, name: str) -> tuple[int, int]:
        """``(rows, hidden)`` of a ``(..., hidden)`` array, checked against the key."""
        if not xa.shape:
            raise ArgumentError(name, "must have at least one dimension (..., hidden_size)")
        hidden = xa.shape[-1]
        key = self.key
        if key.hidden_size is not None and hidden != key.hidden_size:
            raise ArgumentError(
                name, f"last dimension is {hidden}, but this kernel is specialized for "
                f"hidden_size={key.hidden_size} (use hidden_size=None for any size)",
            )  # fmt: skip
        if hidden < 1:
            raise ArgumentError(name, "hidden size (last dimension) must be at least 1")
        return xa.numel // hidden, hidden

    def _sizes(self, rows: int, hidden_size: int | None) -> tuple[int, int]:
        """``(rows, hidden size)`` of a host-side query (:meth:`launch_grid`,
        ``workspace_elements``) as Python ints: the hidden size is ``hidden_size``, or the key's
        where None. Checked before anything is loaded: ArgumentTypeError for a value that is
        not an integer (numpy's are), ArgumentError for one below 1 or a hidden size missing
        (general kernel) or not the key's."""
        for name, value in (("rows", rows), ("hidden_size", hidden_size)):
            if (value is not None or name == "rows") and (
                isinstance(value, bool) or not isinstance(value, numbers.Integral)
            ):
                raise ArgumentTypeError(name, f"must be an int, got {value!r}")
        rows = int(rows)
        hidden_size = None if hidden_size is None else int(hidden_size)  # numpy's ints too
        if rows < 1:
            raise ArgumentError("rows", f"must be at least 1, got {rows}")
        fixed = self.key.hidden_size
        hidden = fixed if hidden_size is None else hidden_size
        if hidden is None:
            raise ArgumentError("hidden_size", "the general kernel needs one: pass hidden_size=")
        if fixed is not None and hidden != fixed:
            raise ArgumentError("hidden_size", f"this kernel takes {fixed}, got {hidden}")
        if hidden < 1:
            raise ArgumentError("hidden_size", f"must be at least 1, got {hidden}")
        return rows, hidden

    def _like(
        self, obj: Any, name: str, like: Array, shape: tuple[int, ...], dtype: DType
    ) -> Array:
        """An input of exactly ``shape``/``dtype`` on ``like``'s device."""
        a = self._input(obj, name, dtype)
        if a.shape != shape:
            raise ArgumentError(name, f"has shape {a.shape}; expected {shape}")
        if a.device != like.device:
            raise ArgumentError(name, f"is on device {a.device}, the input on {like.device}")
        return a

    def _vec(self, hidden: int) -> int:
        """Elements per access: the compiled width, or the loop kernel's (H a multiple)."""
        v = self._vec_width
        return v if self.config.warps or hidden % v == 0 else 1


# eps is passed as fp32: from this value up it rounds to inf (fp32's largest finite value,
# 3.4028234663852886e38, plus half its ulp, 2**103)
FP32_OVERFLOW = 3.4028235677973366e38


def _eps(value: Any, rms: bool = False) -> float:
    """``eps`` as a float: a real number from 0 to fp32's largest, 3.4028235e38 (the kernels
    take it as fp32, where a larger one would be inf). Raises
    :class:`~nvrtc_engine.ArgumentTypeError` for what is no real number (``None``, a bool,
    numpy's too, a string, a list, a complex number, a CUDA array or an array with
    dimensions), and :class:`~nvrtc_engine.ArgumentError` for a number out of that range
    (negative, NaN, inf, too large for fp32). For an RMSNorm kernel (``rms``) an
    array here is most often beta, which it takes none of, and the message says so."""
    if type(value) is not float:
        if isinstance(value, (str, bytes, bool)):
            raise ArgumentTypeError("eps", f"must be a float >= 0, got {value!r}")
        if hasattr(value, "__cuda_array_interface__") or (
            hasattr(value, "shape") and hasattr(value, "dtype") and getattr(value, "ndim", 0)
        ):  # fmt: skip
            hint = " (RMSNorm kernels take no beta: kernel(x, gamma, eps, ...))" if rms else ""
            raise ArgumentTypeError(
                "eps", f"must be a float >= 0, got an array of shape {tuple(value.shape)}{hint}"
            )
        if getattr(getattr(value, "dtype", None), "kind", None) == "b":  # numpy's bool
            raise ArgumentTypeError("eps", f"must be a float >= 0, got {value!r}")
    try:
        eps = float(value)
    except TypeError:  # None, a list, a complex number: no real number at all
        raise ArgumentTypeError("eps", f"must be a float >= 0, got {value!r}") from None
    except OverflowError:  # an int beyond any float: beyond fp32's range too
        eps = FP32_OVERFLOW
    except ValueError:
        raise ArgumentError("eps", f"must be a float >= 0, got {value!r}") from None
    if not (math.isfinite(eps) and eps >= 0.0):
        raise ArgumentError("eps", f"must be a finite float >= 0, got {value!r}")
    if eps >= FP32_OVERFLOW:
        raise ArgumentError(
            "eps", "must be at most 3.4028235e+38 (fp32's largest; kernels take eps as fp32), "
            f"got {value!r}"
        )  # fmt: skip
    return eps


class _NormFwdKernel(_NormKernel):
    # a call giving only x, gamma (and beta): its call key's tag, by stats (set per class)
    _call_tags: dict[bool, Any]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # a call's (z, mu, rsigma, scale_inv), z block-scaled with MXFP8 output: chosen once
        self._result = self._mx_forward if self._mx else self._forward

    def _function_threads(self) -> tuple[int, ...]:
        return (self.config.threads,)

    def launch_grid(self, rows: int, hidden_size: int | None = None, device: int = 0) -> int:
        """CTAs that a call over ``rows`` rows of ``hidden_size`` elements launches on
        ``device``: the arithmetic the call itself uses, from the device's SM count, the
        kernel's occupancy there and its resident clusters (so it loads the kernel there).

        - The general kernel (``config.warps == 0``): one CTA per
          ``LOOP_BLOCK // loop_threads_per_row(H)`` rows.
        - The register kernel: one CTA (cluster) per row group of ``config.rows`` rows, or up
          to ``config.row_groups`` row groups per CTA, never fewer CTAs than the persistent
          grid.
        - The staged kernel: a persistent grid, at most the clusters resident at once (fewer
          under ``config.staging.ctas_per_sm``), at most one per row group.

        Every grid is also capped at ``MAX_GRID`` CTAs, and it is a multiple of
        ``config.cluster``. ``hidden_size`` defaults to the key's and is required for the
        general kernel. Raises :class:`~nvrtc_engine.ArgumentTypeError` for a ``rows`` or
        ``hidden_size`` that is not an int, :class:`~nvrtc_engine.ArgumentError` for one
        below 1, a missing or a mismatched hidden size, and what :meth:`residency` raises
        (:class:`~nvrtc_engine.NoDeviceError` without a GPU)."""
        rows, hidden = self._sizes(rows, hidden_size)
        return self._grid(self._device(self.loaded(device)), rows, hidden)

    def _grid(self, dev: _Device, rows: int, hidden: int) -> int:
        """:meth:`launch_grid` on ``dev`` for ``rows`` rows of ``hidden`` elements."""
        cfg = self.config
        if not cfg.warps:
            return min(-(-rows // (LOOP_BLOCK // loop_threads_per_row(hidden))), MAX_GRID)
        groups = -(-rows // cfg.rows)
        staging = cfg.staging
        # the staged kernel's grid is persistent, at most ctas_per_sm CTAs per SM
        per_sm = min(dev.occupancy[0], (staging and staging.ctas_per_sm) or dev.occupancy[0])
        persistent = _persistent(dev, cfg.cluster, per_sm, groups)
        clusters = persistent if staging else groups
        if cfg.row_groups > 1:  # several row groups per CTA (held weights loaded once)
            clusters = max(min(groups, persistent), -(-groups // cfg.row_groups))
        return min(groups, clusters, MAX_GRID // cfg.cluster) * cfg.cluster

    def _mx_forward(
        self, x: Any, gamma: Any, beta: Any, eps: Any, out: Any, mu: Any, rsigma: Any,
        scale: Any, amax: Any, scale_inv: Any, stream: Any, stats: bool,
    ) -> tuple[Any, Any, Any, Any]:  # fmt: skip
        """:meth:`_forward` of an MXFP8 kernel: ``z`` a :class:`BlockScaledOutput` (``out``
        may be one)."""
        if isinstance(out, BlockScaledOutput):
            out, scale_inv = _mx_buffers(out, scale_inv)
        z, mu, rsigma, scales = self._forward(x, gamma, beta, eps, out, mu, rsigma, scale, amax,
                                              scale_inv, stream, stats)  # fmt: skip
        return BlockScaledOutput(z, scales), mu, rsigma, scales

    def _forward(
        self, x: Any, gamma: Any, beta: Any, eps: Any, out: Any, mu: Any, rsigma: Any,
        scale: Any, amax: Any, scale_inv: Any, stream: Any, stats: bool,
    ) -> tuple[Any, Any, Any, Any]:  # fmt: skip
        """A forward call: ``(z, mu, rsigma, scale_inv)``, through the call key's prepared
        launch if it has one, else the checked path (``beta``, ``mu``: None for RMSNorm;
        ``stats`` False: mu and rsigma are neither written nor returned)."""
        if not stats and (mu is not None or rsigma is not None):
            raise ArgumentError("rsigma" if mu is None else "mu",
                                "is given with stats=False, which writes neither mu nor "
                                "rsigma: pass one or the other")  # fmt: skip
        # eps, a scalar, is checked first: a bad one is reported without a device, as clamped
        # SwiGLU's limit is (the float test is the common case's shortcut)
        ok = type(eps) is float and 0.0 <= eps < FP32_OVERFLOW
        floats = (eps if ok else _eps(eps, self.spec.rms),)
        if (out is None and mu is None and rsigma is None and scale is None and amax is None
                and scale_inv is None):  # fmt: skip
            tag = self._call_tags[stats]
            if beta is None:
                done = self._fast2(tag, x, gamma, floats, stream)
            else:
                done = self._fast3(tag, x, gamma, beta, floats, stream)
        else:
            given = (x, gamma, beta, out, mu, rsigma, scale, amax, scale_inv)
            done = self._fastn(given, floats, stream, None if stats else _NO_STATS)
        if done is None:
            return self._checked_forward(x, gamma, beta, floats, out, mu, rsigma, scale, amax,
                                         scale_inv, stream, stats)  # fmt: skip
        made = iter(done)  # launched through its prepared launch, which allocated these
        z = next(made) if out is None else out
        if mu is None and not self.spec.rms and stats:
            mu = next(made)
        if rsigma is None and stats:
            rsigma = next(made)
        if scale_inv is None and self._mx:
            scale_inv = next(made)
        return z, mu, rsigma, scale_inv

    def _checked_forward(
        self, x: Any, gamma: Any, beta: Any, floats: tuple[float], out: Any, mu: Any,
        rsigma: Any, scale: Any, amax: Any, scale_inv: Any, stream: Any, stats: bool,
    ) -> tuple[Any, Any, Any, Any]:  # fmt: skip
        """The checked path of :meth:`_forward` (``floats``: the checked ``(eps,)``)."""
        given = (x, gamma, beta, out, mu, rsigma, scale, amax, scale_inv)
        key = self.key
        xa = self._input(x, "x", self._in)
        rows, hidden = self._rows(xa, "x")
        ga = self._like(gamma, "gamma", xa, (hidden,), self._w)
        ba = None if self.spec.rms else self._like(beta, "beta", xa, (hidden,), self._w)
        out, oa = self._output(out, "out", xa, xa.shape, self._out)
        mua = rsa = None  # (None: not written, a null pointer the kernels test)
        if not self.spec.rms and stats:
            mu, mua = self._output(mu, "mu", xa, xa.shape[:-1], _FP32)
        if stats:
            rsigma, rsa = self._output(rsigma, "rsigma", xa, xa.shape[:-1], _FP32)
        scale_ptr = amax_ptr = scale_inv_ptr = mx_ptr = 0
        mx_stride, mx_rows = 0, 0
        if key.scaling == "mxfp8":  # scale_inv receives the block scales
            self._tensor_scaling(scale, amax, None, xa)
            shape = mxfp8_scale_shape(rows, hidden, "rowwise")
            if scale_inv is None:
                scale_inv = allocate_like(xa, shape, _BYTES, "scale_inv")
                if xa.kind == "torch":
                    scale_inv = scale_inv.view(sys.modules["torch"].uint8)
            mx_ptr = self._like(scale_inv, "scale_inv", xa, shape, _BYTES).ptr
            mx_rows, mx_stride = shape
        else:
            scale_ptr, amax_ptr, scale_inv_ptr = self._tensor_scaling(scale, amax, scale_inv, xa)
        if rows == 0:
            return out, mu, rsigma, scale_inv
        dev = self._device(self.loaded(xa.device))
        cfg = self.config
        vec = self._vec(hidden)
        aligned = vec > 1 and _aligned([
            (xa, vec * self._in.itemsize), (oa, vec * self._out.itemsize),
            (ga, vec * self._w.itemsize), (ba, vec * self._w.itemsize),
        ])  # fmt: skip
        tpr = loop_threads_per_row(hidden) if not cfg.warps else 0
        grid = self._grid(dev, rows, hidden)
        mx = key.scaling == "mxfp8"
        a = _FWD_ARGS  # scale_inv: the block scales with MXFP8, else tensor scaling's 1/scale
        values = FWD.bind(
            x=a.x, gamma=a.gamma, beta=a.beta, z=a.out, mu_out=a.mu, rs_out=a.rsigma,
            scale_ptr=a.scale, amax_ptr=a.amax, scale_inv_ptr=0 if mx else a.scale_inv,
            mx_scale=a.scale_inv if mx else 0, rows=rows, hidden=hidden, eps=a.eps,
            vec=int(aligned), tpr=tpr, mx_stride=mx_stride, mx_rows=mx_rows,
        )  # fmt: skip
        tensors = (x, gamma, beta, out, mu, rsigma, scale, amax, scale_inv)
        ptrs = (xa.ptr, ga.ptr, ba.ptr if ba is not None else 0, oa.ptr,
                mua.ptr if mua is not None else 0, rsa.ptr if rsa is not None else 0,
                scale_ptr, amax_ptr, mx_ptr if mx else scale_inv_ptr)  # fmt: skip
        launches: list[LaunchSpec] = [(0, grid, cfg.threads, FWD, values)]
        self._submit(given, tensors, ptrs, floats, stream, xa, launches,
                     None if stats else _NO_STATS)  # fmt: skip
        return out, mu, rsigma, scale_inv


class LayerNormFwdKernel(_NormFwdKernel):
    """LayerNorm forward: ``z = (x - mu) * rsigma * gamma + beta`` (``gamma + 1`` with
    ``zero_centered_gamma``), per row of ``x``.

    Call: ``kernel(x, gamma, beta, eps=1e-5, out=None, mu=None, rsigma=None, *, scale=None,
    amax=None, scale_inv=None, stream=None, stats=True) -> LayerNormOutput(z, mu, rsigma,
    scale_inv)``.

    Args:
        x: CUDA array ``(..., hidden_size)`` of ``in_dtype``, C-contiguous.
        gamma, beta: ``(hidden_size,)``, x's dtype (fp32 with the ``fp32_gamma`` flag).
        eps: added to the variance, a float >= 0.
        out: z, x's shape, ``out_dtype`` (FP8 may be uint8 storage); allocated if omitted.
            MXFP8: an array (the data) or a :class:`~..shared.blockscale.BlockScaledOutput`
            (``rowwise_data``, ``rowwise_scale_inv``: then no ``scale_inv``).
        mu, rsigma: fp32 ``x.shape[:-1]``; allocated if omitted.
        scale, amax, scale_inv: tensor scaling: fp32 device arrays; element 0 of ``scale`` is
            the scale, element 0 of ``amax`` is max-reduced (atomically) with ``max|z|``
            before scaling (zero it first), ``1/scale`` goes to ``scale_inv`` (optional).
            MXFP8: ``scale_inv`` is the uint8 E8M0 scale tensor of shape
            ``mxfp8_scale_shape(N, hidden_size, "rowwise")`` (allocated if omitted; every byte,
            padding included, is written); the result's ``z`` is a ``BlockScaledOutput``.
        stream: where to launch (see :mod:`nvrtc_engine.core.interop`).
        stats: False: mu and rsigma are not written (None in the result; none may be
            given), for a forward that no backward follows: no allocation, same kernel.

    Math: mean and biased variance in fp32, two passes over the row; ``rsigma =
    1/sqrt(var + eps)``, as in TransformerEngine. Raises
    :class:`~nvrtc_engine.ArgumentError`/:class:`~nvrtc_engine.ArgumentTypeError` before
    launching when an argument is wrong.
    """

    # the call key's tag of a call giving x, gamma and beta only, by stats (for Kernel._fast3,
    # which a caller keeping its kernels may try first: nvrtc_engine.torch does)
    _call_tags = {True: _X_GAMMA_BETA, False: _X_GAMMA_BETA_NS}

    def __call__(
        self, x: Any, gamma: Any, beta: Any, eps: Any = 1e-5, out: Any = None, mu: Any = None,
        rsigma: Any = None, *, scale: Any = None, amax: Any = None, scale_inv: Any = None,
        stream: Any = None, stats: bool = True,
    ) -> LayerNormOutput:  # fmt: skip
        return LayerNormOutput(*self._result(x, gamma, beta, eps, out, mu, rsigma, scale, amax,
                                             scale_inv, stream, stats))  # fmt: skip


class RMSNormFwdKernel(_NormFwdKernel):
    """RMSNorm forward: ``z = x * rsigma * gamma`` (``gamma + 1`` with
    ``zero_centered_gamma``), ``rsigma = 1/sqrt(mean(x^2) + eps)`` per row.

    Call: ``kernel(x, gamma, eps=1e-5, out=None, rsigma=None, *, scale=None, amax=None,
    scale_inv=None, stream=None, stats=True) -> RMSNormOutput(z, rsigma, scale_inv)``;
    arguments as in :class:`LayerNormFwdKernel`. Math as in TransformerEngine (fp32 compute).
    """

    _call_tags = {True: _X_GAMMA, False: _X_GAMMA_NS}  # (Kernel._fast2's: x, gamma only)

    def __call__(
        self, x: Any, gamma: Any, eps: Any = 1e-5, out: Any = None, rsigma: Any = None, *,
        scale: Any = None, amax: Any = None, scale_inv: Any = None, stream: Any = None,
        stats: bool = True,
    ) -> RMSNormOutput:  # fmt: skip
        z, _, rsigma, scale_inv = self._result(x, gamma, None, eps, out, None, rsigma, scale,
                                               amax, scale_inv, stream, stats)  # fmt: skip
        return RMSNormOutput(z, rsigma, scale_inv)


def _mx_buffers(out: BlockScaledOutput, scale_inv: Any) -> tuple[Any, Any]:
    """``(out, scale_inv)`` arrays from a block-scaled ``out`` (rowwise only: the norms write
    rowwise MXFP8)."""
    if scale_inv is not None:
        raise ArgumentTypeError("scale_inv", "is given twice: also as out.rowwise_scale_inv; "
                                "pass one")  # fmt: skip
    if out.columnwise_data is not None or out.columnwise_scale_inv is not None:
        raise ArgumentError("out.columnwise_data", "is given, but the norms write only rowwise "
                            "MXFP8")  # fmt: skip
    return out.rowwise_data, out.rowwise_scale_inv


class _BwdPlan(NamedTuple):
    """Grids and workspace of one backward call (a function of rows, hidden and device).

    ``parts``: partial rows of column sums (CTAs or clusters of the register and staged
    kernels, row chunks of ``chunk_rows`` rows of the general kernel); ``stats_grid``/``tpr``:
    the general kernel's row-sum kernel; the workspace holds ``part_elements`` fp32 partial
    sums, then from ``stats_offset`` the general kernel's row sums, ``workspace`` elements in
    all.
    """

    stats_grid: int
    tpr: int
    parts: int
    chunk_rows: int
    part_elements: int
    stats_offset: int
    workspace: int


class _NormBwdKernel(_NormKernel):
    def _function_threads(self) -> tuple[int, ...]:
        if self.config.warps:
            return (self.config.threads, FINALIZE_BLOCK)
        return (TILE_BLOCK, LOOP_BLOCK, FINALIZE_BLOCK)

    def _plan(self, dev: _Device, rows: int, hidden: int) -> _BwdPlan:
        cfg = self.config
        nacc = self.spec.accumulators
        stats_grid = tpr = chunk_rows = parts = stats = 0
        if rows > 0 and cfg.warps:
            groups = -(-rows // cfg.rows)
            cap = cfg.staging.ctas_per_sm if cfg.staging else 0
            per_sm = min(dev.occupancy[0], cap or BWD_CTAS_PER_SM)
            parts = _persistent(dev, cfg.cluster, per_sm, groups)
        elif rows > 0:
            tpr = loop_threads_per_row(hidden)
            stats_grid = min(-(-rows // (LOOP_BLOCK // tpr)), dev.sm_count * dev.occupancy[1])
            # chunks of rows sized for the widest tiles, so the workspace does not depend
            # on the pointers' alignment; ntiles is set per launch
            widest = -(-hidden // (32 * self._vec_width))
            want = max(1, -(-dev.sm_count * TILE_CTAS_PER_SM // widest))
            chunk_rows = -(-rows // min(rows, want))
            parts = -(-rows // chunk_rows)
            stats = 2 * rows
        part_elements = nacc * parts * hidden
        offset = -(-part_elements // 4) * 4  # 16-byte aligned
        return _BwdPlan(stats_grid, tpr, parts, chunk_rows, part_elements, offset,
                        offset + stats)  # fmt: skip

    def workspace_elements(self, rows: int, hidden_size: int | None = None, device: int = 0) -> int:
        """fp32 elements of workspace a call over ``rows`` rows of ``hidden_size`` elements
        needs on ``device`` (``hidden_size`` defaults to the key's; the general kernel needs
        it).

        The grid (and so the number of partial dgamma/dbeta rows) depends on the device's SM
        count and this kernel's occupancy there; loads the kernel on ``device``. Raises, before
        loading, :class:`~nvrtc_engine.ArgumentTypeError` for a ``rows`` or ``hidden_size``
        that is not an int and :class:`~nvrtc_engine.ArgumentError` for one below 1, a
        missing or a mismatched hidden size; then what loading raises
        (:class:`~nvrtc_engine.NoDeviceError` without a GPU).
        """
        rows, hidden = self._sizes(rows, hidden_size)
        dev = self._device(self.loaded(device))
        return self._plan(dev, rows, hidden).workspace

    def _backward(
        self, dz: Any, x: Any, mu: Any, rsigma: Any, gamma: Any, add: Any, dx: Any, dgamma: Any,
        dbeta: Any, workspace: Any, stream: Any,
    ) -> tuple[Any, Any, Any]:  # fmt: skip
        given = (dz, x, mu, rsigma, gamma, add, dx, dgamma, dbeta, workspace)
        if dx is not None and type(dx) in TORCH_TYPES and {type(x), type(dz)} <= TORCH_TYPES:
            start = dx.data_ptr()  # (checked here: a prepared call skips the rest)
            for other in (x, dz):
                if _overlap(start, dx.nbytes, other.data_ptr(), other.nbytes):
                    _alias_error(other, x)
        done = self._fastn(given, (), stream)
        if done is not None:  # launched through its prepared launch, which allocated these
            made = iter(done)
            dx = next(made) if dx is None else dx
            dgamma = next(made) if dgamma is None else dgamma
            if dbeta is None and not self.spec.rms:
                dbeta = next(made)
            return dx, dgamma, dbeta
        spec = self.spec
        xa = self._input(x, "x", self._in)
        rows, hidden = self._rows(xa, "x")
        dza = self._like(dz, "dz", xa, xa.shape, self._in)
        mua = None if spec.rms else self._like(mu, "mu", xa, xa.shape[:-1], _FP32)
        rsa = self._like(rsigma, "rsigma", xa, xa.shape[:-1], _FP32)
        ga = self._like(gamma, "gamma", xa, (hidden,), self._w)
        adda = self._like(add, "add", xa, xa.shape, self._in) if spec.add else None
        dx, dxa = self._output(dx, "dx", xa, xa.shape, self._in)
        nbytes = xa.numel * self._in.itemsize  # (dx, x and dz: one shape and dtype)
        for other in (xa, dza):
            if _overlap(dxa.ptr, nbytes, other.ptr, nbytes):
                _alias_error(other.obj, x)
        dgamma, dga = self._output(dgamma, "dgamma", xa, (hidden,), self._w)
        dba = None
        if not spec.rms:
            dbeta, dba = self._output(dbeta, "dbeta", xa, (hidden,), self._w)
        if workspace is None and xa.kind not in ("torch", "cupy"):
            raise ArgumentTypeError(
                "workspace", "is required: the input is neither a torch tensor nor a CuPy "
                "array, so the kernel cannot allocate it",
            )  # fmt: skip
        wa = None if workspace is None else self._input(workspace, "workspace", _FP32)
        dev = self._device(self.loaded(xa.device))
        plan = self._plan(dev, rows, hidden)
        if wa is None:
            workspace = allocate_like(xa, (max(1, plan.workspace),), _FP32, "workspace")
            wa = self._input(workspace, "workspace", _FP32)
        if wa.numel < plan.workspace:
            raise ArgumentError("workspace", f"has {wa.numel} fp32 elements; this call needs "
                                f"{plan.workspace} (see workspace_elements)")  # fmt: skip
        if wa.ptr % 16 or wa.device != xa.device:
            raise ArgumentError("workspace", "must be 16-byte aligned and on the input's device")
        cfg = self.config
        vec = self._vec(hidden)
        w_size, in_size = self._w.itemsize, self._in.itemsize
        aligned = vec > 1 and _aligned([
            (xa, vec * in_size), (dza, vec * in_size), (dxa, vec * in_size),
            (adda, vec * in_size), (ga, vec * w_size),
        ])  # fmt: skip
        ntiles = -(-(hidden // (vec if aligned else 1)) // 32)  # general kernel: 32 accesses each
        a = _BWD_ARGS
        values = BWD.bind(
            dz=a.dz, x=a.x, mu=a.mu, rsigma=a.rsigma, gamma=a.gamma, add=a.add, dx=a.dx,
            ws_part=a.workspace, ws_stats=a.workspace + 4 * plan.stats_offset, dgamma=a.dgamma,
            dbeta=a.dbeta, rows=rows, hidden=hidden, vec=int(aligned), tpr=plan.tpr,
            parts=plan.parts, chunk_rows=plan.chunk_rows, ntiles=ntiles,
        )  # fmt: skip
        p = (BWD, values)
        launches: list[LaunchSpec] = []
        if rows > 0 and cfg.warps:
            launches.append((0, plan.parts * cfg.cluster, cfg.threads, *p))
        elif rows > 0:
            launches.append((1, plan.stats_grid, LOOP_BLOCK, *p))
            launches.append((0, plan.parts * ntiles, TILE_BLOCK, *p))
        finalize_grid = spec.accumulators * -(-hidden // 32)
        launches.append((-1, finalize_grid, FINALIZE_BLOCK, *p))
        tensors = (dz, x, mu, rsigma, gamma, add, dx, dgamma, dbeta, workspace)
        ptrs = (dza.ptr, xa.ptr, mua.ptr if mua is not None else 0, rsa.ptr, ga.ptr,
                adda.ptr if adda is not None else 0, dxa.ptr, dga.ptr,
                dba.ptr if dba is not None else 0, wa.ptr)  # fmt: skip
        self._submit(given, tensors, ptrs, (), stream, xa, launches)
        return dx, dgamma, dbeta


def _overlap(a: int, a_bytes: int, b: int, b_bytes: int) -> bool:
    """Whether the byte ranges ``[a, a + a_bytes)`` and ``[b, b + b_bytes)`` share a byte."""
    return a < b + b_bytes and b < a + a_bytes and a_bytes > 0 and b_bytes > 0


def _alias_error(other: Any, x: Any) -> NoReturn:
    """Raise the error of a dx whose memory overlaps x or dz (``other``)."""
    name = "x" if other is x else "dz"
    raise ArgumentError(
        "dx",
        f"overlaps {name}'s memory; the backward reads {name} while it "
        "writes dx, so pass a separate dx (or none, to have it allocated)",
    )


class LayerNormBwdKernel(_NormBwdKernel):
    """LayerNorm backward.

    Call: ``kernel(dz, x, mu, rsigma, gamma, dx=None, dgamma=None, dbeta=None, *,
    workspace=None, stream=None) -> LayerNormGrads(dx, dgamma, dbeta)``.

    Args:
        dz, x: ``(..., hidden_size)`` of ``in_dtype``; mu, rsigma: fp32 ``x.shape[:-1]`` (from
            the forward pass); gamma: ``(hidden_size,)``, x's dtype or fp32 (``fp32_gamma``).
        dx: x's shape and dtype, its memory apart from x's and dz's; dgamma, dbeta: gamma's
            shape and dtype; allocated if omitted.

    Math (TransformerEngine): ``xhat = (x - mu) * rsigma``, ``dy = dz * gamma`` (``gamma + 1``
    with ``zero_centered_gamma``), ``dx = rsigma * (dy - mean(dy) - xhat * mean(dy * xhat))``
    (means over the row), ``dgamma = sum_rows(dz * xhat)``, ``dbeta = sum_rows(dz)``; fp32.

    Column sums (dgamma, dbeta) are fp32 partial sums per CTA (or cluster), written to a
    workspace and added up by a second kernel in a fixed order: deterministic for a fixed
    shape and device. ``workspace``: fp32 CUDA array of at least
    ``kernel.workspace_elements(rows, hidden_size, device)`` elements, 16-byte aligned; allocated
    with the input's library (torch or CuPy) when omitted, required otherwise.

    Raises :class:`~nvrtc_engine.ArgumentError`/:class:`~nvrtc_engine.ArgumentTypeError`
    before launching when an argument is wrong.
    """

    def __call__(
        self, dz: Any, x: Any, mu: Any, rsigma: Any, gamma: Any, dx: Any = None,
        dgamma: Any = None, dbeta: Any = None, *, workspace: Any = None, stream: Any = None,
    ) -> LayerNormGrads:  # fmt: skip
        return LayerNormGrads(*self._backward(dz, x, mu, rsigma, gamma, None, dx, dgamma, dbeta,
                                              workspace, stream))  # fmt: skip


class RMSNormBwdKernel(_NormBwdKernel):
    """RMSNorm backward.

    Call: ``kernel(dz, x, rsigma, gamma, dx=None, dgamma=None, *, workspace=None,
    stream=None) -> RMSNormGrads(dx, dgamma)``; arguments as in :class:`LayerNormBwdKernel`.

    Math (TransformerEngine): ``xhat = x * rsigma``, ``dy = dz * gamma`` (``gamma + 1`` with
    ``zero_centered_gamma``), ``dx = rsigma * (dy - xhat * mean(dy * xhat))``,
    ``dgamma = sum_rows(dz * xhat)``; fp32. Workspace, determinism and errors as in
    :class:`LayerNormBwdKernel`.
    """

    def __call__(
        self, dz: Any, x: Any, rsigma: Any, gamma: Any, dx: Any = None, dgamma: Any = None, *,
        workspace: Any = None, stream: Any = None,
    ) -> RMSNormGrads:  # fmt: skip
        dx, dgamma, _ = self._backward(dz, x, None, rsigma, gamma, None, dx, dgamma, None,
                                       workspace, stream)  # fmt: skip
        return RMSNormGrads(dx, dgamma)


class RMSNormBwdAddKernel(_NormBwdKernel):
    """RMSNorm backward with a residual gradient: ``dx = rmsnorm_bwd(...) + add``.

    Call: ``kernel(dz, x, rsigma, gamma, add, dx=None, dgamma=None, *, workspace=None,
    stream=None) -> RMSNormGrads(dx, dgamma)``. ``add``: x's shape and dtype, the gradient
    reaching x through the residual branch (TransformerEngine's ``rmsnorm_bwd_add``); ``dx``
    may be ``add`` itself (in place). Other arguments and math as in :class:`RMSNormBwdKernel`.
    """

    def __call__(
        self, dz: Any, x: Any, rsigma: Any, gamma: Any, add: Any, dx: Any = None,
        dgamma: Any = None, *, workspace: Any = None, stream: Any = None,
    ) -> RMSNormGrads:  # fmt: skip
        dx, dgamma, _ = self._backward(dz, x, None, rsigma, gamma, add, dx, dgamma, None,
                                       workspace, stream)  # fmt: skip
        return RMSNormGrads(dx, dgamma)
