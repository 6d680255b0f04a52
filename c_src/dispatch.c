/*
 * dispatch.c - which kernel runs a given call.
 *
 * The table below lists every instantiation compiled into this library (CMake defines
 * FC_HAVE_<FAMILY>_HDIM<d>_<dtype> for each file it builds, so a trimmed build simply has a
 * shorter table). A family runs on a device only if the library holds machine code for that
 * device's architecture: sm_89 code for Ada (8.9), sm_90a code for Hopper (9.0). No PTX is
 * embedded, so no other device can JIT these kernels; they fall back.
 */
#include "dispatch.h"

#include "config.h" /* FLASHCORE_PDL, FLASHCORE_BWD_PERSISTENT */

#include <stddef.h>

#define FC_DECLARE(name) cudaError_t name(const fc_params *p, cudaStream_t stream);
#if defined(FC_HAVE_SM80_HDIM32_fp16)
FC_DECLARE(fc_sm80_fwd_hdim32_fp16)
#endif
#if defined(FC_HAVE_SM80_HDIM32_bf16)
FC_DECLARE(fc_sm80_fwd_hdim32_bf16)
#endif
#if defined(FC_HAVE_SM80_HDIM64_fp16)
FC_DECLARE(fc_sm80_fwd_hdim64_fp16)
#endif
#if defined(FC_HAVE_SM80_HDIM64_bf16)
FC_DECLARE(fc_sm80_fwd_hdim64_bf16)
#endif
#if defined(FC_HAVE_SM80_HDIM80_fp16)
FC_DECLARE(fc_sm80_fwd_hdim80_fp16)
#endif
#if defined(FC_HAVE_SM80_HDIM80_bf16)
FC_DECLARE(fc_sm80_fwd_hdim80_bf16)
#endif
#if defined(FC_HAVE_SM80_HDIM96_fp16)
FC_DECLARE(fc_sm80_fwd_hdim96_fp16)
#endif
#if defined(FC_HAVE_SM80_HDIM96_bf16)
FC_DECLARE(fc_sm80_fwd_hdim96_bf16)
#endif
#if defined(FC_HAVE_SM80_HDIM128_fp16)
FC_DECLARE(fc_sm80_fwd_hdim128_fp16)
#endif
#if defined(FC_HAVE_SM80_HDIM128_bf16)
FC_DECLARE(fc_sm80_fwd_hdim128_bf16)
#endif
#if defined(FC_HAVE_SM80_HDIM256_fp16)
FC_DECLARE(fc_sm80_fwd_hdim256_fp16)
#endif
#if defined(FC_HAVE_SM80_HDIM256_bf16)
FC_DECLARE(fc_sm80_fwd_hdim256_bf16)
#endif

#if defined(FC_HAVE_SM90_HDIM64_fp16)
FC_DECLARE(fc_sm90_fwd_hdim64_fp16)
#endif
#if defined(FC_HAVE_SM90_HDIM64_bf16)
FC_DECLARE(fc_sm90_fwd_hdim64_bf16)
#endif
#if defined(FC_HAVE_SM90_HDIM128_fp16)
FC_DECLARE(fc_sm90_fwd_hdim128_fp16)
#endif
#if defined(FC_HAVE_SM90_HDIM128_bf16)
FC_DECLARE(fc_sm90_fwd_hdim128_bf16)
#endif
#if defined(FC_HAVE_SM90_HDIM256_fp16)
FC_DECLARE(fc_sm90_fwd_hdim256_fp16)
#endif
#if defined(FC_HAVE_SM90_HDIM256_bf16)
FC_DECLARE(fc_sm90_fwd_hdim256_bf16)
#endif

#if defined(FC_HAVE_DECODE_HDIM64_fp16)
FC_DECLARE(fc_decode_hdim64_fp16)
FC_DECLARE(fc_decode_hdim64_bf16)
FC_DECLARE(fc_decode_hdim128_fp16)
FC_DECLARE(fc_decode_hdim128_bf16)
#endif

typedef struct kernel_entry {
    fc_family family;
    int head_dim;
    fc_dtype dtype;
    fc_launch_fn launch;
} kernel_entry;

