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
// How (one CTA = one producer warpgroup and two consumer warpgroups of 64 keys each):
//   * The producer's first thread loads K and V once (TMA), then streams the (query head, query
//     tile) steps of kBlockM = 64 rows: Q, dO (TMA, 128-byte swizzled) and the tile's LSE2 and
//     delta (bulk copies) into a kStages ring, each stage completing on an mbarrier ("full") and
//     released by the consumers' warps ("empty").
//   * Each consumer warpgroup computes S^T and dP^T for its 64 keys with both operands in shared
//     memory (K-major), P^T and dS^T in fp32 registers, then dV and dK with P^T and dS^T straight
//     from registers (the accumulator layout of S^T is the A-fragment layout) against Q and dO
//     read N-major (no transpose pass).
//   * dQ needs dS = (dS^T)^T as an A operand: each warpgroup writes its dS^T rows to shared
//     memory in the 128-byte-swizzled layout wgmma reads M-major (transposed A), and dQ for the
//     tile comes from one more GEMM against K (read N-major). The warpgroups split dQ's columns
//     (each reads both warpgroups' dS^T: a barrier of the two). Two dS^T buffers, so a step may
//     write one while the previous step's GEMM reads the other.
//   * The tile's dQ goes to an fp32 staging tile in shared memory, and the second warp of the
//     producer warpgroup adds it to the fp32 accumulator in global memory with one bulk
//     reduction (cp.reduce.async.bulk .add.f32): dQ sums over key blocks in whatever order they
//     finish, so its last bits may vary from run to run.
//   * GQA: the group's query heads are steps of the same CTA, so dK and dV are summed in
//     registers, in a fixed order. Causal (top-left): steps start at the first query tile that
//     sees the block's first key; scores are masked only in tiles that cross the diagonal and
//     in the ragged last key block.
//   * Rows past Sq are zero-filled by TMA and have LSE2 = +inf (P = 0); keys past Sk are
//     zero-filled and masked.
#pragma once

#include "common/sm80_ptx.cuh"  // pack2, smem_addr, fast_exp2
#include "common/wgmma_generated.cuh"
#include "dispatch.h"
#include "flashcore.h"
#include "sm90/bwd_rows.cuh"
#include "sm90/ptx.cuh"

#include <cuda.h>
#include <cuda_runtime.h>
#include <math.h>

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

