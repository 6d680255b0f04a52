/*
 * flashcore.h - the public C API of FlashCore, a fused scaled-dot-product attention forward.
 *
 * Computes, for every batch b and query head h,
 *     out[b, h] = softmax(scale * q[b, h] @ k[b, h / (Hq / Hkv)]^T + mask) @ v[b, h / (Hq / Hkv)]
 * in one kernel (QK^T, online softmax in fp32, PV), with nothing of size Sq x Sk in device
 * memory. Semantics follow torch.nn.functional.scaled_dot_product_attention: `causal` is
 * top-left aligned (query i sees keys 0..i) when Sq != Sk; a query row that the mask (with
 * `causal`) leaves no key gives zeros and LSE -inf, as PyTorch's SDPA does.
 *
 * Usage from C (no PyTorch needed):
 *     fc_params p;
 *     fc_params_init(&p);                      // zeroes the struct, sets defaults
 *     p.q = dq; p.k = dk; p.v = dv; p.out = dout;
 *     p.batch = B; p.heads_q = Hq; p.heads_kv = Hkv; p.seqlen_q = Sq; p.seqlen_k = Sk;
 *     p.head_dim = D; p.scale = 1.0f / sqrtf(D); p.dtype = FC_DTYPE_FP16;
 *     fc_params_set_contiguous_strides(&p);    // or fill the *_stride_* fields yourself
 *     fc_status s = fc_sdpa_fwd(&p, stream);
 *     if (s != FC_OK) fprintf(stderr, "%s\n", fc_status_string(s));
 *
 * Rules: the library never allocates, never synchronizes and never exits. Every field is
 * validated before anything is launched; a failing call returns a status and launches nothing.
 */
#ifndef FLASHCORE_H
#define FLASHCORE_H

#include <stdint.h>
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FLASHCORE_VERSION_MAJOR 0
#define FLASHCORE_VERSION_MINOR 1

typedef enum fc_dtype {
    FC_DTYPE_FP16 = 0,
    FC_DTYPE_BF16 = 1,
    FC_DTYPE_FP32 = 2, /* describable, so the support query can name it; no kernel takes it */
} fc_dtype;

/* Which kernel family to run. AUTO picks the best one for the device; the others force a
 * family (for testing and timing the sm80 family on Hopper) and fail if it cannot run. */
typedef enum fc_family {
    FC_FAMILY_AUTO = 0,
    FC_FAMILY_SM80 = 1, /* mma.sync + cp.async: sm_89 (Ada), also built for sm_90 */
    FC_FAMILY_SM90 = 2, /* TMA + wgmma + warp specialization: sm_90a */
    FC_FAMILY_DECODE = 3, /* split-KV decoding for Sq <= 16 and (Hq/Hkv)*Sq <= 32; sm_89, sm_90 */
} fc_family;

/* Kinds of attention mask, a (B, Hq, Sq, Sk) view through mask_stride_* (any strides, 0 for
 * a broadcast dim, no alignment requirement). Which forward family takes which mask
 * (dispatch.c, family_takes_mask): the sm80 family any; the decode kernels any, without
 * `causal`; the sm90 family bool masks whose tiles TMA can read (D = 64 / 128 / 256, no band,
 * softcap or sinks; `causal` top-left only). A forced family that does not take the call's mask gives
 * FC_UNSUPPORTED_MASK (the backward: see fc_bwd_params). A mask may be combined with `causal`
 * (PyTorch forbids that; here both apply). */
typedef enum fc_mask_kind {
    FC_MASK_NONE = 0,
    FC_MASK_BOOL = 1,     /* uint8/bool, nonzero = attend */
    FC_MASK_ADDITIVE = 2, /* same dtype as q, added to the scaled scores (-inf = masked) */
} fc_mask_kind;

/* Every outcome of a call. fc_status_string() gives a sentence for each. FC_ERR_* other than
 * FC_ERR_CUDA mean the struct is inconsistent (a caller bug); FC_UNSUPPORTED_* mean the struct
 * is valid but no kernel covers it (the op falls back). (New statuses go at the end.) */
