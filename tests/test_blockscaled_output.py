"""One result type for block-scaled outputs: BlockScaledOutput, with TransformerEngine's field
names; the older spellings still work, with a DeprecationWarning."""

from __future__ import annotations

import pickle

import pytest

import nvrtc_engine as ne
from nvrtc_engine.families.cast.quantize import QuantizeResult
from nvrtc_engine.families.norm.kernels import LayerNormOutput, RMSNormOutput
from nvrtc_engine.families.shared.blockscale import BlockScaledOutput


def test_one_type_under_every_name():
    assert ne.BlockScaledOutput is BlockScaledOutput
    assert ne.MXFP8Output is BlockScaledOutput and QuantizeResult is BlockScaledOutput


def test_fields_iteration_and_equality():
    data, scales = object(), object()
    out = BlockScaledOutput(data, scales)
    assert out.rowwise_data is data and out.rowwise_scale_inv is scales
    assert out.columnwise_data is None and out.amax is None and out.scale_inv is None
    assert tuple(out) == (data, scales, None, None) and len(out) == 4 and out[1] is scales
    assert out == BlockScaledOutput(rowwise_data=data, rowwise_scale_inv=scales)
    assert out != BlockScaledOutput(data)
    out.amax = 5
    assert out.amax == 5
    assert "rowwise_data=" in repr(out) and "columnwise_data" not in repr(out)
    copy = pickle.loads(pickle.dumps(BlockScaledOutput(1, 2, amax=3)))
    assert (copy.rowwise_data, copy.rowwise_scale_inv, copy.amax) == (1, 2, 3)


@pytest.mark.parametrize(
    ("old", "new"),
    [("rowwise", "rowwise_data"), ("rowwise_scale", "rowwise_scale_inv"),
     ("columnwise", "columnwise_data"), ("columnwise_scale", "columnwise_scale_inv")],
)  # fmt: skip
def test_old_names_warn_and_still_work(old, new):
    value = object()
    with pytest.warns(DeprecationWarning, match=f"{old} is deprecated: use .{new}"):
        out = BlockScaledOutput(**{old: value})
    assert getattr(out, new) is value
    with pytest.warns(DeprecationWarning, match=f"{old} is deprecated"):
        assert getattr(out, old) is value
    other = object()
    with pytest.warns(DeprecationWarning, match=f"{old} is deprecated"):
        setattr(out, old, other)
    assert getattr(out, new) is other


def test_a_field_given_twice_or_unknown_is_a_type_error():
    with pytest.raises(TypeError, match="rowwise_data twice"), pytest.warns(DeprecationWarning):
        BlockScaledOutput(1, rowwise=2)
    with pytest.raises(TypeError, match="unexpected keyword argument 'rowwise_scales'"):
        BlockScaledOutput(rowwise_scales=1)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        BlockScaledOutput().nope  # noqa: B018


def test_an_mxfp8_norm_outputs_scale_inv_is_deprecated():
    scales = object()
    ln = LayerNormOutput(BlockScaledOutput(object(), scales), "mu", "rsigma", scales)
    with pytest.warns(DeprecationWarning, match="use z.rowwise_scale_inv"):
        assert ln.scale_inv is scales
    rms = RMSNormOutput(BlockScaledOutput(object(), scales), "rsigma", scales)
    with pytest.warns(DeprecationWarning, match="use z.rowwise_scale_inv"):
        assert rms.scale_inv is scales
    z, _, _, s = ln  # unpacking, and a tensor-scaled output's scale_inv, do not warn
    assert s is scales and isinstance(z, BlockScaledOutput)
    assert LayerNormOutput("z", "mu", "rsigma", 1.0).scale_inv == 1.0
