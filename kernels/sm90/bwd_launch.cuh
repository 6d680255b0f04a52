// sm90/bwd_launch.cuh - host side of the Hopper backward: for validated params (c_src/bwd.c),
// three launches on one stream, no allocation, no sync:
//   1. row_terms_kernel: delta and LSE2 per padded query row, and the fp32 dq accumulator
//      zeroed (sm90/bwd_rows.cuh),
//   2. bwd_kernel: dK, dV and the dq accumulator over tiles of (key block, KV head, batch), at most
//      one CTA per SM taking tiles until none are left, every head's first key blocks first
//      (causal: they see the most query tiles) (sm90/bwd_kernel.cuh); a general band (a sliding
//      window, or causal aligned bottom-right) in its kBand variant,
//   3. dq_convert_kernel: dq = scale * accumulator, in dq's dtype and strides.
// The second and third launch programmatically (fc_sm90_bwd_use_pdl): the main kernel's launch
// and prologue overlap the row-terms kernel's tail, and the conversion of each (batch, KV head)
// pair's rows starts on the SMs the main kernel leaves as soon as the pair's key blocks are all
// counted, while the main kernel's last tiles run.
// A packed call (fc_params.cu_seq_q) first lists every sequence's key blocks (varlen_blocks_kernel
// in its kKeyBlocks form, sm90/varlen_blocks.cuh), then runs the three over the packed rows
// (launch_bwd_varlen).
// Instantiated per (head dim, dtype) in kernels/bwd_sm90_hdim*_*.cu.
#pragma once

#include "common/launch.h"
#include "launch_rules.h"  // fc_mask_tiles_fit_
#include "runtime.h"
#include "sm90/bwd_d256.cuh"
#include "sm90/bwd_kernel.cuh"
#include "sm90/bwd_rows.cuh"
#include "sm90/tensor_map.h"

#include <cuda_runtime.h>
#include <stdint.h>

#include <algorithm>
#include <type_traits>