typedef enum fc_status {
    FC_OK = 0,
    FC_ERR_NULL_PARAMS,          /* the params pointer is NULL */
    FC_ERR_NULL_POINTER,         /* q, k, v or out is NULL, or lse/mask NULL while requested */
    FC_ERR_NEGATIVE_DIM,         /* a size is negative */
    FC_UNSUPPORTED_EMPTY,        /* a size is zero: nothing to launch, the caller handles it */
    FC_ERR_HEADS_NOT_DIVISIBLE,  /* heads_q is not a multiple of heads_kv */
    FC_ERR_LAST_DIM_STRIDE,      /* a tensor's head_dim stride is not 1 */
    FC_ERR_STRIDE_ALIGNMENT,     /* a batch/head/seq stride is not a multiple of 16 bytes */
    FC_ERR_POINTER_ALIGNMENT,    /* q, k, v or out is not 16-byte aligned */
    FC_ERR_NEGATIVE_STRIDE,      /* a stride is negative */
    FC_ERR_BAD_DTYPE,            /* dtype is not an fc_dtype value */
    FC_ERR_BAD_MASK_KIND,        /* mask_kind is not an fc_mask_kind value */
    FC_ERR_BAD_FAMILY,           /* family is not an fc_family value */
    FC_ERR_BAD_WORKSPACE,        /* workspace_bytes negative, or workspace misaligned (16 bytes); backward: missing or too small */
    FC_ERR_BAD_SCALE,            /* scale is NaN or infinite */
    FC_ERR_OFFSET_OVERFLOW,      /* an element offset (q, k, v, out, lse or mask) exceeds what the kernels index (2^31-1) */
    FC_UNSUPPORTED_DTYPE,        /* valid dtype, but no kernel for it (fp32) */
    FC_UNSUPPORTED_HEAD_DIM,     /* no kernel for this head_dim */
    FC_UNSUPPORTED_MASK,         /* a mask the (forced) family does not take (family_takes_mask, dispatch.c) */
    FC_UNSUPPORTED_ARCH,         /* no kernel family for this compute capability */
    FC_UNSUPPORTED_FAMILY,       /* the forced family is not built or cannot run on this device */
    FC_UNSUPPORTED_LAYOUT,       /* the forced family cannot take these strides or this scale (sm90: broadcast dim, scale <= 0) */
    FC_UNSUPPORTED_SLOWER,       /* AUTO on sm_90, no mask, a head dim only the sm80 family has: PyTorch's cuDNN path is faster */
    FC_ERR_CUDA,                 /* a CUDA runtime call or the launch failed (see fc_last_cuda_error) */
    FC_ERR_BAD_WINDOW,           /* windowed with window_left or window_right below -1, alignment not an fc_alignment, or band_* set */
    FC_UNSUPPORTED_BAND,         /* a window or bottom-right causal band that no family here runs (sm90, decode; not with a mask) */
    FC_UNSUPPORTED_SINKS,        /* attention sinks with a family that has none (the sm90 forward alone takes them) */
    FC_ERR_BAD_SOFTCAP,          /* softcap negative, NaN or infinite */
    FC_UNSUPPORTED_SOFTCAP,      /* a logit softcap with a family that has none (forward: sm90 without a mask, sm80; backward: sm90 without a mask) */
    FC_UNSUPPORTED_SLOWER_MASK,  /* AUTO on sm_90, an attn_mask only the sm80 family takes, no LSE wanted: PyTorch's SDPA is faster (dispatch.c) */
    FC_ERR_BAD_PAGES,            /* paged KV arguments inconsistent (see fc_params.block_table) */
    FC_UNSUPPORTED_PAGED,        /* a valid paged call no kernel takes (only the decode family reads pages: no causal, band, mask; no backward) */
    FC_ERR_BAD_VARLEN,           /* packed variable-length arguments inconsistent (see fc_params.cu_seq_q) */
    FC_UNSUPPORTED_VARLEN,       /* a valid packed call no kernel takes (only the sm90 family, forward and backward: no window, mask, softcap, sinks or pages) */
    FC_STATUS_COUNT_             /* number of statuses; not a status */
} fc_status;

