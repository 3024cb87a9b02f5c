"""The build-time fan-out this project replaces, measured beside on-demand compilation.

    python bench/fanout.py [--arch sm_90] [--ops gelu,dgelu]

A build-time library must instantiate every variant of a family: here every registered op
of ``--ops`` x input dtype x output dtype (with its scaling) x a TransformerEngine-style list
of hidden sizes (plus the general kernel). This script renders that cross product and
  1. compiles it all with ``nvcc`` as one translation unit (how a library's .cu file is built),
  2. compiles it with NVRTC variant by variant (no cache),
  3. compiles only the variants of one real model config (a GPT-style GELU MLP block:
     GPT-3 175B, hidden 12288, FFN 49152, bf16 activations, FP8 E4M3 forward output with
     tensor scaling, bf16 backward),
and reports variants, nvcc wall seconds, total NVRTC seconds, seconds for the model's
variants, cubin bytes for all vs the model's set, and the size of this project's wheel; then
TransformerEngine's own build time (TE issue 3054) beside the cold prewarm of a whole model's
variant list that bench/prewarm.py measured (its result on the host with the most CPUs).
Writes bench/results/fanout.json. CPU only.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common

ROOT = Path(__file__).resolve().parent.parent
# The hidden sizes TransformerEngine's normalization kernels are instantiated for.
TE_HIDDEN_SIZES = [768, 1024, 1536, 2048, 2304, 3072, 3840, 4096, 5120, 6144, 8192, 10240,
                   12288, 12800, 15360, 16384, 18432, 20480, 24576, 25600, 30720, 32768,
                   40960, 49152, 65536]  # fmt: skip
IN = ["fp32", "fp16", "bf16"]
# TransformerEngine's build (its C++/CUDA library), wall time on 32 cores by target arch, as
# reported in TransformerEngine issue 3054.
TE_BUILD_S = {"sm_89": 110.9, "sm_100a": 323.7}
TE_BUILD_CORES = 32
OUT = ["fp32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2"]


def find_nvcc() -> str:
    for candidate in (shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if candidate and Path(candidate).exists():
            return candidate
    raise SystemExit("nvcc not found: install the CUDA toolkit or put nvcc on PATH")


def fanout_keys(ops: list[str], arch: str) -> list:
    import nvrtc_engine as ne

    keys = []
    for op, i, o, h in itertools.product(ops, IN, OUT, [None, *TE_HIDDEN_SIZES]):
        with contextlib.suppress(ne.VariantError):  # a combination this op does not have
            keys.append(ne.make_key(op, in_dtype=i, out_dtype=o, hidden_size=h, arch=arch))
    return keys


def model_keys(ops: list[str], arch: str) -> list:
    import nvrtc_engine as ne

    keys = []
    if "gelu" in ops:  # forward: FP8 output for the FC2 GEMM
        keys.append(ne.make_key("gelu", dtype="fp8", hidden_size=49152, arch=arch))
    if "dgelu" in ops:  # backward: bf16 gradient
        keys.append(ne.make_key("dgelu", dtype="bf16", hidden_size=49152, arch=arch))
    return keys


def beside_te() -> list[list[str]]:
    """TE's build time beside the cold prewarm of a model's list (bench/prewarm.py's result for
    this checkout's code on the host with the most CPUs), as table rows; none without one."""
    runs = [(path.stem, json.loads(path.read_text()))
            for path in sorted(common.RESULTS.glob("prewarm-*.json"))]  # fmt: skip
    runs = [(n, d) for n, d in runs if d.get("code") == "this checkout" and "cold" in d]
    if not runs:
        return []
    name, d = max(runs, key=lambda r: r[1]["available_cpus"])
    te = " to ".join(f"{s:.1f} s ({arch})" for arch, s in TE_BUILD_S.items())
    return [[f"TransformerEngine's build, wall time on {TE_BUILD_CORES} cores (TE issue 3054)", te],
            [f"cold prewarm of `{d['list']}` ({d['variants']} variants), {d['available_cpus']} "
             f"CPUs (`bench/results/{name}.json`)", f"{d['cold']['prewarm_s']:.2f} s "
             f"({d['cold']['command_s']:.2f} s with Python's start)"]]  # fmt: skip


def one_translation_unit(sources: list[str]) -> str:
    """Concatenate rendered sources: includes hoisted, each variant in its own namespace."""
    head: list[str] = []
    body: list[str] = []
    for i, src in enumerate(sources):
        lines = []
        for line in src.splitlines():
            if line.startswith(("#include", "#define NVE_SOFT_FP8")):
                if line not in head:
                    head.append(line)
            else:
                lines.append(line)
        body.append(f"namespace v{i} {{\n" + "\n".join(lines) + f"\n}}  // namespace v{i}\n")
    return "\n".join(head) + "\n" + "\n".join(body)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("--ops", default="gelu,dgelu")
    args = parser.parse_args()
    os.environ["NVRTC_ENGINE_DISABLE_DISK_CACHE"] = "1"
    import nvrtc_engine as ne
    from nvrtc_engine.core.nvrtc import CompileOptions, compile_source, find_cuda_include_dir
    from nvrtc_engine.core.render import render, templates_dir

    ops = [op for op in args.ops.split(",") if op in ne.registered_ops()]
    keys = fanout_keys(ops, args.arch)
    model = model_keys(ops, args.arch)
    rendered = [render(k) for k in keys]
    nvcc = find_nvcc()
    version = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    nvcc_version = re.findall(r"release ([\d.]+)", version)[-1]
    with tempfile.TemporaryDirectory() as tmp:
        tu = Path(tmp) / "all_variants.cu"
        tu.write_text(one_translation_unit([r.source for r in rendered]))
        cmd = [nvcc, "-cubin", f"-arch={args.arch}", "-std=c++17",
               f"-I{templates_dir() / 'include'}", f"-I{find_cuda_include_dir().path}",
               str(tu), "-o", str(Path(tmp) / "all.cubin")]  # fmt: skip
        start = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True)
        nvcc_s = time.perf_counter() - start
        if done.returncode != 0:
            print(done.stderr[-3000:])
            raise SystemExit("nvcc failed")
        nvcc_bytes = (Path(tmp) / "all.cubin").stat().st_size
    nvrtc_s = 0.0
    nvrtc_bytes = 0
    compile_source(
        "warmup.cu", 'extern "C" __global__ void k() {}', (), CompileOptions(arch=args.arch)
    )  # NVRTC initialization, not counted
    by_key = {}
    for k, r in zip(keys, rendered, strict=True):
        res = compile_source(r.name, r.source, r.headers, CompileOptions(arch=args.arch),
                             cuda_headers=r.cuda_headers)  # fmt: skip
        nvrtc_s += res.seconds
        nvrtc_bytes += len(res.image)
        by_key[k] = res
    model_s = sum(by_key[k].seconds for k in model)
    model_bytes = sum(len(by_key[k].image) for k in model)
    wheel_dir = Path(tempfile.mkdtemp())
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(wheel_dir),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
    wheel = next(wheel_dir.glob("*.whl"))
    result = {
        "arch": args.arch, "ops": ops, "variants": len(keys), "hidden_sizes": TE_HIDDEN_SIZES,
        "nvcc_version": nvcc_version, "nvcc_wall_s": nvcc_s, "nvcc_cubin_bytes": nvcc_bytes,
        "nvrtc_version": ne.core.nvrtc.nvrtc_version(), "nvrtc_total_s": nvrtc_s,
        "nvrtc_cubin_bytes": nvrtc_bytes, "model": [str(k) for k in model],
        "model_nvrtc_s": model_s, "model_cubin_bytes": model_bytes,
        "model_pct_of_nvcc": 100.0 * model_s / nvcc_s, "wheel": wheel.name,
        "wheel_bytes": wheel.stat().st_size, "te_build_s": TE_BUILD_S,
        "te_build_cores": TE_BUILD_CORES, "beside_te": beside_te(),
    }  # fmt: skip
    shutil.rmtree(wheel_dir, ignore_errors=True)
    path = common.write_results("fanout", result)
    rows = [
        {"what": f"variants ({'+'.join(ops)} x {len(IN)} in x {len(OUT)} out x "
                 f"{len(TE_HIDDEN_SIZES) + 1} hidden sizes, {args.arch})", "value": len(keys)},
        {"what": f"nvcc {nvcc_version}, one translation unit, wall s", "value": round(nvcc_s, 1)},
        {"what": "nvcc cubin bytes", "value": nvcc_bytes},
        {"what": "NVRTC, variant by variant, total s", "value": round(nvrtc_s, 1)},
        {"what": "NVRTC cubin bytes, all variants", "value": nvrtc_bytes},
        {"what": f"model's variants ({len(model)}), NVRTC s", "value": round(model_s, 3)},
        {"what": "model's variants, cubin bytes", "value": model_bytes},
        {"what": "model's compile time, % of nvcc fan-out", "value": round(
            result["model_pct_of_nvcc"], 3)},
        {"what": "this project's wheel, bytes", "value": result["wheel_bytes"]},
        *({"what": what, "value": value} for what, value in result["beside_te"]),
    ]  # fmt: skip
    print(common.table(rows, [("what", "measure", ""), ("value", "value", "")]))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
