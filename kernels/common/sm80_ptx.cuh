// sm80_ptx.cuh - thin wrappers over the sm_80-class PTX the forward kernels use:
// cp.async (global -> shared without registers), ldmatrix (shared -> mma fragments),
// mma.sync m16n8k16 with fp32 accumulators, and fp32 <-> 16-bit packing.
// Each wrapper is one instruction; the fragment layouts they assume are written out in
// kernels/sm80/fwd_steps.cuh (the forward's) where they are used.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace flashcore {

__device__ __forceinline__ uint32_t smem_addr(const void *ptr) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
}

// Copy 16 bytes global -> shared. When `valid` is false nothing is read and the 16 bytes
// are zero-filled (src-size 0), which is how rows past the end of a sequence become zeros.
__device__ __forceinline__ void cp_async_16(uint32_t dst_smem, const void *src_gmem, bool valid) {
    const int src_bytes = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst_smem),
                 "l"(src_gmem), "r"(src_bytes));
}

// Copy kBytes (4, 8 or 16) global -> shared, reading only the first `src_bytes` of them
// (0 <= src_bytes <= kBytes) and zero-filling the rest. Both addresses must be kBytes-aligned.
// The attention mask goes through this: its rows need not be 16-byte aligned, and a row's last
// chunk may end at the last key. 16-byte copies bypass L1 (.cg); smaller ones may only use .ca.
template <int kBytes>
__device__ __forceinline__ void cp_async_zfill(uint32_t dst_smem, const void *src_gmem, int src_bytes) {
    static_assert(kBytes == 4 || kBytes == 8 || kBytes == 16, "cp.async copies 4, 8 or 16 bytes");
    if constexpr (kBytes == 16) {
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst_smem),
                     "l"(src_gmem), "r"(src_bytes));
    } else {
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst_smem),
                     "l"(src_gmem), "n"(kBytes), "r"(src_bytes));
    }
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

// Wait until at most `kPending` committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// Four 8x8 matrices of 16-bit elements; lane i gives the row address for matrix i/8, row i%8.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// Same, transposed: each lane receives a column pair instead of a row pair.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// D = A(16x16, row) * B(16x8, col) + D, fp32 accumulate. Elem is __half or __nv_bfloat16.
template <typename Elem>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1);

template <>
__device__ __forceinline__ void mma_16816<__half>(float (&d)[4], const uint32_t (&a)[4],
                                                  uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4],
                                                         uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two n8 tiles from one ldmatrix_x4 of B: d0 += A * (b[0], b[1]) and d1 += A * (b[2], b[3]),
// the pair every 16-column step of these kernels issues.
template <typename Elem>
__device__ __forceinline__ void mma_16816_pair(float (&d0)[4], float (&d1)[4], const uint32_t (&a)[4],
                                               const uint32_t (&b)[4]) {
    mma_16816<Elem>(d0, a, b[0], b[1]);
    mma_16816<Elem>(d1, a, b[2], b[3]);
}

// Pack two fp32 values into one 32-bit register of two 16-bit values (lo = first).
template <typename Elem>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);

template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&h);
}

template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&h);
}

// Eight fp32 values (lo, then hi) times `scale`, packed into 16 bytes of 16-bit values: a chunk
// of a dq row from its fp32 accumulator (both backward families' conversions).
template <typename Elem>
__device__ __forceinline__ uint4 pack8_scaled(float4 lo, float4 hi, float scale) {
    return make_uint4(pack2<Elem>(lo.x * scale, lo.y * scale), pack2<Elem>(lo.z * scale, lo.w * scale),
                      pack2<Elem>(hi.x * scale, hi.y * scale), pack2<Elem>(hi.z * scale, hi.w * scale));
}

// Unpack one 32-bit register of two 16-bit values into two fp32 values (x = lo).
template <typename Elem>
__device__ __forceinline__ float2 unpack2(uint32_t v);

template <>
__device__ __forceinline__ float2 unpack2<__half>(uint32_t v) {
    return __half22float2(*reinterpret_cast<const __half2 *>(&v));
}

template <>
__device__ __forceinline__ float2 unpack2<__nv_bfloat16>(uint32_t v) {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&v));
}

// Lazy rescaling of O in the online softmax (both forward families, where their kLazyRescale
// says so): a row keeps its exponent base while its max stays within 2^kLazyGrowthLog2 of it,
// so p <= 256 (exact in fp16/bf16, whose relative precision does not depend on size) and O and
// the row sum need no rescaling. must_rebase: the row's new max `mx` grew by more than that
// over its base `base_max` (score units; `to_log2` converts to exp2 units), or the base is
// still -inf / the growth is NaN (first tiles, fully masked rows).
constexpr float kLazyGrowthLog2 = 8.f;
__device__ __forceinline__ bool must_rebase(float mx, float base_max, float to_log2) {
    return !((mx - base_max) * to_log2 <= kLazyGrowthLog2);
}

// Programmatic dependent launch (host side: fc_use_pdl in c_src/launch_rules.h). A kernel
// launched with it may start while the grid before it in the stream still runs: it must wait for
// that grid (complete, its memory visible) before its first global memory access. allow_
// dependent_grids lets the next such kernel start launching. Both are no-ops for a launch
// without the attribute, and compiled out below sm_90 (no such launches there).
__device__ __forceinline__ void wait_for_prior_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    cudaGridDependencySynchronize();
#endif
}
__device__ __forceinline__ void allow_dependent_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    cudaTriggerProgrammaticLaunchCompletion();
#endif
}
// The launch attribute that asks for it (host side; cudaLaunchKernelEx).
inline cudaLaunchAttribute pdl_launch_attribute() {
    cudaLaunchAttribute serialization = {};
    serialization.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    serialization.val.programmaticStreamSerializationAllowed = 1;
    return serialization;
}

__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// tanh on the special-function unit (one MUFU op; sm_75+), relative error about 2^-11: the
// logit softcap's. Saturates to +-1 for large |x|.
__device__ __forceinline__ float fast_tanh(float x) {
    float y;
    asm("tanh.approx.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

}  // namespace flashcore
