/*
 * flashcore.c - the C layer: status strings, validation, the support query, and the launch.
 * See flashcore.h for the contract. Nothing here allocates, synchronizes or exits.
 */
#include "flashcore.h"
#include "config.h"
#include "dispatch.h"

#include <math.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define FC_API __attribute__((visibility("default")))

/* Kernels index inside one (batch, head) slice with 32-bit ints and launch a grid of
 * (query blocks, heads_q, batch): CUDA allows at most 65535 in y and z, so fc_sdpa_fwd runs
 * larger batches and head counts as several launches over slices of at most that many. */
#define FC_MAX_SLICE_OFFSET INT32_MAX
#define FC_MAX_GRID_YZ 65535
/* Kernels round lengths up to whole tiles (at most 256 rows) in int arithmetic. */
#define FC_MAX_SEQLEN (INT32_MAX - 256)

static _Thread_local cudaError_t last_cuda_error = cudaSuccess;

static const char *const kStatusStrings[FC_STATUS_COUNT_] = {
    [FC_OK] = "success",
    [FC_ERR_NULL_PARAMS] = "params is NULL",
    [FC_ERR_NULL_POINTER] = "a required device pointer is NULL (q, k, v and out always; mask when mask_kind is not NONE)",
    [FC_ERR_NEGATIVE_DIM] = "a size (batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim) is negative",
    [FC_UNSUPPORTED_EMPTY] = "a size is zero: there is nothing to launch",
    [FC_ERR_HEADS_NOT_DIVISIBLE] = "heads_q must be a multiple of heads_kv",
    [FC_ERR_LAST_DIM_STRIDE] = "the head_dim stride of q, k, v and out must be 1 (last dim contiguous)",
    [FC_ERR_STRIDE_ALIGNMENT] = "batch, head and sequence strides of q, k, v and out must be multiples of 16 bytes",
    [FC_ERR_POINTER_ALIGNMENT] = "q, k, v and out must be 16-byte aligned",
    [FC_ERR_NEGATIVE_STRIDE] = "strides must not be negative",
    [FC_ERR_BAD_DTYPE] = "dtype is not a valid fc_dtype",
    [FC_ERR_BAD_MASK_KIND] = "mask_kind is not a valid fc_mask_kind",
    [FC_ERR_BAD_FAMILY] = "family is not a valid fc_family",
    [FC_ERR_BAD_WORKSPACE] = "workspace_bytes is negative or workspace is not 16-byte aligned (backward: or missing, or smaller than fc_sdpa_bwd_workspace_size)",
    [FC_ERR_BAD_SCALE] = "scale must be finite",
    [FC_ERR_OFFSET_OVERFLOW] = "tensor too large: an offset inside one (batch, head) slice of q, k, v, out or the mask exceeds 2^31-1 elements, the backward's batch or heads_q exceeds 65535 (CUDA's grid limit), or an offset overflows 64 bits (or the address space, sinks included)",
    [FC_UNSUPPORTED_DTYPE] = "no kernel for this dtype (fp16 and bf16 only)",
    [FC_UNSUPPORTED_HEAD_DIM] = "no kernel for this head_dim in the selected family",
    [FC_UNSUPPORTED_MASK] = "no kernel family here takes this attention mask with this call: the sm80 family takes any (head dims 32, 64, 80, 96, 128, 256); the sm90 family only bool masks at head dims 64, 128 and 256 whose key rows are contiguous and whose base and row strides are 16-byte multiples, without a band, softcap or sinks (is_causal top-left only); the decode family (at most 16 query rows) any mask without is_causal; the backward (fc_sdpa_bwd): either family, any mask without is_causal (the sm90 family also a bool mask it reads in tiles with top-left is_causal, no softcap)",
    [FC_UNSUPPORTED_ARCH] = "no FlashCore kernel for this GPU architecture (kernels exist for sm_89 and sm_90)",
    [FC_UNSUPPORTED_FAMILY] = "the forced kernel family is not built into this library or cannot run on this GPU",
    [FC_UNSUPPORTED_LAYOUT] = "the forced kernel family cannot take these inputs (sm90: a nonzero stride on every dim of size > 1, scale > 0, and for its backward at most 2^31 - 1 key blocks x KV heads x batch; decode: at most 16 query rows, and 32 rows per KV head)",
    [FC_ERR_CUDA] = "a CUDA call or kernel launch failed (fc_last_cuda_error() has the CUDA error)",
    [FC_ERR_BAD_WINDOW] = "with windowed set, window_left and window_right must be -1 (unbounded) or >= 0; alignment must be FC_ALIGN_TOP_LEFT or FC_ALIGN_BOTTOM_RIGHT; the internal band_ fields must be 0",
    [FC_UNSUPPORTED_BAND] = "a sliding window or a bottom-right causal band runs only in the sm90 family (forward and backward: head dims 64, 128, 256) and the decode kernels (forward, up to 16 query rows), without a mask; no kernel here takes this call",
    [FC_UNSUPPORTED_SINKS] = "attention sinks run only in the sm90 family's forward (head dims 64, 128, 256, without a mask); no kernel here takes this call",
    [FC_ERR_BAD_SOFTCAP] = "softcap must be 0 (none) or a finite value > 0",
    [FC_UNSUPPORTED_SOFTCAP] = "a logit softcap runs in the sm90 family without a mask (forward and backward: head dims 64, 128, 256; the D=256 backward with a bool mask too) and in the sm80-class family (with or without a mask; backward: head dims 32-128); no kernel here takes this call",
    [FC_UNSUPPORTED_SLOWER_MASK] = "on sm_90 PyTorch's own SDPA runs such calls faster than the kernels that take this attention mask (the decode kernels: an additive mask; the sm80-class family: an additive mask; at head dims 64, 128 and 256 every mask the sm90 family cannot take; at other head dims a bool mask broadcast over the query rows, or one query row); calls that want the LSE (training) still run it; force family sm80 (FLASHCORE_FAMILY=sm80) to run it anyway",
    [FC_ERR_BAD_PAGES] = "inconsistent paged KV arguments: with block_table set, page_size must be a positive multiple of 16, pages_per_seq >= 1 with pages_per_seq * page_size >= seqlen_k, num_pages in [1, 2^31 - 1], block_table_stride >= pages_per_seq (batch > 1) and the table's extent addressable; without block_table, pages_per_seq, page_size, num_pages, block_table_stride and seqused_k must all be 0 / NULL",
    [FC_UNSUPPORTED_PAGED] = "no kernel here takes this paged call: only the decode family reads a paged KV cache (forward, at most 16 query rows and 32 rows per KV head, head dims 64 and 128, without is_causal, a band, a mask, softcap or sinks); the backward takes no paged call",
    [FC_ERR_BAD_VARLEN] = "packed variable-length arguments are inconsistent: cu_seq_q and cu_seq_k must both be set (4-byte aligned), total_q and total_k at least 1, every batch stride 0 (see fc_params.cu_seq_q)",
    [FC_UNSUPPORTED_VARLEN] = "no kernel here takes this packed variable-length call: only the sm90 family runs them (fp16/bf16, top-left causal or none, without a window, mask, softcap, sinks or pages; the forward and the backward at head dims 64, 128 and 256, the backward not under deterministic mode)",
    [FC_UNSUPPORTED_SLOWER] = "on sm_90 only the sm80-class family has this head dim, and PyTorch's own SDPA (cuDNN) runs it faster (about 1.7x, bench/NOTES.md); force family sm80 (FLASHCORE_FAMILY=sm80) to run it anyway",
};

