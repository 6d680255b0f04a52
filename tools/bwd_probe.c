/*
 * bwd_probe.c - times fc_sdpa_bwd through the C API alone (no PyTorch), per kernel family, on the
 * backward sweep: 16k tokens (B = 16384 / S), hidden 2048 (H = 2048 / D), fp16. Prints one line
 * per (family, D, causal, S): the median of 20 timed calls (CUDA events, after 3 warm-up calls)
 * and TFLOP/s = 2.5 x the forward's FLOPs (causal counts half) / time. A probe for kernel work
 * on the GPU machine; bench/bench.py times the op beside PyTorch's backends.
 *
 *   nvcc -O2 -o build/bwd_probe tools/bwd_probe.c -Ic_src -Lpython/flashcore -lflashcore \
 *        -Xlinker -rpath=python/flashcore && build/bwd_probe [S ...]
 * PROBE_FAMILIES=sm90 (or sm80) times one family only; PROBE_DIMS=128 (or 64, 256) one head dim
 * (D=256: the sm90 family alone has a backward kernel). PROBE_MASK=hf times the non-causal calls
 * with HuggingFace's left-padded causal bool mask instead ((B, 1, S, S), sequence b padded by
 * b S / 2B keys, bench.py's masked rows; the causal calls are left out), for Nsight Compute's
 * pass over the masked kernels; TFLOP/s then counts every (query, key) pair, as bench.py does.
 */
#include "flashcore.h"

#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(x)                                                                               \
    do {                                                                                       \
        cudaError_t e_ = (x);                                                                  \
        if (e_ != cudaSuccess) {                                                               \
            fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));        \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

static void fill_random(void *dst, size_t n) { /* fp16 in [-1, 1) from a fixed LCG */
    uint16_t *h = malloc(n * 2);
    uint32_t s = 12345;
    for (size_t i = 0; i < n; ++i) {
        s = s * 1664525u + 1013904223u;
        const float x = (float)((s >> 9) & 0xffff) / 32768.f - 1.f;
        /* float to fp16 by truncation: sign, exponent, 10 mantissa bits */
        uint32_t b;
        memcpy(&b, &x, 4);
        const uint32_t sign = (b >> 16) & 0x8000u;
        const int exp = (int)((b >> 23) & 0xff) - 127 + 15;
        h[i] = (uint16_t)(exp <= 0 ? sign : sign | ((uint32_t)exp << 10) | ((b >> 13) & 0x3ffu));
    }
    CHECK(cudaMemcpy(dst, h, n * 2, cudaMemcpyHostToDevice));
    free(h);
}

/* HuggingFace's left-padded causal mask as bytes, (B, 1, S, S): row i of sequence b sees keys
 * j <= i from its padding on (b S / 2B keys), and itself. */
static void *hf_mask(int64_t B, int64_t S) {
    unsigned char *h = malloc((size_t)(B * S * S));
    for (int64_t b = 0; b < B; ++b)
        for (int64_t i = 0; i < S; ++i)
            for (int64_t j = 0; j < S; ++j)
                h[(b * S + i) * S + j] = (unsigned char)(j <= i && (j >= b * S / (2 * B) || j == i));
    void *d = NULL;
    CHECK(cudaMalloc(&d, (size_t)(B * S * S)));
    CHECK(cudaMemcpy(d, h, (size_t)(B * S * S), cudaMemcpyHostToDevice));
    free(h);
    return d;
}

