// sm90/bwd_kernel.cuh - the Hopper (sm_90a) fused attention backward: TMA + wgmma + warp
// specialization, one pass over key blocks.
//
// What it computes (as kernels/bwd_sm80.cuh, whose comment has the formulas): for one key block
// of kBlockN = 128 keys of one KV head, dK and dV over every query row of the KV head's group of
// query heads that sees those keys, and each query tile's share of dQ:
//     S^T = K Q^T,  P^T = exp2(S^T scale log2(e) - LSE2),  dV += P^T dO,
//     dP^T = V dO^T,  dS^T = P^T (dP^T - delta),  dK += dS^T Q,  dQ += dS K
// LSE2 and delta come from the row-terms kernel (sm90/bwd_rows.cuh); scale is applied to dK here
// and to dQ when its fp32 accumulator is converted.
//
// How (one CTA = one producer warpgroup and two consumer warpgroups of 64 keys each; at most one
// CTA per SM, each taking tiles (key block, KV head, batch) until none are left):
//   * The producer's threads each have one job: a tile scheduler that claims the CTA's next tile
//     from a counter in the workspace (when the current tile's last step is being loaded) and
//     publishes it decoded, then loads the tile's K and V (TMA) once the consumers are done with
//     the previous tile's; a Q/dO loader and a row-terms loader that stream the (query head,
//     query tile) steps of kBlockM = 64 rows into a kStages ring (Q and dO by TMA, 128-byte
//     swizzled; the tile's delta and LSE2 as one bulk copy), each stage completing on an mbarrier
//     ("full") and released by the consumer threads ("empty"); and the dQ writer (below). A
//     tile's first steps and K/V thus load while the consumers finish the previous tile and
//     write its dK and dV.
//   * Each consumer warpgroup computes S^T and dP^T for its 64 keys with both operands in shared
//     memory (K-major), P^T and dS^T in fp32 registers, then dV and dK with P^T and dS^T straight
//     from registers (the accumulator layout of S^T is the A-fragment layout) against Q and dO
//     read N-major (no transpose pass).
//   * dQ needs dS = (dS^T)^T as an A operand: each warpgroup writes its dS^T rows to shared
//     memory in the 128-byte-swizzled layout wgmma reads M-major (transposed A), and dQ for the
//     tile comes from one more GEMM against K (read N-major). The warpgroups split dQ's columns
//     (each reads both warpgroups' dS^T: a barrier of the two). Two dS^T buffers, so a step may
//     write one while the previous step's GEMM reads the other.
//   * D=64 holds the tile's K and V rows in registers as the A operands of S^T and dP^T (shared
//     memory bandwidth, not the tensor cores, bounds the step), and issues a step's S^T and dP^T
//     GEMMs ahead, right behind the previous step's dQ GEMM, so that they run while the
//     consumers stage dQ. At D=128 the registers for either are taken.
//   * A step's row terms go to registers early: its LSE2 before its score GEMMs are issued, its
//     delta before dP^T is waited for (read after them, each load waited behind the GEMMs'
//     shared-memory traffic).
//   * The tile's dQ goes to an fp32 staging tile in shared memory, and the second warp of the
//     producer warpgroup adds it to the fp32 accumulator in global memory with one bulk
//     reduction (cp.reduce.async.bulk .add.f32): dQ sums over key blocks in whatever order they
//     finish, so its last bits may vary from run to run. Once a tile's reductions are complete
//     it counts the tile for its (batch, KV head) pair, so that the dq conversion (launched
//     programmatically, sm90/bwd_launch.cuh) converts each pair's rows while other tiles run.
//   * At the tile's end each warpgroup's dK and dV (fp32 registers) go out through its half of
//     the dQ staging tile, packed, in 16-byte stores that fill whole 128-byte lines
//     (store_dk_dv; at D=128 the band and packed variants store from registers: they spilled).
//   * GQA: the group's query heads are steps of the same CTA, so dK and dV are summed in
//     registers, in a fixed order. Causal (top-left): steps start at the first query tile that
//     sees the block's first key; scores are masked only in tiles that cross the diagonal and
//     in the ragged last key block.
//   * Band (kBand, with the causal configuration; fc_band_bounds in c_src/flashcore.h: a sliding
//     window, or causal aligned bottom-right): row i sees keys i + lo .. i + hi. A key block's
//     steps are the query tiles whose rows see any of its keys (tile_at); the others are not
//     visited, so a block no row sees writes zero dK and dV. Scores are masked per element only
//     in the tiles an edge of the band crosses. A row that sees no key has LSE -inf, so LSE2 =
//     +inf (sm90/bwd_rows.cuh): its P, dS and dQ are zeros.
//   * Rows past Sq are zero-filled by TMA and have LSE2 = +inf (P = 0); keys past Sk are
//     zero-filled and masked.
//   * Packed sequences (kVarlen, fc_params.cu_seq_q): tiles are (listed key block, KV head) of a
//     list built on the device, sorted by work (varlen_tile_at, sm90/varlen_blocks.cuh); a tile's
//     rows count from its sequence's first key and query (Q, dO, K and V loads at the sequence's
//     rows of one-batch tensor maps, dQ reduced at its rows), and queries and keys past the
//     sequence's ends (the next sequence's rows) are masked like keys past Sk. Causal is top-left
//     in each sequence.
//   * Softcap (kSoftcap, beside causal, non-causal or a band): scores are t = tanh(S^T scale
//     / softcap), P^T = exp2(t softcap log2(e) - LSE2), and dS^T gains the factor 1 - t^2. The
//     variant waits for dP^T before the softmax and packs P^T and dS^T into their fragments pair
//     by pair, so that no fp32 copy of either outlives its element (register budget).
//
// Below, the kernel: the producer threads' jobs (sm90/bwd_producer.cuh) and the consumer
// warpgroups' steps (sm90/bwd_steps.cuh), composed. The types are in sm90/bwd_traits.cuh, the
// launcher in sm90/bwd_launch.cuh; D=256 has a kernel of its own (sm90/bwd_d256.cuh).
#pragma once

