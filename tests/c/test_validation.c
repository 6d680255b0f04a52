/*
 * test_validation.c - every status of fc_params_validate / fc_sdpa_support is reachable,
 * with its own message. Runs on the CPU: validation touches no device memory, so the
 * "device pointers" here are fake aligned addresses that are never dereferenced.
 *
 * Each case starts from a valid struct, changes one thing, and names the status it expects.
 */
#include "build_dims.h"
#include "flashcore.h"

/* Exported by libflashcore for the tests (c_src/dispatch.h): fc_params_validate's runs on this thread. */
unsigned long long fc_validations_on_thread_(void);

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static int failures = 0;

#define CHECK_FAMILY(label, got, want)                                                         \
    do {                                                                                       \
        const fc_family g_ = (got), w_ = (want);                                               \
        if (g_ != w_) {                                                                        \
            fprintf(stderr, "FAIL %-40s got family %d, want %d\n", label, (int)g_, (int)w_);    \
            ++failures;                                                                        \
        } else {                                                                               \
            printf("ok   %-40s family %d\n", label, (int)g_);                                  \
        }                                                                                      \
    } while (0)

#define CHECK_STATUS(label, got, want)                                                         \
    do {                                                                                       \
        fc_status g_ = (got), w_ = (want);                                                     \
        if (g_ != w_) {                                                                        \
            fprintf(stderr, "FAIL %-40s got %d (%s), want %d (%s)\n", label, g_,               \
                    fc_status_string(g_), w_, fc_status_string(w_));                           \
            ++failures;                                                                        \
        } else {                                                                               \
            printf("ok   %-40s %s\n", label, fc_status_string(g_));                            \
        }                                                                                      \
    } while (0)

/* A valid fp16 problem: B=2, Hq=8, Hkv=2, Sq=100, Sk=300, D=128, contiguous. */
static fc_params valid_params(void) {
    fc_params p;
    fc_params_init(&p);
    p.q = (const void *)0x10000;
    p.k = (const void *)0x20000;
    p.v = (const void *)0x30000;
    p.out = (void *)0x40000;
    p.batch = 2;
    p.heads_q = 8;
    p.heads_kv = 2;
    p.seqlen_q = 100;
    p.seqlen_k = 300;
    p.head_dim = 128;
    p.scale = 1.0f / sqrtf(128.0f);
    p.dtype = FC_DTYPE_FP16;
    fc_params_set_contiguous_strides(&p);
    return p;
}

typedef void (*mutate_fn)(fc_params *p);

static void m_none(fc_params *p) { (void)p; }
static void m_null_q(fc_params *p) { p->q = NULL; }
static void m_null_out(fc_params *p) { p->out = NULL; }
static void m_mask_without_pointer(fc_params *p) { p->mask_kind = FC_MASK_BOOL; }
static void m_negative_dim(fc_params *p) { p->seqlen_k = -1; }
static void m_empty(fc_params *p) { p->batch = 0; }
static void m_empty_seq(fc_params *p) { p->seqlen_q = 0; }
static void m_heads(fc_params *p) { p->heads_kv = 3; }
static void m_last_dim(fc_params *p) { p->k_stride_d = 2; }
static void m_stride_align(fc_params *p) { p->v_stride_s = 130; }
static void m_ptr_align(fc_params *p) { p->q = (const void *)0x10008; }
static void m_negative_stride(fc_params *p) { p->o_stride_h = -128; }
static void m_dtype(fc_params *p) { p->dtype = (fc_dtype)7; }
static void m_mask_kind(fc_params *p) { p->mask_kind = (fc_mask_kind)9; }
static void m_family(fc_params *p) { p->family = (fc_family)5; }
static void m_scale_nan(fc_params *p) { p->scale = NAN; }
static void m_scale_inf(fc_params *p) { p->scale = INFINITY; }
static void m_slice_overflow(fc_params *p) { p->q_stride_s = (int64_t)1 << 26; p->q_stride_h = (int64_t)1 << 33; p->q_stride_b = (int64_t)1 << 36; }
static void m_int64_overflow(fc_params *p) { p->batch = 3; p->k_stride_b = (INT64_MAX / 2) & ~(int64_t)7; }
static void m_byte_offset_overflow(fc_params *p) { p->k_stride_b = (int64_t)1 << 62; }
static void m_contiguous_overflow(fc_params *p) { p->heads_q = p->heads_kv = (int64_t)1 << 31; p->seqlen_k = (int64_t)1 << 31; fc_params_set_contiguous_strides(p); }
static void m_grid_overflow(fc_params *p) { p->batch = (int64_t)1 << 29; p->heads_q = 8; p->q_stride_b = 128; p->o_stride_b = 128; p->k_stride_b = 0; p->v_stride_b = 0; }
static void m_fp32(fc_params *p) { p->dtype = FC_DTYPE_FP32; }
static void m_head_dim(fc_params *p) { p->head_dim = 40; fc_params_set_contiguous_strides(p); }
/* Head dims of the sm80 family beyond 64/128 (32, 80, 96; 256 also in the sm90 family). */
static void m_head_dim_32(fc_params *p) { p->head_dim = 32; fc_params_set_contiguous_strides(p); }
static void m_head_dim_80(fc_params *p) { p->head_dim = 80; fc_params_set_contiguous_strides(p); }
static void m_head_dim_96(fc_params *p) { p->head_dim = 96; fc_params_set_contiguous_strides(p); }
static void m_head_dim_256(fc_params *p) { p->head_dim = 256; fc_params_set_contiguous_strides(p); }
static void m_head_dim_72(fc_params *p) { p->head_dim = 72; fc_params_set_contiguous_strides(p); }
static void m_head_dim_96_force_sm90(fc_params *p) { m_head_dim_96(p); p->family = FC_FAMILY_SM90; }
static void m_head_dim_80_force_sm80(fc_params *p) { m_head_dim_80(p); p->family = FC_FAMILY_SM80; }
static void m_head_dim_256_force_sm80(fc_params *p) { m_head_dim_256(p); p->family = FC_FAMILY_SM80; }
static void m_head_dim_32_force_decode(fc_params *p) { m_head_dim_32(p); p->family = FC_FAMILY_DECODE; p->seqlen_q = 4; }
/* Masks: (B, Hq, Sq, Sk) = (2, 8, 100, 300) with strides in elements; no alignment rule. */
static void m_mask(fc_params *p) { p->mask_kind = FC_MASK_ADDITIVE; p->mask = (const void *)0x50000; p->mask_stride_q = 300; p->mask_stride_k = 1; }
static void m_bool_mask_bhqk(fc_params *p) { p->mask_kind = FC_MASK_BOOL; p->mask = (const void *)0x50000; p->mask_stride_b = 8 * 100 * 300; p->mask_stride_h = 100 * 300; p->mask_stride_q = 300; p->mask_stride_k = 1; }
static void m_mask_odd_layout(fc_params *p) { p->mask_kind = FC_MASK_BOOL; p->mask = (const void *)0x50001; p->mask_stride_q = 1; p->mask_stride_k = 101; }
static void m_mask_odd_additive(fc_params *p) { p->mask_kind = FC_MASK_ADDITIVE; p->mask = (const void *)0x50002; p->mask_stride_q = 301; p->mask_stride_k = 1; }
static void m_mask_all_broadcast(fc_params *p) { p->mask_kind = FC_MASK_BOOL; p->mask = (const void *)0x50003; }
static void m_mask_causal(fc_params *p) { m_mask(p); p->causal = 1; }
static void m_mask_negative_stride(fc_params *p) { m_mask(p); p->mask_stride_k = -1; }
static void m_mask_slice_overflow(fc_params *p) { m_mask(p); p->mask_stride_q = (int64_t)1 << 25; }
static void m_mask_key_overflow(fc_params *p) { m_mask(p); p->mask_stride_q = 0; p->mask_stride_k = (int64_t)1 << 23; }
static void m_mask_int64_overflow(fc_params *p) { m_mask(p); p->mask_stride_h = INT64_MAX / 4; }
static void m_mask_address_wraps(fc_params *p) { m_mask(p); p->mask = (const void *)(uintptr_t)0xffffffffffff0000ull; p->mask_stride_b = (int64_t)1 << 20; }
/* The sinks' last float past the end of the address space (valid_params' 8 query heads). */
static void m_sinks_address_wraps(fc_params *p) { p->sinks = (const float *)(uintptr_t)0xfffffffffffffff0ull; }
static void m_sinks_last_addressable(fc_params *p) { p->heads_q = p->heads_kv = 4; p->sinks = (const float *)(uintptr_t)0xfffffffffffffff0ull; }
static void m_mask_size1_huge_strides(fc_params *p) { m_mask(p); p->seqlen_q = 1; p->mask_stride_q = INT64_MAX; p->q_stride_s = 3; p->o_stride_s = 5; }
static void m_mask_force_sm90(fc_params *p) { m_mask(p); p->family = FC_FAMILY_SM90; }
static void m_mask_force_sm80(fc_params *p) { m_bool_mask_bhqk(p); p->family = FC_FAMILY_SM80; }
static void m_mask_force_decode(fc_params *p) { m_bool_mask_bhqk(p); p->family = FC_FAMILY_DECODE; p->seqlen_q = 4; }
static void m_mask_decode_shape(fc_params *p) { m_bool_mask_bhqk(p); p->seqlen_q = 4; }
static void m_mask_broadcast_kv(fc_params *p) { m_mask(p); p->k_stride_b = 0; p->v_stride_b = 0; }
/* A bool mask the sm90 family takes (dispatch.c, family_takes_mask): keys contiguous, rows of
 * Sk = 300 padded to 304 bytes, head and batch strides 16-byte multiples, a 16-byte aligned base.
 * (m_bool_mask_bhqk's 300-byte rows are not 16-byte multiples: sm80 only.) */
static void m_mask_tiles(fc_params *p) { p->mask_kind = FC_MASK_BOOL; p->mask = (const void *)0x50000; p->mask_stride_b = 8 * 100 * 304; p->mask_stride_h = 100 * 304; p->mask_stride_q = 304; p->mask_stride_k = 1; }
static void m_mask_tiles_force_sm90(fc_params *p) { m_mask_tiles(p); p->family = FC_FAMILY_SM90; }
static void m_mask_tiles_broadcast_force_sm90(fc_params *p) { m_mask_tiles_force_sm90(p); p->mask_stride_b = 0; p->mask_stride_h = 0; }
static void m_mask_tiles_d64_force_sm90(fc_params *p) { p->head_dim = 64; fc_params_set_contiguous_strides(p); m_mask_tiles_force_sm90(p); }
static void m_mask_tiles_d256(fc_params *p) { m_head_dim_256(p); m_mask_tiles(p); }
static void m_mask_tiles_d256_force_sm90(fc_params *p) { m_mask_tiles_d256(p); p->family = FC_FAMILY_SM90; }
static void m_mask_tiles_causal(fc_params *p) { m_mask_tiles(p); p->causal = 1; }
static void m_mask_tiles_causal_force_sm90(fc_params *p) { m_mask_tiles_causal(p); p->family = FC_FAMILY_SM90; }
static void m_mask_tiles_causal_d256_force_sm90(fc_params *p) { m_mask_tiles_d256_force_sm90(p); p->causal = 1; }
static void m_mask_tiles_causal_bottom_right_force_sm90(fc_params *p) { m_mask_tiles_causal_force_sm90(p); p->alignment = FC_ALIGN_BOTTOM_RIGHT; }
static void m_mask_tiles_window(fc_params *p) { m_mask_tiles(p); p->windowed = 1; p->window_left = 16; p->window_right = 0; }
static void m_mask_tiles_window_force_sm90(fc_params *p) { m_mask_tiles_window(p); p->family = FC_FAMILY_SM90; }
static void m_mask_tiles_softcap(fc_params *p) { m_mask_tiles(p); p->softcap = 30.0f; }
static void m_mask_tiles_softcap_force_sm90(fc_params *p) { m_mask_tiles_softcap(p); p->family = FC_FAMILY_SM90; }
static void m_mask_tiles_sinks(fc_params *p) { m_mask_tiles(p); p->sinks = (const float *)0x58000; }
static void m_mask_tiles_sinks_force_sm90(fc_params *p) { m_mask_tiles_sinks(p); p->family = FC_FAMILY_SM90; }
static void m_mask_tiles_additive_force_sm90(fc_params *p) { m_mask_tiles_force_sm90(p); p->mask_kind = FC_MASK_ADDITIVE; }
static void m_mask_tiles_rows_unaligned_force_sm90(fc_params *p) { m_mask_tiles_force_sm90(p); p->mask_stride_q = 300; }
static void m_mask_tiles_head_stride_unaligned_force_sm90(fc_params *p) { m_mask_tiles_force_sm90(p); p->mask_stride_h = 100 * 304 + 8; }
static void m_mask_tiles_batch_stride_unaligned_force_sm90(fc_params *p) { m_mask_tiles_force_sm90(p); p->mask_stride_b = 8 * 100 * 304 + 8; }
static void m_mask_tiles_base_unaligned_force_sm90(fc_params *p) { m_mask_tiles_force_sm90(p); p->mask = (const void *)0x50008; }
static void m_mask_tiles_keys_strided_force_sm90(fc_params *p) { m_mask_tiles_force_sm90(p); p->mask_stride_k = 2; p->mask_stride_q = 608; p->mask_stride_h = 100 * 608; p->mask_stride_b = 8 * 100 * 608; }
static void m_mask_tiles_rows_broadcast_force_sm90(fc_params *p) { m_mask_tiles_force_sm90(p); p->mask_stride_q = 0; }
static void m_mask_tiles_decode_shape(fc_params *p) { m_mask_tiles(p); p->seqlen_q = 4; }
static void m_mask_tiles_force_decode(fc_params *p) { m_mask_tiles_decode_shape(p); p->family = FC_FAMILY_DECODE; }
static void m_mask_causal_force_decode(fc_params *p) { m_mask_force_decode(p); p->causal = 1; }
static void m_mask_tiles_broadcast_kv(fc_params *p) { m_mask_tiles(p); p->k_stride_b = 0; p->v_stride_b = 0; }
/* An LSE output, as a training forward asks for: fp32 (B, Hq, Sq), strides from
 * fc_params_set_contiguous_strides. On Hopper AUTO runs a mask that only the sm80 family takes
 * only for calls that want the LSE; without one it declines it (FC_UNSUPPORTED_SLOWER_MASK:
 * PyTorch's SDPA is faster there; dispatch.c, sm80_masked_slower_than_fallback). The *_lse
 * mutators are the mask rows' calls as training makes them (the sm80 family runs them). */
