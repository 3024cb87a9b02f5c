"""The norm kernels of this checkout against those of another copy of the package, paired in
one run on one GPU: per row of the norm table (the shapes and cases of bench/bandwidth.py
--family norm), the time of each in the same rounds and the ratio new/old. Target: no row
slower by more than 2% (median same-round ratio at most 1.02).

    python bench/norm_bandwidth.py --baseline DIR [--baseline-commit REV]
        [--norms layernorm,rmsnorm] [--shapes 16384x1024,...] [--rounds 20] [--repeat 20]
        [--out FILE] [--dry-run [--arch sm_90]] [--stub]

DIR holds the other copy's ``nvrtc_engine/`` and ``templates/`` (e.g. ``git archive 77a0600
| tar -x -C .baseline``). Each copy runs in a worker process of its own (its directory first
on ``sys.path``); the workers never time at once: in each round the two are timed one after
the other, in alternating order. Cases: bf16 x, N x H in {16384 x 1024, 4096, 8192, 14336;
2048 x 65536}; forward to bf16, to E4M3 with tensor scaling and to MXFP8 (E4M3 data, E8M0
scales), backward; the specialized kernels (hidden_size=H). Each timed call touches its own
buffers, cycling over enough copies that a cycle moves at least 256 MB (nothing served from
L2). GB/s counts x read and z written (and gamma, beta) forward, x and dz read and dx
written backward.
Writes bench/results/norm_bandwidth-paired.json (``--out``; and under $OUT when set).

``--dry-run`` needs no GPU: each worker compiles every case's kernel (for ``--arch``) and
reports its symbol, so the two copies and the case list are checked before a GPU is spent.
``--stub`` runs the real launch path against tests/stub_driver.py's stub libcuda and fake
torch tensors (nothing is computed; the times are the host's): a check of the whole run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common

HERE = Path(__file__).resolve()
ROOT = HERE.parents[1]
CASES = ("fwd bf16->bf16", "fwd bf16->fp8", "fwd bf16->mxfp8", "bwd")
SHAPES = ((16384, 1024), (16384, 4096), (16384, 8192), (16384, 14336), (2048, 65536))
EPS = 1e-5
MIN_CYCLE_BYTES = 256 << 20
TARGET = 1.02
RESULT = HERE.parent / "results" / "norm_bandwidth-paired.json"


# ---- worker: one copy of the package ---------------------------------------------------


class Worker:
    """The cases of one package copy: kernels, buffers and timed calls (torch on a GPU, or
    the stub driver with fake tensors)."""

    def __init__(self, stub: bool, arch: str | None) -> None:
        self.stub, self.arch = stub, arch
        if stub:
            sys.path.insert(0, str(ROOT / "tests"))
            import fake_torch
            import stub_driver

            stub_driver.load()
            sys.modules["torch"] = fake_torch.module()
        import nvrtc_engine

        self.ne = nvrtc_engine
        self.case: dict[str, Any] | None = None

    def hello(self) -> dict[str, Any]:
        device = "stub" if self.stub else self.arch and f"none (compiled for {self.arch})"
        if not device:
            import torch

            device = torch.cuda.get_device_name()
        return {"package": str(Path(self.ne.__file__).resolve().parent),
                "version": getattr(self.ne, "__version__", ""), "device": device}  # fmt: skip

    def kernel(self, norm: str, case: str, h: int) -> Any:
        fields: dict[str, Any] = {"in_dtype": "bf16", "hidden_size": h}
        if case != "bwd" and case != "fwd bf16->bf16":
            fields.update(out_dtype="fp8_e4m3", scaling="mxfp8" if "mxfp8" in case else "tensor")
        if self.arch:
            fields["arch"] = self.arch
        op = f"{norm}_{'bwd' if case == 'bwd' else 'fwd'}"
        return self.ne.get_kernel(op, **fields)

    def setup(self, norm: str, case: str, n: int, h: int) -> dict[str, Any]:
        k = self.kernel(norm, case, h)
        info = {"symbol": k.artifact.symbols[0], "digest": k.artifact.digest[:16]}
        if self.arch:  # dry run: compiled, nothing to launch
            return info
        import torch

        ln, bf16 = norm == "layernorm", torch.bfloat16
        fp8, mx = case == "fwd bf16->fp8", case == "fwd bf16->mxfp8"
        weights = 2 if ln else 1
        if case == "bwd":
            nbytes = 3 * n * h * 2
        else:  # (MXFP8: z and one E8M0 scale per 32 elements)
            nbytes = n * h * 2 + n * h * (1 if fp8 or mx else 2) + weights * h * 2
            nbytes += n * h // 32 if mx else 0

        def empty(*shape: int, dtype: Any = bf16) -> Any:
            return torch.empty(shape, dtype=dtype, device="cuda")

        def filled(*shape: int) -> Any:
            t = empty(*shape)
            return t if self.stub else t.normal_()

        w, b = filled(h), filled(h)
        scaling: dict[str, Any] = {}  # tensor scaling's arguments, shared by the sets
        if fp8:
            scaling = {"scale": empty(1, dtype=torch.float32),
                       "amax": empty(1, dtype=torch.float32),
                       "scale_inv": empty(1, dtype=torch.float32)}  # fmt: skip
            if not self.stub:
                scaling["scale"].fill_(2.0)
                scaling["amax"].zero_()
        if mx:
            from nvrtc_engine.families.shared.blockscale import mxfp8_scale_shape

            mx_shape = mxfp8_scale_shape(n, h, "rowwise")
        copies = max(1, -(-MIN_CYCLE_BYTES // nbytes))
        sets = []
        for _ in range(copies):
            s = {"x": filled(n, h), "mu": empty(n, dtype=torch.float32),
                 "rs": empty(n, dtype=torch.float32)}  # fmt: skip
            if case == "bwd":
                s.update(dz=filled(n, h), dx=empty(n, h))
                if not self.stub:  # mu and rsigma of a forward pass
                    s["mu"].normal_()
                    s["rs"].uniform_(0.5, 2.0)
            else:
                s["z"] = empty(n, h, dtype=torch.uint8 if fp8 or mx else bf16)
            # MXFP8: each set its own E8M0 scales, in TransformerEngine's padded layout
            s["scaling"] = {"scale_inv": empty(*mx_shape, dtype=torch.uint8)} if mx else scaling
            sets.append(s)
        dw, db = empty(h), empty(h)
        ws = None
        if case == "bwd":
            ws = empty(max(1, k.workspace_elements(n, h)), dtype=torch.float32)
        state = {"i": 0}

        def call() -> None:
            s = sets[state["i"]]
            state["i"] = (state["i"] + 1) % len(sets)
            if case == "bwd" and ln:
                k(s["dz"], s["x"], s["mu"], s["rs"], w, s["dx"], dw, db, workspace=ws)
            elif case == "bwd":
                k(s["dz"], s["x"], s["rs"], w, s["dx"], dw, workspace=ws)
            elif ln:
                k(s["x"], w, b, EPS, s["z"], s["mu"], s["rs"], **s["scaling"])
            else:
                k(s["x"], w, EPS, s["z"], s["rs"], **s["scaling"])

        for _ in range(3):  # warm: loads the module, plans the launch
            call()
        self.case = {"call": call, "bytes": nbytes, "sets": sets}
        return {**info, "bytes": nbytes, "copies": copies}

    def time(self, repeat: int) -> dict[str, Any]:
        assert self.case is not None
        call = self.case["call"]
        if self.stub:
            start = time.perf_counter()
            for _ in range(repeat):
                call()
            return {"ms": (time.perf_counter() - start) * 1e3 / repeat}
        import torch

        torch.cuda.synchronize()
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        for _ in range(repeat):
            call()
        end.record()
        end.synchronize()
        return {"ms": begin.elapsed_time(end) / repeat}

    def release(self) -> dict[str, Any]:
        self.case = None
        if not self.stub and not self.arch:
            import torch

            torch.cuda.empty_cache()
        return {}


def worker_main(stub: bool, arch: str | None) -> None:
    """Answer JSON commands on stdin, one per line, with one JSON line each on stdout."""
    out = sys.stdout
    sys.stdout = sys.stderr  # (anything else the package prints must not reach the pipe)
    worker = None
    for line in sys.stdin:
        cmd = json.loads(line)
        try:
            if worker is None:
                worker = Worker(stub, arch)
            op = cmd.pop("cmd")
            if op == "quit":
                break
            reply = getattr(worker, op)(**cmd)
        except Exception as exc:  # reported to the coordinator, which stops the run
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        out.write(json.dumps(reply) + "\n")
        out.flush()


# ---- coordinator ----------------------------------------------------------------------


class WorkerError(RuntimeError):
    """What a worker reported instead of an answer."""


class Remote:
    """A worker process for the package copy at ``root``."""

    def __init__(self, name: str, root: Path, args: argparse.Namespace) -> None:
        self.name = name
        cmd = [sys.executable, str(HERE), "--worker"]
        cmd += (["--stub"] if args.stub else []) + (["--arch", args.arch] if args.dry_run else [])
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [str(root), *filter(None, [os.environ.get("PYTHONPATH")])]))  # fmt: skip
        # its own working directory: '' on sys.path must not be a package copy
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     env=env, cwd=tempfile.gettempdir(), text=True)  # fmt: skip
        self.info = self.ask("hello")
        if Path(self.info["package"]) != (root / "nvrtc_engine").resolve():
            sys.exit(f"{name}: imported {self.info['package']}, not the copy under {root}")

    def ask(self, cmd: str, **fields: Any) -> dict[str, Any]:
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(json.dumps({"cmd": cmd, **fields}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            sys.exit(f"{self.name}: the worker ended (see its messages above)")
        reply = json.loads(line)
        if "error" in reply:
            raise WorkerError(f"{self.name}: {cmd} {fields}: {reply['error']}")
        return reply

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin
            self.proc.stdin.write('{"cmd": "quit"}\n')
            self.proc.stdin.close()
            self.proc.wait(timeout=60)


def parse_shapes(text: str) -> list[tuple[int, int]]:
    shapes = []
    for item in text.split(","):
        n, _, h = item.strip().partition("x")
        if not (n.isdigit() and h.isdigit() and int(n) > 0 and int(h) > 0):
            raise ValueError(f"--shapes: {item!r} is not NxH (e.g. 16384x4096)")
        shapes.append((int(n), int(h)))
    return shapes


def run_row(new: Remote, old: Remote, norm: str, case: str, n: int, h: int,
            args: argparse.Namespace) -> dict[str, Any]:  # fmt: skip
    row: dict[str, Any] = {"norm": norm, "case": case, "tokens": n, "hidden": h}
    pair = {"new": new, "old": old}
    for name, w in pair.items():
        info = w.ask("setup", norm=norm, case=case, n=n, h=h)
        row[f"{name}_kernel"], row[f"{name}_digest"] = info["symbol"], info["digest"]
        row["bytes"] = info.get("bytes")
    if args.dry_run:
        return row
    times: dict[str, list[float]] = {"new": [], "old": []}
    for r in range(args.rounds):
        for name in ("new", "old") if r % 2 == 0 else ("old", "new"):
            times[name].append(pair[name].ask("time", repeat=args.repeat)["ms"])
    for w in pair.values():
        w.ask("release")
    ratios = [a / b for a, b in zip(times["new"], times["old"], strict=True)]
    med = statistics.median(ratios)
    for name in pair:
        ms = statistics.median(times[name])
        row[f"{name}_ms"], row[f"{name}_gbps"] = ms, row["bytes"] / (ms * 1e-3) / 1e9
    row.update(ratio=med, ratio_low=min(ratios), ratio_high=max(ratios),
               new_faster_rounds=sum(x < 1 for x in ratios) / len(ratios))  # fmt: skip
    if not args.stub:  # (the stub's times are the host's: no target)
        row["within_target"] = med <= TARGET
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, help="directory of the other package copy")
    parser.add_argument("--baseline-commit", default="", help="its commit, for the result")
    parser.add_argument("--norms", default="layernorm,rmsnorm", help="comma-separated")
    parser.add_argument("--shapes", default=",".join(f"{n}x{h}" for n, h in SHAPES),
                        help="comma-separated NxH (default: the norm table's)")  # fmt: skip
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated, of these")
    parser.add_argument("--rounds", type=int, default=20, help="paired rounds per row")
    parser.add_argument("--repeat", type=int, default=20, help="calls timed per round")
    parser.add_argument("--out", type=Path, default=RESULT, help="the result's path")
    parser.add_argument("--dry-run", action="store_true", help="compile only, no GPU")
    parser.add_argument("--arch", default="sm_90", help="the dry run's arch")
    parser.add_argument("--stub", action="store_true", help="the stub driver: no GPU")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker_main(args.stub, args.arch if "--arch" in sys.argv else None)
        return 0
    norms = [s.strip() for s in args.norms.split(",") if s.strip()]
    cases = [s.strip() for s in args.cases.split(",") if s.strip()]
    try:
        shapes = parse_shapes(args.shapes)
    except ValueError as e:
        parser.error(str(e))
    if args.baseline is None or not (args.baseline / "nvrtc_engine").is_dir():
        parser.error("--baseline DIR: a directory holding the other copy's nvrtc_engine/")
    if bad := [x for x in norms if x not in ("layernorm", "rmsnorm")]:
        parser.error(f"--norms: unknown {bad}")
    if bad := [x for x in cases if x not in CASES]:
        parser.error(f"--cases: unknown {bad}; known: {', '.join(CASES)}")
    if args.rounds < 1 or args.repeat < 1:
        parser.error("--rounds and --repeat: at least 1")
    new = Remote("new", ROOT, args)
    old = Remote("old", args.baseline.resolve(), args)
    rows = []
    try:
        for norm in norms:
            for n, h in shapes:
                for case in cases:
                    try:
                        row = run_row(new, old, norm, case, n, h, args)
                    except WorkerError as e:
                        if not args.stub:  # on a GPU every row must run
                            sys.exit(str(e))
                        print(f"{norm:9} {case:15} {n}x{h}: not on the stub: {e}", flush=True)
                        new.ask("release")
                        old.ask("release")
                        continue
                    rows.append(row)
                    text = (f"{row['ratio']:.4f} ({row['ratio_low']:.3f}-{row['ratio_high']:.3f})"
                            if "ratio" in row else row["new_kernel"])  # fmt: skip
                    print(f"{norm:9} {case:15} {n}x{h}: {text}", flush=True)
    finally:
        new.close()
        old.close()
    result = {
        "script": "bench/norm_bandwidth.py", "argv": sys.argv[1:], "commit": common.commit(),
        "baseline_commit": args.baseline_commit, "new": new.info, "old": old.info,
        "target": f"median new/old <= {TARGET} per row",
        "mode": "dry-run" if args.dry_run else "stub" if args.stub else "gpu",
        "rows": rows,
        "all_within_target": None if args.stub or args.dry_run
        else all(r["within_target"] for r in rows),
    }  # fmt: skip
    result["device"] = new.info["device"]
    text = json.dumps(result, indent=1) + "\n"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], args.out.name).write_text(text)
    print(f"{len(rows)} rows written to {args.out}")
    if args.dry_run or args.stub:
        return 0  # (no GPU times)
    slow = [r for r in rows if not r["within_target"]]
    for r in slow:
        print(f"slower than {TARGET}: {r['norm']} {r['case']} {r['tokens']}x{r['hidden']}: "
              f"{r['ratio']:.4f}")  # fmt: skip
    return 1 if slow else 0


if __name__ == "__main__":
    sys.exit(main())
