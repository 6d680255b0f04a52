// bwd_sm80.cuh - the sm_80-class fused attention backward (mma.sync + ldmatrix + cp.async;
// built for sm_89 and sm_90a, so it runs on Ada and on Hopper).
//
// What it computes, for every batch b, query head h (KV head h / G, G = Hq / Hkv):
//     P  = exp(scale * Q K^T - LSE)            (recomputed from the forward's saved LSE)
//     dV = sum over the G query heads of P^T dO
//     dP = dO V^T,   dS = P * (dP - delta),   delta = rowsum(dO * O) - dLSE
//     dK = scale * sum over the group of dS^T Q,   dQ = scale * dS K
// with causal masking top-left aligned as PyTorch (query i sees keys 0..i, also for Sq != Sk),
// any lengths, GQA, real strides. Nothing of size Sq x Sk is written to device memory.
//
// Two ways (launch_bwd at the bottom; fc_sm80_bwd_one_pass in c_src/launch_rules.h picks: one pass
// at D=64 and 128 unless fc_bwd_params.deterministic; D=32, 80 and 96 always the other).
// Deterministic: three kernels, launched in this order on one stream:
//   1. delta_kernel: delta = rowsum(dO * O) - dLSE and LSE in base-2 units, fp32, into the
//      caller's workspace ([B][Hq][Sq] each). A row whose LSE is -inf (nothing attended) gets
//      +inf, so its P is 0 everywhere, as in PyTorch's safe softmax.
//   2. dq_kernel: one CTA per (64-query block, query head, batch); warps own 16 query rows each
//      (the forward's layout) and stream K/V tiles: S = Q K^T, P, dP = dO V^T, dS, dQ += dS K.
//      dS stays in registers (its accumulator layout is the A-fragment layout of dS K).
//   3. dkdv_kernel: one CTA per (64-key block, KV head, batch); warps own 16 key rows each and
//      stream (query head of the group, query block) tiles of Q, dO, LSE, delta:
//      S^T = K Q^T, P^T, dV += P^T dO, dP^T = V dO^T, dS^T, dK += dS^T Q. The G query heads of a
//      group are summed inside the CTA, in a fixed order.
//
// No atomics anywhere and every sum runs in a fixed order, so the gradients are bitwise identical
// from run to run (and independent of the number of SMs); the price is the dQ pass's recomputation
// of Q K^T and dO V^T (7 matmuls per tile pair instead of 5).
// One pass, as FlashAttention-2's: delta_kernel also zeroes an
// fp32 dq accumulator in the workspace; dkdv_kernel<kDqAtomic> writes each step's dS^T to shared
// memory and adds dQ = dS K of its keys (128-key blocks of 8 warps) to the accumulator with fp32
// atomics (in whatever order the key blocks come); dq_convert_kernel writes dQ = scale x
// accumulator in the input's dtype.
// Measured against each other and FlashAttention-2: docs/experiments/backward.md.
//
// Fragment layouts are those of kernels/fwd_sm80.cuh (ldmatrix patterns, P packing; the swizzle
// is sm80/tile.cuh's); the comments below say which operand plays which role.
//
// Run it through the C API (c_src/flashcore.h, fc_sdpa_bwd); tests/test_gpu_autograd.py and
// tests/c/test_c_api_gpu.c check it, bench/bench.py --bwd times it. Instantiated once per
// (head dim, dtype) in kernels/bwd_sm80_hdim*_*.cu.
#pragma once

#include "common/bwd_delta.cuh"
#include "common/launch.h"
#include "common/mask_slice.cuh"
#include "common/sm80_ptx.cuh"
#include "flashcore.h"
#include "launch_rules.h"  // fc_sm80_bwd_dq_accum_offset
#include "runtime.h"  // fc_device_facts
#include "sm80/row_copy.cuh"  // chunk_pair_addr()
#include "sm80/tile.cuh"  // swizzled(), load_tile()

#include <cuda_runtime.h>
#include <type_traits>
#include <math.h>

