"""The ``nvrtc-engine`` command line (argparse).

Exit codes: 0 success; 1 the command ran but found failures (``prewarm``: a variant failed;
``cache verify``: bad entries were found and removed); 2 an error (bad arguments, an
unreadable variant file, a refused bundle, ...), with a message on stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .._version import __version__
from ..core.config import MAX_WORKERS
from ..core.errors import counted

__all__ = ["main"]


class _UsageError(ValueError):
    """A bad argument found after argparse's own checks (``--arch``'s values, a missing
    variant file): exit code 2 with the command's usage line, as argparse's errors have."""


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    arch = _arch_options([args.arch])[0] if args.arch is not None else None  # as prewarm's
    return run_demo(arch, args.tokens, not args.no_run, sys.stdout, seed=args.seed)


def _arch_options(archs: Sequence[str] | None) -> list[str] | None:
    """The ``--arch`` values, checked here: a bad one is an error that names ``--arch``, not
    the variant file's first entry. Raises ``ValueError`` (exit code 2, with the usage line)."""
    from ..core.errors import VariantError
    from ..core.key import parse_arch

    checked = []
    for arch in archs or ():
        try:
            checked.append(parse_arch(arch))
        except VariantError as exc:
            raise _UsageError(f"argument --arch: {arch} {exc.detail}") from None
    return checked or None


def _files_after_archs(
    files: list[str], archs: list[str] | None
) -> tuple[list[str], list[str] | None]:
    """The variant files and the ``--arch`` values: ``prewarm --arch sm_90 FILE...`` puts the
    files among the archs (``--arch`` takes one or more values), so the last values that
    name an existing file or end in .toml/.json are taken as files. Raises ``ValueError``
    (exit code 2, with the usage line) when there is no file."""
    archs = list(archs or ())
    trailing: list[str] = []
    while archs and (os.path.isfile(archs[-1]) or archs[-1].lower().endswith((".toml", ".json"))):
        trailing.insert(0, archs.pop())
    files = [*files, *trailing]
    if not files:
        raise _UsageError("the variant file FILE is missing")
    return files, archs or None


def _cmd_prewarm(args: argparse.Namespace) -> int:
    """Prewarm fills the disk cache: this process ends with the command, so it makes no
    kernel objects (``prewarm(memory=False)``; with ``--remote``, whose writes read them from
    memory, it does). No disk cache is an error before anything is compiled (exit code 2),
    and kernels compiled but not stored (a read-only cache, or one whose size limit evicted
    them) a failure (exit code 1)."""
    from ..core.errors import NvrtcEngineError, SettingsError
    from .prewarm import prewarm

    files, archs = _files_after_archs(args.files, args.arch)
    arch = _arch_options(archs)
    try:
        disk = _open_disk()
    except SettingsError:  # a malformed NVRTC_ENGINE_* variable: its own message says it all
        raise
    except NvrtcEngineError as exc:
        raise NvrtcEngineError(
            f"{exc}; nothing was compiled: prewarm stores its kernels in the disk cache, and "
            "without one they would be lost when this command exits"
        ) from None
    remote = _open_remote() if args.remote else None  # no remote cache: an error first
    variants = files[0] if len(files) == 1 else [Path(f) for f in files]
    report = prewarm(variants, arch=arch, workers=args.workers, progress=not args.no_progress,
                     memory=remote is not None)  # fmt: skip
    unshared = _publish(report) if remote is not None else []
    if args.json:
        print(json.dumps({**report.to_dict(), "remote_missed": [str(k) for k in unshared]}
                         if remote is not None else report.to_dict(), indent=2))  # fmt: skip
    else:
        print(report.summary())
        if remote is not None:
            ready = len(report.compiled) + len(report.cached)
            print(f"remote cache {remote.location}: {ready - len(unshared)} of "
                  f"{counted(ready, 'kernel')} written")  # fmt: skip
    if unshared:
        why = remote.refused or "unreachable, or built by another NVRTC: see the warnings above"
        listed = ", ".join(map(str, unshared[:3])) + (" ..." if len(unshared) > 3 else "")
        print(f"{args.parser.prog}: error: the remote cache at {remote.location} did not take "
              f"{len(unshared)} kernels ({why}): {listed}", file=sys.stderr)  # fmt: skip
        return 1
    unstored = _not_stored(report.compiled, disk)
    if unstored:
        print(
            f"{args.parser.prog}: error: the disk cache at {disk.directory} did not keep them "
            f"({disk.refused or 'removed meanwhile'}): kernels compiled but not stored: "
            f"{len(unstored)} of {len(report.compiled)}",
            file=sys.stderr,
        )
        return 1
    return 0 if report.ok else 1


