// flashcore_bwd_op.cpp - the fused backward as ops on PyTorch's stable ABI (a FRAGMENT of the
// flashcore library that flashcore_op.cpp defines):
//
//   flashcore::sdpa_bwd_kernel(grad_out, query, key, value, out, lse, grad_lse, is_causal, scale,
//                              enable_gqa, deterministic=False, attn_mask=None) -> (dq, dk, dv)
//       CUDA: fills an fc_bwd_params from the tensors' real strides and runs fc_sdpa_bwd on the
//       current stream (workspace from PyTorch's caching allocator, so CUDA-graph safe). Raises
//       if no kernel covers the call: ask explain_bwd first. dq, dk, dv lie as query, key and
//       value do (layout.h: each one's storage order, densely packed), in query's dtype.
//       `deterministic` (torch.are_deterministic_algorithms_enabled() from the
//       Python caller) asks for bitwise reproducible gradients: the C layer then runs the
//       sm80-class family, not the sm90 one (whose dq is summed with fp32 reductions in any order).
//       attn_mask: as the forward's (bool, or query's dtype added to the scores; any broadcast
//       view of (B, Hq, Sq, Sk)); only the sm90 family takes one, and no gradient comes out for it.
//       CPU: the Python reference (python/flashcore/_ops.py), for opcheck.
//   flashcore::explain_bwd(<same arguments>) -> (int family, int reason)
//       in the forward explain's order. family: the fc_family of the kernel that runs (1 =
//       sm80-class, 2 = sm90), 0 when none. reason: 0 when sdpa_bwd_kernel runs a kernel for
//       these tensors, else why not (the forward's explain codes, reasons.h: op-level, or the
//       status base + fc_status from fc_sdpa_bwd_support). Reads only metadata (sizes, strides,
//       dtypes, pointer alignment, the device's compute capability), never the data.
//
// The autograd backward (flashcore::sdpa_bwd in _ops.py) calls explain_bwd, then either
// sdpa_bwd_kernel or its Python implementation (masks that need a gradient, fp32, other head
// dims...).
// The training route in _ops.py also asks explain_bwd, before the forward, with stand-ins for
// out, lse and grad_out, to decide whether a training call goes to aten instead.
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>

#include <array>
#include <cmath>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <tuple>
#include <vector>

#include "flashcore.h"
#include "layout.h"
#include "mask_copy.h"
#include "op_common.h"
#include "reasons.h"