/* Where the diagonal lies when seqlen_q != seqlen_k, for `causal` and for the window. */
typedef enum fc_alignment {
    FC_ALIGN_TOP_LEFT = 0,     /* query i's diagonal key is i (PyTorch's is_causal, causal_upper_left) */
    FC_ALIGN_BOTTOM_RIGHT = 1, /* query i's diagonal key is i + seqlen_k - seqlen_q (FlashAttention's;
                                * causal_lower_right; the last query sees the last key) */
} fc_alignment;

/*
 * One attention call. Tensors are (batch, heads, seqlen, head_dim) in any strides whose last
 * dim is contiguous; strides are in elements, not bytes. A broadcast dim may have stride 0.
 */
typedef struct fc_params {
    /* device pointers */
    const void *q;   /* (B, Hq,  Sq, D) */
    const void *k;   /* (B, Hkv, Sk, D) */
    const void *v;   /* (B, Hkv, Sk, D) */
    void *out;       /* (B, Hq,  Sq, D), same dtype as q */
    float *lse;      /* optional (B, Hq, Sq) fp32 natural-log log-sum-exp; NULL = not written */
    const void *mask;/* optional (B, Hq, Sq, Sk), see mask_kind; ignored when mask_kind == FC_MASK_NONE */

    int64_t batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim;

    int64_t q_stride_b, q_stride_h, q_stride_s, q_stride_d;
    int64_t k_stride_b, k_stride_h, k_stride_s, k_stride_d;
    int64_t v_stride_b, v_stride_h, v_stride_s, v_stride_d;
    int64_t o_stride_b, o_stride_h, o_stride_s, o_stride_d;
    int64_t lse_stride_b, lse_stride_h, lse_stride_s;
    int64_t mask_stride_b, mask_stride_h, mask_stride_q, mask_stride_k; /* elements; 0 = broadcast */

    float scale;        /* multiplies q.k; PyTorch's default is 1/sqrt(head_dim) */
    int causal;         /* nonzero: query i attends to no key past its diagonal key d(i): i
                         * (top-left, the default) or as `alignment` below says */
    fc_dtype dtype;     /* of q, k, v and out */
    fc_mask_kind mask_kind;
    fc_family family;   /* FC_FAMILY_AUTO unless forcing a family */

    /* Optional scratch for split-KV decoding (see fc_sdpa_workspace_size): device memory the
     * library may use during the call. NULL or too small: the decode kernels run unsplit, and
     * the Hopper family splits a one-row call over few pairs in clusters instead (slower). */
    void *workspace;
    int64_t workspace_bytes;

    int num_splits_; /* internal: set by the library on its own copy; callers leave it 0 */

    /* (Fields below were appended after 0.1; earlier fields keep their offsets.) */
    /* Sliding window (FlashAttention's window_size): with `windowed` nonzero, query i sees only
     * keys d(i) - window_left .. d(i) + window_right, -1 meaning unbounded on that side; with
     * `causal` too, nothing past d(i). A row that sees no key gives zeros and LSE -inf. Zero
     * (the default) means no window. */
    int windowed;
    int64_t window_left, window_right;
    fc_alignment alignment; /* of causal and the window; FC_ALIGN_TOP_LEFT (0) by default */
    /* Attention sinks (gpt-oss): optional (heads_q,) fp32 device array, one natural-log logit per
     * query head added to every row's softmax denominator (a key with no value): out =
     * sum_j e^{s_j} v_j / (sum_j e^{s_j} + e^{sink}), and the LSE includes it. NULL = none.
     * The sm90 forward alone takes them (elsewhere FC_UNSUPPORTED_SINKS); -inf = no sink. */
    const float *sinks;

    /* internal, set by the library on its own copy (fc_resolve_band_); callers leave them 0 */
    int band_;               /* 0 unresolved; then FC_BAND_NONE_ / _CAUSAL_ / _GENERAL_ (dispatch.h) */
    int band_lo_, band_hi_;  /* query i sees keys i + band_lo_ .. i + band_hi_ (fc_band_bounds) */

    /* (Appended after the internal fields: earlier fields keep their offsets.) */
    /* Logit softcap (Gemma 2; FlashAttention's softcap): every scaled score s becomes
     * softcap * tanh(s / softcap) before masking and the softmax, the LSE included. 0 (the
     * default) = none; otherwise finite and > 0 (else FC_ERR_BAD_SOFTCAP). The sm90 family alone
     * takes it (forward and backward, without a mask; elsewhere FC_UNSUPPORTED_SOFTCAP). */
    float softcap;

    /* (Appended after softcap: earlier fields keep their offsets.) */
    /* Paged KV cache (PyTorch's varlen_attn / FlashAttention's block_table). NULL (the default)
     * means not paged: k and v are (B, Hkv, Sk, D) as above, and every field below must be 0.
     * Non-NULL: k and v are pools of pages, (num_pages, page_size, Hkv, D) in any strides whose
     * last dim is contiguous, described by the k/v stride fields read as k_stride_b = the page
     * stride, k_stride_s = the row stride within a page, k_stride_h = the head stride (v alike).
     * Key token t of batch item b is row t % page_size of page
     * block_table[b * block_table_stride + t / page_size] (an int32 device array the host never
     * reads). Batch item b has min(seqlen_k, seqused_k[b]) keys (seqused_k NULL: seqlen_k each;
     * a negative entry counts as 0); an item with no key gives zeros and LSE -inf, as a fully
     * masked row. Requirements (else FC_ERR_BAD_PAGES): page_size a positive multiple of 16,
     * pages_per_seq >= 1 with pages_per_seq * page_size >= seqlen_k, num_pages in [1, 2^31 - 1],
     * block_table_stride >= pages_per_seq (when batch > 1), the table's extent addressable; the
     * table and seqused_k 4-byte aligned (else FC_ERR_POINTER_ALIGNMENT). The kernels clamp
     * every page index into [0, num_pages): a bad table entry gives wrong rows, never an
     * out-of-bounds read. Only the decode family runs paged calls (Sq <= 16, (Hq / Hkv) * Sq <= 32,
     * D 64 / 128, no causal, band, mask, softcap or sinks); every other paged call gives
     * FC_UNSUPPORTED_PAGED, the backward included. */
    const int32_t *block_table;   /* (B, >= pages_per_seq) int32, rows block_table_stride apart */
    int64_t block_table_stride;   /* elements between batch items' rows of the table */
    int32_t pages_per_seq;        /* table entries read per batch item (ceil(seqlen_k / page_size) suffices) */
    int32_t page_size;            /* keys per page: a multiple of 16 */
    int64_t num_pages;            /* pages in the pools k and v (the clamp's bound) */
    const int32_t *seqused_k;     /* optional (B,) int32 device array: keys used per batch item */

    /* (Appended after the paged fields: earlier fields keep their offsets.) */
    /* Packed variable-length sequences (PyTorch's varlen_attn, FlashAttention's cu_seqlens). NULL
     * cu_seq_q (the default) means not packed, and cu_seq_k, total_q and total_k must be 0.
     * Non-NULL: the batch's `batch` sequences lie end to end along the rows of q, out and the
     * LSE (total_q rows) and of k and v (total_k rows): sequence b's queries are rows
     * cu_seq_q[b] .. cu_seq_q[b + 1] - 1 and its keys rows cu_seq_k[b] .. cu_seq_k[b + 1] - 1
     * (int32 device arrays of batch + 1 entries the host never reads). Row r of q is at
     * q + r * q_stride_s + h * q_stride_h (k, v, out alike); the LSE, when wanted, is (Hq,
     * total_q) through lse_stride_h and lse_stride_s; every batch stride must be 0. seqlen_q
     * and seqlen_k bound the sequences' lengths (max_q, max_k; the kernels do not rely on them).
     * `causal` is top-left within each sequence (query i sees keys 0 .. i: the same as PyTorch's
     * bottom-right varlen causal where a sequence has as many queries as keys). A sequence with
     * queries and no key gives zeros and LSE -inf. Requirements (else FC_ERR_BAD_VARLEN): both
     * arrays, total_q and total_k >= 1, batch strides 0. The kernels clamp every offset into
     * [0, total]: wrong offsets give wrong rows, never an access outside the tensors. The call
     * needs its workspace (fc_sdpa_workspace_size; else FC_ERR_BAD_WORKSPACE): the list of the
     * sequences' query blocks, built on the device. The sm90 forward runs packed calls (fp16/bf16,
     * D 64/128/256, no window or bottom-right band, mask, softcap, sinks or pages), and so does
     * the sm90 backward (D 64/128, not `deterministic`): dout, dq, dk and dv then lie along the
     * packed rows as q and k do (no batch stride), dlse as the LSE. Every other packed call gives
     * FC_UNSUPPORTED_VARLEN. */
    const int32_t *cu_seq_q;
    const int32_t *cu_seq_k;
    int64_t total_q, total_k;
} fc_params;

