"""Independent numpy references: float64 math, rounded to the output dtype with ml_dtypes.

Used by the tests, the demo and the benchmarks; nothing here shares code with the kernels.
One module per family (:mod:`.activation` for the activation functions, :mod:`.activation_ops`
for every op of the activation family, ...), helpers in :mod:`.common`, block scaling (MXFP8)
in :mod:`.mx`.
"""

from __future__ import annotations

from .activation import (
    ACTIVATIONS,
    Activation,
    ActivationResult,
    activation,
    dgelu,
    dqgelu,
    drelu,
    dsigmoid,
    dsilu,
    dsrelu,
    gelu,
    qgelu,
    relu,
    sigmoid,
    silu,
    srelu,
)
from .activation_ops import (
    ACTIVATION_OPS,
    GATED_ACTIVATIONS,
    OpValues,
    clamped_swiglu,
    dclamped_swiglu,
    op_kind,
    op_values,
)
from .common import FP32_EPS, check_close, round_to, sample_input, to_float64
from .mx import MXFP8_BLOCK, check_mxfp8, e8m0_multiplier, e8m0_scale, mxfp8_quantize

__all__ = [
    "ACTIVATIONS",
    "ACTIVATION_OPS",
    "FP32_EPS",
    "GATED_ACTIVATIONS",
    "MXFP8_BLOCK",
    "Activation",
    "ActivationResult",
    "OpValues",
    "activation",
    "check_close",
    "check_mxfp8",
    "clamped_swiglu",
    "dclamped_swiglu",
    "dgelu",
    "dqgelu",
    "drelu",
    "dsigmoid",
    "dsilu",
    "dsrelu",
    "e8m0_multiplier",
    "e8m0_scale",
    "gelu",
    "mxfp8_quantize",
    "op_kind",
    "op_values",
    "qgelu",
    "relu",
    "round_to",
    "sample_input",
    "sigmoid",
    "silu",
    "srelu",
    "to_float64",
]
