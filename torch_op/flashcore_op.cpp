// flashcore_op.cpp - registers torch.ops.flashcore.sdpa (and flashcore.explain) on PyTorch's
// stable ABI only, so one binary loads on every torch >= the target version (2.11).
//
//   flashcore::sdpa    - same schema as aten::scaled_dot_product_attention. On CUDA it fills an
//                        fc_params from the tensors' real strides and calls fc_sdpa_fwd on the
//                        current stream; everything no kernel covers goes to aten SDPA through
//                        the dispatcher (CPU tensors always do).
//   flashcore::sdpa_fwd - same arguments, returns (out, lse): the forward autograd saves. lse is
//                        the natural-log log-sum-exp of each query row's scaled, masked scores,
//                        contiguous out.shape[:-1], float32 (float64 for float64 inputs); from
//                        the kernel where it runs, else computed from aten ops beside aten SDPA.
//                        dropout_p must be 0 (flashcore.sdpa sends dropout to aten's autograd).
//   flashcore::explain - same arguments, returns (family, reason) from the same decision
//                        function; the Python package turns it into a sentence.
// Output layout: a 4-D out is (B, Hq, Sq, D) over storage ordered as the query's (layout.h),
// from every path; other ranks are contiguous. The fakes in python/flashcore/_ops.py promise
// the same. Autograd, fakes and the backward op live in Python.
//
// Reason codes (returned by explain): torch_op/reasons.h lists them with their sentences; the
// end of this file exports them, and the family names, to the Python package as plain C functions.
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <dlfcn.h>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "config.h"
#include "flashcore.h"
#include "layout.h"
#include "mask_copy.h"
#include "op_common.h"
#include "reasons.h"

