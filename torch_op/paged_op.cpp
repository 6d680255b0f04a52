// paged_op.cpp - flashcore::_paged_decode: one query row per sequence against a paged KV cache,
// in one launch of the decode kernels (fc_params.block_table, c_src/flashcore.h). A library
// fragment on PyTorch's stable ABI, beside flashcore_op.cpp.
//
//   _paged_decode(Tensor q, Tensor key_pages, Tensor value_pages, Tensor block_table,
//                 Tensor seqused_k, float scale) -> (Tensor out, Tensor lse)
//
//   q            (N, Hq, D) fp16 / bf16, last dim contiguous: sequence i's one query row
//   key_pages,   (num_pages, page_size, Hkv, D), q's dtype, last dim contiguous; page_size a
//   value_pages  multiple of 16; Hq a multiple of Hkv
//   block_table  (N, W) int32, last dim contiguous: key t of sequence i is row t % page_size of
//                page block_table[i, t / page_size] (entries past a sequence's keys are never
//                read; out-of-range entries read a clamped page, never outside the pools)
//   seqused_k    (N,) int32: keys of sequence i (at most W * page_size; more are not read)
//   out          (N, Hq, D) contiguous; lse (Hq, N) float32, natural log (varlen_attn's layout).
//   A sequence with no key gives zeros and LSE -inf (SDPA's convention; flashcore.varlen_attn
//   turns it into +inf, its own).
// Private: python/flashcore/varlen.py calls it (_fused_paged_decode) for the calls it takes, and
// registers its fake. CUDA only: on other devices the same function raises after the argument
// checks, so the checks can be tested anywhere. Anything the C layer declines (head dims other
// than 64 / 128, more than 32 rows per KV head, ...) raises with the C layer's sentence: there is
// no fallback here; the caller decides beforehand.
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <tuple>

#include "flashcore.h"
#include "op_common.h"

