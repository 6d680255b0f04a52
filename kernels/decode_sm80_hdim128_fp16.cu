// decode_sm80_hdim128_fp16.cu - one instantiation of the split-KV decode kernel (see
// decode_sm80.cuh): head dim 128, fp16, causal and non-causal.
#include "decode_sm80.cuh"

FLASHCORE_DEFINE_DECODE(128, fp16, __half)
