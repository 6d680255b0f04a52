// sm90/bwd_traits.cuh - the types of the Hopper backward (sm90/bwd_kernel.cuh): its shapes and
// shared-memory layout (BwdTraits), its tensor maps, its unit of work (Tile, in the order
// tile_at gives), the mbarriers its threads meet on (BwdBarriers) and the attention mask's kinds
// (kMask*; consumers read the mask through common/mask_slice.cuh's MaskSliceOf).
#pragma once

#include "common/mask_slice.cuh"
#include "common/sm80_ptx.cuh"  // pack2, smem_addr, fast_exp2
#include "common/wgmma_generated.cuh"
#include "flashcore.h"
#include "launch_rules.h"
#include "sm90/bwd_rows.cuh"
#include "sm90/ptx.cuh"
#include "sm90/varlen_blocks.cuh"  // VarlenList: a packed call's key blocks

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>

#include <type_traits>

namespace flashcore {
namespace sm90_bwd {

using sm90::fence_registers;
using sm90::MapOrder;
using sm90::set_coords;
using sm90::smem_desc;
using sm90::tma_load;
using sm90::wait_barrier;
using sm90::Wgmma;
using sm90::wgmma_commit;
using sm90::wgmma_fence;
using sm90::WgmmaA;
using sm90::wgmma_wait;
namespace ptx = cuda::ptx;

// D=256 (sm90/bwd_d256.cuh) keeps its own shape: 64-key blocks, each stage's Q and dO side by side
// (the step's dQ is staged over them), one dS^T buffer, and the P^T exchange between its two
// warpgroups where the others stage dQ.
template <int kDim, bool kMaskTiles = false>
struct BwdTraits {
    static constexpr int kHeadDim = kDim;
    static constexpr bool kD256 = kDim == 256;
    static constexpr int kBlockN = FC_SM90_BWD_KEY_BLOCK_OF(kDim);  // keys per CTA
    static constexpr int kBlockM = FC_SM90_BWD_ROW_BLOCK;  // query rows per step
    static constexpr int kStages = 2;
    static constexpr int kConsumers = 2;  // warpgroups of 64 keys
    static constexpr int kConsumerThreads = 128 * kConsumers;
    static constexpr int kThreads = kConsumerThreads + 128;  // and the producer warpgroup
    static constexpr int kPanels = kHeadDim / 64;  // 64-column (128-byte) panels per row
    static constexpr int kKVPanelBytes = kBlockN * 128;
    static constexpr int kKVBytes = kPanels * kKVPanelBytes;
    static constexpr int kQPanelBytes = kBlockM * 128;
    static constexpr int kQBytes = kPanels * kQPanelBytes;
    static constexpr int kRowTermsBytes = sm90_bwd::kRowTermsBytes;  // delta, then LSE2, of one step
    static_assert(kRowTermsBytes == 2 * kBlockM * 4, "a step's row terms are its rows' delta and LSE2");
    // A stage's slot: room for a packed call's span (sm90/bwd_rows.cuh, kPackedRowSpan), in 128-byte
    // units (the mask tiles after the slots are TMA destinations).
    static constexpr int kRowTermsSlotBytes = (kPackedRowSpan * 8 + 127) / 128 * 128;
    // dQ = dS K per step: the warpgroups split its columns (each reads all of the block's keys of dS).
    static constexpr int kDqCols = kHeadDim / 2;
    // dS^T of the CTA's keys x 64 queries: one 128-byte panel of kBlockN rows. Two buffers: a
    // step writes one while the previous step's dQ GEMM may still read the other (D=256: one,
    // its steps are ordered by their barriers).
    static constexpr int kDsBytes = kBlockN * kBlockM * 2;
    static constexpr int kDsBufs = kD256 ? 1 : 2;
    // Shared memory: K, V, Q ring, dO ring (D=256: one ring of (Q, dO) stages), dS^T buffers, the
    // P^T exchange (D=256), dQ staging (not D=256), row-terms ring (1024-aligned tiles: the
    // swizzle atom). A stage's Q is at kOffQ + stage * kStageStride, its dO at kOffDo + the same.
    static constexpr int kOffK = 0;
    static constexpr int kOffV = kOffK + kKVBytes;
    static constexpr int kOffQ = kOffV + kKVBytes;
    static constexpr int kStageStride = kD256 ? 2 * kQBytes : kQBytes;
    static constexpr int kOffDo = kD256 ? kOffQ + kQBytes : kOffQ + kStages * kQBytes;
    static constexpr int kOffDs = kOffQ + 2 * kStages * kQBytes;
    // D=256: P^T of the step (fp32, 64 keys x 64 queries) from the warpgroup that computes it to
    // the one that computes dS^T.
    static constexpr int kOffPx = kOffDs + kDsBufs * kDsBytes;
    static constexpr int kPxBytes = kD256 ? kBlockN * kBlockM * 4 : 0;
    // dQ staging: one 64 x D fp32 tile, each warpgroup its columns. Rows of kDqStagePitch bytes,
    // 8 words past a multiple of 32, so a warp's float2 stores of 8 rows hit every bank once per
    // half; the accumulator's rows in global memory have the same pitch, so a staged tile is one
    // bulk reduction.
    static constexpr int kDqStagePitch = kDqPitch<kHeadDim> * 4;
    static constexpr int kDqStageBytes = kD256 ? 0 : kBlockM * kDqStagePitch;
    static constexpr int kOffDq = kOffPx + kPxBytes;
    static constexpr int kOffRowTerms = kOffDq + kDqStageBytes;
    // kMaskTiles (bool masks TMA can read): each step's mask tile, 64 query rows of kMaskBoxKeys
    // bytes. D=64/128: the block's 128 keys and 16 more, so that rows 2 apart (a warp's reads)
    // start 288 bytes apart and fall in different banks. D=256: the block's 64 keys under TMA's
    // 64-byte swizzle, as the forward's D=256 tiles (no room for padding beside its stages), the
    // tiles at a multiple of 512 bytes (the swizzle's period); mask_byte has the layout.
    static constexpr int kMaskBoxKeys = kD256 ? kBlockN : kBlockN + 16;
    static constexpr int kMaskTileBytes = kMaskTiles ? kBlockM * kMaskBoxKeys : 0;
    static constexpr int kMaskTileAlign = kD256 && kMaskTiles ? 512 : 1;
    static constexpr int kOffMask = (kOffRowTerms + kStages * kRowTermsSlotBytes + kMaskTileAlign - 1) /
                                    kMaskTileAlign * kMaskTileAlign;
    static constexpr CUtensorMapSwizzle kMaskSwizzle = kD256 ? CU_TENSOR_MAP_SWIZZLE_64B : CU_TENSOR_MAP_SWIZZLE_NONE;
    static constexpr int kSmemBytes = kOffMask + kStages * kMaskTileBytes + 1024 /* alignment */;
    static constexpr int kProducerRegs = 24, kConsumerRegs = 240;
    static_assert(kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256, "head dims 64, 128 and 256");
    static_assert(kD256 || kBlockN == FC_VARLEN_BLOCK_ROWS, "a packed call's listed key blocks are the CTA's");
    static_assert(kSmemBytes <= 227 * 1024, "must fit Hopper's 227 KB per block");
    // kMaskTiles: the byte of (query row, key) in a step's mask tile (D=256: 16-byte chunk c of
    // row r at c ^ ((r / 2) % 4)).
    __device__ static constexpr int mask_byte(int row, int key) {
        return kD256 ? row * kMaskBoxKeys + ((((key >> 4) ^ (row >> 1)) & 3) << 4) + (key & 15) : row * kMaskBoxKeys + key;
    }
    static_assert(128 * (kProducerRegs + kConsumers * kConsumerRegs) <= 65536, "register budgets");
};

struct BwdMaps {
    CUtensorMap q, dout, k, v;
    CUtensorMap mask;  // kMaskBoolTiles: the bool mask over (keys, queries, heads, batch)
    MapOrder q_order, dout_order, k_order, v_order, mask_order;
    int32_t chunk_pairs;  // the tile order (see Tile): (batch, KV head) pairs per chunk
    // kSoftcap: softcap * log2(e) and scale / softcap, read as constant operands (in registers
    // they pushed the D=128 consumers past their budget).
    float softcap_log2, softcap_in;
    // Not packed: Workspace::key_blocks_done, which the dQ writer counts (from the parameters:
    // the producer's registers have no room for it).
    int32_t *key_blocks_done;
};

// The steps of one tile: (query head in the group, query tile) pairs, head-major.
struct Steps {
    int m_first, m_count, count;
    __device__ int head_q(int step, int head_kv, int group) const { return head_kv * group + step / m_count; }
    __device__ int m_start(int step, int block_m) const { return (m_first + step % m_count) * block_m; }
};

// One tile of work: a key block of one (batch, KV head) pair and the query steps that see it.
// Tile indices run in the order the CTAs should take them: chunks of maps.chunk_pairs (batch, KV
// head) pairs, each chunk's tiles in order of key block, then pair. With one pair per chunk
// (non-causal) a pair's key blocks run side by side and share its Q and dO tiles in L2; causal
// chunks hold a few pairs, so that their first key blocks (the most query tiles) start first
// and the short ones fill the tail.
struct Tile {
    int n_start, head_kv, batch, group;
    Steps steps;
    int row0;  // kVarlen: the sequence's first query row (the producers' loads and dQ rows); else 0
};
struct BwdBarriers {
    uint64_t kv_full;        // K and V of the tile have landed
    uint64_t kv_empty;       // every consumer thread is done with the tile's K and V
    uint64_t step_full[2];   // Q, dO, LSE2 and delta of a step have landed
    uint64_t step_empty[2];  // every consumer thread is done with the stage
    uint64_t dq_full;        // every consumer warp has staged its share of a step's dQ
    uint64_t dq_empty;       // the dQ writer's reductions have read the staging
    uint64_t tile_full[2];   // the producer has published a tile index in the slot
    uint64_t tile_empty[2];  // every consumer thread, the step loaders and the dQ writer have read it
    uint64_t claim;          // the Q/dO loader has issued a tile's last step
    Tile tile[2];            // the CTA's next tiles, decoded once; batch < 0 = no more
};

// kVarlen (a packed call, fc_params.cu_seq_q): tile `index` is entry `index` of the key-block list
// (sm90/varlen_blocks.cuh: sorted by work, longest first, repeated for every KV head, head-major),
// so that the tiles in flight at once are one head's blocks and share its sequences' Q and dO
// rows and dq accumulator in L2 (in entry-major order, 132 tiles of as many (sequence, head) pairs
// missed it: the all-1024 mix's kernel ran at half the dense kernel's speed), and the tile
// scheduler decodes a tile with no division (it has 24 registers).
// Tile::batch holds the entry (listed_block gives its sequence's rows), Tile::row0 the sequence's
// first query row; n_start and the steps' rows count from the sequence's first key and query;
// causal is top-left in each sequence.
__device__ __forceinline__ const sm90::VarlenBlock &listed_block(const void *workspace, int entry) {
    return static_cast<const sm90::VarlenList *>(workspace)->blocks()[entry];
}
// Returns false past the list's last tile (every listed block once per KV head). D=256's 64-key
// blocks (kBlockN < FC_VARLEN_BLOCK_ROWS): tile `index` is half index % 2 of listed block index / 2,
// and a half past the sequence's last key has no steps.
template <int kBlockM, int kBlockN, bool kCausal>
__device__ bool varlen_tile_at(int index, const void *workspace, const fc_params &f, Tile &t, int *key_row0) {
    constexpr int kParts = FC_VARLEN_BLOCK_ROWS / kBlockN;  // tiles per listed block
    static_assert(kParts * kBlockN == FC_VARLEN_BLOCK_ROWS, "a listed block is whole tiles");
    const int entry = index / kParts;
    if (entry >= static_cast<const sm90::VarlenList *>(workspace)->count) return false;
    const sm90::VarlenBlock &e = listed_block(workspace, entry);  // (the fields it needs, one by one)
    t.n_start = e.m_block * FC_VARLEN_BLOCK_ROWS + index % kParts * kBlockN;
    t.head_kv = e.head_kv;
    t.batch = entry;
    t.group = static_cast<int>(f.heads_q / f.heads_kv);
    t.steps.m_first = kCausal ? t.n_start / kBlockM : 0;
    t.steps.m_count = max(0, (e.sq + kBlockM - 1) / kBlockM - t.steps.m_first);
    if constexpr (kParts > 1)
        if (t.n_start >= e.sk) t.steps.m_count = 0;
    t.steps.count = t.group * t.steps.m_count;
    t.row0 = e.q0;
    *key_row0 = e.k0;
    return true;
}

// kBand: a general band (fc_band_bounds in c_src/flashcore.h): row i sees keys i + f.band_lo_ ..
// i + f.band_hi_, so key j is seen by rows j - band_hi_ .. j - band_lo_: the query tiles of a
// block are those of the transposed band (lo, hi) -> (-hi, -lo) over its keys, and a block no
// row sees has none (its dK and dV are zeros).
template <int kBlockM, int kBlockN, bool kCausal, bool kBand = false>
__device__ Tile tile_at(int index, const BwdMaps &maps, const fc_params &f) {
    const int pairs = static_cast<int>(f.heads_kv * f.batch);
    const int n_blocks = (static_cast<int>(f.seqlen_k) + kBlockN - 1) / kBlockN;
    const int chunk = index / (maps.chunk_pairs * n_blocks);
    const int in_chunk = index % (maps.chunk_pairs * n_blocks);
    const int chunk_size = min(maps.chunk_pairs, pairs - chunk * maps.chunk_pairs);
    const int pair = chunk * maps.chunk_pairs + in_chunk % chunk_size;
    Tile t;
    t.n_start = in_chunk / chunk_size * kBlockN;
    t.head_kv = pair % static_cast<int>(f.heads_kv);
    t.batch = pair / static_cast<int>(f.heads_kv);
    t.group = static_cast<int>(f.heads_q / f.heads_kv);
    // Query tiles that see any key of this block: causal, none before row n_start.
    if constexpr (kBand) {
        // Rows key_first - hi .. key_last - lo, clipped to [0, Sq). In 32 bits (fc_band_key_tiles'
        // 64-bit math spilled in the scheduler thread's 24 registers): with lo, hi in
        // [-(Sq - 1), Sk - 1] a difference is formed only where it lies in [0, Sq - 1], and
        // key - (Sq - 1) cannot overflow.
        const int seqlen_q = static_cast<int>(f.seqlen_q), last_q = seqlen_q - 1;
        const int key_first = t.n_start, key_last = min(t.n_start + kBlockN, static_cast<int>(f.seqlen_k)) - 1;
        const int lo = f.band_lo_, hi = f.band_hi_;
        const int row_first = hi >= key_first ? 0 : key_first - last_q > hi ? seqlen_q : key_first - hi;
        const int row_last = lo <= key_last - last_q ? last_q : lo > key_last ? -1 : key_last - lo;
        t.steps.m_first = row_first / kBlockM;
        t.steps.m_count = row_first > row_last ? 0 : row_last / kBlockM + 1 - t.steps.m_first;
    } else {
        t.steps.m_first = kCausal ? t.n_start / kBlockM : 0;
        t.steps.m_count = max(0, (static_cast<int>(f.seqlen_q) + kBlockM - 1) / kBlockM - t.steps.m_first);
    }
    t.steps.count = t.group * t.steps.m_count;
    t.row0 = 0;
    return t;
}

// The attention mask of masked calls (fc_mask_kind: kMaskNone, kMaskBool, kMaskAdditive), read
// straight from global memory by each consumer thread for its own (key, query) elements, after
// the step's rows were prefetched toward L1 at its start (any strides, broadcast dims included).
// kMaskBoolTiles: a bool mask whose layout TMA can read (keys contiguous, 16-byte aligned rows and
// strides, queries not broadcast): the Q/dO loader brings each step's tile to shared memory.
constexpr int kMaskNone = FC_MASK_NONE, kMaskBool = FC_MASK_BOOL, kMaskAdditive = FC_MASK_ADDITIVE,
              kMaskBoolTiles = 3;

}  // namespace sm90_bwd
}  // namespace flashcore
