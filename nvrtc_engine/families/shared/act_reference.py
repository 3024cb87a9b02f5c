"""Float64 references for activations and their derivatives (TransformerEngine semantics).

Forward: ``gelu`` (tanh approximation), ``qgelu`` (x * sigmoid(1.702 x)), ``silu``,
``relu``, ``srelu`` (relu(x)^2), ``sigmoid``. Backward ``d<name>(x)`` is the derivative
act'(x); a backward kernel computes ``grad * act'(x)``. Each function has an error bound:
the absolute error an fp32 evaluation (as in templates/include/nve_act.cuh) may carry, used
as the ``tolerance`` of :func:`~nvrtc_engine.reference.check_close`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from .reference import FP32_EPS, round_to

__all__ = [
    "ACTIVATIONS",
    "Activation",
    "ActivationResult",
    "activation",
    "dgelu",
    "dqgelu",
    "drelu",
    "dsigmoid",
    "dsilu",
    "dsrelu",
    "gelu",
    "qgelu",
    "relu",
    "sigmoid",
    "silu",
    "srelu",
]

_K = math.sqrt(2.0 / math.pi)
_C = 0.044715
QGELU_ALPHA = 1.702


def _f64(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def _sigmoid(z: np.ndarray) -> np.ndarray:
    # 1 / (1 + e^-z) with a small relative error for any z: through e^-|z| (never
    # overflows), so that tiny values (large negative z) keep their digits; 0.5 (1 + tanh)
    # would round them to 0.
    e = np.exp(-np.abs(z))
    return np.where(z >= 0, 1.0, e) / (1.0 + e)


def gelu(x: np.ndarray) -> np.ndarray:
    """tanh-approximated GELU, as in TransformerEngine.

    ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``, evaluated as the equal
    ``x * sigmoid(2u)`` (no cancellation for negative x).
    """
    x = _f64(x)
    return x * _sigmoid(2.0 * _K * (x + _C * x**3))


def dgelu(x: np.ndarray) -> np.ndarray:
    """Derivative of tanh-GELU: ``0.5 (1 + tanh u) + 0.5 x sech^2(u) u'``,
    ``u' = sqrt(2/pi) (1 + 3 * 0.044715 x^2)``."""
    x = _f64(x)
    s = _sigmoid(2.0 * _K * (x + _C * x**3))
    du = _K * (1.0 + 3.0 * _C * x**2)
    return s + 2.0 * x * s * (1.0 - s) * du


def qgelu(x: np.ndarray) -> np.ndarray:
    """Quick GELU: ``x * sigmoid(1.702 x)``."""
    x = _f64(x)
    return x * _sigmoid(QGELU_ALPHA * x)


def dqgelu(x: np.ndarray) -> np.ndarray:
    """Derivative of quick GELU: ``s + 1.702 x s (1 - s)``, ``s = sigmoid(1.702 x)``."""
    x = _f64(x)
    s = _sigmoid(QGELU_ALPHA * x)
    return s + QGELU_ALPHA * x * s * (1.0 - s)


def silu(x: np.ndarray) -> np.ndarray:
    """SiLU (swish): ``x * sigmoid(x)``."""
    x = _f64(x)
    return x * _sigmoid(x)


def dsilu(x: np.ndarray) -> np.ndarray:
    """Derivative of SiLU: ``s (1 + x (1 - s))``, ``s = sigmoid(x)``."""
    x = _f64(x)
    s = _sigmoid(x)
    return s * (1.0 + x * (1.0 - s))


def relu(x: np.ndarray) -> np.ndarray:
    """ReLU: ``max(x, 0)``."""
    return np.maximum(_f64(x), 0.0)


def drelu(x: np.ndarray) -> np.ndarray:
    """Derivative of ReLU: 1 where ``x > 0``, else 0 (0 at 0, as TransformerEngine)."""
    return (_f64(x) > 0.0).astype(np.float64)


def srelu(x: np.ndarray) -> np.ndarray:
    """Squared ReLU: ``max(x, 0)^2``."""
    r = np.maximum(_f64(x), 0.0)
    return r * r


def dsrelu(x: np.ndarray) -> np.ndarray:
    """Derivative of squared ReLU: ``2 max(x, 0)``."""
    return 2.0 * np.maximum(_f64(x), 0.0)


def sigmoid(x: np.ndarray) -> np.ndarray:
    """Logistic sigmoid ``1 / (1 + exp(-x))``."""
    return _sigmoid(_f64(x))


def dsigmoid(x: np.ndarray) -> np.ndarray:
    """Derivative of sigmoid: ``s (1 - s)``."""
    s = _sigmoid(_f64(x))
    return s * (1.0 - s)


