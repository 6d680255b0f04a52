// sm90/fwd_store.cuh - the Hopper forward's epilogue, as fwd_kernel (sm90/fwd_kernel.cuh) runs it:
// the rows' statistics (finish_rows: sums, the pair's merge, LSE, the attention-sink fold), the
// two cluster-split merges (the read-merge of the peers' partials, the push-merge), the grid
// split's workspace store, and the tile's outputs (store_rows: the LSE store, then O staged for TMA,
// store_o_staged, or in 16-byte stores from registers, store_o_16b).
#pragma once

#include "common/fast_div.cuh"
#include "common/sm80_ptx.cuh"
#include "common/split_combine.cuh"
#include "common/wgmma_generated.cuh"
#include "flashcore.h"
#include "sm90/fwd_epilogue.cuh"
#include "sm90/fwd_split.cuh"
#include "sm90/fwd_traits.cuh"
#include "sm90/ptx.cuh"
#include "sm90/fwd_loop.cuh"  // sum_rows
#include "sm90/fwd_steps.cuh"

#include <cuda.h>
#include <cuda/ptx>
#include <math.h>
#include <stdint.h>
#include <type_traits>

namespace flashcore {
namespace sm90 {

// A cluster split without kPushMerge (D=128, 256): leaves this CTA's partials in shared memory and
// finishes its share of the rows from every peer's (finish_split_rows).
template <class K>
__device__ __forceinline__ void read_merge_split(float (&o_acc)[K::kDTiles * 4], float (&row_max)[2], float (&row_sum)[2],
                                                 float *part_o, float2 *part_ml, int row_group, int warp_in_wg, int row_in_warp,
                                                 int col_in_tile, int lane, float scale_log2, const Tile &tile,
                                                 const fc_params &p) {
    using Elem = typename K::Elem;
    using T = typename K::T;
    constexpr int kHeadDim = K::kHeadDim, kBlockM = K::kBlockM, kDTiles = K::kDTiles, kW = K::kW;
    // Leave this CTA's partials in the K/V ring (running on into the O staging, which
    // split CTAs do not use), once every consumer warpgroup is past its last P V (the
    // producer has nothing in flight: each loaded tile was consumed).
    using SP = SplitPartials<kHeadDim, kBlockM>;
    static_assert(SP::kBytes <= T::kOStageOffset + T::kOBufs * T::kOStageBytes - T::kQBufs * T::kQBytes,
                  "split partials must fit the K/V ring and the O staging");
    asm volatile("bar.sync %0, %1;\n" ::"r"(kW + 1), "n"(128 * kW) : "memory");
    const int r0 = row_group * 64 + warp_in_wg * 16 + row_in_warp;  // row within the block
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float *dst = part_o + (r0 + 8 * h) * SP::kOPitch + col_in_tile;
#pragma unroll
        for (int d = 0; d < kDTiles; ++d)
            *reinterpret_cast<float2 *>(dst + d * 8) = make_float2(o_acc[d * 4 + 2 * h], o_acc[d * 4 + 2 * h + 1]);
        if ((lane % 4) == 0)
            part_ml[r0 + 8 * h] = make_float2(row_max[h] == -INFINITY ? -INFINITY : row_max[h] * scale_log2, row_sum[h]);
    }
    cluster_sync_all();  // every CTA's partials are written
    finish_split_rows<Elem, kHeadDim, kBlockM>(smem_addr(part_o), cluster_rank(), cluster_size(), threadIdx.x - 128, 128 * kW,
                                               tile.m_block, tile.head, tile.batch, p);
    // No CTA leaves (freeing its shared memory) while a peer reads it. Relaxed: every
    // remote load above has returned (its value was stored), so nothing needs releasing,
    // and the default release would wait for this CTA's global stores of O (a GPU-scope
    // MEMBAR in the SASS).
    ptx::barrier_cluster_arrive(ptx::sem_relaxed);
    ptx::barrier_cluster_wait();
}

// kGridSplit: writes this CTA's partial of its rows and their LSE to the workspace.
template <class K>
__device__ __forceinline__ void store_grid_split(float (&o_acc)[K::kDTiles * 4], float (&row_sum)[2], float (&inv_sum)[2],
                                                 float (&lse_log2)[2], int row0, int seqlen_q, int heads_q,
                                                 int col_in_tile, int lane, const Tile &tile, const fc_params &p) {
    constexpr int kHeadDim = K::kHeadDim, kDTiles = K::kDTiles;
    // Grid split (decoding): this CTA's partial of its rows, normalised over its keys,
    // and its base-2 LSE go to the workspace; combine_kernel (common/split_combine.cuh)
    // merges the splits. A row that saw no key (an empty range) leaves O = 0 and
    // LSE = -inf, which the merge weighs 0.
    const int splits = p.num_splits_, slot = static_cast<int>(blockIdx.x) % splits;
    float *part_o = static_cast<float *>(p.workspace);
    float *part_lse = part_o + partial_rows(p) * splits * kHeadDim;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int row = row0 + 8 * h;
        if (row >= seqlen_q) continue;
        const int64_t prow = (static_cast<int64_t>(tile.batch) * heads_q + tile.head) * seqlen_q + row;
        const bool seen = row_sum[h] > 0.f;
        float *dst = part_o + (prow * splits + slot) * kHeadDim + col_in_tile;
#pragma unroll
        for (int d = 0; d < kDTiles; ++d)
            *reinterpret_cast<float2 *>(dst + d * 8) =
                seen ? make_float2(o_acc[d * 4 + 2 * h] * inv_sum[h], o_acc[d * 4 + 2 * h + 1] * inv_sum[h])
                     : make_float2(0.f, 0.f);
        if ((lane % 4) == 0) part_lse[prow * splits + slot] = seen ? lse_log2[h] : -INFINITY;
    }
}