static void m_lse(fc_params *p) { p->lse = (float *)0x60000; }
static void m_mask_lse(fc_params *p) { m_mask(p); m_lse(p); }
static void m_bool_mask_bhqk_lse(fc_params *p) { m_bool_mask_bhqk(p); m_lse(p); }
static void m_mask_odd_layout_lse(fc_params *p) { m_mask_odd_layout(p); m_lse(p); }
static void m_mask_odd_additive_lse(fc_params *p) { m_mask_odd_additive(p); m_lse(p); }
static void m_mask_all_broadcast_lse(fc_params *p) { m_mask_all_broadcast(p); m_lse(p); }
static void m_mask_size1_huge_strides_lse(fc_params *p) { m_mask_size1_huge_strides(p); m_lse(p); }
static void m_mask_decode_shape_lse(fc_params *p) { m_mask_decode_shape(p); m_lse(p); }
static void m_mask_broadcast_kv_lse(fc_params *p) { m_mask_broadcast_kv(p); m_lse(p); }
static void m_mask_tiles_broadcast_kv_lse(fc_params *p) { m_mask_tiles_broadcast_kv(p); m_lse(p); }
/* The rule's head dims: a (B, H, Sq, Sk) mask (rows 300 bytes apart) at D=64 and at the sm80
 * family's other dims; a key-padding mask (B, 1, 1, Sk), broadcast over heads and query rows
 * (mask_stride_q = 0); one query row, whose size-1 dim has stride 0 (as the op passes it). */
static void m_mask_d64(fc_params *p) { p->head_dim = 64; fc_params_set_contiguous_strides(p); m_bool_mask_bhqk(p); }
static void m_mask_d32(fc_params *p) { m_head_dim_32(p); m_bool_mask_bhqk(p); }
static void m_mask_d80(fc_params *p) { m_head_dim_80(p); m_bool_mask_bhqk(p); }
static void m_mask_d96(fc_params *p) { m_head_dim_96(p); m_bool_mask_bhqk(p); }
static void m_mask_d256(fc_params *p) { m_head_dim_256(p); m_bool_mask_bhqk(p); }
static void m_additive_mask_d32(fc_params *p) { m_mask_d32(p); p->mask_kind = FC_MASK_ADDITIVE; }
static void m_additive_mask_d96(fc_params *p) { m_mask_d96(p); p->mask_kind = FC_MASK_ADDITIVE; }
static void m_additive_mask_d256(fc_params *p) { m_mask_d256(p); p->mask_kind = FC_MASK_ADDITIVE; }
static void m_additive_mask_d96_lse(fc_params *p) { m_additive_mask_d96(p); m_lse(p); }
static void m_key_padding(fc_params *p) { p->mask_kind = FC_MASK_BOOL; p->mask = (const void *)0x50000; p->mask_stride_b = 300; p->mask_stride_k = 1; }
static void m_key_padding_d32(fc_params *p) { m_head_dim_32(p); m_key_padding(p); }
static void m_key_padding_d80(fc_params *p) { m_head_dim_80(p); m_key_padding(p); }
static void m_key_padding_d96(fc_params *p) { m_head_dim_96(p); m_key_padding(p); }
static void m_key_padding_d256(fc_params *p) { m_head_dim_256(p); m_key_padding(p); }
static void m_key_padding_d96_lse(fc_params *p) { m_key_padding_d96(p); m_lse(p); }
static void m_key_padding_d96_causal(fc_params *p) { m_key_padding_d96(p); p->causal = 1; }
static void m_key_padding_d96_softcap(fc_params *p) { m_key_padding_d96(p); p->softcap = 30.0f; }
static void m_key_padding_d96_window(fc_params *p) { m_key_padding_d96(p); p->windowed = 1; p->window_left = 16; p->window_right = 0; }
static void m_key_padding_d96_sinks(fc_params *p) { m_key_padding_d96(p); p->sinks = (const float *)0x58000; }
static void m_key_padding_d96_force_sm80(fc_params *p) { m_key_padding_d96(p); p->family = FC_FAMILY_SM80; }
static void m_mask_one_row(fc_params *p) { p->seqlen_q = 1; fc_params_set_contiguous_strides(p); p->mask_kind = FC_MASK_BOOL; p->mask = (const void *)0x50000; p->mask_stride_b = 8 * 300; p->mask_stride_h = 300; p->mask_stride_k = 1; }
static void m_mask_one_row_d96(fc_params *p) { m_head_dim_96(p); m_mask_one_row(p); }
static void m_mask_one_row_d256(fc_params *p) { m_head_dim_256(p); m_mask_one_row(p); }
static void m_mask_one_row_d96_lse(fc_params *p) { m_mask_one_row_d96(p); m_lse(p); }
static void m_force_sm90(fc_params *p) { p->family = FC_FAMILY_SM90; }
static void m_force_sm80(fc_params *p) { p->family = FC_FAMILY_SM80; }
static void m_workspace_misaligned(fc_params *p) { p->workspace = (void *)0x70004; p->workspace_bytes = 64; }
static void m_workspace_negative(fc_params *p) { p->workspace_bytes = -1; }
static void m_force_decode_long_q(fc_params *p) { p->family = FC_FAMILY_DECODE; }
static void m_force_decode(fc_params *p) { p->family = FC_FAMILY_DECODE; p->seqlen_q = 4; }
static void m_force_sm90_negative_scale(fc_params *p) { p->family = FC_FAMILY_SM90; p->scale = -0.5f; }
static void m_negative_scale(fc_params *p) { p->scale = -0.5f; }
static void m_force_sm90_broadcast(fc_params *p) { p->family = FC_FAMILY_SM90; p->k_stride_b = 0; p->v_stride_b = 0; }
static void m_lse_misaligned(fc_params *p) { p->lse = (float *)0x60002; }
static void m_size1_odd_stride(fc_params *p) { p->seqlen_q = 1; p->q_stride_s = 3; p->o_stride_s = 5; }
static void m_broadcast_kv(fc_params *p) { p->k_stride_b = 0; p->v_stride_b = 0; }

/* A paged KV cache (fc_params.block_table): one query row per batch item against pools of
 * 64 pages of 16 keys, (num_pages, page_size, Hkv, D) contiguous; 19 table entries per item
 * (19 * 16 >= Sk = 300), the table's rows 19 apart; seqused_k set. Only the decode family reads
 * pages (FC_UNSUPPORTED_PAGED elsewhere); bad page arguments are FC_ERR_BAD_PAGES. */
static void m_paged(fc_params *p) {
    p->seqlen_q = 1;
    fc_params_set_contiguous_strides(p);
    p->block_table = (const int32_t *)0x60000;
    p->seqused_k = (const int32_t *)0x61000;
    p->page_size = 16;
    p->pages_per_seq = 19;
    p->block_table_stride = 19;
    p->num_pages = 64;
    p->k_stride_d = p->v_stride_d = 1;
    p->k_stride_h = p->v_stride_h = p->head_dim;
    p->k_stride_s = p->v_stride_s = p->heads_kv * p->head_dim;
    p->k_stride_b = p->v_stride_b = 16 * p->heads_kv * p->head_dim;
}
static void m_paged_no_seqused(fc_params *p) { m_paged(p); p->seqused_k = NULL; }
static void m_paged_page_64(fc_params *p) { m_paged(p); p->page_size = 64; p->pages_per_seq = 5; p->block_table_stride = 8; p->k_stride_b = p->v_stride_b = 64 * p->heads_kv * p->head_dim; }
static void m_paged_page_8(fc_params *p) { m_paged(p); p->page_size = 8; p->pages_per_seq = 38; p->block_table_stride = 38; }
static void m_paged_page_24(fc_params *p) { m_paged(p); p->page_size = 24; }
static void m_paged_page_0(fc_params *p) { m_paged(p); p->page_size = 0; }
static void m_paged_page_negative(fc_params *p) { m_paged(p); p->page_size = -16; }
static void m_paged_too_few_pages(fc_params *p) { m_paged(p); p->pages_per_seq = 18; }
static void m_paged_no_pages_per_seq(fc_params *p) { m_paged(p); p->pages_per_seq = 0; }
static void m_paged_num_pages_0(fc_params *p) { m_paged(p); p->num_pages = 0; }
static void m_paged_num_pages_huge(fc_params *p) { m_paged(p); p->num_pages = (int64_t)INT32_MAX + 1; p->k_stride_b = p->v_stride_b = 8; }
static void m_paged_narrow_stride(fc_params *p) { m_paged(p); p->block_table_stride = 18; }
static void m_paged_negative_stride(fc_params *p) { m_paged(p); p->batch = 1; p->block_table_stride = -1; }
static void m_paged_batch1_stride0(fc_params *p) { m_paged(p); p->batch = 1; p->block_table_stride = 0; }
static void m_paged_stride_overflow(fc_params *p) { m_paged(p); p->block_table_stride = INT64_MAX / 2; }
static void m_paged_table_wraps(fc_params *p) { m_paged(p); p->block_table = (const int32_t *)(uintptr_t)0xfffffffffffffff0ull; }
static void m_paged_seqused_wraps(fc_params *p) { m_paged(p); p->seqused_k = (const int32_t *)(uintptr_t)0xfffffffffffffffcull; }
static void m_pages_without_table(fc_params *p) { p->page_size = 16; }
static void m_table_stride_without_table(fc_params *p) { p->block_table_stride = 19; }
static void m_seqused_without_table(fc_params *p) { p->seqused_k = (const int32_t *)0x61000; }
static void m_paged_table_misaligned(fc_params *p) { m_paged(p); p->block_table = (const int32_t *)0x60002; }
static void m_paged_seqused_misaligned(fc_params *p) { m_paged(p); p->seqused_k = (const int32_t *)0x61001; }
static void m_paged_page_stride_unaligned(fc_params *p) { m_paged(p); p->k_stride_b = 4100; }
static void m_paged_page_slice_overflow(fc_params *p) { m_paged(p); p->k_stride_s = (int64_t)1 << 28; p->k_stride_b = (int64_t)1 << 33; }
static void m_paged_pool_overflow(fc_params *p) { m_paged(p); p->v_stride_b = (int64_t)1 << 58; }
static void m_paged_prefill(fc_params *p) { m_paged(p); p->seqlen_q = 100; fc_params pc = *p; fc_params_set_contiguous_strides(&pc); p->q_stride_b = pc.q_stride_b; p->q_stride_h = pc.q_stride_h; p->o_stride_b = pc.o_stride_b; p->o_stride_h = pc.o_stride_h; p->lse_stride_b = pc.lse_stride_b; p->lse_stride_h = pc.lse_stride_h; }
static void m_paged_causal(fc_params *p) { m_paged(p); p->causal = 1; }
static void m_paged_window(fc_params *p) { m_paged(p); p->windowed = 1; p->window_left = 10; p->window_right = -1; p->alignment = FC_ALIGN_BOTTOM_RIGHT; }
static void m_paged_mask(fc_params *p) { m_paged(p); p->mask_kind = FC_MASK_BOOL; p->mask = (const void *)0x50000; p->mask_stride_k = 1; }
static void m_paged_force_sm90(fc_params *p) { m_paged(p); p->family = FC_FAMILY_SM90; }
static void m_paged_force_sm80(fc_params *p) { m_paged(p); p->family = FC_FAMILY_SM80; }
static void m_paged_force_decode(fc_params *p) { m_paged(p); p->family = FC_FAMILY_DECODE; }
static void m_paged_force_decode_prefill(fc_params *p) { m_paged_prefill(p); p->family = FC_FAMILY_DECODE; }
static void m_paged_d96(fc_params *p) { p->head_dim = 96; fc_params_set_contiguous_strides(p); m_paged(p); }
static void m_paged_d64(fc_params *p) { p->head_dim = 64; fc_params_set_contiguous_strides(p); m_paged(p); }
static void m_paged_sinks(fc_params *p) { m_paged(p); p->sinks = (const float *)0x62000; }
static void m_paged_softcap(fc_params *p) { m_paged(p); p->softcap = 30.0f; }
static void m_paged_gqa_rows32(fc_params *p) { m_paged(p); p->heads_q = 16; p->seqlen_q = 4; p->q_stride_s = p->o_stride_s = p->head_dim; p->q_stride_h = p->o_stride_h = 4 * p->head_dim; p->q_stride_b = p->o_stride_b = 16 * 4 * p->head_dim; }
static void m_paged_gqa_rows64(fc_params *p) { m_paged_gqa_rows32(p); p->seqlen_q = 8; p->q_stride_h = p->o_stride_h = 8 * p->head_dim; p->q_stride_b = p->o_stride_b = 16 * 8 * p->head_dim; }
/* 70000 batches: past CUDA's grid z, which the forward handles by launching in slices. */
static void m_batch_past_grid(fc_params *p) { p->batch = 70000; p->k_stride_b = 0; p->v_stride_b = 0; p->q_stride_b = 0; }

/* Packed variable-length sequences (fc_params.cu_seq_q): 3 sequences of at most 100 queries and
 * 300 keys packed into 250 query rows and 700 key rows, (rows, heads, D) contiguous, no batch
 * stride. Only the sm90 forward runs them (FC_UNSUPPORTED_VARLEN elsewhere); inconsistent
 * fields are FC_ERR_BAD_VARLEN; a window or bottom-right causal is declined in validation. */
