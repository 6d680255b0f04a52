// sm80/fwd_steps.cuh - one warp's work on one K/V tile in the sm80-class forward, in the order
// fwd_kernel (fwd_sm80.cuh) runs it, after the rows' start (start_rows): S = Q K^T (qk_gemm),
// the scores scaled and capped (scale_scores), the attn_mask's tile applied (apply_mask_tile),
// the keys past the end or past the diagonal masked (mask_edges), the online softmax
// (online_softmax: row max, O's rescale, exponentials and row sums) and O += P V (pv_gemm).
//
// Fragment layout (mma.sync m16n8k16; FragCoords): in m-atom a this lane holds rows row_in_atom
// and row_in_atom + 8 of the atom's 16, and columns col_in_tile, +1 of every 8-wide n-tile;
// element e of an accumulator tile is row (e >> 1) * 8, column e & 1 of that. The warp's rows
// are [warp_row0, warp_row0 + kWarpRows) of the block.
//
// Scratch arrays: a step's local arrays (fragments, per-row values) are the caller's, declared in
// fwd_kernel where the step once was and passed in. Declared in here, they changed the kernels'
// machine code (the same instructions, other registers): the inliner puts an inlined function's
// arrays first in the kernel's list of locals, which reorders the loop's carried values.
#pragma once

#include "common/sm80_ptx.cuh"
#include "flashcore.h"  // fc_params
#include "sm80/fwd_prologue.cuh"  // FwdBlock, FragCoords
#include "sm80/fwd_traits.cuh"
#include "sm80/mask_tile.cuh"
#include "sm80/row_copy.cuh"  // ChunkPairWalk

#include <math.h>
#include <stdint.h>

