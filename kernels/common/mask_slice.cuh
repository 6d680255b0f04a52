// common/mask_slice.cuh - an attention mask as the backward kernels of both families read it:
// fc_params.mask (FC_MASK_BOOL: one byte per (query, key), nonzero = attend; FC_MASK_ADDITIVE:
// the inputs' dtype, added to the scaled score) for one (batch, query head), any strides (a
// broadcast dimension has stride 0), read element by element from global memory and applied to
// base-2 scores. Callers read only (query, key) pairs inside Sq x Sk.
#pragma once

#include "flashcore.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include <type_traits>

namespace flashcore {

template <typename Elem, int kMaskKind>
struct MaskSlice {
    static_assert(kMaskKind == FC_MASK_BOOL || kMaskKind == FC_MASK_ADDITIVE, "a mask that is read");
    using Value = typename std::conditional<kMaskKind == FC_MASK_ADDITIVE, Elem, uint8_t>::type;
    static constexpr float kLog2e = 1.4426950408889634f;
    const Value *base;  // the (batch, query head) slice
    int64_t stride_q, stride_k;
    __device__ MaskSlice(const fc_params &f, int batch, int head_q)
        : base(static_cast<const Value *>(f.mask) + batch * f.mask_stride_b + head_q * f.mask_stride_h),
          stride_q(f.mask_stride_q), stride_k(f.mask_stride_k) {}
    __device__ void prefetch(int query, int key) const {
        asm volatile("prefetch.global.L1 [%0];\n" ::"l"(base + query * stride_q + key * stride_k));
    }
    // x (a base-2 score) with the mask of (query, key) applied.
    __device__ float apply(float x, int query, int key) const { return apply_in_row(x, row(query), key); }
    // The same for a query row fixed beforehand (a kernel whose rows stay put keeps their pointers).
    __device__ const Value *row(int query) const { return base + query * stride_q; }
    __device__ float apply_in_row(float x, const Value *row, int key) const {
        const Value v = row[key * stride_k];
        if constexpr (kMaskKind == FC_MASK_BOOL) return v != 0 ? x : -INFINITY;
        else return fmaf(to_float(v), kLog2e, x);
    }
    static __device__ float to_float(__half v) { return __half2float(v); }
    static __device__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
};

// The slice a kernel variant of mask kind kKind constructs: additive masks read in the inputs'
// dtype, every other kind (bool, and the kernels' own kinds that are bool masks read another
// way, or none) as bool; unmasked variants construct one and never read it.
template <typename Elem, int kKind>
using MaskSliceOf = MaskSlice<Elem, kKind == FC_MASK_ADDITIVE ? FC_MASK_ADDITIVE : FC_MASK_BOOL>;

}  // namespace flashcore
