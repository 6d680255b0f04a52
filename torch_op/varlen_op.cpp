// varlen_op.cpp - flashcore::_varlen_fwd and _varlen_bwd: attention over sequences packed along
// the rows, forward and backward, each in one launch of the Hopper family (fc_params.cu_seq_q,
// c_src/flashcore.h). A library fragment on PyTorch's stable ABI, beside flashcore_op.cpp and
// paged_op.cpp.
//
//   _varlen_fwd(Tensor q, Tensor k, Tensor v, Tensor cu_seq_q, Tensor cu_seq_k, int max_q,
//               int max_k, bool is_causal, float scale) -> (Tensor out, Tensor lse)
//
//   q          (T_q, Hq, D) fp16 / bf16, last dim contiguous
//   k, v       (T_k, Hkv, D), q's dtype, last dim contiguous; Hq a multiple of Hkv
//   cu_seq_q,  (N + 1,) int32, contiguous: sequence i is rows cu_seq_q[i] .. cu_seq_q[i+1] - 1 of
//   cu_seq_k   q and cu_seq_k[i] .. cu_seq_k[i+1] - 1 of k and v (values never read on the host;
//              the kernels clamp them into the tensors)
//   max_q,     at least 1: bounds of the sequences' lengths (the C layer's seqlen_q / seqlen_k)
//   max_k
//   is_causal  top-left within each sequence (query i sees keys 0 .. i)
//   out        (T_q, Hq, D) contiguous; lse (Hq, T_q) float32, natural log (varlen_attn's layout).
//   Rows outside every sequence are not written. A sequence with queries and no key gives zeros
//   and LSE -inf (SDPA's convention; flashcore.varlen_attn turns it into +inf, its own).
//
//   _varlen_bwd(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse,
//               Tensor? grad_lse, Tensor cu_seq_q, Tensor cu_seq_k, int max_q, int max_k,
//               bool is_causal, float scale) -> (Tensor dq, Tensor dk, Tensor dv)
//
//   grad_out, out  (T_q, Hq, D) in q's dtype, last dim contiguous, rows 16-byte aligned
//   lse, grad_lse  (Hq, T_q) float32 (the forward's natural-log LSE; +inf or -inf: the row saw
//                  nothing); the rest as _varlen_fwd's. dq (T_q, Hq, D), dk and dv (T_k, Hkv, D)
//                  contiguous; rows outside every sequence: dq zeros, dk and dv not written.
// Private: python/flashcore/varlen.py calls them (_fused_varlen_fwd, _fused_varlen_bwd) for the calls it takes, and
// registers its fake. CUDA only: on other devices the same function raises after the argument
// checks. Anything the C layer declines (another architecture, head dim, ...) raises with the C
// layer's sentence: the caller decides beforehand.
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <tuple>

#include "flashcore.h"
#include "op_common.h"