// Writes the natural-log LSE of the rows this thread finalises (once per row: lane 0 of the quad).
__device__ __forceinline__ void store_lse(float (&lse_log2)[2], bool (&finalise)[2], int row0, int seqlen_q, int lane,
                                          int key_part, const Tile &tile, const fc_params &p) {
    if (p.lse != nullptr && (lane % 4) == 0 && key_part == 0) {  // (kPair: both hold the merged rows)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = row0 + 8 * h;
            if (row < seqlen_q && finalise[h])
                p.lse[tile.batch * p.lse_stride_b + tile.head * p.lse_stride_h + row * p.lse_stride_s] =
                    lse_log2[h] * 0.6931471805599453f;
        }
    }
}

// Folds the head's attention sink (p.sinks) into the rows' normaliser and LSE.
__device__ __forceinline__ void apply_sink(float (&inv_sum)[2], float (&lse_log2)[2], int head, const fc_params &p) {
    // Attention sinks (p.sinks: one logit per query head, a key with no value in every row's
    // denominator): the row's keys weigh sigmoid(lse - sink) of it, and its LSE becomes
    // logaddexp(lse, sink), here in base 2. A CTA with sinks is never split (launch_fwd_config),
    // so this is the row's final LSE.
    if (p.sinks != nullptr) {
        const float sink2 = p.sinks[head] * 1.4426950408889634f;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const float top = fmaxf(lse_log2[h], sink2);
            if (top != -INFINITY) {  // (else no key and no sink: zeros, LSE -inf)
                const float total = top + __log2f(fast_exp2(lse_log2[h] - top) + fast_exp2(sink2 - top));
                inv_sum[h] *= fast_exp2(lse_log2[h] - total);
                lse_log2[h] = total;
            }
        }
    }
}