FC_API const char *fc_status_string(fc_status status) {
    if ((int)status < 0 || status >= FC_STATUS_COUNT_ || kStatusStrings[status] == NULL)
        return "unknown fc_status value";
    return kStatusStrings[status];
}

FC_API cudaError_t fc_last_cuda_error(void) { return last_cuda_error; }

FC_API void fc_params_init(fc_params *p) {
    if (p == NULL) return;
    memset(p, 0, sizeof(*p));
    p->dtype = FC_DTYPE_FP16;
    p->mask_kind = FC_MASK_NONE;
    p->family = FC_FAMILY_AUTO;
}

/* a * b, or INT64_MAX when that overflows (validation then rejects the struct). */
static int64_t mul_saturating(int64_t a, int64_t b) {
    int64_t r = 0;
    return __builtin_mul_overflow(a, b, &r) ? INT64_MAX : r;
}

FC_API void fc_params_set_contiguous_strides(fc_params *p) {
    if (p == NULL) return;
    const int64_t D = p->head_dim;
    p->q_stride_d = p->k_stride_d = p->v_stride_d = p->o_stride_d = 1;
    p->q_stride_s = p->o_stride_s = D;
    p->q_stride_h = p->o_stride_h = mul_saturating(p->seqlen_q, D);
    p->q_stride_b = p->o_stride_b = mul_saturating(p->heads_q, p->q_stride_h);
    p->k_stride_s = p->v_stride_s = D;
    p->k_stride_h = p->v_stride_h = mul_saturating(p->seqlen_k, D);
    p->k_stride_b = p->v_stride_b = mul_saturating(p->heads_kv, p->k_stride_h);
    p->lse_stride_s = 1;
    p->lse_stride_h = p->seqlen_q;
    p->lse_stride_b = mul_saturating(p->heads_q, p->seqlen_q);
}

/* One 4-D operand: sizes (b, h, s, d) and strides, for the stride and offset checks. */
typedef struct operand {
    int64_t size[4];
    int64_t stride[4];
} operand;

static int64_t element_bytes(fc_dtype dtype) { return dtype == FC_DTYPE_FP32 ? 4 : 2; }

static fc_status check_strides(const operand *t, int64_t elem_bytes) {
    for (int i = 0; i < 4; ++i)
        if (t->stride[i] < 0) return FC_ERR_NEGATIVE_STRIDE;
    if (t->size[3] > 1 && t->stride[3] != 1) return FC_ERR_LAST_DIM_STRIDE;
    /* A dim of size 1 is never stepped over, so its stride is irrelevant (PyTorch leaves
     * arbitrary strides on such dims, e.g. Sq = 1 in decoding). */
    for (int i = 0; i < 3; ++i)
        if (t->size[i] > 1 && t->stride[i] % (16 / elem_bytes) != 0) return FC_ERR_STRIDE_ALIGNMENT;
    return FC_OK;
}

