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

__device__ __forceinline__ float identity(float x) { return x; }

// GELU, tanh approximation as in TransformerEngine: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
// Evaluated as the equal x * sigmoid(2u) = x / (1 + exp(-2u)), u = sqrt(2/pi) (x + 0.044715 x^3):
// no cancellation in 1 + tanh(u) for negative x (where the tanh form rounds to 0 below
// x ~ -5.3), and the limits come out right: exp(-2u) -> 0 gives x, -> inf gives -0.
// 5 FP32 operations and 2 special-function ones. Error: a few ulp, plus |2u| * 2^-24
// relative from rounding u itself (as any fp32 evaluation); results below ~1e-37 flush to 0.
__device__ __forceinline__ float gelu(float x) {
  const float c1 = -2.f * 0.7978845608028654f * 1.4426950408889634f;  // -2 sqrt(2/pi) log2(e)
  const float c3 = c1 * 0.044715f;
  const float t = x * fmaf(c3, x * x, c1);                             // -2u log2(e)
  return x * rcp_approx(1.f + ex2_approx(t));
}

}  // namespace nve
