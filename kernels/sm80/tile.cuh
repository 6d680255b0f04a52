// sm80/tile.cuh - shared-memory tiles of the sm80-class kernels (the forward, fwd_sm80.cuh, and
// the backward, bwd_sm80.cuh): rows of 16-byte chunks XOR-swizzled by (row % 8), so that the 8
// row addresses of an ldmatrix phase fall in different banks, and their cp.async copy from global
// memory with rows past the end zero-filled.
#pragma once

#include "common/sm80_ptx.cuh"  // cp_async_16, smem_addr

#include <stdint.h>

namespace flashcore {
namespace sm80 {

// Element offset of (row, chunk) in a swizzled tile whose rows are kPitchChunks 16-byte chunks
// (a multiple of 8: the XOR stays inside the row's own group of 8 chunks).
template <int kPitchChunks>
__device__ __forceinline__ int swizzled(int row, int chunk) {
    static_assert(kPitchChunks % 8 == 0, "the swizzle needs rows of whole 128-byte groups");
    return row * kPitchChunks * 8 + ((chunk ^ (row & 7)) * 8);
}

// Copy `rows` x D elements (rows <= kRows, D = 8 * kChunks) of a row-strided global tile into a
// swizzled shared tile of kRows rows of kPitchChunks chunks; rows >= `rows` are zero-filled. All
// threads of the CTA take part (with a ragged last round where the chunks do not split evenly:
// D=80 x 32 keys is 2.5 rounds of 128 threads).
// (kPitchChunks defaults to kChunks: unpadded rows, as the backward uses it.)
template <typename Elem, int kRows, int kChunks, int kThreads, int kPitchChunks = kChunks>
__device__ __forceinline__ void load_tile(Elem *smem_tile, const Elem *gmem, int row_stride,
                                          int rows) {
    constexpr int kItems = kRows * kChunks;
#pragma unroll
    for (int it = 0; it < (kItems + kThreads - 1) / kThreads; ++it) {
        const int item = threadIdx.x + it * kThreads;
        if (kItems % kThreads != 0 && item >= kItems) break;
        const int row = item / kChunks;
        const int chunk = item % kChunks;
        const bool valid = row < rows;
        const Elem *src = valid ? gmem + row * row_stride + chunk * 8 : gmem;
        cp_async_16(smem_addr(smem_tile + swizzled<kPitchChunks>(row, chunk)), src, valid);
    }
}

}  // namespace sm80
}  // namespace flashcore
