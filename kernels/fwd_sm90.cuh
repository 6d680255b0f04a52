// fwd_sm90.cuh - the Hopper (sm_90a) fused attention forward: TMA + wgmma + warp specialization.
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
//     so that each lane holds 8 consecutive columns). Measured (H100, fp16, same runs, ratio to
//     cuDNN): D=128 non-causal 512 0.906 -> 0.951, 1k 0.96 -> 0.99; D=64 non-causal 512 0.952
//     -> 0.983; D=128 causal and D=256 gave up a K/V stage or 16 keys per tile for the staging
//     and still gained 4%, D=128 non-causal 3% more on 128-key tiles (FwdConfig).
//   * Lazy rescaling at D=256 (kLazyRescale): O is rescaled only when a row's max grew by more
//     than 2^8 since its exponent base was set.
//
// Tensor maps are built on the host per call (cuTensorMapEncodeTiled, fetched through the
// runtime's driver entry point so the library does not link libcuda) and passed as
// __grid_constant__ parameters. Instantiated per (head dim, dtype) in fwd_sm90_hdim*_*.cu.
// Run it through the C API; tests force it with FLASHCORE_FAMILY=sm90.
#pragma once

#include "common/fast_div.cuh"
#include "common/sm80_ptx.cuh"
#include "common/split_combine.cuh"
#include "common/wgmma_generated.cuh"
#include "config.h"
#include "dispatch.h"
#include "flashcore.h"
#include "sm90/ptx.cuh"
#include "sm90/tensor_map.h"

#include <cuda.h>
#include <cuda/ptx>
#include <cuda_runtime.h>
#include <math.h>
#include <stdlib.h>
#include <type_traits>

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
// c_src/dispatch.c. Only D=64 has the last three.
constexpr int kLong = 0, kShort = 1, kTiny = 2, kPair = 3;
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
    static constexpr bool kPushMerge = kHeadDim == 64 && kKeySplit == 1;
    static constexpr int kSlotBytes = kPushMerge ? SplitSlots<kHeadDim, kBlockM>::max_bytes() : 0;
    // kQBufs Q buffers, then kStages K tiles, then kStages V tiles (every tile 1024-byte aligned:
    // swizzle atom), then the pair partial or the split slots, then the O staging buffers.
    // (First with one Q buffer: the O staging is sized before a second Q buffer is fitted.)
    static constexpr int kRingBytesOneQ = kQBytes + 2 * kStages * kKVTileBytes + kPairBytes + kSlotBytes;
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
__device__ __forceinline__ int snake_tile(int round, int n_tiles, int splits) {
    // (No division without a split: this runs at every tile boundary.)
    const int slots = splits == 1 ? static_cast<int>(gridDim.x) : static_cast<int>(gridDim.x) / splits;
    const int slot = splits == 1 ? static_cast<int>(blockIdx.x) : static_cast<int>(blockIdx.x) / splits;
    const int in_round = (round & 1) ? slots - 1 - slot : slot;
    const long long t = static_cast<long long>(round) * slots + in_round;
    return t < n_tiles ? static_cast<int>(t) : n_tiles;
}

// ---- Split-KV for small grids (see launch_fwd) ----
// A cluster of `splits` CTAs shares one tile: CTA `rank` runs its share of the key tiles, leaves
// its unnormalised O (fp32, relative to its own row maxima) and each row's (max, sum) in its
// shared memory, and after a cluster barrier finalises 1/splits of the block's rows from every
// CTA's partials, read through distributed shared memory (finish_split_rows; D=128 and 256).
// D=64 pushes instead (SplitSlots, above): no cluster barrier at the merge, and no round trips.
// Measured (H100, fp16, CUDA graph us, same run): one warpgroup split 2 at B=1 H=8 512 x 512
// 7.0 -> 6.5, 256 x 1024 8.4 -> 7.3; two warpgroups split 2 at 512 x 512 8.4 -> 7.6.
// No workspace, no second kernel.
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

