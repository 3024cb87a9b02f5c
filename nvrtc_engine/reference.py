"""Independent numpy references: float64 math, rounded to the output dtype with ml_dtypes.

Used by the tests, the demo and the benchmarks; nothing here shares code with the kernels.
One module per family: :mod:`.activation` (the activation functions), :mod:`.activation_ops`
(every op of the activation family), :mod:`.norm`, :mod:`.cast` (including NVFP4); helpers in
:mod:`.common`, MXFP8 block scaling in :mod:`.mx`.
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
from .common import (
    FP32_EPS,
    check_close,
    round_to,
    sample_input,
    to_float64,
)
from .mx import (
    MXFP8_BLOCK,
    check_mxfp8,
    e8m0_multiplier,
    e8m0_scale,
    mxfp8_quantize,
)
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
    "ACTIVATION_OPS",
    "Activation",
    "ActivationResult",
    "CastTransposeResult",
    "E2M1_VALUES",
    "FP32_EPS",
    "GATED_ACTIVATIONS",
    "MXFP8_BLOCK",
    "NVFP4Result",
    "NormBackward",
    "NormForward",
    "OpValues",
    "activation",
    "cast_transpose",
    "check_close",
    "check_mxfp8",
    "clamped_swiglu",
    "dbias_tolerance",
    "dclamped_swiglu",
    "dgelu",
    "dqgelu",
    "drelu",
    "dsigmoid",
    "dsilu",
    "dsrelu",
    "e2m1_decode",
    "e2m1_encode",
    "e8m0_multiplier",
    "e8m0_scale",
    "gelu",
    "layernorm_bwd",
    "layernorm_fwd",
    "mxfp8_quantize",
    "nvfp4_encode_scale",
    "nvfp4_quantize",
    "op_kind",
    "op_values",
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
