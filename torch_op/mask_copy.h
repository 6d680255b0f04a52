// mask_copy.h - a bool attn_mask copied into the layout the Hopper family's mask tiles read: one
// row per query, rows of a 16-byte multiple (fc_mask_tiles_fit_ in c_src/dispatch.c).
// HuggingFace's mask for a length that is not a multiple of 16, a key-padding mask (B, 1, 1, Sk)
// broadcast over the queries and a mask with strided keys have no such layout; where a copy is
// all the Hopper family lacks, the forward (flashcore_op.cpp) and the backward
// (flashcore_bwd_op.cpp) run on one. The copy costs one pass over the mask.
// Header-only, stable ABI only.
#pragma once

#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>

#include <algorithm>
#include <cstdint>

#include "flashcore.h"
#include "op_common.h"  // stand_in

namespace flashcore_op {

// The copy: (batch, heads, Sq, row) bytes, batch and heads 1 where the mask broadcasts them, the
// keys at the front of each row (the rest is never read: the kernels' key extent is Sk).
struct MaskCopy {
  bool planned = false;
  int64_t batch = 0, heads = 0, row = 0;
};

// The copy's layout for p's bool mask, and `probe` = p with its mask fields describing the copy
// at a stand-in address (the caching allocator's 512-byte alignment), for a support query.
// Not planned for one query row: the Hopper family reads one row per 128-row tile there, slower
// than PyTorch's decoding kernels (docs/experiments/forward-masks.md).
inline MaskCopy mask_copy_layout(const torch::stable::Tensor& mask, const fc_params& p, fc_params* probe) {
  MaskCopy c;
  if (p.mask_kind != FC_MASK_BOOL || p.seqlen_q <= 1) return c;
  const int64_t nd = mask.dim();
  c.batch = nd == 4 && mask.size(0) != 1 ? p.batch : 1;
  c.heads = nd >= 3 && mask.size(nd - 3) != 1 ? p.heads_q : 1;
  c.row = (p.seqlen_k + 15) / 16 * 16;
  *probe = p;
  probe->mask = stand_in<const void>();
  probe->mask_stride_k = 1;
  probe->mask_stride_q = c.row;
  probe->mask_stride_h = c.heads > 1 ? p.seqlen_q * c.row : 0;
  probe->mask_stride_b = c.batch > 1 ? c.heads * p.seqlen_q * c.row : 0;
  c.planned = true;
  return c;
}

// The bytes a bool mask's view spans in memory (an expanded view's stride-0 dims span nothing).
inline double mask_bytes_in_memory(const torch::stable::Tensor& mask) {
  double span = 1.0;
  for (int64_t i = 0; i < mask.dim(); ++i) {
    if (mask.size(i) == 0) return 0.0;
    span += double(mask.size(i) - 1) * double(mask.stride(i) > 0 ? mask.stride(i) : -mask.stride(i));
  }
  return span;
}

// Whether the copy is worth its memory: no larger than q, k, v and the output together, or twice
// the mask's own bytes in memory (a key-padding mask over a long call, or one expanded over the
// queries, would otherwise become many times the activations).
inline bool mask_copy_affordable(const MaskCopy& c, const torch::stable::Tensor& mask, const fc_params& p) {
  const double copy_bytes = double(c.batch) * c.heads * p.seqlen_q * c.row;
  const double elem = p.dtype == FC_DTYPE_FP32 ? 4.0 : 2.0;
  const double call_bytes =
      elem * p.head_dim * (2.0 * p.batch * p.heads_q * p.seqlen_q + 2.0 * p.batch * p.heads_kv * p.seqlen_k);
  return copy_bytes <= std::max(call_bytes, 2.0 * mask_bytes_in_memory(mask));
}

// Makes the copy on the current stream and points p's mask at it (p: the probe of
// mask_copy_layout, whose strides describe the copy). The caller keeps the tensor until the
// kernel is queued (the allocator then frees it in stream order).
inline torch::stable::Tensor make_mask_copy(const MaskCopy& c, const torch::stable::Tensor& mask, fc_params* p) {
  torch::stable::Tensor wide = torch::stable::empty({c.batch, c.heads, p->seqlen_q, c.row},
                                                    torch::headeronly::ScalarType::Bool, std::nullopt,
                                                    mask.device());
  torch::stable::Tensor keys = torch::stable::narrow(wide, 3, 0, p->seqlen_k);
  torch::stable::copy_(keys, mask);  // (copy_ broadcasts the mask's size-1 dims)
  p->mask = wide.data_ptr();
  return wide;
}

}  // namespace flashcore_op
