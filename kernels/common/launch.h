// common/launch.h - host-side launch helpers shared by the kernel families' launchers.
#pragma once

#include <cuda_runtime.h>

namespace flashcore {

// Raise a kernel's dynamic shared memory limit past the default 48 KB, once per device
// (`configured`: a bitmask of the devices done, up to 64; a static of the caller's per kernel).
template <typename Kernel>
cudaError_t allow_smem(Kernel kernel, int bytes, unsigned long long *configured, int device) {
    const unsigned long long bit = 1ull << (device & 63);
    if (bytes <= 48 * 1024 || (__atomic_load_n(configured, __ATOMIC_ACQUIRE) & bit)) return cudaSuccess;
    const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (err == cudaSuccess) __atomic_fetch_or(configured, bit, __ATOMIC_ACQ_REL);
    return err;
}

}  // namespace flashcore
