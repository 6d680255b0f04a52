/*
 * launch_rules.h - internal: the launch heuristics and tile shapes that both the C layer's plan
 * (dispatch.c, flashcore.c, bwd.c) and the kernels' launchers read. Each is a pure function of a
 * call's sizes, the device's SM count and the overrides in config.h: no kernel table and no
 * family choice (those are dispatch.h's), so the kernels include this header, never that one.
 * Definitions: launch_rules.c.
 */
#ifndef FLASHCORE_LAUNCH_RULES_H
#define FLASHCORE_LAUNCH_RULES_H

#include "flashcore.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Helpers below marked so are also called from the kernels. */
#if defined(__CUDACC__)
#define FC_HOST_DEVICE __host__ __device__
#else
#define FC_HOST_DEVICE
#endif

/*
 * Split-KV decoding: how many key ranges to cut each (batch, KV head) into on a device with
 * `sm_count` SMs, and the workspace that takes (partial O and LSE in fp32).
 */
int fc_decode_splits(const fc_params *p, int sm_count);
/* Keys per pipeline chunk of the decode kernels (kernels/decode_sm80.cuh); the split heuristic
 * counts key ranges in these chunks. */
#define FC_DECODE_CHUNK 32
/* The most key ranges fc_decode_splits cuts a (batch, KV head) into (also the limit of the
 * FLASHCORE_DECODE_SPLITS override, config.h). */
#define FC_DECODE_MAX_SPLITS 64
/* Calls of up to this many rows per (batch, KV head), (Hq / Hkv) x Sq, run the tensor-core
 * decode kernel; 17-32 rows the CUDA-core one (kernels/decode_sm80.cuh, launch_decode). */
#define FC_DECODE_MMA_ROWS 16
/* The decode split aims at one wave of this many CTAs per SM, per kernel (fc_decode_splits). */
#define FC_DECODE_CTAS_PER_SM_MMA 1
#define FC_DECODE_CTAS_PER_SM_ROWS 3
/* The CTAs per SM fc_decode_splits aims at for these params. */
#define FC_DECODE_CTAS_PER_SM(p) \
    ((p)->heads_q / (p)->heads_kv * (p)->seqlen_q <= FC_DECODE_MMA_ROWS ? FC_DECODE_CTAS_PER_SM_MMA : FC_DECODE_CTAS_PER_SM_ROWS)
int64_t fc_decode_workspace_bytes(const fc_params *p, int splits);

/*
 * Packed variable-length calls (fc_params.cu_seq_q) in the Hopper forward: a first kernel lists
 * every sequence's query blocks of FC_VARLEN_BLOCK_ROWS rows in the workspace (kernels/sm90/
 * varlen_blocks.cuh), sorted by work, the forward's persistent CTAs take (head, block) tiles
 * from that list. The workspace: a 16-byte header (the list's length), then FC_VARLEN_ENTRY_BYTES
 * per entry for two lists (the sorted one, then the scratch the kernel sorts from), each with
 * room for total_q / rows + batch entries (each sequence's last block may be partial).
 */
#define FC_VARLEN_BLOCK_ROWS 128
#define FC_VARLEN_ENTRY_BYTES 32
#define FC_VARLEN_HEADER_BYTES 16
FC_HOST_DEVICE static inline int64_t fc_varlen_block_capacity(int64_t total_q, int64_t batch) {
    return (total_q + FC_VARLEN_BLOCK_ROWS - 1) / FC_VARLEN_BLOCK_ROWS + batch;
}
int64_t fc_varlen_workspace_bytes(const fc_params *p);

/*
 * Split-KV for the Hopper family's small grids: into how many key ranges (one cluster of CTAs
 * per tile) to cut each of `tiles` (query block, head, batch) tiles of up to `key_tiles` key
 * tiles, with at least `min_key_tiles_per_split` key tiles per range, given wave_ctas[s] = the
 * CTAs that run at once in clusters of s, s = 1..max_splits.
 */
int fc_prefill_splits(int64_t tiles, int64_t key_tiles, int min_key_tiles_per_split, const int *wave_ctas,
                      int max_splits);
/* Key tiles per range: 2 (a range of one tile leaves no loads to overlap with the math), and 4
 * for D=64's one-warpgroup configuration, whose key tiles are short next to the merge: there two
 * ranges of 2 key tiles ran slower than no split, ranges of 4 or more faster (measurements:
 * docs/experiments/sessions-04-09.md, seventh session, "One consumer warpgroup for tiny grids"). */
