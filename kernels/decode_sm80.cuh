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
//   * K/V chunks of 32 keys stream through a 2-stage cp.async ring into shared memory (rows
//     padded by 16 bytes: conflict-free 16-byte reads across rows). Per chunk: scores on CUDA
//     cores (one key per thread, its K row reused over the thread's query rows), softmax per
//     row (one warp per row), then O += P V with each thread owning one or two head-dim columns.
//   * Q is staged once as fp32 with scale * log2(e) folded in, so scores are base-2 logits and
//     any scale (negative too) works; masking (keys past Sk, causal) is applied after.
//   * kMasked (not with kCausal) adds attn_mask's value per score (fc_params mask_kind: a bool
//     mask's -inf where it is false, an additive mask's value), read from global memory element
//     by element: one query row's mask is Sk values, a small fraction of the K and V it goes with.
//   * kCausal runs any band the library resolved (fc_params band_lo_ / band_hi_: top-left or
//     bottom-right causal, a sliding window; fc_band_bounds in flashcore.h): row r sees keys
//     r + band_lo_ .. r + band_hi_, and only the keys from the first row's first to the last
//     row's last are read (a window over a long cache reads the window).
//   * kPaged (not with kCausal or kMasked: fc_dispatch, family_takes_paged) reads a paged KV
//     cache (fc_params.block_table): K/V rows come from pages through the block table
//     (common/key_rows.cuh, page indices clamped into the pools), and batch item b has
//     min(seqlen_k, seqused_k[b]) keys (keys_of); the split ranges are cut from that count, and
//     an item with no key writes zeros and LSE -inf (as a fully masked row). Pages hold a
//     multiple of 16 keys (validation), so a 16-key step never straddles two pages.
//
// Calls with at most 16 rows per CTA (MHA decoding, GQA up to 16:1, short speculative steps) run
// decode_mma_kernel below instead: tensor cores and four independent warps (see its comment).
//
// Built for sm_89 and sm_90 (it uses nothing newer than cp.async and mma.sync). Instantiated per (head dim,
// dtype) in decode_sm80_hdim*_*.cu, for D = 64 and 128 (D = 256 would need a smaller Q or
// chunk to fit sm_89's 99 KB); run through the C API (fc_sdpa_fwd picks it for small Sq).
#pragma once

#include "common/key_rows.cuh"
#include "common/launch.h"
#include "common/sm80_ptx.cuh"
#include "common/split_combine.cuh"
#include "flashcore.h"
#include "launch_rules.h"
#include "runtime.h"

#include <cuda_runtime.h>
#include <math.h>