def _open_remote() -> Any:
    """The remote cache, else an :class:`NvrtcEngineError` (exit code 2) saying why none."""
    from ..core import config
    from ..core.engine import default_engine
    from ..core.errors import NvrtcEngineError

    remote = default_engine().tiers().remote
    if remote is None:
        raise NvrtcEngineError(
            "--remote: no remote cache to fill: set NVRTC_ENGINE_REMOTE_CACHE=redis://host:port/db"
            if not config.settings().remote_cache
            else "--remote: the remote cache cannot be used (the warning above says why)"
        )
    return remote


def _publish(report: Any) -> list[Any]:
    """Write every kernel the prewarm made ready to the remote cache; the keys not written."""
    from ..core.engine import default_engine
    from ..core.remote import publish

    return publish(default_engine(), [*report.compiled, *report.cached])


def _not_stored(keys: Sequence[Any], disk: Any) -> list[Any]:
    """The ``keys`` (compiled by a prewarm) whose kernels the disk cache does not hold: a
    write failed (a full disk), or its size limit evicted them."""
    from ..core.cache import digest

    return [key for key in keys if digest(key) not in disk]


def _open_disk() -> Any:
    """The disk cache, else an :class:`NvrtcEngineError` (exit code 2) saying why there is
    none."""
    from ..core.engine import default_engine
    from ..core.errors import NvrtcEngineError

    disk = default_engine().tiers().disk
    if disk is None:
        raise NvrtcEngineError(_no_disk_reason())
    return disk


def _no_disk_reason() -> str:
    """Why there is no disk cache: disabled by a setting, or its directory is unusable."""
    from ..core import config

    current = config.settings()
    if current.disable_disk_cache:
        return ("the disk cache is disabled (NVRTC_ENGINE_DISABLE_DISK_CACHE=1 or "
                "configure(disable_disk_cache=True)): kernels are kept in memory only")  # fmt: skip
    try:
        where = str(current.resolved_cache_dir())
    except OSError as exc:
        where = f"(none: {exc})"
    return (f"the disk cache at {where} is unusable (the warning above says why); set "
            "NVRTC_ENGINE_CACHE_DIR to a writable directory")  # fmt: skip


def _cache_info(args: argparse.Namespace) -> int:
    from ..api import cache_info
    from ..core.engine import default_engine

    # no disk cache: an error, as for the other cache commands (this process's memory cache,
    # which cache_info() also counts, is empty on the command line: nothing else to report)
    _open_disk()
    tiers = default_engine().tiers()
    info = cache_info()
    remote = tiers.remote.state() if tiers.remote is not None else None
    shared = {"signed": tiers.secret is not None, "any_nvrtc": tiers.settings.any_nvrtc}
    if args.json:
        print(json.dumps({**info._asdict(), "remote_state": remote, **shared}, indent=2))
        return 0
    print(f"directory:  {info.directory}")
    print(f"entries:    {info.entries}")
    print(f"bytes:      {info.bytes} ({_size(info.bytes)} on disk, its SQLite database "
          "included: an empty cache has one)")  # fmt: skip
    print(f"size limit: {info.size_limit} ({_size(info.size_limit)})")
    for path in info.readonly:
        print(f"read-only:  {path}")
    if info.remote is not None:
        if remote is None:
            state = "not used (the warning above says why)"
        elif remote["reachable"]:
            versions = ", ".join(remote["nvrtc_versions"]) or "none yet"
            state = (f"reachable, {counted(remote['entries'], 'entry', 'entries')} under prefix "
                     f"{tiers.settings.remote_prefix!r} (built by NVRTC {versions})")  # fmt: skip
        else:
            state = f"unreachable ({remote['error']})"
        print(f"remote:     {info.remote}: {state}")
    signing = "on (entries of the remote cache and bundles are signed and checked)"
    print(f"signing:    {signing if shared['signed'] else 'off'}")
    print(f"any NVRTC:  {'on' if shared['any_nvrtc'] else 'off'}")
    return 0


