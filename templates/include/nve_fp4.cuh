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
// fminf / fmaxf as the GPU computes them, y not NaN: y for any NaN x, signaling ones too
// (glibc's fminf returns NaN for those: the host builds of the tests would differ).
__device__ __forceinline__ float fmin_gpu(float x, float y) {
#ifdef __CUDA_ARCH__
  return fminf(x, y);
#else
  return x != x ? y : (x < y ? x : y);
#endif
}
__device__ __forceinline__ float fmax_gpu(float x, float y) {
#ifdef __CUDA_ARCH__
  return fmaxf(x, y);
#else
  return x != x ? y : (x > y ? x : y);
#endif
}
// Software path, bit-exact with the reference's nearest-value search (and with the previous
// integer-rounding form of this function): a = min(|v|, 6), NaN giving 6. For the binade 2^E (E = 0, 1, 2) of max(a, 1), one
// bitwise operation on its exponent bits gives c = 2^(E - 104); fmaf(a, 2^-126, c) rounds
// a * 2^-126 once onto the float32 grid of c's binade, 2^(E - 127): the E2M1 grid of a's
// range (steps 0.5 below 2, then 1, then 2) scaled by 2^-126, ties to the even multiple,
// i.e. the even code (0.25, 1.25, 2.5, 5 round down; 0.75, 1.75, 3.5 up). The exact
// difference z = q * 2^-126 of the rounded value q has the bits code << 22 (1.0 is the
// smallest normal float32, 0.5 the subnormal 2^-127; NVRTC keeps subnormals, no -ftz).
// The sign is that of fminf(v, 6): NaN gives +6, every other value keeps its sign (-0 too).
// bench/e2m1_exhaustive.py checks this against the reference for all 2^32 float32 patterns.
__device__ __forceinline__ unsigned int e2m1_mag22(float v) {
  const float a = fmin_gpu(fabsf(v), 6.f);
  const unsigned int m = __float_as_uint(fmax_gpu(a, 1.f));
  // c: exponent bits 0-3 of m kept, bit 3 inverted, bit 4 set (127+E -> 23+E), rest 0; one
  // LOP3 ((m & 0x07800000) ^ 0x0c000000), which the compiler otherwise splits in two.
  unsigned int cb;
#ifdef __CUDA_ARCH__
  asm("lop3.b32 %0, %1, 0x07800000, 0x0c000000, 0x6a;" : "=r"(cb) : "r"(m));
#else
  cb = (m & 0x07800000u) ^ 0x0c000000u;
#endif
  const float c = __uint_as_float(cb);
  return __float_as_uint(fmaf(a, 1.17549435e-38f, c) - c);  // 2^-126
}
// v's sign bits as a float32 word: that of fminf(v, 6), so NaN gives 0 and -0 gives 1.
__device__ __forceinline__ unsigned int e2m1_signword(float v) {
  return __float_as_uint(fmin_gpu(v, 6.f));
}
__device__ __forceinline__ unsigned int e2m1(float v) {
  return (e2m1_mag22(v) >> 22) | ((e2m1_signword(v) >> 28) & 0x8u);
}
__device__ __forceinline__ unsigned int e2m1x2(float lo, float hi) {
  return e2m1(lo) | (e2m1(hi) << 4);
}
#endif

// Eight codes in a word, v[k] in bits 4k .. 4k + 3 (four e2m1x2 bytes, the first lowest).
__device__ __forceinline__ unsigned int e2m1x8(const float (&v)[8]) {
#ifdef NVE_HW_FP4
  unsigned int w = 0u;
#pragma unroll
  for (int j = 0; j < 4; ++j) w |= e2m1x2(v[2 * j], v[2 * j + 1]) << (8 * j);
  return w;
#else
  // Each z = code << 22 shifted into its nibble (the codes do not overlap, so + is |),
  // each sign moved from bit 31 to bit 4k + 3.
  unsigned int w = 0u;
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const unsigned int z = e2m1_mag22(v[k]);
    w += k < 6 ? z >> (22 - 4 * k) : z << (4 * k - 22);
    w |= (e2m1_signword(v[k]) >> (28 - 4 * k)) & (0x8u << (4 * k));
  }
  return w;
#endif
}

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
