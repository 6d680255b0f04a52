// sm90/fwd_steps.cuh - a Hopper forward consumer's work on one key tile, as fwd_kernel
// (sm90/fwd_kernel.cuh) calls it: the kernel's compile-time shape (FwdKernelShape), the ping-pong's
// GEMM turns, a tile's rows reset, the S = Q K^T and O += P V wgmma issues (with Q's fragments at
// kQInRegs), the online softmax (masking, row max, exponentials, sums; kMasked's mask rows), the
// rescale of O's rows, S to P fragments, and the pair configuration's merge of its two warpgroups.
#pragma once

#include "common/fast_div.cuh"
#include "common/sm80_ptx.cuh"
#include "common/split_combine.cuh"
#include "common/wgmma_generated.cuh"
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

// The kernel's compile-time shape, shared by the steps below.
// kVarlen: packed variable-length sequences (fc_params.cu_seq_q; sm90/varlen_blocks.cuh).
template <typename Elem_, int kHeadDim_, bool kCausal_, int kShape_, bool kBand_, bool kSoftcap_, bool kVarlen_ = false>
struct FwdKernelShape {
    using Elem = Elem_;
    using T = FwdTraits<kHeadDim_, kCausal_, kShape_>;
    static constexpr int kHeadDim = kHeadDim_, kShape = kShape_;
    static constexpr bool kCausal = kCausal_, kBand = kBand_, kSoftcap = kSoftcap_, kVarlen = kVarlen_;
    // A bool attn_mask in tiles beside the V tiles (kMasked, sm90/fwd_traits.cuh).
    static constexpr bool kMaskTiles = kShape_ == kMasked;
    static constexpr int kBlockM = T::kBlockM, kBlockN = T::kBlockN, kStages = T::kStages;
    static constexpr int kNTiles = kBlockN / 8;   // 8-column accumulator tiles of S
    static constexpr int kDTiles = kHeadDim / 8;  // 8-column accumulator tiles of O
    static constexpr int kW = T::kConsumerWarpgroups;
    static constexpr int kKeySplit = T::kKeySplit;
    // Ping-pong between the consumer warpgroups (measured against free-running consumers, same
    // run: D=128 non-causal 4k 613 vs 569 TFLOP/s, D=64 474 vs 388; docs/experiments/first-versions.md, v4): each
    // issues its GEMMs only in its turn (wait_turn / pass_turn in fwd_kernel), so the others'
    // softmax runs while its GEMMs hold the tensor cores. Turns go round a ring through named
    // barriers 1..W (256 threads: the waiting and the passing warpgroup), and the ring runs on
    // across tiles: every warpgroup has the same number of GEMM sections in a tile (one per key
    // tile, plus one), so after the last warpgroup's final P V of a tile, consumer 0 starts the
    // next tile's S = Q K^T while the others still write their output (before, the ring restarted
    // per tile and every tile's epilogues ran with the tensor cores idle). Measured (H100, fp16,
    // two passes each, ratio to cuDNN in the same run): D=128 S=512 0.79 -> 0.86, 1k 0.88 -> 0.92,
    // causal 512 0.84 -> 0.90; D=64 causal 512 0.82 -> 0.87, 1k 0.84 -> 0.91; S >= 4k within the
    // run's spread; geomean over 49 shapes 0.949 / 0.946 -> 0.956 / 0.959. The last consumer
    // starts the ring at the CTA's first tile (every tile of a persistent CTA has key tiles; a
    // split CTA has one tile, which may have none, and then starts no ring), and skips its pass
    // after the final section of the CTA's last tile, so no arrival is left over.
    // A single consumer warpgroup (kTiny) has no one to take turns with; a pair (kPair) reads
    // different key tiles and runs free: warpgroups that share rows split the keys instead.
    static constexpr bool kPingPong = kW > 1 && kKeySplit == 1;
    // Causal, 128-key tiles, one warpgroup per row group: a warpgroup whose 64 rows start a key
    // tile sees only that tile's first 64 keys, so its P V on that tile runs on those 64 keys
    // (half_tile in the key loop). The S GEMM on 64 keys too (m64n64 into half of S) made ptxas
    // serialise the wgmma pipeline (C7511) in D=64 LONG and D=128: causal 2k-4k 0.73-0.78 of cuDNN.
    static constexpr bool kHalfTiles = kCausal && !kBand && kBlockN == 128 && kKeySplit == 1;
    // A warpgroup with no live row skips its key tiles (seen_end in the key loop). Only where the
    // loop has no carried S (kCarryS issues the next tile's S in the section it assumes is last).
    static constexpr bool kSkipDeadRows = kHeadDim == 128 && !kCausal;
    // kCarryS: a tile's last GEMM section also issues the next tile's first S = Q K^T (its Q is
    // in the other buffer), so the tensor cores take the next warpgroup's GEMMs and then this
    // one's next S without waiting for its epilogue and tile boundary; s_carried (fwd_kernel) says
    // the current tile's first S is already done, from Q buffer qb.
    // Measured (H100, fp16, 3 interleaved passes, ratio to cuDNN): D=64 non-causal 1k 1.009-1.018
    // -> 1.025-1.034, 2k 1.065-1.079 -> 1.083-1.104, 512 unchanged. Non-causal D=64 LONG only:
    // D=64 SHORT causal lost 5% with it (512 1.034 -> 0.981), and at D=128 ptxas serialised the
    // GEMMs (C7515). Non-causal tiles have no masked sections (seen_end == end).
    static constexpr bool kCarryS = kPingPong && T::kQBufs == 2 && kHeadDim == 64 && kW == 3 && !kCausal;
    static_assert(!(kSkipDeadRows && kCarryS), "a skipping warpgroup's last section is not the tile's last");
    static_assert(!kQInRegs<kHeadDim, kCausal> || (!kCarryS && kKeySplit == 1),
                  "Q in registers frees its buffer at the tile's start: not with a carried S or a pair");
    using Bars = Barriers<T::kQBufs, kStages, T::kOBufs>;
};