static int cmp_float(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static void run(int64_t S, int64_t D, int causal, fc_family family, int masked) {
    const int64_t B = 16384 / S, H = 2048 / D;
    const size_t n = (size_t)(B * H * S * D);
    void *q, *k, *v, *o, *dout, *dq, *dk, *dv, *ws;
    float *lse;
    CHECK(cudaMalloc(&q, n * 2)); CHECK(cudaMalloc(&k, n * 2)); CHECK(cudaMalloc(&v, n * 2));
    CHECK(cudaMalloc(&o, n * 2)); CHECK(cudaMalloc(&dout, n * 2)); CHECK(cudaMalloc(&dq, n * 2));
    CHECK(cudaMalloc(&dk, n * 2)); CHECK(cudaMalloc(&dv, n * 2));
    CHECK(cudaMalloc((void **)&lse, (size_t)(B * H * S) * 4));
    fill_random(q, n); fill_random(k, n); fill_random(v, n); fill_random(dout, n);

    fc_bwd_params b;
    fc_bwd_params_init(&b);
    fc_params *p = &b.fwd;
    p->q = q; p->k = k; p->v = v; p->out = o; p->lse = lse;
    p->batch = B; p->heads_q = p->heads_kv = H; p->seqlen_q = p->seqlen_k = S; p->head_dim = D;
    p->scale = 0.125f; p->causal = causal; p->dtype = FC_DTYPE_FP16;
    b.dout = dout; b.dq = dq; b.dk = dk; b.dv = dv;
    fc_bwd_params_set_contiguous_strides(&b);
    void *mask = masked ? hf_mask(B, S) : NULL;
    if (masked) {
        p->mask = mask; p->mask_kind = FC_MASK_BOOL;
        p->mask_stride_b = S * S; p->mask_stride_h = 0; p->mask_stride_q = S; p->mask_stride_k = 1;
    }
    fc_status st = fc_sdpa_fwd(p, 0);
    if (st != FC_OK) { fprintf(stderr, "fwd: %s\n", fc_status_string(st)); exit(1); }
    p->family = family;
    int64_t ws_bytes = 0;
    fc_sdpa_bwd_workspace_size(&b, &ws_bytes);
    CHECK(cudaMalloc(&ws, (size_t)ws_bytes));
    b.workspace = ws; b.workspace_bytes = ws_bytes;

    enum { kWarmup = 3, kIters = 20 };
    float ms[kIters];
    cudaEvent_t start, stop;
    CHECK(cudaEventCreate(&start)); CHECK(cudaEventCreate(&stop));
    for (int i = 0; i < kWarmup + kIters; ++i) {
        CHECK(cudaEventRecord(start, 0));
        st = fc_sdpa_bwd(&b, 0);
        CHECK(cudaEventRecord(stop, 0));
        if (st != FC_OK) {
            fprintf(stderr, "bwd: %s (%s)\n", fc_status_string(st), cudaGetErrorString(fc_last_cuda_error()));
            exit(1);
        }
        CHECK(cudaEventSynchronize(stop));
        if (i >= kWarmup) CHECK(cudaEventElapsedTime(&ms[i - kWarmup], start, stop));
    }
    qsort(ms, kIters, sizeof(float), cmp_float);
    const double med = ms[kIters / 2] * 1e-3;
    const double flops = 2.5 * 4.0 * (double)B * H * S * S * D / (causal ? 2.0 : 1.0);
    printf("bwd %s D=%-3lld %-6s S=%-6lld %9.1f us %7.1f TFLOP/s\n", family == FC_FAMILY_SM90 ? "sm90" : "sm80",
           (long long)D, masked ? "hfmask" : causal ? "causal" : "full", (long long)S, med * 1e6, flops / med * 1e-12);
    fflush(stdout);
    cudaFree(q); cudaFree(k); cudaFree(v); cudaFree(o); cudaFree(dout); cudaFree(dq); cudaFree(dk);
    cudaFree(dv); cudaFree(lse); cudaFree(ws); cudaFree(mask);
    cudaEventDestroy(start); cudaEventDestroy(stop);
}

int main(int argc, char **argv) {
    int64_t lens[8] = {1024, 4096, 16384};
    int nlens = 3;
    if (argc > 1) {
        nlens = 0;
        for (int i = 1; i < argc && nlens < 8; ++i) lens[nlens++] = atoll(argv[i]);
    }
    /* PROBE_FAMILIES=sm90 (or sm80) times one family only. */
    const char *only = getenv("PROBE_FAMILIES");
    const fc_family families[2] = {FC_FAMILY_SM90, FC_FAMILY_SM80};
    const char *dims = getenv("PROBE_DIMS"); /* e.g. "128": only that head dim */
    const int masked = getenv("PROBE_MASK") != NULL && strcmp(getenv("PROBE_MASK"), "hf") == 0;
    for (int d = 64; d <= 256; d *= 2)
        for (int causal = 0; causal <= (masked ? 0 : 1); ++causal)
            if (dims == NULL || atoi(dims) == d)
            for (int i = 0; i < nlens; ++i)
                for (int f = 0; f < 2; ++f)
                    if ((only == NULL || strcmp(only, families[f] == FC_FAMILY_SM90 ? "sm90" : "sm80") == 0) &&
                        (d < 256 || families[f] == FC_FAMILY_SM90))
                        run(lens[i], d, causal, families[f], masked);
    return 0;
}