/* Zero every field, then set scale = 0 (caller must set it), family = AUTO, mask NONE. */
void fc_params_init(fc_params *p);

/* Fill every stride for contiguous (B, H, S, D) tensors from the sizes already set. */
void fc_params_set_contiguous_strides(fc_params *p);

/*
 * The keys query row i sees under `causal`, the window and the alignment: i + *lo .. i + *hi,
 * clipped to 0 .. seqlen_k - 1. Unbounded sides come out as lo = -(seqlen_q - 1) and
 * hi = seqlen_k - 1, so two ways of asking for the same band give the same numbers. Returns
 * FC_BAND_ALL (0) when that is every key, FC_BAND_TOP_LEFT_CAUSAL (1) when it is plain top-left
 * causal (what every kernel runs), FC_BAND_OTHER (2) otherwise (only the sm90 forward runs it;
 * elsewhere FC_UNSUPPORTED_BAND), or -1 for sizes below 1 or a window below -1. Plain values,
 * so that bindings without the struct (Python's ctypes) can ask too; window -1 = unbounded.
 */
enum { FC_BAND_ALL = 0, FC_BAND_TOP_LEFT_CAUSAL = 1, FC_BAND_OTHER = 2 };
int fc_band_bounds(int64_t seqlen_q, int64_t seqlen_k, int causal, int64_t window_left, int64_t window_right,
                   fc_alignment alignment, int64_t *lo, int64_t *hi);

