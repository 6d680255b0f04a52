// decode_sm80.cuh - attention for a few query rows against a long KV cache (decoding,
// speculative decoding, chunked prefill of <= 16 tokens): split-KV with GQA packing.
//
// What it computes: the same as the forward families, for Sq <= 16 and (Hq / Hkv) * Sq <= 32.
// Such a call is pure bandwidth: every byte of K and V is read once and each key meets only a
// few query rows, so tensor cores buy nothing and one CTA per head would leave most SMs idle.
//
// How:
//   * GQA packing: one CTA serves all Hq / Hkv query heads of a KV head (x Sq rows), so K and V
//     are read once per KV head, not once per query head.
//   * Split-KV (flash-decoding): the keys are cut into `splits` ranges, one CTA each
//     (grid = splits x Hkv x B). With one split the CTA writes O and the LSE directly; with
//     more, each writes an fp32 partial O and its LSE to the caller's workspace and
//     combine_kernel merges them: O = sum_i exp(lse_i - lse) O_i with lse = log sum_i exp(lse_i).
//     The split count comes from fc_decode_splits() in c_src/ (SMs x waves).
//   * K/V chunks of 32 keys stream through a 4-stage cp.async ring into shared memory (rows
//     padded by 16 bytes: conflict-free 16-byte reads across rows): three chunks are in flight
//     while one is computed, because a bandwidth-bound kernel is limited by the bytes it keeps
//     in flight (Little's law), not by its arithmetic. Per chunk: scores on CUDA
//     cores (one key per thread, its K row reused over the thread's query rows), softmax per
//     row (one warp per row), then O += P V with each thread owning one or two head-dim columns.
//   * Q is staged once as fp32 with scale * log2(e) folded in, so scores are base-2 logits and
//     any scale (negative too) works; masking (keys past Sk, causal) is applied after.
//
// Built for sm_89 and sm_90 (it uses nothing newer than cp.async). Instantiated per (head dim,
// dtype) in decode_sm80_hdim*_*.cu, for D = 64 and 128 (D = 256 would need a smaller Q or
// chunk to fit sm_89's 99 KB); run through the C API (fc_sdpa_fwd picks it for small Sq).
#pragma once

#include "common/sm80_ptx.cuh"
#include "flashcore.h"

#include <cuda_runtime.h>
#include <math.h>

