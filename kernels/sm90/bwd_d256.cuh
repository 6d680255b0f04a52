// sm90/bwd_d256.cuh - the Hopper (sm_90a) fused attention backward at head dim 256: the same
// computation as sm90/bwd_kernel.cuh (whose comment has the formulas), with its producer, for
// calls causal top-left or not, a band (a sliding window or bottom-right causal), GQA, any
// lengths, a softcap or none, a bool or additive mask (not with causal or a band) or none, and
// packed sequences (causal or not, nothing else).
//
// Why a kernel of its own: the D=64/128 kernel gives each consumer warpgroup 64 keys and their dK
// and dV, which at D=256 are 256 fp32 registers per thread. Here a CTA takes a block of 64 keys
// (kBlockN) and its two consumer warpgroups split the work by role, each holding one 64 x 256
// accumulator (128 registers):
//   * the P warpgroup: S^T = K Q^T, P^T = exp2(S^T scale log2(e) - LSE2) (masked where keys pass
//     Sk or the diagonal), P^T to the other warpgroup through shared memory (fp32, kOffPx), then
//     dV += P^T dO with P^T from registers;
//   * the dS warpgroup: dP^T = V dO^T, then (once P^T is in) dS^T = P^T (dP^T - delta),
//     dK += dS^T Q with dS^T from registers, and dS^T to shared memory for dQ;
//   * both: dQ = dS K, each 128 of its 256 columns (dS read M-major from dS^T, K N-major).
// Each does two of the five GEMMs and half of the fifth. Their steps meet on three named barriers:
// P^T is in (2), dS^T is in (1), both are done with the stage's Q and dO (3). The two warpgroups
// reach each from different code, so they are the unaligned barrier.sync / barrier.arrive (bar.sync
// is barrier.sync.aligned, which wants every thread at the same instruction: compute-sanitizer's
// synccheck flags it).
//
// The step's dQ (64 rows x 256 fp32 = 64 KB) has no room of its own in shared memory beside K, V
// and two (Q, dO) stages of 64 KB: it is staged over the step's own stage once both warpgroups'
// GEMMs are done with it, in rows of 1 KB whose 16-byte chunks are permuted within each 128 bytes
// by the row (chunk c of row r at c ^ (r % 8), so that a warp's stores of 8 rows hit every bank
// once per half). The dQ writer adds them to the accumulator 16 rows to a bulk reduction (the
// accumulator's rows are the staging's, unpadded and permuted; the dq conversion undoes the
// permutation, sm90/bwd_rows.cuh's dq_chunk_at), then releases the stage to the step loaders.
//
// dK and dV leave from registers at the tile's end (dK scaled), keys past Sk not written.
//
// Band (kBand, with the causal configuration): as bwd_kernel's, the scheduler's tiles visit only
// the query tiles whose rows see a key of the block (tile_at), and the P warpgroup masks scores
// per element in the steps an edge of the band crosses; a block no row sees writes zero dK and dV.
//
// Masks: a bool mask whose layout TMA can read (kMaskBoolTiles) arrives with each
// step's Q and dO as a tile of 64 queries x 64 keys (64-byte rows under the 64-byte swizzle,
// BwdTraits::mask_byte); other masks (kMaskBool, kMaskAdditive) the P warpgroup reads element by
// element from global memory, as bwd_kernel's element-wise variants do (prefetched toward L1
// before the score GEMM). The dS warpgroup needs nothing of them (P^T is 0 where masked).
//
// Packed sequences (kVarlen): as bwd_kernel's, a tile is a listed key block (sm90/varlen_blocks.cuh,
// 128 keys) and one of its two 64-key halves (varlen_tile_at), rows counted from the sequence's
// first; its row terms arrive as (delta, LSE2) pairs from the step's first row rounded down to
// even, queries and keys past the sequence's ends are masked, and the staged dQ rows' chunks are
// permuted by their row in the accumulator (the sequence's first row need not be a multiple of 8).
//
// Softcap (kSoftcap): scores are t = tanh(S^T scale / softcap), P^T = exp2(t softcap log2(e) -
// LSE2), and dS^T gains the factor 1 - t^2. The P warpgroup alone has t, so it hands over
// P^T (1 - t^2) instead of P^T: dS^T = P^T (1 - t^2) (dP^T - delta), the dS warpgroup unchanged.
// Before the softmax it turns its scores into t and parks 1 - t^2 in the exchange (its own
// elements, which the dS warpgroup read in the previous step before the dS^T barrier), after it
// multiplies them by P^T in place: no second array of registers.
#pragma once

