"""Bundles: export a prewarmed cache, import it into an empty one, and refuse damaged,
tampered or foreign bundles, naming the entry, without storing anything."""

from __future__ import annotations

import hashlib
import json
import zipfile

import pytest

import nvrtc_engine as ne
from nvrtc_engine import make_key
from nvrtc_engine.core import config, nvrtc
from nvrtc_engine.core.cache import digest, encode_entry
from nvrtc_engine.core.engine import Engine, default_engine
from nvrtc_engine.core.kernel import Artifact
from nvrtc_engine.core.nvrtc import nvrtc_version
from nvrtc_engine.tools.bundle import BundleError, export_bundle, import_bundle
from nvrtc_engine.tools.prewarm import prewarm

KEYS = [make_key("gelu", dtype=d, arch=a) for d in ("fp8", "bf16") for a in ("sm_90", "sm_100a")]


@pytest.fixture
def bundle(tmp_path):
    prewarm(KEYS, workers=1, progress=False)
    path = tmp_path / "out" / "kernels.nvrtc-bundle"
    path.parent.mkdir()
    report = export_bundle(path)
    assert sorted(report.keys) == sorted(map(str, KEYS)) and report.skipped == ()
    assert report.nvrtc_version == nvrtc_version()
    return path


def _use_empty_cache(tmp_path, name="other-cache"):
    config.configure(cache_dir=tmp_path / name)
    ne.clear_cache()


def test_round_trip_into_an_empty_cache_compiles_nothing(bundle, tmp_path):
    with zipfile.ZipFile(bundle) as zf:
        manifest = json.loads(zf.read("manifest.json"))
    assert manifest["nvrtc_version"] == nvrtc_version() and len(manifest["entries"]) == 4
    record = manifest["entries"][0]
    assert set(record) >= {"key", "digest", "nvrtc_version", "arch", "sha256", "file"}
    assert {r["arch"] for r in manifest["entries"]} == {"sm_90", "sm_100a"}
    _use_empty_cache(tmp_path)
    assert ne.cache_info().entries == 0
    report = import_bundle(bundle)
    assert sorted(report.keys) == sorted(map(str, KEYS))
    engine = Engine()
    assert all(engine.get(k).origin == "disk" for k in KEYS) and engine.compiles == 0


def _rewrite(path, change):
    """Rewrite a bundle, passing (manifest, files) through ``change``."""
    with zipfile.ZipFile(path) as zf:
        manifest = json.loads(zf.read("manifest.json"))
        files = {n: zf.read(n) for n in zf.namelist() if n != "manifest.json"}
    change(manifest, files)
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("manifest.json", json.dumps(manifest))
        for name, data in files.items():
            zf.writestr(name, data)


def _flip_image_byte(manifest, files):
    record = manifest["entries"][1]
    data = bytearray(files[record["file"]])
    data[-10] ^= 0x40
    files[record["file"]] = bytes(data)


def _flip_and_fix_sha(manifest, files):
    _flip_image_byte(manifest, files)
    record = manifest["entries"][1]
    record["sha256"] = hashlib.sha256(files[record["file"]]).hexdigest()


def _other_kernel_under_this_digest(manifest, files):
    """A well-formed entry, consistent with its manifest record (digest, header, sha256), whose
    digest is not the one its key has: altered, or built from other templates."""
    record = manifest["entries"][1]
    art = Artifact(image=b"\x7fELF not this kernel", kind="cubin", symbols=(record["key"],),
                   digest="f" * 64, nvrtc_version=record["nvrtc_version"],
                   options=(f"-arch={record['arch']}",), compile_ms=1.0)  # fmt: skip
    del files[record["file"]]
    record["digest"], record["file"] = art.digest, f"entries/{art.digest}"
    files[record["file"]] = encode_entry(record["key"], art)
    record["size"] = len(files[record["file"]])
    record["sha256"] = hashlib.sha256(files[record["file"]]).hexdigest()


