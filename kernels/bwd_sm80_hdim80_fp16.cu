// bwd_sm80_hdim80_fp16.cu - one instantiation of the sm80-class backward (see bwd_sm80.cuh):
// head dim 80, fp16, causal and non-causal. One per file so builds run in parallel and can
// be trimmed with FLASHCORE_HEAD_DIMS / FLASHCORE_DTYPES.
#include "bwd_sm80.cuh"

FLASHCORE_DEFINE_SM80_BWD(80, fp16, __half)