namespace flashcore {
namespace sm80_bwd {

using sm80::load_tile;
using sm80::swizzled;
using sm80::chunk_pair_addr;

constexpr float kLog2e = 1.4426950408889634f;

// Tile shapes. Both main kernels use 4 warps of 16 rows (the rows each warp owns) and stream
// the other operand in tiles of kStream rows through a 2-stage cp.async ring. The stream tile
// is smaller for D=96 and 128 to keep the fp32 accumulators (D=128: dK+dV 128 registers; dQ 64
// plus Q and dO fragments 64) and the two score tiles (S, dP) within 255 registers without spills
// (D=96 with 64-row tiles spilled 4 bytes on sm_89); D=80 fits 64-row tiles (up to 254 registers),
// which ran its backward 2-8% faster than 32-row ones (docs/experiments/backward.md).
// kWarps_: 4 (the deterministic kernels); 8 for the one-pass dK/dV kernel, whose 128-key
// blocks halve the atomics per query row (and the Q/dO reloads per key).
// Shared rows are kPitchChunks 16-byte chunks, D / 8 rounded up to a multiple of 8 (128 bytes),
// as the forward's (sm80/fwd_traits.cuh): D=32 / 80 / 96 leave the chunks past D / 8 of each row
// unused (never loaded, never read), so the (row % 8) swizzle and chunk_pair_addr's 128-byte
// steps hold for every head dim; D=64 and 128 rows are unpadded.
template <int kHeadDim_, int kWarps_ = 4, bool kSoftcap_ = false>
struct BwdTraits {
    static constexpr int kHeadDim = kHeadDim_;
    static constexpr int kWarps = kWarps_;
    static constexpr int kThreads = 32 * kWarps;
    static constexpr int kBlock = 16 * kWarps;                  // rows a CTA owns (queries or keys)
    // (D=80 with a softcap: 32-row tiles; with 64 its additive-mask dq_kernel spilled 24 bytes on sm_89.)
    static constexpr int kStream = kHeadDim <= 64 || (kHeadDim == 80 && !kSoftcap_) ? 64 : 32;  // rows per streamed tile
    static constexpr int kChunks = kHeadDim / 8;
    static constexpr int kPitchChunks = (kChunks + 7) / 8 * 8;
    static constexpr int kPitch = kPitchChunks * 8;            // elements per shared row
    static constexpr int kStages = 2;
    // dq_kernel: Q + dO (owned), kStages x (K + V) (streamed).
    static constexpr int kDqSmemBytes = (2 * kBlock + kStages * 2 * kStream) * kPitch * 2;
    // dkdv_kernel: K + V (owned), kStages x (Q + dO) (streamed) + kStages x (LSE + delta) fp32,
    // and (kDqAtomic) the step's dS^T, kBlock key rows of kStream queries: in a tile of its own,
    // rows kDsPitch apart (8 elements of padding: the rows of an 8x8 matrix fall in distinct
    // banks, and so do a warp's stores of its fragments); or, kDsInDoStage (D=128, where a tile
    // of its own would pass sm_89's 99 KB), in the step's dO tile once every warp is done with
    // it (the same bytes: 128 keys x 32 queries), rows unpadded and chunks swizzled (ds_offset).
    static constexpr int kDsPitch = kStream + 8;
    static constexpr bool kDsInDoStage = kHeadDim > 64;
    static constexpr int kKvSmemBytes =
        (2 * kBlock + kStages * 2 * kStream) * kPitch * 2 + kStages * 2 * kStream * 4;
    static constexpr int kKvAtomicSmemBytes = kKvSmemBytes + (kDsInDoStage ? 0 : kBlock * kDsPitch * 2);
    static_assert(!kDsInDoStage || kBlock * kStream <= kStream * kPitch, "dS^T fits in a dO tile");
    static_assert(kHeadDim % 16 == 0, "k-steps of 16 and B fragments in pairs of 8 columns");
    static_assert(kDqSmemBytes <= 99 * 1024 && kKvAtomicSmemBytes <= 99 * 1024, "sm_89: 99 KB per block");
    // kDqAtomic's dQ GEMM: the step's kStream x kHeadDim tile split among the warps, 16 rows x
    // kDqCols columns each (add_dq_of_step checks that it splits evenly).
    static constexpr int kDqCols = kHeadDim * (kStream / 16) / kWarps;
};

// kMaskKind (the kernels' template argument): FC_MASK_NONE, FC_MASK_BOOL or FC_MASK_ADDITIVE
// (non-causal calls only: c_src/bwd.c), the mask read element by element from global memory
// through common/mask_slice.cuh's MaskSliceOf.

// Workspace layout (fc_sm80_bwd_workspace_bytes, launch_rules.h): delta [B][Hq][Sq] fp32, then
// LSE * log2(e) [B][Hq][Sq] fp32, then (not deterministic) the dq accumulator [B][Hq][Sq][D] fp32.
__host__ __device__ inline int64_t workspace_rows(const fc_bwd_params &p) {
    return p.fwd.batch * p.fwd.heads_q * p.fwd.seqlen_q;
}
__device__ inline float *dq_accum_of(const fc_bwd_params &p) {
    return reinterpret_cast<float *>(static_cast<unsigned char *>(p.workspace) + fc_sm80_bwd_dq_accum_offset(&p.fwd));
}
// Where (batch, query head)'s rows start in those per-row arrays (times D in the accumulator).
__device__ __forceinline__ int64_t slice_rows_start(const fc_params &f, int batch, int head, int seqlen_q) {
    return (static_cast<int64_t>(batch) * f.heads_q + head) * seqlen_q;
}

// B fragments of a product whose B rows (the k dimension) come from a swizzled shared tile,
// transposed by ldmatrix.trans: `base` is the lane's address in the first 16 rows (its row
// (lane & 7) + 8 ((lane >> 3) & 1), chunk first_chunk + (lane >> 4)); k-step kk, chunk pair `pair`
// is chunk_pair_addr's XOR of it plus kk's 16 rows as an immediate (sm80/row_copy.cuh). With
// first_chunk a multiple of the pairs a caller walks (x2), chunk first_chunk + 2 pair + b sets no
// bit first_chunk has, so the XOR is exact.
template <int kPitchChunks, typename Elem>
__device__ __forceinline__ uint32_t trans_b_base(const Elem *tile, int first_chunk, int lane) {
    return smem_addr(tile + swizzled<kPitchChunks>((lane & 7) + ((lane >> 3) & 1) * 8, first_chunk + (lane >> 4)));
}
template <int kPitchChunks>
__device__ __forceinline__ void load_trans_b(uint32_t (&bf)[4], uint32_t base, int kk, int pair) {
    ldmatrix_x4_trans(bf, chunk_pair_addr(base, pair) + kk * 16 * kPitchChunks * 16);
}

// acc (this warp's 16 rows x 8 kDTiles columns) += A B. A (16 x 16 kSteps) is held in mma
// accumulator layout, a[2 kk] and a[2 kk + 1] covering its columns 16 kk .. 16 kk + 15, and is
// repacked to 16-bit A fragments in registers (FlashAttention-2's reuse of S as an operand); B's
// 16 kSteps rows come from a swizzled shared tile (load_trans_b). This is each pass's second
// product: dQ += dS K, dV += P^T dO, dK += dS^T Q.
template <typename Elem, int kSteps, int kDTiles, int kPitchChunks>
__device__ __forceinline__ void acc_times_tile(float (&acc)[kDTiles][4], const float (&a)[2 * kSteps][4],
                                               const Elem *tile, int lane) {
#pragma unroll
    for (int kk = 0; kk < kSteps; ++kk) {
        uint32_t af[4];
        af[0] = pack2<Elem>(a[2 * kk][0], a[2 * kk][1]);
        af[1] = pack2<Elem>(a[2 * kk][2], a[2 * kk][3]);
        af[2] = pack2<Elem>(a[2 * kk + 1][0], a[2 * kk + 1][1]);
        af[3] = pack2<Elem>(a[2 * kk + 1][2], a[2 * kk + 1][3]);
        const uint32_t base = trans_b_base<kPitchChunks>(tile, 0, lane);
#pragma unroll
        for (int dp2 = 0; dp2 < kDTiles / 2; ++dp2) {
            uint32_t bf[4];
            load_trans_b<kPitchChunks>(bf, base, kk, dp2);
            mma_16816_pair<Elem>(acc[2 * dp2], acc[2 * dp2 + 1], af, bf);
        }
    }
}

// P^T = exp2(S^T * scale * log2e - LSE2[query]) of one warp's 16 keys x kMTiles * 8 queries; where
// `masked`, -inf (P = 0) where kCausal and key > query, or kPastSk and key >= Sk: the one-pass
// kernel's dQ reads those keys' dS^T, and their zero-filled K rows give S^T = 0, whose P^T need
// not be finite. `masked` is tested per element, not by one branch around two loops: ptxas turns
// it into selects and interleaves the exponentials with the tensor-core work around them (a
// warp-uniform branch there measured slower, backward.md).
// kMaskKind (FC_MASK_BOOL, FC_MASK_ADDITIVE): `mask`'s value of every (query, key) inside Sq x Sk too.
// The exponent x of element e of n-tile j with the masks applied (probs_of_scores' masking).
template <bool kCausal, bool kPastSk, int kMaskKind, typename Mask>
__device__ __forceinline__ float masked_exponent(float x, int j, int e, bool masked, int col_in_tile, int m_start,
                                                 int key0, int seqlen_k, const Mask &mask, int seqlen_q) {
    if constexpr (kMaskKind != FC_MASK_NONE) {
        const int query = m_start + j * 8 + col_in_tile + (e & 1), key = key0 + 8 * (e >> 1);
        if (key < seqlen_k && query < seqlen_q) x = mask.apply(x, query, key);
    }
    if (masked) {
        const int col = m_start + j * 8 + col_in_tile + (e & 1);
        const int key = key0 + 8 * (e >> 1);
        if ((kCausal && key > col) || (kPastSk && key >= seqlen_k)) x = -INFINITY;
    }
    return x;
}
template <bool kCausal, bool kPastSk, int kMaskKind, int kMTiles, typename Mask>
__device__ __forceinline__ void probs_of_scores(float (&s)[kMTiles][4], const float *lse2, float scale_log2,
                                                bool masked, int col_in_tile, int m_start, int key0,
                                                int seqlen_k, const Mask &mask, int seqlen_q) {
#pragma unroll
    for (int j = 0; j < kMTiles; ++j) {
        const float2 l = *reinterpret_cast<const float2 *>(lse2 + j * 8 + col_in_tile);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const float x = fmaf(s[j][e], scale_log2, -((e & 1) ? l.y : l.x));
            s[j][e] = fast_exp2(masked_exponent<kCausal, kPastSk, kMaskKind>(x, j, e, masked, col_in_tile, m_start, key0,
                                                                             seqlen_k, mask, seqlen_q));
        }
    }
}

// kSoftcap (a logit softcap c, Gemma 2's): the forward's scores are c tanh(S scale / c) before the
// mask (sm80/fwd_steps.cuh), so with t = tanh(S^T softcap_in), softcap_in = scale / c,
// P^T = exp2(t c log2(e) - LSE2[query]), masked as probs_of_scores does, and dS^T gains the
// tanh's derivative: dS^T = P^T (dP^T - delta[query]) (1 - t^2) (the scale applied at the end,
// as without a softcap). P^T into s, dS^T into dp (which holds dP^T): t lives only here.
template <bool kCausal, bool kPastSk, int kMaskKind, int kMTiles, typename Mask>
__device__ __forceinline__ void softcap_probs_and_ds(float (&s)[kMTiles][4], float (&dp)[kMTiles][4],
                                                     const float *lse2, const float *dlt, float softcap_in,
                                                     float softcap_log2, bool masked, int col_in_tile, int m_start,
                                                     int key0, int seqlen_k, const Mask &mask, int seqlen_q) {
#pragma unroll
    for (int j = 0; j < kMTiles; ++j) {
        const float2 l = *reinterpret_cast<const float2 *>(lse2 + j * 8 + col_in_tile);
        const float2 dl = *reinterpret_cast<const float2 *>(dlt + j * 8 + col_in_tile);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const float t = fast_tanh(s[j][e] * softcap_in);
            const float x = fmaf(t, softcap_log2, -((e & 1) ? l.y : l.x));
            const float prob = fast_exp2(masked_exponent<kCausal, kPastSk, kMaskKind>(x, j, e, masked, col_in_tile, m_start,
                                                                                  key0, seqlen_k, mask, seqlen_q));
            s[j][e] = prob;
            dp[j][e] = prob * (dp[j][e] - ((e & 1) ? dl.y : dl.x)) * fmaf(-t, t, 1.f);
        }
    }
}