namespace flashcore {
namespace sm80 {

// The rows' state before the first key tile: O zero, max -inf, sum zero.
template <class K>
__device__ __forceinline__ void start_rows(float (&o_acc)[K::kAtoms][K::kDTiles][4], float (&row_max)[K::kAtoms][2],
                                           float (&row_sum)[K::kAtoms][2]) {
#pragma unroll
    for (int a = 0; a < K::kAtoms; ++a)
#pragma unroll
        for (int i = 0; i < K::kDTiles; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j) o_acc[a][i][j] = 0.f;
#pragma unroll
    for (int a = 0; a < K::kAtoms; ++a)
#pragma unroll
        for (int h = 0; h < 2; ++h) row_max[a][h] = -INFINITY, row_sum[a][h] = 0.f;
}

// S = Q K^T for this warp's rows x kBlockN keys. Q's A fragments are re-read from shared memory
// per k-step (registers hold O and S; FlashAttention-2 too): matrices (rows 0-7 | 8-15) x
// (cols 0-7 | 8-15). Each K fragment feeds every m-atom. q_addr and k_addr are back at chunk
// pair 0 afterwards. qf, kf: the fragments' registers (scratch; see the note above).
template <class K>
__device__ __forceinline__ void qk_gemm(float (&s)[K::kAtoms][K::kNTiles][4], uint32_t (&qf)[K::kAtoms][4], uint32_t (&kf)[4],
                                        ChunkPairWalk<K::T::kWalkQK> &q_addr, ChunkPairWalk<K::T::kWalkQK> &k_addr) {
    using Elem = typename K::Elem;
    constexpr int kAtoms = K::kAtoms, kNTiles = K::kNTiles, kRowBytes = K::kRowBytes;
#pragma unroll
    for (int a = 0; a < kAtoms; ++a)
#pragma unroll
        for (int j = 0; j < kNTiles; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[a][j][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < K::kKSteps; ++kk) {
#pragma unroll
        for (int a = 0; a < kAtoms; ++a)
            ldmatrix_x4(qf[a], q_addr(kk) + a * 16 * kRowBytes);
#pragma unroll
        for (int np = 0; np < kNTiles / 2; ++np) {
            // B fragments of K for n-tiles 2np, 2np+1: (keys 0-7 | 8-15) x (d 0-7 | 8-15).
            ldmatrix_x4(kf, k_addr(kk) + np * 16 * kRowBytes);
#pragma unroll
            for (int a = 0; a < kAtoms; ++a) {
                mma_16816_pair<Elem>(s[a][2 * np], s[a][2 * np + 1], qf[a], kf);
            }
        }
    }
    q_addr.rewind();
    k_addr.rewind();
}

// The scores times score_mul (into base-2 or natural units; FwdShape::kNatural), or with kSoftcap
// capped: softcap tanh(score_mul s), softcap read from the kernel's parameters.
template <class K>
__device__ __forceinline__ void scale_scores(float (&s)[K::kAtoms][K::kNTiles][4], float score_mul, const fc_params &p) {
#pragma unroll
    for (int a = 0; a < K::kAtoms; ++a)
#pragma unroll
        for (int j = 0; j < K::kNTiles; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                if constexpr (K::kSoftcap) s[a][j][e] = fast_tanh(s[a][j][e] * score_mul) * p.softcap;
                else s[a][j][e] *= score_mul;
            }
}

// The attn_mask's tile (sm80/mask_tile.cuh, loaded with K) applied to the scaled scores: a bool
// mask's zeros become -inf, an additive mask's values are added. Nothing without a mask.
template <class K>
__device__ __forceinline__ void apply_mask_tile(float (&s)[K::kAtoms][K::kNTiles][4], unsigned char *smem_mask,
                                                const FragCoords &at) {
    using M = typename K::M;
    if constexpr (K::kMask != kNoMask) {
        // This thread's values sit at rows (row_in_atom, +8) of each atom and columns
        // (8j + col_in_tile, +1): one 2-value load per (row, n-tile), from one shared
        // address per thread plus immediates.
        const uint32_t mask_base = smem_addr(smem_mask + (at.warp_row0 + at.row_in_atom) * M::kPitch +
                                             at.col_in_tile * M::kElemBytes);
#pragma unroll
        for (int a = 0; a < K::kAtoms; ++a)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
#pragma unroll
                for (int j = 0; j < K::kNTiles; ++j) {
                    const uint32_t at = mask_base + (a * 16 + 8 * h) * M::kPitch + j * 8 * M::kElemBytes;
                    if constexpr (K::kMask == kBoolMask) {
                        const uint32_t two = ld_shared_u16(at);
                        if ((two & 0xffu) == 0) s[a][j][2 * h] = -INFINITY;
                        if ((two >> 8) == 0) s[a][j][2 * h + 1] = -INFINITY;
                    } else {
                        const float2 add = unpack2<typename K::Elem>(ld_shared_u32(at));
                        s[a][j][2 * h] += add.x;
                        s[a][j][2 * h + 1] += add.y;
                    }
                }
            }
    }
}

// -inf for the keys this warp's rows must not see in the tile of keys [n_start, n_start +
// kBlockN): those at or past seqlen_k (the ragged last tile) and, causal, those right of a row's
// own position. Only tiles that reach past the end or cross the diagonal have any. valid: each
// row's count of keys to keep (scratch; see the note above).
template <class K>
__device__ __forceinline__ void mask_edges(float (&s)[K::kAtoms][K::kNTiles][4], int (&valid)[K::kAtoms][2], bool causal,
                                           int n_start, const FwdBlock &blk, const FragCoords &at) {
    constexpr int kAtoms = K::kAtoms, kBlockN = K::kBlockN;
    const int m_start = blk.m_start, seqlen_k = blk.seqlen_k;
    const int warp_row0 = at.warp_row0, row_in_atom = at.row_in_atom, col_in_tile = at.col_in_tile;
    const bool ragged = n_start + kBlockN > seqlen_k;
    const bool crosses_diagonal = causal && n_start + kBlockN - 1 > m_start + warp_row0;
    if (ragged || crosses_diagonal) {
        // Columns n_start + col_in_tile + c, c = j * 8 + (e & 1) a compile-time constant:
        // row (a, h) keeps those with c < valid[a][h] (keys before seqlen_k and, causal,
        // up to the row itself), one compare with an immediate per element.
#pragma unroll
        for (int a = 0; a < kAtoms; ++a)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int row = m_start + warp_row0 + a * 16 + row_in_atom + h * 8;
                const int key_end = causal ? min(seqlen_k, row + 1) : seqlen_k;
                valid[a][h] = key_end - n_start - col_in_tile;
            }
#pragma unroll
        for (int a = 0; a < kAtoms; ++a)
#pragma unroll
            for (int j = 0; j < K::kNTiles; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    if (j * 8 + (e & 1) >= valid[a][e >> 1]) s[a][j][e] = -INFINITY;
    }
}

// The online softmax of one tile: each row's new max (over the tile and the lane quad), O's row
// and the running sum rescaled to it, and S replaced by exp(S - max) (P, unnormalised). row_max
// is in the scores' units (base 2, or natural with kNatural); row_sum is this lane's part of the
// row's sum (the quad's parts are added in the epilogue). mx: the new maxima (scratch; see the
// note above).
template <class K>
__device__ __forceinline__ void online_softmax(float (&s)[K::kAtoms][K::kNTiles][4], float (&mx)[K::kAtoms][2],
                                               float (&row_max)[K::kAtoms][2], float (&row_sum)[K::kAtoms][2],
                                               float (&o_acc)[K::kAtoms][K::kDTiles][4]) {
    constexpr int kAtoms = K::kAtoms, kNTiles = K::kNTiles;
    // Base-2 units: exp2(x). Natural units: exp2(x * log2(e)), x max-subtracted.
    const float units = K::kNatural ? K::kLog2e : 1.f;
    bool rebase_row = false;
#pragma unroll
    for (int a = 0; a < kAtoms; ++a)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float m = row_max[a][h];
#pragma unroll
            for (int j = 0; j < kNTiles; ++j)
                m = fmaxf(m, fmaxf(s[a][j][2 * h], s[a][j][2 * h + 1]));
            m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, 1));
            m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, 2));
            mx[a][h] = m;
            rebase_row |= must_rebase(m, row_max[a][h], units);
        }
    // Lazy rescaling (must_rebase; only where kLazyRescale): the warp's rows keep their
    // bases unless one of them must move. One vote per warp and tile.
    const bool rebase = !kLazyRescale<K::kHeadDim, K::kCausal> || __any_sync(0xffffffff, rebase_row);
