// sm90/bwd_kernel.cuh - the Hopper (sm_90a) fused attention backward: TMA + wgmma + warp
// specialization, one pass over key blocks.
//
// What it computes (as kernels/bwd_sm80.cuh, whose comment has the formulas): for one key block
// of kBlockN = 128 keys of one KV head, dK and dV over every query row of the KV head's group of
// query heads that sees those keys, and each query tile's share of dQ:
//     S^T = K Q^T,  P^T = exp2(S^T scale log2(e) - LSE2),  dV += P^T dO,
//     dP^T = V dO^T,  dS^T = P^T (dP^T - delta),  dK += dS^T Q,  dQ += dS K
// LSE2 and delta come from the row-terms kernel (sm90/bwd_rows.cuh); scale is applied to dK here
// and to dQ when its fp32 accumulator is converted.
//
// How (one CTA = one producer warpgroup and two consumer warpgroups of 64 keys each; at most one
// CTA per SM, each taking tiles (key block, KV head, batch) until none are left):
//   * The producer's threads each have one job: a tile scheduler that claims the CTA's next tile
//     from a counter in the workspace (when the current tile's last step is being loaded) and
//     publishes it decoded, then loads the tile's K and V (TMA) once the consumers are done with
//     the previous tile's; a Q/dO loader and a row-terms loader that stream the (query head,
//     query tile) steps of kBlockM = 64 rows into a kStages ring (Q and dO by TMA, 128-byte
//     swizzled; the tile's delta and LSE2 as one bulk copy), each stage completing on an mbarrier
//     ("full") and released by the consumer threads ("empty"); and the dQ writer (below). A
//     tile's first steps and K/V thus load while the consumers finish the previous tile and
//     write its dK and dV.
//   * Each consumer warpgroup computes S^T and dP^T for its 64 keys with both operands in shared
//     memory (K-major), P^T and dS^T in fp32 registers, then dV and dK with P^T and dS^T straight
//     from registers (the accumulator layout of S^T is the A-fragment layout) against Q and dO
//     read N-major (no transpose pass).
//   * dQ needs dS = (dS^T)^T as an A operand: each warpgroup writes its dS^T rows to shared
//     memory in the 128-byte-swizzled layout wgmma reads M-major (transposed A), and dQ for the
//     tile comes from one more GEMM against K (read N-major). The warpgroups split dQ's columns
//     (each reads both warpgroups' dS^T: a barrier of the two). Two dS^T buffers, so a step may
//     write one while the previous step's GEMM reads the other.
//   * D=64 holds the tile's K and V rows in registers as the A operands of S^T and dP^T (shared
//     memory bandwidth, not the tensor cores, bounds the step), and issues a step's S^T and dP^T
//     GEMMs ahead, right behind the previous step's dQ GEMM, so that they run while the
//     consumers stage dQ. At D=128 the registers for either are taken.
//   * A step's row terms go to registers early: its LSE2 before its score GEMMs are issued, its
//     delta before dP^T is waited for (read after them, each load waited behind the GEMMs'
//     shared-memory traffic).
//   * The tile's dQ goes to an fp32 staging tile in shared memory, and the second warp of the
//     producer warpgroup adds it to the fp32 accumulator in global memory with one bulk
//     reduction (cp.reduce.async.bulk .add.f32): dQ sums over key blocks in whatever order they
//     finish, so its last bits may vary from run to run. Once a tile's reductions are complete
//     it counts the tile for its (batch, KV head) pair, so that the dq conversion (launched
//     programmatically, sm90/bwd_launch.cuh) converts each pair's rows while other tiles run.
//   * At the tile's end each warpgroup's dK and dV (fp32 registers) go out through its half of
//     the dQ staging tile, packed, in 16-byte stores that fill whole 128-byte lines
//     (store_dk_dv; at D=128 the band and packed variants store from registers: they spilled).
//   * GQA: the group's query heads are steps of the same CTA, so dK and dV are summed in
//     registers, in a fixed order. Causal (top-left): steps start at the first query tile that
//     sees the block's first key; scores are masked only in tiles that cross the diagonal and
//     in the ragged last key block.
//   * Band (kBand, with the causal configuration; fc_band_bounds in c_src/flashcore.h: a sliding
//     window, or causal aligned bottom-right): row i sees keys i + lo .. i + hi. A key block's
//     steps are the query tiles whose rows see any of its keys (tile_at); the others are not
//     visited, so a block no row sees writes zero dK and dV. Scores are masked per element only
//     in the tiles an edge of the band crosses. A row that sees no key has LSE -inf, so LSE2 =
//     +inf (sm90/bwd_rows.cuh): its P, dS and dQ are zeros.
//   * Rows past Sq are zero-filled by TMA and have LSE2 = +inf (P = 0); keys past Sk are
//     zero-filled and masked.
//   * Packed sequences (kVarlen, fc_params.cu_seq_q): tiles are (listed key block, KV head) of a
//     list built on the device, sorted by work (varlen_tile_at, sm90/varlen_blocks.cuh); a tile's
//     rows count from its sequence's first key and query (Q, dO, K and V loads at the sequence's
//     rows of one-batch tensor maps, dQ reduced at its rows), and queries and keys past the
//     sequence's ends (the next sequence's rows) are masked like keys past Sk. Causal is top-left
//     in each sequence.
//   * Softcap (kSoftcap, beside causal, non-causal or a band): scores are t = tanh(S^T scale
//     / softcap), P^T = exp2(t softcap log2(e) - LSE2), and dS^T gains the factor 1 - t^2. The
//     variant waits for dP^T before the softmax and packs P^T and dS^T into their fragments pair
//     by pair, so that no fp32 copy of either outlives its element (register budget).
//
// Below, the kernel (last) calls the producer threads' jobs and the consumers' per-step pieces,
// each a function defined before it. The types are in sm90/bwd_traits.cuh, the launcher in
// sm90/bwd_launch.cuh.
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

