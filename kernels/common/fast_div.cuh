// fast_div.cuh - division by a divisor fixed for a whole launch, as a multiply-high, an add and
// a shift (Granlund and Montgomery, "Division by invariant integers using multiplication",
// 1994). Exact for 0 <= n < 2^31 and 1 <= d < 2^31: with shift = ceil(log2 d) and
// mul = floor(2^32 (2^shift - d) / d) + 1, n / d = (umulhi(n, mul) + n) >> shift, and the sum
// fits in 32 bits because umulhi(n, mul) <= n < 2^31.
//
// Used by the Hopper forward's tile decode (kernels/sm90/fwd_traits.cuh, decode_tile), where two
// run-time integer divisions per tile were each a ~30-instruction chain around a MUFU.RCP.
// Host-callable as well, so that tests/c/test_fast_div.cpp checks it against n / d on the CPU.
#pragma once

#include <stdint.h>

#ifdef __CUDACC__
#define FC_HOST_DEVICE __host__ __device__
#else
#define FC_HOST_DEVICE
#endif

namespace flashcore {

struct FastDiv {
    uint32_t d, mul, shift;

    FastDiv() = default;  // (so that a kernel's parameter struct holding some stays an aggregate)
    FC_HOST_DEVICE explicit FastDiv(int divisor) : d(static_cast<uint32_t>(divisor)) {
        shift = 32 - count_leading_zeros(d - 1);  // ceil(log2(d)); 0 for d = 1
        mul = static_cast<uint32_t>(((1ull << 32) * ((1ull << shift) - d)) / d + 1);
    }
    FC_HOST_DEVICE int div(int n) const {
        return static_cast<int>((mul_high(static_cast<uint32_t>(n), mul) + static_cast<uint32_t>(n)) >> shift);
    }

  private:
    FC_HOST_DEVICE static uint32_t count_leading_zeros(uint32_t x) {  // 32 for x = 0
#ifdef __CUDA_ARCH__
        return static_cast<uint32_t>(__clz(x));
#else
        return x == 0 ? 32u : static_cast<uint32_t>(__builtin_clz(x));
#endif
    }
    FC_HOST_DEVICE static uint32_t mul_high(uint32_t a, uint32_t b) {
#ifdef __CUDA_ARCH__
        return __umulhi(a, b);
#else
        return static_cast<uint32_t>((static_cast<uint64_t>(a) * b) >> 32);
#endif
    }
};

}  // namespace flashcore