#define FC_PREFILL_MIN_KEY_TILES_PER_SPLIT 2
#define FC_PREFILL_MIN_KEY_TILES_PER_SPLIT_TINY 4
/* A small grid: `tiles` CTAs fill at most half of `ctas_per_wave` (the SMs, for one CTA per SM).
 * The Hopper family cuts such grids' keys (fc_prefill_splits) and gives D=64 its short
 * configuration for them (kernels/sm90/fwd_launch.cuh, launch_fwd). */
int fc_grid_is_small(int64_t tiles, int64_t ctas_per_wave);
/* The persistent grid for `tiles` tiles of equal work on `sms` SMs (one CTA each): as few CTAs
 * as run them in the same number of rounds as a full wave, so that every CTA runs the same
 * number of tiles, give or take one, and none finishes a round early. E.g. 256 one-row decode
 * tiles: 128 CTAs of 2 tiles, not 132 of which 8 idle for the second round. (The A/B switch to
 * the full wave, FLASHCORE_SM90_BALANCED=0, is retired: docs/TUNING.md.) */
int64_t fc_balanced_grid(int64_t tiles, int64_t sms);
/* fc_params.band_: what the band is, once resolved (fc_resolve_band_). The band itself is
 * fc_band_bounds's (flashcore.h): query row i sees keys i + lo .. i + hi. */
enum { FC_BAND_UNRESOLVED_ = 0, FC_BAND_NONE_ = 1, FC_BAND_CAUSAL_ = 2, FC_BAND_GENERAL_ = 3 };

/* Whether a bool attn_mask's layout lets the Hopper kernels' TMA bring it in tiles (launch_rules.c). */
int fc_mask_tiles_fit_(const fc_params *p);
/* Key tiles [*first, *end) of `block_keys`-key tiles that rows [row0, row1) see under a general
 * band (empty when first == end); the kernels and the launchers' heuristics share it. */
FC_HOST_DEVICE static inline void fc_band_key_tiles(int64_t row0, int64_t row1, int64_t lo, int64_t hi,
                                                    int64_t seqlen_k, int64_t block_keys, int64_t *first,
                                                    int64_t *end) {
    int64_t k0 = row0 + lo, k1 = row1 - 1 + hi; /* first and last key seen */
    if (k0 < 0) k0 = 0;
    if (k1 > seqlen_k - 1) k1 = seqlen_k - 1;
    if (k1 < k0) {
        *first = *end = 0;
        return;
    }
    *first = k0 / block_keys;
    *end = k1 / block_keys + 1;
}

/* Keys the longest query block sees: causal (top-left aligned) rows see no key past their own
 * index, so a causal call with fewer queries than keys reads only its first seqlen_q keys. */
static inline int64_t fc_longest_key_run(int64_t seqlen_q, int64_t seqlen_k, int causal) {
    return causal && seqlen_q < seqlen_k ? seqlen_q : seqlen_k;
}
/*
 * The Hopper family's configuration for a D=64 call (kernels/sm90/fwd_traits.cuh, FwdConfig), on a
 * device of `sms` SMs: three consumer warpgroups on 192-row blocks (LONG), two on 128 (SHORT),
 * one on 64 (TINY), or two splitting the key tiles of 64-row blocks (PAIR). The rules are at the
 * definition (launch_rules.c), with pointers to the measurements behind them (docs/experiments/).
 */
enum { FC_SM90_D64_LONG = 0, FC_SM90_D64_SHORT = 1, FC_SM90_D64_TINY = 2, FC_SM90_D64_PAIR = 3 };
#define FC_SM90_D64_LONG_ROWS 192
#define FC_SM90_D64_SHORT_ROWS 128
#define FC_SM90_D64_TINY_ROWS 64 /* also the pair's */
#define FC_SM90_D64_KEY_TILE 128
/* SHORT for causal calls up to this length. 4096 (SHORT at the sweep's causal 2k and 4k) lost:
 * three warpgroups stay ahead there (measurements: docs/experiments/sessions-10-16.md, sixteenth
 * session, "SHORT for D=64 causal 2k-4k"). */
