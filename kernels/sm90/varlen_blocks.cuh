// sm90/varlen_blocks.cuh - packed variable-length sequences (fc_params.cu_seq_q, c_src/flashcore.h)
// in the Hopper forward: the list of every sequence's query blocks that the forward's persistent
// CTAs take their tiles from (kVarlen in sm90/fwd_kernel.cuh).
//
// The host never reads the offsets, so it cannot count the blocks. A first kernel
// (varlen_blocks_kernel, one CTA) reads cu_seq_q / cu_seq_k and writes into the workspace the
// number of blocks, then one entry per block: its sequence's first query row, query count,
// first key row and key count, and the block's index within the sequence.
//
// The list is sorted by each block's work (its key count, causal masking included), longest
// first: packed blocks differ in work by up to the ratio of the longest sequence to the block,
// and the forward's persistent grid hands tiles out in a fixed (snake) order, which only evens
// out the CTAs' loads when the tiles come sorted. The forward's tile t is (entry t / heads, query
// head t % heads): every head of one block is next to the others, so the heads of one KV group
// (consecutive query heads) and the blocks in flight at once read the same keys from L2. The
// sort is a counting sort over the work in 128-key units (kVarlenWorkBuckets buckets; longer
// blocks share the last): the sequence-ordered list goes to the workspace's scratch half first.
// (Within a bucket the order follows the atomics, so it may differ from call to call; each
// tile's arithmetic does not depend on it.)
//
// Offsets are clamped into [0, total_q] and [0, total_k] (a sequence ends no earlier than it
// starts), and the list stops at the workspace's capacity (fc_varlen_block_capacity, which
// monotone offsets never exceed): offsets that are wrong give wrong rows, never an access outside
// the tensors or the workspace. A sequence with queries but no key gets no block: this kernel
// writes its rows' output (zeros) and LSE (-inf) itself, so every tile of the forward has key
// tiles (its GEMM-turn ring, started by each CTA's first tile, relies on that).
#pragma once

#include "common/fast_div.cuh"
#include "flashcore.h"
#include "launch_rules.h"  // FC_VARLEN_*
#include "sm90/fwd_traits.cuh"  // Tile

#include <math.h>
#include <stdint.h>

