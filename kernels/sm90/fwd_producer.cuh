// sm90/fwd_producer.cuh - the Hopper forward's load pipeline (sm90/fwd_kernel.cuh): its mbarriers'
// set-up (init_barriers) and the producer (load_tiles), the one thread of warpgroup 0 that issues
// every TMA load of a CTA, Q into its buffer once per tile and the tile's key tiles (K, V and,
// kMasked, the mask rows) into the kStages-deep ring, each completing on its "full" mbarrier and
// waiting for the consumers' "empty" arrivals before it reuses a buffer.
#pragma once

#include "common/fast_div.cuh"
#include "flashcore.h"
#include "sm90/fwd_split.cuh"  // SplitSlots, cluster_size, cluster_rank
#include "sm90/fwd_steps.cuh"
#include "sm90/fwd_traits.cuh"
#include "sm90/ptx.cuh"
#include "sm90/varlen_blocks.cuh"  // SeqSpan

#include <cuda.h>
#include <cuda/ptx>
#include <stdint.h>

namespace flashcore {
namespace sm90 {

// The producer thread's loop over this CTA's tiles, in the order the consumers take them
// (snake_tile; kv_splits() and key_range(m_block) are fwd_kernel's, so both sides agree on the
// schedule). `c`: the coordinates' scratch array, declared in the kernel (as a local array of
// this function it changed the kernel's SASS).
// tile_of(t, seq): tile t and its sequence's lengths (fwd_kernel's decode, dense or packed).
// A packed call's tensor maps have one batch item of every sequence's rows: its tiles' rows start
// at their sequence's first row (Tile::batch for queries, SeqSpan::k0 for keys) at batch 0.
template <class K, class KvSplits, class KeyRangeOf, class TileOf>
__device__ __forceinline__ void load_tiles(int32_t (&c)[4], const FwdMaps &maps, const fc_params &p,
                                           typename K::Bars &bars, unsigned char *smem_q, unsigned char *smem_k,
                                           unsigned char *smem_v, unsigned char *smem_mask, int n_tiles,
                                           TileOf &tile_of, KvSplits &kv_splits, KeyRangeOf &key_range) {
    using T = typename K::T;
    constexpr int kBlockM = K::kBlockM, kBlockN = K::kBlockN, kStages = K::kStages, kShape = K::kShape;
    int kv_iter = 0;  // K/V tiles loaded so far by this CTA: ring stage and phase
    int q_loads = 0;  // Q tiles loaded so far by this CTA: Q buffer phase
    int local = 0;    // tiles taken by this CTA
    for (int t = snake_tile(0, n_tiles, kv_splits()); t < n_tiles; t = snake_tile(++local, n_tiles, kv_splits())) {
        SeqSpan seq;
        const Tile tile = tile_of(t, seq);
        const int head_kv = maps.group_div.div(tile.head);
        const auto keys = key_range(tile.m_block, seq);
        const int q_row0 = K::kVarlen ? tile.batch : 0, batch = K::kVarlen ? 0 : tile.batch;
        if (keys.first == keys.end) continue;  // nothing to load (the consumers skip it too)
        // The Q buffer frees once every consumer warp has issued its last S = Q K^T.
        const int qb = q_loads % T::kQBufs;
        wait_barrier(&bars.q_empty[qb], ((q_loads++ / T::kQBufs) & 1) ^ 1);
        ptx::mbarrier_arrive_expect_tx(ptx::sem_release, ptx::scope_cta, ptx::space_shared, &bars.q_full[qb],
                                       T::kQBytes);
        for (int panel = 0; panel < T::kPanels; ++panel) {
            set_coords(c, maps.q_order, panel * 64, q_row0 + tile.m_block * kBlockM, tile.head, batch);
            tma_load(smem_q + qb * T::kQBytes + panel * T::kQPanelBytes, &maps.q, c, &bars.q_full[qb]);
        }
        if constexpr (kShape == kPair) {
            // A pair CTA on a small grid whose key tiles all fit the ring (maps.pair_lead_load,
            // launch_fwd_config) loads K0 alone and, once it has landed, K2, V0, K1, K3, V1,
            // V2, V3: the first S waits for one tile instead of for a share of all nine
            // loads in flight at once (TMA works on its queued copies together: in a probe of
            // 64 CTAs each taking 8 x 16 KB from L2, the first copy landed ~3000 cycles after
            // issue with all eight queued, ~2200 alone). Then the tiles in the order the two
            // warpgroups need them: warpgroup 0's second K (its S GEMMs may go out together,
            // pair_s_ahead), its first V, then warpgroup 1's keys. Stage j holds key tile
            // first + j in the ring's first round, so no stage needs an empty wait.
            // Measured (H100, fp16, CUDA graph us per call, two passes; docs/experiments/sessions-17-23.md,
            // twenty-second session), interleaved K0 V0 K1 V1 ... -> this order: B=1 H=8
            // 512 x 512 5.30-5.32 -> 4.85-4.89, causal 5.27-5.34 -> 5.01-5.06, 256 x 512
            // 5.24-5.33 -> 4.80-4.81, 384 x 384 causal 4.72-4.77 -> 4.60-4.63. On grids of more
            // than half the SMs the wait lost (B=2 H=8 512 x 512: 5.26-5.34 -> 5.49-5.62).
            const int nk = keys.end - keys.first;
            if (maps.pair_lead_load && kv_iter == 0 && nk <= kStages) {
                auto load = [&](int j, bool v) {  // key tile first + j's K or V into stage j
                    if (j >= nk) return;
                    uint64_t *full = v ? &bars.v_full[j] : &bars.k_full[j];
                    ptx::mbarrier_arrive_expect_tx(ptx::sem_release, ptx::scope_cta, ptx::space_shared, full,
                                                   T::kKVTileBytes);
                    for (int panel = 0; panel < T::kPanels; ++panel) {
                        set_coords(c, v ? maps.v_order : maps.k_order, panel * 64, (keys.first + j) * kBlockN,
                                   head_kv, tile.batch);
                        tma_load((v ? smem_v : smem_k) + j * T::kKVTileBytes + panel * T::kKVPanelBytes,
                                 v ? &maps.v : &maps.k, c, full);
                    }
                };
                load(0, false);
                wait_barrier(&bars.k_full[0], 0);
                load(2, false);
                load(0, true);
                load(1, false);
                load(3, false);
                load(1, true);
                load(2, true);
                load(3, true);
                kv_iter += nk;
                continue;
            }
        }
        for (int n = keys.first; n < keys.end; ++n, ++kv_iter) {
            const int stage = kv_iter % kStages;
            const uint32_t phase = (kv_iter / kStages) & 1;
            wait_barrier(&bars.k_empty[stage], phase ^ 1);  // the first round passes at once
            ptx::mbarrier_arrive_expect_tx(ptx::sem_release, ptx::scope_cta, ptx::space_shared,
                                           &bars.k_full[stage], T::kKVTileBytes);
            for (int panel = 0; panel < T::kPanels; ++panel) {
                set_coords(c, maps.k_order, panel * 64, seq.k0 + n * kBlockN, head_kv, batch);
                tma_load(smem_k + stage * T::kKVTileBytes + panel * T::kKVPanelBytes, &maps.k, c,
                         &bars.k_full[stage]);
            }
            wait_barrier(&bars.v_empty[stage], phase ^ 1);
            ptx::mbarrier_arrive_expect_tx(ptx::sem_release, ptx::scope_cta, ptx::space_shared,
                                           &bars.v_full[stage], T::kKVTileBytes + T::kMaskTileBytes);
            for (int panel = 0; panel < T::kPanels; ++panel) {
                set_coords(c, maps.v_order, panel * 64, seq.k0 + n * kBlockN, head_kv, batch);
                tma_load(smem_v + stage * T::kKVTileBytes + panel * T::kKVPanelBytes, &maps.v, c,
                         &bars.v_full[stage]);
            }
            // kMasked: the block's mask rows for these keys ride the V tile's barrier (the
            // consumers read them in the softmax of S(n) and free the stage after P V(n)). A
            // broadcast head or batch dim of the mask is read at coordinate 0.
            if constexpr (K::kMaskTiles) {
                set_coords(c, maps.mask_order, n * kBlockN, tile.m_block * kBlockM, p.mask_stride_h != 0 ? tile.head : 0,
                           p.mask_stride_b != 0 ? tile.batch : 0);
                tma_load(smem_mask + stage * T::kMaskTileBytes, &maps.mask, c, &bars.v_full[stage]);
            }
        }
    }
}

// Thread 0 sets up the CTA's mbarriers (and, kPushMerge in a cluster, opens merge_full's first
// phase for the peers' pushes), made visible to the cluster before anyone waits on them.
template <class K>
__device__ __forceinline__ void init_barriers(typename K::Bars &bars) {
    using T = typename K::T;
    constexpr int kHeadDim = K::kHeadDim, kBlockM = K::kBlockM, kStages = K::kStages, kW = K::kW, kKeySplit = K::kKeySplit;
    for (int b = 0; b < T::kQBufs; ++b) {
        ptx::mbarrier_init(&bars.q_full[b], 1);
        ptx::mbarrier_init(&bars.q_empty[b], 4 * kW);  // one arrival per consumer warp
    }
    for (int s = 0; s < kStages; ++s) {
        ptx::mbarrier_init(&bars.k_full[s], 1);
        ptx::mbarrier_init(&bars.v_full[s], 1);
        ptx::mbarrier_init(&bars.k_empty[s], 4 * kW / kKeySplit);  // each tile has one reader per row group
        ptx::mbarrier_init(&bars.v_empty[s], 4 * kW / kKeySplit);
    }
    for (int b = 0; b < T::kOBufs; ++b) ptx::mbarrier_init(&bars.o_free[b], 1);  // the issuing thread
    if (T::kPushMerge && cluster_size() > 1) {
        // One arrival (now) and the bytes the peers will push: (splits - 1) partials of this
        // CTA's rows. The arrival comes first, so no peer's bytes can find the phase open.
        using SS = SplitSlots<kHeadDim, kBlockM>;
        const int splits = cluster_size(), rows_per_rank = SS::rows_per_rank(splits);
        const int my_rows = min(kBlockM, (cluster_rank() + 1) * rows_per_rank) - cluster_rank() * rows_per_rank;
        ptx::mbarrier_init(&bars.merge_full, 1);
        ptx::mbarrier_arrive_expect_tx(ptx::sem_release, ptx::scope_cluster, ptx::space_shared, &bars.merge_full,
                                       (splits - 1) * my_rows * SS::kRowBytes);
    }
    ptx::fence_mbarrier_init(ptx::sem_release, ptx::scope_cluster);
}

}  // namespace sm90
}  // namespace flashcore
