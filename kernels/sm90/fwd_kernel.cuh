// sm90/fwd_kernel.cuh - the Hopper (sm_90a) fused attention forward kernel (fwd_kernel): TMA +
// wgmma + warp specialization. Its types and switches are in sm90/fwd_traits.cuh, the split-KV
// merge in sm90/fwd_split.cuh, its launch in sm90/fwd_launch.cuh.
//
// What it computes: the same as fwd_sm80.cuh, O = softmax(scale * Q K^T [causal]) V and the
// natural-log LSE, for one (batch, query head) and a block of kBlockM = 64 x (consumer
// warpgroups) query rows per CTA (64 rows for D=64's pair configuration, below).
//
// How (one CTA = one producer and 1-3 consumer warpgroups):
//   * Warpgroup 0 is the producer. It gives most of its registers away (setmaxnreg.dec) and
//     one thread issues every load with the tensor memory accelerator: Q once, then K and V
//     tiles of kBlockN rows into a kStages-deep ring. Each load completes on an mbarrier
//     ("full"); the consumers release a stage through another mbarrier ("empty").
//   * The other warpgroups (2 for D=128 and 256; for D=64 3, or 2 or 1 for grids that would
//     leave SMs idle, fc_sm90_d64_config) are consumers, 64 query rows each, with the
//     registers the producer gave up (setmaxnreg.inc). D=64's pair configuration (one-wave
//     grids) gives two consumers the same 64 rows, one the even key tiles and one the odd,
//     merged through shared memory at the end (FwdConfig, kPair). On grids of at most half
//     the SMs a pair CTA loads its first key tile alone before the rest (pair_lead_load).
//     Per K/V tile: S = Q K^T with wgmma (both operands in shared memory, K-major; at D=128
//     non-causal Q comes from registers, loaded once per tile: kQInRegs), the online
//     softmax in fp32 registers (exp2, scale folded into log2(e)), then O += P V with wgmma
//     taking P straight from registers (the accumulator layout of S is the A-fragment layout)
//     and V from shared memory read N-major (no transpose pass).
//   * Tiles use the 128-byte swizzle that TMA writes and wgmma reads: a row of 64 elements is
//     128 bytes, so a head dim of 128 is stored as two 64-column panels.
//   * Ragged edges cost nothing: the tensor maps describe each (batch, head) slice as 4-D, so
//     TMA zero-fills rows past Sq or Sk; only the keys past Sk (and, causal, past the diagonal)
//     are masked, and only in the tiles that contain them.
//   * Persistent: at most one CTA per SM loops over (query block, head, batch) tiles in snake
//     order; non-causal grids take the fewest CTAs that keep the rounds (fc_balanced_grid).
//     Q has two buffers where they fit (kQBufs), so the next tile's Q loads during this one;
//     with one, the buffer is released as soon as the last S = Q K^T of a tile completes. The
//     next tile's K/V loads run under the current tile's last P V and its epilogue, and at
//     D=64's non-causal three-warpgroup blocks the next tile's first S = Q K^T goes out in the
//     current tile's last GEMM turn (kCarryS). The tile decode divides by multiply-high and
//     shift (FastDiv). Causal calls take a grid that pairs long and short tiles, up to 64 query
//     blocks per head; longer ones launch one CTA per tile (see launch_fwd).
//   * Causal: key tiles wholly past the diagonal are never loaded; within a block, a
//     warpgroup's key tiles past its own rows' diagonal take their GEMM turns without GEMMs
//     (seen_end), and a diagonal tile whose keys 64..127 its rows never see runs P V and the
//     softmax on its first 64 keys (kHalfTiles).
//   * Split-KV for small grids (a B=1 prefill, a chunk of queries against a cache): when the
//     tiles fill at most half the SMs, a cluster of 2-8 CTAs shares each tile, each CTA runs
//     its share of the key tiles, and they merge their partial O and row statistics through
//     distributed shared memory: no workspace, no second kernel. D=64 pushes each partial to
//     the CTA that finalises its rows (st.async, counted by that CTA's mbarrier: SplitSlots);
//     D=128 and 256, with no shared memory to spare, read the peers' (finish_split_rows).
//     One-row D=128 decoding over few (batch, KV head) pairs splits over the grid instead
//     (kGridSplit): partials to a workspace, merged by a second kernel (common/split_combine.cuh).
//   * Epilogue: each consumer warpgroup normalises its 64 rows into a staging buffer in shared
//     memory (stmatrix, in the 128-byte-swizzled layout TMA reads) and one thread stores them
//     with TMA, which clips the rows past Sq; the threads go straight on to the next tile. The
//     buffer's next user waits on an mbarrier that the issuing thread arrives on once the store
//     has read it. Where no staging fits (the pair) and in split CTAs, each thread writes its
//     rows from registers in 16-byte stores (quad_transpose regroups a quad's accumulator words
//     so that each lane holds 8 consecutive columns: sm90/fwd_epilogue.cuh). The staging cost
//     D=128 causal a K/V stage and D=256 16 keys per tile (FwdConfig); measured in
//     docs/experiments/sessions-10-16.md (twelfth session).
//   * Lazy rescaling at D=256 (kLazyRescale): O is rescaled only when a row's max grew by more
#pragma once

#include "common/fast_div.cuh"
#include "common/sm80_ptx.cuh"
#include "common/split_combine.cuh"  // partial_rows (kGridSplit)
#include "common/wgmma_generated.cuh"
#include "dispatch.h"  // fc_band_key_tiles
#include "flashcore.h"
#include "sm90/fwd_epilogue.cuh"
#include "sm90/fwd_split.cuh"
#include "sm90/fwd_traits.cuh"
#include "sm90/ptx.cuh"

#include <cuda.h>
#include <cuda/ptx>
#include <math.h>
#include <stdint.h>
#include <type_traits>

namespace flashcore {
namespace sm90 {

#ifndef FLASHCORE_SM90_TRACE
#define FLASHCORE_SM90_TRACE 0
#endif
// Profiling only (built with -DFLASHCORE_SM90_TRACE=1; off, the kernels are unchanged): thread 0
// of every consumer warpgroup records numbered events of its loop (`trace` in fwd_kernel) with the
// SM's clock into g_trace, kTracePerWg entries per (CTA of the first kTraceCtas, warpgroup), each
// event << 56 | argument << 48 | clock. tools/sm90_trace.py reads it through fc_sm90_trace_hdim*_*
// and prints where the cycles go between events.
constexpr int kTracePerWg = 4096, kTraceCtas = 160;
#if FLASHCORE_SM90_TRACE
__device__ unsigned long long g_trace[kTraceCtas * 4 * kTracePerWg];
#endif

// The kernel's compile-time shape, shared by the steps below.
template <typename Elem_, int kHeadDim_, bool kCausal_, int kShape_, bool kBand_, bool kSoftcap_>
struct FwdKernelShape {
    using Elem = Elem_;
    using T = FwdTraits<kHeadDim_, kCausal_, kShape_>;
    static constexpr int kHeadDim = kHeadDim_, kShape = kShape_;
    static constexpr bool kCausal = kCausal_, kBand = kBand_, kSoftcap = kSoftcap_;
    static constexpr int kBlockM = T::kBlockM, kBlockN = T::kBlockN, kStages = T::kStages;
    static constexpr int kNTiles = kBlockN / 8;   // 8-column accumulator tiles of S
    static constexpr int kDTiles = kHeadDim / 8;  // 8-column accumulator tiles of O
    static constexpr int kW = T::kConsumerWarpgroups;
    static constexpr int kKeySplit = T::kKeySplit;
    // Warpgroups that share rows split the keys instead of taking turns (kPair).
    static constexpr bool kPingPong = kW > 1 && kKeySplit == 1;
    // Causal, 128-key tiles, one warpgroup per row group: a warpgroup whose 64 rows start a key
    // tile sees only that tile's first 64 keys, so its P V on that tile runs on those 64 keys
    // (half_tile in the key loop). The S GEMM on 64 keys too (m64n64 into half of S) made ptxas
    // serialise the wgmma pipeline (C7511) in D=64 LONG and D=128: causal 2k-4k 0.73-0.78 of cuDNN.
    static constexpr bool kHalfTiles = kCausal && !kBand && kBlockN == 128 && kKeySplit == 1;
    // A warpgroup with no live row skips its key tiles (seen_end in the key loop). Only where the
    // loop has no carried S (kCarryS issues the next tile's S in the section it assumes is last).
    static constexpr bool kSkipDeadRows = kHeadDim == 128 && !kCausal;
    using Bars = Barriers<T::kQBufs, kStages, T::kOBufs>;
};

// O's rows times their rescale factors (rescale[h]: the thread's row h).
template <int kN>
__device__ __forceinline__ void rescale_rows(float (&o_acc)[kN], const float (&rescale)[2]) {
#pragma unroll
    for (int d = 0; d < kN / 4; ++d) {
        o_acc[d * 4 + 0] *= rescale[0];
        o_acc[d * 4 + 1] *= rescale[0];
        o_acc[d * 4 + 2] *= rescale[1];
        o_acc[d * 4 + 3] *= rescale[1];
    }
}

// P = S in Elem, as wgmma A fragments: the S accumulator layout of two 8-key tiles is the
// A-fragment layout of one 16-key step. kLive: the 8-key tiles of S that hold P (the rest,
// masked for every row of a half tile, feed no GEMM).
template <typename Elem, int kLive, int kKSteps, int kN>
__device__ __forceinline__ void convert_to_p(uint32_t (&p_frag)[kKSteps][4], const float (&s)[kN]) {
#pragma unroll
    for (int kk = 0; kk < kLive / 2; ++kk) {
        p_frag[kk][0] = pack2<Elem>(s[(2 * kk) * 4 + 0], s[(2 * kk) * 4 + 1]);
        p_frag[kk][1] = pack2<Elem>(s[(2 * kk) * 4 + 2], s[(2 * kk) * 4 + 3]);
        p_frag[kk][2] = pack2<Elem>(s[(2 * kk + 1) * 4 + 0], s[(2 * kk + 1) * 4 + 1]);
        p_frag[kk][3] = pack2<Elem>(s[(2 * kk + 1) * 4 + 2], s[(2 * kk + 1) * 4 + 3]);
    }
}

// S = Q K^T for ring slot i into `acc` (s, or kPair's s_next), asynchronous.
template <class K>
__device__ __forceinline__ void issue_s_gemm(float (&acc)[K::kNTiles * 4], int i, typename K::Bars &bars, uint32_t q_base,
                                             uint32_t k_base,
                                             uint32_t (&q_frag)[kQInRegs<K::kHeadDim, K::kCausal> ? K::kHeadDim / 16 : 1][4]) {
    using Elem = typename K::Elem;
    using T = typename K::T;
    constexpr int kHeadDim = K::kHeadDim, kBlockN = K::kBlockN, kStages = K::kStages;
    constexpr bool kCausal = K::kCausal;
    const int stage = i % kStages;
    wait_barrier(&bars.k_full[stage], (i / kStages) & 1);
    // Descriptors of the tiles' starts; each k-step adds its byte offset / 16 to the start
    // address field (bits 0-13), which cannot carry out: shared addresses stay below 256 KB.
    // (Built from scratch per k-step they took ~15 dependent instructions per wgmma, with the
    // Q address in ordinary registers: the issuing warpgroup's fixed-latency stalls held up
    // the ping-pong. Measured on the H100, same run, ratio to cuDNN: D=128 causal 4k 1.04 ->
    // 1.075, 16k 0.96 -> 1.01; D=256 causal 4k 1.07 -> 1.11, non-causal 4k 0.96 -> 1.00;
    // D=64 non-causal 512 0.93 -> 0.95; geomean of 38 sweep shapes 0.972 -> 0.992-1.001.)
    const uint64_t desc_q0 = smem_desc(q_base, 16, 1024);
    const uint64_t desc_k0 = smem_desc(k_base + stage * T::kKVTileBytes, 16, 1024);
    fence_registers(acc);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
        const uint32_t offset = (kk % 4) * 32;  // 16 columns = 32 bytes along a 128-byte row
        const uint64_t desc_q = desc_q0 + ((kk / 4) * T::kQPanelBytes + offset) / 16;
        const uint64_t desc_k = desc_k0 + ((kk / 4) * T::kKVPanelBytes + offset) / 16;
        if constexpr (kQInRegs<kHeadDim, kCausal>)
            Wgmma<kBlockN, WgmmaA::RS, Elem>::template mma<0>(acc, q_frag[kk], desc_k, kk > 0);
        else
            Wgmma<kBlockN, WgmmaA::SS, Elem>::template mma<0>(acc, desc_q, desc_k, kk > 0);
    }
    wgmma_commit();
}

// O += P V for ring slot i, asynchronous (`half`, `overwrite`: see issue_pv in fwd_kernel).
template <class K>
__device__ __forceinline__ void issue_pv_gemm(float (&o_acc)[K::kDTiles * 4], int i, bool half, bool overwrite,
                                              typename K::Bars &bars, uint32_t v_base,
                                              uint32_t (&p_frag)[K::kBlockN / 16][4]) {
    using Elem = typename K::Elem;
    using T = typename K::T;
    constexpr int kHeadDim = K::kHeadDim, kBlockN = K::kBlockN, kStages = K::kStages;
    constexpr bool kHalfTiles = K::kHalfTiles;
    const int stage = i % kStages;
    wait_barrier(&bars.v_full[stage], (i / kStages) & 1);
    const uint64_t desc_v0 = smem_desc(v_base + stage * T::kKVTileBytes, T::kKVPanelBytes, 1024);
    auto steps = [&](auto keys_tag) {
        fence_registers(o_acc);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < decltype(keys_tag)::value / 16; ++kk) {
            // 16 keys = two 8-row groups of 1024 bytes; 64-column panels of V are lbo apart.
            const uint64_t desc_v = desc_v0 + kk * 2048 / 16;
            Wgmma<kHeadDim, WgmmaA::RS, Elem>::template mma<1>(o_acc, p_frag[kk], desc_v, kk > 0 || !overwrite);
        }
    };
    if constexpr (kHalfTiles)
        if (half) {
            steps(std::integral_constant<int, kBlockN / 2>{});
            wgmma_commit();
            return;
        }
    steps(std::integral_constant<int, kBlockN>{});
    wgmma_commit();
}