def _remove_file(manifest, files):
    del files[manifest["entries"][1]["file"]]


def _other_nvrtc(manifest, files):
    manifest["nvrtc_version"] = "12.0"


def _entry_other_nvrtc(manifest, files):
    manifest["entries"][1]["nvrtc_version"] = "12.0"


@pytest.mark.parametrize(
    ("change", "match", "names_entry"),
    [
        (_flip_image_byte, "SHA-256 mismatch", True),
        (_flip_and_fix_sha, "does not verify", True),
        (_other_kernel_under_this_digest, "digest differs", True),
        (_remove_file, "unreadable", True),
        (_other_nvrtc, "built with NVRTC 12.0", False),
        (_entry_other_nvrtc, "built by NVRTC 12.0", True),
    ],
    ids=lambda v: getattr(v, "__name__", None),
)
def test_tampered_or_foreign_bundle_is_refused_and_nothing_is_stored(
    bundle, tmp_path, change, match, names_entry
):
    _rewrite(bundle, change)
    with zipfile.ZipFile(bundle) as zf:
        bad_key = json.loads(zf.read("manifest.json"))["entries"][1]["key"]
    _use_empty_cache(tmp_path)
    with pytest.raises(BundleError, match=match) as info:
        import_bundle(bundle)
    assert (info.value.entry == bad_key) if names_entry else info.value.entry is None
    if names_entry:
        assert f"entry {bad_key}" in str(info.value)
    assert ne.cache_info().entries == 0  # all or nothing


def _set_field(field, value):
    """A change that sets (or, for ``...``, removes) ``field`` of the second record."""

    def change(manifest, files):
        record = manifest["entries"][1]
        if value is ...:
            del record[field]
        elif callable(value):
            record[field] = value(manifest)
        else:
            record[field] = value

    change.__name__ = f"{field}={getattr(value, '__name__', value)!r}"
    return change


def _digest_of_another_entry(manifest, files):
    """The record (and its file's name) says a digest the entry's own header does not."""
    record = manifest["entries"][1]
    files["entries/" + "0" * 64] = files.pop(record["file"])
    record["digest"], record["file"] = "0" * 64, "entries/" + "0" * 64


def _other_arch(manifest):
    return "sm_80" if manifest["entries"][1]["arch"] != "sm_80" else "sm_89"


def _first_key(manifest):
    return manifest["entries"][0]["key"]


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (_set_field("size", 1), r"'size' is 1; the entry file has \d+ bytes"),
        (_set_field("size", "big"), "'size' is 'big': expected a number of bytes"),
        (_set_field("size", True), "'size' is True: expected a number of bytes"),
        (_set_field("size", ...), "'size' is missing"),
        (_set_field("arch", _other_arch), "'arch' is 'sm_8.*the entry is for 'sm_"),
        (_set_field("kind", "ptx"), "'kind' is 'ptx'; the entry is a 'cubin'"),
        (_set_field("kind", ...), "'kind' is missing"),
        (_set_field("digest", ...), "'digest' is missing"),
        (_digest_of_another_entry, "'digest' is '0000.*the entry's header"),
        (_set_field("digest", "0" * 64), "'file' is 'entries/.*; expected"),
        (_set_field("digest", 7), "'digest' is 7: expected"),
        (_set_field("sha256", ...), "'sha256' is missing"),
        (_set_field("file", ...), "'file' is missing"),
        (_set_field("file", "entries/x"), "'file' is 'entries/x'; expected"),
        (_set_field("nvrtc_version", ...), "'nvrtc_version' is missing"),
        (_set_field("key", _first_key), "'key' is .*the entry's header says"),
    ],
    ids=lambda v: getattr(v, "__name__", None),
)
def test_every_manifest_field_is_checked_against_its_entry(bundle, tmp_path, change, match):
    """Each field a manifest entry gives (missing, of the wrong type, or disagreeing with its
    entry) is refused naming the entry and the field, and nothing is stored."""
    test_tampered_or_foreign_bundle_is_refused_and_nothing_is_stored(
        bundle, tmp_path, change, f"entry [^:]+: manifest field {match}", names_entry=True
    )