template <int kHeadDim>
struct BwdTraits {
    static constexpr int kBlockN = FC_SM90_BWD_KEY_BLOCK;  // keys per CTA
    static constexpr int kBlockM = FC_SM90_BWD_ROW_BLOCK;  // query rows per step
    static constexpr int kStages = 2;
    static constexpr int kConsumers = 2;  // warpgroups of 64 keys
    static constexpr int kThreads = 128 * (kConsumers + 1);
    static constexpr int kPanels = kHeadDim / 64;  // 64-column (128-byte) panels per row
    static constexpr int kKVPanelBytes = kBlockN * 128;
    static constexpr int kKVBytes = kPanels * kKVPanelBytes;
    static constexpr int kQPanelBytes = kBlockM * 128;
    static constexpr int kQBytes = kPanels * kQPanelBytes;
    static constexpr int kRowTermBytes = kBlockM * 4;  // LSE2 or delta of one step
    // dQ = dS K per step: the warpgroups split its columns (each reads all 128 keys of dS).
    static constexpr int kDqCols = kHeadDim / 2;
    // dS^T of the CTA's 128 keys x 64 queries: one 128-byte panel of 128 rows. Two buffers: a
    // step writes one while the previous step's dQ GEMM may still read the other.
    static constexpr int kDsBytes = kBlockN * kBlockM * 2;
    static constexpr int kDsBufs = 2;
    // Shared memory: K, V, Q ring, dO ring, dS^T buffers, LSE2 ring, delta ring (1024-aligned
    // tiles: the swizzle atom).
    static constexpr int kOffK = 0;
    static constexpr int kOffV = kOffK + kKVBytes;
    static constexpr int kOffQ = kOffV + kKVBytes;
    static constexpr int kOffDo = kOffQ + kStages * kQBytes;
    static constexpr int kOffDs = kOffDo + kStages * kQBytes;
    // dQ staging: one 64 x D fp32 tile, each warpgroup its columns. Rows of kDqStagePitch bytes,
    // 8 words past a multiple of 32, so a warp's float2 stores of 8 rows hit every bank once per
    // half; the accumulator's rows in global memory have the same pitch, so a staged tile is one
    // bulk reduction.
    static constexpr int kDqStagePitch = kDqPitch<kHeadDim> * 4;
    static constexpr int kDqStageBytes = kBlockM * kDqStagePitch;
    static constexpr int kOffDq = kOffDs + kDsBufs * kDsBytes;
    static constexpr int kOffLse = kOffDq + kDqStageBytes;
    static constexpr int kOffDelta = kOffLse + kStages * kRowTermBytes;
    static constexpr int kSmemBytes = kOffDelta + kStages * kRowTermBytes + 1024 /* alignment */;
    static constexpr int kProducerRegs = 24, kConsumerRegs = 240;
    static_assert(kHeadDim == 64 || kHeadDim == 128, "head dims 64 and 128");
    static_assert(kSmemBytes <= 227 * 1024, "must fit Hopper's 227 KB per block");
    static_assert(128 * (kProducerRegs + kConsumers * kConsumerRegs) <= 65536, "register budgets");
};

struct BwdMaps {
    CUtensorMap q, dout, k, v;
    MapOrder q_order, dout_order, k_order, v_order;
    int32_t chunk_pairs;  // the CTA order (see bwd_kernel): (batch, KV head) pairs per chunk
};

struct BwdBarriers {
    uint64_t kv_full;
    uint64_t step_full[2];   // Q, dO, LSE2 and delta of a step have landed
    uint64_t step_empty[2];  // every consumer warp is done with the stage
    uint64_t dq_full;        // every consumer warp has staged its share of a step's dQ
    uint64_t dq_empty;       // the dQ writer's reductions have read the staging
};

// The steps of one CTA: (query head in the group, query tile) pairs, head-major.
struct Steps {
    int m_first, m_count, count;
    __device__ int head_q(int step, int head_kv, int group) const { return head_kv * group + step / m_count; }
    __device__ int m_start(int step, int block_m) const { return (m_first + step % m_count) * block_m; }
};

