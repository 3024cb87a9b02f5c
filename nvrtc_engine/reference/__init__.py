"""Independent numpy references: float64 math, rounded to the output dtype with ml_dtypes.

Used by the tests, the demo and the benchmarks; nothing here shares code with the kernels.
One module per family (:mod:`.activation`, :mod:`.norm`, ...), helpers in :mod:`.common`,
block scaling (MXFP8) in :mod:`.mx`.
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
from .common import FP32_EPS, check_close, round_to, sample_input, to_float64
from .mx import MXFP8_BLOCK, e8m0_scale, mxfp8_quantize
from .norm import (
    NormBackward,
    NormForward,
    layernorm_bwd,
    layernorm_fwd,
    rmsnorm_bwd,
    rmsnorm_fwd,
    summation_depth,
)

__all__ = [
    "ACTIVATIONS",
    "FP32_EPS",
    "MXFP8_BLOCK",
    "Activation",
    "ActivationResult",
    "NormBackward",
    "NormForward",
    "activation",
    "check_close",
    "dgelu",
    "dqgelu",
    "drelu",
    "dsigmoid",
    "dsilu",
    "dsrelu",
    "e8m0_scale",
    "gelu",
    "layernorm_bwd",
    "layernorm_fwd",
    "mxfp8_quantize",
    "qgelu",
    "relu",
    "rmsnorm_bwd",
    "rmsnorm_fwd",
    "round_to",
    "sample_input",
    "sigmoid",
    "silu",
    "srelu",
    "summation_depth",
    "to_float64",
]
