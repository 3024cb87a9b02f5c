"""A toy kernel family for tests/test_layout.py and docs/architecture.md's worked example:
``scale_by``, ``y = x * factor`` element-wise, ``factor`` a compile-time int (a key flag).

Everything it needs is in this folder (this spec and ``scale_by.cu.j2``); the registry
learns of it from one entry (``register_family("toy_family", "scale_by")``).
"""

from __future__ import annotations

import math
import os
from typing import Any

from nvrtc_engine.core.errors import VariantError
from nvrtc_engine.core.kernel import Kernel
from nvrtc_engine.core.key import IntFlag, KernelKey
from nvrtc_engine.core.signature import CallArgs, Signature, i64, ptr
from nvrtc_engine.core.spec import HIGH_PRECISION, OpSpec

THREADS = 256
PARAMS = Signature(ptr("x", "T::storage", const=True), ptr("y", "T::storage"), i64("n"))
ARGS = CallArgs(("x", "out"))


class ScaleBySpec(OpSpec):
    """``y = x * factor`` in fp32, for any high-precision dtype (in = out)."""

    name = "scale_by"
    family = "scale_by"  # the template: scale_by.cu.j2, in this folder
    templates = os.path.dirname(os.path.abspath(__file__))
    doc = "y = x * factor (toy family)"
    out_dtypes = HIGH_PRECISION
    scalings = ("none",)
    flags = {"factor": IntFlag("f", choices=(1, 2, 4, 8), default=1)}

    def validate(self, key: KernelKey) -> None:
        super().validate(key)
        if key.in_dtype != key.out_dtype:
            raise VariantError("out_dtype", key.out_dtype, [key.in_dtype], "must be in_dtype")

    def render_context(self, key: KernelKey) -> dict[str, Any]:
        return {**super().render_context(key), "factor": key.flag("factor"),
                "threads": THREADS, "params": PARAMS.c_params()}  # fmt: skip

    def kernel_class(self) -> type[Kernel]:
        return ScaleByKernel


class ScaleByKernel(Kernel):
    """``kernel(x, out=None, *, stream=None) -> out``: ``out = x * factor``."""

    def __call__(self, x: Any, out: Any = None, *, stream: Any = None) -> Any:
        xa = self._input(x, "x", self.key.input)
        out, oa = self._output(out, "out", xa, xa.shape, self.key.output)
        n = math.prod(oa.shape)
        if n:
            values = PARAMS.bind(x=ARGS.x, y=ARGS.out, n=n)
            launch = (0, -(-n // THREADS), THREADS, PARAMS, values)
            self._submit((x, out), (x, out), (xa.ptr, oa.ptr), (), stream, xa, [launch])
        return out


SPECS = (ScaleBySpec(),)
