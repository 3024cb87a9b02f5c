"""A/B of a norm forward kernel's configuration, or of its dependent-launch trigger, in paired
rounds beside torch.compile of the same op: what one field of a TUNED entry or the trigger
rule (``norm._triggers``) is worth on this GPU.

    python bench/tuning/source_ab.py [--cases rmsnorm:8192,layernorm:14336] [--out bf16,fp8]
                              [--variants base,notrigger] [--rounds 20] [--name source_ab]

Needs PyTorch with a GPU (``pip install -e '.[test,torch]'``); the arguments are checked first,
and every variant against every case's kernel rendered for sm_90 (no GPU needed). ``--cases``
lists NORM:H (NORM layernorm or rmsnorm, H the hidden size); ``--out`` bf16, fp8 (E4M3 with
tensor scaling) or both; ``--variants`` names what to compare: ``base`` (the key's kernel as
chosen: its TUNED entry or the rules), or a ``+``-joined list of

  - ``rules``: the rules' configuration, the key's TUNED entry left out;
  - ``FIELD=VALUE``: the configuration with one ``ForwardConfig`` field replaced, or with
    ``staging.FIELD=VALUE`` one ``Staging`` field (``staging=none``: the register kernel);
    VALUE an integer, ``true``/``false``, ``none`` or a word (``stats=two_pass``);
  - ``trigger`` / ``notrigger``: ``griddepcontrol.launch_dependents`` at the start of every
    CTA added to a kernel that does not have it, or taken out (an error where there is
    nothing to change).

E.g. ``--cases layernorm:8192 --out fp8 --variants base,stats=two_pass`` reruns the per-warp
statistics' entry, ``--cases layernorm:4096 --out fp8 --variants base,staging.align=16`` the
aligned stages', ``--variants base,rules`` any entry against the configuration it replaced.

Each variant compiles on an engine without a disk cache (the key does not see the variant).
Every round times each variant and torch.compile once, in a shuffled order
(common.paired_ms), each call on its own buffers (at least 256 MB per cycle, so nothing is
served from L2); ``vs_base`` and ``vs_compile`` are same-round ratios (above 1: faster);
``same_results`` whether one call of the variant gives the first variant's z bytes, rsigma,
amax and mu bit for bit. bf16 x, N = 16384 rows (2048 at H = 65536). Writes NAME.json
(common.write_results: bench/tuning/results/, and $OUT when set) with the digest of the
templates it rendered (``templates_digest``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench/
os.environ["NVRTC_ENGINE_DISABLE_DISK_CACHE"] = "1"  # the key does not see the variants

import common
from families.norm import EPS, Cycle, kernel_forward, torch_fns, torch_forward

# name: (text in the rendered source, replacement); see norm_regs.j2
EDITS = {
    "trigger": ("bool trigger = false;", "bool trigger = true;"),
    "notrigger": ("bool trigger = true;", "bool trigger = false;"),
}


def parse_cases(text: str) -> list[tuple[str, int]]:
    """``--cases``' NORM:H,... as (norm, H) pairs; ValueError naming a bad item."""
    cases = []
    for case in text.split(","):
        norm, _, h = case.partition(":")
        if norm not in ("layernorm", "rmsnorm") or not h.isdigit():
            raise ValueError(f"case {case!r}: expected layernorm:H or rmsnorm:H")
        cases.append((norm, int(h)))
    return cases


def parse_variant(text: str) -> list[str]:
    """A ``--variants`` item as its parts ([] for ``base``); ValueError for an unknown part
    or ``base`` joined to others."""
    if text == "base":
        return []
    parts = text.split("+")
    if "base" in parts:
        raise ValueError(f"{text}: 'base' is the kernel as chosen, not a change; give it alone")
    for part in parts:
        if part not in EDITS and part != "rules" and "=" not in part:
            raise ValueError(f"unknown change {part!r}: rules, FIELD=VALUE, "
                             f"staging.FIELD=VALUE or one of {', '.join(EDITS)}")  # fmt: skip
    return parts


def _value(text: str) -> Any:
    if text.lstrip("-").isdigit():
        return int(text)
    return {"true": True, "false": False, "none": None}.get(text.lower(), text)


