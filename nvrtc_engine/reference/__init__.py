"""Independent numpy references: float64 math, rounded to the output dtype with ml_dtypes.

Used by the tests, the demo and the benchmarks; nothing here shares code with the kernels.
One module per family (:mod:`.activation`, :mod:`.norm`, :mod:`.cast`), helpers in
:mod:`.common`, block scaling (MXFP8) in :mod:`.mx`, NVFP4 in :mod:`.cast`.
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
from .cast import (
    E2M1_VALUES,
    CastTransposeResult,
    NVFP4Result,
    cast_transpose,
    dbias_tolerance,
    e2m1_decode,
    e2m1_encode,
    nvfp4_encode_scale,
    nvfp4_quantize,
    pack_e2m1,
    unpack_e2m1,
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
    "E2M1_VALUES",
    "FP32_EPS",
    "MXFP8_BLOCK",
    "Activation",
    "ActivationResult",
    "CastTransposeResult",
    "NVFP4Result",
    "NormBackward",
    "NormForward",
    "activation",
    "cast_transpose",
    "check_close",
    "dbias_tolerance",
    "dgelu",
    "dqgelu",
    "drelu",
    "dsigmoid",
    "dsilu",
    "dsrelu",
    "e2m1_decode",
    "e2m1_encode",
    "e8m0_scale",
    "gelu",
    "layernorm_bwd",
    "layernorm_fwd",
    "mxfp8_quantize",
    "nvfp4_encode_scale",
    "nvfp4_quantize",
    "pack_e2m1",
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
    "unpack_e2m1",
]