/* A sentence describing the status; never NULL. */
const char *fc_status_string(fc_status status);

/* Check the struct alone: FC_OK when every field is consistent, else the first problem. */
fc_status fc_params_validate(const fc_params *p);

/*
 * Would fc_sdpa_fwd run a kernel for these params on a device of compute capability
 * cc_major.cc_minor? Returns FC_OK if so, otherwise the validation error or the
 * FC_UNSUPPORTED_* reason. Needs no GPU and touches no pointer.
 */
fc_status fc_sdpa_support(const fc_params *p, int cc_major, int cc_minor);

/* The kernel family fc_sdpa_fwd would run (FC_FAMILY_AUTO if none), for reporting. */
fc_family fc_sdpa_family(const fc_params *p, int cc_major, int cc_minor);

/* Launch the forward on `stream` (on the current device). Asynchronous: returns once the
 * kernel is queued. Returns FC_OK, a validation/support status, or FC_ERR_CUDA. */
fc_status fc_sdpa_fwd(const fc_params *p, cudaStream_t stream);

/*
 * Bytes of workspace fc_sdpa_fwd can use for these params on the current device (0 when the
 * chosen kernel needs none). Allocate that much, set p->workspace / p->workspace_bytes, and
 * keep it alive until the call has run on its stream. Sets *bytes; returns a status.
 */
fc_status fc_sdpa_workspace_size(const fc_params *p, int64_t *bytes);

/*
 * A forward call decided once, for callers that run it right after asking about it (the
 * PyTorch op): validated, its kernel family and launcher, the split count, the workspace it can
 * use and the GQA packing, for a device of compute capability cc_major.cc_minor with sm_count
 * SMs. fc_sdpa_fwd_planned then launches it without validating or dispatching again, with the
 * call's own output, LSE and workspace pointers: the plan may be made with stand-ins for those
 * (any address of the same alignment; nothing is read through them), and its LSE is written
 * exactly when the planned struct had one (which the choice of kernel may read). fc_sdpa_fwd is
 * fc_sdpa_plan on the current device followed by fc_sdpa_fwd_planned.
 */
