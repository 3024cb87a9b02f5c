"""KernelKey: validation against closed sets, canonical names, defaults of make_key."""

from __future__ import annotations

import itertools
import pickle
import re

import numpy as np
import pytest

import nvrtc_engine as ne
from nvrtc_engine import KernelKey, VariantError, make_key


def key(**overrides):
    fields = dict(
        op="gelu",
        in_dtype="bf16",
        out_dtype="fp8_e4m3",
        scaling="tensor",
        layout="rowwise",
        hidden_size=4096,
        arch="sm_90",
    )
    fields.update(overrides)
    return KernelKey(**fields)


def test_canonical_name_and_parse_round_trip():
    k = key()
    assert str(k) == "gelu_bf16_e4m3_tensor_rowwise_h4096_sm90"
    assert KernelKey.parse(str(k)) == k
    general = key(hidden_size=None, arch="sm_100a", out_dtype="bf16", scaling="none")
    assert str(general) == "gelu_bf16_bf16_none_rowwise_hany_sm100a"
    assert KernelKey.parse(str(general)) == general
    assert str(k).isidentifier()  # it is also the extern "C" symbol


@pytest.mark.parametrize("alias", ["fp8", "e4m3", "fp8_e4m3", "float8_e4m3fn"])
def test_dtype_aliases_give_equal_keys(alias):
    assert key(out_dtype=alias) == key()
    assert hash(key(out_dtype=alias)) == hash(key())


def test_dtype_objects_accepted():
    import ml_dtypes

    assert key(in_dtype=np.dtype(ml_dtypes.bfloat16)) == key()
    assert key(in_dtype=ml_dtypes.bfloat16, out_dtype=ml_dtypes.float8_e4m3fn) == key()
    assert key(in_dtype=np.float16).in_dtype == "fp16"

    class FakeTorchDtype:  # torch.dtype prints as "torch.bfloat16"
        def __str__(self):
            return "torch.bfloat16"

    assert key(in_dtype=FakeTorchDtype()) == key()


@pytest.mark.parametrize(
    ("field", "value", "allowed_word"),
    [
        ("op", "gelu2", "gelu"),
        ("in_dtype", "int8", "bf16"),
        ("out_dtype", "fp6", "fp8_e4m3"),
        ("scaling", "block", "tensor"),
        ("layout", "diagonal", "rowwise"),
        ("hidden_size", 0, "None or an int"),
        ("hidden_size", -5, "None or an int"),
        ("hidden_size", True, "None or an int"),
        ("hidden_size", "4096", "None or an int"),
        ("arch", "sm_70", "sm_80"),
        ("arch", "gfx90a", "sm_80"),
        ("arch", "sm_80a", "sm_90a"),
        ("flags", (("zero_centered_gamma", True),), "none for this op"),
    ],
)
def test_every_bad_field_names_field_and_allowed_values(field, value, allowed_word):
    with pytest.raises(VariantError) as info:
        key(**{field: value})
    err = info.value
    assert err.field in (field, "flags")
    assert allowed_word in str(err)
    assert isinstance(err, ValueError)


def test_op_level_combinations():
    with pytest.raises(VariantError, match="in_dtype.*fp8_e4m3"):
        key(in_dtype="fp8_e4m3")  # FP8 input is not an activation input
    with pytest.raises(VariantError, match="needs a scaling mode"):
        key(scaling="none")
    with pytest.raises(VariantError, match="is not scaled"):
        key(out_dtype="bf16", scaling="tensor")
    with pytest.raises(VariantError, match="scaling"):
        key(scaling="nvfp4")  # not an activation output
    with pytest.raises(VariantError, match="layout.*MXFP8 only"):
        key(layout="columnwise")  # columnwise/both exist for MXFP8 output only
    with pytest.raises(VariantError, match="hidden_size.*multiple of 32"):
        key(scaling="mxfp8", hidden_size=4100)


def test_arch_forms():
    assert key(arch=90).arch == "sm_90"
    assert key(arch=np.int64(90)).arch == "sm_90"  # numpy's ints too, as for hidden_size
    assert key(arch="SM90A").arch == "sm_90a"
    assert key(arch="sm_100a").arch == "sm_100a"
    assert key(arch="sm_100f").arch == "sm_100f"
    assert key(arch="sm_107").arch == "sm_107"
    # a key holds the arch of a GPU newer than every known arch (its kernel is PTX);
    # make_key refuses such an arch when a caller names it (test_a_named_arch_must_be_known)
    assert key(arch="sm_130").arch == "sm_130"


