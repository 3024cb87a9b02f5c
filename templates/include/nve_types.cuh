// nvrtc_engine device helpers: element types and conversions, without CUDA headers.
//
// Storage: fp32 = float, fp16/bf16 = unsigned short, fp8 = unsigned char. Conversions to
// fp16/bf16 round to nearest even (cvt.rn). Conversions to FP8 round to nearest even and
// saturate to the largest finite value (cvt.rn.satfinite, sm_89 and newer), as
// TransformerEngine's FP8 casts do. On archs without the FP8 conversion instruction the
// template defines NVE_SOFT_FP8 and includes <cuda_fp8.h>, whose software path has the
// same semantics.
#pragma once

namespace nve {

struct f32 {
  typedef float storage;
  static __device__ __forceinline__ float load(float v) { return v; }
  static __device__ __forceinline__ float store(float v) { return v; }
};

struct bf16 {
  typedef unsigned short storage;
  static __device__ __forceinline__ float load(unsigned short v) {
    return __uint_as_float(static_cast<unsigned int>(v) << 16);
  }
  static __device__ __forceinline__ unsigned short store(float v) {
    unsigned short h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(v));
    return h;
  }
};

struct f16 {
  typedef unsigned short storage;
  static __device__ __forceinline__ float load(unsigned short v) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v));
    return f;
  }
  static __device__ __forceinline__ unsigned short store(float v) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
    return h;
  }
};

#ifndef NVE_SOFT_FP8
// cvt.rn.satfinite.e4m3x2.f32 d, a, b puts a in the upper byte of d and b in the lower.
#define NVE_FP8X2(FMT)                                                                   \
  static __device__ __forceinline__ unsigned short store2(float lo, float hi) {        \
    unsigned short r;                                                                    \
    asm("cvt.rn.satfinite." FMT "x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));     \
    return r;                                                                            \
  }
#else
#define NVE_FP8X2(FMT)                                                                   \
  static __device__ __forceinline__ unsigned short store2(float lo, float hi) {        \
    return __nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE,                 \
                                    FMT[1] == '4' ? __NV_E4M3 : __NV_E5M2);              \
  }
#endif

struct e4m3 {
  typedef unsigned char storage;
  NVE_FP8X2("e4m3")
  static __device__ __forceinline__ unsigned char store(float v) {
    return static_cast<unsigned char>(store2(v, 0.f));
  }
};

struct e5m2 {
  typedef unsigned char storage;
  NVE_FP8X2("e5m2")
  static __device__ __forceinline__ unsigned char store(float v) {
    return static_cast<unsigned char>(store2(v, 0.f));
  }
};
#undef NVE_FP8X2

template <typename T> struct is_fp8 { static const bool value = false; };
template <> struct is_fp8<e4m3> { static const bool value = true; };
template <> struct is_fp8<e5m2> { static const bool value = true; };

// Convert N floats (N even for FP8) to storage, two per instruction for FP8.
template <typename T, int N, bool PAIRED = is_fp8<T>::value> struct convert_n {
  static __device__ __forceinline__ void run(const float (&f)[N], typename T::storage (&o)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) o[i] = T::store(f[i]);
  }
};
template <typename T, int N> struct convert_n<T, N, true> {
  static __device__ __forceinline__ void run(const float (&f)[N], unsigned char (&o)[N]) {
#pragma unroll
    for (int i = 0; i < N; i += 2) {
      const unsigned short p = T::store2(f[i], f[i + 1]);
      o[i] = static_cast<unsigned char>(p & 0xffu);
      o[i + 1] = static_cast<unsigned char>(p >> 8);
    }
  }
};

// N FP8 values (N % 4 == 0) as N / 4 32-bit words, byte i of the words = f[i] (little
// endian): two paired conversions and one 16-bit merge per word, where converting to bytes
// first (convert_n) makes the compiler split each pair and repack the bytes one by one.
template <typename T, int N>
__device__ __forceinline__ void convert_fp8_words(const float (&f)[N], unsigned int (&w)[N / 4]) {
  static_assert(N % 4 == 0, "whole words");
#pragma unroll
  for (int k = 0; k < N / 4; ++k) {
    const unsigned int lo = T::store2(f[4 * k], f[4 * k + 1]);
    const unsigned int hi = T::store2(f[4 * k + 2], f[4 * k + 3]);
    w[k] = lo | (hi << 16);
  }
}

}  // namespace nve