// Writes this warpgroup's normalised rows of O into its staging buffer at `stage` (stmatrix).
template <class K>
__device__ __forceinline__ void stage_o(float (&o_acc)[K::kDTiles * 4], float (&inv_sum)[2], uint32_t stage,
                                        int warp_in_wg, int lane) {
    using Elem = typename K::Elem;
    constexpr int kDTiles = K::kDTiles;
    const int matrix = lane / 8;  // lanes 8i..8i+7 address the rows of matrix i
    const int stage_row = warp_in_wg * 16 + (matrix & 1) * 8 + (lane & 7);
#pragma unroll
    for (int d = 0; d < kDTiles; d += 2) {
        // Matrices: column tile d rows 0-7 and 8-15 of the warp, then tile d + 1.
        const int chunk = d + (matrix >> 1);
        const uint32_t addr = stage + (chunk / 8) * (64 * 128) + stage_row * 128 + (((chunk % 8) ^ (lane & 7)) * 16);
        stmatrix_x4(addr, pack2<Elem>(o_acc[d * 4 + 0] * inv_sum[0], o_acc[d * 4 + 1] * inv_sum[0]),
                    pack2<Elem>(o_acc[d * 4 + 2] * inv_sum[1], o_acc[d * 4 + 3] * inv_sum[1]),
                    pack2<Elem>(o_acc[d * 4 + 4] * inv_sum[0], o_acc[d * 4 + 5] * inv_sum[0]),
                    pack2<Elem>(o_acc[d * 4 + 6] * inv_sum[1], o_acc[d * 4 + 7] * inv_sum[1]));
    }
}

// One thread's TMA store of the warpgroup's staged rows of O (buffer o_buf), committed as a group.
template <class K>
__device__ __forceinline__ void issue_o_store(int32_t (&c)[4], const FwdMaps &maps, unsigned char *smem_o, int o_buf,
                                              int wg_row0, const Tile &tile) {
    using T = typename K::T;
#pragma unroll
    for (int panel = 0; panel < T::kPanels; ++panel) {
        // (kVarlen: one batch item of packed rows; tile.batch is the sequence's first row.)
        if constexpr (K::kVarlen)
            set_coords(c, maps.o_order, panel * 64, tile.batch + wg_row0, tile.head, 0);
        else
            set_coords(c, maps.o_order, panel * 64, wg_row0, tile.head, tile.batch);
        ptx::cp_async_bulk_tensor(ptx::space_global, ptx::space_shared, &maps.o, c,
                                  smem_o + o_buf * T::kOStageBytes + panel * (64 * 128));
    }
    ptx::cp_async_bulk_commit_group();
}

// Writes this thread's normalised rows of O (those it finalises) from registers in 16-byte stores
// (w: the caller's scratch for one group's words).
template <class K>
__device__ __forceinline__ void store_o_16b(uint32_t (&w)[4], float (&o_acc)[K::kDTiles * 4], float (&inv_sum)[2],
                                            bool (&finalise)[2], int row0, int seqlen_q, int key_part, int lane,
                                            const Tile &tile, const fc_params &p) {
    using Elem = typename K::Elem;
    constexpr int kDTiles = K::kDTiles, kKeySplit = K::kKeySplit, kShape = K::kShape;
    // 16-byte stores: after quad_transpose each lane holds 8 consecutive columns of its row,
    // so a warp's store fills whole sectors (4-byte stores straight from the accumulator
    // layout filled half a sector each). fc_sdpa checked that out and its strides are
    // 16-byte aligned. All lanes shuffle; only rows inside the query store.
    static_assert(kDTiles % 4 == 0, "the quad transpose takes 4 column tiles at a time");
    Elem *out = static_cast<Elem *>(p.out) + tile.batch * p.o_stride_b + tile.head * p.o_stride_h;
    const int64_t o_stride = p.o_stride_s;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int row = row0 + 8 * h;
        Elem *out_row = out + row * o_stride + 8 * (lane % 4);
#pragma unroll
        for (int g = 0; g < kDTiles / 4; ++g) {
            if (kKeySplit > 1 && g != key_part) continue;  // kPair: the other warpgroup writes it
#pragma unroll
            for (int t = 0; t < 4; ++t) {
                const int d = 4 * g + t;
                w[t] = pack2<Elem>(o_acc[d * 4 + 2 * h] * inv_sum[h], o_acc[d * 4 + 2 * h + 1] * inv_sum[h]);
            }
            quad_transpose(w, lane);
            if (row < seqlen_q && finalise[h]) {
                // kPair: one 16-byte store by hand. Its first group's words sat in registers
                // that are not consecutive, and the compiler split the store into four 4-byte
                // ones (H100, fp16, CUDA graph us per call, three passes: B=1 H=8 512 x 512
                // 4.83-4.84 -> 4.70-4.74, causal 5.01-5.05 -> 4.97-5.00, B=2 5.38-5.40 ->
                // 5.26-5.28).
                if constexpr (kShape == kPair)
                    asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"l"(out_row + 32 * g), "r"(w[0]),
                                 "r"(w[1]), "r"(w[2]), "r"(w[3])
                                 : "memory");
                else
                    *reinterpret_cast<uint4 *>(out_row + 32 * g) = make_uint4(w[0], w[1], w[2], w[3]);
            }
        }
    }
}