/* Largest element offset of the operand; fails on int64 overflow, a slice offset past 2^31,
 * or a last byte address that wraps past the end of the address space. A slice is dims 2 and
 * 3 (the kernels index inside it in int): (size2-1)*stride2 + (size3-1)*stride3 + 1 elements.
 * q, k, v, out and lse have stride3 = 1 (or size3 = 1); the mask's dim 3 (keys) may have any
 * stride, 0 included. */
static fc_status check_offsets(const operand *t, const void *base, int64_t elem_bytes) {
    int64_t slice = 0, term = 0, total = 0, bytes = 0;
    if (__builtin_mul_overflow(t->size[2] - 1, t->stride[2], &term)) return FC_ERR_OFFSET_OVERFLOW;
    if (__builtin_mul_overflow(t->size[3] - 1, t->stride[3], &slice)) return FC_ERR_OFFSET_OVERFLOW;
    if (__builtin_add_overflow(term, slice, &slice)) return FC_ERR_OFFSET_OVERFLOW;
    if (__builtin_add_overflow(slice, 1, &slice)) return FC_ERR_OFFSET_OVERFLOW;
    if (slice > FC_MAX_SLICE_OFFSET) return FC_ERR_OFFSET_OVERFLOW;
    total = slice;
    for (int i = 0; i < 2; ++i) {
        if (__builtin_mul_overflow(t->size[i] - 1, t->stride[i], &term)) return FC_ERR_OFFSET_OVERFLOW;
        if (__builtin_add_overflow(total, term, &total)) return FC_ERR_OFFSET_OVERFLOW;
    }
    if (__builtin_mul_overflow(total, elem_bytes, &bytes)) return FC_ERR_OFFSET_OVERFLOW;
    if ((uint64_t)bytes > UINTPTR_MAX - (uintptr_t)base) return FC_ERR_OFFSET_OVERFLOW;
    return FC_OK;
}

static int aligned16(const void *ptr) { return ((uintptr_t)ptr & 15u) == 0; }

/* q, out and the LSE as operands of the checks above (validation's, and the packed rows':
 * fc_tensor_batch / fc_tensor_rows_q, dispatch.h). */
static operand q_operand(const fc_params *p) {
    const operand t = {{fc_tensor_batch(p), p->heads_q, fc_tensor_rows_q(p), p->head_dim},
                       {p->q_stride_b, p->q_stride_h, p->q_stride_s, p->q_stride_d}};
    return t;
}
static operand o_operand(const fc_params *p) {
    const operand t = {{fc_tensor_batch(p), p->heads_q, fc_tensor_rows_q(p), p->head_dim},
                       {p->o_stride_b, p->o_stride_h, p->o_stride_s, p->o_stride_d}};
    return t;
}
static operand lse_operand(const fc_params *p) {
    const operand t = {{fc_tensor_batch(p), p->heads_q, fc_tensor_rows_q(p), 1},
                       {p->lse_stride_b, p->lse_stride_h, p->lse_stride_s, 1}};
    return t;
}

/* The paged KV fields (flashcore.h, fc_params.block_table): all zero without a table, else
 * consistent. The table's contents live on the device and are never read here (the kernels clamp
 * its entries into [0, num_pages)). */
static fc_status check_pages(const fc_params *p) {
    if (p->block_table == NULL)
        return p->pages_per_seq != 0 || p->page_size != 0 || p->num_pages != 0 || p->block_table_stride != 0 ||
                       p->seqused_k != NULL
                   ? FC_ERR_BAD_PAGES
                   : FC_OK;
    if (p->page_size <= 0 || p->page_size % 16 != 0 || p->pages_per_seq <= 0) return FC_ERR_BAD_PAGES;
    if (p->num_pages <= 0 || p->num_pages > INT32_MAX) return FC_ERR_BAD_PAGES;
    if ((int64_t)p->pages_per_seq * p->page_size < p->seqlen_k) return FC_ERR_BAD_PAGES;
    if (p->batch > 1 && p->block_table_stride < p->pages_per_seq) return FC_ERR_BAD_PAGES;
    if (p->block_table_stride < 0) return FC_ERR_BAD_PAGES;
    /* The table's last entry read, (batch - 1) * stride + pages_per_seq - 1, and its byte address. */
    int64_t last = 0, bytes = 0;
    if (__builtin_mul_overflow(p->batch - 1, p->block_table_stride, &last) ||
        __builtin_add_overflow(last, (int64_t)p->pages_per_seq, &last) || __builtin_mul_overflow(last, (int64_t)4, &bytes) ||
        (uint64_t)bytes > UINTPTR_MAX - (uintptr_t)p->block_table)
        return FC_ERR_BAD_PAGES;
    if (p->seqused_k != NULL && (__builtin_mul_overflow(p->batch, (int64_t)4, &bytes) ||
                                 (uint64_t)bytes > UINTPTR_MAX - (uintptr_t)p->seqused_k))
        return FC_ERR_BAD_PAGES;
    return FC_OK;
}

/* k or v as an operand of the checks above: (B, Hkv, Sk, D), or for a paged call the pool
 * (num_pages, Hkv, page_size, D) with the page stride in the batch stride's place. */
