// sm90/bwd_rows.cuh - the Hopper backward's row-wise kernels around its main kernel
// (sm90/bwd_kernel.cuh), over the workspace laid out in c_src/launch_rules.h
// (fc_sm90_bwd_workspace_bytes): per (batch, query head) the query rows are padded to a multiple
// of the main kernel's query tile, so that each tile's row terms are one aligned bulk copy.
//
//   row_terms_kernel (before): delta = rowsum(dO * O) - dLSE and LSE in base-2 units, fp32,
//       for every padded row, and the row of the dq accumulator zeroed (and the main kernel's
//       tile counter and per-pair counts). Rows past Sq get delta 0
//       and LSE +inf, so their P = exp2(s - inf) is 0 and they add nothing; a row whose LSE is
//       -inf (nothing attended) gets +inf too.
//   dq_convert_kernel (after): dq = scale * (the fp32 dq accumulator), in dq's dtype and strides.
//       It may start while the main kernel's last tiles run (programmatic dependent launch,
//       sm90/bwd_launch.cuh): each CTA first waits until every key block of its rows' (batch,
//       KV head) pair has added its dQ (the pair's count, kept by the main kernel's dQ writer).
//
// kPacked (fc_params.cu_seq_q): the rows are the packed rows of all sequences, one slice per query
// head (fc_sm90_bwd_varlen_workspace_bytes): the row terms [Hq][R][delta, LSE2] and the
// accumulator [Hq][R]; R covers every row a query step reads (its first row may be any), and every
// one of them is written (rows past total_q: delta 0, LSE2 +inf, as padded rows are).
#pragma once

#include "common/bwd_delta.cuh"
#include "common/sm80_ptx.cuh"  // pack8_scaled, allow_dependent_grids
#include "flashcore.h"
#include "launch_rules.h"

#include <cuda_runtime.h>
#include <math.h>