namespace flashcore {
namespace decode {

constexpr int kThreads = 128;
constexpr int kChunk = 32;        // keys per pipeline stage
constexpr int kRowsLimit = 32;    // (Hq / Hkv) * Sq rows per CTA at most
// 2 stages (one chunk in flight) reached 2.54 TB/s (76% of DRAM peak, ncu) at B=8, Hq=Hkv=32,
// Sk=8192, D=128: 424 us against cuDNN's 362 us, with each CTA spending ~5 us per chunk waiting.
constexpr int kStages = 4;

// kMaxRows (4, 8, 16 or 32: the call's row count rounded up) bounds every per-row loop at
// compile time; with a fixed bound of 32, single-row MHA decoding spent its time on skipped
// loop iterations (0.2 TFLOP/s at B=8, H=32, Sk=8192, 15x slower than the copy bound).
template <int kHeadDim, int kMaxRows>
struct DecodeTraits {
    static constexpr int kRowElems = kHeadDim + 8;  // padded K/V row (16 bytes)
    static constexpr int kChunks = kHeadDim / 8;    // 16-byte chunks per row
    static constexpr int kSmemBytes = kMaxRows * kHeadDim * 4        // Q (fp32)
                                      + kMaxRows * kChunk * 4         // scores / P (fp32)
                                      + kMaxRows * 4                  // per-row rescale factor
                                      + kStages * 2 * kChunk * kRowElems * 2;  // K, V ring
    // PV: a thread owns kDPerThread columns of kRowGroups interleaved row groups.
    static constexpr int kRowGroups = kHeadDim >= kThreads ? 1 : kThreads / kHeadDim;
    static constexpr int kDPerThread = kHeadDim >= kThreads ? kHeadDim / kThreads : 1;
    static_assert(kHeadDim % 8 == 0 && kHeadDim <= 256, "head dim must be a multiple of 8, <= 256");
    static_assert(kSmemBytes <= 99 * 1024, "must fit an sm_89 block");
};

template <typename Elem>
__device__ __forceinline__ float to_float(Elem x);
template <>
__device__ __forceinline__ float to_float<__half>(__half x) { return __half2float(x); }
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename Elem>
__device__ __forceinline__ Elem from_float(float x);
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// Workspace layout for `splits` > 1: partial O [B][Hq][Sq][splits][D] fp32, then partial LSE
// [B][Hq][Sq][splits] fp32. Row index of (b, h, s) = (b * Hq + h) * Sq + s.
__host__ __device__ inline int64_t partial_rows(const fc_params &p) { return p.batch * p.heads_q * p.seqlen_q; }

template <typename Elem, int kHeadDim, int kMaxRows, bool kCausal>
__global__ void __launch_bounds__(kThreads)
decode_kernel(const fc_params p, int splits, float *partial_o, float *partial_lse) {
    using T = DecodeTraits<kHeadDim, kMaxRows>;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    float *q_s = reinterpret_cast<float *>(smem_raw);               // [kMaxRows][D]
    float *p_s = q_s + kMaxRows * kHeadDim;                          // [kMaxRows][kChunk]
    float *alpha_s = p_s + kMaxRows * kChunk;                        // [kMaxRows]
    Elem *k_s = reinterpret_cast<Elem *>(alpha_s + kMaxRows);        // [kStages][kChunk][kRowElems]
    Elem *v_s = k_s + kStages * kChunk * T::kRowElems;

    const int split = blockIdx.x, head_kv = blockIdx.y, batch = blockIdx.z;
    const int seqlen_q = static_cast<int>(p.seqlen_q), seqlen_k = static_cast<int>(p.seqlen_k);
    const int group = static_cast<int>(p.heads_q / p.heads_kv);
    const int rows = group * seqlen_q;  // row r = (head_kv * group + r / Sq, query r % Sq)
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;

    // This split's key range, in whole chunks.
    const int n_chunks = (seqlen_k + kChunk - 1) / kChunk;
    const int per_split = (n_chunks + splits - 1) / splits;
    const int chunk_begin = split * per_split;
    int chunk_end = min(n_chunks, chunk_begin + per_split);
    // Causal (top-left): query s sees keys 0..s, so no row needs keys past Sq - 1.
    if (kCausal) chunk_end = min(chunk_end, (seqlen_q - 1) / kChunk + 1);

    const Elem *k = static_cast<const Elem *>(p.k) + batch * p.k_stride_b + head_kv * p.k_stride_h;
    const Elem *v = static_cast<const Elem *>(p.v) + batch * p.v_stride_b + head_kv * p.v_stride_h;
    auto load_chunk = [&](int c, int stage) {
        const int key0 = c * kChunk;
        for (int item = tid; item < kChunk * T::kChunks; item += kThreads) {
            const int row = item / T::kChunks, col = item % T::kChunks;
            const bool valid = key0 + row < seqlen_k;
            const int64_t key = valid ? key0 + row : 0;
            cp_async_16(smem_addr(k_s + (stage * kChunk + row) * T::kRowElems + col * 8),
                        k + key * p.k_stride_s + col * 8, valid);
            cp_async_16(smem_addr(v_s + (stage * kChunk + row) * T::kRowElems + col * 8),
                        v + key * p.v_stride_s + col * 8, valid);
        }
    };
    // Prologue: the first kStages - 1 chunks (one commit group each, empty past the end).
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
        if (chunk_begin + s < chunk_end) load_chunk(chunk_begin + s, s);
        cp_async_commit();
    }

    // Q rows as fp32, pre-scaled into base-2 logits.
    const float scale_log2 = p.scale * 1.4426950408889634f;
    for (int i = tid; i < rows * kHeadDim; i += kThreads) {
        const int r = i / kHeadDim, d = i % kHeadDim;
        const int h = head_kv * group + r / seqlen_q, s = r % seqlen_q;
        const Elem *q = static_cast<const Elem *>(p.q) + batch * p.q_stride_b + h * p.q_stride_h +
                        s * p.q_stride_s;
        q_s[r * kHeadDim + d] = to_float(q[d]) * scale_log2;
    }