static operand kv_operand(const fc_params *p, int64_t sb, int64_t sh, int64_t ss, int64_t sd) {
    const int paged = p->block_table != NULL;
    const operand t = {{paged ? p->num_pages : fc_tensor_batch(p), p->heads_kv,
                        paged ? p->page_size : fc_tensor_rows_k(p), p->head_dim},
                       {sb, sh, ss, sd}};
    return t;
}

/* The packed variable-length fields (flashcore.h, fc_params.cu_seq_q): all zero when not
 * packed, else both offset arrays and both totals, and no batch stride (the batch's sequences
 * are rows). The arrays live on the device and are never read here (the kernels clamp every
 * offset into [0, total]). */
static fc_status check_varlen(const fc_params *p) {
    if (p->cu_seq_q == NULL)
        return p->cu_seq_k != NULL || p->total_q != 0 || p->total_k != 0 ? FC_ERR_BAD_VARLEN : FC_OK;
    if (p->cu_seq_k == NULL || p->total_q < 1 || p->total_k < 1) return FC_ERR_BAD_VARLEN;
    /* (The kernels' causal is top-left within each sequence; a window or a bottom-right diagonal
     * would be per sequence, which none runs: declined before the band is resolved.) */
    if (p->windowed || (p->causal && p->alignment != FC_ALIGN_TOP_LEFT)) return FC_UNSUPPORTED_VARLEN;
    if (p->q_stride_b != 0 || p->k_stride_b != 0 || p->v_stride_b != 0 || p->o_stride_b != 0 ||
        (p->lse != NULL && p->lse_stride_b != 0))
        return FC_ERR_BAD_VARLEN;
    if (((uintptr_t)p->cu_seq_q & 3u) != 0 || ((uintptr_t)p->cu_seq_k & 3u) != 0) return FC_ERR_POINTER_ALIGNMENT;
    if (p->total_q > FC_MAX_SEQLEN || p->total_k > FC_MAX_SEQLEN || p->batch >= INT32_MAX) return FC_ERR_OFFSET_OVERFLOW;
    int64_t bytes = 0;
    if (__builtin_mul_overflow(p->batch + 1, (int64_t)4, &bytes) ||
        (uint64_t)bytes > UINTPTR_MAX - (uintptr_t)p->cu_seq_q || (uint64_t)bytes > UINTPTR_MAX - (uintptr_t)p->cu_seq_k)
        return FC_ERR_BAD_VARLEN;
    return FC_OK;
}

/* Validations on this thread, for the tests that check a call validates its struct once. */
static _Thread_local unsigned long long validations_on_thread;
FC_API unsigned long long fc_validations_on_thread_(void) { return validations_on_thread; }