@pytest.mark.parametrize(
    "arch, says",
    [
        ("sm_95", "names no GPU"),  # between known archs
        ("sm_81", "names no GPU"),
        ("sm_101", "sm_100, sm_103, sm_107"),
        ("sm_75", "older than Ampere"),
        ("gpu90", "not an arch name"),
        ("sm_90f", "family-specific 'f' targets exist from sm_100 on"),
        ("sm_80a", "arch-specific 'a' targets exist from sm_90 on"),
        ("sm_90b", "expected sm_<major><minor>"),
    ],
)
def test_arch_outside_the_known_set_is_refused_before_rendering(arch, says):
    with pytest.raises(VariantError, match=re.escape(says)) as err:
        key(arch=arch)
    assert err.value.field == "arch"


KNOWN = "sm_80, sm_86, sm_87, sm_88, sm_89, sm_90, sm_100, sm_103, sm_107, sm_110, sm_120, sm_121"


@pytest.mark.parametrize(
    "arch, message",
    [
        ("sm_5", "arch='sm_5' is not an arch name: expected sm_<major><minor> such as sm_90 "
                 f"(optionally sm_90a, sm_100f); known archs: {KNOWN}"),
        ("compute_90", "arch='compute_90' is not an arch name: expected sm_<major><minor>"),
        ("", "arch='' is not an arch name: expected sm_<major><minor>"),
        ("sm_50", "arch='sm_50' is older than Ampere: the oldest arch supported is sm_80; "
                  f"known archs: {KNOWN}"),
        ("sm_95", "arch='sm_95' names no GPU (it lies between sm_90 and sm_100); known archs: "),
        ("sm_89a", "arch='sm_89a' cannot take the 'a' suffix: arch-specific 'a' targets exist "
                   "from sm_90 on; pass sm_89, or one of sm_90a, sm_100a, "),
        ("sm_90f", "arch='sm_90f' cannot take the 'f' suffix: family-specific 'f' targets exist "
                   "from sm_100 on; pass sm_90, or one of sm_100f, "),
    ],
)  # fmt: skip
def test_arch_message_says_what_is_wrong_and_what_to_pass(arch, message):
    """The message leads with the fault and ends with what to pass; ``detail`` is the part
    after ``arch=...`` (the command line puts ``--arch``'s own text before it)."""
    with pytest.raises(VariantError) as err:
        key(arch=arch)
    assert str(err.value).startswith(message)
    assert "is not allowed" not in str(err.value)
    assert str(err.value) == f"arch={arch!r} {err.value.detail}"


def test_parse_rejects_garbage():
    for bad in [
        "",
        "gelu",
        "gelu_bf16_e4m3_tensor_rowwise_h4096",
        "tanh_bf16_bf16_none_rowwise_hany_sm90",  # not an op
        "gelu_bf16_e4m3_tensor_rowwise_h4096_sm90_zcg",
    ]:
        with pytest.raises(VariantError):
            KernelKey.parse(bad)


@pytest.mark.parametrize("bad", [None, 3, 4.0, b"gelu_bf16_e4m3_tensor_rowwise_h4096_sm90"])
def test_parse_of_a_non_string_is_a_variant_type_error(bad):
    with pytest.raises(ne.VariantTypeError, match=r"^name=.* pass a canonical kernel name, a "
                       r"str such as 'gelu_") as info:  # fmt: skip
        KernelKey.parse(bad)
    assert isinstance(info.value, TypeError) and info.value.field == "name"


@pytest.mark.parametrize(
    ("name", "canonical"),
    [
        ("gelu_bf16_e4m3_tensor_rowwise_h04096_sm90", "gelu_bf16_e4m3_tensor_rowwise_h4096_sm90"),
        ("gelu_bf16_e4m3_tensor_rowwise_h4096_sm090", "gelu_bf16_e4m3_tensor_rowwise_h4096_sm90"),
        ("layernorm_fwd_bf16_bf16_none_rowwise_h1024_sm90_zcg_zcg",
         "layernorm_fwd_bf16_bf16_none_rowwise_h1024_sm90_zcg"),
        ("layernorm_fwd_bf16_bf16_none_rowwise_h1024_sm90_zcg_wf32",
         "layernorm_fwd_bf16_bf16_none_rowwise_h1024_sm90_wf32_zcg"),
    ],
)  # fmt: skip
def test_parse_refuses_other_spellings_of_a_key_and_shows_its_name(name, canonical):
    with pytest.raises(VariantError, match="is not a canonical kernel name") as info:
        KernelKey.parse(name)
    assert info.value.field == "name" and repr(canonical) in str(info.value)
    assert str(KernelKey.parse(canonical)) == canonical