#include "sm90/bwd_producer.cuh"
#include "sm90/bwd_steps.cuh"

namespace flashcore {
namespace sm90_bwd {

// The dQ writer's step at D=256 (sm90/bwd_producer.cuh's write_dq): the step's dQ, staged over its
// (Q, dO) stage, added to the accumulator kReducedRows rows (16 KB) at a time: the accumulator's
// D=256 rows are unpadded, so the staging and the accumulator hold the same bytes in the same
// order. (One bulk reduction per 1 KB row capped the kernel: the reductions' count, not their
// bytes, docs/experiments/backward.md.) Then its arrival frees the stage (with the consumer threads').
template <typename T>
__device__ __forceinline__ void reduce_staged_rows(BwdBarriers &bars, unsigned char *smem, float *rows, int step_all) {
    constexpr int kRowBytes = T::kHeadDim * 4, kReducedRows = 16;
    static_assert(kDqPitch<T::kHeadDim> == T::kHeadDim, "the accumulator's rows are contiguous, as the staging's");
    static_assert(T::kBlockM % kReducedRows == 0);
    const int stage = step_all % T::kStages;
    const uint32_t staged = smem_addr(smem + T::kOffQ + stage * T::kStageStride);
#pragma unroll
    for (int r = 0; r < T::kBlockM; r += kReducedRows)
        asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n"
                     ::"l"(rows + r * T::kHeadDim), "r"(staged + r * kRowBytes), "n"(kReducedRows * kRowBytes)
                     : "memory");
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
    asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");  // the staging is read
    ptx::mbarrier_arrive(&bars.step_empty[stage]);
}

// The P warpgroup's P^T (fp32, this thread's 32 elements in accumulator order) to the exchange:
// float4 i of thread t at index i * 128 + t (a warp's stores: 512 contiguous bytes).
__device__ __forceinline__ void put_probs(const float (&s)[32], uint32_t px, int thread) {
#pragma unroll
    for (int i = 0; i < 8; ++i)
        asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(px + (i * 128 + thread) * 16), "f"(s[4 * i]),
                     "f"(s[4 * i + 1]), "f"(s[4 * i + 2]), "f"(s[4 * i + 3])
                     : "memory");
}

// kSoftcap, before the softmax: the scores become t = tanh(S^T scale / softcap) in place, and
// 1 - t^2 goes to this thread's places in the exchange (put_probs' layout).
__device__ __forceinline__ void cap_scores(float (&s)[32], float softcap_in, uint32_t px, int thread) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        float slope[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const float t = s[4 * i + e] = fast_tanh(s[4 * i + e] * softcap_in);
            slope[e] = 1.f - t * t;
        }
        asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(px + (i * 128 + thread) * 16), "f"(slope[0]),
                     "f"(slope[1]), "f"(slope[2]), "f"(slope[3])
                     : "memory");
    }
}

// kSoftcap, after the softmax: P^T (1 - t^2) in the exchange, from this thread's 1 - t^2 there
// and its P^T in s (masked elements: P^T = 0).
__device__ __forceinline__ void put_capped_probs(const float (&s)[32], uint32_t px, int thread) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const uint32_t at = px + (i * 128 + thread) * 16;
        float4 slope;
        asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                     : "=f"(slope.x), "=f"(slope.y), "=f"(slope.z), "=f"(slope.w)
                     : "r"(at)
                     : "memory");
        asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(at), "f"(s[4 * i] * slope.x),
                     "f"(s[4 * i + 1] * slope.y), "f"(s[4 * i + 2] * slope.z), "f"(s[4 * i + 3] * slope.w)
                     : "memory");
    }
}

// The dS warpgroup: dS^T = P^T (dP^T - delta[query]) into dp with P^T from the exchange (the same
// thread of the other warpgroup holds the same elements; kSoftcap: P^T (1 - t^2)), packed into
// ds_frag (delta_rows(j): the delta of this thread's columns in 8-column tile j).
template <typename Elem>
__device__ __forceinline__ void ds_from_exchange(uint32_t (&ds_frag)[4][4], float (&dp)[32], uint32_t px, int thread,
                                                 const float2 (&delta_rows)[8]) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        float4 prob;
        asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                     : "=f"(prob.x), "=f"(prob.y), "=f"(prob.z), "=f"(prob.w)
                     : "r"(px + (j * 128 + thread) * 16)
                     : "memory");
        const float2 d = delta_rows[j];
        dp[4 * j] = prob.x * (dp[4 * j] - d.x);
        dp[4 * j + 1] = prob.y * (dp[4 * j + 1] - d.y);
        dp[4 * j + 2] = prob.z * (dp[4 * j + 2] - d.x);
        dp[4 * j + 3] = prob.w * (dp[4 * j + 3] - d.y);
    }
    to_frag<Elem>(ds_frag, dp);
}