namespace {

using flashcore_op::fail;
using flashcore_op::stride_or_0;
using torch::headeronly::ScalarType;
using torch::stable::Tensor;

constexpr const char* kOp = "flashcore._varlen_fwd";

void check_arguments(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_q, const Tensor& cu_k,
                     int64_t max_q, int64_t max_k, double scale) {
  const Tensor* qkv[3] = {&q, &k, &v};
  const char* qkv_names[3] = {"q", "k", "v"};
  for (int i = 0; i < 3; ++i) {
    const Tensor& t = *qkv[i];
    if (t.dim() != 3) fail(kOp, ": ", qkv_names[i], " must be 3-D (rows, heads, head dim), got ", t.dim(), " dims");
    if (t.scalar_type() != ScalarType::Half && t.scalar_type() != ScalarType::BFloat16)
      fail(kOp, ": ", qkv_names[i], " must be float16 or bfloat16");
    if (t.scalar_type() != q.scalar_type()) fail(kOp, ": ", qkv_names[i], " must have q's dtype");
    if (t.size(2) != q.size(2)) fail(kOp, ": ", qkv_names[i], "'s head dim (", t.size(2), ") must equal q's (", q.size(2), ")");
  }
  if (v.size(0) != k.size(0) || v.size(1) != k.size(1)) fail(kOp, ": v must have k's shape");
  if (k.size(1) < 1 || q.size(1) % k.size(1) != 0)
    fail(kOp, ": q's heads (", q.size(1), ") must be a multiple of k's (", k.size(1), ")");
  const Tensor* cu[2] = {&cu_q, &cu_k};
  const char* cu_names[2] = {"cu_seq_q", "cu_seq_k"};
  for (int i = 0; i < 2; ++i) {
    const Tensor& t = *cu[i];
    if (t.dim() != 1 || t.scalar_type() != ScalarType::Int || t.size(0) < 1)
      fail(kOp, ": ", cu_names[i], " must be a 1-D int32 tensor of N + 1 offsets");
    if (t.size(0) > 1 && t.stride(0) != 1) fail(kOp, ": ", cu_names[i], " must be contiguous");
  }
  if (cu_k.size(0) != cu_q.size(0)) fail(kOp, ": cu_seq_k must have cu_seq_q's length (", cu_q.size(0), ")");
  if (max_q < 1 || max_k < 1) fail(kOp, ": max_q and max_k must be at least 1, got ", max_q, " and ", max_k);
  if (!std::isfinite(scale)) fail(kOp, ": scale must be finite, got ", scale);
  const Tensor* all[5] = {&q, &k, &v, &cu_q, &cu_k};
  const char* names[5] = {"q", "k", "v", "cu_seq_q", "cu_seq_k"};
  for (int i = 0; i < 5; ++i) {
    if (!all[i]->is_cuda()) fail(kOp, ": ", names[i], " must be a CUDA tensor (this op runs on CUDA only)");
    if (all[i]->get_device_index() != q.get_device_index())
      fail(kOp, ": ", names[i], " must be on q's device (cuda:", q.get_device_index(), ")");
  }
}

// The fields of a packed call both passes share: Q, K and V (rows in the sequence stride's place,
// no batch stride: flashcore.h, fc_params.cu_seq_q), the offsets, lengths, scale, causal, dtype.
// The caller adds the output and LSE (forward) or takes them as inputs (backward).
void fill_packed_params(fc_params& p, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_seq_q,
                        const Tensor& cu_seq_k, int64_t max_q, int64_t max_k, bool is_causal, double scale) {
  p.q = q.data_ptr();
  p.k = k.data_ptr();
  p.v = v.data_ptr();
  p.batch = cu_seq_q.size(0) - 1;
  p.heads_q = q.size(1);
  p.heads_kv = k.size(1);
  p.seqlen_q = max_q;
  p.seqlen_k = max_k;
  p.head_dim = q.size(2);
  p.q_stride_s = stride_or_0(q, 0), p.q_stride_h = stride_or_0(q, 1), p.q_stride_d = stride_or_0(q, 2);
  p.k_stride_s = stride_or_0(k, 0), p.k_stride_h = stride_or_0(k, 1), p.k_stride_d = stride_or_0(k, 2);
  p.v_stride_s = stride_or_0(v, 0), p.v_stride_h = stride_or_0(v, 1), p.v_stride_d = stride_or_0(v, 2);
  p.scale = static_cast<float>(scale);
  p.causal = is_causal ? 1 : 0;
  p.dtype = q.scalar_type() == ScalarType::Half ? FC_DTYPE_FP16 : FC_DTYPE_BF16;
  p.cu_seq_q = static_cast<const int32_t*>(cu_seq_q.data_ptr());
  p.cu_seq_k = static_cast<const int32_t*>(cu_seq_k.data_ptr());
  p.total_q = q.size(0);
  p.total_k = k.size(0);
}

std::tuple<Tensor, Tensor> varlen_fwd(Tensor q, Tensor k, Tensor v, Tensor cu_seq_q, Tensor cu_seq_k, int64_t max_q,
                                      int64_t max_k, bool is_causal, double scale) {
  check_arguments(q, k, v, cu_seq_q, cu_seq_k, max_q, max_k, scale);
  const int32_t dev = q.get_device_index();
  torch::stable::accelerator::DeviceGuard guard(dev);
  const int64_t total_q = q.size(0), hq = q.size(1), d = q.size(2), batch = cu_seq_q.size(0) - 1;
  Tensor out = torch::stable::empty({total_q, hq, d}, q.scalar_type(), std::nullopt, q.device());
  Tensor lse = torch::stable::empty({hq, total_q}, ScalarType::Float, std::nullopt, q.device());
  if (total_q == 0 || hq == 0 || d == 0 || batch == 0) return {out, lse};
  if (k.size(0) == 0) {  // no key anywhere
    torch::stable::zero_(out);
    torch::stable::fill_(lse, -INFINITY);
    return {out, lse};
  }

  fc_params p;
  fc_params_init(&p);
  fill_packed_params(p, q, k, v, cu_seq_q, cu_seq_k, max_q, max_k, is_causal, scale);
  p.out = out.data_ptr();
  p.lse = static_cast<float*>(lse.data_ptr());
  p.o_stride_s = hq * d, p.o_stride_h = d, p.o_stride_d = 1;
  p.lse_stride_h = total_q, p.lse_stride_s = 1;

  const flashcore_op::DeviceFacts facts = flashcore_op::device_facts(dev);
  fc_fwd_plan plan;
  const fc_status s = fc_sdpa_plan(&p, facts.major, facts.minor, facts.sm_count, &plan);
  if (s != FC_OK) fail(kOp, ": no kernel takes this call: ", fc_status_string(s));
  Tensor workspace = torch::stable::empty({plan.workspace_bytes}, ScalarType::Byte, std::nullopt, q.device());
  flashcore_op::run_planned(kOp, dev, plan, out.data_ptr(), static_cast<float*>(lse.data_ptr()), workspace.data_ptr());
  return {out, lse};
}

constexpr const char* kBwdOp = "flashcore._varlen_bwd";

// grad_out and out as q; lse and grad_lse (Hq, T_q) float32; all on q's device.
void check_bwd_operands(const Tensor& dout, const Tensor& q, const Tensor& out, const Tensor& lse,
                        const std::optional<Tensor>& dlse) {
  const Tensor* rows[2] = {&dout, &out};
  const char* row_names[2] = {"grad_out", "out"};
  for (int i = 0; i < 2; ++i) {
    const Tensor& t = *rows[i];
    if (t.dim() != 3 || t.size(0) != q.size(0) || t.size(1) != q.size(1) || t.size(2) != q.size(2))
      fail(kBwdOp, ": ", row_names[i], " must have q's shape (T_q, Hq, D)");
    if (t.scalar_type() != q.scalar_type()) fail(kBwdOp, ": ", row_names[i], " must have q's dtype");
  }
  const Tensor* terms[2] = {&lse, dlse.has_value() ? &*dlse : nullptr};
  const char* term_names[2] = {"lse", "grad_lse"};
  for (int i = 0; i < 2; ++i) {
    if (terms[i] == nullptr) continue;
    const Tensor& t = *terms[i];
    if (t.dim() != 2 || t.size(0) != q.size(1) || t.size(1) != q.size(0) || t.scalar_type() != ScalarType::Float)
      fail(kBwdOp, ": ", term_names[i], " must be float32 of shape (Hq, T_q)");
  }
  const Tensor* all[4] = {&dout, &out, &lse, dlse.has_value() ? &*dlse : nullptr};
  const char* names[4] = {"grad_out", "out", "lse", "grad_lse"};
  for (int i = 0; i < 4; ++i) {
    if (all[i] == nullptr) continue;
    if (!all[i]->is_cuda() || all[i]->get_device_index() != q.get_device_index())
      fail(kBwdOp, ": ", names[i], " must be a CUDA tensor on q's device (cuda:", q.get_device_index(), ")");
  }
}

std::tuple<Tensor, Tensor, Tensor> varlen_bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse,
                                              std::optional<Tensor> dlse, Tensor cu_seq_q, Tensor cu_seq_k,
                                              int64_t max_q, int64_t max_k, bool is_causal, double scale) {
  check_arguments(q, k, v, cu_seq_q, cu_seq_k, max_q, max_k, scale);
  check_bwd_operands(dout, q, out, lse, dlse);
  const int32_t dev = q.get_device_index();
  torch::stable::accelerator::DeviceGuard guard(dev);
  const int64_t total_q = q.size(0), hq = q.size(1), d = q.size(2), batch = cu_seq_q.size(0) - 1;
  const int64_t total_k = k.size(0), hkv = k.size(1);
  Tensor dq = torch::stable::empty({total_q, hq, d}, q.scalar_type(), std::nullopt, q.device());
  Tensor dk = torch::stable::empty({total_k, hkv, d}, q.scalar_type(), std::nullopt, q.device());
  Tensor dv = torch::stable::empty({total_k, hkv, d}, q.scalar_type(), std::nullopt, q.device());
  if (total_q == 0 || total_k == 0 || hq == 0 || d == 0 || batch == 0) {  // nothing attends
    torch::stable::zero_(dq);
    torch::stable::zero_(dk);
    torch::stable::zero_(dv);
    return {dq, dk, dv};
  }

  fc_bwd_params b;
  fc_bwd_params_init(&b);
  fc_params& p = b.fwd;
  fill_packed_params(p, q, k, v, cu_seq_q, cu_seq_k, max_q, max_k, is_causal, scale);
  p.out = out.data_ptr();
  p.lse = static_cast<float*>(lse.data_ptr());
  p.o_stride_s = stride_or_0(out, 0), p.o_stride_h = stride_or_0(out, 1), p.o_stride_d = stride_or_0(out, 2);
  p.lse_stride_h = stride_or_0(lse, 0), p.lse_stride_s = stride_or_0(lse, 1);
  b.dout = dout.data_ptr();
  b.do_stride_s = stride_or_0(dout, 0), b.do_stride_h = stride_or_0(dout, 1), b.do_stride_d = stride_or_0(dout, 2);
  if (dlse.has_value()) {
    b.dlse = static_cast<const float*>(dlse->data_ptr());
    b.dlse_stride_h = stride_or_0(*dlse, 0), b.dlse_stride_s = stride_or_0(*dlse, 1);
  }
  b.dq = dq.data_ptr();
  b.dk = dk.data_ptr();
  b.dv = dv.data_ptr();
  b.dq_stride_s = hq * d, b.dq_stride_h = d, b.dq_stride_d = 1;
  b.dk_stride_s = b.dv_stride_s = hkv * d, b.dk_stride_h = b.dv_stride_h = d, b.dk_stride_d = b.dv_stride_d = 1;

  int64_t ws_bytes = 0;
  const fc_status s = fc_sdpa_bwd_workspace_size(&b, &ws_bytes);
  if (s != FC_OK) fail(kBwdOp, ": no kernel takes this call: ", fc_status_string(s));
  Tensor workspace = torch::stable::empty({ws_bytes}, ScalarType::Byte, std::nullopt, q.device());
  b.workspace = workspace.data_ptr();
  b.workspace_bytes = ws_bytes;
  flashcore_op::run_bwd(kBwdOp, dev, b);
  return {dq, dk, dv};
}

}  // namespace

STABLE_TORCH_LIBRARY_FRAGMENT(flashcore, m) {
  m.def("_varlen_fwd(Tensor q, Tensor k, Tensor v, Tensor cu_seq_q, Tensor cu_seq_k, int max_q, int max_k, "
        "bool is_causal, float scale) -> (Tensor, Tensor)");
  m.def("_varlen_bwd(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor? grad_lse, "
        "Tensor cu_seq_q, Tensor cu_seq_k, int max_q, int max_k, bool is_causal, float scale) "
        "-> (Tensor, Tensor, Tensor)");
}

// CUDA runs them; CPU (and any tensors on the CPU key) only gets the argument checks' errors.
STABLE_TORCH_LIBRARY_IMPL(flashcore, CUDA, m) {
  m.impl("_varlen_fwd", TORCH_BOX(&varlen_fwd));
  m.impl("_varlen_bwd", TORCH_BOX(&varlen_bwd));
}
STABLE_TORCH_LIBRARY_IMPL(flashcore, CPU, m) {
  m.impl("_varlen_fwd", TORCH_BOX(&varlen_fwd));
  m.impl("_varlen_bwd", TORCH_BOX(&varlen_bwd));
}
