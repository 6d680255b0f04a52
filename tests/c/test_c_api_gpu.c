/*
 * test_c_api_gpu.c - FlashCore used from plain C, with no PyTorch: cudaMalloc'd buffers,
 * fc_sdpa_fwd on a stream, results checked against a float64 CPU reference computed from the
 * same (rounded) 16-bit inputs. Also checks the LSE output and that every output element was
 * written (the output is poisoned with NaN bytes first).
 *
 * Masked cases (bool and additive attn_mask, in three layouts that take the sm80 kernel's three
 * ways of copying mask tiles: 16-byte cp.async, narrower cp.async on misaligned rows, and element
 * by element for a transposed mask; under AUTO on Hopper a bool mask whose tiles TMA can bring,
 * (B, 1, Sq, Sk) with 16-byte rows at D=64 / 128 (causal too) and D=256 (no causal), runs in the
 * sm90 family's masked configuration instead) include fully masked rows (output exactly 0, LSE -inf) and -inf
 * additive entries; compute-sanitizer runs this file in ci/gpu.sh. Every forward case asks for
 * the LSE, so AUTO runs its masked calls on Hopper as well; for each, the same call without the
 * LSE must be declined there exactly where AUTO leaves it to PyTorch's SDPA
 * (FC_UNSUPPORTED_SLOWER_MASK, a status check; run_case).
 *
 * Band cases (a sliding window, causal aligned bottom-right; flashcore.h): the reference applies
 * the band by flashcore.h's definition (sees(), written apart from the library's fc_band_bounds),
 * rows that see no key must give zeros and LSE -inf (dq 0), and each case asserts that its band
 * changes the reference (so a kernel that ignores the band fails it), or, for a window wider than
 * the sequence, that it does not. The sm80-class family must decline a general band
 * (FC_UNSUPPORTED_BAND); off Hopper the band cases skip.
 *
 * Exits 77 (ctest's "skipped") when no CUDA device is present; 0 when all cases pass.
 * Tolerance: |out - ref| <= atol + rtol * |ref|, where rtol covers rounding the output and P to
 * 16 bits (fp16: 2^-11 each; bf16: 2^-8 each) with a 4x margin.
 */
#include "build_dims.h"
#include "flashcore.h"

#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_helpers.h"

