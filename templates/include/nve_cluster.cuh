// nvrtc_engine device helpers: thread block clusters (sm_90 and newer), through PTX.
// A kernel with __cluster_dims__(C, 1, 1) runs its CTAs in groups of C, scheduled together,
// that reach each other's shared memory; they exchange values through mailboxes (below), and
// end with cluster_sync_relaxed(), as no CTA may exit while another may still write to its
// shared memory. Every thread of a warp makes the barrier calls (the barrier is .aligned).
#pragma once

namespace nve {

// This CTA's rank in its cluster (0 <= rank < C), and the cluster's index along x.
__device__ __forceinline__ unsigned cluster_rank() { unsigned r; asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r)); return r; }
__device__ __forceinline__ unsigned cluster_id() { unsigned r; asm volatile("mov.u32 %0, %%clusterid.x;" : "=r"(r)); return r; }

// ---- Mailboxes: values exchanged over the cluster without a cluster barrier --------------
// A release arrive at cluster scope compiles to MEMBAR.ALL.GPU on sm_90 (the thread waits for
// its stores in flight). Instead each CTA writes its values into every CTA's shared memory by
// st.async, whose bytes complete a transaction count on the receiver's mbarrier, and waits only
// on its own: mbar_init (one thread), cluster_sync_init (every thread); per exchange, one thread
// of each CTA calls mbar_expect_tx with the bytes it will receive, sends, and all mbar_wait().
__device__ __forceinline__ unsigned smem_address(const void* p) { return static_cast<unsigned>(__cvta_generic_to_shared(p)); }
// The shared::cluster address of this CTA's shared-memory address `local` in CTA `rank`.
__device__ __forceinline__ unsigned cluster_map(unsigned local, unsigned rank) {
  unsigned remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
  return remote;
}
__device__ __forceinline__ void mbar_init(unsigned long long* bar, unsigned arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_address(bar)), "r"(arrivals) : "memory");
}
// After mbar_init: the initializations are visible to the cluster once every CTA has passed
// this barrier (relaxed arrive: nothing else is ordered, no MEMBAR).
__device__ __forceinline__ void cluster_sync_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n\t" "barrier.cluster.arrive.relaxed.aligned;\n\t"
               "barrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// A barrier over the cluster with no memory ordering (no MEMBAR): passed once every CTA arrived.
__device__ __forceinline__ void cluster_sync_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n\t" "barrier.cluster.wait.aligned;" ::: "memory");
}
// This thread's arrival on its CTA's `bar`, which also expects `bytes` more bytes this phase.
__device__ __forceinline__ void mbar_expect_tx(unsigned long long* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_address(bar)), "r"(bytes)
               : "memory");
}
// v into `dst` (an address of this CTA's shared-memory layout) in CTA `rank`; its 4 bytes
// complete on that CTA's `bar`.
__device__ __forceinline__ void cluster_send(float v, const float* dst, unsigned long long* bar, unsigned rank) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];"
               ::"r"(cluster_map(smem_address(dst), rank)), "r"(__float_as_uint(v)),
               "r"(cluster_map(smem_address(bar), rank)) : "memory");
}
// Waits until the phase of `bar` with parity `phase` has completed.
__device__ __forceinline__ void mbar_wait(unsigned long long* bar, unsigned phase) {
  unsigned done = 0;
  while (!done) {
    asm volatile("{\n\t.reg .pred p;\n\t" "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
                 "selp.u32 %0, 1, 0, p;\n\t}" : "=r"(done) : "r"(smem_address(bar)), "r"(phase) : "memory");
  }
}

}  // namespace nve
