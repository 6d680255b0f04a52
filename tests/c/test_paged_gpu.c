/*
 * test_paged_gpu.c - the decode kernels on a paged KV cache (fc_params.block_table), from plain C.
 *
 * Each case builds a KV cache for B batch items on the host, scatters it into pools of pages in a
 * shuffled order (unused pages and the rows past an item's seqused_k hold large values, so a read
 * of the wrong page or row shows), and runs one paged call with seqused_k. It checks:
 *   * against a float64 reference computed from the same (rounded) 16-bit inputs;
 *   * against the contiguous decode of the same cache, gathered on the host into a (1, Hkv, n, D)
 *     tensor per batch item (fc_sdpa_fwd, no pages);
 *   * items with seqused_k 0: zeros and LSE -inf; every output element written (poisoned first);
 *   * with the key range split (FLASHCORE_DECODE_SPLITS=5 and the default heuristic);
 *   * a table with entries out of range (negative, past num_pages): no fault (compute-sanitizer
 *     in ci/gpu.sh checks the reads), finite output;
 *   * more than 65535 batch items (the call runs in slices: the table's rows and seqused_k move).
 * Cases: page sizes 16 / 64 / 256, seqused_k 0, 1, 17, 127, 1000, 4097, GQA 1 / 4 / 8, D 64 / 128,
 * fp16 / bf16, one query row (the tensor-core kernel) and 4 rows with GQA 8 (32 rows: the plain one).
 *
 * Exits 77 (ctest's "skipped") without a CUDA device of compute capability 8.9 or 9.0.
 */
#include "flashcore.h"

#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_helpers.h"

static int failures = 0;

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rng(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}
static float uniform(void) { return (float)(rng() % 2000001u) / 1000000.0f - 1.0f; } /* [-1, 1] */

typedef struct paged_case {
    fc_dtype dtype;
    int head_dim, heads_kv, group, seqlen_q, page_size;
    int batch;
    const int *used;    /* seqused_k per item (batch entries) */
    int bad_table;      /* entries past an item's pages and some of its own out of range */
    int splits_env;     /* FLASHCORE_DECODE_SPLITS for the call (0: the heuristic) */
} paged_case;

/* Host copies: q (B, Hq, Sq, D), the logical cache keys[b][hk][t][d] (rounded values), pools. */
typedef struct host_case {
    int B, Hq, Hkv, Sq, D, Sk, page_size, pages_per_seq, table_stride;
    int logical_items;              /* item b's keys are logical item b % logical_items's */
    int64_t num_pages;
    float *q, *k, *v;               /* q: (B, Hq, Sq, D); k, v: (B, Hkv, Sk, D), rows past used[b] unused */
    uint16_t *q16, *kpool, *vpool;  /* pools: (num_pages, page_size, Hkv, D) */
    int32_t *table, *used;
} host_case;

/* float64 reference for item b, query head h, query s: out (D) and the natural-log LSE. */
static double reference_row(const host_case *c, int b, int h, int s, double scale, double *out) {
    const int n = c->used[b] < 0 ? 0 : (c->used[b] < c->Sk ? c->used[b] : c->Sk);
    const int hk = h / (c->Hq / c->Hkv);
    const float *q = c->q + (((int64_t)b * c->Hq + h) * c->Sq + s) * c->D;
    const int lb = b % c->logical_items;
    double mx = -INFINITY;
    double *sc = malloc(sizeof(double) * (n > 0 ? n : 1));
    for (int t = 0; t < n; ++t) {
        const float *k = c->k + (((int64_t)lb * c->Hkv + hk) * c->Sk + t) * c->D;
        double acc = 0;
        for (int d = 0; d < c->D; ++d) acc += (double)q[d] * k[d];
        sc[t] = acc * scale;
        if (sc[t] > mx) mx = sc[t];
    }
    for (int d = 0; d < c->D; ++d) out[d] = 0;
    double sum = 0;
    for (int t = 0; t < n; ++t) {
        const double p = exp(sc[t] - mx);
        sum += p;
        const float *v = c->v + (((int64_t)lb * c->Hkv + hk) * c->Sk + t) * c->D;
        for (int d = 0; d < c->D; ++d) out[d] += p * v[d];
    }
    free(sc);
    if (n == 0) return -INFINITY;
    for (int d = 0; d < c->D; ++d) out[d] /= sum;
    return mx + log(sum);
}

