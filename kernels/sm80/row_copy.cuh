// sm80/row_copy.cuh - address helpers and row copies of the sm80-class forward's lean-register
// kernels (fwd_sm80.cuh, FwdTraits::kLeanRegs): ldmatrix chunk-pair addresses without a register
// per k-step (chunk_pair_addr, ChunkPairWalk) and K/V row copies from one address per thread
// (load_rows).
#pragma once

#include "common/sm80_ptx.cuh"
#include "sm80/tile.cuh"  // swizzled, load_tile

#include <stdint.h>

namespace flashcore {
namespace sm80 {

// ldmatrix addresses without a register per k-step. A lane reads 16-byte chunk 2*kk + b of its
// row (b: the lane's half of the chunk pair). With x = row % 8 the swizzled chunk is
// 8*(kk/4) + ((2*(kk%4)) ^ b ^ x), so from `base`, the byte address of chunk b (swizzled) of the
// row, chunk 2*kk + b is base ^ 32*(kk%4), plus 128*(kk/4). This holds when the tile starts on a
// 128-byte boundary (rows are multiples of 128 bytes), which keeps bits 4-6 of `base` to the
// swizzle. kk is a compile-time constant in every unrolled loop: one LOP3, the rest an immediate.
__device__ __forceinline__ uint32_t chunk_pair_addr(uint32_t base, int kk) {
    return (base ^ ((kk & 3) << 5)) + ((kk >> 2) << 7);
}

// The address of chunk pair kk for a loop over kk = 0, 1, ... (fully unrolled). kWalk = false:
// chunk_pair_addr(base, kk), whose four (kk % 4) values ptxas computes once and keeps in four
// registers for the whole kernel. kWalk = true: one register, stepped from pair kk to kk + 1
// (one LOP3, and an add every fourth step) and set back to pair 0 by rewind() after the loop;
// the empty asm there hides from the compiler that the round trip is the identity, which would
// let it hoist the four values again. `at` is a compile-time constant after unrolling.
template <bool kWalk>
struct ChunkPairWalk {
    uint32_t addr;  // kWalk: the address of chunk pair `at`; otherwise of pair 0
    int at = 0;
    __device__ __forceinline__ explicit ChunkPairWalk(uint32_t base) : addr(base) {}
    __device__ __forceinline__ uint32_t operator()(int kk) {
        if constexpr (!kWalk) {
            return chunk_pair_addr(addr, kk);
        } else {
            for (; at < kk; ++at) addr = (addr ^ (at & 1 ? 96 : 32)) + ((at & 3) == 3 ? 128 : 0);
            return addr;
        }
    }
    __device__ __forceinline__ void rewind() {
        if constexpr (kWalk) {
            addr = (addr - ((at >> 2) << 7)) ^ ((at & 3) << 5);
            at = 0;
            asm volatile("" : "+r"(addr));
        }
    }
};

// load_tile for the forward's K and V tiles: rows [row_start, row_start + kRows) of `slice`
// (row stride `row_stride`), of which the first `rows` exist (the rest are zero-filled). Where
// the chunks split into whole rounds of a multiple of 8 rows (D=32/64/128: 32/16/8 rows per
// round), a thread copies the same chunk of rows row0, row0 + kRowStep, ...: the same (row % 8)
// swizzle every round, so one shared address plus immediates; and one global pointer, its
// rounds kRowStep rows apart. The empty asm keeps the compiler from splitting the thread's
// offset off the tile's (both hoisted out of the main loop, its parts would hold registers
// across it: 8-16 per tile load, spilled at D=128). Offsets of existing rows fit in 32 bits
// (fc_params_validate); unsigned arithmetic, as rows past the end are computed but not read.
// Same mapping of chunks to threads as load_tile. Only the kLeanRegs kernels (kOneAddress) copy
// this way; the others call load_tile (with load_rows, D=64 on 128x64 tiles measured 1-2% slower
// non-causal on the H100, thirteenth session: a few more instructions per tile, no registers it
// needed).
template <bool kOneAddress, typename Elem, int kRows, int kChunks, int kThreads, int kPitchChunks>
__device__ __forceinline__ void load_rows(Elem *smem_tile, const Elem *slice, int row_start,
                                          int row_stride, int rows) {
    constexpr int kRowStep = kThreads / kChunks;
    if constexpr (kOneAddress && kThreads % kChunks == 0 && kRowStep % 8 == 0 && kRows % kRowStep == 0) {
        const int row0 = threadIdx.x / kChunks, chunk = threadIdx.x % kChunks;
        const uint32_t dst = smem_addr(smem_tile + swizzled<kPitchChunks>(row0, chunk));
        uint32_t off = static_cast<uint32_t>(row_start + row0) * static_cast<uint32_t>(row_stride) +
                       static_cast<uint32_t>(chunk * 8);
        asm volatile("" : "+r"(off));
        const Elem *src = slice + static_cast<int>(off);
        const int left = rows - row0;  // this thread's rows that exist: it * kRowStep < left
#pragma unroll
        for (int it = 0; it < kRows / kRowStep; ++it) {
            const bool valid = it * kRowStep < left;
            cp_async_16(dst + it * kRowStep * kPitchChunks * 16,
                        valid ? src + it * kRowStep * row_stride : slice, valid);
        }
    } else {
        load_tile<Elem, kRows, kChunks, kThreads, kPitchChunks>(smem_tile, slice + row_start * row_stride,
                                                                row_stride, rows);
    }
}

}  // namespace sm80
}  // namespace flashcore