// Partials in the (then idle) K/V ring: O rows padded by 8 floats, so the float2 stores of a
// warp's 8 rows spread over all banks (2 wavefronts for 256 bytes, the minimum).
template <int kHeadDim, int kBlockM>
struct SplitPartials {
    static constexpr int kOPitch = kHeadDim + 8;  // floats
    static constexpr int kBytes = kBlockM * kOPitch * 4 + kBlockM * 8;  // O, then (max, sum) per row
};

__device__ __forceinline__ uint32_t cluster_peer_addr(uint32_t local_addr, uint32_t rank) {
    uint32_t remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(local_addr), "r"(rank));
    return remote;
}
__device__ __forceinline__ float2 ld_cluster_f2(uint32_t addr) {
    float2 v;
    asm volatile("ld.shared::cluster.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(addr) : "memory");
    return v;
}
__device__ __forceinline__ float4 ld_cluster_f4(uint32_t addr) {
    float4 v;
    asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "r"(addr)
                 : "memory");
    return v;
}
// A float2 into a peer CTA's shared memory, counted (8 bytes) by that CTA's mbarrier.
__device__ __forceinline__ void st_async_f2(uint32_t remote_addr, float x, float y, uint32_t remote_bar) {
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32 [%0], {%1, %2}, [%3];\n"
                 ::"r"(remote_addr), "f"(x), "f"(y), "r"(remote_bar)
                 : "memory");
}
// The cluster's size and this CTA's rank in it (1 and 0 without a cluster launch). Volatile: read
// again at each use instead of being kept in a register across the main loop.
__device__ __forceinline__ int cluster_size() {
    uint32_t n;
    asm volatile("mov.u32 %0, %%cluster_nctarank;\n" : "=r"(n));
    return static_cast<int>(n);
}
__device__ __forceinline__ int cluster_rank() {
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return static_cast<int>(r);
}
__device__ __forceinline__ void cluster_sync_all() {
    ptx::barrier_cluster_arrive(ptx::sem_release);
    ptx::barrier_cluster_wait(ptx::sem_acquire);
}

// Merging partial results of one query row (a split's CTAs, or a pair's two warpgroups): each part j
// left an unnormalised O_j, its row maximum m_j and its sum l_j. With M = max_j m_j the merged row
// is O = sum_j w_j O_j / L, L = sum_j w_j l_j, LSE = M + log2 L (base 2), and w_j is the weight
// below. A part whose key range was empty, or whose keys the row could not see, left m_j = -inf,
// l_j = 0, O_j = 0: it gets weight 0 (2^(m_j - M) would be NaN when every part is empty).
// `scale` turns m into base-2 units (1 where m already is).
__device__ __forceinline__ float partial_weight(float m, float m_max, float scale = 1.f) {
    return m == -INFINITY ? 0.f : fast_exp2((m - m_max) * scale);
}

