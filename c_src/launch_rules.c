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
 * Measured (H100, D=128, Hq=32, two passes each, ratio to cuDNN in the same run; 3 -> 2 -> 1
 * CTAs per SM):
 *   B=1 Hkv=8  Sk=8192 0.86-0.87 -> 0.91-0.93 (new merge) -> 0.95-0.96 -> 0.995
 *   B=1 Hkv=8  Sk=128k 0.90-0.92 -> 0.92 -> 0.955;  B=1 Hkv=32 Sk=1k 0.98-0.99 -> 1.04
 *   B=8 Hkv=8  Sk=1k-32k 0.92-0.94 -> 0.95-0.97 -> 0.95-0.98, but Sk=128k 0.956 -> 0.943
 *   unsplit rows (B x Hkv >= 66) unchanged.
 * Ranges of at least 4 chunks instead of 2 (at 2 CTAs per SM) gained less. History
 * (docs/experiments/sessions-04-09.md): 8-chunk ranges left B=1, Hkv=8, Sk=1024 at 4 splits (23.8 us, cuDNN 12.7).
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
 * the longest block (causal, top-left aligned: none past the last query row).
 *
 * LONG (three warpgroups, 192-row blocks) is the default: per tile the GEMMs are short next to
 * the softmax, and three warpgroups keep the tensor cores busiest.
 *
 * SHORT (two warpgroups, 128-row blocks) for query sequences of up to
 * FC_SM90_D64_SHORT_SEQLEN_Q rows when causal or when the three-warpgroup grid would split
 * (fc_grid_is_small), and for any call whose three-warpgroup grid would fill less than one wave
 * without splitting while the two-warpgroup grid fits in one. Two warpgroups against three
 * (H100, fp16, two passes each, ratio to cuDNN in the same run; docs/experiments/first-versions.md):
 *   causal      S=512 0.74 -> 0.82, 1k 0.75-0.76 -> 0.82-0.85, 2k 0.93 -> 0.88, 4k+ 1.0 -> 0.9
 *   non-causal  S=512 0.90 -> 0.84, 1k 0.94 -> 0.86, 2k+ 1.06-1.13 -> 0.86-0.96
 *   small grids B=1 H=8 S=512: 0.82 -> 0.89-0.91 (both); GQA 256 x 8192 chunk: 1.34 -> 1.55
 * The partial-wave rule (eighth session; CUDA graph us, cuDNN in brackets): B=1 H=32/8 512 x
 * 2048 27.1-27.8 -> 23.0-24.1 (22.3-23.6); H=8 2048 x 2048 non-causal 27.5 -> 22.9-23.0
 * (22.5); H=4 4096 x 4096 49.4-50.4 -> 41.7-42.1 (39.3-40.7); H=2 8192 x 8192 96.7-99.0 ->
 * 78.9-80.7 (73.1); H=16 1024 x 1024 16.2 -> 13.8-14.0 (13.9).
 *
 * PAIR (two warpgroups on the same 64-row block, even and odd key tiles) when its grid fits in
 * one wave and the longest block has at most FC_SM90_D64_PAIR_KEY_TILES key tiles (the most
 * measured), unless TINY would split those keys across CTAs (its grid fills at most half the
 * SMs, with at least two ranges of FC_PREFILL_MIN_KEY_TILES_PER_SPLIT_TINY key tiles). Longer
 * query sequences whose three-warpgroup grid would split take it too when it fits (B=1 H=4
 * 2048 x 8192: split three warpgroups 50.5 us, pair 39.9); B=1 H=8 1536 x 1536 keeps its split
 * (15.5 us against 18.7 for two warpgroups). Measured (CUDA graph us, B=1 H=8 unless noted;
 * cuDNN in brackets): 512 x 512 pair 6.1 / tiny split 2 6.5 (9.2); 256 x 1024 pair 8.5 / tiny
 * split 2 7.3 (13.4); causal 1024 x 1024 (128 blocks, no split) pair 8.6 / tiny 10.3 / short
 * 10.5-11.0 (13.9). One-wave grids of 128 blocks that cannot split, pair against two
 * warpgroups by key tiles (H=32/8 256 x Sk, H=8 1024 x Sk, H=16 512 x Sk, B=2 H=8 512 x Sk):
 * 8 8.7 / 11.1, 16 12.8-13.6 / 15.5-16.0, 32 22.0-22.8 / 24.4-25.3, 64 39.9-41.2 / 42.5
 * (cuDNN 13.5, 22, 39, 74).
 *
 * TINY (one warpgroup, 64-row blocks) for the other grids of the SHORT family whose 64-row
 * grid fills at most half the SMs (split or not), and for causal ones of up to two waves of
 * 64-row blocks with at least FC_SM90_D64_TINY_CAUSAL_KEY_TILES key tiles. The causal rule
 * against two warpgroups (CUDA graph us; cuDNN in brackets): B=1 H=8 2048 x 2048 22.5 -> 19.6
 * (23.0), H=4 4096 40.5 -> 33.0 (40.1), H=2 8192 76.3 -> 61.4 (74.9), H=16 1024 13.3 -> 12.3
 * (14.0), B=2 H=8 1024 13.4 -> 12.7 (14.3); with 4 key tiles (S=512, 256 blocks) two
 * warpgroups stay 1-3% ahead (8.8 against 9.0).
 *
 * Causal calls with more than FC_SM90_D64_SHORT_SEQLEN_Q query rows whose 64-row grid fills
 * more than one wave, with at least FC_SM90_D64_TINY_CAUSAL_KEY_TILES key tiles (the
 * causal-waves rule, ninth session): up to two waves, PAIR within 1.25 waves (the blocks
 * of the second wave are the shortest, the list running longest first), or when the longest
 * block has at least FC_SM90_D64_PAIR_CAUSAL_KEY_TILES key tiles, or at least
 * FC_SM90_D64_PAIR_CAUSAL_KEY_TILES_SHORT_WAVE within one and a half waves, else TINY; up to
 * FC_SM90_D64_SHORT_CAUSAL_WAVES waves SHORT; LONG beyond. Three warpgroups' causal grids of
 * 192-row blocks balance badly over a few waves (how badly depends on how the query length
 * divides into blocks: S=3072, 16 blocks of 192, balances well); from about 8 waves on the two
 * are within a few percent, either way, and at 62 waves (the bench's 16k-token sweeps) three
 * win. CUDA graph us, cuDNN first, then three / two / one / pair warpgroups (H100, fp16, one
 * pass each, two runs; docs/experiments/sessions-04-09.md, ninth session):
 *   B=1 H=6 1536 (144 blocks, 12 key tiles)    18.0: 14.3 / 17.2 / 15.6 / 11.5
 *   B=1 H=3 3072 (144, 24)                      31.0: 22.6 / 30.6 / 25.5 / 18.0
 *   B=1 H=5 2048 (160, 16)                      22.8: 17.5 / 22.0 / 19.1 / 15.7
 *   B=1 H=6 2048 (192, 16)                      22.7: 17.7 / 21.9 / 18.7 / 18.9 (three split)
 *   B=1 H=4 3072 (192, 24)                      31.0: 22.6 / 30.5 / 25.4 / 23.1
 *   B=1 H=7 2048 (224, 16)                      22.6: 26.0 / 21.8 / 18.9 / 21.1
 *   B=1 H=3 4096 (192, 32)                      39.1: 27.6 / 39.1 / 32.0 / 24.2
 *   B=1 H=2 6144 (192, 48)                      58.0: 39.6 / 57.8 / 44.8 / 31.5
 *   B=1 H=1 12288 (192, 96)                    106.7: 73.5 / 113.0 / 87.2 / 60.2
 *   B=1 H=4 4096 (256, 32)                      42.4: 49.0 / 40.1 / 32.9 / 34.7
 *   B=1 H=2 8192 (256, 64)                      73.8: 90.4 / 77.4 / 60.4 / 43.9
 *   B=1 H=1 16384 (256, 128)                   142.6: 182.9 / 150.9 / 115.4 / 82.0
 *   B=1 H=6 3072 (288, 24)                      34.3: 37.8 / 33.5 / 46.3 / 31.2
 *   B=1 H=4 6144 (384, 48)                      78.5: 72.1 / 61.9 / 82.7 / 58.1
 *   B=1 H=12 2048 (384, 16)                     30.9: 26.0 / 24.5 / 33.2 / 30.3
 *   B=1 H=16 2048 (512, 16)                     36.5: 33.4 / 25.0 / 35.4 / 37.7
 *   B=1 H=8 4096 (512, 32)                      65.2: 55.3 / 43.0 / 65.9 / 60.6
 *   B=1 H=2 16384 (512, 128)                   230.3: 188.0 / 159.9 / 224.4 / 168.0
 *   B=1 H=16 4096 (1024, 32)                   101.5: 105.8 / 85.1 / 129.6 / 110.1
 *   B=1 H=8 8192 (1024, 64)                    197.9: 194.0 / 156.7 / 237.5 / 183.8
 *   B=1 H=24 3072 (1152, 24)                    86.8: 82.0 / 95.5 / 123.3 / 105.2
 *   B=1 H=32 4096 (2048, 32)                   188.0: 178.8 / 176.6 / 245.0 / 215.9
 *   B=2 H=32 2048 (2048, 16)                   101.3: 104.2 / 98.2 / 142.5 / 138.2
 *   B=8 H=32 2048 (8192, 16)                   380.2: 391.3 / 400.8 / 543.5 / 537.0
 *   B=2 H=32 8192 (8192, 64)                  1328.2: 1225.6 / 1355.8 / 1898.1 / 1542.3
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
