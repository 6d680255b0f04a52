// sm80/mask_tile.cuh - the attention mask in the sm80-class forward (fwd_sm80.cuh): the mask kinds
// as template values, the shared-memory tile of the mask for one K/V tile (MaskTile), how a CTA
// copies it from a mask of any strides (mask_chunk_bytes, load_mask_chunks, load_mask_elements)
// and the shared-memory loads that read it back.
#pragma once

#include "common/sm80_ptx.cuh"
#include "flashcore.h"  // FC_MASK_*

#include <stdint.h>

namespace flashcore {
namespace sm80 {

// Kinds as template values (same numbers as fc_mask_kind).
enum MaskKind : int { kNoMask = FC_MASK_NONE, kBoolMask = FC_MASK_BOOL, kAddMask = FC_MASK_ADDITIVE };

// Shared-memory tile of the mask for one K/V tile: kBlockM rows of kBlockN raw values (bool:
// 1 byte, additive: the 16-bit bits of Elem). Rows are padded by 16 bytes: with a 64- or
// 128-byte pitch the 8 rows a warp reads at once (lane / 4) would share banks (4-way and 8-way
// conflicts); with 80 / 144 bytes they start in 8 distinct 4-byte banks groups, and the pitch
// stays a multiple of 16 for 16-byte cp.async. One buffer, loaded with the K tile.
template <int kMask, int kBlockM, int kBlockN>
struct MaskTile {
    static constexpr int kElemBytes = kMask == kBoolMask ? 1 : 2;
    static constexpr int kRowBytes = kBlockN * kElemBytes;
    static constexpr int kPitch = kRowBytes + 16;
    static constexpr int kStageBytes = kMask == kNoMask ? 0 : kBlockM * kPitch;
};

// How the CTA copies its mask tiles, decided once per CTA from the mask's address, row stride
// and row length (the kernel must take any mask PyTorch can describe, not only 16-byte aligned
// ones): keys contiguous (stride 1, or one key) and the rows' start addresses and byte lengths
// all multiples of 16, 8 or 4 bytes -> cp.async chunks of that size (HuggingFace's
// (B, 1, Sq, Sk) bool mask with Sk a multiple of 16 takes 16; Sk = 1000 gives 8); anything
// else (transposed, stride-0 keys, odd addresses or lengths) -> element by element through
// registers (0), correct but slower. The row length counts because a chunk must not straddle
// the last key: cp.async's src-size keeps the hardware from reading past it, but
// compute-sanitizer's memcheck checks the copy's full size, and a mask that ends a few bytes
// after its last key would then be reported as read out of bounds.
__device__ __forceinline__ int mask_chunk_bytes(const void *slice, int64_t stride_q,
                                                int64_t stride_k, int seqlen_q, int seqlen_k,
                                                int elem_bytes) {
    if (stride_k != 1 && seqlen_k > 1) return 0;
    const uint64_t bits = reinterpret_cast<uintptr_t>(slice) |
                          static_cast<uint64_t>(seqlen_q > 1 ? stride_q * elem_bytes : 0) |
                          static_cast<uint64_t>(seqlen_k) * static_cast<uint64_t>(elem_bytes);
    if ((bits & 15) == 0) return 16;
    if ((bits & 7) == 0) return 8;
    if ((bits & 3) == 0) return 4;
    return 0;
}

// threadIdx.x read afresh at each call: the compiler cannot hoist what is computed from it out
// of the main loop (where each of load_k_tile's four mask paths would hold its own per-thread
// addresses in registers across the loop).
__device__ __forceinline__ int fresh_tid() {
    int t;
    asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(t));
    return t;
}

// 16- / 32-bit shared-memory loads at a 32-bit shared address (the mask tile's values).
__device__ __forceinline__ uint32_t ld_shared_u16(uint32_t addr) {
    unsigned short v;
    asm volatile("ld.shared.u16 %0, [%1];\n" : "=h"(v) : "r"(addr));
    return v;
}
__device__ __forceinline__ uint32_t ld_shared_u32(uint32_t addr) {
    uint32_t v;
    asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(addr));
    return v;
}

