// reasons.h - the one list of the op layer's reason codes (why no kernel runs a call), their
// sentences, the bases that carry an fc_status, and the kernel families' names. Used by
// flashcore_op.cpp (explain), flashcore_bwd_op.cpp (explain_bwd) and op_common.h (set_mask);
// python/flashcore reads the sentences, names and bases at run time through the plain C
// functions flashcore_op.cpp exports (fc_op_reason_string, ...; see exports.map), never a copy.
//
// A reason code, as explain / explain_bwd return it:
//   0                      a kernel runs the call (kKernel)
//   1 .. kStatusBase-1     an op-level reason, FC_OP_REASONS below
//   kStatusBase + s        fallback because fc_sdpa_support (fc_sdpa_bwd_support) said fc_status s;
//                          the sentence is the C layer's fc_status_string(s)
//   kNoteBase + s          (explain only) a kernel runs, in the sm80 family, although the sm90
//                          family runs on this device: fc_sdpa_support said fc_status s for sm90
//                          (e.g. FC_UNSUPPORTED_MASK: only the sm80 family applies attn_mask)
// Codes are never renumbered: tests and callers compare them.
#pragma once

#include <cstdint>

#include "flashcore.h"

// Who gives a reason (FC_OP_REASONS' third column; fc_op_reason_given_by returns it).
#define FC_OP_REASON_FWD 1    // torch.ops.flashcore.explain (flashcore_op.cpp)
#define FC_OP_REASON_BWD 2    // torch.ops.flashcore.explain_bwd (flashcore_bwd_op.cpp)
#define FC_OP_REASON_ROUTE 4  // only the training route in python/flashcore/_ops.py

// X(code, C++ name, given by, sentence, the backward's sentence where its wording differs, else
// nullptr). python/flashcore/_ops.py looks codes up by C++ name (fc_op_reason_code).
#define FC_OP_REASONS(X)                                                                          \
  X(1, kNotCuda, FC_OP_REASON_FWD | FC_OP_REASON_BWD,                                             \
    "a tensor is not on a CUDA device", nullptr)                                                  \
  X(2, kNot4D, FC_OP_REASON_FWD | FC_OP_REASON_BWD | FC_OP_REASON_ROUTE,                          \
    "query, key and value are not all 4-D (batch, heads, seq_len, head_dim)", nullptr)            \
  X(3, kShapeBroadcast, FC_OP_REASON_FWD | FC_OP_REASON_BWD | FC_OP_REASON_ROUTE,                 \
    "sizes need broadcasting (batch, heads or key/value length differ)", nullptr)                 \
  X(4, kValueHeadDim, FC_OP_REASON_FWD | FC_OP_REASON_BWD,                                        \
    "value's head dim differs from query's", nullptr)                                             \
  X(5, kHeadsNoGqa, FC_OP_REASON_FWD | FC_OP_REASON_BWD,                                          \
    "query and key/value head counts differ and enable_gqa is False", nullptr)                    \
  X(6, kDropout, FC_OP_REASON_FWD, "dropout_p > 0", nullptr)                                      \
  /* the backward kernels have no float32, the forward's do */                                    \
  X(7, kDtype, FC_OP_REASON_FWD | FC_OP_REASON_BWD,                                               \
    "dtype is not float16, bfloat16 or float32", "dtype is not float16 or bfloat16")              \
  X(8, kMaskDtype, FC_OP_REASON_FWD | FC_OP_REASON_BWD,                                           \
    "attn_mask is a float mask whose dtype differs from query's", nullptr)                        \
  X(9, kMaskShape, FC_OP_REASON_FWD | FC_OP_REASON_BWD,                                           \
    "attn_mask does not broadcast to (batch, heads, seq_len_q, seq_len_k)", nullptr)              \
  X(10, kMaskDevice, FC_OP_REASON_FWD | FC_OP_REASON_BWD,                                         \
    "attn_mask is on a different device than query", nullptr)                                     \
  X(11, kBwdOperands, FC_OP_REASON_BWD,                                                           \
    "grad_out, out, lse or grad_lse do not match query (shape or dtype)", nullptr)                \
  /* route only: the C++ ops never return 12. _ops.training_route gives it for an attn_mask     \
     that requires grad, whose gradient only the Python backward computes */                      \
  X(12, kMaskRequiresGrad, FC_OP_REASON_ROUTE,                                                    \
    "an attn_mask that requires grad: the backward kernels give it none", nullptr)                \
  X(13, kSinksLayout, FC_OP_REASON_FWD,                                                           \
    "sinks are not a contiguous float32 (heads_q,) tensor on query's device", nullptr)             \
  /* flashcore_op.cpp, decode_left_to_cudnn */                                                    \
  X(14, kCudnnDecodes, FC_OP_REASON_FWD,                                                          \
    "decoding over many (batch, KV head) pairs (one row, or 2-16 rows without GQA), which "        \
    "PyTorch's SDPA runs in cuDNN here as fast or faster (H200 0.83-0.99x, H100 0.99-1.01x "       \
    "cuDNN's time; PERFORMANCE.md); calls that want the LSE still run the kernel; force the "      \
    "family (FLASHCORE_FAMILY=sm90 for one row, decode for more) to run it",                       \
    nullptr)

