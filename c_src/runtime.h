/*
 * runtime.h - internal: what the C layer asks of the CUDA runtime (defined in flashcore.c): the
 * current device, its compute capability and SM count (cached), and
 * where a launcher leaves the CUDA error behind an FC_ERR_CUDA (fc_last_cuda_error, flashcore.h,
 * returns it). The C layer asks once per call and hands the answer to the kernel's launcher as
 * fc_device_facts: launchers never query the device themselves.
 */
#ifndef FLASHCORE_RUNTIME_H
#define FLASHCORE_RUNTIME_H

#include "flashcore.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The device a call launches on, as the C layer found it for the call (fc_sdpa_fwd_planned,
 * fc_sdpa_bwd): every launcher takes it with the call's params. */
typedef struct fc_device_facts {
    int device;       /* the current device (the launchers' per-device caches are indexed by it) */
    int major, minor; /* its compute capability */
    int sms;          /* its SM count (grid sizes, split heuristics) */
} fc_device_facts;
/* The current device's facts (cached per device after the first call). */
fc_status fc_device_facts_(fc_device_facts *dev);
void fc_set_last_cuda_error_(cudaError_t err);

#ifdef __cplusplus
}
#endif

#endif /* FLASHCORE_RUNTIME_H */