// Copy the mask tile of query rows [m_start, m_start + kRows) and keys [n_start, n_start +
// kBlockN) into `smem` (pitch kPitch) in kChunk-byte cp.async copies. Rows past Sq and keys
// past Sk are zero-filled without being read (mask_chunk_bytes picks a kChunk that divides a
// row's bytes, so a chunk is either wholly before Sk or wholly after it).
// `slice` is this (batch, head)'s mask; offsets inside it fit in int (checked by the C layer).
// kOneAddress (the kLeanRegs kernels; as load_rows): where the chunks split into whole rounds
// of rows, a thread copies the same chunk of rows row0, row0 + kRowStep, ...: one shared
// address plus immediates, one global pointer and one byte count for all its rounds (otherwise
// the compiler keeps an address per round across the main loop).
template <bool kOneAddress, int kChunk, typename Bits, int kRows, int kBlockN, int kPitch, int kThreads>
__device__ __forceinline__ void load_mask_chunks(unsigned char *smem, const Bits *slice,
                                                 int stride_q, int m_start, int n_start,
                                                 int seqlen_q, int seqlen_k) {
    constexpr int kChunkElems = kChunk / static_cast<int>(sizeof(Bits));
    constexpr int kPerRow = kBlockN / kChunkElems;
    constexpr int kItems = kRows * kPerRow;
    static_assert(kItems % kThreads == 0, "mask tile must split evenly over the CTA");
    if constexpr (kOneAddress && kThreads % kPerRow == 0) {
        constexpr int kRowStep = kThreads / kPerRow;
        const int tid = fresh_tid();
        const int row0 = tid / kPerRow, c = tid % kPerRow;
        const int col = n_start + c * kChunkElems;
        const int bytes = max(0, min(kChunk, (seqlen_k - col) * static_cast<int>(sizeof(Bits))));
        const uint32_t dst = smem_addr(smem + row0 * kPitch + c * kChunk);
        uint32_t off = static_cast<uint32_t>(m_start + row0) * static_cast<uint32_t>(stride_q) +
                       static_cast<uint32_t>(col);
        asm volatile("" : "+r"(off));
        const Bits *src = slice + static_cast<int>(off);
        const int left = seqlen_q - m_start - row0;  // this thread's rows that exist: it * kRowStep < left
#pragma unroll
        for (int it = 0; it < kRows / kRowStep; ++it) {
            const int n = it * kRowStep < left ? bytes : 0;
            cp_async_zfill<kChunk>(dst + it * kRowStep * kPitch, n > 0 ? src + it * kRowStep * stride_q : slice, n);
        }
    } else {
#pragma unroll
        for (int it = 0; it < kItems / kThreads; ++it) {
            const int item = threadIdx.x + it * kThreads;
            const int row = item / kPerRow;
            const int col = n_start + (item % kPerRow) * kChunkElems;
            int bytes = (seqlen_k - col) * static_cast<int>(sizeof(Bits));
            bytes = m_start + row < seqlen_q ? max(0, min(kChunk, bytes)) : 0;
            const Bits *src = bytes > 0 ? slice + (m_start + row) * stride_q + col : slice;
            cp_async_zfill<kChunk>(smem_addr(smem + row * kPitch + (item % kPerRow) * kChunk), src, bytes);
        }
    }
}

// The same tile element by element (any strides, any alignment): plain loads, then shared
// stores; the stores are seen by the other warps after the loop's next __syncthreads.
// kOneAddress: as in load_mask_chunks, a thread keeps one key and steps over rows.
template <bool kOneAddress, typename Bits, int kRows, int kBlockN, int kPitch, int kThreads>
__device__ __forceinline__ void load_mask_elements(unsigned char *smem, const Bits *slice,
                                                   int stride_q, int stride_k, int m_start,
                                                   int n_start, int seqlen_q, int seqlen_k) {
    static_assert(kRows * kBlockN % kThreads == 0, "mask tile must split evenly over the CTA");
    if constexpr (kOneAddress && kThreads % kBlockN == 0) {
        constexpr int kRowStep = kThreads / kBlockN;
        const int tid = fresh_tid();
        const int row0 = tid / kBlockN, col = tid % kBlockN;
        // Rows this thread reads: it * kRowStep < left (none when its key is past Sk).
        const int left = n_start + col < seqlen_k ? seqlen_q - m_start - row0 : 0;
        const Bits *src = slice + (m_start + row0) * stride_q + (n_start + col) * stride_k;
        Bits *dst = reinterpret_cast<Bits *>(smem + row0 * kPitch) + col;
#pragma unroll 8
        for (int it = 0; it < kRows / kRowStep; ++it) {
            Bits val = 0;
            if (it * kRowStep < left) val = src[it * kRowStep * stride_q];
            dst[it * kRowStep * kPitch / static_cast<int>(sizeof(Bits))] = val;
        }
    } else {
#pragma unroll 8
        for (int it = 0; it < kRows * kBlockN / kThreads; ++it) {
            const int item = threadIdx.x + it * kThreads;  // consecutive threads: consecutive keys
            const int row = item / kBlockN, col = item % kBlockN;
            Bits val = 0;
            if (m_start + row < seqlen_q && n_start + col < seqlen_k)
                val = slice[(m_start + row) * stride_q + (n_start + col) * stride_k];
            reinterpret_cast<Bits *>(smem + row * kPitch)[col] = val;
        }
    }
}

}  // namespace sm80
}  // namespace flashcore