// kPair: merges the two warpgroups' partials of the same rows through shared memory, each
// finalising half of O's columns.
template <class K, class Trace>
__device__ __forceinline__ void merge_pair(float (&o_acc)[K::kDTiles * 4], float (&row_max)[2], float (&row_sum)[2],
                                           float (&inv_sum)[2], unsigned char *smem_v, int key_part, float scale_log2,
                                           Trace &trace) {
    using T = typename K::T;
    constexpr int kKeySplit = K::kKeySplit, kDTiles = K::kDTiles, kStages = K::kStages, kW = K::kW;
    // kPair: each warpgroup finalises half of O's columns (16-byte store group `key_part`,
    // column tiles 4 key_part .. 4 key_part + 3). Each leaves its partial of the other
    // half and its row statistics (per thread, in the accumulator layout both share,
    // lane-contiguous: no bank conflicts) in its own region, both meet at one named
    // barrier, and each merges the other's partial into its half in registers and writes
    // it. (Before, the even-tile warpgroup merged and wrote all of O after the odd-tile
    // one had left its whole partial: a longer serial tail, ~1500 traced cycles at the
    // small shape. Measured, H100, us per call in a CUDA graph, tools/d64_configs.py, two
    // passes: B=1 H=8 512 x 512 5.80 / 5.77 -> 5.50 / 5.54, causal 5.61 / 5.63 -> 5.35 /
    // 5.29, B=2 6.07 -> 5.71 / 5.65, H=16 6.06 -> 5.60 / 5.67.) Indices into o_acc stay
    // compile-time: the halves are chosen with selects and predicates, not by a run-time
    // offset. A CTA has one tile (launch_fwd).
    static_assert(kKeySplit == 2 && kDTiles == 8, "the pair splits D=64's two 16-byte store groups");
    constexpr int kHalf = kDTiles * 2;  // accumulator words of one half of the columns
    float *pair = reinterpret_cast<float *>(smem_v + kStages * T::kKVTileBytes);
    float *own_region = pair + key_part * (kHalf + 4) * 128;
    const float *other_region = pair + (1 - key_part) * (kHalf + 4) * 128;
    const int t = threadIdx.x % 128;
#pragma unroll
    for (int i = 0; i < kHalf; ++i)  // the half the other warpgroup finalises
        own_region[i * 128 + t] = key_part == 0 ? o_acc[kHalf + i] : o_acc[i];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        own_region[(kHalf + h) * 128 + t] = row_max[h];
        own_region[(kHalf + 2 + h) * 128 + t] = row_sum[h];
    }
    trace(13, 0);
    asm volatile("bar.sync %0, 256;\n" ::"n"(kW + 2) : "memory");
    trace(14, 0);
    float w_own[2], w_other[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const float other_max = other_region[(kHalf + h) * 128 + t];
        const float other_sum = other_region[(kHalf + 2 + h) * 128 + t];
        const float mx = fmaxf(row_max[h], other_max);
        w_own[h] = partial_weight(row_max[h], mx, scale_log2);  // raw score units
        w_other[h] = partial_weight(other_max, mx, scale_log2);
        row_sum[h] = w_own[h] * row_sum[h] + w_other[h] * other_sum;
        row_max[h] = mx;
        inv_sum[h] = 1.f / row_sum[h];
    }
#pragma unroll
    for (int i = 0; i < kHalf; ++i) {
        const int h = (i % 4) / 2;  // accumulator word i holds row (i % 4) / 2 of the pair
        const float other = other_region[i * 128 + t];
        if (key_part == 0)
            o_acc[i] = w_own[h] * o_acc[i] + w_other[h] * other;
        else
            o_acc[kHalf + i] = w_own[h] * o_acc[kHalf + i] + w_other[h] * other;
    }
    trace(15, 0);
}

// The online softmax of key tile n's S, in place (S becomes P): masks, row max, exponentials, row sums.
// row_max is kept in raw score units; the scale (> 0, see fc_dispatch) goes into one
// FFMA per element: p = exp2(s * scale * log2(e) - max * scale * log2(e)).
// Returns whether this warp moved its rows' exponent base (else O needs no rescaling).
// kPvWaitInSoftmax (kEarlyPvWait, kMidPvWait): when `pv_pending` it also calls `finish_pv`
// (waits for O += P(n-1) V(n-1), releases its V stage), rescales O and converts P(n).
template <class K, class FinishPv>
__device__ __forceinline__ bool online_softmax(int n, float (&rescale)[2], bool pv_pending, FinishPv &&finish_pv,
                                               float (&s)[K::kNTiles * 4], float (&row_max)[2], float (&row_sum)[2],
                                               float (&o_acc)[K::kDTiles * 4], uint32_t (&p_frag)[K::kBlockN / 16][4],
                                               const fc_params &p, int seqlen_k, int wg_row0, int row0, int col_in_tile,
                                               float scale_log2, float softcap_in) {
    using Elem = typename K::Elem;
    constexpr int kHeadDim = K::kHeadDim, kBlockM = K::kBlockM, kBlockN = K::kBlockN, kNTiles = K::kNTiles;
    constexpr bool kCausal = K::kCausal, kBand = K::kBand, kSoftcap = K::kSoftcap, kHalfTiles = K::kHalfTiles;
    auto rescale_o = [&](const float (&rescale)[2]) { rescale_rows(o_acc, rescale); };
    auto convert_p = [&](auto live_tag) { convert_to_p<Elem, decltype(live_tag)::value>(p_frag, s); };
    if constexpr (kSoftcap)
#pragma unroll
        for (int i = 0; i < kNTiles * 4; ++i) s[i] = fast_tanh(s[i] * softcap_in);
    const int n_start = n * kBlockN;
    const bool ragged = n_start + kBlockN > seqlen_k;
    // (kBand: the tile crosses the upper edge of the warpgroup's first row or the lower
    // edge of its last.)
    const bool crosses_diagonal =
        kBand ? n_start + kBlockN - 1 > wg_row0 + p.band_hi_ || n_start < wg_row0 + 63 + p.band_lo_
              : kCausal && n_start + kBlockN - 1 > wg_row0;
    bool first_half_only = false;  // only S's first 64 keys are live: this is the key loop's half_tile (kHalfTiles)
    if (ragged || crosses_diagonal) {
        // This thread's columns are n_start + col_in_tile + c, c = j * 8 + (e & 1) a
        // compile-time constant; row h keeps those with c < valid[h] (keys before
        // seqlen_k and, causal, up to the row itself): one compare with an immediate and
        // one select per element. (Comparing col >= seqlen_k and col > row per element
        // took 198 instructions, 364 static cycles, for D=64; ci/sass_schedule.py.)
        int valid[2], below[2];  // kBand: also c < below[h] is masked (keys before the row's band)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int key_end = kBand     ? min(seqlen_k, row0 + h * 8 + p.band_hi_ + 1)
                                : kCausal ? min(seqlen_k, row0 + h * 8 + 1)
                                          : seqlen_k;
            valid[h] = key_end - n_start - col_in_tile;
            below[h] = row0 + h * 8 + p.band_lo_ - n_start - col_in_tile;
        }
        // Causal, not ragged, 128-key tiles: this warpgroup's 64 rows start `band` 64-key
        // halves into the tile (both offsets are multiples of 64). Its rows see all of
        // the halves before that one and none after it, so only that half needs the
        // per-element compare; the halves after it are set to -inf. Half the compares and
        // selects of the general form (D=64 SHORT: 65 or 96 instructions against 129).
        // Measured (H100, fp16, 3 interleaved passes, ratio to cuDNN): D=64 causal 512
        // 0.946-0.951 -> 0.965-0.967, 1k 0.943-0.948 -> 0.943-0.971, 2k 1.000 -> 0.995;
        // D=128 causal 512-2k within +-0.5%.
        static_assert(kBlockM % 64 == 0 && kBlockN % 64 == 0, "band: 64-row and 64-key alignment");
        auto mask = [&](auto band_tag) {  // band_tag: the band, or -1 (every half per element)
            constexpr int kHalf = decltype(band_tag)::value;
#pragma unroll
            for (int j = 0; j < kNTiles; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int half = j / 8;  // 64-key half of the tile
                    const int c = j * 8 + (e & 1);
                    const bool masked = kHalf < 0 || half == kHalf ? c >= valid[e >> 1] || (kBand && c < below[e >> 1])
                                                                   : half > kHalf;
                    // (Band 0 with kHalfTiles: the second half is left out below.)
                    if (masked && !(kHalfTiles && kHalf == 0 && half > 0)) s[j * 4 + e] = -INFINITY;
                }
        };
        const bool banded = kCausal && !kBand && kNTiles == 16 && !ragged;
        const int band = (wg_row0 - n_start) / 64;
        if (banded && band == 0) {
            mask(std::integral_constant<int, 0>{});
            first_half_only = kHalfTiles;
        } else if (banded && band == 1)
            mask(std::integral_constant<int, 1>{});
        else
            mask(std::integral_constant<int, -1>{});
    }
    // The rest runs over the live 8-key tiles of S: all, or the first half on a half tile
    // (its other half is never read: its P V takes the first 64 keys only). Measured
    // against the half P V alone (H100, fp16, 3 interleaved passes, ratio to cuDNN): D=64
    // causal 2k 1.047-1.049 -> 1.068-1.069, 4k 1.076 -> 1.087-1.094; 512-1k and D=128
    // within the spread.
    auto finish = [&](auto live_tag) -> bool {
        constexpr int kLive = decltype(live_tag)::value;
        float mx[2], base[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            mx[h] = row_max[h];
#pragma unroll
            for (int j = 0; j < kLive; ++j) mx[h] = fmaxf(mx[h], fmaxf(s[j * 4 + 2 * h], s[j * 4 + 2 * h + 1]));
            mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffff, mx[h], 1));
            mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffff, mx[h], 2));
        }
        // Lazy rescaling (must_rebase): the warp's rows keep their bases unless one of them
        // must move. One vote per warp and tile.
        bool rebase_row = false;
