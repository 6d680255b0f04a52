/*
 * test_config.c - the run-time overrides (c_src/config.h): each variable parses to the value
 * docs/TUNING.md gives it, bad values fall back to the default, a snapshot holds until the next
 * fc_config_read (CPU; no device needed).
 */
#define _POSIX_C_SOURCE 200112L /* setenv / unsetenv */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures = 0;

#define CHECK(cond)                                                                   \
    do {                                                                              \
        if (!(cond)) {                                                                \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
            ++failures;                                                               \
        }                                                                             \
    } while (0)

static const char *const kVariables[] = {
    "FLASHCORE_FAMILY",     "FLASHCORE_DECODE_SPLITS", "FLASHCORE_KV_SPLITS",      "FLASHCORE_SM90_SHORT",
    "FLASHCORE_SM80_TILES", "FLASHCORE_PDL",           "FLASHCORE_BWD_PERSISTENT",
};

static void clear_all(void) {
    for (size_t i = 0; i < sizeof kVariables / sizeof kVariables[0]; ++i) unsetenv(kVariables[i]);
}

/* The snapshot with only `name` set (to `value`). */
static const fc_config *read_with(const char *name, const char *value) {
    clear_all();
    setenv(name, value, 1);
    return fc_config_read();
}

static void check_defaults(const fc_config *c) {
    CHECK(c->family[0] == '\0');
    CHECK(c->decode_splits == 0);
    CHECK(c->kv_splits == 0);
    CHECK(c->sm90_d64_config == -1);
    CHECK(c->sm80_tiles == FC_SM80_TILES_BY_DEVICE);
    CHECK(c->pdl == 1);
    CHECK(c->bwd_persistent == 1);
}

