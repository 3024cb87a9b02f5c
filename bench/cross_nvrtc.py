"""Kernels built by one NVRTC, run under another: a bundle made on a CPU-only build machine,
imported and launched on a GPU host with another NVRTC version and 0 compiles.

    python bench/cross_nvrtc.py --make BUNDLE    # build machine (no GPU): prewarm, export
    python bench/cross_nvrtc.py --check BUNDLE   # GPU host: import with --any-nvrtc, launch

``--make`` prewarms, in a temporary cache, the demo's GELU variants for sm_90 (bf16 and
tensor-scaled E4M3 output at Llama-3-8B's hidden sizes, which ``nvrtc-engine demo`` checks
against a float64 reference) and the sm_90 variants of docs/examples/llama3_8b_fp8_mlp.toml,
and exports them to BUNDLE. ``--check`` then, in fresh temporary caches: (1) imports BUNDLE
with ``any_nvrtc`` (each kernel loaded once on the GPU: ``unchecked`` must be 0), loads every
kernel on device 0 and runs the demo's variants against the reference; (2) serves BUNDLE as a
read-only cache with ``NVRTC_ENGINE_ANY_NVRTC`` and loads every kernel again. It prints one
JSON line (and writes cross_nvrtc.json under ``$OUT`` where set) and exits 0 when every kernel
loaded, every check passed and NVRTC compiled nothing. Both sides need the same nvrtc_engine
commit and Jinja2 version (they enter the digest, printed as ``code``).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import nvrtc_engine as ne  # noqa: E402
from nvrtc_engine.core import config  # noqa: E402
from nvrtc_engine.core.nvrtc import nvrtc_version  # noqa: E402
from nvrtc_engine.core.render import code_fingerprint  # noqa: E402
from nvrtc_engine.tools.bundle import export_bundle, import_bundle  # noqa: E402
from nvrtc_engine.tools.demo import demo_keys, run_demo  # noqa: E402
from nvrtc_engine.tools.variants import load_variants  # noqa: E402

ARCH = "sm_90"
MODEL = ROOT / "docs" / "examples" / "llama3_8b_fp8_mlp.toml"


def keys() -> list[ne.KernelKey]:
    model = [k for k in load_variants(MODEL) if k.arch == ARCH]
    return [*demo_keys(ARCH), *model]


def _fresh_cache(**settings: object) -> None:
    config.configure(cache_dir=Path(tempfile.mkdtemp(prefix="nvrtc-engine-cross-")), **settings)
    ne.clear_cache(disk=False)


def make(bundle: Path) -> int:
    from nvrtc_engine.tools.prewarm import prewarm

    _fresh_cache()
    report = prewarm(keys(), progress=False)
    if not report.ok:
        print(report.summary(), file=sys.stderr)
        return 1
    exported = export_bundle(bundle, overwrite=True)
    print(
        json.dumps(
            {
                "bundle": str(bundle),
                "kernels": len(exported.keys),
                "nvrtc": exported.nvrtc_version,
                "code": code_fingerprint()[:16],
            }
        )
    )
    return 0


def _load_all(phase: str) -> dict:
    """get_kernel for every key, each loaded on device 0; counts for ``phase``."""
    origins, failed = {}, []
    for key in keys():
        try:
            kernel = ne.get_kernel(key)
            kernel.loaded(0)  # cuModuleLoadData on the GPU
            origins[kernel.origin] = origins.get(kernel.origin, 0) + 1
        except Exception as exc:
            failed.append(f"{key}: {type(exc).__name__}: {exc}")
    info = ne.cache_info()
    return {"phase": phase, "origins": origins, "failed": failed, "compiles": info.compiles}


def check(bundle: Path) -> int:
    from nvrtc_engine.core import driver

    if driver.device_count() == 0:
        raise SystemExit("--check needs a GPU")
    import common  # (bench/common.py: where, when and on which GPU)

    result: dict = {"benchmark": "cross_nvrtc", **common.host_info(), **common.gpu_info(),
                    "bundle": str(bundle), "nvrtc_here": nvrtc_version(),
                    "code": code_fingerprint()[:16]}  # fmt: skip
    _fresh_cache()
    try:
        report = import_bundle(bundle, any_nvrtc=True)
    except ne.BundleError as exc:
        hint = (" (the digests differ: this host's nvrtc_engine commit or Jinja2 version is not "
                "the build machine's; compare 'code' with --make's)")  # fmt: skip
        print(json.dumps({**result, "error": str(exc) + hint * ("digest" in str(exc))}))
        return 1
    result.update(nvrtc_bundle=report.nvrtc_version, crossed=report.other_nvrtc,
                  imported=len(report.keys), unchecked=report.unchecked)  # fmt: skip
    phases = [_load_all("imported")]
    demo = io.StringIO()
    result["demo_rc"] = run_demo(ARCH, 2048, True, demo)
    result["demo"] = demo.getvalue().splitlines()
    phases[0]["compiles"] = ne.cache_info().compiles  # (the demo's get_kernel calls included)
    _fresh_cache(readonly_cache=[bundle], any_nvrtc=True)
    phases.append(_load_all("read-only cache"))
    result["phases"] = phases
    ok = (result["demo_rc"] == 0 and report.unchecked == 0
          and all(not p["failed"] and p["compiles"] == 0 for p in phases))  # fmt: skip
    result["ok"] = ok
    text = json.dumps(result)
    print("\n".join(result["demo"]))
    print(text)
    if os.environ.get("OUT"):
        (Path(os.environ["OUT"]) / "cross_nvrtc.json").write_text(text + "\n")
    return 0 if ok else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--make", type=Path, metavar="BUNDLE", help="prewarm and export (no GPU)")
    mode.add_argument("--check", type=Path, metavar="BUNDLE", help="import, load and run (GPU)")
    args = parser.parse_args()
    return make(args.make) if args.make else check(args.check)


if __name__ == "__main__":
    sys.exit(main())