@pytest.mark.parametrize(
    "name",
    [
        "gelu_bf16_e4m3_tensor_rowwise_h\u0664\u0660\u0669\u0666_sm90",  # Arabic-Indic 4096
        "gelu_bf16_e4m3_tensor_rowwise_h4096_sm\uff19\uff10",  # fullwidth 90
        "gelu_bf16_e4m3_tensor_rowwise_h4096_sm90\n",
        "GELU_bf16_e4m3_tensor_rowwise_h4096_sm90",
        " gelu_bf16_e4m3_tensor_rowwise_h4096_sm90",
    ],
)
def test_parse_refuses_non_ascii_digits_and_stray_characters(name):
    with pytest.raises(VariantError, match="canonical kernel name") as info:
        KernelKey.parse(name)
    assert info.value.field == "name"


def _flag_sets(flags):
    """No flag, each flag alone, and all of them together."""
    sets = [()] + [((flag, True),) for flag in flags]
    return sets + ([tuple((flag, True) for flag in flags)] if len(flags) > 1 else [])


@pytest.mark.parametrize("op", ne.registered_ops())
def test_parse_reads_back_every_name_str_writes(op):
    """For every op: each of its dtypes, scalings and layouts, a few sizes, archs and flag
    sets; the keys that validate round-trip through their name both ways."""
    from nvrtc_engine.core.registry import get_spec

    spec = get_spec(op)
    count = 0
    for fields in itertools.product(
        spec.in_dtypes, spec.out_dtypes, spec.scalings, spec.layouts, (None, 1, 4096, 65536),
        ("sm_80", "sm_90a", "sm_100f", "sm_120"), _flag_sets(tuple(spec.flags)),
    ):  # fmt: skip
        try:
            k = KernelKey(op, *fields)
        except VariantError:  # a combination the op does not take
            continue
        name = str(k)
        assert KernelKey.parse(name) == k and str(KernelKey.parse(name)) == name
        count += 1
    assert count >= 8


def test_make_key_defaults():
    k = make_key("gelu", dtype="fp8", arch="sm_90")
    assert (k.in_dtype, k.out_dtype, k.scaling, k.layout, k.hidden_size) == (
        "bf16",
        "fp8_e4m3",
        "tensor",
        "rowwise",
        None,
    )
    k = make_key("gelu", dtype="fp16", arch="sm_90")
    assert (k.in_dtype, k.out_dtype, k.scaling) == ("fp16", "fp16", "none")
    k = make_key("gelu", arch="sm_90")
    assert (k.in_dtype, k.out_dtype, k.scaling) == ("bf16", "bf16", "none")
    k = make_key("gelu", in_dtype="fp32", out_dtype="e5m2", arch="sm_89")
    assert (k.in_dtype, k.out_dtype, k.scaling) == ("fp32", "fp8_e5m2", "tensor")
    with pytest.raises(ne.ArgumentTypeError, match="^out_dtype: .*not both") as info:
        make_key("gelu", dtype="fp8", out_dtype="fp8", arch="sm_90")
    assert isinstance(info.value, TypeError) and info.value.argument == "out_dtype"


def test_a_kernel_name_given_as_the_op_says_how_to_pass_it():
    name = "gelu_bf16_bf16_none_rowwise_h4096_sm90"
    for call in (lambda: ne.get_kernel(name), lambda: make_key(name, arch="sm_90")):
        with pytest.raises(VariantError, match=r"a kernel name, not an op: pass ne\.KernelKey"):
            call()
    assert make_key("gelu", dtype="bf16", hidden_size=4096, arch="sm_90") == KernelKey.parse(name)
    with pytest.raises(VariantError, match=r"\(did you mean gelu or qgelu\?\)"):  # not a name
        make_key("gelo", arch="sm_90")


def test_key_call_misuse_is_a_library_error_and_a_type_error():
    """Fields that do not go together: an NvrtcEngineError, and still the TypeError a
    Python call with wrong arguments raises."""
    with pytest.raises(ne.ArgumentTypeError, match="not both") as info:
        ne.get_kernel("gelu", dtype="bf16", out_dtype="fp16", arch="sm_90")
    assert isinstance(info.value, ne.NvrtcEngineError) and isinstance(info.value, TypeError)
    key = make_key("gelu", dtype="bf16", arch="sm_90")
    with pytest.raises(ne.ArgumentTypeError, match="^hidden_size: get_kernel.key. takes no"):
        ne.get_kernel(key, hidden_size=4096)


def test_missing_arch_without_gpu_is_a_clear_error(monkeypatch):
    from nvrtc_engine.core import driver

    monkeypatch.setattr(driver, "_init_pid", None)
    monkeypatch.setattr(driver, "_init_error", driver._init_error)
    monkeypatch.setattr(driver, "_devices", {})
    monkeypatch.setattr(driver, "_drv", lambda: (_ for _ in ()).throw(OSError("no libcuda")))
    with pytest.raises(ne.NoDeviceError, match="arch='sm_90'"):
        make_key("gelu", dtype="fp8")
    with pytest.raises(ne.NoDeviceError, match="arch="):
        ne.get_kernel("gelu", dtype="fp8")
    with pytest.raises(ne.NoDeviceError, match="^no arch given, and no GPU 0 to take it from"):
        ne.get_kernel("gelu", dtype="fp8", device=0)


