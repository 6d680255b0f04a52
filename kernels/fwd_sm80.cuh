// fwd_sm80.cuh - the sm_80-class fused attention forward (Ampere/Ada instructions; built for
// sm_89 and also for sm_90 so it can be run and timed on Hopper).
//
// What it computes: for one (batch, query head) and a block of kBlockM query rows,
//     O = softmax(scale * Q K^T [causal-masked]) V,   LSE = log(sum(exp(scale * Q K^T)))
// in one pass over K and V (FlashAttention-2's online softmax), never writing S or P out.
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

template <typename Elem, int kHeadDim, bool kCausal>
__global__ void __launch_bounds__(FwdTraits<kHeadDim>::kThreads, FwdTraits<kHeadDim>::kMinBlocksPerSm)
fwd_kernel(const fc_params p) {
    using T = FwdTraits<kHeadDim>;
    constexpr int kBlockM = T::kBlockM, kBlockN = T::kBlockN, kChunks = T::kChunks;
    constexpr int kKSteps = kHeadDim / 16;   // k-steps of QK^T
    constexpr int kNTiles = kBlockN / 8;     // n-tiles of S per warp
    constexpr int kDTiles = kHeadDim / 8;    // n-tiles of O per warp

    extern __shared__ __align__(128) unsigned char smem_raw[];
    Elem *smem_q = reinterpret_cast<Elem *>(smem_raw);
    Elem *smem_k = smem_q + kBlockM * kHeadDim;            // [kStages][kBlockN][D]
    Elem *smem_v = smem_k + T::kStages * kBlockN * kHeadDim;  // [kStages][kBlockN][D]

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

    // Key tiles this query block needs: with causal masking, none past its last row.
    const int last_row = min(m_start + kBlockM, seqlen_q) - 1;
    int n_blocks = (seqlen_k + kBlockN - 1) / kBlockN;
    if (kCausal) n_blocks = min(n_blocks, last_row / kBlockN + 1);

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
    const float scale_log2 = p.scale * 1.4426950408889634f;

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

        // ---- scale into base-2 units, then mask (after scaling: a negative scale must not
        //      turn -inf into +inf) ----
#pragma unroll
        for (int j = 0; j < kNTiles; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[j][e] *= scale_log2;
        const int n_start = n_block * kBlockN;
        const int row0 = m_start + warp * 16 + row_in_warp;
        const bool ragged = n_start + kBlockN > seqlen_k;
        const bool crosses_diagonal = kCausal && n_start + kBlockN - 1 > m_start + warp * 16;
        if (ragged || crosses_diagonal) {
#pragma unroll
            for (int j = 0; j < kNTiles; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int col = n_start + j * 8 + col_in_tile + (e & 1);
                    const int row = row0 + (e >> 1) * 8;
                    if (col >= seqlen_k || (kCausal && col > row)) s[j][e] = -INFINITY;
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
            const float rescale = fast_exp2(row_max[h] - base);
            row_max[h] = mx;
            float sum = 0.f;
#pragma unroll
            for (int j = 0; j < kNTiles; ++j) {
                s[j][2 * h] = fast_exp2(s[j][2 * h] - base);
                s[j][2 * h + 1] = fast_exp2(s[j][2 * h + 1] - base);
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
        inv_sum[h] = 1.f / sum;
    }
    if (p.lse != nullptr && (lane % 4) == 0) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = m_start + warp * 16 + row_in_warp + 8 * h;
            if (row < seqlen_q) {
                // Natural log: (max in base-2 units + log2(sum)) * ln(2).
                const float lse = (row_max[h] + __log2f(row_sum[h])) * 0.6931471805599453f;
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
template <typename Elem, int kHeadDim, bool kCausal>
cudaError_t launch_fwd(const fc_params &p, cudaStream_t stream) {
    using T = FwdTraits<kHeadDim>;
    auto kernel = fwd_kernel<Elem, kHeadDim, kCausal>;
    // The attribute is per device; remember which devices are done (bitmask, up to 64).
    static unsigned long long configured_devices = 0;
    int device = 0;
    cudaError_t err = cudaGetDevice(&device);
    if (err != cudaSuccess) return err;
    const unsigned long long bit = 1ull << (device & 63);
    if (T::kSmemBytes > 48 * 1024 && !(__atomic_load_n(&configured_devices, __ATOMIC_ACQUIRE) & bit)) {
        err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSmemBytes);
        if (err != cudaSuccess) return err;
        __atomic_fetch_or(&configured_devices, bit, __ATOMIC_ACQ_REL);
    }
    const int m_blocks = static_cast<int>((p.seqlen_q + T::kBlockM - 1) / T::kBlockM);
    const dim3 grid(static_cast<unsigned>(m_blocks), static_cast<unsigned>(p.heads_q), static_cast<unsigned>(p.batch));
    kernel<<<grid, T::kThreads, T::kSmemBytes, stream>>>(p);
    return cudaGetLastError();
}

}  // namespace sm80
}  // namespace flashcore

// Defines the C entry point of one (head dim, dtype) instantiation, e.g.
//   cudaError_t fc_sm80_fwd_hdim64_fp16(const fc_params *p, cudaStream_t stream);
#define FLASHCORE_DEFINE_SM80_FWD(HDIM, DTYPE_NAME, ELEM)                                       \
    extern "C" cudaError_t fc_sm80_fwd_hdim##HDIM##_##DTYPE_NAME(const fc_params *p,          \
                                                                 cudaStream_t stream) {       \
        return p->causal ? flashcore::sm80::launch_fwd<ELEM, HDIM, true>(*p, stream)           \
                         : flashcore::sm80::launch_fwd<ELEM, HDIM, false>(*p, stream);         \
    }
