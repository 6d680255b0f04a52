// sm90/fwd_launch.cuh - host side of the Hopper forward (sm90/fwd_kernel.cuh): for validated params
// (c_src/dispatch.c), the tensor maps (built per call with cuTensorMapEncodeTiled, fetched through
// the runtime's driver entry point so the library does not link libcuda, and passed as
// __grid_constant__ parameters), the configuration (launch_fwd: band, mask, softcap, D=64's shape), and
// the grid (launch_fwd_config: a cluster or grid split-KV, else a persistent grid in snake order,
// paired_grid for causal, or one CTA per tile); the static_asserts that tie the D=64 shapes to
// c_src/launch_rules.h; and FLASHCORE_DEFINE_SM90_FWD, which the kernels/fwd_sm90_hdim*_*.cu files
// instantiate per (head dim, dtype) (with the profiling trace's copy-out, FLASHCORE_SM90_TRACE).
#pragma once

#include "common/fast_div.cuh"
#include "common/launch.h"           // launch_config
#include "common/split_combine.cuh"  // combine_kernel, partial_rows (kGridSplit)
#include "config.h"                  // fc_config_get
#include "flashcore.h"
#include "launch_rules.h"
#include "runtime.h"
#include "sm90/fwd_kernel.cuh"
#include "sm90/fwd_split.cuh"
#include "sm90/fwd_traits.cuh"
#include "sm90/tensor_map.h"
#include "sm90/varlen_blocks.cuh"

