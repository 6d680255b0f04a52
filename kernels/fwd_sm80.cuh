// fwd_sm80.cuh - the sm_80-class fused attention forward (Ampere/Ada instructions; built for
// sm_89 and also for sm_90 so it can be run and timed on Hopper).
//
// What it computes: for one (batch, query head) and a block of kBlockM query rows,
//     O = softmax(scale * Q K^T [+ mask] [causal-masked]) V,   LSE = log(sum(exp(...)))
// in one pass over K and V (FlashAttention-2's online softmax), never writing S or P out.
// Head dims 32, 64, 80, 96, 128, 256. Variants: causal or not, and an optional attn_mask (bool: nonzero = attend; additive: same
// dtype as Q), any strides, broadcast dims at stride 0; each with or without a logit softcap
// (scores softcap tanh(scale q.k / softcap), tanh.approx, before the mask: kSoftcap).
//
// How:
//   * One CTA = 4 warps; warp w owns query rows [32w, 32w+32) of the 128-row block as two 16-row
//     m-atoms, so each K/V fragment read from shared memory feeds two mma, and every softmax
//     reduction stays inside a quad of lanes (no shared memory, no block barrier). D=256, masked
//     D=32 and every masked variant on Ada keep one m-atom per warp (64-row blocks; see
//     FwdTraits).
//   * Q is copied to shared memory once (cp.async) and its A fragments re-read per k-step.
//   * K and V tiles (kBlockN x D) are single-buffered on FlashAttention-2's schedule: V(n) loads
//     while S(n) = Q K(n) is multiplied, K(n+1) (and its mask tile) while softmax(n) and P V(n)
//     run; two barriers per tile. Rows past the end of the sequence are zero-filled by cp.async.
//   * S = Q K^T and O += P V with mma.sync m16n8k16 (fp16/bf16 in, fp32 accumulate). P goes
//     from the S accumulators straight into A fragments (the layouts line up), never to smem.
//   * Softmax in base 2 with the scale folded into log2(e); O is rescaled when the row max grows
//     (in the causal D=128 kernel only when it grew by more than 2^8: kLazyRescale).
//   * Causal (top-left aligned, as PyTorch): tiles entirely above the diagonal are never
//     loaded; only the tiles that cross the diagonal or the end of K are masked.
//   * attn_mask: the (kBlockM x kBlockN) mask tile of each K/V tile rides in the same cp.async
//     group as K, into a padded shared tile; each thread then reads the values under its own
//     accumulator elements. See "The attention mask" below for the layout rules.
//   * Causal: a warp whose rows all lie left of a tile's first key skips that tile's math.
//   * Shared memory rows are 16-byte chunks XOR-swizzled by (row % 8), so the 8 row addresses
//     of each ldmatrix phase fall in distinct bank groups (no conflicts). Head dims 64, 128, 256
//     need no padding; D=32 / 80 / 96 rows are padded to a multiple of 128 bytes.
//   * Epilogue: O is normalised, packed to 16 bits, staged through the (now idle) Q tile in
//     shared memory and written with 16-byte stores; rows past Sq are not written.
//
// Where each part lives (fwd_kernel below reads as the CTA's steps; issue 33):
//   * sm80/fwd_traits.cuh: the tile shapes per head dim and why (FwdTraits, kLazyRescale), and
//     one instantiation's constants (FwdShape).
//   * sm80/fwd_prologue.cuh: the CTA's query block (FwdBlock), where its data lies (FwdSlices,
//     KvSlices), the keys it needs (keys_needed), the lane's fragment coordinates (FragCoords).
//   * sm80/fwd_loads.cuh: the K/V tile copies with the mask's (load_k_tile, load_v_tile) and
//     the kLeanRegs kernels' slices in shared slots (store_slots).
//   * sm80/fwd_steps.cuh: one key tile (qk_gemm, scale_scores, apply_mask_tile, mask_edges,
//     online_softmax, pv_gemm) and the rows' start (start_rows).
//   * sm80/fwd_store.cuh: the epilogue (finish_rows, store_lse, store_o).
//   * sm80/tile.cuh, sm80/row_copy.cuh, sm80/mask_tile.cuh: swizzled tiles and their copies,
//     chunk-pair addresses, the mask tile and its copies.
//   * This file: fwd_kernel and the host side (launch_fwd_tiles, takes_narrow_tiles,
//     launch_fwd, launch_fwd_kind, FLASHCORE_DEFINE_SM80_FWD).
//
// Run it through the C API (c_src/flashcore.h, fc_sdpa_fwd); tests/ and bench/ force this
// family on Hopper with FLASHCORE_FAMILY=sm80. Instantiated once per (head dim, dtype) in
// kernels/fwd_sm80_hdim*_*.cu.
#pragma once