static void *device_copy(const void *host, size_t bytes) {
    void *d = NULL;
    CUDA_OK(cudaMalloc(&d, bytes > 0 ? bytes : 16));
    if (bytes > 0) CUDA_OK(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice));
    return d;
}

/* Runs fc_sdpa_fwd on p (with a workspace as the library asks), out / lse copied back. */
static fc_status run(fc_params *p, uint16_t *out_host, float *lse_host, size_t out_elems, size_t lse_elems) {
    void *out = NULL, *ws = NULL;
    float *lse = NULL;
    CUDA_OK(cudaMalloc(&out, out_elems * 2));
    CUDA_OK(cudaMalloc((void **)&lse, lse_elems * 4));
    CUDA_OK(cudaMemset(out, 0xff, out_elems * 2)); /* NaN poison */
    CUDA_OK(cudaMemset(lse, 0xff, lse_elems * 4));
    p->out = out;
    p->lse = lse;
    int64_t bytes = 0;
    fc_status s = fc_sdpa_workspace_size(p, &bytes);
    if (s == FC_OK && bytes > 0) {
        CUDA_OK(cudaMalloc(&ws, (size_t)bytes));
        p->workspace = ws;
        p->workspace_bytes = bytes;
    }
    if (s == FC_OK) s = fc_sdpa_fwd(p, 0);
    if (s == FC_OK) {
        CUDA_OK(cudaDeviceSynchronize());
        CUDA_OK(cudaMemcpy(out_host, out, out_elems * 2, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(lse_host, lse, lse_elems * 4, cudaMemcpyDeviceToHost));
    }
    cudaFree(out);
    cudaFree(lse);
    if (ws) cudaFree(ws);
    p->out = NULL;
    p->lse = NULL;
    p->workspace = NULL;
    p->workspace_bytes = 0;
    return s;
}

static int close_to(double got, double want, double atol, double rtol) {
    if (isinf(want)) return got == want;
    return isfinite(got) && fabs(got - want) <= atol + rtol * fabs(want);
}

static void run_case(const char *label, const paged_case *pc) {
    host_case c;
    memset(&c, 0, sizeof c);
    c.B = pc->batch;
    c.Hkv = pc->heads_kv;
    c.Hq = pc->heads_kv * pc->group;
    c.Sq = pc->seqlen_q;
    c.D = pc->head_dim;
    c.page_size = pc->page_size;
    int longest = 1;
    for (int b = 0; b < c.B; ++b)
        if (pc->used[b] > longest) longest = pc->used[b];
    c.Sk = longest + 5; /* seqlen_k past every item's keys: seqused_k bounds them */
    c.pages_per_seq = (c.Sk + c.page_size - 1) / c.page_size;
    c.table_stride = c.pages_per_seq + 1;
    /* Distinct pages for the small batches; past 64 items the items share 64 pages' worth. */
    const int distinct = c.B <= 64;
    c.num_pages = distinct ? (int64_t)c.B * c.pages_per_seq + 3 : (int64_t)64 * c.pages_per_seq;
    const int64_t row = (int64_t)c.Hkv * c.D; /* a page row: Hkv heads of D */
    const size_t q_elems = (size_t)c.B * c.Hq * c.Sq * c.D;
    const size_t kv_elems = distinct ? (size_t)c.B * c.Hkv * c.Sk * c.D : (size_t)64 * c.Hkv * c.Sk * c.D;
    const size_t pool_elems = (size_t)c.num_pages * c.page_size * row;
    c.q = malloc(q_elems * sizeof(float));
    c.q16 = malloc(q_elems * 2);
    c.kpool = malloc(pool_elems * 2);
    c.vpool = malloc(pool_elems * 2);
    c.table = malloc(sizeof(int32_t) * (size_t)c.B * c.table_stride);
    c.used = malloc(sizeof(int32_t) * (size_t)c.B);
    for (size_t i = 0; i < q_elems; ++i) {
        c.q16[i] = from_float(uniform(), pc->dtype);
        c.q[i] = to_float(c.q16[i], pc->dtype);
    }
    /* Pools: everything 60 first (wrong pages / rows would show), then the items' keys. */
    const uint16_t big = from_float(60.0f, pc->dtype);
    for (size_t i = 0; i < pool_elems; ++i) c.kpool[i] = c.vpool[i] = big;
    int32_t *order = malloc(sizeof(int32_t) * (size_t)c.num_pages);
    for (int64_t i = 0; i < c.num_pages; ++i) order[i] = (int32_t)i;
    for (int64_t i = c.num_pages - 1; i > 0; --i) { /* shuffled pages */
        const int64_t j = rng() % (uint32_t)(i + 1);
        const int32_t t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    /* The logical cache of item b is item (b % 64)'s when items share pages. */
    const int logical_items = distinct ? c.B : 64;
    c.logical_items = logical_items;
    c.k = malloc(kv_elems * sizeof(float));
    c.v = malloc(kv_elems * sizeof(float));
    for (int b = 0; b < c.B; ++b) {
        c.used[b] = pc->used[b];
        for (int e = 0; e < c.table_stride; ++e) c.table[(int64_t)b * c.table_stride + e] = -1;
        for (int e = 0; e < c.pages_per_seq; ++e)
            c.table[(int64_t)b * c.table_stride + e] = order[(int64_t)(b % logical_items) * c.pages_per_seq + e];
    }
    for (int lb = 0; lb < logical_items; ++lb)
        for (int hk = 0; hk < c.Hkv; ++hk)
            for (int t = 0; t < c.Sk; ++t)
                for (int d = 0; d < c.D; ++d) {
                    const uint16_t k16 = from_float(uniform(), pc->dtype), v16 = from_float(uniform(), pc->dtype);
                    const int64_t li = (((int64_t)lb * c.Hkv + hk) * c.Sk + t) * c.D + d;
                    c.k[li] = to_float(k16, pc->dtype);
                    c.v[li] = to_float(v16, pc->dtype);
                    /* Rows past an item's seqused_k keep the large values (a read past it shows;
                     * items sharing pages, the 65535+ case, have their keys everywhere). */
                    if (distinct && t >= pc->used[lb]) continue;
                    const int32_t page = order[(int64_t)lb * c.pages_per_seq + t / c.page_size];
                    const int64_t pi = ((int64_t)page * c.page_size + t % c.page_size) * row + (int64_t)hk * c.D + d;
                    c.kpool[pi] = k16;
                    c.vpool[pi] = v16;
                }
    if (pc->bad_table) /* entries out of range: clamped by the kernels, never a fault */
        for (int b = 0; b < c.B; ++b) {
            c.table[(int64_t)b * c.table_stride] = b % 2 ? -7 : (int32_t)(c.num_pages + 1000000);
            c.table[(int64_t)b * c.table_stride + c.pages_per_seq] = INT32_MAX;
        }

    fc_params p;
    fc_params_init(&p);
    p.batch = c.B;
    p.heads_q = c.Hq;
    p.heads_kv = c.Hkv;
    p.seqlen_q = c.Sq;
    p.seqlen_k = c.Sk;
    p.head_dim = c.D;
    p.dtype = pc->dtype;
    p.scale = 1.0f / sqrtf((float)c.D);
    fc_params_set_contiguous_strides(&p);
    p.k_stride_d = p.v_stride_d = 1;
    p.k_stride_h = p.v_stride_h = c.D;
    p.k_stride_s = p.v_stride_s = row;
    p.k_stride_b = p.v_stride_b = row * c.page_size;
    p.page_size = c.page_size;
    p.pages_per_seq = c.pages_per_seq;
    p.block_table_stride = c.table_stride;
    p.num_pages = c.num_pages;
    void *dq = device_copy(c.q16, q_elems * 2);
    void *dk = device_copy(c.kpool, pool_elems * 2), *dv = device_copy(c.vpool, pool_elems * 2);
    void *dtable = device_copy(c.table, sizeof(int32_t) * (size_t)c.B * c.table_stride);
    void *dused = device_copy(c.used, sizeof(int32_t) * (size_t)c.B);
    p.q = dq;
    p.k = dk;
    p.v = dv;
    p.block_table = dtable;
    p.seqused_k = dused;

    const size_t rows = (size_t)c.B * c.Hq * c.Sq;
    uint16_t *out = malloc(q_elems * 2), *out_contig = malloc((size_t)c.Hq * c.Sq * c.D * 2);
    float *lse = malloc(rows * 4), *lse_contig = malloc((size_t)c.Hq * c.Sq * 4);
    char env[16];
    if (pc->splits_env > 0) {
        snprintf(env, sizeof env, "%d", pc->splits_env);
        setenv("FLASHCORE_DECODE_SPLITS", env, 1);
    }
    const fc_status s = run(&p, out, lse, q_elems, rows);
    if (s != FC_OK) {
        fprintf(stderr, "FAIL %s: fc_sdpa_fwd %s\n", label, fc_status_string(s));
        ++failures;
        goto done;
    }
    const double tol = pc->dtype == FC_DTYPE_BF16 ? 1.6e-2 : 2e-3;
    int bad = 0, bad_contig = 0;
    double *ref = malloc(sizeof(double) * (size_t)c.D);
    /* Contiguous decode of the same cache, one item at a time (per-item lengths: no pages). The
     * 65535+ case and the bad table skip it (the reference is enough there). */
    const int compare_contig = c.B <= 64 && !pc->bad_table;
    for (int b = 0; b < c.B && bad < 5; ++b) {
        const int n = c.used[b] < c.Sk ? c.used[b] : c.Sk;
        int have_contig = 0;
        if (compare_contig && n > 0) {
            const int lb = b % logical_items;
            uint16_t *kc = malloc((size_t)c.Hkv * n * c.D * 2), *vc = malloc((size_t)c.Hkv * n * c.D * 2);
            for (int hk = 0; hk < c.Hkv; ++hk)
                for (int t = 0; t < n; ++t)
                    for (int d = 0; d < c.D; ++d) {
                        const int64_t li = (((int64_t)lb * c.Hkv + hk) * c.Sk + t) * c.D + d;
                        kc[((int64_t)hk * n + t) * c.D + d] = from_float(c.k[li], pc->dtype);
                        vc[((int64_t)hk * n + t) * c.D + d] = from_float(c.v[li], pc->dtype);
                    }
            fc_params cp;
            fc_params_init(&cp);
            cp.batch = 1;
            cp.heads_q = c.Hq;
            cp.heads_kv = c.Hkv;
            cp.seqlen_q = c.Sq;
            cp.seqlen_k = n;
            cp.head_dim = c.D;
            cp.dtype = pc->dtype;
            cp.scale = p.scale;
            fc_params_set_contiguous_strides(&cp);
            void *dkc = device_copy(kc, (size_t)c.Hkv * n * c.D * 2), *dvc = device_copy(vc, (size_t)c.Hkv * n * c.D * 2);
            cp.q = (const uint16_t *)dq + (size_t)b * c.Hq * c.Sq * c.D;
            cp.k = dkc;
            cp.v = dvc;
            const fc_status cs = run(&cp, out_contig, lse_contig, (size_t)c.Hq * c.Sq * c.D, (size_t)c.Hq * c.Sq);
            if (cs != FC_OK) {
                fprintf(stderr, "FAIL %s: contiguous decode of item %d: %s\n", label, b, fc_status_string(cs));
                ++failures;
            } else {
                have_contig = 1;
            }
            cudaFree(dkc);
            cudaFree(dvc);
            free(kc);
            free(vc);
        }
        for (int h = 0; h < c.Hq; ++h)
            for (int sq = 0; sq < c.Sq; ++sq) {
                const double want_lse = reference_row(&c, b, h, sq, p.scale, ref);
                const size_t r = ((size_t)b * c.Hq + h) * c.Sq + sq;
                const size_t rc = (size_t)h * c.Sq + sq;
                if (pc->bad_table) { /* wrong rows, but finite ones, and every element written */
                    for (int d = 0; d < c.D; ++d)
                        if (!isfinite(to_float(out[r * c.D + d], pc->dtype))) ++bad;
                    continue;
                }
                if (!close_to(lse[r], want_lse, tol, tol)) {
                    if (bad++ < 3)
                        fprintf(stderr, "  %s: item %d (used %d) head %d row %d: lse %g, want %g\n", label, b,
                                c.used[b], h, sq, lse[r], want_lse);
                }
                if (have_contig && !close_to(lse[r], lse_contig[rc], tol, tol)) ++bad_contig;
                for (int d = 0; d < c.D; ++d) {
                    const double got = to_float(out[r * c.D + d], pc->dtype);
                    if (n == 0 ? got != 0.0 : !close_to(got, ref[d], tol, 4 * tol)) {
                        if (bad++ < 3)
                            fprintf(stderr, "  %s: item %d (used %d) head %d row %d col %d: %g, want %g\n", label, b,
                                    c.used[b], h, sq, d, got, ref[d]);
                        break;
                    }
                    if (have_contig &&
                        !close_to(got, to_float(out_contig[rc * c.D + d], pc->dtype), tol, 4 * tol))
                        ++bad_contig;
                }
            }
    }
    free(ref);
    if (bad || bad_contig) {
        fprintf(stderr, "FAIL %s: %d rows off the reference, %d values off the contiguous decode\n", label, bad,
                bad_contig);
        ++failures;
    } else {
        printf("ok   %s\n", label);
    }
done:
    if (pc->splits_env > 0) unsetenv("FLASHCORE_DECODE_SPLITS");
    cudaFree(dq);
    cudaFree(dk);
    cudaFree(dv);
    cudaFree(dtable);
    cudaFree(dused);
    free(out);
    free(out_contig);
    free(lse);
    free(lse_contig);
    free(order);
    free(c.q);
    free(c.q16);
    free(c.k);
    free(c.v);
    free(c.kpool);
    free(c.vpool);
    free(c.table);
    free(c.used);
}

int main(void) {
    int count = 0, major = 0, minor = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        printf("no CUDA device: skipped\n");
        return 77;
    }
    CUDA_OK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
    CUDA_OK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0));
    if (!((major == 9 && minor == 0) || (major == 8 && minor == 9))) {
        printf("compute capability %d.%d: FlashCore's kernels run on 8.9 and 9.0 only: skipped\n", major, minor);
        return 77;
    }
    static const int kUsed[] = {0, 1, 17, 127, 1000, 4097, 0, 33};
    const int n_used = (int)(sizeof kUsed / sizeof kUsed[0]);
    static const int kPageSizes[] = {16, 64, 256};
    static const int kGroups[] = {1, 4, 8};
    static const fc_dtype kDtypes[] = {FC_DTYPE_FP16, FC_DTYPE_BF16};
    static const int kDims[] = {64, 128};
    /* (The decode kernels are built whatever the build's head dims and dtypes: CMakeLists.txt.) */
    for (size_t t = 0; t < 2; ++t)
        for (size_t di = 0; di < 2; ++di) {
            for (size_t pi = 0; pi < 3; ++pi)
                for (size_t gi = 0; gi < 3; ++gi) {
                    /* Splits forced on every other case (the combine kernel), the heuristic on the rest. */
                    const paged_case pc = {kDtypes[t], kDims[di], 2, kGroups[gi], 1, kPageSizes[pi], n_used, kUsed, 0,
                                           (int)((pi + gi) % 2) * 5};
                    char label[128];
                    snprintf(label, sizeof label, "%s D=%d page %d GQA %d%s", t ? "bf16" : "fp16", kDims[di],
                             kPageSizes[pi], kGroups[gi], pc.splits_env ? " splits 5" : "");
                    run_case(label, &pc);
                }
            /* 32 rows per KV head (GQA 8 x 4 queries): the plain decode kernel. */
            const paged_case rows32 = {kDtypes[t], kDims[di], 2, 8, 4, 16, n_used, kUsed, 0, 0};
            char label[128];
            snprintf(label, sizeof label, "%s D=%d page 16 GQA 8, 4 query rows", t ? "bf16" : "fp16", kDims[di]);
            run_case(label, &rows32);
        }
    {
        const paged_case bad = {FC_DTYPE_FP16, 128, 2, 4, 1, 16, n_used, kUsed, 1, 3};
        run_case("fp16 D=128, table entries out of range", &bad);
        const paged_case bad_rows = {FC_DTYPE_FP16, 128, 2, 8, 4, 16, n_used, kUsed, 1, 0};
        run_case("fp16 D=128, 32 rows, table entries out of range", &bad_rows);
    }
    {
        /* 65539 items of at most 16 keys, in slices of 65535: each slice's table rows and seqused_k. */
        enum { kBig = 65539 };
        int *used = malloc(sizeof(int) * kBig);
        for (int b = 0; b < kBig; ++b) used[b] = (b * 7) % 17;
        const paged_case big = {FC_DTYPE_FP16, 64, 1, 1, 1, 16, kBig, used, 0, 0};
        run_case("fp16 D=64, 65539 items (sliced launches)", &big);
        free(used);
    }
    if (failures) {
        fprintf(stderr, "%d paged case(s) failed\n", failures);
        return 1;
    }
    printf("all paged cases passed\n");
    return 0;
}