#include <cuda.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace flashcore {
namespace sm90 {

// The largest grid G <= sms for which the snake order gives every CTA complementary causal
// tiles in consecutive rounds: a tile's rank within its head is t mod m_blocks, and it reverses
// from one round to the next exactly when m_blocks divides 2 G.
inline int64_t paired_grid(int64_t m_blocks, int64_t sms) {
    if (m_blocks % 2 == 0) return (m_blocks / 2) * (2 * sms / m_blocks);
    return m_blocks * (sms / m_blocks);
}

// The (query block, head, batch) tiles of a call in configuration T.
template <typename T>
int64_t tile_count(const fc_params &p) {
    return (p.seqlen_q + T::kBlockM - 1) / T::kBlockM * p.heads_q * p.batch;
}

// `device` and `sms`: the current device and its SM count (launch_fwd reads them once per call).
template <typename Elem, int kHeadDim, bool kCausal, int kShape, bool kBand = false, bool kSoftcap = false>
cudaError_t launch_fwd_config(const fc_params &p, cudaStream_t stream, int device, int sms) {
    using T = FwdTraits<kHeadDim, kCausal, kShape>;
    const CUtensorMapDataType dtype =
        p.dtype == FC_DTYPE_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
    FwdMaps maps = {};
    cudaError_t err = make_tensor_map(&maps.q, &maps.q_order, p.q, dtype, p.seqlen_q, p.heads_q, p.batch, p.head_dim,
                                      p.q_stride_s, p.q_stride_h, p.q_stride_b, T::kBlockM);
    if (err == cudaSuccess)
        err = make_tensor_map(&maps.k, &maps.k_order, p.k, dtype, p.seqlen_k, p.heads_kv, p.batch, p.head_dim,
                              p.k_stride_s, p.k_stride_h, p.k_stride_b, T::kBlockN);
    if (err == cudaSuccess)
        err = make_tensor_map(&maps.v, &maps.v_order, p.v, dtype, p.seqlen_k, p.heads_kv, p.batch, p.head_dim,
                              p.v_stride_s, p.v_stride_h, p.v_stride_b, T::kBlockN);
    // kMasked: the bool mask as (keys, queries, heads, batch) bytes, boxes of kBlockN keys (one
    // 128- or 64-byte row, swizzled as the consumers read it: sm90/fwd_traits.cuh) x kBlockM
    // queries; a broadcast head or batch dim (stride 0) is one of size 1.
    if (err == cudaSuccess && kShape == kMasked)
        err = make_map(&maps.mask, &maps.mask_order, p.mask, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, p.seqlen_k, p.seqlen_q,
                       p.mask_stride_h != 0 ? p.heads_q : 1, p.mask_stride_b != 0 ? p.batch : 1, p.mask_stride_q,
                       p.mask_stride_h, p.mask_stride_b, T::kBlockN, T::kBlockM,
                       T::kBlockN == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B);
    if (err != cudaSuccess) return err;
    // O through TMA where the configuration has staging buffers (kOBufs) and O's map encodes;
    // else 16-byte stores from registers. (The A/B switch to the register stores,
    // FLASHCORE_SM90_TMA_STORE=0, is retired: docs/TUNING.md.)
    if (T::kOBufs > 0)
        maps.o_tma = make_tensor_map(&maps.o, &maps.o_order, p.out, dtype, p.seqlen_q, p.heads_q, p.batch,
                                     p.head_dim, p.o_stride_s, p.o_stride_h, p.o_stride_b, 64) == cudaSuccess;
    const int64_t m_blocks = (p.seqlen_q + T::kBlockM - 1) / T::kBlockM;
    const int64_t tiles = tile_count<T>(p);
    maps.m_blocks_div = FastDiv(static_cast<int>(m_blocks));
    maps.heads_q_div = FastDiv(static_cast<int>(p.heads_q));
    maps.group_div = FastDiv(static_cast<int>(p.heads_q / p.heads_kv));
    // kPair on grids of at most half the SMs (see the producer and the key loop in fwd_kernel):
    // both S GEMMs of a two-key-tile warpgroup at once, and the first key tile loaded alone.
    // (The A/B switch to the interleaved order, FLASHCORE_SM90_PAIR_ORDER=0, is retired:
    // docs/TUNING.md.)
    maps.pair_s_ahead = kShape == kPair && 2 * tiles <= sms;
    maps.pair_lead_load = maps.pair_s_ahead;

    auto kernel = fwd_kernel<Elem, kHeadDim, kCausal, kShape, kBand, kSoftcap>;
    // Per device, once: the shared-memory opt-in.
    static int configured[64];
    if (device >= 64 || !__atomic_load_n(&configured[device], __ATOMIC_ACQUIRE)) {
        err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSmemBytes);
        if (err != cudaSuccess) return err;
        if (device < 64) __atomic_store_n(&configured[device], 1, __ATOMIC_RELEASE);
    }
    // A persistent grid, about one CTA per SM (each needs most of an SM's shared memory), looping
    // over the tiles in snake order (snake_tile), so the next tile's loads overlap the current
    // tile's tail and the per-CTA setup is paid once. Causal tiles differ in length: their grid
    // is paired_grid(), where consecutive rounds give each CTA complementary tiles, and only up
    // to 64 query blocks per head; longer causal calls run one CTA per tile (the hardware's block
    // scheduler hands tiles out as SMs free up). Measured (H100, one run, causal, vs cuDNN in the
    // same pass, S = 512/1k/2k/4k/8k/16k; two passes for the paired grid):
    //   one CTA per tile  D=64 0.62/0.69/0.86/0.93/0.97/1.03  D=128 0.75/0.84/0.92/0.98/0.93/1.03
    //                     D=256 0.81/0.86/0.92/0.98/1.00/1.07
    //   paired grid       D=64 0.81,0.74/0.76,0.74/0.92,0.93/0.98,0.99/0.98,0.96/1.07,0.99
    //                     D=128 0.87/0.94/1.01/1.04/1.05,1.03/0.97,0.96
    //                     D=256 0.83/0.91/1.01/1.07/1.10,1.09/1.04,1.08
    // At 16k the CTAs drift apart over heads whose K/V (8 MB each at D=128) no longer share L2,
    // hence the 64-block limit. Before the pairing, 132 CTAs in snake order lost 27% at D=128
    // 16k (128 blocks per head do not divide 2 x 132), and plain round-robin lost 40% at D=64 4k.