static const kernel_entry kKernels[] = {
#if defined(FC_HAVE_DECODE_HDIM64_fp16)
    {FC_FAMILY_DECODE, 64, FC_DTYPE_FP16, fc_decode_hdim64_fp16},
    {FC_FAMILY_DECODE, 64, FC_DTYPE_BF16, fc_decode_hdim64_bf16},
    {FC_FAMILY_DECODE, 128, FC_DTYPE_FP16, fc_decode_hdim128_fp16},
    {FC_FAMILY_DECODE, 128, FC_DTYPE_BF16, fc_decode_hdim128_bf16},
#endif
#if defined(FC_HAVE_SM90_HDIM64_fp16)
    {FC_FAMILY_SM90, 64, FC_DTYPE_FP16, fc_sm90_fwd_hdim64_fp16},
#endif
#if defined(FC_HAVE_SM90_HDIM64_bf16)
    {FC_FAMILY_SM90, 64, FC_DTYPE_BF16, fc_sm90_fwd_hdim64_bf16},
#endif
#if defined(FC_HAVE_SM90_HDIM128_fp16)
    {FC_FAMILY_SM90, 128, FC_DTYPE_FP16, fc_sm90_fwd_hdim128_fp16},
#endif
#if defined(FC_HAVE_SM90_HDIM128_bf16)
    {FC_FAMILY_SM90, 128, FC_DTYPE_BF16, fc_sm90_fwd_hdim128_bf16},
#endif
#if defined(FC_HAVE_SM90_HDIM256_fp16)
    {FC_FAMILY_SM90, 256, FC_DTYPE_FP16, fc_sm90_fwd_hdim256_fp16},
#endif
#if defined(FC_HAVE_SM90_HDIM256_bf16)
    {FC_FAMILY_SM90, 256, FC_DTYPE_BF16, fc_sm90_fwd_hdim256_bf16},
#endif
#if defined(FC_HAVE_SM80_HDIM32_fp16)
    {FC_FAMILY_SM80, 32, FC_DTYPE_FP16, fc_sm80_fwd_hdim32_fp16},
#endif
#if defined(FC_HAVE_SM80_HDIM32_bf16)
    {FC_FAMILY_SM80, 32, FC_DTYPE_BF16, fc_sm80_fwd_hdim32_bf16},
#endif
#if defined(FC_HAVE_SM80_HDIM64_fp16)
    {FC_FAMILY_SM80, 64, FC_DTYPE_FP16, fc_sm80_fwd_hdim64_fp16},
#endif
#if defined(FC_HAVE_SM80_HDIM64_bf16)
    {FC_FAMILY_SM80, 64, FC_DTYPE_BF16, fc_sm80_fwd_hdim64_bf16},
#endif
#if defined(FC_HAVE_SM80_HDIM80_fp16)
    {FC_FAMILY_SM80, 80, FC_DTYPE_FP16, fc_sm80_fwd_hdim80_fp16},
#endif
#if defined(FC_HAVE_SM80_HDIM80_bf16)
    {FC_FAMILY_SM80, 80, FC_DTYPE_BF16, fc_sm80_fwd_hdim80_bf16},
#endif
#if defined(FC_HAVE_SM80_HDIM96_fp16)
    {FC_FAMILY_SM80, 96, FC_DTYPE_FP16, fc_sm80_fwd_hdim96_fp16},
#endif
#if defined(FC_HAVE_SM80_HDIM96_bf16)
    {FC_FAMILY_SM80, 96, FC_DTYPE_BF16, fc_sm80_fwd_hdim96_bf16},
#endif
#if defined(FC_HAVE_SM80_HDIM128_fp16)
    {FC_FAMILY_SM80, 128, FC_DTYPE_FP16, fc_sm80_fwd_hdim128_fp16},
#endif
#if defined(FC_HAVE_SM80_HDIM128_bf16)
    {FC_FAMILY_SM80, 128, FC_DTYPE_BF16, fc_sm80_fwd_hdim128_bf16},
#endif
#if defined(FC_HAVE_SM80_HDIM256_fp16)
    {FC_FAMILY_SM80, 256, FC_DTYPE_FP16, fc_sm80_fwd_hdim256_fp16},
#endif
#if defined(FC_HAVE_SM80_HDIM256_bf16)
    {FC_FAMILY_SM80, 256, FC_DTYPE_BF16, fc_sm80_fwd_hdim256_bf16},
#endif
    {FC_FAMILY_AUTO, 0, FC_DTYPE_FP16, NULL} /* sentinel: keeps the array non-empty */
};

