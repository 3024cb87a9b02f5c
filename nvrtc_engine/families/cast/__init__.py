"""Cast family: transpose, cast/transpose (with dbias and activation gradients), the
multi-tensor cast/transpose (:mod:`.spec`) and ``quantize`` to tensor-scaled FP8, MXFP8 or
NVFP4 (:mod:`.quantize`). Templates: ``templates/cast.cu.j2``, ``templates/quantize.cu.j2``;
reference: :mod:`.reference`."""

from .quantize import QUANTIZE_SPEC
from .spec import CAST_SPECS

SPECS = (*CAST_SPECS, QUANTIZE_SPEC)