@pytest.mark.parametrize("device", ["banana", -1, 3.5, [0], "cuda:0", True])
def test_bad_device_is_a_variant_error_with_or_without_arch(device):
    """``device`` is checked whether or not ``arch`` makes it unnecessary, and before the
    driver is asked for a GPU (no GPU here)."""
    for arch in ("sm_90", None):
        for call in (make_key, ne.get_kernel):
            with pytest.raises(ne.VariantError, match="^device=.* CUDA device ordinal") as info:
                call("gelu", dtype="fp8", arch=arch, device=device)
            assert info.value.field == "device"
    assert make_key("gelu", dtype="fp8", arch="sm_90", device=0).arch == "sm_90"
    assert make_key("gelu", dtype="fp8", arch="sm_90", device=np.int64(1)).arch == "sm_90"


def test_key_is_frozen_hashable_picklable():
    k = key()
    with pytest.raises(AttributeError):
        k.op = "x"  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(k)) == k
    assert {k: 1}[key()] == 1
    assert k.to_dict()["hidden_size"] == 4096


def test_errors_pickle_round_trip():
    err = VariantError("arch", "sm_70", ["sm_80"])
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is VariantError and again.field == "arch" and str(again) == str(err)
    with pytest.raises(VariantError) as info:
        key(arch="sm_5")  # a message of its own (detail=...)
    again = pickle.loads(pickle.dumps(info.value))
    assert str(again) == str(info.value) and again.detail == info.value.detail


def test_unknown_keyword_is_named_with_a_suggestion():
    with pytest.raises(VariantError, match="did you mean hidden_size") as info:
        make_key("gelu", dtype="bf16", hidden=4096, arch="sm_90")
    assert info.value.field == "hidden"
    with pytest.raises(VariantError) as info:
        make_key("gelu", out_dtype="int8", arch="sm_90")
    assert info.value.field == "out_dtype"
    assert make_key("gelu", dtype="bf16", arch="90").arch == "sm_90"  # a command-line string


def test_hidden_size_takes_numpy_integers_and_no_bools_or_floats():
    # a shape entry from numpy is an int as far as the key goes: the same key, stored as int
    import numpy as np

    key = make_key("gelu", dtype="bf16", hidden_size=np.int64(4096), arch="sm_90")
    assert key == make_key("gelu", dtype="bf16", hidden_size=4096, arch="sm_90")
    assert type(key.hidden_size) is int and str(key).endswith("_h4096_sm90")
    for bad in (True, np.float32(4096), 4096.0, "4096", np.int32(0), np.int64(1 << 21)):
        with pytest.raises(VariantError) as info:
            make_key("gelu", dtype="bf16", hidden_size=bad, arch="sm_90")
        assert info.value.field == "hidden_size"
        # the wrong type is also a TypeError; an int out of range is only a ValueError
        wrong_type = not isinstance(bad, (int, np.integer)) or isinstance(bad, bool)
        assert isinstance(info.value, TypeError) is wrong_type
        assert isinstance(info.value, ne.VariantTypeError) is wrong_type


@pytest.mark.parametrize(
    ("fields", "field"),
    [({"zero_centered_gamma": 1}, "zero_centered_gamma"), ({"scaling": 3}, "scaling"),
     ({"layout": None}, "layout"), ({"arch": 9.0}, "arch"), ({"arch": ("sm_90",)}, "arch"),
     ({"hidden_size": "4096"}, "hidden_size")],
)  # fmt: skip
def test_a_key_field_of_the_wrong_type_is_a_variant_type_error(fields, field):
    """A field of the wrong type raises VariantTypeError: caught as VariantError (ValueError)
    and as TypeError, naming the field, and surviving pickling."""
    args = {"in_dtype": "bf16", "out_dtype": "fp8", "scaling": "tensor", "arch": "sm_90",
            **fields}  # fmt: skip
    with pytest.raises(TypeError) as info:
        make_key("layernorm_fwd", **args)
    err = info.value
    assert isinstance(err, ne.VariantTypeError) and isinstance(err, VariantError)
    assert isinstance(err, ValueError) and err.field == field
    assert str(err).startswith(f"{field}={fields[field]!r} ")
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is ne.VariantTypeError and str(again) == str(err)


