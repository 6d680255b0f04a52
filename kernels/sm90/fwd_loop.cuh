// sm90/fwd_loop.cuh - the Hopper forward's key loop, as fwd_kernel (sm90/fwd_kernel.cuh) runs it: a
// consumer warpgroup's work on one tile (consume_tile), its key tiles' GEMM sections (run_key_tiles)
// and the sections themselves: the row sums, which key tiles a block sees, the pair configuration's
// early-S tiles, the first, middle and last tiles, and the masked tiles past the last one seen.
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
#include "sm90/fwd_steps.cuh"

#include <cuda.h>
#include <cuda/ptx>
#include <math.h>
#include <stdint.h>
#include <type_traits>

namespace flashcore {
namespace sm90 {

// The rows' sums over the quad's four lanes (row_sum) and their reciprocals (inv_sum).
template <class K>
__device__ __forceinline__ void sum_rows(float (&row_sum)[2], float (&inv_sum)[2]) {
    constexpr bool kRowsMayBeEmpty = K::kBand || K::kMaskTiles;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float sum = row_sum[h];
        sum += __shfl_xor_sync(0xffffffff, sum, 1);
        sum += __shfl_xor_sync(0xffffffff, sum, 2);
        row_sum[h] = sum;
        // (A band or a mask: a row that saw no key has sum 0 and gives zeros.)
        inv_sum[h] = kRowsMayBeEmpty && sum == 0.f ? 0.f : 1.f / sum;
    }
}

// The end of the key tiles that this warpgroup's rows (from wg_row0) see, within [first, end).
// (`end` by reference: taken by value, min's operands came out in the other order.)
template <class K>
__device__ __forceinline__ int key_tiles_seen(int first, const int &end, int wg_row0, int seqlen_q, const fc_params &p) {
    constexpr int kBlockN = K::kBlockN, kKeySplit = K::kKeySplit;
    constexpr bool kCausal = K::kCausal, kBand = K::kBand, kSkipDeadRows = K::kSkipDeadRows;
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
    return kBand && kKeySplit == 1      ? max(first + 1, min(end, (wg_row0 + 63 + p.band_hi_) / kBlockN + 1))
           : kCausal && kKeySplit == 1 ? max(first + 1, min(end, (wg_row0 + 63) / kBlockN + 1))
           : kSkipDeadRows && wg_row0 >= seqlen_q ? first + 1
                                                  : end;
}

// kPair with maps.pair_s_ahead: this warpgroup's two key tiles (ring slots slot0 + mine, slot0 + last), both
// S = Q K^T issued together (the steps are fwd_kernel's lambdas).
template <class K, class WaitTurn, class IssueQk, class IssueQkInto, class PassTurn, class Trace, class Release,
          class Softmax, class ConvertP, class IssuePv, class RescaleO>
__device__ __forceinline__ void pair_s_ahead_tiles(int slot0, int mine, int last, int qb, float (&rescale)[2],
                                                   float (&s)[K::kNTiles * 4], float (&s_next)[K::kNTiles * 4],
                                                   float (&o_acc)[K::kDTiles * 4], typename K::Bars &bars,
                                                   WaitTurn &wait_turn, IssueQk &issue_qk, IssueQkInto &issue_qk_into,
                                                   PassTurn &pass_turn, Trace &trace, Release &release, Softmax &softmax,
                                                   ConvertP &convert_p, IssuePv &issue_pv, RescaleO &rescale_o) {
    constexpr int kHeadDim = K::kHeadDim, kNTiles = K::kNTiles, kStages = K::kStages;
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
}

// The key loop's middle sections: for each of this warpgroup's key tiles n after `mine` and before seen_end,
// S(n) and O += P(n-1) V(n-1) in one GEMM turn, then the softmax of S(n) (the steps are fwd_kernel's lambdas).
template <class K, bool kCarryS, class WaitTurn, class IssueQk, class IssuePv, class PassTurn, class Trace, class Release,
          class Softmax, class ConvertP, class RescaleO>
__device__ __forceinline__ void key_tiles_middle(int slot0, int mine, int seen_end, int last, int qb, float (&rescale)[2],
                                                 float (&s)[K::kNTiles * 4], float (&o_acc)[K::kDTiles * 4],
                                                 typename K::Bars &bars, WaitTurn &wait_turn, IssueQk &issue_qk,
                                                 IssuePv &issue_pv, PassTurn &pass_turn, Trace &trace, Release &release,
                                                 Softmax &softmax, ConvertP &convert_p, RescaleO &rescale_o) {
    constexpr int kHeadDim = K::kHeadDim, kNTiles = K::kNTiles, kStages = K::kStages, kKeySplit = K::kKeySplit;
    constexpr bool kCausal = K::kCausal;
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
}

// The key tiles [seen_end, end) that this warpgroup's rows do not see: their GEMM turns taken without
// GEMMs and their stages freed (the steps are fwd_kernel's lambdas).
template <class K, class WaitTurn, class PassTurn, class Release>
__device__ __forceinline__ void skip_key_tiles(int slot0, int seen_end, int end, bool last_tile, typename K::Bars &bars,
                                               WaitTurn &wait_turn, PassTurn &pass_turn, Release &release) {
    constexpr int kStages = K::kStages;
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
}

// The softmax of this warpgroup's first key tile `mine` once its S = Q K^T is in (the steps are fwd_kernel's lambdas).
template <class K, class Trace, class Release, class Softmax, class ConvertP>
__device__ __forceinline__ void first_key_tile(int slot0, int mine, int last, int qb, float (&rescale)[2],
                                               float (&s)[K::kNTiles * 4], typename K::Bars &bars, Trace &trace,
                                               Release &release, Softmax &softmax, ConvertP &convert_p) {
    constexpr int kHeadDim = K::kHeadDim, kNTiles = K::kNTiles, kStages = K::kStages;
    constexpr bool kCausal = K::kCausal;
    wgmma_wait<0>();
    trace(6, mine);
    fence_registers(s);
    release(&bars.k_empty[(slot0 + mine) % kStages]);
    if (!kQInRegs<kHeadDim, kCausal> && mine == last)
        release(&bars.q_empty[qb]);  // last use of Q in this tile
    softmax(mine, rescale, false, [] {});  // O is still zero: nothing to rescale
    if constexpr (!kPvWaitInSoftmax<kHeadDim>) convert_p(std::integral_constant<int, kNTiles>{});
    trace(7, mine);
}

// The tile's last GEMM section for this warpgroup: O += P(last) V(last) (kCarryS, `carry`: after the next
// tile's first S = Q K^T), then its V stage freed (the steps are fwd_kernel's lambdas).
template <class K, bool kCarryS, class WaitTurn, class IssueNextQk, class IssuePv, class PassTurn, class Trace,
          class Release>
__device__ __forceinline__ void last_key_tile(int slot0, int mine, int last, int half_tile, int seen_end, int end,
                                              bool carry, bool last_tile, float (&o_acc)[K::kDTiles * 4],
                                              typename K::Bars &bars, WaitTurn &wait_turn, IssueNextQk &issue_next_qk,
                                              IssuePv &issue_pv, PassTurn &pass_turn, Trace &trace, Release &release) {
    constexpr int kStages = K::kStages;
    wait_turn();
    if (carry) issue_next_qk();  // (first, as in the loop's sections; non-causal: seen_end == end)
    issue_pv(slot0 + last, last == half_tile, kCarryS && last == mine);
    pass_turn(last_tile && seen_end == end);  // the tile's last GEMM section?
    wgmma_wait<0>();  // (with the next S: the epilogue overlapping it made ptxas serialise)
    trace(8, last);
    fence_registers(o_acc);
    release(&bars.v_empty[(slot0 + last) % kStages]);
}

// One tile's key tiles for this warpgroup: `mine` and every kKeySplit-th after it up to seen_end,
// each in its GEMM turn: kPair's two tiles with both S up front (pair_s_ahead_tiles), or the
// first tile's softmax, the middle sections, the last P V (kCarryS: with the next tile's first
// S = Q K^T, from the other Q buffer) and the turns of the tiles past seen_end. Returns whether it
// issued the next tile's first S (the caller then steps its Q buffer). `s_carried`: the tile
// before already issued this tile's first S (kCarryS); cleared here. (The steps are fwd_kernel's
// lambdas.)
template <class K, bool kCarryS, class WaitTurn, class IssueQk, class IssueQkInto, class IssuePv, class PassTurn, class Trace,
          class Release, class Softmax, class ConvertP, class RescaleO, class RetireOStore>
__device__ __forceinline__ bool run_key_tiles(int slot0, int mine, int seen_end, int half_tile, int end, bool last_tile,
                                              int qb, int q_loads, bool &s_carried, uint32_t &q_base, uint32_t q_rows,
                                              float (&rescale)[2], float (&s)[K::kNTiles * 4],
                                              float (&s_next)[K::kNTiles * 4], float (&o_acc)[K::kDTiles * 4],
                                              typename K::Bars &bars, const FwdMaps &maps, WaitTurn &wait_turn,
                                              IssueQk &issue_qk, IssueQkInto &issue_qk_into, IssuePv &issue_pv,
                                              PassTurn &pass_turn, Trace &trace, Release &release, Softmax &softmax,
                                              ConvertP &convert_p, RescaleO &rescale_o, RetireOStore &retire_o_store) {
    using T = typename K::T;
    constexpr int kKeySplit = K::kKeySplit, kShape = K::kShape;
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
            [&] {
                pair_s_ahead_tiles<K>(slot0, mine, last, qb, rescale, s, s_next, o_acc, bars, wait_turn, issue_qk,
                                      issue_qk_into, pass_turn, trace, release, softmax, convert_p, issue_pv,
                                      rescale_o);
            }();
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
        [&] { first_key_tile<K>(slot0, mine, last, qb, rescale, s, bars, trace, release, softmax, convert_p); }();
        [&] {
            key_tiles_middle<K, kCarryS>(slot0, mine, seen_end, last, qb, rescale, s, o_acc, bars, wait_turn,
                                         issue_qk, issue_pv, pass_turn, trace, release, softmax, convert_p,
                                         rescale_o);
        }();
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
        [&] {
            last_key_tile<K, kCarryS>(slot0, mine, last, half_tile, seen_end, end, carry, last_tile, o_acc, bars,
                                      wait_turn, issue_next_qk, issue_pv, pass_turn, trace, release);
        }();
        [&] { skip_key_tiles<K>(slot0, seen_end, end, last_tile, bars, wait_turn, pass_turn, release); }();
        return carry;
    }  // !pair_done
    return false;
}