// ---------------- producer ----------------

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

// ---------------- consumers ----------------

// The dQ staging rows' padding, zeroed once by the consumer threads.
// The staging rows' padding goes out with every reduction: zeros (the stores reach the async
// proxy through each thread's fence before its first dq_full arrival).
template <typename T>
__device__ __forceinline__ void zero_dq_padding(unsigned char *smem) {
    for (int i = threadIdx.x - 128; i < T::kBlockM * 2; i += T::kConsumerThreads) {
        const int row = i / 2, half = i % 2;
        *reinterpret_cast<float4 *>(smem + T::kOffDq + row * T::kDqStagePitch + T::kHeadDim * 4 + half * 16) =
            make_float4(0.f, 0.f, 0.f, 0.f);
    }
}

// acc (64 rows x 64 queries) = rows of `a_rows` (64 keys, K-major, panels kKVPanelBytes apart)
// times the step's `b_tile` (64 queries, K-major): S^T = K Q^T and dP^T = V dO^T.
template <typename T, typename Elem>
__device__ __forceinline__ void issue_scores(float (&acc)[32], uint32_t a_rows, uint32_t b_tile) {
    const uint64_t desc_a0 = smem_desc(a_rows, 16, 1024), desc_b0 = smem_desc(b_tile, 16, 1024);
#pragma unroll
    for (int kk = 0; kk < T::kHeadDim / 16; ++kk) {
        const uint32_t offset = (kk % 4) * 32;  // 16 columns = 32 bytes along a 128-byte row
        Wgmma<64, WgmmaA::SS, Elem>::template mma<0>(acc, desc_a0 + ((kk / 4) * T::kKVPanelBytes + offset) / 16,
                                                     desc_b0 + ((kk / 4) * T::kQPanelBytes + offset) / 16, kk > 0);
    }
    wgmma_commit();
}

// D=64 (kKeysInRegisters): the same product with this warpgroup's K or V rows as A fragments
// in registers (loaded once per tile), so that only Q or dO is read from shared memory.
template <typename T, typename Elem>
__device__ __forceinline__ void issue_scores_rs(float (&acc)[32], const uint32_t (&a)[T::kHeadDim / 16][4], uint32_t b_tile) {
    const uint64_t desc_b0 = smem_desc(b_tile, 16, 1024);
#pragma unroll
    for (int kk = 0; kk < T::kHeadDim / 16; ++kk)
        Wgmma<64, WgmmaA::RS, Elem>::template mma<0>(acc, a[kk], desc_b0 + ((kk / 4) * T::kQPanelBytes + (kk % 4) * 32) / 16,
                                                     kk > 0);
    wgmma_commit();
}

// acc (64 keys x D) += frag (64 keys x 64 queries, registers) times the step's `tile` (64
// queries x D) read N-major: dV += P^T dO and dK += dS^T Q.
template <typename T, typename Elem>
__device__ __forceinline__ void issue_accumulate(float (&acc)[T::kHeadDim / 2], const uint32_t (&frag)[4][4], uint32_t tile) {
    const uint64_t desc0 = smem_desc(tile, T::kQPanelBytes, 1024);
#pragma unroll
    for (int kk = 0; kk < T::kBlockM / 16; ++kk)  // 16 queries = two 8-row groups of 1024 bytes
        Wgmma<T::kHeadDim, WgmmaA::RS, Elem>::template mma<1>(acc, frag[kk], desc0 + kk * 2048 / 16, 1);
    wgmma_commit();
}

// Waits for step `step_index`'s stage (Q, dO and the row terms) to land.
template <typename T>
__device__ __forceinline__ void wait_step(BwdBarriers &bars, int step_index) {
    wait_barrier(&bars.step_full[step_index % T::kStages], (step_index / T::kStages) & 1);
}

// S^T and dP^T of step `step_index` (of every tile so far): into s and dp (the caller has waited
// for its stage: wait_step); K and V as register fragments (kKeysInRegisters) or read from
// shared memory (k_rows, v_rows).
template <typename T, typename Elem, bool kIssueAhead, bool kKeysInRegisters>
__device__ __forceinline__ void issue_scores_of_step(int step_index, float (&s)[32], float (&dp)[32],
                                                     const uint32_t (&k_frag)[T::kHeadDim / 16][4],
                                                     const uint32_t (&v_frag)[T::kHeadDim / 16][4], uint32_t k_rows,
                                                     uint32_t v_rows, uint32_t base) {
    const int stage = step_index % T::kStages;
    if constexpr (!kIssueAhead) {
        fence_registers(s);
        fence_registers(dp);
    }
    wgmma_fence();
    if constexpr (kKeysInRegisters) {
        issue_scores_rs<T, Elem>(s, k_frag, base + T::kOffQ + stage * T::kStageStride);
        issue_scores_rs<T, Elem>(dp, v_frag, base + T::kOffDo + stage * T::kStageStride);
    } else {
        issue_scores<T, Elem>(s, k_rows, base + T::kOffQ + stage * T::kStageStride);
        issue_scores<T, Elem>(dp, v_rows, base + T::kOffDo + stage * T::kStageStride);
    }
}

// The S accumulator layout of two 8-column tiles is the A-fragment layout of one 16-column step.
template <typename Elem>
__device__ __forceinline__ void to_frag(uint32_t (&frag)[4][4], const float (&acc)[32]) {
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
#pragma unroll
        for (int i = 0; i < 4; ++i) frag[kk][i] = pack2<Elem>(acc[8 * kk + 2 * i], acc[8 * kk + 2 * i + 1]);
}

