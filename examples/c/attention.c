/*
 * attention.c - FlashCore from plain C: causal grouped-query attention on the GPU through the
 * installed library (flashcore.h), checked against a CPU reference.
 *
 * q (B, Hq, S, D), k and v (B, Hkv, S, D), bf16, contiguous; out the same shape as q. The
 * program fills the inputs, runs fc_sdpa_fwd on the default stream, copies the output back and
 * compares every element with attention computed in double precision from the same bf16 inputs.
 * Without a CUDA device it prints what fc_sdpa_support answers for an H100 (sm_90), a check
 * that needs no GPU, and exits 77 (ctest's "skipped").
 *
 * Build against an installed FlashCore (cmake --install build --prefix P):
 *     CMake:      find_package(flashcore) and link flashcore::flashcore (examples/c/CMakeLists.txt)
 *     pkg-config: cc attention.c $(PKG_CONFIG_PATH=P/lib/pkgconfig pkg-config --cflags --libs flashcore) -lm
 */
#include <flashcore.h>

#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { B = 2, HQ = 8, HKV = 2, S = 300, D = 64 };

/* bf16 is the top half of an fp32: round to nearest even, then keep the high 16 bits. */
static uint16_t to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}
static double from_bf16(uint16_t h) {
    const uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

/* Uniform values in [-1, 1) from a fixed seed, rounded to bf16. */
static void fill(uint16_t *a, size_t n, uint32_t seed) {
    for (size_t i = 0; i < n; ++i) {
        seed = seed * 1664525u + 1013904223u;
        a[i] = to_bf16((float)(seed >> 8) / (float)(1u << 23) - 1.0f);
    }
}

/* One output row of causal attention (query i sees keys 0..i) in double precision, and for each
 * column the size of the sum behind it, sum_j p_j |v_j| (what rounding P to bf16 scales with). */
static void reference_row(const uint16_t *q, const uint16_t *k, const uint16_t *v, double scale, int i,
                          double *out, double *size) {
    double scores[S], max = -INFINITY, sum = 0.0;
    for (int j = 0; j <= i; ++j) {
        double dot = 0.0;
        for (int d = 0; d < D; ++d) dot += from_bf16(q[i * D + d]) * from_bf16(k[j * D + d]);
        scores[j] = dot * scale;
        if (scores[j] > max) max = scores[j];
    }
    for (int d = 0; d < D; ++d) out[d] = size[d] = 0.0;
    for (int j = 0; j <= i; ++j) {
        const double p = exp(scores[j] - max);
        sum += p;
        for (int d = 0; d < D; ++d) {
            out[d] += p * from_bf16(v[j * D + d]);
            size[d] += p * fabs(from_bf16(v[j * D + d]));
        }
    }
    for (int d = 0; d < D; ++d) out[d] /= sum, size[d] /= sum;
}

static int cuda_failed(cudaError_t e, const char *what) {
    if (e == cudaSuccess) return 0;
    fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    return 1;
}

int main(void) {
    const size_t q_elems = (size_t)B * HQ * S * D, kv_elems = (size_t)B * HKV * S * D;
    uint16_t *q = malloc(q_elems * 2), *k = malloc(kv_elems * 2), *v = malloc(kv_elems * 2);
    uint16_t *out = malloc(q_elems * 2);
    if (!q || !k || !v || !out) return 1;
    fill(q, q_elems, 1), fill(k, kv_elems, 2), fill(v, kv_elems, 3);

    /* The call, described once: sizes, dtype, scale, causal; contiguous strides. */
    fc_params p;
    fc_params_init(&p);
    p.batch = B, p.heads_q = HQ, p.heads_kv = HKV, p.seqlen_q = S, p.seqlen_k = S, p.head_dim = D;
    p.dtype = FC_DTYPE_BF16;
    p.scale = 1.0f / sqrtf((float)D);
    p.causal = 1;
    fc_params_set_contiguous_strides(&p);

    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
        /* fc_sdpa_support reads no pointer but checks that each is set and 16-byte aligned:
         * a stand-in host buffer answers for the device buffers. */
        static _Alignas(16) unsigned char stand_in[16];
        p.q = p.k = p.v = p.out = stand_in;
        const fc_status s = fc_sdpa_support(&p, 9, 0);
        printf("no CUDA device; on an H100 (sm_90) this call would %s\n",
               s == FC_OK ? "run a FlashCore kernel" : fc_status_string(s));
        return 77;
    }

    void *dq, *dk, *dv, *dout, *workspace = NULL;
    int64_t workspace_bytes = 0;
    if (cuda_failed(cudaMalloc(&dq, q_elems * 2), "cudaMalloc") || cuda_failed(cudaMalloc(&dk, kv_elems * 2), "cudaMalloc") ||
        cuda_failed(cudaMalloc(&dv, kv_elems * 2), "cudaMalloc") || cuda_failed(cudaMalloc(&dout, q_elems * 2), "cudaMalloc"))
        return 1;
    cudaMemcpy(dq, q, q_elems * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(dk, k, kv_elems * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(dv, v, kv_elems * 2, cudaMemcpyHostToDevice);
    p.q = dq, p.k = dk, p.v = dv, p.out = dout;

    /* Optional scratch (split-KV decoding uses it; this call needs none, but asking is cheap). */
    fc_status status = fc_sdpa_workspace_size(&p, &workspace_bytes);
    if (status == FC_OK && workspace_bytes > 0 && cudaMalloc(&workspace, (size_t)workspace_bytes) == cudaSuccess)
        p.workspace = workspace, p.workspace_bytes = workspace_bytes;
    if (status == FC_OK) status = fc_sdpa_fwd(&p, 0);
    if (status != FC_OK) {
        fprintf(stderr, "fc_sdpa_fwd: %s\n", fc_status_string(status));
        return 1;
    }
    if (cuda_failed(cudaMemcpy(out, dout, q_elems * 2, cudaMemcpyDeviceToHost), "the kernel")) return 1;

    /* Every element against the reference: the kernel rounds P and the output to bf16 (relative
     * error 2^-8 at most each); allowed: 4x those, on the output and on the sum behind it. */
    double worst = 0.0, row[D], size[D];
    int bad = 0;
    for (int b = 0; b < B; ++b)
        for (int h = 0; h < HQ; ++h) {
            const size_t qo = ((size_t)b * HQ + h) * S * D, kvo = ((size_t)b * HKV + h / (HQ / HKV)) * S * D;
            for (int i = 0; i < S; ++i) {
                reference_row(q + qo, k + kvo, v + kvo, p.scale, i, row, size);
                for (int d = 0; d < D; ++d) {
                    const double err = fabs(from_bf16(out[qo + (size_t)i * D + d]) - row[d]);
                    if (err > worst) worst = err;
                    if (!(err <= 4.0 * 0x1p-8 * (fabs(row[d]) + size[d]))) ++bad;
                }
            }
        }
    printf("flashcore attention B=%d Hq=%d Hkv=%d S=%d D=%d causal bf16: max |out - reference| %.2e, %s\n", B, HQ,
           HKV, S, D, worst, bad ? "FAILED" : "ok");
    cudaFree(dq), cudaFree(dk), cudaFree(dv), cudaFree(dout), cudaFree(workspace);
    free(q), free(k), free(v), free(out);
    return bad ? 1 : 0;
}
