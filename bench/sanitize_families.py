"""Launch the norm and cast-family kernels once each on small, awkward shapes, for
compute-sanitizer (bench/sanitize_kernels.py covers the activation family):

    compute-sanitizer --tool memcheck  python3 bench/sanitize_families.py
    compute-sanitizer --tool racecheck python3 bench/sanitize_families.py

Norms: LayerNorm/RMSNorm forward (bf16, FP8 tensor scaling, MXFP8) and backward, specialized
(including a thread-block cluster at H = 14336 on sm_90) and general, with odd hidden sizes
and rows that do not fill a CTA. Cast family: cast_transpose (+ dbias, + dgelu, gated
dswiglu), transpose, multi_cast_transpose and MXFP8/NVFP4 quantize in every layout, on
shapes that leave partial tiles. Correctness is the GPU tests' job; this only runs them.
"""

from __future__ import annotations

import sys


def main() -> int:
    import torch

    import nvrtc_engine as ne

    dev = "cuda"
    bf16 = torch.bfloat16

    def t(*shape, dtype=bf16):
        return torch.randn(*shape, device=dev).to(dtype)

    def tensor():
        return {"scale": torch.full((1,), 2.0, device=dev), "amax": torch.zeros(1, device=dev),
                "scale_inv": torch.empty(1, device=dev)}  # fmt: skip

    count = 0
    for rows, h, hidden in [(3, 1000, 1000), (5, 4096, 4096), (2, 14336, 14336), (7, 1000, None),
                            (3, 768, None)]:  # fmt: skip
        x, dz = t(rows, h), t(rows, h)
        w, b = t(h), t(h)
        for nm in ("layernorm", "rmsnorm"):
            ln = nm == "layernorm"
            mu, rs = torch.empty(rows, device=dev), torch.empty(rows, device=dev)
            for out, kw in (("bf16", {}), ("fp8", tensor())):
                k = ne.get_kernel(f"{nm}_fwd", in_dtype="bf16", out_dtype=out, hidden_size=hidden)
                if ln:
                    k(x, w, b, 1e-5, None, mu, rs, **kw)
                else:
                    k(x, w, 1e-5, None, rs, **kw)
                count += 1
            if h % 32 == 0:
                k = ne.get_kernel(f"{nm}_fwd", in_dtype="bf16", out_dtype="fp8", scaling="mxfp8",
                                  hidden_size=hidden)  # fmt: skip
                k(x, w, b, 1e-5) if ln else k(x, w, 1e-5)
                count += 1
            kb = ne.get_kernel(f"{nm}_bwd", in_dtype="bf16", hidden_size=hidden)
            kb(dz, x, mu, rs, w) if ln else kb(dz, x, rs, w)
            count += 1
    for m, k in [(31, 33), (130, 260), (1, 1), (256, 512)]:
        x, act, act2 = t(m, k), t(m, k), t(m, 2 * k)
        ne.get_kernel("cast_transpose", dtype="fp8")(x, **tensor())
        ne.get_kernel("transpose", in_dtype="bf16", out_dtype="bf16")(x)
        ne.get_kernel("cast_transpose_dbias", dtype="fp8")(x, **tensor())
        ne.get_kernel("cast_transpose_dbias_dgelu", dtype="fp8")(x, act, **tensor())
        ne.get_kernel("dswiglu_cast_transpose", dtype="fp8")(x, act2, **tensor())
        lists = [tensor(), tensor()]
        ne.get_kernel("multi_cast_transpose", dtype="fp8")(
            [x, t(m + 1, k)], scales=[d["scale"] for d in lists],
            amaxes=[d["amax"] for d in lists], scale_invs=[d["scale_inv"] for d in lists],
        )  # fmt: skip
        for layout in ("rowwise", "columnwise", "both"):
            q = ne.get_kernel("quantize", dtype="fp8", layout=layout)
            q(x)
            q4 = ne.get_kernel("quantize", dtype="fp4_e2m1", layout=layout)
            q4(x)
        count += 11
    torch.cuda.synchronize()
    print(f"{count} launches")
    return 0


if __name__ == "__main__":
    sys.exit(main())