namespace flashcore {
namespace decode {

constexpr int kThreads = 128;
constexpr int kChunk = FC_DECODE_CHUNK;  // keys per pipeline stage (fc_decode_splits counts them)
constexpr int kMaxRows = 32;      // (Hq / Hkv) * Sq rows per CTA at most
constexpr int kStages = 2;

// kMaxRows bounds every per-row loop at compile time. This kernel runs only calls of 17-32 rows
// (launch_decode: up to 16 go to the tensor-core kernel below); when it also ran single rows, the
// fixed bound of 32 spent their time on skipped loop iterations (0.2 TFLOP/s at B=8, H=32,
// Sk=8192, 15x slower than the copy bound).
template <int kHeadDim>
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

// kMasked: where CTA row (query head h, query s) of `batch` finds its mask values, as bytes.
template <typename Elem>
__device__ __forceinline__ const unsigned char *row_mask_of(const fc_params &p, int batch, int h, int s) {
    const int64_t elem_bytes = p.mask_kind == FC_MASK_BOOL ? 1 : static_cast<int64_t>(sizeof(Elem));
    return static_cast<const unsigned char *>(p.mask) +
           (batch * p.mask_stride_b + h * p.mask_stride_h + s * p.mask_stride_q) * elem_bytes;
}

// kMasked: what the mask adds to the base-2 logit of `key` in the row whose values start at
// row_mask: -inf where a bool mask is false (else 0), an additive mask's value times log2(e).
template <typename Elem>
__device__ __forceinline__ float mask_logit2(const fc_params &p, const unsigned char *row_mask, int key) {
    if (p.mask_kind == FC_MASK_BOOL) return row_mask[key * p.mask_stride_k] != 0 ? 0.f : -INFINITY;
    return to_float(reinterpret_cast<const Elem *>(row_mask)[key * p.mask_stride_k]) * 1.4426950408889634f;
}

// The keys batch item `batch` has: seqlen_k, or with kPaged min(seqlen_k, seqused_k[batch])
// (a negative entry counts as 0). Read after wait_for_prior_grids (a global load).
template <bool kPaged>
__device__ __forceinline__ int keys_of(const fc_params &p, int batch) {
    const int seqlen_k = static_cast<int>(p.seqlen_k);
    if constexpr (kPaged) {
        if (p.seqused_k != nullptr) return min(seqlen_k, max(0, __ldg(p.seqused_k + batch)));
    }
    return seqlen_k;
}

template <typename Elem, int kHeadDim, bool kCausal, bool kMasked, bool kPaged>
__global__ void __launch_bounds__(kThreads)
decode_kernel(const fc_params p, int splits, float *partial_o, float *partial_lse) {
    static_assert(!(kPaged && (kCausal || kMasked)), "paged calls run without causal or a mask");
    using T = DecodeTraits<kHeadDim>;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    float *q_s = reinterpret_cast<float *>(smem_raw);               // [kMaxRows][D]
    float *p_s = q_s + kMaxRows * kHeadDim;                          // [kMaxRows][kChunk]
    float *alpha_s = p_s + kMaxRows * kChunk;                        // [kMaxRows]
    Elem *k_s = reinterpret_cast<Elem *>(alpha_s + kMaxRows);        // [kStages][kChunk][kRowElems]
    Elem *v_s = k_s + kStages * kChunk * T::kRowElems;
    wait_for_prior_grids();  // fc_use_pdl: no global memory before the previous grid is done
    allow_dependent_grids();

    const int split = blockIdx.x, head_kv = blockIdx.y, batch = blockIdx.z;
    const int seqlen_q = static_cast<int>(p.seqlen_q), seqlen_k = keys_of<kPaged>(p, batch);
    const int group = static_cast<int>(p.heads_q / p.heads_kv);
    const int rows = group * seqlen_q;  // row r = (head_kv * group + r / Sq, query r % Sq)
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;

    // This split's key range, in whole chunks: of all keys, or (kCausal) of the band's, the
    // chunks from the first row's first key to the last row's last key.
    int band_begin = 0, band_end = (seqlen_k + kChunk - 1) / kChunk;
    if (kCausal) {
        band_begin = max(0, p.band_lo_) / kChunk;
        band_end = max(band_begin, min(band_end, (seqlen_q - 1 + p.band_hi_) / kChunk + 1));
    }
    const int per_split = (band_end - band_begin + splits - 1) / splits;
    const int chunk_begin = band_begin + split * per_split;
    const int chunk_end = min(band_end, chunk_begin + per_split);

    // (kPaged: k and v are the pools' head bases; a key's page comes from the block table.)
    const int64_t kv_batch = kPaged ? 0 : batch;
    const Elem *k = static_cast<const Elem *>(p.k) + kv_batch * p.k_stride_b + head_kv * p.k_stride_h;
    const Elem *v = static_cast<const Elem *>(p.v) + kv_batch * p.v_stride_b + head_kv * p.v_stride_h;
    [[maybe_unused]] KeyRows pages;
    if constexpr (kPaged) pages = KeyRows(p.block_table, p.block_table_stride, batch, p.page_size, p.num_pages);
    auto load_chunk = [&](int c, int stage) {
        const int key0 = c * kChunk;
        for (int item = tid; item < kChunk * T::kChunks; item += kThreads) {
            const int row = item / T::kChunks, col = item % T::kChunks;
            const bool valid = key0 + row < seqlen_k;
            if constexpr (kPaged) {
                // (A 32-key chunk may span two pages: each row looks its page up.)
                const KeyRows::Slot at = pages.at(valid ? key0 + row : 0);
                cp_async_16(smem_addr(k_s + (stage * kChunk + row) * T::kRowElems + col * 8),
                            k + at.page * p.k_stride_b + at.row * p.k_stride_s + col * 8, valid);
                cp_async_16(smem_addr(v_s + (stage * kChunk + row) * T::kRowElems + col * 8),
                            v + at.page * p.v_stride_b + at.row * p.v_stride_s + col * 8, valid);
            } else {
                const int64_t key = valid ? key0 + row : 0;
                cp_async_16(smem_addr(k_s + (stage * kChunk + row) * T::kRowElems + col * 8),
                            k + key * p.k_stride_s + col * 8, valid);
                cp_async_16(smem_addr(v_s + (stage * kChunk + row) * T::kRowElems + col * 8),
                            v + key * p.v_stride_s + col * 8, valid);
            }
        }
    };
    if (chunk_begin < chunk_end) load_chunk(chunk_begin, 0);
    cp_async_commit();

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
        const int stage = (c - chunk_begin) & 1;
        if (c + 1 < chunk_end) load_chunk(c + 1, stage ^ 1);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();  // chunk c is in; q_s is written (first iteration)

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
                    const int band_offset = key - r % seqlen_q;  // key - query
                    const bool masked =
                        key >= seqlen_k || (kCausal && (band_offset < p.band_lo_ || band_offset > p.band_hi_));
                    float x = masked ? -INFINITY : acc[i];
                    if constexpr (kMasked) {
                        if (!masked)
                            x += mask_logit2<Elem>(
                                p, row_mask_of<Elem>(p, batch, head_kv * group + r / seqlen_q, r % seqlen_q), key);
                    }
                    p_s[r * kChunk + j] = x;
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

// ---------------------------------------------------------------------------------------------
// Up to 16 rows: tensor cores, and four warps that never wait for each other.
//
// The kernel above spends its time on latency, not bytes: per 32-key chunk its 128 threads cross
// four CTA barriers and walk long dependent FMA chains (only a quarter of them busy with one row),
// ~3-5 us a chunk, so it needs ~6 CTAs per SM to keep DRAM busy and reached 2.54 TB/s (76% of
// peak) at B=8, H=32, Sk=8192, D=128. Here the rows (padded to 16) are one m16n8k16 A operand:
//   * each warp streams its own 16-key steps (warp w takes steps w, w+4, ...) through its own
//     2-stage cp.async ring (copies with a 256-byte L2 prefetch hint), with its own running
//     max/sum and O accumulators; __syncwarp only;
//   * S = Q K^T with Q in registers (loaded once) and K from ldmatrix, P V with P re-packed from
//     the S accumulators and V from ldmatrix.trans (FlashAttention-2's register layout);
//   * the four warps' (max, sum, O) are merged once at the end through shared memory.
// Chosen by measurement (H100, 23 decode shapes, one run, geomean of time vs cuDNN in the same
// pass): 4 warps x 2 stages 0.924, + the L2::256B prefetch hint 0.95 (kept), 2 warps x 4 stages
// 0.900 (0.911 with the hint), 3 warps x 3 stages 0.895 (best only at B=32, H=32: 0.94). More
// stages keep more of the same shared memory in flight but did not raise DRAM throughput
// (ncu: 84% of peak for 4x2, 82% for 2x4 at B=8, H=32, Sk=8192, D=128).
template <int kHeadDim>
struct MmaDecodeTraits {
    static constexpr int kWarps = 4;
    static constexpr int kThreads = kWarps * 32;
    static constexpr int kStepKeys = 16;           // keys per warp step
    static constexpr int kStages = 2;              // per warp
    static constexpr int kRowElems = kHeadDim + 8; // padded smem row: ldmatrix conflict-free
    static constexpr int kStageElems = 2 * kStepKeys * kRowElems;  // K then V
    static constexpr int kRingBytes = kWarps * kStages * kStageElems * 2;
    // End-of-kernel merge: per warp, O [16][D] + max [16] + sum [16], fp32.
    static constexpr int kMergeBytes = kWarps * (16 * kHeadDim + 32) * 4;
    static constexpr int kSmemBytes = kRingBytes > kMergeBytes ? kRingBytes : kMergeBytes;
    static_assert(kHeadDim % 16 == 0, "head dim must be a multiple of 16");
    static_assert(kSmemBytes <= 99 * 1024, "must fit an sm_89 block");
};

// 16-byte global -> shared copy with an L2 prefetch hint of 256 bytes (zero-fill when !valid).
__device__ __forceinline__ void cp_async_16_l2_256(uint32_t dst_smem, const void *src_gmem, bool valid) {
    const int src_bytes = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(dst_smem),
                 "l"(src_gmem), "r"(src_bytes));
}

template <typename Elem, int kHeadDim, bool kCausal, bool kMasked, bool kPaged>
__global__ void __launch_bounds__(MmaDecodeTraits<kHeadDim>::kThreads)
decode_mma_kernel(const fc_params p, int splits, float *partial_o, float *partial_lse) {
    using T = MmaDecodeTraits<kHeadDim>;
    static_assert(!(kPaged && (kCausal || kMasked)), "paged calls run without causal or a mask");
    constexpr int kSteps16 = kHeadDim / 16;  // k-steps of S = Q K^T, and 16-column pairs of O
    extern __shared__ __align__(16) unsigned char smem_raw[];
    wait_for_prior_grids();  // fc_use_pdl: no global memory before the previous grid is done
    allow_dependent_grids();
    const int split = blockIdx.x, head_kv = blockIdx.y, batch = blockIdx.z;
    const int seqlen_q = static_cast<int>(p.seqlen_q), seqlen_k = keys_of<kPaged>(p, batch);
    const int group = static_cast<int>(p.heads_q / p.heads_kv);
    const int rows = group * seqlen_q;  // <= 16; row r = (head_kv * group + r / Sq, query r % Sq)
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int quad_row = lane / 4, quad_col = (lane % 4) * 2;

    // This split's keys, in the same 32-key chunks fc_decode_splits counts: of all keys, or
    // (kCausal) of the band's, from the first row's first key to the last row's last key.
    int band_begin = 0, band_end = seqlen_k;
    if (kCausal) {
        band_begin = max(0, p.band_lo_);
        band_end = max(band_begin, min(seqlen_k, seqlen_q + p.band_hi_));
    }
    const int n_chunks = (band_end - band_begin + kChunk - 1) / kChunk;
    const int per_split = (n_chunks + splits - 1) / splits;
    const int key_begin = band_begin + split * per_split * kChunk;
    const int key_end = min(band_end, key_begin + per_split * kChunk);
    const int n_steps = key_end > key_begin ? (key_end - key_begin + T::kStepKeys - 1) / T::kStepKeys : 0;

    Elem *ring = reinterpret_cast<Elem *>(smem_raw) + warp * T::kStages * T::kStageElems;
    // (kPaged: k and v are the pools' head bases; a step's page comes from the block table.)
    const int64_t kv_batch = kPaged ? 0 : batch;
    const Elem *k = static_cast<const Elem *>(p.k) + kv_batch * p.k_stride_b + head_kv * p.k_stride_h;
    const Elem *v = static_cast<const Elem *>(p.v) + kv_batch * p.v_stride_b + head_kv * p.v_stride_h;
    [[maybe_unused]] KeyRows pages;
    if constexpr (kPaged) pages = KeyRows(p.block_table, p.block_table_stride, batch, p.page_size, p.num_pages);
    // A lane copies the same 16-byte column of every kRowsPerPass-th row: its column and first
    // row are fixed, so each copy only steps two pointers (a per-copy 64-bit address from the
    // item index took ~30 instructions per 16-byte copy).
    constexpr int kPiecesPerRow = kHeadDim / 8;  // 16-byte pieces per K or V row
    static_assert(32 % kPiecesPerRow == 0, "a warp must cover whole rows");
    constexpr int kRowsPerPass = 32 / kPiecesPerRow;
    const int lane_row = lane / kPiecesPerRow, lane_col = (lane % kPiecesPerRow) * 8;
    const int64_t k_pass_stride = kRowsPerPass * p.k_stride_s, v_pass_stride = kRowsPerPass * p.v_stride_s;
    auto load_step = [&](int step, int stage) {  // this warp's step `step` into its `stage`
        const uint32_t k_dst = smem_addr(ring + stage * T::kStageElems + lane_row * T::kRowElems + lane_col);
        const uint32_t v_dst = k_dst + T::kStepKeys * T::kRowElems * 2;
        const int key = key_begin + step * T::kStepKeys + lane_row;
        const Elem *k_src, *v_src;
        if constexpr (kPaged) {
            // The step's 16 keys lie in one page: key_begin is a multiple of kChunk (no band
            // with pages) and pages hold multiples of 16 keys. The step's first key is below
            // key_end, so its table entry is this item's.
            const KeyRows::Slot at = pages.at(key_begin + step * T::kStepKeys);
            k_src = k + at.page * p.k_stride_b + (at.row + lane_row) * p.k_stride_s + lane_col;
            v_src = v + at.page * p.v_stride_b + (at.row + lane_row) * p.v_stride_s + lane_col;
        } else {
            k_src = k + key * p.k_stride_s + lane_col;
            v_src = v + key * p.v_stride_s + lane_col;
        }
#pragma unroll
        for (int pass = 0; pass < T::kStepKeys / kRowsPerPass; ++pass) {
            const bool valid = key + pass * kRowsPerPass < key_end;  // else zero-filled
            const uint32_t offset = pass * kRowsPerPass * T::kRowElems * 2;
            cp_async_16_l2_256(k_dst + offset, valid ? k_src : k, valid);
            cp_async_16_l2_256(v_dst + offset, valid ? v_src : v, valid);
            k_src += k_pass_stride;
            v_src += v_pass_stride;
        }
    };
    // Warp w's i-th step is the split's step w + kWarps i. Prologue: its first kStages - 1 steps
    // (one commit group each, empty past the end).
    const int my_steps = n_steps > warp ? (n_steps - warp + T::kWarps - 1) / T::kWarps : 0;
#pragma unroll
    for (int i = 0; i < T::kStages - 1; ++i) {
        if (i < my_steps) load_step(warp + i * T::kWarps, i);
        cp_async_commit();
    }

    // Q as the A operand (rows past `rows` are zero): a0 (row, cols c..c+1), a1 (row + 8),
    // a2 (row, c+8..c+9), a3 (row + 8, c+8..c+9), for c = 16 kk + quad_col.
    uint32_t q_frag[kSteps16][4];
    {
        const Elem *q_row[2] = {nullptr, nullptr};
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int r = quad_row + 8 * half;
            if (r < rows) {
                const int h = head_kv * group + r / seqlen_q, s = r % seqlen_q;
                q_row[half] = static_cast<const Elem *>(p.q) + batch * p.q_stride_b + h * p.q_stride_h + s * p.q_stride_s;
            }
        }
#pragma unroll
        for (int kk = 0; kk < kSteps16; ++kk) {
            const int c = kk * 16 + quad_col;
            q_frag[kk][0] = q_row[0] ? *reinterpret_cast<const uint32_t *>(q_row[0] + c) : 0u;
            q_frag[kk][1] = q_row[1] ? *reinterpret_cast<const uint32_t *>(q_row[1] + c) : 0u;
            q_frag[kk][2] = q_row[0] ? *reinterpret_cast<const uint32_t *>(q_row[0] + c + 8) : 0u;
            q_frag[kk][3] = q_row[1] ? *reinterpret_cast<const uint32_t *>(q_row[1] + c + 8) : 0u;
        }
    }
    // Causal: the query position of this lane's two rows (a row past `rows` sees every key).
    int row_query[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int r = quad_row + 8 * half;
        row_query[half] = r < rows ? r % seqlen_q : seqlen_k;
    }