FC_API fc_status fc_params_validate(const fc_params *p) {
    ++validations_on_thread;
    if (p == NULL) return FC_ERR_NULL_PARAMS;
    if ((int)p->dtype < FC_DTYPE_FP16 || (int)p->dtype > FC_DTYPE_FP32) return FC_ERR_BAD_DTYPE;
    if ((int)p->mask_kind < FC_MASK_NONE || (int)p->mask_kind > FC_MASK_ADDITIVE)
        return FC_ERR_BAD_MASK_KIND;
    if ((int)p->family < FC_FAMILY_AUTO || (int)p->family > FC_FAMILY_DECODE) return FC_ERR_BAD_FAMILY;
    if (p->workspace_bytes < 0 || !aligned16(p->workspace)) return FC_ERR_BAD_WORKSPACE;

    const int64_t dims[6] = {p->batch, p->heads_q, p->heads_kv, p->seqlen_q, p->seqlen_k, p->head_dim};
    for (int i = 0; i < 6; ++i)
        if (dims[i] < 0) return FC_ERR_NEGATIVE_DIM;
    for (int i = 0; i < 6; ++i)
        if (dims[i] == 0) return FC_UNSUPPORTED_EMPTY;
    if (p->heads_q % p->heads_kv != 0) return FC_ERR_HEADS_NOT_DIVISIBLE;

    if (p->q == NULL || p->k == NULL || p->v == NULL || p->out == NULL) return FC_ERR_NULL_POINTER;
    if (p->mask_kind != FC_MASK_NONE && p->mask == NULL) return FC_ERR_NULL_POINTER;
    if (!isfinite(p->scale)) return FC_ERR_BAD_SCALE;
    if (p->alignment != FC_ALIGN_TOP_LEFT && p->alignment != FC_ALIGN_BOTTOM_RIGHT) return FC_ERR_BAD_WINDOW;
    if (p->windowed && (p->window_left < -1 || p->window_right < -1)) return FC_ERR_BAD_WINDOW;
    if (p->sinks != NULL && ((uintptr_t)p->sinks & 3u) != 0) return FC_ERR_POINTER_ALIGNMENT;
    if (!(p->softcap >= 0.0f && isfinite(p->softcap))) return FC_ERR_BAD_SOFTCAP;
    /* The library's own fields (fc_resolve_band_) come from callers as 0. */
    if (p->band_ != 0 || p->band_lo_ != 0 || p->band_hi_ != 0) return FC_ERR_BAD_WINDOW;
    const fc_status pages = check_pages(p);
    if (pages != FC_OK) return pages;
    const fc_status packed = check_varlen(p);
    if (packed != FC_OK) return packed;
    if (((uintptr_t)p->block_table & 3u) != 0 || ((uintptr_t)p->seqused_k & 3u) != 0) return FC_ERR_POINTER_ALIGNMENT;

    const operand ops[4] = {
        q_operand(p),
        kv_operand(p, p->k_stride_b, p->k_stride_h, p->k_stride_s, p->k_stride_d),
        kv_operand(p, p->v_stride_b, p->v_stride_h, p->v_stride_s, p->v_stride_d),
        o_operand(p),
    };
    const int64_t elem = element_bytes(p->dtype);
    for (int i = 0; i < 4; ++i) {
        const fc_status s = check_strides(&ops[i], elem);
        if (s != FC_OK) return s;
    }
    if (!aligned16(p->q) || !aligned16(p->k) || !aligned16(p->v) || !aligned16(p->out))
        return FC_ERR_POINTER_ALIGNMENT;
    if (p->lse != NULL) {
        if (p->lse_stride_b < 0 || p->lse_stride_h < 0 || p->lse_stride_s < 0)
            return FC_ERR_NEGATIVE_STRIDE;
        if (((uintptr_t)p->lse & 3u) != 0) return FC_ERR_POINTER_ALIGNMENT;
    }
    if (p->mask_kind != FC_MASK_NONE &&
        (p->mask_stride_b < 0 || p->mask_stride_h < 0 || p->mask_stride_q < 0 || p->mask_stride_k < 0))
        return FC_ERR_NEGATIVE_STRIDE;

    const void *bases[4] = {p->q, p->k, p->v, p->out};
    for (int i = 0; i < 4; ++i) {
        const fc_status s = check_offsets(&ops[i], bases[i], elem);
        if (s != FC_OK) return s;
    }
    if (p->lse != NULL) {
        const operand lse = lse_operand(p);
        const fc_status s = check_offsets(&lse, p->lse, 4);
        if (s != FC_OK) return s;
    }
    if (p->mask_kind != FC_MASK_NONE) {
        /* (B, Hq, Sq, Sk) with any strides (0 = broadcast) and no alignment requirement: the
         * sm80 kernel copies mask tiles in 16/8/4-byte pieces where the address and row stride
         * allow, element by element otherwise. Only the offsets must fit its indexing. */
        const operand mask = {{p->batch, p->heads_q, p->seqlen_q, p->seqlen_k},
                              {p->mask_stride_b, p->mask_stride_h, p->mask_stride_q, p->mask_stride_k}};
        const fc_status s = check_offsets(&mask, p->mask, p->mask_kind == FC_MASK_BOOL ? 1 : elem);
        if (s != FC_OK) return s;
    }
    /* The sinks' (heads_q,) floats, as the block table's entries: the last one's address does
     * not wrap (a launch per slice of heads moves the pointer by the slice's first head). */
    int64_t last_sink = 0;
    if (p->sinks != NULL && (__builtin_mul_overflow(p->heads_q - 1, (int64_t)4, &last_sink) ||
                             (uint64_t)last_sink > UINTPTR_MAX - (uintptr_t)p->sinks))
        return FC_ERR_OFFSET_OVERFLOW;
    if (p->seqlen_q > FC_MAX_SEQLEN || p->seqlen_k > FC_MAX_SEQLEN) return FC_ERR_OFFSET_OVERFLOW;
    /* The persistent kernels number their (64-row query block, head, batch) tiles in an int. */
    int64_t slices = 0, tiles = 0;
    if (__builtin_mul_overflow(p->heads_q, p->batch, &slices) ||
        __builtin_mul_overflow((p->seqlen_q + 63) / 64, slices, &tiles) || tiles > INT32_MAX)
        return FC_ERR_OFFSET_OVERFLOW;
    /* A packed call's tiles: at most (total_q / 64 + batch) query blocks per head. */
    if (p->cu_seq_q != NULL && (__builtin_mul_overflow((p->total_q + 63) / 64 + p->batch, p->heads_q, &tiles) ||
                                tiles > INT32_MAX))
        return FC_ERR_OFFSET_OVERFLOW;
    return FC_OK;
}

/* Given params fc_params_validate accepted, would it accept `packed`, their fc_pack_decode_gqa
 * equivalent? Packing changes only what validation sees of one (batch, head) slice of q, out and
 * the LSE (a GQA group's rows, q_stride_h apart, become one slice's sequence) and seqlen_q (the
 * group): the strides stay 16-byte multiples (the head stride was checked, and so are its
 * multiples), each tensor's largest offset is the same element as before, and the tile count
 * does not grow. So only those checks run again: the decode route (fc_decode_packs_for_sm90)
 * then costs no second validation per call. tests/fuzz/fuzz_params.c holds the answer equal to
 * validating the packed copy whole. */
int fc_packed_rows_valid_(const fc_params *packed) {
    const int64_t elem = element_bytes(packed->dtype);
    const operand q = q_operand(packed), o = o_operand(packed);
    if (check_offsets(&q, packed->q, elem) != FC_OK || check_offsets(&o, packed->out, elem) != FC_OK) return 0;
    if (packed->lse != NULL) {
        const operand lse = lse_operand(packed);
        if (check_offsets(&lse, packed->lse, 4) != FC_OK) return 0;
    }
    return packed->seqlen_q <= FC_MAX_SEQLEN;
}