static void m_varlen(fc_params *p) {
    p->batch = 3;
    p->cu_seq_q = (const int32_t *)0x62000;
    p->cu_seq_k = (const int32_t *)0x63000;
    p->total_q = 250;
    p->total_k = 700;
    p->q_stride_b = p->k_stride_b = p->v_stride_b = p->o_stride_b = 0;
    p->q_stride_s = p->o_stride_s = p->heads_q * p->head_dim;
    p->q_stride_h = p->o_stride_h = p->head_dim;
    p->k_stride_s = p->v_stride_s = p->heads_kv * p->head_dim;
    p->k_stride_h = p->v_stride_h = p->head_dim;
}
static void m_varlen_causal(fc_params *p) { m_varlen(p); p->causal = 1; }
static void m_varlen_lse(fc_params *p) { m_varlen(p); p->lse = (float *)0x64000; p->lse_stride_b = 0; p->lse_stride_h = 250; p->lse_stride_s = 1; }
static void m_varlen_lse_batch_stride(fc_params *p) { m_varlen_lse(p); p->lse_stride_b = 2000; }
static void m_varlen_d64(fc_params *p) { p->head_dim = 64; m_varlen(p); }
static void m_varlen_d256(fc_params *p) { p->head_dim = 256; m_varlen(p); }
static void m_varlen_d96(fc_params *p) { p->head_dim = 96; m_varlen(p); }
static void m_varlen_no_cu_k(fc_params *p) { m_varlen(p); p->cu_seq_k = NULL; }
static void m_cu_k_without_cu_q(fc_params *p) { p->cu_seq_k = (const int32_t *)0x63000; }
static void m_total_without_cu_q(fc_params *p) { p->total_q = 250; }
static void m_varlen_total_k_0(fc_params *p) { m_varlen(p); p->total_k = 0; }
static void m_varlen_batch_stride(fc_params *p) { m_varlen(p); p->q_stride_b = 1024; }
static void m_varlen_cu_misaligned(fc_params *p) { m_varlen(p); p->cu_seq_q = (const int32_t *)0x62002; }
static void m_varlen_window(fc_params *p) { m_varlen(p); p->windowed = 1; p->window_left = 16; p->window_right = 0; }
static void m_varlen_bottom_right(fc_params *p) { m_varlen(p); p->causal = 1; p->alignment = FC_ALIGN_BOTTOM_RIGHT; }
static void m_varlen_mask(fc_params *p) { m_varlen(p); p->mask_kind = FC_MASK_BOOL; p->mask = (const void *)0x50000; p->mask_stride_k = 1; }
static void m_varlen_softcap(fc_params *p) { m_varlen(p); p->softcap = 30.0f; }
static void m_varlen_sinks(fc_params *p) { m_varlen(p); p->sinks = (const float *)0x58000; }
static void m_varlen_force_sm80(fc_params *p) { m_varlen(p); p->family = FC_FAMILY_SM80; }
static void m_varlen_force_sm90(fc_params *p) { m_varlen(p); p->family = FC_FAMILY_SM90; }
static void m_varlen_one_row(fc_params *p) { m_varlen(p); p->seqlen_q = 1; p->total_q = 3; }
static void m_varlen_rows_overflow(fc_params *p) { m_varlen(p); p->q_stride_s = (int64_t)1 << 24; }

typedef struct validation_case {
    const char *label;
    mutate_fn mutate;
    fc_status want_validate;   /* from fc_params_validate */
    fc_status want_hopper;     /* from fc_sdpa_support(p, 9, 0) */
    fc_status want_ampere;     /* from fc_sdpa_support(p, 8, 0): no family runs on sm_80 */
} validation_case;