def test_not_a_bundle(tmp_path):
    junk = tmp_path / "junk.zip"
    junk.write_bytes(b"not a zip at all")
    with pytest.raises(BundleError, match="cannot open as a zip"):
        import_bundle(junk)
    empty = tmp_path / "empty.zip"
    with zipfile.ZipFile(empty, "w") as zf:
        zf.writestr("readme.txt", "hello")
    with pytest.raises(BundleError, match="no manifest.json"):
        import_bundle(empty)


def test_a_missing_bundle_is_reported_as_missing(tmp_path):
    """Not as "cannot open as a zip file: [Errno 2]": the file does not exist."""
    missing = tmp_path / "nope.zip"
    with pytest.raises(BundleError) as info:
        import_bundle(missing)
    assert str(info.value) == f"{missing}: does not exist"
    with pytest.raises(BundleError, match=r"is a directory, not a bundle file$"):
        import_bundle(tmp_path)


def test_export_refuses_an_existing_file_unless_told_to_replace_it(tmp_path):
    ne.get_kernel("gelu", dtype="bf16", arch="sm_90")
    target = tmp_path / "b.zip"
    target.write_bytes(b"someone else's file")
    with pytest.raises(BundleError) as info:
        export_bundle(target)
    assert str(info.value) == (f"{target}: exists; nvrtc-engine cache export --force (or "
                               "export_bundle(..., overwrite=True)) replaces it")  # fmt: skip
    assert target.read_bytes() == b"someone else's file"
    report = export_bundle(target, overwrite=True)
    assert report.keys and zipfile.is_zipfile(target)


def test_export_leaves_out_damaged_and_foreign_entries(tmp_path, monkeypatch):
    good = make_key("gelu", dtype="bf16", arch="sm_90")
    ne.get_kernel(good)
    damaged = make_key("gelu", dtype="fp16", arch="sm_90")
    ne.get_kernel(damaged)
    disk = default_engine().tiers().disk
    disk.put(digest(damaged), disk.get(digest(damaged))[:-5])
    with monkeypatch.context() as m:  # an entry from another NVRTC sharing the directory
        m.setattr(nvrtc, "nvrtc_identity", lambda: "99.0")
        m.setattr(nvrtc, "nvrtc_version", lambda: "99.0")
        Engine().get(make_key("gelu", dtype="fp32", arch="sm_90"))
    report = export_bundle(tmp_path / "b.zip")
    assert report.keys == (str(good),)
    assert len(report.skipped) == 2
    assert any("cache verify removes it" in s for s in report.skipped)
    assert any("NVRTC 99.0" in s for s in report.skipped)


def test_export_needs_a_disk_cache_with_entries(tmp_path, monkeypatch):
    with pytest.raises(BundleError, match="no valid entry"):
        export_bundle(tmp_path / "b.zip")
    assert not (tmp_path / "b.zip").exists() and list(tmp_path.glob(".b.zip.*")) == []
    monkeypatch.setenv("NVRTC_ENGINE_DISABLE_DISK_CACHE", "1")
    config.reset()
    ne.clear_cache()
    with pytest.raises(BundleError, match="no disk cache"):
        export_bundle(tmp_path / "b.zip")