#define FC_SM90_D64_SHORT_SEQLEN_Q 1024
#define FC_SM90_D64_PAIR_KEY_TILES 64     /* PAIR for blocks of up to this many key tiles */
#define FC_SM90_D64_TINY_CAUSAL_KEY_TILES 8 /* TINY for two-wave causal grids from this many */
/* Causal, more than FC_SM90_D64_SHORT_SEQLEN_Q rows, 64-row grid past one wave (launch_rules.c): */
#define FC_SM90_D64_PAIR_CAUSAL_KEY_TILES 48            /* PAIR up to two waves from this many */
#define FC_SM90_D64_PAIR_CAUSAL_KEY_TILES_SHORT_WAVE 24 /* PAIR up to 1.5 waves from this many */
#define FC_SM90_D64_SHORT_CAUSAL_WAVES 8                /* SHORT up to this many waves */
int fc_sm90_d64_config(int64_t batch, int64_t heads_q, int64_t seqlen_q, int64_t seqlen_k, int causal, int64_t sms);
/* Whether to launch a grid of `grid_ctas` CTAs with programmatic dependent launch
 * (cudaLaunchAttributeProgrammaticStreamSerialization; sm90 forward, decode kernels and their
 * merge on sm_90 only): the kernel's launch and prologue then overlap the tail of the kernel
 * before it in the stream. Every such kernel waits for the grids before it (griddepcontrol.wait)
 * ahead of its first global memory access, so the stream's ordering of memory is unchanged.
 * Only grids that fit in one wave (`wave_ctas` run at once): there the overlap takes part of a
 * microsecond off each call, while grids of several waves (unsplit decode) ran slower with it in
 * CUDA graphs (measurements: docs/experiments/sessions-04-09.md, sixth session, "PDL").
 * FLASHCORE_PDL=0 turns it off (config.h: the serial reference of the PDL tests, and a way out). */
int fc_use_pdl(int64_t grid_ctas, int64_t wave_ctas);

/* Whether the sm80-class backward runs in one pass (kernels/bwd_sm80.cuh: dQ summed with fp32
 * atomics, in whatever order the key blocks come) rather than with dQ in a pass of its own
 * (bitwise deterministic): never under `deterministic`; at D=64 (7-12% faster non-causal, 0-4%
 * causal, at 64-key blocks: docs/experiments/backward.md, forty-first session) and D=128 (128-key
 * blocks, dS^T in the dO stage: forty-third session). D=32, 80 and 96 have no one-pass kernel
 * (80 and 96: their dQ tile does not split into 16-column shares of 8 warps; 32: its additive-mask
 * variant took 8 bytes of stack on sm_89, forty-sixth session), nor has a softcap (its masked
 * variants spilled 4-16 bytes on sm_90a). */
static inline FC_HOST_DEVICE int fc_sm80_bwd_one_pass(const fc_params *f, int deterministic) {
    return !deterministic && (f->head_dim == 64 || f->head_dim == 128) && f->softcap == 0.0f;
}
/* The sm80-class backward's workspace (c_src/bwd.c, kernels/bwd_sm80.cuh): delta, then
 * LSE*log2(e), fp32, one each per query row ([B][Hq][Sq] each); in one pass then, 16-byte
 * aligned, the dq accumulator [B][Hq][Sq][D] fp32. */
static inline FC_HOST_DEVICE int64_t fc_sm80_bwd_dq_accum_offset(const fc_params *f) {
    return (2 * f->batch * f->heads_q * f->seqlen_q * 4 + 15) / 16 * 16;
}
static inline int64_t fc_sm80_bwd_workspace_bytes(const fc_params *f, int deterministic) {
    return fc_sm80_bwd_one_pass(f, deterministic)
               ? fc_sm80_bwd_dq_accum_offset(f) + f->batch * f->heads_q * f->seqlen_q * f->head_dim * 4
               : 2 * f->batch * f->heads_q * f->seqlen_q * 4;
}

/* The Hopper backward's workspace (c_src/bwd.c, kernels/sm90/bwd_kernel.cuh): per (batch, query
 * head), seqlen_q rounded up to FC_SM90_BWD_ROW_BLOCK rows, so that every query block's row terms
 * are one aligned, in-bounds bulk copy: the row terms [B*Hq][Sq_pad / 64][delta 64, LSE*log2(e)
 * 64] fp32 (LSE +inf past Sq), then the dq accumulator [B*Hq][Sq_pad][D + FC_SM90_BWD_DQ_PAD] fp32
 * (rows padded as the kernel's shared-memory staging is, so that a block's rows are one bulk
 * reduction), then FC_SM90_BWD_COUNTER_BYTES for the main kernel's tile counter (its persistent
 * CTAs' next tile), then one int32 per (batch, query head): at each (batch, KV head) pair's last
 * query head, the pair's key blocks whose dQ is in the accumulator (the dq conversion of the
 * pair's rows waits for all of them). */
#define FC_SM90_BWD_ROW_BLOCK 64
/* Keys per CTA of the Hopper backward: its grid is one dimension of (key block, KV head, batch).
 * D=256 takes 64 (kernels/sm90/bwd_d256.cuh: its dK and dV of 64 keys fill the registers). At
 * D=256 the dq accumulator's rows hold their 16-byte chunks permuted within each 128 bytes (chunk
 * c of row r at c ^ (r % 8)) and are not padded (D of the D + FC_SM90_BWD_DQ_PAD floats a row the
 * workspace keeps): the kernel's staging layout, 16 rows to a bulk reduction. */
