"""Float64 references for every op of the activation family, with fp32 error bounds.

Kinds (as in :mod:`nvrtc_engine.families.activation.spec`): plain ``act(x)``; backward ``grad *
act'(x)``; gated ``act(a) * b`` for ``x = [a | b]`` split in the middle of the last
dimension (activation half first, as TransformerEngine); gated backward ``[grad * act'(a) *
b | grad * act(a)]``. GLU's activation is the sigmoid. Clamped SwiGLU (GPT-OSS,
TransformerEngine's ``ClampedSwiGLUParam``): with ``a' = min(a, limit)``, the gate
``a' * sigmoid(alpha a')`` times the linear part ``clamp(b, -limit, limit) + linear_offset``;
its gradient is 0 where a clamp is active (``a > limit``; ``|b| > limit``). ``limit``,
``alpha`` and ``linear_offset`` are used as fp32 values, as the kernels receive them.

:func:`op_values` gives the output before any scaling and the absolute error an fp32 kernel
may carry in it (the ``tolerance`` of :func:`~nvrtc_engine.reference.check_close`).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..shared.act_reference import ACTIVATIONS, sigmoid
from ..shared.reference import FP32_EPS

__all__ = [
    "ACTIVATION_OPS",
    "CLAMPED_SWIGLU_ALPHA",
    "CLAMPED_SWIGLU_LINEAR_OFFSET",
    "GATED_ACTIVATIONS",
    "OpValues",
    "clamped_swiglu",
    "dclamped_swiglu",
    "op_kind",
    "op_values",
]

CLAMPED_SWIGLU_ALPHA = 1.702
CLAMPED_SWIGLU_LINEAR_OFFSET = 1.0
# Gated op -> the activation of its first half.
GATED_ACTIVATIONS: dict[str, str] = {
    "glu": "sigmoid", "geglu": "gelu", "qgeglu": "qgelu", "swiglu": "silu", "reglu": "relu",
    "sreglu": "srelu",
}  # fmt: skip
# Every op of the family -> its kind.
ACTIVATION_OPS: dict[str, str] = {
    **{name: "act" for name in ACTIVATIONS},
    **{"d" + name: "dact" for name in ACTIVATIONS},
    **{name: "gated" for name in [*GATED_ACTIVATIONS, "clamped_swiglu"]},
    **{"d" + name: "dgated" for name in [*GATED_ACTIVATIONS, "clamped_swiglu"]},
}

_EPS = FP32_EPS


def _f32(value: float) -> float:
    return float(np.float32(value))


def _clamped_parts(
    a: np.ndarray, b: np.ndarray, limit: float, alpha: float, linear_offset: float
) -> tuple[np.ndarray, ...]:
    """(c, s, gate, lin) with c = min(a, limit), s = sigmoid(alpha c), gate = c s,
    lin = clamp(b) + offset; parameters rounded to fp32 as the kernels get them."""
    limit, alpha, linear_offset = _f32(limit), _f32(alpha), _f32(linear_offset)
    c = np.minimum(np.asarray(a, dtype=np.float64), limit)
    s = sigmoid(alpha * c)
    lin = np.clip(np.asarray(b, dtype=np.float64), -limit, limit) + linear_offset
    return c, s, c * s, lin


def clamped_swiglu(
    a: np.ndarray,
    b: np.ndarray,
    limit: float,
    alpha: float = CLAMPED_SWIGLU_ALPHA,
    linear_offset: float = CLAMPED_SWIGLU_LINEAR_OFFSET,
) -> np.ndarray:
    """Clamped SwiGLU: ``a' sigmoid(alpha a') (clamp(b, -limit, limit) + linear_offset)``,
    ``a' = min(a, limit)``."""
    _, _, gate, lin = _clamped_parts(a, b, limit, alpha, linear_offset)
    return gate * lin


def dclamped_swiglu(
    grad: np.ndarray,
    a: np.ndarray,
    b: np.ndarray,
    limit: float,
    alpha: float = CLAMPED_SWIGLU_ALPHA,
    linear_offset: float = CLAMPED_SWIGLU_LINEAR_OFFSET,
) -> tuple[np.ndarray, np.ndarray]:
    """Gradients of :func:`clamped_swiglu` times ``grad``: ``(d/da, d/db)``; 0 where ``a >
    limit`` (d/da) and where ``|b| > limit`` (d/db), as TransformerEngine."""
    c, s, gate, lin = _clamped_parts(a, b, limit, alpha, linear_offset)
    lim, al = _f32(limit), _f32(alpha)
    a, b, grad = (np.asarray(v, dtype=np.float64) for v in (a, b, grad))
    dgate = np.where(a <= lim, s + al * c * s * (1.0 - s), 0.0)
    return grad * dgate * lin, np.where(np.abs(b) <= lim, grad * gate, 0.0)