    // kMasked: where this lane's two rows find their mask values (none for rows past `rows`).
    [[maybe_unused]] const unsigned char *row_mask[2] = {nullptr, nullptr};
    if constexpr (kMasked) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int r = quad_row + 8 * half;
            if (r < rows) row_mask[half] = row_mask_of<Elem>(p, batch, head_kv * group + r / seqlen_q, r % seqlen_q);
        }
    }

    const float scale_log2 = p.scale * 1.4426950408889634f;
    float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f};  // sum: this lane's part
    float o[kHeadDim / 8][4];
#pragma unroll
    for (int n = 0; n < kHeadDim / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;

    for (int i = 0; i < my_steps; ++i) {
        const int stage = i % T::kStages;
        // Refill the stage step i - 1 used (all lanes left it at the last __syncwarp).
        const int ahead = i + T::kStages - 1;
        if (ahead < my_steps) load_step(warp + ahead * T::kWarps, ahead % T::kStages);
        cp_async_commit();
        cp_async_wait<T::kStages - 1>();
        __syncwarp();  // every lane's pieces of step i are in
        const Elem *k_s = ring + stage * T::kStageElems, *v_s = k_s + T::kStepKeys * T::kRowElems;

        // S (16 rows x 16 keys) = Q K^T: n-tile 0 = keys 0-7, n-tile 1 = keys 8-15.
        float sc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
        {
            const int m = lane / 8;  // ldmatrix: matrix m = (keys (m / 2) * 8.., dims + (m % 2) * 8)
            const uint32_t base = smem_addr(k_s + ((m / 2) * 8 + lane % 8) * T::kRowElems + (m % 2) * 8);
#pragma unroll
            for (int kk = 0; kk < kSteps16; ++kk) {
                uint32_t b[4];
                ldmatrix_x4(b, base + kk * 16 * 2);
                mma_16816_pair<Elem>(sc[0], sc[1], q_frag[kk], b);
            }
        }
        // Mask, scale into base-2 logits, online softmax per row (a row's 16 scores live in the
        // 4 lanes of a quad: shuffles over lane bits 0 and 1).
        const int key0 = key_begin + (warp + i * T::kWarps) * T::kStepKeys;
        float alpha[2];
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            float mx = -INFINITY;
#pragma unroll
            for (int nt = 0; nt < 2; ++nt)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int key = key0 + nt * 8 + quad_col + e;
                    const bool masked = key >= key_end || (kCausal && (key - row_query[half] < p.band_lo_ ||
                                                                       key - row_query[half] > p.band_hi_));
                    float &x = sc[nt][half * 2 + e];
                    x = masked ? -INFINITY : x * scale_log2;
                    if constexpr (kMasked) {
                        if (!masked && row_mask[half] != nullptr) x += mask_logit2<Elem>(p, row_mask[half], key);
                    }
                    mx = fmaxf(mx, x);
                }
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 2));
            const float new_max = fmaxf(row_max[half], mx);
            const float base = new_max == -INFINITY ? 0.f : new_max;
            alpha[half] = exp2f(row_max[half] - base);
            row_max[half] = new_max;
            float sum = 0.f;