namespace flashcore {
namespace sm90 {

// One query block of one sequence (FC_VARLEN_ENTRY_BYTES, two 16-byte loads).
struct alignas(16) VarlenBlock {
    int m_block;  // the block's index within its sequence (rows m_block * FC_VARLEN_BLOCK_ROWS ...)
    int q0;       // the sequence's first row of q / out / the LSE
    int sq;       // its queries
    int k0;       // its first row of k / v
    int sk;       // its keys (>= 1; the backward's list: >= 0)
    int head_kv;  // the backward's list (kKeyBlocks): the KV head of the tile; 0 in the forward's
    int unused[2];
};
static_assert(sizeof(VarlenBlock) == FC_VARLEN_ENTRY_BYTES, "launch_rules.h sizes the workspace from this");

// The workspace: the header (the entry count, padded to FC_VARLEN_HEADER_BYTES), then the sorted
// entries, then (capacity entries further; the backward's list: capacity x Hkv, room for its
// copies per KV head) the scratch the unsorted list is written to first.
struct VarlenList {
    int count;
    int unused[3];
    __device__ const VarlenBlock *blocks() const { return reinterpret_cast<const VarlenBlock *>(this + 1); }
    __device__ VarlenBlock *blocks() { return reinterpret_cast<VarlenBlock *>(this + 1); }
    __device__ VarlenBlock *scratch(int64_t entries) { return blocks() + entries; }
};
static_assert(sizeof(VarlenList) == FC_VARLEN_HEADER_BYTES, "launch_rules.h sizes the workspace from this");

// What the forward needs of a tile's sequence beyond Tile (sm90/fwd_traits.cuh): its query and key
// counts and its first key row. (Its first query row travels as Tile::batch: see varlen_tile.)
struct SeqSpan {
    int sq, k0, sk;
};

// Sequence b's rows, clamped into the tensors: [*q0, *q0 + *sq) of q and [*k0, *k0 + *sk) of k.
__device__ __forceinline__ void varlen_rows(const fc_params &p, int b, int *q0, int *sq, int *k0, int *sk) {
    const int total_q = static_cast<int>(p.total_q), total_k = static_cast<int>(p.total_k);
    const int qa = min(max(p.cu_seq_q[b], 0), total_q), qb = min(max(p.cu_seq_q[b + 1], qa), total_q);
    const int ka = min(max(p.cu_seq_k[b], 0), total_k), kb = min(max(p.cu_seq_k[b + 1], ka), total_k);
    *q0 = qa, *sq = qb - qa, *k0 = ka, *sk = kb - ka;
}

constexpr int kVarlenListThreads = 1024;
constexpr int kVarlenWorkBuckets = kVarlenListThreads;  // (one per thread in the sort's scan)

// A listed block's work in 128-row units (its bucket in the sort). A query block (the forward's
// list): the keys it sees, top-left causal masking showing block m at most (m + 1) *
// FC_VARLEN_BLOCK_ROWS. A key block (kKeyBlocks, the backward's list): the query rows that see it,
// under top-left causal those from its first key on.
template <bool kKeyBlocks = false>
__device__ __forceinline__ int block_work(const VarlenBlock &e, bool causal) {
    const int rows = kKeyBlocks ? (causal ? max(0, e.sq - e.m_block * FC_VARLEN_BLOCK_ROWS) : e.sq)
                                : (causal ? min(e.sk, (e.m_block + 1) * FC_VARLEN_BLOCK_ROWS) : e.sk);
    return min((rows + 127) / 128, kVarlenWorkBuckets - 1);
}

// An exclusive prefix sum over the CTA's threads (kVarlenListThreads); *total gets the sum.
__device__ __forceinline__ int block_exclusive_sum(int x, int *total) {
    __shared__ int warp_sums[kVarlenListThreads / 32];
    __shared__ int sum;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    int inclusive = x;
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
        const int y = __shfl_up_sync(0xffffffff, inclusive, d);
        if (lane >= d) inclusive += y;
    }
    if (lane == 31) warp_sums[warp] = inclusive;
    __syncthreads();
    if (warp == 0) {  // the warps' sums, scanned in place (exclusive)
        const int w = warp_sums[lane];
        int w_inclusive = w;
#pragma unroll
        for (int d = 1; d < 32; d *= 2) {
            const int y = __shfl_up_sync(0xffffffff, w_inclusive, d);
            if (lane >= d) w_inclusive += y;
        }
        warp_sums[lane] = w_inclusive - w;
        if (lane == 31) sum = w_inclusive;
    }
    __syncthreads();
    const int exclusive = warp_sums[warp] + inclusive - x;
    *total = sum;
    __syncthreads();  // (the next call reuses warp_sums and sum)
    return exclusive;
}

// Sorts the first `count` entries of `from` into `to` by block_work, largest first (a counting
// sort; see the top of this file). Every thread of the CTA calls it.
template <bool kKeyBlocks = false>
__device__ __forceinline__ void sort_by_work(const VarlenBlock *from, VarlenBlock *to, int count, bool causal) {
    __shared__ int bucket_next[kVarlenWorkBuckets];  // counts, then each bucket's next free slot
    bucket_next[threadIdx.x] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < count; i += kVarlenListThreads) atomicAdd(&bucket_next[block_work<kKeyBlocks>(from[i], causal)], 1);
    __syncthreads();
    // Largest work first: thread i scans bucket kVarlenWorkBuckets - 1 - i.
    const int bucket = kVarlenWorkBuckets - 1 - static_cast<int>(threadIdx.x);
    int unused_total;
    const int first = block_exclusive_sum(bucket_next[bucket], &unused_total);
    bucket_next[bucket] = first;  // (block_exclusive_sum's barriers: every count was read before)
    __syncthreads();
    for (int i = threadIdx.x; i < count; i += kVarlenListThreads) {
        const VarlenBlock e = from[i];
        to[atomicAdd(&bucket_next[block_work<kKeyBlocks>(e, causal)], 1)] = e;
    }
}