// D=64 (kKeysInRegisters): the fragments of this warpgroup's 64 rows of K or V (128-byte
// swizzled, as TMA wrote them): per 16-column step, ldmatrix's four 8x8 matrices are rows 0-7 /
// 8-15 of the warp's 16, at columns 0-7 / 8-15, which is wgmma's A-fragment order.
template <int kHeadDim>
__device__ __forceinline__ void load_key_frags(uint32_t (&frag)[kHeadDim / 16][4], uint32_t rows, int warp_in_wg, int lane) {
    const int row = warp_in_wg * 16 + lane % 16;
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
        const int chunk = 2 * kk + lane / 16;  // 16-byte chunk of the 128-byte row
        ldmatrix_x4(frag[kk], rows + row * 128 + ((chunk ^ (row & 7)) << 4));
    }
}

// The row terms (delta or LSE2) of two consecutive rows of a stage: kRowStride 1, the dense
// layout (each array on its own, one 8-byte load); 2, a packed call's (delta, LSE2) pairs.
template <int kRowStride>
__device__ __forceinline__ float2 row_pair(const float *at) {
    if constexpr (kRowStride == 1) return *reinterpret_cast<const float2 *>(at);
    else return make_float2(at[0], at[kRowStride]);
}

// Masked calls (kMaskBool, kMaskAdditive): the step's mask rows (query tile m_start, key block
// n_start) toward L1, one 32-key piece of one row per consumer thread.
template <typename Mask>
__device__ __forceinline__ void prefetch_mask_rows(const Mask &mask, const fc_params &f, int m_start,
                                                   int n_start, int seqlen_k) {
    const int t = threadIdx.x - 128, query = m_start + t / 4, key = n_start + t % 4 * 32;
    if (query < static_cast<int>(f.seqlen_q) && key < seqlen_k) mask.prefetch(query, key);
}

// The row terms (delta or LSE2, kRowStride as in row_pair) of this thread's 16 query columns:
// columns 8 j + col_in_tile, +1 in element j.
template <int kRowStride>
__device__ __forceinline__ void load_row_terms_of_columns(float2 (&rows)[8], const float *at, int col_in_tile) {
#pragma unroll
    for (int j = 0; j < 8; ++j) rows[j] = row_pair<kRowStride>(at + kRowStride * (8 * j + col_in_tile));
}

// P^T = exp2(S^T scale log2(e) - LSE2[query]) of the step's scores (lse_rows(j): the LSE2 of
// this thread's columns in 8-column tile j), masked where keys pass Sk,
// the diagonal or the band, packed into p_frag (kSoftcap: dS^T too, into dp and ds_frag).
// masked_tile: some keys of the step are masked; key_in_cta: this thread's first key from the
// block's first (first_key - n_start). kVarlen: queries from seqlen_q on (the next sequence's rows
// or rows of none) are masked too.
template <typename T, typename Elem, bool kCausal, int kMask, bool kBand, bool kSoftcap, bool kVarlen, typename LseRows>
__device__ __forceinline__ void softmax(uint32_t (&p_frag)[4][4], uint32_t (&ds_frag)[4][4], float (&s)[32], float (&dp)[32],
                                        const float *delta, const LseRows &lse_rows, const uint8_t *mask_tile,
                                        const MaskSliceOf<Elem, kMask> &mask, const BwdMaps &maps, const fc_params &f,
                                        float scale_log2, bool masked_tile, int m_start, int first_key, int key_in_cta,
                                        int col_in_tile, int seqlen_k, int seqlen_q) {
    constexpr bool kMaskElements = kMask == kMaskBool || kMask == kMaskAdditive;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        const float2 l = lse_rows(j);
        [[maybe_unused]] float p_soft[4];  // kSoftcap: this 8-column tile's P
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            [[maybe_unused]] float t = 0.f;
            if constexpr (kSoftcap) s[4 * j + e] = t = fast_tanh(s[4 * j + e] * maps.softcap_in);
            float x = fmaf(s[4 * j + e], scale_log2, -((e & 1) ? l.y : l.x));
            const int key = first_key + 8 * (e >> 1), query = m_start + 8 * j + col_in_tile + (e & 1);
            if constexpr (kMaskElements) {
                // (Rows past Sq have LSE2 = +inf: P = 0 without their mask.)
                if (key < seqlen_k && query < static_cast<int>(f.seqlen_q)) x = mask.apply(x, query, key);
            } else if constexpr (kMask == kMaskBoolTiles) {
                // The staged tile (zeros past Sk and Sq: masked, as those are anyway).
                const int offset = (8 * j + col_in_tile + (e & 1)) * T::kMaskBoxKeys + key_in_cta + 8 * (e >> 1);
                if (mask_tile[offset] == 0) x = -INFINITY;
            }
            if constexpr (kBand) {
                if (masked_tile && (key >= seqlen_k || key - query < f.band_lo_ || key - query > f.band_hi_)) x = -INFINITY;
            } else if (masked_tile && (key >= seqlen_k || (kCausal && key > query) || (kVarlen && query >= seqlen_q))) {
                x = -INFINITY;
            }
            if constexpr (kSoftcap) {
                // dS^T = P^T (dP^T - delta) times d(softcap t)/d(x scale) = 1 - t^2, into dp.
                p_soft[e] = fast_exp2(x);
                dp[4 * j + e] = p_soft[e] * (1.f - t * t) * (dp[4 * j + e] - delta[8 * j + col_in_tile + (e & 1)]);
                if (e & 1) {  // a pair done: to its fragments (to_frag's layout: pair h of 8-column
                              // tile j is fragment j / 2, 2 (j % 2) + h)
                    const int h = e >> 1;
                    p_frag[j / 2][2 * (j % 2) + h] = pack2<Elem>(p_soft[e - 1], p_soft[e]);
                    ds_frag[j / 2][2 * (j % 2) + h] = pack2<Elem>(dp[4 * j + e - 1], dp[4 * j + e]);
                }
            } else {
                s[4 * j + e] = fast_exp2(x);
            }
        }
    }
    if constexpr (!kSoftcap) to_frag<Elem>(p_frag, s);
}