def _size(n: int) -> str:
    """``n`` bytes in decimal units (``32.8 kB``, ``1.07 GB``)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} B"


def _current_digest(name: str, memo: dict[str, str | None]) -> str | None:
    """The digest this installation would store key ``name`` under now (its templates,
    options, NVRTC and headers), or None where the name is no key of this version."""
    if name not in memo:
        from ..core.cache import digest
        from ..core.key import KernelKey

        try:
            memo[name] = digest(KernelKey.parse(name))
        except Exception:  # an old or foreign key: nothing to compare with
            memo[name] = None
    return memo[name]


def _cache_list(args: argparse.Namespace) -> int:
    from ..core.cache import entries
    from ..core.nvrtc import target_arch

    rows = []
    memo: dict[str, str | None] = {}
    for digest, checked in entries(_open_disk()):
        if isinstance(checked, str):
            rows.append({"key": "(damaged)", "digest": digest})
            continue
        header, artifact = checked
        current = _current_digest(header["key"], memo)
        adopted = header.get("adopted_for")
        rows.append({
            "key": header["key"], "digest": digest, "arch": target_arch(artifact.options),
            "kind": artifact.kind, "bytes": len(artifact.image),
            "compile_ms": round(artifact.compile_ms, 1), "nvrtc": artifact.nvrtc_version,
            "created": header.get("created"),
            "current": None if current is None else current == digest,
            "other_nvrtc": None if adopted is None else (
                "loads" if header.get("checked") else "unchecked"),
        })  # fmt: skip
    rows.sort(key=lambda r: (r["key"], r["digest"]))
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if rows:
        # size is the entry's image, cubin or PTX as the kind column says
        # current: whether get_kernel would use the entry now (no: superseded by a change of
        # templates, options or NVRTC; it stays until evicted or `cache clear`); NVRTC: the
        # one that built it, and for another NVRTC's entry whether it loaded on a GPU here
        header = ("key", "arch", "kind", "size", "compile", "NVRTC", "digest", "current")
        mark = {True: "yes", False: "no", None: "?"}
        cells = [
            (r["key"], r["arch"], r["kind"], f"{r['bytes']} B", f"{r['compile_ms']:.1f} ms",
             r["nvrtc"] + (f" (other NVRTC, {r['other_nvrtc']})" if r["other_nvrtc"] else ""),
             r["digest"][:12], mark[r["current"]])
            if "arch" in r
            else (r["key"], "", "", "", "", "", r["digest"][:12], "")
            for r in rows
        ]  # fmt: skip
        from .table import format_table

        for line in format_table(header, cells, right=("size", "compile")):
            print(line)
    superseded = sum(r.get("current") is False for r in rows)
    listed = counted(len(rows), "entry", "entries")
    print(listed + (f", {superseded} superseded" if superseded else ""))
    return 0


def _cache_verify(args: argparse.Namespace) -> int:
    """Check every entry as a load does and remove the bad ones, then have diskcache check
    its index against its files (repaired)."""
    from ..core.cache import entries

    disk = _open_disk()
    checked = bad = 0
    for digest, answer in entries(disk):
        checked += 1
        if isinstance(answer, str):
            bad += 1
            disk.delete(digest)
            print(f"removed {digest[:12]}: {answer}")
    for problem in disk.check(fix=True):
        print(f"repaired: {problem}")
    print(f"checked {counted(checked, 'entry', 'entries')}: {bad} bad"
          + (" (removed)" if bad else ""))  # fmt: skip
    return 1 if bad else 0


def _cache_clear(args: argparse.Namespace) -> int:
    """Clear the disk cache and say what went: the entries and the bytes they took, which is
    what the cache's size on disk dropped by (its SQLite database stays: about 32 kB even
    when empty, so it is not counted); no bytes for a cache that held no entry."""
    from ..api import cache_info, clear_cache
    from ..core import config
    from ..core.engine import default_engine

    engine = default_engine()
    if engine.tiers().disk is None and engine.tiers().why.startswith("no space"):
        where = config.settings().resolved_cache_dir()  # a full disk: the store goes whole
        clear_cache()
        print(f"cleared the disk cache at {where}: its store, which could not be opened "
              "(no space left on device), was removed")  # fmt: skip
        return 0
    _open_disk()  # no disk cache: an error, as for the other commands
    before = cache_info()
    clear_cache()
    freed = max(0, before.bytes - cache_info().bytes)  # (another process may store meanwhile)
    size = f" ({freed} bytes)" if before.entries else ""
    print(f"cleared {counted(before.entries, 'entry', 'entries')}{size} from {before.directory}")
    return 0


def _cache_export(args: argparse.Namespace) -> int:
    from .bundle import export_bundle

    _open_disk()  # no disk cache: an error with the reason, as for the other commands
    report = export_bundle(args.bundle, overwrite=args.force)
    reasons: dict[str, list[str]] = {}  # one line per reason, not per entry
    for line in report.skipped:
        name, _, why = line.partition(": ")
        reasons.setdefault(why, []).append(name)
    for why, names in reasons.items():
        more = f" and {len(names) - 1} more" if len(names) > 1 else ""
        print(f"skipped {names[0]}{more}: {why}")
    kernels = counted(len(report.keys), "kernel")
    print(f"exported {kernels} (NVRTC {report.nvrtc_version}) to {report.path}")
    return 0


def _cache_import(args: argparse.Namespace) -> int:
    from .bundle import import_bundle

    _open_disk()
    report = import_bundle(args.bundle, any_nvrtc=args.any_nvrtc or None)
    new = len(report.keys) - report.already
    print(f"imported {counted(len(report.keys), 'kernel')} (NVRTC {report.nvrtc_version}) from "
          f"{report.path}: {new} new, {report.already} already in the cache")  # fmt: skip
    if report.other_nvrtc:
        print(f"built by another NVRTC: {len(report.keys) - report.unchecked} loaded on this "
              f"machine's GPU, {report.unchecked} unchecked (no GPU here runs them: each is "
              "loaded once at its first use)")  # fmt: skip
    return 0


def _int_in(low: int, high: int, what: str) -> Callable[[str], int]:
    """An argparse ``type``: an int from ``low`` to ``high`` written in ASCII digits (an
    optional leading ``-``), else an error saying ``what``. ``int()`` alone would also take
    other scripts' decimal digits (Arabic-Indic, fullwidth...), ``+``, blanks and ``_``."""

    def parse(text: str) -> int:
        digits = text.removeprefix("-")
        try:
            value = int(text) if digits.isascii() and digits.isdigit() else low - 1
        except ValueError:  # more digits than int() converts (sys.set_int_max_str_digits)
            value = low - 1
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text}")
        return value

    return parse


