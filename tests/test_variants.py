"""Variant lists: TOML/JSON files, cross products, defaults, flags, arch override, errors that
name the entry, and the example model lists in docs/examples."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nvrtc_engine import KernelKey, VariantError, make_key
from nvrtc_engine.core.registry import registered_ops
from nvrtc_engine.tools.variants import (
    VariantListError,
    expand_entry,
    load_variants,
    read_entries,
    resolve_variants,
)

EXAMPLES = sorted((Path(__file__).resolve().parent.parent / "docs" / "examples").glob("*.toml"))

TOML = """
description = "test"
[defaults]
arch = ["sm_90", "sm_100a"]
in_dtype = "bf16"

[[variants]]
op = "gelu"
out_dtype = ["bf16", "fp8_e4m3"]
hidden_size = [4096, "any"]

[[variants]]
op = "gelu"
in_dtype = "fp16"
out_dtype = "fp16"
arch = "sm_89"
"""


def test_toml_cross_product_with_defaults(tmp_path):
    path = tmp_path / "v.toml"
    path.write_text(TOML)
    keys = load_variants(path)
    assert len(keys) == 2 * 2 * 2 + 1
    assert keys[0] == make_key("gelu", in_dtype="bf16", out_dtype="bf16", hidden_size=4096,
                               arch="sm_90")  # fmt: skip
    names = {str(k) for k in keys}
    assert "gelu_bf16_e4m3_tensor_rowwise_hany_sm100a" in names  # scaling defaults to tensor
    assert "gelu_fp16_fp16_none_rowwise_hany_sm89" in names
    assert len(names) == len(keys)


def test_json_object_and_bare_list_are_the_same(tmp_path):
    entries = [{"op": "gelu", "dtype": ["bf16", "fp8"], "arch": "sm_90", "hidden_size": None}]
    a = tmp_path / "a.json"
    a.write_text(json.dumps({"variants": entries}))
    b = tmp_path / "b.json"
    b.write_text(json.dumps(entries))
    assert load_variants(a) == load_variants(b)
    assert [str(k) for k in load_variants(a)] == [
        "gelu_bf16_bf16_none_rowwise_hany_sm90",
        "gelu_bf16_e4m3_tensor_rowwise_hany_sm90",
    ]


def test_list_of_keys_dicts_and_names_deduplicated():
    key = make_key("gelu", dtype="fp8", arch="sm_90")
    keys = resolve_variants([key, str(key), {"op": "gelu", "dtype": "fp8", "arch": "sm_90"},
                             {"op": "gelu", "dtype": "bf16", "arch": 90}])  # fmt: skip
    assert keys == [key, make_key("gelu", dtype="bf16", arch="sm_90")]


@pytest.mark.parametrize("suffix", [".toml", ".json"])
def test_a_byte_order_mark_is_no_content(tmp_path, suffix):
    """A file saved with a UTF-8 byte-order mark (some Windows editors) reads as without."""
    text = TOML if suffix == ".toml" else json.dumps([{"op": "gelu", "arch": "sm_90"}])
    plain, marked = tmp_path / f"plain{suffix}", tmp_path / f"marked{suffix}"
    plain.write_text(text, encoding="utf-8")
    marked.write_text(text, encoding="utf-8-sig")
    assert marked.read_bytes().startswith(b"\xef\xbb\xbf")
    assert load_variants(marked) == load_variants(plain) != []


def test_a_list_may_hold_variant_files(tmp_path):
    """Paths (os.PathLike) in a list are variant files, read in their place; a str in a
    list stays a kernel name. Errors name the file and its entry."""
    a, b = tmp_path / "a.toml", tmp_path / "b.json"
    a.write_text(TOML)
    b.write_text(json.dumps([{"op": "silu", "dtype": "bf16", "arch": "sm_90"}]))
    key = make_key("gelu", dtype="fp8", arch="sm_80")
    keys = resolve_variants([key, a, str(key), b])
    assert keys == [key, *load_variants(a), *load_variants(b)]
    b.write_text(json.dumps([{"op": "silu", "dtype": "bf61", "arch": "sm_90"}]))
    with pytest.raises(VariantListError, match=f"^{b}, entry 0: "):
        resolve_variants([a, b])
    with pytest.raises(VariantListError, match=r"a str in a list is a kernel name: pass "
                       r"pathlib.Path\("):  # fmt: skip
        resolve_variants([str(a)])


def test_arch_argument_replaces_the_variants_arch(tmp_path):
    path = tmp_path / "v.toml"
    path.write_text(TOML)
    keys = load_variants(path, arch=["sm_80", "sm_90a"])
    assert {k.arch for k in keys} == {"sm_80", "sm_90a"}
    assert len(keys) == 2 * (2 * 2 + 1)
    key = make_key("gelu", dtype="bf16", arch="sm_90")
    assert resolve_variants([key], arch="sm_100a") == [
        make_key("gelu", dtype="bf16", arch="sm_100a")
    ]


def test_a_bad_arch_argument_is_the_arguments_fault_not_an_entrys(tmp_path):
    path = tmp_path / "v.toml"
    path.write_text(TOML)
    for bad in ("sm_95", ["sm_90", "sm_75"]):
        with pytest.raises(VariantError) as info:
            load_variants(path, arch=bad)
        assert not isinstance(info.value, VariantListError)  # no "v.toml, entry 0: ..."
        assert info.value.field == "arch" and "entry" not in str(info.value)
        assert info.value.hint.startswith(("names no GPU", "older than Ampere"))
    key = make_key("gelu", dtype="bf16", arch="sm_90")
    with pytest.raises(VariantError, match="arch='sm_95'"):
        resolve_variants([key], arch="sm_95")


def test_default_arch_is_asked_once_and_only_when_needed():
    calls = []

    def current() -> str:
        calls.append(1)
        return "sm_89"

    keys = resolve_variants([{"op": "gelu", "dtype": ["bf16", "fp16"]}], default_arch=current)
    assert [k.arch for k in keys] == ["sm_89", "sm_89"] and len(calls) == 1
    resolve_variants([{"op": "gelu", "arch": "sm_90"}], default_arch=current)
    assert len(calls) == 1


def test_toml_suffix_in_any_case(tmp_path):
    """``model.TOML`` is TOML, as the command line takes it (not JSON)."""
    path = tmp_path / "model.TOML"
    path.write_text("[[variants]]\nop = 'gelu'\ndtype = 'fp8'\narch = 'sm_90'\n")
    assert [k.op for k in load_variants(path)] == ["gelu"]


@pytest.mark.parametrize(
    ("text", "suffix", "match"),
    [
        ("[[variants]]\nop = 'gelu'\narch = 'sm_70'\n", ".toml",
         r"entry 0: op='gelu', arch='sm_70'"),
        ("[[variants]]\nop = 'gelu'\narch='sm_90'\n[[variants]]\nop = 'nope'\n", ".toml",
         r"entry 1: .*op='nope' is not allowed"),
        ("[[variants]]\narch = 'sm_90'\n", ".toml", "entry 0: missing 'op'"),
        ("[[variants]]\nop = 'gelu'\narch = 'sm_90'\nwobble = true\n", ".toml",
         "entry 0: .*wobble=True is not allowed.*not a key field or a flag"),
        ("[[variants]]\nop = 'gelu\n", ".toml", "not valid TOML"),
        ("{\"variants\": []}", ".json", "non-empty list"),
        ("{\"variant\": [{\"op\": \"gelu\"}]}", ".json",
         r"unknown top-level .*\(did you mean variants\?\)$"),
        ("[1, 2]", ".json", "entry 0: expected a table/object or a kernel name, got 1"),
        ('["gelu_bf16"]', ".json", "entry 0: .*canonical kernel name"),
        ("{", ".json", r"not valid JSON \(a TOML file needs \.toml\)"),
        ("[[variants]]\nop = 'gelu'\n", ".py", r"not valid JSON \(a TOML file needs \.toml\)"),
    ],
)  # fmt: skip
def test_bad_files_name_the_file_and_entry(tmp_path, text, suffix, match):
    path = tmp_path / f"bad{suffix}"
    path.write_text(text)
    with pytest.raises(VariantListError, match=match) as info:
        load_variants(path)
    assert str(path) in str(info.value)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("suffix", [".json", ".toml"])
def test_a_file_entry_may_be_a_kernel_name_as_in_a_list(tmp_path, suffix):
    """A kernel name fixes every field: the file's defaults do not apply to it; arch=
    replaces its arch, as for a name in a Python list."""
    name = "gelu_bf16_bf16_none_rowwise_h4096_sm90"
    path = tmp_path / f"v{suffix}"
    if suffix == ".json":
        path.write_text(
            json.dumps(
                {
                    "defaults": {"arch": "sm_100a"},
                    "variants": [name, {"op": "silu", "dtype": "bf16"}],
                }
            )
        )
    else:
        path.write_text(
            "defaults = { arch = 'sm_100a' }\n"
            f"variants = ['{name}', {{ op = 'silu', dtype = 'bf16' }}]\n"
        )
    keys = load_variants(path)
    assert keys[0] == KernelKey.parse(name) == resolve_variants([name])[0]
    assert [(k.op, k.arch) for k in keys] == [("gelu", "sm_90"), ("silu", "sm_100a")]
    assert [k.arch for k in load_variants(path, arch="sm_89")] == ["sm_89", "sm_89"]


def test_missing_file_and_bad_list_items(tmp_path):
    with pytest.raises(VariantListError, match="cannot read"):
        load_variants(tmp_path / "missing.toml")
    with pytest.raises(VariantListError, match="<list>, entry 1"):
        resolve_variants([make_key("gelu", dtype="bf16", arch="sm_90"), 42])
    with pytest.raises(VariantListError, match="canonical kernel name"):
        resolve_variants(["not_a_kernel"])


def test_variant_error_is_chained():
    with pytest.raises(VariantListError) as info:
        expand_entry({"op": "gelu", "dtype": "int8", "arch": "sm_90"})
    assert isinstance(info.value.__cause__, VariantError)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_model_lists_expand_for_every_registered_op(path):
    """Every entry whose op is registered on this branch must be a valid variant."""
    entries = read_entries(path)
    assert len(entries) >= 5
    for i, entry in enumerate(entries):
        if entry["op"] in registered_ops():
            keys = expand_entry(entry, source=str(path), index=i)
            assert keys and all(isinstance(k, KernelKey) for k in keys)


@pytest.mark.parametrize("suffix", [".toml", ".json"])
def test_a_file_that_is_not_utf8_names_the_file(tmp_path, suffix):
    path = tmp_path / f"b{suffix}"
    path.write_bytes(b"\xff\xfe[[variants]]\nop = 'gelu'\n")
    with pytest.raises(VariantListError, match="not UTF-8 text") as info:
        load_variants(path)
    assert str(info.value).startswith(f"{path}: ") and info.value.entry is None


@pytest.mark.parametrize(
    ("text", "field"),
    [("[[variants]]\nop = 'gelu'\narch = 'sm_90'\nhidden_size = []\n", "hidden_size"),
     ("[defaults]\narch = []\n[[variants]]\nop = 'gelu'\n", "arch"),
     ("[[variants]]\nop = 'layernorm_fwd'\narch = 'sm_90'\nflags = { zero_centered_gamma = [] }\n",
      "zero_centered_gamma")],
)  # fmt: skip
def test_an_empty_list_in_a_field_is_an_error_naming_entry_and_field(tmp_path, text, field):
    """An empty list expands to no variant at all: most likely a mistake, not success."""
    path = tmp_path / "v.toml"
    path.write_text(text)
    with pytest.raises(VariantListError, match=rf"entry 0: {field}=\[\] is an empty list"):
        load_variants(path)
    with pytest.raises(VariantListError, match=r"<list>, entry 1: hidden_size=\[\] is an empty"):
        resolve_variants([{"op": "gelu", "arch": "sm_90"}, {"op": "gelu", "hidden_size": []}])


@pytest.mark.parametrize(
    ("variants", "says"),
    [(None, "got NoneType None"), (3, "got int 3"), (b"v.json", "os.fsdecode"),
     ({"op": "gelu", "arch": "sm_90"}, "got an entry dict: wrap a single variant in a list"),
     (make_key("gelu", dtype="bf16", arch="sm_90"), "got a KernelKey: wrap")],
    ids=["None", "int", "bytes", "dict", "key"],
)  # fmt: skip
def test_variants_that_are_neither_a_path_nor_a_list_are_a_type_error(variants, says):
    from nvrtc_engine import ArgumentTypeError

    with pytest.raises(ArgumentTypeError, match="variants: expected a variant file path") as info:
        resolve_variants(variants)
    assert says in str(info.value) and isinstance(info.value, TypeError)
    assert info.value.argument == "variants"


def test_an_arch_argument_of_the_wrong_type_or_empty_is_the_library_error():
    """arch=90.0 is the VariantTypeError get_kernel gives for it, not "'float' object is not
    iterable"; arch=[] is a VariantError (a ValueError), not a plain one."""
    import numpy as np

    from nvrtc_engine import VariantTypeError, get_kernel

    entry = [{"op": "gelu", "arch": "sm_90"}]
    for bad in (90.0, np.float32(90), b"sm_90", True):
        with pytest.raises(VariantTypeError) as info:
            resolve_variants(entry, arch=bad)
        with pytest.raises(VariantTypeError) as direct:
            get_kernel("gelu", arch=bad)
        assert str(info.value) == str(direct.value) and info.value.field == "arch"
    with pytest.raises(VariantError, match=r"arch=\[\] is empty: give at least one arch") as e:
        resolve_variants(entry, arch=[])
    assert not isinstance(e.value, TypeError) and isinstance(e.value, ValueError)
    assert [k.arch for k in resolve_variants(entry, arch=np.int64(89))] == ["sm_89"]