def test_an_op_dtype_or_device_of_the_wrong_type_is_a_variant_type_error():
    """The other arguments of make_key and get_kernel: an op that is not a string, a number
    as a dtype (restated with the caller's argument name), a device that is not an int; a
    negative device is a VariantError only."""
    cases = [((5,), {}, "op"), (("gelu",), {"dtype": 16}, "dtype"),
             (("gelu",), {"in_dtype": True}, "in_dtype"),
             (("gelu",), {"dtype": "bf16", "device": "0"}, "device")]  # fmt: skip
    for call in (make_key, ne.get_kernel):
        for args, fields, field in cases:
            with pytest.raises(ne.VariantTypeError) as info:
                call(*args, arch="sm_90", **fields)
            assert isinstance(info.value, TypeError) and info.value.field == field
        with pytest.raises(VariantError) as info:
            call("gelu", dtype="bf16", arch="sm_90", device=-1)
        assert not isinstance(info.value, TypeError)


def test_a_flags_short_form_as_a_keyword_names_the_flag():
    with pytest.raises(VariantError) as info:
        make_key("layernorm_fwd", in_dtype="bf16", zcg=True, arch="sm_90")
    assert info.value.field == "zcg"
    assert "did you mean zero_centered_gamma? (zcg is its short form" in str(info.value)


def test_dtype_errors_name_the_argument_and_the_spelling_given():
    # dtype= names the output: an error about it says dtype, the caller's spelling first
    with pytest.raises(VariantError) as info:
        make_key("layernorm_fwd", dtype="fp4", arch="sm_90")
    assert info.value.field == "dtype" and info.value.value == "'fp4'"
    assert str(info.value).startswith("dtype='fp4' (fp4_e2m1) is not allowed (z of ")
    assert info.value.allowed == "bf16, fp8_e4m3, fp8_e5m2"
    with pytest.raises(VariantError) as info:
        make_key("layernorm_bwd", in_dtype="bf16", dtype="half", arch="sm_90")
    assert info.value.field == "dtype" and "'half' (fp16)" in str(info.value)
    assert info.value.allowed == "bf16"
    # an in_dtype spelled by an alias: the alias first, the canonical name after it
    with pytest.raises(VariantError) as info:
        make_key("gelu", in_dtype="e4m3", arch="sm_90")
    assert str(info.value).startswith("in_dtype='e4m3' (fp8_e4m3) is not allowed (for op 'gelu')")
    # the canonical spelling is not repeated
    with pytest.raises(VariantError) as info:
        make_key("gelu", out_dtype="fp4_e2m1", arch="sm_90")
    assert str(info.value).startswith("out_dtype='fp4_e2m1' is not allowed (for op 'gelu')")
    # with no GPU, the same error comes before the missing device
    with pytest.raises(VariantError) as info:
        make_key("layernorm_fwd", dtype="fp4")
    assert info.value.field == "dtype"


@pytest.mark.parametrize(
    ("op", "fields", "field", "allowed"),
    [("layernorm_fwd", {"in_dtype": "bf17"}, "in_dtype", "fp32, fp16, bf16"),
     ("gelu", {"dtype": "fp9"}, "dtype", "fp32, fp16, bf16, fp8_e4m3, fp8_e5m2"),
     ("rmsnorm_bwd", {"in_dtype": "int8"}, "in_dtype", "fp32, fp16, bf16")],
)  # fmt: skip
def test_a_name_that_is_no_dtype_lists_the_ops_own_dtypes(op, fields, field, allowed):
    with pytest.raises(VariantError) as info:
        make_key(op, arch="sm_90", **fields)
    assert info.value.field == field and info.value.allowed == allowed
    assert f"for op {op!r}" in str(info.value) and "aliases" not in str(info.value)
    assert ("did you mean" in str(info.value)) == (fields.get(field) != "int8")


def test_unknown_op_names_the_closest_one():
    with pytest.raises(VariantError, match="did you mean layernorm_fwd") as info:
        make_key("layernorm_fw", arch="sm_90")
    assert info.value.field == "op"
    with pytest.raises(VariantError) as far:
        make_key("zzzzzz", arch="sm_90")
    assert "did you mean" not in str(far.value)


def test_op_names_are_matched_in_any_case_and_stored_lower_case(isolated_cache):
    upper = make_key("GELU", dtype="fp8", arch="sm_90")
    assert upper == make_key("gelu", dtype="fp8", arch="sm_90") and upper.op == "gelu"
    assert str(upper) == "gelu_bf16_e4m3_tensor_rowwise_hany_sm90"
    assert key(op=" RMSNorm_Fwd ", out_dtype="bf16", scaling="none").op == "rmsnorm_fwd"
    # one kernel and one cache entry, whichever spelling compiled it
    kernel = ne.get_kernel("Gelu", dtype="bf16", arch="sm_90")
    assert kernel is ne.get_kernel("gelu", dtype="bf16", arch="sm_90")
    assert kernel.name == "gelu_bf16_bf16_none_rowwise_hany_sm90"
    assert ne.cache_info().compiles == 1
    # a misspelling in upper case is matched lower-case for the suggestion
    with pytest.raises(VariantError, match=r"did you mean glu or gelu\?") as info:
        make_key("GLEU", arch="sm_90")
    assert info.value.value == "'GLEU'"


