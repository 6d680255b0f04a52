// decode_sm80_hdim128_bf16.cu - one instantiation of the split-KV decode kernel (see
// decode_sm80.cuh): head dim 128, bf16, causal and non-causal.
#include "decode_sm80.cuh"

FLASHCORE_DEFINE_DECODE(128, bf16, __nv_bfloat16)
