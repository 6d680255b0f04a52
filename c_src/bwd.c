/*
 * bwd.c - the C layer of the backward: validation, the support query, the workspace size and the
 * launch of fc_sdpa_bwd (see flashcore.h for the contract, kernels/bwd_sm80.cuh for the kernels).
 * Nothing here allocates, synchronizes or exits.
 *
 * Two kernel families: the sm80-class one (mma.sync + cp.async, kernels/bwd_sm80.cuh), built for
 * sm_89 and sm_90a, bitwise deterministic under `deterministic` (dQ in a pass of its own), else one
 * pass whose dQ is summed with fp32 atomics; and the Hopper one (TMA + wgmma,
 * kernels/sm90/bwd_kernel.cuh), sm_90a only, which sums dq through fp32 reductions in any order. The table holds the
 * instantiations this build compiles (kernel_list.h, written by CMake).
 */
#include "config.h"
#include "dispatch.h"
#include "flashcore.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define FC_API __attribute__((visibility("default")))

/* A backward launcher: the call's params and the device it runs on (found once per call, here). */
typedef cudaError_t (*fc_bwd_launch_fn)(const fc_bwd_params *p, const fc_device_facts *dev, cudaStream_t stream);

/* The backward launchers this build compiles (kernel_list.h, written by CMake): declared here,
 * then listed in kBwdKernels. */
#define FC_FWD_KERNEL(family, prefix, hd, dt, DT) /* (dispatch.c's table) */
#define FC_BWD_KERNEL(family, prefix, hd, dt, DT) \
    cudaError_t fc_##prefix##_hdim##hd##_##dt(const fc_bwd_params *p, const fc_device_facts *dev, cudaStream_t stream);
#include "kernel_list.h"
#undef FC_BWD_KERNEL

typedef struct bwd_entry {
    fc_family family;
    int head_dim;
    fc_dtype dtype;
    fc_bwd_launch_fn launch;
} bwd_entry;

static const bwd_entry kBwdKernels[] = {
#define FC_BWD_KERNEL(family, prefix, hd, dt, DT) {FC_FAMILY_##family, hd, FC_DTYPE_##DT, fc_##prefix##_hdim##hd##_##dt},
#include "kernel_list.h"
#undef FC_BWD_KERNEL
#undef FC_FWD_KERNEL
    {FC_FAMILY_AUTO, 0, FC_DTYPE_FP16, NULL} /* sentinel */
};

FC_API void fc_bwd_params_init(fc_bwd_params *p) {
    if (p == NULL) return;
    memset(p, 0, sizeof(*p));
    fc_params_init(&p->fwd);
}

FC_API void fc_bwd_params_set_contiguous_strides(fc_bwd_params *p) {
    if (p == NULL) return;
    fc_params *f = &p->fwd;
    fc_params_set_contiguous_strides(f);
    p->do_stride_b = p->dq_stride_b = f->q_stride_b;
    p->do_stride_h = p->dq_stride_h = f->q_stride_h;
    p->do_stride_s = p->dq_stride_s = f->q_stride_s;
    p->do_stride_d = p->dq_stride_d = 1;
    p->dk_stride_b = p->dv_stride_b = f->k_stride_b;
    p->dk_stride_h = p->dv_stride_h = f->k_stride_h;
    p->dk_stride_s = p->dv_stride_s = f->k_stride_s;
    p->dk_stride_d = p->dv_stride_d = 1;
    p->dlse_stride_b = f->lse_stride_b;
    p->dlse_stride_h = f->lse_stride_h;
    p->dlse_stride_s = f->lse_stride_s;
}

/* Largest element offset of a (B, H, S) fp32 operand must fit int64 and its last byte must not
 * wrap the address space (the kernels index these with 64-bit offsets). */
static fc_status check_rows_operand(const float *base, int64_t b, int64_t h, int64_t s, int64_t sb,
                                    int64_t sh, int64_t ss) {
    if (sb < 0 || sh < 0 || ss < 0) return FC_ERR_NEGATIVE_STRIDE;
    if (((uintptr_t)base & 3u) != 0) return FC_ERR_POINTER_ALIGNMENT;
    const int64_t sizes[3] = {b, h, s}, strides[3] = {sb, sh, ss};
    int64_t total = 0, term = 0, bytes = 0;
    for (int i = 0; i < 3; ++i) {
        if (__builtin_mul_overflow(sizes[i] - 1, strides[i], &term)) return FC_ERR_OFFSET_OVERFLOW;
        if (__builtin_add_overflow(total, term, &total)) return FC_ERR_OFFSET_OVERFLOW;
    }
    if (__builtin_add_overflow(total, (int64_t)1, &total) || __builtin_mul_overflow(total, (int64_t)4, &bytes))
        return FC_ERR_OFFSET_OVERFLOW;
    if ((uint64_t)bytes > UINTPTR_MAX - (uintptr_t)base) return FC_ERR_OFFSET_OVERFLOW;
    return FC_OK;
}