    // Per-row softmax state, held by the warp that owns the row (rows warp, warp + 4, ...).
    constexpr int kRowsPerWarp = (kMaxRows + 3) / 4;
    float row_max[kRowsPerWarp], row_sum[kRowsPerWarp];
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) row_max[i] = -INFINITY, row_sum[i] = 0.f;
    // O accumulators: column(s) d_own(j) of rows r = row_group + i * kRowGroups.
    constexpr int kRowsPerThread = kMaxRows / T::kRowGroups;
    const int row_group = tid / (kThreads / T::kRowGroups);
    const int d_base = tid % (kThreads / T::kRowGroups);
    float o[kRowsPerThread][T::kDPerThread];
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i)
#pragma unroll
        for (int j = 0; j < T::kDPerThread; ++j) o[i][j] = 0.f;

    for (int c = chunk_begin; c < chunk_end; ++c) {
        const int stage = (c - chunk_begin) % kStages;
        // Refill the stage chunk c - 1 used (every thread left it at the loop's last barrier).
        const int next = c + kStages - 1;
        if (next < chunk_end) load_chunk(next, (next - chunk_begin) % kStages);
        cp_async_commit();
        cp_async_wait<kStages - 1>();  // groups up to chunk c are complete
        __syncthreads();               // chunk c is in; q_s is written (first iteration)

        // ---- scores: thread = one key, rows of its quarter (r = quarter, quarter + 4, ...) ----
        {
            const int j = tid % kChunk, quarter = tid / kChunk;
            const Elem *krow = k_s + (stage * kChunk + j) * T::kRowElems;
            float acc[kMaxRows / 4];
#pragma unroll
            for (int i = 0; i < kMaxRows / 4; ++i) acc[i] = 0.f;
#pragma unroll 4
            for (int col = 0; col < T::kChunks; ++col) {
                const uint4 raw = *reinterpret_cast<const uint4 *>(krow + col * 8);
                const Elem *e = reinterpret_cast<const Elem *>(&raw);
                float kf[8];
#pragma unroll
                for (int t = 0; t < 8; ++t) kf[t] = to_float(e[t]);
#pragma unroll
                for (int i = 0; i < kMaxRows / 4; ++i) {
                    const int r = quarter + 4 * i;
                    if (r < rows) {
                        const float4 qa = *reinterpret_cast<const float4 *>(q_s + r * kHeadDim + col * 8);
                        const float4 qb = *reinterpret_cast<const float4 *>(q_s + r * kHeadDim + col * 8 + 4);
                        acc[i] += qa.x * kf[0] + qa.y * kf[1] + qa.z * kf[2] + qa.w * kf[3] +
                                  qb.x * kf[4] + qb.y * kf[5] + qb.z * kf[6] + qb.w * kf[7];
                    }
                }
            }
            const int key = c * kChunk + j;
#pragma unroll
            for (int i = 0; i < kMaxRows / 4; ++i) {
                const int r = quarter + 4 * i;
                if (r < rows) {
                    const bool masked = key >= seqlen_k || (kCausal && key > r % seqlen_q);
                    p_s[r * kChunk + j] = masked ? -INFINITY : acc[i];
                }
            }
        }
        __syncthreads();

        // ---- online softmax: warp w owns rows w, w + 4, ...; lane = key ----
#pragma unroll
        for (int i = 0; i < kRowsPerWarp; ++i) {
            const int r = warp + 4 * i;
            if (r < rows) {
                const float sc = p_s[r * kChunk + lane];
                float mx = sc;
#pragma unroll
                for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, off));
                mx = fmaxf(mx, row_max[i]);
                const float base = mx == -INFINITY ? 0.f : mx;
                const float pj = exp2f(sc - base);
                float sum = pj;
#pragma unroll
                for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffff, sum, off);
                const float alpha = exp2f(row_max[i] - base);
                row_sum[i] = row_sum[i] * alpha + sum;
                row_max[i] = mx;
                p_s[r * kChunk + lane] = pj;
                if (lane == 0) alpha_s[r] = alpha;
            }
        }
        __syncthreads();

        // ---- O = O * alpha + P V ----
        const Elem *vtile = v_s + stage * kChunk * T::kRowElems;
