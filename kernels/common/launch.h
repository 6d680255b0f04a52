// common/launch.h - host-side launch helpers shared by the kernel families' launchers.
#pragma once

#include "common/sm80_ptx.cuh"  // pdl_launch_attribute

#include <cuda_runtime.h>
#include <stdint.h>

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

// A launch of `grid` CTAs with its attributes in `attrs` (at most 2): clusters of `cluster_size`
// CTAs (0: no cluster attribute; the occupancy query needs one even for clusters of 1), and
// programmatic dependent launch when `pdl` (fc_use_pdl, fc_sm90_bwd_use_pdl).
inline cudaLaunchConfig_t launch_config(dim3 grid, int cluster_size, bool pdl, int threads, int smem_bytes,
                                        cudaStream_t stream, cudaLaunchAttribute (&attrs)[2]) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = dim3(static_cast<unsigned>(threads));
    cfg.dynamicSmemBytes = static_cast<size_t>(smem_bytes);
    cfg.stream = stream;
    cfg.attrs = attrs;
    cfg.numAttrs = 0;
    if (cluster_size > 0) {
        cudaLaunchAttribute &cluster = attrs[cfg.numAttrs++];
        cluster.id = cudaLaunchAttributeClusterDimension;
        cluster.val.clusterDim.x = static_cast<unsigned>(cluster_size);
        cluster.val.clusterDim.y = cluster.val.clusterDim.z = 1;
    }
    if (pdl) attrs[cfg.numAttrs++] = pdl_launch_attribute();
    return cfg;
}
// The same for a 1-D grid.
inline cudaLaunchConfig_t launch_config(int64_t grid, int cluster_size, bool pdl, int threads, int smem_bytes,
                                        cudaStream_t stream, cudaLaunchAttribute (&attrs)[2]) {
    return launch_config(dim3(static_cast<unsigned>(grid)), cluster_size, pdl, threads, smem_bytes, stream, attrs);
}

}  // namespace flashcore
