// sm90/cluster.cuh - thread-block cluster building blocks of the Hopper kernels: a peer CTA's
// shared-memory address (mapa), the cluster's size, this CTA's rank and a barrier of every
// thread of the cluster; an arrival on a peer CTA's mbarrier and a wait that sees the peer's
// writes (cluster scope); a TMA load multicast into the same place of every CTA of the pair.
// The forward's split-KV merge (sm90/fwd_split.cuh) and the D=256 backward's CTA pairs
// (sm90/bwd_pair.cuh) are built from them.
#pragma once

#include <cuda.h>
#include <cuda/ptx>
#include <stdint.h>

namespace flashcore {
namespace sm90 {

namespace ptx = cuda::ptx;

__device__ __forceinline__ uint32_t cluster_peer_addr(uint32_t local_addr, uint32_t rank) {
    uint32_t remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(local_addr), "r"(rank));
    return remote;
}
// The cluster's size and this CTA's rank in it (1 and 0 without a cluster launch). Volatile: read
// again at each use instead of being kept in a register across the main loop.
__device__ __forceinline__ int cluster_size() {
    uint32_t n;
    asm volatile("mov.u32 %0, %%cluster_nctarank;\n" : "=r"(n));
    return static_cast<int>(n);
}
__device__ __forceinline__ int cluster_rank() {
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return static_cast<int>(r);
}
__device__ __forceinline__ void cluster_sync_all() {
    ptx::barrier_cluster_arrive(ptx::sem_release);
    ptx::barrier_cluster_wait(ptx::sem_acquire);
}

// One arrival on the mbarrier at `local_bar`'s place in CTA `rank`'s shared memory, releasing
// this thread's earlier writes (and what it has seen) to the threads that wait on it.
__device__ __forceinline__ void arrive_on_peer(uint32_t local_bar, uint32_t rank) {
    asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n"
                 ::"r"(cluster_peer_addr(local_bar, rank))
                 : "memory");
}
// A wait for a phase of a local mbarrier that peers arrive on (acquire at cluster scope).
__device__ __forceinline__ void wait_barrier_cluster(uint64_t *bar, uint32_t parity) {
    while (!ptx::mbarrier_try_wait_parity(ptx::sem_acquire, ptx::scope_cluster, bar, parity)) {
    }
}

// A TMA load of one box into `dst` in every CTA of `cta_mask`, each completing (bytes) on the
// mbarrier at `bar`'s place in its own shared memory.
__device__ __forceinline__ void tma_load_multicast(void *dst, const CUtensorMap *map, const int32_t (&coords)[4],
                                                   uint64_t *bar, uint16_t cta_mask) {
    ptx::cp_async_bulk_tensor(ptx::space_cluster, ptx::space_global, dst, map, coords, bar, cta_mask);
}

}  // namespace sm90
}  // namespace flashcore
