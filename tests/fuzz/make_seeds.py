"""Writes the seed corpus of tests/fuzz/fuzz_params.c, and one reproducer per known bug.

Usage: python3 tests/fuzz/make_seeds.py SEED_DIR BUG_DIR   (ci/fuzz.sh calls it)

The encoder below mirrors decode_structured() / check_contiguous() in fuzz_params.c byte for
byte: mode byte (1 = structured, 3 = contiguous, 0 = raw struct), then the fields in order.
Seeds are valid structs in the layouts callers pass (contiguous, HuggingFace-transposed,
broadcast K/V, padded rows, GQA, causal, bf16, D=128, LSE) plus one of each rejection, so the
fuzzer starts on both sides of every check.
"""
import base64
import os
import struct
import sys

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1


def raw_i64(v):  # take_i64: selector 0xff, then 8 little-endian bytes
    return b"\xff" + struct.pack("<q", v)


def size(v):  # take_size: one byte below 0xc0 (0 means the field's default), else take_i64
    if 1 <= v < 0xC0:
        return bytes([v])
    return b"\xc0" + raw_i64(v)


def layout(kind, pad=0, strides=None):  # take_strides
    if kind == 4:
        return bytes([4, pad])
    if kind >= 5:
        sb, sh, ss, sd = strides
        return bytes([5]) + raw_i64(sb) + raw_i64(sh) + raw_i64(ss) + b"\x00" + raw_i64(sd)
    return bytes([kind])


def structured(device=0, **fields):
    return bytes([1]) + forward_fields(**fields) + bytes([device])


def forward_fields(B=2, Hkv=2, group=1, Sq=100, Sk=300, D=64, layouts=(0, 0, 0, 0), ptr_sel=(0, 0, 0, 0),
                   scale_sel=0, causal=0, dtype=0, family=0, mask_kind=0, lse=False, softcap=False, paging=b"",
                   packing=b""):
    """decode_structured()'s bytes (structured() and backward() add the mode and device bytes)."""
    out = size(B) + size(Hkv) + bytes([group - 1]) + size(Sq) + size(Sk)
    out += {64: b"\x00", 128: b"\x80"}.get(D) or (b"\xe0" + size(D))
    for lay in layouts:
        out += lay if isinstance(lay, bytes) else layout(lay)
    out += bytes(ptr_sel)
    out += bytes([scale_sel])
    out += bytes([causal | (dtype << 1)])
    extra = family | (mask_kind << 2)
    if mask_kind:
        extra |= 0x10
    if lse:
        extra |= 0x40
    out += bytes([extra])
    if mask_kind:
        out += b"\x00"  # mask pointer: aligned
    if lse:
        out += b"\x00\x00"  # lse pointer aligned, contiguous strides
    if paging or packing or softcap:
        # no window / alignment / sinks; a softcap of 0.125 or none; then the paging bytes and
        # the packing bytes (a 0 byte each when absent: the mode's next byte must not be read as
        # either)
        out += (b"\x40\x00" if softcap else b"\x00") + (paging or b"\x00") + (packing or b"\x00")
    return out


def packs(total_q=250, total_k=700, keep_layouts=False, workspace=True, any_workspace_bytes=None,
          cu_sel=(0, 0)):
    """decode_structured()'s packing bytes: both offset arrays (pointer selectors cu_sel), the
    totals (small sizes), the packed layout unless keep_layouts, a workspace of what the plan
    needs (or of any_workspace_bytes)."""
    flags = 1 | (8 if keep_layouts else 0) | (16 if workspace else 0) | (32 if any_workspace_bytes is not None else 0)
    out = bytes([flags]) + bytes(cu_sel) + size(total_q) + size(total_k)
    if workspace:
        out += b"\x00"  # workspace pointer: aligned
        if any_workspace_bytes is not None:
            out += raw_i64(any_workspace_bytes)
    return out


def pages(page_shift=0, need_delta=0, stride_margin=0, num_pages=64, table_sel=0, seqused=True, pools=True,
          raw_page_size=None):
    """decode_structured()'s paging bytes: a block table (pointer selector table_sel), pages of
    16 << page_shift keys (or raw_page_size through take_i64), pages_per_seq = what seqlen_k needs
    + need_delta (-1..1), the table's stride pages_per_seq + stride_margin, num_pages (1..256),
    seqused_k, K/V as contiguous (num_pages, page_size, Hkv, D) pools."""
    flags = 1 | (2 if raw_page_size is not None else 0) | (32 if seqused else 0) | (64 if pools else 0)
    out = bytes([flags, table_sel])
    out += raw_i64(raw_page_size) if raw_page_size is not None else bytes([page_shift])
    out += bytes([need_delta + 1, stride_margin, num_pages - 1])
    if seqused:
        out += b"\x00"
    return out


