"""The norm kernels do not change: for each recorded norm key, the normalised SASS of every
kernel function (cuobjdump, symbol names and comments left out), its resource usage and the
launch geometry the host code computes (threads per CTA, CTAs per cluster, dynamic shared
memory, grids for a few row counts on two made-up devices) equal tests/data/norm_sass.json.

The keys: every op x input dtype x output mode x hidden size (None, 768, 1000, 1001, 1024,
2048, 4096, 5120, 8192, 14336, 65536; fewer on sm_80/sm_89) x arch (sm_80, sm_89, sm_90,
sm_100a), every tuned entry with bf16 and fp16 x and both FP8 outputs, and the flags. Marked
``matrix`` (about 1,300 compiles); skipped without NVRTC 13.5, cuobjdump or nvdisasm (``pip
install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm``; $CUOBJDUMP and $NVDISASM name others).

Regenerate (after a deliberate change of generated code, and say why in the commit):
``python tests/test_norm_sass.py --write [--jobs N]``; ``--check`` compares without pytest.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

DATA = Path(__file__).resolve().parent / "data" / "norm_sass.json"
NVRTC = (13, 5)
ARCHS = ("sm_80", "sm_89", "sm_90", "sm_100a")
HIDDEN = (None, 768, 1000, 1001, 1024, 2048, 4096, 5120, 8192, 14336, 65536)
HIDDEN_SM8X = (None, 1000, 1001, 4096, 14336, 65536)
TUNED_HIDDEN = (4096, 8192, 14336, 65536)
FWD = ("layernorm_fwd", "rmsnorm_fwd")
BWD = ("layernorm_bwd", "rmsnorm_bwd", "rmsnorm_bwd_add")
ROWS = (1, 7, 1000, 16384, 1 << 20)
# made-up devices for the grid arithmetic: (SMs, CTAs per SM of every function, clusters)
DEVICES = ((132, 2, 0), (132, 5, 16))


def key_fields() -> list[dict[str, Any]]:
    """get_kernel's fields of every recorded key, each once."""
    out: list[dict[str, Any]] = []
    for arch in ARCHS:
        sizes = HIDDEN if arch in ("sm_90", "sm_100a") else HIDDEN_SM8X
        for hidden in sizes:
            for dt in ("fp32", "fp16", "bf16"):
                for op in FWD:
                    modes = [(dt, "none"), ("fp8_e4m3", "tensor"), ("fp8_e4m3", "mxfp8")]
                    if arch == "sm_90":
                        modes.append(("fp8_e5m2", "tensor"))
                    for out_dtype, scaling in modes:
                        out.append(dict(op=op, in_dtype=dt, out_dtype=out_dtype, scaling=scaling,
                                        hidden_size=hidden, arch=arch))  # fmt: skip
                for op in BWD:
                    out.append(dict(op=op, in_dtype=dt, out_dtype=dt, scaling="none",
                                    hidden_size=hidden, arch=arch))  # fmt: skip
    # the tuned sizes on sm_90 with 16-bit x: both FP8 outputs, zero-centred and fp32 gamma
    for hidden in TUNED_HIDDEN:
        for dt in ("bf16", "fp16"):
            for op in FWD + BWD:
                modes = [(dt, "none")]
                if op in FWD:
                    modes += [("fp8_e4m3", "tensor"), ("fp8_e5m2", "tensor"), ("fp8_e4m3", "mxfp8")]
                for out_dtype, scaling in modes:
                    for flags in ({}, {"zero_centered_gamma": True}, {"fp32_gamma": True}):
                        out.append(dict(op=op, in_dtype=dt, out_dtype=out_dtype,
                                        scaling=scaling, hidden_size=hidden, arch="sm_90",
                                        **flags))  # fmt: skip
    # the flags on the rules' layouts
    for arch in ("sm_80", "sm_90", "sm_100a"):
        for hidden in (None, 1024, 5120):
            for op in FWD + BWD:
                for flags in ({"zero_centered_gamma": True}, {"fp32_gamma": True},
                              {"zero_centered_gamma": True, "fp32_gamma": True}):  # fmt: skip
                    out.append(dict(op=op, in_dtype="bf16", out_dtype="bf16", scaling="none",
                                    hidden_size=hidden, arch=arch, **flags))  # fmt: skip
    seen: set[str] = set()
    unique = []
    for fields in out:
        name = str(_key(fields))
        if name not in seen:
            seen.add(name)
            unique.append(fields)
    return unique


