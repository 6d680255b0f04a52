// fwd_sm80_hdim80_fp16.cu - one instantiation of the sm80-class forward (see fwd_sm80.cuh):
// head dim 80, fp16, causal and non-causal. One per file so builds run in parallel and can
// be trimmed with FLASHCORE_HEAD_DIMS / FLASHCORE_DTYPES.
#include "fwd_sm80.cuh"

FLASHCORE_DEFINE_SM80_FWD(80, fp16, __half)
