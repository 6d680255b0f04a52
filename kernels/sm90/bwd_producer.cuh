// sm90/bwd_producer.cuh - the Hopper backward's producer warpgroup (sm90/bwd_kernel.cuh has the
// algorithm): the tiles the tile scheduler publishes to the CTA's threads (read_tile), the
// mbarriers' arrival counts (init_barriers), and the producer threads' four jobs: the dQ writer
// (write_dq, with the D=64/128 kernel's reduce_staged_tile; D=256 reduces its own way,
// sm90/bwd_d256.cuh), the tile scheduler and K/V loader (schedule_tiles_and_load_kv), and the two
// step loaders (for_each_step: load_row_terms, load_q_do).
#pragma once

#include "sm90/bwd_traits.cuh"

namespace flashcore {
namespace sm90_bwd {

// The CTA's tiles, as the tile scheduler publishes them: the n-th through slot n % 2, decoded
// (the producer's threads have no registers to spare for the division). Readers release the
// slot as soon as they have a copy; batch < 0 ends the loop.
constexpr int kTileWords = sizeof(Tile) / 4;

// The CTA's n-th tile, read from its slot (released at once).
__device__ __forceinline__ Tile read_tile(BwdBarriers &bars, int n) {
    wait_barrier(&bars.tile_full[n & 1], (n >> 1) & 1);
    Tile tile;
    const volatile int32_t *from = reinterpret_cast<const volatile int32_t *>(&bars.tile[n & 1]);
#pragma unroll
    for (int i = 0; i < kTileWords; ++i) reinterpret_cast<int32_t *>(&tile)[i] = from[i];
    ptx::mbarrier_arrive(&bars.tile_empty[n & 1]);
    return tile;
}

// The mbarriers' arrival counts (one thread, before the CTA's first __syncthreads).
template <typename T>
__device__ __forceinline__ void init_barriers(BwdBarriers &bars) {
    constexpr int kConsumerThreads = T::kConsumerThreads;
    ptx::mbarrier_init(&bars.kv_full, 1);
    ptx::mbarrier_init(&bars.kv_empty, kConsumerThreads);
    for (int s = 0; s < T::kStages; ++s) {
        ptx::mbarrier_init(&bars.step_full[s], 2);  // the Q/dO and the row-terms loaders
        // One arrival per consumer thread: each thread's own reads of the stage's row terms
        // (ordinary loads) come before its release of them (one per warp raced the next
        // bulk copy in compute-sanitizer's racecheck).
        // (D=256: and the dQ writer, once it has read the step's dQ staged over the stage.)
        ptx::mbarrier_init(&bars.step_empty[s], T::kD256 ? kConsumerThreads + 1 : kConsumerThreads);
    }
    ptx::mbarrier_init(&bars.dq_full, 4 * T::kConsumers);
    ptx::mbarrier_init(&bars.dq_empty, 1);
    ptx::mbarrier_init(&bars.claim, 1);
    for (int s = 0; s < 2; ++s) {
        ptx::mbarrier_init(&bars.tile_full[s], 1);
        ptx::mbarrier_init(&bars.tile_empty[s], kConsumerThreads + 3 /* the step loaders, the dQ writer */);
    }
    ptx::fence_mbarrier_init(ptx::sem_release, ptx::scope_cluster);
}

// The dQ writer (one producer thread): the staged dQ of each step, added to the accumulator.
// One bulk reduction (cp.reduce.async.bulk .add.f32) per staged tile: whole lines through L2's
// reduction units, where per-thread atomics cost the kernel ~40% of its time
// (docs/experiments/backward.md). The rows' padding adds zeros. Once a tile's reductions are
// complete, its (batch, KV head) pair counts one more key block (!kVarlen, Workspace::
// key_blocks_done), for the dq conversion that may already run beside this kernel
// (sm90/bwd_rows.cuh). reduce_step(rows, step_all) issues one staged step's reductions to the
// accumulator rows from `rows`, waits until they have read the staging, and releases it (D=256
// has its own: sm90/bwd_d256.cuh).
template <typename T, bool kVarlen, typename ReduceStep>
__device__ __forceinline__ void write_dq(BwdBarriers &bars, const BwdMaps &maps, const Workspace &ws, const fc_bwd_params &p,
                                         const ReduceStep &reduce_step) {
    constexpr int kHeadDim = T::kHeadDim, kBlockM = T::kBlockM;
    const fc_params &f = p.fwd;
    int step_all = 0;  // steps of every tile so far: the barriers' phases
    for (int n = 0;; ++n) {
        const Tile tile = read_tile(bars, n);
        if (tile.batch < 0) break;
        const int m_first = tile.steps.m_first, m_end = m_first + tile.steps.m_count;
        const int head_end = (tile.head_kv + 1) * tile.group;
        // (kVarlen: one batch item, the sequence's rows from its first.)
        const int batch = kVarlen ? 0 : tile.batch;
        const int row0 = kVarlen ? tile.row0 : 0;
        for (int head_q = tile.head_kv * tile.group; head_q < head_end; ++head_q) {
            float *head_rows =
                ws.dq_accum + ws.dq_at(static_cast<int64_t>(batch) * f.heads_q + head_q, row0, kDqPitch<kHeadDim>);
            for (int m = m_first; m < m_end; ++m, ++step_all) {
                wait_barrier(&bars.dq_full, step_all & 1);
                reduce_step(head_rows + static_cast<int64_t>(m) * kBlockM * kDqPitch<kHeadDim>, step_all);
            }
        }
        if constexpr (!kVarlen) {
            asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");  // the tile's reductions are done
            // (The pair's count at its last query head: what the producer's 24 registers hold
            // here; its address from the kernel's parameters for the same reason.)
            count_key_block(maps.key_blocks_done + (batch * static_cast<int>(f.heads_q) + head_end - 1));
        }
    }
    asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");  // the reductions are done
}

// write_dq's step for the D=64/128 kernel: the whole staging tile (its rows padded as the
// accumulator's) in one reduction, then released to the consumers (dq_empty).
template <typename T>
__device__ __forceinline__ void reduce_staged_tile(BwdBarriers &bars, unsigned char *smem, float *rows) {
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n"
                 ::"l"(rows), "r"(smem_addr(smem + T::kOffDq)), "n"(T::kDqStageBytes)
                 : "memory");
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
    asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");  // the staging is read
    ptx::mbarrier_arrive(&bars.dq_empty);
}

// The tile scheduler and K/V loader (one producer thread).
// Publishes the CTA's tiles: the first is blockIdx.x, each next one comes from the workspace's
// counter (zeroed by the row-terms kernel), so that a CTA's next K/V and first steps load while
// its consumers finish the current tile, and tiles of different lengths (causal) balance. Then
// loads the tile's K and V once the consumers are done with the previous tile's.
template <typename T, bool kCausal, bool kBand, bool kVarlen>
__device__ __forceinline__ void schedule_tiles_and_load_kv(BwdBarriers &bars, unsigned char *smem, const BwdMaps &maps,
                                                           const fc_bwd_params &p, const Workspace &ws, int tiles) {
    const fc_params &f = p.fwd;
    int32_t c[4];
    int index = static_cast<int>(blockIdx.x), kv_round = 0;
    for (int n = 0;; ++n) {
        wait_barrier(&bars.tile_empty[n & 1], ((n >> 1) & 1) ^ 1);  // the first round passes at once
        int key_row0 = 0;  // kVarlen: the sequence's first key row
        Tile tile;
        bool more;
        if constexpr (kVarlen) {  // (the list's length read each time: held, it spilled at 24 registers)
            more = varlen_tile_at<T::kBlockM, T::kBlockN, kCausal>(index, p.workspace, f, tile, &key_row0);
        } else {
            tile = tile_at<T::kBlockM, T::kBlockN, kCausal, kBand>(index, maps, f);
            more = index < tiles;
        }
        if (!more) tile.batch = -1;
        volatile int32_t *to = reinterpret_cast<volatile int32_t *>(&bars.tile[n & 1]);
#pragma unroll
        for (int i = 0; i < kTileWords; ++i) to[i] = reinterpret_cast<const int32_t *>(&tile)[i];
        ptx::mbarrier_arrive(&bars.tile_full[n & 1]);
        if (!more) return;
        if (tile.steps.count > 0) {
            wait_barrier(&bars.kv_empty, (kv_round & 1) ^ 1);
            ++kv_round;
            ptx::mbarrier_arrive_expect_tx(ptx::sem_release, ptx::scope_cta, ptx::space_shared,
                                           &bars.kv_full, 2 * T::kKVBytes);
            for (int panel = 0; panel < T::kPanels; ++panel) {
                const int key_row = key_row0 + tile.n_start, batch = kVarlen ? 0 : tile.batch;
                set_coords(c, maps.k_order, panel * 64, key_row, tile.head_kv, batch);
                tma_load(smem + T::kOffK + panel * T::kKVPanelBytes, &maps.k, c, &bars.kv_full);
                set_coords(c, maps.v_order, panel * 64, key_row, tile.head_kv, batch);
                tma_load(smem + T::kOffV + panel * T::kKVPanelBytes, &maps.v, c, &bars.kv_full);
            }
        }
        // The next tile is claimed once this one's last step is being loaded: claimed any
        // earlier, a CTA would hold it through all of a long tile while others idle
        // (causal tiles differ in length); any later, the loads of its first steps wait.
        wait_barrier(&bars.claim, n & 1);
        // (kVarlen: the grid's size read again here; held across the loop, it spilled at 24 registers.)
        int ctas = static_cast<int>(gridDim.x);
        if constexpr (kVarlen) asm volatile("mov.u32 %0, %%nctaid.x;\n" : "=r"(ctas));
        index = atomicAdd(ws.tile_counter, 1) + ctas;
    }
}

// The steps of the CTA's tiles, for a step loader: waits for each step's stage to be free, then
// load(stage, full barrier, head_q, batch, query row, key row) issues the step's share.
// kVarlen: the query row passed is the packed row (the sequence's first row added), batch 0.
template <typename T, bool kVarlen, typename Load>
__device__ __forceinline__ void for_each_step(BwdBarriers &bars, Load load, bool signal_claim) {
    constexpr int kBlockM = T::kBlockM, kStages = T::kStages;
    for (int n = 0, step_all = 0;; ++n) {
        const Tile tile = read_tile(bars, n);
        if (tile.batch < 0) return;
        const int m_first = tile.steps.m_first, m_end = m_first + tile.steps.m_count;
        const int batch = kVarlen ? 0 : tile.batch, head_end = (tile.head_kv + 1) * tile.group;
        const int row0 = kVarlen ? tile.row0 : 0;
        for (int head_q = tile.head_kv * tile.group; head_q < head_end; ++head_q)
            for (int m = m_first; m < m_end; ++m, ++step_all) {
                const int stage = step_all % kStages;
                wait_barrier(&bars.step_empty[stage], ((step_all / kStages) & 1) ^ 1);
                load(stage, &bars.step_full[stage], head_q, batch, row0 + m * kBlockM, tile.n_start);
            }
        if (signal_claim) ptx::mbarrier_arrive(&bars.claim);
    }
}

// The row-terms loader (one producer thread): each step's delta and LSE2 into the ring, one bulk
// copy.
// kVarlen: a step may start at any packed row, whose (delta, LSE2) pairs lie interleaved
// (sm90/bwd_rows.cuh), and a bulk copy at a 16-byte boundary: one copy of kPackedRowSpan rows from
// the step's first row rounded down to even (the consumers skip the row before it); the row-terms
// kernel wrote every row it reaches. (A TMA tensor load of a (64 rows, delta and LSE2) box of
// the two arrays instead faulted with an illegal instruction on the H200.)
template <typename T, bool kVarlen>
__device__ __forceinline__ void load_row_terms(BwdBarriers &bars, unsigned char *smem, const Workspace &ws,
                                               const fc_bwd_params &p) {
    const fc_params &f = p.fwd;
    for_each_step<T, kVarlen>(bars, [&](int stage, uint64_t *full, int head_q, int batch, int m_start, int) {
        unsigned char *slot = smem + T::kOffRowTerms + stage * T::kRowTermsSlotBytes;
        if constexpr (kVarlen) {
            constexpr int kSpanBytes = kPackedRowSpan * 8;
            ptx::mbarrier_arrive_expect_tx(ptx::sem_release, ptx::scope_cta, ptx::space_shared, full, kSpanBytes);
            ptx::cp_async_bulk(ptx::space_cluster, ptx::space_global, slot,
                               ws.row_terms + ws.packed_delta_at(head_q, m_start & ~1), kSpanBytes, full);
        } else {
            ptx::mbarrier_arrive_expect_tx(ptx::sem_release, ptx::scope_cta, ptx::space_shared, full, T::kRowTermsBytes);
            const int64_t slice = static_cast<int64_t>(batch) * f.heads_q + head_q;
            ptx::cp_async_bulk(ptx::space_cluster, ptx::space_global, slot, ws.row_terms + ws.delta_at(slice, m_start),
                               T::kRowTermsBytes, full);
        }
    }, false);
}

// The Q/dO loader (one producer thread): each step's Q and dO (and kMaskBoolTiles: its mask
// tile) into the ring by TMA; it signals the tile scheduler as it issues a tile's last step.
template <typename T, int kMask, bool kVarlen>
// (smem by reference: taken by value, it changed the code ptxas got for the whole kernel.)
__device__ __forceinline__ void load_q_do(BwdBarriers &bars, unsigned char *const &smem, const BwdMaps &maps,
                                          const fc_bwd_params &p) {
    const fc_params &f = p.fwd;
    for_each_step<T, kVarlen>(bars, [&](int stage, uint64_t *full, int head_q, int batch, int m_start, int n_start) {
        ptx::mbarrier_arrive_expect_tx(ptx::sem_release, ptx::scope_cta, ptx::space_shared, full,
                                       2 * T::kQBytes + T::kMaskTileBytes);
        int32_t c[4];
        if constexpr (kMask == kMaskBoolTiles) {
            // (keys, queries) at n_start, m_start; a broadcast head or batch is a dim of size 1.
            set_coords(c, maps.mask_order, n_start, m_start, f.mask_stride_h != 0 ? head_q : 0,
                       f.mask_stride_b != 0 ? batch : 0);
            tma_load(smem + T::kOffMask + stage * T::kMaskTileBytes, &maps.mask, c, full);
        }
        for (int panel = 0; panel < T::kPanels; ++panel) {
            set_coords(c, maps.q_order, panel * 64, m_start, head_q, batch);
            tma_load(smem + T::kOffQ + stage * T::kStageStride + panel * T::kQPanelBytes, &maps.q, c, full);
            set_coords(c, maps.dout_order, panel * 64, m_start, head_q, batch);
            tma_load(smem + T::kOffDo + stage * T::kStageStride + panel * T::kQPanelBytes, &maps.dout, c, full);
        }
    }, true);
}

}  // namespace sm90_bwd
}  // namespace flashcore
