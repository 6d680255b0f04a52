// sm90/fwd_schedule.cuh - the Hopper forward's tile schedule (sm90/fwd_kernel.cuh), which the
// producer and the consumers follow alike: the key tiles a query block needs (block_key_tiles),
// the CTAs that share a tile under a KV split (kv_split_count) and this CTA's share of the block's
// key tiles (split_key_range). The tiles' order is snake_tile's, their decode decode_tile's
// (sm90/fwd_traits.cuh).
#pragma once

#include "launch_rules.h"  // fc_band_key_tiles
#include "flashcore.h"
#include "sm90/fwd_split.cuh"  // cluster_size, cluster_rank
#include "sm90/fwd_traits.cuh"
#include "sm90/varlen_blocks.cuh"  // SeqSpan

#include <stdint.h>

namespace flashcore {
namespace sm90 {

// Key tiles [first, end).
struct KeyRange {
    int first, end;
};

// Key tiles [first, end) a query block needs: with causal masking, none past its last row;
// with a band, those between its first row's lower edge and its last row's upper edge.
template <class K>
__device__ __forceinline__ KeyRange block_key_tiles(int m_block, int seqlen_q, int seqlen_k, const fc_params &p) {
    constexpr int kBlockM = K::kBlockM, kBlockN = K::kBlockN;
    if constexpr (K::kBand) {
        int64_t first, end;
        fc_band_key_tiles(m_block * kBlockM, min((m_block + 1) * kBlockM, seqlen_q), p.band_lo_, p.band_hi_,
                          seqlen_k, kBlockN, &first, &end);
        return KeyRange{static_cast<int>(first), static_cast<int>(end)};
    }
    int n = (seqlen_k + kBlockN - 1) / kBlockN;
    if (K::kCausal) n = min(n, (min((m_block + 1) * kBlockM, seqlen_q) - 1) / kBlockN + 1);
    return KeyRange{0, n};
}

// KV split (launch_fwd): this CTA's rank among the `splits` CTAs that share its tile takes
// key tiles [first, end) of its query block; without a split, all of them. A range may be
// empty (more splits than key tiles, e.g. the first causal blocks). The sharing CTAs are a
// cluster, or, in the grid split for decoding (p.num_splits_ > 1, launch_fwd_config), the
// grid's consecutive CTAs: in both, CTA x's rank is x mod splits.
// (Read from the special registers and parameters where used, so they hold no register
// through the loop.)
// kPair never splits, and says so at compile time: the split's divisions in key_range and
// snake_tile had stayed in its code after the grid wait, on the path to its first loads
// (H100, fp16, CUDA graph: B=1 H=8 512 x 512 5.46-5.53 -> 5.18-5.24 us per call, causal
// 5.26-5.34 -> 5.19-5.25, GQA 32:8 128 x 512 5.48-5.51 -> 5.16-5.19).
template <class K>
__device__ __forceinline__ int kv_split_count(const fc_params &p) {
    constexpr bool kGridSplitHere = kGridSplit<K::kHeadDim, K::kCausal, K::kShape>;
    return K::kShape == kPair ? 1 : (kGridSplitHere && p.num_splits_ > 1 ? p.num_splits_ : cluster_size());
}

// This CTA's share of a query block's key tiles (block_keys(m_block, seq), split kv_splits() ways).
// `seq`: the block's sequence (its lengths: the call's, or a packed sequence's, SeqSpan).
template <class K, class BlockKeys, class KvSplits>
__device__ __forceinline__ KeyRange split_key_range(int m_block, const SeqSpan &seq, BlockKeys &block_keys,
                                                    KvSplits &kv_splits, const fc_params &p) {
    constexpr bool kGridSplitHere = kGridSplit<K::kHeadDim, K::kCausal, K::kShape>;
    const KeyRange all = block_keys(m_block, seq);
    const int n = all.end - all.first, splits = kv_splits();
    if (splits == 1) return all;
    const int rank = kGridSplitHere && p.num_splits_ > 1 ? static_cast<int>(blockIdx.x) % splits : cluster_rank();
    return KeyRange{all.first + n * rank / splits, all.first + n * (rank + 1) / splits};
}

}  // namespace sm90
}  // namespace flashcore
