// decode_sm80_hdim64_fp16.cu - one instantiation of the split-KV decode kernel (see
// decode_sm80.cuh): head dim 64, fp16, causal and non-causal.
#include "decode_sm80.cuh"

FLASHCORE_DEFINE_DECODE(64, fp16, __half)
