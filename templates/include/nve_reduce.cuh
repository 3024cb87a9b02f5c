// nvrtc_engine device helpers: warp and block reductions, and the FP8 amax update.
#pragma once

namespace nve {

__device__ __forceinline__ float warp_sum(float v) {  // every lane ends with the same bits
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Max over the block; the result is valid in thread 0. THREADS is a multiple of 32.
template <int THREADS>
__device__ __forceinline__ float block_max(float v) {
  __shared__ float partial[THREADS / 32];
  v = warp_max(v);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = threadIdx.x < THREADS / 32 ? partial[threadIdx.x] : 0.f;
  if (warp == 0) v = warp_max(v);
  return v;
}

// amax is >= 0, so its bits order like ints; NaN inputs are dropped by fmaxf, as in
// TransformerEngine's amax reduction. The word only grows, so a value no larger than what it
// already holds changes nothing: reading it first skips most atomics when many blocks end
// at once (all but the blocks that raise the running maximum).
__device__ __forceinline__ void atomic_max_nonneg(float* addr, float v) {
  if (__float_as_int(v) <= *reinterpret_cast<volatile int*>(addr)) return;
  atomicMax(reinterpret_cast<int*>(addr), __float_as_int(v));
}

// Tensor scaling's end in a block of THREADS threads: the block's amax into *amax_ptr, and
// scale_inv = 1 / scale by the block where `first` (null pointers are not written).
template <int THREADS>
__device__ __forceinline__ void finish_amax(float amax, float* amax_ptr, float* scale_inv_ptr, float scale,
                                            bool first) {
  amax = block_max<THREADS>(amax);
  if (threadIdx.x == 0) {
    if (amax_ptr != nullptr) atomic_max_nonneg(amax_ptr, amax);
    if (first && scale_inv_ptr != nullptr) *scale_inv_ptr = 1.f / scale;
  }
}

}  // namespace nve