// kPushMerge, a cluster split (D=64): pushes this CTA's partials of the rows that a peer finalises to
// that peer (st.async, counted by the peer's merge_full), then merges the peers' partials of its
// own rows into o_acc, inv_sum and lse_log2. finalise[h]: whether this CTA writes the thread's row
// h. The peers' slots (slots_o, slots_ml: SplitSlots), the cluster's shape and the scratch arrays
// local_row and m_log2 (the rows' maxima in exp2 units) come from the kernel (set up here, they
// changed the kernel's SASS).
template <class K>
__device__ __forceinline__ void push_merge_split(float (&o_acc)[K::kDTiles * 4], float (&row_max)[2], float (&row_sum)[2],
                                                 float (&inv_sum)[2], float (&lse_log2)[2], bool (&finalise)[2],
                                                 int (&local_row)[2], float (&m_log2)[2], int splits, int rank,
                                                 int rows_per_rank, const float *slots_o, const float2 *slots_ml,
                                                 typename K::Bars &bars, int row_group, int warp_in_wg, int row_in_warp,
                                                 int col_in_tile, int lane, float scale_log2) {
    constexpr int kHeadDim = K::kHeadDim, kBlockM = K::kBlockM, kDTiles = K::kDTiles;
    using SS = SplitSlots<kHeadDim, kBlockM>;
    const uint32_t slot_o = smem_addr(slots_o), slot_ml = smem_addr(slots_ml);
    const uint32_t merge_bar = smem_addr(&bars.merge_full);
    ptx::barrier_cluster_wait(ptx::sem_acquire);  // every peer's merge_full is set up
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = row_group * 64 + warp_in_wg * 16 + row_in_warp + 8 * h;  // row in the block
        const int owner = r / rows_per_rank;
        local_row[h] = r - owner * rows_per_rank;
        finalise[h] = owner == rank;
        m_log2[h] = row_max[h] == -INFINITY ? -INFINITY : row_max[h] * scale_log2;
        if (finalise[h]) continue;
        const int slot_row = rank * rows_per_rank + local_row[h];
        const uint32_t dst = cluster_peer_addr(slot_o + (slot_row * SS::kOPitch + col_in_tile) * 4, owner);
        const uint32_t bar = cluster_peer_addr(merge_bar, owner);
#pragma unroll
        for (int d = 0; d < kDTiles; ++d) st_async_f2(dst + d * 32, o_acc[d * 4 + 2 * h], o_acc[d * 4 + 2 * h + 1], bar);
        if ((lane % 4) == 0) st_async_f2(cluster_peer_addr(slot_ml + slot_row * 8, owner), m_log2[h], row_sum[h], bar);
    }
    wait_barrier(&bars.merge_full, 0);  // every peer's partial of this CTA's rows is here
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        if (!finalise[h]) continue;
        // The merge of partial_weight's comment, m in base-2 units.
        float mx = m_log2[h];
        for (int j = 0; j < splits; ++j)
            if (j != rank) mx = fmaxf(mx, slots_ml[j * rows_per_rank + local_row[h]].x);
        const float w_own = partial_weight(m_log2[h], mx);
        float total = w_own * row_sum[h];