def _key(fields: dict[str, Any]) -> Any:
    from nvrtc_engine import make_key

    f = dict(fields)
    return make_key(f.pop("op"), **f)


def _tool(name: str) -> str | None:
    """``name`` ($NAME in capitals, the nvidia-cuda-NAME wheel's, or one on PATH)."""
    if os.environ.get(name.upper()):
        return os.environ[name.upper()]
    try:
        import nvidia

        for base in nvidia.__path__:
            for found in Path(base).glob(f"*/bin/{name}"):
                return str(found)
    except ImportError:
        pass
    return shutil.which(name)


def cuobjdump() -> str | None:
    """A cuobjdump whose ``-sass`` works: it runs the nvdisasm found beside it or on PATH."""
    tool, disasm = _tool("cuobjdump"), _tool("nvdisasm")
    if tool is None or disasm is None:
        return None
    os.environ["PATH"] = os.pathsep.join([str(Path(disasm).parent), os.environ.get("PATH", "")])
    return tool


def nvrtc_version() -> tuple[int, int]:
    from cuda.bindings import nvrtc

    _, major, minor = nvrtc.nvrtcVersion()
    return int(major), int(minor)


_COMMENT = re.compile(r"/\*.*?\*/")


def _sass_by_function(tool: str, cubin: bytes, symbols: tuple[str, ...]) -> dict[str, Any]:
    """Per function (named by its role: main, stats, finalize): the digest of its SASS with
    addresses, encodings and its name left out, and its resource usage."""
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    try:
        sass = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True, check=True)
        res = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True,
                             check=True)  # fmt: skip
    finally:
        os.unlink(f.name)
    stem = symbols[0]

    def role(name: str) -> str:
        return "main" if name == stem else name.removeprefix(stem + "_")

    text: dict[str, list[str]] = {}
    current = None
    for line in sass.stdout.splitlines():
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            current = role(m.group(1))
            text[current] = []
            continue
        if current is None:
            continue
        line = _COMMENT.sub("", line).strip()
        if line:
            text[current].append(" ".join(line.replace(stem, "<stem>").split()))
    usage: dict[str, str] = {}
    for m in re.finditer(r"Function (\S+):\n\s*(.*)", res.stdout):
        fields = dict(kv.split(":", 1) for kv in m.group(2).split())
        usage[role(m.group(1))] = " ".join(f"{k}:{fields[k]}" for k in
                                           ("REG", "STACK", "SHARED", "LOCAL"))  # fmt: skip
    return {
        r: {"sass": hashlib.sha256("\n".join(lines).encode()).hexdigest()[:20], "res": usage[r]}
        for r, lines in sorted(text.items())
    }


def geometry(kernel: Any) -> dict[str, Any]:
    """What the host code computes for launches: threads per CTA of each function, CTAs per
    cluster, dynamic shared memory, and per made-up device and row count the forward's grid
    or the backward's plan (partial sums, row-sum grid, threads per row, rows per chunk,
    workspace)."""
    from nvrtc_engine.families.norm.kernels import _Device

    key = kernel.key
    threads = kernel._function_threads()
    out: dict[str, Any] = {
        "threads": list(threads),
        "cluster": kernel.config.cluster,
        "shared": list(kernel._shared_bytes()),
    }
    grids = []
    for hidden in [key.hidden_size] if key.hidden_size else [1000, 4096]:
        for sms, occ, clusters in DEVICES:
            dev = _Device(sms, (occ,) * len(threads), clusters if kernel.config.cluster > 1 else 0)
            for rows in ROWS:
                if key.spec.backward:
                    p = kernel._plan(dev, rows, hidden)
                    grids.append([p.parts, p.stats_grid, p.tpr, p.chunk_rows, p.workspace])
                else:
                    grids.append(kernel._grid(dev, rows, hidden))
    out["grids"] = grids
    return out


