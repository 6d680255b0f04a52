// sm90/fwd_split.cuh - the Hopper forward's split-KV merge across a cluster (sm90/fwd_kernel.cuh,
// launch_fwd_config): the layout of a CTA's partials in its idle K/V ring (SplitPartials), the
// cluster primitives (mapa addresses of a peer's shared memory, distributed shared-memory loads,
// st.async pushes counted by the peer's mbarrier, the cluster's size, rank and barrier), the
// weight of one part in a merge of partial rows (partial_weight, also the pair's merge), and the
// rows a CTA finalises from every peer's partials (finish_split_rows; D=128 and 256).
#pragma once

#include "common/sm80_ptx.cuh"  // fast_exp2, pack2
#include "flashcore.h"          // fc_params
#include "sm90/fwd_traits.cuh"  // kMaxKvSplits
#include "sm90/ptx.cuh"         // ptx (cuda::ptx)

#include <cuda/ptx>
#include <math.h>
#include <stdint.h>

namespace flashcore {
namespace sm90 {

// ---- Split-KV for small grids (see launch_fwd) ----
// A cluster of `splits` CTAs shares one tile: CTA `rank` runs its share of the key tiles, leaves
// its unnormalised O (fp32, relative to its own row maxima) and each row's (max, sum) in its
// shared memory, and after a cluster barrier finalises 1/splits of the block's rows from every
// CTA's partials, read through distributed shared memory (finish_split_rows; D=128 and 256).
// D=64 pushes instead (SplitSlots): no cluster barrier at the merge, and no round trips.
// Measured (H100, fp16, CUDA graph us, same run): one warpgroup split 2 at B=1 H=8 512 x 512
// 7.0 -> 6.5, 256 x 1024 8.4 -> 7.3; two warpgroups split 2 at 512 x 512 8.4 -> 7.6.
// No workspace, no second kernel.

// Partials in the (then idle) K/V ring: O rows padded by 8 floats, so the float2 stores of a
// warp's 8 rows spread over all banks (2 wavefronts for 256 bytes, the minimum).
template <int kHeadDim, int kBlockM>
struct SplitPartials {
    static constexpr int kOPitch = kHeadDim + 8;  // floats
    static constexpr int kBytes = kBlockM * kOPitch * 4 + kBlockM * 8;  // O, then (max, sum) per row
};

__device__ __forceinline__ uint32_t cluster_peer_addr(uint32_t local_addr, uint32_t rank) {
    uint32_t remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(local_addr), "r"(rank));
    return remote;
}
__device__ __forceinline__ float2 ld_cluster_f2(uint32_t addr) {
    float2 v;
    asm volatile("ld.shared::cluster.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(addr) : "memory");
    return v;
}
__device__ __forceinline__ float4 ld_cluster_f4(uint32_t addr) {
    float4 v;
    asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "r"(addr)
                 : "memory");
    return v;
}
// A float2 into a peer CTA's shared memory, counted (8 bytes) by that CTA's mbarrier.
__device__ __forceinline__ void st_async_f2(uint32_t remote_addr, float x, float y, uint32_t remote_bar) {
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32 [%0], {%1, %2}, [%3];\n"
                 ::"r"(remote_addr), "f"(x), "f"(y), "r"(remote_bar)
                 : "memory");
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

// Merging partial results of one query row (a split's CTAs, or a pair's two warpgroups): each part j
// left an unnormalised O_j, its row maximum m_j and its sum l_j. With M = max_j m_j the merged row
// is O = sum_j w_j O_j / L, L = sum_j w_j l_j, LSE = M + log2 L (base 2), and w_j is the weight
// below. A part whose key range was empty, or whose keys the row could not see, left m_j = -inf,
// l_j = 0, O_j = 0: it gets weight 0 (2^(m_j - M) would be NaN when every part is empty).
// `scale` turns m into base-2 units (1 where m already is).
__device__ __forceinline__ float partial_weight(float m, float m_max, float scale = 1.f) {
    return m == -INFINITY ? 0.f : fast_exp2((m - m_max) * scale);
}

// Rows [rank * R, rank * R + R) of the block, R = ceil(kBlockM / splits), merged from every CTA's
// partials (partial_weight; m in base-2 units), accumulated one CTA at a time.
template <typename Elem, int kHeadDim, int kBlockM>
__device__ __forceinline__ void finish_split_rows(uint32_t part_addr, int rank, int splits, int tid, int n_threads,
                                                  int m_block, int head, int batch, const fc_params &p) {
    using SP = SplitPartials<kHeadDim, kBlockM>;
    constexpr int kQuads = kHeadDim / 4;  // float4 columns per row
    const uint32_t ml_addr = part_addr + kBlockM * SP::kOPitch * 4;
    const int rows_per_rank = (kBlockM + splits - 1) / splits;
    const int row_begin = rank * rows_per_rank;
    const int row_end = min(kBlockM, row_begin + rows_per_rank);
    const int seqlen_q = static_cast<int>(p.seqlen_q);
    Elem *out = static_cast<Elem *>(p.out) + batch * p.o_stride_b + head * p.o_stride_h;
    for (int item = tid; item < (row_end - row_begin) * kQuads; item += n_threads) {
        const int r = row_begin + item / kQuads;
        const int col = (item % kQuads) * 4;
        const int row = m_block * kBlockM + r;
        if (row >= seqlen_q) continue;
        // All (max, sum) pairs first, then every CTA's O columns: independent loads, so the
        // remote round trips overlap instead of queueing one behind another.
        float2 ml[kMaxKvSplits];
        float mx = -INFINITY;
#pragma unroll
        for (int j = 0; j < kMaxKvSplits; ++j) {
            ml[j] = j < splits ? ld_cluster_f2(cluster_peer_addr(ml_addr + r * 8, j)) : make_float2(-INFINITY, 0.f);
            mx = fmaxf(mx, ml[j].x);
        }
        float sum = 0.f, acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int j = 0; j < kMaxKvSplits; ++j) {
            if (j >= splits) break;
            const float w = partial_weight(ml[j].x, mx);
            const float4 o = ld_cluster_f4(cluster_peer_addr(part_addr + (r * SP::kOPitch + col) * 4, j));
            sum += w * ml[j].y;
            acc[0] += w * o.x;
            acc[1] += w * o.y;
            acc[2] += w * o.z;
            acc[3] += w * o.w;
        }
        const float inv = sum > 0.f ? 1.f / sum : 0.f;
        Elem *dst = out + row * p.o_stride_s + col;
        *reinterpret_cast<uint32_t *>(dst) = pack2<Elem>(acc[0] * inv, acc[1] * inv);
        *reinterpret_cast<uint32_t *>(dst + 2) = pack2<Elem>(acc[2] * inv, acc[3] * inv);
        if (col == 0 && p.lse != nullptr)
            p.lse[batch * p.lse_stride_b + head * p.lse_stride_h + row * p.lse_stride_s] =
                (mx + __log2f(sum)) * 0.6931471805599453f;
    }
}

}  // namespace sm90
}  // namespace flashcore
