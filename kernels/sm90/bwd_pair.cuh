// sm90/bwd_pair.cuh - the D=256 backward's CTA pairs (sm90/bwd_d256.cuh, kPaired): a cluster of
// two CTAs takes the two 64-key halves of one 128-key block of a (batch, KV head) pair, rank r
// the keys n_start + 64 r, and both step through the same query steps (the block's: causal, from
// the lower half's first), so that each step's Q and dO tiles cross from L2 once for the pair:
// each CTA's Q/dO loader brings half of the panels, multicast into the same stage of both CTAs.
// What the pair agrees on, beside what each CTA does alone (sm90/bwd_kernel.cuh):
//   * a stage is loaded only once both CTAs are done with it (its consumers and its dQ writer):
//     each loader, after its own CTA's "empty" phase, arrives on both CTAs' stage_free, and waits
//     for its own to see both arrivals;
//   * each step's full barrier expects the whole stage's bytes (both halves), whichever CTA's
//     load brings them;
//   * rank 0's tile scheduler claims the pair's next block from the workspace's counter and hands
//     the index to rank 1's (index_full / index_empty);
//   * neither CTA leaves before the other (a cluster barrier at the end): a peer may still arrive
//     on its barriers or load into its stages.
// dQ stays per CTA (each reduces its own 64 keys' share); keys past Sk (rank 1's half of an odd
// last block) are masked, stored nowhere, and not counted for the dq conversion.
#pragma once

#include "common/sm80_ptx.cuh"  // smem_addr
#include "sm90/cluster.cuh"
#include "sm90/ptx.cuh"

#include <cuda/ptx>
#include <stdint.h>

namespace flashcore {
namespace sm90_bwd {

using sm90::arrive_on_peer;
using sm90::cluster_peer_addr;
using sm90::cluster_rank;
using sm90::wait_barrier_cluster;

// The pair's own mbarriers and the index handed over (beside BwdBarriers).
struct PairBarriers {
    uint64_t stage_free[2];  // both CTAs are done with the stage: one arrival from each CTA's Q/dO loader
    uint64_t index_full;     // rank 1: rank 0 has put the pair's next tile index in `index`
    uint64_t index_empty;    // rank 0: rank 1 has read it
    int32_t index;
};

// (One thread, before init_barriers' fence and the cluster barrier that follows it.)
__device__ __forceinline__ void init_pair_barriers(PairBarriers &pair) {
    for (int s = 0; s < 2; ++s) cuda::ptx::mbarrier_init(&pair.stage_free[s], 2);
    cuda::ptx::mbarrier_init(&pair.index_full, 1);
    cuda::ptx::mbarrier_init(&pair.index_empty, 1);
}

// The Q/dO loader of either CTA, for a step in `stage` (the stage's use `parity`), once its own CTA
// is done with the stage: until the peer's CTA is done with it too.
__device__ __forceinline__ void wait_stage_free_in_both(PairBarriers &pair, int stage, uint32_t parity) {
    const uint32_t bar = smem_addr(&pair.stage_free[stage]);
    cuda::ptx::mbarrier_arrive(&pair.stage_free[stage]);
    arrive_on_peer(bar, static_cast<uint32_t>(cluster_rank() ^ 1));
    wait_barrier_cluster(&pair.stage_free[stage], parity);
}

// The tile scheduler's n-th claim of a next tile: rank 0 takes it from the counter (the grid's
// clusters took the first ones) and hands it to rank 1, once rank 1 has read the previous one.
__device__ __forceinline__ int next_pair_index(PairBarriers &pair, int *counter, int n) {
    if (cluster_rank() == 0) {
        const int index = atomicAdd(counter, 1) + static_cast<int>(gridDim.x) / 2;
        wait_barrier_cluster(&pair.index_empty, (n & 1) ^ 1);  // (the first claim passes at once)
        asm volatile("st.shared::cluster.u32 [%0], %1;\n" ::"r"(cluster_peer_addr(smem_addr(&pair.index), 1)),
                     "r"(index)
                     : "memory");
        arrive_on_peer(smem_addr(&pair.index_full), 1);
        return index;
    }
    wait_barrier_cluster(&pair.index_full, n & 1);
    const int index = *reinterpret_cast<volatile int32_t *>(&pair.index);
    arrive_on_peer(smem_addr(&pair.index_empty), 0);
    return index;
}

}  // namespace sm90_bwd
}  // namespace flashcore
