"""What every op spec provides: closed sets for its key fields, render context, kernel class.

One :class:`OpSpec` instance per op, in its family's ``SPECS`` (a family is listed in
:mod:`nvrtc_engine.core.registry`). A spec never
touches the GPU; it turns a validated key into template values and says which
:class:`~nvrtc_engine.core.kernel.Kernel` subclass launches it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from .dtypes import DTYPES
from .errors import VariantError
from .key import IntFlag, arch_number

if TYPE_CHECKING:
    from .kernel import Kernel
    from .key import KernelKey

__all__ = ["HIGH_PRECISION", "OpSpec"]

HIGH_PRECISION: tuple[str, ...] = ("fp32", "fp16", "bf16")
FP8: tuple[str, ...] = ("fp8_e4m3", "fp8_e5m2")
# Template type tags (templates/include/nve_types.cuh; e2m1 in nve_fp4.cuh) for each dtype.
TYPE_TAGS = {"fp32": "f32", "fp16": "f16", "bf16": "bf16", "fp8_e4m3": "e4m3", "fp8_e5m2": "e5m2",
             "fp4_e2m1": "e2m1"}  # fmt: skip
# First arch with the cvt.rn.satfinite.{e4m3x2,e5m2x2}.f32 instruction (Ada).
HW_FP8_ARCH = 89


class OpSpec:
    """Base spec. Subclasses set the class attributes and implement :meth:`kernel_class`.

    Attributes:
        name: the op name used in keys and ``get_kernel``.
        family: template stem (``templates/<family>.cu.j2``).
        templates: ``None`` for the package's families; for a family outside the package, the
            folder holding its code and its ``<family>.cu.j2`` (which may include the
            package's templates and helper headers). Read once per process; its files are
            part of its kernels' cache digest.
        in_dtypes / out_dtypes / scalings / layouts: the op's closed sets.
        flags: op flags that change code, mapped to their short form in kernel names (a
            bool flag) or to an :class:`~nvrtc_engine.core.key.IntFlag` (an int flag).
        doc: one line for listings.
    """

    name: str = ""
    family: str = ""
    templates: str | None = None
    doc: str = ""
    in_dtypes: tuple[str, ...] = HIGH_PRECISION
    out_dtypes: tuple[str, ...] = HIGH_PRECISION + FP8
    scalings: tuple[str, ...] = ("none", "tensor")
    layouts: tuple[str, ...] = ("rowwise",)
    flags: ClassVar[dict[str, str | IntFlag]] = {}

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} ({self.family})>"

    def default_scaling(self, out_dtype: str) -> str:
        """Scaling when the caller names none: ``tensor`` for FP8 outputs, else ``none``."""
        return "tensor" if DTYPES[out_dtype].is_fp8 else "none"

    def validate(self, key: KernelKey) -> None:
        """Check the key's fields against this op's sets; raise :class:`VariantError`."""
        hint = f"for op {self.name!r}"
        if key.in_dtype not in self.in_dtypes:
            raise VariantError("in_dtype", key.in_dtype, self.in_dtypes, hint)
        if key.out_dtype not in self.out_dtypes:
            raise VariantError("out_dtype", key.out_dtype, self.out_dtypes, hint)
        if key.scaling not in self.scalings:
            block = key.scaling in ("mxfp8", "nvfp4") and self.name != "quantize"
            raise VariantError("scaling", key.scaling, self.scalings, hint + (
                f"; {key.scaling} quantization of a tensor is the 'quantize' op" if block
                else ""))  # fmt: skip
        if key.layout not in self.layouts:
            raise VariantError("layout", key.layout, self.layouts, hint)
        fp8_out = DTYPES[key.out_dtype].is_fp8
        if fp8_out and key.scaling == "none":
            raise VariantError("scaling", key.scaling, ["tensor", "mxfp8"],
                               f"{key.out_dtype} output needs a scaling mode")  # fmt: skip
        if not fp8_out and key.scaling != "none":
            raise VariantError("scaling", key.scaling, ["none"],
                               f"{key.out_dtype} output is not scaled")  # fmt: skip

    def symbols(self, key: KernelKey) -> tuple[str, ...]:
        """The ``extern "C"`` kernels the variant's source defines; the first is the main one."""
        return (str(key),)

    def cuda_headers(self, key: KernelKey) -> bool:
        """Whether the variant's source includes CUDA toolkit headers: ``cuda_fp8.h`` for FP8
        conversions in software, on archs without the instructions (the cache digest then
        takes in the headers' version). Also the templates' ``soft_fp8``."""
        return arch_number(key.arch) < HW_FP8_ARCH and (
            DTYPES[key.out_dtype].is_fp8 or DTYPES[key.in_dtype].is_fp8
        )

    def render_context(self, key: KernelKey) -> dict[str, Any]:
        """Template values common to every family; subclasses add their own."""
        soft_fp8 = self.cuda_headers(key)
        return {
            "name": self.symbols(key)[0],
            "op": key.op,
            "in_dtype": key.in_dtype,
            "out_dtype": key.out_dtype,
            "in_type": TYPE_TAGS[key.in_dtype],
            "out_type": TYPE_TAGS[key.out_dtype],
            "scaling": key.scaling,
            "layout": key.layout,
            "hidden_size": key.hidden_size,
            "arch": key.arch,
            "soft_fp8": soft_fp8,
        }

    def kernel_class(self) -> type[Kernel]:
        raise NotImplementedError
