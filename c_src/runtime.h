/*
 * runtime.h - internal: what the C layer and the kernels' launchers ask of the CUDA runtime
 * (defined in flashcore.c): the current device, its compute capability and SM count (cached;
 * any output may be NULL), and where a launcher leaves the CUDA error behind an FC_ERR_CUDA
 * (fc_last_cuda_error, flashcore.h, returns it).
 */
#ifndef FLASHCORE_RUNTIME_H
#define FLASHCORE_RUNTIME_H

#include "flashcore.h"

#ifdef __cplusplus
extern "C" {
#endif

fc_status fc_device_info_(int *device, int *major, int *minor, int *sms);
void fc_set_last_cuda_error_(cudaError_t err);

#ifdef __cplusplus
}
#endif

#endif /* FLASHCORE_RUNTIME_H */