WS_ANSWER, WS_ANSWER_LESS, WS_SM80, WS_SM80_LESS, WS_SM90, WS_SM90_LESS, WS_ANY, WS_ZERO = range(8)


def backward(device=1, deterministic=0, keep_null_lse=False, grads=(None, None, None, None), dlse=False,
             dlse_strides=None, ws=WS_ANSWER, ws_ptr=0, **fields):
    """Mode 6, kind 0 (decode_bwd): the forward's fields, the backward's flags, dout/dq/dk/dv
    (None: the forward operand's strides -- out's for dout, q's, k's, v's -- else a take_strides
    layout as layout() writes it), dlse (contiguous unless dlse_strides (b, h, s); the LSE set
    when the forward has none and dlse contiguous are (Hq, total_q), batch stride 0, for a packed
    call), the workspace
    (pointer selector, size rule WS_*), the device (1: sm_90; check_bwd also runs sm_89 and sm_90
    whatever it is)."""
    flags = (1 if keep_null_lse else 0) | (2 if deterministic else 0) | (8 if dlse else 0) | (ws << 5)
    if dlse_strides is not None:
        flags |= 16
    # (The forward's trailing variant and paging bytes come first: without them decode_structured
    # read the flags as its variant byte, and everything after one byte early.)
    fields.setdefault("paging", b"\x00")
    out = bytes([6, 0]) + forward_fields(**fields) + bytes([flags])
    for lay in grads:
        if lay is None:
            out += b"\x00\x00"  # forward's strides, aligned pointer
        else:
            out += b"\x01" + (lay if isinstance(lay, bytes) else layout(lay)) + b"\x00"
    if dlse:
        out += b"\x00"  # dlse pointer aligned
        if dlse_strides is not None:
            out += b"".join(raw_i64(v) for v in dlse_strides)
    out += bytes([ws_ptr])
    if ws == WS_ANSWER_LESS:
        out += b"\x0f"  # 16 bytes short
    return out + bytes([device])


def contiguous(B=2, Hkv=2, group=1, Sq=100, Sk=300, D=64, dtype=0, device=0):
    return (bytes([3]) + size(B) + size(Hkv) + bytes([group - 1]) + size(Sq) + size(Sk) + size(D)
            + bytes([dtype, device]))


def raw_struct(B=1, Hq=1, Hkv=1, Sq=16, Sk=16, D=64):
    """Mode 0: the fc_params bytes themselves (x86-64 layout), a valid contiguous fp16 struct."""
    ptrs = [0x7F0000100000, 0x7F0000200000, 0x7F0000300000, 0x7F0000400000, 0, 0]
    q = [Hq * Sq * D, Sq * D, D, 1]
    kv = [Hkv * Sk * D, Sk * D, D, 1]
    strides = q + kv + kv + q + [0, 0, 0] + [0, 0, 0, 0]
    body = struct.pack("<6Q6q23qfiiii", *ptrs, B, Hq, Hkv, Sq, Sk, D, *strides, 0.125, 0, 0, 0, 0)
    return b"\x00" + body + b"\x00" * 4