@pytest.mark.parametrize("flags_first", [True, False])
def test_a_flag_given_both_ways_must_agree(flags_first):
    """A flag in the flags table and as a field of its own: the same value is one flag; two
    values are an error naming the entry and the flag (not the table's value, silently)."""
    table = {"flags": {"zero_centered_gamma": False}}
    field = {"zero_centered_gamma": True}
    base = {"op": "layernorm_fwd", "dtype": "bf16", "arch": "sm_90"}
    entry = {**base, **table, **field} if flags_first else {**base, **field, **table}
    says = r"^<list>, entry 2: flag 'zero_centered_gamma' is given both in 'flags' \(False\) and"
    with pytest.raises(VariantListError, match=says + r" as a field \(True\)") as info:
        resolve_variants([base, base, entry])
    assert info.value.entry == 2
    for value in (True, [True, False]):
        same = {**base, "flags": {"zero_centered_gamma": value}, "zero_centered_gamma": value}
        assert expand_entry(same) == expand_entry({**base, "zero_centered_gamma": value})
    one = {**base, "flags": {"zero_centered_gamma": True}, "zero_centered_gamma": 1}
    with pytest.raises(VariantListError, match="given both in 'flags' \\(True\\) and as a"):
        expand_entry(one)  # True and 1 are equal, but 1 is no flag value


