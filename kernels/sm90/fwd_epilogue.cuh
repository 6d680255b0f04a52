// sm90/fwd_epilogue.cuh - store helpers of the Hopper forward's epilogue (sm90/fwd_kernel.cuh):
// quad_transpose regroups a quad's wgmma accumulator words so that each lane holds 8 consecutive
// columns (the 16-byte stores from registers: the pair, split CTAs, no O map), and stmatrix_x4
// writes accumulator fragments into the O staging buffer (the TMA-store epilogue).
#pragma once

#include <stdint.h>

namespace flashcore {
namespace sm90 {

// ---- Epilogue stores ----
// In the wgmma accumulator layout lane q of a quad (q = lane % 4) holds columns 8t + 2q, +1 of
// every 8-column tile t of its row: one 32-bit word per tile, so storing straight from
// registers takes 4-byte stores that each fill half a sector. quad_transpose turns the words of
// four consecutive tiles (w[t] = tile 4g + t) into one 16-byte chunk per lane: afterwards lane q
// holds tile 4g + q, its words in column order (w[j] = columns 8(4g + q) + 2j, +1). Two rounds
// of exchanges with the quad partners lane ^ 1 and lane ^ 2, each swapping one bit between the
// lane index and the tile index (4 shuffles, no local memory: the selects are on lane bits).
__device__ __forceinline__ void quad_transpose(uint32_t (&w)[4], int lane) {
    const bool odd = lane & 1, high = lane & 2;
    // Round 1: send the two tiles whose bit 0 differs from the lane's, receive the partner's.
    uint32_t r0 = __shfl_xor_sync(0xffffffff, odd ? w[0] : w[1], 1);
    uint32_t r1 = __shfl_xor_sync(0xffffffff, odd ? w[2] : w[3], 1);
    uint32_t a[4] = {odd ? r0 : w[0], odd ? w[1] : r0, odd ? r1 : w[2], odd ? w[3] : r1};
    // Round 2: the same on bit 1.
    r0 = __shfl_xor_sync(0xffffffff, high ? a[0] : a[2], 2);
    r1 = __shfl_xor_sync(0xffffffff, high ? a[1] : a[3], 2);
    w[0] = high ? r0 : a[0];
    w[1] = high ? r1 : a[1];
    w[2] = high ? a[2] : r0;
    w[3] = high ? a[3] : r1;
}

// Stores four 8x8 16-bit matrices from the mma accumulator layout (lane l holds row l / 4,
// columns 2 (l % 4) and +1 of each): lanes 8i..8i+7 give the shared addresses of matrix i's rows.
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t m0, uint32_t m1, uint32_t m2, uint32_t m3) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(m0), "r"(m1),
                 "r"(m2), "r"(m3)
                 : "memory");
}

}  // namespace sm90
}  // namespace flashcore