/* Does this library hold machine code of `family` for the device? (Also c_src/bwd.c's rule:
 * the backward kernels are sm80-class code.) */
int fc_family_runs_on_(fc_family family, int cc_major, int cc_minor) {
    switch (family) {
    case FC_FAMILY_SM80:
    case FC_FAMILY_DECODE: /* plain sm_80-class code too: built wherever the sm80 family is */
#if defined(FC_BUILT_SM89)
        if (cc_major == 8 && cc_minor == 9) return 1;
#endif
#if defined(FC_BUILT_SM90)
        if (cc_major == 9 && cc_minor == 0) return 1;
#endif
        return 0;
    case FC_FAMILY_SM90:
#if defined(FC_BUILT_SM90)
        if (cc_major == 9 && cc_minor == 0) return 1;
#endif
        return 0;
    default:
        return 0;
    }
}

/* A dim that is stepped over (size > 1) needs a stride a TMA tensor map can hold: nonzero and
 * under 2^40 bytes (2-byte elements). */
#define FC_TMA_MAX_STRIDE_ELEMS (((int64_t)1 << 40) / 2)
static int tma_stride_ok(int64_t size, int64_t stride) {
    return size <= 1 || (stride != 0 && stride < FC_TMA_MAX_STRIDE_ELEMS);
}
static int stepped_strides_nonzero(int64_t s0, int64_t st0, int64_t s1, int64_t st1, int64_t s2, int64_t st2) {
    return tma_stride_ok(s0, st0) && tma_stride_ok(s1, st1) && tma_stride_ok(s2, st2);
}

/* Requirements beyond validation. The Hopper family loads through TMA tensor maps, which
 * cannot describe a broadcast (stride-0) dim, and folds a positive scale into one FFMA per
 * score; other inputs go to the sm80 family, which takes any layout and any scale. */
/* The decode kernel holds (Hq / Hkv) * Sq <= 32 query rows per CTA (GQA packing) and is meant
 * for at most 16 queries against a cache. */
#define FC_DECODE_MAX_ROWS 32
#define FC_DECODE_MAX_SEQLEN_Q 16

static int family_takes_layout(fc_family family, const fc_params *p) {
    if (family == FC_FAMILY_DECODE)
        return p->seqlen_q <= FC_DECODE_MAX_SEQLEN_Q &&
               (p->heads_q / p->heads_kv) * p->seqlen_q <= FC_DECODE_MAX_ROWS;
    if (family != FC_FAMILY_SM90) return 1;
    return p->scale > 0.0f &&
           stepped_strides_nonzero(p->seqlen_q, p->q_stride_s, p->heads_q, p->q_stride_h, p->batch, p->q_stride_b) &&
           stepped_strides_nonzero(p->seqlen_k, p->k_stride_s, p->heads_kv, p->k_stride_h, p->batch, p->k_stride_b) &&
           stepped_strides_nonzero(p->seqlen_k, p->v_stride_s, p->heads_kv, p->v_stride_h, p->batch, p->v_stride_b);
}

/* For c_src/bwd.c: the Hopper family's layout requirements (above) for a params struct. */
int fc_sm90_takes_layout_(const fc_params *p) { return family_takes_layout(FC_FAMILY_SM90, p); }

static const kernel_entry *find_kernel(fc_family family, const fc_params *p) {
    for (size_t i = 0; kKernels[i].launch != NULL; ++i) {
        const kernel_entry *e = &kKernels[i];
        if (e->family == family && e->head_dim == p->head_dim && e->dtype == p->dtype) return e;
    }
    return NULL;
}

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

