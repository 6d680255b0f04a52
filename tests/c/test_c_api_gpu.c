/*
 * test_c_api_gpu.c - FlashCore used from plain C, with no PyTorch: cudaMalloc'd buffers,
 * fc_sdpa_fwd on a stream, results checked against a float64 CPU reference computed from the
 * same (rounded) 16-bit inputs. Also checks the LSE output and that every output element was
 * written (the output is poisoned with NaN bytes first).
 *
 * Masked cases (bool and additive attn_mask, in three layouts that take the kernel's three ways
 * of copying mask tiles: 16-byte cp.async, narrower cp.async on misaligned rows, and element by
 * element for a transposed mask) include fully masked rows (output exactly 0, LSE -inf) and
 * -inf additive entries; compute-sanitizer runs this file in ci/gpu.sh.
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

#define CUDA_OK(call)                                                                        \
    do {                                                                                     \
        cudaError_t e_ = (call);                                                             \
        if (e_ != cudaSuccess) {                                                             \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(1);                                                                         \
        }                                                                                    \
    } while (0)

/* ---- 16-bit float conversions (round to nearest even) ---- */
static uint16_t float_to_half(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 16) & 0x8000u;
    int32_t exp = (int32_t)((x >> 23) & 0xff) - 127 + 15;
    uint32_t mant = x & 0x7fffffu;
    if (exp >= 31) return (uint16_t)(sign | 0x7c00u); /* overflow (inputs here never are) */
    if (exp <= 0) {                                   /* subnormal or zero */
        if (exp < -10) return (uint16_t)sign;
        mant |= 0x800000u;
        const int shift = 14 - exp;
        uint32_t h = mant >> shift;
        const uint32_t rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1))) ++h;
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((uint32_t)exp << 10) | (mant >> 13);
    const uint32_t rem = mant & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) ++h;
    return (uint16_t)(sign | h);
}

