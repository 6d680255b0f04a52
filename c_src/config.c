/*
 * config.c - the one place that reads FLASHCORE_* run-time overrides from the environment
 * (config.h: the struct, and when and why it is read per call). What each is for and the
 * knobs retired since: docs/TUNING.md.
 */
#include "config.h"

#include "launch_rules.h" /* FC_DECODE_MAX_SPLITS, FC_SM90_D64_* */

#include <string.h>

extern char **environ; /* POSIX: the program's environment, as getenv reads it */

static _Thread_local fc_config current = FC_CONFIG_DEFAULTS;

/* A decimal count in [lo, hi] without sign, spaces or leading zeros, else -1. */
static int parse_count(const char *text, int lo, int hi) {
    if (text[0] < '0' || text[0] > '9' || (text[0] == '0' && text[1] != '\0')) return -1;
    long n = 0;
    for (const char *c = text; *c != '\0'; ++c) {
        if (*c < '0' || *c > '9' || n > hi) return -1;
        n = n * 10 + (*c - '0');
    }
    return n >= lo && n <= hi ? (int)n : -1;
}

/* Everything but "0" keeps a feature on. */
static int parse_switch(const char *text) { return !(text[0] == '0' && text[1] == '\0'); }

enum { FAMILY, DECODE_SPLITS, KV_SPLITS, SM90_SHORT, SM80_TILES, PDL, BWD_PERSISTENT, KNOBS };

/* The variables, after the common prefix. */
#define FC_CONFIG_PREFIX "FLASHCORE_"
static const char *const kNames[KNOBS] = {
    [FAMILY] = "FAMILY",         [DECODE_SPLITS] = "DECODE_SPLITS", [KV_SPLITS] = "KV_SPLITS",
    [SM90_SHORT] = "SM90_SHORT", [SM80_TILES] = "SM80_TILES",       [PDL] = "PDL",
    [BWD_PERSISTENT] = "BWD_PERSISTENT",
};

static void set_knob(fc_config *cfg, int knob, const char *text) {
    int n = 0;
    switch (knob) {
    case FAMILY:
        strncpy(cfg->family, text, FC_CONFIG_TEXT_BYTES - 1);
        cfg->family[FC_CONFIG_TEXT_BYTES - 1] = '\0';
        break;
    case DECODE_SPLITS:
        n = parse_count(text, 1, FC_DECODE_MAX_SPLITS);
        cfg->decode_splits = n > 0 ? n : 0;
        break;
    case KV_SPLITS:
        n = parse_count(text, 1, FC_CONFIG_MAX_KV_SPLITS);
        cfg->kv_splits = n > 0 ? n : 0;
        break;
    case SM90_SHORT:
        cfg->sm90_d64_config = parse_count(text, FC_SM90_D64_LONG, FC_SM90_D64_PAIR);
        break;
    case SM80_TILES:
        cfg->sm80_tiles = strcmp(text, "narrow") == 0 ? FC_SM80_TILES_NARROW
                          : strcmp(text, "wide") == 0 ? FC_SM80_TILES_WIDE
                                                      : FC_SM80_TILES_BY_DEVICE;
        break;
    case PDL: cfg->pdl = parse_switch(text); break;
    case BWD_PERSISTENT: cfg->bwd_persistent = parse_switch(text); break;
    }
}

/* One pass over the environment for all the variables, cheaper than a getenv per variable (a
 * call through the op reads three times; measurements: docs/experiments/sessions-04-09.md,
 * "Measurements moved from c_src/config.c and config.h"). As getenv, the first entry of a name
 * counts. */
static void parse_environment(fc_config *cfg, char *const *env) {
    static const fc_config defaults = FC_CONFIG_DEFAULTS;
    const size_t prefix = sizeof FC_CONFIG_PREFIX - 1;
    *cfg = defaults;
    unsigned seen = 0;
    for (char *const *e = env; e != NULL && *e != NULL; ++e) {
        const char *entry = *e;
        if (entry[0] != 'F' || strncmp(entry, FC_CONFIG_PREFIX, prefix) != 0) continue;
        const char *name = entry + prefix;
        for (int knob = 0; knob < KNOBS; ++knob) {
            const size_t len = strlen(kNames[knob]);
            if ((seen >> knob & 1u) || strncmp(name, kNames[knob], len) != 0 || name[len] != '=') continue;
            seen |= 1u << knob;
            set_knob(cfg, knob, name + len + 1);
            break;
        }
    }
}

const fc_config *fc_config_read(void) {
    parse_environment(&current, environ);
    return &current;
}

const fc_config *fc_config_get(void) { return &current; }
