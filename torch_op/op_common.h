// op_common.h - helpers shared by the op library's two files (flashcore_op.cpp: the forward,
// flashcore_bwd_op.cpp: the backward kernel op): errors with our own message, the device's
// compute capability, and a broadcast-aware stride. Header-only, stable ABI only.
#pragma once

#include <torch/csrc/stable/tensor.h>

#include <cuda_runtime_api.h>

#include <mutex>
#include <sstream>
#include <stdexcept>
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

// Compute capability per device, asked once from the CUDA runtime (one cache for the library).
inline std::pair<int, int> compute_capability(int32_t device) {
  static std::mutex mu;
  static std::vector<std::pair<int, int>> cache;
  std::lock_guard<std::mutex> lock(mu);
  if (device < 0) device = 0;
  if (static_cast<size_t>(device) >= cache.size()) cache.resize(device + 1, {-1, -1});
  if (cache[device].first < 0) {
    int major = 0, minor = 0;
    const cudaError_t e1 = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    const cudaError_t e2 = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
    if (e1 != cudaSuccess || e2 != cudaSuccess)
      fail("flashcore: cannot read the compute capability of cuda:", device, ": ",
           cudaGetErrorString(e1 != cudaSuccess ? e1 : e2));
    cache[device] = {major, minor};
  }
  return cache[device];
}

// A size-1 dim's stride is meaningless; report 0 so it never trips alignment checks.
inline int64_t stride_or_0(const torch::stable::Tensor& t, int64_t d) {
  return t.size(d) == 1 ? 0 : t.stride(d);
}

}  // namespace flashcore_op

#define FC_CHECK(cond, ...)                              \
  do {                                                   \
    if (!(cond)) ::flashcore_op::fail(__VA_ARGS__);      \
  } while (0)
