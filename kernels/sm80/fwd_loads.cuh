// sm80/fwd_loads.cuh - how the sm80-class forward (fwd_sm80.cuh) gets its K and V tiles (and the
// attn_mask's tiles) into shared memory: the (batch, head) slices they are copied from
// (KvSlices, sm80/fwd_prologue.cuh) kept by the lean-register kernels in shared slots rather than
// in registers (store_slots), and the copies of one tile (load_k_tile with its mask tile, load_v_tile),
// rows past seqlen_k zero-filled. The row copies themselves are sm80/tile.cuh's load_tile and
// sm80/row_copy.cuh's load_rows; the mask copies sm80/mask_tile.cuh's.
#pragma once

#include "common/sm80_ptx.cuh"
#include "sm80/fwd_prologue.cuh"  // FwdBlock, KvSlices
#include "sm80/fwd_traits.cuh"
#include "sm80/mask_tile.cuh"  // load_mask_chunks, load_mask_elements
#include "sm80/row_copy.cuh"   // load_rows

#include <stdint.h>

namespace flashcore {
namespace sm80 {

// kLeanRegs: thread 0 writes the slices into the shared slots (nothing otherwise).
template <class K>
__device__ __forceinline__ void store_slots(KvSlices<K> *slots, const KvSlices<K> &held) {
    using T = typename K::T;
    static_assert(!T::kLeanRegs || sizeof(KvSlices<K>) <= T::kSlotBytes ||
                      (K::kMask == kNoMask && 2 * sizeof(void *) <= T::kSlotBytes),
                  "the slots hold the slices");
    if constexpr (T::kLeanRegs) {
        if (threadIdx.x == 0) {
            slots->k = held.k, slots->v = held.v;
            if constexpr (K::kMask != kNoMask) {
                slots->mask = held.mask, slots->mask_stride_q = held.mask_stride_q;
                slots->mask_stride_k = held.mask_stride_k, slots->mask_chunk = held.mask_chunk;
            }
        }
    }
}

// K tile [n_start, n_start + kBlockN) into its single buffer, and with a mask the mask's tile of
// the CTA's rows and those keys beside it, in the copy mode `from.mask_chunk` says (the same for
// the whole CTA: no divergence). `from`: the slices in the shared slots or the held ones; each
// field is read where it is used, so slot reads stay next to their use.
template <class K>
__device__ __forceinline__ void load_k_tile(typename K::Elem *smem_k, unsigned char *smem_mask, const KvSlices<K> &from,
                                            int k_stride, int n_start, const FwdBlock &blk) {
    using T = typename K::T;
    using MaskBits = typename K::MaskBits;
    constexpr int kBlockM = K::kBlockM, kBlockN = K::kBlockN;
    load_rows<T::kLeanRegs, typename K::Elem, kBlockN, K::kChunks, T::kThreads, K::kPitchChunks>(
        smem_k, from.k, n_start, k_stride, min(kBlockN, blk.seqlen_k - n_start));
    if constexpr (K::kMask != kNoMask) {
        constexpr int kP = K::M::kPitch, kTh = T::kThreads;
        constexpr bool kOne = T::kLeanRegs;
        const MaskBits *ms = from.mask;
        const int sq = from.mask_stride_q;
        switch (from.mask_chunk) {
        case 16:
            load_mask_chunks<kOne, 16, MaskBits, kBlockM, kBlockN, kP, kTh>(smem_mask, ms, sq, blk.m_start, n_start, blk.seqlen_q, blk.seqlen_k);
            break;
        case 8:
            load_mask_chunks<kOne, 8, MaskBits, kBlockM, kBlockN, kP, kTh>(smem_mask, ms, sq, blk.m_start, n_start, blk.seqlen_q, blk.seqlen_k);
            break;
        case 4:
            load_mask_chunks<kOne, 4, MaskBits, kBlockM, kBlockN, kP, kTh>(smem_mask, ms, sq, blk.m_start, n_start, blk.seqlen_q, blk.seqlen_k);
            break;
        default:
            load_mask_elements<kOne, MaskBits, kBlockM, kBlockN, kP, kTh>(smem_mask, ms, sq, from.mask_stride_k, blk.m_start,
                                                                        n_start, blk.seqlen_q, blk.seqlen_k);
        }
    }
}

// V tile [n_start, n_start + kBlockN) of `slice` into its single buffer.
template <class K>
__device__ __forceinline__ void load_v_tile(typename K::Elem *smem_v, const typename K::Elem *slice, int v_stride,
                                            int n_start, int seqlen_k) {
    using T = typename K::T;
    load_rows<T::kLeanRegs, typename K::Elem, K::kBlockN, K::kChunks, T::kThreads, K::kPitchChunks>(
        smem_v, slice, n_start, v_stride, min(K::kBlockN, seqlen_k - n_start));
}

}  // namespace sm80
}  // namespace flashcore