#pragma unroll
            for (int nt = 0; nt < 2; ++nt)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    float &x = sc[nt][half * 2 + e];
                    x = exp2f(x - base);
                    sum += x;
                }
            row_sum[half] = row_sum[half] * alpha[half] + sum;
        }
        // O = O * alpha + P V. P as the A operand: a0/a1 = keys 0-7 (rows r, r + 8), a2/a3 = 8-15.
        uint32_t p_frag[4] = {pack2<Elem>(sc[0][0], sc[0][1]), pack2<Elem>(sc[0][2], sc[0][3]),
                              pack2<Elem>(sc[1][0], sc[1][1]), pack2<Elem>(sc[1][2], sc[1][3])};
        {
            const int m = lane / 8;  // ldmatrix.trans: matrix m = (keys (m % 2) * 8.., dims + (m / 2) * 8)
            const uint32_t base = smem_addr(v_s + ((m % 2) * 8 + lane % 8) * T::kRowElems + (m / 2) * 8);
#pragma unroll
            for (int np = 0; np < kHeadDim / 16; ++np) {
                uint32_t b[4];
                ldmatrix_x4_trans(b, base + np * 16 * 2);
#pragma unroll
                for (int t = 0; t < 2; ++t) {
                    float (&acc)[4] = o[np * 2 + t];
                    acc[0] *= alpha[0], acc[1] *= alpha[0], acc[2] *= alpha[1], acc[3] *= alpha[1];
                    mma_16816<Elem>(acc, p_frag, b[2 * t], b[2 * t + 1]);
                }
            }
        }
        __syncwarp();  // all lanes are done with this stage before it is refilled
    }
    cp_async_wait<0>();
    __syncthreads();  // every warp is done with its ring: the merge scratch overlays it

    // ---- merge the four warps: row sums over the quad, then (max, sum, O) per warp to smem ----
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        row_sum[half] += __shfl_xor_sync(0xffffffff, row_sum[half], 1);
        row_sum[half] += __shfl_xor_sync(0xffffffff, row_sum[half], 2);
    }
    float *merge = reinterpret_cast<float *>(smem_raw);
    float *o_w = merge + warp * 16 * kHeadDim;                 // [warp][16][D]
    float *max_w = merge + T::kWarps * 16 * kHeadDim + warp * 32;  // [warp][16] max, [16] sum