// This warpgroup's half of the step's dQ (rows my_row, +8; columns first_col + 8 j + col_in_tile,
// +1) over the stage at `staged` (rows of 1 KB, chunks permuted by the row's place in the
// accumulator: row_shift is the step's first accumulator row % 8, 0 but for packed rows), then
// this thread's release of the stage and this warp's arrival for the dQ writer.
template <typename T>
__device__ __forceinline__ void stage_dq_rows(BwdBarriers &bars, const float (&dq)[T::kDqCols / 2], uint32_t staged,
                                              int stage, int first_col, int my_row, int row_shift, int col_in_tile,
                                              int lane) {
    // Column 8 j + col_in_tile lies in chunk 2 j + col_in_tile / 4 (first_col is a multiple of
    // 32 chunks), whose place within its 128 bytes depends on j % 4 and the row % 8 alone (rows
    // my_row and my_row + 8 alike): four offsets, the rest immediates.
    const uint32_t row_base = staged + my_row * T::kHeadDim * 4 + first_col * 4 + (col_in_tile % 4) * 4;
    const int row_phase = (my_row + row_shift) & 7;
#pragma unroll
    for (int jj = 0; jj < 4; ++jj) {
        const uint32_t at = row_base + (((2 * jj + col_in_tile / 4) ^ row_phase) << 4);
#pragma unroll
        for (int jq = 0; jq < T::kDqCols / 32; ++jq)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int j = 4 * jq + jj;
                asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(at + jq * 128 + h * 8 * T::kHeadDim * 4),
                             "f"(dq[4 * j + 2 * h]), "f"(dq[4 * j + 2 * h + 1])
                             : "memory");
            }
    }
    ptx::fence_proxy_async(ptx::space_shared);  // the stores, visible to the bulk reductions
    // Every thread releases the stage after its own reads of it (its row terms) and its staging
    // stores; the stage is free once the dQ writer has read the staging too.
    ptx::mbarrier_arrive(&bars.step_empty[stage]);
    __syncwarp();
    if (lane == 0) ptx::mbarrier_arrive(&bars.dq_full);
}

// Both warpgroups: dQ (this warpgroup's 128 columns) = dS K, then, once the other warpgroup is
// done with the stage's Q and dO too, its staging over them.
template <typename T, typename Elem>
__device__ __forceinline__ void dq_of_step(BwdBarriers &bars, uint32_t base, int stage, int wg, int my_row, int row_shift,
                                           int col_in_tile, int lane) {
    float dq[T::kDqCols / 2];
    issue_dq<T, Elem>(dq, base + T::kOffDs, base, wg);
    wgmma_wait<0>();
    fence_registers(dq);
    asm volatile("barrier.sync 3, 256;\n" ::: "memory");  // both warpgroups' GEMMs are done with Q and dO
    stage_dq_rows<T>(bars, dq, base + T::kOffQ + stage * T::kStageStride, stage, wg * T::kDqCols, my_row, row_shift,
                     col_in_tile, lane);
}

// kMask: the step's mask rows toward L1 (64 queries x 64 keys over the P warpgroup's 128 threads),
// read back after the score GEMM.
template <typename Mask>
__device__ __forceinline__ void prefetch_step_mask(const Mask &mask, const fc_params &f, int m_start, int n_start,
                                                   int seqlen_k) {
    const int t = threadIdx.x % 128, query = m_start + t / 2, key = n_start + t % 2 * 32;
    if (query < static_cast<int>(f.seqlen_q) && key < seqlen_k) mask.prefetch(query, key);
}

// The step's row terms in its stage: delta rows, then LSE2 rows (kVarlen: (delta, LSE2) pairs
// from the step's first row rounded down to even, as load_row_terms brings them).
template <typename T, bool kVarlen>
struct StepTerms {
    static constexpr int kRowStride = kVarlen ? 2 : 1, kLseOffset = kVarlen ? 1 : T::kBlockM;
    const float *delta;
    __device__ StepTerms(unsigned char *smem, int stage, int first_row)
        : delta(reinterpret_cast<const float *>(smem + T::kOffRowTerms + stage * T::kRowTermsSlotBytes) +
                (kVarlen ? 2 * (first_row & 1) : 0)) {}
    __device__ const float *lse() const { return delta + kLseOffset; }
};