static const validation_case kCases[] = {
    {"valid struct", m_none, FC_OK, FC_OK, FC_UNSUPPORTED_ARCH},
    {"q is NULL", m_null_q, FC_ERR_NULL_POINTER, FC_ERR_NULL_POINTER, FC_ERR_NULL_POINTER},
    {"out is NULL", m_null_out, FC_ERR_NULL_POINTER, FC_ERR_NULL_POINTER, FC_ERR_NULL_POINTER},
    {"mask kind set, mask NULL", m_mask_without_pointer, FC_ERR_NULL_POINTER, FC_ERR_NULL_POINTER, FC_ERR_NULL_POINTER},
    {"negative seqlen_k", m_negative_dim, FC_ERR_NEGATIVE_DIM, FC_ERR_NEGATIVE_DIM, FC_ERR_NEGATIVE_DIM},
    {"batch 0", m_empty, FC_UNSUPPORTED_EMPTY, FC_UNSUPPORTED_EMPTY, FC_UNSUPPORTED_EMPTY},
    {"seqlen_q 0", m_empty_seq, FC_UNSUPPORTED_EMPTY, FC_UNSUPPORTED_EMPTY, FC_UNSUPPORTED_EMPTY},
    {"heads_q % heads_kv != 0", m_heads, FC_ERR_HEADS_NOT_DIVISIBLE, FC_ERR_HEADS_NOT_DIVISIBLE, FC_ERR_HEADS_NOT_DIVISIBLE},
    {"k head_dim stride 2", m_last_dim, FC_ERR_LAST_DIM_STRIDE, FC_ERR_LAST_DIM_STRIDE, FC_ERR_LAST_DIM_STRIDE},
    {"v seq stride not 16-byte multiple", m_stride_align, FC_ERR_STRIDE_ALIGNMENT, FC_ERR_STRIDE_ALIGNMENT, FC_ERR_STRIDE_ALIGNMENT},
    {"q 8-byte aligned", m_ptr_align, FC_ERR_POINTER_ALIGNMENT, FC_ERR_POINTER_ALIGNMENT, FC_ERR_POINTER_ALIGNMENT},
    {"negative out head stride", m_negative_stride, FC_ERR_NEGATIVE_STRIDE, FC_ERR_NEGATIVE_STRIDE, FC_ERR_NEGATIVE_STRIDE},
    {"dtype 7", m_dtype, FC_ERR_BAD_DTYPE, FC_ERR_BAD_DTYPE, FC_ERR_BAD_DTYPE},
    {"mask_kind 9", m_mask_kind, FC_ERR_BAD_MASK_KIND, FC_ERR_BAD_MASK_KIND, FC_ERR_BAD_MASK_KIND},
    {"family 5", m_family, FC_ERR_BAD_FAMILY, FC_ERR_BAD_FAMILY, FC_ERR_BAD_FAMILY},
    {"scale NaN", m_scale_nan, FC_ERR_BAD_SCALE, FC_ERR_BAD_SCALE, FC_ERR_BAD_SCALE},
    {"scale inf", m_scale_inf, FC_ERR_BAD_SCALE, FC_ERR_BAD_SCALE, FC_ERR_BAD_SCALE},
    {"slice offset past 2^31", m_slice_overflow, FC_ERR_OFFSET_OVERFLOW, FC_ERR_OFFSET_OVERFLOW, FC_ERR_OFFSET_OVERFLOW},
    {"offset overflows int64", m_int64_overflow, FC_ERR_OFFSET_OVERFLOW, FC_ERR_OFFSET_OVERFLOW, FC_ERR_OFFSET_OVERFLOW},
    {"offset fits int64 elements, not bytes", m_byte_offset_overflow, FC_ERR_OFFSET_OVERFLOW, FC_ERR_OFFSET_OVERFLOW, FC_ERR_OFFSET_OVERFLOW},
    {"contiguous strides overflow int64 (saturated)", m_contiguous_overflow, FC_ERR_STRIDE_ALIGNMENT, FC_ERR_STRIDE_ALIGNMENT, FC_ERR_STRIDE_ALIGNMENT},
    {"batch 70000 (forward runs it in slices)", m_batch_past_grid, FC_OK, FC_OK, FC_UNSUPPORTED_ARCH},
    {"batch*heads past grid limit", m_grid_overflow, FC_ERR_OFFSET_OVERFLOW, FC_ERR_OFFSET_OVERFLOW, FC_ERR_OFFSET_OVERFLOW},
    {"lse 2-byte aligned", m_lse_misaligned, FC_ERR_POINTER_ALIGNMENT, FC_ERR_POINTER_ALIGNMENT, FC_ERR_POINTER_ALIGNMENT},
    {"fp32", m_fp32, FC_OK, FC_UNSUPPORTED_DTYPE, FC_UNSUPPORTED_DTYPE},
    {"head_dim 40", m_head_dim, FC_OK, FC_UNSUPPORTED_HEAD_DIM, FC_UNSUPPORTED_ARCH},
    {"head_dim 72", m_head_dim_72, FC_OK, FC_UNSUPPORTED_HEAD_DIM, FC_UNSUPPORTED_ARCH},
    {"head_dim 32 (auto on Hopper: cuDNN is faster)", m_head_dim_32, FC_OK, FC_UNSUPPORTED_SLOWER, FC_UNSUPPORTED_ARCH},
    {"head_dim 80 (auto on Hopper: cuDNN is faster)", m_head_dim_80, FC_OK, FC_UNSUPPORTED_SLOWER, FC_UNSUPPORTED_ARCH},
    {"head_dim 96 (auto on Hopper: cuDNN is faster)", m_head_dim_96, FC_OK, FC_UNSUPPORTED_SLOWER, FC_UNSUPPORTED_ARCH},
    {"head_dim 256", m_head_dim_256, FC_OK, FC_OK, FC_UNSUPPORTED_ARCH},
    {"head_dim 96, forced sm90 (no such kernel)", m_head_dim_96_force_sm90, FC_OK, FC_UNSUPPORTED_HEAD_DIM, FC_UNSUPPORTED_FAMILY},
    {"head_dim 80, forced sm80", m_head_dim_80_force_sm80, FC_OK, FC_OK, FC_UNSUPPORTED_FAMILY},
    {"head_dim 256, forced sm80", m_head_dim_256_force_sm80, FC_OK, FC_OK, FC_UNSUPPORTED_FAMILY},
    {"head_dim 32, forced decode, Sq = 4", m_head_dim_32_force_decode, FC_OK, FC_UNSUPPORTED_HEAD_DIM, FC_UNSUPPORTED_FAMILY},
    /* Masks run in the sm80 family; on Hopper the sm90 family takes bool masks whose tiles TMA
     * can bring (D=64 / 128 / 256, no band, softcap or sinks, top-left causal or none: the
     * m_mask_tiles rows below);
     * the decode family takes any mask without causal (the decode-sized rows). Under AUTO on Hopper the sm80 family runs the others for calls
     * that want the LSE (the "lse" rows; without it: the "no lse" rows further down). */
    {"additive (Sq, Sk) mask, lse", m_mask_lse, FC_OK, FC_OK, FC_UNSUPPORTED_ARCH},
    {"bool (B, H, Sq, Sk) mask, lse", m_bool_mask_bhqk_lse, FC_OK, FC_OK, FC_UNSUPPORTED_ARCH},
    {"bool mask, odd address, transposed, lse", m_mask_odd_layout_lse, FC_OK, FC_OK, FC_UNSUPPORTED_ARCH},
    {"additive mask, 2-byte address, odd rows, lse", m_mask_odd_additive_lse, FC_OK, FC_OK, FC_UNSUPPORTED_ARCH},
    {"bool mask broadcast on every dim, lse", m_mask_all_broadcast_lse, FC_OK, FC_OK, FC_UNSUPPORTED_ARCH},
    {"mask together with causal", m_mask_causal, FC_OK, FC_OK, FC_UNSUPPORTED_ARCH},
    {"mask negative key stride", m_mask_negative_stride, FC_ERR_NEGATIVE_STRIDE, FC_ERR_NEGATIVE_STRIDE, FC_ERR_NEGATIVE_STRIDE},
    {"mask slice offset past 2^31 (rows)", m_mask_slice_overflow, FC_ERR_OFFSET_OVERFLOW, FC_ERR_OFFSET_OVERFLOW, FC_ERR_OFFSET_OVERFLOW},
    {"mask slice offset past 2^31 (keys)", m_mask_key_overflow, FC_ERR_OFFSET_OVERFLOW, FC_ERR_OFFSET_OVERFLOW, FC_ERR_OFFSET_OVERFLOW},
    {"mask offset overflows int64", m_mask_int64_overflow, FC_ERR_OFFSET_OVERFLOW, FC_ERR_OFFSET_OVERFLOW, FC_ERR_OFFSET_OVERFLOW},
    {"mask last byte wraps the address space", m_mask_address_wraps, FC_ERR_OFFSET_OVERFLOW, FC_ERR_OFFSET_OVERFLOW, FC_ERR_OFFSET_OVERFLOW},
    {"sinks' last float wraps the address space", m_sinks_address_wraps, FC_ERR_OFFSET_OVERFLOW, FC_ERR_OFFSET_OVERFLOW, FC_ERR_OFFSET_OVERFLOW},
    {"sinks' last float the address space's last", m_sinks_last_addressable, FC_OK, FC_OK, FC_UNSUPPORTED_ARCH},
    {"mask, Sq 1, huge unused row stride, lse", m_mask_size1_huge_strides_lse, FC_OK, FC_OK, FC_UNSUPPORTED_ARCH},
    {"mask, forced sm90", m_mask_force_sm90, FC_OK, FC_UNSUPPORTED_MASK, FC_UNSUPPORTED_FAMILY},
    {"mask, forced sm80", m_mask_force_sm80, FC_OK, FC_OK, FC_UNSUPPORTED_FAMILY},
    {"mask, forced decode, Sq = 4", m_mask_force_decode, FC_OK, FC_OK, FC_UNSUPPORTED_FAMILY},
    {"mask, decode-sized call, lse (auto: decode)", m_mask_decode_shape_lse, FC_OK, FC_OK, FC_UNSUPPORTED_ARCH},
    {"mask, K/V broadcast over batch, lse", m_mask_broadcast_kv_lse, FC_OK, FC_OK, FC_UNSUPPORTED_ARCH},
    {"bool (B, H, Sq, Sk) mask, 304-byte rows", m_mask_tiles, FC_OK, FC_OK, FC_UNSUPPORTED_ARCH},
    {"mask tiles, forced sm90", m_mask_tiles_force_sm90, FC_OK, FC_OK, FC_UNSUPPORTED_FAMILY},
    {"mask tiles, broadcast (B, H), forced sm90", m_mask_tiles_broadcast_force_sm90, FC_OK, FC_OK, FC_UNSUPPORTED_FAMILY},
    {"mask tiles, D=64, forced sm90", m_mask_tiles_d64_force_sm90, FC_OK, FC_OK, FC_UNSUPPORTED_FAMILY},
    {"mask tiles, D=256 (auto: sm90)", m_mask_tiles_d256, FC_OK, FC_OK, FC_UNSUPPORTED_ARCH},
    {"mask tiles, D=256, forced sm90", m_mask_tiles_d256_force_sm90, FC_OK, FC_OK, FC_UNSUPPORTED_FAMILY},
    {"mask tiles, causal (auto: sm90)", m_mask_tiles_causal, FC_OK, FC_OK, FC_UNSUPPORTED_ARCH},
    {"mask tiles, causal, forced sm90", m_mask_tiles_causal_force_sm90, FC_OK, FC_OK, FC_UNSUPPORTED_FAMILY},
    {"mask tiles, causal, D=256, forced sm90", m_mask_tiles_causal_d256_force_sm90, FC_OK, FC_OK, FC_UNSUPPORTED_FAMILY},
    {"mask tiles, bottom-right causal, forced sm90", m_mask_tiles_causal_bottom_right_force_sm90, FC_OK, FC_UNSUPPORTED_MASK, FC_UNSUPPORTED_FAMILY},
    {"mask tiles, window (no family)", m_mask_tiles_window, FC_OK, FC_UNSUPPORTED_BAND, FC_UNSUPPORTED_ARCH},
    {"mask tiles, window, forced sm90", m_mask_tiles_window_force_sm90, FC_OK, FC_UNSUPPORTED_MASK, FC_UNSUPPORTED_FAMILY},
    {"mask tiles, softcap (auto: sm80)", m_mask_tiles_softcap, FC_OK, FC_OK, FC_UNSUPPORTED_ARCH},
    {"mask tiles, softcap, forced sm90", m_mask_tiles_softcap_force_sm90, FC_OK, FC_UNSUPPORTED_MASK, FC_UNSUPPORTED_FAMILY},
    {"mask tiles, sinks (no family)", m_mask_tiles_sinks, FC_OK, FC_UNSUPPORTED_SINKS, FC_UNSUPPORTED_ARCH},
    {"mask tiles, sinks, forced sm90", m_mask_tiles_sinks_force_sm90, FC_OK, FC_UNSUPPORTED_MASK, FC_UNSUPPORTED_FAMILY},
    {"additive mask tiles, forced sm90", m_mask_tiles_additive_force_sm90, FC_OK, FC_UNSUPPORTED_MASK, FC_UNSUPPORTED_FAMILY},
    {"mask, 300-byte rows, forced sm90", m_mask_tiles_rows_unaligned_force_sm90, FC_OK, FC_UNSUPPORTED_MASK, FC_UNSUPPORTED_FAMILY},
    {"mask, head stride % 16 != 0, forced sm90", m_mask_tiles_head_stride_unaligned_force_sm90, FC_OK, FC_UNSUPPORTED_MASK, FC_UNSUPPORTED_FAMILY},
    {"mask, batch stride % 16 != 0, forced sm90", m_mask_tiles_batch_stride_unaligned_force_sm90, FC_OK, FC_UNSUPPORTED_MASK, FC_UNSUPPORTED_FAMILY},
    {"mask, 8-byte base, forced sm90", m_mask_tiles_base_unaligned_force_sm90, FC_OK, FC_UNSUPPORTED_MASK, FC_UNSUPPORTED_FAMILY},
    {"mask, key stride 2, forced sm90", m_mask_tiles_keys_strided_force_sm90, FC_OK, FC_UNSUPPORTED_MASK, FC_UNSUPPORTED_FAMILY},
    {"mask, rows broadcast, forced sm90", m_mask_tiles_rows_broadcast_force_sm90, FC_OK, FC_UNSUPPORTED_MASK, FC_UNSUPPORTED_FAMILY},
    {"mask tiles, decode-sized call (auto: sm90)", m_mask_tiles_decode_shape, FC_OK, FC_OK, FC_UNSUPPORTED_ARCH},
    {"mask tiles, forced decode, Sq = 4", m_mask_tiles_force_decode, FC_OK, FC_OK, FC_UNSUPPORTED_FAMILY},
    {"mask, causal, forced decode, Sq = 4", m_mask_causal_force_decode, FC_OK, FC_UNSUPPORTED_MASK, FC_UNSUPPORTED_FAMILY},
    {"mask tiles, K/V broadcast, lse (auto: sm80)", m_mask_tiles_broadcast_kv_lse, FC_OK, FC_OK, FC_UNSUPPORTED_ARCH},
    /* AUTO on Hopper for a call that wants no LSE (inference): a mask that only the sm80 family
     * takes goes to PyTorch's SDPA, faster there (FC_UNSUPPORTED_SLOWER_MASK): at D=64 / 128 / 256
     * every such mask, at 32 / 80 / 96 a mask broadcast over the query rows (key padding, one
     * query row). Not with causal, a window, softcap or sinks (each keeps its own answer), not
     * with an LSE, not for a forced family; main() also checks that each declined row runs in the
     * sm80 family on sm_89, with an LSE, and forced. */
    {"additive (Sq, Sk) mask, no lse (auto on Hopper: SDPA is faster)", m_mask, FC_OK, FC_UNSUPPORTED_SLOWER_MASK, FC_UNSUPPORTED_ARCH},
    {"bool (B, H, Sq, Sk) mask, no lse", m_bool_mask_bhqk, FC_OK, FC_UNSUPPORTED_SLOWER_MASK, FC_UNSUPPORTED_ARCH},
    {"bool mask, odd address, transposed, no lse", m_mask_odd_layout, FC_OK, FC_UNSUPPORTED_SLOWER_MASK, FC_UNSUPPORTED_ARCH},
    {"additive mask, 2-byte address, odd rows, no lse", m_mask_odd_additive, FC_OK, FC_UNSUPPORTED_SLOWER_MASK, FC_UNSUPPORTED_ARCH},
    {"bool mask broadcast on every dim, no lse", m_mask_all_broadcast, FC_OK, FC_UNSUPPORTED_SLOWER_MASK, FC_UNSUPPORTED_ARCH},
    {"mask, Sq 1, huge unused row stride, no lse (additive: SDPA)", m_mask_size1_huge_strides, FC_OK, FC_UNSUPPORTED_SLOWER_MASK, FC_UNSUPPORTED_ARCH},
    {"mask, decode-sized call, no lse (decode)", m_mask_decode_shape, FC_OK, FC_OK, FC_UNSUPPORTED_ARCH},
    {"mask, K/V broadcast over batch, no lse", m_mask_broadcast_kv, FC_OK, FC_UNSUPPORTED_SLOWER_MASK, FC_UNSUPPORTED_ARCH},
    {"mask tiles, K/V broadcast, no lse", m_mask_tiles_broadcast_kv, FC_OK, FC_UNSUPPORTED_SLOWER_MASK, FC_UNSUPPORTED_ARCH},
    {"bool (B, H, Sq, Sk) mask, D=64, no lse", m_mask_d64, FC_OK, FC_UNSUPPORTED_SLOWER_MASK, FC_UNSUPPORTED_ARCH},
    {"bool (B, H, Sq, Sk) mask, D=32, no lse (sm80)", m_mask_d32, FC_OK, FC_OK, FC_UNSUPPORTED_ARCH},
    {"bool (B, H, Sq, Sk) mask, D=80, no lse (sm80)", m_mask_d80, FC_OK, FC_OK, FC_UNSUPPORTED_ARCH},
    {"bool (B, H, Sq, Sk) mask, D=96, no lse (sm80)", m_mask_d96, FC_OK, FC_OK, FC_UNSUPPORTED_ARCH},
    {"bool (B, H, Sq, Sk) mask, D=256, no lse", m_mask_d256, FC_OK, FC_UNSUPPORTED_SLOWER_MASK, FC_UNSUPPORTED_ARCH},
    {"additive (B, H, Sq, Sk) mask, D=32, no lse", m_additive_mask_d32, FC_OK, FC_UNSUPPORTED_SLOWER_MASK, FC_UNSUPPORTED_ARCH},
    {"additive (B, H, Sq, Sk) mask, D=96, no lse", m_additive_mask_d96, FC_OK, FC_UNSUPPORTED_SLOWER_MASK, FC_UNSUPPORTED_ARCH},
    {"additive (B, H, Sq, Sk) mask, D=256, no lse", m_additive_mask_d256, FC_OK, FC_UNSUPPORTED_SLOWER_MASK, FC_UNSUPPORTED_ARCH},
    {"additive (B, H, Sq, Sk) mask, D=96, lse (sm80)", m_additive_mask_d96_lse, FC_OK, FC_OK, FC_UNSUPPORTED_ARCH},
    {"key padding mask, D=128, no lse", m_key_padding, FC_OK, FC_UNSUPPORTED_SLOWER_MASK, FC_UNSUPPORTED_ARCH},
    {"key padding mask, D=32, no lse", m_key_padding_d32, FC_OK, FC_UNSUPPORTED_SLOWER_MASK, FC_UNSUPPORTED_ARCH},
    {"key padding mask, D=80, no lse", m_key_padding_d80, FC_OK, FC_UNSUPPORTED_SLOWER_MASK, FC_UNSUPPORTED_ARCH},
    {"key padding mask, D=96, no lse", m_key_padding_d96, FC_OK, FC_UNSUPPORTED_SLOWER_MASK, FC_UNSUPPORTED_ARCH},
    {"key padding mask, D=256, no lse", m_key_padding_d256, FC_OK, FC_UNSUPPORTED_SLOWER_MASK, FC_UNSUPPORTED_ARCH},
    {"key padding mask, D=96, lse (sm80)", m_key_padding_d96_lse, FC_OK, FC_OK, FC_UNSUPPORTED_ARCH},
    {"mask, one query row, D=96, no lse", m_mask_one_row_d96, FC_OK, FC_UNSUPPORTED_SLOWER_MASK, FC_UNSUPPORTED_ARCH},
    {"mask, one query row, D=256, no lse", m_mask_one_row_d256, FC_OK, FC_UNSUPPORTED_SLOWER_MASK, FC_UNSUPPORTED_ARCH},
    {"mask, one query row, D=96, lse (sm80)", m_mask_one_row_d96_lse, FC_OK, FC_OK, FC_UNSUPPORTED_ARCH},
    {"key padding, D=96, causal, no lse (sm80)", m_key_padding_d96_causal, FC_OK, FC_OK, FC_UNSUPPORTED_ARCH},
    {"key padding, D=96, softcap, no lse (sm80)", m_key_padding_d96_softcap, FC_OK, FC_OK, FC_UNSUPPORTED_ARCH},
    {"key padding, D=96, window, no lse (no family)", m_key_padding_d96_window, FC_OK, FC_UNSUPPORTED_BAND, FC_UNSUPPORTED_ARCH},
    {"key padding, D=96, sinks, no lse (no family)", m_key_padding_d96_sinks, FC_OK, FC_UNSUPPORTED_SINKS, FC_UNSUPPORTED_ARCH},
    {"key padding, D=96, forced sm80, no lse", m_key_padding_d96_force_sm80, FC_OK, FC_OK, FC_UNSUPPORTED_FAMILY},
    {"forced sm90 family", m_force_sm90, FC_OK, FC_OK, FC_UNSUPPORTED_FAMILY},
    {"forced sm90, K/V broadcast over batch", m_force_sm90_broadcast, FC_OK, FC_UNSUPPORTED_LAYOUT, FC_UNSUPPORTED_FAMILY},
    {"forced sm80 family", m_force_sm80, FC_OK, FC_OK, FC_UNSUPPORTED_FAMILY},
    {"workspace misaligned", m_workspace_misaligned, FC_ERR_BAD_WORKSPACE, FC_ERR_BAD_WORKSPACE, FC_ERR_BAD_WORKSPACE},
    {"workspace_bytes negative", m_workspace_negative, FC_ERR_BAD_WORKSPACE, FC_ERR_BAD_WORKSPACE, FC_ERR_BAD_WORKSPACE},
    {"forced decode, Sq = 100", m_force_decode_long_q, FC_OK, FC_UNSUPPORTED_LAYOUT, FC_UNSUPPORTED_FAMILY},
    {"forced decode, Sq = 4, GQA 4", m_force_decode, FC_OK, FC_OK, FC_UNSUPPORTED_FAMILY},
    {"forced sm90, negative scale", m_force_sm90_negative_scale, FC_OK, FC_UNSUPPORTED_LAYOUT, FC_UNSUPPORTED_FAMILY},
    {"negative scale (auto: sm80 family)", m_negative_scale, FC_OK, FC_OK, FC_UNSUPPORTED_ARCH},
    {"seqlen_q 1 with odd stride", m_size1_odd_stride, FC_OK, FC_OK, FC_UNSUPPORTED_ARCH},
    {"K/V broadcast over batch", m_broadcast_kv, FC_OK, FC_OK, FC_UNSUPPORTED_ARCH},
    /* Paged KV (m_paged): the decode family only. */
    {"paged decode", m_paged, FC_OK, FC_OK, FC_UNSUPPORTED_ARCH},
    {"paged decode, no seqused_k", m_paged_no_seqused, FC_OK, FC_OK, FC_UNSUPPORTED_ARCH},
    {"paged decode, 64-key pages", m_paged_page_64, FC_OK, FC_OK, FC_UNSUPPORTED_ARCH},
    {"paged decode, D=64", m_paged_d64, FC_OK, FC_OK, FC_UNSUPPORTED_ARCH},
    {"paged decode, batch 1, table stride 0", m_paged_batch1_stride0, FC_OK, FC_OK, FC_UNSUPPORTED_ARCH},
    {"paged decode, 32 rows per KV head", m_paged_gqa_rows32, FC_OK, FC_OK, FC_UNSUPPORTED_ARCH},
    {"paged, forced decode", m_paged_force_decode, FC_OK, FC_OK, FC_UNSUPPORTED_FAMILY},
    {"paged, page_size 8", m_paged_page_8, FC_ERR_BAD_PAGES, FC_ERR_BAD_PAGES, FC_ERR_BAD_PAGES},
    {"paged, page_size 24", m_paged_page_24, FC_ERR_BAD_PAGES, FC_ERR_BAD_PAGES, FC_ERR_BAD_PAGES},
    {"paged, page_size 0", m_paged_page_0, FC_ERR_BAD_PAGES, FC_ERR_BAD_PAGES, FC_ERR_BAD_PAGES},
    {"paged, page_size -16", m_paged_page_negative, FC_ERR_BAD_PAGES, FC_ERR_BAD_PAGES, FC_ERR_BAD_PAGES},
    {"paged, pages_per_seq * page_size < Sk", m_paged_too_few_pages, FC_ERR_BAD_PAGES, FC_ERR_BAD_PAGES, FC_ERR_BAD_PAGES},
    {"paged, pages_per_seq 0", m_paged_no_pages_per_seq, FC_ERR_BAD_PAGES, FC_ERR_BAD_PAGES, FC_ERR_BAD_PAGES},
    {"paged, num_pages 0", m_paged_num_pages_0, FC_ERR_BAD_PAGES, FC_ERR_BAD_PAGES, FC_ERR_BAD_PAGES},
    {"paged, num_pages 2^31", m_paged_num_pages_huge, FC_ERR_BAD_PAGES, FC_ERR_BAD_PAGES, FC_ERR_BAD_PAGES},
    {"paged, table stride < pages_per_seq", m_paged_narrow_stride, FC_ERR_BAD_PAGES, FC_ERR_BAD_PAGES, FC_ERR_BAD_PAGES},
    {"paged, table stride negative", m_paged_negative_stride, FC_ERR_BAD_PAGES, FC_ERR_BAD_PAGES, FC_ERR_BAD_PAGES},
    {"paged, table extent overflows", m_paged_stride_overflow, FC_ERR_BAD_PAGES, FC_ERR_BAD_PAGES, FC_ERR_BAD_PAGES},
    {"paged, table wraps the address space", m_paged_table_wraps, FC_ERR_BAD_PAGES, FC_ERR_BAD_PAGES, FC_ERR_BAD_PAGES},
    {"paged, seqused_k wraps the address space", m_paged_seqused_wraps, FC_ERR_BAD_PAGES, FC_ERR_BAD_PAGES, FC_ERR_BAD_PAGES},
    {"page_size without block_table", m_pages_without_table, FC_ERR_BAD_PAGES, FC_ERR_BAD_PAGES, FC_ERR_BAD_PAGES},
    {"table stride without block_table", m_table_stride_without_table, FC_ERR_BAD_PAGES, FC_ERR_BAD_PAGES, FC_ERR_BAD_PAGES},
    {"seqused_k without block_table", m_seqused_without_table, FC_ERR_BAD_PAGES, FC_ERR_BAD_PAGES, FC_ERR_BAD_PAGES},
    {"paged, block_table 2-byte aligned", m_paged_table_misaligned, FC_ERR_POINTER_ALIGNMENT, FC_ERR_POINTER_ALIGNMENT, FC_ERR_POINTER_ALIGNMENT},
    {"paged, seqused_k 1-byte aligned", m_paged_seqused_misaligned, FC_ERR_POINTER_ALIGNMENT, FC_ERR_POINTER_ALIGNMENT, FC_ERR_POINTER_ALIGNMENT},
    {"paged, page stride not 16-byte multiple", m_paged_page_stride_unaligned, FC_ERR_STRIDE_ALIGNMENT, FC_ERR_STRIDE_ALIGNMENT, FC_ERR_STRIDE_ALIGNMENT},
    {"paged, page slice offset past 2^31", m_paged_page_slice_overflow, FC_ERR_OFFSET_OVERFLOW, FC_ERR_OFFSET_OVERFLOW, FC_ERR_OFFSET_OVERFLOW},
    {"paged, pool offset past 2^64 bytes", m_paged_pool_overflow, FC_ERR_OFFSET_OVERFLOW, FC_ERR_OFFSET_OVERFLOW, FC_ERR_OFFSET_OVERFLOW},
    {"paged, Sq = 100 (not decode-shaped)", m_paged_prefill, FC_OK, FC_UNSUPPORTED_PAGED, FC_UNSUPPORTED_ARCH},
    {"paged, 64 rows per KV head", m_paged_gqa_rows64, FC_OK, FC_UNSUPPORTED_PAGED, FC_UNSUPPORTED_ARCH},
    {"paged, causal", m_paged_causal, FC_OK, FC_UNSUPPORTED_PAGED, FC_UNSUPPORTED_ARCH},
    {"paged, window", m_paged_window, FC_OK, FC_UNSUPPORTED_PAGED, FC_UNSUPPORTED_ARCH},
    {"paged, mask", m_paged_mask, FC_OK, FC_UNSUPPORTED_PAGED, FC_UNSUPPORTED_ARCH},
    {"paged, forced sm90", m_paged_force_sm90, FC_OK, FC_UNSUPPORTED_PAGED, FC_UNSUPPORTED_FAMILY},
    {"paged, forced sm80", m_paged_force_sm80, FC_OK, FC_UNSUPPORTED_PAGED, FC_UNSUPPORTED_FAMILY},
    {"paged, Sq = 100, forced decode", m_paged_force_decode_prefill, FC_OK, FC_UNSUPPORTED_PAGED, FC_UNSUPPORTED_FAMILY},
    {"paged, D=96 (no decode kernel)", m_paged_d96, FC_OK, FC_UNSUPPORTED_HEAD_DIM, FC_UNSUPPORTED_ARCH},
    {"paged, sinks", m_paged_sinks, FC_OK, FC_UNSUPPORTED_SINKS, FC_UNSUPPORTED_ARCH},
    {"paged, softcap", m_paged_softcap, FC_OK, FC_UNSUPPORTED_SOFTCAP, FC_UNSUPPORTED_ARCH},
    /* Packed sequences (m_varlen): the sm90 forward only. */
    {"varlen", m_varlen, FC_OK, FC_OK, FC_UNSUPPORTED_ARCH},
    {"varlen, causal", m_varlen_causal, FC_OK, FC_OK, FC_UNSUPPORTED_ARCH},
    {"varlen, LSE (H, T)", m_varlen_lse, FC_OK, FC_OK, FC_UNSUPPORTED_ARCH},
    {"varlen, D=64", m_varlen_d64, FC_OK, FC_OK, FC_UNSUPPORTED_ARCH},
    {"varlen, D=256", m_varlen_d256, FC_OK, FC_OK, FC_UNSUPPORTED_ARCH},
    {"varlen, one query row each (no decode route)", m_varlen_one_row, FC_OK, FC_OK, FC_UNSUPPORTED_ARCH},
    {"varlen, forced sm90", m_varlen_force_sm90, FC_OK, FC_OK, FC_UNSUPPORTED_FAMILY},
    {"varlen, D=96 (no sm90 kernel)", m_varlen_d96, FC_OK, FC_UNSUPPORTED_HEAD_DIM, FC_UNSUPPORTED_ARCH},
    {"varlen, bool mask", m_varlen_mask, FC_OK, FC_UNSUPPORTED_VARLEN, FC_UNSUPPORTED_ARCH},
    {"varlen, softcap", m_varlen_softcap, FC_OK, FC_UNSUPPORTED_VARLEN, FC_UNSUPPORTED_ARCH},
    {"varlen, sinks", m_varlen_sinks, FC_OK, FC_UNSUPPORTED_VARLEN, FC_UNSUPPORTED_ARCH},
    {"varlen, forced sm80", m_varlen_force_sm80, FC_OK, FC_UNSUPPORTED_VARLEN, FC_UNSUPPORTED_FAMILY},
    {"varlen, window", m_varlen_window, FC_UNSUPPORTED_VARLEN, FC_UNSUPPORTED_VARLEN, FC_UNSUPPORTED_VARLEN},
    {"varlen, bottom-right causal", m_varlen_bottom_right, FC_UNSUPPORTED_VARLEN, FC_UNSUPPORTED_VARLEN, FC_UNSUPPORTED_VARLEN},
    {"varlen, no cu_seq_k", m_varlen_no_cu_k, FC_ERR_BAD_VARLEN, FC_ERR_BAD_VARLEN, FC_ERR_BAD_VARLEN},
    {"cu_seq_k without cu_seq_q", m_cu_k_without_cu_q, FC_ERR_BAD_VARLEN, FC_ERR_BAD_VARLEN, FC_ERR_BAD_VARLEN},
    {"total_q without cu_seq_q", m_total_without_cu_q, FC_ERR_BAD_VARLEN, FC_ERR_BAD_VARLEN, FC_ERR_BAD_VARLEN},
    {"varlen, total_k 0", m_varlen_total_k_0, FC_ERR_BAD_VARLEN, FC_ERR_BAD_VARLEN, FC_ERR_BAD_VARLEN},
    {"varlen, q batch stride", m_varlen_batch_stride, FC_ERR_BAD_VARLEN, FC_ERR_BAD_VARLEN, FC_ERR_BAD_VARLEN},
    {"varlen, LSE batch stride", m_varlen_lse_batch_stride, FC_ERR_BAD_VARLEN, FC_ERR_BAD_VARLEN, FC_ERR_BAD_VARLEN},
    {"varlen, cu_seq_q 2-byte aligned", m_varlen_cu_misaligned, FC_ERR_POINTER_ALIGNMENT, FC_ERR_POINTER_ALIGNMENT, FC_ERR_POINTER_ALIGNMENT},
    {"varlen, row offsets past 2^31", m_varlen_rows_overflow, FC_ERR_OFFSET_OVERFLOW, FC_ERR_OFFSET_OVERFLOW, FC_ERR_OFFSET_OVERFLOW},
};