/* Standard normal via Box-Muller on a fixed-seed LCG: deterministic, but different per case. */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static double uniform01(void) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return ((rng_state >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}
static float randn(void) { return (float)(sqrt(-2.0 * log(uniform01())) * cos(6.283185307179586 * uniform01())); }

/* Mask layouts: how the (B, Hq, Sq, Sk) mask is laid out in its buffer. */
enum {
    MASK_BHQK = 0,       /* (B, 1, Sq, Sk) contiguous, broadcast over heads: 16-byte rows when Sk allows */
    MASK_QK_PADDED = 1,  /* (Sq, Sk) in rows of Sk + 3 elements, base one element in: misaligned */
    MASK_TRANSPOSED = 2, /* (Sk, Sq) storage viewed as (Sq, Sk): keys strided, element by element */
};

typedef struct test_case {
    int64_t B, Hq, Hkv, Sq, Sk, D;
    int causal;
    fc_dtype dtype;
    fc_mask_kind mask_kind; /* FC_MASK_NONE: no mask */
    int mask_layout;
} test_case;

/* A band case's window and alignment (flashcore.h), on top of its test_case (whose `causal` it
 * keeps). `differs`: 1 if the band changes the result against the same call without window and
 * alignment (a kernel that ignored the band would fail the case), 0 if it must not (a window wider
 * than the sequence); the test checks which holds of its own reference. */
typedef struct test_band {
    int windowed;
    int64_t left, right; /* -1: unbounded */
    fc_alignment alignment;
    int differs;
} test_band;

static void set_band(const test_band *band, fc_params *p) {
    if (band == NULL) return;
    p->windowed = band->windowed;
    p->window_left = band->left;
    p->window_right = band->right;
    p->alignment = band->alignment;
}

/* The same call without its window and alignment: what a kernel that ignores the band computes. */
static fc_params unbanded(const fc_params *p) {
    fc_params plain = *p;
    plain.windowed = 0;
    plain.window_left = plain.window_right = -1;
    plain.alignment = FC_ALIGN_TOP_LEFT;
    return plain;
}

/* Does query i see key j? flashcore.h's definition, written here apart from the library's:
 * row i's diagonal key is d = i, or i + Sk - Sq aligned bottom-right; causal sees no key past d;
 * a window only d - window_left .. d + window_right (-1: unbounded on that side). */
static int sees(const fc_params *p, int64_t i, int64_t j) {
    const int64_t d = p->alignment == FC_ALIGN_BOTTOM_RIGHT ? i + p->seqlen_k - p->seqlen_q : i;
    if (p->causal && j > d) return 0;
    if (p->windowed && p->window_left >= 0 && j < d - p->window_left) return 0;
    if (p->windowed && p->window_right >= 0 && j > d + p->window_right) return 0;
    return 1;
}

/* Is the band general: some row sees other keys than with every key and than with plain
 * (top-left) causal? Only such a band needs the sm90 family's band kernels (c_src resolves the
 * others to plain calls, which every family runs). */
static int band_is_general(const fc_params *p) {
    fc_params causal = unbanded(p);
    causal.causal = 1;
    int like_all = 1, like_causal = 1;
    for (int64_t i = 0; i < p->seqlen_q; ++i)
        for (int64_t j = 0; j < p->seqlen_k; ++j) {
            const int s = sees(p, i, j);
            like_all &= s;
            like_causal &= s == sees(&causal, i, j);
        }
    return !like_all && !like_causal;
}

/* Does the library's fc_band_bounds (flashcore.h) give the same band as sees(), row by row, and
 * call it FC_BAND_OTHER exactly when band_is_general says so? */
static int band_matches_library(const fc_params *p) {
    int64_t lo = 0, hi = 0;
    const int kind = fc_band_bounds(p->seqlen_q, p->seqlen_k, p->causal, p->windowed ? p->window_left : -1,
                                    p->windowed ? p->window_right : -1, p->alignment, &lo, &hi);
    if ((kind == FC_BAND_OTHER) != band_is_general(p)) return 0;
    for (int64_t i = 0; i < p->seqlen_q; ++i)
        for (int64_t j = 0; j < p->seqlen_k; ++j)
            if (sees(p, i, j) != (j - i >= lo && j - i <= hi)) return 0;
    return 1;
}

static void print_band(const test_band *band) {
    if (band == NULL) return;
    if (band->windowed) printf(" window=(%lld,%lld)", (long long)band->left, (long long)band->right);
    if (band->alignment == FC_ALIGN_BOTTOM_RIGHT) printf(" bottom-right");
}

/* Row i's attention over the keys it sees under p, from its scores raw[j] = scale q.k (+ mask):
 * its D outputs in out (zeros if it sees no key, as PyTorch gives) and its LSE, returned (-inf
 * then). V: the (Sk, D) values of the row's KV head; w: Sk doubles of scratch. */
static double attend_row(const fc_params *p, fc_dtype dt, int64_t i, const double *raw, const uint16_t *V,
                         double *w, double *out) {
    const int64_t Sk = p->seqlen_k, D = p->head_dim;
    double mx = -INFINITY, sum = 0;
    for (int64_t j = 0; j < Sk; ++j) {
        w[j] = sees(p, i, j) ? raw[j] : -INFINITY;
        if (w[j] > mx) mx = w[j];
    }
    for (int64_t d = 0; d < D; ++d) out[d] = 0;
    if (mx == -INFINITY) return -INFINITY;
    for (int64_t j = 0; j < Sk; ++j) { w[j] = exp(w[j] - mx); sum += w[j]; }
    for (int64_t j = 0; j < Sk; ++j) {
        if (w[j] == 0) continue;
        for (int64_t d = 0; d < D; ++d) out[d] += w[j] * to_float(V[j * D + d], dt);
    }
    for (int64_t d = 0; d < D; ++d) out[d] /= sum;
    return mx + log(sum);
}

/* Mask value at (b, h, i, j): 1 = attend (bool) or the additive value; masked bool -> -inf. */
static double mask_score(const test_case *tc, const fc_params *p, const uint16_t *m16,
                         const uint8_t *m8, int64_t b, int64_t h, int64_t i, int64_t j) {
    const int64_t at = b * p->mask_stride_b + h * p->mask_stride_h + i * p->mask_stride_q + j * p->mask_stride_k;
    if (tc->mask_kind == FC_MASK_BOOL) return m8[at] ? 0.0 : -INFINITY;
    return to_float(m16[at], tc->dtype);
}

/* A test case's mask: host copies indexed as the kernel sees it (the pointer = buffer + offset),
 * the device buffer, and the (B, Hq, Sq, Sk) view's strides. 30% of bool keys masked, 10% of
 * additive values -inf, and query rows i % 7 == 3 fully masked (every batch for (B, 1, Sq, Sk)). */
typedef struct test_mask {
    uint8_t *hm8;
    uint16_t *hm16;
    const uint8_t *m8;   /* hm8 + offset */
    const uint16_t *m16; /* hm16 + offset */
    void *dmask;
    int64_t msb, msh, msq, msk, m_off;
    size_t m_bytes;
} test_mask;

static void make_mask(const test_case *tc, test_mask *m) {
    const int64_t B = tc->B, Sq = tc->Sq, Sk = tc->Sk;
    memset(m, 0, sizeof *m);
    int64_t m_elems = 0;
    if (tc->mask_layout == MASK_BHQK) { m->msb = Sq * Sk; m->msq = Sk; m->msk = 1; m_elems = B * Sq * Sk; }
    else if (tc->mask_layout == MASK_QK_PADDED) { m->msq = Sk + 3; m->msk = 1; m->m_off = 1; m_elems = 1 + Sq * (Sk + 3); }
    else { m->msq = 1; m->msk = Sq; m_elems = Sq * Sk; }
    m->m_bytes = tc->mask_kind == FC_MASK_BOOL ? 1 : 2;
    if (tc->mask_kind == FC_MASK_NONE) return;
    m->hm8 = calloc((size_t)m_elems, 1);
    m->hm16 = calloc((size_t)m_elems, 2);
    for (int64_t e = 0; e < m_elems; ++e) {
        const double u = uniform01();
        m->hm8[e] = u < 0.7;
        m->hm16[e] = from_float(u < 0.1 ? -INFINITY : randn(), tc->dtype);
    }
    for (int64_t b = 0; b < (tc->mask_layout == MASK_BHQK ? B : 1); ++b)
        for (int64_t i = 3; i < Sq; i += 7)
            for (int64_t j = 0; j < Sk; ++j) {
                const int64_t at = m->m_off + b * m->msb + i * m->msq + j * m->msk;
                m->hm8[at] = 0;
                m->hm16[at] = from_float(-INFINITY, tc->dtype);
            }
    CUDA_OK(cudaMalloc(&m->dmask, (size_t)m_elems * m->m_bytes));
    CUDA_OK(cudaMemcpy(m->dmask, tc->mask_kind == FC_MASK_BOOL ? (void *)m->hm8 : (void *)m->hm16,
                       (size_t)m_elems * m->m_bytes, cudaMemcpyHostToDevice));
    m->m8 = m->hm8 + m->m_off;
    m->m16 = m->hm16 + m->m_off;
}

static void set_mask(const test_case *tc, const test_mask *m, fc_params *p) {
    if (tc->mask_kind == FC_MASK_NONE) return;
    p->mask_kind = tc->mask_kind;
    p->mask = (const char *)m->dmask + m->m_off * (int64_t)m->m_bytes;
    p->mask_stride_b = m->msb; p->mask_stride_h = m->msh; p->mask_stride_q = m->msq; p->mask_stride_k = m->msk;
}

static void free_mask(test_mask *m) {
    if (m->dmask != NULL) CUDA_OK(cudaFree(m->dmask));
    free(m->hm8);
    free(m->hm16);
}

static int run_case(const test_case *tc, fc_family family, const test_band *band) {

    if (fc_test_left_out(tc->D, tc->dtype)) {
        printf("skip D=%lld dtype %d: this build left its kernel out\n", (long long)tc->D, (int)tc->dtype);
        return 0;
    }
    const int64_t B = tc->B, Hq = tc->Hq, Hkv = tc->Hkv, Sq = tc->Sq, Sk = tc->Sk, D = tc->D;
    const size_t nq = (size_t)(B * Hq * Sq * D), nk = (size_t)(B * Hkv * Sk * D);
    uint16_t *hq = malloc(nq * 2), *hk = malloc(nk * 2), *hv = malloc(nk * 2), *ho = malloc(nq * 2);
    float *hlse = malloc((size_t)(B * Hq * Sq) * sizeof(float));
    for (size_t i = 0; i < nq; ++i) hq[i] = from_float(randn(), tc->dtype);
    for (size_t i = 0; i < nk; ++i) hk[i] = from_float(randn(), tc->dtype);
    for (size_t i = 0; i < nk; ++i) hv[i] = from_float(randn(), tc->dtype);

    void *dq, *dk, *dv, *dout;
    float *dlse;
    CUDA_OK(cudaMalloc(&dq, nq * 2));
    CUDA_OK(cudaMalloc(&dk, nk * 2));
    CUDA_OK(cudaMalloc(&dv, nk * 2));
    CUDA_OK(cudaMalloc(&dout, nq * 2));
    CUDA_OK(cudaMalloc((void **)&dlse, (size_t)(B * Hq * Sq) * sizeof(float)));
    CUDA_OK(cudaMemcpy(dq, hq, nq * 2, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dk, hk, nk * 2, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dv, hv, nk * 2, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(dout, 0xff, nq * 2)); /* 0xffff is NaN in fp16 and bf16 */

    test_mask mask;
    make_mask(tc, &mask);
    CUDA_OK(cudaMemset(dlse, 0xff, (size_t)(B * Hq * Sq) * sizeof(float)));

    fc_params p;
    fc_params_init(&p);
    p.q = dq; p.k = dk; p.v = dv; p.out = dout; p.lse = dlse;
    p.batch = B; p.heads_q = Hq; p.heads_kv = Hkv; p.seqlen_q = Sq; p.seqlen_k = Sk; p.head_dim = D;
    p.scale = 1.0f / sqrtf((float)D);
    p.causal = tc->causal;
    p.dtype = tc->dtype;
    p.family = family;
    fc_params_set_contiguous_strides(&p);
    set_mask(tc, &mask, &p);
    set_band(band, &p);
    if (band != NULL && !band_matches_library(&p)) {
        fprintf(stderr, "FAIL the test's band rule and fc_band_bounds disagree (Sq=%lld Sk=%lld)\n", (long long)Sq, (long long)Sk);
        return 1;
    }
    const uint8_t *m8 = mask.m8;
    const uint16_t *m16 = mask.m16;

    /* Workspace, when the chosen kernel can use one (the split-KV decode path). */
    int64_t ws_bytes = 0;
    fc_status st = fc_sdpa_workspace_size(&p, &ws_bytes);
    /* (FC_UNSUPPORTED_SLOWER_MASK never comes here: every case asks for the LSE, which keeps a
     * masked call in the sm80 family under AUTO on Hopper too; the call without it is checked
     * below. A masked case declined here would be a failure.) */
    if (st == FC_UNSUPPORTED_SLOWER && family == FC_FAMILY_AUTO) {
        /* AUTO on Hopper leaves D=32/80/96 to PyTorch's cuDNN path; the forced sm80 pass runs it. */
        printf("skip auto D=%lld: %s\n", (long long)D, fc_status_string(st));
        free_mask(&mask);
        free(hq); free(hk); free(hv); free(ho); free(hlse);
        CUDA_OK(cudaFree(dq)); CUDA_OK(cudaFree(dk)); CUDA_OK(cudaFree(dv)); CUDA_OK(cudaFree(dout)); CUDA_OK(cudaFree(dlse));
        return 0;
    }
    if (band != NULL && band_is_general(&p)) {
        /* A general band runs in the sm90 family and the decode kernels (up to 16 query rows):
         * the sm80 family must decline it (never run it as a plain call), and so must AUTO off
         * Hopper where the decode kernels do not take the call. */
        int dev = 0, major = 0;
        CUDA_OK(cudaGetDevice(&dev));
        CUDA_OK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
        if (family == FC_FAMILY_SM80 || (major != 9 && st != FC_OK)) {
            const int ok = st == FC_UNSUPPORTED_BAND;
            printf("%s family=%s Sq=%lld Sk=%lld causal=%d", ok ? "ok  " : "FAIL", family == FC_FAMILY_SM80 ? "sm80" : "auto",
                   (long long)Sq, (long long)Sk, tc->causal);
            print_band(band);
            printf(": declined (%s)\n", fc_status_string(st));
            free_mask(&mask);
            free(hq); free(hk); free(hv); free(ho); free(hlse);
            CUDA_OK(cudaFree(dq)); CUDA_OK(cudaFree(dk)); CUDA_OK(cudaFree(dv)); CUDA_OK(cudaFree(dout)); CUDA_OK(cudaFree(dlse));
            return !ok;
        }
    }
    if (st != FC_OK) {
        fprintf(stderr, "FAIL fc_sdpa_workspace_size: %s\n", fc_status_string(st));
        return 1;
    }
    if (family == FC_FAMILY_AUTO && tc->mask_kind != FC_MASK_NONE && band == NULL) {
        /* The same masked call without the LSE (inference): on Hopper AUTO leaves it to PyTorch's
         * SDPA where only the sm80 family takes its mask (FC_UNSUPPORTED_SLOWER_MASK: at D=64 / 128
         * every such mask, at other head dims an additive one, one broadcast over the query rows or one
         * query row; never with causal),
         * and fc_sdpa_fwd says so before touching the GPU; elsewhere it runs as it does with the LSE
         * (which this case then checks, so the sm80 masked kernels still run under AUTO). */
        int dev = 0, major = 0, minor = 0;
        CUDA_OK(cudaGetDevice(&dev));
        CUDA_OK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
        CUDA_OK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
        fc_params no_lse = p;
        no_lse.lse = NULL;
        const fc_family runs_it = fc_sdpa_family(&p, major, minor);
        /* (the decode kernels leave only additive masks to PyTorch) */
        const int declined = major == 9 && minor == 0 && !p.causal &&
                             ((runs_it == FC_FAMILY_SM80 &&
                               (p.mask_kind == FC_MASK_ADDITIVE || D == 64 || D == 128 || p.mask_stride_q == 0 ||
                                p.seqlen_q == 1)) ||
                              (runs_it == FC_FAMILY_DECODE && p.mask_kind == FC_MASK_ADDITIVE));
        const fc_status want = declined ? FC_UNSUPPORTED_SLOWER_MASK : FC_OK;
        int64_t no_lse_bytes = 0;
        const fc_status got = fc_sdpa_workspace_size(&no_lse, &no_lse_bytes);
        const fc_status got_fwd = declined ? fc_sdpa_fwd(&no_lse, (cudaStream_t)0) : want;
        if (got != want || got_fwd != want) {
            fprintf(stderr, "FAIL auto D=%lld masked, no LSE: %s (fwd %s), want %s\n", (long long)D,
                    fc_status_string(got), fc_status_string(got_fwd), fc_status_string(want));
            return 1;
        }
        if (declined) printf("ok   auto D=%lld masked, no LSE: declined (%s)\n", (long long)D, fc_status_string(got));
    }
    if (ws_bytes > 0) {
        CUDA_OK(cudaMalloc(&p.workspace, (size_t)ws_bytes));
        p.workspace_bytes = ws_bytes;
    }
    cudaStream_t stream;
    CUDA_OK(cudaStreamCreate(&stream));
    st = fc_sdpa_fwd(&p, stream);
    if (st != FC_OK) {
        fprintf(stderr, "FAIL fc_sdpa_fwd: %s (cuda: %s)\n", fc_status_string(st),
                cudaGetErrorString(fc_last_cuda_error()));
        return 1;
    }
    CUDA_OK(cudaStreamSynchronize(stream));
    CUDA_OK(cudaMemcpy(ho, dout, nq * 2, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(hlse, dlse, (size_t)(B * Hq * Sq) * sizeof(float), cudaMemcpyDeviceToHost));

    const double rtol = tc->dtype == FC_DTYPE_FP16 ? 4 * 2 * 4.9e-4 : 4 * 2 * 3.9e-3;
    const double atol = tc->dtype == FC_DTYPE_FP16 ? 2e-3 : 1.6e-2;
    double max_err = 0, max_lse_err = 0;
    int bad = 0;
    /* Rows whose reference differs from the same call's without window and alignment. */
    int64_t rows_band_changes = 0;
    const fc_params plain = unbanded(&p);
    double *raw = malloc((size_t)Sk * sizeof(double)), *w = malloc((size_t)Sk * sizeof(double));
    double *ref = malloc((size_t)D * sizeof(double)), *ref_plain = malloc((size_t)D * sizeof(double));
    for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < Hq; ++h) {
            const int64_t hk_ = h / (Hq / Hkv);
            const uint16_t *V = hv + (b * Hkv + hk_) * Sk * D;
            for (int64_t i = 0; i < Sq; ++i) {
                const uint16_t *qrow = hq + ((b * Hq + h) * Sq + i) * D;
                for (int64_t j = 0; j < Sk; ++j) {
                    const uint16_t *krow = hk + ((b * Hkv + hk_) * Sk + j) * D;
                    double dot = 0;
                    for (int64_t d = 0; d < D; ++d) dot += (double)to_float(qrow[d], tc->dtype) * to_float(krow[d], tc->dtype);
                    raw[j] = dot * p.scale;
                    if (tc->mask_kind != FC_MASK_NONE) raw[j] += mask_score(tc, &p, m16, m8, b, h, i, j);
                }
                const double lse = attend_row(&p, tc->dtype, i, raw, V, w, ref);
                if (band != NULL) {
                    const double lse_plain = attend_row(&plain, tc->dtype, i, raw, V, w, ref_plain);
                    int changed = (lse == -INFINITY) != (lse_plain == -INFINITY);
                    for (int64_t d = 0; d < D; ++d) changed |= !(fabs(ref[d] - ref_plain[d]) <= atol + rtol * fabs(ref[d]));
                    rows_band_changes += changed;
                }
                const float got_lse = hlse[(b * Hq + h) * Sq + i];
                if (lse == -INFINITY) {
                    /* Every key masked, or none in the band: PyTorch returns zeros for the row,
                     * and its LSE is -inf. */
                    if (!(got_lse == -INFINITY)) ++bad;
                    for (int64_t d = 0; d < D; ++d)
                        if (to_float(ho[((b * Hq + h) * Sq + i) * D + d], tc->dtype) != 0.0f) ++bad;
                    continue;
                }
                const double lse_err = fabs(got_lse - lse);
                if (!(lse_err <= 1e-3 * (1 + fabs(lse)))) ++bad;
                if (lse_err > max_lse_err || isnan(lse_err)) max_lse_err = lse_err;
                for (int64_t d = 0; d < D; ++d) {
                    const double got = to_float(ho[((b * Hq + h) * Sq + i) * D + d], tc->dtype);
                    const double err = fabs(got - ref[d]);
                    if (!(err <= atol + rtol * fabs(ref[d]))) ++bad; /* NaN fails here too */
                    if (err > max_err || isnan(err)) max_err = err;
                }
            }
        }
    /* The case tests the band only if its band changes the result (and a wider-than-the-sequence
     * window must not). */
    const int band_as_meant = band == NULL || (rows_band_changes > 0) == (band->differs != 0);
    if (!band_as_meant) {
        fprintf(stderr, "FAIL the band changes %lld rows of the reference; the case expects it to %s\n",
                (long long)rows_band_changes, band->differs ? "change some" : "change none");
        ++bad;
    }
    static const char *const kMaskNames[] = {"", " bool-mask", " additive-mask"};
    static const char *const kLayoutNames[] = {"(B,1,Sq,Sk)", "(Sq,Sk)-misaligned", "transposed"};
    printf("%s family=%s ws=%lld B=%lld Hq=%lld Hkv=%lld Sq=%lld Sk=%lld D=%lld causal=%d %s%s%s",
           bad ? "FAIL" : "ok  ", family == FC_FAMILY_SM80 ? "sm80" : "auto", (long long)ws_bytes, (long long)B, (long long)Hq, (long long)Hkv, (long long)Sq, (long long)Sk,
           (long long)D, tc->causal, tc->dtype == FC_DTYPE_FP16 ? "fp16" : "bf16", kMaskNames[tc->mask_kind],
           tc->mask_kind != FC_MASK_NONE ? kLayoutNames[tc->mask_layout] : "");
    print_band(band);
    if (band != NULL) printf(" (band changes %lld rows)", (long long)rows_band_changes);
    printf(": max|err| %.2e, max|lse err| %.2e, %d bad\n", max_err, max_lse_err, bad);
    free_mask(&mask);

    free(raw); free(w); free(ref); free(ref_plain); free(hq); free(hk); free(hv); free(ho); free(hlse);
    CUDA_OK(cudaFree(dq)); CUDA_OK(cudaFree(dk)); CUDA_OK(cudaFree(dv)); CUDA_OK(cudaFree(dout)); CUDA_OK(cudaFree(dlse));
    CUDA_OK(cudaStreamDestroy(stream));
    if (p.workspace != NULL) CUDA_OK(cudaFree(p.workspace));
    return bad != 0;
}

/*
 * The backward: fc_sdpa_fwd (for out and the LSE), then fc_sdpa_bwd with a random dout, checked
 * against float64 gradients computed here from the same rounded inputs (P from exact scores,
 * delta = rowsum(dout * exact out)). The gradient buffers are poisoned with NaN first, so an
 * unwritten element fails. Tolerance per gradient tensor: max|g - ref| <= rel * max(1, max|ref|),
 * rel 1e-2 (fp16) / 4e-2 (bf16): P and dS are rounded to 16 bits inside the kernel.
 */
/* float64 gradients of the call p describes (its sizes, scale, causal, band; tc's mask) from the
 * rounded inputs, added into rdq, rdk, rdv (zeroed): per (b, h) the full Sq x Sk probabilities. */
static void bwd_reference(const test_case *tc, const fc_params *p, const test_mask *mask, const uint16_t *hq,
                          const uint16_t *hk, const uint16_t *hv, const uint16_t *hdo, double *rdq, double *rdk,
                          double *rdv) {
    const int64_t B = tc->B, Hq = tc->Hq, Hkv = tc->Hkv, Sq = tc->Sq, Sk = tc->Sk, D = tc->D;
    const int64_t G = Hq / Hkv;
    double *P = malloc((size_t)(Sq * Sk) * sizeof(double)), *dS = malloc((size_t)(Sq * Sk) * sizeof(double));
    double *dcap = malloc((size_t)(Sq * Sk) * sizeof(double)); /* the softcap's derivative 1 - t^2 (1 without) */
    for (int64_t bb = 0; bb < B; ++bb)
        for (int64_t h = 0; h < Hq; ++h) {
            const int64_t hk_ = h / G;
            const uint16_t *Q = hq + (bb * Hq + h) * Sq * D, *DO = hdo + (bb * Hq + h) * Sq * D;
            const uint16_t *K = hk + (bb * Hkv + hk_) * Sk * D, *V = hv + (bb * Hkv + hk_) * Sk * D;
            double *DQ = rdq + (bb * Hq + h) * Sq * D;
            double *DK = rdk + (bb * Hkv + hk_) * Sk * D, *DV = rdv + (bb * Hkv + hk_) * Sk * D;
            for (int64_t i = 0; i < Sq; ++i) {
                double mx = -INFINITY, sum = 0;
                for (int64_t j = 0; j < Sk; ++j) {
                    double dot = 0;
                    for (int64_t d = 0; d < D; ++d) dot += (double)to_float(Q[i * D + d], tc->dtype) * to_float(K[j * D + d], tc->dtype);
                    double s = dot * p->scale;
                    dcap[i * Sk + j] = 1.0;
                    if (p->softcap != 0.0f) { /* c tanh(s / c) of each scaled score, before the mask */
                        const double t = tanh(s / p->softcap);
                        s = p->softcap * t;
                        dcap[i * Sk + j] = 1.0 - t * t;
                    }
                    P[i * Sk + j] = sees(p, i, j) ? s : -INFINITY;
                    if (tc->mask_kind != FC_MASK_NONE) P[i * Sk + j] += mask_score(tc, p, mask->m16, mask->m8, bb, h, i, j);
                    if (P[i * Sk + j] > mx) mx = P[i * Sk + j];
                }
                /* A fully masked row, or one that sees no key: P = 0 (its gradients are zero, as the forward's output). */
                for (int64_t j = 0; j < Sk; ++j) { P[i * Sk + j] = mx == -INFINITY ? 0 : exp(P[i * Sk + j] - mx); sum += P[i * Sk + j]; }
                for (int64_t j = 0; j < Sk; ++j) P[i * Sk + j] = sum > 0 ? P[i * Sk + j] / sum : 0;
                /* delta = rowsum(dO * O), dP = dO V^T, dS = P (dP - delta) */
                double delta = 0;
                for (int64_t d = 0; d < D; ++d) {
                    double o = 0;
                    for (int64_t j = 0; j < Sk; ++j) o += P[i * Sk + j] * to_float(V[j * D + d], tc->dtype);
                    delta += o * to_float(DO[i * D + d], tc->dtype);
                }
                for (int64_t j = 0; j < Sk; ++j) {
                    double dp = 0;
                    for (int64_t d = 0; d < D; ++d) dp += (double)to_float(DO[i * D + d], tc->dtype) * to_float(V[j * D + d], tc->dtype);
                    dS[i * Sk + j] = P[i * Sk + j] * (dp - delta) * dcap[i * Sk + j];
                }
            }
            for (int64_t i = 0; i < Sq; ++i)
                for (int64_t j = 0; j < Sk; ++j) {
                    const double pij = P[i * Sk + j], ds = dS[i * Sk + j] * p->scale;
                    if (pij == 0 && ds == 0) continue;
                    for (int64_t d = 0; d < D; ++d) {
                        DV[j * D + d] += pij * to_float(DO[i * D + d], tc->dtype);
                        DK[j * D + d] += ds * to_float(Q[i * D + d], tc->dtype);
                        DQ[i * D + d] += ds * to_float(K[j * D + d], tc->dtype);
                    }
                }
        }
    free(P);
    free(dS);
    free(dcap);
}

/* Which backward a case runs: AUTO's choice, or the sm80-class family forced, in one pass (dQ
 * through fp32 atomics) or deterministic (dQ in a pass of its own). */
typedef enum { BWD_AUTO, BWD_SM80_ONE_PASS, BWD_SM80_DETERMINISTIC } bwd_way;
static const char *const kBwdWayNames[] = {"", " sm80", " sm80-deterministic"};

static int run_bwd_case(const test_case *tc, const test_band *band, bwd_way way, float softcap) {
    if (fc_test_left_out(tc->D, tc->dtype)) {
        printf("skip backward D=%lld dtype %d: this build left its kernel out\n", (long long)tc->D, (int)tc->dtype);
        return 0;
    }
    if (tc->mask_kind != FC_MASK_NONE || tc->D == 256) {
        int dev = 0, major = 0;
        CUDA_OK(cudaGetDevice(&dev));
        CUDA_OK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
        if (major != 9) {
            printf("skip %s backward: only the sm90 family takes it\n", tc->D == 256 ? "D=256" : "masked");
            return 0;
        }
    }
    const int64_t B = tc->B, Hq = tc->Hq, Hkv = tc->Hkv, Sq = tc->Sq, Sk = tc->Sk, D = tc->D;
    const size_t nq = (size_t)(B * Hq * Sq * D), nk = (size_t)(B * Hkv * Sk * D), nr = (size_t)(B * Hq * Sq);
    uint16_t *hq = malloc(nq * 2), *hk = malloc(nk * 2), *hv = malloc(nk * 2), *hdo = malloc(nq * 2);
    uint16_t *hdq = malloc(nq * 2), *hdk = malloc(nk * 2), *hdv = malloc(nk * 2);
    for (size_t i = 0; i < nq; ++i) hq[i] = from_float(randn(), tc->dtype);
    for (size_t i = 0; i < nk; ++i) hk[i] = from_float(randn(), tc->dtype);
    for (size_t i = 0; i < nk; ++i) hv[i] = from_float(randn(), tc->dtype);
    for (size_t i = 0; i < nq; ++i) hdo[i] = from_float(randn(), tc->dtype);

    void *d_q, *d_k, *d_v, *d_o, *d_do, *d_dq, *d_dk, *d_dv, *d_ws;
    float *d_lse;
    CUDA_OK(cudaMalloc(&d_q, nq * 2)); CUDA_OK(cudaMalloc(&d_k, nk * 2)); CUDA_OK(cudaMalloc(&d_v, nk * 2));
    CUDA_OK(cudaMalloc(&d_o, nq * 2)); CUDA_OK(cudaMalloc(&d_do, nq * 2)); CUDA_OK(cudaMalloc(&d_dq, nq * 2));
    CUDA_OK(cudaMalloc(&d_dk, nk * 2)); CUDA_OK(cudaMalloc(&d_dv, nk * 2));
    CUDA_OK(cudaMalloc((void **)&d_lse, nr * sizeof(float)));
    CUDA_OK(cudaMemcpy(d_q, hq, nq * 2, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d_k, hk, nk * 2, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d_v, hv, nk * 2, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d_do, hdo, nq * 2, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(d_dq, 0xff, nq * 2));
    CUDA_OK(cudaMemset(d_dk, 0xff, nk * 2));
    CUDA_OK(cudaMemset(d_dv, 0xff, nk * 2));
    /* NaN-poisoned: a row the forward leaves unwritten shows up in the gradients. (Also, the sm90
     * forward writes O with TMA stores, which compute-sanitizer's initcheck does not count as
     * initialising memory: without this it flags the backward's reads of O.) */
    CUDA_OK(cudaMemset(d_o, 0xff, nq * 2));
    CUDA_OK(cudaMemset(d_lse, 0xff, nr * sizeof(float)));

    fc_bwd_params b;
    fc_bwd_params_init(&b);
    fc_params *p = &b.fwd;
    p->q = d_q; p->k = d_k; p->v = d_v; p->out = d_o; p->lse = d_lse;
    p->batch = B; p->heads_q = Hq; p->heads_kv = Hkv; p->seqlen_q = Sq; p->seqlen_k = Sk; p->head_dim = D;
    p->scale = 1.0f / sqrtf((float)D);
    p->causal = tc->causal;
    p->dtype = tc->dtype;
    p->softcap = softcap;
    b.dout = d_do; b.dq = d_dq; b.dk = d_dk; b.dv = d_dv;
    fc_bwd_params_set_contiguous_strides(&b);
    test_mask mask;
    make_mask(tc, &mask);
    set_mask(tc, &mask, p);
    set_band(band, p);
    if (way != BWD_AUTO) {
        p->family = FC_FAMILY_SM80;
        b.deterministic = way == BWD_SM80_DETERMINISTIC;
    }
    if (band != NULL && band_is_general(p)) {
        /* Only the sm90 family's backward has a band: the sm80-class family declines it, so a
         * deterministic call does too, and so does any call off Hopper (which then skips). */
        fc_bwd_params other = b;
        other.fwd.family = FC_FAMILY_SM80;
        const fc_status sm80 = fc_sdpa_bwd_support(&other, 9, 0);
        other = b;
        other.deterministic = 1;
        const fc_status det = fc_sdpa_bwd_support(&other, 9, 0);
        const fc_status ada = fc_sdpa_bwd_support(&b, 8, 9), hopper = fc_sdpa_bwd_support(&b, 9, 0);
        /* (sm_89: FC_UNSUPPORTED_ARCH where the build has no sm_89 kernels at all.) */
        const int ada_declines = ada == FC_UNSUPPORTED_BAND || ada == FC_UNSUPPORTED_ARCH;
        if (sm80 != FC_UNSUPPORTED_BAND || det != FC_UNSUPPORTED_BAND || !ada_declines || hopper != FC_OK) {
            fprintf(stderr, "FAIL bwd band support: sm80 %s; deterministic %s; sm_89 %s; sm_90 %s\n", fc_status_string(sm80),
                    fc_status_string(det), fc_status_string(ada), fc_status_string(hopper));
            return 1;
        }
        int dev = 0, major = 0;
        CUDA_OK(cudaGetDevice(&dev));
        CUDA_OK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
        if (major != 9) {
            printf("skip band backward: only the sm90 family takes a band\n");
            return 0;
        }
    }

    cudaStream_t stream;
    CUDA_OK(cudaStreamCreate(&stream));
    fc_status st = fc_sdpa_fwd(p, stream); /* no workspace: the decode path (if chosen) runs unsplit */
    if (st != FC_OK) {
        fprintf(stderr, "FAIL bwd case: fc_sdpa_fwd: %s\n", fc_status_string(st));
        return 1;
    }
    /* Without a workspace the backward refuses to run. */
    if ((st = fc_sdpa_bwd(&b, stream)) != FC_ERR_BAD_WORKSPACE) {
        fprintf(stderr, "FAIL bwd case: no workspace gave %s\n", fc_status_string(st));
        return 1;
    }
    int64_t ws_bytes = 0;
    if ((st = fc_sdpa_bwd_workspace_size(&b, &ws_bytes)) != FC_OK || ws_bytes <= 0) {
        fprintf(stderr, "FAIL fc_sdpa_bwd_workspace_size: %s\n", fc_status_string(st));
        return 1;
    }
    CUDA_OK(cudaMalloc(&d_ws, (size_t)ws_bytes));
    CUDA_OK(cudaMemset(d_ws, 0xff, (size_t)ws_bytes)); /* NaN: what the kernels must zero, they do */
    b.workspace = d_ws;
    b.workspace_bytes = ws_bytes;
    st = fc_sdpa_bwd(&b, stream);
    if (st != FC_OK) {
        fprintf(stderr, "FAIL fc_sdpa_bwd: %s (cuda: %s)\n", fc_status_string(st),
                cudaGetErrorString(fc_last_cuda_error()));
        return 1;
    }
    CUDA_OK(cudaStreamSynchronize(stream));
    CUDA_OK(cudaMemcpy(hdq, d_dq, nq * 2, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(hdk, d_dk, nk * 2, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(hdv, d_dv, nk * 2, cudaMemcpyDeviceToHost));

    /* float64 reference; for a band also the same call's without it, which must differ from it
     * beyond the tolerance (a kernel that ignored the band would fail), or, for a window wider
     * than the sequence, must not. */
    double *rdq = calloc(nq, sizeof(double)), *rdk = calloc(nk, sizeof(double)), *rdv = calloc(nk, sizeof(double));
    bwd_reference(tc, p, &mask, hq, hk, hv, hdo, rdq, rdk, rdv);
    double *plain_ref[3] = {NULL, NULL, NULL};
    if (band != NULL) {
        const fc_params plain = unbanded(p);
        for (int t = 0; t < 3; ++t) plain_ref[t] = calloc(t == 0 ? nq : nk, sizeof(double));
        bwd_reference(tc, &plain, &mask, hq, hk, hv, hdo, plain_ref[0], plain_ref[1], plain_ref[2]);
    }
    const double rel = tc->dtype == FC_DTYPE_FP16 ? 1e-2 : 4e-2;
    const uint16_t *got[3] = {hdq, hdk, hdv};
    const double *ref[3] = {rdq, rdk, rdv};
    const size_t n[3] = {nq, nk, nk};
    const char *names[3] = {"dq", "dk", "dv"};
    int bad = 0, band_changes = 0;
    for (int t = 0; t < 3; ++t) {
        double max_ref = 1.0, max_err = 0, max_band_change = 0;
        for (size_t i = 0; i < n[t]; ++i) if (fabs(ref[t][i]) > max_ref) max_ref = fabs(ref[t][i]);
        for (size_t i = 0; i < n[t]; ++i) {
            const double err = fabs(to_float(got[t][i], tc->dtype) - ref[t][i]);
            if (!(err <= max_err)) max_err = err; /* NaN sticks */
            if (band != NULL && fabs(plain_ref[t][i] - ref[t][i]) > max_band_change)
                max_band_change = fabs(plain_ref[t][i] - ref[t][i]);
        }
        const int ok = max_err <= rel * max_ref;
        bad += !ok;
        band_changes |= max_band_change > rel * max_ref;
        static const char *const kMaskNames[] = {"", " bool-mask", " additive-mask"};
        printf("%s bwd%s B=%lld Hq=%lld Hkv=%lld Sq=%lld Sk=%lld D=%lld causal=%d %s%s", ok ? "ok  " : "FAIL",
               kBwdWayNames[way], (long long)B, (long long)Hq, (long long)Hkv, (long long)Sq, (long long)Sk, (long long)D,
               tc->causal, tc->dtype == FC_DTYPE_FP16 ? "fp16" : "bf16", kMaskNames[tc->mask_kind]);
        print_band(band);
        if (softcap != 0.0f) printf(" softcap %g", softcap);
        printf(" %s: max|err| %.2e (tol %.2e)", names[t], max_err, rel * max_ref);
        if (band != NULL) printf(", band changes it by %.2e", max_band_change);
        printf("\n");
    }
    /* Exact zeros where the band leaves nothing: dq of rows that see no key, dk and dv of keys no
     * row sees (a NaN or a stray sum fails here, whatever the tolerance). */
    int64_t not_zero = 0;
    for (int64_t i = 0; i < Sq; ++i) {
        int64_t seen = 0;
        for (int64_t j = 0; j < Sk && !seen; ++j) seen += sees(p, i, j);
        for (int64_t bh = 0; bh < B * Hq && !seen; ++bh)
            for (int64_t d = 0; d < D; ++d) not_zero += to_float(hdq[(bh * Sq + i) * D + d], tc->dtype) != 0.0f;
    }
    for (int64_t j = 0; j < Sk; ++j) {
        int64_t seen = 0;
        for (int64_t i = 0; i < Sq && !seen; ++i) seen += sees(p, i, j);
        for (int64_t bh = 0; bh < B * Hkv && !seen; ++bh)
            for (int64_t d = 0; d < D; ++d)
                not_zero += (to_float(hdk[(bh * Sk + j) * D + d], tc->dtype) != 0.0f) +
                            (to_float(hdv[(bh * Sk + j) * D + d], tc->dtype) != 0.0f);
    }
    if (not_zero != 0) {
        fprintf(stderr, "FAIL bwd: %lld gradient elements of rows that see no key, or keys no row sees, are not 0\n",
                (long long)not_zero);
        ++bad;
    }
    if (band != NULL && band_changes != (band->differs != 0)) {
        fprintf(stderr, "FAIL bwd: the band %s the reference gradients beyond the tolerance; the case expects it %s\n",
                band_changes ? "changes" : "does not change", band->differs ? "to" : "not to");
        ++bad;
    }
    free(hq); free(hk); free(hv); free(hdo); free(hdq); free(hdk); free(hdv);
    free(rdq); free(rdk); free(rdv);
    for (int t = 0; t < 3; ++t) free(plain_ref[t]);
    free_mask(&mask);
    void *bufs[] = {d_q, d_k, d_v, d_o, d_do, d_dq, d_dk, d_dv, d_lse, d_ws};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); ++i) CUDA_OK(cudaFree(bufs[i]));
    CUDA_OK(cudaStreamDestroy(stream));
    return bad != 0;
}

/* Every case of a table, the same way; the number that failed. */
static int run_bwd_table(const test_case *cases, size_t count, bwd_way way) {
    int failed = 0;
    for (size_t i = 0; i < count; ++i) failed += run_bwd_case(&cases[i], NULL, way, 0.0f);
    return failed;
}

int main(void) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        printf("no CUDA device: skipped\n");
        return 77;
    }
    static const test_case kCases[] = {
        {1, 2, 2, 128, 128, 64, 0, FC_DTYPE_FP16, FC_MASK_NONE, 0},
        {2, 4, 1, 17, 300, 64, 1, FC_DTYPE_FP16, FC_MASK_NONE, 0},
        {1, 8, 2, 127, 65, 128, 0, FC_DTYPE_BF16, FC_MASK_NONE, 0},
        {1, 2, 2, 200, 77, 128, 1, FC_DTYPE_FP16, FC_MASK_NONE, 0},   /* Sq > Sk, causal: top-left alignment */
        {1, 4, 4, 1, 513, 128, 0, FC_DTYPE_BF16, FC_MASK_NONE, 0},     /* one query row */
        {3, 1, 1, 1000, 1000, 64, 1, FC_DTYPE_BF16, FC_MASK_NONE, 0},
        /* decode path under AUTO: split-KV with GQA packing, odd lengths, causal Sq > 1 */
        {2, 8, 2, 1, 8191, 128, 0, FC_DTYPE_FP16, FC_MASK_NONE, 0},
        {1, 4, 1, 3, 3000, 64, 1, FC_DTYPE_BF16, FC_MASK_NONE, 0},
        {1, 32, 4, 2, 777, 128, 0, FC_DTYPE_BF16, FC_MASK_NONE, 0},
        {3, 2, 2, 16, 100, 64, 1, FC_DTYPE_FP16, FC_MASK_NONE, 0},
        /* 17-32 rows per KV head: the CUDA-core decode kernel (MQA 32:1; GQA 8:1 x Sq = 3) */
        {1, 32, 1, 1, 2049, 128, 0, FC_DTYPE_FP16, FC_MASK_NONE, 0},
        {2, 16, 2, 3, 500, 64, 1, FC_DTYPE_BF16, FC_MASK_NONE, 0},
        /* attn_mask: every sm80 copy path, ragged Sq/Sk, GQA, causal (the forced sm80 pass; under
         * AUTO on Hopper the first case, 256-byte rows at D=64, runs in the sm90 family's mask
         * tiles, the others in sm80: rows not 16-byte multiples, misaligned, transposed, additive,
         * causal, D=96 / 256) */
        {2, 4, 2, 100, 256, 64, 0, FC_DTYPE_FP16, FC_MASK_BOOL, MASK_BHQK},
        {1, 4, 1, 77, 1000, 128, 0, FC_DTYPE_BF16, FC_MASK_BOOL, MASK_BHQK},
        {2, 2, 2, 130, 201, 64, 0, FC_DTYPE_BF16, FC_MASK_BOOL, MASK_QK_PADDED},
        {1, 2, 1, 65, 130, 128, 0, FC_DTYPE_FP16, FC_MASK_BOOL, MASK_TRANSPOSED},
        {2, 2, 2, 100, 256, 128, 0, FC_DTYPE_FP16, FC_MASK_ADDITIVE, MASK_BHQK},
        {1, 4, 2, 67, 99, 64, 0, FC_DTYPE_BF16, FC_MASK_ADDITIVE, MASK_QK_PADDED},
        {1, 2, 2, 33, 70, 64, 0, FC_DTYPE_FP16, FC_MASK_ADDITIVE, MASK_TRANSPOSED},
        {1, 2, 2, 3, 50, 64, 0, FC_DTYPE_FP16, FC_MASK_BOOL, MASK_BHQK},       /* decode-sized */
        /* the decode kernels' masks (kMasked): 32 rows per KV head (the CUDA-core kernel) and
         * GQA 4 over split keys, misaligned rows, keys strided */
        {2, 8, 1, 4, 3000, 128, 0, FC_DTYPE_BF16, FC_MASK_ADDITIVE, MASK_BHQK},
        {1, 8, 2, 1, 5000, 64, 0, FC_DTYPE_FP16, FC_MASK_BOOL, MASK_TRANSPOSED},
        {2, 4, 4, 2, 777, 128, 0, FC_DTYPE_FP16, FC_MASK_BOOL, MASK_QK_PADDED},
        {1, 2, 2, 150, 150, 64, 1, FC_DTYPE_FP16, FC_MASK_ADDITIVE, MASK_BHQK}, /* causal + mask (C API) */
        /* causal with a bool mask in tiles (under AUTO on Hopper the sm90 family's causal masked
         * configuration, D=64 / 128): Sq < Sk, Sq > Sk, ragged ends, GQA */
        {2, 4, 2, 200, 256, 64, 1, FC_DTYPE_FP16, FC_MASK_BOOL, MASK_BHQK},
        {1, 4, 1, 300, 320, 128, 1, FC_DTYPE_BF16, FC_MASK_BOOL, MASK_BHQK},
        {1, 2, 2, 130, 96, 128, 1, FC_DTYPE_FP16, FC_MASK_BOOL, MASK_BHQK},
        {1, 2, 1, 600, 608, 64, 1, FC_DTYPE_BF16, FC_MASK_BOOL, MASK_BHQK},
        {1, 4, 2, 300, 320, 256, 1, FC_DTYPE_FP16, FC_MASK_BOOL, MASK_BHQK},
        {2, 2, 1, 130, 96, 256, 1, FC_DTYPE_BF16, FC_MASK_BOOL, MASK_BHQK},
        /* head dims 32, 80, 96 (sm80 family only, on Hopper too) and 256 (sm90 under AUTO on
         * Hopper, sm80 forced or on Ada): ragged tiles, GQA, causal, a mask */
        {1, 4, 2, 127, 1000, 32, 1, FC_DTYPE_FP16, FC_MASK_NONE, 0},
        {2, 2, 2, 1000, 17, 80, 0, FC_DTYPE_BF16, FC_MASK_NONE, 0},
        {1, 4, 1, 300, 300, 96, 1, FC_DTYPE_FP16, FC_MASK_NONE, 0},
        {1, 2, 1, 200, 129, 256, 1, FC_DTYPE_BF16, FC_MASK_NONE, 0},
        {1, 2, 2, 100, 256, 96, 0, FC_DTYPE_BF16, FC_MASK_BOOL, MASK_BHQK},
        {1, 2, 2, 67, 99, 256, 0, FC_DTYPE_FP16, FC_MASK_ADDITIVE, MASK_QK_PADDED},
        /* D=256 bool masks in TMA tiles (the sm90 family: 64-key tiles, 64-byte swizzle) */
        {1, 4, 2, 300, 1024, 256, 0, FC_DTYPE_BF16, FC_MASK_BOOL, MASK_BHQK},
        {2, 2, 2, 127, 256, 256, 0, FC_DTYPE_FP16, FC_MASK_BOOL, MASK_BHQK},
    };
    /* Bands (sliding windows, causal aligned bottom-right; the sm90 family's forward under AUTO
     * on Hopper, declined by the sm80 family): {window?, left, right, alignment, band changes
     * the result?}; -1 = unbounded. Rows that see no key (Sq > Sk bottom-right causal, a window
     * past Sk) give zeros and LSE -inf. */
    typedef struct band_case {
        test_case tc;
        test_band band;
    } band_case;
#define TL FC_ALIGN_TOP_LEFT
#define BR FC_ALIGN_BOTTOM_RIGHT
    static const band_case kBandCases[] = {
        {{1, 2, 2, 256, 256, 64, 0, FC_DTYPE_FP16, FC_MASK_NONE, 0}, {1, 0, 0, TL, 1}},      /* the diagonal alone */
        {{1, 2, 2, 127, 127, 128, 0, FC_DTYPE_BF16, FC_MASK_NONE, 0}, {1, 1, 0, TL, 1}},
        {{2, 4, 1, 1000, 1000, 64, 0, FC_DTYPE_FP16, FC_MASK_NONE, 0}, {1, 127, 0, TL, 1}},  /* GQA 4:1 */
        {{1, 2, 2, 300, 300, 128, 0, FC_DTYPE_BF16, FC_MASK_NONE, 0}, {1, 299, 0, TL, 1}},   /* (S-1, 0): plain causal */
        {{1, 4, 1, 1000, 1000, 128, 0, FC_DTYPE_BF16, FC_MASK_NONE, 0}, {1, 64, 32, TL, 1}}, /* asymmetric */
        {{1, 2, 2, 17, 17, 64, 0, FC_DTYPE_FP16, FC_MASK_NONE, 0}, {1, 64, 32, TL, 0}},      /* wider than S: every key */
        {{1, 2, 2, 1000, 1000, 128, 0, FC_DTYPE_FP16, FC_MASK_NONE, 0}, {1, 5000, 3, TL, 1}},
        {{2, 4, 1, 77, 300, 64, 1, FC_DTYPE_BF16, FC_MASK_NONE, 0}, {0, -1, -1, BR, 1}},     /* causal, Sq < Sk */
        {{1, 2, 2, 300, 77, 128, 1, FC_DTYPE_FP16, FC_MASK_NONE, 0}, {0, -1, -1, BR, 1}},    /* causal, Sq > Sk */
        {{1, 4, 1, 127, 1000, 128, 0, FC_DTYPE_BF16, FC_MASK_NONE, 0}, {1, 100, 0, BR, 1}},
        {{1, 2, 2, 1000, 17, 64, 0, FC_DTYPE_FP16, FC_MASK_NONE, 0}, {1, 5, 5, TL, 1}},      /* rows past the keys */
        {{1, 2, 2, 1000, 1000, 64, 1, FC_DTYPE_BF16, FC_MASK_NONE, 0}, {1, 200, 50, TL, 1}}, /* causal cuts the right */
        {{1, 8, 2, 1, 1000, 128, 0, FC_DTYPE_FP16, FC_MASK_NONE, 0}, {1, 256, 0, BR, 1}},    /* one row, sliding window */
        {{1, 4, 1, 3, 500, 64, 1, FC_DTYPE_BF16, FC_MASK_NONE, 0}, {1, 100, -1, BR, 1}},
        /* the decode kernels' bands: speculative steps (16 rows per KV head: tensor cores; 32:
         * the CUDA-core kernel), a window over a long cache (split over the window's keys) */
        {{2, 8, 2, 4, 1000, 128, 1, FC_DTYPE_BF16, FC_MASK_NONE, 0}, {0, -1, -1, BR, 1}},
        {{1, 8, 1, 4, 700, 64, 1, FC_DTYPE_FP16, FC_MASK_NONE, 0}, {0, -1, -1, BR, 1}},
        {{1, 4, 1, 2, 4000, 128, 0, FC_DTYPE_BF16, FC_MASK_NONE, 0}, {1, 300, 0, BR, 1}},
        {{1, 2, 2, 5, 3, 64, 1, FC_DTYPE_FP16, FC_MASK_NONE, 0}, {0, -1, -1, BR, 1}},        /* rows with no key */
    };
    /* The backward's (smaller: compute-sanitizer runs them): a key block's steps start and end
     * at the band's edges, interior tiles unmasked (the (400, 100) window), key blocks no row sees
     * (zero dk, dv), rows that see no key (zero dq). */
    static const band_case kBwdBandCases[] = {
        {{1, 2, 2, 256, 256, 64, 0, FC_DTYPE_FP16, FC_MASK_NONE, 0}, {1, 0, 0, TL, 1}},
        {{1, 2, 2, 127, 127, 128, 0, FC_DTYPE_BF16, FC_MASK_NONE, 0}, {1, 1, 0, TL, 1}},
        {{1, 4, 1, 300, 300, 64, 0, FC_DTYPE_BF16, FC_MASK_NONE, 0}, {1, 127, 0, TL, 1}},
        {{1, 2, 2, 200, 200, 128, 0, FC_DTYPE_FP16, FC_MASK_NONE, 0}, {1, 199, 0, TL, 1}},   /* (S-1, 0): plain causal */
        {{1, 4, 1, 1000, 1000, 64, 0, FC_DTYPE_FP16, FC_MASK_NONE, 0}, {1, 64, 32, TL, 1}},
        {{1, 2, 1, 1000, 1000, 128, 0, FC_DTYPE_BF16, FC_MASK_NONE, 0}, {1, 400, 100, TL, 1}},
        {{1, 2, 2, 17, 17, 128, 0, FC_DTYPE_BF16, FC_MASK_NONE, 0}, {1, 64, 32, TL, 0}},     /* wider than S */
        {{2, 4, 1, 77, 300, 64, 1, FC_DTYPE_BF16, FC_MASK_NONE, 0}, {0, -1, -1, BR, 1}},
        {{1, 2, 2, 300, 77, 128, 1, FC_DTYPE_FP16, FC_MASK_NONE, 0}, {0, -1, -1, BR, 1}},
        {{1, 2, 1, 127, 1000, 128, 0, FC_DTYPE_BF16, FC_MASK_NONE, 0}, {1, 100, 0, BR, 1}},  /* key blocks 0-5 unseen */
        {{1, 2, 2, 1000, 17, 64, 0, FC_DTYPE_FP16, FC_MASK_NONE, 0}, {1, 5, 5, TL, 1}},
        {{1, 2, 2, 300, 300, 128, 1, FC_DTYPE_FP16, FC_MASK_NONE, 0}, {1, 200, 50, TL, 1}},
        {{1, 4, 1, 1, 513, 64, 0, FC_DTYPE_BF16, FC_MASK_NONE, 0}, {1, 100, 0, BR, 1}},
    };
#undef TL
#undef BR
    int failed = 0;
    /* FC_TEST_BWD_ONLY=1: only the backward cases (a quicker compute-sanitizer pass). */
    const int bwd_only = getenv("FC_TEST_BWD_ONLY") != NULL && strcmp(getenv("FC_TEST_BWD_ONLY"), "1") == 0;
    /* AUTO picks the best family for the device (sm90 on Hopper); then the sm80 family forced. */
    const fc_family families[] = {FC_FAMILY_AUTO, FC_FAMILY_SM80};
    for (size_t f = 0; f < (bwd_only ? 0u : 2u); ++f) {
        for (size_t i = 0; i < sizeof(kCases) / sizeof(kCases[0]); ++i) failed += run_case(&kCases[i], families[f], NULL);
        for (size_t i = 0; i < sizeof(kBandCases) / sizeof(kBandCases[0]); ++i)
            failed += run_case(&kBandCases[i].tc, families[f], &kBandCases[i].band);
    }
    /* The fused backward (small shapes: compute-sanitizer runs this whole program). Ragged
     * edges, Sq != Sk both ways (causal Sk > Sq: keys no query sees get zero gradients), GQA 4:1. */
    static const test_case kBwdCases[] = {
        {1, 2, 2, 65, 65, 64, 1, FC_DTYPE_FP16, FC_MASK_NONE, 0},
        {2, 4, 1, 17, 130, 128, 1, FC_DTYPE_BF16, FC_MASK_NONE, 0},
        {1, 4, 2, 100, 33, 64, 0, FC_DTYPE_BF16, FC_MASK_NONE, 0},
        {1, 2, 2, 1, 1, 128, 0, FC_DTYPE_FP16, FC_MASK_NONE, 0},
        {1, 2, 1, 77, 140, 128, 0, FC_DTYPE_FP16, FC_MASK_NONE, 0},
        /* Ten steps per CTA through the two-stage ring (GQA 2, five query tiles), three key blocks. */
        {1, 2, 1, 300, 257, 64, 1, FC_DTYPE_BF16, FC_MASK_NONE, 0},
        /* Masks (either family; AUTO: the sm90 family on Hopper): bool and additive, broadcast
         * over heads, misaligned rows, transposed; GQA; fully masked rows. */
        {2, 4, 2, 100, 256, 64, 0, FC_DTYPE_FP16, FC_MASK_BOOL, MASK_BHQK},   /* TMA mask tiles */
        {1, 4, 2, 130, 208, 128, 0, FC_DTYPE_BF16, FC_MASK_BOOL, MASK_BHQK},  /* tiles, ragged */
        {1, 2, 1, 77, 140, 128, 0, FC_DTYPE_BF16, FC_MASK_BOOL, MASK_QK_PADDED}, /* element reads */
        {1, 2, 2, 65, 130, 128, 0, FC_DTYPE_FP16, FC_MASK_ADDITIVE, MASK_BHQK},
        {1, 4, 2, 67, 99, 64, 0, FC_DTYPE_BF16, FC_MASK_ADDITIVE, MASK_TRANSPOSED},
    };
    failed += run_bwd_table(kBwdCases, sizeof(kBwdCases) / sizeof(kBwdCases[0]), BWD_AUTO);
    /* Causal with a bool mask in tiles: the sm90 family's causal masked variant (c_src/dispatch.c
     * fc_sm90_bool_mask_tiles_; the forward's causal masked configuration too), AUTO only (the sm80-class
     * family declines it): random masks reaching past the diagonal (mask and causal both
     * apply), Sq != Sk both ways, GQA, ragged key blocks, many steps per CTA. */
    static const test_case kBwdMaskCausalCases[] = {
        {2, 4, 2, 200, 256, 64, 1, FC_DTYPE_FP16, FC_MASK_BOOL, MASK_BHQK},
        {1, 4, 1, 300, 320, 128, 1, FC_DTYPE_BF16, FC_MASK_BOOL, MASK_BHQK},
        {1, 2, 2, 130, 96, 128, 1, FC_DTYPE_FP16, FC_MASK_BOOL, MASK_BHQK},
        {1, 2, 1, 600, 608, 64, 1, FC_DTYPE_BF16, FC_MASK_BOOL, MASK_BHQK},
        {1, 4, 2, 300, 320, 256, 1, FC_DTYPE_FP16, FC_MASK_BOOL, MASK_BHQK},
        {2, 2, 1, 130, 96, 256, 1, FC_DTYPE_BF16, FC_MASK_BOOL, MASK_BHQK},
    };
    failed += run_bwd_table(kBwdMaskCausalCases, sizeof(kBwdMaskCausalCases) / sizeof(kBwdMaskCausalCases[0]), BWD_AUTO);
    for (size_t i = 0; i < sizeof(kBwdBandCases) / sizeof(kBwdBandCases[0]); ++i)
        failed += run_bwd_case(&kBwdBandCases[i].tc, &kBwdBandCases[i].band, BWD_AUTO, 0.0f);
    /* D=256 (the sm90 family's own kernel, 64-key blocks): ragged, Sq != Sk both ways, GQA 4:1,
     * one row, and a CTA through many steps of the two-stage ring (five query tiles, GQA 2);
     * causal blocks with no steps (17 queries on 130 or 640 keys), and 320 tiles, more than a
     * grid's CTAs (tiles claimed from the workspace's counter). */
    static const test_case kBwdD256Cases[] = {
        {4, 8, 8, 17, 640, 256, 0, FC_DTYPE_BF16, FC_MASK_NONE, 0},
        {4, 8, 4, 17, 640, 256, 1, FC_DTYPE_FP16, FC_MASK_NONE, 0},
        {1, 2, 2, 65, 65, 256, 1, FC_DTYPE_FP16, FC_MASK_NONE, 0},
        {2, 4, 1, 17, 130, 256, 1, FC_DTYPE_BF16, FC_MASK_NONE, 0},
        {1, 4, 2, 100, 33, 256, 0, FC_DTYPE_BF16, FC_MASK_NONE, 0},
        {1, 2, 2, 1, 1, 256, 0, FC_DTYPE_FP16, FC_MASK_NONE, 0},
        {1, 2, 1, 300, 257, 256, 1, FC_DTYPE_BF16, FC_MASK_NONE, 0},
        {1, 2, 1, 300, 257, 256, 0, FC_DTYPE_FP16, FC_MASK_NONE, 0},
    };
    failed += run_bwd_table(kBwdD256Cases, sizeof(kBwdD256Cases) / sizeof(kBwdD256Cases[0]), BWD_AUTO);
    /* Head dims 32, 80, 96: the sm80-class family's kernels (dQ in a pass of its own, asked for
     * determinism or not), forced, since on Hopper AUTO leaves their forward to PyTorch; shared
     * rows padded to 128 bytes. Causal Sq < Sk, Sq > Sk, GQA 2 and 4, one row, bool and
     * additive masks. */
    static const test_case kBwdOtherDimCases[] = {
        {1, 4, 2, 127, 1000, 32, 1, FC_DTYPE_FP16, FC_MASK_NONE, 0},
        {2, 2, 2, 1000, 17, 80, 0, FC_DTYPE_BF16, FC_MASK_NONE, 0},
        {1, 4, 1, 300, 300, 96, 1, FC_DTYPE_FP16, FC_MASK_NONE, 0},
        {1, 2, 2, 65, 130, 80, 1, FC_DTYPE_FP16, FC_MASK_NONE, 0},
        {1, 2, 2, 1, 1, 96, 0, FC_DTYPE_BF16, FC_MASK_NONE, 0},
        {1, 2, 2, 100, 256, 96, 0, FC_DTYPE_BF16, FC_MASK_BOOL, MASK_BHQK},
        {1, 4, 2, 67, 99, 32, 0, FC_DTYPE_FP16, FC_MASK_ADDITIVE, MASK_TRANSPOSED},
        {1, 2, 1, 77, 140, 80, 0, FC_DTYPE_BF16, FC_MASK_BOOL, MASK_QK_PADDED},
    };
    /* A softcap: the sm90 family without a mask (AUTO on Hopper), the sm80-class family with a
     * mask or forced (dQ in a pass of its own either way); small and large caps, masks, GQA. */
    typedef struct softcap_case {
        test_case tc;
        float softcap;
    } softcap_case;
    static const softcap_case kBwdSoftcapCases[] = {
        {{1, 4, 2, 100, 257, 64, 1, FC_DTYPE_FP16, FC_MASK_NONE, 0}, 5.0f},
        {{1, 2, 2, 77, 140, 128, 0, FC_DTYPE_BF16, FC_MASK_NONE, 0}, 30.0f},
        {{2, 4, 2, 100, 256, 64, 0, FC_DTYPE_FP16, FC_MASK_BOOL, MASK_BHQK}, 20.0f},
        {{1, 2, 1, 77, 140, 128, 0, FC_DTYPE_BF16, FC_MASK_ADDITIVE, MASK_QK_PADDED}, 5.0f},
        {{1, 4, 2, 67, 99, 80, 0, FC_DTYPE_FP16, FC_MASK_BOOL, MASK_TRANSPOSED}, 2.0f},
        {{1, 4, 1, 130, 300, 96, 1, FC_DTYPE_BF16, FC_MASK_NONE, 0}, 50.0f},
        {{1, 2, 2, 65, 65, 32, 0, FC_DTYPE_FP16, FC_MASK_ADDITIVE, MASK_BHQK}, 1.0f},
    };
    for (int way = BWD_AUTO; way <= BWD_SM80_DETERMINISTIC; ++way)
        for (size_t i = 0; i < sizeof(kBwdSoftcapCases) / sizeof(kBwdSoftcapCases[0]); ++i) {
            const test_case *tc = &kBwdSoftcapCases[i].tc;
            /* D = 32 / 80 / 96: the forward under AUTO on Hopper goes to PyTorch (no kernel here) */
            if (way == BWD_AUTO && tc->mask_kind == FC_MASK_NONE && (tc->D == 32 || tc->D == 80 || tc->D == 96)) continue;
            failed += run_bwd_case(tc, NULL, (bwd_way)way, kBwdSoftcapCases[i].softcap);
        }
    /* D=256 with a softcap: the sm90 family's own kernel (P^T (1 - t^2) through the exchange),
     * causal or not, GQA, ragged, a CTA through many steps, a small cap (scores well past it). */
    static const softcap_case kBwdD256SoftcapCases[] = {
        {{1, 2, 2, 65, 65, 256, 1, FC_DTYPE_FP16, FC_MASK_NONE, 0}, 2.0f},
        {{1, 4, 2, 100, 257, 256, 0, FC_DTYPE_BF16, FC_MASK_NONE, 0}, 50.0f},
        {{1, 2, 1, 300, 257, 256, 1, FC_DTYPE_BF16, FC_MASK_NONE, 0}, 20.0f},
        {{2, 4, 1, 17, 130, 256, 0, FC_DTYPE_FP16, FC_MASK_NONE, 0}, 1.0f},
        /* a bool mask with it (Gemma 2's padded batches): every layout, rows that see no key */
        {{2, 4, 2, 100, 256, 256, 0, FC_DTYPE_BF16, FC_MASK_BOOL, MASK_BHQK}, 50.0f},
        {{1, 2, 1, 77, 140, 256, 0, FC_DTYPE_FP16, FC_MASK_BOOL, MASK_QK_PADDED}, 5.0f},
        {{1, 4, 2, 67, 99, 256, 0, FC_DTYPE_BF16, FC_MASK_BOOL, MASK_TRANSPOSED}, 20.0f},
    };
    for (size_t i = 0; i < sizeof(kBwdD256SoftcapCases) / sizeof(kBwdD256SoftcapCases[0]); ++i)
        failed += run_bwd_case(&kBwdD256SoftcapCases[i].tc, NULL, BWD_AUTO, kBwdD256SoftcapCases[i].softcap);
    /* D=256 with a band (the sm90 family's own kernel, 64-key blocks), with and without a
     * softcap (Gemma 2's sliding layers): the diagonal alone, a window with interior steps
     * unmasked, GQA 4:1, bottom-right causal with rows that see no key, key blocks no row sees
     * (zero dk, dv), one row. */
    typedef struct band_softcap_case {
        test_case tc;
        test_band band;
        float softcap;
    } band_softcap_case;
    static const band_softcap_case kBwdD256BandCases[] = {
        {{1, 2, 2, 256, 256, 256, 0, FC_DTYPE_FP16, FC_MASK_NONE, 0}, {1, 0, 0, FC_ALIGN_TOP_LEFT, 1}, 0.0f},
        {{1, 4, 1, 300, 300, 256, 0, FC_DTYPE_BF16, FC_MASK_NONE, 0}, {1, 127, 0, FC_ALIGN_TOP_LEFT, 1}, 0.0f},
        {{1, 2, 1, 600, 600, 256, 0, FC_DTYPE_BF16, FC_MASK_NONE, 0}, {1, 300, 100, FC_ALIGN_TOP_LEFT, 1}, 0.0f},
        {{1, 2, 2, 300, 77, 256, 1, FC_DTYPE_FP16, FC_MASK_NONE, 0}, {0, -1, -1, FC_ALIGN_BOTTOM_RIGHT, 1}, 0.0f},
        {{1, 2, 1, 127, 1000, 256, 0, FC_DTYPE_BF16, FC_MASK_NONE, 0}, {1, 100, 0, FC_ALIGN_BOTTOM_RIGHT, 1}, 30.0f},
        {{2, 4, 2, 200, 200, 256, 1, FC_DTYPE_BF16, FC_MASK_NONE, 0}, {1, 64, 0, FC_ALIGN_TOP_LEFT, 1}, 50.0f},
        {{1, 2, 2, 1, 513, 256, 0, FC_DTYPE_FP16, FC_MASK_NONE, 0}, {1, 100, 0, FC_ALIGN_BOTTOM_RIGHT, 1}, 5.0f},
    };
    for (size_t i = 0; i < sizeof(kBwdD256BandCases) / sizeof(kBwdD256BandCases[0]); ++i)
        failed += run_bwd_case(&kBwdD256BandCases[i].tc, &kBwdD256BandCases[i].band, BWD_AUTO,
                               kBwdD256BandCases[i].softcap);
    /* D=256 with a mask (the sm90 family's kernel: bool masks with 16-byte rows in TMA tiles,
     * the others element by element): bool in every layout and additive, GQA, Sq != Sk both ways,
     * a CTA through many steps, rows that see no key, a ragged last key block in tiles. */
    static const test_case kBwdD256MaskCases[] = {
        {2, 4, 2, 100, 256, 256, 0, FC_DTYPE_FP16, FC_MASK_BOOL, MASK_BHQK},
        {1, 4, 2, 300, 272, 256, 0, FC_DTYPE_BF16, FC_MASK_BOOL, MASK_BHQK},
        {1, 2, 1, 300, 257, 256, 0, FC_DTYPE_BF16, FC_MASK_BOOL, MASK_BHQK},
        {1, 2, 1, 77, 140, 256, 0, FC_DTYPE_BF16, FC_MASK_BOOL, MASK_QK_PADDED},
        {1, 4, 2, 67, 99, 256, 0, FC_DTYPE_FP16, FC_MASK_BOOL, MASK_TRANSPOSED},
        {1, 2, 2, 65, 130, 256, 0, FC_DTYPE_FP16, FC_MASK_ADDITIVE, MASK_BHQK},
        {1, 4, 2, 130, 33, 256, 0, FC_DTYPE_BF16, FC_MASK_ADDITIVE, MASK_TRANSPOSED},
    };
    failed += run_bwd_table(kBwdD256MaskCases, sizeof(kBwdD256MaskCases) / sizeof(kBwdD256MaskCases[0]), BWD_AUTO);
    /* The sm80-class family's two ways, masks included (it takes no band), at every head dim it has. */
    for (int way = BWD_SM80_ONE_PASS; way <= BWD_SM80_DETERMINISTIC; ++way) {
        failed += run_bwd_table(kBwdOtherDimCases, sizeof(kBwdOtherDimCases) / sizeof(kBwdOtherDimCases[0]), (bwd_way)way);
        failed += run_bwd_table(kBwdCases, sizeof(kBwdCases) / sizeof(kBwdCases[0]), (bwd_way)way);
    }
    if (failed) {
        fprintf(stderr, "%d case(s) failed\n", failed);
        return 1;
    }
    printf("all C API GPU cases passed\n");
    return 0;
}