// ---- 1. delta = rowsum(dO * O) - dLSE, LSE in base 2 -------------------------------------------
// kHeadDim / 8 threads per row (RowLane), each reading 16 bytes of dO and of O. kZeroDq (the one-pass
// backward): each thread also zeroes its 8 columns of the row's dq accumulator.
template <typename Elem, int kHeadDim, bool kZeroDq>
__global__ void __launch_bounds__(128) delta_kernel(const fc_bwd_params p) {
    const RowLane<kHeadDim> lane;
    const int seqlen_q = static_cast<int>(p.fwd.seqlen_q), head = lane.head, batch = lane.batch, chunk = lane.chunk;
    const int row = static_cast<int>(lane.row);
    float acc = row_dot_dout_out<Elem, kHeadDim>(row < seqlen_q, chunk, [&] {
        const Elem *dout = static_cast<const Elem *>(p.dout) + batch * p.do_stride_b +
                           head * p.do_stride_h + static_cast<int64_t>(row) * p.do_stride_s;
        const Elem *out = static_cast<const Elem *>(p.fwd.out) + batch * p.fwd.o_stride_b +
                          head * p.fwd.o_stride_h + static_cast<int64_t>(row) * p.fwd.o_stride_s;
        return cuda::std::pair<const Elem *, const Elem *>(dout, out);
    });
    if (chunk == 0 && row < seqlen_q) {
        if (p.dlse != nullptr)
            acc -= p.dlse[batch * p.dlse_stride_b + head * p.dlse_stride_h + row * p.dlse_stride_s];
        const float lse = p.fwd.lse[batch * p.fwd.lse_stride_b + head * p.fwd.lse_stride_h +
                                    row * p.fwd.lse_stride_s];
        const int64_t idx = slice_rows_start(p.fwd, batch, head, seqlen_q) + row;
        float *delta = static_cast<float *>(p.workspace);
        delta[idx] = acc;
        delta[workspace_rows(p) + idx] = lse == -INFINITY ? INFINITY : lse * kLog2e;
    }
    if constexpr (kZeroDq) {
        if (row < seqlen_q && lane.has_chunk()) {
            const int64_t idx = slice_rows_start(p.fwd, batch, head, seqlen_q) + row;
            float4 *accum = reinterpret_cast<float4 *>(dq_accum_of(p) + idx * kHeadDim + chunk * 8);
            accum[0] = accum[1] = make_float4(0.f, 0.f, 0.f, 0.f);
        }
    }
}

// ---- the one-pass backward's dQ: shared dS^T, then atomics; the conversion ----------------------

// Element offset of (key row, query column) in the CTA's dS^T tile (BwdTraits: padded rows, or in
// the dO tile 32-query rows of 4 chunks, the chunk XOR-ed with (row / 2) % 4 so that the 8 rows
// of an ldmatrix phase, and of a warp's fragment stores, fall in distinct banks).
template <typename T>
__device__ __forceinline__ int ds_offset(int row, int col) {
    if constexpr (T::kDsInDoStage) {
        static_assert(T::kStream == 32, "the swizzle is for rows of 4 chunks");
        return row * 32 + ((((col >> 3) ^ (row >> 1)) & 3) << 3) + (col & 7);
    } else {
        return row * T::kDsPitch + col;
    }
}

// This thread's dS^T (its warp's 16 keys x the step's queries, mma accumulator layout) to the
// CTA's dS^T tile, packed in pairs of query columns.
template <typename Elem, typename T, int kMTiles>
__device__ __forceinline__ void store_ds_t(Elem *ds_t, const float (&ds)[kMTiles][4], int warp, int row_in_warp,
                                           int col_in_tile) {
#pragma unroll
    for (int j = 0; j < kMTiles; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h)
            *reinterpret_cast<uint32_t *>(ds_t + ds_offset<T>(warp * 16 + row_in_warp + 8 * h, j * 8 + col_in_tile)) =
                pack2<Elem>(ds[j][2 * h], ds[j][2 * h + 1]);
}

// Adds a and b to at[0] and at[1] (8-byte aligned) atomically: one vector reduction on sm_90.
__device__ __forceinline__ void atomic_add2(float *at, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    atomicAdd(reinterpret_cast<float2 *>(at), make_float2(a, b));
#else
    atomicAdd(at, a);
    atomicAdd(at + 1, b);
#endif
}

// The step's dQ share of this CTA's keys, dS K (query rows m_start.., its query head), added to
// the dq accumulator: each warp 16 query rows x kDqCols columns, dS read from the dS^T tile and K
// from the CTA's K tile, both transposed by ldmatrix.trans.
template <typename Elem, typename T>
__device__ __forceinline__ void add_dq_of_step(const fc_bwd_params &p, const Elem *ds_t, const Elem *k_tile, int head_q,
                                               int batch, int m_start, int warp, int lane) {
    constexpr int kMTiles = T::kStream / 16, kNTiles = T::kDqCols / 8;
    const int m0 = warp % kMTiles * 16, chunk0 = warp / kMTiles * T::kDqCols / 8;
    static_assert(T::kDqCols % 16 == 0 && T::kHeadDim % T::kDqCols == 0, "each warp 16 rows x kDqCols columns of dQ");
    static_assert(kNTiles <= 8 || T::kDqCols == T::kHeadDim, "chunk0: a multiple of the chunks a warp walks");
    const uint32_t k_base = trans_b_base<T::kPitchChunks>(k_tile, chunk0, lane);
    float acc[kNTiles][4];
#pragma unroll
    for (int n = 0; n < kNTiles; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[n][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < T::kBlock / 16; ++kk) {
        // A = dS (16 queries x 16 keys): matrix i of the x4 is (queries 8 (i % 2), keys 8 (i / 2)),
        // stored as its transpose.
        uint32_t af[4];
        const int matrix = lane >> 3;
        ldmatrix_x4_trans(af, smem_addr(ds_t + ds_offset<T>(kk * 16 + (matrix >> 1) * 8 + (lane & 7), m0 + (matrix & 1) * 8)));
#pragma unroll
        for (int dp2 = 0; dp2 < kNTiles / 2; ++dp2) {
            uint32_t bf[4];
            load_trans_b<T::kPitchChunks>(bf, k_base, kk, dp2);
            mma_16816_pair<Elem>(acc[2 * dp2], acc[2 * dp2 + 1], af, bf);
        }
    }
    const int seqlen_q = static_cast<int>(p.fwd.seqlen_q);
    float *rows = dq_accum_of(p) + slice_rows_start(p.fwd, batch, head_q, seqlen_q) * T::kHeadDim;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int query = m_start + m0 + lane / 4 + 8 * h;
        if (query >= seqlen_q) continue;
#pragma unroll
        for (int n = 0; n < kNTiles; ++n)
            atomic_add2(rows + static_cast<int64_t>(query) * T::kHeadDim + chunk0 * 8 + n * 8 + 2 * (lane % 4),
                        acc[n][2 * h], acc[n][2 * h + 1]);
    }
}