#pragma unroll
        for (int h = 0; h < 2; ++h) rebase_row |= must_rebase(mx[h], row_max[h], scale_log2);
        const bool rebase = !kLazyRescale<kHeadDim> || __any_sync(0xffffffff, rebase_row);
        if constexpr (kEarlyPvWait<kHeadDim>)
            if (pv_pending) finish_pv();
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            if (!rebase) mx[h] = row_max[h];
            // A row that has seen only masked keys keeps max -inf; exponentiate against 0.
            base[h] = mx[h] == -INFINITY ? 0.f : mx[h] * scale_log2;
        }
        // p = exp2(fmaf(s, c, -round(mx * c))) is off from exp2((s - mx) * c) by the rounding
        // of mx * c, |mx * c| * 2^-24 in the exponent: nothing for ordinary scores, but with
        // huge scores or scales (scale = 1e30 in tests/test_bad_inputs.py) that residual is
        // itself huge and exp2 of it overflows (inf / inf = NaN). A warp whose rows reach
        // |mx * c| >= 4096 takes the exact form (s - mx) * c for this tile instead. The
        // choice is one vote per warp and tile. Measured against the fold alone (H100, fp16,
        // same runs, 3 passes each): a per-row branch cost 4-9% (D=64 causal 4k 383 vs 422
        // TFLOP/s); this vote costs 1-4% (D=64 causal 16k 455 vs 474, D=128 causal 4k 530 vs
        // 546, D=128 non-causal 16k 629 vs 636), the price of no NaN at huge scales.
        auto exponentiate = [&](auto exact_tag) {
            constexpr bool kExact = decltype(exact_tag)::value;
            // The exact form's reference: the max, or 0 for a row that has seen no key
            // yet (kBand: -inf - -inf would be NaN; its scores are all -inf, so 0 gives
            // p = 0). A select here, not in the loop: one there serialised the GEMMs
            // (ptxas C7514).
            [[maybe_unused]] float row_ref[2];
            if constexpr (kBand)
#pragma unroll
                for (int h = 0; h < 2; ++h) row_ref[h] = mx[h] == -INFINITY ? 0.f : mx[h];
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                // kExact: exactly 1 when the max did not move (a row still at -inf too),
                // else the difference is taken before scaling, never a rounding residual.
                rescale[h] = kExact ? (row_max[h] == mx[h] ? 1.f : fast_exp2((row_max[h] - mx[h]) * scale_log2))
                                    : fast_exp2(row_max[h] * scale_log2 - base[h]);
                row_max[h] = mx[h];
                float sum = 0.f;
#pragma unroll
                for (int j = 0; j < kLive; ++j) {
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        float &x = s[j * 4 + 2 * h + e];
                        x = kExact ? fast_exp2((x - (kBand ? row_ref[h] : mx[h])) * scale_log2)
                                   : fast_exp2(fmaf(x, scale_log2, -base[h]));
                    }
                    sum += s[j * 4 + 2 * h] + s[j * 4 + 2 * h + 1];
                }
                row_sum[h] = row_sum[h] * rescale[h] + sum;
                if constexpr (kMidPvWait<kHeadDim>)
                    if (h == 0 && pv_pending) finish_pv();
            }
            if constexpr (kPvWaitInSoftmax<kHeadDim>) {
                if (pv_pending) rescale_o(rescale);  // (never lazy here: always rebased)
                convert_p(live_tag);
            }
        };
        const bool huge = fabsf(base[0]) >= 4096.f || fabsf(base[1]) >= 4096.f;
        if (__any_sync(0xffffffff, huge))
            exponentiate(std::true_type{});
        else
            exponentiate(std::false_type{});
        return rebase;
    };
    if constexpr (kHalfTiles)
        if (first_half_only) return finish(std::integral_constant<int, kNTiles / 2>{});
    return finish(std::integral_constant<int, kNTiles>{});
}

// A cluster split without kPushMerge (D=128, 256): leaves this CTA's partials in shared memory and
// finishes its share of the rows from every peer's (finish_split_rows).
template <class K>
__device__ __forceinline__ void read_merge_split(float (&o_acc)[K::kDTiles * 4], float (&row_max)[2], float (&row_sum)[2],
                                                 float *part_o, float2 *part_ml, int row_group, int warp_in_wg, int row_in_warp,
                                                 int col_in_tile, int lane, float scale_log2, const Tile &tile,
                                                 const fc_params &p) {
    using Elem = typename K::Elem;
    using T = typename K::T;
    constexpr int kHeadDim = K::kHeadDim, kBlockM = K::kBlockM, kDTiles = K::kDTiles, kW = K::kW;
    // Leave this CTA's partials in the K/V ring (running on into the O staging, which
    // split CTAs do not use), once every consumer warpgroup is past its last P V (the
    // producer has nothing in flight: each loaded tile was consumed).
    using SP = SplitPartials<kHeadDim, kBlockM>;
    static_assert(SP::kBytes <= T::kOStageOffset + T::kOBufs * T::kOStageBytes - T::kQBufs * T::kQBytes,
                  "split partials must fit the K/V ring and the O staging");
    asm volatile("bar.sync %0, %1;\n" ::"r"(kW + 1), "n"(128 * kW) : "memory");
    const int r0 = row_group * 64 + warp_in_wg * 16 + row_in_warp;  // row within the block
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float *dst = part_o + (r0 + 8 * h) * SP::kOPitch + col_in_tile;
#pragma unroll
        for (int d = 0; d < kDTiles; ++d)
            *reinterpret_cast<float2 *>(dst + d * 8) = make_float2(o_acc[d * 4 + 2 * h], o_acc[d * 4 + 2 * h + 1]);
        if ((lane % 4) == 0)
            part_ml[r0 + 8 * h] = make_float2(row_max[h] == -INFINITY ? -INFINITY : row_max[h] * scale_log2, row_sum[h]);
    }
    cluster_sync_all();  // every CTA's partials are written
    finish_split_rows<Elem, kHeadDim, kBlockM>(smem_addr(part_o), cluster_rank(), cluster_size(), threadIdx.x - 128, 128 * kW,
                                               tile.m_block, tile.head, tile.batch, p);
    // No CTA leaves (freeing its shared memory) while a peer reads it. Relaxed: every
    // remote load above has returned (its value was stored), so nothing needs releasing,
    // and the default release would wait for this CTA's global stores of O (a GPU-scope
    // MEMBAR in the SASS).
    ptx::barrier_cluster_arrive(ptx::sem_relaxed);
    ptx::barrier_cluster_wait();
}

// kGridSplit: writes this CTA's partial of its rows and their LSE to the workspace.
template <class K>
__device__ __forceinline__ void store_grid_split(float (&o_acc)[K::kDTiles * 4], float (&row_sum)[2], float (&inv_sum)[2],
                                                 float (&lse_log2)[2], int row0, int seqlen_q, int heads_q,
                                                 int col_in_tile, int lane, const Tile &tile, const fc_params &p) {
    constexpr int kHeadDim = K::kHeadDim, kDTiles = K::kDTiles;
    // Grid split (decoding): this CTA's partial of its rows, normalised over its keys,
    // and its base-2 LSE go to the workspace; combine_kernel (common/split_combine.cuh)
    // merges the splits. A row that saw no key (an empty range) leaves O = 0 and
    // LSE = -inf, which the merge weighs 0.
    const int splits = p.num_splits_, slot = static_cast<int>(blockIdx.x) % splits;
    float *part_o = static_cast<float *>(p.workspace);
    float *part_lse = part_o + partial_rows(p) * splits * kHeadDim;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int row = row0 + 8 * h;
        if (row >= seqlen_q) continue;
        const int64_t prow = (static_cast<int64_t>(tile.batch) * heads_q + tile.head) * seqlen_q + row;
        const bool seen = row_sum[h] > 0.f;
        float *dst = part_o + (prow * splits + slot) * kHeadDim + col_in_tile;
#pragma unroll
        for (int d = 0; d < kDTiles; ++d)
            *reinterpret_cast<float2 *>(dst + d * 8) =
                seen ? make_float2(o_acc[d * 4 + 2 * h] * inv_sum[h], o_acc[d * 4 + 2 * h + 1] * inv_sum[h])
                     : make_float2(0.f, 0.f);
        if ((lane % 4) == 0) part_lse[prow * splits + slot] = seen ? lse_log2[h] : -INFINITY;
    }
}

// Writes the natural-log LSE of the rows this thread finalises (once per row: lane 0 of the quad).
__device__ __forceinline__ void store_lse(float (&lse_log2)[2], bool (&finalise)[2], int row0, int seqlen_q, int lane,
                                          int key_part, const Tile &tile, const fc_params &p) {
    if (p.lse != nullptr && (lane % 4) == 0 && key_part == 0) {  // (kPair: both hold the merged rows)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = row0 + 8 * h;
            if (row < seqlen_q && finalise[h])
                p.lse[tile.batch * p.lse_stride_b + tile.head * p.lse_stride_h + row * p.lse_stride_s] =
                    lse_log2[h] * 0.6931471805599453f;
        }
    }
}

// Folds the head's attention sink (p.sinks) into the rows' normaliser and LSE.
__device__ __forceinline__ void apply_sink(float (&inv_sum)[2], float (&lse_log2)[2], int head, const fc_params &p) {
    // Attention sinks (p.sinks: one logit per query head, a key with no value in every row's
    // denominator): the row's keys weigh sigmoid(lse - sink) of it, and its LSE becomes
    // logaddexp(lse, sink), here in base 2. A CTA with sinks is never split (launch_fwd_config),
    // so this is the row's final LSE.
    if (p.sinks != nullptr) {
        const float sink2 = p.sinks[head] * 1.4426950408889634f;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const float top = fmaxf(lse_log2[h], sink2);
            if (top != -INFINITY) {  // (else no key and no sink: zeros, LSE -inf)
                const float total = top + __log2f(fast_exp2(lse_log2[h] - top) + fast_exp2(sink2 - top));
                inv_sum[h] *= fast_exp2(lse_log2[h] - total);
                lse_log2[h] = total;
            }
        }
    }
}