namespace {

using flashcore_op::compute_capability;
using flashcore_op::fail;
using flashcore_op::family_from_config;
using flashcore_op::in_output_layout;
using flashcore_op::new_output;
using flashcore_op::output_strides;
using flashcore_op::make_mask_copy;
using flashcore_op::mask_copy_affordable;
using flashcore_op::mask_copy_layout;
using flashcore_op::MaskCopy;
using flashcore_op::stand_in;
using flashcore_op::stride_or_0;

using torch::headeronly::ScalarType;
using torch::stable::Tensor;

// ---- reasons -------------------------------------------------------------------------------

// The codes and the bases (status, note): reasons.h.
using namespace flashcore_op::reason;  // the codes only: kNotCuda, ..., kStatusBase, kNoteBase
using flashcore_op::family_name;

struct Decision {
  fc_params p;
  int64_t reason = kKernel;    // kKernel, a reason::Code, or kStatusBase + fc_status
  fc_status sm90_declined = FC_OK;  // kernel path in sm80 under auto: why the sm90 family did not take it
  fc_family family = FC_FAMILY_AUTO;  // kernel family that runs (when reason == kKernel)
  bool family_forced = false;
  MaskCopy mask_copy;  // planned: the kernel reads a copy of the bool attn_mask (plan_mask_copy)
  fc_fwd_plan plan{};  // the launch, decided once (reason == kKernel): fc_sdpa_plan
};

const char* dtype_name(ScalarType t) { return torch::headeronly::toString(t); }

std::string device_str(const Tensor& t) {
  if (t.is_cpu()) return "cpu";
  if (t.is_cuda()) return "cuda:" + std::to_string(t.get_device_index());
  return "device type " + std::to_string(static_cast<int>(t.device().type())) + ":" +
         std::to_string(t.get_device_index());
}

// fc statuses that describe the caller's layout or a case aten handles: fall back, don't raise.
bool status_means_fallback(fc_status s) {
  switch (s) {
    case FC_UNSUPPORTED_EMPTY:
    case FC_UNSUPPORTED_DTYPE:
    case FC_UNSUPPORTED_HEAD_DIM:
    case FC_UNSUPPORTED_MASK:
    case FC_UNSUPPORTED_BAND:  // flashcore.attention then passes a mask (sdpa_fwd refuses the band)
    case FC_UNSUPPORTED_SINKS:  // flashcore.attention then adds them itself (sdpa_fwd refuses them)
    case FC_UNSUPPORTED_SOFTCAP:  // flashcore.attention then computes it in PyTorch (sdpa_fwd refuses it)
    case FC_UNSUPPORTED_SLOWER:  // AUTO on Hopper: aten (cuDNN) is the faster path for this head dim
    case FC_UNSUPPORTED_SLOWER_MASK:  // AUTO on Hopper, no LSE: aten is the faster path for this mask
    case FC_UNSUPPORTED_ARCH:
    case FC_UNSUPPORTED_FAMILY:
    case FC_UNSUPPORTED_LAYOUT:  // only a forced family's rules: check_forced_family raises for it
    case FC_ERR_LAST_DIM_STRIDE:
    case FC_ERR_STRIDE_ALIGNMENT:
    case FC_ERR_POINTER_ALIGNMENT:
    case FC_ERR_NEGATIVE_STRIDE:
    case FC_ERR_OFFSET_OVERFLOW:
    case FC_ERR_BAD_SCALE:  // scale=inf/nan: aten computes it, so let aten do so
      return true;
    default:
      return false;
  }
}

// A 4-D call's attn_mask must broadcast to the scores, (batch, heads, query length, key length),
// batch and heads broadcast over query, key and value as aten's (check_args has checked that
// they do; under GQA the query's heads): each of the mask's sizes, aligned from the right, that
// size or 1. (aten raises too, with a message about "tensor a" and "tensor b" that names neither.)
void check_mask_broadcasts(const Tensor& mask, const Tensor& q, const Tensor& k, const Tensor& v,
                           bool enable_gqa) {
  auto broadcast = [&](int d) {
    return q.size(d) != 1 ? q.size(d) : k.size(d) != 1 ? k.size(d) : v.size(d);
  };
  const int64_t scores[4] = {broadcast(0), enable_gqa ? q.size(1) : broadcast(1), q.size(2), k.size(2)};
  bool fits = mask.dim() <= 4;
  for (int64_t i = 1; fits && i <= mask.dim(); ++i) {
    const int64_t m = mask.size(mask.dim() - i), s = scores[4 - i];
    fits = m == s || m == 1;
  }
  if (fits) return;
  std::string shape = "[";
  for (int64_t i = 0; i < mask.dim(); ++i) shape += (i ? ", " : "") + std::to_string(mask.size(i));
  FC_CHECK(false, "flashcore.sdpa: attn_mask of shape ", shape, "] does not broadcast to the "
           "scores' (batch, heads, query length, key length) = [", scores[0], ", ",
           scores[1], ", ", scores[2], ", ", scores[3], "]: each of its sizes, from the right, must "
           "be that size or 1");
}

// Raise for inputs aten rejects too, where a clear message helps (on torch < 2.13 an aten error
// raised through the dispatcher shim loses its message).
void check_args(const Tensor& q, const Tensor& k, const Tensor& v,
                const std::optional<Tensor>& mask, bool is_causal, bool enable_gqa) {
  const std::array<const Tensor*, 3> qkv{&q, &k, &v};
  const std::array<const char*, 3> names{"query", "key", "value"};
  for (int i = 0; i < 3; ++i) {
    FC_CHECK(qkv[i]->dim() >= 2, "flashcore.sdpa: ", names[i],
             " must have at least 2 dimensions (..., seq_len, head_dim), got ",
             qkv[i]->dim(), "-D");
  }
  for (int i = 1; i < 3; ++i) {
    FC_CHECK(qkv[i]->scalar_type() == q.scalar_type(), "flashcore.sdpa: ", names[i],
             " must have the same dtype as query (query: ", dtype_name(q.scalar_type()),
             ", ", names[i], ": ", dtype_name(qkv[i]->scalar_type()), ")");
    FC_CHECK(qkv[i]->device() == q.device(), "flashcore.sdpa: ", names[i],
             " must be on the same device as query (query: ", device_str(q), ", ",
             names[i], ": ", device_str(*qkv[i]), ")");
  }
  FC_CHECK(k.size(-1) == q.size(-1), "flashcore.sdpa: key must have the same head dim "
           "(last size) as query (query: ", q.size(-1), ", key: ", k.size(-1), ")");
  if (k.dim() >= 2 && v.dim() >= 2) {
    FC_CHECK(v.size(-2) == k.size(-2), "flashcore.sdpa: value must have the same sequence "
             "length (dim -2) as key (key: ", k.size(-2), ", value: ", v.size(-2), ")");
  }
  if (mask.has_value()) {
    const ScalarType mt = mask->scalar_type();
    FC_CHECK(mt == ScalarType::Bool || mt == ScalarType::Float || mt == q.scalar_type(),
             "flashcore.sdpa: attn_mask must be bool, float32 or query's dtype (query: ",
             dtype_name(q.scalar_type()), ", attn_mask: ", dtype_name(mt), ")");
    FC_CHECK(!is_causal, "flashcore.sdpa: attn_mask must be None when is_causal=True");
  }
  if (q.dim() == 4 && k.dim() == 4 && v.dim() == 4) {
    // Batch sizes broadcast like aten's; two different sizes neither of which is 1 is an error.
    for (int i = 1; i < 3; ++i) {
      const int64_t a = q.size(0), b = qkv[i]->size(0);
      FC_CHECK(a == b || a == 1 || b == 1, "flashcore.sdpa: ", names[i],
               " must have the same batch size (dim 0) as query (query: ", a, ", ",
               names[i], ": ", b, ")");
    }
    const int64_t hq = q.size(1);
    for (int i = 1; i < 3; ++i) {
      const int64_t h = qkv[i]->size(1);
      if (enable_gqa) {
        FC_CHECK(hq == 0 || (h > 0 && hq % h == 0), "flashcore.sdpa: with enable_gqa=True the number "
                 "of query heads must be a multiple of ", names[i], "'s (query: ", hq,
                 " heads, ", names[i], ": ", h, " heads)");
      } else {
        FC_CHECK(h == hq || h == 1 || hq == 1, "flashcore.sdpa: ", names[i], " has ", h,
                 " heads and query has ", hq, ": they must match unless "
                 "enable_gqa=True (query heads a multiple of ", names[i], "'s)");
      }
    }
    if (mask.has_value()) check_mask_broadcasts(*mask, q, k, v, enable_gqa);
  }
}


// A bool mask the Hopper family cannot read as it is runs there on a copy (mask_copy.h) where
// the copy is all it lacks and affordable: the family ran such calls 1.13-1.42x PyTorch's default
// where the sm80 family ran them at 0.41-0.92x (docs/experiments/forward-masks.md). A copy not
// affordable leaves the call to fc_dispatch, which sends it to PyTorch under auto.
void plan_mask_copy(Decision& d, const Tensor& mask, const flashcore_op::DeviceFacts& dev) {
  fc_params probe;
  const MaskCopy c = mask_copy_layout(mask, d.p, &probe);
  fc_fwd_plan plan;
  if (!c.planned || !mask_copy_affordable(c, mask, d.p) ||
      fc_sdpa_plan(&probe, dev.major, dev.minor, dev.sm_count, &plan) != FC_OK || plan.family != FC_FAMILY_SM90)
    return;
  d.p = probe;
  d.plan = plan;
  d.mask_copy = c;
}

// Decoding that PyTorch's SDPA runs as fast or faster in cuDNN, where PyTorch would run it there:
//  * one row, which the decode route sends to the Hopper family (c_src/dispatch.c,
//    sm90_reads_decode_faster: D=128, many (batch, KV head) pairs or long caches): it streams K
//    and V no faster than cuDNN's decoding kernel, 0.94-0.99x its time on the H200 and
//    0.99-1.01x on the H100 (docs/experiments/backward.md, "Forty-fifth session");
//  * 2-16 query rows without GQA over at least kMinPairs (batch, KV head) pairs, which the decode
//    kernel runs: 0.83-0.997x cuDNN's time on the H200 at 4 and 16 rows (B = 4-32, 32 heads,
//    1k-32k keys; with fewer pairs it ran 0.92-2.6x, "Forty-sixth session").
// Such a call, plain (no mask, causal flag, band, softcap or sinks), D=128, wanting no LSE and
// reading at least kMinKeyRowsOneRow (batch, KV head, key) rows (several query rows:
// kMinKeyRowsManyRows), goes to aten when aten itself would run it in cuDNN
// (aten::_fused_sdp_choice: not when cuDNN is switched off or the installed torch prefers another
// backend, which the kernels beat by up to 1.7x). Shorter calls keep the kernel, as the fallback's extra host work costs more than it
// gains there: timed eagerly, one row at B=8 H=32 over 1k keys (2^18 rows, ~45 us) took 79 us
// through the fallback against the kernel's 46; with 4-16 rows the fallback added 4-6 us to
// cuDNN's time, less than the decode kernel lost from 2^19 rows (B=16, 1k keys: 88-92 us against
// cuDNN's 78) but not at 2^18 (B=8: 47-49 against 47).
bool decode_left_to_cudnn(const Tensor& q, const Tensor& k, const Tensor& v, std::optional<double> scale,
                          bool enable_gqa, const fc_params& p, fc_family family) {
  constexpr int64_t kCudnnBackend = 3;  // torch.nn.attention.SDPBackend.CUDNN_ATTENTION
  constexpr int64_t kMinKeyRowsOneRow = int64_t{1} << 20, kMinKeyRowsManyRows = int64_t{1} << 19;
  constexpr int64_t kMinPairs = 128;
  const bool one_row_sm90 = family == FC_FAMILY_SM90 && p.seqlen_q == 1;
  const bool rows_in_decode_kernel = family == FC_FAMILY_DECODE && p.seqlen_q >= 2 && p.seqlen_q <= 16 &&
                                     p.heads_q == p.heads_kv && p.batch * p.heads_kv >= kMinPairs;
  if (!(one_row_sm90 || rows_in_decode_kernel) || p.head_dim != 128 || p.causal || p.mask_kind != FC_MASK_NONE ||
      p.windowed || p.softcap != 0.0f || p.sinks != nullptr || p.lse != nullptr ||
      p.batch * p.heads_kv * p.seqlen_k < (one_row_sm90 ? kMinKeyRowsOneRow : kMinKeyRowsManyRows))
    return false;
  using torch::stable::detail::from;
  std::array<StableIValue, 8> stack{from(q), from(k), from(v), from(std::optional<Tensor>()), from(0.0),
                                    from(false), from(scale), from(enable_gqa)};
  if (torch_call_dispatcher("aten::_fused_sdp_choice", "", stack.data(), TORCH_ABI_VERSION) != TORCH_SUCCESS)
    return false;  // (no answer: the kernel runs, as before this rule)
  return torch::stable::detail::to<int64_t>(stack[0]) == kCudnnBackend;
}

// THE decision: raises for bad input, otherwise says kernel (with params filled) or why not.
// want_lse: the caller wants the log-sum-exp too (training), which some rules read.
Decision decide(const Tensor& q, const Tensor& k, const Tensor& v,
                const std::optional<Tensor>& mask, double dropout_p, bool is_causal,
                std::optional<double> scale, bool enable_gqa, int64_t window_left = -1,
                int64_t window_right = -1, bool bottom_right = false,
                const std::optional<Tensor>& sinks = std::nullopt, double softcap = 0.0,
                bool want_lse = false) {
  check_args(q, k, v, mask, is_causal, enable_gqa);
  // Checked here, not left to aten: on torch 2.11 an error raised inside aten during the
  // dispatcher fallback crashed the process (seen on the H100 with dropout_p=1.5).
  FC_CHECK(dropout_p >= 0.0 && dropout_p <= 1.0, "flashcore.sdpa: dropout_p: dropout probability "
           "has to be between 0 and 1, but got ", dropout_p);
  Decision d;
  fc_params_init(&d.p);
  flashcore_op::set_band(window_left, window_right, bottom_right, &d.p, "flashcore.attention");
  flashcore_op::set_softcap(softcap, &d.p, "flashcore.attention");
  d.family = family_from_config(*fc_config_read());
  d.family_forced = d.family != FC_FAMILY_AUTO;
  d.p.family = d.family;

  auto fallback = [&](int64_t reason) {
    d.reason = reason;
    d.family = FC_FAMILY_AUTO;
    return d;
  };
  if (!q.is_cuda()) return fallback(kNotCuda);
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4) return fallback(kNot4D);
  const int64_t B = q.size(0), Hq = q.size(1), Sq = q.size(2), D = q.size(3);
  const int64_t Hkv = k.size(1), Sk = k.size(2);
  if (k.size(0) != B || v.size(0) != B || v.size(1) != Hkv || v.size(2) != Sk)
    return fallback(kShapeBroadcast);
  if (v.size(3) != D) return fallback(kValueHeadDim);
  if (Hq != Hkv && !enable_gqa) return fallback(kHeadsNoGqa);  // (check_args: Hkv or Hq is 1)
  if (dropout_p > 0.0) return fallback(kDropout);