FC_API fc_status fc_sdpa_support(const fc_params *p, int cc_major, int cc_minor) {
    const fc_status s = fc_params_validate(p);
    if (s != FC_OK) return s;
    return fc_dispatch(p, cc_major, cc_minor, NULL, NULL, NULL);
}

FC_API fc_family fc_sdpa_family(const fc_params *p, int cc_major, int cc_minor) {
    fc_family family = FC_FAMILY_AUTO;
    if (fc_params_validate(p) != FC_OK) return FC_FAMILY_AUTO;
    if (fc_dispatch(p, cc_major, cc_minor, NULL, &family, NULL) != FC_OK) return FC_FAMILY_AUTO;
    return family;
}

/* The current device, its compute capability and SM count (cached: 0 means not read yet).
 * Any of the outputs may be NULL (callers that need only some of them). */
#define FC_MAX_DEVICES 64
static _Atomic int cc_cache[FC_MAX_DEVICES]; /* written last (release), read first (acquire) */
static _Atomic int sm_cache[FC_MAX_DEVICES];

static fc_status device_info(int *device_out, int *major_out, int *minor_out, int *sms_out) {
    int device = 0, major = 0, minor = 0, sms = 0;
    cudaError_t err = cudaGetDevice(&device);
    if (err != cudaSuccess) goto fail;
    const int cached = device >= 0 && device < FC_MAX_DEVICES
                           ? atomic_load_explicit(&cc_cache[device], memory_order_acquire)
                           : 0;
    if (cached != 0) {
        major = cached / 10;
        minor = cached % 10;
        sms = atomic_load_explicit(&sm_cache[device], memory_order_relaxed);
    } else {
        err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
        if (err != cudaSuccess) goto fail;
        err = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
        if (err != cudaSuccess) goto fail;
        err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
        if (err != cudaSuccess) goto fail;
        if (device >= 0 && device < FC_MAX_DEVICES) {
            atomic_store_explicit(&sm_cache[device], sms, memory_order_relaxed);
            atomic_store_explicit(&cc_cache[device], major * 10 + minor, memory_order_release);
        }
    }
    if (device_out != NULL) *device_out = device;
    if (major_out != NULL) *major_out = major;
    if (minor_out != NULL) *minor_out = minor;
    if (sms_out != NULL) *sms_out = sms;
    return FC_OK;
fail:
    last_cuda_error = err;
    return FC_ERR_CUDA;
}

FC_API fc_status fc_sdpa_plan(const fc_params *user, int cc_major, int cc_minor, int sm_count, fc_fwd_plan *plan) {
    if (plan == NULL) return FC_ERR_NULL_POINTER;
    memset(plan, 0, sizeof(*plan));
    plan->family = FC_FAMILY_AUTO;
    plan->splits = 1;
    fc_status s = fc_params_validate(user);
    if (s != FC_OK) return s;
    /* The call's overrides (config.h), read once here for it and for its launcher. */
    const fc_config *cfg = fc_config_read();
    fc_params run = *user;
    fc_resolve_band_(&run);
    fc_launch_fn launch = NULL;
    fc_family family = FC_FAMILY_AUTO;
    /* packs: whether a one-row GQA call runs in the Hopper family as one block of the group's
     * rows per KV head. The dispatch decides it once for the call (the choice of family may
     * already have asked), and everything below takes its answer. */
    int packs = 0;
    s = fc_dispatch(&run, cc_major, cc_minor, &launch, &family, &packs);
    if (s != FC_OK) return s;
    /* FLASHCORE_DECODE_SPLITS forces the split count (for A/B timing and the tests). More splits
     * than 32-key chunks leave some CTAs an empty range, which the kernel and the merge handle
     * (as with causal ranges past Sq). */
    int splits = 1;
    if (family == FC_FAMILY_DECODE) {
        splits = cfg->decode_splits > 0 ? cfg->decode_splits : fc_decode_splits(&run, sm_count);
    } else if (family == FC_FAMILY_SM90) {
        /* One-row decoding over few pairs: the grid split, merged like the decode path's. */
        splits = fc_sm90_decode_splits(&run, sm_count, cfg->decode_splits, packs);
    }
    if (splits > 1) plan->workspace_bytes = fc_decode_workspace_bytes(&run, splits);
    if (run.cu_seq_q != NULL) plan->workspace_bytes = fc_varlen_workspace_bytes(&run);
    if (packs) (void)fc_pack_decode_gqa(&run);  /* (packs: it packs) */
    plan->params = run;
    plan->family = family;
    plan->splits = splits;
    plan->launch_ = (void (*)(void))launch;
    return FC_OK;
}

/* fc_sdpa_plan for the current device. Validation comes first, so a struct that is not valid
 * gets its validation status whatever the device says. */