    // Split-KV for grids that leave most SMs idle (B=1 prefill, a chunk of queries against a
    // cache): clusters of `splits` CTAs share each tile's key tiles and merge through
    // distributed shared memory (SplitSlots, finish_split_rows). How many: fc_prefill_splits in
    // c_src/launch_rules.c, from the CTAs that fit at once in clusters of each size (clusters must
    // sit inside one GPC, so fewer fit than SMs). FLASHCORE_KV_SPLITS=1..8 (config.h) forces a
    // split count (for A/B runs and the tests' split-independence checks). Measured (H100, fp16,
    // GQA 32:8, eager medians, ratio = cuDNN time / ours in the same run;
    // docs/experiments/first-versions.md):
    //   Sq x Sk, D        unsplit           split (count chosen)    forced 2 / 4 / 8
    //   128 x 4096, 128   55.1 us (1.01x)   30.9 us (1.78x, 3)      1.49 / 1.13 / 1.02x
    //   256 x 32768, 128  405 us (0.93x)    217 us (1.73x, 2)       1.82 / 1.12 / 1.16x
    //   256 x 8192, 64    97.4 us (0.78x)   57.4 us (1.46-1.74x, 2) 1.39 / 0.87 / 0.86x
    //   B=1 H=8 S=512 D=64 (24 tiles of 4 key tiles): 14.8 us eager, 11.0 in a graph, split or
    //   not (cuDNN 12.2 / 9.1): there the fixed cost of a CTA, not its key loop, sets the time.
    // Merging with all remote loads issued before any is used beat one peer at a time by ~3%.
    cudaLaunchAttribute attrs[2];
    if constexpr (kGridSplit<kHeadDim, kCausal, kShape>) {
        if (p.num_splits_ > 1) {
            // Grid split for decoding (fc_sm90_decode_splits in c_src/dispatch.c sets num_splits_ and
            // the workspace): `splits` consecutive CTAs per tile, no cluster, each leaving its
            // partial in the workspace, then combine_kernel merges them (as the decode kernels do).
            // Clusters cannot give a one-row call over 8 or 32 (batch, KV head) pairs one CTA per
            // SM: clusters of 4 or 8 do not all fit in one wave (GPCs of 16-18 SMs). Measured (H100,
            // fp16, D=128, Hq=32, eager us with a cold L2, cuDNN / this family): B=1 Hkv=32 Sk=128k
            // with clusters of 2 (64 CTAs) 716 / 731, of 4 947, of 8 807, split over the grid (128
            // CTAs) 710 / 707; Hkv=8 clusters of 8 (64 CTAs) 195 / 201, grid 193.4 / 195.0
            // (docs/experiments/sessions-17-23.md, twentieth session).
            const int64_t ctas = tiles * p.num_splits_;
            const bool pdl = fc_use_pdl(ctas, sms) != 0;
            cudaLaunchConfig_t cfg = launch_config(ctas, 0, pdl, T::kThreads, T::kSmemBytes, stream, attrs);
            const cudaError_t err = cudaLaunchKernelEx(&cfg, kernel, maps, p);
            if (err != cudaSuccess) return err;
            const float *partial_o = static_cast<const float *>(p.workspace);
            const float *partial_lse = partial_o + partial_rows(p) * p.num_splits_ * kHeadDim;
            cfg = launch_config(partial_rows(p), 0, pdl, kCombineThreads, 0, stream, attrs);  // (it waits for the split grid)
            return cudaLaunchKernelEx(&cfg, combine_kernel<Elem, kHeadDim>, p, static_cast<int>(p.num_splits_), partial_o,
                                      partial_lse);
        }
    }
    int splits = 1;
    const int forced = fc_config_get()->kv_splits;  // 0: not forced
    // kPair never splits across CTAs: its warpgroups already split the keys, merging in the CTA.
    // (Sinks are added in the unsplit epilogue: a call with them is not split either.)
    // (Nor is a masked one: its rows may see no key in a CTA's share, which the merges do not
    // expect.)
    const bool may_split = kShape != kPair && kShape != kMasked && p.sinks == nullptr;
    if (may_split && forced >= 1 && forced <= kMaxKvSplits) {
        splits = forced;
    } else if (may_split && fc_grid_is_small(tiles, sms)) {  // (saves the occupancy query on full grids)
        // CTAs that run at once in clusters of s (s = 1..8), per device, queried once.
        static int wave_ctas[64][kMaxKvSplits + 1];
        static int wave_known[64];
        int uncached[kMaxKvSplits + 1] = {0};
        int *wave = device < 64 ? wave_ctas[device] : uncached;
        if (device >= 64 || !__atomic_load_n(&wave_known[device], __ATOMIC_ACQUIRE)) {
            for (int s = 1; s <= kMaxKvSplits; ++s) {
                cudaLaunchAttribute attrs[2];
                const cudaLaunchConfig_t cfg = launch_config(s, s, false, T::kThreads, T::kSmemBytes, nullptr, attrs);
                int clusters = 0;
                if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg) != cudaSuccess) {
                    (void)cudaGetLastError();  // not sticky; this size is simply never chosen
                    clusters = 0;
                }
                wave[s] = clusters * s;
            }
            if (device < 64) __atomic_store_n(&wave_known[device], 1, __ATOMIC_RELEASE);
        }
        // Key tiles of the longest block (B=1 H=8 Sq=128 Sk=8192 D=64 causal: 1 key tile, not
        // 64; split 7.3 us, unsplit 3.7).
        // (A band: a block's rows see at most kBlockM + hi - lo keys.)
        const int64_t key_len = kBand ? (p.seqlen_k < T::kBlockM + p.band_hi_ - p.band_lo_ ? p.seqlen_k : T::kBlockM + p.band_hi_ - p.band_lo_)
                                      : fc_longest_key_run(p.seqlen_q, p.seqlen_k, kCausal);  // launch_rules.h
        const int min_key_tiles = kShape == kTiny ? FC_PREFILL_MIN_KEY_TILES_PER_SPLIT_TINY : FC_PREFILL_MIN_KEY_TILES_PER_SPLIT;
        splits = fc_prefill_splits(tiles, (key_len + T::kBlockN - 1) / T::kBlockN, min_key_tiles, wave, kMaxKvSplits);
    }
    if (splits > 1) {
        const bool pdl = fc_use_pdl(tiles * splits, sms) != 0;
        const cudaLaunchConfig_t cfg = launch_config(tiles * splits, splits, pdl, T::kThreads, T::kSmemBytes, stream, attrs);
        return cudaLaunchKernelEx(&cfg, kernel, maps, p);
    }

    int64_t persistent_grid = sms;
    // kPair runs one tile per CTA: its merge region and its stage-per-warpgroup ring assume it.
    bool persistent = kShape != kPair;
    // (A band: the balanced grid or one CTA per tile, below.)
    if (kCausal && !kBand && persistent) {
        persistent_grid = paired_grid(m_blocks, sms);
        persistent = m_blocks <= 64 && persistent_grid * 10 >= static_cast<int64_t>(sms) * 9;
    }
    // Non-causal tiles are all alike: the fewest CTAs that keep the rounds (fc_balanced_grid).
    // Measured (H100, fp16, two passes, all interleaved call by call, ratio to cuDNN, 132 CTAs ->
    // balanced): 256 one-row decode tiles, 128 CTAs: B=8 Hkv=32 8k 0.994-0.996 -> 1.002-1.003,
    // 32k 0.998-0.999 -> 1.006-1.011, B=32 Hkv=8 8k 0.991 -> 1.000-1.001, 128k 0.998 -> 1.009-1.010;
    // the prefill sweep (2048 or 3072 tiles, 128 CTAs) D=128 and D=64 within +-1%.
    if ((!kCausal || kBand) && persistent) persistent_grid = fc_balanced_grid(tiles, sms);
    // A band whose blocks see at least kBandTilesPerCta key tiles runs one CTA per tile (the
    // hardware's block scheduler evens out the shorter blocks at the band's start); shorter
    // bands run the balanced persistent grid. Measured (H100, bf16, forward, us, same run;
    // persistent balanced / one CTA per tile): D=128 S=16k window 4k 1687 / 1563, 1k 520 / 577;
    // D=64 S=8k window 4k 552 / 470, 1k 212 / 208, window S-2 771 / 616 (docs/experiments/README.md).
    constexpr int64_t kBandTilesPerCta = 16;
    if (kBand && (T::kBlockM + static_cast<int64_t>(p.band_hi_) - p.band_lo_) >= kBandTilesPerCta * T::kBlockN)
        persistent = false;
    const int64_t grid = persistent && tiles > persistent_grid ? persistent_grid : tiles;
    const cudaLaunchConfig_t cfg = launch_config(grid, 0, fc_use_pdl(grid, sms) != 0, T::kThreads, T::kSmemBytes, stream, attrs);
    return cudaLaunchKernelEx(&cfg, kernel, maps, p);
}