# --tokens: at most 65536 rows (the demo checks them on the host in float64: 7.5 GB at the
# MLP's 14336); --workers at most 1024 processes (config.MAX_WORKERS, as
# NVRTC_ENGINE_WORKERS); --seed as numpy's generators take it.
_tokens = _int_in(1, 65536, "a positive integer up to 65536")
_positive_int = _int_in(1, MAX_WORKERS, f"a positive integer up to {MAX_WORKERS}")
_seed = _int_in(0, 2**63 - 1, "an integer >= 0 (numpy's seeds are not negative)")


_COMMANDS = ("demo", "prewarm", "cache")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser. With ``command`` (``demo``, ``prewarm`` or ``cache``) only
    that command's options are declared, the others' names and help only: what a run parses
    and prints is the same, and it declares no option it cannot be given."""
    full = {name: command in (None, name) for name in _COMMANDS}
    parser = argparse.ArgumentParser(
        prog="nvrtc-engine",
        description="Run-time specialized CUDA kernels, compiled with NVRTC and cached on disk.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="compile, cache, and (with a GPU) run and check kernels")
    if full["demo"]:
        _demo_options(demo)
    pre = sub.add_parser(
        "prewarm",
        help="compile (in parallel) and cache every variant of one or more variant files",
        # FILE is required; argparse would show it as optional (nargs="*" lets it follow --arch)
        usage="%(prog)s [-h] FILE [FILE ...] [--arch ARCH [ARCH ...]] [--workers WORKERS]"
        " [--no-progress] [--json] [--remote]",
    )
    if full["prewarm"]:
        _prewarm_options(pre)
    cache = sub.add_parser("cache", help="inspect, verify, clear, export or import the cache")
    if full["cache"]:
        _cache_actions(cache)
    return parser


def _demo_options(demo: argparse.ArgumentParser) -> None:
    demo.add_argument("--arch", help="compile target, e.g. sm_90 (default: this GPU's, or sm_90)")
    demo.add_argument("--tokens", type=_tokens, default=2048,
                      help="rows of the test input, checked against a float64 reference on "
                      "the host (2048)")  # fmt: skip
    demo.add_argument("--no-run", action="store_true", help="compile and cache only")
    demo.add_argument("--seed", type=_seed, default=0, help="random seed for the inputs (0)")
    demo.set_defaults(func=_cmd_demo, parser=demo)


def _prewarm_options(pre: argparse.ArgumentParser) -> None:
    pre.add_argument("files", nargs="*", metavar="FILE",
                     help="TOML or JSON variant files (see docs/variants.md)")  # fmt: skip
    pre.add_argument(
        "--arch",
        nargs="+",
        action="extend",
        help="compile for these archs (e.g. sm_90 sm_100a), replacing the file's; "
        "default: the files', else this GPU's",
    )
    pre.add_argument("--workers", type=_positive_int, help="compile threads (default: usable CPUs)")
    pre.add_argument("--no-progress", action="store_true", help="no progress bar")
    pre.add_argument("--json", action="store_true", help="machine-readable report")
    pre.add_argument("--remote", action="store_true",
                     help="write every kernel to the remote cache (NVRTC_ENGINE_REMOTE_CACHE), "
                     "compiled or read here")  # fmt: skip
    pre.set_defaults(func=_cmd_prewarm, parser=pre)


def _cache_actions(cache: argparse.ArgumentParser) -> None:
    actions = cache.add_subparsers(dest="action", required=True)
    for name, func, text in (
        ("info", _cache_info, "directory, entries, bytes, size limit, remote cache"),
        ("list", _cache_list, "one line per entry: key, arch, size, compile time"),
        ("verify", _cache_verify, "check every entry; remove bad ones (exit 1 if any)"),
        ("clear", _cache_clear, "remove every entry"),
        ("export", _cache_export, "write every valid entry to one bundle file"),
        ("import", _cache_import, "verify a bundle, then add its entries to the cache"),
    ):
        action = actions.add_parser(name, help=text)
        if name in ("export", "import"):
            action.add_argument("bundle", help="bundle file (zip)")
        if name == "export":
            action.add_argument("--force", action="store_true",
                                help="replace the bundle file if it exists")  # fmt: skip
        if name == "import":
            action.add_argument("--any-nvrtc", action="store_true",
                                help="take a bundle built by another NVRTC version (each "
                                "kernel loaded once on this machine's GPU, where there is "
                                "one)")  # fmt: skip
        if name in ("info", "list"):
            action.add_argument("--json", action="store_true", help="machine-readable output")
        action.set_defaults(func=func, parser=action)


def _one_line_warning(message: Warning | str, category: type[Warning], *_: object) -> str:
    """Warnings on the command line as one line each, without Python's source excerpt, and
    with one prefix: the library's own ``nvrtc_engine: `` (for Python callers) is dropped."""
    text = str(message).removeprefix("nvrtc_engine: ")
    return f"nvrtc-engine: warning: {text}\n"