// What a consumer warpgroup carries from one tile to the next: the K/V ring slots consumed
// (kv_iter: stage and phase, as in the producer), the Q buffers consumed (q_loads: buffer phase)
// and whether the next tile's first S = Q K^T is already issued (s_carried, kCarryS).
struct ConsumerCounters {
    int kv_iter, q_loads;
    bool s_carried;
};

// A consumer warpgroup's work on one tile with key tiles [first, end) (up to its epilogue): the
// tile's first ping-pong turn opened (local == 0), its Q waited for (unless carried in) and, at
// kQInRegs, loaded into registers, then its key tiles (run_key_tiles). Key tile n sits in ring slot
// `slot0 + n` (slots count every tile this CTA has consumed). kPair: this warpgroup runs key tiles
// mine, mine + 2, ... of [first, end) (the other one of its row group the rest); otherwise every
// key tile (kKeySplit = 1). `last_tile`: no tile follows in this CTA (a split CTA has one tile; a
// persistent CTA's tiles all have key tiles).
// Takes and returns the counters by value, and the kernel captures them by value: taken by
// reference, they changed the kernel's SASS. (The steps are fwd_kernel's lambdas.)
template <class K, class Trace, class LoadQFrags, class Release, class WaitTurn, class IssueQk, class IssueQkInto, class IssuePv,
          class PassTurn, class Softmax, class ConvertP, class RescaleO, class RetireOStore>