  switch (q.scalar_type()) {
    case ScalarType::Half: d.p.dtype = FC_DTYPE_FP16; break;
    case ScalarType::BFloat16: d.p.dtype = FC_DTYPE_BF16; break;
    case ScalarType::Float: d.p.dtype = FC_DTYPE_FP32; break;
    default: return fallback(kDtype);
  }
  d.p.batch = B; d.p.heads_q = Hq; d.p.heads_kv = Hkv;
  d.p.seqlen_q = Sq; d.p.seqlen_k = Sk; d.p.head_dim = D;
  if (q.numel() == 0 || k.numel() == 0 || v.numel() == 0)
    return fallback(kStatusBase + FC_UNSUPPORTED_EMPTY);

  d.p.q = q.data_ptr(); d.p.k = k.data_ptr(); d.p.v = v.data_ptr();
  d.p.q_stride_b = stride_or_0(q, 0); d.p.q_stride_h = stride_or_0(q, 1);
  d.p.q_stride_s = stride_or_0(q, 2); d.p.q_stride_d = D == 1 ? 1 : q.stride(3);
  d.p.k_stride_b = stride_or_0(k, 0); d.p.k_stride_h = stride_or_0(k, 1);
  d.p.k_stride_s = stride_or_0(k, 2); d.p.k_stride_d = D == 1 ? 1 : k.stride(3);
  d.p.v_stride_b = stride_or_0(v, 0); d.p.v_stride_h = stride_or_0(v, 1);
  d.p.v_stride_s = stride_or_0(v, 2); d.p.v_stride_d = D == 1 ? 1 : v.stride(3);
  // out (new_output's layout) and lse (contiguous (B, Hq, Sq)), allocated only if the kernel runs.
  d.p.out = stand_in<void>();
  const std::array<int64_t, 4> o_strides = output_strides(q, B, Hq, Sq, D);
  d.p.o_stride_b = o_strides[0]; d.p.o_stride_h = o_strides[1];
  d.p.o_stride_s = o_strides[2]; d.p.o_stride_d = o_strides[3];
  if (want_lse) {
    d.p.lse = stand_in<float>();
    d.p.lse_stride_s = 1; d.p.lse_stride_h = Sq; d.p.lse_stride_b = Hq * Sq;
  }
  d.p.scale = static_cast<float>(flashcore_op::sdpa_scale(scale, D));
  d.p.causal = is_causal ? 1 : 0;