// dQ = scale * the dq accumulator, in the input's dtype (the one-pass backward's last kernel):
// kHeadDim / 8 threads per row, 8 columns each.
template <typename Elem, int kHeadDim>
__global__ void __launch_bounds__(128) dq_convert_kernel(const fc_bwd_params p) {
    const RowLane<kHeadDim> lane;
    const int seqlen_q = static_cast<int>(p.fwd.seqlen_q), head = lane.head, batch = lane.batch, chunk = lane.chunk;
    const int row = static_cast<int>(lane.row);
    if (row >= seqlen_q || !lane.has_chunk()) return;
    const int64_t idx = slice_rows_start(p.fwd, batch, head, seqlen_q) + row;
    const float4 *accum = reinterpret_cast<const float4 *>(dq_accum_of(p) + idx * kHeadDim + chunk * 8);
    const float4 a = __ldcs(accum), b = __ldcs(accum + 1);  // (read once)
    const uint4 out = pack8_scaled<Elem>(a, b, p.fwd.scale);
    *reinterpret_cast<uint4 *>(static_cast<Elem *>(p.dq) + batch * p.dq_stride_b + head * p.dq_stride_h +
                               static_cast<int64_t>(row) * p.dq_stride_s + chunk * 8) = out;
}

// ---- 2. dQ = scale * dS K, one CTA per (query block, query head, batch) ------------------------
template <typename Elem, int kHeadDim, bool kCausal, int kMaskKind, bool kSoftcap>
__global__ void __launch_bounds__(BwdTraits<kHeadDim, 4, kSoftcap>::kThreads)
dq_kernel(const fc_bwd_params p) {
    using T = BwdTraits<kHeadDim, 4, kSoftcap>;
    constexpr int kBlockM = T::kBlock, kBlockN = T::kStream, kChunks = T::kChunks;
    constexpr int kPitchChunks = T::kPitchChunks, kPitch = T::kPitch;  // shared rows (BwdTraits)
    constexpr int kKSteps = kHeadDim / 16;  // k-steps of Q K^T and dO V^T
    constexpr int kNTiles = kBlockN / 8;    // n-tiles of S and dP per warp
    constexpr int kDTiles = kHeadDim / 8;   // n-tiles of dQ per warp

    extern __shared__ __align__(128) unsigned char smem_raw[];
    Elem *smem_q = reinterpret_cast<Elem *>(smem_raw);
    Elem *smem_do = smem_q + kBlockM * kPitch;
    Elem *smem_k = smem_do + kBlockM * kPitch;              // [kStages][kBlockN][D]
    Elem *smem_v = smem_k + T::kStages * kBlockN * kPitch;  // [kStages][kBlockN][D]

    const fc_params &f = p.fwd;
    const int seqlen_q = static_cast<int>(f.seqlen_q);
    const int seqlen_k = static_cast<int>(f.seqlen_k);
    const int head_q = blockIdx.y, batch = blockIdx.z;
    const int head_kv = head_q / static_cast<int>(f.heads_q / f.heads_kv);
    const int m_block = gridDim.x - 1 - blockIdx.x;  // longest (causal) blocks first
    const int m_start = m_block * kBlockM;
    const MaskSliceOf<Elem, kMaskKind> mask(f, batch, head_q);

    const Elem *q = static_cast<const Elem *>(f.q) + batch * f.q_stride_b + head_q * f.q_stride_h +
                    static_cast<int64_t>(m_start) * f.q_stride_s;
    const Elem *dout = static_cast<const Elem *>(p.dout) + batch * p.do_stride_b +
                       head_q * p.do_stride_h + static_cast<int64_t>(m_start) * p.do_stride_s;
    const Elem *k = static_cast<const Elem *>(f.k) + batch * f.k_stride_b + head_kv * f.k_stride_h;
    const Elem *v = static_cast<const Elem *>(f.v) + batch * f.v_stride_b + head_kv * f.v_stride_h;
    const int k_stride = static_cast<int>(f.k_stride_s);
    const int v_stride = static_cast<int>(f.v_stride_s);

    const int last_row = min(m_start + kBlockM, seqlen_q) - 1;
    int n_blocks = (seqlen_k + kBlockN - 1) / kBlockN;
    if (kCausal) n_blocks = min(n_blocks, last_row / kBlockN + 1);

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int row_in_warp = lane / 4, col_in_tile = 2 * (lane % 4);

    auto load_kv = [&](int n_block, int stage) {
        const int n_start = n_block * kBlockN;
        const int rows = min(kBlockN, seqlen_k - n_start);
        load_tile<Elem, kBlockN, kChunks, T::kThreads, kPitchChunks>(smem_k + stage * kBlockN * kPitch,
                                                       k + n_start * k_stride, k_stride, rows);
        load_tile<Elem, kBlockN, kChunks, T::kThreads, kPitchChunks>(smem_v + stage * kBlockN * kPitch,
                                                       v + n_start * v_stride, v_stride, rows);
    };
    load_tile<Elem, kBlockM, kChunks, T::kThreads, kPitchChunks>(smem_q, q, static_cast<int>(f.q_stride_s),
                                                   seqlen_q - m_start);
    load_tile<Elem, kBlockM, kChunks, T::kThreads, kPitchChunks>(smem_do, dout, static_cast<int>(p.do_stride_s),
                                                   seqlen_q - m_start);
    load_kv(0, 0);
    cp_async_commit();

    // Per-row terms of this lane's two rows; rows past Sq get P = 0 (LSE +inf) and are not written.
    const float *delta_ws = static_cast<const float *>(p.workspace);
    const int64_t row_base = slice_rows_start(f, batch, head_q, seqlen_q);
    float lse2[2], delta[2];
    const typename MaskSliceOf<Elem, kMaskKind>::Value *mask_rows[2];  // (masked calls)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int row = m_start + warp * 16 + row_in_warp + 8 * h;
        mask_rows[h] = mask.row(row);
        lse2[h] = row < seqlen_q ? delta_ws[workspace_rows(p) + row_base + row] : INFINITY;
        delta[h] = row < seqlen_q ? delta_ws[row_base + row] : 0.f;
    }
    const float scale_log2 = f.scale * kLog2e;
    // kSoftcap: scores t = tanh(S softcap_in), exponents t softcap_log2 (softcap_probs_and_ds).
    [[maybe_unused]] const float softcap_in = kSoftcap ? f.scale / f.softcap : 0.f;
    [[maybe_unused]] const float softcap_log2 = kSoftcap ? f.softcap * kLog2e : 0.f;

    uint32_t q_frag[kKSteps][4], do_frag[kKSteps][4];
    float dq_acc[kDTiles][4];
