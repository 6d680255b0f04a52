// split_combine.cuh - the merge of a split-KV call's partial results (flash-decoding's second
// kernel), shared by the decode kernels (decode_sm80.cuh) and the Hopper family's grid split for
// decoding (sm90/fwd_launch.cuh, launch_fwd_config).
//
// A split kernel leaves, per query row and split, the row's O normalised over that split's keys
// (fp32) and its base-2 LSE in the caller's workspace; combine_kernel weighs the splits by their
// LSEs and writes O (and the LSE) in the output's dtype and strides.
#pragma once

#include "common/sm80_ptx.cuh"
#include "flashcore.h"

#include <cuda_runtime.h>
#include <math.h>

namespace flashcore {

// Workspace layout for `splits` > 1: partial O [B][Hq][Sq][splits][D] fp32, then partial LSE
// [B][Hq][Sq][splits] fp32 (fc_decode_workspace_bytes sizes it). Row index of (b, h, s) =
// (b * Hq + h) * Sq + s, in the call's own terms (a packed GQA call's rows are its query heads).
__host__ __device__ inline int64_t partial_rows(const fc_params &p) { return p.batch * p.heads_q * p.seqlen_q; }

// Merge the splits' partials: O = sum_i w_i O_i / sum_i w_i, w_i = 2^(lse_i - max lse), one CTA
// per (b, h, s) row. Every load is independent of the others: the threads first take the max
// over the splits' LSEs together, then each group of kHeadDim / 4 threads folds every
// kGroups-th split's O row (a float4 per thread, rows read whole), and the groups' sums meet in
// shared memory. One thread per column walking the splits in turn (the first version) took
// 5.4 us for 49 splits at B=1, Hq=32, Hkv=8, Sk=8192 (H100; cuDNN's reduction 2.9 us).
constexpr int kCombineThreads = 128;

template <typename Elem, int kHeadDim>
__global__ void __launch_bounds__(kCombineThreads)
combine_kernel(const fc_params p, int splits, const float *partial_o, const float *partial_lse) {
    constexpr int kLanes = kHeadDim / 4;                 // threads per split's O row
    constexpr int kGroups = kCombineThreads / kLanes;    // splits folded side by side
    static_assert(kHeadDim % 4 == 0 && kCombineThreads % kLanes == 0, "head dim must split into float4 lanes");
    __shared__ float warp_max[kCombineThreads / 32];
    __shared__ float4 group_acc[kGroups][kLanes];
    __shared__ float group_total[kGroups];
    wait_for_prior_grids();  // fc_use_pdl: the partials are complete and visible after this
    allow_dependent_grids();

    const int64_t prow = blockIdx.x;
    const int s = static_cast<int>(prow % p.seqlen_q);
    const int64_t bh = prow / p.seqlen_q;
    const int h = static_cast<int>(bh % p.heads_q), batch = static_cast<int>(bh / p.heads_q);
    const float *lse = partial_lse + prow * splits;
    const int tid = threadIdx.x;

    float mx = -INFINITY;
    for (int i = tid; i < splits; i += kCombineThreads) mx = fmaxf(mx, lse[i]);
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, offset));
    if (tid % 32 == 0) warp_max[tid / 32] = mx;
    __syncthreads();
#pragma unroll
    for (int w = 0; w < kCombineThreads / 32; ++w) mx = fmaxf(mx, warp_max[w]);
    const float base = mx == -INFINITY ? 0.f : mx;

    const int group = tid / kLanes, lane = tid % kLanes;
    const float4 *o_rows = reinterpret_cast<const float4 *>(partial_o + prow * splits * kHeadDim) + lane;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    float total = 0.f;
#pragma unroll 4
    for (int i = group; i < splits; i += kGroups) {
        const float w = exp2f(lse[i] - base);  // splits with no unmasked key have lse -inf: w = 0
        const float4 o = o_rows[i * kLanes];
        total += w;
        acc.x += w * o.x;
        acc.y += w * o.y;
        acc.z += w * o.z;
        acc.w += w * o.w;
    }
    group_acc[group][lane] = acc;
    if (lane == 0) group_total[group] = total;
    __syncthreads();
    if (group != 0) return;
#pragma unroll
    for (int g = 1; g < kGroups; ++g) {
        const float4 other = group_acc[g][lane];
        acc.x += other.x;
        acc.y += other.y;
        acc.z += other.z;
        acc.w += other.w;
        total += group_total[g];
    }
    // One 8-byte store per lane (out is 16-byte aligned and its strides are multiples of 8
    // elements: fc_params_validate).
    Elem *out = static_cast<Elem *>(p.out) + batch * p.o_stride_b + h * p.o_stride_h + s * p.o_stride_s + 4 * lane;
    // A row no split saw a key of (a mask that leaves it none): zeros and LSE -inf, not 0 / 0.
    const float inv = total > 0.f ? 1.f / total : 0.f;
    *reinterpret_cast<uint2 *>(out) =
        make_uint2(pack2<Elem>(acc.x * inv, acc.y * inv), pack2<Elem>(acc.z * inv, acc.w * inv));
    if (lane == 0 && p.lse != nullptr)
        p.lse[batch * p.lse_stride_b + h * p.lse_stride_h + s * p.lse_stride_s] =
            total > 0.f ? (base + __log2f(total)) * 0.6931471805599453f : -INFINITY;
}

}  // namespace flashcore