  if (mask.has_value()) {
    const int64_t why = flashcore_op::set_mask(*mask, q, &d.p);
    if (why != 0) return fallback(why);
  }
  if (sinks.has_value()) {
    if (sinks->device() != q.device() || sinks->scalar_type() != ScalarType::Float ||
        sinks->dim() != 1 || sinks->size(0) != Hq || (Hq > 1 && sinks->stride(0) != 1))
      return fallback(kSinksLayout);
    d.p.sinks = static_cast<const float*>(sinks->data_ptr());
  }

  const flashcore_op::DeviceFacts dev = flashcore_op::device_facts(q.get_device_index());
  const int major = dev.major, minor = dev.minor;
  fc_status s = fc_sdpa_plan(&d.p, major, minor, dev.sm_count, &d.plan);
  if (d.p.mask_kind == FC_MASK_BOOL && (d.family == FC_FAMILY_AUTO || d.family == FC_FAMILY_SM90) &&
      (s != FC_OK || d.plan.family == FC_FAMILY_SM80)) {  // (the decode kernels read any mask)
    plan_mask_copy(d, *mask, dev);
    if (d.mask_copy.planned) s = FC_OK;
  }
  if (s != FC_OK) {
    if (status_means_fallback(s)) return fallback(kStatusBase + s);
    fail("flashcore.sdpa: internal error, the op built inconsistent parameters: ",
         fc_status_string(s));
  }
  d.family = d.plan.family;
  d.reason = kKernel;
  if (!d.family_forced && decode_left_to_cudnn(q, k, v, scale, enable_gqa, d.p, d.family))
    return fallback(kCudnnDecodes);
  if (!d.family_forced && d.family == FC_FAMILY_SM80) {
    // Say why the preferred Hopper family did not take it, where it runs at all (a mask, a
    // broadcast dim, scale <= 0); on Ada the answer is FC_UNSUPPORTED_FAMILY: nothing to say.
    fc_params probe = d.p;
    probe.family = FC_FAMILY_SM90;
    const fc_status why = fc_sdpa_support(&probe, major, minor);
    if (why != FC_OK && why != FC_UNSUPPORTED_FAMILY) d.sm90_declined = why;
  }
  return d;
}

// torch >= 2.13 keeps the message of an exception caught at the C shim boundary and exports
// torch_exception_get_what_without_backtrace() to read it. Looked up at run time (as torch's own
// headers do), so the library builds against 2.11 headers and still loads on 2.11.
const char* aten_error_message() {
  using Fn = const char* (*)();
  static const Fn fn = []() -> Fn {
    const char* name = "torch_exception_get_what_without_backtrace";
    void* sym = dlsym(RTLD_DEFAULT, name);
    if (sym == nullptr) {
      if (void* lib = dlopen("libtorch_cpu.so", RTLD_LAZY | RTLD_NOLOAD)) sym = dlsym(lib, name);
    }
    return reinterpret_cast<Fn>(sym);
  }();
  return fn != nullptr ? fn() : nullptr;
}

// aten's CUDA SDPA backends assume 16-byte-aligned inputs: on torch 2.11 (H100) an fp32 query
// viewed 1 element into its storage faults with "misaligned address", which poisons the CUDA
// context for the rest of the process. A fallback therefore hands aten an aligned copy of any
// misaligned CUDA input (a rare layout; the copy costs one read and write of that tensor).
Tensor aligned_for_aten(const Tensor& t) {
  if (!t.is_cuda() || t.numel() == 0 || reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0)
    return t;
  return torch::stable::clone(t);
}

Tensor aten_sdpa(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in,
                 const std::optional<Tensor>& mask_in, double dropout_p, bool is_causal,
                 std::optional<double> scale, bool enable_gqa) {
  using torch::stable::detail::from;
  const Tensor q = aligned_for_aten(q_in), k = aligned_for_aten(k_in), v = aligned_for_aten(v_in);
  std::optional<Tensor> mask;
  if (mask_in.has_value()) {
    mask = aligned_for_aten(*mask_in);
    // A 1-D (Sk,) mask: torch 2.11's CUDA SDPA raises for it (H100), where the kernels and
    // PyTorch's math backend broadcast it; as (1, Sk) it means the same and aten takes it.
    if (mask->dim() == 1) mask = torch::stable::reshape(*mask, {1, mask->size(0)});
    // A float32 mask beside fp16/bf16 CUDA inputs: torch 2.11's fused CUDA backends return NaN
    // garbage for it (H100), so aten gets the mask in the inputs' dtype (its values rounded
    // to that dtype; -inf and large negatives stay masked).
    const ScalarType qt = q.scalar_type();
    if (q.is_cuda() && mask->scalar_type() == ScalarType::Float &&
        (qt == ScalarType::Half || qt == ScalarType::BFloat16))
      mask = torch::stable::to(*mask, qt);
  }
  std::array<StableIValue, 8> stack{from(q), from(k), from(v), from(mask), from(dropout_p),
                                    from(is_causal), from(scale), from(enable_gqa)};
  if (torch_call_dispatcher("aten::scaled_dot_product_attention", "", stack.data(),
                            TORCH_ABI_VERSION) != TORCH_SUCCESS) {
    // aten rejected the inputs: raise its message (torch < 2.13 only logs it to stderr).
    const char* msg = aten_error_message();
    fail(msg != nullptr ? msg : "aten::scaled_dot_product_attention failed (its error "
         "message was logged above)", " [flashcore.sdpa fell back to aten]");
  }
  return torch::stable::detail::to<Tensor>(stack[0]);
}

