"""Dtype names, aliases and dtype objects."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from nvrtc_engine import DTYPES, VariantError
from nvrtc_engine.core.dtypes import dtype, dtype_name


@pytest.mark.parametrize(
    ("value", "name"),
    [
        ("fp32", "fp32"), ("float32", "fp32"), (np.float32, "fp32"), (np.dtype("float32"), "fp32"),
        ("half", "fp16"), (np.float16, "fp16"),
        ("bf16", "bf16"), ("BFloat16", "bf16"), (ml_dtypes.bfloat16, "bf16"),
        ("fp8", "fp8_e4m3"), ("e4m3", "fp8_e4m3"), (ml_dtypes.float8_e4m3fn, "fp8_e4m3"),
        ("e5m2", "fp8_e5m2"), (np.dtype(ml_dtypes.float8_e5m2), "fp8_e5m2"),
    ],
)  # fmt: skip
def test_names_aliases_and_objects(value, name):
    assert dtype_name(value) == name
    assert dtype(value) is DTYPES[name]


@pytest.mark.parametrize("bad", ["int8", "fp6", "float64", np.int32, 3])
def test_unknown_dtype_lists_allowed(bad):
    with pytest.raises(VariantError) as info:
        dtype_name(bad, "in_dtype")
    assert info.value.field == "in_dtype"
    for allowed in DTYPES:
        assert allowed in str(info.value)


@pytest.mark.parametrize(
    ("bad", "close"),
    [("bf61", "bf16"), ("fp8_e4m4", "fp8_e4m3"), ("BF61", "bf16"), ("halff", "half (fp16)"),
     ("bfloat", "bfloat16 (bf16)"), ("fp8_e5", "fp8_e5m2"), ("fp9", "fp8 (fp8_e4m3)")],
)  # fmt: skip
def test_misspelled_dtype_suggests_the_closest_spelling(bad, close):
    # an alias is suggested with the name it stands for, which the allowed list shows
    with pytest.raises(VariantError) as info:
        dtype_name(bad, "in_dtype")
    assert f"(did you mean {close}?);" in str(info.value)
    assert info.value.field == "in_dtype"


@pytest.mark.parametrize("bad", ["flaot32", "float33", "e5m3", "halff", "bf61", "fp8_e4m4"])
def test_the_message_lists_every_alias_as_a_pair_and_suggests_only_what_it_lists(bad):
    from nvrtc_engine.core.dtypes import _ALIASES

    with pytest.raises(VariantError) as info:
        dtype_name(bad)
    message = str(info.value)
    names, _, aliases = info.value.allowed.partition("; aliases: ")
    accepted = names.split(", ") + [pair.split(" -> ")[0] for pair in aliases.split(", ")]
    # each alias is "alias -> canonical": no reading "fp8=e4m3, e5m2" as e5m2 being fp8
    for alias, name in _ALIASES.items():
        assert (alias in names.split(", ")) if alias == name else f"{alias} -> {name}" in aliases
    assert sorted(accepted) == sorted(_ALIASES)
    suggested = message.split("did you mean ")[1].split("?")[0]
    spelling, _, stands_for = suggested.partition(" (")
    assert spelling in accepted
    assert stands_for == ("" if _ALIASES[spelling] == spelling else f"{_ALIASES[spelling]})")
    assert message.endswith(info.value.allowed)


@pytest.mark.parametrize("other", ["float64", "int8", "float8_e4m3fnuz", np.float64, 3])
def test_a_real_dtype_the_kernels_do_not_take_gets_no_suggestion(other):
    # float8_e4m3fnuz is not a typo of float8_e4m3fn: suggesting it would change the format
    with pytest.raises(VariantError) as info:
        dtype_name(other)
    assert "did you mean" not in str(info.value)


def test_numpy_dtypes_and_limits():
    assert DTYPES["bf16"].numpy() == np.dtype(ml_dtypes.bfloat16)
    assert DTYPES["fp8_e4m3"].numpy() == np.dtype(ml_dtypes.float8_e4m3fn)
    assert DTYPES["fp8_e4m3"].max_finite == float(ml_dtypes.finfo(ml_dtypes.float8_e4m3fn).max)
    assert DTYPES["fp8_e5m2"].max_finite == float(ml_dtypes.finfo(ml_dtypes.float8_e5m2).max)
    assert DTYPES["bf16"].max_finite == float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)
    for d in DTYPES.values():
        assert d.numpy().itemsize == d.itemsize
