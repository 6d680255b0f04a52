// fwd_sm90_hdim256_bf16.cu - one instantiation of the Hopper forward (see fwd_sm90.cuh):
// head dim 256, bf16, causal and non-causal. Built for sm_90a only.
#include "fwd_sm90.cuh"

FLASHCORE_DEFINE_SM90_FWD(256, bf16, __nv_bfloat16)
