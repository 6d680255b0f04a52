// fwd_sm90_hdim256_fp16.cu - one instantiation of the Hopper forward (see fwd_sm90.cuh):
// head dim 256, fp16, causal and non-causal. Built for sm_90a only.
#include "fwd_sm90.cuh"

FLASHCORE_DEFINE_SM90_FWD(256, fp16, __half)
