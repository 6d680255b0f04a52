// sm90/fwd_kernel.cuh - the Hopper (sm_90a) fused attention forward kernel (fwd_kernel): TMA +
// wgmma + warp specialization. Its types and switches are in sm90/fwd_traits.cuh, the split-KV
// merge in sm90/fwd_split.cuh, its launch in sm90/fwd_launch.cuh. fwd_kernel is the story of a CTA;
// its parts: the tile schedule (sm90/fwd_schedule.cuh), the barriers and the producer's loads
// (sm90/fwd_producer.cuh), a consumer's key loop (sm90/fwd_loop.cuh), the steps on one key tile
// (sm90/fwd_steps.cuh) and the epilogue (sm90/fwd_store.cuh).
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
//     than 2^8 since its exponent base was set.
#pragma once

#include "common/fast_div.cuh"
#include "common/sm80_ptx.cuh"
#include "common/split_combine.cuh"  // partial_rows (kGridSplit)
#include "common/wgmma_generated.cuh"
#include "flashcore.h"
#include "sm90/fwd_epilogue.cuh"
#include "sm90/fwd_split.cuh"
#include "sm90/fwd_traits.cuh"
#include "sm90/fwd_loop.cuh"
#include "sm90/fwd_producer.cuh"
#include "sm90/fwd_schedule.cuh"
#include "sm90/fwd_steps.cuh"
#include "sm90/fwd_store.cuh"
#include "sm90/ptx.cuh"
#include "sm90/varlen_blocks.cuh"

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
// Trace events (names as in tools/sm90_trace.py): 1 tile start (argument: its key tiles), 2 Q
// landed, 3 / 4 GEMM turn waited for / taken, 5 GEMMs issued, 6 S ready, 8 P V done, 11 softmax
// done, 7 P converted, 9 / 10 epilogue start / end, 12 CTA done; kPair's merge: 13 partial left,
// 14 both met, 15 merged. Off, `trace` is an empty lambda.
constexpr int kTracePerWg = 4096, kTraceCtas = 160;
#if FLASHCORE_SM90_TRACE
__device__ unsigned long long g_trace[kTraceCtas * 4 * kTracePerWg];

// A consumer warpgroup's trace: trace(event, argument).
struct TraceLog {
    int warpgroup;
    int n = 0;  // events so far
    __device__ void operator()(int ev, int arg) {
        if (threadIdx.x % 128 == 0 && n < kTracePerWg && blockIdx.x < kTraceCtas) {
            const unsigned long long c = clock64();
            g_trace[(blockIdx.x * 4 + warpgroup) * kTracePerWg + n] =
                (static_cast<unsigned long long>(ev) << 56) | (static_cast<unsigned long long>(arg & 0xff) << 48) |
                (c & ((1ull << 48) - 1));
        }
        ++n;
    }
};
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
//
// kVarlen: packed variable-length sequences (fc_params.cu_seq_q): the tiles come from the list of
// the sequences' query blocks (sm90/varlen_blocks.cuh), each with its sequence's lengths (SeqSpan)
// where a dense call has the call's; loads start at the sequence's rows of the one-batch tensor
// maps, and O goes out in 16-byte stores (a TMA store of a block would clip at the tensor's end,
// not the sequence's). No split, pair, mask, band or softcap with it (c_src/dispatch.c).
template <typename Elem, int kHeadDim, bool kCausal, int kShape, bool kBand = false, bool kSoftcap = false,
          bool kVarlen = false>