// Writes this warpgroup's normalised rows of O into its staging buffer at `stage` (stmatrix).
template <class K>
__device__ __forceinline__ void stage_o(float (&o_acc)[K::kDTiles * 4], float (&inv_sum)[2], uint32_t stage,
                                        int warp_in_wg, int lane) {
    using Elem = typename K::Elem;
    constexpr int kDTiles = K::kDTiles;
    const int matrix = lane / 8;  // lanes 8i..8i+7 address the rows of matrix i
    const int stage_row = warp_in_wg * 16 + (matrix & 1) * 8 + (lane & 7);
#pragma unroll
    for (int d = 0; d < kDTiles; d += 2) {
        // Matrices: column tile d rows 0-7 and 8-15 of the warp, then tile d + 1.
        const int chunk = d + (matrix >> 1);
        const uint32_t addr = stage + (chunk / 8) * (64 * 128) + stage_row * 128 + (((chunk % 8) ^ (lane & 7)) * 16);
        stmatrix_x4(addr, pack2<Elem>(o_acc[d * 4 + 0] * inv_sum[0], o_acc[d * 4 + 1] * inv_sum[0]),
                    pack2<Elem>(o_acc[d * 4 + 2] * inv_sum[1], o_acc[d * 4 + 3] * inv_sum[1]),
                    pack2<Elem>(o_acc[d * 4 + 4] * inv_sum[0], o_acc[d * 4 + 5] * inv_sum[0]),
                    pack2<Elem>(o_acc[d * 4 + 6] * inv_sum[1], o_acc[d * 4 + 7] * inv_sum[1]));
    }
}

// One thread's TMA store of the warpgroup's staged rows of O (buffer o_buf), committed as a group.
template <class K>
__device__ __forceinline__ void issue_o_store(int32_t (&c)[4], const FwdMaps &maps, unsigned char *smem_o, int o_buf,
                                              int wg_row0, const Tile &tile) {
    using T = typename K::T;
#pragma unroll
    for (int panel = 0; panel < T::kPanels; ++panel) {
        set_coords(c, maps.o_order, panel * 64, wg_row0, tile.head, tile.batch);
        ptx::cp_async_bulk_tensor(ptx::space_global, ptx::space_shared, &maps.o, c,
                                  smem_o + o_buf * T::kOStageBytes + panel * (64 * 128));
    }
    ptx::cp_async_bulk_commit_group();
}

// Writes this thread's normalised rows of O (those it finalises) from registers in 16-byte stores
// (w: the caller's scratch for one group's words).
template <class K>
__device__ __forceinline__ void store_o_16b(uint32_t (&w)[4], float (&o_acc)[K::kDTiles * 4], float (&inv_sum)[2],
                                            bool (&finalise)[2], int row0, int seqlen_q, int key_part, int lane,
                                            const Tile &tile, const fc_params &p) {
    using Elem = typename K::Elem;
    constexpr int kDTiles = K::kDTiles, kKeySplit = K::kKeySplit, kShape = K::kShape;
    // 16-byte stores: after quad_transpose each lane holds 8 consecutive columns of its row,
    // so a warp's store fills whole sectors (4-byte stores straight from the accumulator
    // layout filled half a sector each). fc_sdpa checked that out and its strides are
    // 16-byte aligned. All lanes shuffle; only rows inside the query store.
    static_assert(kDTiles % 4 == 0, "the quad transpose takes 4 column tiles at a time");
    Elem *out = static_cast<Elem *>(p.out) + tile.batch * p.o_stride_b + tile.head * p.o_stride_h;
    const int64_t o_stride = p.o_stride_s;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int row = row0 + 8 * h;
        Elem *out_row = out + row * o_stride + 8 * (lane % 4);
#pragma unroll
        for (int g = 0; g < kDTiles / 4; ++g) {
            if (kKeySplit > 1 && g != key_part) continue;  // kPair: the other warpgroup writes it
#pragma unroll
            for (int t = 0; t < 4; ++t) {
                const int d = 4 * g + t;
                w[t] = pack2<Elem>(o_acc[d * 4 + 2 * h] * inv_sum[h], o_acc[d * 4 + 2 * h + 1] * inv_sum[h]);
            }
            quad_transpose(w, lane);
            if (row < seqlen_q && finalise[h]) {
                // kPair: one 16-byte store by hand. Its first group's words sat in registers
                // that are not consecutive, and the compiler split the store into four 4-byte
                // ones (H100, fp16, CUDA graph us per call, three passes: B=1 H=8 512 x 512
                // 4.83-4.84 -> 4.70-4.74, causal 5.01-5.05 -> 4.97-5.00, B=2 5.38-5.40 ->
                // 5.26-5.28).
                if constexpr (kShape == kPair)
                    asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"l"(out_row + 32 * g), "r"(w[0]),
                                 "r"(w[1]), "r"(w[2]), "r"(w[3])
                                 : "memory");
                else
                    *reinterpret_cast<uint4 *>(out_row + 32 * g) = make_uint4(w[0], w[1], w[2], w[3]);
            }
        }
    }
}

// The rows' sums over the quad's four lanes (row_sum) and their reciprocals (inv_sum).
template <class K>
__device__ __forceinline__ void sum_rows(float (&row_sum)[2], float (&inv_sum)[2]) {
    constexpr bool kBand = K::kBand;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float sum = row_sum[h];
        sum += __shfl_xor_sync(0xffffffff, sum, 1);
        sum += __shfl_xor_sync(0xffffffff, sum, 2);
        row_sum[h] = sum;
        // (kBand: a row that saw no key has sum 0 and gives zeros.)
        inv_sum[h] = kBand && sum == 0.f ? 0.f : 1.f / sum;
    }
}

// The end of the key tiles that this warpgroup's rows (from wg_row0) see, within [first, end).
// (`end` by reference: taken by value, min's operands came out in the other order.)
template <class K>
__device__ __forceinline__ int key_tiles_seen(int first, const int &end, int wg_row0, int seqlen_q, const fc_params &p) {
    constexpr int kBlockN = K::kBlockN, kKeySplit = K::kKeySplit;
    constexpr bool kCausal = K::kCausal, kBand = K::kBand, kSkipDeadRows = K::kSkipDeadRows;
    // Causal: the block's range ends at its last row's diagonal, but this warpgroup's rows
    // see no key at or past seen_end (at least one tile runs, so that the row state is
    // that of a masked run when it sees none of the range). The tiles past it take their
    // GEMM turns without issuing (every warpgroup has the same number of sections in a
    // tile) and free their stages. half_tile: the diagonal tile whose keys 64..127 are
    // all masked for this warpgroup's rows (they start the tile), or -1. (D=64 LONG's
    // 192-row blocks skipped 1.5 key tiles per block of 3 warpgroups; D=256's 64-key tiles
    // one per block.) Measured (H100, fp16, 3 interleaved passes, ratio to cuDNN): D=64
    // causal 512 0.957 -> 0.974, 1k 0.977 -> 0.981, 2k 0.993 -> 1.046, 4k 1.045 -> 1.07;
    // D=256 causal 512-4k +1-2%; D=128 causal within 0.5% (half tiles only).
    // Non-causal D=128 (kSkipDeadRows): a warpgroup whose 64 rows all lie past the query
    // sequence (one-row decoding: the second warpgroup of every tile) runs one key tile
    // and takes the other tiles' turns the same way, so the live warpgroup has the tensor
    // cores and the issue slots to itself. Measured (H100, fp16, Hq=32, two A/B passes,
    // ratio to cuDNN): B=8 Hkv=32 1k 0.998-1.008 -> 1.014-1.017, B=32 Hkv=8 1k 0.988 ->
    // 0.997-1.008, B=8 Hkv=32 32k 0.995 -> 1.000; geomean of 21 decode rows 1.008 -> 1.014.
    // (kBand: the upper edge of the warpgroup's last row, which may lie before key 0.)
    return kBand && kKeySplit == 1      ? max(first + 1, min(end, (wg_row0 + 63 + p.band_hi_) / kBlockN + 1))
           : kCausal && kKeySplit == 1 ? max(first + 1, min(end, (wg_row0 + 63) / kBlockN + 1))
           : kSkipDeadRows && wg_row0 >= seqlen_q ? first + 1
                                                  : end;
}

// kPair with maps.pair_s_ahead: this warpgroup's two key tiles (ring slots slot0 + mine, slot0 + last), both
// S = Q K^T issued together (the steps are fwd_kernel's lambdas).
template <class K, class WaitTurn, class IssueQk, class IssueQkInto, class PassTurn, class Trace, class Release,
          class Softmax, class ConvertP, class IssuePv, class RescaleO>
__device__ __forceinline__ void pair_s_ahead_tiles(int slot0, int mine, int last, int qb, float (&rescale)[2],
                                                   float (&s)[K::kNTiles * 4], float (&s_next)[K::kNTiles * 4],
                                                   float (&o_acc)[K::kDTiles * 4], typename K::Bars &bars,
                                                   WaitTurn &wait_turn, IssueQk &issue_qk, IssueQkInto &issue_qk_into,
                                                   PassTurn &pass_turn, Trace &trace, Release &release, Softmax &softmax,
                                                   ConvertP &convert_p, IssuePv &issue_pv, RescaleO &rescale_o) {
    constexpr int kHeadDim = K::kHeadDim, kNTiles = K::kNTiles, kStages = K::kStages;
    const int i0 = slot0 + mine, i1 = slot0 + last;
    wait_turn();
    issue_qk(i0);
    issue_qk_into(s_next, i1);
    pass_turn(false);
    wgmma_wait<1>();  // S(mine) is ready
    trace(6, mine);
    fence_registers(s);
    release(&bars.k_empty[i0 % kStages]);
    softmax(mine, rescale, false, [] {});  // O is still zero: nothing to rescale
    if constexpr (!kPvWaitInSoftmax<kHeadDim>) convert_p(std::integral_constant<int, kNTiles>{});
    trace(7, mine);
    wait_turn();
    issue_pv(i0, false, false);
    pass_turn(false);
    wgmma_wait<1>();  // S(last) is ready; O += P(mine) V(mine) may still run
    trace(6, last);
    fence_registers(s_next);
    release(&bars.k_empty[i1 % kStages]);
    release(&bars.q_empty[qb]);  // last use of Q in this tile
#pragma unroll
    for (int e = 0; e < kNTiles * 4; ++e) s[e] = s_next[e];
    auto finish_pv = [&] {
        wgmma_wait<0>();
        fence_registers(o_acc);
        trace(8, last);
        release(&bars.v_empty[i0 % kStages]);
    };
    const bool rebased = softmax(last, rescale, true, finish_pv);
    trace(11, last);
    if constexpr (!kPvWaitInSoftmax<kHeadDim>) {
        finish_pv();
        if (rebased) rescale_o(rescale);
        convert_p(std::integral_constant<int, kNTiles>{});
        trace(7, last);
    }
    wait_turn();
    issue_pv(i1, false, false);
    pass_turn(false);
    wgmma_wait<0>();
    trace(8, last);
    fence_registers(o_acc);
    release(&bars.v_empty[i1 % kStages]);
}