# Error bounds of the fp32 device math (absolute). An fp32 evaluation rounds the exponent
# argument z, which costs |z| * eps relative in exp(z); the rest is a few ulp. Derivatives
# are sums of terms that can cancel, so their bound scales with the terms, not the result.
def _exp_arg_gelu(x: np.ndarray) -> np.ndarray:
    return np.abs(2.0 * _K * (x + _C * x**3))


def _bound(terms: np.ndarray, z: np.ndarray) -> np.ndarray:
    return 16.0 * FP32_EPS * (1.0 + z) * np.abs(terms)


def _gelu_tol(x: np.ndarray) -> np.ndarray:
    return _bound(gelu(x), _exp_arg_gelu(x))


def _dgelu_tol(x: np.ndarray) -> np.ndarray:
    s = _sigmoid(2.0 * _K * (x + _C * x**3))
    du = _K * (1.0 + 3.0 * _C * x**2)
    return _bound(s + np.abs(2.0 * x * s * (1.0 - s) * du), _exp_arg_gelu(x))


def _logistic_tol(alpha: float, f: Callable, with_x: bool) -> Callable:
    def tol(x: np.ndarray) -> np.ndarray:
        z = np.abs(alpha * x)
        if not with_x:
            return _bound(f(x), z)
        s = _sigmoid(alpha * x)
        return _bound(s + np.abs(alpha * x * s * (1.0 - s)), z)

    return tol


def _dsigmoid_tol(x: np.ndarray) -> np.ndarray:
    # s (1 - s): 1 - s loses its digits where s is near 1 (large x): an absolute error of
    # up to ~2 eps * s (approximate reciprocal, rounding); elsewhere relative, as for the
    # other logistic functions.
    return 32.0 * FP32_EPS * (1.0 + np.abs(x)) * dsigmoid(x) + 4.0 * FP32_EPS * sigmoid(x)


def _exact_tol(f: Callable) -> Callable:
    return lambda x: 4.0 * FP32_EPS * np.abs(f(x))


class Activation(NamedTuple):
    """An activation: its function, derivative, and their fp32 error bounds (absolute)."""

    name: str
    fn: Callable[[np.ndarray], np.ndarray]
    dfn: Callable[[np.ndarray], np.ndarray]
    fn_tol: Callable[[np.ndarray], np.ndarray]
    dfn_tol: Callable[[np.ndarray], np.ndarray]


ACTIVATIONS: dict[str, Activation] = {
    a.name: a
    for a in (
        Activation("gelu", gelu, dgelu, _gelu_tol, _dgelu_tol),
        Activation("qgelu", qgelu, dqgelu, _logistic_tol(QGELU_ALPHA, qgelu, False),
                   _logistic_tol(QGELU_ALPHA, dqgelu, True)),
        Activation("silu", silu, dsilu, _logistic_tol(1.0, silu, False),
                   _logistic_tol(1.0, dsilu, True)),
        Activation("relu", relu, drelu, _exact_tol(relu), _exact_tol(drelu)),
        Activation("srelu", srelu, dsrelu, _exact_tol(srelu), _exact_tol(dsrelu)),
        Activation("sigmoid", sigmoid, dsigmoid, _logistic_tol(1.0, sigmoid, False),
                   _dsigmoid_tol),
    )
}  # fmt: skip


class ActivationResult(NamedTuple):
    """Reference output of a forward activation kernel.

    ``y``: float64 values before scaling; ``out``: ``y * scale`` rounded to the output dtype;
    ``amax``: ``max|y|``; ``scale_inv``: ``1/scale`` in fp32 (or None); ``tolerance``: the
    absolute error an fp32 kernel may carry in ``y`` (multiply by the scale for scaled output).
    """

    y: np.ndarray
    out: np.ndarray
    amax: float
    scale_inv: np.float32 | None
    tolerance: np.ndarray


def activation(
    op: str, x: np.ndarray, out_dtype: str, scale: float | None = None
) -> ActivationResult:
    """Reference for a forward activation kernel on input values ``x`` (any float dtype).

    ``scale`` (an fp32 value) applies tensor scaling: ``out = round(y * scale)``.
    """
    act = ACTIVATIONS[op]
    x64 = np.asarray(x).astype(np.float64)
    y = act.fn(x64)
    scaled = y if scale is None else y * np.float64(np.float32(scale))
    amax = float(np.max(np.abs(y))) if y.size else 0.0
    scale_inv = None if scale is None else np.float32(1.0) / np.float32(scale)
    return ActivationResult(y, round_to(scaled, out_dtype), amax, scale_inv, act.fn_tol(x64))