#pragma unroll
    for (int i = 0; i < kDTiles; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) dq_acc[i][j] = 0.f;

    // One key block, instantiated with and without masking (kMask: the block runs past Sk or,
    // causal, crosses the diagonal of some warp's rows), chosen per whole block as in dkdv_kernel.
    auto run_block = [&](auto mask_tag, int n_block) {
        constexpr bool kMask = decltype(mask_tag)::value;
        const int stage = n_block & 1;
        if (n_block + 1 < n_blocks) {
            load_kv(n_block + 1, stage ^ 1);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();

        if (n_block == 0) {  // A fragments of Q and dO (this warp's 16 rows), held for the loop
            const int r = warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
            for (int kk = 0; kk < kKSteps; ++kk) {
                const int off = swizzled<kPitchChunks>(r, kk * 2 + (lane >> 4));
                ldmatrix_x4(q_frag[kk], smem_addr(smem_q + off));
                ldmatrix_x4(do_frag[kk], smem_addr(smem_do + off));
            }
        }

        const Elem *k_tile = smem_k + stage * kBlockN * kPitch;
        const Elem *v_tile = smem_v + stage * kBlockN * kPitch;
        // ---- S = Q K^T and dP = dO V^T: K and V rows are the (non-transposed) B operands ----
        float s[kNTiles][4], dp[kNTiles][4];
#pragma unroll
        for (int j = 0; j < kNTiles; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[j][e] = dp[j][e] = 0.f;
        // chunk pair kk of row r: chunk_pair_addr(base, kk) plus r's offset (as in dkdv_kernel)
        const int b_row = (lane & 7) + (lane >> 4) * 8, b_chunk = (lane >> 3) & 1;
        const uint32_t k_base = smem_addr(k_tile + swizzled<kPitchChunks>(b_row, b_chunk));
        const uint32_t v_base = smem_addr(v_tile + swizzled<kPitchChunks>(b_row, b_chunk));
#pragma unroll
        for (int kk = 0; kk < kKSteps; ++kk) {
#pragma unroll
            for (int np = 0; np < kNTiles / 2; ++np) {
                uint32_t kf[4], vf[4];
                ldmatrix_x4(kf, chunk_pair_addr(k_base, kk) + np * 16 * kPitchChunks * 16);
                mma_16816_pair<Elem>(s[2 * np], s[2 * np + 1], q_frag[kk], kf);
                ldmatrix_x4(vf, chunk_pair_addr(v_base, kk) + np * 16 * kPitchChunks * 16);
                mma_16816_pair<Elem>(dp[2 * np], dp[2 * np + 1], do_frag[kk], vf);
            }
        }

        // ---- P = exp2(S * scale * log2e - LSE2), masked; dS = P * (dP - delta) (kSoftcap: P from
        // t = tanh(S softcap_in) and dS times 1 - t^2, as softcap_probs_and_ds) ----
        const int n_start = n_block * kBlockN;
        const int row0 = m_start + warp * 16 + row_in_warp;
        const bool ragged = n_start + kBlockN > seqlen_k;
        const bool crosses_diagonal = kCausal && n_start + kBlockN - 1 > m_start + warp * 16;
#pragma unroll
        for (int j = 0; j < kNTiles; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int h = e >> 1;
                [[maybe_unused]] float t;
                float x;
                if constexpr (kSoftcap) {
                    t = fast_tanh(s[j][e] * softcap_in);
                    x = fmaf(t, softcap_log2, -lse2[h]);
                } else {
                    x = fmaf(s[j][e], scale_log2, -lse2[h]);
                }
                const int col = n_start + j * 8 + col_in_tile + (e & 1);
                if constexpr (kMaskKind != FC_MASK_NONE) {
                    if (col < seqlen_k && row0 + 8 * h < seqlen_q) x = mask.apply_in_row(x, mask_rows[h], col);
                }
                if (kMask && (ragged || crosses_diagonal)) {
                    if (col >= seqlen_k || (kCausal && col > row0 + 8 * h)) x = -INFINITY;
                }
                if constexpr (kSoftcap)
                    s[j][e] = fast_exp2(x) * (dp[j][e] - delta[h]) * fmaf(-t, t, 1.f);
                else
                    s[j][e] = fast_exp2(x) * (dp[j][e] - delta[h]);  // dS (scale applied at the end)
            }

        // ---- dQ += dS K ----
        acc_times_tile<Elem, kBlockN / 16, kDTiles, kPitchChunks>(dq_acc, s, k_tile, lane);
        __syncthreads();  // the next iteration's prefetch overwrites this stage
    };
    for (int n_block = 0; n_block < n_blocks; ++n_block) {
        const int n_end = (n_block + 1) * kBlockN;
        if (n_end > seqlen_k || (kCausal && n_end - 1 > m_start))
            run_block(std::true_type{}, n_block);
        else
            run_block(std::false_type{}, n_block);
    }

    // ---- epilogue: dQ * scale, staged through this warp's own rows of the Q tile ----
    Elem *stage_dq = smem_q;
#pragma unroll
    for (int d = 0; d < kDTiles; ++d)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = warp * 16 + row_in_warp + 8 * h;
            const uint32_t packed = pack2<Elem>(dq_acc[d][2 * h] * f.scale, dq_acc[d][2 * h + 1] * f.scale);
            *reinterpret_cast<uint32_t *>(stage_dq + swizzled<kPitchChunks>(r, d) + col_in_tile) = packed;
        }
    __syncwarp();
    Elem *dq = static_cast<Elem *>(p.dq) + batch * p.dq_stride_b + head_q * p.dq_stride_h;
    const int dq_stride = static_cast<int>(p.dq_stride_s);
#pragma unroll
    for (int it = 0; it < 16 * kChunks / 32; ++it) {
        const int item = lane + it * 32;
        const int r = warp * 16 + item / kChunks;
        const int chunk = item % kChunks;
        const int row = m_start + r;
        if (row < seqlen_q) {
            const uint4 val = *reinterpret_cast<const uint4 *>(stage_dq + swizzled<kPitchChunks>(r, chunk));
            *reinterpret_cast<uint4 *>(dq + static_cast<int64_t>(row) * dq_stride + chunk * 8) = val;
        }
    }
}

// ---- 3. dK, dV: one CTA per (key block, KV head, batch) -----------------------------------------
// kDqAtomic (the one-pass backward): also each step's dQ share, added to the dq accumulator
// (add_dq_of_step), with 8 warps (128-key blocks).
template <int kHeadDim, bool kDqAtomic, bool kSoftcap = false>
using DkDvTraits = BwdTraits<kHeadDim, kDqAtomic ? 8 : 4, kSoftcap>;