@pytest.mark.parametrize("table_in_defaults", [True, False])
def test_an_entry_flag_in_either_form_replaces_the_defaults_flag(tmp_path, table_in_defaults):
    """defaults set a flag one way, an entry the other way: the entry's own value wins (as
    for any field), with no both-ways conflict."""
    if table_in_defaults:
        text = ("[defaults]\narch = 'sm_90'\nflags = { zero_centered_gamma = true }\n"
                "[[variants]]\nop = 'layernorm_fwd'\ndtype = 'bf16'\nzero_centered_gamma = false\n"
                "[[variants]]\nop = 'layernorm_fwd'\ndtype = 'bf16'\n")  # fmt: skip
    else:
        text = ("[defaults]\narch = 'sm_90'\nzero_centered_gamma = true\n"
                "[[variants]]\nop = 'layernorm_fwd'\ndtype = 'bf16'\n"
                "flags = { zero_centered_gamma = false }\n"
                "[[variants]]\nop = 'layernorm_fwd'\ndtype = 'bf16'\n")  # fmt: skip
    path = tmp_path / "v.toml"
    path.write_text(text)
    keys = load_variants(path)
    assert [dict(k.flags).get("zero_centered_gamma", False) for k in keys] == [False, True]


def test_a_json_file_nested_too_deep_names_the_file(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text("[" * 100000 + "]" * 100000)
    with pytest.raises(VariantListError, match="nested too deeply") as info:
        load_variants(path)
    assert str(info.value).startswith(f"{path}: ") and info.value.entry is None


def test_a_toml_file_nested_too_deep_names_the_file(tmp_path):
    path = tmp_path / "deep.toml"
    path.write_text("variants = " + "[" * 100000 + "]" * 100000 + "\n")
    with pytest.raises(VariantListError) as info:
        load_variants(path)
    assert str(info.value).startswith(f"{path}: ") and info.value.entry is None


@pytest.mark.parametrize(
    ("text", "key"),
    [('{"variants": [{"op": "gelu", "arch": "sm_90", "op": "silu"}]}', "op"),
     ('{"variants": [{"op": "gelu"}], "variants": [{"op": "silu"}]}', "variants"),
     ('[{"op": "layernorm_fwd", "flags": {"zero_centered_gamma": true, '
      '"zero_centered_gamma": false}}]', "zero_centered_gamma")],
)  # fmt: skip
def test_a_duplicate_json_key_is_an_error_naming_the_key(tmp_path, text, key):
    """json keeps the last of two equal keys: an error instead, naming the key and file."""
    path = tmp_path / "dup.json"
    path.write_text(text)
    with pytest.raises(VariantListError, match=rf"duplicate key '{key}'") as info:
        load_variants(path)
    assert str(info.value).startswith(f"{path}: ") and "needs .toml" not in str(info.value)


def test_a_duplicate_toml_key_is_refused_by_the_parser(tmp_path):
    """TOML forbids a key twice; tomllib refuses it with the line, which the error keeps."""
    path = tmp_path / "dup.toml"
    path.write_text("[[variants]]\nop = 'gelu'\nop = 'silu'\n")
    with pytest.raises(VariantListError, match=r"not valid TOML: .*line 3") as info:
        load_variants(path)
    assert str(info.value).startswith(f"{path}: ")