#include "sm90/bwd_producer.cuh"
#include "sm90/bwd_steps.cuh"
#include "sm90/bwd_traits.cuh"

namespace flashcore {
namespace sm90_bwd {

template <typename Elem, int kHeadDim, bool kCausal, int kMask, bool kBand = false, bool kSoftcap = false, bool kVarlen = false>
__global__ void __launch_bounds__(BwdTraits<kHeadDim>::kThreads, 1)
bwd_kernel(const __grid_constant__ BwdMaps maps, const fc_bwd_params p) {
    static_assert(!kBand || (kCausal && kMask == kMaskNone), "a band runs in the causal configuration, without a mask");
    static_assert(!kVarlen || (kMask == kMaskNone && !kBand && !kSoftcap), "packed calls: causal or not, nothing else");
    using T = BwdTraits<kHeadDim, kMask == kMaskBoolTiles>;
    constexpr int kBlockN = T::kBlockN;

    extern __shared__ unsigned char smem_raw[];
    __shared__ BwdBarriers bars;
    unsigned char *smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);

    const fc_params &f = p.fwd;
    const int seqlen_k = static_cast<int>(f.seqlen_k);
    // (kVarlen: the tile scheduler reads the count from the key-block list.)
    const int tiles = kVarlen ? 0 : (seqlen_k + kBlockN - 1) / kBlockN * static_cast<int>(f.heads_kv * f.batch);
    const Workspace ws = workspace_of<kVarlen>(p);

    const int warpgroup = __shfl_sync(0xffffffff, static_cast<int>(threadIdx.x) / 128, 0);
    const int lane = threadIdx.x % 32;
    if (threadIdx.x == 0) init_barriers<T>(bars);
    __syncthreads();
    // Launched programmatically (sm90/bwd_launch.cuh): the row-terms kernel's results first; then
    // the dq conversion may launch (it waits for each pair's count, which the row-terms kernel
    // zeroed: hence not before this wait).
    wait_for_prior_grids();
    allow_dependent_grids();

    if (warpgroup == 0) {
        // ---------------- producer: four threads of their own jobs ----------------
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(T::kProducerRegs));
        if (threadIdx.x == 32) {
            write_dq<T, kVarlen>(bars, maps, ws, p, [&](float *rows, int) { reduce_staged_tile<T>(bars, smem, rows); });
            return;
        }
        if (threadIdx.x == 96) {
            schedule_tiles_and_load_kv<T, kCausal, kBand, kVarlen>(bars, smem, maps, p, ws, tiles);
            return;
        }
        // The step loaders: each step's Q and dO (thread 0) and its row terms (thread 64) into the
        // ring; a stage fills on both.
        if (threadIdx.x == 64) {
            load_row_terms<T, kVarlen>(bars, smem, ws, p);
        } else if (threadIdx.x == 0) {
            load_q_do<T, kMask, kVarlen>(bars, smem, maps, p);
        }
        return;
    }

