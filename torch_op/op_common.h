// op_common.h - helpers shared by the op library's files (flashcore_op.cpp: the forward,
// flashcore_bwd_op.cpp: the backward kernel op, paged_op.cpp and varlen_op.cpp: the fused
// varlen calls): errors with our own message, the device's compute capability, a broadcast-aware
// stride, an attn_mask described to the C layer, and a planned forward's launch (run_planned).
// Header-only, stable ABI only.
#pragma once

#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>

#include "config.h"
#include "flashcore.h"
#include "reasons.h"

#include <cuda_runtime_api.h>

#include <array>
#include <cmath>
#include <cstring>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

// Declared in aoti_torch/c/shim.h only under USE_CUDA; exported by libtorch_cuda since 2.x.
extern "C" AOTITorchError aoti_torch_get_current_cuda_stream(int32_t device_index,
                                                             void** ret_stream);

namespace flashcore_op {

// Like STD_TORCH_CHECK (throws std::runtime_error, which the dispatcher turns into a Python
// RuntimeError), but the message is only ours: no function name, file or line in front of it.
template <typename... Args>
[[noreturn]] void fail(const Args&... args) {
  std::ostringstream oss;
  ((oss << args), ...);
  throw std::runtime_error(oss.str());
}

// A device's compute capability and SM count, asked once from the CUDA runtime (one cache for
// the library).
struct DeviceFacts {
  int major = -1, minor = -1, sm_count = 0;
};
inline DeviceFacts device_facts(int32_t device) {
  static std::mutex mu;
  static std::vector<DeviceFacts> cache;
  std::lock_guard<std::mutex> lock(mu);
  if (device < 0) device = 0;
  if (static_cast<size_t>(device) >= cache.size()) cache.resize(device + 1);
  if (cache[device].major < 0) {
    DeviceFacts f;
    const cudaError_t e1 = cudaDeviceGetAttribute(&f.major, cudaDevAttrComputeCapabilityMajor, device);
    const cudaError_t e2 = cudaDeviceGetAttribute(&f.minor, cudaDevAttrComputeCapabilityMinor, device);
    const cudaError_t e3 = cudaDeviceGetAttribute(&f.sm_count, cudaDevAttrMultiProcessorCount, device);
    const cudaError_t e = e1 != cudaSuccess ? e1 : e2 != cudaSuccess ? e2 : e3;
    if (e != cudaSuccess)
      fail("flashcore: cannot read the compute capability of cuda:", device, ": ", cudaGetErrorString(e));
    cache[device] = f;
  }
  return cache[device];
}

inline std::pair<int, int> compute_capability(int32_t device) {
  const DeviceFacts f = device_facts(device);
  return {f.major, f.minor};
}

// SDPA's scale: the caller's, else 1 / sqrt(head_dim) (PyTorch's default), for every op.
// FLASHCORE_FAMILY: read with the library's other overrides (c_src/config.h, fc_config_read,
// once per call in decide() and decide_bwd()), named by reasons.h's family names; "" (unset) is auto.
inline fc_family family_from_config(const fc_config& cfg) {
  const char* text = cfg.family;
  if (text[0] == '\0') return FC_FAMILY_AUTO;
  std::string names;  // 'auto', 'sm80', ... for the error
  for (int f = FC_FAMILY_AUTO; family_name(f) != nullptr; ++f) {
    if (std::strcmp(text, family_name(f)) == 0) return static_cast<fc_family>(f);
    names += (names.empty() ? "'" : ", '") + std::string(family_name(f)) + "'";
  }
  fail("flashcore: environment variable FLASHCORE_FAMILY must be one of ", names, " (got '", text,
       "')");
  return FC_FAMILY_AUTO;  // unreachable
}

inline double sdpa_scale(const std::optional<double>& scale, int64_t head_dim) {
  return scale.has_value() ? *scale : 1.0 / std::sqrt(static_cast<double>(head_dim));
}

// Where stand-ins for tensors not yet allocated "start" (the caching allocator's blocks are
// 512-byte aligned): the support queries check everything but the data. Never read.
template <typename T>
T* stand_in() {
  return reinterpret_cast<T*>(static_cast<uintptr_t>(512));
}

// A size-1 dim's stride is meaningless; report 0 so it never trips alignment checks.
inline int64_t stride_or_0(const torch::stable::Tensor& t, int64_t d) {
  return t.size(d) == 1 ? 0 : t.stride(d);
}

// Describe the mask as a (B, Hq, Sq, Sk) view with broadcast dims at stride 0. False: it can't.
inline bool describe_mask(const torch::stable::Tensor& mask, fc_params* p) {
  const int64_t nd = mask.dim();
  if (nd > 4) return false;
  const std::array<int64_t, 4> target{p->batch, p->heads_q, p->seqlen_q, p->seqlen_k};
  std::array<int64_t, 4> st{0, 0, 0, 0};
  for (int64_t i = 0; i < nd; ++i) {
    const int64_t td = 4 - nd + i;
    const int64_t sz = mask.size(i);
    if (sz == target[td]) st[td] = sz == 1 ? 0 : mask.stride(i);
    else if (sz == 1) st[td] = 0;
    else return false;
  }
  p->mask = mask.data_ptr();
  p->mask_stride_b = st[0];
  p->mask_stride_h = st[1];
  p->mask_stride_q = st[2];
  p->mask_stride_k = st[3];
  return true;
}

// attn_mask into p (sizes already set): bool masks as FC_MASK_BOOL, query's dtype as additive.
// 0, or the reason (reasons.h) the kernels cannot take it (another device, another dtype, not a
// broadcast view of (B, Hq, Sq, Sk)).
inline int64_t set_mask(const torch::stable::Tensor& mask, const torch::stable::Tensor& q, fc_params* p) {
  using torch::headeronly::ScalarType;
  if (mask.device() != q.device()) return reason::kMaskDevice;
  if (mask.scalar_type() == ScalarType::Bool) p->mask_kind = FC_MASK_BOOL;
  else if (mask.scalar_type() == q.scalar_type()) p->mask_kind = FC_MASK_ADDITIVE;
  else return reason::kMaskDtype;
  if (!describe_mask(mask, p)) return reason::kMaskShape;
  return 0;
}

// flashcore.attention's window_size and causal alignment into p (fc_params' window fields):
// (-1, -1) is no window. Raises for a side below -1.
inline void set_band(int64_t window_left, int64_t window_right, bool bottom_right, fc_params* p,
                     const char* op) {
  if (window_left < -1 || window_right < -1)
    fail(op, ": window_size must be (left, right) with each side -1 (unbounded) or >= 0, got (",
         window_left, ", ", window_right, ")");
  p->windowed = window_left >= 0 || window_right >= 0;
  p->window_left = window_left;
  p->window_right = window_right;
  p->alignment = bottom_right ? FC_ALIGN_BOTTOM_RIGHT : FC_ALIGN_TOP_LEFT;
}

// flashcore.attention's logit softcap (fc_params.softcap): 0 = none, else finite and > 0.
inline void set_softcap(double softcap, fc_params* p, const char* op) {
  if (!(softcap >= 0.0 && std::isfinite(softcap)) || static_cast<float>(softcap) == INFINITY)
    fail(op, ": softcap must be 0 (none) or a finite value > 0, got ", softcap);
  p->softcap = static_cast<float>(softcap);
}

// Launches a forward plan made for device `dev` (fc_sdpa_plan) on that device's current stream,
// with the call's out, LSE (NULL unless planned with one) and workspace (NULL when the plan needs
// none); any failure raises with `op`'s name and the C layer's sentence (and the CUDA error's).
// (Makes dev's primary context current on this thread first, as flashcore_op.cpp's run_kernel.)
inline void run_planned(const char* op, int32_t dev, const fc_fwd_plan& plan, void* out, float* lse, void* workspace) {
  const cudaError_t set_err = cudaSetDevice(dev);
  if (set_err != cudaSuccess) fail(op, ": cannot make cuda:", dev, " current: ", cudaGetErrorString(set_err));
  void* stream = nullptr;
  TORCH_ERROR_CODE_CHECK(aoti_torch_get_current_cuda_stream(dev, &stream));
  const fc_status s = fc_sdpa_fwd_planned(&plan, out, lse, workspace, workspace != nullptr ? plan.workspace_bytes : 0,
                                          static_cast<cudaStream_t>(stream));
  if (s == FC_ERR_CUDA) {
    const cudaError_t e = fc_last_cuda_error();
    fail(op, ": ", fc_status_string(s), ": ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
  }
  if (s != FC_OK) fail(op, ": ", fc_status_string(s));
}

// Runs a backward whose params are filled (gradients and workspace included) on device `dev`'s
// current stream; any failure raises with `op`'s name and the C layer's sentence. (Makes dev's
// primary context current first, as run_planned does.)
inline void run_bwd(const char* op, int32_t dev, const fc_bwd_params& p) {
  const cudaError_t set_err = cudaSetDevice(dev);
  if (set_err != cudaSuccess) fail(op, ": cannot make cuda:", dev, " current: ", cudaGetErrorString(set_err));
  void* stream = nullptr;
  TORCH_ERROR_CODE_CHECK(aoti_torch_get_current_cuda_stream(dev, &stream));
  const fc_status s = fc_sdpa_bwd(&p, static_cast<cudaStream_t>(stream));
  if (s == FC_ERR_CUDA) fail(op, ": ", fc_status_string(s), ": ", cudaGetErrorString(fc_last_cuda_error()));
  if (s != FC_OK) fail(op, ": ", fc_status_string(s));
}

}  // namespace flashcore_op

#define FC_CHECK(cond, ...)                              \
  do {                                                   \
    if (!(cond)) ::flashcore_op::fail(__VA_ARGS__);      \
  } while (0)