// Rows [rank * R, rank * R + R) of the block, R = ceil(kBlockM / splits), merged from every CTA's
// partials (partial_weight; m in base-2 units), accumulated one CTA at a time.
template <typename Elem, int kHeadDim, int kBlockM>
__device__ __forceinline__ void finish_split_rows(uint32_t part_addr, int rank, int splits, int tid, int n_threads,
                                                  int m_block, int head, int batch, const fc_params &p) {
    using SP = SplitPartials<kHeadDim, kBlockM>;
    constexpr int kQuads = kHeadDim / 4;  // float4 columns per row
    const uint32_t ml_addr = part_addr + kBlockM * SP::kOPitch * 4;
    const int rows_per_rank = (kBlockM + splits - 1) / splits;
    const int row_begin = rank * rows_per_rank;
    const int row_end = min(kBlockM, row_begin + rows_per_rank);
    const int seqlen_q = static_cast<int>(p.seqlen_q);
    Elem *out = static_cast<Elem *>(p.out) + batch * p.o_stride_b + head * p.o_stride_h;
    for (int item = tid; item < (row_end - row_begin) * kQuads; item += n_threads) {
        const int r = row_begin + item / kQuads;
        const int col = (item % kQuads) * 4;
        const int row = m_block * kBlockM + r;
        if (row >= seqlen_q) continue;
        // All (max, sum) pairs first, then every CTA's O columns: independent loads, so the
        // remote round trips overlap instead of queueing one behind another.
        float2 ml[kMaxKvSplits];
        float mx = -INFINITY;
#pragma unroll
        for (int j = 0; j < kMaxKvSplits; ++j) {
            ml[j] = j < splits ? ld_cluster_f2(cluster_peer_addr(ml_addr + r * 8, j)) : make_float2(-INFINITY, 0.f);
            mx = fmaxf(mx, ml[j].x);
        }
        float sum = 0.f, acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int j = 0; j < kMaxKvSplits; ++j) {
            if (j >= splits) break;
            const float w = partial_weight(ml[j].x, mx);
            const float4 o = ld_cluster_f4(cluster_peer_addr(part_addr + (r * SP::kOPitch + col) * 4, j));
            sum += w * ml[j].y;
            acc[0] += w * o.x;
            acc[1] += w * o.y;
            acc[2] += w * o.z;
            acc[3] += w * o.w;
        }
        const float inv = sum > 0.f ? 1.f / sum : 0.f;
        Elem *dst = out + row * p.o_stride_s + col;
        *reinterpret_cast<uint32_t *>(dst) = pack2<Elem>(acc[0] * inv, acc[1] * inv);
        *reinterpret_cast<uint32_t *>(dst + 2) = pack2<Elem>(acc[2] * inv, acc[3] * inv);
        if (col == 0 && p.lse != nullptr)
            p.lse[batch * p.lse_stride_b + head * p.lse_stride_h + row * p.lse_stride_s] =
                (mx + __log2f(sum)) * 0.6931471805599453f;
    }
}

// ---- Epilogue stores ----
// In the wgmma accumulator layout lane q of a quad (q = lane % 4) holds columns 8t + 2q, +1 of
// every 8-column tile t of its row: one 32-bit word per tile, so storing straight from
// registers takes 4-byte stores that each fill half a sector. quad_transpose turns the words of
// four consecutive tiles (w[t] = tile 4g + t) into one 16-byte chunk per lane: afterwards lane q
// holds tile 4g + q, its words in column order (w[j] = columns 8(4g + q) + 2j, +1). Two rounds
// of exchanges with the quad partners lane ^ 1 and lane ^ 2, each swapping one bit between the
// lane index and the tile index (4 shuffles, no local memory: the selects are on lane bits).
__device__ __forceinline__ void quad_transpose(uint32_t (&w)[4], int lane) {
    const bool odd = lane & 1, high = lane & 2;
    // Round 1: send the two tiles whose bit 0 differs from the lane's, receive the partner's.
    uint32_t r0 = __shfl_xor_sync(0xffffffff, odd ? w[0] : w[1], 1);
    uint32_t r1 = __shfl_xor_sync(0xffffffff, odd ? w[2] : w[3], 1);
    uint32_t a[4] = {odd ? r0 : w[0], odd ? w[1] : r0, odd ? r1 : w[2], odd ? w[3] : r1};
    // Round 2: the same on bit 1.
    r0 = __shfl_xor_sync(0xffffffff, high ? a[0] : a[2], 2);
    r1 = __shfl_xor_sync(0xffffffff, high ? a[1] : a[3], 2);
    w[0] = high ? r0 : a[0];
    w[1] = high ? r1 : a[1];
    w[2] = high ? a[2] : r0;
    w[3] = high ? a[3] : r1;
}

