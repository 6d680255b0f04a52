// sm90/ptx.cuh - device-side building blocks of the Hopper kernels: wgmma shared-memory
// descriptors and the wgmma fence/commit/wait protocol, mbarrier waits, and TMA loads of 4-D
// (column, row, head, batch) tensor maps. The forward (sm90/fwd_*.cuh) and the backward
// (sm90/bwd_kernel.cuh) are built from them.
#pragma once

#include <cuda.h>
#include <cuda/ptx>
#include <stdint.h>

namespace flashcore {
namespace sm90 {

namespace ptx = cuda::ptx;

// wgmma shared-memory descriptor for a 128-byte-swizzled tile (layout type 1 in bits 62-63).
// lbo/sbo in bytes: K-major operands step 8-row groups by sbo (1024) and ignore lbo;
// N-major V steps 64-column panels by lbo and 8-row groups by sbo.
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
    return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) |
           (static_cast<uint64_t>((lbo >> 4) & 0x3FFF) << 16) |
           (static_cast<uint64_t>((sbo >> 4) & 0x3FFF) << 32) | (1ull << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
// Keep the compiler from moving accumulator reads/writes across an asynchronous wgmma.
template <int N>
__device__ __forceinline__ void fence_registers(float (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}

__device__ __forceinline__ void wait_barrier(uint64_t *bar, uint32_t parity) {
    while (!ptx::mbarrier_try_wait_parity(bar, parity)) {
    }
}

// TMA load of one box into shared memory, completing on `bar`. Coordinates are in the tensor
// map's dim order (see make_tensor_map on the host).
__device__ __forceinline__ void tma_load(void *dst, const CUtensorMap *map, const int32_t (&coords)[4],
                                         uint64_t *bar) {
    ptx::cp_async_bulk_tensor(ptx::space_cluster, ptx::space_global, dst, map, coords, bar);
}

// Where the tensor map puts the (column, row, head, batch) coordinates: the host orders the
// map's dims 1-3 by stride, so this small permutation travels with the kernel parameters.
struct MapOrder {
    int8_t row_dim, head_dim, batch_dim;  // positions 1..3 in the coordinate array
};

__device__ __forceinline__ void set_coords(int32_t (&c)[4], const MapOrder &o, int col, int row,
                                           int head, int batch) {
    // Selects, not c[o.row_dim] = ...: a run-time index would put the array in local memory.
    c[0] = col;
#pragma unroll
    for (int i = 1; i < 4; ++i) c[i] = i == o.row_dim ? row : (i == o.head_dim ? head : batch);
}

}  // namespace sm90
}  // namespace flashcore