typedef struct fc_fwd_plan {
    fc_params params;        /* the call as it will launch: band resolved, GQA rows packed */
    fc_family family;        /* the kernel family that runs it */
    int splits;              /* key-range splits when the workspace allows (1: none) */
    int64_t workspace_bytes; /* what the splits need (0: no workspace) */
    void (*launch_)(void);   /* internal: the kernel's launcher */
} fc_fwd_plan;

/* Fills *plan; returns FC_OK, or the status fc_sdpa_support would give (the plan then launches
 * nothing: fc_sdpa_fwd_planned returns FC_ERR_NULL_POINTER for it). */
fc_status fc_sdpa_plan(const fc_params *p, int cc_major, int cc_minor, int sm_count, fc_fwd_plan *plan);

/*
 * Launches a plan on `stream` (the current device must be the one planned for) with the call's
 * out (16-byte aligned), lse (read only when planned with one; then non-NULL and 4-byte aligned)
 * and workspace (NULL or 16-byte aligned, workspace_bytes of it; less than plan->workspace_bytes
 * runs unsplit, same result). Returns FC_OK, FC_ERR_NULL_POINTER, FC_ERR_POINTER_ALIGNMENT,
 * FC_ERR_BAD_WORKSPACE or FC_ERR_CUDA.
 */
fc_status fc_sdpa_fwd_planned(const fc_fwd_plan *plan, void *out, float *lse, void *workspace,
                              int64_t workspace_bytes, cudaStream_t stream);

/* The CUDA error behind the last FC_ERR_CUDA returned on this thread (cudaSuccess if none). */
cudaError_t fc_last_cuda_error(void);

/* ---- backward (c_src/bwd.c, kernels/bwd_sm80.cuh) -------------------------------------------
 *
 * Gradients of out = softmax(scale * q k^T [+ mask] [causal]) v, given dout (and optionally the
 * gradient of the LSE), from the forward's saved natural-log LSE (recomputation, FlashAttention-2
 * style); the mask itself gets no gradient:
 *     dq (B, Hq, Sq, D), dk (B, Hkv, Sk, D), dv (B, Hkv, Sk, D)
 * GQA: dk and dv are summed over each KV head's group of query heads. Every element of dq, dk and
 * dv is written (keys no query sees, e.g. causal with Sk > Sq, get zeros).
 * Two kernel families; no dropout:
 *   - sm80-class (mma.sync + cp.async; sm_89, and sm_90 by the same code). At D=64 and 128,
 *     unless `deterministic` is set, one pass with dq summed through fp32 atomics in any order
 *     (its last bits may vary from run to run); otherwise dq in a pass of its own and no atomics,
 *     so two calls on the same inputs give bitwise equal gradients (fc_sm80_bwd_one_pass,
 *     launch_rules.h). Takes a mask (bool or additive, any strides, read element by element)
 *     when the call is not causal.
 *   - sm90 (TMA + wgmma, sm_90a; head dims 64, 128 and 256): one pass over key blocks, dq summed
 *     in fp32 through bulk reductions in any order, so dq may differ in its last bits from run to
 *     run (dk, dv do not). Takes a mask (bool or additive, any strides, as the forward) when the
 *     call is not causal, or a bool mask TMA can read in tiles (fc_mask_tiles_fit_'s layout) with
 *     top-left causal (no softcap; the blocks above the diagonal skipped, the mask
 *     applied to the rest), and a band (a window or bottom-right causal; not with a mask); at
 *     D=256 (a kernel of its own, packed rows too) no softcap with an additive mask
 *     (FC_UNSUPPORTED_SOFTCAP). The
 *     sm80-class family declines a band (FC_UNSUPPORTED_BAND), so a deterministic call with one
 *     is declined too.
 *     AUTO picks it on sm_90 unless `deterministic` is set.
 *
 * Usage:
 *     fc_bwd_params b;
 *     fc_bwd_params_init(&b);
 *     b.fwd = <the forward's fc_params, with fwd.out and fwd.lse set>;
 *     b.dout = ddo; b.dq = ddq; b.dk = ddk; b.dv = ddv;
 *     fc_bwd_params_set_contiguous_strides(&b);   // or fill the strides (dout's too)
 *     fc_sdpa_bwd_workspace_size(&b, &bytes);    // allocate that much: b.workspace(_bytes)
 *     fc_status s = fc_sdpa_bwd(&b, stream);
 */
