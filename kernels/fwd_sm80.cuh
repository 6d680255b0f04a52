// fwd_sm80.cuh - the sm_80-class fused attention forward (Ampere/Ada instructions; built for
// sm_89 and also for sm_90 so it can be run and timed on Hopper).
//
// What it computes: for one (batch, query head) and a block of kBlockM query rows,
//     O = softmax(scale * Q K^T [+ mask] [causal-masked]) V,   LSE = log(sum(exp(...)))
// in one pass over K and V (FlashAttention-2's online softmax), never writing S or P out.
// Variants: causal or not, and an optional attn_mask (bool: nonzero = attend; additive: same
// dtype as Q), any strides, broadcast dims at stride 0.
//
// How:
//   * One CTA = kWarps warps; warp w owns query rows [16w, 16w+16) of the block, so every
//     softmax reduction stays inside a quad of lanes (no shared memory, no block barrier).
//   * Q is copied to shared memory once (cp.async), then held in registers as mma A fragments.
//   * K and V tiles (kBlockN x D) stream through a 2-stage cp.async ring: tile n+1 loads while
//     tile n is multiplied. Rows past the end of the sequence are zero-filled by cp.async.
//   * S = Q K^T and O += P V with mma.sync m16n8k16 (fp16/bf16 in, fp32 accumulate). P goes
//     from the S accumulators straight into A fragments (the layouts line up), never to smem.
//   * Softmax in base 2 with the scale folded into log2(e); O is rescaled when the row max grows.
//   * Causal (top-left aligned, as PyTorch): tiles entirely above the diagonal are never
//     loaded; only the tiles that cross the diagonal or the end of K are masked.
//   * attn_mask: the (kBlockM x kBlockN) mask tile of each K/V tile rides in the same cp.async
//     group as K and V, into a padded shared tile; each thread then reads the values under its
//     own accumulator elements. See "The attention mask" below for the layout rules.
//   * Shared memory rows are 16-byte chunks XOR-swizzled by (row % 8), so the 8 row addresses
//     of each ldmatrix phase fall in distinct bank groups (no conflicts, no padding).
//   * Epilogue: O is normalised, packed to 16 bits, staged through the (now idle) Q tile in
//     shared memory and written with 16-byte stores; rows past Sq are not written.
//
// Run it through the C API (c_src/flashcore.h, fc_sdpa_fwd); tests/ and bench/ force this
// family on Hopper with FLASHCORE_FAMILY=sm80. Instantiated once per (head dim, dtype) in
// kernels/fwd_sm80_hdim*_*.cu.
#pragma once

#include "common/sm80_ptx.cuh"
#include "flashcore.h"

#include <cuda_runtime.h>
#include <math.h>
#include <type_traits>

