// sm90/tensor_map.h - host side of the Hopper kernels' TMA loads: 4-D tensor maps over
// (head_dim, seq, heads, batch) slices (and the backward's bool masks over (keys, queries, heads,
// batch)), built per call with cuTensorMapEncodeTiled fetched through
// the runtime (so the library does not link libcuda and loads where there is no driver).
#pragma once

#include "sm90/ptx.cuh"  // MapOrder

#include <cuda.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace flashcore {
namespace sm90 {

using EncodeTiledFn = CUresult (*)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                                   const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave,
                                   CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// cuTensorMapEncodeTiled through the runtime, so the library loads where there is no driver.
inline EncodeTiledFn encode_tiled() {
    static EncodeTiledFn fn = [] {
        void *ptr = nullptr;
        cudaDriverEntryPointQueryResult found;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000, cudaEnableDefault, &found) !=
                cudaSuccess ||
            found != cudaDriverEntryPointSuccess)
            ptr = nullptr;
        return reinterpret_cast<EncodeTiledFn>(ptr);
    }();
    return fn;
}

// A 4-D tensor map over (inner, seq, heads, batch) elements of elem_bytes, with boxes of
// box_inner x box_rows (x 1 x 1). Dims 1-3 are ordered by stride (HuggingFace's (B, S, H, D) views
// have the head stride below the sequence stride); dims of size 1 get an outermost stride of
// their own (a caller's broadcast dim is one of size 1, read at coordinate 0).
inline cudaError_t make_map(CUtensorMap *map, MapOrder *order, const void *base, CUtensorMapDataType dtype,
                            int64_t elem_bytes, int64_t inner, int64_t seqlen, int64_t heads, int64_t batch,
                            int64_t stride_s, int64_t stride_h, int64_t stride_b, int box_inner, int box_rows,
                            CUtensorMapSwizzle swizzle) {
    const EncodeTiledFn encode = encode_tiled();
    if (encode == nullptr) return cudaErrorNotSupported;
    struct Dim {
        int64_t size, stride_bytes;
        int role;  // 0 row, 1 head, 2 batch
    } dims[3] = {{seqlen, stride_s * elem_bytes, 0}, {heads, stride_h * elem_bytes, 1}, {batch, stride_b * elem_bytes, 2}};
    int64_t outer = inner * elem_bytes;
    for (const Dim &d : dims)
        if (d.size > 1 && d.size * d.stride_bytes > outer) outer = d.size * d.stride_bytes;
    outer = (outer + 15) / 16 * 16;
    for (Dim &d : dims)
        if (d.size == 1) d.stride_bytes = outer;  // never stepped over; keep the order monotone
    // Sort the three dims by stride (insertion sort, stable).
    for (int i = 1; i < 3; ++i)
        for (int j = i; j > 0 && dims[j].stride_bytes < dims[j - 1].stride_bytes; --j) {
            const Dim t = dims[j];
            dims[j] = dims[j - 1];
            dims[j - 1] = t;
        }
    cuuint64_t size[4] = {static_cast<cuuint64_t>(inner), 0, 0, 0};
    cuuint64_t stride[3];
    cuuint32_t box[4] = {static_cast<cuuint32_t>(box_inner), 1, 1, 1};
    const cuuint32_t elem_stride[4] = {1, 1, 1, 1};
    for (int i = 0; i < 3; ++i) {
        size[i + 1] = static_cast<cuuint64_t>(dims[i].size);
        stride[i] = static_cast<cuuint64_t>(dims[i].stride_bytes);
        if (dims[i].role == 0) {
            order->row_dim = static_cast<int8_t>(i + 1);
            box[i + 1] = static_cast<cuuint32_t>(box_rows);
        } else if (dims[i].role == 1) {
            order->head_dim = static_cast<int8_t>(i + 1);
        } else {
            order->batch_dim = static_cast<int8_t>(i + 1);
        }
    }
    const CUresult r = encode(map, dtype, 4, const_cast<void *>(base), size, stride, box, elem_stride,
                              CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    // A distinct runtime error for a rejected map (strides, box or address), so a failure here
    // is not mistaken for a bad launch configuration (cudaErrorInvalidValue).
    return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidPitchValue;
}

// The Q/K/V/O maps: 16-bit (head_dim, seq, heads, batch), boxes of 64 columns x box_rows rows,
// 128-byte swizzled.
inline cudaError_t make_tensor_map(CUtensorMap *map, MapOrder *order, const void *base, CUtensorMapDataType dtype,
                                   int64_t seqlen, int64_t heads, int64_t batch, int64_t head_dim, int64_t stride_s,
                                   int64_t stride_h, int64_t stride_b, int box_rows) {
    return make_map(map, order, base, dtype, 2, head_dim, seqlen, heads, batch, stride_s, stride_h, stride_b, 64,
                    box_rows, CU_TENSOR_MAP_SWIZZLE_128B);
}

}  // namespace sm90
}  // namespace flashcore