/* The sm80 family reads any attn_mask (a mask tile per K/V tile, kernels/fwd_sm80.cuh). The
 * Hopper forward reads bool masks whose tiles TMA can bring (fc_mask_tiles_fit_), alongside
 * each V tile, at D=64 and 128, in its non-causal configuration (kMasked in
 * kernels/sm90/fwd_traits.cuh): no causal flag, band, softcap or sinks with it. The decode
 * kernel's GQA row packing has no mask path. */
static int family_takes_mask(fc_family family, const fc_params *p) {
    if (p->mask_kind == FC_MASK_NONE || family == FC_FAMILY_SM80) return 1;
    return family == FC_FAMILY_SM90 && (p->head_dim == 64 || p->head_dim == 128) && !p->causal &&
           p->band_ != FC_BAND_GENERAL_ && p->softcap == 0.0f && p->sinks == NULL && fc_mask_tiles_fit_(p);
}

/* A general band (a window, or causal aligned bottom-right with seqlen_q != seqlen_k; dispatch.h)
 * runs in the Hopper family's forward, whose key loop starts and ends at the band's edges
 * (kernels/sm90/fwd_kernel.cuh), and in the decode kernels, whose causal variant reads only the band's
 * keys (kernels/decode_sm80.cuh). Neither takes it with a mask (the Hopper forward's mask tiles run
 * only in its non-causal configuration), so a band with a mask runs nowhere. */
/* Attention sinks: the Hopper forward's epilogue alone adds them (kernels/sm90/fwd_kernel.cuh). */
static int family_takes_sinks(fc_family family, const fc_params *p) {
    return p->sinks == NULL || family == FC_FAMILY_SM90;
}

/* A logit softcap: the Hopper forward's softmax applies it without a mask (kernels/sm90/fwd_kernel.cuh,
 * kSoftcap), the sm80-class forward's with or without one (kernels/fwd_sm80.cuh, kSoftcap). */
static int family_takes_softcap(fc_family family, const fc_params *p) {
    return p->softcap == 0.0f || family == FC_FAMILY_SM80 || (family == FC_FAMILY_SM90 && p->mask_kind == FC_MASK_NONE);
}

static int family_takes_band(fc_family family, const fc_params *p) {
    return p->band_ != FC_BAND_GENERAL_ ||
           ((family == FC_FAMILY_SM90 || family == FC_FAMILY_DECODE) && p->mask_kind == FC_MASK_NONE);
}

/* Would a family other than sm80 that runs here have a kernel for this call without its mask? */
static int unmasked_kernel_elsewhere(const fc_params *p, int cc_major, int cc_minor) {
    const fc_family others[] = {FC_FAMILY_DECODE, FC_FAMILY_SM90};
    for (size_t i = 0; i < 2; ++i)
        if (fc_family_runs_on_(others[i], cc_major, cc_minor) && find_kernel(others[i], p) != NULL &&
            family_takes_layout(others[i], p))
            return 1;
    return 0;
}

/* On Hopper, AUTO runs an unmasked call in the sm80-class family only for head dims the sm90
 * family also has (there the sm80 family is the layout fallback: broadcast dims, scale <= 0).
 * For a head dim only the sm80 family has (32, 80, 96), PyTorch's cuDNN path is the faster
 * choice on that card: D=96 at S=4096 measured 303 vs 520 TFLOP/s non-causal and 268 vs 449
 * causal (H100, docs/experiments/first-versions.md). Masked calls at those head dims stay in the sm80 family: it
 * measured 1.0-1.4x PyTorch's default there (docs/experiments/forward-masks.md). */
static int sm80_slower_than_fallback(fc_family family, const fc_params *p, int cc_major, int cc_minor) {
    return family == FC_FAMILY_SM80 && p->mask_kind == FC_MASK_NONE &&
           fc_family_runs_on_(FC_FAMILY_SM90, cc_major, cc_minor) && find_kernel(FC_FAMILY_SM90, p) == NULL;
}