// dS^T = P^T (dP^T - delta[query]) into dp (s holds P^T), packed into ds_frag (delta_rows(j): the
// delta of this thread's columns in 8-column tile j).
template <typename Elem, typename DeltaRows>
__device__ __forceinline__ void compute_ds(uint32_t (&ds_frag)[4][4], float (&dp)[32], const float (&s)[32],
                                           const DeltaRows &delta_rows) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        const float2 d = delta_rows(j);
#pragma unroll
        for (int e = 0; e < 4; ++e) dp[4 * j + e] = s[4 * j + e] * (dp[4 * j + e] - ((e & 1) ? d.y : d.x));
    }
    to_frag<Elem>(ds_frag, dp);
}

// dS^T of this thread's keys (rows first_row and first_row + 8, counted from the block's first
// key) to the buffer at ds_tile, in the 128-byte-swizzled layout wgmma reads M-major, visible to
// wgmma once the writers meet on a barrier.
__device__ __forceinline__ void write_ds_t(const uint32_t (&ds_frag)[4][4], uint32_t ds_tile, int first_row, int lane) {
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int row = first_row + 8 * (i & 1), chunk = 2 * kk + (i >> 1);
            const uint32_t addr = ds_tile + row * 128 + ((chunk ^ (row & 7)) << 4) + 4 * (lane % 4);
            asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(ds_frag[kk][i]) : "memory");
        }
    ptx::fence_proxy_async(ptx::space_shared);  // the stores, visible to wgmma
}

// write_ds_t, then waits for both warpgroups' rows.
__device__ __forceinline__ void store_ds_t(const uint32_t (&ds_frag)[4][4], uint32_t ds_tile, int first_row, int lane) {
    write_ds_t(ds_frag, ds_tile, first_row, lane);
    asm volatile("bar.sync 1, 256;\n" ::: "memory");  // both warpgroups' dS^T rows are in
}

// Issues dQ (64 queries x kDqCols, this warpgroup's columns) = dS K: dS read M-major from the dS^T
// buffer at ds_tile, K read N-major.
template <typename T, typename Elem>
__device__ __forceinline__ void issue_dq(float (&dq)[T::kDqCols / 2], uint32_t ds_tile, uint32_t base, int wg) {
    // This warpgroup's columns of K: a panel of their own (D=128), or the second half of
    // the panel's 128-byte rows (D=64: the descriptor starts 64 bytes in; the swizzle is
    // a function of the address, as TMA wrote it).
    const int first_col = wg * T::kDqCols;
    const uint32_t k_b = base + T::kOffK + first_col / 64 * T::kKVPanelBytes + first_col % 64 * 2;
    const uint64_t desc_a0 = smem_desc(ds_tile, T::kDsBytes, 1024), desc_b0 = smem_desc(k_b, T::kKVPanelBytes, 1024);
    fence_registers(dq);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < T::kBlockN / 16; ++kk)
        Wgmma<T::kDqCols, WgmmaA::SS, Elem>::template mma<1, 1>(dq, desc_a0 + kk * 2048 / 16,
                                                               desc_b0 + kk * 2048 / 16, kk > 0);
    wgmma_commit();
}

// Until the dQ writer's reductions have read the staging of the step before `step_all` (the
// barrier's phase: steps of every tile so far).
__device__ __forceinline__ void wait_dq_staging_read(BwdBarriers &bars, int step_all) {
    wait_barrier(&bars.dq_empty, (step_all & 1) ^ 1);
}

// The step's dQ (this thread's share) to the staging at dq_stage, for the dQ writer, once its
// reductions of the previous step's have read it.
template <typename T>
__device__ __forceinline__ void stage_dq(BwdBarriers &bars, const float (&dq)[T::kDqCols / 2], uint32_t dq_stage, int my_row,
                                         int lane, int step_all) {
    wait_dq_staging_read(bars, step_all);
#pragma unroll
    for (int j = 0; j < T::kDqCols / 8; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h)
            asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(dq_stage + (my_row + 8 * h) * T::kDqStagePitch + 32 * j),
                         "f"(dq[4 * j + 2 * h]), "f"(dq[4 * j + 2 * h + 1])
                         : "memory");
    ptx::fence_proxy_async(ptx::space_shared);  // the stores, visible to the bulk reductions
    __syncwarp();
    if (lane == 0) ptx::mbarrier_arrive(&bars.dq_full);
}

// Where the tile's dK and dV rows start (row 0 of the tile's sequence: kVarlen's key_row0).
template <typename Elem>
struct DkDvOut {
    Elem *dk, *dv;
    __device__ DkDvOut(const fc_bwd_params &b, const Tile &tile, int batch, int64_t key_row0)
        : dk(static_cast<Elem *>(b.dk) + batch * b.dk_stride_b + tile.head_kv * b.dk_stride_h + key_row0 * b.dk_stride_s),
          dv(static_cast<Elem *>(b.dv) + batch * b.dv_stride_b + tile.head_kv * b.dv_stride_h + key_row0 * b.dv_stride_s) {}
};