def _cli_syntax(message: str) -> str:
    """An error message with the library's Python-syntax hints put in command-line syntax."""
    from ..core.make import NO_GPU_HINT

    cli_hint = "pass --arch sm_90 (or another arch) to compile without a GPU"
    return message.replace(NO_GPU_HINT, cli_hint)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``nvrtc-engine`` console script; returns the exit code. Without
    ``argv`` (the program itself, which exits next) the garbage collector is off while the
    command runs and the objects left are frozen (``gc.freeze``) at the end: what the
    command creates is nearly all modules, kept to the end, which each collection (during
    the imports, and the interpreter's last one) would walk for nothing."""
    import gc

    from ..core.errors import NvrtcEngineError

    if argv is None:
        gc.disable()
    given = sys.argv[1:] if argv is None else argv
    command = given[0] if given and given[0] in _COMMANDS else None
    args = build_parser(command).parse_args(argv)
    formatwarning, warnings.formatwarning = warnings.formatwarning, _one_line_warning
    try:
        return int(args.func(args))
    except BrokenPipeError:  # output piped into a reader that stopped (``| head``)
        # stdout is gone: point it at /dev/null so the interpreter's final flush is quiet
        with contextlib.suppress(OSError, ValueError):  # (no file descriptor: nothing to do)
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except _UsageError as exc:  # as argparse words its own: usage, then "PROG: error: ..."
        args.parser.print_usage(sys.stderr)
        print(f"{args.parser.prog}: error: {exc}", file=sys.stderr)
        return 2
    except (NvrtcEngineError, ValueError, OSError) as exc:
        # (the command's name, as argparse's errors and the usage errors above have it)
        print(f"{args.parser.prog}: error: {_cli_syntax(str(exc))}", file=sys.stderr)
        return 2
    finally:
        warnings.formatwarning = formatwarning
        if argv is None:
            gc.freeze()
            gc.enable()


if __name__ == "__main__":
    sys.exit(main())