namespace flashcore {
namespace sm80 {

// Tile shape per head dim. Registers per thread (D=128): O 64 + S 32 + Q 32 fp32/b32 values.
// Measured and lost (H100, forced sm80, same run as cuDNN; bench/NOTES.md, 2026-11-25):
//   * 8 warps / 128 query rows for D=128 (each K/V tile serves twice the rows, but one CTA of
//     8 warps per SM instead of two of 4): non-causal 4k 222 vs 263 TFLOP/s, causal 196 vs 248.
//   * K and V in separate cp.async groups (FlashAttention-2's order, two waits per tile):
//     D=64 non-causal 4k 236 vs 248, within noise but not a gain; not kept.
template <int kHeadDim>
struct FwdTraits {
    static constexpr int kWarps = 4;
    static constexpr int kBlockM = 16 * kWarps;  // query rows per CTA
    static constexpr int kBlockN = 64;           // key rows per pipeline tile
    static constexpr int kThreads = 32 * kWarps;
    static constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks per row
    static constexpr int kStages = 2;
    static constexpr int kMinBlocksPerSm = 2;
    // Elements: Q tile + kStages x (K tile + V tile).
    static constexpr int kSmemElems = kBlockM * kHeadDim + kStages * 2 * kBlockN * kHeadDim;
    static constexpr int kSmemBytes = kSmemElems * 2;
    static_assert(kHeadDim % 64 == 0, "the swizzle assumes at least 8 chunks per row");
    static_assert(kSmemBytes <= 99 * 1024, "must fit an sm_89 block (99 KB)");
};

// ---- The attention mask ------------------------------------------------------------------
// Kinds as template values (same numbers as fc_mask_kind).
enum MaskKind : int { kNoMask = FC_MASK_NONE, kBoolMask = FC_MASK_BOOL, kAddMask = FC_MASK_ADDITIVE };

// Shared-memory tile of the mask for one K/V tile: kBlockM rows of kBlockN raw values (bool:
// 1 byte, additive: the 16-bit bits of Elem). Rows are padded by 16 bytes: with a 64- or
// 128-byte pitch the 8 rows a warp reads at once (lane / 4) would share banks (4-way and 8-way
// conflicts); with 80 / 144 bytes they start in 8 distinct 4-byte banks groups, and the pitch
// stays a multiple of 16 for 16-byte cp.async. Two stages, like K and V.
template <int kMask, int kBlockM, int kBlockN>
struct MaskTile {
    static constexpr int kElemBytes = kMask == kBoolMask ? 1 : 2;
    static constexpr int kRowBytes = kBlockN * kElemBytes;
    static constexpr int kPitch = kRowBytes + 16;
    static constexpr int kStageBytes = kMask == kNoMask ? 0 : kBlockM * kPitch;
};

// How the CTA copies its mask tiles, decided once per CTA from the mask's address and row
// stride (the kernel must take any mask PyTorch can describe, not only 16-byte aligned ones):
// keys contiguous (stride 1, or one key) and the rows' start addresses all multiples of 16, 8
// or 4 bytes -> cp.async chunks of that size (HuggingFace's (B, 1, Sq, Sk) bool mask with Sk a
// multiple of 16 takes 16; Sk = 1000 gives 8); anything else (transposed, stride-0 keys,
// odd addresses) -> element by element through registers (0), correct but slower.
__device__ __forceinline__ int mask_chunk_bytes(const void *slice, int64_t stride_q,
                                                int64_t stride_k, int seqlen_q, int seqlen_k,
                                                int elem_bytes) {
    if (stride_k != 1 && seqlen_k > 1) return 0;
    const uint64_t bits = reinterpret_cast<uintptr_t>(slice) |
                          static_cast<uint64_t>(seqlen_q > 1 ? stride_q * elem_bytes : 0);
    if ((bits & 15) == 0) return 16;
    if ((bits & 7) == 0) return 8;
    if ((bits & 3) == 0) return 4;
    return 0;
}

// Copy the mask tile of query rows [m_start, m_start + kRows) and keys [n_start, n_start +
// kBlockN) into `smem` (pitch kPitch) in kChunk-byte cp.async copies. Rows past Sq and keys
// past Sk are zero-filled without being read (a chunk that straddles Sk reads only up to it).
// `slice` is this (batch, head)'s mask; offsets inside it fit in int (checked by the C layer).
template <int kChunk, typename Bits, int kRows, int kBlockN, int kPitch, int kThreads>
__device__ __forceinline__ void load_mask_chunks(unsigned char *smem, const Bits *slice,
                                                 int stride_q, int m_start, int n_start,
                                                 int seqlen_q, int seqlen_k) {
    constexpr int kChunkElems = kChunk / static_cast<int>(sizeof(Bits));
    constexpr int kPerRow = kBlockN / kChunkElems;
    constexpr int kItems = kRows * kPerRow;
    static_assert(kItems % kThreads == 0, "mask tile must split evenly over the CTA");
#pragma unroll
    for (int it = 0; it < kItems / kThreads; ++it) {
        const int item = threadIdx.x + it * kThreads;
        const int row = item / kPerRow;
        const int col = n_start + (item % kPerRow) * kChunkElems;
        int bytes = (seqlen_k - col) * static_cast<int>(sizeof(Bits));
        bytes = m_start + row < seqlen_q ? max(0, min(kChunk, bytes)) : 0;
        const Bits *src = bytes > 0 ? slice + (m_start + row) * stride_q + col : slice;
        cp_async_zfill<kChunk>(smem_addr(smem + row * kPitch + (item % kPerRow) * kChunk), src, bytes);
    }
}

// The same tile element by element (any strides, any alignment): plain loads, then shared
// stores; the stores are seen by the other warps after the loop's next __syncthreads.
template <typename Bits, int kRows, int kBlockN, int kPitch, int kThreads>
__device__ __forceinline__ void load_mask_elements(unsigned char *smem, const Bits *slice,
                                                   int stride_q, int stride_k, int m_start,
                                                   int n_start, int seqlen_q, int seqlen_k) {
    static_assert(kRows * kBlockN % kThreads == 0, "mask tile must split evenly over the CTA");
#pragma unroll 8
    for (int it = 0; it < kRows * kBlockN / kThreads; ++it) {
        const int item = threadIdx.x + it * kThreads;  // consecutive threads: consecutive keys
        const int row = item / kBlockN, col = item % kBlockN;
        Bits val = 0;
        if (m_start + row < seqlen_q && n_start + col < seqlen_k)
            val = slice[(m_start + row) * stride_q + (n_start + col) * stride_k];
        reinterpret_cast<Bits *>(smem + row * kPitch)[col] = val;
    }
}

// Element offset of (row, chunk) in a swizzled tile with kChunks 16-byte chunks per row.
template <int kChunks>
__device__ __forceinline__ int swizzled(int row, int chunk) {
    return row * kChunks * 8 + ((chunk ^ (row & 7)) * 8);
}

// Copy `rows` x D elements (rows <= kRows) of a row-strided global tile into a swizzled shared
// tile of kRows rows; rows >= `rows` are zero-filled. All threads of the CTA take part.
template <typename Elem, int kRows, int kChunks, int kThreads>
__device__ __forceinline__ void load_tile(Elem *smem_tile, const Elem *gmem, int row_stride,
                                          int rows) {
    constexpr int kItems = kRows * kChunks;
    static_assert(kItems % kThreads == 0, "tile must split evenly over the CTA");
#pragma unroll
    for (int it = 0; it < kItems / kThreads; ++it) {
        const int item = threadIdx.x + it * kThreads;
        const int row = item / kChunks;
        const int chunk = item % kChunks;
        const bool valid = row < rows;
        const Elem *src = valid ? gmem + row * row_stride + chunk * 8 : gmem;
        cp_async_16(smem_addr(smem_tile + swizzled<kChunks>(row, chunk)), src, valid);
    }
}

// kCausal: the causal variant without a mask. With a mask (kMask != kNoMask) the causal flag is
// read at run time instead (one instantiation per mask kind: PyTorch never sends a mask with
// is_causal, C callers may).
template <typename Elem, int kHeadDim, bool kCausal, int kMask>
__global__ void __launch_bounds__(FwdTraits<kHeadDim>::kThreads, FwdTraits<kHeadDim>::kMinBlocksPerSm)
fwd_kernel(const fc_params p) {
    using T = FwdTraits<kHeadDim>;
    using M = MaskTile<kMask, T::kBlockM, T::kBlockN>;
    using MaskBits = typename std::conditional<kMask == kBoolMask, uint8_t, uint16_t>::type;
    constexpr int kBlockM = T::kBlockM, kBlockN = T::kBlockN, kChunks = T::kChunks;
    // An additive mask can hold huge finite values (HuggingFace fills with finfo(dtype).min,
    // -3.4e38 in bf16); times log2(e) they would overflow to -inf and a row masked only by them
    // would read as fully masked (zeros) where PyTorch averages V. So with an additive mask the
    // scores stay in natural-log units and log2(e) is applied after subtracting the row max.
    constexpr bool kNatural = kMask == kAddMask;
    const bool causal = kCausal || (kMask != kNoMask && p.causal != 0);
    constexpr int kKSteps = kHeadDim / 16;   // k-steps of QK^T
    constexpr int kNTiles = kBlockN / 8;     // n-tiles of S per warp
    constexpr int kDTiles = kHeadDim / 8;    // n-tiles of O per warp

    extern __shared__ __align__(128) unsigned char smem_raw[];
    Elem *smem_q = reinterpret_cast<Elem *>(smem_raw);
    Elem *smem_k = smem_q + kBlockM * kHeadDim;            // [kStages][kBlockN][D]
    Elem *smem_v = smem_k + T::kStages * kBlockN * kHeadDim;  // [kStages][kBlockN][D]
    unsigned char *smem_mask = reinterpret_cast<unsigned char *>(smem_v + T::kStages * kBlockN * kHeadDim);

    const int seqlen_q = static_cast<int>(p.seqlen_q);
    const int seqlen_k = static_cast<int>(p.seqlen_k);
    // blockIdx.x is the query block, so the CTAs in flight at once are mostly the blocks of
    // one (batch, head) and share its K/V in L2; y is the head, z the batch.
    const int head_q = blockIdx.y;
    const int batch = blockIdx.z;
    const int head_kv = head_q / static_cast<int>(p.heads_q / p.heads_kv);
    const int m_block = gridDim.x - 1 - blockIdx.x;  // longest (causal) blocks first
    const int m_start = m_block * kBlockM;

    // 64-bit (batch, head) bases; offsets inside one (batch, head) slice fit in 32 bits
    // (checked by fc_params_validate).
    const Elem *q = static_cast<const Elem *>(p.q) + batch * p.q_stride_b + head_q * p.q_stride_h +
                    static_cast<int64_t>(m_start) * p.q_stride_s;
    const Elem *k = static_cast<const Elem *>(p.k) + batch * p.k_stride_b + head_kv * p.k_stride_h;
    const Elem *v = static_cast<const Elem *>(p.v) + batch * p.v_stride_b + head_kv * p.v_stride_h;
    const int q_stride = static_cast<int>(p.q_stride_s);
    const int k_stride = static_cast<int>(p.k_stride_s);
    const int v_stride = static_cast<int>(p.v_stride_s);

    // This (batch, query head)'s mask slice, and how its tiles are copied.
    const MaskBits *mask = nullptr;
    int mask_stride_q = 0, mask_stride_k = 0, mask_chunk = 0;
    if constexpr (kMask != kNoMask) {
        mask = static_cast<const MaskBits *>(p.mask) + batch * p.mask_stride_b + head_q * p.mask_stride_h;
        mask_stride_q = static_cast<int>(p.mask_stride_q);
        mask_stride_k = static_cast<int>(p.mask_stride_k);
        mask_chunk = mask_chunk_bytes(mask, p.mask_stride_q, p.mask_stride_k, seqlen_q, seqlen_k,
                                      M::kElemBytes);
    }
    // Key tiles this query block needs: with causal masking, none past its last row.
    const int last_row = min(m_start + kBlockM, seqlen_q) - 1;
    int n_blocks = (seqlen_k + kBlockN - 1) / kBlockN;
    if (causal) n_blocks = min(n_blocks, last_row / kBlockN + 1);

    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    // mma fragment coordinates: this lane holds rows (lane/4) and (lane/4 + 8) of its warp's 16,
    // and columns 2*(lane%4), +1 of every 8-wide n-tile.
    const int row_in_warp = lane / 4;
    const int col_in_tile = 2 * (lane % 4);

    auto load_kv = [&](int n_block, int stage) {
        const int n_start = n_block * kBlockN;
        const int rows = min(kBlockN, seqlen_k - n_start);
        load_tile<Elem, kBlockN, kChunks, T::kThreads>(smem_k + stage * kBlockN * kHeadDim,
                                                       k + n_start * k_stride, k_stride, rows);
        load_tile<Elem, kBlockN, kChunks, T::kThreads>(smem_v + stage * kBlockN * kHeadDim,
                                                       v + n_start * v_stride, v_stride, rows);
        if constexpr (kMask != kNoMask) {
            unsigned char *dst = smem_mask + stage * M::kStageBytes;
            constexpr int kP = M::kPitch, kTh = T::kThreads;
            switch (mask_chunk) {  // the same for the whole CTA: no divergence
            case 16:
                load_mask_chunks<16, MaskBits, kBlockM, kBlockN, kP, kTh>(dst, mask, mask_stride_q, m_start, n_start, seqlen_q, seqlen_k);
                break;
            case 8:
                load_mask_chunks<8, MaskBits, kBlockM, kBlockN, kP, kTh>(dst, mask, mask_stride_q, m_start, n_start, seqlen_q, seqlen_k);
                break;
            case 4:
                load_mask_chunks<4, MaskBits, kBlockM, kBlockN, kP, kTh>(dst, mask, mask_stride_q, m_start, n_start, seqlen_q, seqlen_k);
                break;
            default:
                load_mask_elements<MaskBits, kBlockM, kBlockN, kP, kTh>(dst, mask, mask_stride_q, mask_stride_k, m_start, n_start, seqlen_q, seqlen_k);
            }
        }
    };

    load_tile<Elem, kBlockM, kChunks, T::kThreads>(smem_q, q, q_stride, seqlen_q - m_start);
    load_kv(0, 0);
    cp_async_commit();

    uint32_t q_frag[kKSteps][4];
    float o_acc[kDTiles][4];
#pragma unroll
    for (int i = 0; i < kDTiles; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) o_acc[i][j] = 0.f;
    // Running max (base-2, scaled) and partial row sums for rows row_in_warp and row_in_warp+8.
    float row_max[2] = {-INFINITY, -INFINITY};
    float row_sum[2] = {0.f, 0.f};
    constexpr float kLog2e = 1.4426950408889634f;
    // Scores are multiplied by this: into base-2 units, or natural units (kNatural).
    const float score_mul = kNatural ? p.scale : p.scale * kLog2e;

    for (int n_block = 0; n_block < n_blocks; ++n_block) {
        const int stage = n_block & 1;
        if (n_block + 1 < n_blocks) {
            load_kv(n_block + 1, stage ^ 1);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();

        if (n_block == 0) {
            // A fragments of Q: matrices (rows 0-7 | 8-15) x (cols 0-7 | 8-15) of each k-step.
            const int r = warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
            for (int kk = 0; kk < kKSteps; ++kk)
                ldmatrix_x4(q_frag[kk], smem_addr(smem_q + swizzled<kChunks>(r, kk * 2 + (lane >> 4))));
        }

        // ---- S = Q K^T for this warp's 16 rows x kBlockN keys ----
        const Elem *k_tile = smem_k + stage * kBlockN * kHeadDim;
        float s[kNTiles][4];
#pragma unroll
        for (int j = 0; j < kNTiles; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[j][e] = 0.f;
#pragma unroll
        for (int kk = 0; kk < kKSteps; ++kk) {
#pragma unroll
            for (int np = 0; np < kNTiles / 2; ++np) {
                // B fragments of K for n-tiles 2np, 2np+1: (keys 0-7 | 8-15) x (d 0-7 | 8-15).
                uint32_t kf[4];
                const int r = np * 16 + (lane & 7) + (lane >> 4) * 8;
                ldmatrix_x4(kf, smem_addr(k_tile + swizzled<kChunks>(r, kk * 2 + ((lane >> 3) & 1))));
                mma_16816<Elem>(s[2 * np], q_frag[kk], kf[0], kf[1]);
                mma_16816<Elem>(s[2 * np + 1], q_frag[kk], kf[2], kf[3]);
            }
        }

        // ---- scale, then mask (after scaling: a negative scale must not turn -inf into
        //      +inf). The attn_mask comes first, so the causal/ragged -inf has the last word. ----
#pragma unroll
        for (int j = 0; j < kNTiles; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[j][e] *= score_mul;
        if constexpr (kMask != kNoMask) {
            // This thread's values sit at rows (row_in_warp, +8) of its warp and columns
            // (8j + col_in_tile, +1): one 2-value load per (row, n-tile).
            const unsigned char *tile = smem_mask + stage * M::kStageBytes;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const unsigned char *mrow = tile + (warp * 16 + row_in_warp + 8 * h) * M::kPitch;
#pragma unroll
                for (int j = 0; j < kNTiles; ++j) {
                    const int at = (j * 8 + col_in_tile) * M::kElemBytes;
                    if constexpr (kMask == kBoolMask) {
                        const uint32_t two = *reinterpret_cast<const uint16_t *>(mrow + at);
                        if ((two & 0xffu) == 0) s[j][2 * h] = -INFINITY;
                        if ((two >> 8) == 0) s[j][2 * h + 1] = -INFINITY;
                    } else {
                        const float2 add = unpack2<Elem>(*reinterpret_cast<const uint32_t *>(mrow + at));
                        s[j][2 * h] += add.x;
                        s[j][2 * h + 1] += add.y;
                    }
                }
            }
        }
        const int n_start = n_block * kBlockN;
        const int row0 = m_start + warp * 16 + row_in_warp;
        const bool ragged = n_start + kBlockN > seqlen_k;
        const bool crosses_diagonal = causal && n_start + kBlockN - 1 > m_start + warp * 16;
        if (ragged || crosses_diagonal) {
#pragma unroll
            for (int j = 0; j < kNTiles; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int col = n_start + j * 8 + col_in_tile + (e & 1);
                    const int row = row0 + (e >> 1) * 8;
                    if (col >= seqlen_k || (causal && col > row)) s[j][e] = -INFINITY;
                }
        }

        // ---- online softmax: new row max, rescale O and the running sum ----
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float mx = row_max[h];
#pragma unroll
            for (int j = 0; j < kNTiles; ++j) mx = fmaxf(mx, fmaxf(s[j][2 * h], s[j][2 * h + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 2));
            // A row that has seen only masked keys keeps max -inf; exponentiate against 0 then.
            const float base = mx == -INFINITY ? 0.f : mx;
            // Base-2 units: exp2(x). Natural units: exp2(x * log2(e)), x already max-subtracted.
            const float units = kNatural ? kLog2e : 1.f;
            const float rescale = fast_exp2((row_max[h] - base) * units);
            row_max[h] = mx;
            float sum = 0.f;
#pragma unroll
            for (int j = 0; j < kNTiles; ++j) {
                s[j][2 * h] = fast_exp2((s[j][2 * h] - base) * units);
                s[j][2 * h + 1] = fast_exp2((s[j][2 * h + 1] - base) * units);
                sum += s[j][2 * h] + s[j][2 * h + 1];
            }
            row_sum[h] = row_sum[h] * rescale + sum;
#pragma unroll
            for (int d = 0; d < kDTiles; ++d) {
                o_acc[d][2 * h] *= rescale;
                o_acc[d][2 * h + 1] *= rescale;
            }
        }

        // ---- O += P V: P's accumulator layout is the A-fragment layout of a 16x16 k-step ----
        const Elem *v_tile = smem_v + stage * kBlockN * kHeadDim;
#pragma unroll
        for (int kk = 0; kk < kBlockN / 16; ++kk) {
            uint32_t pf[4];
            pf[0] = pack2<Elem>(s[2 * kk][0], s[2 * kk][1]);
            pf[1] = pack2<Elem>(s[2 * kk][2], s[2 * kk][3]);
            pf[2] = pack2<Elem>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
            pf[3] = pack2<Elem>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
            for (int dp = 0; dp < kDTiles / 2; ++dp) {
                // Transposed B fragments of V: (keys 0-7 | 8-15) x (d 0-7 | 8-15).
                uint32_t vf[4];
                const int r = kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
                ldmatrix_x4_trans(vf, smem_addr(v_tile + swizzled<kChunks>(r, dp * 2 + (lane >> 4))));
                mma_16816<Elem>(o_acc[2 * dp], pf, vf[0], vf[1]);
                mma_16816<Elem>(o_acc[2 * dp + 1], pf, vf[2], vf[3]);
            }
        }
        // The next iteration's prefetch overwrites this stage.
        __syncthreads();
    }

    // ---- epilogue: finish the row sums, normalise, write O (and LSE) ----
    float inv_sum[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float sum = row_sum[h];
        sum += __shfl_xor_sync(0xffffffff, sum, 1);
        sum += __shfl_xor_sync(0xffffffff, sum, 2);
        row_sum[h] = sum;
        // A row whose every key is masked has sum 0: PyTorch returns zeros there (its safe
        // softmax), not 0/0. Only masked variants can have such rows by design; the others keep
        // 1/sum, so NaN/Inf inputs propagate exactly as before.
        inv_sum[h] = (kMask != kNoMask && sum == 0.f) ? 0.f : 1.f / sum;
    }
    if (p.lse != nullptr && (lane % 4) == 0) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = m_start + warp * 16 + row_in_warp + 8 * h;
            if (row < seqlen_q) {
                // Natural log: (max in base-2 units + log2(sum)) * ln(2), or max in natural
                // units + log2(sum) * ln(2). Fully masked rows: -inf + -inf = -inf.
                const float lse = kNatural ? row_max[h] + __log2f(row_sum[h]) * 0.6931471805599453f
                                           : (row_max[h] + __log2f(row_sum[h])) * 0.6931471805599453f;
                p.lse[batch * p.lse_stride_b + head_q * p.lse_stride_h + row * p.lse_stride_s] = lse;
            }
        }
    }

    // Stage this warp's 16 rows in its own rows of the Q tile (Q is in registers by now, and no
    // other warp reads these rows), then write 16-byte chunks to global memory.
    Elem *stage_o = smem_q;
#pragma unroll
    for (int d = 0; d < kDTiles; ++d)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = warp * 16 + row_in_warp + 8 * h;
            const uint32_t packed = pack2<Elem>(o_acc[d][2 * h] * inv_sum[h], o_acc[d][2 * h + 1] * inv_sum[h]);
            *reinterpret_cast<uint32_t *>(stage_o + swizzled<kChunks>(r, d) + col_in_tile) = packed;
        }
    __syncwarp();
    Elem *out = static_cast<Elem *>(p.out) + batch * p.o_stride_b + head_q * p.o_stride_h;
    const int o_stride = static_cast<int>(p.o_stride_s);
#pragma unroll
    for (int it = 0; it < 16 * kChunks / 32; ++it) {
        const int item = lane + it * 32;
        const int r = warp * 16 + item / kChunks;
        const int chunk = item % kChunks;
        const int row = m_start + r;
        if (row < seqlen_q) {
            const uint4 val = *reinterpret_cast<const uint4 *>(stage_o + swizzled<kChunks>(r, chunk));
            *reinterpret_cast<uint4 *>(out + static_cast<int64_t>(row) * o_stride + chunk * 8) = val;
        }
    }
}

// Host side: configure shared memory once per (kernel, device), then launch on `stream`.
template <typename Elem, int kHeadDim, bool kCausal, int kMask>
cudaError_t launch_fwd(const fc_params &p, cudaStream_t stream) {
    using T = FwdTraits<kHeadDim>;
    constexpr int kSmemBytes = T::kSmemBytes + T::kStages * MaskTile<kMask, T::kBlockM, T::kBlockN>::kStageBytes;
    static_assert(kSmemBytes <= 99 * 1024, "must fit an sm_89 block (99 KB)");
    auto kernel = fwd_kernel<Elem, kHeadDim, kCausal, kMask>;
    // The attribute is per device; remember which devices are done (bitmask, up to 64).
    static unsigned long long configured_devices = 0;
    int device = 0;
    cudaError_t err = cudaGetDevice(&device);
    if (err != cudaSuccess) return err;
    const unsigned long long bit = 1ull << (device & 63);
    if (kSmemBytes > 48 * 1024 && !(__atomic_load_n(&configured_devices, __ATOMIC_ACQUIRE) & bit)) {
        err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
        if (err != cudaSuccess) return err;
        __atomic_fetch_or(&configured_devices, bit, __ATOMIC_ACQ_REL);
    }
    const int m_blocks = static_cast<int>((p.seqlen_q + T::kBlockM - 1) / T::kBlockM);
    const dim3 grid(static_cast<unsigned>(m_blocks), static_cast<unsigned>(p.heads_q), static_cast<unsigned>(p.batch));
    kernel<<<grid, T::kThreads, kSmemBytes, stream>>>(p);
    return cudaGetLastError();
}

}  // namespace sm80
}  // namespace flashcore

// Defines the C entry point of one (head dim, dtype) instantiation, e.g.
//   cudaError_t fc_sm80_fwd_hdim64_fp16(const fc_params *p, cudaStream_t stream);
#define FLASHCORE_DEFINE_SM80_FWD(HDIM, DTYPE_NAME, ELEM)                                       \
    extern "C" cudaError_t fc_sm80_fwd_hdim##HDIM##_##DTYPE_NAME(const fc_params *p,          \
                                                                 cudaStream_t stream) {       \
        using namespace flashcore::sm80;                                                      \
        switch (p->mask_kind) {                                                               \
        case FC_MASK_BOOL: return launch_fwd<ELEM, HDIM, false, kBoolMask>(*p, stream);       \
        case FC_MASK_ADDITIVE: return launch_fwd<ELEM, HDIM, false, kAddMask>(*p, stream);    \
        default:                                                                              \
            return p->causal ? launch_fwd<ELEM, HDIM, true, kNoMask>(*p, stream)              \
                             : launch_fwd<ELEM, HDIM, false, kNoMask>(*p, stream);            \
        }                                                                                     \
    }