// A forced family that cannot run is an error, not a silent fallback (it is for testing):
// not built / not for this device, or (sm90, decode) asked to apply an attn_mask.
void check_forced_family(const Decision& d) {
  for (fc_status s : {FC_UNSUPPORTED_FAMILY, FC_UNSUPPORTED_MASK, FC_UNSUPPORTED_LAYOUT}) {
    FC_CHECK(!(d.family_forced && d.reason == kStatusBase + s),
             "flashcore.sdpa: FLASHCORE_FAMILY=", fc_config_get()->family,
             " forces a kernel family that cannot run this call: ", fc_status_string(s));
  }
}

// The C layer's sentence for a fallback's status, or the op-level reason code.
std::string explain_status(const Decision& d) {
  if (d.reason >= kStatusBase && d.reason < kNoteBase)
    return fc_status_string(static_cast<fc_status>(d.reason - kStatusBase));
  return "reason " + std::to_string(d.reason);
}

// Runs the kernel decide() chose. out: new_output's layout; lse (if asked for): contiguous
// (B, Hq, Sq) fp32.
Tensor run_kernel(Decision& d, const Tensor& q, const std::optional<Tensor>& mask,
                  std::optional<Tensor>* lse) {
  const int32_t dev = q.get_device_index();
  torch::stable::accelerator::DeviceGuard guard(dev);
  std::optional<Tensor> mask_copy;
  if (d.mask_copy.planned) {
    mask_copy = make_mask_copy(d.mask_copy, *mask, &d.p);
    d.plan.params.mask = d.p.mask;  // (planned on a stand-in of the copy, same strides)
  }
  Tensor out = new_output(d.p.batch, d.p.heads_q, d.p.seqlen_q, d.p.head_dim, q);
  float* lse_ptr = nullptr;
  if (lse != nullptr) {  // (decide() planned with a stand-in of this contiguous LSE)
    Tensor l = torch::stable::empty({d.p.batch, d.p.heads_q, d.p.seqlen_q}, ScalarType::Float,
                                    std::nullopt, q.device());
    lse_ptr = static_cast<float*>(l.data_ptr());
    *lse = l;
  }
  // Split-KV decoding wants scratch for its partial results: through PyTorch's allocator, on
  // this stream, so it is graph-safe and freed (stream-ordered) once the call is queued.
  const int64_t ws_bytes = d.plan.workspace_bytes;
  std::optional<Tensor> workspace;
  if (ws_bytes > 0) workspace = torch::stable::empty({ws_bytes}, ScalarType::Byte, std::nullopt, q.device());
  // Make dev's primary context current on this thread. A thread whose CUDA work so far came
  // from PyTorch's cached allocations may have no current context: the driver's tensor-map
  // encoder (sm90 family) then fails (seen with 8 threads on the default stream), and
  // libflashcore's CUDA runtime, a separate instance from PyTorch's, takes its device from the
  // thread's current context. Cheap when it is already current.
  const cudaError_t set_err = cudaSetDevice(dev);
  FC_CHECK(set_err == cudaSuccess, "flashcore.sdpa: cannot make cuda:", dev, " current: ",
           cudaGetErrorString(set_err));
  void* stream = nullptr;
  TORCH_ERROR_CODE_CHECK(aoti_torch_get_current_cuda_stream(dev, &stream));
  const fc_status s = fc_sdpa_fwd_planned(&d.plan, out.data_ptr(), lse_ptr,
                                          workspace.has_value() ? workspace->data_ptr() : nullptr,
                                          ws_bytes, static_cast<cudaStream_t>(stream));
  if (s == FC_ERR_CUDA) {
    const cudaError_t e = fc_last_cuda_error();
    const char* family = family_name(d.family);
    fail("flashcore.sdpa: ", fc_status_string(s), ": ", cudaGetErrorName(e), " (",
         cudaGetErrorString(e), ") in the ", family ? family : "unknown", " family, B=", d.p.batch,
         " Hq=", d.p.heads_q, " Hkv=", d.p.heads_kv, " Sq=", d.p.seqlen_q, " Sk=", d.p.seqlen_k,
         " D=", d.p.head_dim, d.p.causal ? " causal" : "", " on cuda:", dev);
  }
  FC_CHECK(s == FC_OK, "flashcore.sdpa: ", fc_status_string(s));
  return out;
}

// ---- the LSE of a fallback call, from aten ops --------------------------------------------

// Calls an aten op through the dispatcher (stack positional, defaults included); result stack[0].
template <size_t N>
Tensor call_aten(const char* name, const char* overload, std::array<StableIValue, N> stack) {
  if (torch_call_dispatcher(name, overload, stack.data(), TORCH_ABI_VERSION) != TORCH_SUCCESS) {
    const char* msg = aten_error_message();
    fail("flashcore.sdpa_fwd: ", name, " failed while computing the log-sum-exp",
         msg != nullptr ? std::string(": ") + msg : std::string(" (message logged above)"));
  }
  return torch::stable::detail::to<Tensor>(stack[0]);
}

std::vector<int64_t> sizes_of(const Tensor& t) {
  std::vector<int64_t> s(t.dim());
  for (int64_t i = 0; i < t.dim(); ++i) s[i] = t.size(i);
  return s;
}

