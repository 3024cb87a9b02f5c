"""The ``nvrtc-engine`` command line (argparse)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

__all__ = ["main"]


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo(args.arch, args.tokens, not args.no_run, sys.stdout, seed=args.seed)


def _cmd_cache(args: argparse.Namespace) -> int:
    from .api import cache_info, clear_cache

    if args.action == "clear":
        info = cache_info()
        clear_cache()
        print(f"cleared {info.entries} entries ({info.bytes} bytes) from {info.directory}")
        return 0
    info = cache_info()
    if args.json:
        print(json.dumps(info.__dict__, indent=2))
    else:
        print(f"directory: {info.directory or '(disk cache disabled or unusable)'}")
        print(f"entries:   {info.entries}")
        print(f"bytes:     {info.bytes}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nvrtc-engine",
        description="Run-time specialized CUDA kernels, compiled with NVRTC and cached on disk.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="compile, cache, and (with a GPU) run and check kernels")
    demo.add_argument("--arch", help="compile target, e.g. sm_90 (default: this GPU's, or sm_90)")
    demo.add_argument("--tokens", type=int, default=8192, help="rows of the test input (8192)")
    demo.add_argument("--no-run", action="store_true", help="compile and cache only")
    demo.add_argument("--seed", type=int, default=0, help="random seed for the inputs")
    demo.set_defaults(func=_cmd_demo)

    cache = sub.add_parser("cache", help="inspect or clear the disk cache")
    cache.add_argument("action", choices=["info", "clear"])
    cache.add_argument("--json", action="store_true", help="machine-readable output")
    cache.set_defaults(func=_cmd_cache)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``nvrtc-engine`` console script; returns the exit code."""
    from .errors import NvrtcEngineError

    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except (NvrtcEngineError, ValueError) as exc:
        print(f"nvrtc-engine: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