// The consumers' epilogue: dK * scale and dV of this warpgroup's 64 keys, each through the
// warpgroup's half of the dQ staging tile (64 rows of kHeadDim * 2 bytes at its pitch; free
// between tiles once the dQ writer has read the last step's dQ): the fragments to shared memory,
// then each row out in 16-byte pieces, 8 threads to a 128-byte line (from the fragments, each
// warp-wide 4-byte store touched 8 lines). Keys past Sk are not written. kVarlen: batch 0, keys
// from the sequence's first row key_row0.
template <typename T, typename Elem>
__device__ __forceinline__ void store_dk_dv(BwdBarriers &bars, const fc_bwd_params &b, const Tile &tile, int batch,
                                            int64_t key_row0, uint32_t base, int wg, int my_row, int col_in_tile,
                                            int seqlen_k, int step_all, const float (&dk)[T::kHeadDim / 2],
                                            const float (&dv)[T::kHeadDim / 2]) {
    constexpr int kHeadDim = T::kHeadDim, kPitch = T::kDqStagePitch;
    constexpr int kChunksPerRow = kHeadDim * 2 / 16, kRowsPerPass = 128 / kChunksPerRow;
    static_assert(kHeadDim * 2 == T::kDqCols * 4, "a warpgroup's dK rows fill its half of a staging row");
    const uint32_t scratch = base + T::kOffDq + wg * T::kDqCols * 4;
    const int thread = threadIdx.x % 128, first_key = tile.n_start + wg * 64;
    wait_dq_staging_read(bars, step_all);  // the tile's last staged dQ
    auto store = [&](const float (&acc)[kHeadDim / 2], float scale, Elem *out, int64_t stride_s) {
#pragma unroll
        for (int j = 0; j < kHeadDim / 8; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h)
                asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(scratch + (my_row + 8 * h) * kPitch + (col_in_tile + 8 * j) * 2),
                             "r"(pack2<Elem>(acc[4 * j + 2 * h] * scale, acc[4 * j + 2 * h + 1] * scale))
                             : "memory");
        asm volatile("bar.sync %0, 128;\n" ::"r"(2 + wg) : "memory");  // the warpgroup's rows are in
#pragma unroll
        for (int pass = 0; pass < 64 / kRowsPerPass; ++pass) {
            const int row = pass * kRowsPerPass + thread / kChunksPerRow, chunk = thread % kChunksPerRow;
            if (first_key + row >= seqlen_k) continue;
            uint4 piece;
            asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                         : "=r"(piece.x), "=r"(piece.y), "=r"(piece.z), "=r"(piece.w)
                         : "r"(scratch + row * kPitch + chunk * 16));
            *reinterpret_cast<uint4 *>(out + static_cast<int64_t>(first_key + row) * stride_s + chunk * 8) = piece;
        }
        asm volatile("bar.sync %0, 128;\n" ::"r"(2 + wg) : "memory");  // read before it is written again
    };
    const DkDvOut<Elem> to(b, tile, batch, key_row0);
    store(dk, b.fwd.scale, to.dk, b.dk_stride_s);
    store(dv, 1.f, to.dv, b.dv_stride_s);
}

// The consumers' epilogue, direct: dK * scale and dV of this thread's two keys, from registers
// (keys past Sk are not written). kVarlen: batch 0, keys from the sequence's first row key_row0.
// The D=128 band and packed variants' (staged, they spilled).
template <typename Elem, int kHeadDim>
__device__ __forceinline__ void store_dk_dv_direct(const fc_bwd_params &b, const Tile &tile, int batch, int64_t key_row0,
                                                   int first_key, int col_in_tile, int seqlen_k,
                                                   const float (&dk)[kHeadDim / 2], const float (&dv)[kHeadDim / 2]) {
    constexpr int kDTiles = kHeadDim / 8;  // 8-column accumulator tiles of dK, dV
    const DkDvOut<Elem> to(b, tile, batch, key_row0);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int key = first_key + 8 * h;
        if (key >= seqlen_k) continue;
        Elem *dk_row = to.dk + static_cast<int64_t>(key) * b.dk_stride_s + col_in_tile;
        Elem *dv_row = to.dv + static_cast<int64_t>(key) * b.dv_stride_s + col_in_tile;
#pragma unroll
        for (int j = 0; j < kDTiles; ++j) {
            *reinterpret_cast<uint32_t *>(dk_row + 8 * j) =
                pack2<Elem>(dk[4 * j + 2 * h] * b.fwd.scale, dk[4 * j + 2 * h + 1] * b.fwd.scale);
            *reinterpret_cast<uint32_t *>(dv_row + 8 * j) = pack2<Elem>(dv[4 * j + 2 * h], dv[4 * j + 2 * h + 1]);
        }
    }
}

// A tile's steps, instantiated twice: run_steps(std::true_type()) where some step may need
// masking (kMaybeMasked: keys past Sk, and every tile of the variants whose steps may mask
// anyway, kAlwaysMasked), else run_steps(std::false_type()), so that a plain call's tile of inner
// key blocks runs no compares or selects. The choice is made per tile, outside the step loop (a
// condition inside it around the GEMMs serializes them). Then the tile's K and V are released.
template <int kBlockN, bool kAlwaysMasked, typename RunSteps>
__device__ __forceinline__ void run_tile_steps(BwdBarriers &bars, const Tile &tile, int seqlen_k, int &kv_round,
                                               const RunSteps &run_steps) {
    if constexpr (kAlwaysMasked) {
        run_steps(std::true_type());
    } else {
        if (tile.n_start + kBlockN > seqlen_k)
            run_steps(std::true_type());
        else
            run_steps(std::false_type());
    }
    if (tile.steps.count > 0) {
        ptx::mbarrier_arrive(&bars.kv_empty);  // the last step's GEMMs are done with K and V
        ++kv_round;
    }
}

