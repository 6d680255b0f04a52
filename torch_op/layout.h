// layout.h - where the op library's 4-D results lie in memory: (B, H, S, D) tensors over storage
// ordered as a given input's (the output as the query, dq as the query, dk as the key, dv as
// the value). Batch, head and sequence dims in the order of that input's strides (largest
// first, equal strides keeping the order B, H, S), head_dim innermost, densely packed: the rule
// of PyTorch's cuDNN and flash backends (forward and backward), so a fallback keeps aten's
// results as they are and a caller gets what PyTorch's SDPA would give (HuggingFace's
// transposed views: (B, S, H, D) storage, whose usual next step out.transpose(1, 2).reshape(B,
// S, H * D) is a view, and whose gradients reach the projections without a copy).
// python/flashcore/_layout.py is the same rule for the fakes. Header-only, stable ABI only.
#pragma once

#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <utility>

namespace flashcore_op {

using torch::stable::Tensor;

// `like`'s dims 0, 1, 2 (batch, heads, sequence), outermost first (the contiguous order for a
// tensor of another rank).
inline std::array<int, 3> output_order(const Tensor& like) {
  std::array<int, 3> order = {0, 1, 2};
  if (like.dim() != 4) return order;
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return like.stride(a) > like.stride(b); });
  return order;
}

// The strides of a (B, H, S, D) result laid out as `like` (torch.empty's, which count an empty
// dim as 1).
inline std::array<int64_t, 4> output_strides(const Tensor& like, int64_t B, int64_t H, int64_t S,
                                             int64_t D) {
  const int64_t sizes[4] = {B, H, S, D};
  std::array<int64_t, 4> strides = {0, 0, 0, 1};
  int64_t step = std::max<int64_t>(D, 1);
  const std::array<int, 3> order = output_order(like);
  for (int p = 2; p >= 0; --p) {
    strides[order[p]] = step;
    step *= std::max<int64_t>(sizes[order[p]], 1);
  }
  return strides;
}

// An uninitialised (B, H, S, D) result laid out as `like`, in `like`'s dtype and device: storage
// allocated in `like`'s order, then transposed back to (B, H, S, D).
inline Tensor new_output(int64_t B, int64_t H, int64_t S, int64_t D, const Tensor& like) {
  const int64_t sizes[3] = {B, H, S};
  std::array<int, 3> held = output_order(like);  // held[p]: the dim at storage position p
  Tensor out = torch::stable::empty({sizes[held[0]], sizes[held[1]], sizes[held[2]], D},
                                    like.scalar_type(), std::nullopt, like.device());
  for (int dim = 0; dim < 3; ++dim) {
    int p = dim;
    while (held[p] != dim) ++p;
    if (p != dim) {
      out = torch::stable::transpose(out, dim, p);
      std::swap(held[dim], held[p]);
    }
  }
  return out;
}

// aten's output in new_output's layout for query q: as it is where it already has those strides
// (sizes of 1 included, so the fake's strides always hold), else copied; other ranks contiguous.
inline Tensor in_output_layout(const Tensor& aten_out, const Tensor& q) {
  if (aten_out.dim() != 4) return torch::stable::contiguous(aten_out);
  const int64_t B = aten_out.size(0), H = aten_out.size(1), S = aten_out.size(2),
                D = aten_out.size(3);
  const std::array<int64_t, 4> want = output_strides(q, B, H, S, D);
  bool same = true;
  for (int i = 0; i < 4; ++i) same = same && aten_out.stride(i) == want[i];
  if (same) return aten_out;
  Tensor out = new_output(B, H, S, D, q);
  torch::stable::copy_(out, aten_out);
  return out;
}

}  // namespace flashcore_op