#pragma unroll
        for (int d = 0; d < kDTiles; ++d) {
            o_acc[d * 4 + 2 * h] *= w_own;
            o_acc[d * 4 + 2 * h + 1] *= w_own;
        }
        for (int j = 0; j < splits; ++j) {
            if (j == rank) continue;
            const int slot_row = j * rows_per_rank + local_row[h];
            const float2 ml = slots_ml[slot_row];
            const float w = partial_weight(ml.x, mx);
            total += w * ml.y;
            const float *src = slots_o + slot_row * SS::kOPitch + col_in_tile;
#pragma unroll
            for (int d = 0; d < kDTiles; ++d) {
                const float2 o = *reinterpret_cast<const float2 *>(src + d * 8);
                o_acc[d * 4 + 2 * h] += w * o.x;
                o_acc[d * 4 + 2 * h + 1] += w * o.y;
            }
        }
        inv_sum[h] = total > 0.f ? 1.f / total : 0.f;  // the epilogue below writes the merged row
        lse_log2[h] = mx + __log2f(total);
    }
}

// The TMA-store epilogue of one tile (maps.o_tma, no split): once the staging buffer's previous
// store has read it, this warpgroup's normalised O goes into it and one thread stores the block with
// TMA; o_store_pending tells that thread's retire_o_store (fwd_kernel) to free the buffer later.
// `c`: issue_o_store's coordinates, declared in the kernel (here, a local array changed the SASS).
template <class K>
__device__ __forceinline__ void store_o_staged(int32_t (&c)[4], float (&o_acc)[K::kDTiles * 4], float (&inv_sum)[2],
                                               bool &o_store_pending, const FwdMaps &maps, typename K::Bars &bars,
                                               unsigned char *smem_o, int o_buf, int local, int consumer, int warp_in_wg,
                                               int lane, int wg_row0, const Tile &tile) {
    using T = typename K::T;
    constexpr int kW = K::kW;
    // Normalised O goes into this warpgroup's staging buffer with stmatrix, laid out
    // as TMA reads it (64-column panels, 128-byte swizzle: 16-byte chunk c of row r at
    // c ^ (r % 8), conflict-free for the 8 rows a matrix stores), then one thread
    // stores the 64-row block with TMA, which clips the rows past Sq. The threads move
    // on at once: no STG queue to drain before the next tile's GEMMs.
    const int uses = T::kOBufs == 1 ? local * kW + consumer : local;  // earlier uses of the buffer
    if (uses > 0) wait_barrier(&bars.o_free[o_buf], (uses - 1) & 1);
    const uint32_t stage = smem_addr(smem_o) + o_buf * T::kOStageBytes;
    [&] { stage_o<K>(o_acc, inv_sum, stage, warp_in_wg, lane); }();
    ptx::fence_proxy_async(ptx::space_shared);  // the stores, visible to TMA
    asm volatile("bar.sync %0, 128;\n" ::"r"(kW + 3 + consumer) : "memory");
    if (threadIdx.x % 128 == 0) {
        [&] { issue_o_store<K>(c, maps, smem_o, o_buf, wg_row0, tile); }();
        o_store_pending = true;
    }
}