#pragma unroll
    for (int n = 0; n < kHeadDim / 8; ++n) {
        const int c = n * 8 + quad_col;
        *reinterpret_cast<float2 *>(o_w + quad_row * kHeadDim + c) = make_float2(o[n][0], o[n][1]);
        *reinterpret_cast<float2 *>(o_w + (quad_row + 8) * kHeadDim + c) = make_float2(o[n][2], o[n][3]);
    }
    if (lane % 4 == 0) {
        max_w[quad_row] = row_max[0], max_w[quad_row + 8] = row_max[1];
        max_w[16 + quad_row] = row_sum[0], max_w[16 + quad_row + 8] = row_sum[1];
    }
    __syncthreads();

    const float *stats = merge + T::kWarps * 16 * kHeadDim;
    for (int idx = tid; idx < rows * kHeadDim; idx += T::kThreads) {
        const int r = idx / kHeadDim, d = idx % kHeadDim;
        float mx = -INFINITY;
#pragma unroll
        for (int w = 0; w < T::kWarps; ++w) mx = fmaxf(mx, stats[w * 32 + r]);
        const float base = mx == -INFINITY ? 0.f : mx;
        float sum = 0.f, acc = 0.f;
#pragma unroll
        for (int w = 0; w < T::kWarps; ++w) {
            const float f = exp2f(stats[w * 32 + r] - base);  // a warp that saw no key: 0
            sum += f * stats[w * 32 + 16 + r];
            acc += f * merge[(w * 16 + r) * kHeadDim + d];
        }
        const float value = sum > 0.f ? acc / sum : 0.f;
        const float lse2 = sum > 0.f ? base + __log2f(sum) : -INFINITY;
        const int h = head_kv * group + r / seqlen_q, s = r % seqlen_q;
        const int64_t prow = (static_cast<int64_t>(batch) * p.heads_q + h) * seqlen_q + s;
        if (splits == 1) {
            Elem *out = static_cast<Elem *>(p.out) + batch * p.o_stride_b + h * p.o_stride_h + s * p.o_stride_s;
            out[d] = from_float<Elem>(value);
            if (d == 0 && p.lse != nullptr)
                p.lse[batch * p.lse_stride_b + h * p.lse_stride_h + s * p.lse_stride_s] = lse2 * 0.6931471805599453f;
        } else {
            partial_o[(prow * splits + split) * kHeadDim + d] = value;
            if (d == 0) partial_lse[prow * splits + split] = lse2;
        }
    }
}

