// nvrtc_engine device helpers: thread block clusters (sm_90 and newer), through PTX.
//
// A kernel declared with __cluster_dims__(C, 1, 1) runs its CTAs in groups of C that are
// scheduled together and can read each other's shared memory. cluster_sync() is a barrier
// over every thread of every CTA in the cluster with release/acquire ordering: shared memory
// written before it (by any CTA of the cluster) is visible to cluster_load() after it. A CTA
// must not exit while another CTA may still read its shared memory: end with cluster_sync().
// All calls must be made by every thread of the warp (the barrier is .aligned).
#pragma once

namespace nve {

// This CTA's rank in its cluster, 0 <= rank < C.
__device__ __forceinline__ unsigned cluster_rank() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}

// The cluster's index along x in the grid of clusters.
__device__ __forceinline__ unsigned cluster_id() {
  unsigned r;
  asm volatile("mov.u32 %0, %%clusterid.x;" : "=r"(r));
  return r;
}

__device__ __forceinline__ void cluster_sync() {
  asm volatile(
      "barrier.cluster.arrive.release.aligned;\n\t"
      "barrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// The float at shared-memory address p (a variable of this CTA) in CTA `rank` of the cluster.
__device__ __forceinline__ float cluster_load(const float* p, unsigned rank) {
  const unsigned local = static_cast<unsigned>(__cvta_generic_to_shared(p));
  unsigned remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(remote) : "memory");
  return v;
}

}  // namespace nve