__global__ void __launch_bounds__(FwdTraits<kHeadDim, kCausal, kShape>::kThreads, 1)
fwd_kernel(const __grid_constant__ FwdMaps maps, const fc_params p) {
    static_assert(!kBand || kCausal, "a band runs in the causal configurations");
    static_assert(!kVarlen || (!kBand && !kSoftcap && kShape != kPair && kShape != kMasked), "packed: plain configurations");
    using K = FwdKernelShape<Elem, kHeadDim, kCausal, kShape, kBand, kSoftcap, kVarlen>;  // (its constants: see there)
    using T = typename K::T;
    constexpr int kBlockM = K::kBlockM, kBlockN = K::kBlockN, kStages = K::kStages;
    constexpr int kNTiles = K::kNTiles, kDTiles = K::kDTiles, kKeySplit = K::kKeySplit;
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
    [[maybe_unused]] unsigned char *smem_mask = smem_v + T::kMaskOffsetFromV;  // kMasked: a mask tile per stage

    const int seqlen_q = static_cast<int>(p.seqlen_q);
    const int seqlen_k = static_cast<int>(p.seqlen_k);
    const int heads_q = static_cast<int>(p.heads_q);
    const int m_blocks = (seqlen_q + kBlockM - 1) / kBlockM;
    // kVarlen: the listed blocks (written by the kernel before this one, which this launch follows
    // in stream order without programmatic dependent launch: readable from the start).
    const int varlen_blocks = kVarlen ? varlen_block_count(p) : 0;
    const int n_tiles = kVarlen ? varlen_blocks * heads_q : m_blocks * heads_q * static_cast<int>(p.batch);
    const FastDiv &m_blocks_div = maps.m_blocks_div, &heads_q_div = maps.heads_q_div;  // for decode_tile
    // The tile schedule (sm90/fwd_schedule.cuh), the producer's and the consumers' alike: tile t
    // and its sequence (the call's lengths, or a packed sequence's), its key tiles.
    auto tile_of = [&](int t, SeqSpan &seq) -> Tile {
        if constexpr (kVarlen) return varlen_tile(t, heads_q_div, p, seq);
        seq = SeqSpan{seqlen_q, 0, seqlen_k};
        return decode_tile(t, m_blocks_div, heads_q_div);
    };
    auto block_keys = [&](int m_block, const SeqSpan &seq) { return block_key_tiles<K>(m_block, seq.sq, seq.sk, p); };
    auto kv_splits = [&] { return kv_split_count<K>(p); };
    auto key_range = [&](int m_block, const SeqSpan &seq) { return split_key_range<K>(m_block, seq, block_keys, kv_splits, p); };
    constexpr bool kGridSplitHere = kGridSplit<kHeadDim, kCausal, kShape>;

    // Broadcast from lane 0, so the compiler knows it is warp-uniform and keeps what derives from
    // it (the shared-memory descriptors) in uniform registers.
    const int warpgroup = __shfl_sync(0xffffffff, static_cast<int>(threadIdx.x) / 128, 0);
    const int lane = threadIdx.x % 32;

    if (threadIdx.x == 0) init_barriers<K>(bars);
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
        int32_t c[4];  // (load_tiles's scratch, declared here: see there)
        load_tiles<K>(c, maps, p, bars, smem_q, smem_k, smem_v, smem_mask, n_tiles, tile_of, kv_splits, key_range);
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
#if FLASHCORE_SM90_TRACE
    TraceLog trace{warpgroup};
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

    auto load_q_frags = [&] { load_q_fragments<K>(q_frag, q_base, warp_in_wg, lane); };  // kQInRegs (see there)
    // S = Q K^T for ring slot i into `acc` (s, or kPair's s_next), asynchronous.
    auto issue_qk_into = [&](float (&acc)[kNTiles * 4], int i) { issue_s_gemm<K>(acc, i, bars, q_base, k_base, q_frag); };
    auto issue_qk = [&](int i) { issue_qk_into(s, i); };
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

    // GEMM turns round the consumer warpgroups (K::kPingPong, see there).
    auto wait_turn = [&] { wait_gemm_turn<K>(consumer, trace); };
    auto pass_turn = [&](bool last_section) { pass_gemm_turn<K>(consumer, last_section, trace); };

    // The buffer of this warpgroup's last TMA store of O freed once the store has read it (see there).
    const int o_buf = T::kOBufs == 1 ? 0 : consumer;
    bool o_store_pending = false;
    [[maybe_unused]] int staged_o_stores = 0;  // kVarlen: this warpgroup's TMA stores of O so far (store_rows)
    auto retire_o_store = [&] { release_o_staging<K>(o_store_pending, bars, o_buf); };

    // (The three counters declared in this order: in any other, the loop's PTX registers came out
    // in another order and the SASS changed.)
    int local = 0;
    int q_loads = 0;  // Q tiles consumed: Q buffer phase, as in the producer
    int kv_iter = 0;  // K/V tiles consumed so far: ring stage and phase, as in the producer
    bool s_carried = false;
    int qb = 0;  // the current tile's Q buffer
    [[maybe_unused]] int tile_slot0 = 0;  // the current tile's key tile 0's ring slot (kMasked's softmax)
    // t_next: the tile after this one, found once per tile (see snake_tile).
    for (int t = snake_tile(0, n_tiles, kv_splits()), t_next; t < n_tiles; t = t_next, ++local) {
        t_next = snake_tile(local + 1, n_tiles, kv_splits());
        SeqSpan seq;
        const Tile tile = tile_of(t, seq);
        const KeyRange keys = key_range(tile.m_block, seq);  // key tiles [first, end) of this CTA
        const int wg_row0 = tile.m_block * kBlockM + row_group * 64;  // first query row of this WG
        const int row0 = wg_row0 + warp_in_wg * 16 + row_in_warp;    // this thread's first row

        // The online softmax of key tile n (online_softmax). kMasked: key tile n's mask rows sit
        // in its ring slot's stage (tile_slot0 + n; consume_tile sets tile_slot0), landed with its V tile.
        auto softmax = [&](int n, float (&rescale)[2], bool pv_pending, auto &&finish_pv) -> bool {
            const unsigned char *mask_row = mask_row_of<K>(tile_slot0 + n, bars, smem_mask, row_group, warp_in_wg, row_in_warp);
            return online_softmax<K>(n, rescale, pv_pending, finish_pv, s, row_max, row_sum, o_acc, p_frag, p, seq.sk,
                                     wg_row0, row0, col_in_tile, scale_log2, softcap_in, mask_row);
        };

        start_rows<K>(o_acc, row_max, row_sum, keys.first >= keys.end);
        float rescale[2];
        // The whole CTA agrees on the range: an empty one loads and runs nothing.
        if (keys.first < keys.end) {
            // (Captured by value where the kernel's own code used them directly: see consume_tile.)
            const ConsumerCounters next = [&, local, t_next, n_tiles, keys, kv_iter, q_loads, s_carried] {
                return consume_tile<K>(keys.first, keys.end, key_part, wg_row0, seq.sq, p, local, consumer, t_next >= n_tiles,
                                       ConsumerCounters{kv_iter, q_loads, s_carried}, tile_slot0, qb, q_base, q_rows, rescale,
                                       s, s_next, o_acc, bars, maps, trace, load_q_frags, release, wait_turn, issue_qk,
                                       issue_qk_into, issue_pv, pass_turn, softmax, convert_p, rescale_o, retire_o_store);
            }();
            kv_iter = next.kv_iter;
            q_loads = next.q_loads;
            s_carried = next.s_carried;
        }

        // ---- epilogue: normalise, write O from registers (Q's buffer is already refilling) ----
        trace(9, 0);
        float inv_sum[2];
        // Rows this CTA writes (all, unless a pushed split leaves some to a peer) and their LSE.
        bool finalise[2] = {true, true};
        float lse_log2[2];
        finish_rows<K>(o_acc, row_max, row_sum, inv_sum, lse_log2, smem_v, key_part, scale_log2, tile.head, p, trace);
        if (T::kPushMerge && cluster_size() > 1) {  // (a split CTA has one tile: one merge)
            // (The slots, the cluster's shape and the scratch arrays: see push_merge_split.)
            using SS = SplitSlots<kHeadDim, kBlockM>;
            const int splits = cluster_size(), rank = cluster_rank();
            const int rows_per_rank = SS::rows_per_rank(splits);
            const float *slots_o = reinterpret_cast<const float *>(smem_v + kStages * T::kKVTileBytes + T::kPairBytes);
            const float2 *slots_ml = reinterpret_cast<const float2 *>(slots_o + splits * rows_per_rank * SS::kOPitch);
            int local_row[2];
            float m_log2[2];
            push_merge_split<K>(o_acc, row_max, row_sum, inv_sum, lse_log2, finalise, local_row, m_log2, splits, rank,
                                rows_per_rank, slots_o, slots_ml, bars, row_group, warp_in_wg, row_in_warp, col_in_tile,
                                lane, scale_log2);
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
        int32_t c[4];   // (store_rows's scratch, declared here: see there)
        uint32_t w[4];
        store_rows<K>(c, w, o_acc, inv_sum, lse_log2, finalise, o_store_pending, maps, bars, smem_o, o_buf, local, consumer,
                      warp_in_wg, lane, wg_row0, row0, seq.sq, key_part, tile, p, trace, staged_o_stores);
    }
    trace(12, 0);
    // The last store of O must have read the staging buffer before the CTA's shared memory goes
    // (and, with one buffer, the other warpgroup's last epilogue may be waiting for it).
    if constexpr (T::kOBufs > 0) retire_o_store();
}

}  // namespace sm90
}  // namespace flashcore