def test_export_refuses_a_path_it_cannot_write_naming_it(tmp_path, monkeypatch):
    """As cp would: a missing directory is not created; an OS error names the bundle, not
    the temporary file beside it."""
    import os

    ne.get_kernel("gelu", dtype="bf16", arch="sm_90")
    missing = tmp_path / "no-such-dir" / "b.zip"
    with pytest.raises(BundleError, match=f"{missing}: cannot write: .*no-such-dir does not"):
        export_bundle(missing)
    assert not missing.parent.exists()
    (tmp_path / "k.zip").write_bytes(b"")
    with pytest.raises(BundleError, match="k.zip is not a directory"):
        export_bundle(tmp_path / "k.zip" / "sub.zip")

    def refuse(src, dst):
        raise PermissionError(13, "Permission denied", src)

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(BundleError) as info:
        export_bundle(tmp_path / "b.zip")
    assert str(info.value) == f"{tmp_path / 'b.zip'}: cannot write: Permission denied"
    assert list(tmp_path.glob(".b.zip.*")) == []
    if os.path.isdir("/proc/self"):  # a directory that takes no new files
        with pytest.raises(BundleError, match="^/proc/x.zip: cannot write: "):
            export_bundle("/proc/x.zip")


def test_bundle_file_mode_follows_the_umask(tmp_path):
    import os
    import stat

    from nvrtc_engine.tools.bundle import export_bundle

    ne.get_kernel("gelu", dtype="bf16", arch="sm_90")
    old = os.umask(0o022)
    try:
        export_bundle(tmp_path / "b.zip")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "b.zip").stat().st_mode) == 0o644


@pytest.mark.parametrize("path", [None, 123, b"x.zip", 1.5, ["x.zip"]])
@pytest.mark.parametrize("function", [export_bundle, import_bundle])
def test_a_bundle_path_of_the_wrong_type_names_the_argument(function, path):
    ne.get_kernel("gelu", dtype="bf16", arch="sm_90")
    with pytest.raises(ne.ArgumentTypeError, match=r"^path: expected a path \(str or "
                       r"os.PathLike\)") as info:  # fmt: skip
        function(path)
    assert info.value.argument == "path" and isinstance(info.value, TypeError)
    assert ("os.fsdecode" in str(info.value)) == isinstance(path, bytes)


def test_a_bytes_path_like_is_refused_too(tmp_path):
    class BytesPath:
        def __fspath__(self) -> bytes:
            return b"x.zip"

    with pytest.raises(ne.ArgumentTypeError, match="os.fsdecode"):
        import_bundle(BytesPath())
    ne.get_kernel("gelu", dtype="bf16", arch="sm_90")
    report = export_bundle(str(tmp_path / "s.zip"))  # str and os.PathLike both work
    assert report.path == str(tmp_path / "s.zip")


def test_an_entry_listed_twice_in_the_manifest_is_refused(bundle, tmp_path):
    def twice(manifest, files):
        manifest["entries"].append(dict(manifest["entries"][1]))

    _rewrite(bundle, twice)
    with zipfile.ZipFile(bundle) as zf:
        key = json.loads(zf.read("manifest.json"))["entries"][1]["key"]
    _use_empty_cache(tmp_path)
    with pytest.raises(BundleError, match="listed twice in manifest.json") as info:
        import_bundle(bundle)
    assert info.value.entry == key
    assert ne.cache_info().entries == 0  # all or nothing


def test_a_bundle_of_the_previous_format_is_refused_saying_what_to_do(bundle, tmp_path):
    def previous(manifest, files):
        manifest["version"], manifest["schema"] = 1, 1

    _rewrite(bundle, previous)
    _use_empty_cache(tmp_path)
    with pytest.raises(BundleError, match="format 1, made by an earlier nvrtc_engine.*export it "
                       "again with this release") as info:  # fmt: skip
        import_bundle(bundle)
    assert info.value.entry is None and ne.cache_info().entries == 0


def test_an_import_is_filed_under_the_digest_this_installation_computes(bundle, tmp_path):
    _use_empty_cache(tmp_path)
    report = import_bundle(bundle)
    disk = default_engine().tiers().disk
    assert sorted(disk.digests()) == sorted(digest(k) for k in KEYS)
    assert report.already == 0 and import_bundle(bundle).already == len(KEYS)