namespace flashcore {
namespace sm90_bwd {

constexpr float kLog2e = 1.4426950408889634f;

// Where the workspace's regions start, for validated params.
struct Workspace {
    // Per (batch, query head) and 64-row query tile: the tile's 64 deltas, then its 64 LSE2s, so
    // that a step's row terms are one bulk copy (kRowTermsBytes).
    float *row_terms;
    float *dq_accum;
    int32_t *tile_counter;  // the main kernel's next tile past its first wave (sm90/bwd_kernel.cuh)
    // Per slice (batch, query head): at the last query head of each (batch, KV head) pair's
    // group, the pair's key blocks whose dQ reductions are complete (the others stay 0;
    // kPacked: none, nullptr).
    int32_t *key_blocks_done;
    int64_t padded_seqlen;  // query rows per (batch, head) in every region
    // Offset in row_terms of the delta of padded row `row` of slice (batch * heads_q + head);
    // its LSE2 is kRowBlock further on.
    static constexpr int kRowBlock = FC_SM90_BWD_ROW_BLOCK;
    __host__ __device__ int64_t delta_at(int64_t slice, int64_t row) const {
        return (slice * padded_seqlen + row / kRowBlock * kRowBlock) * 2 + row % kRowBlock;
    }
    // kPacked: the same for a packed call's layout (its LSE2 is the next float).
    __host__ __device__ int64_t packed_delta_at(int64_t head, int64_t row) const {
        return (head * padded_seqlen + row) * 2;
    }
    // Offset in dq_accum of padded row `row` of a slice, in rows of kDqPitch<D> floats.
    __host__ __device__ int64_t dq_at(int64_t slice, int64_t row, int pitch) const {
        return (slice * padded_seqlen + row) * pitch;
    }
};
constexpr int kRowTermsBytes = 2 * FC_SM90_BWD_ROW_BLOCK * 4;
// kPacked: a step's rows start anywhere, and a bulk copy at a 16-byte boundary: the step copies
// kPackedRowSpan rows' (delta, LSE2) pairs from its first row rounded down to even.
constexpr int kPackedRowSpan = FC_SM90_BWD_ROW_BLOCK + 2;
// Floats per row of the dq accumulator. D=64/128: padded like the kernel's staging, so that a
// staged block is one bulk reduction. D=256: not padded (its staging rows are 1 KB, permuted
// instead), so that a run of rows is contiguous and one bulk reduction takes several (the
// workspace keeps FC_SM90_BWD_DQ_PAD floats a row regardless: they go unused).
template <int kHeadDim>
constexpr int kDqPitch = kHeadDim == 256 ? kHeadDim : kHeadDim + FC_SM90_BWD_DQ_PAD;
template <bool kPacked = false>
__host__ __device__ inline Workspace workspace_of(const fc_bwd_params &p) {
    const int64_t padded = kPacked ? fc_sm90_bwd_varlen_rows(p.fwd.total_q) : fc_sm90_bwd_padded_seqlen(&p.fwd);
    const int64_t rows = (kPacked ? 1 : p.fwd.batch) * p.fwd.heads_q * padded;
    // (kPacked: the key-block list comes first.)
    float *base = reinterpret_cast<float *>(static_cast<unsigned char *>(p.workspace) +
                                            (kPacked ? fc_sm90_bwd_varlen_list_bytes(&p.fwd) : 0));
    float *dq_accum = base + 2 * rows;
    int32_t *tile_counter = reinterpret_cast<int32_t *>(dq_accum + rows * (p.fwd.head_dim + FC_SM90_BWD_DQ_PAD));
    int32_t *key_blocks_done = kPacked ? nullptr : tile_counter + FC_SM90_BWD_COUNTER_BYTES / 4;
    return Workspace{base, dq_accum, tile_counter, key_blocks_done, padded};
}

// Key blocks of the main kernel per (batch, KV head) pair: what a pair's count reaches.
template <int kHeadDim>
__host__ __device__ inline int key_blocks(const fc_params &f) {
    constexpr int kBlock = FC_SM90_BWD_KEY_BLOCK_OF(kHeadDim);
    return static_cast<int>((f.seqlen_k + kBlock - 1) / kBlock);
}

// Where 16-byte chunk `chunk` of padded row `row` lies in the dq accumulator's row: D=256's rows
// hold them permuted within each 128 bytes (c_src/launch_rules.h, sm90/bwd_d256.cuh).
template <int kHeadDim>
__host__ __device__ constexpr int dq_chunk_at(int64_t row, int chunk) {
    return kHeadDim == 256 ? chunk ^ static_cast<int>(row & 7) : chunk;
}

// The main kernel's dQ writer, once a tile's dQ reductions are complete: one more key block of
// the pair counted, released at GPU scope behind them (the bulk reductions write through the
// async proxy: the proxy fence orders them before the count).
__device__ __forceinline__ void count_key_block(int32_t *pair_done) {
    asm volatile("fence.proxy.async.global;\n" ::: "memory");
    asm volatile("red.release.gpu.global.add.s32 [%0], 1;\n" ::"l"(pair_done) : "memory");
}

// The dq conversion (one thread of a CTA): until the pair's count reaches `blocks`.
__device__ __forceinline__ void wait_for_key_blocks(const int32_t *pair_done, int blocks) {
    for (;;) {
        int counted;
        asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(counted) : "l"(pair_done) : "memory");
        if (counted >= blocks) return;
        __nanosleep(500);
    }
}

// Each thread reads 16 bytes of dO and of O. Grid over the padded rows (kPacked: one batch item).
template <typename Elem, int kHeadDim, bool kPacked = false>
__global__ void __launch_bounds__(128) row_terms_kernel(const fc_bwd_params p) {
    const fc_params &f = p.fwd;
    const Workspace ws = workspace_of<kPacked>(p);
    const RowLane<kHeadDim> lane;
    const int head = lane.head, batch = lane.batch, chunk = lane.chunk;
    const int64_t row = lane.row;
    const bool real = row < (kPacked ? f.total_q : f.seqlen_q);
    allow_dependent_grids();  // the main kernel may launch (it waits for this grid before reading)
    if (row == 0 && head == 0 && batch == 0 && chunk == 0) *ws.tile_counter = 0;
    if (!kPacked && row == 0 && chunk == 0) ws.key_blocks_done[batch * f.heads_q + head] = 0;
    float acc = row_dot_dout_out<Elem, kHeadDim>(real, chunk, [&] {
        const Elem *dout = static_cast<const Elem *>(p.dout) + batch * p.do_stride_b + head * p.do_stride_h +
                           row * p.do_stride_s;
        const Elem *out = static_cast<const Elem *>(f.out) + batch * f.o_stride_b + head * f.o_stride_h +
                          row * f.o_stride_s;
        return cuda::std::pair<const Elem *, const Elem *>(dout, out);
    });
    if (row >= ws.padded_seqlen) return;
    float4 *dq_row = reinterpret_cast<float4 *>(
        ws.dq_accum + ws.dq_at(static_cast<int64_t>(batch) * f.heads_q + head, row, kDqPitch<kHeadDim>));
    const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
    dq_row[2 * chunk] = dq_row[2 * chunk + 1] = zero;
    if constexpr (kDqPitch<kHeadDim> > kHeadDim)
        if (chunk == 0) dq_row[kHeadDim / 4] = dq_row[kHeadDim / 4 + 1] = zero;  // the row's padding
    if (chunk != 0) return;
    float lse2 = INFINITY;
    if (real) {
        if (p.dlse != nullptr) acc -= p.dlse[batch * p.dlse_stride_b + head * p.dlse_stride_h + row * p.dlse_stride_s];
        const float lse = f.lse[batch * f.lse_stride_b + head * f.lse_stride_h + row * f.lse_stride_s];
        if (lse != -INFINITY) lse2 = lse * kLog2e;
    }
    if constexpr (kPacked) {
        const int64_t at = ws.packed_delta_at(head, row);
        ws.row_terms[at] = acc;
        ws.row_terms[at + 1] = lse2;
    } else {
        const int64_t at = ws.delta_at(static_cast<int64_t>(batch) * f.heads_q + head, row);
        ws.row_terms[at] = acc;
        ws.row_terms[at + Workspace::kRowBlock] = lse2;
    }
}

// The conversion's CTAs: kConvertThreads threads, each converting kConvertChunks 8-column chunks
// (32 bytes of the accumulator each, all loaded before any is stored), so that a CTA converts
// ConvertTile<D>::kRows rows after one wait for their pair's count, with 4 KB in flight per warp
// (the conversion runs on the few SMs the main kernel's last tiles leave).
constexpr int kConvertThreads = 256, kConvertChunks = 4;
template <int kHeadDim>
struct ConvertTile {
    static constexpr int kChunksPerRow = kHeadDim / 8;
    static constexpr int kRows = kConvertThreads * kConvertChunks / kChunksPerRow;
};

// dq = scale * accumulator, in dq's dtype and strides. Grid: (rows / ConvertTile::kRows, query heads,
// batch) over Sq (kPacked: one batch item over total_q; rows of no sequence were never added to:
// zeros). Not packed, the CTA's rows are converted once their pair's count is complete (the main
// kernel may still run); a packed call's conversion runs after the main kernel.
template <typename Elem, int kHeadDim, bool kPacked = false>
__global__ void __launch_bounds__(kConvertThreads) dq_convert_kernel(const fc_bwd_params p) {
    using Shape = ConvertTile<kHeadDim>;
    const fc_params &f = p.fwd;
    const Workspace ws = workspace_of<kPacked>(p);
    const int head = blockIdx.y, batch = blockIdx.z;
    if constexpr (!kPacked) {
        const int group = static_cast<int>(f.heads_q / f.heads_kv), last_head = (head / group + 1) * group - 1;
        if (threadIdx.x == 0) wait_for_key_blocks(ws.key_blocks_done + batch * f.heads_q + last_head, key_blocks<kHeadDim>(f));
        __syncthreads();
    }
    const int64_t rows = kPacked ? f.total_q : f.seqlen_q;
    const int64_t first_row = static_cast<int64_t>(blockIdx.x) * Shape::kRows;
    const float *slice_acc = ws.dq_accum + ws.dq_at(static_cast<int64_t>(batch) * f.heads_q + head, 0, kDqPitch<kHeadDim>);
    float4 lo[kConvertChunks], hi[kConvertChunks];
#pragma unroll
    for (int i = 0; i < kConvertChunks; ++i) {
        const int c = threadIdx.x + i * kConvertThreads;
        const int64_t row = first_row + c / Shape::kChunksPerRow;
        if (row >= rows) continue;
        // (From L2: other SMs' reductions wrote it.)
        if constexpr (kHeadDim == 256) {  // (16-byte chunks permuted: dq_chunk_at)
            const float4 *acc = reinterpret_cast<const float4 *>(slice_acc + row * kDqPitch<kHeadDim>);
            const int chunk = c % Shape::kChunksPerRow * 2;
            lo[i] = __ldcg(acc + dq_chunk_at<kHeadDim>(row, chunk));
            hi[i] = __ldcg(acc + dq_chunk_at<kHeadDim>(row, chunk + 1));
        } else {
            const float *acc = slice_acc + row * kDqPitch<kHeadDim> + c % Shape::kChunksPerRow * 8;
            lo[i] = __ldcg(reinterpret_cast<const float4 *>(acc));
            hi[i] = __ldcg(reinterpret_cast<const float4 *>(acc + 4));
        }
    }
    const float s = f.scale;
    Elem *slice_dq = static_cast<Elem *>(p.dq) + batch * p.dq_stride_b + head * p.dq_stride_h;
#pragma unroll
    for (int i = 0; i < kConvertChunks; ++i) {
        const int c = threadIdx.x + i * kConvertThreads;
        const int64_t row = first_row + c / Shape::kChunksPerRow;
        if (row >= rows) continue;
        *reinterpret_cast<uint4 *>(slice_dq + row * p.dq_stride_s + c % Shape::kChunksPerRow * 8) =
            pack8_scaled<Elem>(lo[i], hi[i], s);
    }
}

}  // namespace sm90_bwd
}  // namespace flashcore