static fc_status plan_here(const fc_params *p, fc_fwd_plan *plan) {
    int major = 0, minor = 0, sms = 0;
    const fc_status device = device_info(NULL, &major, &minor, &sms);
    if (device != FC_OK) {
        memset(plan, 0, sizeof(*plan));
        const fc_status s = fc_params_validate(p);
        return s != FC_OK ? s : device;
    }
    return fc_sdpa_plan(p, major, minor, sms, plan);
}

FC_API fc_status fc_sdpa_workspace_size(const fc_params *p, int64_t *bytes) {
    if (bytes == NULL) return FC_ERR_NULL_POINTER;
    fc_fwd_plan plan;
    const fc_status s = plan_here(p, &plan);
    *bytes = plan.workspace_bytes;
    return s;
}

/* One launch over batches [b0, b0 + nb) and query heads [h0, h0 + nh), whose key/value heads
 * are [hk0, hk0 + nkv): the same struct with sizes and base pointers moved. */
static fc_status launch_slice(const fc_params *p, fc_launch_fn launch, const fc_device_facts *dev,
                              cudaStream_t stream, int64_t b0, int64_t nb, int64_t h0, int64_t nh, int64_t hk0,
                              int64_t nkv) {
    const int64_t elem = element_bytes(p->dtype);
    const int64_t mask_elem = p->mask_kind == FC_MASK_BOOL ? 1 : elem;
    fc_params slice = *p;
    slice.batch = nb;
    slice.heads_q = nh;
    slice.heads_kv = nkv;
    slice.q = (const char *)p->q + (b0 * p->q_stride_b + h0 * p->q_stride_h) * elem;
    /* A paged call's K/V pools are shared by every batch item: its batch items move through the
     * block table's rows and seqused_k instead (a batch stride here is the page stride). */
    const int64_t kv_b0 = p->block_table != NULL ? 0 : b0;
    slice.k = (const char *)p->k + (kv_b0 * p->k_stride_b + hk0 * p->k_stride_h) * elem;
    slice.v = (const char *)p->v + (kv_b0 * p->v_stride_b + hk0 * p->v_stride_h) * elem;
    if (p->block_table != NULL) slice.block_table = p->block_table + b0 * p->block_table_stride;
    if (p->seqused_k != NULL) slice.seqused_k = p->seqused_k + b0;
    slice.out = (char *)p->out + (b0 * p->o_stride_b + h0 * p->o_stride_h) * elem;
    if (p->lse != NULL) slice.lse = p->lse + b0 * p->lse_stride_b + h0 * p->lse_stride_h;
    if (p->sinks != NULL) slice.sinks = p->sinks + h0;
    if (p->mask_kind != FC_MASK_NONE)
        slice.mask = (const char *)p->mask + (b0 * p->mask_stride_b + h0 * p->mask_stride_h) * mask_elem;
    const cudaError_t err = launch(&slice, dev, stream);
    last_cuda_error = err;
    return err == cudaSuccess ? FC_OK : FC_ERR_CUDA;
}

FC_API fc_status fc_sdpa_fwd(const fc_params *p, cudaStream_t stream) {
    fc_fwd_plan plan;
    const fc_status s = plan_here(p, &plan);
    if (s != FC_OK) return s;
    return fc_sdpa_fwd_planned(&plan, p->out, p->lse, p->workspace, p->workspace_bytes, stream);
}

FC_API fc_status fc_sdpa_fwd_planned(const fc_fwd_plan *plan, void *out, float *lse, void *workspace,
                                     int64_t workspace_bytes, cudaStream_t stream) {
    if (plan == NULL || plan->launch_ == NULL || out == NULL || (plan->params.lse != NULL && lse == NULL))
        return FC_ERR_NULL_POINTER;
    if (!aligned16(out) || (plan->params.lse != NULL && ((uintptr_t)lse & 3u) != 0)) return FC_ERR_POINTER_ALIGNMENT;
    if (workspace_bytes < 0 || (workspace != NULL && !aligned16(workspace))) return FC_ERR_BAD_WORKSPACE;
    const fc_launch_fn launch = (fc_launch_fn)plan->launch_;
    /* The device, once for the call's launches (the one planned for: flashcore.h's contract). */
    fc_device_facts dev;
    const fc_status device = fc_device_facts_(&dev);
    if (device != FC_OK) return device;
    fc_params run = plan->params;
    run.out = out;
    if (run.lse != NULL) run.lse = lse;
    run.workspace = workspace;
    run.workspace_bytes = workspace_bytes;
    /* Without enough workspace the decode path runs unsplit: slower on a small batch, same result. */
    const int64_t bytes = plan->workspace_bytes;
    run.num_splits_ = (bytes > 0 && workspace != NULL && workspace_bytes >= bytes) ? plan->splits : 1;
    /* A packed call builds its list of query blocks in the workspace: it cannot run without. */
    if (run.cu_seq_q != NULL && (workspace == NULL || workspace_bytes < bytes)) return FC_ERR_BAD_WORKSPACE;
    /* (A packed call's grid is one persistent row of CTAs, whatever its batch and heads.) */
    if (run.cu_seq_q != NULL || (run.batch <= FC_MAX_GRID_YZ && run.heads_q <= FC_MAX_GRID_YZ)) {
        const cudaError_t err = launch(&run, &dev, stream);
        last_cuda_error = err;
        return err == cudaSuccess ? FC_OK : FC_ERR_CUDA;
    }
    /* More than 65535 batches or query heads: one launch per slice of at most that many, in
     * stream order, reusing the workspace. Query heads go in whole GQA groups (each slice's
     * key/value heads are its own), or, for a group itself past 65535, in pieces of one group
     * (one key/value head). Validation checked every offset of the whole call, so every
     * slice's pointers stay inside the tensors. */
    const int64_t group = run.heads_q / run.heads_kv;
    const int64_t batch_step = run.batch <= FC_MAX_GRID_YZ ? run.batch : FC_MAX_GRID_YZ;
    for (int64_t b0 = 0; b0 < run.batch; b0 += batch_step) {
        const int64_t nb = run.batch - b0 < batch_step ? run.batch - b0 : batch_step;
        if (group <= FC_MAX_GRID_YZ) {
            const int64_t step = run.heads_q <= FC_MAX_GRID_YZ ? run.heads_q : FC_MAX_GRID_YZ / group * group;
            for (int64_t h0 = 0; h0 < run.heads_q; h0 += step) {
                const int64_t nh = run.heads_q - h0 < step ? run.heads_q - h0 : step;
                if (launch_slice(&run, launch, &dev, stream, b0, nb, h0, nh, h0 / group, nh / group) != FC_OK)
                    return FC_ERR_CUDA;
            }
        } else {
            for (int64_t hk = 0; hk < run.heads_kv; ++hk)
                for (int64_t off = 0; off < group; off += FC_MAX_GRID_YZ) {
                    const int64_t nh = group - off < FC_MAX_GRID_YZ ? group - off : FC_MAX_GRID_YZ;
                    if (launch_slice(&run, launch, &dev, stream, b0, nb, hk * group + off, nh, hk, 1) != FC_OK)
                        return FC_ERR_CUDA;
                }
        }
    }
    return FC_OK;
}

