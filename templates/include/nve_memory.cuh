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

// (tile / per_row, tile % per_row) for a tile number of a row-major grid of tiles: 32-bit
// division when both fit (always, for grids CUDA can launch), which costs a fraction of the
// 64-bit division's instructions.
__device__ __forceinline__ void tile_coords(long long tile, long long per_row, long long& row,
                                            long long& col) {
  if (((tile | per_row) >> 32) == 0) {
    const unsigned int t = static_cast<unsigned int>(tile), n = static_cast<unsigned int>(per_row);
    const unsigned int q = t / n;
    row = q;
    col = t - q * n;
  } else {
    row = tile / per_row;
    col = tile - row * per_row;
  }
}

// n / d for 0 <= n < 2^31 with the host's magic pair (m, s) for d (d >= 1):
// s = ceil(log2 d), m = floor(2^32 (2^s - d) / d) + 1 (nvrtc_engine.ops.activation.magic):
// floor((umulhi(n, m) + n) / 2^s), whose sum cannot overflow for n < 2^31.
__device__ __forceinline__ unsigned int magic_div(unsigned int n, unsigned int m, unsigned int s) {
  return (__umulhi(n, m) + n) >> s;
}

// Programmatic dependent launch (sm_90+; nothing on older archs). A kernel launched with the
// attribute CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION may start before the
// previous kernel of its stream has finished; grid_dependency_wait(), called before the
// kernel's first access to global memory, returns once that kernel has completed and its
// memory operations are visible, so results are those of an ordinary launch and only the
// launch latency between the two is hidden. launch_dependents() lets the next such kernel
// be scheduled as soon as every CTA of this one has called it (or exited); it orders
// nothing, so it may come anywhere.
__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

}  // namespace nve
