// Host emulation of the CUDA built-ins the engine's kernels use, for CPU tests only: one
// std::thread per CUDA thread, blocks run one after another, __syncthreads and warp
// shuffles through barriers. Semantics, not speed: small shapes only.
#pragma once
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

struct dim3 {
  unsigned x = 0, y = 0, z = 0;
};
inline thread_local dim3 threadIdx;
inline dim3 blockIdx, gridDim, blockDim;
inline std::barrier<>* nve_block_barrier = nullptr;
inline std::barrier<>* nve_warp_barrier[32];
inline float nve_shfl_buffer[32][32];

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __grid_constant__
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define __restrict__ __restrict

inline void __syncthreads() { nve_block_barrier->arrive_and_wait(); }

inline float __shfl_xor_sync(unsigned, float v, int lane_mask) {
  const int w = threadIdx.x / 32, l = threadIdx.x % 32;
  nve_shfl_buffer[w][l] = v;
  nve_warp_barrier[w]->arrive_and_wait();
  const float r = nve_shfl_buffer[w][l ^ lane_mask];
  nve_warp_barrier[w]->arrive_and_wait();
  return r;
}

// Byte n of the result is byte (s >> 4n) & 7 of the 8 bytes {y, x} (x the low 4; the
// sign-replicating mode, bit 3 of a selector, is not used by the kernels).
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
  const unsigned long long v = (static_cast<unsigned long long>(y) << 32) | x;
  unsigned r = 0;
  for (int n = 0; n < 4; ++n) r |= static_cast<unsigned>((v >> (8 * ((s >> (4 * n)) & 7))) & 0xff) << (8 * n);
  return r;
}

inline int atomicMax(int* addr, int v) {
  std::atomic_ref<int> a(*addr);
  int old = a.load();
  while (old < v && !a.compare_exchange_weak(old, v)) {
  }
  return old;
}

// CUDA's integer min / max overloads used by the device helpers.
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline int min(int a, int b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }

// The high 32 bits of the 64-bit product (CUDA's __umulhi).
inline unsigned __umulhi(unsigned a, unsigned b) {
  return static_cast<unsigned>((static_cast<unsigned long long>(a) * b) >> 32);
}

inline unsigned __float_as_uint(float f) {
  unsigned u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline int __float_as_int(float f) {
  int u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float __uint_as_float(unsigned u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Run fn for every thread of every block of a 1-D grid.
inline void nve_run_grid(unsigned grid, unsigned block, const std::function<void()>& fn) {
  gridDim.x = grid;
  blockDim.x = block;
  for (unsigned b = 0; b < grid; ++b) {
    blockIdx.x = b;
    std::barrier<> bar(block);
    nve_block_barrier = &bar;
    std::vector<std::unique_ptr<std::barrier<>>> warps;
    for (unsigned w = 0; w < block / 32; ++w) {
      warps.emplace_back(new std::barrier<>(32));
      nve_warp_barrier[w] = warps.back().get();
    }
    std::vector<std::thread> threads;
    for (unsigned t = 0; t < block; ++t) {
      threads.emplace_back([&fn, t] {
        threadIdx.x = t;
        fn();
      });
    }
    for (auto& th : threads) th.join();
  }
}
