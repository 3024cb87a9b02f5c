// nvrtc_engine device helpers: activation functions and their derivatives, in fp32.
//
// Semantics as in TransformerEngine: gelu is the tanh approximation, qgelu is
// x * sigmoid(1.702 x), silu is x * sigmoid(x), srelu is relu(x)^2. d<name>(x) is the
// derivative act'(x); backward kernels multiply it by the incoming gradient. The logistic
// function is evaluated as 1 / (1 + 2^(-z log2 e)) on the special-function unit: relative
// error a few ulp plus |z| * 2^-24 from rounding z (as any fp32 evaluation), with the right
// limits (exp -> inf gives 0, exp -> 0 gives 1); results below ~1e-37 flush to zero.
#pragma once

namespace nve {

// 2^x and 1/x on the special-function unit (ex2.approx / rcp.approx, flush-to-zero).
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

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kGeluK = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluC = 0.044715f;
constexpr float kQgeluAlpha = 1.702f;

// sigmoid(z) from t = -z log2(e): 1 / (1 + 2^t).
__device__ __forceinline__ float sigmoid_from_log2(float t) { return rcp_approx(1.f + ex2_approx(t)); }
__device__ __forceinline__ float sigmoidf(float z) { return sigmoid_from_log2(-kLog2e * z); }

__device__ __forceinline__ float identity(float x) { return x; }
__device__ __forceinline__ float didentity(float) { return 1.f; }

// GELU = 0.5 x (1 + tanh(u)) = x * sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3): the
// sigmoid form has no cancellation for negative x (the tanh form rounds to 0 below -5.3).
__device__ __forceinline__ float gelu(float x) {
  const float c1 = -2.f * kGeluK * kLog2e, c3 = c1 * kGeluC;
  return x * sigmoid_from_log2(x * fmaf(c3, x * x, c1));
}
// d/dx: s + 2 x s (1 - s) u', s = sigmoid(2u), u' = sqrt(2/pi) (1 + 3 * 0.044715 x^2)
// (equal to TransformerEngine's 0.5 (1 + tanh u) + 0.5 x sech^2(u) u').
__device__ __forceinline__ float dgelu(float x) {
  const float c1 = -2.f * kGeluK * kLog2e, c3 = c1 * kGeluC;
  const float x2 = x * x;
  const float s = sigmoid_from_log2(x * fmaf(c3, x2, c1));
  const float du = kGeluK * fmaf(3.f * kGeluC, x2, 1.f);
  return fmaf(2.f * x * du, s * (1.f - s), s);
}

__device__ __forceinline__ float qgelu(float x) { return x * sigmoidf(kQgeluAlpha * x); }
__device__ __forceinline__ float dqgelu(float x) {
  const float s = sigmoidf(kQgeluAlpha * x);
  return fmaf(kQgeluAlpha * x, s * (1.f - s), s);
}

__device__ __forceinline__ float silu(float x) { return x * sigmoidf(x); }
__device__ __forceinline__ float dsilu(float x) {
  const float s = sigmoidf(x);
  return s * fmaf(x, 1.f - s, 1.f);
}

__device__ __forceinline__ float relu(float x) { return fmaxf(x, 0.f); }
__device__ __forceinline__ float drelu(float x) { return x > 0.f ? 1.f : 0.f; }

__device__ __forceinline__ float srelu(float x) {
  const float r = fmaxf(x, 0.f);
  return r * r;
}
__device__ __forceinline__ float dsrelu(float x) { return 2.f * fmaxf(x, 0.f); }

__device__ __forceinline__ float sigmoid(float x) { return sigmoidf(x); }
__device__ __forceinline__ float dsigmoid(float x) {
  const float s = sigmoidf(x);
  return s * (1.f - s);
}

// Clamped SwiGLU's gate (GPT-OSS; TransformerEngine's clamped_silu): with x' = min(x, limit),
// x' * sigmoid(alpha x'). Its derivative is 0 where x > limit (the clamp is flat there).
__device__ __forceinline__ float clamped_silu(float x, float limit, float alpha) {
  const float c = fminf(x, limit);
  return c * sigmoidf(alpha * c);
}
__device__ __forceinline__ float dclamped_silu(float x, float limit, float alpha) {
  const float c = fminf(x, limit);
  const float s = sigmoidf(alpha * c);
  return x <= limit ? fmaf(alpha * c, s * (1.f - s), s) : 0.f;
}

}  // namespace nve