#include "common/sm80_ptx.cuh"
#include "config.h"
#include "flashcore.h"
#include "launch_rules.h"
#include "runtime.h"
#include "sm80/fwd_loads.cuh"
#include "sm80/fwd_prologue.cuh"
#include "sm80/fwd_steps.cuh"
#include "sm80/fwd_store.cuh"
#include "sm80/fwd_traits.cuh"
#include "sm80/tile.cuh"
#include "sm80/mask_tile.cuh"
#include "sm80/row_copy.cuh"

#include <cuda_runtime.h>
#include <math.h>
#include <stdlib.h>
#include <type_traits>

namespace flashcore {
namespace sm80 {

// kCausal: the causal variant without a mask. With a mask (kMask != kNoMask) the causal flag is
// read at run time instead (one instantiation per mask kind: PyTorch never sends a mask with
// is_causal, C callers may). kSoftcap: the logit softcap (fc_params.softcap): each scaled score
// s becomes softcap tanh(s / softcap) before the mask.
template <typename Elem, int kHeadDim, bool kCausal, int kMask, bool kNarrow = false, bool kSoftcap = false>
__global__ void __launch_bounds__(FwdTraits<kHeadDim, kMask != kNoMask, kNarrow>::kThreads,
                                FwdTraits<kHeadDim, kMask != kNoMask, kNarrow>::kMinBlocksPerSm)
fwd_kernel(const fc_params p) {
    using K = FwdShape<Elem, kHeadDim, kCausal, kMask, kNarrow, kSoftcap>;
    using T = typename K::T;
    constexpr int kBlockM = K::kBlockM, kBlockN = K::kBlockN, kChunks = K::kChunks;
    constexpr int kPitchChunks = K::kPitchChunks, kPitch = K::kPitch;
    constexpr int kAtoms = K::kAtoms, kWarpRows = K::kWarpRows;
    constexpr int kNTiles = K::kNTiles, kDTiles = K::kDTiles;
    const bool causal = kCausal || (kMask != kNoMask && p.causal != 0);

    extern __shared__ __align__(128) unsigned char smem_raw[];
    Elem *smem_q = reinterpret_cast<Elem *>(smem_raw);      // [kBlockM][kPitch]
    Elem *smem_k = smem_q + kBlockM * kPitch;                // [kBlockN][kPitch]
    Elem *smem_v = smem_k + kBlockN * kPitch;                // [kBlockN][kPitch]
    // After the tiles: kLeanRegs' K/V slice pointers (T::kSlotBytes), then the mask tile.
    unsigned char *smem_mask = smem_raw + T::kSmemBytes;

    const FwdBlock blk = fwd_block<K>(p);           // which query rows of which (batch, head)
    const FwdSlices<K> g = fwd_slices<K>(p, blk);  // where they and their K, V, mask lie
    const int n_end = keys_needed<K>(blk, causal);  // keys [0, n_end)

    // This thread's mma fragment coordinates (FragCoords: why they are computed here).
    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    const int warp_row0 = warp * kWarpRows;
    const int row_in_atom = lane / 4;
    const int col_in_tile = 2 * (lane % 4);
    const FragCoords at = {lane, warp_row0, row_in_atom, col_in_tile};

    // ldmatrix row addresses, chunk pair 0 (see chunk_pair_addr). Q (A operand) and V (B
    // operand, transposed): lanes 0-15 give rows 0-15 of the first chunk, 16-31 of the second.
    // K (B operand): lanes 0-7 / 16-23 give key rows 0-7 / 8-15 of the first chunk, 8-15 / 24-31
    // of the second. m-atoms, key groups and V rows step by 16 rows: immediate offsets. kLeanRegs
    // walks V's chunk pairs from these (ChunkPairWalk), kWalkQK Q's and K's too; the others hold
    // four per operand.
    const uint32_t q_base = smem_addr(smem_q + swizzled<kPitchChunks>(at.warp_row0 + (at.lane & 15), at.lane >> 4));
    const uint32_t k_base = smem_addr(smem_k + swizzled<kPitchChunks>((at.lane & 7) + (at.lane >> 4) * 8, (at.lane >> 3) & 1));
    const uint32_t v_base = smem_addr(smem_v + swizzled<kPitchChunks>(at.lane & 15, at.lane >> 4));
    ChunkPairWalk<T::kWalkQK> q_addr(q_base), k_addr(k_base);
    ChunkPairWalk<T::kLeanRegs> v_addr(v_base);

    // The K and V slices (and the mask's) for the key loop's loads: held in registers, or
    // (kLeanRegs) read back per tile from the shared slots after the tiles (KvSlices).
    KvSlices<K> *slots = reinterpret_cast<KvSlices<K> *>(smem_v + kBlockN * kPitch);
    store_slots<K>(slots, g.kv);
    // K tile n (and its mask tile) / V tile n into their single buffers. kFromSlots: the K and
    // mask slices from the shared slots (kLeanRegs, in the key loop).
    auto load_k = [&](auto from_slots, int n_start) {
        load_k_tile<K>(smem_k, smem_mask, decltype(from_slots)::value ? *slots : g.kv, g.k_stride, n_start, blk);
    };
    auto load_v = [&](int n_start) {
        load_v_tile<K>(smem_v, T::kLeanRegs ? slots->v : g.kv.v, g.v_stride, n_start, blk.seqlen_k);
    };

    load_tile<Elem, kBlockM, kChunks, T::kThreads, kPitchChunks>(smem_q, g.q, g.q_stride, blk.seqlen_q - blk.m_start);
    load_k(std::false_type(), 0);
    cp_async_commit();

    // This thread's part of O, and the running max (in the scores' units) and partial sum of its
    // rows row_in_atom, +8 of each m-atom.
    float o_acc[kAtoms][kDTiles][4], row_max[kAtoms][2], row_sum[kAtoms][2];
    start_rows<K>(o_acc, row_max, row_sum);
    // Scores are multiplied by this: into base-2 units, or natural units (kNatural). kSoftcap:
    // the score becomes softcap tanh(x score_mul), natural units.
    const float score_mul = kSoftcap ? p.scale / p.softcap : K::kNatural ? p.scale : p.scale * K::kLog2e;

    // Single-buffered K and V (FlashAttention-2's schedule): V(n) loads while S(n) = Q K(n) is
    // multiplied, K(n+1) while softmax(n) and P V(n) run. Two barriers per tile, each both a
    // "landed" and a "free" fence.
    for (int n_start = 0; n_start < n_end; n_start += kBlockN) {
        cp_async_wait<0>();
        __syncthreads();  // K(n) and mask(n) have landed; every warp is done reading V(n-1)
        load_v(n_start);
        cp_async_commit();

        // With causal masking, a warp whose last row is left of this tile's first key would
        // only add exact zeros: it skips the tile's math (the barriers stay CTA-wide).
        const bool active = !causal || n_start <= blk.m_start + at.warp_row0 + kWarpRows - 1;
        float s[kAtoms][kNTiles][4];
        if (active) {
            uint32_t qf[kAtoms][4], kf[4];
            qk_gemm<K>(s, qf, kf, q_addr, k_addr);
            // Scale (kSoftcap: and cap), then mask (after scaling: a negative scale must not turn
            // -inf into +inf). The attn_mask comes first, so the causal/ragged -inf has the last
            // word.
            scale_scores<K>(s, score_mul, p);
            apply_mask_tile<K>(s, smem_mask, at);
            int valid[kAtoms][2];
            mask_edges<K>(s, valid, causal, n_start, blk, at);
        }

        cp_async_wait<0>();
        __syncthreads();  // V(n) has landed; every warp is done reading K(n) and mask(n)
        if (n_start + kBlockN < n_end) {
            load_k(std::integral_constant<bool, T::kLeanRegs>(), n_start + kBlockN);
            cp_async_commit();
        }

        if (active) {
            float mx[kAtoms][2];
            online_softmax<K>(s, mx, row_max, row_sum, o_acc);
            uint32_t pf[kAtoms][4], vf[4];
            pv_gemm<K>(o_acc, s, pf, vf, v_addr);
        }
    }
    cp_async_wait<0>();  // with no key tiles at all (Sk = 0) the prologue's copies are still in flight

    // Epilogue: finish the row sums, write LSE, normalise O and write it (staged through the Q
    // tile, which only this warp's own rows of are reused).
    float inv_sum[kAtoms][2];
    finish_rows<K>(row_sum, inv_sum);
    store_lse<K>(p, row_max, row_sum, blk, at);
    store_o<K>(p, o_acc, inv_sum, smem_q, blk, at);
}

// Host side: configure shared memory once per (kernel, device), then launch on `stream`.
template <typename Elem, int kHeadDim, bool kCausal, int kMask, bool kNarrow = false, bool kSoftcap = false>
cudaError_t launch_fwd_tiles(const fc_params &p, cudaStream_t stream, int device) {
    using T = FwdTraits<kHeadDim, kMask != kNoMask, kNarrow>;
    constexpr int kSmemBytes = T::kSmemBytes + MaskTile<kMask, T::kBlockM, T::kBlockN>::kStageBytes;
    static_assert(kSmemBytes <= 99 * 1024, "must fit an sm_89 block (99 KB)");
    auto kernel = fwd_kernel<Elem, kHeadDim, kCausal, kMask, kNarrow, kSoftcap>;
    // The attribute is per device; remember which devices are done (bitmask, up to 64).
    static unsigned long long configured_devices = 0;
    cudaError_t err = cudaSuccess;
    const unsigned long long bit = 1ull << (device & 63);
    if (kSmemBytes > 48 * 1024 && !(__atomic_load_n(&configured_devices, __ATOMIC_ACQUIRE) & bit)) {
        err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
        if (err != cudaSuccess) return err;
        __atomic_fetch_or(&configured_devices, bit, __ATOMIC_ACQ_REL);
    }
    const int m_blocks = static_cast<int>((p.seqlen_q + T::kBlockM - 1) / T::kBlockM);
    const dim3 grid(static_cast<unsigned>(m_blocks), static_cast<unsigned>(p.heads_q), static_cast<unsigned>(p.batch));
    kernel<<<grid, T::kThreads, kSmemBytes, stream>>>(p);
    return cudaGetLastError();
}

// Whether a kernel with two tile shapes (FwdTraits' kNarrow) takes its narrow one:
// FLASHCORE_SM80_TILES=narrow / wide (config.h) picks one anywhere (the tests run Ada's shapes
// on Hopper so); else the narrow shape below compute capability 9 (Ada; see kNarrow and
// kTwoAtomMask for why). `major`: the device's, as the C layer found it for the call.
inline bool takes_narrow_tiles(int major) {
    const int tiles = fc_config_get()->sm80_tiles;
    return tiles == FC_SM80_TILES_BY_DEVICE ? major < 9 : tiles == FC_SM80_TILES_NARROW;
}

// A kernel whose FwdTraits differ with kNarrow has two tile shapes (unmasked D=64 / D=128: key
// tiles of 64 / 128 and 32 / 64; the masked D=64 / 80 / 96 / 128 on one or two m-atoms: 64 / 128
// query rows per CTA). The others have one.
template <typename Elem, int kHeadDim, bool kCausal, int kMask, bool kSoftcap = false>
cudaError_t launch_fwd(const fc_params &p, const fc_device_facts &dev, cudaStream_t stream) {
    const int device = dev.device, major = dev.major;
    constexpr bool kMasked = kMask != kNoMask;
    using Narrow = FwdTraits<kHeadDim, kMasked, true>;
    using Wide = FwdTraits<kHeadDim, kMasked, false>;
    constexpr bool kTwoShapes = Narrow::kBlockM != Wide::kBlockM || Narrow::kBlockN != Wide::kBlockN;
    // kSoftcap: the narrow shape on every card (the wide softcap kernels spilled: D=96 with an
    // additive mask on sm_90a, D=64 causal on sm_89), whatever FLASHCORE_SM80_TILES says.
    if constexpr (kTwoShapes && kSoftcap) {
        return launch_fwd_tiles<Elem, kHeadDim, kCausal, kMask, true, true>(p, stream, device);
    } else if constexpr (kTwoShapes) {
        static_assert(kMasked ? Narrow::kBlockM == 64 && Wide::kBlockM == 128
                              : (kHeadDim == 64 || kHeadDim == 128) &&
                                    Narrow::kBlockN == (kHeadDim == 64 ? 64 : 32) &&
                                    Wide::kBlockN == (kHeadDim == 64 ? 128 : 64),
                      "the tile sizes docs/TUNING.md gives for FLASHCORE_SM80_TILES");
        if (takes_narrow_tiles(major))
            return launch_fwd_tiles<Elem, kHeadDim, kCausal, kMask, true, kSoftcap>(p, stream, device);
        return launch_fwd_tiles<Elem, kHeadDim, kCausal, kMask, false, kSoftcap>(p, stream, device);
    } else {
        return launch_fwd_tiles<Elem, kHeadDim, kCausal, kMask, false, kSoftcap>(p, stream, device);
    }
}

// The variant for the call's mask kind and causal flag.
template <typename Elem, int kHeadDim, bool kSoftcap>
cudaError_t launch_fwd_kind(const fc_params &p, const fc_device_facts &dev, cudaStream_t stream) {
    switch (p.mask_kind) {
    case FC_MASK_BOOL: return launch_fwd<Elem, kHeadDim, false, kBoolMask, kSoftcap>(p, dev, stream);
    case FC_MASK_ADDITIVE: return launch_fwd<Elem, kHeadDim, false, kAddMask, kSoftcap>(p, dev, stream);
    default:
        return p.causal ? launch_fwd<Elem, kHeadDim, true, kNoMask, kSoftcap>(p, dev, stream)
                        : launch_fwd<Elem, kHeadDim, false, kNoMask, kSoftcap>(p, dev, stream);
    }
}

}  // namespace sm80
}  // namespace flashcore

// Defines the C entry point of one (head dim, dtype) instantiation, e.g.
//   cudaError_t fc_sm80_fwd_hdim64_fp16(const fc_params *p, const fc_device_facts *dev, cudaStream_t stream);
#define FLASHCORE_DEFINE_SM80_FWD(HDIM, DTYPE_NAME, ELEM)                                       \
    extern "C" cudaError_t fc_sm80_fwd_hdim##HDIM##_##DTYPE_NAME(                              \
        const fc_params *p, const fc_device_facts *dev, cudaStream_t stream) {                 \
        using namespace flashcore::sm80;                                                      \
        return p->softcap != 0.0f ? launch_fwd_kind<ELEM, HDIM, true>(*p, *dev, stream)       \
                                  : launch_fwd_kind<ELEM, HDIM, false>(*p, *dev, stream);     \
    }