def configured(key: Any, parts: list[str]) -> Any:
    """The configuration ``key`` compiles with under the variant ``parts``: its own (or the
    rules' with ``rules``) with each ``FIELD=VALUE`` replaced; ValueError naming what does
    not apply (an unknown field, a value the configuration refuses)."""
    from nvrtc_engine.families.norm import config as norm_config
    from nvrtc_engine.families.norm import spec as norm

    cfg = norm_config._register_layout(key) if "rules" in parts else norm.norm_config(key)
    for part in (p for p in parts if "=" in p):
        name, _, text = part.partition("=")
        if name.startswith("staging.") and cfg.staging is None:
            raise ValueError(f"{part}: {cfg.label} is not a staged kernel")
        try:
            if name.startswith("staging."):
                staging = cfg.staging._replace(**{name[8:]: _value(text)})
                cfg = cfg._replace(staging=staging)
            else:
                cfg = cfg._replace(**{name: _value(text)})
        except (TypeError, ValueError) as e:  # (the library's ArgumentError is a ValueError)
            raise ValueError(f"{part} on {cfg.label}: {e}") from None
    return cfg


def edited(rendered: Any, parts: list[str]) -> Any:
    """``rendered`` (a RenderedSource) with the trigger edits among ``parts`` applied;
    ValueError where an edit has nothing to change."""
    source = rendered.source
    for name in (p for p in parts if p in EDITS):
        old, new = EDITS[name]
        if old not in source:
            raise ValueError(f"{name}: {rendered.name} has no {old!r}")
        source = source.replace(old, new)
    return rendered._replace(source=source)


def case_key(norm: str, h: int, out: str, arch: str | None = None) -> Any:
    """The forward key of a case: bf16 x, ``h`` columns, bf16 z or (``out`` fp8) E4M3 with
    tensor scaling; ``arch`` None: the GPU's. VariantError for a hidden size out of range."""
    import nvrtc_engine as ne

    extra = {"out_dtype": "fp8", "scaling": "tensor"} if out == "fp8" else {}
    return ne.make_key(f"{norm}_fwd", in_dtype="bf16", hidden_size=h, arch=arch, **extra)


def check_variants(cases: list[tuple[str, int]], outs: list[str], variants: list[list[str]],
                   arch: str = "sm_90") -> None:  # fmt: skip
    """ValueError unless every variant applies to every case's kernel, rendered for ``arch``
    (no GPU, no compile), so that a field a kernel lacks is found before any timing."""
    import nvrtc_engine.core.engine as engine_mod

    for norm_name, h in cases:
        for out in outs:
            key = case_key(norm_name, h, out, arch)
            for parts in variants:
                try:
                    with common.norm_configured(configured(key, parts)):
                        edited(engine_mod.render(key), parts)
                except ValueError as exc:
                    raise ValueError(f"case {norm_name}:{h} --out {out}: {exc}") from None


def build(key: Any, parts: list[str]) -> Any:
    """``key``'s kernel under the variant ``parts``, compiled on a fresh memory-only engine."""
    import nvrtc_engine.core.engine as engine_mod

    plain = engine_mod.render
    engine_mod.render = lambda k: edited(plain(k), parts)
    try:
        with common.norm_configured(configured(key, parts)):
            return engine_mod.Engine().get(key)
    finally:
        engine_mod.render = plain


