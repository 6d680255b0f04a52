/*
 * config.h - every run-time override of the C layer, the kernels' launchers and the op library,
 * in one struct (fc_config), read from the environment in one function (config.c, the only
 * place in c_src/, kernels/ and torch_op/ that reads it; tests/test_config.py checks that).
 * What each variable is for, and the knobs retired since: docs/TUNING.md.
 *
 * When it is read: once per call, on the calling thread. fc_config_read() parses every
 * variable into the calling thread's snapshot; the library's entry points that a variable can
 * steer call it first (plan() in flashcore.c: fc_sdpa_workspace_size and fc_sdpa_fwd;
 * fc_sdpa_bwd in bwd.c; decide() in torch_op/flashcore_op.cpp, decide_bwd() in
 * torch_op/flashcore_bwd_op.cpp), and everything below them
 * (dispatch.c's heuristics, the launchers in kernels/) takes the values from fc_config_get(),
 * which returns that snapshot without reading anything.
 * Why not once per process: the tests (and tools/, bench/) set these variables between calls in
 * one process (pytest's monkeypatch.setenv, os.environ), so a value read at load time, or cached
 * until someone calls a reload function, would go stale (the op's Python side would have to call
 * the reload wherever a variable might have changed, and monkeypatch's undo calls nothing).
 * A read is one pass over the environment (config.c; cheaper than the getenv calls it replaces:
 * docs/experiments/sessions-04-09.md, "Measurements moved from c_src/config.c and config.h"),
 * and a call sees one consistent set of values however often its launcher asks. Per thread,
 * because calls run on several threads at once
 * (tests/test_streams_devices.py): a process-wide struct rewritten by one call while another
 * reads it would tear. A thread that never called an entry point sees the defaults
 * (FC_CONFIG_DEFAULTS).
 */
#ifndef FLASHCORE_CONFIG_H
#define FLASHCORE_CONFIG_H

#ifdef __cplusplus
extern "C" {
#endif

/* FLASHCORE_FAMILY's text is kept up to this many bytes, NUL included (every family name is far
 * shorter; a longer value only shows cut in the error that rejects it). */
#define FC_CONFIG_TEXT_BYTES 64
/* The Hopper family's largest forced cluster split (kernels/sm90/fwd_traits.cuh, kMaxKvSplits). */
#define FC_CONFIG_MAX_KV_SPLITS 8

/* FLASHCORE_SM80_TILES: which of its two tile shapes a sm80-class kernel that has two takes. */
enum { FC_SM80_TILES_BY_DEVICE = 0, FC_SM80_TILES_NARROW = 1, FC_SM80_TILES_WIDE = 2 };

typedef struct fc_config {
    /* FLASHCORE_FAMILY (read by the op library only; a C caller sets fc_params.family): the
     * variable's text, "" when unset. torch_op/flashcore_op.cpp (family_from_config) maps it to
     * a family by reasons.h's names and rejects any other text. */
    char family[FC_CONFIG_TEXT_BYTES];
    /* FLASHCORE_DECODE_SPLITS = 1..FC_DECODE_MAX_SPLITS (64): the decode kernel's split count,
     * and the sm90 family's for one-row D=128 decoding (over any number of pairs: flashcore.c,
     * plan; fc_sm90_decode_splits). 0: chosen by the heuristics (unset, or not such a number). */
    int decode_splits;
    /* FLASHCORE_KV_SPLITS = 1..FC_CONFIG_MAX_KV_SPLITS: the sm90 family's cluster split
     * (kernels/sm90/fwd_launch.cuh, launch_fwd_config; not the pair configuration, not with sinks).
     * 0: fc_prefill_splits chooses. */
    int kv_splits;
    /* FLASHCORE_SM90_SHORT = 0..3: the sm90 D=64 configuration, FC_SM90_D64_LONG / SHORT / TINY /
     * PAIR (dispatch.h; kernels/sm90/fwd_launch.cuh, launch_fwd). -1: fc_sm90_d64_config chooses. */
    int sm90_d64_config;
    /* FLASHCORE_SM80_TILES = narrow / wide: the sm80-class kernels that have two tile shapes take
     * their narrow (Ada's) or wide (Hopper's) one on any device (kernels/fwd_sm80.cuh,
     * launch_fwd). FC_SM80_TILES_BY_DEVICE: narrow below compute capability 9. */
    int sm80_tiles;
    /* FLASHCORE_PDL = 0 -> 0: no programmatic dependent launch (fc_use_pdl, dispatch.c;
     * fc_sm90_bwd_use_pdl). Else 1. */
    int pdl;
    /* FLASHCORE_BWD_PERSISTENT = 0 -> 0: the sm90 backward runs one CTA per tile instead of at
     * most one persistent CTA per SM (fc_sm90_bwd_grid, dispatch.c). Else 1. */
    int bwd_persistent;
} fc_config;

#define FC_CONFIG_DEFAULTS {"", 0, 0, -1, FC_SM80_TILES_BY_DEVICE, 1, 1}

/* fc_config_read and fc_config_get are exported from libflashcore.so for the op library
 * (not part of the public API in flashcore.h). */
#if defined(__GNUC__)
#define FC_CONFIG_API __attribute__((visibility("default")))
#else
#define FC_CONFIG_API
#endif

/* Parses every variable above into the calling thread's snapshot and returns it. */
FC_CONFIG_API const fc_config *fc_config_read(void);
/* The calling thread's snapshot as its last fc_config_read left it (FC_CONFIG_DEFAULTS before
 * any); reads nothing. */
FC_CONFIG_API const fc_config *fc_config_get(void);

#ifdef __cplusplus
}
#endif

#endif /* FLASHCORE_CONFIG_H */
