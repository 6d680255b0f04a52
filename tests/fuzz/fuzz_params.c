/*
 * fuzz_params.c - libFuzzer target for FlashCore's C layer: fc_params_validate, fc_sdpa_support,
 * fc_sdpa_family, fc_sdpa_fwd (up to the launch) and fc_status_string; and the backward's
 * (c_src/bwd.c): fc_bwd_params_validate, fc_sdpa_bwd_support, fc_sdpa_bwd_family,
 * fc_sdpa_bwd_workspace_size and fc_sdpa_bwd (up to the launch; see check_bwd below).
 *
 * What it asserts, for every input:
 *   * nothing crashes, reads out of bounds or hits undefined behaviour (built with
 *     -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all; the params struct lives in a
 *     heap block of exactly sizeof(fc_params), so any read past it is an ASan report);
 *   * validation is a pure function: it does not modify the struct, and fc_sdpa_support,
 *     fc_sdpa_family and fc_sdpa_fwd agree with it and with each other on every device;
 *   * every struct that validation ACCEPTS is internally consistent, re-derived here
 *     independently in 128-bit arithmetic (accepted_is_consistent): sizes >= 1, heads divisible,
 *     pointers 16-byte aligned, strides non-negative / unit last dim / 16-byte multiples, the
 *     largest offset inside one (batch, head) slice fits the kernels' 32-bit index, the largest
 *     offset of every tensor fits int64, the grid fits CUDA's limits;
 *   * every struct the support query accepts has a kernel (dtype, head dim, arch, a mask in the
 *     sm80 family, in the decode family without causal, or in sm90 only as sm90_takes_mask
 *     states it: a bool mask whose tiles TMA can bring, at D=64 / 128 / 256, without causal, band,
 *     softcap or sinks; a general band (window,
 *     bottom-right causal) only in the sm90 and decode families, without a mask; sinks only in
 *     sm90; a softcap only in sm90 without a mask or in sm80; the family's own layout rules),
 *     AUTO prefers the decode kernel, then the sm90 family, where they can take the struct (a
 *     masked call: decode where it takes the call, else sm90 where it takes the mask, else sm80), a masked call that the sm90 family
 *     takes is never declined on sm_90 (AUTO or forced sm90; check_mask_rule walks a grid of
 *     masked calls once per run, as the fuzzer seldom builds a mask the sm90 family takes), and
 *     AUTO on sm_90 declines a masked call as FC_UNSUPPORTED_SLOWER_MASK exactly where
 *     auto_leaves_mask_to_sdpa says so (no LSE wanted, a mask only the sm80 family would run:
 *     an additive one, at D=64 / 128 / 256 any, else one broadcast over the query rows or one query
 *     row; no causal, band, softcap or
 *     sinks), never for a forced family or a call that wants the LSE, and
 *     fc_sdpa_fwd calls exactly that kernel's launcher with the caller's struct (as the library
 *     resolves its band, fc_resolve_band_); the launcher
 *     stubs re-check what that family's kernel computes in int (tile counts, block bounds);
 *   * paged KV calls (fc_params.block_table): validation accepts only consistent page fields
 *     (page_size a positive multiple of 16, pages_per_seq * page_size >= seqlen_k, num_pages in
 *     [1, 2^31 - 1], the table's stride and extent, K/V as (num_pages, Hkv, page_size, D) pools,
 *     all page fields zero without a table); only the decode family runs them (decode-shaped, no
 *     causal, band or mask), AUTO never moves them to the Hopper family, a slice past 65535
 *     batches moves the table and seqused_k (not K/V), the backward declines them
 *     (FC_UNSUPPORTED_PAGED), and a paged call the decode kernels take runs there;
 *   * packed variable-length calls (fc_params.cu_seq_q): validation accepts only consistent
 *     packed fields (both offset arrays, aligned and addressable, totals >= 1, no batch stride,
 *     q / out / the LSE as one item of total_q rows and K / V of total_k; a window or
 *     bottom-right causal is FC_UNSUPPORTED_VARLEN); only the sm90 forward runs them, never
 *     split or sliced, the plan sizing the list of query blocks (fc_varlen_workspace_bytes), and
 *     fc_sdpa_fwd gives FC_ERR_BAD_WORKSPACE without it; a packed call the sm90 family takes runs
 *     there on sm_90; the backward runs them in the sm90 family alone (no mask, softcap, band
 *     or sinks, not under `deterministic` with AUTO, the key-block list's tiles in an int), with
 *     the gradients along the packed rows (no batch stride, else FC_ERR_BAD_VARLEN) and its own
 *     workspace (fc_sm90_bwd_varlen_workspace_bytes, the size query's whole answer: no
 *     sm80-class term); every other one is FC_UNSUPPORTED_VARLEN, a forced family's earlier
 *     reason aside (bwd_packed_status; check_bwd_packed_rule walks a grid of packed backward
 *     calls once per run, the key-block list's int bound included, its answers as literals);
 *   * the canonical layout (fc_params_set_contiguous_strides on sane sizes) is never rejected
 *     for a layout reason (no false rejections);
 *   * backward inputs (an fc_bwd_params, itself in a heap block of exactly its size): the same
 *     for fc_bwd_params_validate (pure, forward checks first, what it accepts re-derived for
 *     dout/dq/dk/dv/dlse/workspace), the support query and family against an independent model
 *     of the choice (AUTO: sm90 where it runs the call and determinism is not asked for, else
 *     sm80-class; a softcap in sm90 without a mask, in sm80 with or without one; sm90 at
 *     D=256 only without packed rows (masks, a band and a softcap taken, not an additive mask
 *     with a softcap); a forced
 *     family or an FC_UNSUPPORTED_* reason that holds), the workspace size
 *     (>= each family's need, per docs/USAGE.md / dispatch.h), and fc_sdpa_bwd on sm_89 and sm_90:
 *     FC_ERR_BAD_WORKSPACE and no launch below the chosen family's need, else exactly that
 *     family's kernel with the caller's struct (check_bwd, check_bwd_launch).
 *
 * Built from c_src/flashcore.c + c_src/dispatch.c + c_src/bwd.c only (no CUDA code, no GPU):
 * this file provides the CUDA runtime calls flashcore.c makes (cudaGetDevice,
 * cudaDeviceGetAttribute: device d reports the compute capability kDeviceCC[d % N]; fc_sdpa_fwd
 * and fc_sdpa_bwd ask through fc_device_facts_) and the launchers dispatch.c and bwd.c name
 * (forward: sm80, sm90, decode; backward: every line of kernel_list.h: they check the
 * struct and the device facts they are handed, record the call and return cudaSuccess without
 * touching memory). ci/fuzz.sh defines
 * the FC_HAVE_* / FC_BUILT_* macros of the default CMake build (cmake/kernel_list.cmake's, with
 * the kernel list), so no hook in c_src is needed;
 * the backward's expectations follow the kernel list's backward lines (kBwdBuilt).
 * Build and run: bash ci/fuzz.sh (400000 inputs from a fixed seed; FUZZ_SEED=0 FUZZ_SECONDS=n
 * for a random seed and n seconds).
 *
 * FC_FUZZ_STRICT=1 (FUZZ_STRICT=1 bash ci/fuzz.sh) also asserts the properties the C layer does
 * not guarantee yet (reported in issue 8; tests/fuzz/make_seeds.py writes a reproducer for each,
 * known_bug_*, which FUZZ_STRICT=1 bash ci/fuzz.sh runs first):
 *   A. seqlen_k + kBlockN - 1 and seqlen_q + kBlockM - 1 must fit in int32: the sm80 kernel
 *      computes n_blocks = (seqlen_k + 63) / 64, key columns n_start + j and m_start + 64 in
 *      int, so an accepted seqlen_k (or seqlen_q) in [2^31 - 63, 2^31 - 1] overflows. Reachable
 *      with K/V broadcast along the sequence (stride 0), which the sm90 family declines, so
 *      H100 runs the sm80 family on it too.
 *   C. fc_params_set_contiguous_strides multiplies sizes without overflow checks (UB).
 *      Non-strict runs only call it when heads * seqlen * head_dim fits int64.
 *   D. offsets are checked in elements, not bytes: an accepted struct may describe a last
 *      element whose address (pointer + offset * element size) wraps past 2^64, and the sm90
 *      launcher computes stride * 2 in int64 (UB past 2^62 elements).
 *   E. the sm90 launcher builds TMA tensor maps, whose strides must be below 2^40 bytes; an
 *      accepted struct with a larger batch or head stride fails at launch (FC_ERR_CUDA from
 *      cuTensorMapEncodeTiled) instead of being declined by the support query. Holds for q, k
 *      and v (dispatch.c, tma_stride_ok) and, since 2026-11-27, for the bool mask's map
 *      (fc_mask_tiles_fit_ bounds its stepped-over strides; check_mask_rule's kMaskStrides2to40
 *      keeps it so). Open: a size-1 dim's map stride is the slice's whole extent
 *      (kernels/sm90/tensor_map.h), which can pass 2^40 bytes when the other strides do not.
 *   G. (fixed 2026-11-27) fc_bwd_params_validate's dlse check (c_src/bwd.c, check_rows_operand)
 *      counted the elements as total + 1 without an overflow check: UB when dlse's largest
 *      element offset is exactly INT64_MAX (e.g. B = 2, dlse_stride_b = INT64_MAX).
 */
#include "flashcore.h"
/* fc_decode_splits, fc_prefill_splits, fc_pack_decode_gqa...: c_src/dispatch.h (internal; this
 * target is built from c_src's sources). */
#include "dispatch.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <stddef.h>
#include <string.h>

#ifndef FC_FUZZ_STRICT
#define FC_FUZZ_STRICT 0
#endif

typedef __int128 i128;

#define REQUIRE(cond)                                                                        \
    do {                                                                                     \
        if (!(cond)) {                                                                       \
            fprintf(stderr, "fuzz_params: property violated at %s:%d: %s\n", __FILE__,      \
                    __LINE__, #cond);                                                        \
            dump_params(g_current);                                                          \
            dump_bwd_params(g_current_bwd);                                                  \
            abort();                                                                         \
        }                                                                                    \
    } while (0)

static const fc_params *g_current; /* the struct under test, for the failure dump */
static const fc_bwd_params *g_current_bwd; /* the backward struct under test (its fwd: g_current) */
static void dump_bwd_params(const fc_bwd_params *b);

static void dump_params(const fc_params *p) {
    if (p == NULL) return;
    fprintf(stderr,
            "  q=%p k=%p v=%p out=%p lse=%p mask=%p\n"
            "  B=%lld Hq=%lld Hkv=%lld Sq=%lld Sk=%lld D=%lld\n"
            "  q strides %lld %lld %lld %lld | k %lld %lld %lld %lld | v %lld %lld %lld %lld"
            " | o %lld %lld %lld %lld\n"
            "  lse strides %lld %lld %lld | mask strides %lld %lld %lld %lld\n"
            "  scale=%g causal=%d dtype=%d mask_kind=%d family=%d\n",
            p->q, p->k, p->v, p->out, (void *)p->lse, p->mask, (long long)p->batch,
            (long long)p->heads_q, (long long)p->heads_kv, (long long)p->seqlen_q,
            (long long)p->seqlen_k, (long long)p->head_dim, (long long)p->q_stride_b,
            (long long)p->q_stride_h, (long long)p->q_stride_s, (long long)p->q_stride_d,
            (long long)p->k_stride_b, (long long)p->k_stride_h, (long long)p->k_stride_s,
            (long long)p->k_stride_d, (long long)p->v_stride_b, (long long)p->v_stride_h,
            (long long)p->v_stride_s, (long long)p->v_stride_d, (long long)p->o_stride_b,
            (long long)p->o_stride_h, (long long)p->o_stride_s, (long long)p->o_stride_d,
            (long long)p->lse_stride_b, (long long)p->lse_stride_h, (long long)p->lse_stride_s,
            (long long)p->mask_stride_b, (long long)p->mask_stride_h, (long long)p->mask_stride_q,
            (long long)p->mask_stride_k, (double)p->scale, p->causal, (int)p->dtype,
            (int)p->mask_kind, (int)p->family);
}

static void dump_bwd_params(const fc_bwd_params *b) {
    if (b == NULL) return;
    fprintf(stderr,
            "  bwd: dout=%p dq=%p dk=%p dv=%p dlse=%p workspace=%p workspace_bytes=%lld"
            " deterministic=%d\n"
            "  do strides %lld %lld %lld %lld | dq %lld %lld %lld %lld | dk %lld %lld %lld %lld"
            " | dv %lld %lld %lld %lld | dlse %lld %lld %lld\n",
            b->dout, b->dq, b->dk, b->dv, (const void *)b->dlse, b->workspace,
            (long long)b->workspace_bytes, b->deterministic, (long long)b->do_stride_b,
            (long long)b->do_stride_h, (long long)b->do_stride_s, (long long)b->do_stride_d,
            (long long)b->dq_stride_b, (long long)b->dq_stride_h, (long long)b->dq_stride_s,
            (long long)b->dq_stride_d, (long long)b->dk_stride_b, (long long)b->dk_stride_h,
            (long long)b->dk_stride_s, (long long)b->dk_stride_d, (long long)b->dv_stride_b,
            (long long)b->dv_stride_h, (long long)b->dv_stride_s, (long long)b->dv_stride_d,
            (long long)b->dlse_stride_b, (long long)b->dlse_stride_h, (long long)b->dlse_stride_s);
}

/* ---- stand-ins for the CUDA runtime and the kernel launchers ------------------------------- */

/* Device d has compute capability kDeviceCC[d % 8] (major * 10 + minor). flashcore.c caches the
 * capability per device, so the mapping must never change during a run. */
static const int kDeviceCC[8] = {89, 90, 80, 86, 75, 100, 120, 87};
static int g_device;

cudaError_t cudaGetDevice(int *device) {
    *device = g_device;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device) {
    const int cc = kDeviceCC[(unsigned)device % 8u];
    if (attr == cudaDevAttrComputeCapabilityMajor) *value = cc / 10;
    else if (attr == cudaDevAttrComputeCapabilityMinor) *value = cc % 10;
    else if (attr == cudaDevAttrMultiProcessorCount) *value = 132;
    else return cudaErrorInvalidValue;
    return cudaSuccess;
}

static const fc_params *g_expected_launch; /* the struct fc_sdpa_fwd was given */
static int g_launches;

/* Every launcher is handed the current device as the stand-ins above describe it. */
static void check_device_facts(const fc_device_facts *dev) {
    REQUIRE(dev != NULL);
    REQUIRE(dev->device == g_device);
    REQUIRE(dev->major * 10 + dev->minor == kDeviceCC[(unsigned)g_device % 8u]);
    REQUIRE(dev->sms == 132);
}

static void accepted_is_consistent(const fc_params *p);

/* Tile shapes of each family (kernels/fwd_sm80.cuh, kernels/sm90/fwd_traits.cuh FwdTraits). */
static void tile_shape(fc_family family, int head_dim, int causal, int *block_m, int *block_n) {
    if (family == FC_FAMILY_SM80) {
        /* 128 x 64 (D=32 and D=64: 128 x 128; D=96: 128 x 32; D=256: 64 x 32), narrow variants
         * D=64 128 x 64 and D=128 128 x 32, masked 64 x 64 (D=256: 64 x 32; D=64 / 80 / 96 on
         * Hopper: 128 x 64, D=128 there: 128 x 32): the larger of each bounds both */
        *block_m = 128;
        *block_n = head_dim == 32 || head_dim == 64 ? 128 : 64;
    } else if (family == FC_FAMILY_DECODE) {
        *block_m = 16; /* all of Sq in one CTA; keys in chunks of 32 */
        *block_n = 32;
    } else if (head_dim == 256) {
        *block_m = 128;
        *block_n = 80;
    } else if (head_dim == 64) {
        /* (a bool mask, kMasked: D=64 and D=128 128 x 128, which these bound) */
        *block_m = 192;
        *block_n = 128;
    } else {
        *block_m = 128;
        *block_n = causal ? 128 : 176;
    }
}

static int sm90_takes(const fc_params *p);
static int sm90_takes_mask(const fc_params *p);
static int decode_takes(const fc_params *p);
static i128 elem_bytes(fc_dtype dtype);

/* The struct as the library sees it once it has resolved the band (dispatch.h,
 * fc_resolve_band_): causal as the kernels run it, band_ saying whether the band is general
 * (a window, or causal aligned bottom-right with Sq != Sk). Idempotent. */
static fc_params resolved_of(const fc_params *p) {
    fc_params r = *p;
    fc_resolve_band_(&r);
    return r;
}

/* fc_decode_packs_for_sm90 by its first rule: the packed copy validated whole (as a caller's
 * struct) and taken by the Hopper family's layout rule. The library re-checks only what packing
 * changes (fc_packed_rows_valid_, so that a call validates once); the two agree on every
 * validated struct (check_struct, check_decode_packing). */
static int packs_by_validation(const fc_params *r) {
    if (r->seqlen_q != 1 || r->causal || r->heads_q <= r->heads_kv || r->sinks != NULL || r->mask_kind != FC_MASK_NONE ||
        r->block_table != NULL || r->cu_seq_q != NULL)
        return 0;
    fc_params packed = *r;
    if (!fc_pack_decode_gqa(&packed)) return 0;  /* (a head stride x the group passes int64) */
    packed.band_ = packed.band_lo_ = packed.band_hi_ = 0;
    return fc_params_validate(&packed) == FC_OK && sm90_takes(&packed);
}

static void check_launch(const fc_params *p, fc_family family, int head_dim, fc_dtype dtype) {
    /* The caller's struct, copied with only the library's internal split count filled in; or,
     * past CUDA's 65535 grid limit on batch or query heads, one slice of it: the same struct
     * but for the slice's sizes and pointers, which lie at or after the caller's. */
    const fc_params *e = g_expected_launch;
    REQUIRE(e != NULL); /* only fc_sdpa_fwd launches a forward kernel (not fc_sdpa_bwd) */
    /* The library launches its resolved copy: a band that is every key or plain top-left causal
     * as exactly that (causal 0 or 1), anything else with causal set (dispatch.h). */
    fc_params resolved = *e;
    fc_resolve_band_(&resolved);
    e = &resolved;
    /* A one-row GQA call in the Hopper family launches as its packed equivalent. */
    fc_params packed;
    if (family == FC_FAMILY_SM90 && fc_decode_packs_for_sm90(e)) {
        packed = *e;
        REQUIRE(fc_pack_decode_gqa(&packed));
        e = &packed;
    }
    if (e->cu_seq_q != NULL || (e->batch <= 65535 && e->heads_q <= 65535)) {  /* (packed: one 1-D grid) */
        REQUIRE(memcmp(p, e, offsetof(fc_params, num_splits_)) == 0);
        REQUIRE(p->cu_seq_q == e->cu_seq_q && p->cu_seq_k == e->cu_seq_k && p->total_q == e->total_q &&
                p->total_k == e->total_k);
        REQUIRE(p->block_table == e->block_table && p->seqused_k == e->seqused_k);
    } else {
        fc_params same = *p;
        same.batch = e->batch;
        same.heads_q = e->heads_q;
        same.heads_kv = e->heads_kv;
        same.q = e->q, same.k = e->k, same.v = e->v, same.out = e->out;
        same.lse = e->lse, same.mask = e->mask;
        REQUIRE(memcmp(&same, e, offsetof(fc_params, num_splits_)) == 0);
        REQUIRE(p->batch >= 1 && p->batch <= e->batch && p->heads_q >= 1 && p->heads_q <= e->heads_q);
        /* whole GQA groups, or a piece of one group past 65535 (one key/value head) */
        REQUIRE(p->heads_q * e->heads_kv == p->heads_kv * e->heads_q ||
                (p->heads_kv == 1 && e->heads_q / e->heads_kv > 65535));
        REQUIRE((const char *)p->q >= (const char *)e->q && (const char *)p->k >= (const char *)e->k);
        REQUIRE((const char *)p->v >= (const char *)e->v && (char *)p->out >= (char *)e->out);
        /* Paged: the pools are every batch item's (K/V move by KV heads only); the slice's items
         * are table rows and seqused_k entries b0.. of the caller's. */
        REQUIRE((p->block_table == NULL) == (e->block_table == NULL) && (p->seqused_k == NULL) == (e->seqused_k == NULL));
        if (e->block_table != NULL) {
            const i128 elem = elem_bytes(e->dtype);
            const i128 dk = (i128)((const char *)p->k - (const char *)e->k), dv = (i128)((const char *)p->v - (const char *)e->v);
            REQUIRE(e->k_stride_h == 0 || dk % (e->k_stride_h * elem) == 0);
            REQUIRE(dk <= ((i128)e->heads_kv - 1) * e->k_stride_h * elem && dv <= ((i128)e->heads_kv - 1) * e->v_stride_h * elem);
            const i128 rows = (i128)(p->block_table - e->block_table);
            REQUIRE(rows >= 0 && rows <= ((i128)e->batch - 1) * e->block_table_stride);
            if (e->seqused_k != NULL) {
                const i128 b0 = (i128)(p->seqused_k - e->seqused_k);
                REQUIRE(b0 >= 0 && b0 + p->batch <= e->batch && rows == b0 * e->block_table_stride);
            }
        }
    }
    REQUIRE(p->pages_per_seq == e->pages_per_seq && p->page_size == e->page_size && p->num_pages == e->num_pages &&
            p->block_table_stride == e->block_table_stride);
    /* Only the decode kernels read pages, in their plain configuration. */
    if (p->block_table != NULL) REQUIRE(family == FC_FAMILY_DECODE && !p->causal && p->mask_kind == FC_MASK_NONE);
    REQUIRE(p->num_splits_ >= 1 && p->num_splits_ <= 64);
    /* Packed: the sm90 forward, unsplit, with the workspace its list needs. */
    if (p->cu_seq_q != NULL)
        REQUIRE(family == FC_FAMILY_SM90 && p->num_splits_ == 1 && p->workspace != NULL &&
                p->workspace_bytes >= fc_varlen_workspace_bytes(p) && p->mask_kind == FC_MASK_NONE);
    if (p->num_splits_ > 1) REQUIRE((family == FC_FAMILY_DECODE || family == FC_FAMILY_SM90) && p->workspace != NULL);
    /* Split-KV promises (c_src/dispatch.c): one wave of 132 SMs x 3 CTAs at most, and every key
     * range at least 2 chunks of 32 keys; the Hopper family's grid split (one-row D=128 calls
     * over fewer than 64 pairs, launched packed: one block per pair) one CTA per SM and ranges of
     * at least 512 keys. */
    if (p->num_splits_ > 1 && family == FC_FAMILY_DECODE) {
        REQUIRE(p->batch * p->heads_kv * p->num_splits_ <= 3 * 132);
        REQUIRE(p->num_splits_ * 2 <= (p->seqlen_k + 31) / 32);
    }
    if (p->num_splits_ > 1 && family == FC_FAMILY_SM90) {
        REQUIRE(head_dim == 128 && !p->causal && p->mask_kind == FC_MASK_NONE && p->heads_q == p->heads_kv);
        REQUIRE(p->seqlen_q == g_expected_launch->heads_q / g_expected_launch->heads_kv && p->batch * p->heads_kv < 64);
        REQUIRE(p->batch * p->heads_kv * p->num_splits_ <= 132 && p->num_splits_ * 512 <= p->seqlen_k);
    }
    if (family == FC_FAMILY_DECODE) REQUIRE(decode_takes(p));
    REQUIRE(p->head_dim == head_dim && p->dtype == dtype);
    /* A mask: the sm80 family, the decode one without causal, or the sm90 one where it takes it (a
     * slice's mask pointer moves by whole 16-byte multiples of head and batch strides, so a
     * slice takes it too). */
    REQUIRE(p->mask_kind == FC_MASK_NONE || family == FC_FAMILY_SM80 ||
            (family == FC_FAMILY_DECODE && !p->causal) || (family == FC_FAMILY_SM90 && sm90_takes_mask(p)));
    REQUIRE(p->family == FC_FAMILY_AUTO || p->family == family);
    accepted_is_consistent(p);
    int bm = 0, bn = 0;
    tile_shape(family, head_dim, p->causal != 0, &bm, &bn);
    const i128 m_blocks = ((i128)p->seqlen_q + bm - 1) / bm;
    /* sm80: grid (m_blocks, heads_q, batch); sm90: m_blocks * heads_q * batch tiles in an int. */
    REQUIRE(m_blocks >= 1 && m_blocks <= INT32_MAX);
    REQUIRE(p->cu_seq_q != NULL || (p->heads_q <= 65535 && p->batch <= 65535));
    if (family == FC_FAMILY_SM90) {
        REQUIRE(sm90_takes(p));
        REQUIRE(m_blocks * p->heads_q * p->batch <= INT32_MAX);
        /* m_blocks and key-tile counts computed in int, (m_block + 1) * kBlockM too. */
        REQUIRE((i128)p->seqlen_q + bm - 1 <= INT32_MAX);
        REQUIRE((i128)p->seqlen_k + bn - 1 <= INT32_MAX);
#if FC_FUZZ_STRICT
        /* E: TMA global strides are below 2^40 bytes (and stride * 2 fits int64). */
        const int64_t strides[9] = {p->q_stride_s, p->q_stride_h, p->q_stride_b, p->k_stride_s,
                                    p->k_stride_h, p->k_stride_b, p->v_stride_s, p->v_stride_h,
                                    p->v_stride_b};
        const int packed = p->cu_seq_q != NULL;
        const int64_t b = packed ? 1 : p->batch, rq = packed ? p->total_q : p->seqlen_q, rk = packed ? p->total_k : p->seqlen_k;
        const int64_t sizes[9] = {rq, p->heads_q, b, rk, p->heads_kv, b, rk, p->heads_kv, b};
        for (int i = 0; i < 9; ++i)
            if (sizes[i] > 1) REQUIRE((i128)strides[i] * 2 < ((i128)1 << 40));
        /* E for the mask's map (kMasked, bytes): a stepped-over head or batch dim (size > 1,
         * stride nonzero; a stride-0 dim is mapped as one of size 1) and the query dim. */
        if (p->mask_kind != FC_MASK_NONE) {
            const int64_t msizes[3] = {p->seqlen_q, p->mask_stride_h != 0 ? p->heads_q : 1,
                                       p->mask_stride_b != 0 ? p->batch : 1};
            const int64_t mstrides[3] = {p->mask_stride_q, p->mask_stride_h, p->mask_stride_b};
            for (int i = 0; i < 3; ++i)
                if (msizes[i] > 1) REQUIRE((i128)mstrides[i] < ((i128)1 << 40));
        }
#endif
    }
#if FC_FUZZ_STRICT
    /* A: the int arithmetic of the sm80 kernel (n_blocks, key columns, m_start + kBlockM). */
    REQUIRE((i128)p->seqlen_q + bm - 1 <= INT32_MAX);
    REQUIRE((i128)p->seqlen_k + bn - 1 <= INT32_MAX);
#endif
    ++g_launches;
}

#define FC_FUZZ_LAUNCHER(FAM, fam, HD, NAME, DT)                                               \
    cudaError_t fc_##fam##_fwd_hdim##HD##_##NAME(const fc_params *p, const fc_device_facts *dev, \
                                                 cudaStream_t stream) {                        \
        (void)stream;                                                                          \
        check_device_facts(dev);                                                               \
        check_launch(p, FAM, HD, DT);                                                          \
        return cudaSuccess;                                                                    \
    }
