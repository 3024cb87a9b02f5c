// nvrtc_engine device helpers: MXFP8 block scales (E8M0), TransformerEngine semantics.
//
// A block of 32 values with max |v| = amax gets the biased exponent
// e = float_to_e8m0(amax * (1 / max_norm)): the fp32 exponent field, rounded up when the
// mantissa is not zero (so amax * 2^(127 - e) <= max_norm); NaN -> 0xFF, inf -> 0xFE,
// 0 -> 0. Data is then fp8_satfinite(v * 2^(127 - e)) (multiplier 1 when e == 0).
// The same integer arithmetic on every arch, so results match across archs bit for bit.
#pragma once

namespace nve {

__device__ __forceinline__ unsigned char e8m0_from_amax(float amax, float max_norm_rcp) {
  const float v = amax * max_norm_rcp;
  const unsigned int bits = __float_as_uint(v);
  const unsigned int exponent = (bits >> 23) & 0xffu;
  const unsigned int mantissa = bits & 0x7fffffu;
  if (exponent == 0xffu) return mantissa ? 0xff : 0xfe;  // NaN, inf
  if (v == 0.f) return 0;
  const bool up = mantissa != 0u && exponent != 0xfeu && !(exponent == 0u && mantissa <= 0x400000u);
  return static_cast<unsigned char>(exponent + (up ? 1u : 0u));
}

// e8m0_from_amax with fewer instructions, bit for bit the same result for every fp32 value
// of amax * max_norm_rcp (tests/test_activation.py checks a numpy model of both over fp32
// bit patterns). With b = |v|'s bits: NaN (b > inf) -> 0xFF; otherwise the exponent field
// of b rounded up by adding 0x7FFFFF below the exponent (any mantissa bit carries), capped
// at 0xFE (inf, and the largest binade); subnormals (b < 2^-126) round up only past half
// the binade (b > 0x400000), so they add 0x3FFFFF instead; zero stays 0.
__device__ __forceinline__ unsigned char e8m0_from_amax_fast(float amax, float max_norm_rcp) {
  const unsigned int b = __float_as_uint(amax * max_norm_rcp) & 0x7fffffffu;
  const unsigned int up = b < 0x800000u ? 0x3fffffu : 0x7fffffu;
  const unsigned int e = min((b + up) >> 23, 0xfeu);
  return static_cast<unsigned char>(b > 0x7f800000u ? 0xffu : e);
}

// The factor applied before the FP8 cast: 2^(127 - e), and 1 for e == 0.
__device__ __forceinline__ float e8m0_multiplier(unsigned char e) {
  return e == 0 ? 1.f : __uint_as_float((254u - e) << 23);
}

// A 32-element block held by 32 / N adjacent lanes, N values v each: the block's E8M0 scale,
// the same in every lane.
template <int N>
__device__ __forceinline__ unsigned char mx_block_scale(const float (&v)[N], float max_norm_rcp) {
  float m = 0.f;
#pragma unroll
  for (int j = 0; j < N; ++j) m = fmaxf(m, fabsf(v[j]));
#pragma unroll
  for (int o = 1; o < 32 / N; o <<= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  return e8m0_from_amax_fast(m, max_norm_rcp);
}

// mx_block_scale (returned) and f = v * 2^(127 - scale), ready for the FP8 cast (f may be v).
template <int N>
__device__ __forceinline__ unsigned char mx_scale_block(const float (&v)[N], float (&f)[N], float max_norm_rcp) {
  const unsigned char e = mx_block_scale(v, max_norm_rcp);
  const float mult = e8m0_multiplier(e);
#pragma unroll
  for (int j = 0; j < N; ++j) f[j] = v[j] * mult;
  return e;
}

}  // namespace nve