// Launch `kernel` over (splits, Hkv, B), then the combine pass when the keys were split.
template <typename Elem, int kHeadDim, typename Kernel>
cudaError_t launch_split_kv(Kernel kernel, int threads, int smem_bytes, const fc_params &p, const fc_device_facts &dev,
                            cudaStream_t stream) {
    const int splits = p.num_splits_ > 1 ? p.num_splits_ : 1;
    float *partial_o = static_cast<float *>(p.workspace);
    float *partial_lse = partial_o == nullptr ? nullptr : partial_o + partial_rows(p) * splits * kHeadDim;
    // Programmatic dependent launch (fc_use_pdl) only on sm_90 and newer (below, the kernels are
    // compiled without the wait for the previous grid), for grids of at most the split
    // heuristic's one wave; the merge after a split kernel (which fills one wave) gets it too.
    const int64_t grid_ctas = static_cast<int64_t>(splits) * p.heads_kv * p.batch;
    const bool pdl = dev.major >= 9 && fc_use_pdl(grid_ctas, static_cast<int64_t>(FC_DECODE_CTAS_PER_SM(&p)) * dev.sms) != 0;
    cudaLaunchAttribute serialization = pdl_launch_attribute();
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(static_cast<unsigned>(splits), static_cast<unsigned>(p.heads_kv), static_cast<unsigned>(p.batch));
    cfg.blockDim = dim3(static_cast<unsigned>(threads));
    cfg.dynamicSmemBytes = static_cast<size_t>(smem_bytes);
    cfg.stream = stream;
    cfg.attrs = &serialization;
    cfg.numAttrs = pdl ? 1 : 0;
    cudaError_t err = cudaLaunchKernelEx(&cfg, kernel, p, splits, partial_o, partial_lse);
    if (err != cudaSuccess || splits == 1) return err;
    cfg.gridDim = dim3(static_cast<unsigned>(partial_rows(p)));
    cfg.blockDim = dim3(kCombineThreads);
    cfg.dynamicSmemBytes = 0;
    return cudaLaunchKernelEx(&cfg, combine_kernel<Elem, kHeadDim>, p, splits,
                              static_cast<const float *>(partial_o), static_cast<const float *>(partial_lse));
}