// Stores four 8x8 16-bit matrices from the mma accumulator layout (lane l holds row l / 4,
// columns 2 (l % 4) and +1 of each): lanes 8i..8i+7 give the shared addresses of matrix i's rows.
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t m0, uint32_t m1, uint32_t m2, uint32_t m3) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(m0), "r"(m1),
                 "r"(m2), "r"(m3)
                 : "memory");
}

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
    using T = FwdTraits<kHeadDim, kCausal, kShape>;
    constexpr int kBlockM = T::kBlockM, kBlockN = T::kBlockN, kStages = T::kStages;
    constexpr int kNTiles = kBlockN / 8;   // 8-column accumulator tiles of S
    constexpr int kDTiles = kHeadDim / 8;  // 8-column accumulator tiles of O
    constexpr int kW = T::kConsumerWarpgroups;
    constexpr int kKeySplit = T::kKeySplit;
    // Warpgroups that share rows split the keys instead of taking turns (kPair).
    constexpr bool kPingPong = kW > 1 && kKeySplit == 1;
    // Causal, 128-key tiles, one warpgroup per row group: a warpgroup whose 64 rows start a key
    // tile sees only that tile's first 64 keys, so its P V on that tile runs on those 64 keys
    // (half_tile in the key loop). The S GEMM on 64 keys too (m64n64 into half of S) made ptxas
    // serialise the wgmma pipeline (C7511) in D=64 LONG and D=128: causal 2k-4k 0.73-0.78 of cuDNN.
    constexpr bool kHalfTiles = kCausal && !kBand && kBlockN == 128 && kKeySplit == 1;
    // A warpgroup with no live row skips its key tiles (seen_end in the key loop). Only where the
    // loop has no carried S (kCarryS issues the next tile's S in the section it assumes is last).
    constexpr bool kSkipDeadRows = kHeadDim == 128 && !kCausal;
    static_assert(!(kPvWaitInSoftmax<kHeadDim> && kLazyRescale<kHeadDim>),
                  "the softmax rescales O unconditionally where it waits for P V: not with lazy rescaling");

    extern __shared__ unsigned char smem_raw[];
    __shared__ Barriers<T::kQBufs, kStages, T::kOBufs> bars;
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
    auto issue_qk_into = [&](float (&acc)[kNTiles * 4], int i) {
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
    };
    auto issue_qk = [&](int i) { issue_qk_into(s, i); };
    // `half`: P's keys 64..127 are all zero (half_tile in the key loop), so only the first 64 keys.
    // `overwrite`: the tile's first P V, which writes O instead of adding to it (kCarryS: O is not
    // zeroed at the tile's start, see there).
    auto issue_pv = [&](int i, bool half, bool overwrite) {  // O += P V for ring slot i, asynchronous
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
    };
    auto release = [&](uint64_t *bar) {  // this warp is done with what `bar` guards
        __syncwarp();
        if (lane == 0) ptx::mbarrier_arrive(bar);
    };
    auto rescale_o = [&](const float (&rescale)[2]) {
#pragma unroll
        for (int d = 0; d < kDTiles; ++d) {
            o_acc[d * 4 + 0] *= rescale[0];
            o_acc[d * 4 + 1] *= rescale[0];
            o_acc[d * 4 + 2] *= rescale[1];
            o_acc[d * 4 + 3] *= rescale[1];
        }
    };
    // The S accumulator layout of two 8-key tiles is the A-fragment layout of one 16-key step.
    // `live_tag`: the 8-key tiles of S that hold P (the rest, masked for every row of a half
    // tile, feed no GEMM).
    auto convert_p = [&](auto live_tag) {
#pragma unroll
        for (int kk = 0; kk < decltype(live_tag)::value / 2; ++kk) {
            p_frag[kk][0] = pack2<Elem>(s[(2 * kk) * 4 + 0], s[(2 * kk) * 4 + 1]);
            p_frag[kk][1] = pack2<Elem>(s[(2 * kk) * 4 + 2], s[(2 * kk) * 4 + 3]);
            p_frag[kk][2] = pack2<Elem>(s[(2 * kk + 1) * 4 + 0], s[(2 * kk + 1) * 4 + 1]);
            p_frag[kk][3] = pack2<Elem>(s[(2 * kk + 1) * 4 + 2], s[(2 * kk + 1) * 4 + 3]);
        }
    };

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

        // row_max is kept in raw score units; the scale (> 0, see fc_dispatch) goes into one
        // FFMA per element: p = exp2(s * scale * log2(e) - max * scale * log2(e)).
        // Returns whether this warp moved its rows' exponent base (else O needs no rescaling).
        // kPvWaitInSoftmax (kEarlyPvWait, kMidPvWait): when `pv_pending` it also calls `finish_pv`
        // (waits for O += P(n-1) V(n-1), releases its V stage), rescales O and converts P(n).
        auto softmax = [&](int n, float (&rescale)[2], bool pv_pending, auto &&finish_pv) -> bool {
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
            const int seen_end = kBand && kKeySplit == 1 ? max(first + 1, min(end, (wg_row0 + 63 + p.band_hi_) / kBlockN + 1))
                                 : kCausal && kKeySplit == 1 ? max(first + 1, min(end, (wg_row0 + 63) / kBlockN + 1))
                                 : kSkipDeadRows && wg_row0 >= seqlen_q ? first + 1
                                                                        : end;
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
                    wgmma_wait<0>();
                    trace(6, mine);
                    fence_registers(s);
                    release(&bars.k_empty[(slot0 + mine) % kStages]);
                    if (!kQInRegs<kHeadDim, kCausal> && mine == last)
                        release(&bars.q_empty[qb]);  // last use of Q in this tile
                    softmax(mine, rescale, false, [] {});  // O is still zero: nothing to rescale
                    if constexpr (!kPvWaitInSoftmax<kHeadDim>) convert_p(std::integral_constant<int, kNTiles>{});
                    trace(7, mine);
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
                    wait_turn();
                    if (carry) issue_next_qk();  // (first, as in the loop's sections; non-causal: seen_end == end)
                    issue_pv(slot0 + last, last == half_tile, kCarryS && last == mine);
                    pass_turn(last_tile && seen_end == end);  // the tile's last GEMM section?
                    wgmma_wait<0>();  // (with the next S: the epilogue overlapping it made ptxas serialise)
                    trace(8, last);
                    fence_registers(o_acc);
                    release(&bars.v_empty[(slot0 + last) % kStages]);
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
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float sum = row_sum[h];
            sum += __shfl_xor_sync(0xffffffff, sum, 1);
            sum += __shfl_xor_sync(0xffffffff, sum, 2);
            row_sum[h] = sum;
            // (kBand: a row that saw no key has sum 0 and gives zeros.)
            inv_sum[h] = kBand && sum == 0.f ? 0.f : 1.f / sum;
        }
        if constexpr (kKeySplit > 1) {
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
        // Rows this CTA writes (all, unless a pushed split leaves some to a peer) and their LSE.
        bool finalise[2] = {true, true};
        float lse_log2[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) lse_log2[h] = row_max[h] * scale_log2 + __log2f(row_sum[h]);
        // Attention sinks (p.sinks: one logit per query head, a key with no value in every row's
        // denominator): the row's keys weigh sigmoid(lse - sink) of it, and its LSE becomes
        // logaddexp(lse, sink), here in base 2. A CTA with sinks is never split (launch_fwd_config),
        // so this is the row's final LSE.
        if (p.sinks != nullptr) {
            const float sink2 = p.sinks[tile.head] * 1.4426950408889634f;
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
            // Leave this CTA's partials in the K/V ring (running on into the O staging, which
            // split CTAs do not use), once every consumer warpgroup is past its last P V (the
            // producer has nothing in flight: each loaded tile was consumed).
            using SP = SplitPartials<kHeadDim, kBlockM>;
            static_assert(SP::kBytes <= T::kOStageOffset + T::kOBufs * T::kOStageBytes - T::kQBufs * T::kQBytes,
                          "split partials must fit the K/V ring and the O staging");
            asm volatile("bar.sync %0, %1;\n" ::"r"(kW + 1), "n"(128 * kW) : "memory");
            float *part_o = reinterpret_cast<float *>(smem_k);
            float2 *part_ml = reinterpret_cast<float2 *>(part_o + kBlockM * SP::kOPitch);
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
            continue;
        } else if (kGridSplitHere && p.num_splits_ > 1) {
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
            continue;
        }
        if (p.lse != nullptr && (lane % 4) == 0 && key_part == 0) {  // (kPair: both hold the merged rows)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int row = row0 + 8 * h;
                if (row < seqlen_q && finalise[h])
                    p.lse[tile.batch * p.lse_stride_b + tile.head * p.lse_stride_h + row * p.lse_stride_s] =
                        lse_log2[h] * 0.6931471805599453f;
            }
        }
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
                ptx::fence_proxy_async(ptx::space_shared);  // the stores, visible to TMA
                asm volatile("bar.sync %0, 128;\n" ::"r"(kW + 3 + consumer) : "memory");
                if (threadIdx.x % 128 == 0) {
                    int32_t c[4];
#pragma unroll
                    for (int panel = 0; panel < T::kPanels; ++panel) {
                        set_coords(c, maps.o_order, panel * 64, wg_row0, tile.head, tile.batch);
                        ptx::cp_async_bulk_tensor(ptx::space_global, ptx::space_shared, &maps.o, c,
                                                  smem_o + o_buf * T::kOStageBytes + panel * (64 * 128));
                    }
                    ptx::cp_async_bulk_commit_group();
                    o_store_pending = true;
                }
                trace(10, 0);
                continue;
            }
        }
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
                uint32_t w[4];
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
    trace(12, 0);
    // The last store of O must have read the staging buffer before the CTA's shared memory goes
    // (and, with one buffer, the other warpgroup's last epilogue may be waiting for it).
    if constexpr (T::kOBufs > 0) retire_o_store();
}