    // ---------------- consumers: 64 keys each ----------------
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(T::kConsumerRegs));
    const int wg = warpgroup - 1;
    const int warp_in_wg = (threadIdx.x / 32) % 4;
    const int row_in_warp = lane / 4;        // accumulator rows row_in_warp, +8 (of the warp's 16)
    const int col_in_tile = 2 * (lane % 4);  // accumulator columns col_in_tile, +1 (of each 8)
    const int my_row = warp_in_wg * 16 + row_in_warp;  // within the warpgroup's 64 rows
    const uint32_t base = smem_addr(smem);
    const uint32_t k_rows = base + T::kOffK + wg * 64 * 128;  // this warpgroup's keys in K's first panel
    const uint32_t v_rows = base + T::kOffV + wg * 64 * 128;
    // kSoftcap: scores are t = tanh(x * scale / softcap) in units of softcap (as the forward's).
    // kSoftcap: scale_log2 is softcap * log2(e), and scores become tanh(x * maps.softcap_in).
    const float scale_log2 = kSoftcap ? maps.softcap_log2 : f.scale * kLog2e;

    zero_dq_padding<T>(smem);

    // D=64 (kIssueAhead): the next step's S^T and dP^T go out right behind this step's dQ GEMM,
    // so that the tensor cores have work while the consumers stage dQ and start the next step
    // (their registers are free once P^T and dS^T are packed; at D=128, dK, dV and dQ leave no
    // room for them).
    constexpr bool kIssueAhead = kHeadDim == 64;
    // D=64 (kKeysInRegisters): K and V of the tile as the A fragments of S^T and dP^T. Read from
    // shared memory, the two score GEMMs' A operands were about a sixth of the step's shared-memory
    // traffic; at D=128 the registers are taken.
    constexpr bool kKeysInRegisters = kHeadDim == 64;
    // dK and dV leave through shared memory (store_dk_dv), but at D=128 in the band and packed
    // variants, which spilled so (store_dk_dv_direct).
    constexpr bool kStagedEpilogue = !(kHeadDim == 128 && (kBand || kVarlen));
    uint32_t k_frag[kHeadDim / 16][4], v_frag[kHeadDim / 16][4];
    // S^T and dP^T of a step: into s and dp, once its stage has landed.
    float s[32], dp[32];
    // (kIssueAhead: waits for the step's stage first; otherwise compute_step has.)
    auto issue_step_scores = [&](int step_index) {
        if constexpr (kIssueAhead) wait_step<T>(bars, step_index);
        issue_scores_of_step<T, Elem, kIssueAhead, kKeysInRegisters>(step_index, s, dp, k_frag, v_frag, k_rows, v_rows, base);
    };

    int step_all = 0, kv_round = 0;  // steps and K/V loads of every tile so far: the barriers' phases
    for (int n = 0;; ++n) {
        const Tile tile = read_tile(bars, n);
        if (tile.batch < 0) break;
        const int n_start = tile.n_start;
        const int first_key = n_start + wg * 64 + my_row;  // this thread's keys: first_key, +8
        // kVarlen: the tile's sequence (rows counted from its first; its lengths bound the masks).
        int seq_q = 0, seq_k = seqlen_k, key_row0 = 0;
        if constexpr (kVarlen) {
            const sm90::VarlenBlock &e = listed_block(p.workspace, tile.batch);
            seq_q = e.sq, seq_k = e.sk, key_row0 = e.k0;
        }

        float dk[kHeadDim / 2], dv[kHeadDim / 2];
#pragma unroll
        for (int i = 0; i < kHeadDim / 2; ++i) dk[i] = dv[i] = 0.f;

        if (tile.steps.count > 0) {
            wait_barrier(&bars.kv_full, kv_round & 1);
            if constexpr (kKeysInRegisters) {
                load_key_frags<kHeadDim>(k_frag, k_rows, warp_in_wg, lane);
                load_key_frags<kHeadDim>(v_frag, v_rows, warp_in_wg, lane);
            }
        }
        // The tile's steps, with and without masking (run_tile_steps: causal, a band, packed
        // rows and masked calls keep the masked one; masked calls' registers are tight).
        auto run_steps = [&](auto maybe_masked) {
            constexpr bool kMaybeMasked = decltype(maybe_masked)::value;
            // One step; `ahead` (std::true_type) issues the next step's score GEMMs before staging dQ.
            auto run_step = [&](int step, auto ahead) {
                compute_step<T, Elem, kCausal, kMask, kBand, kSoftcap, kVarlen, decltype(ahead)::value, kMaybeMasked>(
                    bars, smem, maps, f, tile, step, step_all, s, dp, dk, dv, issue_step_scores, base, scale_log2, first_key,
                    wg, my_row, col_in_tile, lane, seq_k, seq_q);
            };
            // kIssueAhead: every step but the last issues the next one's scores, and the last runs
            // outside the loop, so that on every path into a step its two score GEMMs are in flight
            // (with a condition inside one loop, ptxas serialized every wgmma of the kernel).
            if constexpr (kIssueAhead) {
                if (tile.steps.count > 0) {
                    issue_step_scores(step_all);
                    for (int step = 0; step < tile.steps.count - 1; ++step, ++step_all) run_step(step, std::true_type());
                    run_step(tile.steps.count - 1, std::false_type());
                    ++step_all;
                }
            } else {
                for (int step = 0; step < tile.steps.count; ++step, ++step_all) run_step(step, std::false_type());
            }
        };
        run_tile_steps<T::kBlockN, kCausal || kBand || kVarlen || kMask != kMaskNone>(bars, tile, seq_k, kv_round, run_steps);

        // ---- epilogue ----
        if constexpr (kStagedEpilogue) {
            store_dk_dv<T, Elem>(bars, p, tile, kVarlen ? 0 : tile.batch, key_row0, base, wg, my_row, col_in_tile, seq_k,
                                 step_all, dk, dv);
        } else {
            store_dk_dv_direct<Elem, kHeadDim>(p, tile, kVarlen ? 0 : tile.batch, key_row0, first_key, col_in_tile, seq_k, dk,
                                               dv);
        }
    }
}

}  // namespace sm90_bwd
}  // namespace flashcore