template <typename Elem, int kHeadDim, bool kCausal, bool kMasked, bool kPaged>
cudaError_t launch_decode_rows(const fc_params &p, const fc_device_facts &dev, cudaStream_t stream) {
    static unsigned long long configured_devices = 0;  // cudaFuncSetAttribute is per device
    auto kernel = decode_kernel<Elem, kHeadDim, kCausal, kMasked, kPaged>;
    const int smem = DecodeTraits<kHeadDim>::kSmemBytes;
    const cudaError_t err = allow_smem(kernel, smem, &configured_devices, dev.device);
    return err != cudaSuccess ? err : launch_split_kv<Elem, kHeadDim>(kernel, kThreads, smem, p, dev, stream);
}

template <typename Elem, int kHeadDim, bool kCausal, bool kMasked, bool kPaged>
cudaError_t launch_decode_mma(const fc_params &p, const fc_device_facts &dev, cudaStream_t stream) {
    static unsigned long long configured_devices = 0;
    auto kernel = decode_mma_kernel<Elem, kHeadDim, kCausal, kMasked, kPaged>;
    using T = MmaDecodeTraits<kHeadDim>;
    const cudaError_t err = allow_smem(kernel, T::kSmemBytes, &configured_devices, dev.device);
    return err != cudaSuccess ? err
                              : launch_split_kv<Elem, kHeadDim>(kernel, T::kThreads, T::kSmemBytes, p, dev, stream);
}

