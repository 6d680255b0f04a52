/*
 * launch_rules.c - the launch heuristics of launch_rules.h: how many key ranges a decode or a
 * small prefill grid is cut into, the persistent grids, D=64's Hopper configuration, when to
 * launch with programmatic dependent launch, and whether a bool mask's layout suits TMA tiles.
 * Read by the C layer's plan and by the kernels' launchers alike.
 */
#include "launch_rules.h"

#include "config.h" /* FLASHCORE_PDL, FLASHCORE_BWD_PERSISTENT */

#include <stdint.h>

/* Whether a bool attn_mask's layout lets TMA bring it in tiles (the Hopper kernels' mask tiles:
 * the forward's kMasked shape, the backward's kMaskBoolTiles): keys contiguous, the base and the
 * query, head and batch strides 16-byte multiples, queries not broadcast (a row per query), and
 * every stepped-over stride below TMA's 2^40 bytes (a broadcast dim, stride 0, is mapped with
 * size 1). */
#define FC_TMA_MAX_STRIDE_BYTES ((int64_t)1 << 40)
int fc_mask_tiles_fit_(const fc_params *p) {
    return p->mask_kind == FC_MASK_BOOL && p->mask_stride_k == 1 && p->mask_stride_q > 0 && p->mask_stride_q % 16 == 0 &&
           p->mask_stride_h >= 0 && p->mask_stride_h % 16 == 0 && p->mask_stride_b >= 0 && p->mask_stride_b % 16 == 0 &&
           ((uintptr_t)p->mask & 15) == 0 && p->mask_stride_q < FC_TMA_MAX_STRIDE_BYTES &&
           (p->heads_q <= 1 || p->mask_stride_h < FC_TMA_MAX_STRIDE_BYTES) &&
           (p->batch <= 1 || p->mask_stride_b < FC_TMA_MAX_STRIDE_BYTES);
}

/*
 * Split count for the decode kernel. Its CTAs are bandwidth-bound and up to three fit on an SM
 * (D=128: ~70 KB of K/V ring each). Split each (batch, KV head) into as many key ranges as
 * still fit in SMs x FC_DECODE_CTAS_PER_SM(p) CTAs, never more (a second, partial wave runs
 * with too few bytes in flight), each range at least 2 chunks (64 keys), at most 64. For the
 * tensor-core kernel (up to 16 rows) one CTA per SM, not the three that fit: fewer, longer
 * ranges each keep their pipeline full for longer and leave fewer partials to merge. The
 * CUDA-core kernel (17-32 rows) keeps three: its CTAs are latency-bound (see its comment).
 * Ranges as short as 2 chunks: longer minimums left short caches with too few ranges to keep the
 * SMs busy, and 4 gained less than 2. (Measurements: docs/experiments/sessions-04-09.md,
 * "Measurements moved from c_src/launch_rules.c (fc_decode_splits)".)
 */
#define FC_DECODE_MIN_CHUNKS_PER_SPLIT 2

int fc_decode_splits(const fc_params *p, int sm_count) {
    const int64_t ctas = p->batch * p->heads_kv;
    const int64_t slots = (int64_t)FC_DECODE_CTAS_PER_SM(p) * (sm_count > 0 ? sm_count : 1);
    int64_t splits = slots / (ctas > 0 ? ctas : 1);
    /* The keys the kernel reads: all, or a band's (a resolved struct: the first row's first key
     * to the last row's last). */
    int64_t keys = p->seqlen_k;
    if (p->band_ == FC_BAND_GENERAL_) {
        const int64_t first = p->band_lo_ > 0 ? p->band_lo_ : 0;
        const int64_t end = p->seqlen_q + p->band_hi_ < p->seqlen_k ? p->seqlen_q + p->band_hi_ : p->seqlen_k;
        keys = end > first ? end - first : 0;
    }
    const int64_t chunks = (keys + FC_DECODE_CHUNK - 1) / FC_DECODE_CHUNK;
    const int64_t by_length = chunks / FC_DECODE_MIN_CHUNKS_PER_SPLIT;
    if (splits > by_length) splits = by_length;
    if (splits > FC_DECODE_MAX_SPLITS) splits = FC_DECODE_MAX_SPLITS;
    return splits > 1 ? (int)splits : 1;
}

int64_t fc_decode_workspace_bytes(const fc_params *p, int splits) {
    const int64_t rows = p->batch * p->heads_q * p->seqlen_q;
    /* partial O [rows][splits][D] then partial LSE [rows][splits], fp32, 16-byte rounded */
    const int64_t o_bytes = rows * splits * p->head_dim * 4;
    const int64_t lse_bytes = rows * splits * 4;
    return (o_bytes + lse_bytes + 15) / 16 * 16;
}