// ------------------------------------------------------------------------- host side

// The largest grid G <= sms for which the snake order gives every CTA complementary causal
// tiles in consecutive rounds: a tile's rank within its head is t mod m_blocks, and it reverses
// from one round to the next exactly when m_blocks divides 2 G.
inline int64_t paired_grid(int64_t m_blocks, int64_t sms) {
    if (m_blocks % 2 == 0) return (m_blocks / 2) * (2 * sms / m_blocks);
    return m_blocks * (sms / m_blocks);
}

// A 1-D launch of `grid` CTAs with its attributes in `attrs` (at most 2): clusters of `cluster_size`
// CTAs (0: no cluster attribute; the occupancy query needs one even for clusters of 1), and
// programmatic dependent launch when `pdl` (fc_use_pdl).
inline cudaLaunchConfig_t launch_config(int64_t grid, int cluster_size, bool pdl, int threads, int smem_bytes,
                                        cudaStream_t stream, cudaLaunchAttribute (&attrs)[2]) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(static_cast<unsigned>(grid));
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
    // c_src/dispatch.c, from the CTAs that fit at once in clusters of each size (clusters must
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
    const bool may_split = kShape != kPair && p.sinks == nullptr;
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
                                      : fc_longest_key_run(p.seqlen_q, p.seqlen_k, kCausal);  // dispatch.h
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

