/* build_dims.h - what this build of libflashcore instantiated, for the C tests.
 *
 * A trimmed build (FLASHCORE_HEAD_DIMS / FLASHCORE_DTYPES) leaves kernels out, and the library
 * then answers "no kernel for this head_dim" for calls a full build runs. A case that needs a
 * left-out kernel is skipped, not failed. tests/c/CMakeLists.txt passes the build's lists as
 * FC_TEST_HEAD_DIMS ("64,128") and FC_TEST_DTYPES ("fp16,bf16"), and every head dim the sources
 * have as FC_TEST_ALL_HEAD_DIMS. Head dims no build has (40, 72, ...) are never "left out": their
 * cases check the unsupported status as before. */
#pragma once

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "flashcore.h"

#if !defined(FC_TEST_ALL_HEAD_DIMS) || !defined(FC_TEST_HEAD_DIMS) || !defined(FC_TEST_DTYPES)
#error "build the C tests through CMake: tests/c/CMakeLists.txt defines what the build holds"
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

/* 1 when a call with this head dim and dtype needs a kernel this build left out. */
static int fc_test_left_out(int64_t head_dim, fc_dtype dtype) {
    if (fc_test_list_has_number(FC_TEST_ALL_HEAD_DIMS, head_dim) && !fc_test_list_has_number(FC_TEST_HEAD_DIMS, head_dim))
        return 1;
    if (dtype == FC_DTYPE_FP16) return strstr(FC_TEST_DTYPES, "fp16") == NULL;
    if (dtype == FC_DTYPE_BF16) return strstr(FC_TEST_DTYPES, "bf16") == NULL;
    return 0;
}
