"""The FP8 norm forwards beside a kernel that only moves their bytes: how much of the copy
bandwidth a bf16 -> FP8 pass can reach at the issue's shapes.

    python bench/norm_vs_cast.py [--shapes 16384x4096,16384x8192] [--rounds 20]
                                 [--name norm_vs_cast]

Needs PyTorch with a GPU (``pip install -e '.[test,torch]'``). At each N x H shape, in
paired rounds (common.paired_ms: every round times every function once, in a shuffled
order; each call on its own buffers, norm_bandwidth.Cycle), it times:

- the LayerNorm and RMSNorm forwards, bf16 x -> E4M3 z with tensor scaling (the specialized
  kernels, as bench/norm_bandwidth.py runs them);
- nvrtc_engine's ``cast`` of the same x to E4M3 with tensor scaling (amax and scale_inv):
  x read and z written, the forwards' traffic less the weights (2H or 4H bytes) and mu and
  rsigma (4 or 8 bytes a row), with no row statistics;
- a device copy (torch ``copy_``) of the LayerNorm forward's bytes, and the 1 GiB reference
  copy (common.CopyReference).

Per function: its % of the 1 GiB copy's bandwidth in the same rounds
(common.paired_pct_of_copy; bytes as bench/norm_bandwidth.py counts them: x, z and the
weights); per norm, the cast's time over the norm's in the same round (above 1: the norm is
faster). Reading: the cast is what an FP8 forward's traffic costs at that shape with nothing
else to do, so a norm's distance from it is what its statistics cost. Writes
bench/results/NAME.json (and $OUT/NAME.json when set).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common
from norm_bandwidth import Cycle, forward_rows, forward_weights, kernel_forward, same_bytes_copy


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """``16384x4096,16384x8192`` -> [(16384, 4096), (16384, 8192)]; ValueError otherwise."""
    shapes = []
    for item in text.split(","):
        n, sep, h = item.strip().partition("x")
        if not (sep and n.isdigit() and h.isdigit() and int(n) > 0 and int(h) > 0):
            raise ValueError(f"not NxH: {item!r}")
        shapes.append((int(n), int(h)))
    return shapes


def time_shape(n: int, h: int, rounds: int) -> list[dict[str, Any]]:
    """The rows of one shape: each function's milliseconds per round and its figures."""
    import torch

    import nvrtc_engine as ne

    elem = n * h
    x_z = 2 * elem + elem  # bf16 x read, E4M3 z written
    nbytes = {"layernorm": x_z + 2 * h * 2, "rmsnorm": x_z + h * 2, "cast": x_z}
    keep: list[Any] = []
    fns: dict[str, Any] = {}
    symbols: dict[str, str] = {}
    for norm in ("layernorm", "rmsnorm"):
        k = ne.get_kernel(f"{norm}_fwd", in_dtype="bf16", out_dtype="fp8", hidden_size=h)
        w, b, fp8 = forward_weights(h, True)
        cycle = Cycle(functools.partial(forward_rows, n, h, True), nbytes[norm])
        fns[norm] = kernel_forward(k, cycle, norm == "layernorm", w, b, **fp8)
        symbols[norm] = k.artifact.symbols[0]
        keep += [cycle, w, b, fp8]
    cast = ne.get_kernel("cast", dtype="fp8")
    _, _, tensor = forward_weights(h, True)
    cast_cycle = Cycle(functools.partial(forward_rows, n, h, True), nbytes["cast"])

    def run_cast() -> None:
        s = cast_cycle.next()
        cast(s["x"], s["z"], **tensor)

    fns["cast"] = run_cast
    symbols["cast"] = cast.artifact.symbols[0]
    fns["same-bytes copy"], copy_cycle = same_bytes_copy(nbytes["layernorm"])
    nbytes["same-bytes copy"] = nbytes["layernorm"]
    reference = common.CopyReference()
    fns["1 GiB copy"] = reference.call
    keep += [cast_cycle, tensor, copy_cycle]
    times = common.paired_ms(fns, rounds=rounds)
    rows = []
    for name in [*nbytes]:
        pct = common.paired_pct_of_copy(times[name], nbytes[name], times["1 GiB copy"],
                                        reference.nbytes)  # fmt: skip
        row: dict[str, Any] = {
            "shape": f"{n}x{h}", "impl": name, "kernel": symbols.get(name, ""),
            "bytes": nbytes[name], "ms": statistics.median(times[name]),
            "ms_rounds": times[name], "pct_of_copy": pct["median"],
            "pct_low": pct["low"], "pct_high": pct["high"], "copy_gbps": pct["copy_gbps"],
        }  # fmt: skip
        if name in ("layernorm", "rmsnorm"):
            ratio = common.paired_ratios({"cast": times["cast"], name: times[name]}, "cast")
            row["vs_cast"] = ratio[name]  # cast time / norm time, round by round
        rows.append(row)
    del keep
    torch.cuda.empty_cache()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="16384x4096,16384x8192", help="NxH,... (bf16 x)")
    parser.add_argument("--rounds", type=int, default=20, help="paired rounds (default 20)")
    parser.add_argument(
        "--name", type=common.result_name, default="norm_vs_cast", help="bench/results/NAME.json"
    )
    args = parser.parse_args()
    try:
        shapes = parse_shapes(args.shapes)
    except ValueError as exc:
        parser.error(f"--shapes {exc}")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    common.torch_or_exit(parser)

    rows = []
    for n, h in shapes:
        rows += time_shape(n, h, args.rounds)
    for r in rows:
        r["us"] = r["ms"] * 1e3
    columns = [("shape", "shape", "s"), ("impl", "impl", "s"), ("us", "us", ".1f"),
               ("pct_of_copy", "% copy", ".1f"), ("pct_low", "low", ".1f"),
               ("pct_high", "high", ".1f")]  # fmt: skip
    print(common.table(rows, columns))
    for r in rows:
        if "vs_cast" in r:
            v = r["vs_cast"]
            print(f"{r['shape']} {r['impl']}: {v['median']:.3f}x the cast's speed "
                  f"(faster in {v['faster']:.0%} of rounds)")  # fmt: skip
    payload = {"benchmark": args.name, **common.host_info(), **common.gpu_info(),
               "command": " ".join(["bench/norm_vs_cast.py", *sys.argv[1:]]),
               "rounds": args.rounds, "rows": rows}  # fmt: skip
    path = common.write_results(args.name, payload)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
