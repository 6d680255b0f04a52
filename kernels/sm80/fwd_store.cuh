// sm80/fwd_store.cuh - the sm80-class forward's epilogue, as fwd_kernel (fwd_sm80.cuh) runs it
// after its last key tile: the rows' sums over the lane quad and their inverses (finish_rows),
// the log-sum-exp of each row (store_lse), and O normalised, staged through the Q tile and
// written to global memory in 16-byte stores (store_o). Rows past seqlen_q are not written.
#pragma once

#include "common/sm80_ptx.cuh"
#include "flashcore.h"  // fc_params
#include "sm80/fwd_prologue.cuh"  // FwdBlock, FragCoords
#include "sm80/fwd_traits.cuh"
#include "sm80/tile.cuh"  // swizzled

#include <stdint.h>

namespace flashcore {
namespace sm80 {

// Each row's sum over the lane quad (every lane ends with the whole sum) and its inverse. A row
// whose every key is masked has sum 0: PyTorch returns zeros there (its safe softmax), not 0/0.
// Only masked variants can have such rows by design; the others keep 1/sum, so NaN/Inf inputs
// propagate exactly as before.
template <class K>
__device__ __forceinline__ void finish_rows(float (&row_sum)[K::kAtoms][2], float (&inv_sum)[K::kAtoms][2]) {
#pragma unroll
    for (int a = 0; a < K::kAtoms; ++a)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float sum = row_sum[a][h];
            sum += __shfl_xor_sync(0xffffffff, sum, 1);
            sum += __shfl_xor_sync(0xffffffff, sum, 2);
            row_sum[a][h] = sum;
            inv_sum[a][h] = (K::kMask != kNoMask && sum == 0.f) ? 0.f : 1.f / sum;
        }
}

// The natural-log LSE of this warp's rows before seqlen_q, when the call asks for it (p.lse),
// from the quad's first lane.
template <class K>
__device__ __forceinline__ void store_lse(const fc_params &p, const float (&row_max)[K::kAtoms][2],
                                          const float (&row_sum)[K::kAtoms][2], const FwdBlock &blk, const FragCoords &at) {
    if (p.lse != nullptr && (at.lane % 4) == 0) {
#pragma unroll
        for (int a = 0; a < K::kAtoms; ++a)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int row = blk.m_start + at.warp_row0 + a * 16 + at.row_in_atom + 8 * h;
                if (row < blk.seqlen_q) {
                    // Natural log: (max in base-2 units + log2(sum)) * ln(2), or max in natural
                    // units + log2(sum) * ln(2). Fully masked rows: -inf + -inf = -inf.
                    const float lse = K::kNatural ? row_max[a][h] + __log2f(row_sum[a][h]) * 0.6931471805599453f
                                                  : (row_max[a][h] + __log2f(row_sum[a][h])) * 0.6931471805599453f;
                    p.lse[blk.batch * p.lse_stride_b + blk.head_q * p.lse_stride_h + row * p.lse_stride_s] = lse;
                }
            }
    }
}

// O times each row's inverse sum, packed to 16 bits and written to this (batch, head)'s output
// rows before seqlen_q. The warp stages its rows in its own rows of the Q tile (stage_o): only
// this warp ever read them, and its last ldmatrix of them fed the mma whose results are stored
// here. Then each lane writes 16-byte chunks to global memory.
template <class K>
__device__ __forceinline__ void store_o(const fc_params &p, const float (&o_acc)[K::kAtoms][K::kDTiles][4],
                                        const float (&inv_sum)[K::kAtoms][2], typename K::Elem *stage_o,
                                        const FwdBlock &blk, const FragCoords &at) {
    using Elem = typename K::Elem;
    constexpr int kChunks = K::kChunks, kPitchChunks = K::kPitchChunks;
#pragma unroll
    for (int a = 0; a < K::kAtoms; ++a)
#pragma unroll
        for (int d = 0; d < K::kDTiles; ++d)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = at.warp_row0 + a * 16 + at.row_in_atom + 8 * h;
                const uint32_t packed = pack2<Elem>(o_acc[a][d][2 * h] * inv_sum[a][h],
                                                    o_acc[a][d][2 * h + 1] * inv_sum[a][h]);
                *reinterpret_cast<uint32_t *>(stage_o + swizzled<kPitchChunks>(r, d) + at.col_in_tile) = packed;
            }
    __syncwarp();
    Elem *out = static_cast<Elem *>(p.out) + blk.batch * p.o_stride_b + blk.head_q * p.o_stride_h;
    const int o_stride = static_cast<int>(p.o_stride_s);
#pragma unroll
    for (int it = 0; it < K::kWarpRows * kChunks / 32; ++it) {
        const int item = at.lane + it * 32;
        const int r = at.warp_row0 + item / kChunks;
        const int chunk = item % kChunks;
        const int row = blk.m_start + r;
        if (row < blk.seqlen_q) {
            const uint4 val = *reinterpret_cast<const uint4 *>(stage_o + swizzled<kPitchChunks>(r, chunk));
            *reinterpret_cast<uint4 *>(out + static_cast<int64_t>(row) * o_stride + chunk * 8) = val;
        }
    }
}

}  // namespace sm80
}  // namespace flashcore