template <typename Elem, int kHeadDim, bool kCausal>
__global__ void __launch_bounds__(BwdTraits<kHeadDim>::kThreads, 1)
bwd_kernel(const __grid_constant__ BwdMaps maps, const fc_bwd_params p) {
    using T = BwdTraits<kHeadDim>;
    constexpr int kBlockM = T::kBlockM, kBlockN = T::kBlockN, kStages = T::kStages;
    constexpr int kDTiles = kHeadDim / 8;  // 8-column accumulator tiles of dK, dV

    extern __shared__ unsigned char smem_raw[];
    __shared__ BwdBarriers bars;
    unsigned char *smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);

    const fc_params &f = p.fwd;
    const int seqlen_q = static_cast<int>(f.seqlen_q), seqlen_k = static_cast<int>(f.seqlen_k);
    // The CTA order: chunks of maps.chunk_pairs (batch, KV head) pairs, each chunk's CTAs in
    // order of key block, then pair. With one pair per chunk (non-causal) a pair's key blocks run
    // side by side and share its Q and dO tiles in L2; causal chunks hold a few pairs, so that
    // their first key blocks (the most query tiles) start first and the short ones fill the tail.
    const int pairs = static_cast<int>(f.heads_kv * f.batch);
    const int n_blocks = (seqlen_k + kBlockN - 1) / kBlockN;
    const int chunk = static_cast<int>(blockIdx.x) / (maps.chunk_pairs * n_blocks);
    const int in_chunk = static_cast<int>(blockIdx.x) % (maps.chunk_pairs * n_blocks);
    const int chunk_size = min(maps.chunk_pairs, pairs - chunk * maps.chunk_pairs);
    const int pair = chunk * maps.chunk_pairs + in_chunk % chunk_size;
    const int n_start = in_chunk / chunk_size * kBlockN;
    const int head_kv = pair % static_cast<int>(f.heads_kv), batch = pair / static_cast<int>(f.heads_kv);
    const int group = static_cast<int>(f.heads_q / f.heads_kv);
    // Query tiles that see any key of this block: causal, none before row n_start.
    Steps steps;
    steps.m_first = kCausal ? n_start / kBlockM : 0;
    steps.m_count = max(0, (seqlen_q + kBlockM - 1) / kBlockM - steps.m_first);
    steps.count = group * steps.m_count;
    const Workspace ws = workspace_of(p);

    const int warpgroup = __shfl_sync(0xffffffff, static_cast<int>(threadIdx.x) / 128, 0);
    const int lane = threadIdx.x % 32;
    if (threadIdx.x == 0) {
        ptx::mbarrier_init(&bars.kv_full, 1);
        for (int s = 0; s < kStages; ++s) {
            ptx::mbarrier_init(&bars.step_full[s], 1);
            // One arrival per consumer thread: each thread's own reads of the stage's row terms
            // (ordinary loads) come before its release of them (one per warp raced the next
            // bulk copy in compute-sanitizer's racecheck).
            ptx::mbarrier_init(&bars.step_empty[s], 128 * T::kConsumers);
        }
        ptx::mbarrier_init(&bars.dq_full, 4 * T::kConsumers);
        ptx::mbarrier_init(&bars.dq_empty, 1);
        ptx::fence_mbarrier_init(ptx::sem_release, ptx::scope_cluster);
    }
    __syncthreads();

    if (warpgroup == 0) {
        // ---------------- producer: one thread issues every load ----------------
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(T::kProducerRegs));
        if (threadIdx.x == 32) {
            // ---------------- dQ writer: the staged dQ of each step, added to the accumulator ----
            // One bulk reduction (cp.reduce.async.bulk .add.f32) per staged tile: whole lines
            // through L2's reduction units, where per-thread atomics cost the kernel ~40% of its
            // time (bench/NOTES.md). The rows' padding adds zeros.
            for (int step = 0; step < steps.count; ++step) {
                wait_barrier(&bars.dq_full, step & 1);
                const int head_q = steps.head_q(step, head_kv, group), m_start = steps.m_start(step, kBlockM);
                float *rows = ws.dq_accum + ((static_cast<int64_t>(batch) * f.heads_q + head_q) * ws.padded_seqlen +
                                             m_start) * kDqPitch<kHeadDim>;
                asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n"
                             ::"l"(rows), "r"(smem_addr(smem + T::kOffDq)), "n"(T::kDqStageBytes)
                             : "memory");
                asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
                asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");  // the staging is read
                ptx::mbarrier_arrive(&bars.dq_empty);
            }
            asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");  // the reductions are done
            return;
        }
        if (threadIdx.x != 0 || steps.count == 0) return;
        int32_t c[4];
        ptx::mbarrier_arrive_expect_tx(ptx::sem_release, ptx::scope_cta, ptx::space_shared, &bars.kv_full,
                                       2 * T::kKVBytes);
        for (int panel = 0; panel < T::kPanels; ++panel) {
            set_coords(c, maps.k_order, panel * 64, n_start, head_kv, batch);
            tma_load(smem + T::kOffK + panel * T::kKVPanelBytes, &maps.k, c, &bars.kv_full);
            set_coords(c, maps.v_order, panel * 64, n_start, head_kv, batch);
            tma_load(smem + T::kOffV + panel * T::kKVPanelBytes, &maps.v, c, &bars.kv_full);
        }
        for (int step = 0; step < steps.count; ++step) {
            const int stage = step % kStages;
            wait_barrier(&bars.step_empty[stage], ((step / kStages) & 1) ^ 1);  // the first round passes at once
            uint64_t *full = &bars.step_full[stage];
            ptx::mbarrier_arrive_expect_tx(ptx::sem_release, ptx::scope_cta, ptx::space_shared, full,
                                           2 * T::kQBytes + 2 * T::kRowTermBytes);
            const int head_q = steps.head_q(step, head_kv, group), m_start = steps.m_start(step, kBlockM);
            for (int panel = 0; panel < T::kPanels; ++panel) {
                set_coords(c, maps.q_order, panel * 64, m_start, head_q, batch);
                tma_load(smem + T::kOffQ + stage * T::kQBytes + panel * T::kQPanelBytes, &maps.q, c, full);
                set_coords(c, maps.dout_order, panel * 64, m_start, head_q, batch);
                tma_load(smem + T::kOffDo + stage * T::kQBytes + panel * T::kQPanelBytes, &maps.dout, c, full);
            }
            const int64_t row = (static_cast<int64_t>(batch) * f.heads_q + head_q) * ws.padded_seqlen + m_start;
            ptx::cp_async_bulk(ptx::space_cluster, ptx::space_global, smem + T::kOffLse + stage * T::kRowTermBytes,
                               ws.lse2 + row, T::kRowTermBytes, full);
            ptx::cp_async_bulk(ptx::space_cluster, ptx::space_global, smem + T::kOffDelta + stage * T::kRowTermBytes,
                               ws.delta + row, T::kRowTermBytes, full);
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
    const float scale_log2 = f.scale * kLog2e;
    const int first_key = n_start + wg * 64 + my_row;  // this thread's keys: first_key, +8

    // The staging rows' padding goes out with every reduction: zeros (the stores reach the async
    // proxy through each thread's fence before its first dq_full arrival).
    for (int i = threadIdx.x - 128; i < kBlockM * 2; i += 128 * T::kConsumers) {
        const int row = i / 2, half = i % 2;
        *reinterpret_cast<float4 *>(smem + T::kOffDq + row * T::kDqStagePitch + kHeadDim * 4 + half * 16) =
            make_float4(0.f, 0.f, 0.f, 0.f);
    }

    float dk[kHeadDim / 2], dv[kHeadDim / 2];
#pragma unroll
    for (int i = 0; i < kHeadDim / 2; ++i) dk[i] = dv[i] = 0.f;

    // acc (64 rows x 64 queries) = rows of `a_rows` (64 keys, K-major, panels kKVPanelBytes apart)
    // times the step's `b_tile` (64 queries, K-major): S^T = K Q^T and dP^T = V dO^T.
    auto issue_scores = [&](float (&acc)[32], uint32_t a_rows, uint32_t b_tile) {
        const uint64_t desc_a0 = smem_desc(a_rows, 16, 1024), desc_b0 = smem_desc(b_tile, 16, 1024);
#pragma unroll
        for (int kk = 0; kk < kHeadDim / 16; ++kk) {
            const uint32_t offset = (kk % 4) * 32;  // 16 columns = 32 bytes along a 128-byte row
            Wgmma<64, WgmmaA::SS, Elem>::template mma<0>(acc, desc_a0 + ((kk / 4) * T::kKVPanelBytes + offset) / 16,
                                                         desc_b0 + ((kk / 4) * T::kQPanelBytes + offset) / 16, kk > 0);
        }
        wgmma_commit();
    };
    // acc (64 keys x D) += frag (64 keys x 64 queries, registers) times the step's `tile` (64
    // queries x D) read N-major: dV += P^T dO and dK += dS^T Q.
    auto issue_accumulate = [&](float (&acc)[kHeadDim / 2], const uint32_t (&frag)[4][4], uint32_t tile) {
        const uint64_t desc0 = smem_desc(tile, T::kQPanelBytes, 1024);
#pragma unroll
        for (int kk = 0; kk < kBlockM / 16; ++kk)  // 16 queries = two 8-row groups of 1024 bytes
            Wgmma<kHeadDim, WgmmaA::RS, Elem>::template mma<1>(acc, frag[kk], desc0 + kk * 2048 / 16, 1);
        wgmma_commit();
    };
    // The S accumulator layout of two 8-column tiles is the A-fragment layout of one 16-column step.
    auto to_frag = [&](uint32_t (&frag)[4][4], const float (&acc)[32]) {
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
#pragma unroll
            for (int i = 0; i < 4; ++i) frag[kk][i] = pack2<Elem>(acc[8 * kk + 2 * i], acc[8 * kk + 2 * i + 1]);
    };

    if (steps.count > 0) wait_barrier(&bars.kv_full, 0);
    for (int step = 0; step < steps.count; ++step) {
        const int stage = step % kStages;
        const int m_start = steps.m_start(step, kBlockM);
        const uint32_t q_tile = base + T::kOffQ + stage * T::kQBytes;
        const uint32_t do_tile = base + T::kOffDo + stage * T::kQBytes;
        wait_barrier(&bars.step_full[stage], (step / kStages) & 1);

        // ---- S^T = K Q^T and dP^T = V dO^T ----
        float s[32], dp[32];
        fence_registers(s);
        fence_registers(dp);
        wgmma_fence();
        issue_scores(s, k_rows, q_tile);
        issue_scores(dp, v_rows, do_tile);

        // ---- P^T = exp2(S^T scale log2(e) - LSE2[query]), masked where keys pass Sk or the diagonal ----
        wgmma_wait<1>();
        fence_registers(s);
        const float *lse2 = reinterpret_cast<const float *>(smem + T::kOffLse + stage * T::kRowTermBytes);
        const float *delta = reinterpret_cast<const float *>(smem + T::kOffDelta + stage * T::kRowTermBytes);
        const bool masked_tile = n_start + kBlockN > seqlen_k || (kCausal && m_start < n_start + kBlockN);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const float2 l = *reinterpret_cast<const float2 *>(lse2 + 8 * j + col_in_tile);
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                float x = fmaf(s[4 * j + e], scale_log2, -((e & 1) ? l.y : l.x));
                if (masked_tile) {
                    const int key = first_key + 8 * (e >> 1), query = m_start + 8 * j + col_in_tile + (e & 1);
                    if (key >= seqlen_k || (kCausal && key > query)) x = -INFINITY;
                }
                s[4 * j + e] = fast_exp2(x);
            }
        }
        uint32_t p_frag[4][4];
        to_frag(p_frag, s);

        // ---- dV += P^T dO ----
        wgmma_wait<0>();
        fence_registers(dp);
        fence_registers(dv);
        wgmma_fence();
        issue_accumulate(dv, p_frag, do_tile);

        // ---- dS^T = P^T (dP^T - delta[query]);  dK += dS^T Q ----
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const float2 d = *reinterpret_cast<const float2 *>(delta + 8 * j + col_in_tile);
#pragma unroll
            for (int e = 0; e < 4; ++e) dp[4 * j + e] = s[4 * j + e] * (dp[4 * j + e] - ((e & 1) ? d.y : d.x));
        }
        uint32_t ds_frag[4][4];
        to_frag(ds_frag, dp);
        fence_registers(dk);
        wgmma_fence();
        issue_accumulate(dk, ds_frag, q_tile);

        // ---- dS^T to shared memory (rows: this warpgroup's keys; 128-byte swizzle) ----
        const uint32_t ds_tile = base + T::kOffDs + (step & 1) * T::kDsBytes;
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int row = wg * 64 + my_row + 8 * (i & 1), chunk = 2 * kk + (i >> 1);
                const uint32_t addr = ds_tile + row * 128 + ((chunk ^ (row & 7)) << 4) + 4 * (lane % 4);
                asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(ds_frag[kk][i]) : "memory");
            }
        ptx::fence_proxy_async(ptx::space_shared);  // the stores, visible to wgmma
        asm volatile("bar.sync 1, 256;\n" ::: "memory");  // both warpgroups' dS^T rows are in

        // ---- dQ (64 queries x kDqCols) = dS K: dS read M-major from dS^T, K read N-major ----
        float dq[T::kDqCols / 2];
        {
            // This warpgroup's columns of K: a panel of their own (D=128), or the second half of
            // the panel's 128-byte rows (D=64: the descriptor starts 64 bytes in; the swizzle is
            // a function of the address, as TMA wrote it).
            const int first_col = wg * T::kDqCols;
            const uint32_t k_b = base + T::kOffK + first_col / 64 * T::kKVPanelBytes + first_col % 64 * 2;
            const uint64_t desc_a0 = smem_desc(ds_tile, T::kDsBytes, 1024), desc_b0 = smem_desc(k_b, T::kKVPanelBytes, 1024);
            fence_registers(dq);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < kBlockN / 16; ++kk)
                Wgmma<T::kDqCols, WgmmaA::SS, Elem>::template mma<1, 1>(dq, desc_a0 + kk * 2048 / 16,
                                                                       desc_b0 + kk * 2048 / 16, kk > 0);
            wgmma_commit();
        }
        wgmma_wait<0>();
        fence_registers(dq);
        fence_registers(dk);
        fence_registers(dv);
        ptx::mbarrier_arrive(&bars.step_empty[stage]);  // Q, dO and the row terms are read

        // ---- dQ to the staging, for the dQ writer ----
        wait_barrier(&bars.dq_empty, (step & 1) ^ 1);  // the previous step's reductions have read it
        const uint32_t dq_stage = base + T::kOffDq + wg * T::kDqCols * 4 + col_in_tile * 4;