FC_FUZZ_LAUNCHER(FC_FAMILY_SM80, sm80, 32, fp16, FC_DTYPE_FP16)
FC_FUZZ_LAUNCHER(FC_FAMILY_SM80, sm80, 32, bf16, FC_DTYPE_BF16)
FC_FUZZ_LAUNCHER(FC_FAMILY_SM80, sm80, 64, fp16, FC_DTYPE_FP16)
FC_FUZZ_LAUNCHER(FC_FAMILY_SM80, sm80, 64, bf16, FC_DTYPE_BF16)
FC_FUZZ_LAUNCHER(FC_FAMILY_SM80, sm80, 128, fp16, FC_DTYPE_FP16)
FC_FUZZ_LAUNCHER(FC_FAMILY_SM80, sm80, 80, fp16, FC_DTYPE_FP16)
FC_FUZZ_LAUNCHER(FC_FAMILY_SM80, sm80, 80, bf16, FC_DTYPE_BF16)
FC_FUZZ_LAUNCHER(FC_FAMILY_SM80, sm80, 96, fp16, FC_DTYPE_FP16)
FC_FUZZ_LAUNCHER(FC_FAMILY_SM80, sm80, 96, bf16, FC_DTYPE_BF16)
FC_FUZZ_LAUNCHER(FC_FAMILY_SM80, sm80, 128, bf16, FC_DTYPE_BF16)
FC_FUZZ_LAUNCHER(FC_FAMILY_SM80, sm80, 256, fp16, FC_DTYPE_FP16)
FC_FUZZ_LAUNCHER(FC_FAMILY_SM80, sm80, 256, bf16, FC_DTYPE_BF16)
FC_FUZZ_LAUNCHER(FC_FAMILY_SM90, sm90, 64, fp16, FC_DTYPE_FP16)
FC_FUZZ_LAUNCHER(FC_FAMILY_SM90, sm90, 64, bf16, FC_DTYPE_BF16)
FC_FUZZ_LAUNCHER(FC_FAMILY_SM90, sm90, 128, fp16, FC_DTYPE_FP16)
FC_FUZZ_LAUNCHER(FC_FAMILY_SM90, sm90, 128, bf16, FC_DTYPE_BF16)
FC_FUZZ_LAUNCHER(FC_FAMILY_SM90, sm90, 256, fp16, FC_DTYPE_FP16)
FC_FUZZ_LAUNCHER(FC_FAMILY_SM90, sm90, 256, bf16, FC_DTYPE_BF16)

#define FC_FUZZ_DECODE_LAUNCHER(HD, NAME, DT)                                                  \
    cudaError_t fc_decode_hdim##HD##_##NAME(const fc_params *p, const fc_device_facts *dev,   \
                                            cudaStream_t stream) {                             \
        (void)stream;                                                                          \
        check_device_facts(dev);                                                               \
        check_launch(p, FC_FAMILY_DECODE, HD, DT);                                             \
        return cudaSuccess;                                                                    \
    }
FC_FUZZ_DECODE_LAUNCHER(64, fp16, FC_DTYPE_FP16)
FC_FUZZ_DECODE_LAUNCHER(64, bf16, FC_DTYPE_BF16)
FC_FUZZ_DECODE_LAUNCHER(128, fp16, FC_DTYPE_FP16)
FC_FUZZ_DECODE_LAUNCHER(128, bf16, FC_DTYPE_BF16)

/* The backward launchers bwd.c names (kernels/bwd_sm80_*.cu, kernels/bwd_sm90_*.cu): one stub
 * per line of kernel_list.h, the list bwd.c's table is built from. */
static const fc_bwd_params *g_expected_bwd; /* the struct fc_sdpa_bwd was given */
static int g_bwd_launches;
static fc_family g_bwd_launched_family;

static void check_bwd_launch(const fc_bwd_params *p, fc_family family, int head_dim, fc_dtype dtype);