// A packed variable-length call (fc_params.cu_seq_q; kVarlen in sm90/fwd_kernel.cuh): the list of the
// sequences' query blocks first (varlen_blocks_kernel, into the workspace), then the forward as a
// persistent grid over (head, block) tiles, in stream order (no programmatic dependent launch: its
// CTAs read the list's length at their start). The tensor maps hold all rows as one batch item;
// out and the LSE get their row strides as batch strides, since a tile's batch is its sequence's
// first row (varlen_tile). D=64 takes its SHORT configuration (128-row blocks, as the list's).
template <typename Elem, int kHeadDim, bool kCausal, int kShape>
cudaError_t launch_varlen_config(const fc_params &p, cudaStream_t stream, int device, int sms) {
    using T = FwdTraits<kHeadDim, kCausal, kShape>;
    static_assert(T::kBlockM == FC_VARLEN_BLOCK_ROWS, "the block list's rows are the configuration's");
    const CUtensorMapDataType dtype =
        p.dtype == FC_DTYPE_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
    FwdMaps maps = {};
    cudaError_t err = make_tensor_map(&maps.q, &maps.q_order, p.q, dtype, p.total_q, p.heads_q, 1, p.head_dim,
                                      p.q_stride_s, p.q_stride_h, 0, T::kBlockM);
    if (err == cudaSuccess)
        err = make_tensor_map(&maps.k, &maps.k_order, p.k, dtype, p.total_k, p.heads_kv, 1, p.head_dim, p.k_stride_s,
                              p.k_stride_h, 0, T::kBlockN);
    if (err == cudaSuccess)
        err = make_tensor_map(&maps.v, &maps.v_order, p.v, dtype, p.total_k, p.heads_kv, 1, p.head_dim, p.v_stride_s,
                              p.v_stride_h, 0, T::kBlockN);
    if (err != cudaSuccess) return err;
    // O through TMA for the 64-row blocks that lie inside their sequence (store_rows), where each
    // consumer warpgroup has a staging buffer of its own; the map over the packed rows.
    maps.o_tma = T::kOBufs == T::kConsumerWarpgroups &&
                 make_tensor_map(&maps.o, &maps.o_order, p.out, dtype, p.total_q, p.heads_q, 1, p.head_dim, p.o_stride_s,
                                 p.o_stride_h, 0, 64) == cudaSuccess;
    maps.heads_q_div = FastDiv(static_cast<int>(p.heads_q));
    maps.group_div = FastDiv(static_cast<int>(p.heads_q / p.heads_kv));
    fc_params run = p;
    run.o_stride_b = p.o_stride_s;
    run.lse_stride_b = p.lse_stride_s;

    auto kernel = fwd_kernel<Elem, kHeadDim, kCausal, kShape, false, false, true>;
    static int configured[64];
    if (device >= 64 || !__atomic_load_n(&configured[device], __ATOMIC_ACQUIRE)) {
        err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSmemBytes);
        if (err != cudaSuccess) return err;
        if (device < 64) __atomic_store_n(&configured[device], 1, __ATOMIC_RELEASE);
    }
    varlen_blocks_kernel<Elem><<<1, kVarlenListThreads, 0, stream>>>(run);
    err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    const int64_t most_tiles = fc_varlen_block_capacity(p.total_q, p.batch) * p.heads_q;
    const int64_t grid = most_tiles < sms ? most_tiles : sms;
    cudaLaunchAttribute attrs[2];
    const cudaLaunchConfig_t cfg = launch_config(grid, 0, false, T::kThreads, T::kSmemBytes, stream, attrs);
    return cudaLaunchKernelEx(&cfg, kernel, maps, run);
}