typedef struct fc_bwd_params {
    /* q, k, v, out (the forward's output), lse (required here), sizes and their strides, scale,
     * causal, dtype, the mask (either family, not causal; sm90: a bool mask in tiles with causal
     * too, see above); family AUTO, SM80 or SM90.
     * fwd.workspace is not used. */
    fc_params fwd;

    const void *dout;   /* (B, Hq, Sq, D) gradient of out, same dtype */
    void *dq;           /* (B, Hq, Sq, D) written */
    void *dk;           /* (B, Hkv, Sk, D) written */
    void *dv;           /* (B, Hkv, Sk, D) written */
    const float *dlse;  /* optional (B, Hq, Sq) fp32 gradient of the LSE; NULL = zero */

    int64_t do_stride_b, do_stride_h, do_stride_s, do_stride_d;
    int64_t dq_stride_b, dq_stride_h, dq_stride_s, dq_stride_d;
    int64_t dk_stride_b, dk_stride_h, dk_stride_s, dk_stride_d;
    int64_t dv_stride_b, dv_stride_h, dv_stride_s, dv_stride_d;
    int64_t dlse_stride_b, dlse_stride_h, dlse_stride_s;

    /* Nonzero: the gradients must be bitwise reproducible (PyTorch's
     * torch.use_deterministic_algorithms); AUTO then takes the sm80-class family, in its
     * deterministic form (dq in a pass of its own). */
    int deterministic;

    /* Required device scratch of at least fc_sdpa_bwd_workspace_size bytes, 16-byte aligned
     * (per-row fp32 terms, and an fp32 dq accumulator for the sm90 family and the sm80-class
     * family's one pass). Missing or too
     * small: FC_ERR_BAD_WORKSPACE. */
    void *workspace;
    int64_t workspace_bytes;
} fc_bwd_params;

/* fc_params_init(&p->fwd) and every other field zeroed. */
void fc_bwd_params_init(fc_bwd_params *p);

/* fc_params_set_contiguous_strides(&p->fwd), then contiguous strides for dout, dq, dk, dv and
 * dlse from the sizes already set. */
void fc_bwd_params_set_contiguous_strides(fc_bwd_params *p);

/* Check the struct alone: FC_OK or the first problem (the forward's checks on p->fwd first,
 * then lse/dout/dq/dk/dv present, their strides, alignment and offsets, dlse, workspace). */
fc_status fc_bwd_params_validate(const fc_bwd_params *p);

/* Would fc_sdpa_bwd run a kernel for these params on compute capability cc_major.cc_minor?
 * FC_OK, a validation status, or FC_UNSUPPORTED_* (dtype, head dim, mask, arch, family).
 * Needs no GPU; does not look at the workspace size. */
fc_status fc_sdpa_bwd_support(const fc_bwd_params *p, int cc_major, int cc_minor);

/* The kernel family fc_sdpa_bwd would run on cc_major.cc_minor (FC_FAMILY_AUTO if none). */
fc_family fc_sdpa_bwd_family(const fc_bwd_params *p, int cc_major, int cc_minor);

/* Bytes of workspace fc_sdpa_bwd needs for these params (sizes only: enough for whichever
 * family runs them). Sets *bytes. */
fc_status fc_sdpa_bwd_workspace_size(const fc_bwd_params *p, int64_t *bytes);

/* Launch the backward on `stream` (current device): three kernels, asynchronous. Returns FC_OK,
 * a validation/support status, FC_ERR_BAD_WORKSPACE, or FC_ERR_CUDA. */
fc_status fc_sdpa_bwd(const fc_bwd_params *p, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* FLASHCORE_H */
