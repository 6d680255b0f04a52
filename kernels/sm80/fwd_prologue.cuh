// sm80/fwd_prologue.cuh - what a CTA of the sm80-class forward (fwd_sm80.cuh) works out before its
// key loop: which query block of which (batch, head) it computes (FwdBlock), where that block's
// Q rows and the (batch, head)'s K, V and mask slices lie in global memory (FwdSlices),
// which keys it needs (keys_needed), and the coordinates of this thread's mma fragments
// (FragCoords).
#pragma once

#include "flashcore.h"  // fc_params
#include "sm80/fwd_traits.cuh"
#include "sm80/mask_tile.cuh"  // mask_chunk_bytes

#include <stdint.h>

namespace flashcore {
namespace sm80 {

// The CTA's query block and its (batch, head): blockIdx.x is the query block, so the CTAs in
// flight at once are mostly the blocks of one (batch, head) and share its K/V in L2; y is the
// head, z the batch. The longest (causal) blocks run first.
struct FwdBlock {
    int seqlen_q, seqlen_k;
    int head_q, batch, head_kv;  // head_kv: the K/V head of head_q's group
    int m_start;                 // the block's first query row
};

template <class K>
__device__ __forceinline__ FwdBlock fwd_block(const fc_params &p) {
    FwdBlock b;
    b.seqlen_q = static_cast<int>(p.seqlen_q);
    b.seqlen_k = static_cast<int>(p.seqlen_k);
    b.head_q = blockIdx.y;
    b.batch = blockIdx.z;
    b.head_kv = b.head_q / static_cast<int>(p.heads_q / p.heads_kv);
    const int m_block = gridDim.x - 1 - blockIdx.x;  // longest (causal) blocks first
    b.m_start = m_block * K::kBlockM;
    return b;
}

// This (batch, head)'s K and V slices and the mask's (its row strides, and how its tiles are
// copied: mask_chunk_bytes), from which the key loop's loads copy. The kLeanRegs kernels read
// them back from shared slots after the tiles (FwdTraits::kSlotBytes) per tile: written before
// the loop, first read after its first barrier (a load cannot move across a barrier), so they
// hold no registers in between. The others hold them. Without a mask only k and v are used
// (the unmasked slots hold 16 bytes).
template <class K>
struct KvSlices {
    const typename K::Elem *k, *v;
    const typename K::MaskBits *mask;
    int mask_stride_q, mask_stride_k, mask_chunk;
};

// Where the CTA's data lies in global memory: the block's first Q row, the (batch, head)'s K and
// V slices and with a mask the (batch, query head)'s mask slice and how its tiles are copied
// (mask_chunk_bytes; zeros without a mask), and the rows' strides. 64-bit (batch, head) bases;
// offsets inside one (batch, head) slice fit in 32 bits (checked by fc_params_validate).
template <class K>
struct FwdSlices {
    const typename K::Elem *q;
    KvSlices<K> kv;
    int q_stride, k_stride, v_stride;
};

template <class K>
__device__ __forceinline__ FwdSlices<K> fwd_slices(const fc_params &p, const FwdBlock &b) {
    using Elem = typename K::Elem;
    using MaskBits = typename K::MaskBits;
    FwdSlices<K> g;
    g.q = static_cast<const Elem *>(p.q) + b.batch * p.q_stride_b + b.head_q * p.q_stride_h +
          static_cast<int64_t>(b.m_start) * p.q_stride_s;
    g.kv.k = static_cast<const Elem *>(p.k) + b.batch * p.k_stride_b + b.head_kv * p.k_stride_h;
    g.kv.v = static_cast<const Elem *>(p.v) + b.batch * p.v_stride_b + b.head_kv * p.v_stride_h;
    g.q_stride = static_cast<int>(p.q_stride_s);
    g.k_stride = static_cast<int>(p.k_stride_s);
    g.v_stride = static_cast<int>(p.v_stride_s);
    g.kv.mask = nullptr;
    g.kv.mask_stride_q = 0, g.kv.mask_stride_k = 0, g.kv.mask_chunk = 0;
    if constexpr (K::kMask != kNoMask) {
        g.kv.mask = static_cast<const MaskBits *>(p.mask) + b.batch * p.mask_stride_b + b.head_q * p.mask_stride_h;
        g.kv.mask_stride_q = static_cast<int>(p.mask_stride_q);
        g.kv.mask_stride_k = static_cast<int>(p.mask_stride_k);
        g.kv.mask_chunk = mask_chunk_bytes(g.kv.mask, p.mask_stride_q, p.mask_stride_k, b.seqlen_q, b.seqlen_k,
                                           K::M::kElemBytes);
    }
    return g;
}

// Keys this query block needs, [0, n_end): with causal masking, none past its last row. The key
// loop runs over the tiles that start before n_end (the same tiles as counting them, one
// register fewer: seqlen_k is n_end when not causal).
template <class K>
__device__ __forceinline__ int keys_needed(const FwdBlock &b, bool causal) {
    const int last_row = min(b.m_start + K::kBlockM, b.seqlen_q) - 1;
    return causal ? min(b.seqlen_k, last_row + 1) : b.seqlen_k;
}

// This thread's place in its warp's mma fragments: the warp's rows of the block are [warp_row0,
// warp_row0 + kWarpRows); in m-atom a this lane holds rows row_in_atom and row_in_atom + 8 of the
// atom's 16, and columns col_in_tile, +1 of every 8-wide n-tile. fwd_kernel computes the four
// itself and gathers them here: computed in a function returning them, they moved a shift in
// the masked kernels' machine code.
struct FragCoords {
    int lane, warp_row0, row_in_atom, col_in_tile;
};

}  // namespace sm80
}  // namespace flashcore