namespace {

using flashcore_op::fail;
using flashcore_op::stride_or_0;
using torch::headeronly::ScalarType;
using torch::stable::Tensor;

constexpr const char* kOp = "flashcore._paged_decode";

void check_arguments(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& table,
                     const Tensor& used, double scale) {
  if (q.dim() != 3) fail(kOp, ": q must be 3-D (N, Hq, D), got ", q.dim(), " dims");
  if (q.scalar_type() != ScalarType::Half && q.scalar_type() != ScalarType::BFloat16)
    fail(kOp, ": q must be float16 or bfloat16");
  const Tensor* kv[2] = {&k, &v};
  const char* kv_names[2] = {"key_pages", "value_pages"};
  for (int i = 0; i < 2; ++i) {
    const Tensor& t = *kv[i];
    if (t.dim() != 4) fail(kOp, ": ", kv_names[i], " must be 4-D (num_pages, page_size, Hkv, D), got ", t.dim(), " dims");
    if (t.scalar_type() != q.scalar_type()) fail(kOp, ": ", kv_names[i], " must have q's dtype");
    if (t.size(3) != q.size(2))
      fail(kOp, ": ", kv_names[i], "'s head dim (", t.size(3), ") must equal q's (", q.size(2), ")");
  }
  for (int d = 0; d < 4; ++d)
    if (v.size(d) != k.size(d)) fail(kOp, ": value_pages must have key_pages' shape");
  const int64_t n = q.size(0), hq = q.size(1), hkv = k.size(2), page_size = k.size(1);
  if (hkv < 1 || hq % hkv != 0)
    fail(kOp, ": q's heads (", hq, ") must be a multiple of key_pages' (", hkv, ")");
  if (page_size < 1 || page_size % 16 != 0)
    fail(kOp, ": key_pages' page size (dim 1) must be a positive multiple of 16, got ", page_size);
  if (table.dim() != 2 || table.scalar_type() != ScalarType::Int)
    fail(kOp, ": block_table must be a 2-D int32 tensor (N, pages per sequence)");
  if (table.size(0) != n) fail(kOp, ": block_table must have one row per query (", n, "), got ", table.size(0));
  if (table.size(1) > 1 && table.stride(1) != 1) fail(kOp, ": block_table's rows must be contiguous");
  if (used.dim() != 1 || used.scalar_type() != ScalarType::Int || used.size(0) != n)
    fail(kOp, ": seqused_k must be a 1-D int32 tensor of N = ", n, " entries");
  if (!std::isfinite(scale)) fail(kOp, ": scale must be finite, got ", scale);
  const Tensor* all[5] = {&q, &k, &v, &table, &used};
  const char* names[5] = {"q", "key_pages", "value_pages", "block_table", "seqused_k"};
  for (int i = 0; i < 5; ++i) {
    if (!all[i]->is_cuda()) fail(kOp, ": ", names[i], " must be a CUDA tensor (this op runs on CUDA only)");
    if (all[i]->get_device_index() != q.get_device_index())
      fail(kOp, ": ", names[i], " must be on q's device (cuda:", q.get_device_index(), ")");
  }
}

std::tuple<Tensor, Tensor> paged_decode(Tensor q, Tensor key_pages, Tensor value_pages, Tensor block_table,
                                        Tensor seqused_k, double scale) {
  check_arguments(q, key_pages, value_pages, block_table, seqused_k, scale);
  const int32_t dev = q.get_device_index();
  torch::stable::accelerator::DeviceGuard guard(dev);
  const int64_t n = q.size(0), hq = q.size(1), d = q.size(2);
  Tensor out = torch::stable::empty({n, hq, d}, q.scalar_type(), std::nullopt, q.device());
  Tensor lse = torch::stable::empty({hq, n}, ScalarType::Float, std::nullopt, q.device());
  const int64_t page_size = key_pages.size(1), width = block_table.size(1);
  if (n == 0 || hq == 0 || d == 0) return {out, lse};
  if (width == 0 || key_pages.size(0) == 0) {  // no key anywhere
    torch::stable::zero_(out);
    torch::stable::fill_(lse, -std::numeric_limits<double>::infinity());
    return {out, lse};
  }
  if (width > std::numeric_limits<int32_t>::max() / page_size)
    fail(kOp, ": block_table has too many pages per sequence (", width, " of ", page_size, " keys)");

  fc_params p;
  fc_params_init(&p);
  p.q = q.data_ptr();
  p.k = key_pages.data_ptr();
  p.v = value_pages.data_ptr();
  p.out = out.data_ptr();
  p.lse = static_cast<float*>(lse.data_ptr());
  p.batch = n;
  p.heads_q = hq;
  p.heads_kv = key_pages.size(2);
  p.seqlen_q = 1;
  p.seqlen_k = width * page_size;  // each sequence: min(this, seqused_k[i]) keys
  p.head_dim = d;
  p.q_stride_b = stride_or_0(q, 0), p.q_stride_h = stride_or_0(q, 1), p.q_stride_s = 0, p.q_stride_d = stride_or_0(q, 2);
  p.o_stride_b = hq * d, p.o_stride_h = d, p.o_stride_s = 0, p.o_stride_d = 1;
  // (num_pages, page_size, Hkv, D): the page stride in the batch stride's place (flashcore.h).
  p.k_stride_b = stride_or_0(key_pages, 0), p.k_stride_s = stride_or_0(key_pages, 1);
  p.k_stride_h = stride_or_0(key_pages, 2), p.k_stride_d = stride_or_0(key_pages, 3);
  p.v_stride_b = stride_or_0(value_pages, 0), p.v_stride_s = stride_or_0(value_pages, 1);
  p.v_stride_h = stride_or_0(value_pages, 2), p.v_stride_d = stride_or_0(value_pages, 3);
  p.lse_stride_b = 1, p.lse_stride_h = n, p.lse_stride_s = 0;
  p.scale = static_cast<float>(scale);
  p.dtype = q.scalar_type() == ScalarType::Half ? FC_DTYPE_FP16 : FC_DTYPE_BF16;
  p.block_table = static_cast<const int32_t*>(block_table.data_ptr());
  p.block_table_stride = n > 1 ? block_table.stride(0) : width;
  p.pages_per_seq = static_cast<int32_t>(width);
  p.page_size = static_cast<int32_t>(page_size);
  p.num_pages = key_pages.size(0);
  p.seqused_k = static_cast<const int32_t*>(seqused_k.data_ptr());
  // (A 1-element seqused_k's stride is irrelevant; a longer one must be contiguous.)
  if (n > 1 && seqused_k.stride(0) != 1) fail(kOp, ": seqused_k must be contiguous");

  const flashcore_op::DeviceFacts facts = flashcore_op::device_facts(dev);
  fc_fwd_plan plan;
  const fc_status s = fc_sdpa_plan(&p, facts.major, facts.minor, facts.sm_count, &plan);
  if (s != FC_OK) fail(kOp, ": no kernel takes this call: ", fc_status_string(s));
  std::optional<Tensor> workspace;
  if (plan.workspace_bytes > 0)
    workspace = torch::stable::empty({plan.workspace_bytes}, ScalarType::Byte, std::nullopt, q.device());
  flashcore_op::run_planned(kOp, dev, plan, out.data_ptr(), static_cast<float*>(lse.data_ptr()),
                            workspace.has_value() ? workspace->data_ptr() : nullptr);
  return {out, lse};
}

}  // namespace

STABLE_TORCH_LIBRARY_FRAGMENT(flashcore, m) {
  m.def("_paged_decode(Tensor q, Tensor key_pages, Tensor value_pages, Tensor block_table, "
        "Tensor seqused_k, float scale) -> (Tensor, Tensor)");
}

// CUDA runs it; CPU (and any tensors on the CPU key) only gets the argument checks' errors.
STABLE_TORCH_LIBRARY_IMPL(flashcore, CUDA, m) { m.impl("_paged_decode", TORCH_BOX(&paged_decode)); }
STABLE_TORCH_LIBRARY_IMPL(flashcore, CPU, m) { m.impl("_paged_decode", TORCH_BOX(&paged_decode)); }