#define FC_FWD_KERNEL(family, prefix, hd, dt, DT) /* (the forward's stubs are above) */
#define FC_BWD_KERNEL(FAM, prefix, HD, NAME, DT)                                                \
    cudaError_t fc_##prefix##_hdim##HD##_##NAME(const fc_bwd_params *p, const fc_device_facts *dev, \
                                                cudaStream_t stream) {                         \
        (void)stream;                                                                          \
        check_device_facts(dev);                                                               \
        check_bwd_launch(p, FC_FAMILY_##FAM, HD, FC_DTYPE_##DT);                               \
        return cudaSuccess;                                                                    \
    }
#include "kernel_list.h"
#undef FC_BWD_KERNEL
#undef FC_FWD_KERNEL

/* ---- independent consistency checks ----------------------------------------------------------- */

typedef struct view4 {
    const void *ptr;
    i128 size[4];
    i128 stride[4];
} view4;

static i128 elem_bytes(fc_dtype dtype) { return dtype == FC_DTYPE_FP32 ? 4 : 2; }

static void check_operand(const view4 *t, i128 elem) {
    for (int i = 0; i < 4; ++i) REQUIRE(t->size[i] >= 1);
    for (int i = 0; i < 4; ++i) REQUIRE(t->stride[i] >= 0);
    if (t->size[3] > 1) REQUIRE(t->stride[3] == 1);
    for (int i = 0; i < 3; ++i)
        if (t->size[i] > 1) REQUIRE((t->stride[i] * elem) % 16 == 0);
    REQUIRE(((uintptr_t)t->ptr & 15u) == 0);
    /* Each term (size - 1) * stride is below 2^126 in i128; bound it before summing. */
    i128 term[4];
    for (int i = 0; i < 4; ++i) {
        term[i] = (t->size[i] - 1) * t->stride[i];
        REQUIRE(term[i] <= INT64_MAX);
    }
    /* Inside one (batch, head) slice the kernels index rows with int: row * stride_s + d. */
    const i128 in_slice = term[2] + term[3];
    REQUIRE(in_slice <= INT32_MAX);
    /* The whole tensor is addressed with int64 element offsets. */
    const i128 last = term[0] + term[1] + in_slice;
    REQUIRE(last <= INT64_MAX);
#if FC_FUZZ_STRICT
    /* D: the byte address of the last element must not wrap. */
    REQUIRE((i128)(uintptr_t)t->ptr + last * elem + elem - 1 <= (i128)UINTPTR_MAX);
#endif
}

/* Everything fc_params_validate promises about a struct it returns FC_OK for. */
static void accepted_is_consistent(const fc_params *p) {
    REQUIRE((int)p->dtype >= FC_DTYPE_FP16 && (int)p->dtype <= FC_DTYPE_FP32);
    REQUIRE((int)p->mask_kind >= FC_MASK_NONE && (int)p->mask_kind <= FC_MASK_ADDITIVE);
    REQUIRE((int)p->family >= FC_FAMILY_AUTO && (int)p->family <= FC_FAMILY_DECODE);
    REQUIRE(p->batch >= 1 && p->heads_q >= 1 && p->heads_kv >= 1);
    REQUIRE(p->seqlen_q >= 1 && p->seqlen_k >= 1 && p->head_dim >= 1);
    REQUIRE(p->heads_q % p->heads_kv == 0);
    REQUIRE(p->q && p->k && p->v && p->out);
    REQUIRE(p->mask_kind == FC_MASK_NONE || p->mask != NULL);
    REQUIRE(isfinite(p->scale));
    const i128 elem = elem_bytes(p->dtype);
    /* K and V: (B, Hkv, Sk, D), or paged the pools (num_pages, Hkv, page_size, D), the batch
     * stride being the page stride. */
    /* Packed (fc_params.cu_seq_q): q, out and the LSE one item of total_q rows, K and V one of
     * total_k rows. */
    const int paged = p->block_table != NULL, packed = p->cu_seq_q != NULL;
    const i128 kv_items = paged ? (i128)p->num_pages : packed ? 1 : (i128)p->batch;
    const i128 kv_rows = paged ? (i128)p->page_size : packed ? (i128)p->total_k : (i128)p->seqlen_k;
    const i128 q_items = packed ? 1 : (i128)p->batch, q_rows = packed ? (i128)p->total_q : (i128)p->seqlen_q;
    const view4 ops[4] = {
        {p->q, {q_items, p->heads_q, q_rows, p->head_dim},
         {p->q_stride_b, p->q_stride_h, p->q_stride_s, p->q_stride_d}},
        {p->k, {kv_items, p->heads_kv, kv_rows, p->head_dim},
         {p->k_stride_b, p->k_stride_h, p->k_stride_s, p->k_stride_d}},
        {p->v, {kv_items, p->heads_kv, kv_rows, p->head_dim},
         {p->v_stride_b, p->v_stride_h, p->v_stride_s, p->v_stride_d}},
        {p->out, {q_items, p->heads_q, q_rows, p->head_dim},
         {p->o_stride_b, p->o_stride_h, p->o_stride_s, p->o_stride_d}},
    };
    if (packed) {
        /* Both offset arrays (batch + 1 int32 each, addressable), both totals, no batch stride;
         * no window and no bottom-right diagonal (a per-sequence band runs nowhere). */
        REQUIRE(p->cu_seq_k != NULL && ((uintptr_t)p->cu_seq_q & 3u) == 0 && ((uintptr_t)p->cu_seq_k & 3u) == 0);
        REQUIRE(p->total_q >= 1 && p->total_k >= 1 && p->total_q <= INT32_MAX && p->total_k <= INT32_MAX);
        REQUIRE(p->q_stride_b == 0 && p->k_stride_b == 0 && p->v_stride_b == 0 && p->o_stride_b == 0);
        REQUIRE(p->lse == NULL || p->lse_stride_b == 0);
        REQUIRE(!p->windowed && (!p->causal || p->alignment == FC_ALIGN_TOP_LEFT));
        REQUIRE((i128)(uintptr_t)p->cu_seq_q + ((i128)p->batch + 1) * 4 - 1 <= (i128)UINTPTR_MAX);
        REQUIRE((i128)(uintptr_t)p->cu_seq_k + ((i128)p->batch + 1) * 4 - 1 <= (i128)UINTPTR_MAX);
        /* the forward's (head, listed block) tiles in an int */
        REQUIRE((((i128)p->total_q + 63) / 64 + p->batch) * p->heads_q <= INT32_MAX);
    } else {
        REQUIRE(p->cu_seq_k == NULL && p->total_q == 0 && p->total_k == 0);
    }
    for (int i = 0; i < 4; ++i) check_operand(&ops[i], elem);
    if (paged) {
        /* The decode kernels: key t at page table[t / page_size] (clamped below num_pages, an
         * int), row t % page_size; pages hold whole 16-key steps; every key has a table entry;
         * the table's entries read (int32) and seqused_k's are addressable. */
        REQUIRE(p->page_size > 0 && p->page_size % 16 == 0 && p->pages_per_seq >= 1);
        REQUIRE(p->num_pages >= 1 && p->num_pages <= INT32_MAX);
        REQUIRE((i128)p->pages_per_seq * p->page_size >= p->seqlen_k);
        REQUIRE(p->block_table_stride >= 0 && (p->batch == 1 || p->block_table_stride >= p->pages_per_seq));
        REQUIRE(((uintptr_t)p->block_table & 3u) == 0 && ((uintptr_t)p->seqused_k & 3u) == 0);
        const i128 last = ((i128)p->batch - 1) * p->block_table_stride + p->pages_per_seq - 1;
        REQUIRE((i128)(uintptr_t)p->block_table + last * 4 + 3 <= (i128)UINTPTR_MAX);
        if (p->seqused_k != NULL) REQUIRE((i128)(uintptr_t)p->seqused_k + (i128)p->batch * 4 - 1 <= (i128)UINTPTR_MAX);
    } else {
        REQUIRE(p->pages_per_seq == 0 && p->page_size == 0 && p->num_pages == 0 && p->block_table_stride == 0 &&
                p->seqused_k == NULL);
    }
    if (p->lse != NULL) {
        REQUIRE(((uintptr_t)p->lse & 3u) == 0);
        REQUIRE(p->lse_stride_b >= 0 && p->lse_stride_h >= 0 && p->lse_stride_s >= 0);
        const i128 in_slice = (q_rows - 1) * p->lse_stride_s;
        REQUIRE(in_slice <= INT32_MAX);
        const i128 tb = (q_items - 1) * p->lse_stride_b;
        const i128 th = ((i128)p->heads_q - 1) * p->lse_stride_h;
        REQUIRE(tb <= INT64_MAX && th <= INT64_MAX);
        const i128 last = tb + th + in_slice;
        REQUIRE(last <= INT64_MAX);
#if FC_FUZZ_STRICT
        REQUIRE((i128)(uintptr_t)p->lse + last * 4 + 3 <= (i128)UINTPTR_MAX);
#endif
    }
    if (p->mask_kind != FC_MASK_NONE) {
        /* (B, Hq, Sq, Sk), any strides and alignment; the sm80 kernel indexes a (batch, head)
         * slice in int: row * stride_q + key * stride_k. */
        REQUIRE(p->mask_stride_b >= 0 && p->mask_stride_h >= 0 && p->mask_stride_q >= 0 &&
                p->mask_stride_k >= 0);
        const i128 melem = p->mask_kind == FC_MASK_BOOL ? 1 : elem;
        const i128 tq = ((i128)p->seqlen_q - 1) * p->mask_stride_q;
        const i128 tk = ((i128)p->seqlen_k - 1) * p->mask_stride_k;
        REQUIRE(tq + tk <= INT32_MAX);
        const i128 tb = ((i128)p->batch - 1) * p->mask_stride_b;
        const i128 th = ((i128)p->heads_q - 1) * p->mask_stride_h;
        REQUIRE(tb <= INT64_MAX && th <= INT64_MAX);
        const i128 last = tb + th + tq + tk;
        REQUIRE(last <= INT64_MAX);
        REQUIRE((i128)(uintptr_t)p->mask + last * melem + melem - 1 <= (i128)UINTPTR_MAX);
    }
    /* The sinks' (Hq,) floats: aligned, the last one addressable. */
    if (p->sinks != NULL) {
        REQUIRE(((uintptr_t)p->sinks & 3u) == 0);
        REQUIRE((i128)(uintptr_t)p->sinks + ((i128)p->heads_q - 1) * 4 + 3 <= (i128)UINTPTR_MAX);
    }
    /* The kernels cast seqlen_q and seqlen_k to int and number (64-row query block, head,
     * batch) tiles in an int. (Batch and heads past CUDA's grid limit run in slices.) */
    REQUIRE(p->seqlen_q <= INT32_MAX && p->seqlen_k <= INT32_MAX);
    REQUIRE(((i128)p->seqlen_q + 63) / 64 * p->heads_q * p->batch <= INT32_MAX);
}

/* The sm90 family's own rules (dispatch.c family_takes_layout), re-stated: TMA cannot describe
 * a stepped-over dim of stride 0, and the scale is folded into one FFMA only when positive. */
static int sm90_takes(const fc_params *p) {
    /* (A packed call's tensors: one item of total_q / total_k rows.) */
    const int packed = p->cu_seq_q != NULL;
    const int64_t b = packed ? 1 : p->batch, rq = packed ? p->total_q : p->seqlen_q, rk = packed ? p->total_k : p->seqlen_k;
    const int64_t s[9] = {rq, p->heads_q, b, rk, p->heads_kv, b, rk, p->heads_kv, b};
    const int64_t st[9] = {p->q_stride_s, p->q_stride_h, p->q_stride_b, p->k_stride_s,
                           p->k_stride_h, p->k_stride_b, p->v_stride_s, p->v_stride_h,
                           p->v_stride_b};
    for (int i = 0; i < 9; ++i)
        if (s[i] > 1 && (st[i] == 0 || (i128)st[i] * 2 >= ((i128)1 << 40))) return 0;
    return p->scale > 0.0f;
}

/* The sm90 forward's mask rule (dispatch.c family_takes_mask; kMasked in
 * kernels/sm90/fwd_traits.cuh), re-stated for a masked call: the Hopper family takes a bool mask
 * only, at D=64, 128 and 256, with the call as the library resolves it free of any general band
 * (top-left causal it takes), with no softcap and no sinks, and only where
 * TMA can bring the mask in tiles: keys contiguous (stride 1), rows a positive multiple of 16
 * bytes apart (no broadcast queries), head and batch strides 16-byte multiples (0: broadcast),
 * the base 16-byte aligned. Additive masks, and every other masked call, stay in sm80. */
static int mask_tiles_layout(const fc_params *p);
static int sm90_takes_mask(const fc_params *p) {
    const fc_params r = resolved_of(p);
    if (r.mask_kind != FC_MASK_BOOL) return 0;
    if (r.head_dim != 64 && r.head_dim != 128 && r.head_dim != 256) return 0;
    if (r.band_ == FC_BAND_GENERAL_ || r.softcap != 0.0f || r.sinks != NULL) return 0;
    return mask_tiles_layout(&r);
}

/* The layout half of the rule above (TMA can bring the bool mask in tiles), for a resolved call. */
static int mask_tiles_layout(const fc_params *p) {
    const fc_params r = *p;
    const int keys_contiguous = r.mask_stride_k == 1;
    const int rows_tiled = r.mask_stride_q > 0 && r.mask_stride_q % 16 == 0;
    const int heads_tiled = r.mask_stride_h >= 0 && r.mask_stride_h % 16 == 0;
    const int batch_tiled = r.mask_stride_b >= 0 && r.mask_stride_b % 16 == 0;
    const int base_aligned = ((uintptr_t)r.mask & 15u) == 0;
    /* TMA's strides: below 2^40 bytes where the dim is stepped over (a bool is one byte). */
    const i128 tma_max = (i128)1 << 40;
    const int strides_mappable = (i128)r.mask_stride_q < tma_max && (r.heads_q <= 1 || (i128)r.mask_stride_h < tma_max) &&
                                 (r.batch <= 1 || (i128)r.mask_stride_b < tma_max);
    return keys_contiguous && rows_tiled && heads_tiled && batch_tiled && base_aligned && strides_mappable;
}

/* The decode kernel: Sq <= 16 and (Hq / Hkv) * Sq <= 32 rows, head dims 64 and 128. */
static int decode_takes(const fc_params *p) {
    return p->seqlen_q <= 16 && (p->heads_q / p->heads_kv) * p->seqlen_q <= 32;
}

/*
 * AUTO's speed rule for masked calls on Hopper (FC_UNSUPPORTED_SLOWER_MASK; flashcore.h, and
 * the measurements in docs/experiments/forward-masks.md), re-stated from what the status
 * promises: on an sm_90 device, under AUTO, a masked call that only the sm80 family would run
 * (the decode kernel did not take it: decode_takes_masked, and the sm90 family did not take it: its mask rule and
 * its layout rule above) is left to PyTorch's SDPA when
 *   - SDPA itself can express the call: no causal flag and no general band as the library
 *     resolves them (fc_resolve_band_: a window over every key is no band, bottom-right causal
 *     over one row that sees every key is not causal), no softcap, no sinks;
 *   - the caller wants no LSE (a training forward keeps the sm80 family: the backward reads
 *     its LSE);
 *   - and the mask leaves the sm80 kernel no whole tiles to skip: at D=64, 128 and 256 any mask
 *     the sm90 family cannot take, at the other head dims (32, 80, 96) a mask broadcast over the
 *     query rows (mask_stride_q == 0, which one-row calls from the op have).
 * Only valid structs with a dtype and head dim the sm80 family has (otherwise the call is
 * declined earlier for that). A forced family always runs what it takes.
 */
static int sm80_head_dim(int64_t d) { return d == 32 || d == 64 || d == 80 || d == 96 || d == 128 || d == 256; }

/* A masked call the decode kernels run under AUTO: their shapes and head dims, no causal (as
 * resolved), band, softcap or sinks. */
static int decode_takes_masked(const fc_params *p) {
    const fc_params r = resolved_of(p);
    return decode_takes(p) && (p->head_dim == 64 || p->head_dim == 128) && !r.causal &&
           r.band_ != FC_BAND_GENERAL_ && r.softcap == 0.0f && r.sinks == NULL;
}

static int auto_leaves_mask_to_sdpa(const fc_params *p, int cc) {
    if (p->family != FC_FAMILY_AUTO || cc != 90 || p->mask_kind == FC_MASK_NONE || p->lse != NULL) return 0;
    if (p->block_table != NULL) return 0; /* (FC_UNSUPPORTED_PAGED first) */
    if (p->cu_seq_q != NULL) return 0;    /* (FC_UNSUPPORTED_VARLEN first) */
    if (p->dtype != FC_DTYPE_FP16 && p->dtype != FC_DTYPE_BF16) return 0;
    if (!sm80_head_dim(p->head_dim)) return 0;
    const fc_params r = resolved_of(p);
    if (r.causal || r.band_ == FC_BAND_GENERAL_ || r.softcap != 0.0f || r.sinks != NULL) return 0;
    /* the decode kernels run it, bool masks only: an additive one they leave to PyTorch too */
    if (decode_takes_masked(p) && p->mask_kind != FC_MASK_ADDITIVE) return 0;
    if (sm90_takes_mask(p) && sm90_takes(p)) return 0; /* the sm90 family runs it */
    return p->mask_kind == FC_MASK_ADDITIVE || p->head_dim == 64 || p->head_dim == 128 || p->head_dim == 256 ||
           p->mask_stride_q == 0 || p->seqlen_q == 1;
}

/* Everything fc_sdpa_support promises on top: a kernel of family `fam` exists for it here. */
static void supported_is_runnable(const fc_params *p, int cc, fc_family fam) {
    accepted_is_consistent(p);
    REQUIRE(p->dtype == FC_DTYPE_FP16 || p->dtype == FC_DTYPE_BF16);
    /* A mask: the sm80 family, the decode family without causal, or the sm90 family where it
     * takes it. */
    REQUIRE(p->mask_kind == FC_MASK_NONE || fam == FC_FAMILY_SM80 ||
            (fam == FC_FAMILY_DECODE && !resolved_of(p).causal) || (fam == FC_FAMILY_SM90 && sm90_takes_mask(p)));
    /* sm80: 32, 64, 80, 96, 128, 256; sm90: 64, 128, 256; decode: 64, 128. */
    const int64_t d = p->head_dim;
    REQUIRE(d == 32 || d == 64 || d == 80 || d == 96 || d == 128 || d == 256);
    if (fam == FC_FAMILY_SM90) REQUIRE(d == 64 || d == 128 || d == 256);
    REQUIRE(cc == 89 || cc == 90);
    REQUIRE(p->family == FC_FAMILY_AUTO || p->family == fam);
    /* A general band: the sm90 and decode families, no mask; sinks: the sm90 family; a softcap:
     * the sm90 family without a mask, or the sm80 family. */
    const fc_params r = resolved_of(p);
    if (r.band_ == FC_BAND_GENERAL_)
        REQUIRE((fam == FC_FAMILY_SM90 || fam == FC_FAMILY_DECODE) && p->mask_kind == FC_MASK_NONE);
    if (p->sinks != NULL) REQUIRE(fam == FC_FAMILY_SM90);
    if (p->softcap != 0.0f)
        REQUIRE((fam == FC_FAMILY_SM90 && p->mask_kind == FC_MASK_NONE) || fam == FC_FAMILY_SM80);
    if (fam == FC_FAMILY_SM90) REQUIRE(cc == 90 && sm90_takes(p));
    else if (fam == FC_FAMILY_DECODE) REQUIRE(decode_takes(p) && (d == 64 || d == 128));
    else REQUIRE(fam == FC_FAMILY_SM80);
    /* Pages: the decode family, decode-shaped, without causal, a band or a mask. */
    if (p->block_table != NULL)
        REQUIRE(fam == FC_FAMILY_DECODE && !r.causal && r.band_ != FC_BAND_GENERAL_ && p->mask_kind == FC_MASK_NONE);
    /* Packed sequences: the sm90 forward alone, without a mask, softcap, sinks, pages or a general
     * band (whatever AUTO would pick for the dense call of the same sizes). */
    if (p->cu_seq_q != NULL) {
        REQUIRE(fam == FC_FAMILY_SM90 && p->mask_kind == FC_MASK_NONE && p->softcap == 0.0f && p->sinks == NULL &&
                p->block_table == NULL && r.band_ != FC_BAND_GENERAL_);
        return;
    }
    /* AUTO with a mask: the decode kernels run the calls they take (decode_takes_masked); the
     * sm90 family runs the call on sm_90 wherever it takes both the layout and the mask, and the
     * sm80 family every other one
     * (the sm80-only head dims included: the speed rule below is for unmasked calls) but those
     * the masked speed rule leaves to PyTorch's SDPA (auto_leaves_mask_to_sdpa: never supported). */
    if (p->mask_kind != FC_MASK_NONE) {
        const int sm90_masked = cc == 90 && sm90_takes(p) && sm90_takes_mask(p);
        if (p->family == FC_FAMILY_AUTO)
            REQUIRE(fam == (decode_takes_masked(p) ? FC_FAMILY_DECODE
                                                   : sm90_masked ? FC_FAMILY_SM90 : FC_FAMILY_SM80));
        REQUIRE(!auto_leaves_mask_to_sdpa(p, cc));
        return;
    }
    /* AUTO unmasked: the decode kernel for the small-Sq calls it takes, else Hopper wherever it
     * can run... */
    const int decode = decode_takes(p) && (d == 64 || d == 128) && p->sinks == NULL && p->softcap == 0.0f;
    const int sm90 = cc == 90 && sm90_takes(p) && (d == 64 || d == 128 || d == 256);
    /* ...except one-row D=128 calls over many (batch, KV head) pairs and key rows, which the
     * Hopper family reads faster (dispatch.c, sm90_reads_decode_faster): from 64 pairs and 2^18
     * key rows, or, over fewer pairs whose query heads pack into one block each, 2^20. */
    const int64_t pairs = p->batch * p->heads_kv, key_rows = pairs * p->seqlen_k;
    const int one_block_per_pair = p->heads_q == p->heads_kv || fc_decode_packs_for_sm90(&r);
    const int decode_to_sm90 = cc == 90 && sm90_takes(p) && d == 128 && p->seqlen_q == 1 && !r.causal && p->block_table == NULL &&
                               (pairs >= 64 ? key_rows >= (1 << 18) : key_rows >= (1 << 20) && one_block_per_pair);
    if (p->family == FC_FAMILY_AUTO && decode) REQUIRE(fam == (decode_to_sm90 ? FC_FAMILY_SM90 : FC_FAMILY_DECODE));
    if (p->family == FC_FAMILY_AUTO && !decode && sm90 && p->block_table == NULL) REQUIRE(fam == FC_FAMILY_SM90);
    /* The sm80-only dims run in the sm80 family under AUTO, and never unmasked on Hopper (there
     * AUTO declines them: PyTorch's cuDNN path is faster). */
    if (p->family == FC_FAMILY_AUTO && (d == 32 || d == 80 || d == 96)) REQUIRE(fam == FC_FAMILY_SM80 && cc == 89);
}

/* ---- the backward's model (c_src/bwd.c, flashcore.h, docs/USAGE.md "Training: the backward") */

/* The backward kernels of this build: kernel_list.h's backward lines (as bwd.c's table). */
static const struct {
    fc_family family;
    int head_dim;
    fc_dtype dtype;
} kBwdBuilt[] = {
#define FC_FWD_KERNEL(family, prefix, hd, dt, DT)
#define FC_BWD_KERNEL(FAM, prefix, HD, NAME, DT) {FC_FAMILY_##FAM, HD, FC_DTYPE_##DT},
#include "kernel_list.h"
#undef FC_BWD_KERNEL
#undef FC_FWD_KERNEL
    {FC_FAMILY_AUTO, 0, FC_DTYPE_FP16} /* end */
};

static int bwd_built(fc_family family, int64_t head_dim, fc_dtype dtype) {
    for (size_t i = 0; kBwdBuilt[i].family != FC_FAMILY_AUTO; ++i)
        if (kBwdBuilt[i].family == family && kBwdBuilt[i].head_dim == head_dim && kBwdBuilt[i].dtype == dtype)
            return 1;
    return 0;
}

/* Machine code of the family for compute capability cc (major * 10 + minor): the sm80-class
 * kernels are built for sm_89 and sm_90a, the Hopper ones for sm_90a only. */
static int bwd_family_runs_on(fc_family family, int cc) {
#if defined(FC_BUILT_SM89)
    if (family == FC_FAMILY_SM80 && cc == 89) return 1;
#endif
#if defined(FC_BUILT_SM90)
    if ((family == FC_FAMILY_SM80 || family == FC_FAMILY_SM90) && cc == 90) return 1;
#endif
    (void)family;
    (void)cc;
    return 0;
}

/* The Hopper backward's own rules: TMA maps for q, k, v (the forward's: sm90_takes, which also
 * wants scale > 0) and for dout as a Q-shaped operand (a stepped-over dim needs a nonzero stride
 * below 2^40 bytes), and a 1-D grid of (key block, KV head, batch) CTAs in an int (128-key
 * blocks; D=256: 64). */
static int bwd_sm90_takes(const fc_bwd_params *b) {
    const fc_params *f = &b->fwd;
    if (!sm90_takes(f)) return 0;
    /* (A packed call's dout: one item of total_q rows, as q.) */
    const int packed = f->cu_seq_q != NULL;
    const int64_t s[3] = {packed ? f->total_q : f->seqlen_q, f->heads_q, packed ? 1 : f->batch};
    const int64_t st[3] = {b->do_stride_s, b->do_stride_h, b->do_stride_b};
    for (int i = 0; i < 3; ++i)
        if (s[i] > 1 && (st[i] == 0 || (i128)st[i] * 2 >= ((i128)1 << 40))) return 0;
    const i128 block = f->head_dim == 256 ? 64 : 128;
    const i128 ctas = ((i128)f->seqlen_k + block - 1) / block * f->heads_kv * f->batch;
    /* A packed call's tiles: each listed key block (at most total_k / 128 + batch) per KV head,
     * 128 / block tiles each (D=256: two). */
    const i128 packed_tiles = packed ? (((i128)f->total_k + 127) / 128 + f->batch) * f->heads_kv * (128 / block) : 0;
    return ctas <= INT32_MAX && packed_tiles <= INT32_MAX;
}

/* The sm90 backward's causal masked variant (c_src/dispatch.c fc_sm90_bool_mask_tiles_): a bool mask in TMA
 * tiles at D=64 / 128 / 256, top-left causal (no general band), no softcap. */
static int bwd_sm90_mask_causal(const fc_params *f) {
    const fc_params r = resolved_of(f);
    return r.mask_kind == FC_MASK_BOOL && (r.head_dim == 64 || r.head_dim == 128 || r.head_dim == 256) &&
           r.band_ != FC_BAND_GENERAL_ && r.softcap == 0.0f && mask_tiles_layout(&r);
}

/* The sm90 family's softcap: no mask but at D=256 with a bool mask. */
static int sm90_softcap_mask_ok(const fc_params *f) {
    return f->mask_kind == FC_MASK_NONE || (f->head_dim == 256 && f->mask_kind == FC_MASK_BOOL);
}

/* Can family `fam` run these (validated) params on cc? The dtype and the mask aside. */
static int bwd_family_possible(const fc_bwd_params *b, fc_family fam, int cc) {
    return bwd_family_runs_on(fam, cc) && bwd_built(fam, b->fwd.head_dim, b->fwd.dtype) &&
           (fam != FC_FAMILY_SM90 || bwd_sm90_takes(b));
}

static i128 round16(i128 x) { return (x + 15) / 16 * 16; }

/* Workspace a family needs (docs/USAGE.md, dispatch.h), 16-byte rounded, in 128-bit arithmetic: the
 * sm80-class family 8 bytes per query row (delta and LSE in fp32) and, in one pass (D=64, not
 * deterministic), 16-byte aligned after them D x 4 bytes per row (its dq accumulator); the sm90
 * family (D + 10) x 4 bytes per row, each (batch, query head)'s rows rounded up to a multiple of 64. */
static i128 bwd_need(const fc_params *f, int deterministic, fc_family fam) {
    const i128 slices = (i128)f->batch * f->heads_q;
    if (fam == FC_FAMILY_SM90 && f->cu_seq_q != NULL) {
        /* Packed: the key-block list (a 16-byte header, then 32-byte entries: total_k / 128 +
         * batch of them per KV head and once more for the scratch), then (D + 10) x 4 bytes per
         * packed query row and head, the rows rounded up to 64 and 128 more, and the counter. */
        const i128 entries = ((i128)f->total_k + 127) / 128 + f->batch;
        const i128 rows = ((i128)f->total_q + 63) / 64 * 64 + 128;
        return round16(16 + 32 * entries * ((i128)f->heads_kv + 1) + (i128)f->heads_q * rows * ((i128)f->head_dim + 10) * 4 +
                       16);
    }
    if (fam == FC_FAMILY_SM90) {
        const i128 padded = ((i128)f->seqlen_q + 63) / 64 * 64;
        return round16(slices * padded * ((i128)f->head_dim + 10) * 4 + 16 /* tile counter */ +
                       4 * slices /* per-head counts */);
    }
    const i128 rows = slices * f->seqlen_q;
    const int one_pass = !deterministic && (f->head_dim == 64 || f->head_dim == 128) && f->softcap == 0.0f;
    return one_pass ? round16(round16(rows * 8) + rows * f->head_dim * 4) : round16(rows * 8);
}

/* The support query's exact answer for a validated packed call (fc_params.cu_seq_q), not
 * paged, re-derived from the rules: the sm90 family alone runs it (D 64 / 128 / 256 fp16 / bf16, its
 * layout rule with the key-block list's tiles in an int), without a mask, softcap, general band
 * or sinks; AUTO does not try it under `deterministic` (it sums dq in any order), and never falls
 * back to the sm80-class family: FC_UNSUPPORTED_VARLEN. A forced family answers what it checks
 * first: the arch, then the mask (sm90: not with causal), band and softcap rules every call has,
 * then the packed rule, then (sm90) the head dim and the layout. */
static fc_status bwd_packed_status(const fc_bwd_params *b, int cc) {
    const fc_params *f = &b->fwd;
    if (f->dtype != FC_DTYPE_FP16 && f->dtype != FC_DTYPE_BF16) return FC_UNSUPPORTED_DTYPE;
    const fc_params rf = resolved_of(f);
    const int mask = f->mask_kind != FC_MASK_NONE, general = rf.band_ == FC_BAND_GENERAL_, softcap = f->softcap != 0.0f;
    const int plain = !mask && !general && !softcap && f->sinks == NULL;
    const int sm90_runs = bwd_family_runs_on(FC_FAMILY_SM90, cc) && plain && bwd_built(FC_FAMILY_SM90, f->head_dim, f->dtype) &&
                          bwd_sm90_takes(b);
    switch (f->family) {
    case FC_FAMILY_AUTO:
        return sm90_runs && !b->deterministic ? FC_OK : FC_UNSUPPORTED_VARLEN;
    case FC_FAMILY_SM80:
        if (!bwd_family_runs_on(FC_FAMILY_SM80, cc)) return FC_UNSUPPORTED_FAMILY;
        return mask && rf.causal ? FC_UNSUPPORTED_MASK : general ? FC_UNSUPPORTED_BAND : FC_UNSUPPORTED_VARLEN;
    case FC_FAMILY_SM90:
        if (!bwd_family_runs_on(FC_FAMILY_SM90, cc)) return FC_UNSUPPORTED_FAMILY;
        if (mask && rf.causal && !bwd_sm90_mask_causal(f)) return FC_UNSUPPORTED_MASK;
        if (softcap && !sm90_softcap_mask_ok(f)) return FC_UNSUPPORTED_SOFTCAP;
        if (!plain) return FC_UNSUPPORTED_VARLEN;
        if (!bwd_built(FC_FAMILY_SM90, f->head_dim, f->dtype)) return FC_UNSUPPORTED_HEAD_DIM;
        return bwd_sm90_takes(b) ? FC_OK : FC_UNSUPPORTED_LAYOUT;
    default:
        return FC_UNSUPPORTED_FAMILY; /* the decode family has no backward */
    }
}

/* Everything fc_bwd_params_validate promises about a struct it returns FC_OK for. */
static void bwd_accepted_is_consistent(const fc_bwd_params *b) {
    const fc_params *f = &b->fwd;
    accepted_is_consistent(f);
    REQUIRE(f->lse != NULL && b->dout != NULL && b->dq != NULL && b->dk != NULL && b->dv != NULL);
    REQUIRE(b->workspace_bytes >= 0 && ((uintptr_t)b->workspace & 15u) == 0);
    /* (blocks, heads, batch) grids: CUDA's y and z limits (a packed call's grids have one item). */
    const int packed = f->cu_seq_q != NULL;
    const int64_t items = packed ? 1 : f->batch, rq = packed ? f->total_q : f->seqlen_q,
                  rk = packed ? f->total_k : f->seqlen_k;
    REQUIRE(f->heads_q <= 65535 && items <= 65535);
    /* Packed: the gradients and dlse along the packed rows, no batch stride. */
    if (packed)
        REQUIRE(b->do_stride_b == 0 && b->dq_stride_b == 0 && b->dk_stride_b == 0 && b->dv_stride_b == 0 &&
                (b->dlse == NULL || b->dlse_stride_b == 0));
    const i128 elem = elem_bytes(f->dtype);
    const view4 ops[4] = {
        {b->dout, {items, f->heads_q, rq, f->head_dim},
         {b->do_stride_b, b->do_stride_h, b->do_stride_s, b->do_stride_d}},
        {b->dq, {items, f->heads_q, rq, f->head_dim},
         {b->dq_stride_b, b->dq_stride_h, b->dq_stride_s, b->dq_stride_d}},
        {b->dk, {items, f->heads_kv, rk, f->head_dim},
         {b->dk_stride_b, b->dk_stride_h, b->dk_stride_s, b->dk_stride_d}},
        {b->dv, {items, f->heads_kv, rk, f->head_dim},
         {b->dv_stride_b, b->dv_stride_h, b->dv_stride_s, b->dv_stride_d}},
    };
    for (int i = 0; i < 4; ++i) check_operand(&ops[i], elem);
    if (b->dlse != NULL) {
        /* fp32 (B, Hq, Sq), 4-byte aligned, indexed in int64; its last byte must not wrap. */
        REQUIRE(((uintptr_t)b->dlse & 3u) == 0);
        REQUIRE(b->dlse_stride_b >= 0 && b->dlse_stride_h >= 0 && b->dlse_stride_s >= 0);
        const i128 tb = ((i128)items - 1) * b->dlse_stride_b;
        const i128 th = ((i128)f->heads_q - 1) * b->dlse_stride_h;
        const i128 ts = ((i128)rq - 1) * b->dlse_stride_s;
        REQUIRE(tb <= INT64_MAX && th <= INT64_MAX && ts <= INT64_MAX && tb + th + ts <= INT64_MAX);
        REQUIRE((i128)(uintptr_t)b->dlse + (tb + th + ts) * 4 + 3 <= (i128)UINTPTR_MAX);
    }
}

/* Everything fc_sdpa_bwd_support promises on top: family `fam` has a kernel for it on cc. */
static void bwd_supported_is_runnable(const fc_bwd_params *b, int cc, fc_family fam) {
    const fc_params *f = &b->fwd;
    bwd_accepted_is_consistent(b);
    REQUIRE(fam == FC_FAMILY_SM80 || fam == FC_FAMILY_SM90);
    REQUIRE(f->dtype == FC_DTYPE_FP16 || f->dtype == FC_DTYPE_BF16);
    const fc_params rf = resolved_of(f);
    /* masks: either family, not causal (but the sm90 family's causal masked variant) */
    REQUIRE(f->mask_kind == FC_MASK_NONE || !rf.causal || (fam == FC_FAMILY_SM90 && bwd_sm90_mask_causal(f)));
    if (rf.band_ == FC_BAND_GENERAL_) REQUIRE(fam == FC_FAMILY_SM90 && f->mask_kind == FC_MASK_NONE);
    if (f->softcap != 0.0f && fam == FC_FAMILY_SM90) REQUIRE(sm90_softcap_mask_ok(f)); /* (sm80: masks too) */
    if (f->cu_seq_q != NULL)  /* packed: the sm90 family, nothing but causal */
        REQUIRE(fam == FC_FAMILY_SM90 && f->mask_kind == FC_MASK_NONE && f->softcap == 0.0f && f->sinks == NULL &&
                rf.band_ != FC_BAND_GENERAL_);
    /* head dims: 64 and 128 in both families, 256 in the sm90 family, 32 / 80 / 96 in the sm80-class one */
    if (fam == FC_FAMILY_SM90)
        REQUIRE(f->head_dim == 64 || f->head_dim == 128 || f->head_dim == 256);
    else
        REQUIRE(f->head_dim == 32 || f->head_dim == 64 || f->head_dim == 80 || f->head_dim == 96 || f->head_dim == 128);
    REQUIRE(bwd_built(fam, f->head_dim, f->dtype) && bwd_family_runs_on(fam, cc));
    REQUIRE(cc == 89 || cc == 90);
    REQUIRE(f->family == FC_FAMILY_AUTO || f->family == fam);
    if (fam == FC_FAMILY_SM90) {
        /* compute capability 9.0, TMA-able q/k/v/dout, scale > 0, the CTA count in an int */
        REQUIRE(cc == 90 && f->scale > 0.0f && bwd_sm90_takes(b));
        /* determinism asked for: never the family that sums dq in any order (AUTO) */
        if (f->family == FC_FAMILY_AUTO) REQUIRE(!b->deterministic);
    }
    /* The int arithmetic of both families' kernels: key / query block counts and bounds. */
    REQUIRE((i128)f->seqlen_q + 127 <= INT32_MAX && (i128)f->seqlen_k + 127 <= INT32_MAX);
}

/* The launcher stubs: called by fc_sdpa_bwd alone, with the caller's struct, on a device where
 * the support query names this family, with enough workspace for it. */
static void check_bwd_launch(const fc_bwd_params *p, fc_family family, int head_dim, fc_dtype dtype) {
    const fc_bwd_params *e = g_expected_bwd;
    REQUIRE(e != NULL);
    REQUIRE(g_bwd_launches == 0); /* one launcher per call */
    fc_params resolved = e->fwd; /* the library launches its resolved copy (check_launch) */
    fc_resolve_band_(&resolved);
    REQUIRE(memcmp(&p->fwd, &resolved, offsetof(fc_params, num_splits_)) == 0);
    REQUIRE(memcmp((const char *)p + offsetof(fc_bwd_params, dout), (const char *)e + offsetof(fc_bwd_params, dout),
                   offsetof(fc_bwd_params, deterministic) - offsetof(fc_bwd_params, dout)) == 0);
    REQUIRE(p->deterministic == e->deterministic && p->workspace == e->workspace &&
            p->workspace_bytes == e->workspace_bytes);
    /* (the caller's struct: the launched one carries the library's resolved band fields) */
    REQUIRE(fc_bwd_params_validate(e) == FC_OK);
    const int cc = kDeviceCC[(unsigned)g_device % 8u];
    REQUIRE(fc_sdpa_bwd_support(e, cc / 10, cc % 10) == FC_OK);
    REQUIRE(fc_sdpa_bwd_family(e, cc / 10, cc % 10) == family);
    REQUIRE(p->fwd.head_dim == head_dim && p->fwd.dtype == dtype);
    bwd_supported_is_runnable(p, cc, family);
    /* The workspace: present, aligned, at least this family's need, which the size query covers. */
    REQUIRE(p->workspace != NULL && ((uintptr_t)p->workspace & 15u) == 0);
    const i128 need = bwd_need(&p->fwd, p->deterministic, family);
    REQUIRE((i128)p->workspace_bytes >= need);
    int64_t size = -1;
    REQUIRE(fc_sdpa_bwd_workspace_size(e, &size) == FC_OK && (i128)size >= need);
    ++g_bwd_launches;
    g_bwd_launched_family = family;
}

/* ---- input decoding ------------------------------------------------------------------------- */

typedef struct reader {
    const uint8_t *data;
    size_t size, pos;
} reader;

static uint8_t take_u8(reader *r) { return r->pos < r->size ? r->data[r->pos++] : 0; }

static uint64_t take_u64(reader *r) {
    uint64_t x = 0;
    for (int i = 0; i < 8; ++i) x |= (uint64_t)take_u8(r) << (8 * i);
    return x;
}

/* Values at the edges of every check, picked by one byte; 0xff reads 8 raw bytes. */
static const int64_t kInteresting[] = {
    0, 1, 2, 3, 7, 8, 15, 16, 63, 64, 65, 80, 127, 128, 129, 256, 4096, 65535,
    65535LL * 64, 65535LL * 64 + 1, 65536LL * 64,
    INT32_MAX - 64, INT32_MAX - 63, INT32_MAX - 62, INT32_MAX - 1, INT32_MAX,
    (int64_t)INT32_MAX + 1, (int64_t)1 << 32, (int64_t)1 << 33, (int64_t)1 << 40,
    (int64_t)1 << 55, (int64_t)1 << 62, INT64_MAX / 2, INT64_MAX - 64, INT64_MAX - 63,
    INT64_MAX - 62, INT64_MAX - 1, INT64_MAX, INT64_MIN, INT64_MIN + 1, -1, -2, -8, -64,
    -(int64_t)INT32_MAX};
#define N_INTERESTING ((uint8_t)(sizeof(kInteresting) / sizeof(kInteresting[0])))

static int64_t take_i64(reader *r) {
    const uint8_t sel = take_u8(r);
    if (sel == 0xff) return (int64_t)take_u64(r);
    if (sel < N_INTERESTING) return kInteresting[sel];
    /* Otherwise a small positive value, often a multiple of 8. */
    return (int64_t)(sel - N_INTERESTING) * ((sel & 1) ? 1 : 8);
}

/* A size: mostly small; sometimes an edge value. */
static int64_t take_size(reader *r, int64_t small_default) {
    const uint8_t sel = take_u8(r);
    if (sel < 0xc0) return sel == 0 ? small_default : sel;
    return take_i64(r);
}

static float take_scale(reader *r) {
    switch (take_u8(r) % 12) {
    case 0: return 0.125f;
    case 1: return 0.0f;
    case 2: return -1.0f;
    case 3: return NAN;
    case 4: return INFINITY;
    case 5: return -INFINITY;
    case 6: return 1e30f;
    case 7: return 1e-45f;
    case 8: return 3.4e38f;
    case 9: return -0.0f;
    default: {
        const uint32_t bits = (uint32_t)take_u64(r);
        float f;
        memcpy(&f, &bits, sizeof f);
        return f;
    }
    }
}

/* A device pointer: 16-byte aligned, or off by a fuzzed amount, or NULL. Never dereferenced. */
static const void *take_pointer(reader *r, uintptr_t base) {
    const uint8_t sel = take_u8(r);
    if (sel == 0xfe) return NULL;
    if (sel == 0xff) return (const void *)(uintptr_t)take_u64(r);
    if (sel == 0xfd) return (const void *)(UINTPTR_MAX & ~(uintptr_t)15); /* top of the space */
    return (const void *)(base + (sel < 0xc0 ? 0 : (uintptr_t)(sel & 15)));
}

/* Strides of one (b, h, s, d) operand with sizes (B, H, S, D): a layout a caller might pass. */
static void take_strides(reader *r, int64_t B, int64_t H, int64_t S, int64_t D, int64_t *sb,
                         int64_t *sh, int64_t *ss, int64_t *sd) {
    const uint8_t layout = take_u8(r) % 8;
    /* Layouts use wrapping unsigned products: the point is the struct, not the arithmetic. */
    const uint64_t uB = (uint64_t)B, uH = (uint64_t)H, uS = (uint64_t)S, uD = (uint64_t)D;
    (void)uB;
    switch (layout) {
    case 0: /* contiguous (B, H, S, D) */
        *sd = 1; *ss = (int64_t)uD; *sh = (int64_t)(uS * uD); *sb = (int64_t)(uH * uS * uD);
        break;
    case 1: /* (B, S, H, D) storage viewed as (B, H, S, D): HuggingFace */
        *sd = 1; *sh = (int64_t)uD; *ss = (int64_t)(uH * uD); *sb = (int64_t)(uS * uH * uD);
        break;
    case 2: /* broadcast over batch and heads (expand) */
        *sd = 1; *ss = (int64_t)uD; *sh = 0; *sb = 0;
        break;
    case 3: /* broadcast along the sequence too */
        *sd = 1; *ss = 0; *sh = (int64_t)uD; *sb = 0;
        break;
    case 4: /* padded rows */ {
        const int64_t pad = (int64_t)take_u8(r);
        *sd = 1; *ss = (int64_t)(uD + (uint64_t)pad);
        *sh = (int64_t)(uS * (uint64_t)*ss); *sb = (int64_t)(uH * (uint64_t)*sh);
        break;
    }
    default: /* anything */
        *sb = take_i64(r); *sh = take_i64(r); *ss = take_i64(r);
        *sd = (take_u8(r) & 3) == 0 ? take_i64(r) : 1;
        break;
    }
}

/* Structured decoding: sizes, per-operand layouts, pointers and enums from the input. */
static void decode_structured(reader *r, fc_params *p) {
    fc_params_init(p);
    p->batch = take_size(r, 2);
    p->heads_kv = take_size(r, 2);
    const uint8_t group = take_u8(r);
    /* wrapping product: the harness itself must stay free of UB */
    p->heads_q = group < 0xf0 ? (int64_t)((uint64_t)p->heads_kv * (uint64_t)(1 + group % 8))
                              : take_size(r, 8);
    p->seqlen_q = take_size(r, 100);
    p->seqlen_k = take_size(r, 300);
    const uint8_t d = take_u8(r);
    p->head_dim = d < 0x80 ? 64 : d < 0xe0 ? 128 : take_size(r, 80);
    take_strides(r, p->batch, p->heads_q, p->seqlen_q, p->head_dim, &p->q_stride_b,
                 &p->q_stride_h, &p->q_stride_s, &p->q_stride_d);
    take_strides(r, p->batch, p->heads_kv, p->seqlen_k, p->head_dim, &p->k_stride_b,
                 &p->k_stride_h, &p->k_stride_s, &p->k_stride_d);
    take_strides(r, p->batch, p->heads_kv, p->seqlen_k, p->head_dim, &p->v_stride_b,
                 &p->v_stride_h, &p->v_stride_s, &p->v_stride_d);
    take_strides(r, p->batch, p->heads_q, p->seqlen_q, p->head_dim, &p->o_stride_b,
                 &p->o_stride_h, &p->o_stride_s, &p->o_stride_d);
    p->q = take_pointer(r, 0x7f0000100000u);
    p->k = take_pointer(r, 0x7f0000200000u);
    p->v = take_pointer(r, 0x7f0000300000u);
    p->out = (void *)take_pointer(r, 0x7f0000400000u);
    p->scale = take_scale(r);
    const uint8_t flags = take_u8(r);
    p->causal = flags & 1;
    p->dtype = (fc_dtype)((flags >> 1) & 3);                /* 3 is not an fc_dtype */
    if (flags & 0x80) p->dtype = (fc_dtype)(int)take_i64(r); /* any int, negative included */
    const uint8_t extra = take_u8(r);
    p->family = (fc_family)(extra & 3);                        /* 0-3: every fc_family */
    p->mask_kind = (fc_mask_kind)((extra >> 2) & 3);           /* 3 is not an fc_mask_kind */
    if (extra & 0x10) p->mask = take_pointer(r, 0x7f0000500000u);
    if (extra & 0x20) {
        p->mask_stride_b = take_i64(r); p->mask_stride_h = take_i64(r);
        p->mask_stride_q = take_i64(r); p->mask_stride_k = take_i64(r);
    }
    if (extra & 0x40) {
        p->lse = (float *)take_pointer(r, 0x7f0000600000u);
        const uint8_t l = take_u8(r);
        if (l & 1) {
            p->lse_stride_b = take_i64(r); p->lse_stride_h = take_i64(r); p->lse_stride_s = take_i64(r);
        } else {
            p->lse_stride_s = 1; p->lse_stride_h = p->seqlen_q;
            p->lse_stride_b = (int64_t)((uint64_t)p->heads_q * (uint64_t)p->seqlen_q);
        }
    }
    if (extra & 0x80) p->family = (fc_family)(int)take_i64(r);
    /* The fields appended after 0.1 (read last, so older inputs decode as before): a window
     * (small sides, or any int64), the causal alignment (any int), attention sinks. */
    const uint8_t variant = take_u8(r);
    if (variant & 1) {
        p->windowed = 1;
        p->window_left = (variant & 2) ? take_i64(r) : (int64_t)take_u8(r) - 1;
        p->window_right = (variant & 4) ? take_i64(r) : (int64_t)take_u8(r) - 1;
    }
    if (variant & 8) p->alignment = FC_ALIGN_BOTTOM_RIGHT;
    if (variant & 16) p->alignment = (fc_alignment)(int)take_i64(r);
    if (variant & 32) p->sinks = (const float *)take_pointer(r, 0x7f0000700000u);
    if (variant & 64) p->softcap = take_scale(r);  /* (0, negative, NaN, inf, huge, tiny, any bits) */
    /* Paged KV (appended after softcap; read last again): bit 0 a block table (pointer, maybe
     * NULL or misaligned), bits 1-4 page_size / pages_per_seq / table stride / num_pages from
     * take_i64 (else consistent: 16 << (0..4) keys a page, enough pages, a small stride margin,
     * 1 + a byte pages), bit 5 seqused_k, bit 6 K and V as contiguous (num_pages, page_size,
     * Hkv, D) pools; without bit 0, bit 7 sets a stray page field (FC_ERR_BAD_PAGES). */
    const uint8_t paging = take_u8(r);
    if (paging & 1) {
        p->block_table = (const int32_t *)take_pointer(r, 0x7f0000800000u);
        p->page_size = (paging & 2) ? (int32_t)take_i64(r) : (int32_t)(16 << (take_u8(r) % 5));
        if (paging & 4) {
            p->pages_per_seq = (int32_t)take_i64(r);
        } else {
            const int64_t need = p->page_size > 0 && p->seqlen_k >= 0 && p->seqlen_k < INT32_MAX
                                     ? (p->seqlen_k + p->page_size - 1) / p->page_size : 1;
            p->pages_per_seq = (int32_t)(need + (int64_t)(take_u8(r) % 3) - 1);
        }
        p->block_table_stride = (paging & 8) ? take_i64(r) : (int64_t)p->pages_per_seq + (int64_t)(take_u8(r) % 4);
        p->num_pages = (paging & 16) ? take_i64(r) : 1 + (int64_t)take_u8(r);
        if (paging & 32) p->seqused_k = (const int32_t *)take_pointer(r, 0x7f0000900000u);
        if (paging & 64) {
            const uint64_t uD = (uint64_t)p->head_dim, uH = (uint64_t)p->heads_kv, uP = (uint64_t)(int64_t)p->page_size;
            p->k_stride_d = p->v_stride_d = 1;
            p->k_stride_h = p->v_stride_h = (int64_t)uD;
            p->k_stride_s = p->v_stride_s = (int64_t)(uH * uD);
            p->k_stride_b = p->v_stride_b = (int64_t)(uP * uH * uD);
        }
    } else if (paging & 0x80) {
        switch (take_u8(r) % 5) {
        case 0: p->page_size = 16; break;
        case 1: p->pages_per_seq = 1; break;
        case 2: p->num_pages = 1; break;
        case 3: p->block_table_stride = 1; break;
        default: p->seqused_k = (const int32_t *)take_pointer(r, 0x7f0000900000u); break;
        }
    }
    /* Packed sequences (fc_params.cu_seq_q; appended after the paging byte, read last again):
     * bit 0 both offset arrays (pointers, maybe NULL or misaligned), bits 1-2 total_q / total_k
     * from take_i64 (else small sizes), bit 3 keeps the layouts above (else the packed layout:
     * (rows, heads, D) contiguous, batch strides 0, the LSE (Hq, total_q)), bit 4 a workspace
     * (bit 5: any size, else what the plan needs); without bit 0, bit 7 sets a stray packed field
     * (FC_ERR_BAD_VARLEN). */
    const uint8_t packing = take_u8(r);
    if (packing & 1) {
        p->cu_seq_q = (const int32_t *)take_pointer(r, 0x7f0000a00000u);
        p->cu_seq_k = (const int32_t *)take_pointer(r, 0x7f0000b00000u);
        p->total_q = (packing & 2) ? take_i64(r) : take_size(r, 250);
        p->total_k = (packing & 4) ? take_i64(r) : take_size(r, 700);
        if (!(packing & 8)) {
            const uint64_t uD = (uint64_t)p->head_dim;
            p->q_stride_b = p->k_stride_b = p->v_stride_b = p->o_stride_b = 0;
            p->q_stride_d = p->k_stride_d = p->v_stride_d = p->o_stride_d = 1;
            p->q_stride_h = p->k_stride_h = p->v_stride_h = p->o_stride_h = (int64_t)uD;
            p->q_stride_s = p->o_stride_s = (int64_t)((uint64_t)p->heads_q * uD);
            p->k_stride_s = p->v_stride_s = (int64_t)((uint64_t)p->heads_kv * uD);
            if (p->lse != NULL) p->lse_stride_b = 0, p->lse_stride_h = p->total_q, p->lse_stride_s = 1;
        }
        if (packing & 16) {
            p->workspace = (void *)take_pointer(r, 0x7f0000c00000u);
            p->workspace_bytes = (packing & 32) ? take_i64(r) : fc_varlen_workspace_bytes(p);
        }
    } else if (packing & 0x80) {
        switch (take_u8(r) % 3) {
        case 0: p->cu_seq_k = (const int32_t *)take_pointer(r, 0x7f0000b00000u); break;
        case 1: p->total_q = 1; break;
        default: p->total_k = take_i64(r); break;
        }
    }
}

/* Saturating i128 -> int64 (workspace sizes derived from a need). */
static int64_t clamp_i64(i128 x) {
    return x > INT64_MAX ? INT64_MAX : x < INT64_MIN ? INT64_MIN : (int64_t)x;
}

/* One gradient operand: its strides (even selector: the forward operand's `from`, as autograd
 * usually hands them; odd: a layout of take_strides) and its pointer. */
static void take_grad_operand(reader *r, int64_t B, int64_t H, int64_t S, int64_t D, const int64_t from[4],
                              int64_t *st[4], const void **ptr, uintptr_t base) {
    if (take_u8(r) & 1) take_strides(r, B, H, S, D, st[0], st[1], st[2], st[3]);
    else for (int i = 0; i < 4; ++i) *st[i] = from[i];
    *ptr = take_pointer(r, base);
}

/*
 * Backward decoding: the forward's fields as decode_structured reads them (b->fwd), then
 *   flags: bit 0 keep a NULL lse (else one is set, contiguous), bit 1 deterministic, bit 2
 *          deterministic = any int (take_i64), bit 3 dlse, bit 4 dlse strides from the input
 *          (else contiguous), bits 5-7 the workspace size (below);
 *   dout, dq, dk, dv: take_grad_operand each; dlse (bit 3): pointer [, 3 strides];
 *   (a packed call's: one item of total_q / total_k rows; its contiguous LSE and dlse (Hq,
 *   total_q) with batch stride 0, so that the packed seeds reach the packed backward);
 *   workspace pointer, then its size: 0 what fc_sdpa_bwd_workspace_size answers (0 if it
 *   fails), 1 that less 1..256, 2 the sm80-class need, 3 one byte less, 4 the sm90 need, 5 one
 *   byte less, 6 any int64 (take_i64), 7 zero.
 */
static void decode_bwd(reader *r, fc_bwd_params *b) {
    fc_bwd_params_init(b);
    fc_params *f = &b->fwd;
    decode_structured(r, f);
    const uint8_t flags = take_u8(r);
    b->deterministic = (flags >> 1) & 1;
    if (flags & 4) b->deterministic = (int)take_i64(r);
    /* (A packed call's tensors: one item of total_q / total_k rows, no batch stride; its
     * contiguous LSE and dlse are (Hq, total_q), as decode_structured's packed layout has it.) */
    const int packed = f->cu_seq_q != NULL;
    const int64_t items = packed ? 1 : f->batch, rq = packed ? f->total_q : f->seqlen_q,
                  rk = packed ? f->total_k : f->seqlen_k;
    if (!(flags & 1) && f->lse == NULL) {
        f->lse = (float *)(uintptr_t)0x7f0000600000ull;
        f->lse_stride_s = 1, f->lse_stride_h = rq;
        f->lse_stride_b = packed ? 0 : (int64_t)((uint64_t)f->heads_q * (uint64_t)f->seqlen_q);
    }
    const int64_t q_st[4] = {f->q_stride_b, f->q_stride_h, f->q_stride_s, f->q_stride_d};
    const int64_t o_st[4] = {f->o_stride_b, f->o_stride_h, f->o_stride_s, f->o_stride_d};
    const int64_t k_st[4] = {f->k_stride_b, f->k_stride_h, f->k_stride_s, f->k_stride_d};
    const int64_t v_st[4] = {f->v_stride_b, f->v_stride_h, f->v_stride_s, f->v_stride_d};
    int64_t *do_st[4] = {&b->do_stride_b, &b->do_stride_h, &b->do_stride_s, &b->do_stride_d};
    int64_t *dq_st[4] = {&b->dq_stride_b, &b->dq_stride_h, &b->dq_stride_s, &b->dq_stride_d};
    int64_t *dk_st[4] = {&b->dk_stride_b, &b->dk_stride_h, &b->dk_stride_s, &b->dk_stride_d};
    int64_t *dv_st[4] = {&b->dv_stride_b, &b->dv_stride_h, &b->dv_stride_s, &b->dv_stride_d};
    const void *ptr = NULL;
    take_grad_operand(r, items, f->heads_q, rq, f->head_dim, o_st, do_st, &ptr, 0x7f0000800000u);
    b->dout = ptr;
    take_grad_operand(r, items, f->heads_q, rq, f->head_dim, q_st, dq_st, &ptr, 0x7f0000900000u);
    b->dq = (void *)(uintptr_t)ptr;
    take_grad_operand(r, items, f->heads_kv, rk, f->head_dim, k_st, dk_st, &ptr, 0x7f0000a00000u);
    b->dk = (void *)(uintptr_t)ptr;
    take_grad_operand(r, items, f->heads_kv, rk, f->head_dim, v_st, dv_st, &ptr, 0x7f0000b00000u);
    b->dv = (void *)(uintptr_t)ptr;
    if (flags & 8) {
        b->dlse = (const float *)take_pointer(r, 0x7f0000c00000u);
        if (flags & 16) {
            b->dlse_stride_b = take_i64(r), b->dlse_stride_h = take_i64(r), b->dlse_stride_s = take_i64(r);
        } else {
            b->dlse_stride_s = 1, b->dlse_stride_h = rq;
            b->dlse_stride_b = packed ? 0 : (int64_t)((uint64_t)f->heads_q * (uint64_t)f->seqlen_q);
        }
    }
    b->workspace = (void *)(uintptr_t)take_pointer(r, 0x7f0000d00000u);
    /* The size query on the struct without its workspace (which validation looks at). */
    fc_bwd_params sized = *b;
    sized.workspace = NULL, sized.workspace_bytes = 0;
    int64_t answer = 0;
    if (fc_sdpa_bwd_workspace_size(&sized, &answer) != FC_OK) answer = 0;
    const int sane = fc_params_validate(f) == FC_OK; /* the needs below then fit easily in i128 */
    switch (flags >> 5) {
    case 0: b->workspace_bytes = answer; break;
    case 1: b->workspace_bytes = answer - 1 - (int64_t)take_u8(r); break;
    case 2: b->workspace_bytes = sane ? clamp_i64(bwd_need(f, b->deterministic, FC_FAMILY_SM80)) : 0; break;
    case 3: b->workspace_bytes = sane ? clamp_i64(bwd_need(f, b->deterministic, FC_FAMILY_SM80) - 1) : 0; break;
    case 4: b->workspace_bytes = sane ? clamp_i64(bwd_need(f, b->deterministic, FC_FAMILY_SM90)) : 0; break;
    case 5: b->workspace_bytes = sane ? clamp_i64(bwd_need(f, b->deterministic, FC_FAMILY_SM90) - 1) : 0; break;
    case 6: b->workspace_bytes = take_i64(r); break;
    default: b->workspace_bytes = 0; break;
    }
}

/* ---- the checks run on every struct ----------------------------------------------------------- */

static const int kQueryCC[] = {89, 90, 80, 86, 75, 100, 120, 0, 91, 8};

static void check_struct(const fc_params *p, int device) {
    g_current = p;
    fc_params before;
    memcpy(&before, p, sizeof before);

    const fc_status s = fc_params_validate(p);
    REQUIRE((int)s >= 0 && s < FC_STATUS_COUNT_ && s != FC_ERR_CUDA && s != FC_ERR_NULL_PARAMS);
    /* validation gives no FC_UNSUPPORTED_* but EMPTY (statuses added later sit at the end) */
    REQUIRE(s < FC_UNSUPPORTED_DTYPE || s == FC_ERR_BAD_WINDOW || s == FC_ERR_BAD_SOFTCAP || s == FC_ERR_BAD_PAGES ||
            s == FC_ERR_BAD_VARLEN || (s == FC_UNSUPPORTED_VARLEN && p->cu_seq_q != NULL && (p->windowed || p->causal)));
    if (s == FC_OK) REQUIRE(p->softcap >= 0.0f && isfinite(p->softcap));
    REQUIRE(fc_status_string(s) != NULL && fc_status_string(s)[0] != '\0');
    REQUIRE(fc_params_validate(p) == s);
    if (s == FC_OK) accepted_is_consistent(p);
    if (s == FC_OK) {
        const fc_params r = resolved_of(p);
        REQUIRE(fc_decode_packs_for_sm90(&r) == packs_by_validation(&r));
    }

    for (size_t i = 0; i < sizeof kQueryCC / sizeof kQueryCC[0]; ++i) {
        const int cc = kQueryCC[i];
        const fc_status sup = fc_sdpa_support(p, cc / 10, cc % 10);
        const fc_family fam = fc_sdpa_family(p, cc / 10, cc % 10);
        REQUIRE(fc_status_string(sup) != NULL);
        if (s != FC_OK) REQUIRE(sup == s);
        else REQUIRE(sup == FC_OK || (sup >= FC_UNSUPPORTED_DTYPE && sup < FC_ERR_CUDA) ||
                     sup == FC_UNSUPPORTED_BAND || sup == FC_UNSUPPORTED_SINKS || sup == FC_UNSUPPORTED_SOFTCAP ||
                     sup == FC_UNSUPPORTED_SLOWER_MASK || sup == FC_UNSUPPORTED_PAGED || sup == FC_UNSUPPORTED_VARLEN);
        REQUIRE((sup == FC_OK) == (fam != FC_FAMILY_AUTO));
        if (sup == FC_OK) supported_is_runnable(p, cc, fam);
        /* The plan (fc_sdpa_plan) answers as the support query and names the same family; a
         * failed plan launches nothing. It validates the caller's struct once, whatever the
         * call (the decode route's packing check included: dispatch.c). */
        {
            fc_fwd_plan plan;
            const unsigned long long validations = fc_validations_on_thread_();
            REQUIRE(fc_sdpa_plan(p, cc / 10, cc % 10, 132, &plan) == sup);
            REQUIRE(fc_validations_on_thread_() - validations == 1);
            REQUIRE(plan.family == fam && plan.splits >= 1 && plan.workspace_bytes >= 0);
            REQUIRE((plan.launch_ != NULL) == (sup == FC_OK));
            /* a workspace for splits, or a packed call's list of query blocks (never split) */
            const int packed_plan = sup == FC_OK && p->cu_seq_q != NULL;
            REQUIRE((plan.workspace_bytes > 0) == (plan.splits > 1 || packed_plan));
            if (packed_plan) REQUIRE(plan.splits == 1 && plan.workspace_bytes == fc_varlen_workspace_bytes(p));
            if (sup != FC_OK)
                REQUIRE(fc_sdpa_fwd_planned(&plan, (void *)(uintptr_t)0x7f0000400000ull, NULL, NULL, 0,
                                            (cudaStream_t)0) == FC_ERR_NULL_POINTER);
        }
        if (sup == FC_UNSUPPORTED_BAND) REQUIRE(resolved_of(p).band_ == FC_BAND_GENERAL_);
        if (sup == FC_UNSUPPORTED_SINKS) REQUIRE(p->sinks != NULL);
        if (sup == FC_UNSUPPORTED_SOFTCAP) REQUIRE(p->softcap != 0.0f);
        if (sup == FC_UNSUPPORTED_PAGED) REQUIRE(p->block_table != NULL);
        if (sup == FC_UNSUPPORTED_VARLEN) REQUIRE(p->cu_seq_q != NULL);
        /* A packed call the sm90 forward takes (fp16 / bf16, D 64 / 128 / 256, its layout, no
         * mask, softcap, sinks or pages) runs there on sm_90, AUTO or forced sm90. */
        if (s == FC_OK && p->cu_seq_q != NULL && cc == 90 && sm90_takes(p) &&
            (p->head_dim == 64 || p->head_dim == 128 || p->head_dim == 256) &&
            (p->dtype == FC_DTYPE_FP16 || p->dtype == FC_DTYPE_BF16) && p->mask_kind == FC_MASK_NONE &&
            p->softcap == 0.0f && p->sinks == NULL && p->block_table == NULL &&
            (p->family == FC_FAMILY_AUTO || p->family == FC_FAMILY_SM90))
            REQUIRE(sup == FC_OK && fam == FC_FAMILY_SM90);
        if (sup == FC_ERR_BAD_PAGES) REQUIRE(s == FC_ERR_BAD_PAGES);
        /* A paged call the decode kernels take (decode-shaped, D 64 / 128, fp16 / bf16, no causal,
         * band, mask, sinks or softcap) runs there on sm_89 and sm_90, AUTO or forced decode. */
        if (s == FC_OK && p->block_table != NULL && p->cu_seq_q == NULL && (cc == 89 || cc == 90) && decode_takes(p) &&
            (p->head_dim == 64 || p->head_dim == 128) && (p->dtype == FC_DTYPE_FP16 || p->dtype == FC_DTYPE_BF16) &&
            !resolved_of(p).causal && p->mask_kind == FC_MASK_NONE && p->sinks == NULL && p->softcap == 0.0f &&
            (p->family == FC_FAMILY_AUTO || p->family == FC_FAMILY_DECODE))
            REQUIRE(sup == FC_OK && fam == FC_FAMILY_DECODE);
        /* Declined only for a reason that holds: the layout reason only for a forced sm90. */
        /* The speed reason only for AUTO on Hopper, unmasked, a head dim sm90 lacks. */
        if (sup == FC_UNSUPPORTED_SLOWER)
            REQUIRE(p->family == FC_FAMILY_AUTO && cc == 90 && p->mask_kind == FC_MASK_NONE &&
                    p->head_dim != 64 && p->head_dim != 128 && p->head_dim != 256);
        /* The masked speed reason: only AUTO on Hopper, with a mask, without an LSE (never a
         * forced family, never a call that wants the LSE), and exactly where the model says so. */
        if (sup == FC_UNSUPPORTED_SLOWER_MASK)
            REQUIRE(s == FC_OK && p->family == FC_FAMILY_AUTO && cc == 90 && p->mask_kind != FC_MASK_NONE &&
                    p->lse == NULL);
        if (s == FC_OK) REQUIRE((sup == FC_UNSUPPORTED_SLOWER_MASK) == auto_leaves_mask_to_sdpa(p, cc));
        if (sup == FC_UNSUPPORTED_LAYOUT)
            REQUIRE((p->family == FC_FAMILY_SM90 && !sm90_takes(p)) ||
                    (p->family == FC_FAMILY_DECODE && !decode_takes(p)));
        /* The mask reason only with a mask; a forced sm90 family gives it for a mask it does not
         * take, or (dispatch.c's last resort for a forced family, which does not tell the two
         * apart) for a mask it takes on a layout it does not. */
        if (sup == FC_UNSUPPORTED_MASK) {
            REQUIRE(p->mask_kind != FC_MASK_NONE);
            if (p->family == FC_FAMILY_SM90) REQUIRE(!sm90_takes_mask(p) || !sm90_takes(p));
        }
        /* A masked call the sm90 family takes (mask and layout) runs there on sm_90, under AUTO
         * (unless the decode kernels take it first) and forced alike (its D=64 / 128 kernels are
         * built here: ci/fuzz.sh). */
        if (s == FC_OK && cc == 90 && p->mask_kind != FC_MASK_NONE && sm90_takes_mask(p) && sm90_takes(p) &&
            p->block_table == NULL && p->cu_seq_q == NULL &&
            (p->dtype == FC_DTYPE_FP16 || p->dtype == FC_DTYPE_BF16) &&
            (p->family == FC_FAMILY_SM90 || (p->family == FC_FAMILY_AUTO && !decode_takes_masked(p))))
            REQUIRE(sup == FC_OK && fam == FC_FAMILY_SM90);
    }

    /* The launch path on a stubbed device: same answer as the support query for its CC. */
    g_device = device;
    g_expected_launch = p;
    g_launches = 0;
    const int cc = kDeviceCC[(unsigned)device % 8u];
    const unsigned long long validations = fc_validations_on_thread_();
    const fc_status f = fc_sdpa_fwd(p, (cudaStream_t)0);
    REQUIRE(fc_validations_on_thread_() - validations == 1); /* (its plan's, or beside a failed device query) */
    /* A packed call needs its workspace (the list of query blocks): without it, FC_ERR_BAD_WORKSPACE. */
    const fc_status sup_here = fc_sdpa_support(p, cc / 10, cc % 10);
    const int packed_short = sup_here == FC_OK && p->cu_seq_q != NULL &&
                             (p->workspace == NULL || p->workspace_bytes < fc_varlen_workspace_bytes(p));
    REQUIRE(f == (packed_short ? FC_ERR_BAD_WORKSPACE : sup_here));
    /* A packed one-row GQA call launches with heads_kv query heads (fc_pack_decode_gqa). */
    const fc_params r = resolved_of(p);
    const int packs = fc_sdpa_family(p, cc / 10, cc % 10) == FC_FAMILY_SM90 && fc_decode_packs_for_sm90(&r);
    const int64_t launched_heads = packs ? p->heads_kv : p->heads_q;
    if (f != FC_OK) REQUIRE(g_launches == 0);
    else if (p->cu_seq_q != NULL || (p->batch <= 65535 && launched_heads <= 65535)) REQUIRE(g_launches == 1);
    else REQUIRE(g_launches >= 2);
    REQUIRE(fc_last_cuda_error() == cudaSuccess);

    REQUIRE(memcmp(&before, p, sizeof before) == 0); /* const really is const */
}

/* The canonical layout on sane sizes is never rejected for a layout reason. */
static void check_contiguous(reader *r, fc_params *p) {
    fc_params_init(p);
    p->batch = take_size(r, 2);
    p->heads_kv = take_size(r, 2);
    p->heads_q = (int64_t)((uint64_t)p->heads_kv * (uint64_t)(1 + take_u8(r) % 8));
    p->seqlen_q = take_size(r, 100);
    p->seqlen_k = take_size(r, 300);
    p->head_dim = take_size(r, 64);
    p->dtype = (fc_dtype)(take_u8(r) % 3);
    p->scale = 0.125f;
    p->q = (const void *)0x7f0000100000u;
    p->k = (const void *)0x7f0000200000u;
    p->v = (const void *)0x7f0000300000u;
    p->out = (void *)0x7f0000400000u;
    const i128 B = p->batch, Hq = p->heads_q, Hkv = p->heads_kv, Sq = p->seqlen_q,
               Sk = p->seqlen_k, D = p->head_dim;
    int64_t n_q = 0, n_kv = 0;
    const int sane = B >= 1 && Hkv >= 1 && Hq >= 1 && Sq >= 1 && Sk >= 1 && D >= 1 &&
                     Hq % Hkv == 0 && /* the wrapping product above may break it */
                     !__builtin_mul_overflow(p->batch, p->heads_q, &n_q) &&
                     !__builtin_mul_overflow(n_q, p->seqlen_q, &n_q) &&
                     !__builtin_mul_overflow(n_q, p->head_dim, &n_q) &&
                     !__builtin_mul_overflow(p->batch, p->heads_kv, &n_kv) &&
                     !__builtin_mul_overflow(n_kv, p->seqlen_k, &n_kv) &&
                     !__builtin_mul_overflow(n_kv, p->head_dim, &n_kv);
#if !FC_FUZZ_STRICT
    /* Known bug C: fc_params_set_contiguous_strides overflows (UB) on sizes like these. */
    if (!sane) return;
#endif
    fc_params_set_contiguous_strides(p);
    check_struct(p, take_u8(r));
    if (!sane) return;
    const fc_status s = fc_params_validate(p);
    /* Exactly the dims stepped over (size > 1) need 16-byte strides. */
    const i128 e = elem_bytes(p->dtype);
    const int aligned_rows =
        (B == 1 || (Hq * Sq * D * e) % 16 == 0) && (B == 1 || (Hkv * Sk * D * e) % 16 == 0) &&
        (Hq == 1 || (Sq * D * e) % 16 == 0) && (Hkv == 1 || (Sk * D * e) % 16 == 0) &&
        (Sq == 1 || (D * e) % 16 == 0) && (Sk == 1 || (D * e) % 16 == 0);
    /* The last byte must fit int64 too: fp32 (4 bytes) elements counted in int64 may not. */
    const int fits = Sq * D <= INT32_MAX && Sk * D <= INT32_MAX &&
                     (Sq + 63) / 64 * Hq * B <= INT32_MAX &&
                     ((i128)n_q - 1) * e <= INT64_MAX && ((i128)n_kv - 1) * e <= INT64_MAX;
    if (aligned_rows && fits) REQUIRE(s == FC_OK);
    if (s != FC_OK) REQUIRE(s == FC_ERR_STRIDE_ALIGNMENT || s == FC_ERR_OFFSET_OVERFLOW);
}


/*
 * The backward C layer (c_src/bwd.c) on one fc_bwd_params: validation, the support query and
 * family on every compute capability of kQueryCC against the model above, the workspace size,
 * and fc_sdpa_bwd on an sm_89 device, an sm_90 one and the input's.
 */
static void check_bwd(const fc_bwd_params *b, int device) {
    const fc_params *f = &b->fwd;
    g_current = f;
    g_current_bwd = b;
    g_expected_launch = NULL; /* no forward launch from here */
    fc_bwd_params before;
    memcpy(&before, b, sizeof before);

    const fc_status v = fc_bwd_params_validate(b);
    REQUIRE((int)v >= 0 &&
            (v < FC_UNSUPPORTED_DTYPE || v == FC_ERR_BAD_WINDOW || v == FC_ERR_BAD_SOFTCAP || v == FC_ERR_BAD_PAGES ||
             v == FC_ERR_BAD_VARLEN || v == FC_UNSUPPORTED_VARLEN) &&
            v != FC_ERR_NULL_PARAMS);
    REQUIRE(fc_status_string(v) != NULL && fc_status_string(v)[0] != '\0');
    REQUIRE(fc_bwd_params_validate(b) == v);
    /* The forward's checks come first. */
    const fc_status fv = fc_params_validate(f);
    if (fv != FC_OK) REQUIRE(v == fv);
    if (v == FC_OK) bwd_accepted_is_consistent(b);
    /* A packed call's gradients and dlse lie along the packed rows: a batch stride among them is
     * FC_ERR_BAD_VARLEN, checked after the pointers, the workspace and the grid (whose batch is
     * one item for a packed call); and that is the only way the backward's own checks give it. */
    {
        const int packed = f->cu_seq_q != NULL;
        const int grad_batch_stride = b->do_stride_b != 0 || b->dq_stride_b != 0 || b->dk_stride_b != 0 ||
                                      b->dv_stride_b != 0 || (b->dlse != NULL && b->dlse_stride_b != 0);
        const int before_it = fv == FC_OK && f->lse != NULL && b->dout != NULL && b->dq != NULL && b->dk != NULL &&
                              b->dv != NULL && b->workspace_bytes >= 0 && ((uintptr_t)b->workspace & 15u) == 0 &&
                              f->heads_q <= 65535 && (packed || f->batch <= 65535);
        if (before_it && packed && grad_batch_stride) REQUIRE(v == FC_ERR_BAD_VARLEN);
        if (v == FC_ERR_BAD_VARLEN) REQUIRE(fv == FC_ERR_BAD_VARLEN || (packed && grad_batch_stride));
    }

    /* The workspace size: the validation status; when valid, 16-byte multiples enough for the
     * sm80-class family (8 bytes per query row, and D x 4 more in one pass) and, where its kernel is built, the sm90 one
     * (dispatch.h's fc_sm90_bwd_workspace_bytes, which is docs/USAGE.md's formula); a packed
     * call: the sm90 family's need alone (fc_sm90_bwd_varlen_workspace_bytes), or 0. */
    int64_t ws = -1;
    REQUIRE(fc_sdpa_bwd_workspace_size(b, &ws) == v);
    REQUIRE(fc_sdpa_bwd_workspace_size(b, NULL) == FC_ERR_NULL_POINTER);
    if (v != FC_OK) {
        REQUIRE(ws == 0);
    } else {
        REQUIRE(ws % 16 == 0);
        if (f->cu_seq_q == NULL) {
            REQUIRE((i128)ws >= (i128)8 * f->batch * f->heads_q * f->seqlen_q);
            REQUIRE((i128)ws >= bwd_need(f, b->deterministic, FC_FAMILY_SM80));
        } else {
            /* A packed call: the sm90 family's need alone (no other family runs it). */
            REQUIRE((i128)ws == (bwd_built(FC_FAMILY_SM90, f->head_dim, f->dtype) ? bwd_need(f, b->deterministic, FC_FAMILY_SM90) : 0));
        }
        if (f->head_dim == 64 || f->head_dim == 128 || f->head_dim == 256) {
            /* (other head dims have no sm90 kernel; their byte count may not fit int64) */
            REQUIRE(round16(f->cu_seq_q != NULL ? fc_sm90_bwd_varlen_workspace_bytes(f) : fc_sm90_bwd_workspace_bytes(f)) ==
                    bwd_need(f, b->deterministic, FC_FAMILY_SM90));
        }
        if (bwd_built(FC_FAMILY_SM90, f->head_dim, f->dtype)) REQUIRE((i128)ws >= bwd_need(f, b->deterministic, FC_FAMILY_SM90));
    }

    const int dtype_ok = f->dtype == FC_DTYPE_FP16 || f->dtype == FC_DTYPE_BF16;
    for (size_t i = 0; i < sizeof kQueryCC / sizeof kQueryCC[0]; ++i) {
        const int cc = kQueryCC[i];
        const fc_status sup = fc_sdpa_bwd_support(b, cc / 10, cc % 10);
        const fc_family fam = fc_sdpa_bwd_family(b, cc / 10, cc % 10);
        REQUIRE(fc_status_string(sup) != NULL);
        REQUIRE(fc_sdpa_bwd_support(b, cc / 10, cc % 10) == sup);
        /* support == FC_OK implies validate == FC_OK; family AUTO iff unsupported, else SM80 / SM90 */
        if (v != FC_OK) REQUIRE(sup == v);
        else REQUIRE(sup == FC_OK || (sup >= FC_UNSUPPORTED_DTYPE && sup < FC_ERR_CUDA) ||
                     sup == FC_UNSUPPORTED_BAND || sup == FC_UNSUPPORTED_SOFTCAP || sup == FC_UNSUPPORTED_PAGED ||
                     sup == FC_UNSUPPORTED_VARLEN);
        REQUIRE((sup == FC_OK) == (fam != FC_FAMILY_AUTO));
        REQUIRE(fam == FC_FAMILY_AUTO || fam == FC_FAMILY_SM80 || fam == FC_FAMILY_SM90);
        if (v != FC_OK) continue;
        if (sup == FC_OK) bwd_supported_is_runnable(b, cc, fam);
        if (b->deterministic && f->family == FC_FAMILY_AUTO) REQUIRE(fam != FC_FAMILY_SM90);
        /* The choice, modelled: AUTO takes the sm90 family where it runs the call and determinism
         * is not asked for, else the sm80-class one; a forced sm80 / sm90 family runs where it
         * can, or the call is declined (never moved to the other family). Masks: either family,
         * not with causal (but the sm90 family's causal masked variant, bwd_sm90_mask_causal). */
        /* (causal and the band as the library resolves them: a general band, sm90 only) */
        const fc_params rf = resolved_of(f);
        const int general = rf.band_ == FC_BAND_GENERAL_;
        /* (a softcap: the sm90 family without a mask (at D=256: or a bool one), the sm80-class
         * family with or without one) */
        const int softcap = f->softcap != 0.0f;
        /* (a paged forward: no backward kernel reads pages, whatever else holds; packed
         * sequences: the sm90 family alone, with nothing but causal) */
        const int paged = f->block_table != NULL, packed = f->cu_seq_q != NULL;
        const int packed_plain = f->mask_kind == FC_MASK_NONE && !softcap && !general && f->sinks == NULL;
        const int sm80 = dtype_ok && (f->mask_kind == FC_MASK_NONE || !rf.causal) && !general && !paged && !packed &&
                         bwd_family_possible(b, FC_FAMILY_SM80, cc);
        const int sm90 = dtype_ok &&
                         (f->mask_kind == FC_MASK_NONE || (!rf.causal && (!softcap || sm90_softcap_mask_ok(f))) ||
                          bwd_sm90_mask_causal(f)) &&
                         !paged &&
                         (!packed || packed_plain) &&
                         bwd_family_possible(b, FC_FAMILY_SM90, cc);
        REQUIRE((sup == FC_UNSUPPORTED_PAGED) == paged);
        if (sup == FC_UNSUPPORTED_VARLEN) REQUIRE(packed && !paged);
        /* AUTO declines a packed call the sm90 family does not run (or determinism rules out)
         * with FC_UNSUPPORTED_VARLEN: the sm80-class family is not tried. */
        if (packed && !paged && dtype_ok && f->family == FC_FAMILY_AUTO && !(sm90 && !b->deterministic))
            REQUIRE(sup == FC_UNSUPPORTED_VARLEN);
        if (packed && !paged) REQUIRE(sup == bwd_packed_status(b, cc));
        if (f->family == FC_FAMILY_AUTO) {
            const fc_family want = sm90 && !b->deterministic ? FC_FAMILY_SM90 : sm80 ? FC_FAMILY_SM80 : FC_FAMILY_AUTO;
            REQUIRE(fam == want);
        } else if (f->family == FC_FAMILY_SM80 || f->family == FC_FAMILY_SM90) {
            const int runs = f->family == FC_FAMILY_SM80 ? sm80 : sm90;
            REQUIRE(fam == f->family || fam == FC_FAMILY_AUTO);
            if (!runs) REQUIRE(fam == FC_FAMILY_AUTO);
            /* A forced sm90 family with determinism asked for: flashcore.h says only what AUTO
             * does then; bwd.c runs the forced family (either answer is accepted here). */
            if (runs && !(f->family == FC_FAMILY_SM90 && b->deterministic)) REQUIRE(fam == f->family);
        } else {
            REQUIRE(sup != FC_OK); /* the decode family has no backward */
        }
        /* Declined only for a reason that holds. */
        if (sup == FC_UNSUPPORTED_DTYPE) REQUIRE(!dtype_ok);
        if (sup == FC_UNSUPPORTED_MASK) REQUIRE(f->mask_kind != FC_MASK_NONE);
        if (sup == FC_UNSUPPORTED_BAND) REQUIRE(general);
        if (sup == FC_UNSUPPORTED_SOFTCAP) REQUIRE(softcap);
        if (sup == FC_UNSUPPORTED_LAYOUT) REQUIRE(f->family == FC_FAMILY_SM90 && !bwd_sm90_takes(b));
        if (sup == FC_UNSUPPORTED_ARCH) REQUIRE(f->family == FC_FAMILY_AUTO && !bwd_family_runs_on(FC_FAMILY_SM80, cc));
        if (sup == FC_UNSUPPORTED_FAMILY)
            REQUIRE(f->family != FC_FAMILY_AUTO &&
                    ((f->family != FC_FAMILY_SM80 && f->family != FC_FAMILY_SM90) || !bwd_family_runs_on(f->family, cc)));
        if (sup == FC_UNSUPPORTED_HEAD_DIM)
            REQUIRE(!bwd_built(f->family == FC_FAMILY_SM90 ? FC_FAMILY_SM90 : FC_FAMILY_SM80, f->head_dim, f->dtype));
        REQUIRE(sup != FC_UNSUPPORTED_SLOWER && sup != FC_UNSUPPORTED_SLOWER_MASK && sup != FC_UNSUPPORTED_EMPTY);
    }

    /* The launch on stubbed devices: sm_89, sm_90 and the input's (kDeviceCC). */
    const int devices[3] = {0, 1, device};
    for (int i = 0; i < 3; ++i) {
        g_device = devices[i];
        const int cc = kDeviceCC[(unsigned)g_device % 8u];
        g_expected_bwd = b;
        g_bwd_launches = 0;
        g_bwd_launched_family = FC_FAMILY_AUTO;
        const fc_status s = fc_sdpa_bwd(b, (cudaStream_t)0);
        g_expected_bwd = NULL;
        const fc_status sup = fc_sdpa_bwd_support(b, cc / 10, cc % 10);
        if (sup != FC_OK) {
            REQUIRE(s == sup && g_bwd_launches == 0);
        } else {
            const fc_family fam = fc_sdpa_bwd_family(b, cc / 10, cc % 10);
            const i128 need = bwd_need(f, b->deterministic, fam);
            if (b->workspace == NULL || (i128)b->workspace_bytes < need) {
                REQUIRE(s == FC_ERR_BAD_WORKSPACE && g_bwd_launches == 0);
            } else {
                REQUIRE(s == FC_OK && g_bwd_launches == 1 && g_bwd_launched_family == fam);
            }
            /* The size query's answer is always enough. */
            if (b->workspace != NULL && b->workspace_bytes >= ws) REQUIRE(s == FC_OK);
        }
        REQUIRE(fc_last_cuda_error() == cudaSuccess);
    }

    REQUIRE(memcmp(&before, b, sizeof before) == 0); /* const really is const */
    g_current_bwd = NULL;
}


/*
 * The packed backward's rules over a grid of calls, once per run (the fuzzer seldom builds a
 * valid packed backward, and never one near the key-block list's int bound): a packed call in
 * the layout PyTorch's varlen ops hand over ((rows, heads, D) contiguous, every batch stride 0,
 * the LSE and dlse (Hq, total_q)), each through check_bwd with the workspace the size query
 * answers and with one byte less, and the answers stated here as literals, worked out by hand
 * from the rules (not from the model above): the sm90 family alone, on sm_90, D 64 / 128, AUTO
 * not under `deterministic`; FC_UNSUPPORTED_VARLEN for everything else that validates.
 */
enum {
    kPackedPlain, kPackedCausal, kPackedDeterministic, kPackedForcedSm80, kPackedForcedSm90Deterministic,
    kPackedForcedDecode, kPackedMask, kPackedForcedSm90Mask, kPackedForcedSm90MaskCausal, kPackedSoftcap,
    kPackedForcedSm90Softcap, kPackedSinks, kPackedWindow, kPackedBottomRight, kPackedD96, kPackedForcedSm90D96,
    kPackedD256, kPackedFp32, kPackedBf16, kPackedDqBatchStride, kPackedDlseBatchStride, kPackedDlse,
    kPackedBatch70000, kPackedHeads65536, kPackedDqRowsPastInt32, kPackedCases
};

static void set_fake_pointers(fc_params *p);

static void packed_bwd_call(fc_bwd_params *b, int64_t batch, int64_t heads_q, int64_t heads_kv, int64_t total_q,
                            int64_t total_k, int64_t head_dim) {
    fc_bwd_params_init(b);
    fc_params *f = &b->fwd;
    f->batch = batch, f->heads_q = heads_q, f->heads_kv = heads_kv, f->head_dim = head_dim, f->scale = 0.1f;
    f->seqlen_q = total_q, f->seqlen_k = total_k; /* (bounds of the sequences' lengths) */
    f->dtype = FC_DTYPE_FP16;
    set_fake_pointers(f);
    f->cu_seq_q = (const int32_t *)(uintptr_t)0x7f0000a00000ull;
    f->cu_seq_k = (const int32_t *)(uintptr_t)0x7f0000b00000ull;
    f->total_q = total_q, f->total_k = total_k;
    f->q_stride_d = f->k_stride_d = f->v_stride_d = f->o_stride_d = 1;
    f->q_stride_h = f->k_stride_h = f->v_stride_h = f->o_stride_h = head_dim;
    f->q_stride_s = f->o_stride_s = heads_q * head_dim;
    f->k_stride_s = f->v_stride_s = heads_kv * head_dim;
    f->lse_stride_h = total_q, f->lse_stride_s = 1;
    b->dout = (const void *)(uintptr_t)0x7f0000c00000ull;
    b->dq = (void *)(uintptr_t)0x7f0000d00000ull;
    b->dk = (void *)(uintptr_t)0x7f0000e00000ull;
    b->dv = (void *)(uintptr_t)0x7f0000f00000ull;
    b->do_stride_h = b->dq_stride_h = b->dk_stride_h = b->dv_stride_h = head_dim;
    b->do_stride_s = b->dq_stride_s = heads_q * head_dim;
    b->dk_stride_s = b->dv_stride_s = heads_kv * head_dim;
    b->do_stride_d = b->dq_stride_d = b->dk_stride_d = b->dv_stride_d = 1;
    b->workspace = (void *)(uintptr_t)0x7f0001000000ull;
}

/* check_bwd with the size query's workspace, then with one byte less; the size it answered. */
static int64_t check_packed_bwd_call(fc_bwd_params *b) {
    b->workspace_bytes = 0;
    int64_t ws = -1;
    const fc_status v = fc_sdpa_bwd_workspace_size(b, &ws);
    b->workspace_bytes = ws;
    check_bwd(b, 1);
    if (v == FC_OK && ws > 0) {
        b->workspace_bytes = ws - 1;
        check_bwd(b, 1);
        b->workspace_bytes = ws;
    }
    g_current = NULL;
    return ws;
}

static void check_bwd_packed_rule(void) {
    /* Exactly sizeof(fc_bwd_params) on the heap, as the fuzzed structs (check_bwd_input). */
    fc_bwd_params *b = (fc_bwd_params *)malloc(sizeof(fc_bwd_params));
    REQUIRE(b != NULL);
    fc_params *f = &b->fwd;

    /* One call's workspace by hand: 3 sequences, Hq 8, Hkv 2, total_q 250, total_k 700, D 128.
     * Key-block list: 16 + 32 x (700 / 128 rounded up + 3 = 9 entries) x (2 KV heads + the
     * scratch) = 880 bytes; rows 256 + 128 = 384 per query head, (2 + 128 + 8) x 4 bytes each,
     * 8 heads: 1695744; the tile counter 16: 1696640 (a multiple of 16). */
    packed_bwd_call(b, 3, 8, 2, 250, 700, 128);
    REQUIRE(check_packed_bwd_call(b) == 1696640);
    REQUIRE(fc_sdpa_bwd_support(b, 9, 0) == FC_OK && fc_sdpa_bwd_family(b, 9, 0) == FC_FAMILY_SM90);
    REQUIRE(fc_sdpa_bwd_support(b, 8, 9) == FC_UNSUPPORTED_VARLEN);

    for (int c = 0; c < kPackedCases; ++c)
        for (int d = 0; d < 2; ++d) {
            const int64_t D = d ? 128 : 64;
            packed_bwd_call(b, 3, 8, 2, 250, 700, D);
            /* the validation status, and the support query's on sm_90 and sm_89 */
            fc_status want_v = FC_OK, want_90 = FC_OK, want_89 = FC_UNSUPPORTED_VARLEN;
            switch (c) {
            case kPackedPlain: break;
            case kPackedCausal: f->causal = 1; break; /* top-left within each sequence */
            case kPackedDeterministic: b->deterministic = 1, want_90 = FC_UNSUPPORTED_VARLEN; break;
            case kPackedForcedSm80: f->family = FC_FAMILY_SM80, want_90 = FC_UNSUPPORTED_VARLEN; break;
            case kPackedForcedSm90Deterministic:
                f->family = FC_FAMILY_SM90, b->deterministic = 1, want_89 = FC_UNSUPPORTED_FAMILY;
                break;
            case kPackedForcedDecode: f->family = FC_FAMILY_DECODE, want_90 = want_89 = FC_UNSUPPORTED_FAMILY; break;
            case kPackedMask:
            case kPackedForcedSm90Mask:
            case kPackedForcedSm90MaskCausal:
                f->mask_kind = FC_MASK_BOOL, f->mask = (const void *)(uintptr_t)0x7f0000600000ull, f->mask_stride_k = 1;
                want_90 = FC_UNSUPPORTED_VARLEN;
                if (c != kPackedMask) f->family = FC_FAMILY_SM90, want_89 = FC_UNSUPPORTED_FAMILY;
                if (c == kPackedForcedSm90MaskCausal) f->causal = 1, want_90 = FC_UNSUPPORTED_MASK;
                break;
            case kPackedSoftcap: f->softcap = 30.0f, want_90 = FC_UNSUPPORTED_VARLEN; break;
            case kPackedForcedSm90Softcap:
                f->family = FC_FAMILY_SM90, f->softcap = 30.0f, want_90 = FC_UNSUPPORTED_VARLEN;
                want_89 = FC_UNSUPPORTED_FAMILY;
                break;
            case kPackedSinks:
                f->sinks = (const float *)(uintptr_t)0x7f0000700000ull, want_90 = FC_UNSUPPORTED_VARLEN;
                break;
            /* (a band per sequence: no kernel, declined by validation, the forward's rule) */
            case kPackedWindow: f->windowed = 1, f->window_left = 16, want_v = FC_UNSUPPORTED_VARLEN; break;
            case kPackedBottomRight:
                f->causal = 1, f->alignment = FC_ALIGN_BOTTOM_RIGHT, want_v = FC_UNSUPPORTED_VARLEN;
                break;
            case kPackedD96: packed_bwd_call(b, 3, 8, 2, 250, 700, 96), want_90 = FC_UNSUPPORTED_VARLEN; break;
            case kPackedForcedSm90D96:
                packed_bwd_call(b, 3, 8, 2, 250, 700, 96);
                f->family = FC_FAMILY_SM90, want_90 = FC_UNSUPPORTED_HEAD_DIM, want_89 = FC_UNSUPPORTED_FAMILY;
                break;
            case kPackedD256: packed_bwd_call(b, 3, 8, 2, 250, 700, 256); break; /* (64-key tiles, two per listed block) */
            case kPackedFp32: f->dtype = FC_DTYPE_FP32, want_90 = want_89 = FC_UNSUPPORTED_DTYPE; break;
            case kPackedBf16: f->dtype = FC_DTYPE_BF16; break;
            case kPackedDqBatchStride: b->dq_stride_b = 8 * D, want_v = FC_ERR_BAD_VARLEN; break;
            case kPackedDlseBatchStride:
                b->dlse = (const float *)(uintptr_t)0x7f0000800000ull;
                b->dlse_stride_b = 8 * 250, b->dlse_stride_h = 250, b->dlse_stride_s = 1;
                want_v = FC_ERR_BAD_VARLEN;
                break;
            case kPackedDlse:
                b->dlse = (const float *)(uintptr_t)0x7f0000800000ull;
                b->dlse_stride_h = 250, b->dlse_stride_s = 1;
                break;
            /* 70000 sequences: one item of rows for the grids, past 65535 batches as they are */
            case kPackedBatch70000:
                packed_bwd_call(b, 70000, 8, 2, 250000, 700000, D);
                f->seqlen_q = f->seqlen_k = 16;
                break;
            /* 65536 query heads: past CUDA's grid y, a packed call's too */
            case kPackedHeads65536:
                packed_bwd_call(b, 3, 65536, 65536, 4, 4, D), want_v = FC_ERR_OFFSET_OVERFLOW;
                break;
            /* dq's rows 2^24 elements apart: its slice is checked over total_q (250) rows, past
             * 2^31 elements, not over seqlen_q (16), which would fit */
            case kPackedDqRowsPastInt32:
                f->seqlen_q = 16, b->dq_stride_s = (int64_t)1 << 24, want_v = FC_ERR_OFFSET_OVERFLOW;
                break;
            default: break;
            }
            if (want_v != FC_OK) want_90 = want_89 = want_v;
            REQUIRE(fc_bwd_params_validate(b) == want_v);
            REQUIRE(fc_sdpa_bwd_support(b, 9, 0) == want_90 && fc_sdpa_bwd_support(b, 8, 9) == want_89);
            REQUIRE(fc_sdpa_bwd_family(b, 9, 0) == (want_90 == FC_OK ? FC_FAMILY_SM90 : FC_FAMILY_AUTO));
            REQUIRE(fc_sdpa_bwd_family(b, 8, 9) == FC_FAMILY_AUTO);
            const int64_t ws = check_packed_bwd_call(b);
            /* the size: the sm90 family's need where its kernel is built, else none */
            if (want_v != FC_OK || f->dtype == FC_DTYPE_FP32 || (f->head_dim != 64 && f->head_dim != 128 && f->head_dim != 256))
                REQUIRE(ws == 0);
            else
                REQUIRE(ws > 0);
        }

    /* The key-block list's tiles, (total_k / 128 rounded up + batch) x heads_kv (D=256: x 2), in an int: at
     * 65535 KV heads, 32768 entries fit (2147450880 tiles) and 32769 do not (2147516415). K and
     * V rows 16 bytes apart (overlapping) keep each head's slice inside 2^31 elements; seqlen_k
     * keeps the (128-key block, KV head, batch) count in an int on both sides, so only this rule
     * changes. AUTO declines the call past it as FC_UNSUPPORTED_VARLEN, a forced sm90 family as
     * FC_UNSUPPORTED_LAYOUT. */
    static const struct {
        int64_t batch, total_k, seqlen_k;
        int fits;
        int64_t D;
    } kCapacity[] = {
        {1, 128 * 32767, 128 * 32767, 1, 64},          /* 32767 + 1 entries */
        {1, 128 * 32767 + 1, 128 * 32767 + 1, 0, 64},  /* 32768 + 1 */
        {2, 128 * 32766, 64 * 32766, 1, 64},           /* 32766 + 2 */
        {2, 128 * 32767, 64 * 32767, 0, 64},           /* 32767 + 2; 16384 blocks x 65535 x 2 CTAs fit */
        /* D=256: two 64-key tiles per listed block, so half as many entries */
        {1, 128 * 16383, 128 * 16383, 1, 256},         /* 16383 + 1 entries: 2147450880 tiles */
        {1, 128 * 16383 + 1, 128 * 16383 + 1, 0, 256}, /* 16384 + 1 */
    };
    for (size_t i = 0; i < sizeof kCapacity / sizeof kCapacity[0]; ++i)
        for (int forced = 0; forced < 2; ++forced) {
            /* (64 query rows at D=256: each head's slice of q, 64 x 65535 x 256 elements, in 2^31) */
            packed_bwd_call(b, kCapacity[i].batch, 65535, 65535, kCapacity[i].D == 256 ? 64 : 256, kCapacity[i].total_k,
                            kCapacity[i].D);
            f->seqlen_k = kCapacity[i].seqlen_k;
            f->k_stride_s = f->v_stride_s = b->dk_stride_s = b->dv_stride_s = 8;
            f->k_stride_h = f->v_stride_h = b->dk_stride_h = b->dv_stride_h = 8;
            if (forced) f->family = FC_FAMILY_SM90;
            REQUIRE(fc_bwd_params_validate(b) == FC_OK);
            const fc_status want = kCapacity[i].fits ? FC_OK : forced ? FC_UNSUPPORTED_LAYOUT : FC_UNSUPPORTED_VARLEN;
            REQUIRE(fc_sdpa_bwd_support(b, 9, 0) == want);
            check_packed_bwd_call(b);
        }
    free(b);
    g_current = NULL;
    g_current_bwd = NULL;
}

/*
 * The split-KV heuristic's promises over a grid of shapes, once per run: the fuzzer rarely
 * reaches a decode call with a long Sk, few (batch, KV head) pairs and a workspace. At most
 * one wave of SMs x FC_DECODE_CTAS_PER_SM(p) CTAs, every key range at least 2 chunks of 32 keys,
 * at most 64 ranges.
 */
static void check_split_heuristic(void) {
    static const int64_t kSeqlenK[] = {1, 31, 32, 63, 64, 65, 1000, 4096, 32768, 131072, (int64_t)1 << 30};
    static const int kSms[] = {0, 1, 58, 132, 144};
    fc_params p;
    g_current = &p;
    for (int64_t ctas = 1; ctas <= 1000; ctas += ctas < 64 ? 1 : 37) {
        for (size_t i = 0; i < sizeof kSeqlenK / sizeof kSeqlenK[0]; ++i) {
            for (size_t j = 0; j < sizeof kSms / sizeof kSms[0]; ++j) {
                fc_params_init(&p);
                p.batch = ctas % 2 ? ctas : 2;  /* B x Hkv = ctas either way */
                p.heads_kv = ctas % 2 ? 1 : ctas / 2;
                p.heads_q = p.heads_kv * ((ctas + (int64_t)i) % 2 ? 4 : 32); /* both decode kernels */
                p.seqlen_q = 1;
                p.seqlen_k = kSeqlenK[i];
                p.head_dim = 128;
                const int sms = kSms[j] > 0 ? kSms[j] : 1;
                const int splits = fc_decode_splits(&p, kSms[j]);
                REQUIRE(splits >= 1 && splits <= 64);
                if (splits > 1) {
                    REQUIRE(ctas * splits <= FC_DECODE_CTAS_PER_SM(&p) * (int64_t)sms);
                    REQUIRE(splits * 2 <= (p.seqlen_k + 31) / 32);
                }
                /* It does split a call that leaves most of the wave empty and has the keys. */
                if (ctas * 2 <= FC_DECODE_CTAS_PER_SM(&p) * (int64_t)sms && p.seqlen_k >= 4 * 32) REQUIRE(splits >= 2);
                /* The Hopper family's grid split (one block per pair: Hq == Hkv here): one CTA per
                 * SM at most, ranges of at least 512 keys, only under 64 pairs, and a split
                 * whenever half the SMs are idle and the keys allow two ranges. */
                p.heads_q = p.heads_kv;
                const int grid_splits = fc_sm90_decode_splits(&p, kSms[j], 0, fc_decode_packs_for_sm90(&p));
                REQUIRE(grid_splits >= 1 && grid_splits <= 64);
                if (grid_splits > 1) {
                    REQUIRE(ctas < 64 && ctas * grid_splits <= (int64_t)sms);
                    REQUIRE(grid_splits * 512 <= p.seqlen_k);
                }
                if (ctas < 64 && ctas * 2 <= (int64_t)sms && p.seqlen_k >= 2 * 512) REQUIRE(grid_splits >= 2);
                /* FLASHCORE_DECODE_SPLITS (forced) sets the count over any number of pairs, at most 64. */
                REQUIRE(fc_sm90_decode_splits(&p, kSms[j], 7, fc_decode_packs_for_sm90(&p)) == 7);
                REQUIRE(fc_sm90_decode_splits(&p, kSms[j], 100, fc_decode_packs_for_sm90(&p)) == 64);
            }
        }
    }
    g_current = NULL;
}

/*
 * The sm90 family's prefill split (clusters of CTAs per tile): never more CTAs than one wave of
 * clusters of that size holds, at least min_key_tiles_per_split key tiles per range, at most
 * max_splits, no split for a grid that fills more than half the SMs, and a split whenever a
 * 2-cluster wave has room and the keys allow it. Waves: H100-like (clusters fill whole GPCs less a remainder), a card
 * where no cluster fits (all zero past 1), and tiny ones.
 */
static void check_prefill_split_heuristic(void) {
    static const int kWaves[][9] = {
        {0, 132, 132, 120, 128, 120, 120, 112, 128},
        {0, 132, 0, 0, 0, 0, 0, 0, 0},
        {0, 1, 0, 0, 0, 0, 0, 0, 0},
        {0, 16, 16, 15, 16, 15, 12, 14, 16},
    };
    static const int64_t kKeyTiles[] = {0, 1, 2, 3, 4, 7, 16, 24, 1000, (int64_t)1 << 40};
    for (size_t w = 0; w < sizeof kWaves / sizeof kWaves[0]; ++w)
        for (int64_t tiles = 0; tiles <= 300; ++tiles)
            for (size_t k = 0; k < sizeof kKeyTiles / sizeof kKeyTiles[0]; ++k)
                for (int max_splits = 1; max_splits <= 8; ++max_splits)
                    for (int min = FC_PREFILL_MIN_KEY_TILES_PER_SPLIT; min <= FC_PREFILL_MIN_KEY_TILES_PER_SPLIT_TINY;
                         min += FC_PREFILL_MIN_KEY_TILES_PER_SPLIT_TINY - FC_PREFILL_MIN_KEY_TILES_PER_SPLIT) {
                        const int *wave = kWaves[w];
                        const int s = fc_prefill_splits(tiles, kKeyTiles[k], min, wave, max_splits);
                        REQUIRE(s >= 1 && s <= max_splits);
                        if (s > 1) {
                            REQUIRE(tiles * s <= wave[s]);
                            REQUIRE(kKeyTiles[k] >= min * (int64_t)s);
                            REQUIRE(tiles * 2 <= wave[1]);
                        }
                        if (tiles >= 1 && tiles * 2 <= wave[1] && tiles * 2 <= wave[2] && kKeyTiles[k] >= 2 * min &&
                            max_splits >= 2)
                            REQUIRE(s >= 2);
                    }
    REQUIRE(fc_prefill_splits(4, 100, FC_PREFILL_MIN_KEY_TILES_PER_SPLIT, NULL, 8) == 1);
}

/*
 * The sm90 family's persistent grid for non-causal calls (fc_balanced_grid): one CTA per tile up
 * to a wave; past it, no more CTAs than SMs, the same number of rounds as a full wave, and the
 * fewest CTAs that keep it (one CTA fewer would need another round).
 */
static void check_balanced_grid(void) {
    for (int64_t sms = 1; sms <= 144; ++sms)
        for (int64_t tiles = 0; tiles <= 3000; ++tiles) {
            const int64_t g = fc_balanced_grid(tiles, sms);
            if (tiles <= sms) {
                REQUIRE(g == tiles);
                continue;
            }
            const int64_t rounds = (tiles + sms - 1) / sms;
            REQUIRE(g >= 1 && g <= sms);
            REQUIRE((tiles + g - 1) / g == rounds);
            REQUIRE(g == 1 || (tiles + g - 2) / (g - 1) > rounds);
        }
    REQUIRE(fc_balanced_grid(256, 132) == 128 && fc_balanced_grid(264, 132) == 132 && fc_balanced_grid(2048, 132) == 128);
    REQUIRE(fc_balanced_grid((int64_t)1 << 40, 132) <= 132);
}

/*
 * The sm90 family's D=64 configuration (fc_sm90_d64_config) on a 132-SM H100: the choices the
 * eighth and ninth sessions measured (docs/experiments/sessions-04-09.md), and over a grid of
 * shapes what each choice promises:
 * PAIR and TINY only for at most two waves of 64-row blocks (one when not causal), LONG whenever
 * the three-warpgroup grid fills a wave (not causal) or the 64-row grid fills more than
 * FC_SM90_D64_SHORT_CAUSAL_WAVES waves (causal).
 */
static void check_d64_config(void) {
    static const struct {
        int64_t b, h, sq, sk;
        int causal, want;
    } kMeasured[] = {
        {1, 8, 512, 512, 0, FC_SM90_D64_PAIR},     {1, 8, 512, 512, 1, FC_SM90_D64_PAIR},
        {1, 8, 256, 1024, 0, FC_SM90_D64_TINY},    {1, 8, 1024, 1024, 1, FC_SM90_D64_PAIR},
        {2, 8, 512, 512, 0, FC_SM90_D64_PAIR},     {1, 32, 256, 2048, 0, FC_SM90_D64_PAIR},
        {1, 32, 256, 8192, 0, FC_SM90_D64_PAIR},   {1, 32, 512, 2048, 0, FC_SM90_D64_SHORT},
        {1, 4, 2048, 8192, 0, FC_SM90_D64_PAIR},   {1, 8, 1536, 1536, 0, FC_SM90_D64_LONG},
        {1, 8, 2048, 2048, 0, FC_SM90_D64_SHORT},  {1, 8, 2048, 2048, 1, FC_SM90_D64_TINY},
        {1, 4, 4096, 4096, 1, FC_SM90_D64_TINY},   {1, 2, 8192, 8192, 0, FC_SM90_D64_SHORT},
        {1, 16, 1024, 1024, 1, FC_SM90_D64_TINY},  {4, 8, 512, 512, 1, FC_SM90_D64_SHORT},
        {1, 16, 256, 3072, 0, FC_SM90_D64_TINY},   {32, 32, 512, 512, 0, FC_SM90_D64_LONG},
        {32, 32, 512, 512, 1, FC_SM90_D64_SHORT},  {8, 32, 2048, 2048, 1, FC_SM90_D64_LONG},
        /* ninth session: causal grids past one wave of 64-row blocks */
        {1, 3, 4096, 4096, 1, FC_SM90_D64_PAIR},   {1, 2, 6144, 6144, 1, FC_SM90_D64_PAIR},
        {1, 1, 12288, 12288, 1, FC_SM90_D64_PAIR}, {1, 2, 8192, 8192, 1, FC_SM90_D64_PAIR},
        {1, 1, 16384, 16384, 1, FC_SM90_D64_PAIR}, {1, 4, 6144, 6144, 1, FC_SM90_D64_SHORT},
        {1, 16, 2048, 2048, 1, FC_SM90_D64_SHORT}, {1, 8, 4096, 4096, 1, FC_SM90_D64_SHORT},
        {1, 2, 16384, 16384, 1, FC_SM90_D64_SHORT}, {1, 16, 4096, 4096, 1, FC_SM90_D64_SHORT},
        {1, 8, 8192, 8192, 1, FC_SM90_D64_SHORT},  {1, 32, 4096, 4096, 1, FC_SM90_D64_LONG},
        {2, 32, 2048, 2048, 1, FC_SM90_D64_LONG},  {2, 32, 8192, 8192, 1, FC_SM90_D64_LONG},
        {4, 32, 4096, 4096, 1, FC_SM90_D64_LONG},  {1, 24, 3072, 3072, 1, FC_SM90_D64_LONG},
        {1, 4, 3072, 3072, 1, FC_SM90_D64_PAIR},   {1, 6, 3072, 3072, 1, FC_SM90_D64_SHORT},
        {1, 12, 2048, 2048, 1, FC_SM90_D64_SHORT}, {1, 5, 2048, 2048, 1, FC_SM90_D64_PAIR},
        {1, 6, 1536, 1536, 1, FC_SM90_D64_PAIR},   {1, 7, 2048, 2048, 1, FC_SM90_D64_TINY},
        {1, 3, 3072, 3072, 1, FC_SM90_D64_PAIR},   {1, 6, 2048, 2048, 1, FC_SM90_D64_TINY},
    };
    for (size_t i = 0; i < sizeof kMeasured / sizeof kMeasured[0]; ++i)
        REQUIRE(fc_sm90_d64_config(kMeasured[i].b, kMeasured[i].h, kMeasured[i].sq, kMeasured[i].sk,
                                   kMeasured[i].causal, 132) == kMeasured[i].want);
    static const int64_t kSeq[] = {1, 17, 64, 65, 127, 128, 300, 512, 1000, 1024, 1025, 2048, 4097, 8192, 32768};
    static const int64_t kSms[] = {1, 16, 78, 114, 132};
    for (size_t a = 0; a < sizeof kSeq / sizeof kSeq[0]; ++a)
        for (size_t c = 0; c < sizeof kSeq / sizeof kSeq[0]; ++c)
            for (int64_t heads = 1; heads <= 512; heads *= 2)
                for (size_t m = 0; m < sizeof kSms / sizeof kSms[0]; ++m)
                    for (int causal = 0; causal <= 1; ++causal) {
                        const int64_t sq = kSeq[a], sk = kSeq[c], sms = kSms[m];
                        const int got = fc_sm90_d64_config(1, heads, sq, sk, causal, sms);
                        const int64_t tiny_tiles = (sq + 63) / 64 * heads, long_tiles = (sq + 191) / 192 * heads;
                        REQUIRE(got >= FC_SM90_D64_LONG && got <= FC_SM90_D64_PAIR);
                        if (got == FC_SM90_D64_PAIR) REQUIRE(tiny_tiles <= (causal ? 2 : 1) * sms);
                        if (got == FC_SM90_D64_TINY) REQUIRE(tiny_tiles <= (causal ? 2 : 1) * sms);
                        if (long_tiles >= sms && !causal) REQUIRE(got == FC_SM90_D64_LONG);
                        if (causal && sq > FC_SM90_D64_SHORT_SEQLEN_Q && tiny_tiles > FC_SM90_D64_SHORT_CAUSAL_WAVES * sms)
                            REQUIRE(got == FC_SM90_D64_LONG);
                    }
}

/*
 * fc_pack_decode_gqa (the Hopper family's one-row GQA calls): every query head h = hk * group + j
 * of batch b, its output row and its LSE entry keep their element offsets as row j of KV head hk
 * in the packed call, and the packed call is an MHA call of `group` rows.
 */
/* Aligned, distinct, never dereferenced addresses (the launchers here are stubs). */
static void set_fake_pointers(fc_params *p) {
    p->q = (const void *)(uintptr_t)0x7f0000100000ull;
    p->k = (const void *)(uintptr_t)0x7f0000200000ull;
    p->v = (const void *)(uintptr_t)0x7f0000300000ull;
    p->out = (void *)(uintptr_t)0x7f0000400000ull;
    p->lse = (float *)(uintptr_t)0x7f0000500000ull;
}

static void check_decode_packing(void) {
    static const int64_t kStrides[][3] = {{4096, 128, 128}, {4096, 1024, 8}, {12800, 3200, 64}, {640, 128, 256}};
    for (int64_t group = 1; group <= 8; ++group)
        for (int64_t heads_kv = 1; heads_kv <= 3; ++heads_kv)
            for (size_t st = 0; st < sizeof kStrides / sizeof kStrides[0]; ++st) {
                fc_params p;
                fc_params_init(&p);
                p.batch = 2, p.heads_kv = heads_kv, p.heads_q = heads_kv * group, p.seqlen_q = 1, p.seqlen_k = 77;
                p.head_dim = 128, p.scale = 0.1f;
                fc_params_set_contiguous_strides(&p);
                set_fake_pointers(&p);  /* packing checks the packed call as validation would */
                p.q_stride_b = p.o_stride_b = kStrides[st][0] * heads_kv * group;
                p.q_stride_h = p.o_stride_h = kStrides[st][1];
                p.q_stride_s = p.o_stride_s = kStrides[st][2];
                p.lse_stride_b = 3 * p.heads_q, p.lse_stride_h = 3, p.lse_stride_s = 1;
                REQUIRE(fc_decode_packs_for_sm90(&p) == (group > 1));
                REQUIRE(fc_decode_packs_for_sm90(&p) == packs_by_validation(&p));
                fc_params packed = p;
                REQUIRE(fc_pack_decode_gqa(&packed));
                REQUIRE(packed.heads_q == heads_kv && packed.heads_kv == heads_kv && packed.seqlen_q == group);
                for (int64_t b = 0; b < p.batch; ++b)
                    for (int64_t h = 0; h < p.heads_q; ++h) {
                        const int64_t hk = h / group, j = h % group;
                        REQUIRE(b * p.q_stride_b + h * p.q_stride_h ==
                                b * packed.q_stride_b + hk * packed.q_stride_h + j * packed.q_stride_s);
                        REQUIRE(b * p.o_stride_b + h * p.o_stride_h ==
                                b * packed.o_stride_b + hk * packed.o_stride_h + j * packed.o_stride_s);
                        REQUIRE(b * p.lse_stride_b + h * p.lse_stride_h ==
                                b * packed.lse_stride_b + hk * packed.lse_stride_h + j * packed.lse_stride_s);
                    }
                p.causal = 1;
                REQUIRE(!fc_decode_packs_for_sm90(&p));
            }
    /* A packed slice must end inside the kernels' int offsets: (group - 1) * head stride + D
     * elements for q and out, (group - 1) * head stride + 1 for the LSE. At the widest stride
     * validation allows (q and out strides step 16 bytes) it packs; one step more runs unpacked,
     * and the call as given stays valid. */
    for (int which = 0; which < 3; ++which) {
        fc_params p;
        fc_params_init(&p);
        p.batch = 1, p.heads_kv = 2, p.heads_q = 16, p.seqlen_q = 1, p.seqlen_k = 77, p.head_dim = 128, p.scale = 0.1f;
        fc_params_set_contiguous_strides(&p);
        set_fake_pointers(&p);
        p.lse_stride_b = 16, p.lse_stride_h = 1, p.lse_stride_s = 1;
        const int64_t row_len = which == 2 ? 1 : p.head_dim, step = which == 2 ? 1 : 8;
        const int64_t widest = (INT32_MAX - row_len) / 7 / step * step; /* group 8: rows 0..7 */
        int64_t *stride_h = which == 0 ? &p.q_stride_h : which == 1 ? &p.o_stride_h : &p.lse_stride_h;
        *stride_h = widest;
        REQUIRE(fc_params_validate(&p) == FC_OK);
        REQUIRE(fc_decode_packs_for_sm90(&p) && packs_by_validation(&p));
        *stride_h = widest + step;
        REQUIRE(fc_params_validate(&p) == FC_OK);
        REQUIRE(!fc_decode_packs_for_sm90(&p) && !packs_by_validation(&p));
    }
}

/*
 * The sm90 forward's mask rule over a grid of masked calls, once per run: the fuzzer's inputs
 * seldom reach a bool mask whose tiles TMA can bring (keys stride 1, rows a multiple of 16 bytes
 * apart). From a call the sm90 family takes (B=2, Hq=8, Hkv=2, Sk=300, mask rows padded to 304
 * bytes), one change at a time that keeps it there or leaves it to the sm80 family (or to no
 * family), for every family, head dims 64 / 128 (the mask's) and 32 / 80 / 96 / 256 (not),
 * Sq = 100, a decode-sized 4 and a one-row GQA call, with and without an LSE, on an sm_89 and an
 * sm_90 device: check_struct's checks (support, family, AUTO's preference, the launch, a declined
 * call's reason, and that a masked call the model says sm90 takes runs there), and AUTO's masked
 * speed rule (FC_UNSUPPORTED_SLOWER_MASK) case by case.
 */
enum {
    kMaskKeep, kMaskAdditive, kMaskCausal, kMaskWindow, kMaskBottomRight, kMaskWholeWindow, kMaskSoftcap,
    kMaskSinks, kMaskKeysStrided, kMaskRows300, kMaskRowsBroadcast, kMaskHeadStride8, kMaskBatchStride8,
    kMaskBase8, kMaskBroadcastHB, kMaskKvBroadcast, kMaskNegativeScale, kMaskStrides2to40, kMaskChanges
};

static void check_mask_rule(void) {
    static const fc_family kFamilies[] = {FC_FAMILY_AUTO, FC_FAMILY_SM80, FC_FAMILY_SM90, FC_FAMILY_DECODE};
    static const int64_t kDims[] = {64, 128, 96, 256, 32, 80};
    static const int64_t kSeqlenQ[] = {100, 4, 1};
    /* Exactly sizeof(fc_params) on the heap, as the fuzzed structs (check_struct). */
    fc_params *p = (fc_params *)malloc(sizeof(fc_params));
    REQUIRE(p != NULL);
    for (int change = 0; change < kMaskChanges; ++change)
        for (size_t f = 0; f < sizeof kFamilies / sizeof kFamilies[0]; ++f)
            for (size_t d = 0; d < sizeof kDims / sizeof kDims[0]; ++d)
                for (size_t q = 0; q < sizeof kSeqlenQ / sizeof kSeqlenQ[0]; ++q)
                    for (int run = 0; run < 4; ++run) {
                        const int device = run % 2, with_lse = run / 2; /* kDeviceCC: sm_89, sm_90 */
                        fc_params_init(p);
                        p->batch = 2, p->heads_q = 8, p->heads_kv = 2, p->seqlen_q = kSeqlenQ[q], p->seqlen_k = 300;
                        p->head_dim = kDims[d], p->scale = 0.1f;
                        p->dtype = (change + (int)d) % 2 ? FC_DTYPE_BF16 : FC_DTYPE_FP16;
                        fc_params_set_contiguous_strides(p);
                        set_fake_pointers(p);
                        if (!with_lse) p->lse = NULL;
                        p->mask_kind = FC_MASK_BOOL;
                        p->mask = (const void *)(uintptr_t)0x7f0000600000ull;
                        p->mask_stride_k = 1, p->mask_stride_q = 304;
                        p->mask_stride_h = p->seqlen_q * 304, p->mask_stride_b = 8 * p->seqlen_q * 304;
                        switch (change) {
                        case kMaskAdditive: p->mask_kind = FC_MASK_ADDITIVE; break;
                        case kMaskCausal: p->causal = 1; break;
                        case kMaskWindow: p->windowed = 1, p->window_left = 16, p->window_right = 0; break;
                        case kMaskBottomRight: p->causal = 1, p->alignment = FC_ALIGN_BOTTOM_RIGHT; break;
                        case kMaskWholeWindow: p->windowed = 1, p->window_left = -1, p->window_right = -1; break;
                        case kMaskSoftcap: p->softcap = 30.0f; break;
                        case kMaskSinks: p->sinks = (const float *)(uintptr_t)0x7f0000700000ull; break;
                        case kMaskKeysStrided:
                            p->mask_stride_k = 2, p->mask_stride_q *= 2, p->mask_stride_h *= 2, p->mask_stride_b *= 2;
                            break;
                        case kMaskRows300:
                            p->mask_stride_q = 300, p->mask_stride_h = p->seqlen_q * 300, p->mask_stride_b = 8 * p->seqlen_q * 300;
                            break;
                        case kMaskRowsBroadcast: p->mask_stride_q = 0; break;
                        case kMaskHeadStride8: p->mask_stride_h += 8; break;
                        case kMaskBatchStride8: p->mask_stride_b += 8; break;
                        case kMaskBase8: p->mask = (const char *)p->mask + 8; break;
                        case kMaskBroadcastHB: p->mask_stride_h = 0, p->mask_stride_b = 0; break;
                        case kMaskKvBroadcast: p->k_stride_b = 0, p->v_stride_b = 0; break;
                        case kMaskNegativeScale: p->scale = -0.1f; break;
                        /* Head and batch strides of 2^40 bytes: accepted, and past what a TMA map
                         * holds (the strict E check at the sm90 launch). */
                        case kMaskStrides2to40: p->mask_stride_h = p->mask_stride_b = (int64_t)1 << 40; break;
                        default: break;
                        }
                        p->family = kFamilies[f];
                        REQUIRE(fc_params_validate(p) == FC_OK);
                        check_struct(p, device);
                        /* The rule's cases, as the model states them. */
                        const int takes = sm90_takes_mask(p);
                        if (change == kMaskKeep || change == kMaskWholeWindow || change == kMaskBroadcastHB ||
                            change == kMaskKvBroadcast || change == kMaskNegativeScale)
                            REQUIRE(takes == (kDims[d] == 64 || kDims[d] == 128 || kDims[d] == 256));
                        else if (change == kMaskCausal) /* top-left causal */
                            REQUIRE(takes == (kDims[d] == 64 || kDims[d] == 128 || kDims[d] == 256));
                        else if (change == kMaskWindow || change == kMaskBottomRight) /* (one row: every key, or key 0) */
                            REQUIRE(!takes || resolved_of(p).band_ != FC_BAND_GENERAL_);
                        else
                            REQUIRE(!takes);
                        /* AUTO's masked speed rule, case by case: on sm_90, without an LSE, a call the
                         * sm90 family does not run (its mask rule, or a layout it cannot take: K/V
                         * broadcast, a negative scale) is left to PyTorch's SDPA at D=64 / 128 / 256, and at
                         * the other head dims when its mask is additive, broadcast over the query rows
                         * or it has one query row (unless the decode kernels take it: up to 16
                         * rows, no causal, band, softcap or sinks); never with a causal flag or a band (as resolved), a softcap or sinks, never with an
                         * LSE, on sm_89 or for a forced family. Every other AUTO call here runs. */
                        const int cc = kDeviceCC[device];
                        const fc_status sup = fc_sdpa_support(p, cc / 10, cc % 10);
                        const fc_params r = resolved_of(p);
                        const int sdpa_expresses = !r.causal && r.band_ != FC_BAND_GENERAL_ &&
                                                   change != kMaskSoftcap && change != kMaskSinks;
                        const int sm90_runs = takes && change != kMaskKvBroadcast && change != kMaskNegativeScale;
                        const int wide = kDims[d] == 64 || kDims[d] == 128 || kDims[d] == 256;
                        const int decode_runs = decode_takes_masked(p) && change != kMaskSoftcap &&
                                                change != kMaskSinks &&
                                                !(cc == 90 && !with_lse && p->mask_kind == FC_MASK_ADDITIVE &&
                                                  kFamilies[f] == FC_FAMILY_AUTO);
                        const int declined = kFamilies[f] == FC_FAMILY_AUTO && cc == 90 && !with_lse &&
                                             sdpa_expresses && !sm90_runs && !decode_runs &&
                                             (wide || change == kMaskRowsBroadcast || p->seqlen_q == 1 ||
                                              p->mask_kind == FC_MASK_ADDITIVE);
                        REQUIRE((sup == FC_UNSUPPORTED_SLOWER_MASK) == declined);
                        if (kFamilies[f] == FC_FAMILY_AUTO && sdpa_expresses && !declined)
                            REQUIRE(sup == FC_OK &&
                                    fc_sdpa_family(p, cc / 10, cc % 10) ==
                                        (decode_runs ? FC_FAMILY_DECODE
                                                     : cc == 90 && sm90_runs ? FC_FAMILY_SM90 : FC_FAMILY_SM80));
                        /* The same call wanting the LSE runs in the sm80 family (the decode kernels where
                         * they take it); forced there, in the sm80 family. */
                        if (declined) {
                            fc_params twin = *p;
                            twin.lse = (float *)(uintptr_t)0x7f0000500000ull;
                            REQUIRE(fc_sdpa_support(&twin, 9, 0) == FC_OK &&
                                    fc_sdpa_family(&twin, 9, 0) ==
                                        (decode_takes_masked(p) ? FC_FAMILY_DECODE : FC_FAMILY_SM80));
                            twin.lse = NULL;
                            twin.family = FC_FAMILY_SM80;
                            REQUIRE(fc_sdpa_support(&twin, 9, 0) == FC_OK && fc_sdpa_family(&twin, 9, 0) == FC_FAMILY_SM80);
                        }
                    }
    free(p);
    g_current = NULL;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    check_split_heuristic();
    check_d64_config();
    check_decode_packing();
    check_mask_rule();
    check_bwd_packed_rule();
    check_prefill_split_heuristic();
    check_balanced_grid();
    return 0;
}

/* A backward input (mode 6): the byte after the mode picks the decoding (& 3): 0 and 2
 * decode_bwd; 1 the raw bytes of the whole fc_bwd_params; 3 decode_structured for the forward
 * part, raw bytes for the rest. Raw kinds take the device from the same byte (>> 2). */
static void check_bwd_input(reader *r) {
    /* Exactly sizeof(fc_bwd_params) on the heap: any read past the struct is an ASan report. */
    fc_bwd_params *b = (fc_bwd_params *)malloc(sizeof(fc_bwd_params));
    if (b == NULL) return;
    const uint8_t kind = take_u8(r);
    const size_t left = r->size - r->pos;
    int device = kind >> 2;
    switch (kind & 3) {
    case 1:
        memset(b, 0, sizeof *b);
        memcpy(b, r->data + r->pos, left < sizeof *b ? left : sizeof *b);
        break;
    case 3: {
        fc_bwd_params_init(b);
        decode_structured(r, &b->fwd);
        const size_t rest = sizeof *b - sizeof b->fwd, n = r->size - r->pos;
        memcpy((char *)b + sizeof b->fwd, r->data + r->pos, n < rest ? n : rest);
        break;
    }
    default:
        decode_bwd(r, b);
        device = take_u8(r);
        break;
    }
    check_bwd(b, device);
    free(b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* Exactly sizeof(fc_params) on the heap: any read past the struct is an ASan report. */
    fc_params *p = (fc_params *)malloc(sizeof(fc_params));
    if (p == NULL) return 0;
    reader r = {data, size, 0};
    const uint8_t mode = take_u8(&r);
    switch (mode % 8) {
    case 0:
    case 4: /* raw bytes: every field arbitrary, enums and pointers included */
        memset(p, 0, sizeof *p);
        memcpy(p, data + r.pos, size - r.pos < sizeof *p ? size - r.pos : sizeof *p);
        r.pos = size;
        check_struct(p, mode >> 2);
        break;
    case 1:
    case 2:
    case 5:
        decode_structured(&r, p);
        check_struct(p, take_u8(&r));
        break;
    case 6: /* the backward (c_src/bwd.c) */
        check_bwd_input(&r);
        break;
    default:
        check_contiguous(&r, p);
        break;
    }
    /* The degenerate calls. */
    g_current = NULL;
    g_current_bwd = NULL;
    REQUIRE(fc_params_validate(NULL) == FC_ERR_NULL_PARAMS);
    REQUIRE(fc_sdpa_support(NULL, 9, 0) == FC_ERR_NULL_PARAMS);
    REQUIRE(fc_sdpa_family(NULL, 9, 0) == FC_FAMILY_AUTO);
    REQUIRE(fc_sdpa_fwd(NULL, (cudaStream_t)0) == FC_ERR_NULL_PARAMS);
    REQUIRE(fc_status_string((fc_status)(int)(int8_t)mode) != NULL);
    REQUIRE(fc_bwd_params_validate(NULL) == FC_ERR_NULL_PARAMS);
    REQUIRE(fc_sdpa_bwd_support(NULL, 9, 0) == FC_ERR_NULL_PARAMS);
    REQUIRE(fc_sdpa_bwd_family(NULL, 9, 0) == FC_FAMILY_AUTO);
    REQUIRE(fc_sdpa_bwd(NULL, (cudaStream_t)0) == FC_ERR_NULL_PARAMS);
    int64_t bytes = -1;
    REQUIRE(fc_sdpa_bwd_workspace_size(NULL, &bytes) == FC_ERR_NULL_PARAMS && bytes == 0);
    free(p);
    return 0;
}