def record(name: str) -> tuple[str, dict[str, Any]]:
    """One key's entry: its functions' SASS digests and resources, its geometry, the label
    of its configuration (for reading; not compared)."""
    import nvrtc_engine as ne

    tool = cuobjdump()
    assert tool is not None
    kernel = ne.get_kernel(ne.KernelKey.parse(name))
    art = kernel.artifact
    return name, {
        "label": art.symbols[0][len(name) + 1 :],
        "functions": _sass_by_function(tool, art.image, art.symbols),
        "geometry": geometry(kernel),
    }


def record_all(jobs: int) -> dict[str, Any]:
    names = [str(_key(f)) for f in key_fields()]
    with concurrent.futures.ProcessPoolExecutor(jobs) as pool:
        entries = dict(pool.map(record, names, chunksize=4))
    return {"nvrtc": ".".join(map(str, nvrtc_version())), "keys": entries}


def dump(recording: dict[str, Any]) -> str:
    """The recording as JSON, one key per line (diffs stay readable)."""
    lines = [f"  {json.dumps(name)}: {json.dumps(entry, sort_keys=True)}"
             for name, entry in sorted(recording["keys"].items())]  # fmt: skip
    head = f'{{"nvrtc": {json.dumps(recording["nvrtc"])}, "keys": {{\n'
    return head + ",\n".join(lines) + "\n}}\n"


def compare(recorded: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """Differences between two recordings (labels aside)."""
    problems = []
    for name, want in recorded["keys"].items():
        got = now["keys"].get(name)
        if got is None:
            problems.append(f"{name}: not recorded now")
            continue
        for part in ("functions", "geometry"):
            if got[part] != want[part]:
                problems.append(f"{name} ({want['label']} -> {got['label']}): {part} "
                                f"{want[part]} -> {got[part]}")  # fmt: skip
    return problems


def _skip_reason() -> str | None:
    if cuobjdump() is None:
        return (
            "no cuobjdump and nvdisasm (pip install nvidia-cuda-cuobjdump "
            "nvidia-cuda-nvdisasm, or set CUOBJDUMP and NVDISASM)"
        )
    try:
        if nvrtc_version() != NVRTC:
            return f"the recording is of NVRTC {NVRTC}, this is {nvrtc_version()}"
    except Exception as e:  # (no NVRTC at all)
        return f"no NVRTC: {e}"
    return None


@pytest.mark.matrix
def test_norm_kernels_match_the_recorded_sass():
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    recorded = json.loads(DATA.read_text())
    assert sorted(recorded["keys"]) == sorted(str(_key(f)) for f in key_fields())
    now = record_all(max(1, min(4, os.cpu_count() or 1)))
    problems = compare(recorded, now)
    assert not problems, "\n".join(problems[:20]) + f"\n({len(problems)} keys differ)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="record into " + str(DATA))
    parser.add_argument("--check", action="store_true", help="compare with the recording")
    parser.add_argument("--out", type=Path, help="record into this file instead")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    reason = _skip_reason()
    if reason:
        sys.exit(reason)
    now = record_all(args.jobs)
    problems = compare(json.loads(DATA.read_text()), now) if args.check else []
    if args.check:  # against the recording as it was before this run
        print("\n".join(problems) or f"{len(now['keys'])} keys: no difference")
    if args.write or args.out:
        target = args.out or DATA
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(dump(now))
        print(f"{len(now['keys'])} keys recorded in {target}")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