// The ping-pong's GEMM turns (kPingPong): wait for this warpgroup's turn, and pass it on to the
// next warpgroup (`last_section`: the CTA's last tile's last section, after which the last
// consumer passes nothing, so that no arrival is left over). Without ping-pong only the trace.
template <class K, class Trace>
__device__ __forceinline__ void wait_gemm_turn(int consumer, Trace &trace) {
    trace(3, 0);
    if constexpr (K::kPingPong) asm volatile("bar.sync %0, 256;\n" ::"r"(1 + consumer) : "memory");
    trace(4, 0);
}
template <class K, class Trace>
__device__ __forceinline__ void pass_gemm_turn(int consumer, bool last_section, Trace &trace) {
    constexpr int kW = K::kW;
    trace(5, 0);
    if constexpr (K::kPingPong)
        if (!(consumer == kW - 1 && last_section))
            asm volatile("bar.arrive %0, 256;\n" ::"r"(1 + (consumer + 1) % kW) : "memory");
}

// A tile's rows start empty: O zero, row max -inf, row sum 0. kCarryS: the tile's first P V
// overwrites O instead (scale-d 0), so no plain instruction writes O's registers between two
// tiles' GEMMs; only a CTA with no key tiles (`no_keys`: a split's empty range, which runs no
// P V) zeroes it.
template <class K>
__device__ __forceinline__ void start_rows(float (&o_acc)[K::kDTiles * 4], float (&row_max)[2], float (&row_sum)[2],
                                           bool no_keys) {
    if (!K::kCarryS || no_keys)
#pragma unroll
        for (int i = 0; i < K::kDTiles * 4; ++i) o_acc[i] = 0.f;
    row_max[0] = row_max[1] = -INFINITY;
    row_sum[0] = row_sum[1] = 0.f;
}

// kMasked: this thread's first mask row for the key tile in ring slot `slot`, once its stage has
// landed (the mask tile rides the V tile's barrier); otherwise null.
template <class K>
__device__ __forceinline__ const unsigned char *mask_row_of(int slot, typename K::Bars &bars, unsigned char *smem_mask,
                                                           int row_group, int warp_in_wg, int row_in_warp) {
    using T = typename K::T;
    constexpr int kStages = K::kStages, kBlockN = K::kBlockN;
    [[maybe_unused]] const unsigned char *mask_row = nullptr;
    if constexpr (K::kMaskTiles) {
        const int stage = slot % kStages;
        wait_barrier(&bars.v_full[stage], (slot / kStages) & 1);
        mask_row = smem_mask + stage * T::kMaskTileBytes + (row_group * 64 + warp_in_wg * 16 + row_in_warp) * kBlockN;
    }
    return mask_row;
}

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