#pragma unroll
        for (int i = 0; i < kRowsPerThread; ++i) {
            const int r = row_group + i * T::kRowGroups;
            if (r < rows) {
                const float alpha = alpha_s[r];
#pragma unroll
                for (int jd = 0; jd < T::kDPerThread; ++jd) o[i][jd] *= alpha;
            }
        }
#pragma unroll 4
        for (int j = 0; j < kChunk; ++j) {
            float vf[T::kDPerThread];
#pragma unroll
            for (int jd = 0; jd < T::kDPerThread; ++jd)
                vf[jd] = to_float(vtile[j * T::kRowElems + d_base + jd * (kThreads / T::kRowGroups)]);
#pragma unroll
            for (int i = 0; i < kRowsPerThread; ++i) {
                const int r = row_group + i * T::kRowGroups;
                if (r < rows) {
                    const float pj = p_s[r * kChunk + j];
#pragma unroll
                    for (int jd = 0; jd < T::kDPerThread; ++jd) o[i][jd] += pj * vf[jd];
                }
            }
        }
        __syncthreads();  // the next prefetch overwrites this stage; p_s is rewritten
    }
    cp_async_wait<0>();

    // ---- write: final (one split) or partial (workspace) ----
    // Row sums live with the softmax warps; share them through smem (alpha_s is free now).
    float *lse_s = alpha_s;  // [kMaxRows]: log2-domain LSE per row
    float *sum_s = p_s;      // [kMaxRows]
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
        const int r = warp + 4 * i;
        if (r < rows && lane == 0) {
            sum_s[r] = row_sum[i];
            lse_s[r] = row_max[i] == -INFINITY ? -INFINITY : row_max[i] + __log2f(row_sum[i]);
        }
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
        const int r = row_group + i * T::kRowGroups;
        if (r >= rows) continue;
        const int h = head_kv * group + r / seqlen_q, s = r % seqlen_q;
        const float sum = sum_s[r];
        const float inv = sum > 0.f ? 1.f / sum : 0.f;
        const int64_t prow = (static_cast<int64_t>(batch) * p.heads_q + h) * seqlen_q + s;
        if (splits == 1) {
            Elem *out = static_cast<Elem *>(p.out) + batch * p.o_stride_b + h * p.o_stride_h + s * p.o_stride_s;
#pragma unroll
            for (int jd = 0; jd < T::kDPerThread; ++jd)
                out[d_base + jd * (kThreads / T::kRowGroups)] = from_float<Elem>(o[i][jd] * inv);
        } else {
            float *po = partial_o + (prow * splits + split) * kHeadDim;
#pragma unroll
            for (int jd = 0; jd < T::kDPerThread; ++jd) po[d_base + jd * (kThreads / T::kRowGroups)] = o[i][jd] * inv;
        }
        if (d_base == 0) {
            const float lse2 = lse_s[r];
            if (splits == 1) {
                if (p.lse != nullptr)
                    p.lse[batch * p.lse_stride_b + h * p.lse_stride_h + s * p.lse_stride_s] = lse2 * 0.6931471805599453f;
            } else {
                partial_lse[prow * splits + split] = lse2;
            }
        }
    }
}