// D=64's configuration: fc_sm90_d64_config (c_src/launch_rules.c), with the rules and their
// measurements. FLASHCORE_SM90_SHORT=0 / 1 / 2 / 3 (config.h) forces long / short / tiny / pair
// (A/B runs and the tests).
static_assert(kLong == FC_SM90_D64_LONG && kShort == FC_SM90_D64_SHORT && kTiny == FC_SM90_D64_TINY &&
                  kPair == FC_SM90_D64_PAIR, "fc_sm90_d64_config names the configurations");
template <bool kCausal>
constexpr bool d64_blocks_match() {
    return FwdTraits<64, kCausal, kLong>::kBlockM == FC_SM90_D64_LONG_ROWS &&
           FwdTraits<64, kCausal, kShort>::kBlockM == FC_SM90_D64_SHORT_ROWS &&
           FwdTraits<64, kCausal, kTiny>::kBlockM == FC_SM90_D64_TINY_ROWS &&
           FwdTraits<64, kCausal, kPair>::kBlockM == FC_SM90_D64_TINY_ROWS &&
           FwdTraits<64, kCausal, kPair>::kBlockN == FC_SM90_D64_KEY_TILE &&
           FwdTraits<64, kCausal, kTiny>::kBlockN == FC_SM90_D64_KEY_TILE;
}
static_assert(d64_blocks_match<false>() && d64_blocks_match<true>(), "fc_sm90_d64_config counts these blocks");