#pragma unroll
    for (int a = 0; a < kAtoms; ++a)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            if (!rebase) mx[a][h] = row_max[a][h];
            // A row that has seen only masked keys keeps max -inf; exponentiate against 0.
            const float base = mx[a][h] == -INFINITY ? 0.f : mx[a][h];
            const float rescale = fast_exp2((row_max[a][h] - base) * units);
            row_max[a][h] = mx[a][h];
            float sum = 0.f;
#pragma unroll
            for (int j = 0; j < kNTiles; ++j) {
                s[a][j][2 * h] = fast_exp2((s[a][j][2 * h] - base) * units);
                s[a][j][2 * h + 1] = fast_exp2((s[a][j][2 * h + 1] - base) * units);
                sum += s[a][j][2 * h] + s[a][j][2 * h + 1];
            }
            row_sum[a][h] = row_sum[a][h] * rescale + sum;
            if (rebase) {
#pragma unroll
                for (int d = 0; d < K::kDTiles; ++d) {
                    o_acc[a][d][2 * h] *= rescale;
                    o_acc[a][d][2 * h + 1] *= rescale;
                }
            }
        }
}

// O += P V: P's accumulator layout is the A-fragment layout of a 16x16 k-step, so P goes from
// the S registers straight into A fragments (packed to 16 bits), never to shared memory. Each V
// fragment feeds every m-atom. v_addr is back at chunk pair 0 after each k-step. pf, vf: the
// fragments' registers (scratch; see the note above).
template <class K>
__device__ __forceinline__ void pv_gemm(float (&o_acc)[K::kAtoms][K::kDTiles][4], const float (&s)[K::kAtoms][K::kNTiles][4],
                                        uint32_t (&pf)[K::kAtoms][4], uint32_t (&vf)[4], ChunkPairWalk<K::T::kLeanRegs> &v_addr) {
    using Elem = typename K::Elem;
    constexpr int kAtoms = K::kAtoms;
#pragma unroll
    for (int kk = 0; kk < K::kBlockN / 16; ++kk) {
#pragma unroll
        for (int a = 0; a < kAtoms; ++a) {
            pf[a][0] = pack2<Elem>(s[a][2 * kk][0], s[a][2 * kk][1]);
            pf[a][1] = pack2<Elem>(s[a][2 * kk][2], s[a][2 * kk][3]);
            pf[a][2] = pack2<Elem>(s[a][2 * kk + 1][0], s[a][2 * kk + 1][1]);
            pf[a][3] = pack2<Elem>(s[a][2 * kk + 1][2], s[a][2 * kk + 1][3]);
        }
#pragma unroll
        for (int dp = 0; dp < K::kDTiles / 2; ++dp) {
            // Transposed B fragments of V: (keys 0-7 | 8-15) x (d 0-7 | 8-15).
            ldmatrix_x4_trans(vf, v_addr(dp) + kk * 16 * K::kRowBytes);
#pragma unroll
            for (int a = 0; a < kAtoms; ++a) {
                mma_16816_pair<Elem>(o_acc[a][2 * dp], o_acc[a][2 * dp + 1], pf[a], vf);
            }
        }
        v_addr.rewind();
    }
}

}  // namespace sm80
}  // namespace flashcore