def test_misspelled_scaling_and_layout_name_the_closest_one():
    with pytest.raises(VariantError, match=r"\(did you mean mxfp8\?\)") as info:
        make_key("gelu", dtype="fp8", scaling="mxpf8", arch="sm_100a")
    assert info.value.field == "scaling"
    with pytest.raises(VariantError, match=r"\(did you mean columnwise\?\)"):
        make_key("gelu", dtype="fp8", layout="colwise", arch="sm_90")


@pytest.mark.parametrize("arch", ["sm_900", "sm_130", "sm_999", 130, "sm_130a"])
def test_a_named_arch_must_be_known(arch, tmp_path):
    """An arch a caller names that is newer than every known arch (``sm_900``, a typo of
    sm_90) is a VariantError listing the known archs, from make_key, get_kernel, prewarm's
    ``arch=`` and a kernel name in a variant list; nothing is compiled."""
    from nvrtc_engine.tools.prewarm import prewarm

    calls = [
        lambda: make_key("gelu", dtype="fp8", arch=arch),
        lambda: ne.get_kernel("gelu", dtype="fp8", arch=arch),
        lambda: prewarm([{"op": "gelu", "dtype": "bf16"}], arch=arch, progress=False),
    ]
    for call in calls:
        with pytest.raises(VariantError, match="newer than every arch this library knows") as err:
            call()
        assert err.value.field == "arch" and KNOWN in str(err.value)
    name = f"gelu_bf16_bf16_none_rowwise_hany_sm{str(arch).removeprefix('sm_')}"
    with pytest.raises(ne.VariantListError, match="newer than every arch"):
        prewarm([name], progress=False)
    assert ne.cache_info().compiles == 0


def test_a_key_with_an_unknown_arch_needs_that_gpu(monkeypatch):
    """A key holds any newer arch (``KernelKey.parse``, ``key._replace(arch=...)``), but
    get_kernel and prewarm make its PTX only where a GPU here has that arch: without one it is
    the VariantError a named arch gets, and nothing is compiled."""
    from nvrtc_engine.core import make
    from nvrtc_engine.core.key import DeviceArch
    from nvrtc_engine.tools.prewarm import prewarm

    key = make_key("gelu", dtype="bf16", arch="sm_90")._replace(arch="sm_900")
    assert KernelKey.parse(str(key)) == key
    with pytest.raises(VariantError, match="newer than every arch") as err:
        ne.get_kernel(key)
    assert err.value.field == "arch"
    with pytest.raises(ne.VariantListError, match="newer than every arch"):
        prewarm([key], progress=False)
    assert ne.cache_info().compiles == 0
    from nvrtc_engine.tools.variants import resolve_variants

    assert resolve_variants([key], arch="sm_90") == [key._replace(arch="sm_90")]  # replaced
    monkeypatch.setattr(make, "device_arch", lambda device: DeviceArch("sm_900"))
    assert ne.get_kernel(key).artifact.kind == "ptx"


def test_only_a_device_newer_than_every_known_arch_gets_ptx(monkeypatch):
    """With arch left out, a GPU newer than every known arch (here sm_130) gets a key for
    its own arch and a PTX kernel for the newest arch NVRTC supports; the same arch named
    by the caller is refused."""
    from nvrtc_engine.core import make, nvrtc
    from nvrtc_engine.core.key import DeviceArch

    monkeypatch.setattr(make, "device_arch", lambda device: DeviceArch("sm_130"))
    key = make_key("gelu", dtype="bf16")
    assert key.arch == "sm_130" and type(key.arch) is str  # the key holds a plain str
    assert KernelKey.parse(str(key)) == key  # its name reads back (cache listings, bundles)
    kernel = ne.get_kernel("gelu", dtype="bf16")
    newest = max(nvrtc.supported_archs())
    assert kernel.artifact.kind == "ptx" and kernel.artifact.options[0] == f"-arch=compute_{newest}"
    with pytest.raises(VariantError, match="newer than every arch"):
        make_key("gelu", dtype="bf16", arch="sm_130")
    # a known arch named by the caller is always a cubin
    assert ne.get_kernel("gelu", dtype="bf16", arch="sm_121").artifact.kind == "cubin"