SEEDS = {
    "valid_default": structured(),
    "valid_hf_layout": structured(layouts=(1, 1, 1, 0)),
    "valid_gqa_causal_bf16_d128": structured(Hkv=2, group=4, Sq=77, Sk=1000, D=128, causal=1, dtype=1),
    "valid_broadcast_kv": structured(B=4, layouts=(0, 2, 2, 0), device=1),
    "valid_kv_seq_broadcast": structured(layouts=(0, 3, 3, 0)),
    "valid_padded_rows": structured(layouts=(layout(4, pad=8), 0, 0, 0)),
    "valid_decode": structured(B=8, Hkv=8, group=4, Sq=1, Sk=4096, D=128),
    "valid_lse": structured(lse=True),
    "valid_forced_sm80": structured(family=1),
    "reject_misaligned_q": structured(ptr_sel=(0xC2, 0, 0, 0)),
    "reject_null_out": structured(ptr_sel=(0, 0, 0, 0xFE)),
    "reject_stride_align": structured(layouts=(layout(4, pad=1), 0, 0, 0)),
    "reject_fp32": structured(dtype=2),
    "reject_bad_dtype": structured(dtype=3),
    "reject_mask": structured(mask_kind=1),
    # A bool mask (strides 0: broadcast over every dim, the query rows too) under AUTO at D=96: on
    # sm_90 declined without an LSE (FC_UNSUPPORTED_SLOWER_MASK), run by the sm80 family with one,
    # or forced there.
    "mask_auto_no_lse_d96": structured(mask_kind=1, D=96, device=1),
    "mask_auto_lse_d96": structured(mask_kind=1, D=96, lse=True, device=1),
    "mask_forced_sm80_no_lse_d96": structured(mask_kind=1, D=96, family=1, device=1),
    "reject_scale_nan": structured(scale_sel=3),
    "reject_head_dim_40": structured(D=40),
    "valid_head_dim_80": structured(D=80),
    "valid_head_dim_96": structured(D=96),
    "valid_head_dim_32": structured(D=32),
    "reject_sm86": structured(device=3),
    "reject_force_sm90": structured(family=2),
    "reject_slice_overflow": structured(Sk=3, layouts=(0, layout(5, strides=(0, 0, 2**30, 1)), 0, 0)),
    # 65536 batches: past CUDA's grid z, so fc_sdpa_fwd launches in slices (reject_ before 2026-11-26)
    "valid_batch_65536_in_slices": structured(B=65536, layouts=(2, 2, 2, 2)),
    "reject_seqlen_q_int64_max": structured(B=1, Hkv=1, Sq=INT64_MAX, Sk=64, layouts=(3, 0, 0, 3)),
    "valid_seqlen_q_past_old_grid_y": structured(Sq=65535 * 64 + 1, layouts=(3, 0, 0, 3)),
    "valid_sm90_device_hf_layout": structured(layouts=(1, 1, 1, 1), device=1),
    "valid_sm90_device_broadcast_goes_sm80": structured(layouts=(0, 2, 2, 0), device=1),
    "reject_forced_sm90_negative_scale": structured(family=2, scale_sel=2, device=1),
    "contiguous_default": contiguous(),
    "contiguous_fp32_odd_d": contiguous(D=7, dtype=2),
    "contiguous_slice_past_int32": contiguous(B=1, Hkv=1, Sq=2**24, Sk=2**10, D=128),
    # fp32 q of 2.3e18 elements (the count fits int64, its 9.2e18 bytes do not): rightly rejected
    # as FC_ERR_OFFSET_OVERFLOW; check_contiguous once required FC_OK here (CI's fuzz run on
    # de6a4b8, 2026-11-27: the property was wrong, not c_src/).
    "contiguous_fp32_bytes_past_int64": contiguous(B=2, Hkv=620822572, Sq=3, Sk=2, D=620822572, dtype=2),
    "raw_valid": raw_struct(),
    "raw_empty": b"\x00",
    # The backward (mode 6, c_src/bwd.c): each runs on sm_89 and sm_90 stub devices.
    # AUTO on sm_90: the sm90 family (D=64 fp16), the workspace the size query answers.
    "bwd_valid_sm90": backward(lse=True),
    "bwd_valid_sm90_hf_layout_bf16_d128_causal": backward(D=128, dtype=1, causal=1, layouts=(1, 1, 1, 0),
                                                          grads=(1, 1, None, None), dlse=True),
    # torch.use_deterministic_algorithms(True): AUTO takes the sm80-class family on sm_90 too.
    "bwd_deterministic": backward(deterministic=1),
    # sm80-class need only: enough on sm_89, FC_ERR_BAD_WORKSPACE for the sm90 family on sm_90.
    "bwd_workspace_sm80_only": backward(ws=WS_SM80),
    "bwd_workspace_short": backward(ws=WS_ANSWER_LESS),
    "bwd_workspace_null": backward(ws_ptr=0xFE),
    # Forced sm90, dout broadcast over batch and heads (stride 0, as an expanded gradient): no TMA
    # map for it, FC_UNSUPPORTED_LAYOUT (AUTO would take the sm80-class family).
    "bwd_forced_sm90_dout_broadcast": backward(family=2, grads=(2, None, None, None)),
    "bwd_dout_broadcast": backward(grads=(2, None, None, None)),
    "bwd_forced_sm80": backward(family=1),
    # Forced sm90 and deterministic: the forced family runs (flashcore.h only says what AUTO does).
    "bwd_forced_sm90_deterministic": backward(family=2, deterministic=1),
    # GQA: 8 query heads on 2 KV heads, causal, Sq != Sk.
    "bwd_gqa": backward(Hkv=2, group=4, Sq=77, Sk=1000, D=128, causal=1),
    "bwd_reject_null_lse": backward(keep_null_lse=True),
    "bwd_reject_mask": backward(mask_kind=1),
    # D=256 (the sm90 family's kernel alone; its rule in c_src/bwd.c decides each): plain, a
    # softcap, a bool mask with and without one, an additive mask with one.
    "bwd_d256": backward(D=256, dtype=1),
    "bwd_d256_causal_softcap": backward(D=256, dtype=1, causal=1, softcap=True),
    "bwd_d256_bool_mask": backward(D=256, mask_kind=1),
    "bwd_d256_bool_mask_softcap": backward(D=256, mask_kind=1, softcap=True),
    "bwd_d256_additive_mask_softcap": backward(D=256, mask_kind=2, softcap=True),
    "bwd_reject_head_dim_96": backward(D=96),
    "bwd_reject_dlse_negative_stride": backward(dlse=True, dlse_strides=(200, 100, -1)),
    # 65536 batches: the forward runs them in slices, the backward's grids do not (yet).
    "bwd_reject_batch_65536": backward(B=65536, layouts=(2, 2, 2, 2)),
    # Huge seqlen_k: 1024 batches x 2 KV heads x 2^20 key blocks of 128 = 2^31 CTAs, one more than
    # the sm90 family's 1-D grid holds (sm80-class under AUTO, forced sm90 declined); 128 keys
    # fewer fits. K/V rows 16 bytes apart (overlapping) keep each slice inside 2^31 elements.
    "bwd_huge_seqlen_k_ctas_past_int32": backward(
        B=1024, Sq=64, Sk=2**27, layouts=(0, layout(5, strides=(16, 8, 8, 1)), layout(5, strides=(16, 8, 8, 1)), 0)),
    "bwd_huge_seqlen_k_ctas_past_int32_forced_sm90": backward(
        B=1024, Sq=64, Sk=2**27, family=2,
        layouts=(0, layout(5, strides=(16, 8, 8, 1)), layout(5, strides=(16, 8, 8, 1)), 0)),
    "bwd_huge_seqlen_k_ctas_int32": backward(
        B=1024, Sq=64, Sk=2**27 - 128,
        layouts=(0, layout(5, strides=(16, 8, 8, 1)), layout(5, strides=(16, 8, 8, 1)), 0)),
    "bwd_raw_empty": b"\x06\x01",
    # Paged KV (fc_params.block_table): decode-shaped calls run in the decode kernels (AUTO and
    # forced decode, sm_89 and sm_90, never the Hopper family); the rest FC_UNSUPPORTED_PAGED or
    # FC_ERR_BAD_PAGES.
    "paged_decode": structured(B=4, Hkv=2, group=4, Sq=1, Sk=1000, D=128, paging=pages(), device=1),
    "paged_decode_sm89_page_256_bf16_d64": structured(B=3, Hkv=4, group=2, Sq=1, Sk=700, D=64, dtype=1,
                                                      paging=pages(page_shift=4, stride_margin=3)),
    "paged_decode_rows_32": structured(B=2, Hkv=1, group=8, Sq=4, Sk=129, D=128, paging=pages(), device=1),
    "paged_decode_forced_decode_no_seqused": structured(B=2, Sq=2, Sk=64, family=3, paging=pages(seqused=False), device=1),
    "paged_decode_long_cache_stays_decode": structured(B=64, Hkv=8, Sq=1, Sk=8192, D=128, paging=pages(num_pages=256), device=1),
    "paged_decode_batch_65536_in_slices": structured(B=65536, Hkv=1, Sq=1, Sk=32, layouts=(2, 0, 0, 2),
                                                     paging=pages(), device=1),
    "paged_reject_page_size_24": structured(Sq=1, paging=pages(raw_page_size=24), device=1),
    "paged_reject_too_few_pages": structured(Sq=1, paging=pages(need_delta=-1), device=1),
    "paged_reject_null_table": structured(Sq=1, paging=pages(table_sel=0xFE), device=1),
    "paged_reject_misaligned_table": structured(Sq=1, paging=pages(table_sel=0xC2), device=1),
    "paged_reject_stray_page_size": structured(Sq=1, paging=b"\x80\x00", device=1),
    "paged_unsupported_prefill": structured(Sq=100, paging=pages(), device=1),
    "paged_unsupported_causal": structured(Sq=4, causal=1, paging=pages(), device=1),
    "paged_unsupported_forced_sm80": structured(Sq=1, family=1, paging=pages(), device=1),
    "paged_unsupported_mask": structured(Sq=1, mask_kind=1, paging=pages(), device=1),
    "bwd_paged_unsupported": backward(Sq=1, paging=pages()),
    # Packed sequences (fc_params.cu_seq_q): the sm90 family only (AUTO and forced sm90 on
    # sm_90; FC_UNSUPPORTED_VARLEN elsewhere and with a mask, pages or a forced sm80), never
    # split or sliced, FC_ERR_BAD_WORKSPACE without its workspace.
    "packed": structured(B=3, Hkv=2, group=4, Sq=100, Sk=300, D=128, packing=packs(), device=1),
    "packed_causal_d64": structured(B=3, Sq=100, Sk=100, causal=1, packing=packs(total_k=250), device=1),
    "packed_one_row_each": structured(B=5, Hkv=2, group=4, Sq=1, Sk=300, D=128, packing=packs(total_q=5), device=1),
    "packed_batch_70000": structured(B=70000, Sq=4, Sk=4, packing=packs(total_q=5000, total_k=5000), device=1),
    "packed_sm89": structured(B=3, packing=packs(), device=0),
    "packed_forced_sm80": structured(B=3, family=1, packing=packs(), device=1),
    "packed_mask": structured(B=3, mask_kind=1, packing=packs(), device=1),
    "packed_no_workspace": structured(B=3, packing=packs(workspace=False), device=1),
    "packed_small_workspace": structured(B=3, packing=packs(any_workspace_bytes=64), device=1),
    "packed_dense_layouts": structured(B=3, packing=packs(keep_layouts=True), device=1),
    "packed_null_cu_seq_k": structured(B=3, packing=packs(cu_sel=(0, 0xFE)), device=1),
    "packed_misaligned_cu_seq_q": structured(B=3, packing=packs(cu_sel=(0xC2, 0)), device=1),
    "packed_paged": structured(B=4, Hkv=2, group=4, Sq=1, Sk=1000, D=128, paging=pages(), packing=packs(), device=1),
    "packed_stray_total": structured(B=3, packing=b"\x80\x01", device=1),
    # The backward of packed calls: the sm90 family alone (AUTO on sm_90, D 64 / 128, the size
    # query's workspace: the sm90 need, no sm80-class term); FC_UNSUPPORTED_VARLEN under
    # `deterministic` (AUTO), with a forced sm80 and on sm_89. (fuzz_params.c's
    # check_bwd_packed_rule covers the rest: masks, softcap, sinks, batch strides, the int bound.)
    "bwd_packed": backward(B=3, packing=packs()),
    "bwd_packed_causal": backward(B=3, Sq=100, Sk=100, causal=1, packing=packs(total_k=250)),
    "bwd_packed_deterministic": backward(B=3, deterministic=1, packing=packs()),
    "bwd_packed_forced_sm80": backward(B=3, family=1, packing=packs()),
}

