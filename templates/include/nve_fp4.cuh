// nvrtc_engine device helpers: FP4 (E2M1) conversion and NVFP4 scales, TransformerEngine
// semantics.
//
// E2M1 code: sign in bit 3, magnitude code 0..7 for 0, 0.5, 1, 1.5, 2, 3, 4, 6. Conversion
// rounds to nearest even and saturates to +-6; NaN gives +6 (0x7), as CUDA's cuda_fp4.h.
// Two values pack into a byte, the first in the low nibble (torch float4_e2m1fn_x2). Archs
// with the conversion instruction (sm_100a/f, sm_103a, sm_110a, sm_120a/f, ...) define
// NVE_HW_FP4 and use cvt.rn.satfinite.e2m1x2.f32; others take the bit-exact software path.
//
// NVFP4 (16-element blocks, E4M3 block scales, fp32 tensor scale), all in fp32:
//   S_enc = 448 * 6 / global_amax (1 if global_amax is 0 or S_enc is 0; at most FLT_MAX),
//   block scale byte = e4m3_satfinite(block_amax * (S_enc * fp32(1/6))),
//   data = e2m1(x * min(1 / (float(block scale) * (1 / S_enc)), FLT_MAX)).
#pragma once

namespace nve {

constexpr float kFltMax = 3.402823466e38f;

#ifdef NVE_HW_FP4
// One byte: e2m1(lo) in bits 0-3, e2m1(hi) in bits 4-7 (cvt puts operand a in the high
// nibble, b in the low one).
__device__ __forceinline__ unsigned int e2m1x2(float lo, float hi) {
  unsigned short r;
  asm("{ .reg .b8 t; cvt.rn.satfinite.e2m1x2.f32 t, %1, %2; mov.b16 %0, {t, 0}; }"
      : "=h"(r) : "f"(hi), "f"(lo));
  return r & 0xffu;
}
#else
// Round-to-nearest-even as a float -> minifloat conversion (E2M1: exponent bias 1, one
// mantissa bit), a few integer and float operations instead of one compare per midpoint:
// a = min(|v|, 6). For a >= 1 (codes 2..7) the fp32 bits' exponent and top
// mantissa bit, (bits >> 22) - 252, rounded to nearest even on the 22 bits below by integer
// addition (a carry moves into the exponent: 1.75 -> 2); for a < 1 (codes 0..2, steps of
// 0.5) the float addition a + 2^22, whose ulp is 0.5, rounds to nearest even and leaves the
// code in the low bits. Midpoints thus round down at 0.25, 1.25, 2.5, 5 and up at 0.75, 1.75,
// 3.5, as the reference's nearest-value search. Sign bit from v; NaN (also signaling) gives
// 0x7.
__device__ __forceinline__ unsigned int e2m1(float v) {
  const float a = fminf(fabsf(v), 6.f);
  const unsigned int b = __float_as_uint(a);
  const unsigned int hi = (b + 0x1fffffu + ((b >> 22) & 1u) - (252u << 22)) >> 22;
  const unsigned int lo = __float_as_uint(a + 4194304.f) - 0x4a800000u;
  const unsigned int code = a < 1.f ? lo : hi;
  return v == v ? code | ((__float_as_uint(v) >> 28) & 0x8u) : 0x7u;
}
__device__ __forceinline__ unsigned int e2m1x2(float lo, float hi) {
  return e2m1(lo) | (e2m1(hi) << 4);
}
#endif

// The E4M3 byte's value (finite codes; what a block scale holds).
__device__ __forceinline__ float e4m3_value(unsigned int b) {
  const unsigned int e = (b >> 3) & 0xfu, m = b & 0x7u;
  const float v = e ? __uint_as_float(((e + 120u) << 23) | (m << 20)) : m * 0.001953125f;
  return (b & 0x80u) ? -v : v;
}

// S_enc from the tensor's amax.
__device__ __forceinline__ float nvfp4_encode_scale(float global_amax) {
  const float s = fminf(2688.f / global_amax, kFltMax);
  return (global_amax == 0.f || s == 0.f) ? 1.f : s;
}

// The factor a block's values are multiplied by before the E2M1 conversion, from the stored
// block scale and S_dec = 1 / S_enc.
__device__ __forceinline__ float nvfp4_block_multiplier(unsigned int scale_byte, float s_dec) {
  return fminf(1.f / (e4m3_value(scale_byte) * s_dec), kFltMax);
}

}  // namespace nve