/* ---- shared with c_src/bwd.c (declared in dispatch.h) ---- */

FC_API int fc_band_bounds(int64_t seqlen_q, int64_t seqlen_k, int causal, int64_t window_left,
                          int64_t window_right, fc_alignment alignment, int64_t *lo, int64_t *hi) {
    if (seqlen_q < 1 || seqlen_k < 1 || window_left < -1 || window_right < -1) return -1;
    const int64_t diag = alignment == FC_ALIGN_BOTTOM_RIGHT ? seqlen_k - seqlen_q : 0; /* row 0's diagonal key */
    const int64_t all_lo = -(seqlen_q - 1), all_hi = seqlen_k - 1;
    int64_t l = all_lo, h = all_hi;
    /* (Compared before subtracting: a window of up to INT64_MAX must not overflow.) */
    if (window_left >= 0 && window_left < diag - all_lo) l = diag - window_left;
    if (window_right >= 0 && window_right < all_hi - diag) h = diag + window_right;
    if (causal && diag < h) h = diag;
    if (lo != NULL) *lo = l;
    if (hi != NULL) *hi = h;
    if (l == all_lo && h == all_hi) return FC_BAND_ALL;
    return l == all_lo && h == 0 ? FC_BAND_TOP_LEFT_CAUSAL : FC_BAND_OTHER;
}

void fc_resolve_band_(fc_params *p) {
    if (p->band_ != FC_BAND_UNRESOLVED_) return;
    int64_t lo = 0, hi = 0;
    const int kind = fc_band_bounds(p->seqlen_q, p->seqlen_k, p->causal, p->windowed ? p->window_left : -1,
                                    p->windowed ? p->window_right : -1, p->alignment, &lo, &hi);
    /* (Validated structs have sizes >= 1 and windows >= -1 when they reach a launch; empty
     * ones count as no band.) */
    p->band_ = kind == FC_BAND_OTHER ? FC_BAND_GENERAL_ : kind == FC_BAND_TOP_LEFT_CAUSAL ? FC_BAND_CAUSAL_ : FC_BAND_NONE_;
    p->causal = p->band_ != FC_BAND_NONE_;
    p->windowed = 0;
    p->window_left = p->window_right = -1;
    p->alignment = FC_ALIGN_TOP_LEFT;
    /* (Validation keeps both lengths below 2^31 - 256, so the offsets fit an int. Set for every
     * kind: the decode kernels' causal variant runs any band from them.) */
    p->band_lo_ = kind < 0 ? 0 : (int)lo;
    p->band_hi_ = kind < 0 ? 0 : (int)hi;
}

fc_status fc_device_facts_(fc_device_facts *dev) {
    return device_info(&dev->device, &dev->major, &dev->minor, &dev->sms);
}

void fc_set_last_cuda_error_(cudaError_t err) { last_cuda_error = err; }

fc_status fc_check_operand_(const int64_t size[4], const int64_t stride[4], const void *base,
                            int64_t elem_bytes) {
    const operand t = {{size[0], size[1], size[2], size[3]}, {stride[0], stride[1], stride[2], stride[3]}};
    fc_status s = check_strides(&t, elem_bytes);
    if (s != FC_OK) return s;
    if (!aligned16(base)) return FC_ERR_POINTER_ALIGNMENT;
    return check_offsets(&t, base, elem_bytes);
}