// One step for a thread of the P warpgroup: S^T, P^T (to the exchange; kSoftcap: P^T (1 - t^2)),
// dV += P^T dO, dQ. kVarlen: seqlen_q and seqlen_k are the sequence's.
template <typename T, typename Elem, bool kCausal, int kMask, bool kBand, bool kSoftcap, bool kVarlen, bool kMaybeMasked>
__device__ __forceinline__ void p_step(BwdBarriers &bars, unsigned char *smem, const BwdMaps &maps, const fc_params &f,
                                       const Tile &tile, int step, int step_all, float (&dv)[T::kHeadDim / 2], uint32_t base,
                                       float scale_log2, int my_row, int col_in_tile, int lane, int seqlen_k, int seqlen_q) {
    const int stage = step_all % T::kStages;
    const int m_start = tile.steps.m_start(step, T::kBlockM);
    constexpr bool kMaskElements = kMask == kMaskBool || kMask == kMaskAdditive;
    const MaskSliceOf<Elem, kMask> mask(f, tile.batch,
                                        kMaskElements ? tile.steps.head_q(step, tile.head_kv, tile.group) : 0);
    if constexpr (kMaskElements) prefetch_step_mask(mask, f, m_start, tile.n_start, seqlen_k);
    wait_step<T>(bars, step_all);
    using Terms = StepTerms<T, kVarlen>;
    const Terms terms(smem, stage, tile.row0 + m_start);
    // The LSE2 rows into registers before the score GEMM; a masked step reads them in the
    // softmax instead (16 registers fewer there: the additive variant spilled holding them).
    [[maybe_unused]] float2 lse_rows[8];
    if constexpr (!kMaskElements) load_row_terms_of_columns<Terms::kRowStride>(lse_rows, terms.lse(), col_in_tile);
    auto lse_of_tile = [&](int j) {
        if constexpr (kMaskElements) return row_pair<Terms::kRowStride>(terms.lse() + Terms::kRowStride * (8 * j + col_in_tile));
        else return lse_rows[j];
    };

    float s[32];
    fence_registers(s);
    wgmma_fence();
    issue_scores<T, Elem>(s, base + T::kOffK, base + T::kOffQ + stage * T::kStageStride);
    wgmma_wait<0>();
    fence_registers(s);

    const uint32_t px = base + T::kOffPx;
    const int thread = threadIdx.x % 128;
    if constexpr (kSoftcap) cap_scores(s, maps.softcap_in, px, thread);
    const int n_start = tile.n_start;
    // (kBand: no element of the step is masked when its last row reaches back to the block's
    // first key and its first row forward to the block's last, as in bwd_kernel's compute_step.)
    // (kVarlen: a step past its sequence's last query too.)
    const bool masked_tile =
        kMaybeMasked && (n_start + T::kBlockN > seqlen_k || (kVarlen && m_start + T::kBlockM > seqlen_q) ||
                         (kBand ? n_start - (m_start + T::kBlockM - 1) < f.band_lo_ || n_start + T::kBlockN - 1 - m_start > f.band_hi_
                                : kCausal && m_start < n_start + T::kBlockN));
    uint32_t p_frag[4][4], unused_frag[4][4];
    float unused_dp[32];
    [[maybe_unused]] const uint8_t *mask_tile = smem + T::kOffMask + stage * T::kMaskTileBytes;  // (kMaskBoolTiles)
    softmax<T, Elem, kCausal, kMask, kBand, false, kVarlen>(
        p_frag, unused_frag, s, unused_dp, terms.delta, lse_of_tile, mask_tile, mask, maps, f, scale_log2,
        masked_tile, m_start, n_start + my_row, my_row, col_in_tile, seqlen_k, seqlen_q);
    if constexpr (kSoftcap)
        put_capped_probs(s, px, thread);
    else
        put_probs(s, px, thread);
    asm volatile("barrier.arrive 2, 256;\n" ::: "memory");  // P^T is in

    fence_registers(dv);
    wgmma_fence();
    issue_accumulate<T, Elem>(dv, p_frag, base + T::kOffDo + stage * T::kStageStride);
    asm volatile("barrier.sync 1, 256;\n" ::: "memory");  // dS^T is in
    dq_of_step<T, Elem>(bars, base, stage, 0, my_row, kVarlen ? tile.row0 & 7 : 0, col_in_tile, lane);
    fence_registers(dv);
}