// X(fc_family, name): the names explain, FLASHCORE_FAMILY and error messages use.
#define FC_OP_FAMILIES(X)                                                   \
  X(FC_FAMILY_AUTO, "auto") X(FC_FAMILY_SM80, "sm80") X(FC_FAMILY_SM90, "sm90") \
  X(FC_FAMILY_DECODE, "decode")

namespace flashcore_op {
namespace reason {

enum Code : int64_t {
  kKernel = 0,
#define FC_OP_REASON_ENUM(code, name, by, sentence, bwd_sentence) name = code,
  FC_OP_REASONS(FC_OP_REASON_ENUM)
#undef FC_OP_REASON_ENUM
};
constexpr int64_t kStatusBase = 100;
constexpr int64_t kNoteBase = 1000;

struct Info {
  int64_t code;
  const char* name;
  int given_by;  // FC_OP_REASON_* bits
  const char* sentence;
  const char* bwd_sentence;  // nullptr: the same as sentence
};

inline constexpr Info kInfos[] = {
#define FC_OP_REASON_INFO(code, name, by, sentence, bwd_sentence) \
  {code, #name, by, sentence, bwd_sentence},
    FC_OP_REASONS(FC_OP_REASON_INFO)
#undef FC_OP_REASON_INFO
};

// The list's entry for code, or nullptr.
constexpr const Info* find(int64_t code) {
  for (const Info& i : kInfos)
    if (i.code == code) return &i;
  return nullptr;
}

constexpr bool list_is_sound() {
  for (const Info& i : kInfos) {
    if (i.code <= kKernel || i.code >= kStatusBase || find(i.code) != &i) return false;
    if (i.given_by == 0 || i.sentence == nullptr || i.sentence[0] == '\0') return false;
    if (i.bwd_sentence != nullptr && i.bwd_sentence[0] == '\0') return false;
  }
  return kStatusBase < kNoteBase;
}
static_assert(list_is_sound(), "FC_OP_REASONS: each code unique, in 1 .. kStatusBase-1, given by "
                               "someone, with a sentence");

}  // namespace reason

// The family's name ("auto", "sm80", "sm90", "decode"), or nullptr for a value fc_family lacks.
constexpr const char* family_name(int64_t family) {
#define FC_OP_FAMILY_CASE(value, name) \
  if (family == value) return name;
  FC_OP_FAMILIES(FC_OP_FAMILY_CASE)
#undef FC_OP_FAMILY_CASE
  return nullptr;
}

}  // namespace flashcore_op