#pragma unroll
        for (int j = 0; j < T::kDqCols / 8; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h)
                asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(dq_stage + (my_row + 8 * h) * T::kDqStagePitch + 32 * j),
                             "f"(dq[4 * j + 2 * h]), "f"(dq[4 * j + 2 * h + 1])
                             : "memory");
        ptx::fence_proxy_async(ptx::space_shared);  // the stores, visible to the bulk reductions
        __syncwarp();
        if (lane == 0) ptx::mbarrier_arrive(&bars.dq_full);
    }

    // ---- epilogue: dK * scale and dV, from registers (keys past Sk are not written) ----
    const fc_bwd_params &b = p;
    Elem *dk_out = static_cast<Elem *>(b.dk) + batch * b.dk_stride_b + head_kv * b.dk_stride_h;
    Elem *dv_out = static_cast<Elem *>(b.dv) + batch * b.dv_stride_b + head_kv * b.dv_stride_h;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int key = first_key + 8 * h;
        if (key >= seqlen_k) continue;
        Elem *dk_row = dk_out + static_cast<int64_t>(key) * b.dk_stride_s + col_in_tile;
        Elem *dv_row = dv_out + static_cast<int64_t>(key) * b.dv_stride_s + col_in_tile;
#pragma unroll
        for (int j = 0; j < kDTiles; ++j) {
            *reinterpret_cast<uint32_t *>(dk_row + 8 * j) =
                pack2<Elem>(dk[4 * j + 2 * h] * f.scale, dk[4 * j + 2 * h + 1] * f.scale);
            *reinterpret_cast<uint32_t *>(dv_row + 8 * j) = pack2<Elem>(dv[4 * j + 2 * h], dv[4 * j + 2 * h + 1]);
        }
    }
}

}  // namespace sm90_bwd
}  // namespace flashcore