/* ---- the backward's struct (fc_bwd_params_validate / fc_sdpa_bwd_support) ---- */

static fc_bwd_params valid_bwd_params(void) {
    fc_bwd_params b;
    fc_bwd_params_init(&b);
    b.fwd = valid_params();
    b.fwd.head_dim = 64; /* built in every configuration, also the quick fp16/D=64 one */
    b.fwd.scale = 0.125f;
    b.fwd.lse = (float *)0x50000;
    b.dout = (const void *)0x60000;
    b.dq = (void *)0x70000;
    b.dk = (void *)0x80000;
    b.dv = (void *)0x90000;
    fc_bwd_params_set_contiguous_strides(&b);
    return b;
}

typedef void (*bwd_mutate_fn)(fc_bwd_params *b);
static void b_none(fc_bwd_params *b) { (void)b; }
static void b_null_lse(fc_bwd_params *b) { b->fwd.lse = NULL; }
static void b_null_dout(fc_bwd_params *b) { b->dout = NULL; }
static void b_null_dv(fc_bwd_params *b) { b->dv = NULL; }
static void b_fwd_invalid(fc_bwd_params *b) { b->fwd.heads_kv = 3; }
static void b_dq_misaligned(fc_bwd_params *b) { b->dq = (void *)0x70008; }
static void b_dk_stride(fc_bwd_params *b) { b->dk_stride_s = 66; }
static void b_dv_last_dim(fc_bwd_params *b) { b->dv_stride_d = 2; }
static void b_dout_negative(fc_bwd_params *b) { b->do_stride_h = -64; }
static void b_dout_overflow(fc_bwd_params *b) { b->do_stride_s = (int64_t)1 << 40; }
static void b_dlse_misaligned(fc_bwd_params *b) { b->dlse = (const float *)0xa0002; }
static void b_dlse_negative(fc_bwd_params *b) { b->dlse = (const float *)0xa0000; b->dlse_stride_s = -1; }
static void b_dlse_ok(fc_bwd_params *b) { b->dlse = (const float *)0xa0000; }
static void b_workspace_misaligned(fc_bwd_params *b) { b->workspace = (void *)0xb0004; }
static void b_workspace_negative(fc_bwd_params *b) { b->workspace_bytes = -1; }
static void b_mask(fc_bwd_params *b) { b->fwd.mask_kind = FC_MASK_BOOL; b->fwd.mask = (const void *)0xc0000; }
static void b_fp32(fc_bwd_params *b) { b->fwd.dtype = FC_DTYPE_FP32; fc_bwd_params_set_contiguous_strides(b); }
static void b_head_dim_256(fc_bwd_params *b) { b->fwd.head_dim = 256; fc_bwd_params_set_contiguous_strides(b); }
/* The forward's new dims have no backward kernel: the op falls back to the Python backward. */
static void b_head_dim_80(fc_bwd_params *b) { b->fwd.head_dim = 80; fc_bwd_params_set_contiguous_strides(b); }
static void b_head_dim_96(fc_bwd_params *b) { b->fwd.head_dim = 96; fc_bwd_params_set_contiguous_strides(b); }
static void b_head_dim_32(fc_bwd_params *b) { b->fwd.head_dim = 32; fc_bwd_params_set_contiguous_strides(b); }
static void b_head_dim_72(fc_bwd_params *b) { b->fwd.head_dim = 72; fc_bwd_params_set_contiguous_strides(b); }
static void b_force_sm90(fc_bwd_params *b) { b->fwd.family = FC_FAMILY_SM90; }
static void b_force_sm80(fc_bwd_params *b) { b->fwd.family = FC_FAMILY_SM80; }
static void b_deterministic(fc_bwd_params *b) { b->deterministic = 1; }
/* A broadcast (stride-0) head dim of dout: no TMA tensor map for it (the Hopper family). */
static void b_dout_broadcast_heads(fc_bwd_params *b) { b->do_stride_h = 0; }
static void b_force_sm90_broadcast(fc_bwd_params *b) { b_force_sm90(b); b_dout_broadcast_heads(b); }
static void b_empty(fc_bwd_params *b) { b->fwd.seqlen_k = 0; }
/* A paged forward (m_paged's pages; dk/dv keep their (B, Hkv, Sk, D) layout): no backward kernel. */
static void b_paged(fc_bwd_params *b) {
    b->fwd.block_table = (const int32_t *)0x60000;
    b->fwd.page_size = 16;
    b->fwd.pages_per_seq = (int32_t)((b->fwd.seqlen_k + 15) / 16);
    b->fwd.block_table_stride = b->fwd.pages_per_seq;
    b->fwd.num_pages = 8;
}
static void b_paged_bad(fc_bwd_params *b) { b_paged(b); b->fwd.page_size = 12; }

typedef struct bwd_case {
    const char *label;
    bwd_mutate_fn mutate;
    fc_status want_validate;
    fc_status want_support; /* on a device the library runs on (sm_90 or sm_89, as built) */
} bwd_case;

