// sm90/fwd_traits.cuh - the types and policies of the Hopper forward (sm90/fwd_kernel.cuh): the
// tile configuration per head dim and, at D=64, per grid shape (FwdConfig; kLong / kShort / kTiny
// / kPair), the block shapes and shared-memory layout they imply (FwdTraits), the split-KV push
// slots (kMaxKvSplits, SplitSlots), the mbarriers (Barriers), the kernel's tensor maps and tile
// decode divisors (FwdMaps), its unit of work and the order a persistent grid takes it in (Tile,
// decode_tile, snake_tile), and the per-head-dim code-path switches of the key loop
// (kLazyRescale, kQInRegs, kGridSplit, kEarlyPvWait / kMidPvWait / kPvWaitInSoftmax).
#pragma once

#include "common/fast_div.cuh"
#include "config.h"      // FC_CONFIG_MAX_KV_SPLITS
#include "sm90/ptx.cuh"  // MapOrder

#include <cuda.h>
#include <cuda/ptx>
#include <stdint.h>

namespace flashcore {
namespace sm90 {

namespace ptx = cuda::ptx;

// Tile shape per head dim (FlashAttention-3's choices as the starting point):
//   D=64:  three consumer warpgroups (192 query rows), 128-key tiles: per tile the GEMMs are
//          short next to the softmax, so more warpgroups take turns on the tensor cores; two
//          (128 rows) for short query sequences, one (64 rows) for tiny grids (kShape, below).
//   D=128: two consumer warpgroups (128 rows), 240 registers each.
// Register budgets (setmaxnreg) must sum to at most 64K over the CTA's threads.
// kShape: the configuration for long query sequences (kLong), short ones or partial waves
// (kShort), grids of 64-row blocks that fill at most half the SMs, or causal ones of up to two
// waves (kTiny), and one-wave grids of such blocks (kPair); see fc_sm90_d64_config in
// c_src/launch_rules.c. Only D=64 has the last three. kMasked: a bool attn_mask read in tiles that
// ride each V tile's load (D=64: kShort's blocks; D=128 and 256: their one configuration;
// with causal or without: c_src/dispatch.c's family_takes_mask says at which head dims).
constexpr int kLong = 0, kShort = 1, kTiny = 2, kPair = 3, kMasked = 4;
template <int kHeadDim, bool kCausal, int kShape = kLong>
struct FwdConfig;
// D=64 causal with two consumer warpgroups (128-row blocks, less diagonal waste) was measured
// and lost at long sequences: 8k 441 vs 483 TFLOP/s, 16k 414 vs 444 (it won at 512-1k:
// 179 vs 170, 262 vs 237); three are kept there. Short query sequences (kShort) take two:
// 192-row blocks waste 11% of the rows at S = 512 and 1024, and a small grid's CTAs each run
// 1.5x the rows of 128-row blocks. Tiny grids (kTiny) take one: twice the CTAs of 64 rows, each
// with the tensor cores to itself (no ping-pong partner to wait for). kPair: two warpgroups on
// the same 64 rows, one taking the even key tiles and the other the odd ones (kKeySplit), merged
// in registers through shared memory at the end: half the key loop, for one named barrier.
template <bool kCausal, int kShape>
struct FwdConfig<64, kCausal, kShape> {
    static constexpr int kConsumerWarpgroups = kShape == kLong ? 3 : (kShape == kTiny ? 1 : 2);
    static constexpr int kKeySplit = kShape == kPair ? 2 : 1;
    // kPair: 4 stages, so that each stage only ever holds one warpgroup's tiles (tile n in stage
    // n % 4, read by warpgroup n % 2). Its readers then take its phases in order; with 3 stages a
    // warpgroup could wait on a stage two phases ahead of the other's pending load, and the
    // parity wait passes on the wrong phase (found as a hang and a launch failure on the H100).
    static constexpr int kBlockN = 128, kStages = kShape == kPair ? 4 : 3;
    static constexpr int kProducerRegs = kShape == kLong ? 32 : 24, kConsumerRegs = kShape == kLong ? 160 : 240;
};
// D=128: 128-key tiles and two stages (160 KB), which leave room for two O staging buffers, one
// per consumer warpgroup (the TMA-store epilogue). Measured on the H100 (fp16, two passes each,
// same run, ratio to cuDNN):
//   * non-causal had 176-key tiles (fewer, longer GEMMs per softmax) with one staging buffer
//     taken in turn: 128 keys and two buffers gave 512 0.953 -> 0.983-0.987, 1k 0.994 -> 1.02-1.03,
//     2k 1.00 -> 1.03, 16k +1.5%, 4k-8k within the spread. (Before the staging, 128-key tiles
//     had been worth +0.5% at 512 only.)
//   * causal had a third stage (225 KB: S=512 0.885-0.894 -> 0.901-0.903, 1k-4k unchanged); two
//     stages with the staging won more: 512 0.957 -> 0.993-0.997, 1k 1.03 -> 1.07, 2k 1.08 ->
//     1.12, 4k 1.07-1.10 -> 1.13.
template <bool kCausal, int kShape>
struct FwdConfig<128, kCausal, kShape> {
    static constexpr int kKeySplit = 1;
    static constexpr int kConsumerWarpgroups = 2, kBlockN = 128, kStages = 2;
    static constexpr int kProducerRegs = 24, kConsumerRegs = 240;
};
// D=256: O alone takes 128 registers per consumer thread and a K or V row is 512 bytes, so
// short key tiles: 64 KB of Q + 2 stages x (32 + 32) KB of K/V + one 32 KB O staging buffer.
// (80-key tiles filled the 227 KB without the staging; 64 keys with the TMA-store epilogue won,
// H100, fp16, two passes each, same run: non-causal 512 1.005 -> 1.045-1.056, 1k-4k +1-2%;
// causal 512 0.99 -> 1.04, 1k 1.065 -> 1.12, 2k-4k +1.5%.)
template <bool kCausal, int kShape>
struct FwdConfig<256, kCausal, kShape> {
    static constexpr int kKeySplit = 1;
    static constexpr int kConsumerWarpgroups = 2, kBlockN = 64, kStages = 2;
    static constexpr int kProducerRegs = 24, kConsumerRegs = 240;
};

// Split-KV (launch_fwd): a cluster of up to kMaxKvSplits CTAs shares one tile's keys.
constexpr int kMaxKvSplits = 8;  // the portable cluster size
static_assert(kMaxKvSplits == FC_CONFIG_MAX_KV_SPLITS, "FLASHCORE_KV_SPLITS's range (config.h)");
// The D=64 configurations merge a split by pushing (kPushMerge): rows [rank * R, rank * R + R)
// of the block, R = ceil(kBlockM / splits), are finalised by CTA `rank`, and every other CTA
// sends its partial of those rows into slot [its rank] of that CTA's slots region with st.async
// (unnormalised O in fp32, relative to its own row maxima, then the row's (max, sum)), counted
// by the receiver's mbarrier. O rows are padded by 8 floats (a warp's float2 stores of its 8
// rows spread over all banks).
template <int kHeadDim, int kBlockM>
struct SplitSlots {
    static constexpr int kOPitch = kHeadDim + 8;  // floats
    static constexpr int kRowBytes = kHeadDim * 4 + 8;  // what one row's partial sends
    static constexpr int rows_per_rank(int splits) { return (kBlockM + splits - 1) / splits; }
    // O slots [splits][R][kOPitch], then (max, sum) slots [splits][R].
    static constexpr int bytes(int splits) { return splits * rows_per_rank(splits) * (kOPitch * 4 + 8); }
    static constexpr int max_bytes() {
        int most = 0;
        for (int s = 2; s <= kMaxKvSplits; ++s) most = bytes(s) > most ? bytes(s) : most;
        return most;
    }
};

template <int kHeadDim, bool kCausal, int kShape = kLong>
struct FwdTraits : FwdConfig<kHeadDim, kCausal, kShape> {
    using C = FwdConfig<kHeadDim, kCausal, kShape>;
    static constexpr int kConsumerWarpgroups = C::kConsumerWarpgroups;
    static constexpr int kKeySplit = C::kKeySplit;  // consumer warpgroups per 64 query rows
    static constexpr int kBlockM = 64 * kConsumerWarpgroups / kKeySplit;  // query rows per CTA
    static constexpr int kBlockN = C::kBlockN;                // keys per K/V tile
    static constexpr int kStages = C::kStages;
    static constexpr int kThreads = 128 * (kConsumerWarpgroups + 1);
    static constexpr int kPanels = kHeadDim / 64;     // 64-column (128-byte) panels per row
    static constexpr int kQPanelBytes = kBlockM * 128;
    static constexpr int kKVPanelBytes = kBlockN * 128;
    static constexpr int kQBytes = kPanels * kQPanelBytes;
    static constexpr int kKVTileBytes = kPanels * kKVPanelBytes;
    // kKeySplit: each warpgroup's partial of the other's half of O, then its row max and sum (per
    // thread), for the merge.
    static constexpr int kPairBytes = kKeySplit > 1 ? 2 * 128 * (kHeadDim / 4 + 4) * 4 : 0;
    // Split merge by pushing (SplitSlots) where its slots fit: D=64 (D=128 and 256 fill the 227 KB
    // with their rings and merge by reading the peers' partials, finish_split_rows).
    // (kMasked calls are never split: no slots.)
    static constexpr bool kPushMerge = kHeadDim == 64 && kKeySplit == 1 && kShape != kMasked;
    static constexpr int kSlotBytes = kPushMerge ? SplitSlots<kHeadDim, kBlockM>::max_bytes() : 0;
    // kMasked: each stage's mask tile, kBlockM query rows of kBlockN keys (bytes), swizzled as TMA
    // writes it so that a warp's reads of one key column over its 8 rows fall in distinct banks:
    // 128-byte rows (D=64 / 128) with the 128-byte swizzle, 16-byte chunk c of row r at c ^ (r % 8);
    // 64-byte rows (D=256's 64-key tiles) with the 64-byte swizzle, chunk c at c ^ ((r / 2) % 4).
    // (D=256's staging buffer for O does not fit beside them: its masked blocks store O from
    // registers.)
    static constexpr int kMaskTileBytes = kShape == kMasked ? kBlockM * kBlockN : 0;
    // kQBufs Q buffers, then kStages K tiles, then kStages V tiles (every tile 1024-byte aligned:
    // swizzle atom), then the pair partial or the split slots, then the mask tiles, then the O
    // staging buffers. (First with one Q buffer: the O staging is sized before a second Q buffer
    // is fitted.)
    static constexpr int kMaskOffsetFromV = kStages * kKVTileBytes + kPairBytes + kSlotBytes;
    static constexpr int kRingBytesOneQ =
        kQBytes + 2 * kStages * kKVTileBytes + kPairBytes + kSlotBytes + kStages * kMaskTileBytes;
    static constexpr int kRingEndOneQ = (kRingBytesOneQ + 1023) / 1024 * 1024 + 1024 /* alignment */;
    static constexpr int kOStageBytes = 64 * kHeadDim * 2;
    static constexpr int kSmemLimit = 227 * 1024;
    // The epilogue's staging for O (the TMA-store epilogue in fwd_kernel): one 64-row block of O
    // per buffer, 128-byte swizzled panels as TMA reads them. One buffer per consumer warpgroup
    // where they fit after the rings (D=64, D=128); else one that the warpgroups take in ring
    // order (D=256); else none (kPair merges in its own region first).
    static constexpr int kOBufs = kKeySplit > 1                                                       ? 0
                                  : kRingEndOneQ + kConsumerWarpgroups * kOStageBytes <= kSmemLimit ? kConsumerWarpgroups
                                  : kRingEndOneQ + kOStageBytes <= kSmemLimit                       ? 1
                                                                                                    : 0;
    // A second Q buffer where it fits beside those (D=64 SHORT and non-causal LONG, D=128): the
    // producer loads the next tile's Q while this one runs, instead of once every consumer has
    // issued its last S = Q K^T of this tile (the consumers waited ~400 traced cycles per tile
    // for Q at D=64 S=512). Measured (H100, fp16, 3 interleaved passes, ratio to cuDNN): D=64
    // non-causal 512 (LONG) 1.006 -> 1.029, causal 512 1.011 -> 1.025-1.037, 1k 1.001 -> 1.017;
    // D=128 non-causal 512-2k +0.5-1%, causal 1k-4k +0.5%. D=64 causal LONG (three warpgroups,
    // 226 KB with it) lost, 2k 1.083 -> 1.069, 4k 1.092 -> 1.084, and keeps one. D=256: no room.
    static constexpr int kQBufs =
        (kConsumerWarpgroups <= 2 || !kCausal) && kRingEndOneQ + kQBytes + kOBufs * kOStageBytes <= kSmemLimit ? 2 : 1;
    static constexpr int kRingBytes = kRingBytesOneQ + (kQBufs - 1) * kQBytes;
    static constexpr int kOStageOffset = (kRingBytes + 1023) / 1024 * 1024;  // swizzle atoms are 1024 bytes
    static constexpr int kRingEnd = kOStageOffset + 1024 /* alignment */;
    static constexpr int kSmemBytes = kRingEnd + kOBufs * kOStageBytes;
    static_assert(kHeadDim % 64 == 0, "head dim must be a multiple of 64 (128-byte panels)");
    static_assert(kShape != kMasked || ((kBlockN == 128 || kBlockN == 64) && kKeySplit == 1 && kMaskOffsetFromV % 1024 == 0),
                  "mask tiles: rows of one swizzle span (128 or 64 bytes), 1024-byte aligned, one reader per row group");
    static_assert(kStages % kKeySplit == 0, "a stage must hold the tiles of one key part only");
    static_assert(kSmemBytes <= kSmemLimit, "must fit Hopper's 227 KB per block");
    static_assert(128 * (C::kProducerRegs + kConsumerWarpgroups * C::kConsumerRegs) <= 65536,
                  "register budgets exceed the register file");
};

// Barriers live in static shared memory, apart from the tiles.
template <int kQBufs, int kStages, int kOBufs>
struct Barriers {
    uint64_t q_full[kQBufs];  // per Q buffer
    uint64_t q_empty[kQBufs];
    uint64_t k_full[kStages];
    uint64_t v_full[kStages];
    uint64_t k_empty[kStages];  // K and V are released separately: with the pipelined loop,
    uint64_t v_empty[kStages];  // K(n) is done long before V(n)
    uint64_t merge_full;        // kPushMerge: the peers' partials of this CTA's rows have landed
    uint64_t o_free[kOBufs > 0 ? kOBufs : 1];  // an O staging buffer's last TMA store has read it

};

struct FwdMaps {
    CUtensorMap q, k, v, o;  // o: 64-row boxes, for the TMA-store epilogue
    MapOrder q_order, k_order, v_order, o_order;
    int32_t o_tma;  // O goes out through `o` (the TMA-store epilogue); 0: 16-byte stores from registers
    int32_t pair_s_ahead;  // kPair on a small grid: a warpgroup with two key tiles issues both S GEMMs at once
    int32_t pair_lead_load;  // kPair on a small grid: K0 alone first, then the other tiles (the producer)
    // The tile decode's divisors (query blocks, query heads) and the GQA group, set up on the
    // host: each FastDiv built in the kernel cost a 64-bit division (a called subroutine), and
    // head / group was a 32-bit division on the producer's path to its first load.
    FastDiv m_blocks_div, heads_q_div, group_div;
    // kMasked: the bool mask over (keys, queries, heads, batch), boxes of kBlockN keys x kBlockM
    // queries (last, so the other configurations' parameters keep their offsets).
    CUtensorMap mask;
    MapOrder mask_order;
};

// The work list: one tile = (query block, head, batch). Tiles of one (batch, head) are
// consecutive, its query blocks last-first, so the CTAs in flight at once mostly share one
// head's K/V in L2 and, under causal masking, the longest tiles of a head start first.
struct Tile {
    int m_block, head, batch;
};

// The tile decode divides by multiply-high and shift (FastDiv, common/fast_div.cuh): its two
// run-time divisions were each a dependent chain of ~30 instructions around a MUFU.RCP, on every
// consumer's path between one tile's epilogue and the next tile's first GEMM (~800 traced
// cycles from the epilogue's end to the next tile's start at D=64 causal 512, a ninth of a
// tile). Measured against the divisions (H100, fp16, 3 interleaved passes, ratio to cuDNN):
// D=64 causal 512 0.977-0.982 -> 1.009-1.042, 1k 0.978 -> 1.002-1.004, 2k 1.070 -> 1.084,
// non-causal 512 1.001 -> 1.007-1.009; D=128 causal 1k 1.124 -> 1.137; the rest within the
// spread.
__device__ __forceinline__ Tile decode_tile(int t, const FastDiv &m_blocks, const FastDiv &heads) {
    const int bh = m_blocks.div(t);
    const int head_batch = heads.div(bh);
    const int mb = static_cast<int>(m_blocks.d), h = static_cast<int>(heads.d);
    return {mb - 1 - (t - bh * mb), bh - head_batch * h, head_batch};
}

// The tile a CTA takes in round `round` of a persistent grid: rounds go over the work list
// gridDim.x tiles at a time, in snake order (even rounds left to right, odd rounds right to
// left). With causal masking the tiles of a head shrink along the list, so a CTA that drew a
// long tile in one round draws a short one in the next; plain round-robin gave CTA c the same
// block length every round whenever the blocks per head divide the grid (40% slower, see
// launch_fwd). Returns n_tiles when the CTA has no tile in this round (and in no later one).
// With a KV split the grid is made of clusters of `splits` CTAs that share each tile, so the
// order goes over clusters (slots) instead of CTAs.
// fwd_kernel's consumers find the next tile (t_next) once per tile: the loop steps to it, and the
// last GEMM section of the CTA's last tile is told by it. With snake_tile's and key_range's
// divisions skipped when there is no split, measured against main (H100, fp16, two A/B runs
// of 3 interleaved passes, ratio to cuDNN): D=64 non-causal 512 0.98 -> 0.995, causal 512
// 0.925 -> 0.94, 1k 0.937 -> 0.952; D=128 non-causal 512 1.006 -> 1.021, causal 1k 1.10 ->
// 1.12; but D=64 causal 2k 1.005 -> 0.996 and 4k 1.065 -> 1.05. The divisions skipped
// without t_next (the same loop step as before) lost to both: D=64 non-causal 1k 0.995.
__device__ __forceinline__ int snake_tile(int round, int n_tiles, int splits) {
    // (No division without a split: this runs at every tile boundary.)
    const int slots = splits == 1 ? static_cast<int>(gridDim.x) : static_cast<int>(gridDim.x) / splits;
    const int slot = splits == 1 ? static_cast<int>(blockIdx.x) : static_cast<int>(blockIdx.x) / splits;
    const int in_round = (round & 1) ? slots - 1 - slot : slot;
    const long long t = static_cast<long long>(round) * slots + in_round;
    return t < n_tiles ? static_cast<int>(t) : n_tiles;
}

// Lazy rescaling of O (must_rebase, common/sm80_ptx.cuh) in fwd_kernel's softmax: only at
// D=256, where the skipped rescale is 128 FMUL per thread and tile: there it gained 1-4% (H100,
// fp16, all 12 sweep shapes, same run); at D=64 and D=128 the warp vote cost about what it saved
// (D=128 non-causal 512-2k lost 1-1.5%, causal 2k-4k gained 0.5%; D=64 within +-1%).
template <int kHeadDim>
constexpr bool kLazyRescale = kHeadDim == 256;

// S = Q K^T with Q from registers (wgmma RS) instead of shared memory, at D=128. The SS form reads
// 6 KB of operands from shared memory per m64n128k16 step (64 tensor-core cycles): 96 bytes a
// cycle of the SM's 128, with the TMA writes of the next K/V tiles (~32 bytes a cycle) beside
// them. With Q's fragments in 32 registers per thread (loaded once per tile with ldmatrix), the
// S GEMM reads only K: 64 bytes a cycle. Q's buffer is also freed as soon as the fragments are
// loaded, not after the tile's last S GEMM. Measured (H100, fp16, 3 passes of A/B, ratio to
// cuDNN, backends timed call by call in turn): D=128 non-causal 1k 1.052-1.055 -> 1.063-1.064,
// 2k 1.058 -> 1.067-1.068, 4k 1.058-1.065 -> 1.067-1.074, 8k 1.062 -> 1.071-1.072, 16k
// 1.058-1.068 -> 1.062-1.071, 512 unchanged; causal 512 1.040-1.057 -> 1.033-1.041 and 1k -0.5%,
// so causal keeps Q in shared memory.
template <int kHeadDim, bool kCausal>
constexpr bool kQInRegs = kHeadDim == 128 && !kCausal;

// The grid split for one-row decoding (launch_fwd_config, fc_sm90_decode_splits in
// c_src/dispatch.c) runs only where the decode route sends calls: D=128 without a causal mask.
// Elsewhere it is compiled out, so the other configurations' code is unchanged by it.
template <int kHeadDim, bool kCausal, int kShape>
constexpr bool kGridSplit = kHeadDim == 128 && !kCausal && kShape == kLong;

// When a consumer waits for O += P(n-1) V(n-1) in the key loop (fwd_kernel's softmax). Main
// used to wait after the softmax of S(n), then rescale O and convert P(n) into p_frag: a tail of
// FMULs and F2FPs after the last exponential, on the path to the warpgroup's next GEMM turn.
// Waiting earlier lets the compiler interleave them with the exponentials, whose MUFU pacing
// leaves issue slots idle (ncu: our MUFUs stalled on "wait" 15x as often as cuDNN's):
//   * early (kEarlyPvWait, D=64): as soon as the row maxima are known. P V(n-1) takes half the
//     time of D=128's and is done by then.
//   * mid (kMidPvWait, D=128): after the first of the thread's two rows is exponentiated; the
//     early wait stalled there (D=128 non-causal 2k 1.03 -> 0.99, causal 2k 1.12 -> 1.10).
// Measured (H100, fp16, 3 passes each, ratio to cuDNN; docs/experiments/sessions-10-16.md, fifteenth session):
// D=64 causal 512 0.92 -> 0.94, 2k 0.99 -> 1.01; D=128 non-causal 512 0.98 -> 1.00, 1k-2k
// 1.02 -> 1.04, causal 512 0.995 -> 1.015, 1k 1.07 -> 1.10; the long rows within their spread.
template <int kHeadDim>
constexpr bool kEarlyPvWait = kHeadDim == 64;
template <int kHeadDim>
constexpr bool kMidPvWait = kHeadDim == 128;
template <int kHeadDim>
constexpr bool kPvWaitInSoftmax = kEarlyPvWait<kHeadDim> || kMidPvWait<kHeadDim>;

}  // namespace sm90
}  // namespace flashcore