def bench_case(norm: str, h: int, out: str, variants: list[str], rounds: int) -> dict:
    import torch

    n = 2048 if h >= 65536 else 16384
    ln = norm == "layernorm"
    fp8 = out == "fp8"
    bf16 = torch.bfloat16
    w = (torch.randn(h, device="cuda") * 0.1 + 1).to(bf16)
    b = (torch.randn(h, device="cuda") * 0.1).to(bf16)
    scale = torch.full((1,), 2.0, device="cuda")
    amax, scale_inv = torch.zeros(1, device="cuda"), torch.empty(1, device="cuda")

    def make() -> dict[str, Any]:
        x = torch.randn(n, h, device="cuda").to(bf16)
        z = torch.empty(n, h, dtype=torch.float8_e4m3fn if fp8 else bf16, device="cuda")
        mu, rs = torch.empty(n, device="cuda"), torch.empty(n, device="cuda")
        return {"x": x, "z": z, "mu": mu, "rs": rs}

    cycle = Cycle(make, 2 * n * h * 2)
    key = case_key(norm, h, out)
    fp8_kw = {"scale": scale, "amax": amax, "scale_inv": scale_inv} if fp8 else {}
    fns: dict[str, Any] = {}
    symbols: dict[str, str] = {}
    results: dict[str, tuple[Any, ...]] = {}

    def outputs(k: Any) -> tuple[Any, ...]:
        """z's bytes, mu, rsigma and the amax of one call on the first buffer set, whose
        outputs are first filled with a pattern no row leaves (so a row the call skipped does
        not show the bytes an earlier variant wrote)."""
        s = cycle.sets[0]
        amax.zero_()
        s["z"].view(torch.uint8).fill_(0x7F)  # (z is compared by its bytes)
        s["mu"].fill_(float("nan"))
        s["rs"].fill_(float("nan"))
        if ln:
            k(s["x"], w, b, EPS, s["z"], s["mu"], s["rs"], **fp8_kw)
        else:
            k(s["x"], w, EPS, s["z"], s["rs"], **fp8_kw)
        torch.cuda.synchronize()
        return (s["z"].view(torch.uint8).clone(), s["rs"].clone(), amax.clone(),
                *((s["mu"].clone(),) if ln else ()))  # fmt: skip

    for variant in variants:
        k = build(key, parse_variant(variant))
        symbols[variant] = k.artifact.symbols[0]
        fns[variant] = kernel_forward(k, cycle, ln, w, b, **fp8_kw)
        results[variant] = outputs(k)
    first = results[variants[0]]
    same = {v: all(torch.equal(got, want) for got, want in zip(r, first, strict=True))
            for v, r in results.items()}  # fmt: skip
    results.clear()
    f = common.fresh_compile(torch_fns(norm, h)["fwd_fp8" if fp8 else "fwd"], dynamic=False)
    fns["torch.compile"] = torch_forward(f, cycle, w, b, **fp8_kw)
    times = common.paired_ms(fns, rounds=rounds, seed=h)
    vs_base = common.paired_ratios(times, "base") if "base" in fns else {}
    vs_compile = common.paired_ratios(times, "torch.compile")
    nbytes = n * h * (2 + (1 if fp8 else 2))
    rows = []
    for name, ts in times.items():
        ms = statistics.median(ts)
        rows.append({"norm": norm, "hidden": h, "out": out, "variant": name,
                     "kernel": symbols.get(name, ""), "ms": ms, "ms_rounds": ts,
                     "gbps": nbytes / (ms * 1e-3) / 1e9, "vs_base": vs_base.get(name),
                     "vs_compile": vs_compile[name], "same_results": same.get(name)})  # fmt: skip
    cycle.sets.clear()
    torch.cuda.empty_cache()
    return {"rows": rows}


def main() -> int:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--cases", default="rmsnorm:8192,layernorm:14336",
                        help="NORM:H,... (default %(default)s)")  # fmt: skip
    parser.add_argument("--out", default="bf16", help="bf16, fp8 or bf16,fp8 (default bf16)")
    parser.add_argument("--variants", default="base,notrigger",
                        help="comma-separated, '+' joining changes (%(default)s)")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=20, help="paired rounds (default 20)")
    parser.add_argument(
        "--name", type=common.result_name, default="source_ab", help="results/NAME.json"
    )
    args = parser.parse_args()
    variants = args.variants.split(",")
    try:
        parsed = [parse_variant(v) for v in variants]
        cases = parse_cases(args.cases)
        outs = args.out.split(",")
        if not set(outs) <= {"bf16", "fp8"}:
            raise ValueError(f"--out {args.out!r}: bf16, fp8 or bf16,fp8")
        if args.rounds < 1:
            raise ValueError("--rounds: at least 1")
        check_variants(cases, outs, parsed)
    except ValueError as exc:
        parser.error(str(exc))
    torch = common.torch_or_exit(parser)

    torch.manual_seed(0)
    copy = common.copy_bandwidth_gbps()
    rows = []
    for norm, h in cases:
        for out in outs:
            rows += bench_case(norm, h, out, variants, args.rounds)["rows"]
    for r in rows:
        r["pct_of_copy"] = 100 * r["gbps"] / copy
    from nvrtc_engine.core.render import templates_digest

    path = common.write_results(args.name, {**common.gpu_info(), "copy_gbps": copy,
                                            "rounds": args.rounds,
                                            "templates_digest": templates_digest(),
                                            "rows": rows})  # fmt: skip
    print(f"device copy {copy:.0f} GB/s; ratios are same-round medians (above 1: faster)")
    vs = [("vs_base", "x base", "median"), ("vs_compile", "x compile", "median"),
          ("vs_compile", "won vs compile", "faster")]  # fmt: skip
    shown = [{**r, **{f"{k}_{s}": (r[k] or {}).get(s) for k, _, s in vs}} for r in rows]
    print(common.table(shown, [("norm", "norm", ""), ("hidden", "H", ""), ("out", "out", ""),
                               ("variant", "variant", ""), ("ms", "ms", ".4f"),
                               ("pct_of_copy", "% copy", ".1f"), ("same_results", "same", ""),
                               *[(f"{k}_{s}", head, ".3f") for k, head, s in vs]]))  # fmt: skip
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
