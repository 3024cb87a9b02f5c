"""Independent numpy references of every family, in one namespace: float64 math, rounded to
the output dtype with ml_dtypes.

Used by the tests, the demo and the benchmarks; nothing here shares code with the kernels.
Each family keeps its own beside its kernels: :mod:`.families.activation.reference`,
:mod:`.families.norm.reference`, :mod:`.families.cast.reference` (NVFP4 included); shared
pieces in :mod:`.families.shared` (``act_reference``: the activation functions;
``mx_reference``: MXFP8 block scaling; ``reference``: sampling, rounding, checks). This module
imports every family's reference (and NumPy): the package does not import it.
"""

from __future__ import annotations

from .families.activation.reference import (
    ACTIVATION_OPS,
    GATED_ACTIVATIONS,
    OpValues,
    clamped_swiglu,
    dclamped_swiglu,
    op_kind,
    op_values,
)
from .families.cast.reference import (
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
from .families.norm.reference import (
    NormBackward,
    NormForward,
    layernorm_bwd,
    layernorm_fwd,
    rmsnorm_bwd,
    rmsnorm_fwd,
    summation_depth,
)
from .families.shared.act_reference import (
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
from .families.shared.mx_reference import (
    MXFP8_BLOCK,
    check_mxfp8,
    e8m0_multiplier,
    e8m0_scale,
    mxfp8_quantize,
)
from .families.shared.reference import (
    FP32_EPS,
    check_close,
    round_to,
    sample_input,
    to_float64,
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