int64_t fc_varlen_workspace_bytes(const fc_params *p) {
    /* (Validated structs give small numbers; any other saturates instead of overflowing.) */
    if (p->total_q < 0 || p->batch < 0 || p->total_q > INT64_MAX - FC_VARLEN_BLOCK_ROWS) return INT64_MAX;
    int64_t entries = 0, bytes = 0;
    if (__builtin_add_overflow((p->total_q + FC_VARLEN_BLOCK_ROWS - 1) / FC_VARLEN_BLOCK_ROWS, p->batch, &entries) ||
        __builtin_mul_overflow(entries, (int64_t)(2 * FC_VARLEN_ENTRY_BYTES), &bytes) ||  /* two lists */
        __builtin_add_overflow(bytes, (int64_t)FC_VARLEN_HEADER_BYTES, &bytes))
        return INT64_MAX;
    return bytes;
}

/*
 * Split-KV for the Hopper family's small grids (kernels/sm90/fwd_split.cuh, finish_split_rows). A
 * tile's CTA runs its key tiles one after another, so a grid of a few dozen tiles (B=1 H=8
 * S=512: 24 CTAs on 132 SMs) takes as long as one tile's whole key loop. Cutting each tile's
 * keys into s ranges run by a cluster of s CTAs shortens that loop s-fold for the price of one
 * merge through distributed shared memory. Only grids that fill at most half the SMs are cut;
 * the largest s <= max_splits is taken whose clusters all fit in one wave, with at least
 * min_key_tiles_per_split key tiles per range (launch_rules.h).
 */

int fc_grid_is_small(int64_t tiles, int64_t ctas_per_wave) { return tiles * 2 <= ctas_per_wave; }

int fc_use_pdl(int64_t grid_ctas, int64_t wave_ctas) {
    return grid_ctas <= wave_ctas && fc_config_get()->pdl;
}

int fc_sm90_bwd_use_pdl(void) { return fc_config_get()->pdl; }

int64_t fc_sm90_bwd_grid(int64_t tiles, int64_t sms) {
    if (sms <= 0 || tiles <= sms || !fc_config_get()->bwd_persistent) return tiles;
    return sms;
}

int64_t fc_balanced_grid(int64_t tiles, int64_t sms) {
    if (sms <= 0 || tiles <= sms) return tiles;
    const int64_t rounds = (tiles + sms - 1) / sms;
    return (tiles + rounds - 1) / rounds;
}

int fc_prefill_splits(int64_t tiles, int64_t key_tiles, int min_key_tiles_per_split, const int *wave_ctas,
                      int max_splits) {
    if (tiles <= 0 || wave_ctas == NULL || !fc_grid_is_small(tiles, wave_ctas[1])) return 1;
    if (min_key_tiles_per_split < 1) min_key_tiles_per_split = 1;
    int best = 1;
    for (int s = 2; s <= max_splits; ++s)
        if (tiles * s <= wave_ctas[s] && key_tiles >= (int64_t)s * min_key_tiles_per_split) best = s;
    return best;
}

/*
 * D=64 in the Hopper family (kernels/sm90/fwd_traits.cuh): which of four configurations a call runs.
 * Tile counts are (query blocks) x heads x batch for each block height; key tiles are those of
 * the longest block (causal, top-left aligned: none past the last query row). Each rule below
 * was chosen from timings of the forced configurations beside cuDNN's; the measurements are in
 * docs/experiments/first-versions.md ("sm90 D=64 short-sequence configuration") and
 * docs/experiments/sessions-04-09.md (eighth and ninth sessions, and "Measurements moved from
 * c_src/launch_rules.c (fc_sm90_d64_config)", which holds the causal-waves crossover table).
 *
 * LONG (three warpgroups, 192-row blocks) is the default: per tile the GEMMs are short next to
 * the softmax, and three warpgroups keep the tensor cores busiest.
 *
 * SHORT (two warpgroups, 128-row blocks) for query sequences of up to
 * FC_SM90_D64_SHORT_SEQLEN_Q rows when causal or when the three-warpgroup grid would split
 * (fc_grid_is_small), and for any call whose three-warpgroup grid would fill less than one wave
 * without splitting while the two-warpgroup grid fits in one. Two warpgroups win on short causal
 * sequences and on small grids, where 192-row blocks waste rows and give each CTA more of them;
 * they lose on longer sequences, and on short non-causal ones that fill the grid, where the third
 * warpgroup's overlap matters more than the wasted rows. On a partial wave, the two-warpgroup
 * grid's more, smaller blocks keep more SMs busy.
 *
 * PAIR (two warpgroups on the same 64-row block, even and odd key tiles) when its grid fits in
 * one wave and the longest block has at most FC_SM90_D64_PAIR_KEY_TILES key tiles (the most
 * measured), unless TINY would split those keys across CTAs (its grid fills at most half the
 * SMs, with at least two ranges of FC_PREFILL_MIN_KEY_TILES_PER_SPLIT_TINY key tiles). Longer
 * query sequences whose three-warpgroup grid would split take it too when it fits, and keep
 * their split otherwise (it beat two warpgroups there). The pair halves each block's key loop
 * without a cluster merge: on one-wave grids that cannot split it beat two warpgroups at every
 * key length measured, and it beat a split three-warpgroup grid; where TINY can split the keys,
 * that split is faster still.
 *
 * TINY (one warpgroup, 64-row blocks) for the other grids of the SHORT family whose 64-row
 * grid fills at most half the SMs (split or not), and for causal ones of up to two waves of
 * 64-row blocks with at least FC_SM90_D64_TINY_CAUSAL_KEY_TILES key tiles: there one warpgroup
 * per block beat two, while with fewer key tiles (S=512) two warpgroups stay slightly ahead.
 *
 * Causal calls with more than FC_SM90_D64_SHORT_SEQLEN_Q query rows whose 64-row grid fills
 * more than one wave, with at least FC_SM90_D64_TINY_CAUSAL_KEY_TILES key tiles (the
 * causal-waves rule): up to two waves, PAIR within 1.25 waves (the blocks of the second wave are
 * the shortest, the list running longest first), or when the longest block has at least
 * FC_SM90_D64_PAIR_CAUSAL_KEY_TILES key tiles, or at least
 * FC_SM90_D64_PAIR_CAUSAL_KEY_TILES_SHORT_WAVE within one and a half waves (long blocks gain
 * most from the pair's halved key loop), else TINY; up to FC_SM90_D64_SHORT_CAUSAL_WAVES waves
 * SHORT; LONG beyond. Three warpgroups' causal grids of 192-row blocks balance badly over a few
 * waves (how badly depends on how the query length divides into blocks: S=3072, 16 blocks of
 * 192, balances well); from about 8 waves on the two are within a few percent, either way, and
 * at 62 waves (the bench's 16k-token sweeps) three win.
 */