namespace {

using flashcore_op::compute_capability;
using flashcore_op::fail;
using flashcore_op::new_output;
using flashcore_op::output_strides;
using flashcore_op::stride_or_0;
using flashcore_op::make_mask_copy;
using flashcore_op::mask_copy_affordable;
using flashcore_op::mask_copy_layout;
using flashcore_op::MaskCopy;

using torch::headeronly::ScalarType;
using torch::stable::Tensor;

// The forward's reason codes and status base (reasons.h; the backward's own: kBwdOperands).
using namespace flashcore_op::reason;  // the codes only: kNotCuda, ..., kStatusBase

bool same_sizes(const Tensor& t, const std::vector<int64_t>& sizes) {
  if (t.dim() != static_cast<int64_t>(sizes.size())) return false;
  for (int64_t i = 0; i < t.dim(); ++i)
    if (t.size(i) != sizes[i]) return false;
  return true;
}

void fill4(const Tensor& t, int64_t* b, int64_t* h, int64_t* s, int64_t* d) {
  *b = stride_or_0(t, 0);
  *h = stride_or_0(t, 1);
  *s = stride_or_0(t, 2);
  *d = t.size(3) == 1 ? 1 : t.stride(3);
}

// A gradient's strides (layout.h's output_strides) into its four fc_bwd_params fields.
void fill4(const std::array<int64_t, 4>& st, int64_t* b, int64_t* h, int64_t* s, int64_t* d) {
  *b = st[0];
  *h = st[1];
  *s = st[2];
  *d = st[3];
}

struct BwdDecision {
  fc_bwd_params p;
  int64_t reason = kKernel;
  fc_family family = FC_FAMILY_AUTO;  // the family that runs (when reason == kKernel)
  MaskCopy mask_copy;  // planned: the kernel reads a copy of the bool attn_mask (plan_mask_copy)
};

// The sm90 backward reads a bool mask in TMA tiles where the Hopper forward's mask rule holds
// for it (kMaskBoolTiles: fc_mask_tiles_fit_, which that rule includes), else element by
// element: a key-padding mask's training steps ran 0.84-1.05x PyTorch's that way, where masks
// read in tiles ran 1.36-1.68x (docs/experiments/forward-masks.md). So, as the forward does, the
// backward runs on a copy with such rows (mask_copy.h) where the rule holds for the copy and
// not for the mask as it is, and the copy is affordable.
void plan_mask_copy(BwdDecision& d, const Tensor& mask, int major, int minor) {
  fc_params as_is = d.p.fwd;
  as_is.family = FC_FAMILY_SM90;
  if (as_is.mask_kind != FC_MASK_BOOL || fc_sdpa_support(&as_is, major, minor) == FC_OK) return;
  fc_params probe;
  const MaskCopy c = mask_copy_layout(mask, d.p.fwd, &probe);
  if (!c.planned || !mask_copy_affordable(c, mask, d.p.fwd)) return;
  fc_params probe_sm90 = probe;
  probe_sm90.family = FC_FAMILY_SM90;
  fc_bwd_params with_copy = d.p;
  with_copy.fwd = probe;
  if (fc_sdpa_support(&probe_sm90, major, minor) != FC_OK ||
      fc_sdpa_bwd_family(&with_copy, major, minor) != FC_FAMILY_SM90)  // (AUTO where unsupported)
    return;
  d.p = with_copy;
  d.mask_copy = c;
}

// The decision: kernel (params filled; dq/dk/dv/workspace pointers are stand-ins) or why not.
BwdDecision decide_bwd(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                       const Tensor& out, const Tensor& lse, const std::optional<Tensor>& dlse,
                       bool is_causal, std::optional<double> scale, bool enable_gqa,
                       bool deterministic, const std::optional<Tensor>& mask,
                       int64_t window_left, int64_t window_right, bool bottom_right,
                       double softcap) {
  BwdDecision d;
  fc_bwd_params_init(&d.p);
  flashcore_op::set_band(window_left, window_right, bottom_right, &d.p.fwd, "flashcore.attention");
  flashcore_op::set_softcap(softcap, &d.p.fwd, "flashcore.attention");
  auto fallback = [&](int64_t reason) {
    d.reason = reason;
    return d;
  };
  for (const Tensor* t : {&dout, &q, &k, &v, &out, &lse})
    if (!t->is_cuda() || t->device() != q.device()) return fallback(kNotCuda);
  if (dlse.has_value() && (!dlse->is_cuda() || dlse->device() != q.device())) return fallback(kNotCuda);
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4) return fallback(kNot4D);
  const int64_t B = q.size(0), Hq = q.size(1), Sq = q.size(2), D = q.size(3);
  const int64_t Hkv = k.size(1), Sk = k.size(2);
  if (k.size(0) != B || !same_sizes(v, {B, Hkv, Sk, k.size(3)})) return fallback(kShapeBroadcast);
  if (k.size(3) != D || v.size(3) != D) return fallback(kValueHeadDim);
  if (Hq != Hkv && !enable_gqa) return fallback(kHeadsNoGqa);
  if (Hkv == 0 || Hq % Hkv != 0) return fallback(kShapeBroadcast);
  const ScalarType dt = q.scalar_type();
  if (dt != ScalarType::Half && dt != ScalarType::BFloat16) return fallback(kDtype);
  if (k.scalar_type() != dt || v.scalar_type() != dt || out.scalar_type() != dt ||
      dout.scalar_type() != dt || lse.scalar_type() != ScalarType::Float ||
      !same_sizes(out, {B, Hq, Sq, D}) || !same_sizes(dout, {B, Hq, Sq, D}) ||
      !same_sizes(lse, {B, Hq, Sq}))
    return fallback(kBwdOperands);
  if (dlse.has_value() && (dlse->scalar_type() != ScalarType::Float || !same_sizes(*dlse, {B, Hq, Sq})))
    return fallback(kBwdOperands);
  if (q.numel() == 0 || k.numel() == 0) return fallback(kStatusBase + FC_UNSUPPORTED_EMPTY);