// The key loop's middle sections: for each of this warpgroup's key tiles n after `mine` and before seen_end,
// S(n) and O += P(n-1) V(n-1) in one GEMM turn, then the softmax of S(n) (the steps are fwd_kernel's lambdas).
template <class K, bool kCarryS, class WaitTurn, class IssueQk, class IssuePv, class PassTurn, class Trace, class Release,
          class Softmax, class ConvertP, class RescaleO>
__device__ __forceinline__ void key_tiles_middle(int slot0, int mine, int seen_end, int last, int qb, float (&rescale)[2],
                                                 float (&s)[K::kNTiles * 4], float (&o_acc)[K::kDTiles * 4],
                                                 typename K::Bars &bars, WaitTurn &wait_turn, IssueQk &issue_qk,
                                                 IssuePv &issue_pv, PassTurn &pass_turn, Trace &trace, Release &release,
                                                 Softmax &softmax, ConvertP &convert_p, RescaleO &rescale_o) {
    constexpr int kHeadDim = K::kHeadDim, kNTiles = K::kNTiles, kStages = K::kStages, kKeySplit = K::kKeySplit;
    constexpr bool kCausal = K::kCausal;
    for (int n = mine + kKeySplit; n < seen_end; n += kKeySplit) {
        wait_turn();
        issue_qk(slot0 + n);
        issue_pv(slot0 + n - kKeySplit, false, kCarryS && n - kKeySplit == mine);
        pass_turn(false);
        wgmma_wait<1>();  // S(n) is ready; O += P(n-1) V(n-1) may still run
        trace(6, n);
        fence_registers(s);
        release(&bars.k_empty[(slot0 + n) % kStages]);
        if (!kQInRegs<kHeadDim, kCausal> && n == last) release(&bars.q_empty[qb]);
        auto finish_pv = [&] {  // O += P(n-1) V(n-1) is done: its V stage is free
            wgmma_wait<0>();
            fence_registers(o_acc);
            trace(8, n);
            release(&bars.v_empty[(slot0 + n - kKeySplit) % kStages]);
        };
        const bool rebased = softmax(n, rescale, true, finish_pv);
        trace(11, n);
        if constexpr (!kPvWaitInSoftmax<kHeadDim>) {
            finish_pv();
            if (rebased) rescale_o(rescale);  // else every factor is 1
            convert_p(std::integral_constant<int, kNTiles>{});
            trace(7, n);
        }
    }
}

// The key tiles [seen_end, end) that this warpgroup's rows do not see: their GEMM turns taken without
// GEMMs and their stages freed (the steps are fwd_kernel's lambdas).
template <class K, class WaitTurn, class PassTurn, class Release>
__device__ __forceinline__ void skip_key_tiles(int slot0, int seen_end, int end, bool last_tile, typename K::Bars &bars,
                                               WaitTurn &wait_turn, PassTurn &pass_turn, Release &release) {
    constexpr int kStages = K::kStages;
        for (int n = seen_end; n < end; ++n) {  // masked for all of this warpgroup's rows
            wait_turn();
            pass_turn(last_tile && n == end - 1);
            // Freed only once loaded: a release ahead of the load would count toward the
            // stage's previous phase, which another warpgroup may still be reading.
            const int i = slot0 + n;
            wait_barrier(&bars.k_full[i % kStages], (i / kStages) & 1);
            release(&bars.k_empty[i % kStages]);
            wait_barrier(&bars.v_full[i % kStages], (i / kStages) & 1);
            release(&bars.v_empty[i % kStages]);
        }
}

// The softmax of this warpgroup's first key tile `mine` once its S = Q K^T is in (the steps are fwd_kernel's lambdas).
template <class K, class Trace, class Release, class Softmax, class ConvertP>
__device__ __forceinline__ void first_key_tile(int slot0, int mine, int last, int qb, float (&rescale)[2],
                                               float (&s)[K::kNTiles * 4], typename K::Bars &bars, Trace &trace,
                                               Release &release, Softmax &softmax, ConvertP &convert_p) {
    constexpr int kHeadDim = K::kHeadDim, kNTiles = K::kNTiles, kStages = K::kStages;
    constexpr bool kCausal = K::kCausal;
    wgmma_wait<0>();
    trace(6, mine);
    fence_registers(s);
    release(&bars.k_empty[(slot0 + mine) % kStages]);
    if (!kQInRegs<kHeadDim, kCausal> && mine == last)
        release(&bars.q_empty[qb]);  // last use of Q in this tile
    softmax(mine, rescale, false, [] {});  // O is still zero: nothing to rescale
    if constexpr (!kPvWaitInSoftmax<kHeadDim>) convert_p(std::integral_constant<int, kNTiles>{});
    trace(7, mine);
}

// The tile's last GEMM section for this warpgroup: O += P(last) V(last) (kCarryS, `carry`: after the next
// tile's first S = Q K^T), then its V stage freed (the steps are fwd_kernel's lambdas).
template <class K, bool kCarryS, class WaitTurn, class IssueNextQk, class IssuePv, class PassTurn, class Trace,
          class Release>
__device__ __forceinline__ void last_key_tile(int slot0, int mine, int last, int half_tile, int seen_end, int end,
                                              bool carry, bool last_tile, float (&o_acc)[K::kDTiles * 4],
                                              typename K::Bars &bars, WaitTurn &wait_turn, IssueNextQk &issue_next_qk,
                                              IssuePv &issue_pv, PassTurn &pass_turn, Trace &trace, Release &release) {
    constexpr int kStages = K::kStages;
    wait_turn();
    if (carry) issue_next_qk();  // (first, as in the loop's sections; non-causal: seen_end == end)
    issue_pv(slot0 + last, last == half_tile, kCarryS && last == mine);
    pass_turn(last_tile && seen_end == end);  // the tile's last GEMM section?
    wgmma_wait<0>();  // (with the next S: the epilogue overlapping it made ptxas serialise)
    trace(8, last);
    fence_registers(o_acc);
    release(&bars.v_empty[(slot0 + last) % kStages]);
}