int fc_sm90_d64_config(int64_t batch, int64_t heads_q, int64_t seqlen_q, int64_t seqlen_k, int causal, int64_t sms) {
    const int64_t heads = heads_q * batch;
    const int64_t tiny_tiles = (seqlen_q + FC_SM90_D64_TINY_ROWS - 1) / FC_SM90_D64_TINY_ROWS * heads;
    const int64_t key_tiles =
        (fc_longest_key_run(seqlen_q, seqlen_k, causal) + FC_SM90_D64_KEY_TILE - 1) / FC_SM90_D64_KEY_TILE;

    /* Long causal grids of more than one wave of 64-row blocks (the causal-waves rule above). */
    if (causal && seqlen_q > FC_SM90_D64_SHORT_SEQLEN_Q && tiny_tiles > sms &&
        key_tiles >= FC_SM90_D64_TINY_CAUSAL_KEY_TILES) {
        if (tiny_tiles <= 2 * sms) {
            const int pair_pays = 4 * tiny_tiles <= 5 * sms || key_tiles >= FC_SM90_D64_PAIR_CAUSAL_KEY_TILES ||
                                  (key_tiles >= FC_SM90_D64_PAIR_CAUSAL_KEY_TILES_SHORT_WAVE && 2 * tiny_tiles <= 3 * sms);
            return pair_pays ? FC_SM90_D64_PAIR : FC_SM90_D64_TINY;
        }
        return tiny_tiles <= FC_SM90_D64_SHORT_CAUSAL_WAVES * sms ? FC_SM90_D64_SHORT : FC_SM90_D64_LONG;
    }

    /* Every other call: LONG unless it belongs to the SHORT family (short query sequences,
     * grids that would split or fill part of a wave), which then picks PAIR, TINY or SHORT. */
    const int64_t long_tiles = (seqlen_q + FC_SM90_D64_LONG_ROWS - 1) / FC_SM90_D64_LONG_ROWS * heads;
    const int64_t short_tiles = (seqlen_q + FC_SM90_D64_SHORT_ROWS - 1) / FC_SM90_D64_SHORT_ROWS * heads;
    const int long_splits = fc_grid_is_small(long_tiles, sms);
    const int long_partial_wave = !long_splits && long_tiles < sms && short_tiles <= sms;
    const int tiny_splits =
        fc_grid_is_small(tiny_tiles, sms) && key_tiles >= 2 * FC_PREFILL_MIN_KEY_TILES_PER_SPLIT_TINY;
    const int pair_fits = tiny_tiles <= sms && key_tiles <= FC_SM90_D64_PAIR_KEY_TILES && !tiny_splits;
    const int short_family = seqlen_q <= FC_SM90_D64_SHORT_SEQLEN_Q ? causal || long_splits || long_partial_wave
                                                                   : long_partial_wave || (long_splits && pair_fits);
    if (!short_family) return FC_SM90_D64_LONG;
    if (pair_fits) return FC_SM90_D64_PAIR;
    const int tiny_causal = causal && tiny_tiles <= 2 * sms && key_tiles >= FC_SM90_D64_TINY_CAUSAL_KEY_TILES;
    return fc_grid_is_small(tiny_tiles, sms) || tiny_causal ? FC_SM90_D64_TINY : FC_SM90_D64_SHORT;
}