FC_API fc_status fc_bwd_params_validate(const fc_bwd_params *p) {
    if (p == NULL) return FC_ERR_NULL_PARAMS;
    const fc_params *f = &p->fwd;
    fc_status s = fc_params_validate(f); /* also checks lse's strides and offsets when set */
    if (s != FC_OK) return s;
    if (f->lse == NULL || p->dout == NULL || p->dq == NULL || p->dk == NULL || p->dv == NULL)
        return FC_ERR_NULL_POINTER;
    if (p->workspace_bytes < 0 || ((uintptr_t)p->workspace & 15u) != 0) return FC_ERR_BAD_WORKSPACE;
    /* The backward kernels launch (blocks, heads, batch) grids in one go: CUDA caps y and z at
     * 65535 (the forward splits such calls into several launches; the backward does not yet).
     * A packed call's row-wise grids have one batch item (its sequences are rows). */
    if (f->heads_q > 65535 || fc_tensor_batch(f) > 65535) return FC_ERR_OFFSET_OVERFLOW;
    /* Packed (fc_params.cu_seq_q): the gradients and dlse lie along the packed rows as q, k and
     * the LSE do, with no batch stride. */
    if (f->cu_seq_q != NULL && (p->do_stride_b != 0 || p->dq_stride_b != 0 || p->dk_stride_b != 0 ||
                                p->dv_stride_b != 0 || (p->dlse != NULL && p->dlse_stride_b != 0)))
        return FC_ERR_BAD_VARLEN;

    const int64_t elem = f->dtype == FC_DTYPE_FP32 ? 4 : 2;
    const int64_t qsize[4] = {fc_tensor_batch(f), f->heads_q, fc_tensor_rows_q(f), f->head_dim};
    const int64_t ksize[4] = {fc_tensor_batch(f), f->heads_kv, fc_tensor_rows_k(f), f->head_dim};
    const int64_t do_st[4] = {p->do_stride_b, p->do_stride_h, p->do_stride_s, p->do_stride_d};
    const int64_t dq_st[4] = {p->dq_stride_b, p->dq_stride_h, p->dq_stride_s, p->dq_stride_d};
    const int64_t dk_st[4] = {p->dk_stride_b, p->dk_stride_h, p->dk_stride_s, p->dk_stride_d};
    const int64_t dv_st[4] = {p->dv_stride_b, p->dv_stride_h, p->dv_stride_s, p->dv_stride_d};
    if ((s = fc_check_operand_(qsize, do_st, p->dout, elem)) != FC_OK) return s;
    if ((s = fc_check_operand_(qsize, dq_st, p->dq, elem)) != FC_OK) return s;
    if ((s = fc_check_operand_(ksize, dk_st, p->dk, elem)) != FC_OK) return s;
    if ((s = fc_check_operand_(ksize, dv_st, p->dv, elem)) != FC_OK) return s;
    if (p->dlse != NULL) {
        s = check_rows_operand(p->dlse, fc_tensor_batch(f), f->heads_q, fc_tensor_rows_q(f), p->dlse_stride_b,
                               p->dlse_stride_h, p->dlse_stride_s);
        if (s != FC_OK) return s;
    }
    return FC_OK;
}


static const bwd_entry *find_bwd_kernel(fc_family family, const fc_params *f) {
    for (size_t i = 0; kBwdKernels[i].launch != NULL; ++i)
        if (kBwdKernels[i].family == family && kBwdKernels[i].head_dim == f->head_dim &&
            kBwdKernels[i].dtype == f->dtype)
            return &kBwdKernels[i];
    return NULL;
}

/* The Hopper family loads Q, dO, K and V through TMA tensor maps: the forward's layout rules
 * (no broadcast dim, positive scale) for q, k, v, and for dout as a Q-shaped operand. Its grid is
 * one dimension of (key block, KV head, batch) CTAs, at most 2^31 - 1 of them (128-key blocks;
 * D=256: 64; a packed call: each listed 128-key block, at D=256 as two tiles). */
