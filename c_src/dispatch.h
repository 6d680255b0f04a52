/*
 * dispatch.h - internal: the table of compiled kernels and the choice of kernel family, for the
 * library's C files (no kernel includes it: the launchers read launch_rules.h and runtime.h).
 * Not part of the public API (flashcore.h is).
 */
#ifndef FLASHCORE_DISPATCH_H
#define FLASHCORE_DISPATCH_H

#include "flashcore.h"
#include "launch_rules.h"
#include "runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The tensors' own batch and row dims: a packed call (fc_params.cu_seq_q) has one "batch item"
 * of total_q query rows and total_k key rows; any other call its batch, seqlen_q, seqlen_k. */
static inline int64_t fc_tensor_batch(const fc_params *p) { return p->cu_seq_q != NULL ? 1 : p->batch; }
static inline int64_t fc_tensor_rows_q(const fc_params *p) { return p->cu_seq_q != NULL ? p->total_q : p->seqlen_q; }
static inline int64_t fc_tensor_rows_k(const fc_params *p) { return p->cu_seq_q != NULL ? p->total_k : p->seqlen_k; }

/* Every kernel instantiation exposes one launcher of this type (kernels/fwd_*_hdim*_*.cu): the
 * call's params as planned, and the device it runs on, as the C layer found it for the call. */
typedef cudaError_t (*fc_launch_fn)(const fc_params *p, const fc_device_facts *dev, cudaStream_t stream);

/*
 * Pick the launcher for validated params on a device of compute capability cc_major.cc_minor.
 * Returns FC_OK and sets *launch, *family and *packs (each if not NULL), or the FC_UNSUPPORTED_*
 * reason. *packs: whether the chosen family runs the call with its GQA rows packed (the Hopper
 * family and fc_decode_packs_for_sm90; the plan then applies fc_pack_decode_gqa). That check
 * builds and checks a packed copy, so a call works it out once, here, where the choice of family
 * may already have needed it, and the plan takes the answer from here instead of asking again.
 */
fc_status fc_dispatch(const fc_params *p, int cc_major, int cc_minor, fc_launch_fn *launch,
                      fc_family *family, int *packs);

/* The Hopper family's grid split for one-row decoding over few pairs (1: none); see dispatch.c.
 * `packs`: fc_decode_packs_for_sm90(p), as fc_dispatch answered it for the call. */
int fc_sm90_decode_splits(const fc_params *p, int sm_count, int forced, int packs);
/* A GQA call of one query row without a causal mask, run in the Hopper family, goes as one block
 * of `group` rows per KV head (fc_pack_decode_gqa rewrites sizes and strides to that equivalent
 * call: K/V are then read once per KV head), unless a packed slice would pass the kernels' int
 * offsets. See sm90_reads_decode_faster in dispatch.c. For validated (resolved) params; the
 * library asks it at most once per call, through fc_dispatch. fc_pack_decode_gqa returns 0 and
 * leaves p as it was where a packed head stride would pass int64. */
int fc_decode_packs_for_sm90(const fc_params *p);
int fc_pack_decode_gqa(fc_params *p);

/* On the library's own copy of a validated struct, before anything reads `causal`: a band that is
 * every key (NONE) or plain top-left causal (CAUSAL) becomes exactly that (causal 0 or 1, no
 * window, top-left), so the kernels without a band path run it; any other band (GENERAL) keeps
 * its numbers in band_lo_ / band_hi_ and sets causal = 1, so that every rule that treats a causal
 * call as masked (decode packing, split heuristics) treats it so. Idempotent. */
void fc_resolve_band_(fc_params *p);

/* For c_src/bwd.c (defined in flashcore.c): the stride / alignment / offset checks of one
 * (B, H, S, D) operand as fc_params_validate applies them. */
fc_status fc_check_operand_(const int64_t size[4], const int64_t stride[4], const void *base,
                            int64_t elem_bytes);
/* Defined in flashcore.c, for fc_decode_packs_for_sm90: would validation, having accepted a
 * struct, accept `packed`, its fc_pack_decode_gqa equivalent? (The checks packing can change.) */
int fc_packed_rows_valid_(const fc_params *packed);
/* Defined in flashcore.c: how many times fc_params_validate ran on this thread (the tests count
 * one validation per planned call; exported for them, not part of the API). */
unsigned long long fc_validations_on_thread_(void);
/* Defined in dispatch.c: does this library hold machine code of `family` for the device? */
int fc_family_runs_on_(fc_family family, int cc_major, int cc_minor);
/* Defined in dispatch.c: can the Hopper family's TMA tensor maps take these strides and scale? */
int fc_sm90_takes_layout_(const fc_params *p);
/* Defined in dispatch.c, for both passes: does the Hopper family read this call's bool mask in
 * TMA tiles (the forward's kMasked, the backward's kMaskBoolTiles), causal or not? */
int fc_sm90_bool_mask_tiles_(const fc_params *p);

#ifdef __cplusplus
}
#endif

#endif /* FLASHCORE_DISPATCH_H */
