"""CPU stand-ins for the engine's kernels, for the CPU tests of nvrtc_engine.torch.

:func:`install` makes the PyTorch layer run on CPU tensors: its device type becomes ``cpu``
and each kernel it fetches is a stand-in with the kernel's call (arguments, named results,
tensor scaling: ``amax`` max-reduced in place, ``scale_inv = 1/scale``) computing with the
float64 references of :mod:`nvrtc_engine.reference` and rounding to the output dtype. So
the CPU tests exercise everything the layer adds (dispatch, autograd, fake
implementations, torch.compile, checks) on values whose math is independent of it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from nvrtc_engine import reference as ref
from nvrtc_engine.families.norm import reference as ref_norm
from nvrtc_engine.torch import _kernels

_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}


def install(monkeypatch: Any) -> list[tuple[Any, ...]]:
    """Patch the layer onto the stand-ins; returns the list of keys fetched (in order)."""
    fetched: list[tuple[Any, ...]] = []

    def load(key: tuple[Any, ...]) -> Any:
        fetched.append(key)
        k = StandIn(*key)
        _kernels._KERNELS[key] = k
        return k

    monkeypatch.setattr(_kernels, "DEVICE_TYPE", "cpu")
    monkeypatch.setattr(_kernels, "load", load)
    monkeypatch.setattr(_kernels, "_KERNELS", {})
    monkeypatch.setattr(_kernels, "_FILLS", {})
    return fetched


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().to(torch.float64).numpy()


class StandIn:
    """One kernel: ``op`` for ``in_dtype`` input, ``out_dtype`` (FP8 with tensor scaling, or
    None), the hidden size and flags of the key (checked as the kernels check them)."""

    def __init__(
        self,
        op: str,
        in_dtype: torch.dtype,
        out_dtype: torch.dtype | None,
        hidden: int,
        device: int,
        flags: tuple[tuple[str, bool], ...],
    ) -> None:
        self.op, self.in_dtype, self.out_dtype, self.hidden = op, in_dtype, out_dtype, hidden
        self.device = device
        self.flags = dict(flags)
        self.calls = 0

    def _out(
        self, y: np.ndarray, like: torch.Tensor, scale: Any, amax: Any, scale_inv: Any
    ) -> torch.Tensor:
        y = torch.from_numpy(np.ascontiguousarray(y)).reshape(y.shape)
        if self.out_dtype is None:
            assert scale is None and amax is None
            return y.to(like.dtype)
        amax[0] = torch.maximum(amax[0], y.abs().max().to(torch.float32))
        if scale_inv is not None:
            scale_inv[0] = 1.0 / scale[0]
        limit = _MAX[self.out_dtype]
        return (y * float(scale[0])).clamp(-limit, limit).to(self.out_dtype)

    _call_tags = {True: None, False: None}

    def _fast2(self, *args: Any) -> None:  # (no prepared launches: each call is __call__)
        return None

    _fast3 = _fast2

    def __call__(self, *args: Any, **kw: Any) -> Any:
        self.calls += 1
        # a kernel is loaded on one device: the layer must give it that device's tensors only
        devices = {a.get_device() for a in (*args, *kw.values()) if isinstance(a, torch.Tensor)}
        assert devices == {self.device}, (self.op, self.device, devices)
        scaling = {k: kw.pop(k, None) for k in ("scale", "amax", "scale_inv")}
        kw.pop("stream", None)
        if self.op in ref.ACTIVATION_OPS or self.op == "cast":
            return self._activation(args, kw, scaling)
        return getattr(self, "_" + self.op)(*args, **kw, **scaling)

    def _activation(
        self, args: tuple[Any, ...], kw: dict[str, Any], scaling: dict[str, Any]
    ) -> torch.Tensor:
        x = args[-1]
        grad = args[0] if len(args) == 2 else None
        assert x.dtype == self.in_dtype and x.is_contiguous()
        if self.op == "cast":
            y = _np(x)
        else:
            gated = ref.op_kind(self.op) in ("gated", "dgated")
            assert (x.shape[-1] // 2 if gated else x.shape[-1]) == self.hidden
            y = ref.op_values(self.op, _np(x), None if grad is None else _np(grad), **kw).y
        return self._out(y, x, **scaling)

    def _norm_out(self, fwd: Any, x: torch.Tensor, scaling: dict[str, Any]) -> torch.Tensor:
        assert x.shape[-1] == self.hidden and x.dtype == self.in_dtype
        return self._out(fwd.z.reshape(x.shape), x, **scaling)

    def _stat(self, v: np.ndarray, x: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(v).to(torch.float32).reshape(x.shape[:-1])

    def _check_gamma(self, gamma: torch.Tensor, x: torch.Tensor) -> None:
        want = torch.float32 if self.flags.get("fp32_gamma") else x.dtype
        assert gamma.dtype == want and gamma.shape == (self.hidden,), (gamma.dtype, want)

    def _layernorm_fwd(
        self,
        x: torch.Tensor,
        gamma: torch.Tensor,
        beta: torch.Tensor,
        eps: float,
        stats: bool = True,
        **scaling: Any,
    ) -> tuple[Any, ...]:
        self._check_gamma(gamma, x)
        zcg = self.flags.get("zero_centered_gamma", False)
        f = ref_norm.layernorm_fwd(_np(x), _np(gamma), _np(beta), eps, zero_centered_gamma=zcg)
        z = self._norm_out(f, x, scaling)
        if not stats:  # (as the kernels: neither written)
            return z, None, None, scaling["scale_inv"]
        return z, self._stat(f.mu, x), self._stat(f.rsigma, x), scaling["scale_inv"]

    def _rmsnorm_fwd(
        self, x: torch.Tensor, gamma: torch.Tensor, eps: float, stats: bool = True, **scaling: Any
    ) -> tuple[Any, ...]:
        self._check_gamma(gamma, x)
        zcg = self.flags.get("zero_centered_gamma", False)
        f = ref_norm.rmsnorm_fwd(_np(x), _np(gamma), eps, zero_centered_gamma=zcg)
        rsigma = self._stat(f.rsigma, x) if stats else None
        return self._norm_out(f, x, scaling), rsigma, scaling["scale_inv"]

    def _grads(self, b: Any, x: torch.Tensor, gamma: torch.Tensor) -> tuple[torch.Tensor, ...]:
        dx = torch.from_numpy(b.dx).reshape(x.shape).to(x.dtype)
        out = [dx, torch.from_numpy(b.dgamma).to(gamma.dtype)]
        if b.dbeta is not None:
            out.append(torch.from_numpy(b.dbeta).to(gamma.dtype))
        return tuple(out)

    def _layernorm_bwd(
        self,
        dz: torch.Tensor,
        x: torch.Tensor,
        mu: torch.Tensor,
        rsigma: torch.Tensor,
        gamma: torch.Tensor,
        **_: Any,
    ) -> tuple[Any, ...]:
        self._check_gamma(gamma, x)
        assert dz.is_contiguous() and dz.dtype == x.dtype
        zcg = self.flags.get("zero_centered_gamma", False)
        b = ref_norm.layernorm_bwd(
            _np(dz), _np(x), _np(mu), _np(rsigma), _np(gamma), zero_centered_gamma=zcg
        )
        return self._grads(b, x, gamma)

    def _rmsnorm_bwd(
        self,
        dz: torch.Tensor,
        x: torch.Tensor,
        rsigma: torch.Tensor,
        gamma: torch.Tensor,
        add: torch.Tensor | None = None,
        **_: Any,
    ) -> tuple[Any, ...]:
        self._check_gamma(gamma, x)
        assert dz.is_contiguous() and dz.dtype == x.dtype
        assert (add is not None) == (self.op == "rmsnorm_bwd_add")
        zcg = self.flags.get("zero_centered_gamma", False)
        b = ref_norm.rmsnorm_bwd(
            _np(dz),
            _np(x),
            _np(rsigma),
            _np(gamma),
            zero_centered_gamma=zcg,
            add=None if add is None else _np(add),
        )
        return self._grads(b, x, gamma)

    _rmsnorm_bwd_add = _rmsnorm_bwd

    def _cast_transpose(self, x: torch.Tensor, **scaling: Any) -> tuple[torch.Tensor, ...]:
        q = self._out(_np(x), x, **scaling)
        return q, q.t().contiguous()

    def _transpose(self, x: torch.Tensor, **_: Any) -> torch.Tensor:
        return x.t().contiguous()