// kQInRegs: Q's fragments from the current buffer (q_base). ldmatrix.x4 gives a warp the
// m16k16 A fragment of its 16 rows, the register layout wgmma takes: lanes 0-7 address rows
// 0-7 of the first 8 columns, 8-15 rows 8-15, 16-31 the same rows' next 8 columns. The
// buffer is 128-byte swizzled (as TMA wrote it): 16-byte chunk c of row r sits at c ^ (r % 8).
template <class K>
__device__ __forceinline__ void load_q_fragments(uint32_t (&q_frag)[kQInRegs<K::kHeadDim, K::kCausal> ? K::kHeadDim / 16 : 1][4],
                                                 uint32_t q_base, int warp_in_wg, int lane) {
    using T = typename K::T;
    constexpr int kHeadDim = K::kHeadDim;
    if constexpr (kQInRegs<kHeadDim, K::kCausal>) {
        const int row = warp_in_wg * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
        for (int kk = 0; kk < kHeadDim / 16; ++kk) {
            const int chunk = (kk % 4) * 2 + (lane >> 4);
            const uint32_t addr = q_base + (kk / 4) * T::kQPanelBytes + row * 128 + ((chunk ^ (row & 7)) << 4);
            ldmatrix_x4(q_frag[kk], addr);
        }
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

// O += P V for ring slot i, asynchronous. `half`: P's keys 64..127 are all zero (half_tile in the
// key loop), so only the first 64 keys. `overwrite`: the tile's first P V, which writes O instead of
// adding to it (kCarryS: O is not zeroed at the tile's start, see fwd_kernel).
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
                                               float scale_log2, float softcap_in,
                                               const unsigned char *mask_row = nullptr) {
    using Elem = typename K::Elem;
    constexpr int kHeadDim = K::kHeadDim, kBlockM = K::kBlockM, kBlockN = K::kBlockN, kNTiles = K::kNTiles;
    constexpr bool kCausal = K::kCausal, kBand = K::kBand, kSoftcap = K::kSoftcap, kHalfTiles = K::kHalfTiles;
    // Rows may see no key so far: their max stays -inf (a band's edges, a mask's zeros).
    constexpr bool kRowsMayBeEmpty = kBand || K::kMaskTiles;
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
    if constexpr (K::kMaskTiles) {
        // The stage's mask tile decides every element: mask_row is this thread's first row in it
        // (its second is 8 rows on), kBlockN keys of one byte per row, 16-byte chunk c of a row at
        // c ^ (row % 8) (128 keys: the 128-byte swizzle) or c ^ ((row / 2) % 4) (64 keys: the
        // 64-byte one); row % 8 is the lane's row in its quad group (the rest of the row number is
        // a multiple of 8). Keys past Sk (and rows past Sq) arrive as zeros from TMA's bounds
        // fill: masked, as they must be, with no compare of their own. One 2-byte read gives a
        // row's two columns.
        const int row_in_group = (threadIdx.x % 32) / 4;
        const int swizzle = kBlockN == 128 ? row_in_group : (row_in_group / 2) % 4;
#pragma unroll
        for (int j = 0; j < kNTiles; ++j) {
            const int offset = (((j / 2) ^ swizzle) << 4) + (j % 2) * 8 + col_in_tile;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const uint32_t keep = *reinterpret_cast<const uint16_t *>(mask_row + h * 8 * kBlockN + offset);
                if ((keep & 0xff) == 0) s[j * 4 + 2 * h] = -INFINITY;
                if ((keep >> 8) == 0) s[j * 4 + 2 * h + 1] = -INFINITY;
            }
        }
    }
    // Causal with a mask (kMaskTiles, c_src/dispatch.c: top-left): the diagonal's compare on top
    // of the mask tile (the tile's bounds fill has already masked keys past Sk).
    if (K::kMaskTiles ? kCausal && crosses_diagonal : ragged || crosses_diagonal) {
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
            // yet (kRowsMayBeEmpty: -inf - -inf would be NaN; its scores are all -inf, so 0 gives
            // p = 0). A select here, not in the loop: one there serialised the GEMMs
            // (ptxas C7514).
            [[maybe_unused]] float row_ref[2];
            if constexpr (kRowsMayBeEmpty)
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
                        x = kExact ? fast_exp2((x - (kRowsMayBeEmpty ? row_ref[h] : mx[h])) * scale_log2)
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

}  // namespace sm90
}  // namespace flashcore
