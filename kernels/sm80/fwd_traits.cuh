// sm80/fwd_traits.cuh - the compile-time shape of the sm80-class forward (fwd_sm80.cuh): its
// tiles per head dim (FwdTraits: m-atoms per warp, query and key rows per tile, shared-memory
// pitch and bytes, which kernels keep their addresses in few registers), the narrow shapes Ada
// runs (kNarrow), and where O is rescaled lazily (kLazyRescale). Why each shape, and what the
// others measured, is written beside it. FwdShape gathers one kernel instantiation's constants
// for the parts of fwd_kernel (sm80/fwd_steps.cuh and the others).
#pragma once

#include "sm80/mask_tile.cuh"  // MaskTile, kNoMask, kBoolMask, kAddMask

#include <stdint.h>
#include <type_traits>

namespace flashcore {
namespace sm80 {
// Tile shape per head dim. Unmasked: 4 warps, 128 query rows per CTA, so each warp owns 32 rows
// (two 16-row m-atoms) and every K/V fragment it loads from shared memory feeds two mma instead of
// one (half the ldmatrix traffic per FLOP of 16 rows per warp, as FlashAttention-2). Q is re-read
// from shared memory per k-step: registers hold O (D=64: 64, D=128: 128 fp32) and S (128 / 64
// on Hopper). Key tiles:
//   * D=64: 128 keys on Hopper, FlashAttention-2's 128x128 (S 128 + O 64 fp32, the same 192
//     accumulators as D=128's 128x64); forced sm80 on the H100 it measured 0.86-1.17 ->
//     0.95-1.32x flash, +8-11% non-causal (docs/experiments/sessions-10-16.md). It fits 255 registers only with
//     FwdTraits::kLeanRegs (without it: 12-148 bytes of spill stores; 144-1000 in an earlier
//     attempt). Ada keeps 128x64 (FwdTraits' kNarrow).
//   * D=128: 64 keys on Hopper, FlashAttention-2's 128x64 there: against 128x32 tiles, 20% fewer
//     ldmatrix per key (Q re-read per 64 keys, not 32) and half the O rescales and row-max
//     shuffles; forced sm80 on the H100 it measured 0.86-1.02 -> 0.95-1.13x flash
//     (docs/experiments/sessions-10-16.md, thirteenth session). It fits 255 registers only with FwdTraits::kLeanRegs
//     and load_rows' one shared address per thread (before them: 20-144 bytes of spill stores).
//     Its 64 KB of shared memory would leave one CTA per SM on sm_89 (100 KB per SM), so Ada
//     keeps 128x32 (48 KB, two CTAs; FwdTraits' kNarrow).
//   * Masked D=64 / D=128 (a mask tile rides with K; FwdTraits' kTwoAtomMask): on Hopper two
//     m-atoms per warp like the unmasked kernels, D=64 128x64 and D=128 128x32; on the H100
//     with HuggingFace's padded causal bool mask: 0.80 -> 1.02x cuDNN at D=64 4k, 0.83-0.86 ->
//     0.90-0.92 at D=128 (docs/experiments/sessions-10-16.md). Both need FwdTraits::kLeanRegs (with the mask's pointer, strides and copy mode in
//     the shared slots too) and the mask copies' one address per thread (load_mask_chunks /
//     load_mask_elements): before those, two atoms spilled 40-370 bytes. D=128 128x64 (192 fp32
//     accumulators, as the unmasked 128x64) still spilled 4-108 bytes (255 registers) with
//     them, whichever of the mask copies, the mask reads or the run-time causal flag was taken
//     out, so D=128 takes 32-key tiles (160 accumulators). Ada keeps one m-atom, 64x64 (kNarrow;
//     launch_fwd, takes_narrow_tiles).
//   * Masked D=80 / D=96 (Phi-2's and Phi-3-mini's heads): two m-atoms on Hopper the same way,
//     D=80 128x64 (O 80 + S 64 fp32) and D=96 128x64 (O 96 + S 64: D=128 128x32's 160
//     accumulators), with kLeanRegs (as far as it applies: load_rows has no one-address path for
//     10 / 12 chunks per row) and, at D=96, the Q/K address walks (kWalkQK). Without kLeanRegs
//     they spilled (D=80 128x64: 120-444 bytes; D=96 128x32: 16-32 bytes, additive); D=96 128x64
//     spilled 4-24 bytes with kLeanRegs alone. On the H100 with HuggingFace's padded bool mask
//     (B=4 H=32 S=2048, three passes, cuDNN time / ours): D=80 1.01-1.04 -> 1.31-1.32, D=96
//     0.90-0.92 -> 1.12-1.15 (128x32 tiles: 0.97-0.99); 2.3-2.5x -> 2.8-3.2x PyTorch's
//     `efficient`. Ada keeps the one-atom 64x64 shape (kNarrow), as for D=64 / D=128. Shared
//     memory per CTA: D=80 74 KB (bool) / 82 KB (additive), D=96 72 / 80 KB; two CTAs per SM on
//     Hopper. D=32 and D=256 keep one m-atom everywhere.
// ptxas (sm_90a / sm_89): D=64 255 registers (128x64: 225-237), D=128 255 (128x32: 248-255),
// masked two-atom D=64 207-215, D=128 230-236, D=80 239-241, D=96 250-255, masked one-atom 182-255;
// no spills, no stack.
// Measured (H100 80GB HBM3, forced sm80, fp16, 16k-token sweeps; flash = PyTorch's FlashAttention-2
// in the same run; docs/experiments/first-versions.md, 2026-11-26):
//   * v1, 4 warps x 16 rows (BM=64, BN=64), Q in registers, 2-stage K/V ring: D=64 nc 4k 244 vs
//     flash 308; D=128 nc 4k 265 vs 326; causal D=64 237 vs 284, D=128 252 vs 304.
//   * v2 (this shape; D=64 with 128x64, D=128 with 128x32 tiles): D=64 nc 4k 297 vs 303, D=128
//     nc 4k 321 vs 349, causal D=64 251 vs 287, D=128 266 vs 312 (0.85-0.98x at 4k; 1.0x at
//     D=64 nc 1k and D=128 nc 16k). A GPU profile of D=128 nc against flash (128x64): 20% more ldmatrix, twice the
//     rescales and row-max shuffles, ~9% slower; hence the 64-key tiles above.
// Measured and lost:
//   * The scale folded into the exponent's FFMA (exp2(s * c - max * c), max over raw scores) with
//     a per-row branch to the exact form for huge scores (the sm90 family's fix): with the fold
//     switched on vs off in one run, D=64 +1-7%, D=128 -1-3%; but both builds ran 10-15% below v2
//     on every shape (D=128 nc 4k 277-279 vs 321, flash unchanged at 349-352). The per-row branch
//     (4 per tile, splitting the softmax into separate blocks) is the suspect; not verified.
//   * load_tile with one running source pointer per thread (fewer live registers): no gain.
//   * D=128 with 64-key tiles and the old addressing: spills 20-144 bytes (255 registers) in the
//     unmasked variants; no gain measured. (Now without spills; see above.)
//   * 8 warps / 128 query rows of 16 rows per warp for D=128 (one CTA of 8 warps per SM instead of
//     two of 4): non-causal 4k 222 vs 263 TFLOP/s, causal 196 vs 248.
//   * K and V in separate cp.async groups on the v1 2-stage ring: D=64 nc 4k 236 vs 248.
// Other head dims (issue 3; shapes chosen by the register budget, not yet timed on a GPU):
//   * Rows of D=32 / 80 / 96 are not whole 128-byte groups, so shared rows are padded to a multiple
//     of 64 elements (kPitch): the same swizzle and ldmatrix addressing as D=64/128, no bank
//     conflicts, no extra global traffic; the cost is shared memory (D=80/96 take D=128's tiles).
//   * D=32: 128 x 128 (O is 32 fp32, so S can be 128 keys wide: half the barriers per key of a
//     64-key tile, and 2 k-steps per tile is little work to hide them behind; FlashAttention-2's
//     choice too). 235-240 registers, no spills.
//   * D=80: 128 x 64 like D=64 (O 80 + S 64 fp32): 239-246 registers.
//   * D=96: 128 x 32 (O 96 + S 32): 215-229 registers. 128 x 64 also compiled without spills
//     but at 255 registers on both archs (O 96 + S 64; before load_rows); the candidate to time
//     first.
//   * D=256: 64 x 32, one m-atom per warp (O alone is 128 fp32 per atom): 242-255 registers,
//     64 KB of shared memory (one CTA per SM on sm_89). 64 x 64 (96 KB) also compiles without
//     spills at 255 registers; on Hopper the sm90 family runs D=256 anyway unless forced.
//   * Masked: 64 x 64 for D=32 (156-220 registers) and for D=64/80/96/128 on Ada (D=80/96:
//     203-251), 64 x 32 for D=256 (255 registers;
//     a 64-key tile would not fit 99 KB beside its mask tile).
// Lazy rescaling of O (must_rebase, common/sm80_ptx.cuh) in fwd_kernel's online softmax: only
// in the causal D=128 kernel, where it measured a gain. Forced sm80 on the H100 (fp16, 2 passes
// of each build in one run, ratio to cuDNN): causal D=128 +2-4% at S=512-1k, +7-8% at 2k, +3-14%
// at 4k-16k. Non-causal D=128 lost 2% at 512-1k and 7-10% on the GQA chunk rows (Sq=128/512
// against Sk=4k/8k); D=64 lost 1-6% (the warp vote costs about what the rescale of 32 columns
// saves); D=256 spilled (255 registers).
template <int kHeadDim, bool kCausal>
constexpr bool kLazyRescale = kHeadDim == 128 && kCausal;

// kNarrow: the D=64 and D=128 unmasked kernels on their narrower key tiles, as before the wide
// ones (above), for sm_89. D=128 128x32: 128x64's 64 KB of shared memory would leave one CTA per
// SM there (100 KB per SM), where the 48 KB of 128x32 leave two, and FlashAttention-2 also keeps
// 128x32 on sm8x. D=64 128x64: both shapes leave two CTAs per SM there (128x128: 48 KB);
// Ada keeps the shape it had. Neither head dim's shapes were compared on an Ada card.
// launch_fwd takes the narrow tiles below compute capability 9, or anywhere with
// FLASHCORE_SM80_TILES=narrow (config.h; how the tests run them on Hopper); =wide takes the
// wide ones anywhere (launch_fwd, takes_narrow_tiles).
template <int kHeadDim, bool kMasked = false, bool kNarrow = false>
struct FwdTraits {
    static constexpr int kWarps = 4;
    // kTwoAtomMask: the D=64 / 80 / 96 / 128 masked variants on two m-atoms per warp, 128-row
    // tiles (kNarrow = false); with kNarrow they keep the one-atom 64x64 shape (Ada; see
    // launch_fwd).
    static constexpr bool kTwoAtomMask = kMasked && !kNarrow && kHeadDim != 32 && kHeadDim != 256;
    // 16-row m-atoms per warp: two (each K/V fragment feeds two mma), except the other masked
    // variants and D=256, whose O accumulators (128 fp32 per atom) leave no room for a second atom.
    static constexpr int kMAtoms = (kMasked && !kTwoAtomMask) || kHeadDim == 256 ? 1 : 2;
    static constexpr int kWarpRows = 16 * kMAtoms;
    static constexpr int kBlockM = kWarpRows * kWarps;  // query rows per CTA
    // Key rows per K/V tile (see the tile-shape comment above for why each).
    static constexpr int kBlockN = kHeadDim == 256             ? 32
                                   : kMasked                   ? (kTwoAtomMask && kHeadDim == 128 ? 32 : 64)
                                   : kHeadDim == 32            ? 128
                                   : kHeadDim == 64            ? (kNarrow ? 64 : 128)
                                   : kHeadDim == 128           ? (kNarrow ? 32 : 64)
                                   : kHeadDim == 96            ? 32
                                                               : 64;  // D=80
    static constexpr int kThreads = 32 * kWarps;
    static constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks of data per row
    // Shared-memory row pitch in chunks: rounded up to a multiple of 8 (128 bytes), so the
    // (row % 8) XOR swizzle and chunk_pair_addr's 128-byte steps hold for any D; D=32 / 80 / 96
    // leave chunks [kChunks, kPitchChunks) of each row unused (never loaded, never read).
    static constexpr int kPitchChunks = (kChunks + 7) / 8 * 8;
    static constexpr int kPitch = kPitchChunks * 8;  // elements
    static constexpr int kMinBlocksPerSm = 2;
    // The wide kernels, unmasked D=64 128x128 and D=128 128x64 (192 fp32 accumulators, O + S, of
    // the 255 registers two CTAs per SM leave) and the two-atom masked ones (kTwoAtomMask: D=128
    // 160 accumulators, D=64 128, beside the mask tile's addressing), keep their addresses
    // in as few registers as they can, for a few more instructions per tile: V's ldmatrix
    // addresses walked along the d-steps (ChunkPairWalk) instead of one register per step
    // modulo 4, the K/V slice pointers read back from shared memory per tile (KvSlices'
    // shared slots, sm80/fwd_loads.cuh) instead of held, and K/V tiles (and mask tiles)
    // copied with one shared address per thread (load_rows, load_mask_chunks /
    // load_mask_elements). D=128 also walks Q's and K's addresses along its 8 k-steps
    // (kWalkQK). Each is needed: without the V walk, the Q/K walks or the shared pointers,
    // D=128 spilled 32-40 bytes (non-causal, sm_90a); without the V walk, the shared pointers
    // or load_rows, D=64 spilled 32-144 bytes (non-causal), and with the Q/K walks as well
    // 44-48 bytes (non-causal, sm_90a), so D=64 leaves them out.
    // The two-atom masked D=80 / D=96 kernels take kLeanRegs too (without it they spilled
    // 16-444 bytes); load_rows has no one-address path for their 10 / 12 chunks per row, so
    // there it is the V walk, the shared slots and the mask copies' one address, and at D=96
    // (128x64) the Q/K walks as well.
    static constexpr bool kLeanRegs = (!kMasked || kTwoAtomMask) && !kNarrow &&
                                      (kHeadDim == 64 || kHeadDim == 128 || kTwoAtomMask);
    static constexpr bool kWalkQK = kLeanRegs && (kHeadDim == 128 || (kTwoAtomMask && kHeadDim == 96));
    // Elements: Q tile + one K tile + one V tile (single-buffered: V(n) loads under S(n), K(n+1)
    // under softmax(n) and PV(n); see fwd_kernel's key loop).
    static constexpr int kSmemElems = kBlockM * kPitch + 2 * kBlockN * kPitch;
    // kLeanRegs: the K and V slice pointers (and a mask's pointer, strides and copy mode), after
    // the tiles (16 / 48 bytes: a mask tile after them stays 16-byte aligned for cp.async).
    static constexpr int kSlotBytes = kLeanRegs ? (kMasked ? 48 : 16) : 0;
    // Bytes: the tiles, then the slots; a mask tile follows (launch_fwd adds it).
    static constexpr int kSmemBytes = kSmemElems * 2 + kSlotBytes;
    static_assert(kHeadDim % 16 == 0, "k-steps of 16 and V fragments in pairs of 8 columns");
    static_assert(kSmemBytes % 16 == 0, "the mask tile after the slots: 16-byte aligned");
    static_assert(kSmemBytes <= 99 * 1024, "must fit an sm_89 block (99 KB)");
};

// One fwd_kernel instantiation's compile-time shape, shared by its parts. kCausal: the causal
// variant without a mask (with one, causality is a run-time flag); kSoftcap: the logit softcap.
template <typename Elem_, int kHeadDim_, bool kCausal_, int kMask_, bool kNarrow_, bool kSoftcap_>
struct FwdShape {
    using Elem = Elem_;
    using T = FwdTraits<kHeadDim_, kMask_ != kNoMask, kNarrow_>;
    using M = MaskTile<kMask_, T::kBlockM, T::kBlockN>;
    // The mask's raw values: bool bytes, or an additive mask's 16-bit bits of Elem.
    using MaskBits = typename std::conditional<kMask_ == kBoolMask, uint8_t, uint16_t>::type;
    static constexpr int kHeadDim = kHeadDim_, kMask = kMask_;
    static constexpr bool kCausal = kCausal_, kNarrow = kNarrow_, kSoftcap = kSoftcap_;
    static constexpr int kBlockM = T::kBlockM, kBlockN = T::kBlockN, kChunks = T::kChunks;
    static constexpr int kPitchChunks = T::kPitchChunks, kPitch = T::kPitch;
    static constexpr int kAtoms = T::kMAtoms, kWarpRows = T::kWarpRows;
    // An additive mask can hold huge finite values (HuggingFace fills with finfo(dtype).min,
    // -3.4e38 in bf16); times log2(e) they would overflow to -inf and a row masked only by them
    // would read as fully masked (zeros) where PyTorch averages V. So with an additive mask the
    // scores stay in natural-log units and log2(e) is applied after subtracting the row max.
    // kSoftcap: natural units too, so that the cap is one constant (scale / softcap) in a register
    // and softcap itself a kernel-parameter operand (the masked D=96 kernels spilled with two).
    static constexpr bool kNatural = kMask_ == kAddMask || kSoftcap_;
    static constexpr int kKSteps = kHeadDim_ / 16;  // k-steps of QK^T
    static constexpr int kNTiles = kBlockN / 8;     // n-tiles of S per m-atom
    static constexpr int kDTiles = kHeadDim_ / 8;   // n-tiles of O per m-atom
    static constexpr int kRowBytes = kPitch * 2;    // a shared Q / K / V row (ldmatrix steps)
    static constexpr float kLog2e = 1.4426950408889634f;
};

}  // namespace sm80
}  // namespace flashcore