// One CTA per (b, h, s) row, one thread per head-dim column: merge the splits' partials.
template <typename Elem, int kHeadDim>
__global__ void __launch_bounds__(kHeadDim)
combine_kernel(const fc_params p, int splits, const float *partial_o, const float *partial_lse) {
    const int64_t prow = blockIdx.x;
    const int s = static_cast<int>(prow % p.seqlen_q);
    const int64_t bh = prow / p.seqlen_q;
    const int h = static_cast<int>(bh % p.heads_q), batch = static_cast<int>(bh / p.heads_q);
    const float *lse = partial_lse + prow * splits;
    float mx = -INFINITY;
    for (int i = 0; i < splits; ++i) mx = fmaxf(mx, lse[i]);
    const float base = mx == -INFINITY ? 0.f : mx;
    float total = 0.f, acc = 0.f;
    const int d = threadIdx.x;
    for (int i = 0; i < splits; ++i) {
        const float w = exp2f(lse[i] - base);  // splits with no unmasked key have lse -inf: w = 0
        total += w;
        acc += w * partial_o[(prow * splits + i) * kHeadDim + d];
    }
    Elem *out = static_cast<Elem *>(p.out) + batch * p.o_stride_b + h * p.o_stride_h + s * p.o_stride_s;
    out[d] = from_float<Elem>(acc / total);
    if (d == 0 && p.lse != nullptr)
        p.lse[batch * p.lse_stride_b + h * p.lse_stride_h + s * p.lse_stride_s] =
            (base + __log2f(total)) * 0.6931471805599453f;
}

template <typename Elem, int kHeadDim, int kMaxRows, bool kCausal>
cudaError_t launch_decode_rows(const fc_params &p, cudaStream_t stream) {
    using T = DecodeTraits<kHeadDim, kMaxRows>;
    auto kernel = decode_kernel<Elem, kHeadDim, kMaxRows, kCausal>;
    static unsigned long long configured_devices = 0;  // cudaFuncSetAttribute is per device
    int device = 0;
    cudaError_t err = cudaGetDevice(&device);
    if (err != cudaSuccess) return err;
    const unsigned long long bit = 1ull << (device & 63);
    if (T::kSmemBytes > 48 * 1024 && !(__atomic_load_n(&configured_devices, __ATOMIC_ACQUIRE) & bit)) {
        err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSmemBytes);
        if (err != cudaSuccess) return err;
        __atomic_fetch_or(&configured_devices, bit, __ATOMIC_ACQ_REL);
    }
    const int splits = p.num_splits_ > 1 ? p.num_splits_ : 1;
    float *partial_o = static_cast<float *>(p.workspace);
    float *partial_lse = partial_o == nullptr ? nullptr : partial_o + partial_rows(p) * splits * kHeadDim;
    const dim3 grid(static_cast<unsigned>(splits), static_cast<unsigned>(p.heads_kv), static_cast<unsigned>(p.batch));
    kernel<<<grid, kThreads, T::kSmemBytes, stream>>>(p, splits, partial_o, partial_lse);
    err = cudaGetLastError();
    if (err != cudaSuccess || splits == 1) return err;
    combine_kernel<Elem, kHeadDim><<<static_cast<unsigned>(partial_rows(p)), kHeadDim, 0, stream>>>(
        p, splits, partial_o, partial_lse);
    return cudaGetLastError();
}

template <typename Elem, int kHeadDim, bool kCausal>
cudaError_t launch_decode(const fc_params &p, cudaStream_t stream) {
    const int64_t rows = p.heads_q / p.heads_kv * p.seqlen_q;  // <= kRowsLimit (fc_dispatch)
    if (rows <= 4) return launch_decode_rows<Elem, kHeadDim, 4, kCausal>(p, stream);
    if (rows <= 8) return launch_decode_rows<Elem, kHeadDim, 8, kCausal>(p, stream);
    if (rows <= 16) return launch_decode_rows<Elem, kHeadDim, 16, kCausal>(p, stream);
    return launch_decode_rows<Elem, kHeadDim, kRowsLimit, kCausal>(p, stream);
}

}  // namespace decode
}  // namespace flashcore

#define FLASHCORE_DEFINE_DECODE(HDIM, DTYPE_NAME, ELEM)                                          \
    extern "C" cudaError_t fc_decode_hdim##HDIM##_##DTYPE_NAME(const fc_params *p,             \
                                                               cudaStream_t stream) {          \
        return p->causal ? flashcore::decode::launch_decode<ELEM, HDIM, true>(*p, stream)       \
                         : flashcore::decode::launch_decode<ELEM, HDIM, false>(*p, stream);     \
    }