def test_get_kernel_reports_a_bad_field_before_asking_for_a_device(monkeypatch):
    """Without a GPU and without arch, a misspelled op or dtype, or any other bad field, is
    reported as such (a VariantError, with a suggestion where one is close), not hidden behind
    NoDeviceError nor chained to it (no second traceback); a good call still raises
    NoDeviceError with its hint."""
    import nvrtc_engine as ne
    from nvrtc_engine.core import make

    def no_device(device):
        raise ne.NoDeviceError("no CUDA device; pass arch='sm_90' (or another arch)")

    monkeypatch.setattr(make, "device_arch", no_device)
    with pytest.raises(ne.VariantError, match="did you mean gelu") as raised:
        ne.get_kernel("gelo", dtype="bf16")
    assert raised.value.__context__ is None and raised.value.__cause__ is None
    with pytest.raises(ne.VariantError, match="not a key field") as raised:
        make_key("gelu", dtype="bf16", hiden_size=4096)
    assert raised.value.__context__ is None
    with pytest.raises(ne.VariantError, match="did you mean bf16"):
        ne.get_kernel("gelu", dtype="bf61")
    # fields checked by the key itself: hidden size, scaling, the norm backward's dx dtype
    with pytest.raises(ne.VariantError, match="hidden_size=0"):
        ne.get_kernel("gelu", dtype="bf16", hidden_size=0)
    with pytest.raises(ne.VariantError, match="scaling='mxfp8'"):
        ne.get_kernel("gelu", dtype="bf16", scaling="mxfp8")
    with pytest.raises(ne.VariantError, match="dx of layernorm_bwd"):
        make_key("layernorm_bwd", in_dtype="bf16", out_dtype="fp8")
    with pytest.raises(ne.NoDeviceError, match="arch='sm_90'"):
        ne.get_kernel("gelu", dtype="bf16")


def test_scaling_and_layout_are_matched_in_any_case_and_stored_lower_case():
    upper = make_key("gelu", dtype="fp8", scaling="MXFP8", layout="ROWWISE", arch="sm_100a")
    lower = make_key("gelu", dtype="fp8", scaling="mxfp8", layout="rowwise", arch="sm_100a")
    assert upper == lower and (upper.scaling, upper.layout) == ("mxfp8", "rowwise")
    assert str(upper) == str(lower)
    assert key(scaling=" Tensor ", layout="RowWise") == key()
    # a misspelling in upper case is matched lower-case for the suggestion, and the error
    # shows what was given
    with pytest.raises(VariantError, match=r"\(did you mean rowwise\?\)") as info:
        make_key("gelu", dtype="fp8", layout="ROWWIZE", arch="sm_90")
    assert info.value.field == "layout" and info.value.value == "'ROWWIZE'"
    with pytest.raises(VariantError, match=r"\(did you mean mxfp8\?\)") as info:
        make_key("gelu", dtype="fp8", scaling="MXPF8", arch="sm_100a")
    assert info.value.field == "scaling"
    with pytest.raises(VariantError, match="scaling=None is not allowed"):
        key(scaling=None)


def test_documented_arch_and_name_spellings():
    # docs/usage.md: any case, surrounding spaces, the bare number, no underscore
    from nvrtc_engine.core.key import parse_arch

    for spelling in ("sm_90", "SM_90", " sm_90 ", "90", 90, "sm90"):
        assert parse_arch(spelling) == "sm_90"
    assert parse_arch("sm90a") == parse_arch("SM_90A") == "sm_90a"
    assert str(make_key(" Gelu ", dtype="bf16", arch="sm_90")) == str(
        make_key("gelu", dtype="bf16", arch="sm_90")
    )


MEMO_CASES = [
    ("gelu", {"dtype": "bf16", "arch": "sm_90"}, "hidden_size", 4096, 4096.0),
    ("gelu", {"dtype": "bf16", "arch": "sm_90"}, "hidden_size", 1, True),
    ("gelu", {"dtype": "bf16"}, "arch", 90, 90.0),
    ("gelu", {"dtype": "bf16"}, "arch", 90, np.float32(90)),
    ("layernorm_fwd", {"in_dtype": "bf16", "hidden_size": 1024, "arch": "sm_90"},
     "zero_centered_gamma", True, 1),
    ("gelu", {"dtype": "bf16", "arch": "sm_90"}, "device", 0, False),
]  # fmt: skip


@pytest.mark.parametrize(
    ("op", "fields", "field", "good", "bad"), MEMO_CASES, ids=lambda v: repr(v)[:20]
)
def test_get_kernels_memo_tells_equal_values_of_other_types_apart(op, fields, field, good, bad):
    """4096.0 == 4096 and True == 1, but only the int is a hidden size (the bool a flag):
    get_kernel's call memo must not answer the bad value with the kernel the good one got, so
    a call raises the same VariantTypeError whether or not the good call came first."""
    with pytest.raises(ne.VariantTypeError) as first:
        ne.get_kernel(op, **fields, **{field: bad})
    kernel = ne.get_kernel(op, **fields, **{field: good})
    assert ne.get_kernel(op, **fields, **{field: good}) is kernel  # the memo still answers
    with pytest.raises(ne.VariantTypeError) as after:
        ne.get_kernel(op, **fields, **{field: bad})
    assert str(after.value) == str(first.value) and after.value.field == field


