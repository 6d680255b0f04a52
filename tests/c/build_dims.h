/* build_dims.h - what this build of libflashcore instantiated, for the C tests.
 *
 * A trimmed build (FLASHCORE_HEAD_DIMS / FLASHCORE_DTYPES) leaves kernels out, and the library
 * then answers "no kernel for this head_dim" for calls a full build runs. A case that needs a
 * left-out kernel is skipped, not failed; tests/c/CMakeLists.txt passes the build's lists as
 * FC_TEST_HEAD_DIMS ("32,64,...") and FC_TEST_DTYPES ("fp16,bf16"). Head dims no build has
 * (40, 72, ...) are never "left out": their cases check the unsupported status as before. */
#pragma once

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "flashcore.h"

#ifndef FC_TEST_HEAD_DIMS
#define FC_TEST_HEAD_DIMS "32,64,80,96,128,256"
#endif
#ifndef FC_TEST_DTYPES
#define FC_TEST_DTYPES "fp16,bf16"
#endif

static int fc_test_list_has_number(const char *list, int64_t value) {
    for (const char *at = list; *at != '\0';) {
        char *end = NULL;
        const long long n = strtoll(at, &end, 10);
        if (end == at) return 0;
        if (n == value) return 1;
        at = *end == ',' ? end + 1 : end;
    }
    return 0;
}

/* The head dims some build of the library can have (CMakeLists.txt's FLASHCORE_HEAD_DIMS). */
static int fc_test_head_dim_exists(int64_t head_dim) {
    return fc_test_list_has_number("32,64,80,96,128,256", head_dim);
}

/* 1 when a call with this head dim and dtype needs a kernel this build left out. */
static int fc_test_left_out(int64_t head_dim, fc_dtype dtype) {
    if (fc_test_head_dim_exists(head_dim) && !fc_test_list_has_number(FC_TEST_HEAD_DIMS, head_dim)) return 1;
    if (dtype == FC_DTYPE_FP16) return strstr(FC_TEST_DTYPES, "fp16") == NULL;
    if (dtype == FC_DTYPE_BF16) return strstr(FC_TEST_DTYPES, "bf16") == NULL;
    return 0;
}