#define FC_SM90_BWD_KEY_BLOCK 128
#define FC_SM90_BWD_KEY_BLOCK_D256 64
/* The key block at a head dim, as a constant expression (the kernels' traits) and as a function. */
#define FC_SM90_BWD_KEY_BLOCK_OF(head_dim) ((head_dim) == 256 ? FC_SM90_BWD_KEY_BLOCK_D256 : FC_SM90_BWD_KEY_BLOCK)
static inline FC_HOST_DEVICE int64_t fc_sm90_bwd_key_block(int64_t head_dim) {
    return FC_SM90_BWD_KEY_BLOCK_OF(head_dim);
}
#define FC_SM90_BWD_DQ_PAD 8
#define FC_SM90_BWD_COUNTER_BYTES 16
static inline FC_HOST_DEVICE int64_t fc_sm90_bwd_padded_seqlen(const fc_params *f) {
    return (f->seqlen_q + FC_SM90_BWD_ROW_BLOCK - 1) / FC_SM90_BWD_ROW_BLOCK * FC_SM90_BWD_ROW_BLOCK;
}
static inline int64_t fc_sm90_bwd_workspace_bytes(const fc_params *f) {
    return f->batch * f->heads_q * fc_sm90_bwd_padded_seqlen(f) * (2 + f->head_dim + FC_SM90_BWD_DQ_PAD) * 4 +
           FC_SM90_BWD_COUNTER_BYTES + f->batch * f->heads_q * 4;
}
/* A packed call's (fc_params.cu_seq_q) Hopper backward workspace: the list of every sequence's
 * FC_SM90_BWD_KEY_BLOCK-key blocks first (kernels/sm90/varlen_blocks.cuh, the forward's list
 * format, capacity from total_k: the sorted list once per KV head, then its scratch), then the
 * row terms [Hq][R][delta, LSE*log2(e)] fp32 and the dq
 * accumulator [Hq][R][D + FC_SM90_BWD_DQ_PAD] fp32 over the packed rows, R =
 * fc_sm90_bwd_varlen_rows (total_q rounded up to FC_SM90_BWD_ROW_BLOCK, and two blocks more: a
 * sequence's last query step may start anywhere and read 68 rows on), then the tile counter. */
FC_HOST_DEVICE static inline int64_t fc_sm90_bwd_varlen_rows(int64_t total_q) {
    return (total_q + FC_SM90_BWD_ROW_BLOCK - 1) / FC_SM90_BWD_ROW_BLOCK * FC_SM90_BWD_ROW_BLOCK + 2 * FC_SM90_BWD_ROW_BLOCK;
}
FC_HOST_DEVICE static inline int64_t fc_sm90_bwd_varlen_list_bytes(const fc_params *f) {
    return FC_VARLEN_HEADER_BYTES +
           (f->heads_kv + 1) * FC_VARLEN_ENTRY_BYTES * fc_varlen_block_capacity(f->total_k, f->batch);
}
static inline int64_t fc_sm90_bwd_varlen_workspace_bytes(const fc_params *f) {
    return fc_sm90_bwd_varlen_list_bytes(f) +
           f->heads_q * fc_sm90_bwd_varlen_rows(f->total_q) * (2 + f->head_dim + FC_SM90_BWD_DQ_PAD) * 4 +
           FC_SM90_BWD_COUNTER_BYTES;
}
/* CTAs of the Hopper backward's main kernel for `tiles` tiles on `sms` SMs: at most one per SM, each
 * taking tiles until none are left (kernels/sm90/bwd_kernel.cuh). FLASHCORE_BWD_PERSISTENT=0 gives
 * one CTA per tile instead (config.h; A/B timing while that comparison is open). */
int64_t fc_sm90_bwd_grid(int64_t tiles, int64_t sms);
/* Whether the Hopper backward launches its main kernel and its dq conversion with programmatic
 * dependent launch (kernels/sm90/bwd_launch.cuh): the main kernel's launch and prologue overlap
 * the row-terms kernel's tail, and the conversion of a (batch, KV head) pair's rows runs on the
 * SMs the main kernel's CTAs leave while its last tiles run (each conversion CTA waits for its
 * pair's count in the workspace, not for the whole grid). FLASHCORE_PDL=0 turns it off (then the
 * three run one after another, the counts complete before the conversion starts). */
int fc_sm90_bwd_use_pdl(void);

#ifdef __cplusplus
}
#endif

#endif /* FLASHCORE_LAUNCH_RULES_H */