static const bwd_case kBwdCases[] = {
    {"bwd valid", b_none, FC_OK, FC_OK},
    {"bwd lse NULL", b_null_lse, FC_ERR_NULL_POINTER, FC_ERR_NULL_POINTER},
    {"bwd dout NULL", b_null_dout, FC_ERR_NULL_POINTER, FC_ERR_NULL_POINTER},
    {"bwd dv NULL", b_null_dv, FC_ERR_NULL_POINTER, FC_ERR_NULL_POINTER},
    {"bwd forward params invalid", b_fwd_invalid, FC_ERR_HEADS_NOT_DIVISIBLE, FC_ERR_HEADS_NOT_DIVISIBLE},
    {"bwd dq misaligned", b_dq_misaligned, FC_ERR_POINTER_ALIGNMENT, FC_ERR_POINTER_ALIGNMENT},
    {"bwd dk stride not 16-byte", b_dk_stride, FC_ERR_STRIDE_ALIGNMENT, FC_ERR_STRIDE_ALIGNMENT},
    {"bwd dv last dim strided", b_dv_last_dim, FC_ERR_LAST_DIM_STRIDE, FC_ERR_LAST_DIM_STRIDE},
    {"bwd dout negative stride", b_dout_negative, FC_ERR_NEGATIVE_STRIDE, FC_ERR_NEGATIVE_STRIDE},
    {"bwd dout slice offset past 2^31", b_dout_overflow, FC_ERR_OFFSET_OVERFLOW, FC_ERR_OFFSET_OVERFLOW},
    {"bwd dlse misaligned", b_dlse_misaligned, FC_ERR_POINTER_ALIGNMENT, FC_ERR_POINTER_ALIGNMENT},
    {"bwd dlse negative stride", b_dlse_negative, FC_ERR_NEGATIVE_STRIDE, FC_ERR_NEGATIVE_STRIDE},
    {"bwd with dlse", b_dlse_ok, FC_OK, FC_OK},
    {"bwd workspace misaligned", b_workspace_misaligned, FC_ERR_BAD_WORKSPACE, FC_ERR_BAD_WORKSPACE},
    {"bwd workspace_bytes negative", b_workspace_negative, FC_ERR_BAD_WORKSPACE, FC_ERR_BAD_WORKSPACE},
    {"bwd fp32", b_fp32, FC_OK, FC_UNSUPPORTED_DTYPE},
    /* D=32 / 80 / 96: the sm80-class family alone (where the build has them: check_bwd) */
    {"bwd head dim 32", b_head_dim_32, FC_OK, FC_OK},
    {"bwd head dim 80", b_head_dim_80, FC_OK, FC_OK},
    {"bwd head dim 96", b_head_dim_96, FC_OK, FC_OK},
    {"bwd head dim 72", b_head_dim_72, FC_OK, FC_UNSUPPORTED_HEAD_DIM},
    {"bwd forced sm90 family", b_force_sm90, FC_OK, FC_OK}, /* where Hopper is built; see check_bwd */
    {"bwd forced sm80 family", b_force_sm80, FC_OK, FC_OK},
    {"bwd deterministic", b_deterministic, FC_OK, FC_OK},
    {"bwd dout broadcast over heads", b_dout_broadcast_heads, FC_OK, FC_OK},
    {"bwd forced sm90, dout broadcast", b_force_sm90_broadcast, FC_OK, FC_UNSUPPORTED_LAYOUT},
    {"bwd empty", b_empty, FC_UNSUPPORTED_EMPTY, FC_UNSUPPORTED_EMPTY},
    {"bwd paged forward", b_paged, FC_OK, FC_UNSUPPORTED_PAGED},
    {"bwd paged forward, page_size 12", b_paged_bad, FC_ERR_BAD_PAGES, FC_ERR_BAD_PAGES},
};

/* A plan validates the caller's struct once (the op layer plans each call once): fc_sdpa_plan
 * on 132 SMs, counting fc_params_validate's runs on this thread. */
/* A one-row 32:8 GQA plan in the Hopper family: launched packed (8 heads of 4 rows) over
 * `splits` key ranges. */
static void check_packed_plan(const char *label, const fc_fwd_plan *plan, int splits) {
    if (plan->params.heads_q != 8 || plan->params.seqlen_q != 4 || plan->splits != splits) {
        fprintf(stderr, "FAIL %s: heads_q %lld seqlen_q %lld splits %d, want 8 4 %d\n", label,
                (long long)plan->params.heads_q, (long long)plan->params.seqlen_q, plan->splits, splits);
        ++failures;
    }
}

static void check_plan_validates_once(const char *label, const fc_params *p, int cc_major, int cc_minor,
                                      fc_fwd_plan *plan) {
    const unsigned long long before = fc_validations_on_thread_();
    fc_sdpa_plan(p, cc_major, cc_minor, 132, plan);
    const unsigned long long runs = fc_validations_on_thread_() - before;
    if (runs != 1) {
        fprintf(stderr, "FAIL %-40s %llu validations, want 1\n", label, runs);
        ++failures;
    } else {
        printf("ok   %-40s 1 validation\n", label);
    }
}

/* A one-row GQA decode call: B=1, Hq=32, Hkv=8, Sq=1, D=128, fp16, contiguous. */
static fc_params gqa_decode_params(int64_t seqlen_k) {
    fc_params p = valid_params();
    p.batch = 1;
    p.heads_q = 32;
    p.heads_kv = 8;
    p.seqlen_q = 1;
    p.seqlen_k = seqlen_k;
    fc_params_set_contiguous_strides(&p);
    return p;
}

/* One-row GQA decoding on sm_90 asks whether its query heads pack into one block per KV head
 * (fc_decode_packs_for_sm90), which validates a packed copy: the choice of family, the packing
 * and the grid split all need that answer, and the call works it out once. */
static void check_plan_gqa_decode(void) {
    fc_fwd_plan plan;
    if (fc_test_left_out(128, FC_DTYPE_FP16)) {
        printf("skip plan: one-row GQA decode (this build left D=128 fp16 out)\n");
        return;
    }
    /* Sk=1024: the decode kernel under AUTO (the Hopper family reads only long caches faster). */
    fc_params p = gqa_decode_params(1024);
    const int hopper = fc_sdpa_support(&p, 9, 0) == FC_OK;
    const int cc_major = hopper ? 9 : 8, cc_minor = hopper ? 0 : 9;
    check_plan_validates_once("plan: GQA decode, auto", &p, cc_major, cc_minor, &plan);
    CHECK_FAMILY("plan: GQA decode, auto, family", plan.family, FC_FAMILY_DECODE);
    if (!hopper) {
        printf("skip plan: one-row GQA decode in the sm90 family (not built)\n");
        return;
    }
    /* The same call forced into the Hopper family: packed (4 rows per KV head) and split over the
     * grid (8 pairs on 132 SMs: 2 ranges of 512 keys). */
    p.family = FC_FAMILY_SM90;
    check_plan_validates_once("plan: GQA decode, forced sm90", &p, 9, 0, &plan);
    CHECK_FAMILY("plan: GQA decode, forced sm90, family", plan.family, FC_FAMILY_SM90);
    check_packed_plan("plan: GQA decode, forced sm90", &plan, 2);
    /* A long cache under AUTO: 8 pairs x 128k keys reach the Hopper family, whose choice over
     * the decode kernel already needs the packing (sm90_reads_decode_faster in dispatch.c). */
    p = gqa_decode_params((int64_t)1 << 17);
    check_plan_validates_once("plan: GQA decode 128k, auto", &p, 9, 0, &plan);
    CHECK_FAMILY("plan: GQA decode 128k, auto, family", plan.family, FC_FAMILY_SM90);
    check_packed_plan("plan: GQA decode 128k, auto", &plan, 16);
}

/* fc_sdpa_plan and fc_sdpa_fwd_planned's argument checks (nothing launches here: every case
 * is refused before the launch). */
static void check_plan(void) {
    fc_params p = valid_params();
    fc_fwd_plan plan;
    const int hopper = fc_sdpa_support(&p, 9, 0) == FC_OK;
    const int cc_major = hopper ? 9 : 8, cc_minor = hopper ? 0 : 9;
    check_plan_validates_once("plan: valid call, validations", &p, cc_major, cc_minor, &plan);
    check_plan_gqa_decode();
    CHECK_STATUS("plan: valid call", fc_sdpa_plan(&p, cc_major, cc_minor, 132, &plan),
                 fc_sdpa_support(&p, cc_major, cc_minor));
    CHECK_FAMILY("plan: family", plan.family, fc_sdpa_family(&p, cc_major, cc_minor));
    if (plan.family != FC_FAMILY_AUTO) {
        CHECK_STATUS("planned: out NULL", fc_sdpa_fwd_planned(&plan, NULL, NULL, NULL, 0, (cudaStream_t)0),
                     FC_ERR_NULL_POINTER);
        CHECK_STATUS("planned: out misaligned",
                     fc_sdpa_fwd_planned(&plan, (void *)0x40008, NULL, NULL, 0, (cudaStream_t)0),
                     FC_ERR_POINTER_ALIGNMENT);
        CHECK_STATUS("planned: workspace misaligned",
                     fc_sdpa_fwd_planned(&plan, (void *)0x40000, NULL, (void *)0x70004, 64, (cudaStream_t)0),
                     FC_ERR_BAD_WORKSPACE);
        CHECK_STATUS("planned: negative workspace bytes",
                     fc_sdpa_fwd_planned(&plan, (void *)0x40000, NULL, NULL, -1, (cudaStream_t)0),
                     FC_ERR_BAD_WORKSPACE);
    }
    /* Planned with an LSE: launching needs one, 4-byte aligned. */
    p.lse = (float *)0x60000;
    CHECK_STATUS("plan: with lse", fc_sdpa_plan(&p, cc_major, cc_minor, 132, &plan),
                 fc_sdpa_support(&p, cc_major, cc_minor));
    if (plan.family != FC_FAMILY_AUTO) {
        CHECK_STATUS("planned: lse NULL", fc_sdpa_fwd_planned(&plan, (void *)0x40000, NULL, NULL, 0, (cudaStream_t)0),
                     FC_ERR_NULL_POINTER);
        CHECK_STATUS("planned: lse misaligned",
                     fc_sdpa_fwd_planned(&plan, (void *)0x40000, (float *)0x60002, NULL, 0, (cudaStream_t)0),
                     FC_ERR_POINTER_ALIGNMENT);
    }
    /* A plan that failed launches nothing; a NULL plan pointer is refused. */
    p.head_dim = 48;
    CHECK_STATUS("plan: no kernel", fc_sdpa_plan(&p, cc_major, cc_minor, 132, &plan), FC_UNSUPPORTED_HEAD_DIM);
    CHECK_FAMILY("plan: no kernel, family", plan.family, FC_FAMILY_AUTO);
    CHECK_STATUS("planned: failed plan", fc_sdpa_fwd_planned(&plan, (void *)0x40000, NULL, NULL, 0, (cudaStream_t)0),
                 FC_ERR_NULL_POINTER);
    CHECK_STATUS("plan: NULL plan", fc_sdpa_plan(&p, cc_major, cc_minor, 132, NULL), FC_ERR_NULL_POINTER);
    CHECK_STATUS("planned: NULL plan", fc_sdpa_fwd_planned(NULL, (void *)0x40000, NULL, NULL, 0, (cudaStream_t)0),
                 FC_ERR_NULL_POINTER);
}

/* D=256: the Hopper family's kernel, masks (not with causal), a band and a softcap (not with
 * an additive mask) taken, no packed rows (no kernel for that head dim then); none in the
 * sm80-class family. */
static void check_bwd_head_dim_256(int hopper_built, int ada_built, int cc_major, int cc_minor) {
    fc_bwd_params b = valid_bwd_params();
    b_head_dim_256(&b);
    CHECK_STATUS("bwd head dim 256: validate", fc_bwd_params_validate(&b), FC_OK);
    if (fc_test_left_out(256, b.fwd.dtype)) {
        printf("skip bwd head dim 256: not in this build (FLASHCORE_HEAD_DIMS / FLASHCORE_DTYPES)\n");
        return;
    }
    if (hopper_built) {
        CHECK_STATUS("bwd head dim 256: support", fc_sdpa_bwd_support(&b, 9, 0), FC_OK);
        CHECK_FAMILY("bwd head dim 256: family", fc_sdpa_bwd_family(&b, 9, 0), FC_FAMILY_SM90);
        b.fwd.causal = 1;
        CHECK_STATUS("bwd head dim 256, causal", fc_sdpa_bwd_support(&b, 9, 0), FC_OK);
        b.fwd.softcap = 30.0f;
        CHECK_STATUS("bwd head dim 256, causal, softcap", fc_sdpa_bwd_support(&b, 9, 0), FC_OK);
        CHECK_FAMILY("bwd head dim 256, softcap: family", fc_sdpa_bwd_family(&b, 9, 0), FC_FAMILY_SM90);
        b.fwd.windowed = 1, b.fwd.window_left = 16, b.fwd.window_right = 0;  /* Gemma 2's sliding layers */
        CHECK_STATUS("bwd head dim 256, window, softcap", fc_sdpa_bwd_support(&b, 9, 0), FC_OK);
        CHECK_FAMILY("bwd head dim 256, window, softcap: family", fc_sdpa_bwd_family(&b, 9, 0), FC_FAMILY_SM90);
        b.fwd.softcap = 0.0f;
        CHECK_STATUS("bwd head dim 256, window", fc_sdpa_bwd_support(&b, 9, 0), FC_OK);
        b_deterministic(&b);
        CHECK_STATUS("bwd head dim 256, window, deterministic", fc_sdpa_bwd_support(&b, 9, 0), FC_UNSUPPORTED_BAND);
        b.deterministic = 0;
        b.fwd.windowed = 0, b.fwd.window_left = b.fwd.window_right = -1;
        b.fwd.softcap = 30.0f;
        b_mask(&b);
        b.fwd.causal = 0;
        CHECK_STATUS("bwd head dim 256, softcap, bool mask", fc_sdpa_bwd_support(&b, 9, 0), FC_OK);
        CHECK_FAMILY("bwd head dim 256, softcap, bool mask: family", fc_sdpa_bwd_family(&b, 9, 0), FC_FAMILY_SM90);
        b.fwd.mask_kind = FC_MASK_ADDITIVE;
        if (fc_sdpa_bwd_support(&b, 9, 0) == FC_OK) {  /* (no kernel: the op's Python backward) */
            fprintf(stderr, "FAIL bwd head dim 256, softcap, additive mask: supported\n");
            ++failures;
        }
        b.fwd.softcap = 0.0f;
        CHECK_STATUS("bwd head dim 256, additive mask", fc_sdpa_bwd_support(&b, 9, 0), FC_OK);
        b = valid_bwd_params();
        b_head_dim_256(&b);
    }
    if (ada_built) CHECK_STATUS("bwd head dim 256: Ada", fc_sdpa_bwd_support(&b, 8, 9), FC_UNSUPPORTED_HEAD_DIM);
    CHECK_STATUS("bwd head dim 256: sm_80", fc_sdpa_bwd_support(&b, 8, 0), FC_UNSUPPORTED_ARCH);
    b_deterministic(&b);
    CHECK_STATUS("bwd head dim 256, deterministic", fc_sdpa_bwd_support(&b, cc_major, cc_minor),
                 hopper_built || ada_built ? FC_UNSUPPORTED_HEAD_DIM : FC_UNSUPPORTED_ARCH);
    b.deterministic = 0;
    b_mask(&b);
    CHECK_STATUS("bwd head dim 256, mask", fc_sdpa_bwd_support(&b, cc_major, cc_minor),
                 hopper_built ? FC_OK : ada_built ? FC_UNSUPPORTED_HEAD_DIM : FC_UNSUPPORTED_ARCH);
    if (hopper_built) {
        b_force_sm90(&b);
        CHECK_STATUS("bwd head dim 256, mask, forced sm90", fc_sdpa_bwd_support(&b, 9, 0), FC_OK);
        b.fwd.causal = 1;
        CHECK_STATUS("bwd head dim 256, mask and causal", fc_sdpa_bwd_support(&b, 9, 0), FC_UNSUPPORTED_MASK);
    }
}