// The tile's row statistics once its key loop is done: the rows' sums (sum_rows) and, kPair, the
// two warpgroups' partials merged (merge_pair); inv_sum, the LSE in base 2 (lse_log2) and the
// attention sink's share (apply_sink).
template <class K, class Trace>
__device__ __forceinline__ void finish_rows(float (&o_acc)[K::kDTiles * 4], float (&row_max)[2], float (&row_sum)[2],
                                            float (&inv_sum)[2], float (&lse_log2)[2], unsigned char *smem_v, int key_part,
                                            float scale_log2, int head, const fc_params &p, Trace &trace) {
    constexpr int kKeySplit = K::kKeySplit;
    [&] { sum_rows<K>(row_sum, inv_sum); }();
    if constexpr (kKeySplit > 1) [&] { merge_pair<K>(o_acc, row_max, row_sum, inv_sum, smem_v, key_part, scale_log2, trace); }();
#pragma unroll
    for (int h = 0; h < 2; ++h) lse_log2[h] = row_max[h] * scale_log2 + __log2f(row_sum[h]);
    [&] { apply_sink(inv_sum, lse_log2, head, p); }();
}

// The tile's outputs once its rows are final (no split, or this CTA's rows of a pushed split): their
// LSE, then O normalised, staged for a TMA store (store_o_staged) or written with 16-byte stores
// from registers (store_o_16b). `c`, `w`: the two stores' scratch arrays, declared in the kernel (as
// local arrays of the stores they changed the kernel's SASS). kVarlen: a TMA store writes whole
// 64-row blocks, so only a warpgroup whose 64 rows all lie in its sequence stages them (a block
// past the sequence's end would overwrite the next sequence's rows), and only with a staging
// buffer of its own (one shared buffer is taken in a fixed ring order); staged_uses counts this
// warpgroup's staged stores (its buffer's phase).
template <class K, class Trace>
__device__ __forceinline__ void store_rows(int32_t (&c)[4], uint32_t (&w)[4], float (&o_acc)[K::kDTiles * 4], float (&inv_sum)[2],
                                           float (&lse_log2)[2], bool (&finalise)[2], bool &o_store_pending, const FwdMaps &maps,
                                           typename K::Bars &bars, unsigned char *smem_o, int o_buf, int local, int consumer,
                                           int warp_in_wg, int lane, int wg_row0, int row0, int seqlen_q, int key_part,
                                           const Tile &tile, const fc_params &p, Trace &trace, int &staged_uses) {
    using T = typename K::T;
    [&] { store_lse(lse_log2, finalise, row0, seqlen_q, lane, key_part, tile, p); }();
    if constexpr (K::kVarlen && T::kOBufs == K::kW) {
        if (maps.o_tma && wg_row0 + 64 <= seqlen_q) {
            store_o_staged<K>(c, o_acc, inv_sum, o_store_pending, maps, bars, smem_o, o_buf, staged_uses, consumer, warp_in_wg,
                              lane, wg_row0, tile);
            ++staged_uses;
            trace(10, 0);
            return;
        }
    }
    if constexpr (T::kOBufs > 0 && !K::kVarlen) {
        if (maps.o_tma && cluster_size() == 1) {  // (split CTAs write their rows from registers)
            store_o_staged<K>(c, o_acc, inv_sum, o_store_pending, maps, bars, smem_o, o_buf, local, consumer, warp_in_wg, lane,
                              wg_row0, tile);
            trace(10, 0);
            return;
        }
    }
    [&] { store_o_16b<K>(w, o_acc, inv_sum, finalise, row0, seqlen_q, key_part, lane, tile, p); }();
}

// The TMA-store epilogue (store_o_staged): the thread that issued this warpgroup's last store of O
// lets the next user of the staging buffer in once the store has read it. It checks only after
// issuing its next S = Q K^T (by then the read is long done), so no thread of the epilogue waits on
// its own store. With one buffer the warpgroups take it in ring order, the order of their epilogues.
template <class K>
__device__ __forceinline__ void release_o_staging(bool &o_store_pending, typename K::Bars &bars, int o_buf) {
    if (o_store_pending) {
        ptx::cp_async_bulk_wait_group_read(ptx::n32_t<0>{});
        ptx::mbarrier_arrive(&bars.o_free[o_buf]);
        o_store_pending = false;
    }
    __syncwarp();
}

}  // namespace sm90
}  // namespace flashcore