  fc_params& f = d.p.fwd;
  f.dtype = dt == ScalarType::Half ? FC_DTYPE_FP16 : FC_DTYPE_BF16;
  f.batch = B; f.heads_q = Hq; f.heads_kv = Hkv; f.seqlen_q = Sq; f.seqlen_k = Sk; f.head_dim = D;
  f.q = q.data_ptr(); f.k = k.data_ptr(); f.v = v.data_ptr(); f.out = out.data_ptr();
  f.lse = static_cast<float*>(lse.data_ptr());
  fill4(q, &f.q_stride_b, &f.q_stride_h, &f.q_stride_s, &f.q_stride_d);
  fill4(k, &f.k_stride_b, &f.k_stride_h, &f.k_stride_s, &f.k_stride_d);
  fill4(v, &f.v_stride_b, &f.v_stride_h, &f.v_stride_s, &f.v_stride_d);
  fill4(out, &f.o_stride_b, &f.o_stride_h, &f.o_stride_s, &f.o_stride_d);
  f.lse_stride_b = stride_or_0(lse, 0); f.lse_stride_h = stride_or_0(lse, 1);
  f.lse_stride_s = stride_or_0(lse, 2);
  f.scale = static_cast<float>(flashcore_op::sdpa_scale(scale, D));
  f.causal = is_causal ? 1 : 0;
  if (mask.has_value()) {
    const int64_t why = flashcore_op::set_mask(*mask, q, &f);
    if (why != 0) return fallback(why);
  }
  // FLASHCORE_FAMILY=sm80 forces the sm80-class backward too (how the Ada path is tested and
  // timed on Hopper); any other value leaves the backward's family to AUTO.
  const bool forced_sm80 = flashcore_op::family_from_config(*fc_config_read()) == FC_FAMILY_SM80;
  f.family = forced_sm80 ? FC_FAMILY_SM80 : FC_FAMILY_AUTO;
  // torch.use_deterministic_algorithms(True): AUTO then takes the sm80-class family, whose
  // gradients are bitwise reproducible (the sm90 family sums dq with fp32 reductions in any order).
  d.p.deterministic = deterministic ? 1 : 0;

  d.p.dout = dout.data_ptr();
  fill4(dout, &d.p.do_stride_b, &d.p.do_stride_h, &d.p.do_stride_s, &d.p.do_stride_d);
  if (dlse.has_value()) {
    d.p.dlse = static_cast<const float*>(dlse->data_ptr());
    d.p.dlse_stride_b = stride_or_0(*dlse, 0); d.p.dlse_stride_h = stride_or_0(*dlse, 1);
    d.p.dlse_stride_s = stride_or_0(*dlse, 2);
  }
  // dq, dk, dv: laid out as q, k, v (new_output; HuggingFace's transposed views then get their
  // gradients without a copy), allocated only if the kernel runs. A stand-in pointer (the
  // caching allocator's blocks are 512-byte aligned) lets the support query check the rest.
  d.p.dq = d.p.dk = d.p.dv = flashcore_op::stand_in<void>();
  fill4(output_strides(q, B, Hq, Sq, D), &d.p.dq_stride_b, &d.p.dq_stride_h, &d.p.dq_stride_s,
        &d.p.dq_stride_d);
  fill4(output_strides(k, B, Hkv, Sk, D), &d.p.dk_stride_b, &d.p.dk_stride_h, &d.p.dk_stride_s,
        &d.p.dk_stride_d);
  fill4(output_strides(v, B, Hkv, Sk, D), &d.p.dv_stride_b, &d.p.dv_stride_h, &d.p.dv_stride_s,
        &d.p.dv_stride_d);

  const auto [major, minor] = compute_capability(q.get_device_index());
  const fc_status s = fc_sdpa_bwd_support(&d.p, major, minor);
  if (s != FC_OK) return fallback(kStatusBase + s);
  d.reason = kKernel;
  d.family = fc_sdpa_bwd_family(&d.p, major, minor);
  if (d.family == FC_FAMILY_SM90 && mask.has_value()) plan_mask_copy(d, *mask, major, minor);
  return d;
}

std::tuple<int64_t, int64_t> explain_bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out,
                                         Tensor lse, std::optional<Tensor> dlse, bool is_causal,
                                         std::optional<double> scale, bool enable_gqa,
                                         bool deterministic, std::optional<Tensor> mask,
                                         int64_t window_left, int64_t window_right, bool bottom_right,
                                         double softcap) {
  const BwdDecision d = decide_bwd(dout, q, k, v, out, lse, dlse, is_causal, scale, enable_gqa,
                                   deterministic, mask, window_left, window_right, bottom_right,
                                   softcap);
  return {static_cast<int64_t>(d.reason == kKernel ? d.family : FC_FAMILY_AUTO), d.reason};
}