namespace flashcore {
namespace sm90_bwd {

// The main kernel of a variant: D=256's own, else bwd_kernel.
template <typename Elem, int kHeadDim, bool kCausal, int kMask, bool kBand, bool kSoftcap>
constexpr auto main_kernel() {
    if constexpr (kHeadDim == 256) return bwd_kernel_d256<Elem, kCausal, kMask, kBand, kSoftcap>;
    else return bwd_kernel<Elem, kHeadDim, kCausal, kMask, kBand, kSoftcap>;
}

template <typename Elem, int kHeadDim, bool kCausal, int kMask, bool kBand = false, bool kSoftcap = false>
cudaError_t launch_bwd(const fc_bwd_params &p, const fc_device_facts &dev, cudaStream_t stream) {
    using T = BwdTraits<kHeadDim, kMask == kMaskBoolTiles>;
    const fc_params &f = p.fwd;
    cudaError_t err = cudaSuccess;

    auto kernel = main_kernel<Elem, kHeadDim, kCausal, kMask, kBand, kSoftcap>();
    static unsigned long long configured = 0;
    if ((err = allow_smem(kernel, T::kSmemBytes, &configured, dev.device)) != cudaSuccess) return err;

    BwdMaps maps;
    const CUtensorMapDataType dtype =
        std::is_same<Elem, __half>::value ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    if ((err = sm90::make_tensor_map(&maps.q, &maps.q_order, f.q, dtype, f.seqlen_q, f.heads_q, f.batch, kHeadDim,
                                     f.q_stride_s, f.q_stride_h, f.q_stride_b, T::kBlockM)) != cudaSuccess ||
        (err = sm90::make_tensor_map(&maps.dout, &maps.dout_order, p.dout, dtype, f.seqlen_q, f.heads_q, f.batch,
                                     kHeadDim, p.do_stride_s, p.do_stride_h, p.do_stride_b, T::kBlockM)) != cudaSuccess ||
        (err = sm90::make_tensor_map(&maps.k, &maps.k_order, f.k, dtype, f.seqlen_k, f.heads_kv, f.batch, kHeadDim,
                                     f.k_stride_s, f.k_stride_h, f.k_stride_b, T::kBlockN)) != cudaSuccess ||
        (err = sm90::make_tensor_map(&maps.v, &maps.v_order, f.v, dtype, f.seqlen_k, f.heads_kv, f.batch, kHeadDim,
                                     f.v_stride_s, f.v_stride_h, f.v_stride_b, T::kBlockN)) != cudaSuccess)
        return err;
    if (kMask == kMaskBoolTiles &&
        (err = sm90::make_map(&maps.mask, &maps.mask_order, f.mask, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, f.seqlen_k,
                              f.seqlen_q, f.mask_stride_h != 0 ? f.heads_q : 1, f.mask_stride_b != 0 ? f.batch : 1,
                              f.mask_stride_q, f.mask_stride_h, f.mask_stride_b, T::kMaskBoxKeys, T::kBlockM,
                              T::kMaskSwizzle)) != cudaSuccess)
        return err;

    // Causal CTA order (bwd_kernel) over at least 32 key blocks: chunks of pairs whose Q and dO
    // tiles fit in 16 MB of L2. Measured (H100, fp16, C-API probe, against one pair per chunk):
    // D=128 causal 4k 459 -> 476 TFLOP/s, 16k 516 -> 529; at 1k (8 key blocks) 271 -> 258, so not there.
    // (A band takes the causal rule as it is: not measured for windows.)
    const int64_t pairs = f.heads_kv * f.batch, qdo_bytes = f.seqlen_q * kHeadDim * 2 * 2 * (f.heads_q / f.heads_kv);
    maps.chunk_pairs = 1;
    if (kCausal && f.seqlen_k >= 32 * T::kBlockN)
        maps.chunk_pairs = static_cast<int32_t>(std::max<int64_t>(1, std::min<int64_t>(pairs, (16 << 20) / qdo_bytes)));
    maps.softcap_log2 = f.softcap * 1.4426950408889634f;
    maps.softcap_in = kSoftcap ? f.scale / f.softcap : 0.f;
    const Workspace ws = workspace_of(p);
    maps.key_blocks_done = ws.key_blocks_done;
    const unsigned hq = static_cast<unsigned>(f.heads_q), batch = static_cast<unsigned>(f.batch);
    constexpr int kRowsPerCta = RowLane<kHeadDim>::kRowsPerCta;  // of the row-terms kernel
    const dim3 rows_grid(static_cast<unsigned>((ws.padded_seqlen + kRowsPerCta - 1) / kRowsPerCta), hq, batch);
    row_terms_kernel<Elem, kHeadDim><<<rows_grid, 128, 0, stream>>>(p);
    if ((err = cudaGetLastError()) != cudaSuccess) return err;

    const int64_t tiles = static_cast<int64_t>(key_blocks<kHeadDim>(f)) * f.heads_kv * f.batch;
    if (tiles > INT32_MAX) return cudaErrorInvalidConfiguration;  // c_src/bwd.c sends such calls elsewhere
    const bool pdl = fc_sm90_bwd_use_pdl() != 0;
    cudaLaunchAttribute attrs[2];
    const cudaLaunchConfig_t main_cfg =
        launch_config(fc_sm90_bwd_grid(tiles, dev.sms), 0, pdl, T::kThreads, T::kSmemBytes, stream, attrs);
    if ((err = cudaLaunchKernelEx(&main_cfg, kernel, maps, p)) != cudaSuccess) return err;

    constexpr int kConvertRows = ConvertTile<kHeadDim>::kRows;
    const dim3 convert_grid(static_cast<unsigned>((f.seqlen_q + kConvertRows - 1) / kConvertRows), hq, batch);
    const cudaLaunchConfig_t convert_cfg = launch_config(convert_grid, 0, pdl, kConvertThreads, 0, stream, attrs);
    return cudaLaunchKernelEx(&convert_cfg, dq_convert_kernel<Elem, kHeadDim>, p);
}

// A packed call: the key-block list, then the three kernels in their kPacked / kVarlen forms. The
// tensor maps hold all rows as one batch item. The main kernel's grid: one CTA per SM at most (the host does not know the
// list's length; CTAs past it stop at once).
template <typename Elem, int kHeadDim, bool kCausal>
cudaError_t launch_bwd_varlen(const fc_bwd_params &p, const fc_device_facts &dev, cudaStream_t stream) {
    using T = BwdTraits<kHeadDim>;
    const fc_params &f = p.fwd;
    cudaError_t err = cudaSuccess;
    auto kernel = [] {
        if constexpr (kHeadDim == 256) return bwd_kernel_d256<Elem, kCausal, kMaskNone, false, false, true>;
        else return bwd_kernel<Elem, kHeadDim, kCausal, kMaskNone, false, false, true>;
    }();
    static unsigned long long configured = 0;
    if ((err = allow_smem(kernel, T::kSmemBytes, &configured, dev.device)) != cudaSuccess) return err;

    BwdMaps maps = {};
    const CUtensorMapDataType dtype =
        std::is_same<Elem, __half>::value ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    const Workspace ws = workspace_of<true>(p);
    if ((err = sm90::make_tensor_map(&maps.q, &maps.q_order, f.q, dtype, f.total_q, f.heads_q, 1, kHeadDim, f.q_stride_s,
                                     f.q_stride_h, 0, T::kBlockM)) != cudaSuccess ||
        (err = sm90::make_tensor_map(&maps.dout, &maps.dout_order, p.dout, dtype, f.total_q, f.heads_q, 1, kHeadDim,
                                     p.do_stride_s, p.do_stride_h, 0, T::kBlockM)) != cudaSuccess ||
        (err = sm90::make_tensor_map(&maps.k, &maps.k_order, f.k, dtype, f.total_k, f.heads_kv, 1, kHeadDim, f.k_stride_s,
                                     f.k_stride_h, 0, T::kBlockN)) != cudaSuccess ||
        (err = sm90::make_tensor_map(&maps.v, &maps.v_order, f.v, dtype, f.total_k, f.heads_kv, 1, kHeadDim, f.v_stride_s,
                                     f.v_stride_h, 0, T::kBlockN)) != cudaSuccess)
        return err;
    maps.chunk_pairs = 1;

    fc_params listed = f;  // the list kernel takes its workspace from fc_params
    listed.workspace = p.workspace;
    sm90::varlen_blocks_kernel<Elem, true><<<1, sm90::kVarlenListThreads, 0, stream>>>(listed);
    if ((err = cudaGetLastError()) != cudaSuccess) return err;
    constexpr int kRowsPerCta = RowLane<kHeadDim>::kRowsPerCta;
    const unsigned hq = static_cast<unsigned>(f.heads_q);
    const dim3 rows_grid(static_cast<unsigned>((ws.padded_seqlen + kRowsPerCta - 1) / kRowsPerCta), hq, 1);
    row_terms_kernel<Elem, kHeadDim, true><<<rows_grid, 128, 0, stream>>>(p);
    if ((err = cudaGetLastError()) != cudaSuccess) return err;

    // (D=256: each listed 128-key block is two 64-key tiles, varlen_tile_at.)
    const int64_t most_tiles = fc_varlen_block_capacity(f.total_k, f.batch) * f.heads_kv * (FC_VARLEN_BLOCK_ROWS / T::kBlockN);
    const dim3 grid(static_cast<unsigned>(most_tiles < dev.sms ? most_tiles : dev.sms));
    kernel<<<grid, T::kThreads, T::kSmemBytes, stream>>>(maps, p);
    if ((err = cudaGetLastError()) != cudaSuccess) return err;

    constexpr int kConvertRows = ConvertTile<kHeadDim>::kRows;
    const dim3 convert_grid(static_cast<unsigned>((f.total_q + kConvertRows - 1) / kConvertRows), hq, 1);
    dq_convert_kernel<Elem, kHeadDim, true><<<convert_grid, kConvertThreads, 0, stream>>>(p);
    return cudaGetLastError();
}

// Whether a bool mask's layout lets TMA bring its tiles (kMaskBoolTiles): fc_mask_tiles_fit_
// (c_src/launch_rules.c), the rule the Hopper forward's masked shape shares.
inline bool mask_tiles_fit(const fc_params &f) { return fc_mask_tiles_fit_(&f) != 0; }

// A variant with a softcap where the call has one, else without.
template <typename Elem, int kHeadDim, bool kCausal, int kMask, bool kBand = false>
cudaError_t launch_bwd_capped_or_not(const fc_bwd_params &p, const fc_device_facts &dev, cudaStream_t stream) {
    return p.fwd.softcap != 0.f ? launch_bwd<Elem, kHeadDim, kCausal, kMask, kBand, true>(p, dev, stream)
                                : launch_bwd<Elem, kHeadDim, kCausal, kMask, kBand, false>(p, dev, stream);
}

// The variant for a call (each with or without a softcap): causal, a general band (p.fwd.band_, set by
// fc_resolve_band_ in c_src/bwd.c; it comes with causal set), or one of the mask kinds (c_src/bwd.c sends masked
// banded calls elsewhere, and masked causal ones but for a bool mask in tiles: flashcore's op asks for those
// where the mask lies inside the causal triangle).
template <typename Elem, int kHeadDim>
cudaError_t launch_bwd_variant_of(const fc_bwd_params &p, const fc_device_facts &dev, cudaStream_t stream) {
    if (p.fwd.cu_seq_q != nullptr)  // (c_src/bwd.c: no mask, band or softcap with it)
        return p.fwd.causal ? launch_bwd_varlen<Elem, kHeadDim, true>(p, dev, stream)
                            : launch_bwd_varlen<Elem, kHeadDim, false>(p, dev, stream);
    if (p.fwd.band_ == FC_BAND_GENERAL_)
        return launch_bwd_capped_or_not<Elem, kHeadDim, true, kMaskNone, true>(p, dev, stream);
    if (p.fwd.softcap != 0.f)  // (no mask: c_src/bwd.c)
        return p.fwd.causal ? launch_bwd<Elem, kHeadDim, true, kMaskNone, false, true>(p, dev, stream)
                            : launch_bwd<Elem, kHeadDim, false, kMaskNone, false, true>(p, dev, stream);
    switch (p.fwd.mask_kind) {
    case FC_MASK_BOOL:
        // (With causal: a mask in tiles, c_src/dispatch.c's fc_sm90_bool_mask_tiles_; the causal tiles' steps only.)
        if (p.fwd.causal) return launch_bwd<Elem, kHeadDim, true, kMaskBoolTiles>(p, dev, stream);
        return mask_tiles_fit(p.fwd) ? launch_bwd<Elem, kHeadDim, false, kMaskBoolTiles>(p, dev, stream)
                                     : launch_bwd<Elem, kHeadDim, false, kMaskBool>(p, dev, stream);
    case FC_MASK_ADDITIVE: return launch_bwd<Elem, kHeadDim, false, kMaskAdditive>(p, dev, stream);
    default:
        return p.fwd.causal ? launch_bwd<Elem, kHeadDim, true, kMaskNone>(p, dev, stream)
                            : launch_bwd<Elem, kHeadDim, false, kMaskNone>(p, dev, stream);
    }
}

// D=256's variants: causal, a general band or none, each with or without a softcap; a bool mask
// in TMA tiles where its layout allows, else read element by element, each with or without a
// softcap, and in tiles with causal (no softcap); an additive mask without one (c_src/bwd.c: that
// variant with a softcap spilled).
template <typename Elem>
cudaError_t launch_bwd_d256(const fc_bwd_params &p, const fc_device_facts &dev, cudaStream_t stream) {
    if (p.fwd.band_ == FC_BAND_GENERAL_)  // (no mask with it: c_src/bwd.c)
        return launch_bwd_capped_or_not<Elem, 256, true, kMaskNone, true>(p, dev, stream);
    switch (p.fwd.mask_kind) {
    case FC_MASK_BOOL:
        // (With causal: a mask in tiles without a softcap, c_src/dispatch.c's fc_sm90_bool_mask_tiles_.)
        if (p.fwd.causal) return launch_bwd<Elem, 256, true, kMaskBoolTiles>(p, dev, stream);
        return mask_tiles_fit(p.fwd) ? launch_bwd_capped_or_not<Elem, 256, false, kMaskBoolTiles>(p, dev, stream)
                                     : launch_bwd_capped_or_not<Elem, 256, false, kMaskBool>(p, dev, stream);
    case FC_MASK_ADDITIVE: return launch_bwd<Elem, 256, false, kMaskAdditive>(p, dev, stream);
    default:
        return p.fwd.causal ? launch_bwd_capped_or_not<Elem, 256, true, kMaskNone>(p, dev, stream)
                            : launch_bwd_capped_or_not<Elem, 256, false, kMaskNone>(p, dev, stream);
    }
}

// The D=256 kernel's calls, or the variant for a call at D=64/128.
template <typename Elem, int kHeadDim>
cudaError_t launch_bwd_variant(const fc_bwd_params &p, const fc_device_facts &dev, cudaStream_t stream) {
    if constexpr (kHeadDim == 256) {  // masks not with causal or a band (c_src/bwd.c)
        if (p.fwd.cu_seq_q != nullptr)  // (c_src/bwd.c: no mask, band or softcap with it)
            return p.fwd.causal ? launch_bwd_varlen<Elem, 256, true>(p, dev, stream)
                                : launch_bwd_varlen<Elem, 256, false>(p, dev, stream);
        return launch_bwd_d256<Elem>(p, dev, stream);
    } else {
        return launch_bwd_variant_of<Elem, kHeadDim>(p, dev, stream);
    }
}

}  // namespace sm90_bwd
}  // namespace flashcore

// Defines the C entry point of one (head dim, dtype) instantiation, e.g.
//   cudaError_t fc_sm90_bwd_hdim64_fp16(const fc_bwd_params *p, const fc_device_facts *dev, cudaStream_t stream);
#define FLASHCORE_DEFINE_SM90_BWD(HDIM, DTYPE_NAME, ELEM)                                  \
    extern "C" cudaError_t fc_sm90_bwd_hdim##HDIM##_##DTYPE_NAME(                         \
        const fc_bwd_params *p, const fc_device_facts *dev, cudaStream_t stream) {        \
        return flashcore::sm90_bwd::launch_bwd_variant<ELEM, HDIM>(*p, *dev, stream);     \
    }