static int sm90_takes_layout(const fc_bwd_params *p) {
    int64_t ctas = 0;
    const int64_t block = fc_sm90_bwd_key_block(p->fwd.head_dim);
    const int64_t key_blocks = (p->fwd.seqlen_k + block - 1) / block;
    if (__builtin_mul_overflow(key_blocks, p->fwd.heads_kv, &ctas) ||
        __builtin_mul_overflow(ctas, p->fwd.batch, &ctas) || ctas > INT32_MAX)
        return 0;
    /* A packed call's tiles: at most the key-block list's capacity per KV head, times the tiles
     * of a listed block. */
    const int64_t tiles_per_listed_block = FC_VARLEN_BLOCK_ROWS / block;
    if (p->fwd.cu_seq_q != NULL &&
        (__builtin_mul_overflow(fc_varlen_block_capacity(p->fwd.total_k, p->fwd.batch), p->fwd.heads_kv, &ctas) ||
         __builtin_mul_overflow(ctas, tiles_per_listed_block, &ctas) || ctas > INT32_MAX))
        return 0;
    fc_params as_dout = p->fwd;
    as_dout.q_stride_b = p->do_stride_b;
    as_dout.q_stride_h = p->do_stride_h;
    as_dout.q_stride_s = p->do_stride_s;
    return fc_sm90_takes_layout_(&p->fwd) && fc_sm90_takes_layout_(&as_dout);
}

/* Can `family` run validated params here? FC_OK and its entry, or the FC_UNSUPPORTED_* reason. */
static fc_status family_runs(fc_family family, const fc_bwd_params *p, int cc_major, int cc_minor,
                             const bwd_entry **entry) {
    if (!fc_family_runs_on_(family, cc_major, cc_minor)) return FC_UNSUPPORTED_FAMILY;
    /* Masks: both families, not with causal (PyTorch's SDPA never asks for both), but for the
     * Hopper family's bool mask tiles (fc_sm90_bool_mask_tiles_, top-left causal at most): a mask
     * inside the causal triangle then runs as causal with its mask, the empty tiles above the
     * diagonal skipped (flashcore's op asks so, python/flashcore/_ops.py). */
    if (p->fwd.mask_kind != FC_MASK_NONE && p->fwd.causal && !(family == FC_FAMILY_SM90 && fc_sm90_bool_mask_tiles_(&p->fwd)))
        return FC_UNSUPPORTED_MASK;
    /* A window or bottom-right causal band (dispatch.h; with a mask, declined just above, as it
     * comes with causal set): the Hopper family's kBand variant only. So a deterministic call
     * with one (AUTO then tries the sm80-class family alone) is declined too. */
    if (p->fwd.band_ == FC_BAND_GENERAL_ && family != FC_FAMILY_SM90) return FC_UNSUPPORTED_BAND;
    /* A softcap: the Hopper family's kSoftcap variant, which has no mask path but at D=256 with a
     * bool mask (its additive one spilled), or the sm80-class family's (masks too; dQ in a pass
     * of its own, fc_sm80_bwd_one_pass). */
    if (p->fwd.softcap != 0.0f && family == FC_FAMILY_SM90 && p->fwd.mask_kind != FC_MASK_NONE &&
        !(p->fwd.head_dim == 256 && p->fwd.mask_kind == FC_MASK_BOOL))
        return FC_UNSUPPORTED_SOFTCAP;
    /* Packed sequences: the Hopper family's kVarlen variant, top-left causal or none, no mask or
     * softcap (a window or bottom-right causal was declined in validation). */
    if (p->fwd.cu_seq_q != NULL &&
        (family != FC_FAMILY_SM90 || p->fwd.mask_kind != FC_MASK_NONE || p->fwd.softcap != 0.0f ||
         p->fwd.band_ == FC_BAND_GENERAL_ || p->fwd.sinks != NULL))
        return FC_UNSUPPORTED_VARLEN;
    if ((*entry = find_bwd_kernel(family, &p->fwd)) == NULL) return FC_UNSUPPORTED_HEAD_DIM;
    if (family == FC_FAMILY_SM90 && !sm90_takes_layout(p)) return FC_UNSUPPORTED_LAYOUT;
    return FC_OK;
}

/* The kernel for validated params, or the FC_UNSUPPORTED_* reason. AUTO takes the Hopper family
 * where it runs the call and determinism is not asked for, else the sm80-class family (so a
 * masked call the Hopper family cannot take, e.g. a layout its tensor maps cannot describe, runs
 * there). */