std::tuple<Tensor, Tensor, Tensor> sdpa_bwd_kernel(Tensor dout, Tensor q, Tensor k, Tensor v,
                                                   Tensor out, Tensor lse,
                                                   std::optional<Tensor> dlse, bool is_causal,
                                                   std::optional<double> scale, bool enable_gqa,
                                                   bool deterministic, std::optional<Tensor> mask,
                                                   int64_t window_left, int64_t window_right,
                                                   bool bottom_right, double softcap) {
  BwdDecision d = decide_bwd(dout, q, k, v, out, lse, dlse, is_causal, scale, enable_gqa,
                             deterministic, mask, window_left, window_right, bottom_right, softcap);
  if (d.reason != kKernel)
    fail("flashcore.sdpa_bwd_kernel: no backward kernel for these inputs (explain_bwd reason ",
         d.reason, d.reason >= kStatusBase ? std::string(": ") +
                       fc_status_string(static_cast<fc_status>(d.reason - kStatusBase)) : std::string(),
         ")");
  const int32_t dev = q.get_device_index();
  torch::stable::accelerator::DeviceGuard guard(dev);
  std::optional<Tensor> mask_copy;
  if (d.mask_copy.planned) mask_copy = make_mask_copy(d.mask_copy, *mask, &d.p.fwd);
  const fc_params& f = d.p.fwd;
  // (decide_bwd planned these strides; k and v have q's dtype there.)
  Tensor dq = new_output(f.batch, f.heads_q, f.seqlen_q, f.head_dim, q);
  Tensor dk = new_output(f.batch, f.heads_kv, f.seqlen_k, f.head_dim, k);
  Tensor dv = new_output(f.batch, f.heads_kv, f.seqlen_k, f.head_dim, v);
  d.p.dq = dq.data_ptr();
  d.p.dk = dk.data_ptr();
  d.p.dv = dv.data_ptr();
  int64_t ws_bytes = 0;
  const fc_status s = fc_sdpa_bwd_workspace_size(&d.p, &ws_bytes);
  if (s != FC_OK) fail("flashcore.sdpa_bwd_kernel: ", fc_status_string(s));
  Tensor workspace = torch::stable::empty({ws_bytes}, ScalarType::Byte, std::nullopt, q.device());
  d.p.workspace = workspace.data_ptr();
  d.p.workspace_bytes = ws_bytes;
  // As the forward does (flashcore_op.cpp): dev's primary context made current on this thread,
  // for libflashcore's own CUDA runtime (it takes its device from the thread's current context)
  // and the driver's tensor-map encoder (the sm90 family).
  flashcore_op::run_bwd("flashcore.sdpa_bwd_kernel", dev, d.p);
  return {dq, dk, dv};
}

}  // namespace

STABLE_TORCH_LIBRARY_FRAGMENT(flashcore, m) {
  m.def("sdpa_bwd_kernel(Tensor grad_out, Tensor query, Tensor key, Tensor value, Tensor out, "
        "Tensor lse, Tensor? grad_lse, bool is_causal, float? scale, bool enable_gqa, "
        "bool deterministic=False, Tensor? attn_mask=None, int window_left=-1, "
        "int window_right=-1, bool bottom_right=False, float softcap=0.) -> (Tensor, Tensor, Tensor)");
  m.def("explain_bwd(Tensor grad_out, Tensor query, Tensor key, Tensor value, Tensor out, "
        "Tensor lse, Tensor? grad_lse, bool is_causal, float? scale, bool enable_gqa, "
        "bool deterministic=False, Tensor? attn_mask=None, int window_left=-1, "
        "int window_right=-1, bool bottom_right=False, float softcap=0.) -> (int, int)");
}

// CUDA only: the CPU kernel is the Python reference, registered in python/flashcore/_ops.py.
STABLE_TORCH_LIBRARY_IMPL(flashcore, CUDA, m) {
  m.impl("sdpa_bwd_kernel", TORCH_BOX(&sdpa_bwd_kernel));
}
// explain_bwd only reads metadata, so it answers for tensors on any device.
STABLE_TORCH_LIBRARY_IMPL(flashcore, CompositeExplicitAutograd, m) {
  m.impl("explain_bwd", TORCH_BOX(&explain_bwd));
}