/*
 * A masked call that only the sm80-class family takes, on a card where the Hopper family runs, is
 * slower there than PyTorch's own SDPA (cuDNN or its memory-efficient kernel) unless its mask
 * leaves whole tiles empty, which the sm80 kernels skip: HuggingFace's causal + padding bool mask
 * does (the sm80 family 1.01-1.41x PyTorch's default at D = 32, 80, 96, 256), a mask broadcast
 * over the query rows cannot, neither can one query row (decoding), and an additive mask costs
 * the sm80 kernels more than PyTorch's. Measured (H100, bf16, tools/mask_forms_vs_aten.py,
 * ratio = PyTorch's default time / the sm80 family's; docs/experiments/forward-masks.md):
 *   D=64/128: HF's mask as an additive one 0.74-0.90, a key-padding mask (B, 1, 1, Sk) bool
 *     0.41-0.54 and additive 0.24-0.46, decoding 0.21-1.12, 128-row chunks with an additive
 *     mask 0.67-0.70;
 *   D=32/80/96/256: key padding 0.19-0.86, decoding 0.22-0.89 over 4000 keys (1.05-1.58 for a
 *     bool mask over 1000), HF's mask additive 0.69-1.26 (below 1 at D=32, and at D=96 and 256
 *     on some lengths), bool 1.01-1.41.
 * At D=64 and 128 the Hopper family takes every bool mask it can read (the op hands it a copy
 * with 16-byte rows where that is all it lacks), so what reaches the sm80 family there goes to
 * PyTorch; at the other head dims, additive masks, masks broadcast over the query rows and
 * one-row calls. Only for calls PyTorch's SDPA expresses (no causal flag with the mask, band,
 * softcap or sinks) and that want no LSE: a training call's forward stays in the sm80 family,
 * whose LSE FlashCore's backward reads (the training route weighs the whole step and sends
 * additive masks to PyTorch: TRAINING_TABLE in python/flashcore/_ops.py).
 */
static int sm80_masked_slower_than_fallback(fc_family family, const fc_params *p, int cc_major, int cc_minor) {
    if (family != FC_FAMILY_SM80 || p->mask_kind == FC_MASK_NONE || p->lse != NULL || p->causal ||
        p->band_ == FC_BAND_GENERAL_ || p->softcap != 0.0f || p->sinks != NULL ||
        !fc_family_runs_on_(FC_FAMILY_SM90, cc_major, cc_minor))
        return 0;
    return p->mask_kind == FC_MASK_ADDITIVE || p->head_dim == 64 || p->head_dim == 128 ||
           p->mask_stride_q == 0 || p->seqlen_q == 1;
}