# Inputs that once broke a property checked with FC_FUZZ_STRICT=1 (see fuzz_params.c's header),
# all fixed in c_src/ (A-F 2026-11-26, G 2026-11-27, H 2026-11-29, I 2026-11-30): kept as seeds so the fuzzer starts from
# them every run.
FIXED_BUGS = {
    # A: accepted, but the sm80 kernel's int n_blocks = (seqlen_k + 63) / 64 overflows
    #    (device 0: sm_89; on sm_90 the sm90 family declines stride 0, so sm80 runs it too).
    "known_bug_A_seqlen_k_int32_max": structured(B=1, Hkv=1, Sq=64, Sk=INT32_MAX, layouts=(0, 3, 3, 0)),
    "known_bug_A_seqlen_k_int32_max_sm90_device": structured(B=1, Hkv=1, Sq=64, Sk=INT32_MAX,
                                                             layouts=(0, 3, 3, 0), device=1),
    # A: the same for seqlen_q (q and out with sequence stride 0): m_start + 64 overflows int.
    "known_bug_A_seqlen_q_int32_max": structured(B=1, Hkv=1, Sq=INT32_MAX, Sk=64, layouts=(3, 0, 0, 3)),
    # C: fc_params_set_contiguous_strides overflows int64 (heads * seqlen * head_dim).
    "known_bug_C_contiguous_strides_overflow": contiguous(B=1, Hkv=2**31, Sq=2**31, Sk=2**31, D=64),
    # D: element offsets fit int64, byte addresses wrap: k batch stride 2^63 - 2^40 elements, B = 2
    #    (last element at byte 2^64 - 2^41 past a pointer near 2^47).
    "known_bug_D_byte_offset_wraps": structured(
        B=2, layouts=(0, layout(5, strides=(2**63 - 2**40, 0, 64, 1)), 0, 0)),
    # E: k batch stride 2^40 elements (2^41 bytes), B = 2, on an sm_90 device: the sm90 family
    #    takes it, and its TMA tensor map cannot (strides must be below 2^40 bytes).
    "known_bug_E_tma_stride_2_40": structured(
        B=2, layouts=(0, layout(5, strides=(2**40, 300 * 64, 64, 1)), 0, 0), device=1),
    # F: a one-row GQA call on an sm_90 device, packed for the Hopper family (fc_pack_decode_gqa)
    #    with query heads 2^29 elements apart: the packed slice (8 rows) passes 2^31 elements.
    #    Found by CI's fuzz run on 5ea693d (67044095 query heads 64 apart); such calls now run unpacked.
    "known_bug_F_packed_decode_slice_past_int32": structured(
        B=1, Hkv=1, group=8, Sq=1, Sk=300,
        layouts=(layout(5, strides=(8 * 2**29, 2**29, 64, 1)), 0, 0, 0), family=2, device=1),
    # G: fc_bwd_params_validate's dlse check counted the elements as total + 1 without an overflow
    #    check: signed overflow when dlse's largest element offset is INT64_MAX, here
    #    (B - 1) * dlse_stride_b with B = 2. Found by the first backward fuzz run (seed 20261126).
    "known_bug_G_dlse_offset_int64_max": backward(dlse=True, dlse_strides=(INT64_MAX, 0, 0)),
    # H: fc_pack_decode_gqa multiplied the head strides by the group without an overflow check: a
    #    one-row GQA call (group 2) with no lse and an lse head stride near INT64_MAX (not
    #    validated when lse is NULL). Found after the forty-ninth session's dispatch.c edit moved
    #    the fixed-seed run onto it (the fuzzer's raw bytes); such calls now run unpacked.
    "known_bug_H_packed_decode_stride_overflow": base64.b64decode(
        "AQMEAQHA/7wCAAAAAAAAAAAAAAAGAAMCAGTA/v8AIQAAAAAAAAACACBhAAAA"),
    # I: a sinks pointer near the top of the address space (0xff..f0) on a call of 19857404 query
    #    heads, launched in slices of 65535 heads: sinks + h0 wrapped (UBSan pointer overflow in
    #    launch_slice); validation now checks the last sink's address as the block table's.
    #    Found by a random-seed run in the fifty-third session (seed 7798).
    "known_bug_I_sinks_address_wraps": base64.b64decode("cQHB//z/LgEAAAAAAAEBAAFZAAAACAA4AAAANgD9FhQBAAAAAQA="),
}
SEEDS.update({name.replace("known_bug_", "fixed_bug_"): data for name, data in FIXED_BUGS.items()})
# One reproducer per bug still open (FC_FUZZ_STRICT=1 runs each and reports it).
KNOWN_BUGS = {}  # none open


def main():
    seed_dir, bug_dir = sys.argv[1], sys.argv[2]
    for folder, table in ((seed_dir, SEEDS), (bug_dir, KNOWN_BUGS)):
        os.makedirs(folder, exist_ok=True)
        for name, data in table.items():
            with open(os.path.join(folder, name), "wb") as f:
                f.write(data)
    print(f"make_seeds: {len(SEEDS)} seeds in {seed_dir}, {len(KNOWN_BUGS)} known-bug inputs in {bug_dir}")


if __name__ == "__main__":
    main()