template <typename Elem, int kHeadDim, bool kCausal, bool kMasked, bool kPaged>
cudaError_t launch_decode(const fc_params &p, const fc_device_facts &dev, cudaStream_t stream) {
    const int64_t rows = p.heads_q / p.heads_kv * p.seqlen_q;  // <= kMaxRows (fc_dispatch)
    if (rows <= FC_DECODE_MMA_ROWS) return launch_decode_mma<Elem, kHeadDim, kCausal, kMasked, kPaged>(p, dev, stream);
    return launch_decode_rows<Elem, kHeadDim, kCausal, kMasked, kPaged>(p, dev, stream);
}

}  // namespace decode
}  // namespace flashcore

#define FLASHCORE_DEFINE_DECODE(HDIM, DTYPE_NAME, ELEM)                                          \
    extern "C" cudaError_t fc_decode_hdim##HDIM##_##DTYPE_NAME(                                \
        const fc_params *p, const fc_device_facts *dev, cudaStream_t stream) {                 \
        /* (pages and a mask run without causal, and not together: fc_dispatch,              \
         * family_takes_paged and family_takes_mask) */                                         \
        if (p->block_table != nullptr)                                                          \
            return flashcore::decode::launch_decode<ELEM, HDIM, false, false, true>(*p, *dev, stream); \
        if (p->mask_kind != FC_MASK_NONE)                                                       \
            return flashcore::decode::launch_decode<ELEM, HDIM, false, true, false>(*p, *dev, stream); \
        return p->causal ? flashcore::decode::launch_decode<ELEM, HDIM, true, false, false>(*p, *dev, stream) \
                         : flashcore::decode::launch_decode<ELEM, HDIM, false, false, false>(*p, *dev, stream); \
    }