// One step of a tile (query head and query tile `step`; step `step_all` of every tile so far)
// for one consumer thread: S^T and dP^T (kIssueAhead: issued a step ago), P^T and dS^T, dV and
// dK accumulated, dS^T to shared memory, dQ and its staging. kAhead issues the next step's
// score GEMMs right behind the dQ GEMM.
template <typename T, typename Elem, bool kCausal, int kMask, bool kBand, bool kSoftcap, bool kVarlen, bool kAhead,
          bool kMaybeMasked, typename IssueScores>
__device__ __forceinline__ void compute_step(BwdBarriers &bars, unsigned char *smem, const BwdMaps &maps, const fc_params &f,
                                             const Tile &tile, int step, int step_all, float (&s)[32], float (&dp)[32],
                                             float (&dk)[T::kHeadDim / 2], float (&dv)[T::kHeadDim / 2],
                                             IssueScores &issue_step_scores, uint32_t base, float scale_log2, int first_key,
                                             int wg, int my_row, int col_in_tile, int lane, int seqlen_k, int seqlen_q) {
    constexpr int kBlockM = T::kBlockM, kBlockN = T::kBlockN, kStages = T::kStages;
    constexpr bool kIssueAhead = T::kHeadDim == 64;  // the kernel's (see there)
    const int n_start = tile.n_start;
    const int stage = step_all % kStages;
    const int m_start = tile.steps.m_start(step, kBlockM);
    const uint32_t q_tile = base + T::kOffQ + stage * T::kStageStride;
    const uint32_t do_tile = base + T::kOffDo + stage * T::kStageStride;
    // Masked calls: the step's mask rows toward L1, read back after the score GEMMs.
    constexpr bool kMaskElements = kMask == kMaskBool || kMask == kMaskAdditive;
    [[maybe_unused]] const MaskSliceOf<Elem, kMask> mask(
        f, tile.batch, kMaskElements ? tile.steps.head_q(step, tile.head_kv, tile.group) : 0);
    if constexpr (kMaskElements) prefetch_mask_rows(mask, f, m_start, n_start, seqlen_k);

    // The step's delta and LSE2 rows in the stage (kVarlen: (delta, LSE2) pairs from the step's
    // first row rounded down to even: load_row_terms).
    constexpr int kRowStride = kVarlen ? 2 : 1;
    auto stage_delta = [&] {
        const int skew = kVarlen ? (tile.row0 + m_start) & 1 : 0;
        return reinterpret_cast<const float *>(smem + T::kOffRowTerms + stage * T::kRowTermsSlotBytes) + 2 * skew;
    };
    constexpr int kLseOffset = kVarlen ? 1 : kBlockM;
    // The step's LSE2 rows into registers before its score GEMMs are issued (kLseFirst): read
    // behind them, each load waited on the GEMMs' shared-memory traffic. Softcap and masks read
    // element by element at D=128 have no registers to hold them that long.
    constexpr bool kLseFirst = !(T::kHeadDim == 128 && (kSoftcap || kMaskElements));
    if constexpr (!kIssueAhead) wait_step<T>(bars, step_all);  // (kIssueAhead: waited a step ago)
    [[maybe_unused]] float2 lse_rows[8];
    if constexpr (kLseFirst) {
        load_row_terms_of_columns<kRowStride>(lse_rows, stage_delta() + kLseOffset, col_in_tile);
    }

    // ---- S^T = K Q^T and dP^T = V dO^T (kIssueAhead: already issued) ----
    if constexpr (!kIssueAhead) issue_step_scores(step_all);

    // ---- P^T = exp2(S^T scale log2(e) - LSE2[query]), masked where keys pass Sk, the diagonal or the band ----
    // kSoftcap: dS^T here too (below), so dP^T first: P^T in fp32 then lives only as long
    // as one element (with it beside dP^T the D=128 consumers spilled).
    // (kIssueAhead: both were issued a step ago and have likely finished; waiting for dP^T
    // too keeps ptxas from serializing every wgmma, as it did reading S^T while dP^T ran.)
    constexpr bool kWaitBoth = kSoftcap || kIssueAhead;
    wgmma_wait<kWaitBoth ? 0 : 1>();
    fence_registers(s);
    if constexpr (kWaitBoth) fence_registers(dp);
    const float *delta = stage_delta();
    // (!kLseFirst: each tile's LSE2 read as the softmax reaches it.)
    auto lse_of_tile = [&](int j) {
        if constexpr (kLseFirst) return lse_rows[j];
        else return row_pair<kRowStride>(delta + kLseOffset + kRowStride * (8 * j + col_in_tile));
    };
    [[maybe_unused]] const uint8_t *mask_tile = smem + T::kOffMask + stage * T::kMaskTileBytes;
    // (kBand: every key of the block lies in the band of every row of the step when the
    // step's last row reaches back to the block's first key and its first row forward to
    // the block's last; compared as key - query, which cannot overflow.)
    // (kVarlen: a step past its sequence's last query too.)
    const bool masked_tile = kMaybeMasked && (n_start + kBlockN > seqlen_k || (kVarlen && m_start + kBlockM > seqlen_q) ||
                             (kBand ? n_start - (m_start + kBlockM - 1) < f.band_lo_ || n_start + kBlockN - 1 - m_start > f.band_hi_
                                    : kCausal && m_start < n_start + kBlockN));
    uint32_t p_frag[4][4], ds_frag[4][4];
    softmax<T, Elem, kCausal, kMask, kBand, kSoftcap, kVarlen>(p_frag, ds_frag, s, dp, delta, lse_of_tile, mask_tile, mask, maps, f,
                                                               scale_log2, masked_tile, m_start, first_key, wg * 64 + my_row,
                                                               col_in_tile, seqlen_k, seqlen_q);

    // The step's delta rows, read while dP^T may still run (kDeltaFirst: as kLseFirst; at D=128
    // masked calls have no registers for them).
    constexpr bool kDeltaFirst = kLseFirst && !(T::kHeadDim == 128 && kMask != kMaskNone);
    [[maybe_unused]] float2 delta_rows[8];
    if constexpr (kDeltaFirst) load_row_terms_of_columns<kRowStride>(delta_rows, delta, col_in_tile);
    auto delta_of_tile = [&](int j) {
        if constexpr (kDeltaFirst) return delta_rows[j];
        else return row_pair<kRowStride>(delta + kRowStride * (8 * j + col_in_tile));
    };

    // ---- dV += P^T dO ----
    if constexpr (!kWaitBoth) {
        wgmma_wait<0>();
        fence_registers(dp);
    }
    fence_registers(dv);
    wgmma_fence();
    issue_accumulate<T, Elem>(dv, p_frag, do_tile);

    // ---- dS^T = P^T (dP^T - delta[query]) (kSoftcap: done above);  dK += dS^T Q ----
    if constexpr (!kSoftcap) compute_ds<Elem>(ds_frag, dp, s, delta_of_tile);
    fence_registers(dk);
    wgmma_fence();
    issue_accumulate<T, Elem>(dk, ds_frag, q_tile);

    // ---- dS^T to shared memory (rows: this warpgroup's keys; 128-byte swizzle) ----
    const uint32_t ds_tile = base + T::kOffDs + (step_all & 1) * T::kDsBytes;
    store_ds_t(ds_frag, ds_tile, wg * 64 + my_row, lane);

    // ---- dQ (64 queries x kDqCols) = dS K: dS read M-major from dS^T, K read N-major ----
    float dq[T::kDqCols / 2];
    issue_dq<T, Elem>(dq, ds_tile, base, wg);
    if constexpr (kAhead) {
        issue_step_scores(step_all + 1);
        wgmma_wait<2>();  // all but the next step's two score GEMMs
    } else {
        wgmma_wait<0>();
    }
    fence_registers(dq);
    fence_registers(dk);
    fence_registers(dv);
    ptx::mbarrier_arrive(&bars.step_empty[stage]);  // Q, dO and the row terms are read

    // ---- dQ to the staging, for the dQ writer ----
    stage_dq<T>(bars, dq, base + T::kOffDq + wg * T::kDqCols * 4 + col_in_tile * 4, my_row, lane, step_all);
}

