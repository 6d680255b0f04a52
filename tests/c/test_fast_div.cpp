// FastDiv (kernels/common/fast_div.cuh) against n / d on the CPU: every n < 20000 for every
// d < 3000, the largest n and the multiples of d (and one below) near it for random d, and
// 20 M random pairs over the whole range (n < 2^31, 1 <= d < 2^31). The same code runs in the
// Hopper forward's tile decode. Exits 1 on the first few mismatches, printed.
#include "common/fast_div.cuh"

#include <cstdint>
#include <cstdio>
#include <random>

int main() {
    long checks = 0, wrong = 0;
    auto check = [&](uint32_t d, uint32_t n) {
        const flashcore::FastDiv fd(static_cast<int>(d));
        const uint32_t got = static_cast<uint32_t>(fd.div(static_cast<int>(n)));
        ++checks;
        if (got != n / d && wrong++ < 5) std::printf("FastDiv(%u).div(%u) = %u, expected %u\n", d, n, got, n / d);
    };
    for (uint32_t d = 1; d < 3000; ++d)
        for (uint32_t n = 0; n < 20000; ++n) check(d, n);
    std::mt19937_64 rng(20261127);
    const uint32_t n_max = 0x7fffffffu;
    for (int i = 0; i < 2000000; ++i) {
        const uint32_t d = 1 + static_cast<uint32_t>(rng() % n_max);
        check(d, n_max);
        const uint64_t multiple = (n_max / d) * static_cast<uint64_t>(d);  // the largest multiple of d <= n_max
        check(d, static_cast<uint32_t>(multiple));
        if (multiple > 0) check(d, static_cast<uint32_t>(multiple - 1));
    }
    for (int i = 0; i < 20000000; ++i)
        check(1 + static_cast<uint32_t>(rng() % n_max), static_cast<uint32_t>(rng() % (uint64_t{n_max} + 1)));
    std::printf("FastDiv: %ld checks, %ld wrong\n", checks, wrong);
    return wrong == 0 ? 0 : 1;
}
