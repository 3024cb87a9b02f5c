"""Variant lists: which kernels a model needs, as keys, dicts or a TOML/JSON file.

A file holds optional ``[defaults]`` and a list of ``[[variants]]`` entries (JSON: an object
with ``"defaults"`` and ``"variants"``, or a bare list of entries). An entry names the fields
of :func:`~nvrtc_engine.make_key`: ``op``, ``dtype`` or ``in_dtype``/``out_dtype``,
``scaling``, ``layout``, ``hidden_size`` (an int, or ``"any"``/``null`` for the general
kernel), ``arch``, and op flags (``flags = {zero_centered_gamma = true}`` or the flag name as
a field). Any field may be a list: the entry stands for the cross product. An entry may
also be a kernel name (``"gelu_bf16_e4m3_tensor_rowwise_h4096_sm90"``), as in a list. See
``docs/variants.md`` for the format and two model configs as examples.

    >>> keys = load_variants("llama3_8b_fp8_mlp.toml", arch="sm_90")
"""

from __future__ import annotations

import itertools
import json
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..core.errors import (
    ArgumentTypeError,
    NvrtcEngineError,
    VariantError,
    VariantListError,
    did_you_mean,
)
from ..core.key import KernelKey, parse_arch

__all__ = [
    "ENTRY_FIELDS",
    "VariantListError",
    "expand_entry",
    "load_variants",
    "read_entries",
    "resolve_variants",
]

# make_key's keyword fields, in the order the cross product varies them (last fastest).
ENTRY_FIELDS: tuple[str, ...] = (
    "op",
    "dtype",
    "in_dtype",
    "out_dtype",
    "scaling",
    "layout",
    "hidden_size",
    "arch",
)
_TOP_LEVEL = {"defaults", "variants", "description", "name"}