// logsumexp over keys of the scaled, masked scores, for any input aten SDPA accepts (any rank,
// broadcast batch dims, GQA on dim -3, bool/additive masks, top-left causal), shaped like
// out.shape[:-1]. Computed in float32 (float64 for float64 inputs), in chunks of query rows
// so that at most ~2^25 scores exist at once. Fully masked rows give -inf.
Tensor fallback_lse(const Tensor& q, const Tensor& k, const std::optional<Tensor>& mask,
                    bool is_causal, std::optional<double> scale, bool enable_gqa,
                    const Tensor& out) {
  using torch::stable::detail::from;
  const ScalarType ct = q.scalar_type() == ScalarType::Double ? ScalarType::Double
                                                              : ScalarType::Float;
  const int64_t qd = q.dim(), kd = k.dim();
  const int64_t Sq = q.size(qd - 2), Sk = k.size(kd - 2), D = q.size(qd - 1);
  const double sc = flashcore_op::sdpa_scale(scale, D);

  std::vector<int64_t> lse_shape = sizes_of(out);
  lse_shape.pop_back();
  Tensor lse = torch::stable::empty(lse_shape, ct, std::nullopt, q.device());
  int64_t rows_elems = 1;  // scores per query row, over all batch dims
  for (size_t i = 0; i + 1 < lse_shape.size(); ++i) rows_elems *= lse_shape[i];
  rows_elems *= std::max<int64_t>(Sk, 1);
  const int64_t chunk = std::max<int64_t>(1, (int64_t(1) << 25) / std::max<int64_t>(1, rows_elems));

  // GQA (as aten: key head j serves query heads j*G .. j*G+G-1 on dim -3): split q's heads
  // into (Hkv, G) and give k a size-1 group dim, so matmul broadcasts instead of copying.
  const int64_t hq = qd >= 3 ? q.size(qd - 3) : 1, hkv = kd >= 3 ? k.size(kd - 3) : 1;
  const bool gqa = enable_gqa && qd >= 3 && kd >= 3 && hq != hkv && hkv > 0;
  Tensor kt = torch::stable::transpose(torch::stable::to(k, ct), kd - 2, kd - 1);  // (..., D, Sk)
  if (gqa) kt = torch::stable::unsqueeze(kt, kd - 2);                               // (..., Hkv, 1, D, Sk)
  Tensor scale_t = torch::stable::full({}, sc, ct, std::nullopt, q.device());

  std::optional<Tensor> add_mask;  // additive form, compute dtype
  bool mask_rows = false;          // the mask has a query-row dim of size Sq (> 1) to slice
  if (mask.has_value()) {
    Tensor m = torch::stable::to(*mask, ct);
    if (mask->scalar_type() == ScalarType::Bool)
      m = call_aten<1>("aten::log", "", {from(m)});  // true -> 0, false -> -inf
    mask_rows = m.dim() >= 2 && m.size(m.dim() - 2) != 1;
    add_mask = m;
  }

  Tensor qf = torch::stable::to(q, ct);
  for (int64_t i0 = 0; i0 < Sq; i0 += chunk) {
    const int64_t n = std::min(chunk, Sq - i0);
    Tensor qc = torch::stable::narrow(qf, qd - 2, i0, n);
    if (gqa) {
      std::vector<int64_t> s = sizes_of(qc);
      s.insert(s.begin() + (qd - 3), hkv);
      s[qd - 2] = hq / hkv;
      qc = torch::stable::reshape(qc, s);  // (..., Hkv, G, n, D)
    }
    Tensor scores = torch::stable::matmul(qc, kt);
    if (gqa) {
      std::vector<int64_t> s = sizes_of(scores);
      s[qd - 3] = hq;
      s.erase(s.begin() + (qd - 2));
      scores = torch::stable::reshape(scores, s);  // (..., Hq, n, Sk)
    }
    scores = call_aten<2>("aten::mul", "Tensor", {from(scores), from(scale_t)});
    if (add_mask.has_value()) {
      Tensor m = *add_mask;
      if (mask_rows) m = torch::stable::narrow(m, m.dim() - 2, i0, n);
      scores = torch::stable::subtract(scores, m, -1.0);  // scores + m
    }
    if (is_causal) {  // query i0+r sees keys 0 .. i0+r (top-left aligned)
      Tensor keep = torch::stable::full({n, Sk}, 1.0, ct, std::nullopt, q.device());
      keep = call_aten<2>("aten::tril", "", {from(keep), from(i0)});
      keep = call_aten<1>("aten::log", "", {from(keep)});
      scores = torch::stable::subtract(scores, keep, -1.0);
    }
    Tensor l = call_aten<3>("aten::logsumexp", "",
                            {from(scores), from(std::vector<int64_t>{-1}), from(false)});
    Tensor dst = torch::stable::narrow(lse, static_cast<int64_t>(lse_shape.size()) - 1, i0, n);
    torch::stable::copy_(dst, l);
  }
  return lse;
}

// Inputs with nothing to compute are answered here, never by aten: aten's empty-input paths
// crash on torch 2.11 (SIGFPE dividing by a zero head count, on CPU and CUDA) or return wrong
// results on CUDA (empty batch). Two cases, for same-batch 4-D inputs:
//   an empty output (B, Hq, Sq or value's D = 0): an empty tensor;
//   no keys (Sk = 0, the output is not empty): every row's softmax is over nothing, and PyTorch
//   returns zeros (its math path: an (Sq x 0) @ (0 x D) product), with an LSE of -inf.
bool nothing_to_compute(const Tensor& q, const Tensor& k, const Tensor& v) {
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4 || q.size(0) != k.size(0)) return false;
  const bool empty_out = q.size(0) == 0 || q.size(1) == 0 || q.size(2) == 0 || v.size(3) == 0;
  return empty_out || k.size(2) == 0;
}
Tensor trivial_output(const Tensor& q, const Tensor& v) {
  Tensor out = new_output(q.size(0), q.size(1), q.size(2), v.size(3), q);
  if (out.numel() > 0) torch::stable::zero_(out);
  return out;
}
Tensor trivial_lse(const Tensor& q) {
  const ScalarType lt = q.scalar_type() == ScalarType::Double ? ScalarType::Double : ScalarType::Float;
  Tensor lse = torch::stable::empty({q.size(0), q.size(1), q.size(2)}, lt, std::nullopt, q.device());
  if (lse.numel() > 0) torch::stable::fill_(lse, -std::numeric_limits<double>::infinity());
  return lse;
}