template <typename Elem, int kHeadDim, bool kCausal, int kMask, bool kBand = false, bool kSoftcap = false, bool kVarlen = false>
__global__ void __launch_bounds__(BwdTraits<kHeadDim>::kThreads, 1)
bwd_kernel(const __grid_constant__ BwdMaps maps, const fc_bwd_params p) {
    static_assert(!kBand || (kCausal && kMask == kMaskNone), "a band runs in the causal configuration, without a mask");
    static_assert(!kVarlen || (kMask == kMaskNone && !kBand && !kSoftcap), "packed calls: causal or not, nothing else");
    using T = BwdTraits<kHeadDim, kMask == kMaskBoolTiles>;
    constexpr int kBlockN = T::kBlockN;

    extern __shared__ unsigned char smem_raw[];
    __shared__ BwdBarriers bars;
    unsigned char *smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);

    const fc_params &f = p.fwd;
    const int seqlen_k = static_cast<int>(f.seqlen_k);
    // (kVarlen: the tile scheduler reads the count from the key-block list.)
    const int tiles = kVarlen ? 0 : (seqlen_k + kBlockN - 1) / kBlockN * static_cast<int>(f.heads_kv * f.batch);
    const Workspace ws = workspace_of<kVarlen>(p);

    const int warpgroup = __shfl_sync(0xffffffff, static_cast<int>(threadIdx.x) / 128, 0);
    const int lane = threadIdx.x % 32;
    if (threadIdx.x == 0) init_barriers<T>(bars);
    __syncthreads();
    // Launched programmatically (sm90/bwd_launch.cuh): the row-terms kernel's results first; then
    // the dq conversion may launch (it waits for each pair's count, which the row-terms kernel
    // zeroed: hence not before this wait).
    wait_for_prior_grids();
    allow_dependent_grids();

    if (warpgroup == 0) {
        // ---------------- producer: four threads of their own jobs ----------------
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(T::kProducerRegs));
        if (threadIdx.x == 32) {
            write_dq<T, kVarlen>(bars, maps, ws, p, [&](float *rows, int) { reduce_staged_tile<T>(bars, smem, rows); });
            return;
        }
        if (threadIdx.x == 96) {
            schedule_tiles_and_load_kv<T, kCausal, kBand, kVarlen>(bars, smem, maps, p, ws, tiles);
            return;
        }
        // The step loaders: each step's Q and dO (thread 0) and its row terms (thread 64) into the
        // ring; a stage fills on both.
        if (threadIdx.x == 64) {
            load_row_terms<T, kVarlen>(bars, smem, ws, p);
        } else if (threadIdx.x == 0) {
            load_q_do<T, kMask, kVarlen>(bars, smem, maps, p);
        }
        return;
    }

    // ---------------- consumers: 64 keys each ----------------
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(T::kConsumerRegs));
    const int wg = warpgroup - 1;
    const int warp_in_wg = (threadIdx.x / 32) % 4;
    const int row_in_warp = lane / 4;        // accumulator rows row_in_warp, +8 (of the warp's 16)
    const int col_in_tile = 2 * (lane % 4);  // accumulator columns col_in_tile, +1 (of each 8)
    const int my_row = warp_in_wg * 16 + row_in_warp;  // within the warpgroup's 64 rows
    const uint32_t base = smem_addr(smem);
    const uint32_t k_rows = base + T::kOffK + wg * 64 * 128;  // this warpgroup's keys in K's first panel
    const uint32_t v_rows = base + T::kOffV + wg * 64 * 128;
    // kSoftcap: scores are t = tanh(x * scale / softcap) in units of softcap (as the forward's).
    // kSoftcap: scale_log2 is softcap * log2(e), and scores become tanh(x * maps.softcap_in).
    const float scale_log2 = kSoftcap ? maps.softcap_log2 : f.scale * kLog2e;

    zero_dq_padding<T>(smem);

    // D=64 (kIssueAhead): the next step's S^T and dP^T go out right behind this step's dQ GEMM,
    // so that the tensor cores have work while the consumers stage dQ and start the next step
    // (their registers are free once P^T and dS^T are packed; at D=128, dK, dV and dQ leave no
    // room for them).
    constexpr bool kIssueAhead = kHeadDim == 64;
    // D=64 (kKeysInRegisters): K and V of the tile as the A fragments of S^T and dP^T. Read from
    // shared memory, the two score GEMMs' A operands were about a sixth of the step's shared-memory
    // traffic; at D=128 the registers are taken.
    constexpr bool kKeysInRegisters = kHeadDim == 64;
    // dK and dV leave through shared memory (store_dk_dv), but at D=128 in the band and packed
    // variants, which spilled so (store_dk_dv_direct).
    constexpr bool kStagedEpilogue = !(kHeadDim == 128 && (kBand || kVarlen));
    uint32_t k_frag[kHeadDim / 16][4], v_frag[kHeadDim / 16][4];
    // S^T and dP^T of a step: into s and dp, once its stage has landed.
    float s[32], dp[32];
    // (kIssueAhead: waits for the step's stage first; otherwise compute_step has.)
    auto issue_step_scores = [&](int step_index) {
        if constexpr (kIssueAhead) wait_step<T>(bars, step_index);
        issue_scores_of_step<T, Elem, kIssueAhead, kKeysInRegisters>(step_index, s, dp, k_frag, v_frag, k_rows, v_rows, base);
    };

    int step_all = 0, kv_round = 0;  // steps and K/V loads of every tile so far: the barriers' phases
    for (int n = 0;; ++n) {
        const Tile tile = read_tile(bars, n);
        if (tile.batch < 0) break;
        const int n_start = tile.n_start;
        const int first_key = n_start + wg * 64 + my_row;  // this thread's keys: first_key, +8
        // kVarlen: the tile's sequence (rows counted from its first; its lengths bound the masks).
        int seq_q = 0, seq_k = seqlen_k, key_row0 = 0;
        if constexpr (kVarlen) {
            const sm90::VarlenBlock &e = listed_block(p.workspace, tile.batch);
            seq_q = e.sq, seq_k = e.sk, key_row0 = e.k0;
        }

        float dk[kHeadDim / 2], dv[kHeadDim / 2];
#pragma unroll
        for (int i = 0; i < kHeadDim / 2; ++i) dk[i] = dv[i] = 0.f;

        if (tile.steps.count > 0) {
            wait_barrier(&bars.kv_full, kv_round & 1);
            if constexpr (kKeysInRegisters) {
                load_key_frags<kHeadDim>(k_frag, k_rows, warp_in_wg, lane);
                load_key_frags<kHeadDim>(v_frag, v_rows, warp_in_wg, lane);
            }
        }
        // The tile's steps, with and without masking (run_tile_steps: causal, a band, packed
        // rows and masked calls keep the masked one; masked calls' registers are tight).
        auto run_steps = [&](auto maybe_masked) {
            constexpr bool kMaybeMasked = decltype(maybe_masked)::value;
            // One step; `ahead` (std::true_type) issues the next step's score GEMMs before staging dQ.
            auto run_step = [&](int step, auto ahead) {
                compute_step<T, Elem, kCausal, kMask, kBand, kSoftcap, kVarlen, decltype(ahead)::value, kMaybeMasked>(
                    bars, smem, maps, f, tile, step, step_all, s, dp, dk, dv, issue_step_scores, base, scale_log2, first_key,
                    wg, my_row, col_in_tile, lane, seq_k, seq_q);
            };
            // kIssueAhead: every step but the last issues the next one's scores, and the last runs
            // outside the loop, so that on every path into a step its two score GEMMs are in flight
            // (with a condition inside one loop, ptxas serialized every wgmma of the kernel).
            if constexpr (kIssueAhead) {
                if (tile.steps.count > 0) {
                    issue_step_scores(step_all);
                    for (int step = 0; step < tile.steps.count - 1; ++step, ++step_all) run_step(step, std::true_type());
                    run_step(tile.steps.count - 1, std::false_type());
                    ++step_all;
                }
            } else {
                for (int step = 0; step < tile.steps.count; ++step, ++step_all) run_step(step, std::false_type());
            }
        };
        run_tile_steps<T::kBlockN, kCausal || kBand || kVarlen || kMask != kMaskNone>(bars, tile, seq_k, kv_round, run_steps);

        // ---- epilogue ----
        if constexpr (kStagedEpilogue) {
            store_dk_dv<T, Elem>(bars, p, tile, kVarlen ? 0 : tile.batch, key_row0, base, wg, my_row, col_in_tile, seq_k,
                                 step_all, dk, dv);
        } else {
            store_dk_dv_direct<Elem, kHeadDim>(p, tile, kVarlen ? 0 : tile.batch, key_row0, first_key, col_in_tile, seq_k, dk,
                                               dv);
        }
    }
}

}  // namespace sm90_bwd
}  // namespace flashcore