static void check_bwd(void) {
    /* Which device the backward kernels run on in this build (D=64 fp16 is in every build
     * that has any backward kernel). */
    fc_bwd_params probe = valid_bwd_params();
    const int hopper_built = fc_sdpa_bwd_support(&probe, 9, 0) == FC_OK;
    const int ada_built = fc_sdpa_bwd_support(&probe, 8, 9) == FC_OK;
    printf("backward runs on: %s%s\n", hopper_built ? "sm_90 " : "", ada_built ? "sm_89" : "");
    const int cc_major = hopper_built ? 9 : 8, cc_minor = hopper_built ? 0 : 9;
    for (size_t i = 0; i < sizeof(kBwdCases) / sizeof(kBwdCases[0]); ++i) {
        const bwd_case *c = &kBwdCases[i];
        fc_bwd_params b = valid_bwd_params();
        c->mutate(&b);
        char label[96];
        snprintf(label, sizeof label, "%s: validate", c->label);
        CHECK_STATUS(label, fc_bwd_params_validate(&b), c->want_validate);
        if (hopper_built || ada_built) {
            /* Forcing the Hopper family on an Ada-only build: not built there. */
            const fc_status want = b.fwd.family == FC_FAMILY_SM90 && !hopper_built ? FC_UNSUPPORTED_FAMILY
                                   : c->want_support == FC_OK && fc_test_left_out(b.fwd.head_dim, b.fwd.dtype)
                                       ? FC_UNSUPPORTED_HEAD_DIM
                                       : c->want_support;
            snprintf(label, sizeof label, "%s: support", c->label);
            CHECK_STATUS(label, fc_sdpa_bwd_support(&b, cc_major, cc_minor), want);
        }
        /* No device runs this library's kernels on sm_80: an otherwise valid struct says so. */
        snprintf(label, sizeof label, "%s: sm_80", c->label);
        const fc_status ampere = fc_sdpa_bwd_support(&b, 8, 0);
        const fc_status want_ampere = c->want_support == FC_OK ? FC_UNSUPPORTED_ARCH
                                    : c->want_support == FC_UNSUPPORTED_HEAD_DIM ? FC_UNSUPPORTED_ARCH
                                    : c->want_support;
        const int forced_elsewhere = want_ampere == FC_UNSUPPORTED_ARCH || want_ampere == FC_UNSUPPORTED_LAYOUT;
        CHECK_STATUS(label, ampere, b.fwd.family != FC_FAMILY_AUTO && forced_elsewhere
                                        ? FC_UNSUPPORTED_FAMILY : want_ampere);
    }
    /* Which family runs: on Hopper AUTO takes the sm90 family (where built) unless determinism is
     * asked for or the layout needs the sm80-class one; on Ada always the sm80-class one. */
    {
        fc_bwd_params b = valid_bwd_params();
        const fc_family want_auto = hopper_built ? FC_FAMILY_SM90 : FC_FAMILY_SM80;
        if (hopper_built || ada_built) {
            CHECK_FAMILY("bwd family: auto", fc_sdpa_bwd_family(&b, cc_major, cc_minor), want_auto);
            b_deterministic(&b);
            CHECK_FAMILY("bwd family: deterministic", fc_sdpa_bwd_family(&b, cc_major, cc_minor), FC_FAMILY_SM80);
            b = valid_bwd_params();
            b_dout_broadcast_heads(&b);
            CHECK_FAMILY("bwd family: dout broadcast", fc_sdpa_bwd_family(&b, cc_major, cc_minor), FC_FAMILY_SM80);
        }
        if (ada_built) {
            b = valid_bwd_params();
            CHECK_FAMILY("bwd family: Ada", fc_sdpa_bwd_family(&b, 8, 9), FC_FAMILY_SM80);
        }
        b = valid_bwd_params();
        CHECK_FAMILY("bwd family: sm_80 (none)", fc_sdpa_bwd_family(&b, 8, 0), FC_FAMILY_AUTO);
        /* Masks: either family (the Hopper one where it runs the call), not with causal. */
        b_mask(&b);
        CHECK_STATUS("bwd mask: validate", fc_bwd_params_validate(&b), FC_OK);
        if (hopper_built) {
            CHECK_STATUS("bwd mask: support", fc_sdpa_bwd_support(&b, 9, 0), FC_OK);
            CHECK_FAMILY("bwd family: mask", fc_sdpa_bwd_family(&b, 9, 0), FC_FAMILY_SM90);
        }
        if (ada_built) {
            CHECK_STATUS("bwd mask: Ada", fc_sdpa_bwd_support(&b, 8, 9), FC_OK);
            CHECK_FAMILY("bwd family: mask, Ada", fc_sdpa_bwd_family(&b, 8, 9), FC_FAMILY_SM80);
        }
        b.fwd.causal = 1;
        CHECK_STATUS("bwd mask, causal", fc_sdpa_bwd_support(&b, cc_major, cc_minor), FC_UNSUPPORTED_MASK);
        b.fwd.causal = 0;
        b_deterministic(&b);
        CHECK_STATUS("bwd mask, deterministic", fc_sdpa_bwd_support(&b, cc_major, cc_minor), FC_OK);
        CHECK_FAMILY("bwd family: mask, deterministic", fc_sdpa_bwd_family(&b, cc_major, cc_minor), FC_FAMILY_SM80);
        b.deterministic = 0;
        b_force_sm80(&b);
        CHECK_STATUS("bwd mask, forced sm80", fc_sdpa_bwd_support(&b, cc_major, cc_minor), FC_OK);
        b.fwd.causal = 1;
        CHECK_STATUS("bwd mask, causal, forced sm80", fc_sdpa_bwd_support(&b, cc_major, cc_minor), FC_UNSUPPORTED_MASK);
        /* A bool mask in tiles (rows a multiple of 16 bytes apart) with causal: the Hopper
         * family's causal masked variant (D=64 / 128 / 256), never the sm80-class family's; a softcap
         * with it, rows TMA cannot tile, or determinism, declined. */
        b = valid_bwd_params();
        b_mask(&b);
        b.fwd.mask_stride_k = 1;
        b.fwd.mask_stride_q = 304;
        b.fwd.mask_stride_h = 0;
        b.fwd.mask_stride_b = 100 * 304;
        b.fwd.causal = 1;
        if (hopper_built) {
            CHECK_STATUS("bwd mask tiles, causal", fc_sdpa_bwd_support(&b, 9, 0), FC_OK);
            CHECK_FAMILY("bwd family: mask tiles, causal", fc_sdpa_bwd_family(&b, 9, 0), FC_FAMILY_SM90);
            b.fwd.softcap = 30.0f;
            CHECK_STATUS("bwd mask tiles, causal, softcap", fc_sdpa_bwd_support(&b, 9, 0), FC_UNSUPPORTED_MASK);
            b.fwd.softcap = 0.0f;
            b.fwd.mask_stride_q = 300;
            b.fwd.mask_stride_b = 100 * 300;
            CHECK_STATUS("bwd mask, 300-byte rows, causal", fc_sdpa_bwd_support(&b, 9, 0), FC_UNSUPPORTED_MASK);
            b.fwd.mask_stride_q = 304;
            b.fwd.mask_stride_b = 100 * 304;
            b_deterministic(&b);
            CHECK_STATUS("bwd mask tiles, causal, deterministic", fc_sdpa_bwd_support(&b, 9, 0), FC_UNSUPPORTED_MASK);
            b.deterministic = 0;
            if (!fc_test_left_out(256, b.fwd.dtype)) {  /* D=256's kernel: the same rule */
                fc_bwd_params b256 = b;
                b256.fwd.head_dim = 256;
                fc_bwd_params_set_contiguous_strides(&b256);
                CHECK_STATUS("bwd mask tiles, causal, D=256", fc_sdpa_bwd_support(&b256, 9, 0), FC_OK);
                CHECK_FAMILY("bwd family: mask tiles, causal, D=256", fc_sdpa_bwd_family(&b256, 9, 0), FC_FAMILY_SM90);
            }
        }
        if (ada_built)
            CHECK_STATUS("bwd mask tiles, causal: Ada", fc_sdpa_bwd_support(&b, 8, 9), FC_UNSUPPORTED_MASK);
        b_force_sm80(&b);
        CHECK_STATUS("bwd mask tiles, causal, forced sm80", fc_sdpa_bwd_support(&b, cc_major, cc_minor), FC_UNSUPPORTED_MASK);
    }
    /* A softcap: the sm90 family without a mask; the sm80-class family with or without one
     * (there with dQ in a pass of its own, fc_sm80_bwd_one_pass). */
    {
        fc_bwd_params b = valid_bwd_params();
        b.fwd.softcap = 30.0f;
        if (hopper_built)
            CHECK_FAMILY("bwd softcap: family", fc_sdpa_bwd_family(&b, 9, 0), FC_FAMILY_SM90);
        if (ada_built)
            CHECK_FAMILY("bwd softcap: family, Ada", fc_sdpa_bwd_family(&b, 8, 9), FC_FAMILY_SM80);
        b_force_sm80(&b);
        CHECK_STATUS("bwd softcap, forced sm80", fc_sdpa_bwd_support(&b, cc_major, cc_minor),
                     hopper_built || ada_built ? FC_OK : FC_UNSUPPORTED_ARCH);
        b.fwd.softcap = 30.0f;
        b.fwd.family = FC_FAMILY_AUTO;
        b_mask(&b);
        if (hopper_built || ada_built)
            CHECK_FAMILY("bwd softcap, mask: family", fc_sdpa_bwd_family(&b, cc_major, cc_minor), FC_FAMILY_SM80);
        if (hopper_built) {
            b_force_sm90(&b);
            CHECK_STATUS("bwd softcap, mask, forced sm90", fc_sdpa_bwd_support(&b, 9, 0), FC_UNSUPPORTED_SOFTCAP);
        }
    }
    /* D=32 / 80 / 96: the sm80-class family's kernels on either card (the Hopper family has
     * none of them), masks included. */
    {
        fc_bwd_params b = valid_bwd_params();
        b_head_dim_96(&b);
        if ((hopper_built || ada_built) && !fc_test_left_out(96, b.fwd.dtype)) {
            CHECK_FAMILY("bwd head dim 96: family", fc_sdpa_bwd_family(&b, cc_major, cc_minor), FC_FAMILY_SM80);
            b_deterministic(&b);
            CHECK_FAMILY("bwd head dim 96, deterministic: family", fc_sdpa_bwd_family(&b, cc_major, cc_minor),
                         FC_FAMILY_SM80);
            b.deterministic = 0;
            b_mask(&b);
            CHECK_STATUS("bwd head dim 96, mask", fc_sdpa_bwd_support(&b, cc_major, cc_minor), FC_OK);
            if (hopper_built) {
                b_force_sm90(&b);
                CHECK_STATUS("bwd head dim 96, forced sm90", fc_sdpa_bwd_support(&b, 9, 0), FC_UNSUPPORTED_HEAD_DIM);
            }
        }
    }
    check_bwd_head_dim_256(hopper_built, ada_built, cc_major, cc_minor);
    CHECK_STATUS("bwd NULL params: validate", fc_bwd_params_validate(NULL), FC_ERR_NULL_PARAMS);
    CHECK_STATUS("bwd NULL params: support", fc_sdpa_bwd_support(NULL, 9, 0), FC_ERR_NULL_PARAMS);
    CHECK_STATUS("bwd NULL params: launch", fc_sdpa_bwd(NULL, 0), FC_ERR_NULL_PARAMS);
    fc_bwd_params b = valid_bwd_params();
    int64_t bytes = -1;
    CHECK_STATUS("bwd workspace size: NULL out", fc_sdpa_bwd_workspace_size(&b, NULL), FC_ERR_NULL_POINTER);
    CHECK_STATUS("bwd workspace size", fc_sdpa_bwd_workspace_size(&b, &bytes), FC_OK);
    /* Enough for either family: the sm80-class one's row terms and (in one pass: D=64 or 128, not
     * deterministic) its fp32 dq accumulator, or (where an sm90 kernel is built) the Hopper family's padded row terms, fp32 dq
     * accumulator, tile counter (16 bytes) and per-head counts (4 bytes each), rounded up to 16
     * bytes. */
    const int64_t rows = b.fwd.batch * b.fwd.heads_q * b.fwd.seqlen_q;
    const int64_t sm80_bytes = ((2 * 4 * rows + 15) / 16 * 16 + rows * b.fwd.head_dim * 4 + 15) / 16 * 16;
    const int64_t padded = (b.fwd.seqlen_q + 63) / 64 * 64;
    const int64_t sm90_bytes =
        (b.fwd.batch * b.fwd.heads_q * padded * (2 + b.fwd.head_dim + 8) * 4 + 16 + 4 * b.fwd.batch * b.fwd.heads_q + 15) /
        16 * 16;
    if (b.deterministic != 0 || b.fwd.head_dim != 64 ||
        bytes != (hopper_built && sm90_bytes > sm80_bytes ? sm90_bytes : sm80_bytes)) {
        fprintf(stderr, "FAIL bwd workspace size %lld\n", (long long)bytes);
        ++failures;
    }
    /* Deterministic: the sm80-class family's row terms alone (no accumulator). */
    b.deterministic = 1;
    CHECK_STATUS("bwd workspace size, deterministic", fc_sdpa_bwd_workspace_size(&b, &bytes), FC_OK);
    if (bytes != (hopper_built && sm90_bytes > 8 * rows ? sm90_bytes : (8 * rows + 15) / 16 * 16)) {
        fprintf(stderr, "FAIL bwd workspace size, deterministic %lld\n", (long long)bytes);
        ++failures;
    }
    b.deterministic = 0;
    b.dq = NULL;
    CHECK_STATUS("bwd validates before touching the GPU", fc_sdpa_bwd(&b, 0), FC_ERR_NULL_POINTER);
}

