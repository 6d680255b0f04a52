// launch_once.cuh - one-time, per-device launch configuration shared by the kernel families.
#pragma once

#include <cuda_runtime.h>

#include <mutex>

namespace flashcore {

// Runs `configure()` (e.g. cudaFuncSetAttribute for > 48 KB of shared memory) once per device
// for the calling launcher, under a lock, so concurrent first calls from several threads
// neither skip it nor race each other. Returns configure()'s error, or cudaSuccess.
template <typename Configure>
cudaError_t once_per_device(int device, Configure configure) {
    static std::mutex mutex;
    static unsigned long long done = 0;  // bit d: device d configured (devices 0-63)
    const unsigned long long bit = 1ull << (device & 63);
    std::lock_guard<std::mutex> lock(mutex);
    if (done & bit) return cudaSuccess;
    const cudaError_t err = configure();
    if (err == cudaSuccess) done |= bit;
    return err;
}

}  // namespace flashcore