// kBand: a general band (fc_band_bounds in c_src/flashcore.h: a sliding window, or causal aligned
// bottom-right): row i sees keys i + p.band_lo_ .. i + p.band_hi_. It runs as a causal kernel
// (kCausal, its configurations) whose key range starts and ends at the block's band edges, with
// the per-element compare on every tile an edge crosses; the top-left diagonal's shortcuts
// (kHalfTiles, the 64-key halves) are off. Rows that see no key give zeros and LSE -inf.
//
// kSoftcap: the logit softcap (p.softcap > 0): each raw score x becomes tanh(x * scale / softcap)
// before the masking, and the exponent's scale becomes softcap (not p.scale), so every later
// step (max, exp2, LSE, merges) reads scores in those units unchanged. It runs in the LONG
// configuration of the call's kind (causal or not, or kBand for a general band).
template <typename Elem, int kHeadDim, bool kCausal, int kShape, bool kBand = false, bool kSoftcap = false>
__global__ void __launch_bounds__(FwdTraits<kHeadDim, kCausal, kShape>::kThreads, 1)
fwd_kernel(const __grid_constant__ FwdMaps maps, const fc_params p) {
    static_assert(!kBand || kCausal, "a band runs in the causal configurations");
    using K = FwdKernelShape<Elem, kHeadDim, kCausal, kShape, kBand, kSoftcap>;  // (its constants: see there)
    using T = typename K::T;
    constexpr int kBlockM = K::kBlockM, kBlockN = K::kBlockN, kStages = K::kStages;
    constexpr int kNTiles = K::kNTiles, kDTiles = K::kDTiles, kW = K::kW, kKeySplit = K::kKeySplit;
    constexpr bool kPingPong = K::kPingPong, kHalfTiles = K::kHalfTiles, kSkipDeadRows = K::kSkipDeadRows;
    static_assert(!(kPvWaitInSoftmax<kHeadDim> && kLazyRescale<kHeadDim>),
                  "the softmax rescales O unconditionally where it waits for P V: not with lazy rescaling");

    extern __shared__ unsigned char smem_raw[];
    __shared__ typename K::Bars bars;
    // Swizzled tiles need 1024-byte alignment. Stepped from smem_raw (not rebuilt from an
    // integer), so the compiler still knows the pointers are shared memory and stores through
    // them (the split partials) are STS, not generic stores.
    unsigned char *smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
    unsigned char *smem_q = smem;
    unsigned char *smem_k = smem_q + T::kQBufs * T::kQBytes;
    unsigned char *smem_v = smem_k + kStages * T::kKVTileBytes;
    unsigned char *smem_o = smem + T::kOStageOffset;  // kOBufs staging buffers of O

    const int seqlen_q = static_cast<int>(p.seqlen_q);
    const int seqlen_k = static_cast<int>(p.seqlen_k);
    const int heads_q = static_cast<int>(p.heads_q);
    const int m_blocks = (seqlen_q + kBlockM - 1) / kBlockM;
    const int n_tiles = m_blocks * heads_q * static_cast<int>(p.batch);
    const FastDiv &m_blocks_div = maps.m_blocks_div, &heads_q_div = maps.heads_q_div;  // for decode_tile
    struct KeyRange {
        int first, end;
    };
    // Key tiles [first, end) a query block needs: with causal masking, none past its last row;
    // with a band, those between its first row's lower edge and its last row's upper edge.
    auto block_keys = [&](int m_block) {
        if constexpr (kBand) {
            int64_t first, end;
            fc_band_key_tiles(m_block * kBlockM, min((m_block + 1) * kBlockM, seqlen_q), p.band_lo_, p.band_hi_,
                              seqlen_k, kBlockN, &first, &end);
            return KeyRange{static_cast<int>(first), static_cast<int>(end)};
        }
        int n = (seqlen_k + kBlockN - 1) / kBlockN;
        if (kCausal) n = min(n, (min((m_block + 1) * kBlockM, seqlen_q) - 1) / kBlockN + 1);
        return KeyRange{0, n};
    };
    // KV split (launch_fwd): this CTA's rank among the `splits` CTAs that share its tile takes
    // key tiles [first, end) of its query block; without a split, all of them. A range may be
    // empty (more splits than key tiles, e.g. the first causal blocks). The sharing CTAs are a
    // cluster, or, in the grid split for decoding (p.num_splits_ > 1, launch_fwd_config), the
    // grid's consecutive CTAs: in both, CTA x's rank is x mod splits.
    // (Read from the special registers and parameters where used, so they hold no register
    // through the loop.)
    constexpr bool kGridSplitHere = kGridSplit<kHeadDim, kCausal, kShape>;
    // kPair never splits, and says so at compile time: the split's divisions in key_range and
    // snake_tile had stayed in its code after the grid wait, on the path to its first loads
    // (H100, fp16, CUDA graph: B=1 H=8 512 x 512 5.46-5.53 -> 5.18-5.24 us per call, causal
    // 5.26-5.34 -> 5.19-5.25, GQA 32:8 128 x 512 5.48-5.51 -> 5.16-5.19).
    auto kv_splits = [&] {
        return kShape == kPair ? 1 : (kGridSplitHere && p.num_splits_ > 1 ? p.num_splits_ : cluster_size());
    };
    auto key_range = [&](int m_block) {
        const KeyRange all = block_keys(m_block);
        const int n = all.end - all.first, splits = kv_splits();
        if (splits == 1) return all;
        const int rank = kGridSplitHere && p.num_splits_ > 1 ? static_cast<int>(blockIdx.x) % splits : cluster_rank();
        return KeyRange{all.first + n * rank / splits, all.first + n * (rank + 1) / splits};
    };

    // Broadcast from lane 0, so the compiler knows it is warp-uniform and keeps what derives from
    // it (the shared-memory descriptors) in uniform registers.
    const int warpgroup = __shfl_sync(0xffffffff, static_cast<int>(threadIdx.x) / 128, 0);
    const int lane = threadIdx.x % 32;

    if (threadIdx.x == 0) {
        for (int b = 0; b < T::kQBufs; ++b) {
            ptx::mbarrier_init(&bars.q_full[b], 1);
            ptx::mbarrier_init(&bars.q_empty[b], 4 * kW);  // one arrival per consumer warp
        }
        for (int s = 0; s < kStages; ++s) {
            ptx::mbarrier_init(&bars.k_full[s], 1);
            ptx::mbarrier_init(&bars.v_full[s], 1);
            ptx::mbarrier_init(&bars.k_empty[s], 4 * kW / kKeySplit);  // each tile has one reader per row group
            ptx::mbarrier_init(&bars.v_empty[s], 4 * kW / kKeySplit);
        }
        for (int b = 0; b < T::kOBufs; ++b) ptx::mbarrier_init(&bars.o_free[b], 1);  // the issuing thread
        if (T::kPushMerge && cluster_size() > 1) {
            // One arrival (now) and the bytes the peers will push: (splits - 1) partials of this
            // CTA's rows. The arrival comes first, so no peer's bytes can find the phase open.
            using SS = SplitSlots<kHeadDim, kBlockM>;
            const int splits = cluster_size(), rows_per_rank = SS::rows_per_rank(splits);
            const int my_rows = min(kBlockM, (cluster_rank() + 1) * rows_per_rank) - cluster_rank() * rows_per_rank;
            ptx::mbarrier_init(&bars.merge_full, 1);
            ptx::mbarrier_arrive_expect_tx(ptx::sem_release, ptx::scope_cluster, ptx::space_shared, &bars.merge_full,
                                           (splits - 1) * my_rows * SS::kRowBytes);
        }
        ptx::fence_mbarrier_init(ptx::sem_release, ptx::scope_cluster);
    }
    __syncthreads();
    // kPushMerge: no peer may push before this CTA's merge_full is set up. Every thread arrives
    // here (under the previous grid's tail, with PDL); the consumers wait just before they push.
    if (T::kPushMerge && cluster_size() > 1) ptx::barrier_cluster_arrive(ptx::sem_release);
    // With programmatic dependent launch (fc_use_pdl) the above ran under the previous grid's
    // tail: it touched only shared memory and the parameters. Global memory from here on.
    wait_for_prior_grids();
    allow_dependent_grids();

    if (warpgroup == 0) {
        // ---------------- producer: one thread issues every load ----------------
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(T::kProducerRegs));
        if (threadIdx.x != 0) return;
        int32_t c[4];
        int kv_iter = 0;  // K/V tiles loaded so far by this CTA: ring stage and phase
        int q_loads = 0;  // Q tiles loaded so far by this CTA: Q buffer phase
        int local = 0;    // tiles taken by this CTA
        for (int t = snake_tile(0, n_tiles, kv_splits()); t < n_tiles; t = snake_tile(++local, n_tiles, kv_splits())) {
            const Tile tile = decode_tile(t, m_blocks_div, heads_q_div);
            const int head_kv = maps.group_div.div(tile.head);
            const KeyRange keys = key_range(tile.m_block);
            if (keys.first == keys.end) continue;  // nothing to load (the consumers skip it too)
            // The Q buffer frees once every consumer warp has issued its last S = Q K^T.
            const int qb = q_loads % T::kQBufs;
            wait_barrier(&bars.q_empty[qb], ((q_loads++ / T::kQBufs) & 1) ^ 1);
            ptx::mbarrier_arrive_expect_tx(ptx::sem_release, ptx::scope_cta, ptx::space_shared, &bars.q_full[qb],
                                           T::kQBytes);
            for (int panel = 0; panel < T::kPanels; ++panel) {
                set_coords(c, maps.q_order, panel * 64, tile.m_block * kBlockM, tile.head, tile.batch);
                tma_load(smem_q + qb * T::kQBytes + panel * T::kQPanelBytes, &maps.q, c, &bars.q_full[qb]);
            }
            if constexpr (kShape == kPair) {
                // A pair CTA on a small grid whose key tiles all fit the ring (maps.pair_lead_load,
                // launch_fwd_config) loads K0 alone and, once it has landed, K2, V0, K1, K3, V1,
                // V2, V3: the first S waits for one tile instead of for a share of all nine
                // loads in flight at once (TMA works on its queued copies together: in a probe of
                // 64 CTAs each taking 8 x 16 KB from L2, the first copy landed ~3000 cycles after
                // issue with all eight queued, ~2200 alone). Then the tiles in the order the two
                // warpgroups need them: warpgroup 0's second K (its S GEMMs may go out together,
                // pair_s_ahead), its first V, then warpgroup 1's keys. Stage j holds key tile
                // first + j in the ring's first round, so no stage needs an empty wait.
                // Measured (H100, fp16, CUDA graph us per call, two passes; docs/experiments/sessions-17-23.md,
                // twenty-second session), interleaved K0 V0 K1 V1 ... -> this order: B=1 H=8
                // 512 x 512 5.30-5.32 -> 4.85-4.89, causal 5.27-5.34 -> 5.01-5.06, 256 x 512
                // 5.24-5.33 -> 4.80-4.81, 384 x 384 causal 4.72-4.77 -> 4.60-4.63. On grids of more
                // than half the SMs the wait lost (B=2 H=8 512 x 512: 5.26-5.34 -> 5.49-5.62).
                const int nk = keys.end - keys.first;
                if (maps.pair_lead_load && kv_iter == 0 && nk <= kStages) {
                    auto load = [&](int j, bool v) {  // key tile first + j's K or V into stage j
                        if (j >= nk) return;
                        uint64_t *full = v ? &bars.v_full[j] : &bars.k_full[j];
                        ptx::mbarrier_arrive_expect_tx(ptx::sem_release, ptx::scope_cta, ptx::space_shared, full,
                                                       T::kKVTileBytes);
                        for (int panel = 0; panel < T::kPanels; ++panel) {
                            set_coords(c, v ? maps.v_order : maps.k_order, panel * 64, (keys.first + j) * kBlockN,
                                       head_kv, tile.batch);
                            tma_load((v ? smem_v : smem_k) + j * T::kKVTileBytes + panel * T::kKVPanelBytes,
                                     v ? &maps.v : &maps.k, c, full);
                        }
                    };
                    load(0, false);
                    wait_barrier(&bars.k_full[0], 0);
                    load(2, false);
                    load(0, true);
                    load(1, false);
                    load(3, false);
                    load(1, true);
                    load(2, true);
                    load(3, true);
                    kv_iter += nk;
                    continue;
                }
            }
            for (int n = keys.first; n < keys.end; ++n, ++kv_iter) {
                const int stage = kv_iter % kStages;
                const uint32_t phase = (kv_iter / kStages) & 1;
                wait_barrier(&bars.k_empty[stage], phase ^ 1);  // the first round passes at once
                ptx::mbarrier_arrive_expect_tx(ptx::sem_release, ptx::scope_cta, ptx::space_shared,
                                               &bars.k_full[stage], T::kKVTileBytes);
                for (int panel = 0; panel < T::kPanels; ++panel) {
                    set_coords(c, maps.k_order, panel * 64, n * kBlockN, head_kv, tile.batch);
                    tma_load(smem_k + stage * T::kKVTileBytes + panel * T::kKVPanelBytes, &maps.k, c,
                             &bars.k_full[stage]);
                }
                wait_barrier(&bars.v_empty[stage], phase ^ 1);
                ptx::mbarrier_arrive_expect_tx(ptx::sem_release, ptx::scope_cta, ptx::space_shared,
                                               &bars.v_full[stage], T::kKVTileBytes);
                for (int panel = 0; panel < T::kPanels; ++panel) {
                    set_coords(c, maps.v_order, panel * 64, n * kBlockN, head_kv, tile.batch);
                    tma_load(smem_v + stage * T::kKVTileBytes + panel * T::kKVPanelBytes, &maps.v, c,
                             &bars.v_full[stage]);
                }
            }
        }
        return;
    }

    // ---------------- consumers ----------------
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(T::kConsumerRegs));
    const int consumer = warpgroup - 1;
    const int row_group = consumer / kKeySplit;     // which 64 rows of the block
    const int key_part = consumer % kKeySplit;      // which of the row group's key tiles (kPair)
    const int warp_in_wg = (threadIdx.x / 32) % 4;  // which 16 of those rows
    const int row_in_warp = lane / 4;               // accumulator rows row_in_warp, +8
    const int col_in_tile = 2 * (lane % 4);         // accumulator columns col_in_tile, +1
    const uint32_t q_rows = smem_addr(smem_q) + row_group * 64 * 128;  // this warpgroup's rows of Q buffer 0
    uint32_t q_base = q_rows;  // ... of the current tile's Q buffer
    const uint32_t k_base = smem_addr(smem_k);
    const uint32_t v_base = smem_addr(smem_v);
    const float scale_log2 = (kSoftcap ? p.softcap : p.scale) * 1.4426950408889634f;
    [[maybe_unused]] const float softcap_in = kSoftcap ? p.scale / p.softcap : 0.f;  // x -> tanh(x * this)
    // Trace events (FLASHCORE_SM90_TRACE; names as in tools/sm90_trace.py): 1 tile start (argument:
    // its key tiles), 2 Q landed, 3 / 4 GEMM turn waited for / taken, 5 GEMMs issued, 6 S ready,
    // 8 P V done, 11 softmax done, 7 P converted, 9 / 10 epilogue start / end, 12 CTA done; kPair's
    // merge: 13 partial left, 14 both met, 15 merged.
#if FLASHCORE_SM90_TRACE
    int trace_n = 0;
    auto trace = [&](int ev, int n) {
        if (threadIdx.x % 128 == 0 && trace_n < kTracePerWg && blockIdx.x < kTraceCtas) {
            const unsigned long long c = clock64();
            g_trace[(blockIdx.x * 4 + warpgroup) * kTracePerWg + trace_n] =
                (static_cast<unsigned long long>(ev) << 56) | (static_cast<unsigned long long>(n & 0xff) << 48) |
                (c & ((1ull << 48) - 1));
        }
        ++trace_n;
    };
#else
    auto trace = [](int, int) {};