// One step for a thread of the dS warpgroup: dP^T, dS^T (with P^T from the exchange), dK += dS^T Q,
// dS^T to shared memory, dQ. first_row: the step's first row in the accumulator (kVarlen: packed).
template <typename T, typename Elem, bool kVarlen>
__device__ __forceinline__ void ds_step(BwdBarriers &bars, unsigned char *smem, int step_all, float (&dk)[T::kHeadDim / 2],
                                        uint32_t base, int first_row, int my_row, int col_in_tile, int lane) {
    const int stage = step_all % T::kStages;
    wait_step<T>(bars, step_all);
    using Terms = StepTerms<T, kVarlen>;
    const Terms terms(smem, stage, first_row);
    float2 delta_rows[8];
    load_row_terms_of_columns<Terms::kRowStride>(delta_rows, terms.delta, col_in_tile);

    float dp[32];
    fence_registers(dp);
    wgmma_fence();
    issue_scores<T, Elem>(dp, base + T::kOffV, base + T::kOffDo + stage * T::kStageStride);
    wgmma_wait<0>();
    fence_registers(dp);

    asm volatile("barrier.sync 2, 256;\n" ::: "memory");  // P^T is in
    uint32_t ds_frag[4][4];
    ds_from_exchange<Elem>(ds_frag, dp, base + T::kOffPx, threadIdx.x % 128, delta_rows);
    fence_registers(dk);
    wgmma_fence();
    issue_accumulate<T, Elem>(dk, ds_frag, base + T::kOffQ + stage * T::kStageStride);
    write_ds_t(ds_frag, base + T::kOffDs, my_row, lane);
    asm volatile("barrier.sync 1, 256;\n" ::: "memory");  // dS^T is in (for both warpgroups' dQ)
    dq_of_step<T, Elem>(bars, base, stage, 1, my_row, kVarlen ? first_row & 7 : 0, col_in_tile, lane);
    fence_registers(dk);
}

// dK * scale or dV of the tile's keys from this thread's registers (keys first_key, +8), 4 bytes
// at a time; keys past Sk not written.
template <typename Elem, int kHeadDim>
__device__ __forceinline__ void store_grad_rows(const float (&acc)[kHeadDim / 2], Elem *out, int64_t stride_s, float scale,
                                                int first_key, int col_in_tile, int seqlen_k) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int key = first_key + 8 * h;
        if (key >= seqlen_k) continue;
        Elem *row = out + static_cast<int64_t>(key) * stride_s + col_in_tile;
#pragma unroll
        for (int j = 0; j < kHeadDim / 8; ++j)
            *reinterpret_cast<uint32_t *>(row + 8 * j) = pack2<Elem>(acc[4 * j + 2 * h] * scale, acc[4 * j + 2 * h + 1] * scale);
    }
}