/*
 * Decoding (one query row) against many (batch, KV head) pairs and long caches: the decode
 * kernel's cp.async ring reads K/V at ~2.9 TB/s on the H100, the Hopper family's TMA ring at
 * ~3.05, about what cuDNN reads. Under AUTO such calls go to the Hopper family when they have at
 * least FC_DECODE_SM90_MIN_PAIRS pairs (64: half a wave of its CTAs, which it splits in two) and
 * FC_DECODE_SM90_MIN_KEY_ROWS key rows over all pairs (shorter calls are set by fixed costs,
 * where the decode kernel is ahead, as it is with fewer pairs, which it splits finer). A GQA
 * group's query heads become the rows of one block (fc_pack_decode_gqa), so each K/V byte is
 * read once, as in the decode kernel. Measured at D=128, Hq=32 (H100, fp16, eager us with a cold
 * L2, cuDNN / decode kernel / Hopper family; ninth session, two runs):
 *   B=8  Hkv=32 Sk=8k   362.9 / 380.0 / 367.7    B=8  Hkv=32 Sk=32k  1392 / 1442 / 1402-1404
 *   B=32 Hkv=32 Sk=8k   1405-1412 / 1475 / 1398  B=8  Hkv=8  Sk=32k  365.6 / 375.9 / 367.2
 *   B=8  Hkv=8  Sk=128k 1398 / 1456 / 1390       B=32 Hkv=8  Sk=8k   362.0 / 367.5 / 366.0
 *   B=32 Hkv=32 Sk=1k   190.7 / 199.3 / 194.0-195.1 (the bench: 0.958 -> 0.982 of cuDNN)
 * and the calls left to the decode kernel:
 *   B=8  Hkv=32 Sk=1k   60.2 / 61.9 / 63.3       B=32 Hkv=8  Sk=1k   60.4 / 61.7 / 63.5
 *   B=1  Hkv=32 Sk=32k  193.5 / 197.8 / 208.2    B=1  Hkv=32 Sk=128k 709 / 729 / 768
 *   B=1  Hkv=8  Sk=128k 193.9 / 198.8 / 204.5
 * Only D=128, one query row, no causal mask (a causal row 0 sees one key) were measured. The
 * threshold was 2^20 key rows until the nineteenth session, when the Hopper family had caught up
 * on the shorter calls (same tool, decode kernel at its automatic split count, two runs):
 *   B=32 Hkv=8 Sk=1k  60.7-60.8 / 62.1-62.5 / 61.5     B=8 Hkv=32 Sk=1k 60.5-61.2 / 61.2-62.0 / 61.1-61.8
 *   B=8  Hkv=8 Sk=8k  109.3-109.9 / 108.3-109.6 / 105.2-105.6
 * while the B=1 calls (32 or 8 pairs) still read faster in the decode kernel (above): there the
 * family's clusters of 4-16 CTAs per tile do not all fit in one wave. Since the twentieth
 * session calls over fewer pairs go to the family too, from FC_DECODE_SM90_SPLIT_MIN_KEY_ROWS
 * key rows, split over the grid instead (fc_sm90_decode_splits: one CTA per SM, a workspace and
 * the decode kernels' merge). Same tool, D=128, Hq=32, two runs:
 *   B=1 Hkv=32 Sk=32k  193.3-193.7 / 197.9-198.0 / 194.8-195.0
 *   B=1 Hkv=32 Sk=128k 710.2-710.3 / 731.1-732.2 / 707.1-707.2
 *   B=1 Hkv=8  Sk=128k 193.4-193.5 / 198.7-199.0 / 195.0-195.3
 *   B=2 Hkv=8  Sk=64k  193.8-194.4 / 199.6-199.8 / 194.2-194.6
 *   B=4 Hkv=8  Sk=32k  195.9-196.3 / 198.4 / 194.1-194.7
 * and below it the decode kernel stays ahead:
 *   B=1 Hkv=8  Sk=32k  64.5-64.7 / 63.4-63.9 / 64.4-64.8    B=1 Hkv=32 Sk=8k 64.3-65.0 / 62.8-63.1 / 64.6-64.9
 */
#define FC_DECODE_SM90_MIN_PAIRS 64
#define FC_DECODE_SM90_MIN_KEY_ROWS (1 << 18)
#define FC_DECODE_SM90_SPLIT_MIN_KEY_ROWS (1 << 20)

/* Packing makes a group's query heads the rows of one slice, q_stride_h apart. The packed call
 * must pass the same checks as any call (fc_params_validate: its slices must stay inside the
 * kernels' int offsets, which huge head strides or millions of heads break) and suit the Hopper
 * family's tensor maps; otherwise it runs unpacked, with the same result. */
int fc_decode_packs_for_sm90(const fc_params *p) {
    /* (Sinks and masks are per query head, which packing turns into rows.) */
    if (p->seqlen_q != 1 || p->causal || p->heads_q <= p->heads_kv || p->sinks != NULL || p->mask_kind != FC_MASK_NONE)
        return 0;
    fc_params packed = *p;
    fc_pack_decode_gqa(&packed);
    packed.band_ = packed.band_lo_ = packed.band_hi_ = 0; /* (validated as a caller's struct) */
    return fc_params_validate(&packed) == FC_OK && family_takes_layout(FC_FAMILY_SM90, &packed);
}

