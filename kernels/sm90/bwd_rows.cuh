// sm90/bwd_rows.cuh - the Hopper backward's row-wise kernels around its main kernel
// (sm90/bwd_kernel.cuh), over the workspace laid out in c_src/launch_rules.h
// (fc_sm90_bwd_workspace_bytes): per (batch, query head) the query rows are padded to a multiple
// of the main kernel's query tile, so that each tile's row terms are one aligned bulk copy.
//
//   row_terms_kernel (before): delta = rowsum(dO * O) - dLSE and LSE in base-2 units, fp32,
//       for every padded row, and the row of the dq accumulator zeroed (and the main kernel's
//       tile counter). Rows past Sq get delta 0
//       and LSE +inf, so their P = exp2(s - inf) is 0 and they add nothing; a row whose LSE is
//       -inf (nothing attended) gets +inf too.
//   dq_convert_kernel (after): dq = scale * (the fp32 dq accumulator), in dq's dtype and strides.
//
// kPacked (fc_params.cu_seq_q): the rows are the packed rows of all sequences, one slice per query
// head (fc_sm90_bwd_varlen_workspace_bytes): the row terms [Hq][R][delta, LSE2] and the
// accumulator [Hq][R]; R covers every row a query step reads (its first row may be any), and every
// one of them is written (rows past total_q: delta 0, LSE2 +inf, as padded rows are).
#pragma once

#include "common/bwd_delta.cuh"
#include "common/sm80_ptx.cuh"  // pack2
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
// Floats per row of the dq accumulator (its rows are padded like the kernel's staging).
template <int kHeadDim>
constexpr int kDqPitch = kHeadDim + FC_SM90_BWD_DQ_PAD;
template <bool kPacked = false>
__host__ __device__ inline Workspace workspace_of(const fc_bwd_params &p) {
    const int64_t padded = kPacked ? fc_sm90_bwd_varlen_rows(p.fwd.total_q) : fc_sm90_bwd_padded_seqlen(&p.fwd);
    const int64_t rows = (kPacked ? 1 : p.fwd.batch) * p.fwd.heads_q * padded;
    // (kPacked: the key-block list comes first.)
    float *base = reinterpret_cast<float *>(static_cast<unsigned char *>(p.workspace) +
                                            (kPacked ? fc_sm90_bwd_varlen_list_bytes(&p.fwd) : 0));
    float *dq_accum = base + 2 * rows;
    int32_t *tile_counter = reinterpret_cast<int32_t *>(dq_accum + rows * (p.fwd.head_dim + FC_SM90_BWD_DQ_PAD));
    return Workspace{base, dq_accum, tile_counter, padded};
}

// What a thread of the row-wise kernels takes: kHeadDim / 8 consecutive threads per row, each a
// 16-byte chunk of it. Grid: (rows / kRowsPerCta, query heads, batch) CTAs of 128 threads.
template <int kHeadDim>
struct RowLane {
    static constexpr int kThreadsPerRow = kHeadDim / 8;
    static constexpr int kRowsPerCta = 128 / kThreadsPerRow;
    int head = blockIdx.y, batch = blockIdx.z, chunk = threadIdx.x % kThreadsPerRow;
    int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerCta + threadIdx.x / kThreadsPerRow;
};

// Each thread reads 16 bytes of dO and of O. Grid over the padded rows (kPacked: one batch item).
template <typename Elem, int kHeadDim, bool kPacked = false>
__global__ void __launch_bounds__(128) row_terms_kernel(const fc_bwd_params p) {
    const fc_params &f = p.fwd;
    const Workspace ws = workspace_of<kPacked>(p);
    const RowLane<kHeadDim> lane;
    const int head = lane.head, batch = lane.batch, chunk = lane.chunk;
    const int64_t row = lane.row;
    const bool real = row < (kPacked ? f.total_q : f.seqlen_q);
    if (row == 0 && head == 0 && batch == 0 && chunk == 0) *ws.tile_counter = 0;
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

// Each thread converts 8 consecutive columns of one row. Grid as row_terms_kernel's, over Sq
// (kPacked: over total_q; rows of no sequence were never added to: zeros).
template <typename Elem, int kHeadDim, bool kPacked = false>
__global__ void __launch_bounds__(128) dq_convert_kernel(const fc_bwd_params p) {
    const fc_params &f = p.fwd;
    const Workspace ws = workspace_of<kPacked>(p);
    const RowLane<kHeadDim> lane;
    const int head = lane.head, batch = lane.batch, chunk = lane.chunk;
    const int64_t row = lane.row;
    if (row >= (kPacked ? f.total_q : f.seqlen_q)) return;
    const float *acc =
        ws.dq_accum + ws.dq_at(static_cast<int64_t>(batch) * f.heads_q + head, row, kDqPitch<kHeadDim>) + chunk * 8;
    const float4 lo = *reinterpret_cast<const float4 *>(acc), hi = *reinterpret_cast<const float4 *>(acc + 4);
    const float s = f.scale;
    uint4 packed;
    packed.x = pack2<Elem>(lo.x * s, lo.y * s);
    packed.y = pack2<Elem>(lo.z * s, lo.w * s);
    packed.z = pack2<Elem>(hi.x * s, hi.y * s);
    packed.w = pack2<Elem>(hi.z * s, hi.w * s);
    Elem *dq = static_cast<Elem *>(p.dq) + batch * p.dq_stride_b + head * p.dq_stride_h + row * p.dq_stride_s;
    *reinterpret_cast<uint4 *>(dq + chunk * 8) = packed;
}

}  // namespace sm90_bwd
}  // namespace flashcore
