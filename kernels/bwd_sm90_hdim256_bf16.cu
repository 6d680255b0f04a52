// bwd_sm90_hdim256_bf16.cu - one instantiation of the Hopper backward (see sm90/bwd_d256.cuh):
// head dim 256, bf16, causal and non-causal. Built for sm_90a only.
#include "sm90/bwd_launch.cuh"

FLASHCORE_DEFINE_SM90_BWD(256, bf16, __nv_bfloat16)