Tensor sdpa(Tensor q, Tensor k, Tensor v, std::optional<Tensor> mask, double dropout_p,
            bool is_causal, std::optional<double> scale, bool enable_gqa) {
  Decision d = decide(q, k, v, mask, dropout_p, is_causal, scale, enable_gqa);
  if (d.reason != kKernel) {
    check_forced_family(d);
    if (nothing_to_compute(q, k, v)) return trivial_output(q, v);
    return in_output_layout(aten_sdpa(q, k, v, mask, dropout_p, is_causal, scale, enable_gqa), q);
  }
  return run_kernel(d, q, mask, nullptr);
}

// Forward that also returns the log-sum-exp of each query row (what the backward needs):
// out as sdpa's (new_output's layout), lse contiguous out.shape[:-1], float32 (float64 for float64
// inputs), natural log, of the scaled + masked scores; -inf for fully masked rows.
//
// window_left / window_right / bottom_right: flashcore.attention's band (fc_params' window
// fields). A band other than plain top-left causal runs only where a kernel takes it: aten's SDPA
// cannot express it, so without a kernel this raises, and flashcore.attention (which asks explain
// first) passes such calls an explicit mask instead.
std::tuple<Tensor, Tensor> forward_with_lse(Tensor q, Tensor k, Tensor v, std::optional<Tensor> mask,
                                            double dropout_p, bool is_causal,
                                            std::optional<double> scale, bool enable_gqa,
                                            int64_t window_left, int64_t window_right,
                                            bool bottom_right, std::optional<Tensor> sinks,
                                            double softcap) {
  Decision d = decide(q, k, v, mask, dropout_p, is_causal, scale, enable_gqa, window_left,
                      window_right, bottom_right, sinks, softcap, /*want_lse=*/true);
  FC_CHECK(dropout_p == 0.0, "flashcore.sdpa_fwd: dropout_p must be 0 (got ", dropout_p,
           "): the LSE does not determine a dropout backward; flashcore.sdpa hands "
           "dropout to aten's differentiable SDPA");
  if (d.reason != kKernel) {
    check_forced_family(d);
    // Without a kernel: a band that is every key or plain top-left causal is aten's plain or
    // is_causal call; any other band is refused (see above).
    const int band = q.dim() == 4 && k.dim() == 4 && q.size(2) > 0 && k.size(2) > 0
                         ? fc_band_bounds(q.size(2), k.size(2), is_causal, window_left, window_right,
                                          d.p.alignment, nullptr, nullptr)
                         : (is_causal ? FC_BAND_TOP_LEFT_CAUSAL : FC_BAND_ALL);
    FC_CHECK(band != FC_BAND_OTHER, "flashcore.sdpa_fwd: no kernel runs this window / bottom-right "
             "band here (", explain_status(d), ") and aten's SDPA cannot express it; "
             "flashcore.attention passes such calls an explicit mask");
    FC_CHECK(!sinks.has_value(), "flashcore.sdpa_fwd: no kernel takes these sinks here (",
             explain_status(d), "); flashcore.attention adds them from the output and LSE");
    FC_CHECK(softcap == 0.0, "flashcore.sdpa_fwd: no kernel takes a softcap here (",
             explain_status(d), ") and aten's SDPA has none; flashcore.attention computes such "
             "calls in PyTorch");
    is_causal = band == FC_BAND_TOP_LEFT_CAUSAL;
    if (nothing_to_compute(q, k, v)) return {trivial_output(q, v), trivial_lse(q)};
    Tensor out = in_output_layout(aten_sdpa(q, k, v, mask, dropout_p, is_causal, scale, enable_gqa), q);
    Tensor lse = fallback_lse(q, k, mask, is_causal, scale, enable_gqa, out);
    return {out, lse};
  }
  std::optional<Tensor> lse;
  Tensor out = run_kernel(d, q, mask, &lse);
  return {out, *lse};
}

std::tuple<Tensor, Tensor> sdpa_fwd(Tensor q, Tensor k, Tensor v, std::optional<Tensor> mask,
                                    double dropout_p, bool is_causal,
                                    std::optional<double> scale, bool enable_gqa,
                                    int64_t window_left, int64_t window_right, bool bottom_right,
                                    double softcap) {
  return forward_with_lse(q, k, v, mask, dropout_p, is_causal, scale, enable_gqa, window_left,
                          window_right, bottom_right, std::nullopt, softcap);
}

// sdpa_fwd with attention sinks (fc_params.sinks): a separate op, since sdpa_fwd has autograd
// registered (torch.library allows no keyword-only tensor there) and its callers never pass
// them. Only where a kernel takes the sinks (explain says so); flashcore.attention's op owns
// the gradients.
std::tuple<Tensor, Tensor> sdpa_fwd_sinks(Tensor q, Tensor k, Tensor v, Tensor sinks,
                                          std::optional<Tensor> mask, bool is_causal,
                                          std::optional<double> scale, bool enable_gqa,
                                          int64_t window_left, int64_t window_right,
                                          bool bottom_right, double softcap) {
  return forward_with_lse(q, k, v, mask, 0.0, is_causal, scale, enable_gqa, window_left,
                          window_right, bottom_right, sinks, softcap);
}