__device__ __forceinline__ ConsumerCounters consume_tile(int first, int end, int key_part, int wg_row0, int seqlen_q,
                                                         const fc_params &p, int local, int consumer, bool last_tile,
                                                         ConsumerCounters c, int &tile_slot0, int &qb, uint32_t &q_base,
                                                         uint32_t q_rows, float (&rescale)[2], float (&s)[K::kNTiles * 4],
                                                         float (&s_next)[K::kNTiles * 4], float (&o_acc)[K::kDTiles * 4],
                                                         typename K::Bars &bars, const FwdMaps &maps, Trace &trace,
                                                         LoadQFrags &load_q_frags, Release &release, WaitTurn &wait_turn,
                                                         IssueQk &issue_qk, IssueQkInto &issue_qk_into, IssuePv &issue_pv,
                                                         PassTurn &pass_turn, Softmax &softmax, ConvertP &convert_p,
                                                         RescaleO &rescale_o, RetireOStore &retire_o_store) {
    using T = typename K::T;
    constexpr int kHeadDim = K::kHeadDim, kBlockN = K::kBlockN, kW = K::kW;
    constexpr bool kCausal = K::kCausal, kPingPong = K::kPingPong, kHalfTiles = K::kHalfTiles, kCarryS = K::kCarryS;
    const int slot0 = c.kv_iter - first;
    tile_slot0 = slot0;
    const int mine = first + key_part;
    const int seen_end = [&] { return key_tiles_seen<K>(first, end, wg_row0, seqlen_q, p); }();
    // half_tile (key_tiles_seen): the diagonal tile whose keys 64..127 this warpgroup's rows never see, or -1.
    const int half_tile =
        kHalfTiles && wg_row0 % kBlockN == 0 && wg_row0 / kBlockN == seen_end - 1 ? seen_end - 1 : -1;
    if (kPingPong && local == 0 && consumer == kW - 1) asm volatile("bar.arrive 1, 256;\n" ::: "memory");
    trace(1, end - first);
    if (!c.s_carried) {
        qb = c.q_loads % T::kQBufs;
        q_base = q_rows + qb * T::kQBytes;
        wait_barrier(&bars.q_full[qb], (c.q_loads++ / T::kQBufs) & 1);
    }
    trace(2, 0);
    if constexpr (kQInRegs<kHeadDim, kCausal>) {  // (no kCarryS, no kPair at D=128)
        load_q_frags();
        release(&bars.q_empty[qb]);
    }
    if (mine >= end) {
        release(&bars.q_empty[qb]);  // kPair with a single key tile: nothing for this one
    } else {
        // carried: the next tile's first S = Q K^T is issued, from the next Q buffer (kCarryS).
        // (q_loads captured by value: by reference, it changed the SASS.)
        const bool carried = [&, q_loads = c.q_loads] {
            return run_key_tiles<K, kCarryS>(slot0, mine, seen_end, half_tile, end, last_tile, qb, q_loads, c.s_carried,
                                             q_base, q_rows, rescale, s, s_next, o_acc, bars, maps, wait_turn, issue_qk,
                                             issue_qk_into, issue_pv, pass_turn, trace, release, softmax, convert_p,
                                             rescale_o, retire_o_store);
        }();
        if (carried) {
            qb = (qb + 1) % T::kQBufs;
            ++c.q_loads;
            c.s_carried = true;
        }
    }
    c.kv_iter = slot0 + end;
    return c;
}

}  // namespace sm90
}  // namespace flashcore
