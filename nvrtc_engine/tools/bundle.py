"""Bundles: the disk cache's kernels in one file, built once and imported on other machines.

A bundle is a zip file::

    manifest.json        format, version, schema, NVRTC version, nvrtc_engine version, and
                         one record per entry: key, digest, NVRTC version, arch, kind, size,
                         sha256 (of the entry file), file
    entries/<digest>     the cache entry exactly as stored (header + image, see cache.py)

A bundle is also a read-only cache as it stands (``NVRTC_ENGINE_READONLY_CACHE``; see
:mod:`nvrtc_engine.core.tiers`), zipped or unzipped.

:func:`export_bundle` writes every valid entry built by this NVRTC for this installation
(entries that fail verification, were built by another NVRTC, or whose digest this
installation would not produce are left out and listed). :func:`import_bundle` checks the
whole bundle before storing anything, and refuses it, naming the entry, when the NVRTC
version differs, a manifest field is missing or of the wrong type, a file is missing or its
SHA-256 differs, an entry does not decode and verify, a manifest field disagrees with its
entry (key, digest, NVRTC version, arch, kind, size, file name ``entries/<digest>``; the
message names the field), an entry's digest is not the one this installation computes
for its key (the bundle came from different templates, or was tampered with), or the
manifest lists a key twice (an export never does: the manifest was edited or damaged, and
the bundle's kernel count would be wrong). A bundle of format 1 (releases whose digest
hashed the rendered source) is refused, saying to export it again.

Where a signing key is configured (``NVRTC_ENGINE_CACHE_KEY``), :func:`export_bundle` signs
every entry it writes (:func:`~nvrtc_engine.core.cache.sign_entry`) and :func:`import_bundle`
refuses a bundle holding an entry that is unsigned or signed with another key. With
``any_nvrtc`` (``cache import --any-nvrtc``), a bundle of another NVRTC version is imported:
its digests are checked as a process with that NVRTC computes them, each entry is loaded once
on a GPU here that runs its arch (refused if the driver does not load it; marked unchecked
where no such GPU is present, checked at its first use) and filed under this NVRTC's digest.

Both functions take the bundle's path as ``str`` or ``os.PathLike``; anything else is an
:class:`~nvrtc_engine.ArgumentTypeError` naming ``path``.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import tempfile
import zipfile
from pathlib import Path
from typing import Any, NamedTuple

from .._version import __version__
from ..core.cache import SCHEMA, check_entry, digest, encode_entry, sign_entry
from ..core.engine import default_engine
from ..core.errors import ArgumentTypeError, BundleError, CudaError
from ..core.kernel import Artifact, try_load
from ..core.key import KernelKey
from ..core.nvrtc import nvrtc_version, target_arch
from ..core.tiers import BUNDLE_ENTRIES

__all__ = ["FORMAT", "VERSION", "BundleError", "BundleReport", "export_bundle", "import_bundle"]

FORMAT = "nvrtc-engine-bundle"
VERSION = 2
MANIFEST = "manifest.json"


class BundleReport(NamedTuple):
    """What an export or import did: the bundle ``path``, the ``keys`` written or imported,
    the ``nvrtc_version`` of the bundle, ``skipped`` (one line per entry left out of an
    export, with the reason), ``already`` (import: how many of ``keys`` the disk cache
    held already, the same bytes by their digest, written again), ``other_nvrtc`` (import:
    built by another NVRTC, taken on request) and ``unchecked`` (how many of those no GPU
    here could load yet)."""

    path: str
    keys: tuple[str, ...]
    nvrtc_version: str
    skipped: tuple[str, ...] = ()
    already: int = 0
    other_nvrtc: bool = False
    unchecked: int = 0


def _checked_path(path: object) -> str:
    """The bundle ``path`` as text: a ``str`` or an ``os.PathLike`` of ``str``, else an
    :class:`ArgumentTypeError` naming ``path`` (for bytes, suggesting ``os.fsdecode``)."""
    text = os.fspath(path) if isinstance(path, (str, os.PathLike)) else path
    if isinstance(text, str):
        return text
    accepted = "expected a path (str or os.PathLike)"
    if isinstance(text, bytes):
        raise ArgumentTypeError("path", f"{accepted}, got bytes {text!r}; decode it with "
                                "os.fsdecode(path)")  # fmt: skip
    raise ArgumentTypeError("path", f"{accepted}, got {type(path).__name__} {path!r}")


def _disk(path: str, what: str) -> Any:
    disk = default_engine().tiers().disk
    if disk is None:
        raise BundleError(path, None, f"no disk cache to {what} (disabled or unusable)")
    return disk


def _expected(name: str, nvrtc_version: str | None = None) -> str:
    """The digest this installation (with NVRTC ``nvrtc_version``) computes for ``name``."""
    return digest(KernelKey.parse(name), nvrtc_version)


def export_bundle(path: str | os.PathLike[str], *, overwrite: bool = False) -> BundleReport:
    """Write every valid entry of the disk cache built by this NVRTC to bundle ``path``,
    signed where a signing key is configured.

    The file appears atomically (written beside it, then renamed); its directory must
    exist, and the file must not, unless ``overwrite`` (the command line's ``--force``).
    Raises :class:`BundleError` when there is no disk cache, nothing to export, the file
    exists (without ``overwrite``) or cannot be written (naming ``path`` and the reason), and
    :class:`~nvrtc_engine.ArgumentTypeError` for a ``path`` that is not a ``str`` or
    ``os.PathLike``.
    """
    target = Path(_checked_path(path))
    where = str(target)
    disk = _disk(where, "export")
    secret = default_engine().tiers().secret
    if target.is_dir():
        raise BundleError(where, None, "is a directory; give the bundle's file name")
    if target.exists() and not overwrite:
        raise BundleError(where, None, "exists; nvrtc-engine cache export --force (or "
                          "export_bundle(..., overwrite=True)) replaces it")  # fmt: skip
    if not target.parent.is_dir():  # as cp or zip would: the directory is not created
        missing = "is not a directory" if target.parent.exists() else "does not exist"
        raise BundleError(where, None, f"cannot write: {target.parent} {missing}")
    nv = nvrtc_version()
    records: list[dict[str, Any]] = []
    files: list[tuple[str, bytes]] = []
    skipped: list[str] = []
    for stored in disk.digests():
        value = disk.get(stored)
        checked = check_entry(value, stored) if value is not None else "removed meanwhile"
        if isinstance(checked, str):
            skipped.append(f"{stored}: {checked} (nvrtc-engine cache verify removes it)")
            continue
        header, artifact = checked
        name = str(header["key"])
        if artifact.nvrtc_version != nv:
            skipped.append(f"{name}: built by NVRTC {artifact.nvrtc_version}, this is {nv}")
            continue
        try:
            current = _expected(name) == stored
        except Exception as exc:  # an op this installation lacks, headers missing
            skipped.append(f"{name}: {type(exc).__name__}: {exc}")
            continue
        if not current:
            skipped.append(f"{name}: built from other templates (another nvrtc_engine version)")
            continue
        assert value is not None
        value = sign_entry(value, secret) if secret else value
        member = f"{BUNDLE_ENTRIES}{stored}"
        records.append({
            "key": name, "digest": stored, "nvrtc_version": artifact.nvrtc_version,
            "arch": target_arch(artifact.options), "kind": artifact.kind, "size": len(value),
            "sha256": hashlib.sha256(value).hexdigest(), "file": member,
        })  # fmt: skip
        files.append((member, value))
    if not records:
        raise BundleError(where, None, "the disk cache holds no valid entry for this NVRTC")
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "schema": SCHEMA,
        "nvrtc_version": nv,
        "nvrtc_engine": __version__,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "entries": records,
    }
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    except OSError as exc:  # the temporary file's name would only confuse: name the bundle
        raise BundleError(where, None, f"cannot write: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as raw, zipfile.ZipFile(raw, "w", zipfile.ZIP_DEFLATED) as zf:
            zf.writestr(MANIFEST, json.dumps(manifest, indent=1, sort_keys=True))
            for member, value in files:
                zf.writestr(member, value)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes it 0600; a bundle is meant to be shared
        os.replace(tmp, target)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise BundleError(where, None, f"cannot write: {exc.strerror or exc}") from None
        raise
    return BundleReport(where, tuple(r["key"] for r in records), nv, tuple(skipped))


def _read_manifest(zf: zipfile.ZipFile, where: str) -> dict[str, Any]:
    try:
        manifest = json.loads(zf.read(MANIFEST))
    except KeyError:
        raise BundleError(where, None, f"no {MANIFEST}: not an nvrtc_engine bundle") from None
    except ValueError as exc:
        raise BundleError(where, None, f"damaged {MANIFEST}: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise BundleError(where, None, "not an nvrtc_engine bundle (wrong format field)")
    if manifest.get("version") == 1:
        raise BundleError(
            where, None, "a bundle of format 1, made by an earlier nvrtc_engine (its entries "
            "are filed under digests of rendered sources); export it again with this release",
        )  # fmt: skip
    if manifest.get("version") != VERSION or manifest.get("schema") != SCHEMA:
        raise BundleError(
            where,
            None,
            f"bundle format {manifest.get('version')}/schema {manifest.get('schema')}; this "
            f"nvrtc_engine reads format {VERSION}/schema {SCHEMA}",
        )
    if not isinstance(manifest.get("entries"), list):
        raise BundleError(where, None, f"damaged {MANIFEST}: no entry list")
    return manifest


_TEXT_FIELDS = ("digest", "nvrtc_version", "arch", "kind", "sha256", "file")


def _is_hex_digest(value: str) -> bool:
    return len(value) == 64 and all(c in "0123456789abcdef" for c in value)


def _checked_record(record: Any, where: str) -> dict[str, Any]:
    """A manifest record with every field present and of its type (``key``, the text fields,
    ``digest``/``sha256`` as SHA-256 hex, ``size`` a count of bytes), else a
    :class:`BundleError` naming the entry and the field."""
    if not isinstance(record, dict) or not isinstance(record.get("key"), str):
        raise BundleError(where, None, f"damaged manifest record {record!r}")
    name = record["key"]
    for field in (*_TEXT_FIELDS, "size"):
        if field not in record:
            raise BundleError(where, name, f"manifest field {field!r} is missing")
        value = record[field]
        if field == "size":
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise BundleError(
                    where, name, f"manifest field 'size' is {value!r}: expected a number of bytes"
                )
        elif not isinstance(value, str):
            raise BundleError(where, name, f"manifest field {field!r} is {value!r}: expected text")
        elif field in ("digest", "sha256") and not _is_hex_digest(value):
            raise BundleError(
                where, name, f"manifest field {field!r} is {value!r}: expected 64 hex digits"
            )
    return record


def _agrees(where: str, name: str, field: str, said: object, actual: object, what: str) -> None:
    """A :class:`BundleError` unless the manifest's ``field`` (``said``) is ``actual``;
    ``what`` introduces the entry's own value in the message."""
    if said != actual:
        raise BundleError(where, name, f"manifest field {field!r} is {said!r}; {what} {actual!r}")


_Verified = tuple[str, bytes, str, Artifact]


def _verified(
    zf: zipfile.ZipFile, record: Any, nv: str, where: str, secret: bytes | None
) -> _Verified:
    """One manifest record, every field checked against its entry file and the entry against
    this installation with NVRTC ``nv`` (the bundle's) and signing key ``secret``; returns
    the key's name, the entry, its digest and its artifact."""
    record = _checked_record(record, where)
    name, digest = record["key"], record["digest"]
    if record["nvrtc_version"] != nv:
        raise BundleError(
            where, name, f"built by NVRTC {record['nvrtc_version']}; this is NVRTC {nv}"
        )
    if record["file"] != f"entries/{digest}":
        raise BundleError(
            where, name, f"manifest field 'file' is {record['file']!r}; expected "
            f"'entries/<digest>' ('entries/{digest}')",
        )  # fmt: skip
    try:
        value = zf.read(record["file"])
    except (KeyError, zipfile.BadZipFile, OSError) as exc:
        raise BundleError(where, name, f"file {record['file']!r} unreadable: {exc}") from None
    if hashlib.sha256(value).hexdigest() != record["sha256"]:
        raise BundleError(where, name, "SHA-256 mismatch: the entry file is damaged")
    if record["size"] != len(value):
        raise BundleError(
            where, name, f"manifest field 'size' is {record['size']}; the entry file has "
            f"{len(value)} bytes",
        )  # fmt: skip
    checked = check_entry(value, None, secret=secret)
    if isinstance(checked, str):
        raise BundleError(where, name, f"the entry does not verify ({checked})")
    header, artifact = checked
    _agrees(where, name, "key", name, header.get("key"), "the entry's header says")
    _agrees(where, name, "digest", digest, artifact.digest, "the entry's header says")
    _agrees(where, name, "nvrtc_version", nv, artifact.nvrtc_version, "the entry's header says")
    _agrees(where, name, "kind", record["kind"], artifact.kind, "the entry is a")
    _agrees(where, name, "arch", record["arch"], target_arch(artifact.options), "the entry is for")
    try:
        expected = _expected(name, nv)
    except Exception as exc:
        raise BundleError(where, name, f"this installation cannot build it: {exc}") from None
    if expected != digest:
        raise BundleError(
            where,
            name,
            "digest differs from the one this installation computes (the bundle was built "
            "from other templates or headers, or was altered)",
        )
    return name, value, digest, artifact


def import_bundle(path: str | os.PathLike[str], *, any_nvrtc: bool | None = None) -> BundleReport:
    """Verify every entry of bundle ``path``, then store them all in the disk cache.

    All or nothing: raises :class:`BundleError` naming the first bad entry (or the bundle)
    and stores nothing when any check fails, a key listed twice in the manifest included;
    see the module docstring for the checks. ``any_nvrtc`` (default: the setting,
    ``NVRTC_ENGINE_ANY_NVRTC``) takes a bundle of another NVRTC version, each entry loaded
    once on a GPU here that runs it (a :class:`BundleError` naming the entry where the
    driver refuses one). Raises :class:`~nvrtc_engine.ArgumentTypeError` for a ``path``
    that is not a ``str`` or ``os.PathLike``.
    """
    where = _checked_path(path)
    disk = _disk(where, "import into")
    t = default_engine().tiers()
    any_nvrtc = t.settings.any_nvrtc if any_nvrtc is None else bool(any_nvrtc)
    nv = local = nvrtc_version()
    try:
        zf = zipfile.ZipFile(where)
    except FileNotFoundError:
        raise BundleError(where, None, "does not exist") from None
    except IsADirectoryError:
        raise BundleError(where, None, "is a directory, not a bundle file") from None
    except (OSError, zipfile.BadZipFile) as exc:
        raise BundleError(where, None, f"cannot open as a zip file: {exc}") from None
    with zf:
        manifest = _read_manifest(zf, where)
        if manifest.get("nvrtc_version") != nv:
            if not any_nvrtc or not isinstance(manifest.get("nvrtc_version"), str):
                raise BundleError(
                    where,
                    None,
                    f"built with NVRTC {manifest.get('nvrtc_version')}; this is NVRTC {nv} "
                    "(kernels are shared across NVRTC versions only on request: "
                    "--any-nvrtc, any_nvrtc=True, NVRTC_ENGINE_ANY_NVRTC=1)",
                )
            nv = manifest["nvrtc_version"]
        verified = []
        listed: set[str] = set()
        for record in manifest["entries"]:
            # verified first: a record naming another entry's key is refused for disagreeing
            # with its own entry; a verified key names one digest, so a repeat is the same entry
            found = _verified(zf, record, nv, where, t.secret)
            if found[0] in listed:
                raise BundleError(where, found[0], f"listed twice in {MANIFEST}")
            listed.add(found[0])
            verified.append(found)
    unchecked = 0
    if nv != local:  # another NVRTC's entries: loaded here first, filed under this NVRTC's digests
        verified, unchecked = _adopted(verified, local, where)
    already = sum(1 for _, _, stored, _ in verified if stored in disk)
    for name, value, stored, _ in verified:
        if not disk.put(stored, value):
            raise BundleError(where, name, f"cannot write to the disk cache at {disk.directory}")
    keys = tuple(name for name, _, _, _ in verified)
    return BundleReport(where, keys, nv, already=already, other_nvrtc=nv != local,
                        unchecked=unchecked)  # fmt: skip


def _adopted(verified: list[_Verified], local: str, where: str) -> tuple[list[_Verified], int]:
    """Entries of another NVRTC, each loaded once on a GPU here that runs it (a
    :class:`BundleError` naming the first the driver refuses), refiled under this NVRTC's
    digest; and how many no GPU here could load."""
    adopted, unchecked = [], 0
    for name, value, _, artifact in verified:
        key = KernelKey.parse(name)
        try:
            loaded = try_load(key, artifact)
        except CudaError as exc:
            raise BundleError(where, name, f"built by NVRTC {artifact.nvrtc_version}, it does "
                              f"not load on this machine's GPU ({exc})") from None  # fmt: skip
        unchecked += not loaded
        artifact = artifact._replace(digest=digest(key))
        value = encode_entry(name, artifact, adopted_for=local, checked=loaded)
        adopted.append((name, value, artifact.digest, artifact))
    return adopted, unchecked