static fc_status bwd_dispatch(const fc_bwd_params *user, int cc_major, int cc_minor, const bwd_entry **entry) {
    fc_bwd_params resolved = *user;
    fc_resolve_band_(&resolved.fwd);
    const fc_bwd_params *p = &resolved;
    const fc_params *f = &p->fwd;
    /* No backward kernel reads a paged KV cache (fc_params.block_table): the forward's decode
     * kernels alone do. */
    if (f->block_table != NULL) return FC_UNSUPPORTED_PAGED;
    if (f->dtype != FC_DTYPE_FP16 && f->dtype != FC_DTYPE_BF16) return FC_UNSUPPORTED_DTYPE;
    const bwd_entry *found = NULL;
    fc_status s;
    if (f->family == FC_FAMILY_SM80 || f->family == FC_FAMILY_SM90) {
        s = family_runs(f->family, p, cc_major, cc_minor, &found);
    } else if (f->family != FC_FAMILY_AUTO) {
        return FC_UNSUPPORTED_FAMILY;
    } else {
        s = p->deterministic ? FC_UNSUPPORTED_FAMILY : family_runs(FC_FAMILY_SM90, p, cc_major, cc_minor, &found);
        /* (A packed call runs in the Hopper family alone, whose dq is summed in any order: under
         * `deterministic` it is declined.) */
        if (s != FC_OK && f->cu_seq_q != NULL) return FC_UNSUPPORTED_VARLEN;
        if (s != FC_OK) {
            s = family_runs(FC_FAMILY_SM80, p, cc_major, cc_minor, &found);
            if (s == FC_UNSUPPORTED_FAMILY) s = FC_UNSUPPORTED_ARCH;
        }
    }
    if (s == FC_OK && entry != NULL) *entry = found;
    return s;
}

FC_API fc_status fc_sdpa_bwd_support(const fc_bwd_params *p, int cc_major, int cc_minor) {
    const fc_status s = fc_bwd_params_validate(p);
    if (s != FC_OK) return s;
    return bwd_dispatch(p, cc_major, cc_minor, NULL);
}

FC_API fc_family fc_sdpa_bwd_family(const fc_bwd_params *p, int cc_major, int cc_minor) {
    const bwd_entry *entry = NULL;
    if (fc_bwd_params_validate(p) != FC_OK || bwd_dispatch(p, cc_major, cc_minor, &entry) != FC_OK)
        return FC_FAMILY_AUTO;
    return entry->family;
}

/* fc_sm80_bwd_workspace_bytes, fc_sm90_bwd_workspace_bytes and fc_sm90_bwd_varlen_workspace_bytes
 * (launch_rules.h), 16-byte rounded. Sizes are validated, so rows < 2^31 * 64 (fc_params_validate
 * bounds the number of 64-row tiles) and none of them can wrap. */
static int64_t bwd_workspace_bytes(const fc_bwd_params *p, fc_family family) {
    const fc_params *f = &p->fwd;
    const int64_t bytes = family != FC_FAMILY_SM90 ? fc_sm80_bwd_workspace_bytes(f, p->deterministic)
                          : f->cu_seq_q != NULL   ? fc_sm90_bwd_varlen_workspace_bytes(f)
                                                  : fc_sm90_bwd_workspace_bytes(f);
    return (bytes + 15) / 16 * 16;
}

FC_API fc_status fc_sdpa_bwd_workspace_size(const fc_bwd_params *p, int64_t *bytes) {
    if (bytes == NULL) return FC_ERR_NULL_POINTER;
    *bytes = 0;
    const fc_status s = fc_bwd_params_validate(p);
    if (s != FC_OK) return s;
    /* Sizes only (no device query): enough for either family where a Hopper kernel is built. */
    int64_t need = p->fwd.cu_seq_q != NULL ? 0 : bwd_workspace_bytes(p, FC_FAMILY_SM80);  /* (packed: sm90 alone) */
    if (find_bwd_kernel(FC_FAMILY_SM90, &p->fwd) != NULL) {
        const int64_t sm90 = bwd_workspace_bytes(p, FC_FAMILY_SM90);
        if (sm90 > need) need = sm90;
    }
    *bytes = need;
    return FC_OK;
}

FC_API fc_status fc_sdpa_bwd(const fc_bwd_params *p, cudaStream_t stream) {
    fc_config_read(); /* the call's overrides (config.h), read once here for its launcher */
    fc_status s = fc_bwd_params_validate(p);
    if (s != FC_OK) return s;
    fc_device_facts dev;
    if ((s = fc_device_facts_(&dev)) != FC_OK) return s;
    const bwd_entry *entry = NULL;
    if ((s = bwd_dispatch(p, dev.major, dev.minor, &entry)) != FC_OK) return s;
    if (p->workspace == NULL || p->workspace_bytes < bwd_workspace_bytes(p, entry->family))
        return FC_ERR_BAD_WORKSPACE;
    fc_bwd_params run = *p;
    fc_resolve_band_(&run.fwd);
    const cudaError_t err = entry->launch(&run, &dev, stream);
    fc_set_last_cuda_error_(err);
    return err == cudaSuccess ? FC_OK : FC_ERR_CUDA;
}