static float half_to_float(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ffu;
    uint32_t x;
    if (exp == 0) {
        if (mant == 0) {
            x = sign;
        } else { /* subnormal */
            float f = ldexpf((float)mant, -24);
            return sign ? -f : f;
        }
    } else if (exp == 31) {
        x = sign | 0x7f800000u | (mant << 13);
    } else {
        x = sign | ((exp - 15 + 127) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &x, 4);
    return f;
}

static uint16_t float_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

static float bf16_to_float(uint16_t b) {
    const uint32_t x = (uint32_t)b << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

static float to_float(uint16_t v, fc_dtype dt) { return dt == FC_DTYPE_FP16 ? half_to_float(v) : bf16_to_float(v); }
static uint16_t from_float(float f, fc_dtype dt) { return dt == FC_DTYPE_FP16 ? float_to_half(f) : float_to_bf16(f); }

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

static int run_case(const test_case *tc, fc_family family) {

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
    const uint8_t *m8 = mask.m8;
    const uint16_t *m16 = mask.m16;

    /* Workspace, when the chosen kernel can use one (the split-KV decode path). */
    int64_t ws_bytes = 0;
    fc_status st = fc_sdpa_workspace_size(&p, &ws_bytes);
    if (st == FC_UNSUPPORTED_SLOWER && family == FC_FAMILY_AUTO) {
        /* AUTO on Hopper leaves D=32/80/96 to PyTorch's cuDNN path; the forced sm80 pass runs it. */
        printf("skip auto D=%lld: %s\n", (long long)D, fc_status_string(st));
        free_mask(&mask);
        free(hq); free(hk); free(hv); free(ho); free(hlse);
        CUDA_OK(cudaFree(dq)); CUDA_OK(cudaFree(dk)); CUDA_OK(cudaFree(dv)); CUDA_OK(cudaFree(dout)); CUDA_OK(cudaFree(dlse));
        return 0;
    }
    if (st != FC_OK) {
        fprintf(stderr, "FAIL fc_sdpa_workspace_size: %s\n", fc_status_string(st));
        return 1;
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
    double *scores = malloc((size_t)Sk * sizeof(double));
    for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < Hq; ++h) {
            const int64_t hk_ = h / (Hq / Hkv);
            for (int64_t i = 0; i < Sq; ++i) {
                const uint16_t *qrow = hq + ((b * Hq + h) * Sq + i) * D;
                const int64_t n_keys = tc->causal ? (i + 1 < Sk ? i + 1 : Sk) : Sk;
                double mx = -INFINITY;
                for (int64_t j = 0; j < n_keys; ++j) {
                    const uint16_t *krow = hk + ((b * Hkv + hk_) * Sk + j) * D;
                    double dot = 0;
                    for (int64_t d = 0; d < D; ++d) dot += (double)to_float(qrow[d], tc->dtype) * to_float(krow[d], tc->dtype);
                    scores[j] = dot * p.scale;
                    if (tc->mask_kind != FC_MASK_NONE) scores[j] += mask_score(tc, &p, m16, m8, b, h, i, j);
                    if (scores[j] > mx) mx = scores[j];
                }
                const float got_lse = hlse[(b * Hq + h) * Sq + i];
                if (mx == -INFINITY) {
                    /* Every key masked: PyTorch returns zeros for the row, and its LSE is -inf. */
                    if (!(got_lse == -INFINITY)) ++bad;
                    for (int64_t d = 0; d < D; ++d)
                        if (to_float(ho[((b * Hq + h) * Sq + i) * D + d], tc->dtype) != 0.0f) ++bad;
                    continue;
                }
                double sum = 0;
                for (int64_t j = 0; j < n_keys; ++j) { scores[j] = exp(scores[j] - mx); sum += scores[j]; }
                const double lse_err = fabs(got_lse - (mx + log(sum)));
                if (!(lse_err <= 1e-3 * (1 + fabs(mx + log(sum))))) ++bad;
                if (lse_err > max_lse_err || isnan(lse_err)) max_lse_err = lse_err;
                for (int64_t d = 0; d < D; ++d) {
                    double ref = 0;
                    for (int64_t j = 0; j < n_keys; ++j)
                        ref += scores[j] * to_float(hv[((b * Hkv + hk_) * Sk + j) * D + d], tc->dtype);
                    ref /= sum;
                    const double got = to_float(ho[((b * Hq + h) * Sq + i) * D + d], tc->dtype);
                    const double err = fabs(got - ref);
                    if (!(err <= atol + rtol * fabs(ref))) ++bad; /* NaN fails here too */
                    if (err > max_err || isnan(err)) max_err = err;
                }
            }
        }
    static const char *const kMaskNames[] = {"", " bool-mask", " additive-mask"};
    static const char *const kLayoutNames[] = {"(B,1,Sq,Sk)", "(Sq,Sk)-misaligned", "transposed"};
    printf("%s family=%s ws=%lld B=%lld Hq=%lld Hkv=%lld Sq=%lld Sk=%lld D=%lld causal=%d %s%s%s: max|err| %.2e, max|lse err| %.2e, %d bad\n",
           bad ? "FAIL" : "ok  ", family == FC_FAMILY_SM80 ? "sm80" : "auto", (long long)ws_bytes, (long long)B, (long long)Hq, (long long)Hkv, (long long)Sq, (long long)Sk,
           (long long)D, tc->causal, tc->dtype == FC_DTYPE_FP16 ? "fp16" : "bf16", kMaskNames[tc->mask_kind],
           tc->mask_kind != FC_MASK_NONE ? kLayoutNames[tc->mask_layout] : "", max_err, max_lse_err, bad);
    free_mask(&mask);

    free(scores); free(hq); free(hk); free(hv); free(ho); free(hlse);
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
static int run_bwd_case(const test_case *tc) {
    if (fc_test_left_out(tc->D, tc->dtype)) {
        printf("skip backward D=%lld dtype %d: this build left its kernel out\n", (long long)tc->D, (int)tc->dtype);
        return 0;
    }
    if (tc->mask_kind != FC_MASK_NONE) {
        int dev = 0, major = 0;
        CUDA_OK(cudaGetDevice(&dev));
        CUDA_OK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
        if (major != 9) {
            printf("skip masked backward: only the sm90 family takes masks\n");
            return 0;
        }
    }
    const int64_t B = tc->B, Hq = tc->Hq, Hkv = tc->Hkv, Sq = tc->Sq, Sk = tc->Sk, D = tc->D;
    const int64_t G = Hq / Hkv;
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
    b.dout = d_do; b.dq = d_dq; b.dk = d_dk; b.dv = d_dv;
    fc_bwd_params_set_contiguous_strides(&b);
    test_mask mask;
    make_mask(tc, &mask);
    set_mask(tc, &mask, p);

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

    /* float64 reference: per (b, h) the full Sq x Sk probabilities. */
    double *rdq = calloc(nq, sizeof(double)), *rdk = calloc(nk, sizeof(double)), *rdv = calloc(nk, sizeof(double));
    double *P = malloc((size_t)(Sq * Sk) * sizeof(double)), *dS = malloc((size_t)(Sq * Sk) * sizeof(double));
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
                    P[i * Sk + j] = (tc->causal && j > i) ? -INFINITY : dot * p->scale;
                    if (tc->mask_kind != FC_MASK_NONE) P[i * Sk + j] += mask_score(tc, p, mask.m16, mask.m8, bb, h, i, j);
                    if (P[i * Sk + j] > mx) mx = P[i * Sk + j];
                }
                /* A fully masked row: P = 0 (its gradients are zero, as the forward's output). */
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
                    dS[i * Sk + j] = P[i * Sk + j] * (dp - delta);
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
    const double rel = tc->dtype == FC_DTYPE_FP16 ? 1e-2 : 4e-2;
    const uint16_t *got[3] = {hdq, hdk, hdv};
    const double *ref[3] = {rdq, rdk, rdv};
    const size_t n[3] = {nq, nk, nk};
    const char *names[3] = {"dq", "dk", "dv"};
    int bad = 0;
    for (int t = 0; t < 3; ++t) {
        double max_ref = 1.0, max_err = 0;
        for (size_t i = 0; i < n[t]; ++i) if (fabs(ref[t][i]) > max_ref) max_ref = fabs(ref[t][i]);
        for (size_t i = 0; i < n[t]; ++i) {
            const double err = fabs(to_float(got[t][i], tc->dtype) - ref[t][i]);
            if (!(err <= max_err)) max_err = err; /* NaN sticks */
        }
        const int ok = max_err <= rel * max_ref;
        bad += !ok;
        static const char *const kMaskNames[] = {"", " bool-mask", " additive-mask"};
        printf("%s bwd B=%lld Hq=%lld Hkv=%lld Sq=%lld Sk=%lld D=%lld causal=%d %s%s %s: max|err| %.2e (tol %.2e)\n",
               ok ? "ok  " : "FAIL", (long long)B, (long long)Hq, (long long)Hkv, (long long)Sq, (long long)Sk,
               (long long)D, tc->causal, tc->dtype == FC_DTYPE_FP16 ? "fp16" : "bf16", kMaskNames[tc->mask_kind],
               names[t], max_err, rel * max_ref);
    }
    free(hq); free(hk); free(hv); free(hdo); free(hdq); free(hdk); free(hdv);
    free(rdq); free(rdk); free(rdv); free(P); free(dS);
    free_mask(&mask);
    void *bufs[] = {d_q, d_k, d_v, d_o, d_do, d_dq, d_dk, d_dv, d_lse, d_ws};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); ++i) CUDA_OK(cudaFree(bufs[i]));
    CUDA_OK(cudaStreamDestroy(stream));
    return bad != 0;
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
        /* attn_mask (sm80 family under AUTO too): every copy path, ragged Sq/Sk, GQA, causal */
        {2, 4, 2, 100, 256, 64, 0, FC_DTYPE_FP16, FC_MASK_BOOL, MASK_BHQK},
        {1, 4, 1, 77, 1000, 128, 0, FC_DTYPE_BF16, FC_MASK_BOOL, MASK_BHQK},
        {2, 2, 2, 130, 201, 64, 0, FC_DTYPE_BF16, FC_MASK_BOOL, MASK_QK_PADDED},
        {1, 2, 1, 65, 130, 128, 0, FC_DTYPE_FP16, FC_MASK_BOOL, MASK_TRANSPOSED},
        {2, 2, 2, 100, 256, 128, 0, FC_DTYPE_FP16, FC_MASK_ADDITIVE, MASK_BHQK},
        {1, 4, 2, 67, 99, 64, 0, FC_DTYPE_BF16, FC_MASK_ADDITIVE, MASK_QK_PADDED},
        {1, 2, 2, 33, 70, 64, 0, FC_DTYPE_FP16, FC_MASK_ADDITIVE, MASK_TRANSPOSED},
        {1, 2, 2, 3, 50, 64, 0, FC_DTYPE_FP16, FC_MASK_BOOL, MASK_BHQK},       /* decode-sized */
        {1, 2, 2, 150, 150, 64, 1, FC_DTYPE_FP16, FC_MASK_ADDITIVE, MASK_BHQK}, /* causal + mask (C API) */
        /* head dims 32, 80, 96 (sm80 family only, on Hopper too) and 256 (sm90 under AUTO on
         * Hopper, sm80 forced or on Ada): ragged tiles, GQA, causal, a mask */
        {1, 4, 2, 127, 1000, 32, 1, FC_DTYPE_FP16, FC_MASK_NONE, 0},
        {2, 2, 2, 1000, 17, 80, 0, FC_DTYPE_BF16, FC_MASK_NONE, 0},
        {1, 4, 1, 300, 300, 96, 1, FC_DTYPE_FP16, FC_MASK_NONE, 0},
        {1, 2, 1, 200, 129, 256, 1, FC_DTYPE_BF16, FC_MASK_NONE, 0},
        {1, 2, 2, 100, 256, 96, 0, FC_DTYPE_BF16, FC_MASK_BOOL, MASK_BHQK},
        {1, 2, 2, 67, 99, 256, 0, FC_DTYPE_FP16, FC_MASK_ADDITIVE, MASK_QK_PADDED},
    };
    int failed = 0;
    /* FC_TEST_BWD_ONLY=1: only the backward cases (a quicker compute-sanitizer pass). */
    const int bwd_only = getenv("FC_TEST_BWD_ONLY") != NULL && strcmp(getenv("FC_TEST_BWD_ONLY"), "1") == 0;
    /* AUTO picks the best family for the device (sm90 on Hopper); then the sm80 family forced. */
    const fc_family families[] = {FC_FAMILY_AUTO, FC_FAMILY_SM80};
    for (size_t f = 0; f < (bwd_only ? 0u : 2u); ++f)
        for (size_t i = 0; i < sizeof(kCases) / sizeof(kCases[0]); ++i) failed += run_case(&kCases[i], families[f]);
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
        /* Masks (the sm90 family on Hopper; elsewhere the call is declined and the case skips):
         * bool and additive, broadcast over heads, misaligned rows, transposed; GQA; fully masked rows. */
        {2, 4, 2, 100, 256, 64, 0, FC_DTYPE_FP16, FC_MASK_BOOL, MASK_BHQK},   /* TMA mask tiles */
        {1, 4, 2, 130, 208, 128, 0, FC_DTYPE_BF16, FC_MASK_BOOL, MASK_BHQK},  /* tiles, ragged */
        {1, 2, 1, 77, 140, 128, 0, FC_DTYPE_BF16, FC_MASK_BOOL, MASK_QK_PADDED}, /* element reads */
        {1, 2, 2, 65, 130, 128, 0, FC_DTYPE_FP16, FC_MASK_ADDITIVE, MASK_BHQK},
        {1, 4, 2, 67, 99, 64, 0, FC_DTYPE_BF16, FC_MASK_ADDITIVE, MASK_TRANSPOSED},
    };
    for (size_t i = 0; i < sizeof(kBwdCases) / sizeof(kBwdCases[0]); ++i) failed += run_bwd_case(&kBwdCases[i]);
    if (failed) {
        fprintf(stderr, "%d case(s) failed\n", failed);
        return 1;
    }
    printf("all C API GPU cases passed\n");
    return 0;
}
