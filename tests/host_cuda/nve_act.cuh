// Host stand-in for templates/include/nve_act.cuh (CPU emulation tests): the same
// functions in fp32 with std::exp in place of the special-function unit.
#pragma once
#include <cmath>

namespace nve {

inline float sigmoidf(float z) { return 1.f / (1.f + std::exp(-z)); }
inline float identity(float x) { return x; }
inline float didentity(float) { return 1.f; }
constexpr float kGeluK = 0.7978845608028654f, kGeluC = 0.044715f, kQgeluAlpha = 1.702f;

inline float gelu(float x) { return x * sigmoidf(2.f * kGeluK * (x + kGeluC * x * x * x)); }
inline float dgelu(float x) {
  const float s = sigmoidf(2.f * kGeluK * (x + kGeluC * x * x * x));
  const float du = kGeluK * (1.f + 3.f * kGeluC * x * x);
  return s + 2.f * x * du * s * (1.f - s);
}
inline float qgelu(float x) { return x * sigmoidf(kQgeluAlpha * x); }
inline float dqgelu(float x) {
  const float s = sigmoidf(kQgeluAlpha * x);
  return s + kQgeluAlpha * x * s * (1.f - s);
}
inline float silu(float x) { return x * sigmoidf(x); }
inline float dsilu(float x) {
  const float s = sigmoidf(x);
  return s * (1.f + x * (1.f - s));
}
inline float relu(float x) { return std::fmax(x, 0.f); }
inline float drelu(float x) { return x > 0.f ? 1.f : 0.f; }
inline float srelu(float x) {
  const float r = std::fmax(x, 0.f);
  return r * r;
}
inline float dsrelu(float x) { return 2.f * std::fmax(x, 0.f); }

}  // namespace nve
