// sm90/bwd_steps.cuh - the Hopper backward's consumer pieces (sm90/bwd_kernel.cuh has the
// algorithm): the step's GEMMs as wgmma issues (scores S^T and dP^T, the dV / dK accumulations,
// dQ), its row terms, the softmax and dS^T in registers, dS^T to shared memory, dQ's staging
// for the dQ writer, dK and dV out at a tile's end, and one whole step of a consumer warpgroup of
// the D=64/128 kernel (compute_step); the D=256 kernel composes its own steps from them
// (sm90/bwd_d256.cuh).
#pragma once

#include "sm90/bwd_traits.cuh"

namespace flashcore {
namespace sm90_bwd {

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
                if (mask_tile[T::mask_byte(8 * j + col_in_tile + (e & 1), key_in_cta + 8 * (e >> 1))] == 0) x = -INFINITY;
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

}  // namespace sm90_bwd
}  // namespace flashcore