#endif

    float o_acc[kDTiles * 4];
    float row_max[2], row_sum[2];
    // The loop is software-pipelined inside the warpgroup (FlashAttention-3's intra-warpgroup
    // overlap): while the tensor cores run O += P(n-1) V(n-1), this warpgroup's threads do the
    // softmax of S(n), issued just before. P(n-1) lives in p_frag, S(n) in s.
    float s[kNTiles * 4];
    float s_next[kNTiles * 4];  // kPair with two key tiles: the second S, issued with the first
    uint32_t p_frag[kBlockN / 16][4];
    // kQInRegs: this warpgroup's rows of Q as wgmma A fragments, one per 16-column k-step.
    uint32_t q_frag[kQInRegs<kHeadDim, kCausal> ? kHeadDim / 16 : 1][4];
    int kv_iter = 0;  // K/V tiles consumed so far: ring stage and phase, as in the producer

    // kQInRegs: Q's fragments from the current buffer (q_base). ldmatrix.x4 gives a warp the
    // m16k16 A fragment of its 16 rows, the register layout wgmma takes: lanes 0-7 address rows
    // 0-7 of the first 8 columns, 8-15 rows 8-15, 16-31 the same rows' next 8 columns. The
    // buffer is 128-byte swizzled (as TMA wrote it): 16-byte chunk c of row r sits at c ^ (r % 8).
    auto load_q_frags = [&] {
        if constexpr (kQInRegs<kHeadDim, kCausal>) {
            const int row = warp_in_wg * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
            for (int kk = 0; kk < kHeadDim / 16; ++kk) {
                const int chunk = (kk % 4) * 2 + (lane >> 4);
                const uint32_t addr = q_base + (kk / 4) * T::kQPanelBytes + row * 128 + ((chunk ^ (row & 7)) << 4);
                ldmatrix_x4(q_frag[kk], addr);
            }
        }
    };
    // S = Q K^T for ring slot i into `acc` (s, or kPair's s_next), asynchronous.
    auto issue_qk_into = [&](float (&acc)[kNTiles * 4], int i) { issue_s_gemm<K>(acc, i, bars, q_base, k_base, q_frag); };
    auto issue_qk = [&](int i) { issue_qk_into(s, i); };
    // `half`: P's keys 64..127 are all zero (half_tile in the key loop), so only the first 64 keys.
    // `overwrite`: the tile's first P V, which writes O instead of adding to it (kCarryS: O is not
    // zeroed at the tile's start, see there).
    auto issue_pv = [&](int i, bool half, bool overwrite) {  // O += P V for ring slot i, asynchronous
        issue_pv_gemm<K>(o_acc, i, half, overwrite, bars, v_base, p_frag);
    };
    auto release = [&](uint64_t *bar) {  // this warp is done with what `bar` guards
        __syncwarp();
        if (lane == 0) ptx::mbarrier_arrive(bar);
    };
    auto rescale_o = [&](const float (&rescale)[2]) { rescale_rows(o_acc, rescale); };
    // `live_tag`: the 8-key tiles of S that hold P (convert_to_p).
    auto convert_p = [&](auto live_tag) { convert_to_p<Elem, decltype(live_tag)::value>(p_frag, s); };

    // Ping-pong between the consumer warpgroups (measured against free-running consumers, same
    // run: D=128 non-causal 4k 613 vs 569 TFLOP/s, D=64 474 vs 388; docs/experiments/first-versions.md, v4): each
    // issues its GEMMs only in its turn, so the others' softmax runs while its GEMMs hold the
    // tensor cores. Turns go round a ring through named barriers 1..W (256 threads: the waiting
    // and the passing warpgroup), and the ring runs on across tiles: every warpgroup has the same
    // number of GEMM sections in a tile (one per key tile, plus one), so after the last
    // warpgroup's final P V of a tile, consumer 0 starts the next tile's S = Q K^T while the
    // others still write their output (before, the ring restarted per tile and every tile's
    // epilogues ran with the tensor cores idle). Measured (H100, fp16, two passes each, ratio to
    // cuDNN in the same run): D=128 S=512 0.79 -> 0.86, 1k 0.88 -> 0.92, causal 512 0.84 ->
    // 0.90; D=64 causal 512 0.82 -> 0.87, 1k 0.84 -> 0.91; S >= 4k within the run's spread;
    // geomean over 49 shapes 0.949 / 0.946 -> 0.956 / 0.959. The last consumer
    // starts the ring at the CTA's first tile (every tile of a persistent CTA has key tiles; a
    // split CTA has one tile, which may have none, and then starts no ring), and skips its pass
    // after the final section of the CTA's last tile, so no arrival is left over.
    // A single consumer warpgroup (kTiny) has no one to take turns with; a pair (kPair) reads
    // different key tiles and runs free.
    auto wait_turn = [&] {
        trace(3, 0);
        if constexpr (kPingPong) asm volatile("bar.sync %0, 256;\n" ::"r"(1 + consumer) : "memory");
        trace(4, 0);
    };
    auto pass_turn = [&](bool last_section) {
        trace(5, 0);
        if constexpr (kPingPong)
            if (!(consumer == kW - 1 && last_section))
                asm volatile("bar.arrive %0, 256;\n" ::"r"(1 + (consumer + 1) % kW) : "memory");
    };

    // The TMA-store epilogue (below): the thread that issued this warpgroup's last store of O
    // lets the next user of the staging buffer in once the store has read it. It checks only
    // after issuing its next S = Q K^T (by then the read is long done), so no thread of the
    // epilogue waits on its own store. With one buffer the warpgroups take it in ring order,
    // the order of their epilogues.
    const int o_buf = T::kOBufs == 1 ? 0 : consumer;
    bool o_store_pending = false;
    auto retire_o_store = [&] {
        if (o_store_pending) {
            ptx::cp_async_bulk_wait_group_read(ptx::n32_t<0>{});
            ptx::mbarrier_arrive(&bars.o_free[o_buf]);
            o_store_pending = false;
        }
        __syncwarp();
    };

    int q_loads = 0;  // Q tiles consumed: Q buffer phase, as in the producer
    int local = 0;
    // t_next: the tile after this one, found once per tile (the loop steps to it, and the last
    // GEMM section of the CTA's last tile is told by it). With snake_tile's and key_range's
    // divisions skipped when there is no split, measured against main (H100, fp16, two A/B runs
    // of 3 interleaved passes, ratio to cuDNN): D=64 non-causal 512 0.98 -> 0.995, causal 512
    // 0.925 -> 0.94, 1k 0.937 -> 0.952; D=128 non-causal 512 1.006 -> 1.021, causal 1k 1.10 ->
    // 1.12; but D=64 causal 2k 1.005 -> 0.996 and 4k 1.065 -> 1.05. The divisions skipped
    // without t_next (the same loop step as before) lost to both: D=64 non-causal 1k 0.995.
    // kCarryS: a tile's last GEMM section also issues the next tile's first S = Q K^T (its Q is
    // in the other buffer), so the tensor cores take the next warpgroup's GEMMs and then this
    // one's next S without waiting for its epilogue and tile boundary; s_carried says the current
    // tile's first S is already done, from Q buffer qb.
    // Measured (H100, fp16, 3 interleaved passes, ratio to cuDNN): D=64 non-causal 1k 1.009-1.018
    // -> 1.025-1.034, 2k 1.065-1.079 -> 1.083-1.104, 512 unchanged. Non-causal D=64 LONG only:
    // D=64 SHORT causal lost 5% with it (512 1.034 -> 0.981), and at D=128 ptxas serialised the
    // GEMMs (C7515). Non-causal tiles have no masked sections (seen_end == end).
    constexpr bool kCarryS = kPingPong && T::kQBufs == 2 && kHeadDim == 64 && kW == 3 && !kCausal;
    static_assert(!(kSkipDeadRows && kCarryS), "a skipping warpgroup's last section is not the tile's last");
    static_assert(!kQInRegs<kHeadDim, kCausal> || (!kCarryS && kKeySplit == 1),
                  "Q in registers frees its buffer at the tile's start: not with a carried S or a pair");
    bool s_carried = false;
    int qb = 0;  // the current tile's Q buffer
    for (int t = snake_tile(0, n_tiles, kv_splits()), t_next; t < n_tiles; t = t_next, ++local) {
        t_next = snake_tile(local + 1, n_tiles, kv_splits());
        const Tile tile = decode_tile(t, m_blocks_div, heads_q_div);
        const KeyRange keys = key_range(tile.m_block);  // key tiles [first, end) of this CTA
        const int wg_row0 = tile.m_block * kBlockM + row_group * 64;  // first query row of this WG
        const int row0 = wg_row0 + warp_in_wg * 16 + row_in_warp;    // this thread's first row

        // The online softmax of key tile n (online_softmax).
        auto softmax = [&](int n, float (&rescale)[2], bool pv_pending, auto &&finish_pv) -> bool {
            return online_softmax<K>(n, rescale, pv_pending, finish_pv, s, row_max, row_sum, o_acc, p_frag, p, seqlen_k,
                                     wg_row0, row0, col_in_tile, scale_log2, softcap_in);
        };

        // kCarryS: the tile's first P V overwrites O instead (scale-d 0), so no plain instruction
        // writes O's registers between two tiles' GEMMs; only a CTA with no key tiles (a split's
        // empty range, which runs no P V) zeroes it.
        if (!kCarryS || keys.first >= keys.end)
#pragma unroll
            for (int i = 0; i < kDTiles * 4; ++i) o_acc[i] = 0.f;
        row_max[0] = row_max[1] = -INFINITY;
        row_sum[0] = row_sum[1] = 0.f;
        float rescale[2];
        // The whole CTA agrees on the range: an empty one loads and runs nothing. Key tile n
        // sits in ring slot `slot0 + n` (slots count every tile this CTA has consumed).
        // kPair: this warpgroup runs key tiles mine, mine + 2, ... of [first, end) (the other one
        // of its row group the rest); otherwise every key tile (kKeySplit = 1).
        if (keys.first < keys.end) {
            const int first = keys.first, end = keys.end, slot0 = kv_iter - first;
            const int mine = first + key_part;
            const int seen_end = [&] { return key_tiles_seen<K>(first, end, wg_row0, seqlen_q, p); }();
            // half_tile (key_tiles_seen): the diagonal tile whose keys 64..127 this warpgroup's rows never see, or -1.
            const int half_tile =
                kHalfTiles && wg_row0 % kBlockN == 0 && wg_row0 / kBlockN == seen_end - 1 ? seen_end - 1 : -1;
            if (kPingPong && local == 0 && consumer == kW - 1) asm volatile("bar.arrive 1, 256;\n" ::: "memory");
            // In split mode a CTA has one tile; persistent CTAs' tiles all have key tiles, so the
            // CTA's last tile is the one without a successor.
            const bool last_tile = t_next >= n_tiles;
            trace(1, end - first);
            if (!s_carried) {
                qb = q_loads % T::kQBufs;
                q_base = q_rows + qb * T::kQBytes;
                wait_barrier(&bars.q_full[qb], (q_loads++ / T::kQBufs) & 1);
            }
            trace(2, 0);
            if constexpr (kQInRegs<kHeadDim, kCausal>) {  // (no kCarryS, no kPair at D=128)
                load_q_frags();
                release(&bars.q_empty[qb]);
            }
            if (mine >= end) {
                release(&bars.q_empty[qb]);  // kPair with a single key tile: nothing for this one
            } else {
                const int last = mine + (seen_end - 1 - mine) / kKeySplit * kKeySplit;  // this WG's last
                // kPair, two key tiles for this warpgroup (257-512 keys), grids of at
                // most half the SMs (maps.pair_s_ahead, launch_fwd_config): both S = Q K^T go out
                // together, so the second one runs during the first tile's softmax instead of
                // after it (the small shape's trace had both warpgroups issue S(2nd) + P V(1st)
                // only after their first softmax). The warpgroup then waits for its second K tile
                // before its first softmax: on fuller grids, whose loads land later, and on causal
                // blocks that cost more than it saved. Measured on every pair grid (H100, fp16, us
                // per call in a CUDA graph, tools/d64_configs.py, two passes): B=1 H=8 512 x 512
                // 6.01 / 6.02 -> 5.78 / 5.76, but causal 512 x 512 5.60 / 5.58 -> 5.73 / 5.68 and
                // B=2 H=8 512 x 512 6.06 / 6.10 -> 6.38 / 6.36: hence the limits. With them (same
                // tool, two passes): B=1 H=8 512 x 512 5.99 / 5.94 -> 5.73 / 5.72, 256 x 512 5.97 /
                // 6.00 -> 5.77 / 5.76; causal, B=2 and H=16 unchanged. Causal small grids took it
                // too once the first key tile loaded alone (pair_lead_load), which brings K2 in
                // right after K0 (twenty-second session, three passes: B=1 H=8 512 x 512 causal
                // 4.97-5.00 -> 4.86-4.89, 384 x 384 causal within +-0.02).
                bool pair_done = false;
                if constexpr (kShape == kPair) {
                    if (maps.pair_s_ahead && last == mine + kKeySplit) {
                        [&] {
                            pair_s_ahead_tiles<K>(slot0, mine, last, qb, rescale, s, s_next, o_acc, bars, wait_turn, issue_qk,
                                                  issue_qk_into, pass_turn, trace, release, softmax, convert_p, issue_pv,
                                                  rescale_o);
                        }();
                        pair_done = true;
                    }
                }
                if (!pair_done) {
                    if (!s_carried) {
                        wait_turn();
                        issue_qk(slot0 + mine);
                        pass_turn(false);
                    }
                    s_carried = false;
                    if constexpr (T::kOBufs > 0 && !kCarryS) retire_o_store();  // the previous tile's store of O
                    [&] { first_key_tile<K>(slot0, mine, last, qb, rescale, s, bars, trace, release, softmax, convert_p); }();
                    [&] {
                        key_tiles_middle<K, kCarryS>(slot0, mine, seen_end, last, qb, rescale, s, o_acc, bars, wait_turn,
                                                     issue_qk, issue_pv, pass_turn, trace, release, softmax, convert_p,
                                                     rescale_o);
                    }();
                    // kCarryS: the tile's last section (this one: non-causal tiles have no masked
                    // sections) issues the next tile's first S = Q K^T; its Q is waited for before
                    // the turn is taken.
                    const bool carry = kCarryS && !last_tile;
                    const int next_qb = (qb + 1) % T::kQBufs;
                    if (carry) wait_barrier(&bars.q_full[next_qb], (q_loads / T::kQBufs) & 1);
                    // The previous tile's store of O (issued a section or more ago): before this tile's
                    // epilogue waits for its buffer, whether or not a next tile follows.
                    if constexpr (T::kOBufs > 0 && kCarryS) retire_o_store();
                    auto issue_next_qk = [&] {
                        q_base = q_rows + next_qb * T::kQBytes;  // (this tile's S GEMMs are all issued)
                        issue_qk(slot0 + end);                    // the next tile's first key tile
                    };
                    [&] {
                        last_key_tile<K, kCarryS>(slot0, mine, last, half_tile, seen_end, end, carry, last_tile, o_acc, bars,
                                                  wait_turn, issue_next_qk, issue_pv, pass_turn, trace, release);
                    }();
                    [&] { skip_key_tiles<K>(slot0, seen_end, end, last_tile, bars, wait_turn, pass_turn, release); }();
                    if (carry) {
                        qb = next_qb;
                        ++q_loads;
                        s_carried = true;
                    }
                }  // !pair_done
            }
            kv_iter = slot0 + end;
        }

        // ---- epilogue: normalise, write O from registers (Q's buffer is already refilling) ----
        trace(9, 0);
        float inv_sum[2];
        [&] { sum_rows<K>(row_sum, inv_sum); }();
        if constexpr (kKeySplit > 1) [&] { merge_pair<K>(o_acc, row_max, row_sum, inv_sum, smem_v, key_part, scale_log2, trace); }();
        // Rows this CTA writes (all, unless a pushed split leaves some to a peer) and their LSE.
        bool finalise[2] = {true, true};
        float lse_log2[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) lse_log2[h] = row_max[h] * scale_log2 + __log2f(row_sum[h]);
        [&] { apply_sink(inv_sum, lse_log2, tile.head, p); }();
        if (T::kPushMerge && cluster_size() > 1) {  // (a split CTA has one tile: one merge)
            using SS = SplitSlots<kHeadDim, kBlockM>;
            const int splits = cluster_size(), rank = cluster_rank();
            const int rows_per_rank = SS::rows_per_rank(splits);
            const float *slots_o = reinterpret_cast<const float *>(smem_v + kStages * T::kKVTileBytes + T::kPairBytes);
            const float2 *slots_ml = reinterpret_cast<const float2 *>(slots_o + splits * rows_per_rank * SS::kOPitch);
            const uint32_t slot_o = smem_addr(slots_o), slot_ml = smem_addr(slots_ml);
            const uint32_t merge_bar = smem_addr(&bars.merge_full);
            ptx::barrier_cluster_wait(ptx::sem_acquire);  // every peer's merge_full is set up
            int local_row[2];
            float m_log2[2];  // the row's max in exp2 units
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = row_group * 64 + warp_in_wg * 16 + row_in_warp + 8 * h;  // row in the block
                const int owner = r / rows_per_rank;
                local_row[h] = r - owner * rows_per_rank;
                finalise[h] = owner == rank;
                m_log2[h] = row_max[h] == -INFINITY ? -INFINITY : row_max[h] * scale_log2;
                if (finalise[h]) continue;
                const int slot_row = rank * rows_per_rank + local_row[h];
                const uint32_t dst = cluster_peer_addr(slot_o + (slot_row * SS::kOPitch + col_in_tile) * 4, owner);
                const uint32_t bar = cluster_peer_addr(merge_bar, owner);
#pragma unroll
                for (int d = 0; d < kDTiles; ++d) st_async_f2(dst + d * 32, o_acc[d * 4 + 2 * h], o_acc[d * 4 + 2 * h + 1], bar);
                if ((lane % 4) == 0) st_async_f2(cluster_peer_addr(slot_ml + slot_row * 8, owner), m_log2[h], row_sum[h], bar);
            }
            wait_barrier(&bars.merge_full, 0);  // every peer's partial of this CTA's rows is here
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                if (!finalise[h]) continue;
                // The merge of partial_weight's comment, m in base-2 units.
                float mx = m_log2[h];
                for (int j = 0; j < splits; ++j)
                    if (j != rank) mx = fmaxf(mx, slots_ml[j * rows_per_rank + local_row[h]].x);
                const float w_own = partial_weight(m_log2[h], mx);
                float total = w_own * row_sum[h];
#pragma unroll
                for (int d = 0; d < kDTiles; ++d) {
                    o_acc[d * 4 + 2 * h] *= w_own;
                    o_acc[d * 4 + 2 * h + 1] *= w_own;
                }
                for (int j = 0; j < splits; ++j) {
                    if (j == rank) continue;
                    const int slot_row = j * rows_per_rank + local_row[h];
                    const float2 ml = slots_ml[slot_row];
                    const float w = partial_weight(ml.x, mx);
                    total += w * ml.y;
                    const float *src = slots_o + slot_row * SS::kOPitch + col_in_tile;
#pragma unroll
                    for (int d = 0; d < kDTiles; ++d) {
                        const float2 o = *reinterpret_cast<const float2 *>(src + d * 8);
                        o_acc[d * 4 + 2 * h] += w * o.x;
                        o_acc[d * 4 + 2 * h + 1] += w * o.y;
                    }
                }
                inv_sum[h] = total > 0.f ? 1.f / total : 0.f;  // the epilogue below writes the merged row
                lse_log2[h] = mx + __log2f(total);
            }
        } else if (!T::kPushMerge && kKeySplit == 1 && cluster_size() > 1) {  // (kPair never splits)
            // (The partials' pointers are built here: built in read_merge_split, their offsets were
            // added in another order.)
            float *part_o = reinterpret_cast<float *>(smem_k);
            float2 *part_ml = reinterpret_cast<float2 *>(part_o + kBlockM * SplitPartials<kHeadDim, kBlockM>::kOPitch);
            [&] {
                read_merge_split<K>(o_acc, row_max, row_sum, part_o, part_ml, row_group, warp_in_wg, row_in_warp,
                                    col_in_tile, lane, scale_log2, tile, p);
            }();
            continue;
        } else if (kGridSplitHere && p.num_splits_ > 1) {
            [&] {
                store_grid_split<K>(o_acc, row_sum, inv_sum, lse_log2, row0, seqlen_q, heads_q, col_in_tile, lane, tile, p);
            }();
            continue;
        }
        [&] { store_lse(lse_log2, finalise, row0, seqlen_q, lane, key_part, tile, p); }();
        if constexpr (T::kOBufs > 0) {
            if (maps.o_tma && cluster_size() == 1) {  // (split CTAs finish their rows below)
                // Normalised O goes into this warpgroup's staging buffer with stmatrix, laid out
                // as TMA reads it (64-column panels, 128-byte swizzle: 16-byte chunk c of row r at
                // c ^ (r % 8), conflict-free for the 8 rows a matrix stores), then one thread
                // stores the 64-row block with TMA, which clips the rows past Sq. The threads move
                // on at once: no STG queue to drain before the next tile's GEMMs.
                const int uses = T::kOBufs == 1 ? local * kW + consumer : local;  // earlier uses of the buffer
                if (uses > 0) wait_barrier(&bars.o_free[o_buf], (uses - 1) & 1);
                const uint32_t stage = smem_addr(smem_o) + o_buf * T::kOStageBytes;
                [&] { stage_o<K>(o_acc, inv_sum, stage, warp_in_wg, lane); }();
                ptx::fence_proxy_async(ptx::space_shared);  // the stores, visible to TMA
                asm volatile("bar.sync %0, 128;\n" ::"r"(kW + 3 + consumer) : "memory");
                if (threadIdx.x % 128 == 0) {
                    int32_t c[4];  // (declared here, not in issue_o_store: a local array there changed the SASS)
                    [&] { issue_o_store<K>(c, maps, smem_o, o_buf, wg_row0, tile); }();
                    o_store_pending = true;
                }
                trace(10, 0);
                continue;
            }
        }
        // (w: declared here, not in store_o_16b; a local array there changed the kernel's SASS.)
        uint32_t w[4];
        [&] { store_o_16b<K>(w, o_acc, inv_sum, finalise, row0, seqlen_q, key_part, lane, tile, p); }();
    }
    trace(12, 0);
    // The last store of O must have read the staging buffer before the CTA's shared memory goes
    // (and, with one buffer, the other warpgroup's last epilogue may be waiting for it).
    if constexpr (T::kOBufs > 0) retire_o_store();
}

}  // namespace sm90
}  // namespace flashcore