// A general band (p.band_ == FC_BAND_GENERAL_, c_src/launch_rules.h) runs in the causal LONG
// configuration of each head dim (kBand); a softcap (kSoftcap) the LONG one of its kind.
template <typename Elem, int kHeadDim, bool kCausal>
cudaError_t launch_fwd(const fc_params &p, const fc_device_facts &dev, cudaStream_t stream) {
    const int device = dev.device, sms = dev.sms;
    if (p.cu_seq_q != nullptr)
        return launch_varlen_config<Elem, kHeadDim, kCausal, kHeadDim == 64 ? kShort : kLong>(p, stream, device, sms);
    if constexpr (kCausal)
        if (p.band_ == FC_BAND_GENERAL_)
            return p.softcap != 0.f ? launch_fwd_config<Elem, kHeadDim, true, kLong, true, true>(p, stream, device, sms)
                                    : launch_fwd_config<Elem, kHeadDim, true, kLong, true>(p, stream, device, sms);
    // A bool mask whose tiles TMA reads (c_src/dispatch.c: no band, softcap or sinks; top-left
    // causal or none): the masked configuration.
    if (p.mask_kind != FC_MASK_NONE) return launch_fwd_config<Elem, kHeadDim, kCausal, kMasked>(p, stream, device, sms);
    // A softcap: the LONG configuration (no D=64 small-grid shapes).
    if (p.softcap != 0.f) return launch_fwd_config<Elem, kHeadDim, kCausal, kLong, false, true>(p, stream, device, sms);
    if constexpr (kHeadDim == 64) {
        const int forced = fc_config_get()->sm90_d64_config;  // -1: not forced
        const int shape = forced >= kLong && forced <= kPair
                              ? forced
                              : fc_sm90_d64_config(p.batch, p.heads_q, p.seqlen_q, p.seqlen_k, kCausal, sms);
        if (shape == kShort) return launch_fwd_config<Elem, kHeadDim, kCausal, kShort>(p, stream, device, sms);
        if (shape == kTiny) return launch_fwd_config<Elem, kHeadDim, kCausal, kTiny>(p, stream, device, sms);
        if (shape == kPair) return launch_fwd_config<Elem, kHeadDim, kCausal, kPair>(p, stream, device, sms);
    }
    return launch_fwd_config<Elem, kHeadDim, kCausal, kLong>(p, stream, device, sms);
}

}  // namespace sm90
}  // namespace flashcore

#if FLASHCORE_SM90_TRACE
#define FLASHCORE_SM90_TRACE_COPY(HDIM, DTYPE_NAME)                                              \
    extern "C" __attribute__((visibility("default"))) int fc_sm90_trace_hdim##HDIM##_##DTYPE_NAME(void *dst, int clear) { \
        if (clear) {                                                                             \
            static unsigned long long zeros[flashcore::sm90::kTracePerWg];                       \
            for (int i = 0; i < flashcore::sm90::kTraceCtas * 4; ++i)                            \
                cudaMemcpyToSymbol(flashcore::sm90::g_trace, zeros, sizeof zeros, i * sizeof zeros); \
            return 0;                                                                            \
        }                                                                                        \
        return cudaMemcpyFromSymbol(dst, flashcore::sm90::g_trace, sizeof flashcore::sm90::g_trace); \
    }
#else
#define FLASHCORE_SM90_TRACE_COPY(HDIM, DTYPE_NAME)
#endif
#define FLASHCORE_DEFINE_SM90_FWD(HDIM, DTYPE_NAME, ELEM)                                       \
    extern "C" cudaError_t fc_sm90_fwd_hdim##HDIM##_##DTYPE_NAME(                              \
        const fc_params *p, const fc_device_facts *dev, cudaStream_t stream) {                 \
        return p->causal ? flashcore::sm90::launch_fwd<ELEM, HDIM, true>(*p, *dev, stream)     \
                         : flashcore::sm90::launch_fwd<ELEM, HDIM, false>(*p, *dev, stream);   \
    }                                                                                          \
    FLASHCORE_SM90_TRACE_COPY(HDIM, DTYPE_NAME)