// One CTA of kVarlenListThreads: the list of query blocks (see the top of this file), and the
// output of sequences that have queries but no key. kKeyBlocks (the Hopper backward,
// sm90/bwd_kernel.cuh): the list of every sequence's FC_VARLEN_BLOCK_ROWS-key blocks instead
// (m_block: the key block's index), a sequence with keys and no query included (its blocks write
// zero dK and dV), nothing written but the list (a sequence with no key has no block: its dq rows
// stay the zeros of the accumulator).
template <typename Elem, bool kKeyBlocks = false>
__global__ void __launch_bounds__(kVarlenListThreads) varlen_blocks_kernel(const fc_params p) {
    VarlenList *list = static_cast<VarlenList *>(p.workspace);
    const int capacity = static_cast<int>(fc_varlen_block_capacity(kKeyBlocks ? p.total_k : p.total_q, p.batch));
    VarlenBlock *unsorted = list->scratch(kKeyBlocks ? capacity * p.heads_kv : capacity);
    const int batch = static_cast<int>(p.batch);
    int listed = 0;  // entries before this chunk of sequences (the same in every thread)
    for (int chunk = 0; chunk < batch; chunk += kVarlenListThreads) {
        const int b = chunk + static_cast<int>(threadIdx.x);
        int q0 = 0, sq = 0, k0 = 0, sk = 0;
        if (b < batch) varlen_rows(p, b, &q0, &sq, &k0, &sk);
        const int blocks = kKeyBlocks ? (sk + FC_VARLEN_BLOCK_ROWS - 1) / FC_VARLEN_BLOCK_ROWS
                                      : sk > 0 ? (sq + FC_VARLEN_BLOCK_ROWS - 1) / FC_VARLEN_BLOCK_ROWS : 0;
        int chunk_blocks = 0;
        const int first = listed + block_exclusive_sum(blocks, &chunk_blocks);
        for (int i = 0; i < blocks && first + i < capacity; ++i) {
            VarlenBlock e = {};
            e.m_block = i;
            e.q0 = q0, e.sq = sq, e.k0 = k0, e.sk = sk;
            unsorted[first + i] = e;
        }
        if (!kKeyBlocks && sq > 0 && sk == 0) {  // no key: zeros, LSE -inf (as a fully masked row)
            Elem *out = static_cast<Elem *>(p.out);
            for (int r = q0; r < q0 + sq; ++r)
                for (int h = 0; h < p.heads_q; ++h) {
                    for (int d = 0; d < p.head_dim; ++d) out[r * p.o_stride_s + h * p.o_stride_h + d] = Elem(0.f);
                    if (p.lse != nullptr) p.lse[h * p.lse_stride_h + r * p.lse_stride_s] = -INFINITY;
                }
        }
        listed += chunk_blocks;
    }
    const int count = min(listed, capacity);
    __syncthreads();  // the unsorted list, written by every thread, read by any
    sort_by_work<kKeyBlocks>(unsorted, list->blocks(), count, p.causal != 0);
    if constexpr (kKeyBlocks) {  // the sorted list once per KV head, head-major (the backward's tiles)
        __syncthreads();  // (the sorted entries, written by every thread)
        const int heads_kv = static_cast<int>(p.heads_kv);
        VarlenBlock *blocks = list->blocks();
        for (int t = count + static_cast<int>(threadIdx.x); t < count * heads_kv; t += kVarlenListThreads) {
            VarlenBlock e = blocks[t % count];
            e.head_kv = t / count;
            blocks[t] = e;
        }
        if (threadIdx.x == 0) list->count = count * heads_kv;
    } else if (threadIdx.x == 0) {
        list->count = count;
    }
}

// The forward's tile t of a packed call: query head t % heads of the entry t / heads (see the top
// of this file; `heads`: fwd_kernel's divisor by the query heads). Tile::batch carries the
// sequence's first query row: the launcher sets the batch strides of out and the LSE to their row
// strides, so the epilogue's dense addressing (batch * batch stride + row * row stride) lands on
// the packed rows unchanged.
__device__ __forceinline__ Tile varlen_tile(int t, const FastDiv &heads, const fc_params &p, SeqSpan &seq) {
    const int entry = heads.div(t);
    const VarlenBlock e = static_cast<const VarlenList *>(p.workspace)->blocks()[entry];
    seq = SeqSpan{e.sq, e.k0, e.sk};
    return Tile{e.m_block, t - entry * static_cast<int>(heads.d), e.q0};
}

// The number of listed blocks (the forward's tiles: every query head over each of them).
__device__ __forceinline__ int varlen_block_count(const fc_params &p) {
    return static_cast<const VarlenList *>(p.workspace)->count;
}

}  // namespace sm90
}  // namespace flashcore