class _DuplicateKeyError(ValueError):
    """A JSON object that names a key twice (``json`` would keep the last value)."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads``'s ``object_pairs_hook``: the object as a dict, or
    :class:`_DuplicateKeyError` for a key given twice."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKeyError(key)
            seen.add(key)
    return obj


def _with_defaults(defaults: dict[str, Any], entry: dict[str, Any]) -> dict[str, Any]:
    """``entry`` with the file's ``defaults`` for the fields it does not set itself. A flag
    the entry sets in either form (a field of its own, or in its ``flags`` table) replaces
    the defaults' setting of that flag in either form, as for any other field; a ``flags``
    table of the entry replaces that of the defaults whole."""
    own = set(entry)
    table = entry.get("flags")
    if isinstance(table, dict):
        own.update(table)
    merged = {name: value for name, value in defaults.items() if name not in own}
    table = merged.get("flags")
    if isinstance(table, dict):
        merged["flags"] = {name: value for name, value in table.items() if name not in own}
    merged.update(entry)
    return merged


def _parse_toml(text: str) -> Any:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    return tomllib.loads(text)


def read_entries(path: str | os.PathLike[str]) -> list[dict[str, Any] | str]:
    """The entries of a TOML (``.toml``, any case) or JSON (any other suffix) variant file, with the
    file's ``defaults`` merged into each; lists are not expanded yet. A kernel name entry
    (``str(key)``, which fixes every field) is kept as it is, for :func:`resolve_variants`.

    Raises :class:`VariantListError` naming the file for unreadable or malformed content
    (a file that is not UTF-8 text included).
    """
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8-sig")  # a byte-order mark is no content
    except OSError as exc:
        raise VariantListError(source, None, f"cannot read: {exc}") from None
    except UnicodeDecodeError as exc:
        raise VariantListError(source, None, f"not UTF-8 text: {exc}") from None
    toml = source.lower().endswith(".toml")  # in any case, as the command line tells them apart
    try:
        data = _parse_toml(text) if toml else json.loads(text, object_pairs_hook=_unique_pairs)
    except _DuplicateKeyError as exc:
        reason = f"duplicate key {exc.key!r} in a JSON object (give each key once)"
        raise VariantListError(source, None, reason) from None
    except ValueError as exc:  # tomllib.TOMLDecodeError and JSONDecodeError are ValueErrors
        kind = "TOML" if toml else "JSON (a TOML file needs .toml)"
        raise VariantListError(source, None, f"not valid {kind}: {exc}") from None
    except RecursionError:  # a parser recurses once per level of nesting
        kind = "TOML arrays or tables" if toml else "JSON arrays or objects"
        reason = f"{kind} nested too deeply to read"
        raise VariantListError(source, None, reason) from None
    if isinstance(data, list):
        data = {"variants": data}
    if not isinstance(data, dict):
        raise VariantListError(source, None, "expected a table/object or a list of entries")
    unknown = sorted(set(data) - _TOP_LEVEL)
    if unknown:
        hints = [h for h in (did_you_mean(u, sorted(_TOP_LEVEL)) for u in unknown) if h]
        raise VariantListError(
            source,
            None,
            f"unknown top-level field(s) {unknown}; expected {sorted(_TOP_LEVEL)}"
            + "".join(f" ({h})" for h in hints),
        )
    defaults = data.get("defaults", {})
    entries = data.get("variants", [])
    if not isinstance(defaults, dict):
        raise VariantListError(source, None, "'defaults' must be a table/object")
    if not isinstance(entries, list) or not entries:
        raise VariantListError(source, None, "'variants' must be a non-empty list of entries")
    out: list[dict[str, Any] | str] = []
    for i, entry in enumerate(entries):
        if isinstance(entry, str):
            out.append(entry)
            continue
        if not isinstance(entry, dict):
            raise VariantListError(
                source, i, f"expected a table/object or a kernel name, got {entry!r}"
            )
        out.append(_with_defaults(defaults, entry))
    return out


def _choices(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _hidden(value: Any) -> Any:
    if isinstance(value, str) and value.strip().lower() in ("any", "none"):
        return None
    return value


def expand_entry(
    entry: Mapping[str, Any], *, source: str = "<list>", index: int = 0
) -> list[KernelKey]:
    """The keys one entry stands for: the cross product of its list-valued fields.

    Fields other than :data:`ENTRY_FIELDS` and ``flags`` are op flags; a flag may be given
    both in ``flags`` and as a field of its own when the two values are the same (of the same
    type: ``True`` and ``1`` differ). Raises :class:`VariantListError` naming the entry and
    the combination that failed (the underlying :class:`~nvrtc_engine.VariantError` is
    chained), the flag given both ways with two values, or the field given an empty list
    (which would stand for no variant at all: most likely a mistake).
    """
    from ..core.make import make_key

    fields = dict(entry)
    flags = fields.pop("flags", {})
    if not isinstance(flags, dict):
        raise VariantListError(source, index, f"'flags' must be a table/object, got {flags!r}")
    for name, value in flags.items():
        if name in fields:
            other = fields[name]
            if type(other) is not type(value) or other != value:
                raise VariantListError(
                    source,
                    index,
                    f"flag {name!r} is given both in 'flags' ({value!r}) and as a field "
                    f"({other!r}): give it once, or the same value both ways",
                )
    fields.update(flags)
    if "op" not in fields:
        raise VariantListError(source, index, "missing 'op'")
    names = [n for n in ENTRY_FIELDS if n in fields] + sorted(set(fields) - set(ENTRY_FIELDS))
    for name in names:
        if isinstance(fields[name], (list, tuple)) and not fields[name]:
            raise VariantListError(
                source,
                index,
                f"{name}={fields[name]!r} is an empty list: it stands for no "
                "variant; give at least one value, or leave the field out",
            )
    keys = []
    for combo in itertools.product(*(_choices(fields[n]) for n in names)):
        kwargs = dict(zip(names, combo, strict=True))
        if "hidden_size" in kwargs:
            kwargs["hidden_size"] = _hidden(kwargs["hidden_size"])
        try:
            keys.append(make_key(**kwargs))
        except (ValueError, TypeError, NvrtcEngineError) as exc:
            shown = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
            raise VariantListError(source, index, f"{shown}: {exc}") from exc
    return keys


def _as_arch_list(arch: str | int | Sequence[str | int] | None) -> list[str] | None:
    """The archs of an ``arch=`` argument, checked here: a bad one is the argument's fault,
    not that of the first entry it would be applied to. A value that is not a list of archs
    (``90.0``, ``b"sm_90"``) is checked as one arch, so its error is the
    :class:`~nvrtc_engine.VariantTypeError` that ``get_kernel`` gives for it; an empty list
    is a :class:`~nvrtc_engine.VariantError`."""
    if arch is None:
        return None
    single = isinstance(arch, (str, bytes, Mapping)) or not isinstance(arch, Iterable)
    archs = [arch] if single else list(arch)
    if not archs:
        detail = "is empty: give at least one arch (sm_90, ...), or None"
        raise VariantError("arch", arch, "an arch or a non-empty list of archs", detail=detail)
    return [parse_arch(a) for a in archs]


def _check_variants_type(variants: Any) -> None:
    """Raise :class:`~nvrtc_engine.ArgumentTypeError` (a ``TypeError``) naming
    ``variants`` when it is neither a path nor an iterable of variants: ``None``, a number,
    bytes, a single entry dict or :class:`~nvrtc_engine.KernelKey`."""
    accepted = (
        "a variant file path (str or os.PathLike) or a list of variants (KernelKeys, entry "
        "dicts, kernel names)"
    )
    if isinstance(variants, (bytes, bytearray, memoryview)):
        raise ArgumentTypeError(
            "variants",
            f"expected {accepted}, got {type(variants).__name__} {variants!r} "
            "(a path given as bytes: decode it first, os.fsdecode(path))",
        )
    if isinstance(variants, (Mapping, KernelKey)):
        what = "an entry dict" if isinstance(variants, Mapping) else "a KernelKey"
        raise ArgumentTypeError(
            "variants",
            f"expected {accepted}, got {what}: wrap a single variant in a list, [{variants!r}]",
        )
    try:
        iter(variants)
    except TypeError:
        raise ArgumentTypeError(
            "variants", f"expected {accepted}, got {type(variants).__name__} {variants!r}"
        ) from None


def _unique(keys: Iterable[KernelKey]) -> list[KernelKey]:
    return list(dict.fromkeys(keys))


def _items(variants: Any) -> Iterator[tuple[str, int, Any]]:
    """``(source, index, entry)`` for each variant of a file path or a list, the entries of
    the variant files a list holds (``os.PathLike`` items) in their place."""
    if isinstance(variants, (str, os.PathLike)):
        source = os.fspath(variants)
        for i, entry in enumerate(read_entries(variants)):
            yield str(source), i, entry
        return
    _check_variants_type(variants)
    for i, item in enumerate(variants):
        if isinstance(item, os.PathLike):
            yield from _items(item)
        else:
            yield "<list>", i, item


def resolve_variants(
    variants: Any,
    *,
    arch: str | int | Sequence[str | int] | None = None,
    default_arch: Callable[[], str] | None = None,
) -> list[KernelKey]:
    """Distinct keys, in order, for a variant file path or a list of keys/dicts/names.

    ``variants``: a path (``str`` or ``os.PathLike``) to a TOML/JSON variant file, or an
    iterable of :class:`~nvrtc_engine.KernelKey`, entry dicts (lists expand), canonical
    kernel names (``"gelu_bf16_e4m3_tensor_rowwise_h4096_sm90"``) and paths of variant files
    (``os.PathLike`` such as ``pathlib.Path``: a ``str`` in a list is a kernel name), whose
    variants take the path's place. ``arch``: one arch or a
    list; when given, every variant is made for each of these archs, replacing the arch
    the variant names. Otherwise an entry without an arch gets ``default_arch()`` (called
    once, when first needed), or without that the current GPU's arch.

    Raises :class:`VariantListError` (naming the file and entry),
    :class:`~nvrtc_engine.VariantError` (for a bad ``arch``, before any entry is read;
    :class:`~nvrtc_engine.VariantTypeError` for one of the wrong type) or
    :class:`~nvrtc_engine.ArgumentTypeError` naming ``variants`` when that is neither a
    path nor an iterable of variants (``None``, bytes, a single dict or key: wrap one
    variant in a list).
    """
    from ..core.make import check_arch

    archs = _as_arch_list(arch)
    fallback: list[str] = []
    keys: list[KernelKey] = []
    for source, i, item in _items(variants):
        if isinstance(item, Mapping):
            if archs is not None:
                for a in archs:
                    keys += expand_entry({**item, "arch": a}, source=source, index=i)
                continue
            if item.get("arch") is None and default_arch is not None:
                if not fallback:
                    fallback.append(default_arch())
                item = {**item, "arch": fallback[0]}
            keys += expand_entry(item, source=source, index=i)
            continue
        try:
            key = KernelKey.parse(item) if isinstance(item, str) else item
            if isinstance(item, str):
                parse_arch(key.arch)  # a named arch must be a known one, as make_key's
            if not isinstance(key, KernelKey):
                raise TypeError(f"expected a KernelKey, a dict or a kernel name, got {item!r}")
            # (a key's own arch newer than every known one: this GPU's only; archs replace it)
            keys += [check_arch(key)] if archs is None else [key._replace(arch=a) for a in archs]
        except (ValueError, TypeError) as exc:
            hint = ""
            if isinstance(item, str) and item.lower().endswith((".toml", ".json")):
                hint = f" (a str in a list is a kernel name: pass pathlib.Path({item!r}))"
            raise VariantListError(source, i, f"{exc}{hint}") from exc
    return _unique(keys)


def load_variants(
    path: str | os.PathLike[str], *, arch: str | int | Sequence[str | int] | None = None
) -> list[KernelKey]:
    """The distinct keys of a variant file (see :func:`resolve_variants`)."""
    return resolve_variants(Path(path), arch=arch)
