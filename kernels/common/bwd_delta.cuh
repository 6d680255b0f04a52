// common/bwd_delta.cuh - what both backward families' row kernels share: their thread layout
// (RowLane) and the softmax correction term delta = rowsum(dO * O) of one query row, as
// bwd_sm80.cuh's delta_kernel and sm90/bwd_rows.cuh's row_terms_kernel compute it: kHeadDim / 8
// consecutive lanes per row (rounded up to a power of two), each reading 16 bytes of dO and of O,
// then summed across those lanes with xor shuffles.
#pragma once

#include "common/sm80_ptx.cuh"  // unpack2

#include <cuda/std/utility>
#include <stdint.h>

namespace flashcore {

// What a thread of a row kernel (sm90/bwd_rows.cuh's row_terms_kernel, bwd_sm80.cuh's
// delta_kernel and dq_convert_kernel) takes: kHeadDim / 8 consecutive threads per row, each a
// 16-byte chunk of it (kChunks), rounded up to a power of two so that a row's lanes are an
// aligned group of the warp for the shuffles (D=80 / 96: 16 lanes, of which 10 / 12 hold a
// chunk; the others read nothing). Grid: (rows / kRowsPerCta, query heads, batch) CTAs of 128
// threads.
template <int kHeadDim>
struct RowLane {
    static constexpr int kChunks = kHeadDim / 8;
    static constexpr int kThreadsPerRow = kChunks <= 4 ? 4 : kChunks <= 8 ? 8 : kChunks <= 16 ? 16 : 32;
    static_assert(kHeadDim % 8 == 0 && kChunks <= 32, "16-byte chunks, at most a warp per row");
    static constexpr int kRowsPerCta = 128 / kThreadsPerRow;
    int head = blockIdx.y, batch = blockIdx.z, chunk = threadIdx.x % kThreadsPerRow;
    int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerCta + threadIdx.x / kThreadsPerRow;
    // Lane `c` of a row holds a chunk of it (always, where the row's lanes are exactly its chunks).
    static __device__ __forceinline__ bool holds(int c) { return kThreadsPerRow == kChunks || c < kChunks; }
    __device__ __forceinline__ bool has_chunk() const { return holds(chunk); }
};

// `real`: the row exists (rows past Sq read nothing and contribute 0, but still take part in
// the shuffles, which every lane of the warp must reach; so do a row's lanes past its chunks). `rows()` gives the row's dO and O
// pointers, as a pair; it is called only for a real row. Every lane of the row gets the sum.
template <typename Elem, int kHeadDim, typename RowPointers>
__device__ __forceinline__ float row_dot_dout_out(bool real, int chunk, RowPointers rows) {
    constexpr int kThreadsPerRow = RowLane<kHeadDim>::kThreadsPerRow;
    real = real && RowLane<kHeadDim>::holds(chunk);
    float acc = 0.f;
    if (real) {
        const auto [dout_row, out_row] = rows();
        const uint4 a = *reinterpret_cast<const uint4 *>(dout_row + chunk * 8);
        const uint4 b = *reinterpret_cast<const uint4 *>(out_row + chunk * 8);
        const uint32_t av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const float2 x = unpack2<Elem>(av[i]), y = unpack2<Elem>(bv[i]);
            acc = fmaf(x.x, y.x, fmaf(x.y, y.y, acc));
        }
    }
#pragma unroll
    for (int off = kThreadsPerRow / 2; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffff, acc, off);
    return acc;
}

}  // namespace flashcore