int main(void) {
    /* Build-dependent expectations: a library built without sm_90a code cannot run on Hopper. */
    fc_params probe = valid_params();
    if (fc_test_left_out(probe.head_dim, probe.dtype)) { /* a trimmed build: probe with D=64 */
        probe.head_dim = 64;
        fc_params_set_contiguous_strides(&probe);
    }
    const int hopper_built = fc_sdpa_support(&probe, 9, 0) == FC_OK;
    const int ada_built = fc_sdpa_support(&probe, 8, 9) == FC_OK;
    printf("library runs on: %s%s\n", hopper_built ? "sm_90 " : "", ada_built ? "sm_89" : "");
    if (!hopper_built && !ada_built) {
        fprintf(stderr, "FAIL library has no kernel for sm_89 or sm_90\n");
        ++failures;
    }

    for (size_t i = 0; i < sizeof(kCases) / sizeof(kCases[0]); ++i) {
        const validation_case *c = &kCases[i];
        fc_params p = valid_params();
        c->mutate(&p);
        char label[96];
        snprintf(label, sizeof label, "%s: validate", c->label);
        CHECK_STATUS(label, fc_params_validate(&p), c->want_validate);
        if (hopper_built && c->want_validate == FC_OK && fc_test_left_out(p.head_dim, p.dtype)) {
            printf("skip %s: sm_90 (this build left its kernel out)\n", c->label);
        } else if (hopper_built) {
            snprintf(label, sizeof label, "%s: sm_90", c->label);
            CHECK_STATUS(label, fc_sdpa_support(&p, 9, 0), c->want_hopper);
        }
        snprintf(label, sizeof label, "%s: sm_80", c->label);
        CHECK_STATUS(label, fc_sdpa_support(&p, 8, 0), c->want_ampere);
        /* A call AUTO declines on Hopper as slower than PyTorch's SDPA runs in the sm80 family
         * on Ada, on Hopper when it wants the LSE, and forced there (the rule is AUTO's, on sm_90,
         * for calls without an LSE only). */
        if (c->want_hopper == FC_UNSUPPORTED_SLOWER_MASK && !fc_test_left_out(p.head_dim, p.dtype)) {
            /* (a decode-sized call runs in the decode kernels there instead: additive masks, which
             * they leave to PyTorch on Hopper) */
            const fc_family runs = p.seqlen_q <= 16 && p.heads_q / p.heads_kv * p.seqlen_q <= 32 &&
                                           (p.head_dim == 64 || p.head_dim == 128) && !p.causal
                                       ? FC_FAMILY_DECODE
                                       : FC_FAMILY_SM80;
            if (ada_built) {
                snprintf(label, sizeof label, "%s: sm_89", c->label);
                CHECK_FAMILY(label, fc_sdpa_family(&p, 8, 9), runs);
            }
            if (hopper_built) {
                fc_params with_lse = p, forced = p;
                m_lse(&with_lse);
                snprintf(label, sizeof label, "%s: sm_90 with lse", c->label);
                CHECK_STATUS(label, fc_sdpa_support(&with_lse, 9, 0), FC_OK);
                CHECK_FAMILY(label, fc_sdpa_family(&with_lse, 9, 0), runs);
                m_force_sm80(&forced);
                snprintf(label, sizeof label, "%s: sm_90 forced sm80", c->label);
                CHECK_STATUS(label, fc_sdpa_support(&forced, 9, 0), FC_OK);
                CHECK_FAMILY(label, fc_sdpa_family(&forced, 9, 0), FC_FAMILY_SM80);
            }
        }
    }

    /* Which family AUTO picks per head dim: on Hopper the sm90 family keeps 64/128/256, and 32,
     * 80, 96 (sm80 only) are left to PyTorch's faster cuDNN path (none: FC_FAMILY_AUTO); with a
     * mask the sm90 family takes it at 64/128/256 when its tiles fit TMA (masked 2: m_mask_tiles),
     * and every other masked call that wants the LSE runs in sm80 (masked 1: m_bool_mask_bhqk's
     * 300-byte rows, with an LSE). Without the LSE such calls are left to PyTorch's SDPA (none)
     * at 64/128/256 (masked 3: m_bool_mask_bhqk), and at every head dim when the mask is broadcast
     * over the query rows (masked 4: m_key_padding). On Ada everything runs in sm80. Sq = 4 with
     * GQA 4 would go to the decode kernel for 64/128. */
    {
        static const struct { int64_t d; int masked; fc_family hopper; } kDims[] = {
            {32, 0, FC_FAMILY_AUTO}, {64, 0, FC_FAMILY_SM90}, {80, 0, FC_FAMILY_AUTO},
            {96, 0, FC_FAMILY_AUTO}, {128, 0, FC_FAMILY_SM90}, {256, 0, FC_FAMILY_SM90},
            {32, 1, FC_FAMILY_SM80}, {64, 1, FC_FAMILY_SM80}, {80, 1, FC_FAMILY_SM80},
            {96, 1, FC_FAMILY_SM80}, {128, 1, FC_FAMILY_SM80}, {256, 1, FC_FAMILY_SM80},
            {32, 2, FC_FAMILY_SM80}, {64, 2, FC_FAMILY_SM90}, {80, 2, FC_FAMILY_SM80},
            {96, 2, FC_FAMILY_SM80}, {128, 2, FC_FAMILY_SM90}, {256, 2, FC_FAMILY_SM90},
            {32, 3, FC_FAMILY_SM80}, {64, 3, FC_FAMILY_AUTO}, {80, 3, FC_FAMILY_SM80},
            {96, 3, FC_FAMILY_SM80}, {128, 3, FC_FAMILY_AUTO}, {256, 3, FC_FAMILY_AUTO},
            {32, 4, FC_FAMILY_AUTO}, {64, 4, FC_FAMILY_AUTO}, {80, 4, FC_FAMILY_AUTO},
            {96, 4, FC_FAMILY_AUTO}, {128, 4, FC_FAMILY_AUTO}, {256, 4, FC_FAMILY_AUTO}};
        static const char *const kMaskedNames[] = {"", " masked, lse", " masked (tiles)", " masked, no lse",
                                                   " masked (key padding), no lse"};
        for (size_t i = 0; i < sizeof(kDims) / sizeof(kDims[0]); ++i) {
            fc_params p = valid_params();
            p.head_dim = kDims[i].d;
            fc_params_set_contiguous_strides(&p);
            if (kDims[i].masked == 1) m_bool_mask_bhqk_lse(&p);
            if (kDims[i].masked == 2) m_mask_tiles(&p);
            if (kDims[i].masked == 3) m_bool_mask_bhqk(&p);
            if (kDims[i].masked == 4) m_key_padding(&p);
            char label[96];
            snprintf(label, sizeof label, "D=%lld%s", (long long)kDims[i].d, kMaskedNames[kDims[i].masked]);
            if (fc_test_left_out(kDims[i].d, p.dtype)) {
                printf("skip %s: this build left its kernel out\n", label);
                continue;
            }
            const struct { int built, major, minor; fc_family want; } devs[] = {
                {hopper_built, 9, 0, kDims[i].hopper}, {ada_built, 8, 9, FC_FAMILY_SM80}};
            for (size_t j = 0; j < 2; ++j) {
                if (!devs[j].built) continue;
                const fc_family got = fc_sdpa_family(&p, devs[j].major, devs[j].minor);
                if (got != devs[j].want) {
                    fprintf(stderr, "FAIL %s on sm_%d%d: family %d, want %d\n", label, devs[j].major,
                            devs[j].minor, (int)got, (int)devs[j].want);
                    ++failures;
                } else {
                    printf("ok   %-40s sm_%d%d family %d\n", label, devs[j].major, devs[j].minor, (int)got);
                }
            }
        }
    }

    /* On Hopper, AUTO runs a masked call in the sm90 family where it takes the mask (a bool mask
     * in TMA-sized tiles, D=64 / 128 / 256, no band, softcap or sinks, top-left causal or none),
     * decode-sized calls in
     * the decode kernels (any mask, no causal), else in the sm80 family: at D=64 / 128 for calls that
     * want the LSE or have a causal flag, softcap (or a band or sinks, which no family takes with
     * a mask); others it leaves to PyTorch's SDPA (none: FC_UNSUPPORTED_SLOWER_MASK). */
    if (hopper_built && fc_test_left_out(valid_params().head_dim, FC_DTYPE_FP16)) {
        printf("skip masked calls on sm_90 (auto): this build left its kernel out\n");
    } else if (hopper_built) {
        static const struct { const char *label; mutate_fn mutate; fc_family want; } kMasked[] = {
            {"masked call on sm_90 (auto), 300-byte rows, lse", m_bool_mask_bhqk_lse, FC_FAMILY_SM80},
            {"masked call on sm_90 (auto), additive, lse", m_mask_lse, FC_FAMILY_SM80},
            {"masked call on sm_90 (auto), 300-byte rows, no lse", m_bool_mask_bhqk, FC_FAMILY_AUTO},
            {"masked call on sm_90 (auto), additive, no lse", m_mask, FC_FAMILY_AUTO},
            {"masked call on sm_90 (auto), tiles", m_mask_tiles, FC_FAMILY_SM90},
            {"mask tiles, forced sm90", m_mask_tiles_force_sm90, FC_FAMILY_SM90},
            {"mask tiles, broadcast (B, H), forced", m_mask_tiles_broadcast_force_sm90, FC_FAMILY_SM90},
            {"mask tiles, decode-sized call (auto)", m_mask_tiles_decode_shape, FC_FAMILY_DECODE},
            {"mask tiles, causal (auto)", m_mask_tiles_causal, FC_FAMILY_SM90},
            {"mask tiles, softcap (auto)", m_mask_tiles_softcap, FC_FAMILY_SM80},
            {"mask tiles, K/V broadcast, lse (auto)", m_mask_tiles_broadcast_kv_lse, FC_FAMILY_SM80},
            {"mask tiles, K/V broadcast, no lse (auto)", m_mask_tiles_broadcast_kv, FC_FAMILY_AUTO},
        };
        for (size_t i = 0; i < sizeof(kMasked) / sizeof(kMasked[0]); ++i) {
            fc_params p = valid_params();
            kMasked[i].mutate(&p);
            CHECK_FAMILY(kMasked[i].label, fc_sdpa_family(&p, 9, 0), kMasked[i].want);
        }
    }

    /* A paged one-row call over many pairs and a long cache stays in the decode kernels (the
     * unpaged one goes to the Hopper family there: sm90_reads_decode_faster). */
    if (hopper_built && !fc_test_left_out(128, FC_DTYPE_FP16)) {
        fc_params p = valid_params();
        p.batch = 64;
        p.heads_q = p.heads_kv = 8;
        p.seqlen_k = 8192;
        m_paged(&p);
        p.pages_per_seq = 8192 / 16;
        p.block_table_stride = p.pages_per_seq;
        p.num_pages = 64 * 512;
        CHECK_FAMILY("paged, 64 x 8 pairs x 8192 keys (sm_90)", fc_sdpa_family(&p, 9, 0), FC_FAMILY_DECODE);
        p.block_table = NULL;
        p.seqused_k = NULL;
        p.page_size = p.pages_per_seq = 0;
        p.block_table_stride = p.num_pages = 0;
        fc_params_set_contiguous_strides(&p);
        CHECK_FAMILY("same call unpaged (sm_90)", fc_sdpa_family(&p, 9, 0), FC_FAMILY_SM90);
    }

    CHECK_STATUS("NULL params: validate", fc_params_validate(NULL), FC_ERR_NULL_PARAMS);
    CHECK_STATUS("NULL params: support", fc_sdpa_support(NULL, 9, 0), FC_ERR_NULL_PARAMS);
    CHECK_STATUS("NULL params: fwd", fc_sdpa_fwd(NULL, 0), FC_ERR_NULL_PARAMS);
    {
        fc_params p = valid_params();
        p.q = NULL;
        CHECK_STATUS("fwd validates before touching the GPU", fc_sdpa_fwd(&p, 0), FC_ERR_NULL_POINTER);
    }

    check_plan();
    check_bwd();

    /* Every status has its own, non-empty message; out-of-range values get a fallback text. */
    for (int s = 0; s < FC_STATUS_COUNT_; ++s) {
        const char *msg = fc_status_string((fc_status)s);
        if (msg == NULL || msg[0] == '\0' || strcmp(msg, "unknown fc_status value") == 0) {
            fprintf(stderr, "FAIL status %d has no message\n", s);
            ++failures;
        }
        for (int t = 0; t < s; ++t)
            if (strcmp(msg, fc_status_string((fc_status)t)) == 0) {
                fprintf(stderr, "FAIL statuses %d and %d share a message\n", t, s);
                ++failures;
            }
    }
    if (strcmp(fc_status_string((fc_status)-1), "unknown fc_status value") != 0 ||
        strcmp(fc_status_string(FC_STATUS_COUNT_), "unknown fc_status value") != 0) {
        fprintf(stderr, "FAIL out-of-range status not reported as unknown\n");
        ++failures;
    }

    if (failures) {
        fprintf(stderr, "%d check(s) failed\n", failures);
        return 1;
    }
    printf("all validation checks passed\n");
    return 0;
}