int main(void) {
    /* Before any read, and with nothing set: the defaults. */
    check_defaults(fc_config_get());
    clear_all();
    check_defaults(fc_config_read());

    /* FLASHCORE_FAMILY: the text, for the op library to name (torch_op/flashcore_op.cpp). */
    CHECK(strcmp(read_with("FLASHCORE_FAMILY", "sm80")->family, "sm80") == 0);
    CHECK(strcmp(read_with("FLASHCORE_FAMILY", "decode")->family, "decode") == 0);
    CHECK(strcmp(read_with("FLASHCORE_FAMILY", "sm70")->family, "sm70") == 0); /* rejected by the op */
    CHECK(read_with("FLASHCORE_FAMILY", "")->family[0] == '\0');
    {
        char long_value[200];
        memset(long_value, 'x', sizeof long_value - 1);
        long_value[sizeof long_value - 1] = '\0';
        const fc_config *c = read_with("FLASHCORE_FAMILY", long_value);
        CHECK(strlen(c->family) == FC_CONFIG_TEXT_BYTES - 1 && c->family[0] == 'x');
    }

    /* FLASHCORE_DECODE_SPLITS: 1..64, else automatic (0). */
    CHECK(read_with("FLASHCORE_DECODE_SPLITS", "1")->decode_splits == 1);
    CHECK(read_with("FLASHCORE_DECODE_SPLITS", "7")->decode_splits == 7);
    CHECK(read_with("FLASHCORE_DECODE_SPLITS", "64")->decode_splits == 64);
    static const char *const kBadSplits[] = {"0", "65", "", "abc", "7x", "+5", " 5", "05", "-1", "99999999999999999999"};
    for (size_t i = 0; i < sizeof kBadSplits / sizeof kBadSplits[0]; ++i)
        CHECK(read_with("FLASHCORE_DECODE_SPLITS", kBadSplits[i])->decode_splits == 0);

    /* FLASHCORE_KV_SPLITS: 1..8, else automatic (0). */
    for (int n = 1; n <= FC_CONFIG_MAX_KV_SPLITS; ++n) {
        char text[4];
        snprintf(text, sizeof text, "%d", n);
        CHECK(read_with("FLASHCORE_KV_SPLITS", text)->kv_splits == n);
    }
    CHECK(read_with("FLASHCORE_KV_SPLITS", "0")->kv_splits == 0);
    CHECK(read_with("FLASHCORE_KV_SPLITS", "9")->kv_splits == 0);
    CHECK(read_with("FLASHCORE_KV_SPLITS", "10")->kv_splits == 0);
    CHECK(read_with("FLASHCORE_KV_SPLITS", "02")->kv_splits == 0);

    /* FLASHCORE_SM90_SHORT: 0..3 (LONG, SHORT, TINY, PAIR), else automatic (-1). */
    CHECK(read_with("FLASHCORE_SM90_SHORT", "0")->sm90_d64_config == 0);
    CHECK(read_with("FLASHCORE_SM90_SHORT", "1")->sm90_d64_config == 1);
    CHECK(read_with("FLASHCORE_SM90_SHORT", "2")->sm90_d64_config == 2);
    CHECK(read_with("FLASHCORE_SM90_SHORT", "3")->sm90_d64_config == 3);
    CHECK(read_with("FLASHCORE_SM90_SHORT", "4")->sm90_d64_config == -1);
    CHECK(read_with("FLASHCORE_SM90_SHORT", "00")->sm90_d64_config == -1);
    CHECK(read_with("FLASHCORE_SM90_SHORT", "")->sm90_d64_config == -1);

    /* FLASHCORE_SM80_TILES: narrow / wide, else by device. */
    CHECK(read_with("FLASHCORE_SM80_TILES", "narrow")->sm80_tiles == FC_SM80_TILES_NARROW);
    CHECK(read_with("FLASHCORE_SM80_TILES", "wide")->sm80_tiles == FC_SM80_TILES_WIDE);
    CHECK(read_with("FLASHCORE_SM80_TILES", "Narrow")->sm80_tiles == FC_SM80_TILES_BY_DEVICE);
    CHECK(read_with("FLASHCORE_SM80_TILES", "64")->sm80_tiles == FC_SM80_TILES_BY_DEVICE);

    /* FLASHCORE_PDL / FLASHCORE_BWD_PERSISTENT: only "0" turns them off. */
    CHECK(read_with("FLASHCORE_PDL", "0")->pdl == 0);
    CHECK(read_with("FLASHCORE_PDL", "1")->pdl == 1);
    CHECK(read_with("FLASHCORE_PDL", "00")->pdl == 1);
    CHECK(read_with("FLASHCORE_PDL", "")->pdl == 1);
    CHECK(read_with("FLASHCORE_BWD_PERSISTENT", "0")->bwd_persistent == 0);
    CHECK(read_with("FLASHCORE_BWD_PERSISTENT", "off")->bwd_persistent == 1);

    /* A longer name is another variable; retired names are read by nothing. */
    check_defaults(read_with("FLASHCORE_PDL_X", "0"));
    check_defaults(read_with("FLASHCORE_FAMILYX", "sm80"));
    check_defaults(read_with("FLASHCORE_SM90_BALANCED", "0"));
    check_defaults(read_with("FLASHCORE_SM90_TMA_STORE", "0"));
    unsetenv("FLASHCORE_SM90_TMA_STORE");

    /* All at once. */
    clear_all();
    setenv("FLASHCORE_FAMILY", "sm90", 1);
    setenv("FLASHCORE_DECODE_SPLITS", "16", 1);
    setenv("FLASHCORE_KV_SPLITS", "3", 1);
    setenv("FLASHCORE_SM90_SHORT", "2", 1);
    setenv("FLASHCORE_SM80_TILES", "wide", 1);
    setenv("FLASHCORE_PDL", "0", 1);
    setenv("FLASHCORE_BWD_PERSISTENT", "0", 1);
    const fc_config *c = fc_config_read();
    CHECK(strcmp(c->family, "sm90") == 0 && c->decode_splits == 16 && c->kv_splits == 3 &&
          c->sm90_d64_config == 2 && c->sm80_tiles == FC_SM80_TILES_WIDE && c->pdl == 0 && c->bwd_persistent == 0);

    /* The snapshot holds until the next read: fc_config_get reads nothing. */
    setenv("FLASHCORE_PDL", "1", 1);
    setenv("FLASHCORE_KV_SPLITS", "5", 1);
    CHECK(fc_config_get() == c && fc_config_get()->pdl == 0 && fc_config_get()->kv_splits == 3);
    CHECK(fc_config_read()->pdl == 1 && fc_config_get()->kv_splits == 5);
    clear_all();
    check_defaults(fc_config_read());

    if (failures != 0) {
        fprintf(stderr, "test_config: %d check(s) failed\n", failures);
        return 1;
    }
    printf("test_config: all checks passed\n");
    return 0;
}