template <typename Elem, int kHeadDim, bool kCausal, bool kDqAtomic, int kMaskKind, bool kSoftcap>
__global__ void __launch_bounds__(DkDvTraits<kHeadDim, kDqAtomic, kSoftcap>::kThreads)
dkdv_kernel(const fc_bwd_params p) {
    using T = DkDvTraits<kHeadDim, kDqAtomic, kSoftcap>;
    constexpr int kBlockN = T::kBlock, kBlockM = T::kStream, kChunks = T::kChunks;
    constexpr int kPitchChunks = T::kPitchChunks, kPitch = T::kPitch;  // shared rows (BwdTraits)
    constexpr int kKSteps = kHeadDim / 16;  // k-steps of K Q^T and V dO^T
    constexpr int kMTiles = kBlockM / 8;    // n-tiles (query columns) of S^T and dP^T per warp
    constexpr int kDTiles = kHeadDim / 8;   // n-tiles of dK, dV per warp
    // D=128: with the k-step loops of S^T and dP^T fully unrolled, ptxas hoists the fragment
    // loads of all 8 k-steps and spills 40 bytes on sm_90a (255 registers); unrolled by 2 it fits.
    constexpr int kKUnroll = kHeadDim <= 64 ? kKSteps : 2;
    // D=64: the A fragments of this warp's K and V rows (32 registers) stay in registers instead
    // of being reloaded from shared memory every step; D=128 has no registers for its 64, nor
    // D=64 with a softcap (its masked variants spilled 4 bytes on sm_90a with them).
    constexpr bool kKvInRegs = kHeadDim <= 64 && !kSoftcap;

    extern __shared__ __align__(128) unsigned char smem_raw[];
    Elem *smem_k = reinterpret_cast<Elem *>(smem_raw);
    Elem *smem_v = smem_k + kBlockN * kPitch;
    Elem *smem_q = smem_v + kBlockN * kPitch;                 // [kStages][kBlockM][D]
    Elem *smem_do = smem_q + T::kStages * kBlockM * kPitch;   // [kStages][kBlockM][D]
    float *smem_lse2 = reinterpret_cast<float *>(smem_do + T::kStages * kBlockM * kPitch);  // [kStages][kBlockM]
    float *smem_delta = smem_lse2 + T::kStages * kBlockM;                                    // [kStages][kBlockM]
    Elem *smem_ds = reinterpret_cast<Elem *>(smem_delta + T::kStages * kBlockM);  // kDqAtomic, !kDsInDoStage: [kBlockN][kDsPitch]

    const fc_params &f = p.fwd;
    const int seqlen_q = static_cast<int>(f.seqlen_q);
    const int seqlen_k = static_cast<int>(f.seqlen_k);
    const int n_block = blockIdx.x;  // causal: low key blocks have the most work and start first
    const int head_kv = blockIdx.y, batch = blockIdx.z;
    const int group = static_cast<int>(f.heads_q / f.heads_kv);
    const int n_start = n_block * kBlockN;

    // Query blocks that see any key of this block: with causal masking none before row n_start.
    // Keys past Sq (causal, Sq < Sk) are seen by no query: their dK, dV are written as zeros.
    const int m_first = kCausal ? n_start / kBlockM : 0;
    const int m_total = (seqlen_q + kBlockM - 1) / kBlockM;
    const int m_count = max(0, m_total - m_first);
    const int steps = group * m_count;  // (query head in the group, query block) pairs, head-major

    const float *delta_ws = static_cast<const float *>(p.workspace);
    const float *lse2_ws = delta_ws + workspace_rows(p);

    // A step's (query head of the group, query block) pair, stepped without a division.
    struct StepAt {
        int head_q, m_start;
    };
    auto next_of = [&](StepAt at) {
        at.m_start += kBlockM;
        if (at.m_start >= seqlen_q) {
            at.m_start = m_first * kBlockM;
            ++at.head_q;
        }
        return at;
    };
    auto load_step = [&](StepAt at, int stage) {
        const int head_q = at.head_q;
        const int m_start = at.m_start;
        const int rows = min(kBlockM, seqlen_q - m_start);
        const Elem *q = static_cast<const Elem *>(f.q) + batch * f.q_stride_b + head_q * f.q_stride_h +
                        static_cast<int64_t>(m_start) * f.q_stride_s;
        const Elem *dout = static_cast<const Elem *>(p.dout) + batch * p.do_stride_b +
                           head_q * p.do_stride_h + static_cast<int64_t>(m_start) * p.do_stride_s;
        load_tile<Elem, kBlockM, kChunks, T::kThreads, kPitchChunks>(smem_q + stage * kBlockM * kPitch, q,
                                                       static_cast<int>(f.q_stride_s), rows);
        load_tile<Elem, kBlockM, kChunks, T::kThreads, kPitchChunks>(smem_do + stage * kBlockM * kPitch, dout,
                                                       static_cast<int>(p.do_stride_s), rows);
        if (threadIdx.x < kBlockM) {
            const int r = threadIdx.x;
            float *lse_dst = smem_lse2 + stage * kBlockM + r;
            float *delta_dst = smem_delta + stage * kBlockM + r;
            if (r < rows) {
                const int64_t idx = slice_rows_start(f, batch, head_q, seqlen_q) + m_start + r;
                cp_async_zfill<4>(smem_addr(lse_dst), lse2_ws + idx, 4);
                cp_async_zfill<4>(smem_addr(delta_dst), delta_ws + idx, 4);
            } else {  // rows past Sq: P = 0, dS = 0 (plain stores, ordered by the same barrier)
                *lse_dst = INFINITY;
                *delta_dst = 0.f;
            }
        }
    };

    const Elem *k = static_cast<const Elem *>(f.k) + batch * f.k_stride_b + head_kv * f.k_stride_h +
                    static_cast<int64_t>(n_start) * f.k_stride_s;
    const Elem *v = static_cast<const Elem *>(f.v) + batch * f.v_stride_b + head_kv * f.v_stride_h +
                    static_cast<int64_t>(n_start) * f.v_stride_s;
    const int n_rows = min(kBlockN, seqlen_k - n_start);
    load_tile<Elem, kBlockN, kChunks, T::kThreads, kPitchChunks>(smem_k, k, static_cast<int>(f.k_stride_s), n_rows);
    load_tile<Elem, kBlockN, kChunks, T::kThreads, kPitchChunks>(smem_v, v, static_cast<int>(f.v_stride_s), n_rows);
    StepAt at{head_kv * group, m_first * kBlockM};
    if (steps > 0) load_step(at, 0);
    cp_async_commit();

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int row_in_warp = lane / 4, col_in_tile = 2 * (lane % 4);
    const float scale_log2 = f.scale * kLog2e;
    [[maybe_unused]] const float softcap_in = kSoftcap ? f.scale / f.softcap : 0.f;
    [[maybe_unused]] const float softcap_log2 = kSoftcap ? f.softcap * kLog2e : 0.f;
    // This lane's two key rows (of the 16 its warp owns).
    const int key0 = n_start + warp * 16 + row_in_warp;

    float dk_acc[kDTiles][4], dv_acc[kDTiles][4];
#pragma unroll
    for (int i = 0; i < kDTiles; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) dk_acc[i][j] = dv_acc[i][j] = 0.f;

    // kKvInRegs: this warp's K and V rows as A fragments, held for the whole loop
    uint32_t k_frag[kKvInRegs ? kKSteps : 1][4], v_frag[kKvInRegs ? kKSteps : 1][4];
    // One step, instantiated twice where masks exist: kMask for the steps where some warp's keys
    // need masking (causal: the query blocks across the diagonal; the one-pass kernel: every
    // step of the block whose keys run past Sk), so that the other steps run no compares or
    // selects. The choice is made per whole step, whose body stays one piece for the scheduler
    // (a branch around the exponentials alone measured slower).
    auto run_step = [&](auto mask_tag, int step) {
        constexpr bool kMask = decltype(mask_tag)::value;
        const int stage = step & 1;
        if (step + 1 < steps) {
            load_step(next_of(at), stage ^ 1);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();

        const int m_start = at.m_start;
        const Elem *q_tile = smem_q + stage * kBlockM * kPitch;
        const Elem *do_tile = smem_do + stage * kBlockM * kPitch;
        const float *lse2 = smem_lse2 + stage * kBlockM;
        const float *dlt = smem_delta + stage * kBlockM;
        // ldmatrix addresses of the B operands of S^T and dP^T: chunk pair kk of row r is
        // chunk_pair_addr(base, kk) plus r's offset (the same r % 8 for every 16-row block)
        const int b_row = (lane & 7) + (lane >> 4) * 8, b_chunk = (lane >> 3) & 1;
        const uint32_t q_tile_base = smem_addr(q_tile + swizzled<kPitchChunks>(b_row, b_chunk));
        const uint32_t do_tile_base = smem_addr(do_tile + swizzled<kPitchChunks>(b_row, b_chunk));

        // ---- S^T = K Q^T: this warp's K rows are the A operand, Q rows the B operand ----
        const int a_row = warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
        if constexpr (kKvInRegs) {
            if (step == 0) {  // the K/V tiles landed with step 0's copies
#pragma unroll
                for (int kk = 0; kk < kKSteps; ++kk) {
                    ldmatrix_x4(k_frag[kk], smem_addr(smem_k + swizzled<kPitchChunks>(a_row, kk * 2 + (lane >> 4))));
                    ldmatrix_x4(v_frag[kk], smem_addr(smem_v + swizzled<kPitchChunks>(a_row, kk * 2 + (lane >> 4))));
                }
            }
        }
        // acc = (this warp's 16 key rows: A, from kv_frag or kv_rows) x (the step's query tile at
        // tile_base: B)^T, for S^T (K, Q) and dP^T (V, dO) alike.
        auto keys_by_step_rows = [&](float (&acc)[kMTiles][4], const uint32_t (&kv_frag)[kKvInRegs ? kKSteps : 1][4],
                                     const Elem *kv_rows, uint32_t tile_base) {
#pragma unroll
            for (int j = 0; j < kMTiles; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[j][e] = 0.f;
#pragma unroll(kKUnroll)
            for (int kk = 0; kk < kKSteps; ++kk) {
                uint32_t af[4];
                if constexpr (kKvInRegs)
                    for (int i = 0; i < 4; ++i) af[i] = kv_frag[kk][i];
                else
                    ldmatrix_x4(af, smem_addr(kv_rows + swizzled<kPitchChunks>(a_row, kk * 2 + (lane >> 4))));
#pragma unroll
                for (int np = 0; np < kMTiles / 2; ++np) {
                    uint32_t bf[4];
                    ldmatrix_x4(bf, chunk_pair_addr(tile_base, kk) + np * 16 * kPitchChunks * 16);
                    mma_16816_pair<Elem>(acc[2 * np], acc[2 * np + 1], af, bf);
                }
            }
        };
        float s[kMTiles][4];
        keys_by_step_rows(s, k_frag, smem_k, q_tile_base);

        // ---- dP^T = V dO^T: this warp's V rows are the A operand, dO rows the B operand ----
        float dp[kMTiles][4];
        auto dp_of_step = [&] { keys_by_step_rows(dp, v_frag, smem_v, do_tile_base); };

        // ---- P^T = exp2(S^T * scale * log2e - LSE2[query]), masked where this warp's keys need it ----
        const bool masked_tile = kMask && ((kCausal && n_start + warp * 16 + 15 > m_start) ||
                                           (kDqAtomic && n_start + warp * 16 + 15 >= seqlen_k));
        const MaskSliceOf<Elem, kMaskKind> mask(f, batch, at.head_q);
        if constexpr (kSoftcap) {
            // dP^T first: P^T and dS^T both need t, which then lives only inside one loop.
            dp_of_step();
            softcap_probs_and_ds<kCausal, kDqAtomic, kMaskKind>(s, dp, lse2, dlt, softcap_in, softcap_log2, masked_tile,
                                                               col_in_tile, m_start, key0, seqlen_k, mask, seqlen_q);
            // ---- dV += P^T dO; then dS^T into s, where the rest of the step reads it ----
            acc_times_tile<Elem, kBlockM / 16, kDTiles, kPitchChunks>(dv_acc, s, do_tile, lane);
#pragma unroll
            for (int j = 0; j < kMTiles; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) s[j][e] = dp[j][e];
        } else {
            probs_of_scores<kCausal, kDqAtomic, kMaskKind>(s, lse2, scale_log2, masked_tile, col_in_tile, m_start, key0,
                                                           seqlen_k, mask, seqlen_q);

            // ---- dV += P^T dO ----
            acc_times_tile<Elem, kBlockM / 16, kDTiles, kPitchChunks>(dv_acc, s, do_tile, lane);

            dp_of_step();

            // ---- dS^T = P^T * (dP^T - delta[query]) ----
#pragma unroll
            for (int j = 0; j < kMTiles; ++j) {
                const float2 dl = *reinterpret_cast<const float2 *>(dlt + j * 8 + col_in_tile);
#pragma unroll
                for (int e = 0; e < 4; ++e) s[j][e] *= dp[j][e] - ((e & 1) ? dl.y : dl.x);
            }
        }

        if constexpr (kDqAtomic && !T::kDsInDoStage) store_ds_t<Elem, T>(smem_ds, s, warp, row_in_warp, col_in_tile);

        // ---- dK += dS^T Q (scale applied at the end) ----
        acc_times_tile<Elem, kBlockM / 16, kDTiles, kPitchChunks>(dk_acc, s, q_tile, lane);

        // ---- kDqAtomic: dQ += dS K of this block's keys, in the accumulator ----
        if constexpr (kDqAtomic) {
            Elem *ds_t = smem_ds;
            if constexpr (T::kDsInDoStage) {
                ds_t = smem_do + stage * kBlockM * kPitch;  // this step's dO tile
                __syncthreads();  // every warp is done with this step's dO
                store_ds_t<Elem, T>(ds_t, s, warp, row_in_warp, col_in_tile);
            }
            __syncthreads();  // every warp's dS^T rows are in
            add_dq_of_step<Elem, T>(p, ds_t, smem_k, at.head_q, batch, m_start, warp, lane);
        }
        __syncthreads();  // the next iteration's prefetch overwrites this stage (and dS^T)
    };
    const bool past_sk = kDqAtomic && n_start + kBlockN > seqlen_k;
    for (int step = 0; step < steps; ++step) {
        if constexpr (kCausal || kDqAtomic) {
            if (past_sk || (kCausal && n_start + kBlockN - 1 > at.m_start))
                run_step(std::true_type{}, step);
            else
                run_step(std::false_type{}, step);
        } else {
            run_step(std::false_type{}, step);
        }
        at = next_of(at);
    }

    // ---- epilogue: stage dK * scale and dV in this warp's own rows of the K and V tiles ----
    cp_async_wait<0>();  // with no steps, the K/V copies may still be landing
    __syncthreads();
#pragma unroll
    for (int d = 0; d < kDTiles; ++d)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = warp * 16 + row_in_warp + 8 * h;
            const int off = swizzled<kPitchChunks>(r, d) + col_in_tile;
            *reinterpret_cast<uint32_t *>(smem_k + off) =
                pack2<Elem>(dk_acc[d][2 * h] * f.scale, dk_acc[d][2 * h + 1] * f.scale);
            *reinterpret_cast<uint32_t *>(smem_v + off) = pack2<Elem>(dv_acc[d][2 * h], dv_acc[d][2 * h + 1]);
        }
    __syncwarp();
    Elem *dk = static_cast<Elem *>(p.dk) + batch * p.dk_stride_b + head_kv * p.dk_stride_h;
    Elem *dv = static_cast<Elem *>(p.dv) + batch * p.dv_stride_b + head_kv * p.dv_stride_h;
    const int dk_stride = static_cast<int>(p.dk_stride_s), dv_stride = static_cast<int>(p.dv_stride_s);
#pragma unroll
    for (int it = 0; it < 16 * kChunks / 32; ++it) {
        const int item = lane + it * 32;
        const int r = warp * 16 + item / kChunks;
        const int chunk = item % kChunks;
        const int row = n_start + r;
        if (row < seqlen_k) {
            const int off = swizzled<kPitchChunks>(r, chunk);
            *reinterpret_cast<uint4 *>(dk + static_cast<int64_t>(row) * dk_stride + chunk * 8) =
                *reinterpret_cast<const uint4 *>(smem_k + off);
            *reinterpret_cast<uint4 *>(dv + static_cast<int64_t>(row) * dv_stride + chunk * 8) =
                *reinterpret_cast<const uint4 *>(smem_v + off);
        }
    }
}

// ---- host side ----------------------------------------------------------------------------------

// Validated params (c_src/bwd.c): the kernels on `stream` (two passes: delta, dQ, dK/dV; one pass:
// delta with the accumulator zeroed, dK/dV with dQ's atomics, the conversion), no allocation, no
// sync.
template <typename Elem, int kHeadDim, bool kCausal, int kMaskKind, bool kSoftcap>
cudaError_t launch_bwd(const fc_bwd_params &p, const fc_device_facts &dev, cudaStream_t stream) {
    using T = BwdTraits<kHeadDim, 4, kSoftcap>;
    const unsigned hq = static_cast<unsigned>(p.fwd.heads_q), b = static_cast<unsigned>(p.fwd.batch);
    constexpr int kRowsPerCta = RowLane<kHeadDim>::kRowsPerCta;  // delta_kernel's and dq_convert_kernel's
    const dim3 row_grid(static_cast<unsigned>((p.fwd.seqlen_q + kRowsPerCta - 1) / kRowsPerCta), hq, b);
    // dK/dV kernels: one CTA per (key block of `block` keys, KV head, batch)
    auto key_block_grid = [&](int block) {
        return dim3(static_cast<unsigned>((p.fwd.seqlen_k + block - 1) / block), static_cast<unsigned>(p.fwd.heads_kv), b);
    };
    cudaError_t err = cudaSuccess;
    // (fc_sm80_bwd_one_pass holds at D=64 and 128 without a softcap alone: only those build the
    // one-pass kernel.)
    if constexpr ((kHeadDim == 64 || kHeadDim == 128) && !kSoftcap) {
        if (fc_sm80_bwd_one_pass(&p.fwd, p.deterministic)) {  // dQ through the accumulator
            using TA = DkDvTraits<kHeadDim, true>;
            auto dkdv = dkdv_kernel<Elem, kHeadDim, kCausal, true, kMaskKind, kSoftcap>;
            static unsigned long long dkdv_configured = 0;
            if ((err = allow_smem(dkdv, TA::kKvAtomicSmemBytes, &dkdv_configured, dev.device)) != cudaSuccess) return err;
            delta_kernel<Elem, kHeadDim, true><<<row_grid, 128, 0, stream>>>(p);
            if ((err = cudaGetLastError()) != cudaSuccess) return err;
            dkdv<<<key_block_grid(TA::kBlock), TA::kThreads, TA::kKvAtomicSmemBytes, stream>>>(p);
            if ((err = cudaGetLastError()) != cudaSuccess) return err;
            dq_convert_kernel<Elem, kHeadDim><<<row_grid, 128, 0, stream>>>(p);
            return cudaGetLastError();
        }
    }
    auto dq = dq_kernel<Elem, kHeadDim, kCausal, kMaskKind, kSoftcap>;
    auto dkdv = dkdv_kernel<Elem, kHeadDim, kCausal, false, kMaskKind, kSoftcap>;
    static unsigned long long dq_configured = 0, dkdv_configured = 0;
    if ((err = allow_smem(dq, T::kDqSmemBytes, &dq_configured, dev.device)) != cudaSuccess) return err;
    if ((err = allow_smem(dkdv, T::kKvSmemBytes, &dkdv_configured, dev.device)) != cudaSuccess) return err;

    delta_kernel<Elem, kHeadDim, false><<<row_grid, 128, 0, stream>>>(p);
    if ((err = cudaGetLastError()) != cudaSuccess) return err;

    const dim3 dq_grid(static_cast<unsigned>((p.fwd.seqlen_q + T::kBlock - 1) / T::kBlock), hq, b);
    dq<<<dq_grid, T::kThreads, T::kDqSmemBytes, stream>>>(p);
    if ((err = cudaGetLastError()) != cudaSuccess) return err;

    dkdv<<<key_block_grid(T::kBlock), T::kThreads, T::kKvSmemBytes, stream>>>(p);
    return cudaGetLastError();
}

// The variant for a call: causal or not, or one of the mask kinds (c_src/bwd.c sends masked causal
// calls elsewhere: PyTorch's SDPA never makes them), each with or without a softcap.
template <typename Elem, int kHeadDim, bool kSoftcap>
cudaError_t launch_bwd_mask_variant(const fc_bwd_params &p, const fc_device_facts &dev, cudaStream_t stream) {
    switch (p.fwd.mask_kind) {
    case FC_MASK_BOOL: return launch_bwd<Elem, kHeadDim, false, FC_MASK_BOOL, kSoftcap>(p, dev, stream);
    case FC_MASK_ADDITIVE: return launch_bwd<Elem, kHeadDim, false, FC_MASK_ADDITIVE, kSoftcap>(p, dev, stream);
    default:
        return p.fwd.causal ? launch_bwd<Elem, kHeadDim, true, FC_MASK_NONE, kSoftcap>(p, dev, stream)
                            : launch_bwd<Elem, kHeadDim, false, FC_MASK_NONE, kSoftcap>(p, dev, stream);
    }
}
template <typename Elem, int kHeadDim>
cudaError_t launch_bwd_variant(const fc_bwd_params &p, const fc_device_facts &dev, cudaStream_t stream) {
    return p.fwd.softcap != 0.0f ? launch_bwd_mask_variant<Elem, kHeadDim, true>(p, dev, stream)
                                 : launch_bwd_mask_variant<Elem, kHeadDim, false>(p, dev, stream);
}

}  // namespace sm80_bwd
}  // namespace flashcore

// Defines the C entry point of one (head dim, dtype) instantiation, e.g.
//   cudaError_t fc_sm80_bwd_hdim64_fp16(const fc_bwd_params *p, const fc_device_facts *dev, cudaStream_t stream);
#define FLASHCORE_DEFINE_SM80_BWD(HDIM, DTYPE_NAME, ELEM)                                       \
    extern "C" cudaError_t fc_sm80_bwd_hdim##HDIM##_##DTYPE_NAME(                              \
        const fc_bwd_params *p, const fc_device_facts *dev, cudaStream_t stream) {             \
        return flashcore::sm80_bwd::launch_bwd_variant<ELEM, HDIM>(*p, *dev, stream);          \
    }
