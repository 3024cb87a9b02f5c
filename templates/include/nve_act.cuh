// nvrtc_engine device helpers: activation functions in fp32.
#pragma once

namespace nve {

// 2^x and 1/x on the special-function unit: relative error ~2^-22, results below 2^-126
// flush to zero.
__device__ __forceinline__ float ex2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float rcp_approx(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// GELU, tanh approximation as in TransformerEngine: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
// Evaluated as the equal x * sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3), with the
// exponential taken of -2|u| <= 0: no overflow, 1 + e in [1, 2] for the reciprocal, and no
// cancellation in 1 + tanh(u) for negative x (where the tanh form rounds to 0 below x ~ -5.3).
// Error: a few ulp, plus |2u| * 2^-24 relative from rounding u itself (any fp32 evaluation).
__device__ __forceinline__ float gelu(float x) {
  const float k = -2.f * 0.7978845608028654f * 1.4426950408889634f;  // -2 sqrt(2/pi) log2(e)
  const float t = k * fmaf(0.044715f * x, x * x, x);                  // -2u log2(e)
  const float e = ex2_approx(-fabsf(t));                               // exp(-2|u|)
  const float r = rcp_approx(1.f + e);
  return x >= 0.f ? x * r : x * (e * r);
}

}  // namespace nve
