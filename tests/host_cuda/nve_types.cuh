// Host stand-in for templates/include/nve_types.cuh (CPU emulation tests): the same types
// and conversions (round to nearest even; FP8 saturating to the largest finite value),
// written without PTX.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstring>

namespace nve {

struct f32 {
  typedef float storage;
  static float load(float v) { return v; }
  static float store(float v) { return v; }
};

struct bf16 {
  typedef unsigned short storage;
  static float load(unsigned short v) { return __uint_as_float(static_cast<unsigned>(v) << 16); }
  static unsigned short store(float v) {
    unsigned u = __float_as_uint(v);
    if (v != v) return 0x7fc0;
    u += 0x7fffu + ((u >> 16) & 1u);
    return static_cast<unsigned short>(u >> 16);
  }
};

struct f16 {
  typedef unsigned short storage;
  static float load(unsigned short v) {
    _Float16 h;
    std::memcpy(&h, &v, 2);
    return static_cast<float>(h);
  }
  static unsigned short store(float v) {
    const _Float16 h = static_cast<_Float16>(v);
    unsigned short u;
    std::memcpy(&u, &h, 2);
    return u;
  }
};

// Saturating, round-to-nearest-even conversion to an FP8 format with MB mantissa bits,
// exponent bias BIAS and largest finite value MAXV.
template <int MB, int BIAS>
inline unsigned char fp8_store(float v, double maxv) {
  if (v != v) return 0x7f;
  const unsigned char sign = std::signbit(v) ? 0x80 : 0;
  double a = std::fmin(std::fabs(static_cast<double>(v)), maxv);
  if (a == 0) return sign;
  const int emin = 1 - BIAS;
  const int e = std::max(std::ilogb(a), emin);
  const double ulp = std::ldexp(1.0, e - MB);
  double r = std::nearbyint(a / ulp) * ulp;  // ties to even (default rounding mode)
  r = std::fmin(r, maxv);
  if (r < std::ldexp(1.0, emin)) {  // subnormal
    return sign | static_cast<unsigned char>(std::lrint(r / std::ldexp(1.0, emin - MB)));
  }
  const int er = std::ilogb(r);
  const int mant = static_cast<int>(std::lrint((r / std::ldexp(1.0, er) - 1.0) * (1 << MB)));
  return sign | static_cast<unsigned char>(((er + BIAS) << MB) | mant);
}

struct e4m3 {
  typedef unsigned char storage;
  static unsigned char store(float v) { return fp8_store<3, 7>(v, 448.0); }
  static unsigned short store2(float lo, float hi) { return store(lo) | (store(hi) << 8); }
};

struct e5m2 {
  typedef unsigned char storage;
  static unsigned char store(float v) { return fp8_store<2, 15>(v, 57344.0); }
  static unsigned short store2(float lo, float hi) { return store(lo) | (store(hi) << 8); }
};

template <typename T, int N>
struct convert_n {
  static void run(const float (&f)[N], typename T::storage (&o)[N]) {
    for (int i = 0; i < N; ++i) o[i] = T::store(f[i]);
  }
};

// N FP8 values as N / 4 32-bit words, the bytes of the byte array in order.
template <typename T, int N>
inline void convert_fp8_words(const float (&f)[N], unsigned int (&w)[N / 4]) {
  static_assert(N % 4 == 0, "whole words");
  for (int k = 0; k < N / 4; ++k) {
    const unsigned int lo = T::store2(f[4 * k], f[4 * k + 1]);
    const unsigned int hi = T::store2(f[4 * k + 2], f[4 * k + 3]);
    w[k] = lo | (hi << 16);
  }
}

}  // namespace nve