void fc_pack_decode_gqa(fc_params *p) {
    const int64_t group = p->heads_q / p->heads_kv;
    /* Query head h = hk * group + j of batch b sits at b * q_stride_b + (hk * group + j) *
     * q_stride_h: row j of KV head hk's block, rows q_stride_h apart, blocks group * q_stride_h. */
    p->seqlen_q = group;
    p->heads_q = p->heads_kv;
    p->q_stride_s = p->q_stride_h;
    p->q_stride_h *= group;
    p->o_stride_s = p->o_stride_h;
    p->o_stride_h *= group;
    p->lse_stride_s = p->lse_stride_h;
    p->lse_stride_h *= group;
    /* A resolved struct's rows now number `group`, all seeing every key (packed calls have no
     * band): the band's lower edge moves with them. */
    if (p->band_ == FC_BAND_NONE_) p->band_lo_ = (int)(1 - group);
}

/* Whether the Hopper family runs this one-row call as one block per (batch, KV head) pair: its
 * query heads' rows packed (fc_decode_packs_for_sm90), or one head per KV head. */
static int sm90_decode_block_per_pair(const fc_params *p) {
    if (p->seqlen_q != 1 || p->causal || p->mask_kind != FC_MASK_NONE) return 0;
    const int64_t group = p->heads_q / p->heads_kv;
    return group == 1 || (group <= 64 && fc_decode_packs_for_sm90(p));
}

static int sm90_reads_decode_faster(const fc_params *p, int cc_major, int cc_minor) {
    if (p->seqlen_q != 1 || p->causal || p->head_dim != 128 || p->mask_kind != FC_MASK_NONE) return 0;
    if (!fc_family_runs_on_(FC_FAMILY_SM90, cc_major, cc_minor) || find_kernel(FC_FAMILY_SM90, p) == NULL ||
        !family_takes_layout(FC_FAMILY_SM90, p))
        return 0;
    const int64_t pairs = p->batch * p->heads_kv;
    if (pairs >= FC_DECODE_SM90_MIN_PAIRS) return pairs * p->seqlen_k >= FC_DECODE_SM90_MIN_KEY_ROWS;
    return pairs * p->seqlen_k >= FC_DECODE_SM90_SPLIT_MIN_KEY_ROWS && sm90_decode_block_per_pair(p);
}