// D=64's configuration: fc_sm90_d64_config (c_src/dispatch.c), with the rules and their
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

// A general band (p.band_ == FC_BAND_GENERAL_, c_src/dispatch.h) runs in the causal LONG
// configuration of each head dim (kBand); a softcap (kSoftcap) the LONG one of its kind.
template <typename Elem, int kHeadDim, bool kCausal>
cudaError_t launch_fwd(const fc_params &p, cudaStream_t stream) {
    int device = 0, sms = 0;
    if (fc_device_info_(&device, nullptr, nullptr, &sms) != FC_OK) return fc_last_cuda_error();
    if constexpr (kCausal)
        if (p.band_ == FC_BAND_GENERAL_)
            return p.softcap != 0.f ? launch_fwd_config<Elem, kHeadDim, true, kLong, true, true>(p, stream, device, sms)
                                    : launch_fwd_config<Elem, kHeadDim, true, kLong, true>(p, stream, device, sms);
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
    extern "C" cudaError_t fc_sm90_fwd_hdim##HDIM##_##DTYPE_NAME(const fc_params *p,          \
                                                                 cudaStream_t stream) {       \
        return p->causal ? flashcore::sm90::launch_fwd<ELEM, HDIM, true>(*p, stream)           \
                         : flashcore::sm90::launch_fwd<ELEM, HDIM, false>(*p, stream);         \
    }                                                                                          \
    FLASHCORE_SM90_TRACE_COPY(HDIM, DTYPE_NAME)
