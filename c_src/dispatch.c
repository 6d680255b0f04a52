/*
 * dispatch.c - which kernel runs a given call.
 *
 * The table below lists every instantiation compiled into this library (kernel_list.h, which
 * CMake writes from the kernel files it builds, so a trimmed build simply has a shorter table). A family runs on a device only if the library holds machine code for that
 * device's architecture: sm_89 code for Ada (8.9), sm_90a code for Hopper (9.0). No PTX is
 * embedded, so no other device can JIT these kernels; they fall back.
 */
#include "dispatch.h"

#include <stddef.h>

/* The launchers this build compiles (kernel_list.h, written by CMake from its list of kernel
 * files): declared here, then listed in kKernels. */
#define FC_FWD_KERNEL(family, prefix, hd, dt, DT) \
    cudaError_t fc_##prefix##_hdim##hd##_##dt(const fc_params *p, const fc_device_facts *dev, cudaStream_t stream);
#define FC_BWD_KERNEL(family, prefix, hd, dt, DT) /* (bwd.c's table) */
#include "kernel_list.h"
#undef FC_FWD_KERNEL

typedef struct kernel_entry {
    fc_family family;
    int head_dim;
    fc_dtype dtype;
    fc_launch_fn launch;
} kernel_entry;

static const kernel_entry kKernels[] = {
#define FC_FWD_KERNEL(family, prefix, hd, dt, DT) {FC_FAMILY_##family, hd, FC_DTYPE_##DT, fc_##prefix##_hdim##hd##_##dt},
#include "kernel_list.h"
#undef FC_FWD_KERNEL
#undef FC_BWD_KERNEL
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
    const int64_t batch = fc_tensor_batch(p), rows_q = fc_tensor_rows_q(p), rows_k = fc_tensor_rows_k(p);
    return p->scale > 0.0f &&
           stepped_strides_nonzero(rows_q, p->q_stride_s, p->heads_q, p->q_stride_h, batch, p->q_stride_b) &&
           stepped_strides_nonzero(rows_k, p->k_stride_s, p->heads_kv, p->k_stride_h, batch, p->k_stride_b) &&
           stepped_strides_nonzero(rows_k, p->v_stride_s, p->heads_kv, p->v_stride_h, batch, p->v_stride_b);
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

/* The head dims whose Hopper kernels read bool masks in tiles (both passes). */
static int sm90_has_mask_tiles(int64_t head_dim) { return head_dim == 64 || head_dim == 128 || head_dim == 256; }

/* The Hopper family's bool mask tiles, one rule for both passes (the forward's kMasked in
 * kernels/sm90/fwd_traits.cuh, the backward's kMaskBoolTiles): a bool mask whose tiles TMA can
 * bring (fc_mask_tiles_fit_) at D=64, 128 or 256, with top-left causal or none (the causal
 * configuration's key range, the mask applied inside it: flashcore's op asks for that where the
 * mask lies inside the causal triangle, as HuggingFace's padded causal masks do), no general
 * band and no softcap. */
int fc_sm90_bool_mask_tiles_(const fc_params *p) {
    return p->mask_kind == FC_MASK_BOOL && sm90_has_mask_tiles(p->head_dim) && p->band_ != FC_BAND_GENERAL_ &&
           p->softcap == 0.0f && fc_mask_tiles_fit_(p);
}

/* The sm80 family reads any attn_mask (a mask tile per K/V tile, kernels/fwd_sm80.cuh). The
 * Hopper forward reads bool masks in tiles (fc_sm90_bool_mask_tiles_), alongside each V tile,
 * without sinks. The decode kernels read any mask element by element beside their scores
 * (kMasked in kernels/decode_sm80.cuh), without the causal flag (PyTorch never passes both). */
static int family_takes_mask(fc_family family, const fc_params *p) {
    if (p->mask_kind == FC_MASK_NONE || family == FC_FAMILY_SM80) return 1;
    if (family == FC_FAMILY_DECODE) return !p->causal;
    return family == FC_FAMILY_SM90 && p->sinks == NULL && fc_sm90_bool_mask_tiles_(p);
}

/* A general band (a window, or causal aligned bottom-right with seqlen_q != seqlen_k; dispatch.h)
 * runs in the Hopper family's forward, whose key loop starts and ends at the band's edges
 * (kernels/sm90/fwd_kernel.cuh), and in the decode kernels, whose causal variant reads only the band's
 * keys (kernels/decode_sm80.cuh). Neither takes it with a mask (the Hopper forward's mask tiles
 * run with top-left causal at most), so a band with a mask runs nowhere. */
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

/* A paged KV cache (fc_params.block_table): only the decode kernels read pages (kPaged in
 * kernels/decode_sm80.cuh: each 16-key step's row addresses through the block table), and only in
 * their plain configuration: a decode-shaped call without causal, a band or a mask. Every other
 * family, and a paged call no decode kernel shape takes, declines it (FC_UNSUPPORTED_PAGED). */
static int family_takes_paged(fc_family family, const fc_params *p) {
    if (p->block_table == NULL) return 1;
    return family == FC_FAMILY_DECODE && family_takes_layout(family, p) && !p->causal && p->band_ != FC_BAND_GENERAL_ &&
           p->mask_kind == FC_MASK_NONE;
}

/* Packed variable-length sequences (fc_params.cu_seq_q): only the Hopper forward runs them
 * (kVarlen in kernels/sm90/fwd_kernel.cuh: its tiles from a list of the sequences' query blocks),
 * in its plain configurations: top-left causal or none, no mask, softcap, sinks or pages. (A
 * window or bottom-right causal was declined in validation, before the band is resolved.) */
static int family_takes_varlen(fc_family family, const fc_params *p) {
    if (p->cu_seq_q == NULL) return 1;
    return family == FC_FAMILY_SM90 && family_takes_layout(family, p) && p->band_ != FC_BAND_GENERAL_ &&
           p->mask_kind == FC_MASK_NONE && p->softcap == 0.0f && p->sinks == NULL && p->block_table == NULL;
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
 * choice on that card: the sm80 kernel ran at about 0.6x cuDNN's speed at D=96
 * (docs/experiments/first-versions.md, "Head dims 32/80/96/256 in the sm80 family"). Masked
 * calls at those head dims stay in the sm80 family: it ran HuggingFace's padding masks faster
 * than PyTorch's default (docs/experiments/forward-masks.md; the exceptions: below). */
static int sm80_slower_than_fallback(fc_family family, const fc_params *p, int cc_major, int cc_minor) {
    return family == FC_FAMILY_SM80 && p->mask_kind == FC_MASK_NONE &&
           fc_family_runs_on_(FC_FAMILY_SM90, cc_major, cc_minor) && find_kernel(FC_FAMILY_SM90, p) == NULL;
}

/*
 * A masked call that only the sm80-class family takes, on a card where the Hopper family runs, is
 * slower there than PyTorch's own SDPA (cuDNN or its memory-efficient kernel) unless its mask
 * leaves whole tiles empty, which the sm80 kernels skip: HuggingFace's causal + padding bool mask
 * does (there the sm80 family beats PyTorch's default at D = 32, 80, 96, 256), a mask broadcast
 * over the query rows cannot, neither can one query row (decoding), and an additive mask costs
 * the sm80 kernels more than PyTorch's. (Measurements, tools/mask_forms_vs_aten.py:
 * docs/experiments/forward-masks.md, thirtieth session, "Measured before", and "Measurements
 * moved from c_src/dispatch.c (sm80_masked_slower_than_fallback)".)
 * At D=64, 128 and 256 the Hopper family takes every bool mask it can read (the op hands it a
 * copy with 16-byte rows where that is all it lacks), so what reaches the sm80 family there goes
 * to PyTorch; at the other head dims, additive masks, masks broadcast over the query rows and
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
    return p->mask_kind == FC_MASK_ADDITIVE || sm90_has_mask_tiles(p->head_dim) ||
           p->mask_stride_q == 0 || p->seqlen_q == 1;
}

/*
 * Decoding (one query row) against many (batch, KV head) pairs and long caches: the Hopper
 * family's TMA ring reads K/V a few percent faster than the decode kernel's cp.async ring, about
 * as fast as cuDNN. Under AUTO such calls go to the Hopper family when they have at
 * least FC_DECODE_SM90_MIN_PAIRS pairs (64: half a wave of its CTAs, which it splits in two) and
 * FC_DECODE_SM90_MIN_KEY_ROWS key rows over all pairs (shorter calls are set by fixed costs,
 * where the decode kernel is ahead, as it is with fewer pairs, which it splits finer). A GQA
 * group's query heads become the rows of one block (fc_pack_decode_gqa), so each K/V byte is
 * read once, as in the decode kernel. Calls over fewer pairs go to the family from
 * FC_DECODE_SM90_SPLIT_MIN_KEY_ROWS key rows, split over the grid instead (fc_sm90_decode_splits:
 * one CTA per SM, a workspace and the decode kernels' merge): unsplit, the family's clusters of
 * 4-16 CTAs per tile do not all fit in one wave, and below that many key rows the decode kernel
 * stays ahead. Only D=128, one query row and no causal mask (a causal row 0 sees one key) were
 * measured. Measurements: docs/experiments/sessions-04-09.md, "Measurements moved from
 * c_src/dispatch.c (the decode route, FC_DECODE_SM90_MIN_PAIRS)"; sessions-17-23.md, "Measurements
 * moved from c_src/dispatch.c (the decode route, nineteenth session)" and the twentieth session's
 * "The grid split".
 */
#define FC_DECODE_SM90_MIN_PAIRS 64
#define FC_DECODE_SM90_MIN_KEY_ROWS (1 << 18)
#define FC_DECODE_SM90_SPLIT_MIN_KEY_ROWS (1 << 20)

/* Packing makes a group's query heads the rows of one slice, q_stride_h apart. The packed call
 * must pass the same checks as any call (fc_params_validate: its slices must stay inside the
 * kernels' int offsets, which huge head strides or millions of heads break) and suit the Hopper
 * family's tensor maps; otherwise it runs unpacked, with the same result. The caller's struct
 * passed validation already, so only the checks packing can change run on the packed one
 * (fc_packed_rows_valid_), not a second validation. */
int fc_decode_packs_for_sm90(const fc_params *p) {
    /* (Sinks and masks are per query head, which packing turns into rows; the Hopper family reads
     * no pages.) */
    if (p->seqlen_q != 1 || p->causal || p->heads_q <= p->heads_kv || p->sinks != NULL || p->mask_kind != FC_MASK_NONE ||
        p->block_table != NULL || p->cu_seq_q != NULL)
        return 0;
    fc_params packed = *p;
    if (!fc_pack_decode_gqa(&packed)) return 0;
    return fc_packed_rows_valid_(&packed) && family_takes_layout(FC_FAMILY_SM90, &packed);
}

int fc_pack_decode_gqa(fc_params *p) {
    const int64_t group = p->heads_q / p->heads_kv;
    /* The head strides grow by the group: where a product passes int64 (an unused lse's stride
     * is not validated) the call cannot be packed. */
    int64_t q_stride_h = 0, o_stride_h = 0, lse_stride_h = 0;
    if (__builtin_mul_overflow(p->q_stride_h, group, &q_stride_h) || __builtin_mul_overflow(p->o_stride_h, group, &o_stride_h) ||
        __builtin_mul_overflow(p->lse_stride_h, group, &lse_stride_h))
        return 0;
    /* Query head h = hk * group + j of batch b sits at b * q_stride_b + (hk * group + j) *
     * q_stride_h: row j of KV head hk's block, rows q_stride_h apart, blocks group * q_stride_h. */
    p->seqlen_q = group;
    p->heads_q = p->heads_kv;
    p->q_stride_s = p->q_stride_h;
    p->q_stride_h = q_stride_h;
    p->o_stride_s = p->o_stride_h;
    p->o_stride_h = o_stride_h;
    p->lse_stride_s = p->lse_stride_h;
    p->lse_stride_h = lse_stride_h;
    /* A resolved struct's rows now number `group`, all seeing every key (packed calls have no
     * band): the band's lower edge moves with them. */
    if (p->band_ == FC_BAND_NONE_) p->band_lo_ = (int)(1 - group);
    return 1;
}

/* fc_decode_packs_for_sm90 for the call being decided, worked out the first time a rule asks
 * (*packs < 0 until then): it builds and checks a packed copy, which a call should do once, and
 * most calls never need the answer (only one-row GQA calls that reach the rules below). */
static int packs_once(const fc_params *p, int *packs) {
    if (*packs < 0) *packs = fc_decode_packs_for_sm90(p);
    return *packs;
}

/* Whether the Hopper family runs this one-row call as one block per (batch, KV head) pair: its
 * query heads' rows packed (fc_decode_packs_for_sm90, through packs_once), or one head per KV
 * head. */
static int sm90_decode_block_per_pair(const fc_params *p, int *packs) {
    if (p->seqlen_q != 1 || p->causal || p->mask_kind != FC_MASK_NONE) return 0;
    const int64_t group = p->heads_q / p->heads_kv;
    return group == 1 || (group <= 64 && packs_once(p, packs));
}

static int sm90_reads_decode_faster(const fc_params *p, int cc_major, int cc_minor, int *packs) {
    /* (A paged call stays in the decode kernels: the Hopper family reads no pages.) */
    if (p->seqlen_q != 1 || p->causal || p->head_dim != 128 || p->mask_kind != FC_MASK_NONE || p->block_table != NULL ||
        p->cu_seq_q != NULL)
        return 0;
    if (!fc_family_runs_on_(FC_FAMILY_SM90, cc_major, cc_minor) || find_kernel(FC_FAMILY_SM90, p) == NULL ||
        !family_takes_layout(FC_FAMILY_SM90, p))
        return 0;
    const int64_t pairs = p->batch * p->heads_kv;
    if (pairs >= FC_DECODE_SM90_MIN_PAIRS) return pairs * p->seqlen_k >= FC_DECODE_SM90_MIN_KEY_ROWS;
    return pairs * p->seqlen_k >= FC_DECODE_SM90_SPLIT_MIN_KEY_ROWS && sm90_decode_block_per_pair(p, packs);
}

/* On Hopper, under AUTO, the decode kernels leave an additive mask to PyTorch's SDPA when no LSE
 * is wanted: PyTorch ran one-row calls with an additive mask at 1.07-1.37x the decode kernels'
 * time (its backend for additive masks reads them faster than the kernels' element-by-element
 * loads), while with a bool mask the kernels ran 1.10-1.61x faster than PyTorch's
 * (docs/experiments/forward-masks.md, thirty-second session). */
static int decode_masked_slower_than_fallback(fc_family family, const fc_params *p, int cc_major, int cc_minor) {
    return family == FC_FAMILY_DECODE && cc_major == 9 && cc_minor == 0 && p->mask_kind == FC_MASK_ADDITIVE &&
           p->block_table == NULL && p->lse == NULL && family_takes_mask(family, p) && p->band_ != FC_BAND_GENERAL_ && p->softcap == 0.0f &&
           p->sinks == NULL;
}

fc_status fc_dispatch(const fc_params *user, int cc_major, int cc_minor, fc_launch_fn *launch,
                      fc_family *family, int *packs) {
    fc_params resolved = *user;
    fc_resolve_band_(&resolved);
    const fc_params *p = &resolved;
    int packs_known = -1; /* fc_decode_packs_for_sm90(p), once asked (packs_once) */
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
    int declined_for_pages = 0;
    int declined_for_varlen = 0;
    for (size_t i = 0; i < n_candidates; ++i) {
        const fc_family f = p->family == FC_FAMILY_AUTO ? preference[i] : p->family;
        if (!fc_family_runs_on_(f, cc_major, cc_minor)) continue;
        any_family_runs = 1;
        /* (First: a paged call is declined for its pages before any speed or layout rule.) */
        if (!family_takes_paged(f, p)) {
            declined_for_pages = 1;
            continue;
        }
        if (!family_takes_varlen(f, p)) {
            declined_for_varlen = 1;
            continue;
        }
        if (f == FC_FAMILY_DECODE && p->family == FC_FAMILY_AUTO &&
            sm90_reads_decode_faster(p, cc_major, cc_minor, &packs_known))
            continue;
        const kernel_entry *e = find_kernel(f, p);
        if (e != NULL && p->family == FC_FAMILY_AUTO && sm80_slower_than_fallback(f, p, cc_major, cc_minor)) {
            declined_as_slower = 1;
            continue;
        }
        if (e != NULL && p->family == FC_FAMILY_AUTO && family_takes_layout(f, p) &&
            (sm80_masked_slower_than_fallback(f, p, cc_major, cc_minor) ||
             decode_masked_slower_than_fallback(f, p, cc_major, cc_minor))) {
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
            if (packs != NULL) *packs = f == FC_FAMILY_SM90 && packs_once(p, &packs_known);
            return FC_OK;
        }
    }
    if (!any_family_runs)
        return p->family == FC_FAMILY_AUTO ? FC_UNSUPPORTED_ARCH : FC_UNSUPPORTED_FAMILY;
    /* A paged call no family took for its pages; the decode family, which reads them, may have
     * declined it for a head dim, sinks or a softcap (the statuses below) instead. */
    if (declined_for_pages && !(p->family == FC_FAMILY_AUTO && family_takes_paged(FC_FAMILY_DECODE, p) &&
                                fc_family_runs_on_(FC_FAMILY_DECODE, cc_major, cc_minor)))
        return FC_UNSUPPORTED_PAGED;
    /* A packed call no family took for its packing; the sm90 family, which reads it, may have
     * declined it for a head dim (FC_UNSUPPORTED_HEAD_DIM below) instead. */
    if (declined_for_varlen && !(family_takes_varlen(FC_FAMILY_SM90, p) && fc_family_runs_on_(FC_FAMILY_SM90, cc_major, cc_minor) &&
                                 (p->family == FC_FAMILY_AUTO || p->family == FC_FAMILY_SM90)))
        return FC_UNSUPPORTED_VARLEN;
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
 * The Hopper family's grid split for one-row decoding over fewer than FC_DECODE_SM90_MIN_PAIRS
 * (batch, KV head) pairs (kernels/sm90/fwd_launch.cuh, launch_fwd_config): each pair's block (its
 * packed GQA rows, or one query head's row) is cut into `splits` key ranges, one CTA each,
 * without clusters, and the decode kernels' combine_kernel merges the partials from the
 * workspace (fc_decode_workspace_bytes). As many ranges as give one CTA per SM, each at least
 * FC_SM90_DECODE_MIN_KEYS_PER_SPLIT keys; `forced` > 0 (FLASHCORE_DECODE_SPLITS) overrides the
 * count, over any number of pairs (for A/B runs: tools/decode_splits.py). Only D=128 (the head
 * dim the decode route measured) and calls whose blocks are one per pair
 * (sm90_decode_block_per_pair). Ranges of 512 keys, not 2048: with the longer minimum a
 * call over few pairs and a short cache got too few CTAs and fell well behind cuDNN, and more
 * ranges passed it (measurements: docs/experiments/sessions-17-23.md, twentieth session, "The
 * grid split").
 */
#define FC_SM90_DECODE_MIN_KEYS_PER_SPLIT 512

int fc_sm90_decode_splits(const fc_params *p, int sm_count, int forced, int packs) {
    const int64_t pairs = p->batch * p->heads_kv;
    /* (The packing is the caller's answer, fc_dispatch's: not asked again here.) */
    int packs_known = packs != 0;
    /* (Sinks are added in the unsplit epilogue only.) */
    if (p->head_dim != 128 || (pairs >= FC_DECODE_SM90_MIN_PAIRS && forced <= 0) || p->sinks != NULL || p->cu_seq_q != NULL ||
        !sm90_decode_block_per_pair(p, &packs_known))
        return 1;
    int64_t splits = forced > 0 ? forced : (sm_count > 0 ? sm_count : 1) / pairs;
    if (forced <= 0 && splits > p->seqlen_k / FC_SM90_DECODE_MIN_KEYS_PER_SPLIT)
        splits = p->seqlen_k / FC_SM90_DECODE_MIN_KEYS_PER_SPLIT;
    if (splits > FC_DECODE_MAX_SPLITS) splits = FC_DECODE_MAX_SPLITS;
    return splits > 1 ? (int)splits : 1;
}