fc_status fc_dispatch(const fc_params *user, int cc_major, int cc_minor, fc_launch_fn *launch,
                      fc_family *family) {
    fc_params resolved = *user;
    fc_resolve_band_(&resolved);
    const fc_params *p = &resolved;
    if (p->dtype != FC_DTYPE_FP16 && p->dtype != FC_DTYPE_BF16) return FC_UNSUPPORTED_DTYPE;

    /* Families in order of preference; a forced family is the only candidate. The decode
     * kernel comes first: it takes only the small-Sq calls it is built for. */
    const fc_family preference[] = {FC_FAMILY_DECODE, FC_FAMILY_SM90, FC_FAMILY_SM80};
    const size_t n_candidates = p->family == FC_FAMILY_AUTO ? 3 : 1;
    int any_family_runs = 0;
    int declined_as_slower = 0;
    int declined_mask_as_slower = 0;
    int declined_for_band = 0;
    int declined_for_sinks = 0;
    int declined_for_softcap = 0;
    for (size_t i = 0; i < n_candidates; ++i) {
        const fc_family f = p->family == FC_FAMILY_AUTO ? preference[i] : p->family;
        if (!fc_family_runs_on_(f, cc_major, cc_minor)) continue;
        any_family_runs = 1;
        if (f == FC_FAMILY_DECODE && p->family == FC_FAMILY_AUTO && sm90_reads_decode_faster(p, cc_major, cc_minor))
            continue;
        const kernel_entry *e = find_kernel(f, p);
        if (e != NULL && p->family == FC_FAMILY_AUTO && sm80_slower_than_fallback(f, p, cc_major, cc_minor)) {
            declined_as_slower = 1;
            continue;
        }
        if (e != NULL && p->family == FC_FAMILY_AUTO && family_takes_layout(f, p) &&
            sm80_masked_slower_than_fallback(f, p, cc_major, cc_minor)) {
            declined_mask_as_slower = 1;
            continue;
        }
        if (e != NULL && family_takes_layout(f, p) && family_takes_mask(f, p) && !family_takes_band(f, p)) {
            declined_for_band = 1;
            continue;
        }
        if (e != NULL && family_takes_layout(f, p) && family_takes_mask(f, p) && !family_takes_sinks(f, p)) {
            declined_for_sinks = 1;
            continue;
        }
        if (e != NULL && family_takes_layout(f, p) && family_takes_mask(f, p) && !family_takes_softcap(f, p)) {
            declined_for_softcap = 1;
            continue;
        }
        if (e != NULL && family_takes_layout(f, p) && family_takes_mask(f, p)) {
            if (launch != NULL) *launch = e->launch;
            if (family != NULL) *family = f;
            return FC_OK;
        }
    }
    if (!any_family_runs)
        return p->family == FC_FAMILY_AUTO ? FC_UNSUPPORTED_ARCH : FC_UNSUPPORTED_FAMILY;
    if (declined_as_slower) return FC_UNSUPPORTED_SLOWER;
    if (declined_mask_as_slower) return FC_UNSUPPORTED_SLOWER_MASK;
    if (declined_for_band) return FC_UNSUPPORTED_BAND;
    if (declined_for_sinks) return FC_UNSUPPORTED_SINKS;
    if (declined_for_softcap) return FC_UNSUPPORTED_SOFTCAP;
    /* A mask with a forced family that has none, or (auto) a head dim only those families have. */
    if (p->mask_kind != FC_MASK_NONE &&
        (p->family == FC_FAMILY_SM90 || p->family == FC_FAMILY_DECODE ||
         (p->family == FC_FAMILY_AUTO && unmasked_kernel_elsewhere(p, cc_major, cc_minor))))
        return FC_UNSUPPORTED_MASK;
    if ((p->family == FC_FAMILY_SM90 || p->family == FC_FAMILY_DECODE) && find_kernel(p->family, p) != NULL)
        return FC_UNSUPPORTED_LAYOUT;
    return FC_UNSUPPORTED_HEAD_DIM;
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

/*
 * The Hopper family's grid split for one-row decoding over fewer than FC_DECODE_SM90_MIN_PAIRS
 * (batch, KV head) pairs (kernels/sm90/fwd_launch.cuh, launch_fwd_config): each pair's block (its
 * packed GQA rows, or one query head's row) is cut into `splits` key ranges, one CTA each,
 * without clusters, and the decode kernels' combine_kernel merges the partials from the
 * workspace (fc_decode_workspace_bytes). As many ranges as give one CTA per SM, each at least
 * FC_SM90_DECODE_MIN_KEYS_PER_SPLIT keys; `forced` > 0 (FLASHCORE_DECODE_SPLITS) overrides the
 * count. Only D=128 (the head dim the decode route measured) and calls whose blocks are one per
 * pair (sm90_decode_block_per_pair). Measured at B=1 Hkv=8 Sk=8k (H100, fp16, eager us, cuDNN /
 * this split): 4 ranges of 2048 keys 26.8-27.1 / 33.5-34.9, 8 ranges (forced) 25.7.
 */
#define FC_SM90_DECODE_MIN_KEYS_PER_SPLIT 512

int fc_sm90_decode_splits(const fc_params *p, int sm_count, int forced) {
    const int64_t pairs = p->batch * p->heads_kv;
    /* (The packing check validates a packed copy: last, after the cheap tests.) */
    /* (Sinks are added in the unsplit epilogue only.) */
    if (p->head_dim != 128 || pairs >= FC_DECODE_SM90_MIN_PAIRS || p->sinks != NULL || !sm90_decode_block_per_pair(p))
        return 1;
    int64_t splits = forced > 0 ? forced : (sm_count > 0 ? sm_count : 1) / pairs;
    if (forced <= 0 && splits > p->seqlen_k / FC_SM90_DECODE_MIN_KEYS_PER_SPLIT)
        splits = p->seqlen_k / FC_SM90_DECODE_MIN_KEYS_PER_SPLIT;
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
 * min_key_tiles_per_split key tiles per range (dispatch.h).
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