def test_get_kernels_memo_without_arch_tells_types_apart_too(monkeypatch):
    """The memo of calls without arch (keyed on the device's arch too) types its values."""
    from nvrtc_engine.core import make

    monkeypatch.setattr(make, "device_arch", lambda device: "sm_90")
    kernel = ne.get_kernel("gelu", dtype="bf16", hidden_size=4096)
    assert kernel.key.arch == "sm_90"
    assert ne.get_kernel("gelu", dtype="bf16", hidden_size=4096) is kernel
    with pytest.raises(ne.VariantTypeError, match=r"hidden_size=4096\.0 "):
        ne.get_kernel("gelu", dtype="bf16", hidden_size=4096.0)


@pytest.mark.parametrize(
    "bad",
    [{}, [], object(), b"bf16", ("bf16",)],
    ids=lambda v: type(v).__name__ if type(v) is object else repr(v),
)
@pytest.mark.parametrize("argument", ["dtype", "in_dtype", "out_dtype"])
def test_a_dtype_that_is_no_name_nor_dtype_object_is_a_variant_type_error(argument, bad):
    """A dict, list, bytes or plain object as a dtype is a value of the wrong type, as a
    number is: VariantTypeError naming the argument as given (docs/usage.md)."""
    for call in (make_key, ne.get_kernel):
        with pytest.raises(ne.VariantTypeError) as info:
            call("gelu", arch="sm_90", **{argument: bad})
        assert isinstance(info.value, TypeError) and isinstance(info.value, ValueError)
        assert info.value.field == argument
        assert f"{type(bad).__name__} is not a dtype" in str(info.value)
    # dtype objects stay accepted, and a real dtype the kernels do not take is a value error
    assert make_key("gelu", dtype=np.dtype("float16"), arch="sm_90").out_dtype == "fp16"
    with pytest.raises(VariantError) as info:
        make_key("gelu", dtype=np.float64, arch="sm_90")
    assert not isinstance(info.value, TypeError)


def test_a_flag_given_false_is_the_key_without_it():
    """False is a flag's default: the key equals, hashes, names and digests as the same key
    without the flag (one kernel in memory and on disk, not two), and parses back equal."""
    plain = make_key("layernorm_fwd", dtype="bf16", hidden_size=4096, arch="sm_90")
    off = make_key("layernorm_fwd", dtype="bf16", hidden_size=4096, arch="sm_90",
                   zero_centered_gamma=False)  # fmt: skip
    on = make_key("layernorm_fwd", dtype="bf16", hidden_size=4096, arch="sm_90",
                  zero_centered_gamma=True)  # fmt: skip
    assert off == plain and hash(off) == hash(plain) and off.flags == ()
    assert off.to_dict() == plain.to_dict() and KernelKey.parse(str(off)) == off
    assert on != plain and on.flags == (("zero_centered_gamma", True),)
    assert ne.get_kernel(off) is ne.get_kernel(plain)


def test_a_flag_given_as_a_keyword_and_in_flags_must_agree():
    """make_key(flags={...}, flag=...) with two values for one flag is an error naming it,
    not a silent choice of the keyword; the same value twice is one flag."""
    base = dict(dtype="bf16", arch="sm_90")
    for table, keyword in ((False, True), (True, False), (True, 1)):
        with pytest.raises(ne.ArgumentTypeError, match="zero_centered_gamma: given as"):
            make_key("layernorm_fwd", **base, flags={"zero_centered_gamma": table},
                     zero_centered_gamma=keyword)  # fmt: skip
    both = make_key("layernorm_fwd", **base, flags={"zero_centered_gamma": True},
                    zero_centered_gamma=True)  # fmt: skip
    assert both.flag("zero_centered_gamma")


def test_replace_and_flags_errors_name_the_key():
    """``key._replace`` with an unknown field names KernelKey and its fields; ``flags`` that
    are not (name, value) pairs are a VariantTypeError naming ``flags``."""
    key = make_key("gelu", dtype="fp8", arch="sm_90")
    with pytest.raises(TypeError, match=r"KernelKey\._replace: unknown field\(s\) \['bogus'\]"):
        key._replace(bogus=1)
    with pytest.raises(ne.VariantTypeError, match="not pairs") as err:
        KernelKey(*key[:7], "x")
    assert err.value.field == "flags"
