// nvrtc_engine device helpers: aligned vectors for wide (up to 16-byte) loads and stores.
#pragma once

namespace nve {

// N elements of storage type S, aligned so that one access moves min(N*sizeof(S), 16) bytes.
template <typename S, int N>
struct alignas(N * sizeof(S) >= 16 ? 16 : N * sizeof(S)) vec {
  S v[N];
};

template <typename S, int N>
__device__ __forceinline__ void load_vec(const S* __restrict__ p, long long chunk, S (&out)[N]) {
  const vec<S, N> t = reinterpret_cast<const vec<S, N>*>(p)[chunk];
#pragma unroll
  for (int i = 0; i < N; ++i) out[i] = t.v[i];
}

template <typename S, int N>
__device__ __forceinline__ void store_vec(S* __restrict__ p, long long chunk, const S (&in)[N]) {
  vec<S, N> t;
#pragma unroll
  for (int i = 0; i < N; ++i) t.v[i] = in[i];
  reinterpret_cast<vec<S, N>*>(p)[chunk] = t;
}

}  // namespace nve