// A consumer warpgroup's tiles: kDsRole picks the dS warpgroup's steps (dK) over the P
// warpgroup's (dV).
template <typename T, typename Elem, bool kCausal, int kMask, bool kBand, bool kSoftcap, bool kVarlen, bool kDsRole>
__device__ __forceinline__ void consume_tiles(BwdBarriers &bars, unsigned char *smem, const BwdMaps &maps,
                                              const fc_bwd_params &p) {
    constexpr int kHeadDim = T::kHeadDim;
    const fc_params &f = p.fwd;
    const int seqlen_k = static_cast<int>(f.seqlen_k);
    const int lane = threadIdx.x % 32, warp_in_wg = (threadIdx.x / 32) % 4;
    const int col_in_tile = 2 * (lane % 4);             // accumulator columns col_in_tile, +1 (of each 8)
    const int my_row = warp_in_wg * 16 + lane / 4;      // accumulator rows my_row, +8: the block's keys
    const uint32_t base = smem_addr(smem);
    // kSoftcap: the softmax's scores are t, in units of softcap (as the forward's).
    const float scale_log2 = kSoftcap ? maps.softcap_log2 : f.scale * kLog2e;
    int step_all = 0, kv_round = 0;  // steps and K/V loads of every tile so far: the barriers' phases
    for (int n = 0;; ++n) {
        const Tile tile = read_tile(bars, n);
        if (tile.batch < 0) break;
        // kVarlen: the tile's sequence (rows counted from its first; its lengths bound the masks).
        int seq_q = static_cast<int>(f.seqlen_q), seq_k = seqlen_k, key_row0 = 0;
        if constexpr (kVarlen) {
            const sm90::VarlenBlock &e = listed_block(p.workspace, tile.batch);
            seq_q = e.sq, seq_k = e.sk, key_row0 = e.k0;
        }
        float grad[kHeadDim / 2];  // dK (kDsRole) or dV of the block's 64 keys
#pragma unroll
        for (int i = 0; i < kHeadDim / 2; ++i) grad[i] = 0.f;
        if (tile.steps.count > 0) wait_barrier(&bars.kv_full, kv_round & 1);
        auto run_steps = [&](auto maybe_masked) {
            for (int step = 0; step < tile.steps.count; ++step, ++step_all) {
                if constexpr (kDsRole) {
                    const int first_row = kVarlen ? tile.row0 + tile.steps.m_start(step, T::kBlockM) : 0;
                    ds_step<T, Elem, kVarlen>(bars, smem, step_all, grad, base, first_row, my_row, col_in_tile, lane);
                } else {
                    p_step<T, Elem, kCausal, kMask, kBand, kSoftcap, kVarlen, decltype(maybe_masked)::value>(
                        bars, smem, maps, f, tile, step, step_all, grad, base, scale_log2, my_row, col_in_tile, lane, seq_k,
                        seq_q);
                }
            }
        };
        run_tile_steps<T::kBlockN, kCausal || kVarlen>(bars, tile, seq_k, kv_round, run_steps);
        const DkDvOut<Elem> to(p, tile, kVarlen ? 0 : tile.batch, key_row0);
        if constexpr (kDsRole)
            store_grad_rows<Elem, kHeadDim>(grad, to.dk, p.dk_stride_s, f.scale, tile.n_start + my_row, col_in_tile, seq_k);
        else
            store_grad_rows<Elem, kHeadDim>(grad, to.dv, p.dv_stride_s, 1.f, tile.n_start + my_row, col_in_tile, seq_k);
    }
}

template <typename Elem, bool kCausal, int kMask, bool kBand, bool kSoftcap, bool kVarlen = false>
__global__ void __launch_bounds__(BwdTraits<256>::kThreads, 1)
bwd_kernel_d256(const __grid_constant__ BwdMaps maps, const fc_bwd_params p) {
    using T = BwdTraits<256, kMask == kMaskBoolTiles>;
    static_assert(!kBand || (kCausal && kMask == kMaskNone), "a band runs in the causal configuration, without a mask");
    static_assert(!kVarlen || (kMask == kMaskNone && !kBand && !kSoftcap), "packed calls: causal or not, nothing else");
    extern __shared__ unsigned char smem_raw[];
    __shared__ BwdBarriers bars;
    unsigned char *smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
    const fc_params &f = p.fwd;
    const int tiles = key_blocks<256>(f) * static_cast<int>(f.heads_kv * f.batch);
    const Workspace ws = workspace_of<kVarlen>(p);
    const int warpgroup = __shfl_sync(0xffffffff, static_cast<int>(threadIdx.x) / 128, 0);
    if (threadIdx.x == 0) init_barriers<T>(bars);
    __syncthreads();
    wait_for_prior_grids();  // (launched programmatically, as bwd_kernel)
    allow_dependent_grids();

    if (warpgroup == 0) {
        // ---------------- producer: bwd_kernel's four jobs, with this kernel's dQ writer ----------------
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(T::kProducerRegs));
        if (threadIdx.x == 32) {
            write_dq<T, kVarlen>(bars, maps, ws, p,
                               [&](float *rows, int step_all) { reduce_staged_rows<T>(bars, smem, rows, step_all); });
        } else if (threadIdx.x == 96) {
            schedule_tiles_and_load_kv<T, kCausal, kBand, kVarlen>(bars, smem, maps, p, ws, tiles);
        } else if (threadIdx.x == 64) {
            load_row_terms<T, kVarlen>(bars, smem, ws, p);
        } else if (threadIdx.x == 0) {
            load_q_do<T, kMask, kVarlen>(bars, smem, maps, p);
        }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(T::kConsumerRegs));
    if (warpgroup == 1)
        consume_tiles<T, Elem, kCausal, kMask, kBand, kSoftcap, kVarlen, false>(bars, smem, maps, p);
    else
        consume_tiles<T, Elem, kCausal, kMask, kBand, kSoftcap, kVarlen, true>(bars, smem, maps, p);
}

}  // namespace sm90_bwd
}  // namespace flashcore
