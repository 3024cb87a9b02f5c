"""Launch each kernel the bandwidth benchmarks leave furthest from copy bandwidth once, for a
hardware-counter profile:

    ncu --clock-control none --section SpeedOfLight --section Occupancy \\
        --section WarpStateStats --section LaunchStats --csv python bench/profile_kernels.py

bf16 input of 16384 x 8192 (gated ops: 16384 x 2*8192; norms: H = 8192). Each kernel runs
once after every kernel is compiled, so the profile holds one launch of each.
"""

from __future__ import annotations

import sys


def main() -> int:
    import torch

    import nvrtc_engine as ne
    from nvrtc_engine.ops.blockscale import mxfp8_scale_shape, nvfp4_scale_shape

    m, h = 16384, 8192
    dev = "cuda"
    bf16 = torch.bfloat16
    x = torch.randn(m, h, device=dev).to(bf16)
    x2 = torch.randn(m, 2 * h, device=dev).to(bf16)
    g = torch.randn(m, h, device=dev).to(bf16)
    scale, amax = torch.full((1,), 2.0, device=dev), torch.zeros(1, device=dev)
    scale_inv = torch.empty(1, device=dev)
    tensor = {"scale": scale, "amax": amax, "scale_inv": scale_inv}
    w = torch.ones(h, device=dev, dtype=bf16)
    b = torch.zeros(h, device=dev, dtype=bf16)
    mu, rs = torch.empty(m, device=dev), torch.empty(m, device=dev)
    k = {
        "swiglu": ne.get_kernel("swiglu", dtype="bf16"),
        "gelu_mx_row": ne.get_kernel("gelu", dtype="fp8", scaling="mxfp8", layout="rowwise"),
        "gelu_mx_both": ne.get_kernel("gelu", dtype="fp8", scaling="mxfp8", layout="both"),
        "dswiglu": ne.get_kernel("dswiglu", dtype="bf16"),
        "ln_fwd8": ne.get_kernel("layernorm_fwd", in_dtype="bf16", out_dtype="fp8", hidden_size=h),
        "ln_bwd": ne.get_kernel("layernorm_bwd", in_dtype="bf16", hidden_size=h),
        "ct_dbias": ne.get_kernel("cast_transpose_dbias", dtype="fp8"),
        "nvfp4": ne.get_kernel("quantize", dtype="fp4_e2m1"),
        "mx_both": ne.get_kernel("quantize", dtype="fp8", layout="both"),
    }
    q = torch.empty(m, h, dtype=torch.float8_e4m3fn, device=dev)
    qt = torch.empty(h, m, dtype=torch.float8_e4m3fn, device=dev)
    u8 = lambda shape: torch.empty(shape, dtype=torch.uint8, device=dev)  # noqa: E731
    k["swiglu"](x2)
    k["gelu_mx_row"](x)
    k["gelu_mx_both"](x)
    k["dswiglu"](g, x2)
    k["ln_fwd8"](x, w, b, 1e-5, q, mu, rs, **tensor)
    k["ln_bwd"](g, x, mu, rs, w)
    ws = torch.empty(k["ct_dbias"].workspace_rows(m), h, device=dev)
    k["ct_dbias"](x, out=q, out_t=qt, dbias=torch.empty(h, dtype=bf16, device=dev),
                  workspace=ws, **tensor)  # fmt: skip
    fp4_scales = u8(nvfp4_scale_shape(m, h, "rowwise"))
    fp4_amax = x.float().abs().amax().reshape(1)
    k["nvfp4"](x, rowwise_data=u8((m, h // 2)), rowwise_scale_inv=fp4_scales, amax=fp4_amax,
               compute_amax=False)  # fmt: skip
    k["mx_both"](x, rowwise_data=q, rowwise_scale_inv=u8(mxfp8_scale_shape(m, h, "rowwise")),
                 columnwise_data=torch.empty_like(q),
                 columnwise_scale_inv=u8(mxfp8_scale_shape(m, h, "columnwise")))  # fmt: skip
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