// Which path sdpa (lse false) or sdpa_fwd / sdpa_fwd_sinks (lse true: the LSE is wanted, as in
// training and flashcore.attention) takes for these arguments: (family, reason code).
std::tuple<int64_t, int64_t> explain(Tensor q, Tensor k, Tensor v, std::optional<Tensor> mask,
                                     double dropout_p, bool is_causal,
                                     std::optional<double> scale, bool enable_gqa,
                                     int64_t window_left, int64_t window_right, bool bottom_right,
                                     std::optional<Tensor> sinks, double softcap, bool lse) {
  const Decision d = decide(q, k, v, mask, dropout_p, is_causal, scale, enable_gqa, window_left,
                            window_right, bottom_right, sinks, softcap, lse);
  if (d.reason == kKernel && d.sm90_declined != FC_OK)
    return {static_cast<int64_t>(d.family), kNoteBase + d.sm90_declined};
  return {static_cast<int64_t>(d.family), d.reason};
}

}  // namespace

STABLE_TORCH_LIBRARY(flashcore, m) {
  m.def("sdpa(Tensor query, Tensor key, Tensor value, Tensor? attn_mask=None, "
        "float dropout_p=0., bool is_causal=False, *, float? scale=None, "
        "bool enable_gqa=False) -> Tensor");
  // sdpa for calls that record no gradient: the same kernels, but no Autograd kernel, so the
  // dispatcher goes straight to them instead of through sdpa's Python one (about 7 us of host
  // time per call on the H100's host, docs/experiments/forward-masks.md). Private: the Python
  // entry points (flashcore.sdpa, patch(), the transformers integration) call it only when
  // nothing requires grad or grad mode is off (python/flashcore/_entry.py).
  m.def("_sdpa_inference(Tensor query, Tensor key, Tensor value, Tensor? attn_mask=None, "
        "float dropout_p=0., bool is_causal=False, *, float? scale=None, "
        "bool enable_gqa=False) -> Tensor");
  m.def("explain(Tensor query, Tensor key, Tensor value, Tensor? attn_mask=None, "
        "float dropout_p=0., bool is_causal=False, *, float? scale=None, "
        "bool enable_gqa=False, int window_left=-1, int window_right=-1, "
        "bool bottom_right=False, Tensor? sinks=None, float softcap=0., bool lse=False) -> (int, int)");
  m.def("sdpa_fwd(Tensor query, Tensor key, Tensor value, Tensor? attn_mask=None, "
        "float dropout_p=0., bool is_causal=False, *, float? scale=None, "
        "bool enable_gqa=False, int window_left=-1, int window_right=-1, "
        "bool bottom_right=False, float softcap=0.) -> (Tensor, Tensor)");
  m.def("sdpa_fwd_sinks(Tensor query, Tensor key, Tensor value, Tensor sinks, "
        "Tensor? attn_mask=None, bool is_causal=False, *, float? scale=None, "
        "bool enable_gqa=False, int window_left=-1, int window_right=-1, "
        "bool bottom_right=False, float softcap=0.) -> (Tensor, Tensor)");
}

// One function for both keys: on CPU tensors the decision says "not CUDA" and aten runs.
// No Meta kernel: the fake is registered from Python (torch.library.register_fake).
STABLE_TORCH_LIBRARY_IMPL(flashcore, CUDA, m) {
  m.impl("sdpa", TORCH_BOX(&sdpa));
  m.impl("_sdpa_inference", TORCH_BOX(&sdpa));
  m.impl("sdpa_fwd", TORCH_BOX(&sdpa_fwd));
  m.impl("sdpa_fwd_sinks", TORCH_BOX(&sdpa_fwd_sinks));
}
STABLE_TORCH_LIBRARY_IMPL(flashcore, CPU, m) {
  m.impl("sdpa", TORCH_BOX(&sdpa));
  m.impl("_sdpa_inference", TORCH_BOX(&sdpa));
  m.impl("sdpa_fwd", TORCH_BOX(&sdpa_fwd));
  m.impl("sdpa_fwd_sinks", TORCH_BOX(&sdpa_fwd_sinks));
}
// explain only reads metadata, so it answers for tensors on any device.
STABLE_TORCH_LIBRARY_IMPL(flashcore, CompositeExplicitAutograd, m) {
  m.impl("explain", TORCH_BOX(&explain));
}

// ---- reasons.h for the Python package ------------------------------------------------------
// Plain C functions (exports.map), read through ctypes by python/flashcore/__init__.py and
// _ops.py, so the sentences, codes, bases and family names have one definition: reasons.h.

#define FC_OP_EXPORT extern "C" __attribute__((visibility("default")))

// The sentence of an op-level reason code (1 .. status base - 1): the forward's (explain's)
// wording, or with `backward` nonzero explain_bwd's. NULL for a code reasons.h does not list.
FC_OP_EXPORT const char* fc_op_reason_string(int code, int backward) {
  const flashcore_op::reason::Info* i = flashcore_op::reason::find(code);
  if (i == nullptr) return nullptr;
  return backward && i->bwd_sentence != nullptr ? i->bwd_sentence : i->sentence;
}

// Who gives a reason code: FC_OP_REASON_FWD | _BWD | _ROUTE bits (reasons.h); 0 if none does.
FC_OP_EXPORT int fc_op_reason_given_by(int code) {
  const flashcore_op::reason::Info* i = flashcore_op::reason::find(code);
  return i == nullptr ? 0 : i->given_by;
}

// The code of the reason reasons.h names `name` (e.g. "kMaskRequiresGrad"); -1 if none.
FC_OP_EXPORT int fc_op_reason_code(const char* name) {
  if (name == nullptr) return -1;
  for (const flashcore_op::reason::Info& i : flashcore_op::reason::kInfos)
    if (std::strcmp(i.name, name) == 0) return static_cast<int>(i.code);
  return -1;
}

// Reason = this + fc_status: a fallback because the C layer said that status.
FC_OP_EXPORT int fc_op_reason_status_base(void) {
  return static_cast<int>(flashcore_op::reason::kStatusBase);
}

// Reason = this + fc_status: a kernel runs in the sm80 family; the sm90 family said that status.
FC_OP_EXPORT int fc_op_reason_note_base(void) {
  return static_cast<int>(flashcore_op::reason::kNoteBase);
}

// An fc_family's name ("auto", "sm80", "sm90", "decode"); NULL for another value.
FC_OP_EXPORT const char* fc_op_family_name(int family) { return flashcore_op::family_name(family); }