class OpValues(NamedTuple):
    """Reference output of one op: ``y`` (float64, before scaling, in the output's shape)
    and ``tolerance`` (the absolute error an fp32 kernel may carry in each element)."""

    y: np.ndarray
    tolerance: np.ndarray


def op_kind(op: str) -> str:
    """``act``, ``dact``, ``gated`` or ``dgated``; raises ``KeyError`` for another op."""
    return ACTIVATION_OPS[op]


def _split(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    h = x.shape[-1] // 2
    return x[..., :h], x[..., h:]


def _clamped_values(
    kind: str, a: np.ndarray, b: np.ndarray, g: np.ndarray | None, params: tuple[float, ...]
) -> OpValues:
    c, s, gate, lin = _clamped_parts(a, b, *params)
    z = np.abs(_f32(params[1]) * c)
    gate_tol = 16.0 * _EPS * (1.0 + z) * np.abs(gate)
    lin_tol = _EPS * np.abs(lin)
    if kind == "gated":
        y = gate * lin
        return OpValues(y, np.abs(lin) * gate_tol + np.abs(gate) * lin_tol + 2 * _EPS * np.abs(y))
    assert g is not None
    da, db = dclamped_swiglu(g, a, b, *params)
    al = _f32(params[1])
    dgate = np.where(a <= _f32(params[0]), s + al * c * s * (1.0 - s), 0.0)
    dgate_tol = 16.0 * _EPS * (1.0 + z) * (s + np.abs(al * c * s * (1.0 - s))) * (dgate != 0)
    tol_a = np.abs(g * lin) * dgate_tol + np.abs(g * dgate) * lin_tol + 4 * _EPS * np.abs(da)
    tol_b = np.where(db != 0, np.abs(g) * gate_tol + 2 * _EPS * np.abs(db), 0.0)
    return OpValues(np.concatenate([da, db], axis=-1), np.concatenate([tol_a, tol_b], axis=-1))


def op_values(
    op: str,
    x: np.ndarray,
    grad: np.ndarray | None = None,
    *,
    limit: float | None = None,
    alpha: float = CLAMPED_SWIGLU_ALPHA,
    linear_offset: float = CLAMPED_SWIGLU_LINEAR_OFFSET,
) -> OpValues:
    """Reference values of ``op`` on inputs ``x`` (and ``grad`` for backward ops).

    Shapes: ``x`` ``(..., n)`` for plain ops, ``(..., 2H)`` for gated ops; ``grad`` the shape
    of the forward output. Output: plain ops ``x``'s shape; gated ``(..., H)``; gated
    backward ``(..., 2H)`` (``d/da`` first). ``limit`` is required for clamped SwiGLU.
    Raises ``KeyError`` for an unknown op, ``ValueError`` for a missing input.
    """
    kind = op_kind(op)
    x = np.asarray(x).astype(np.float64)
    g = None if grad is None else np.asarray(grad).astype(np.float64)
    if kind in ("dact", "dgated") and g is None:
        raise ValueError(f"{op} needs grad")
    name = op[1:] if kind in ("dact", "dgated") else op
    if kind in ("act", "dact"):
        act = ACTIVATIONS[name]
        if kind == "act":
            return OpValues(act.fn(x), act.fn_tol(x))
        y = g * act.dfn(x)
        return OpValues(y, np.abs(g) * act.dfn_tol(x) + 2 * _EPS * np.abs(y))
    if x.shape[-1] % 2:
        raise ValueError(f"{op} needs an even last dimension, got {x.shape}")
    a, b = _split(x)
    if name == "clamped_swiglu":
        if limit is None:
            raise ValueError(f"{op} needs limit")
        return _clamped_values(kind, a, b, g, (limit, alpha, linear_offset))
    act = ACTIVATIONS[GATED_ACTIVATIONS[name]]
    f, f_tol = act.fn(a), act.fn_tol(a)
    if kind == "gated":
        y = f * b
        return OpValues(y, np.abs(b) * f_tol + 2 * _EPS * np.abs(y))
    assert g is not None
    da = g * act.dfn(a) * b
    db = g * f
    tol_a = np.abs(g * b) * act.dfn_tol(a) + 4 * _EPS * np.abs(da)
    tol_b = np.abs(g) * f_tol + 2 * _EPS * np.abs(db)
    return OpValues(np.concatenate([da, db], axis=-1), np.concatenate([tol_a, tol_b], axis=-1))
