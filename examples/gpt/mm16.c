/* mm16.c - bf16 x bf16 -> fp32 matrix products for bf16 training. oneDNN's matmul (Debian's libdnnl,
 * OpenMP runtime: its threads are the rank's OpenMP threads) does them where the CPU has native bf16
 * dot products; primitives are made once per shape and kept, the data pointers swapped per call. Without
 * oneDNN, or if it refuses a shape, the operands are widened and multiplied by cblas_sgemm. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cblas.h>  /* defines: cblas_sgemm (the fallback) */

#include "mm16.h"
#include "vmath.h" /* defines: gpt_vmath (16-lane bf16 rounding) */

#ifdef ZS_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>  /* defines: dnnl_matmul_desc_init, dnnl_primitive_execute (oneDNN 2.x C API) */
#endif

static float bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;

    memcpy(&f, &u, 4);
    return f;
}

void gpt_f32_to_bf16(uint16_t *dst, const float *src, int64_t n)
{
    gpt_vmath()->to_bf16(dst, src, n);
}


/* element (i, j) of op(X), X row-major with leading dimension ld */
static float at(const uint16_t *X, bool t, int64_t ld, int64_t i, int64_t j)
{
    return bf16_to_f32(t ? X[j * ld + i] : X[i * ld + j]);
}

void gpt_mm16_ref(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const uint16_t *A, int64_t lda,
                  const uint16_t *B, int64_t ldb, float beta, float *C, int64_t ldc)
{
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double s = 0;
            for (int64_t k = 0; k < K; k++)
                s += (double)at(A, ta, lda, i, k) * (double)at(B, tb, ldb, k, j);
            C[i * ldc + j] = (float)(s + (beta != 0 ? (double)C[i * ldc + j] : 0));
        }
}

/* ---------------------------------------------------------------- fallback: widen, then sgemm */

static void widen(float *dst, const uint16_t *src, int64_t rows, int64_t cols, int64_t ld)
{
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            dst[r * cols + c] = bf16_to_f32(src[r * ld + c]);
}

static int mm16_sgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const uint16_t *A, int64_t lda,
                      const uint16_t *B, int64_t ldb, float beta, float *C, int64_t ldc)
{
    /* stored shapes: A is [M, K] or (ta) [K, M]; B is [K, N] or (tb) [N, K] */
    int64_t ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
    float *a = malloc((size_t)(ar * ac) * sizeof(float)), *b = malloc((size_t)(br * bc) * sizeof(float));

    if (!a || !b) {
        free(a);
        free(b);
        return -1;
    }
    widen(a, A, ar, ac, lda);
    widen(b, B, br, bc, ldb);
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (int)M, (int)N, (int)K,
                1, a, (int)ac, b, (int)bc, beta, C, (int)ldc);
    free(a);
    free(b);
    return 0;
}

/* ---------------------------------------------------------------- oneDNN */

#ifdef ZS_HAVE_DNNL

struct mm_key {
    int64_t M, N, K, lda, ldb, ldc;
    bool ta, tb, acc;
};

struct mm_prim {
    struct mm_key key;
    dnnl_primitive_t prim;
    dnnl_memory_t a, b, c;
};

/* The model uses a few dozen shapes (each linear forward and its two backward products, the head, and the
 * smaller batches of validation and sampling); a full cache makes one-off primitives. */
#define MM_CACHE 64

static struct {
    bool tried, ok;
    const char *why;
    dnnl_engine_t eng;
    dnnl_stream_t stream;
    struct mm_prim cache[MM_CACHE];
    int n;
} dn;

static void prim_free(struct mm_prim *p)
{
    if (p->prim)
        dnnl_primitive_destroy(p->prim);
    if (p->a)
        dnnl_memory_destroy(p->a);
    if (p->b)
        dnnl_memory_destroy(p->b);
    if (p->c)
        dnnl_memory_destroy(p->c);
    *p = (struct mm_prim){0};
}

/* a row-major [rows, cols] operand, or (t) the transpose of a row-major [cols, rows] one */
static dnnl_status_t md_init(dnnl_memory_desc_t *md, int64_t rows, int64_t cols, int64_t ld, bool t,
                             dnnl_data_type_t type)
{
    dnnl_dims_t dims = {rows, cols}, strides = {t ? 1 : ld, t ? ld : 1};

    return dnnl_memory_desc_init_by_strides(md, 2, dims, type, strides);
}

static int prim_make(struct mm_prim *p, const struct mm_key *k, const char **impl)
{
    dnnl_memory_desc_t a, b, c;
    dnnl_matmul_desc_t desc;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t ops = NULL;
    dnnl_primitive_desc_t pd = NULL;
    int rc = -1;

    *p = (struct mm_prim){.key = *k};
    if (md_init(&a, k->M, k->K, k->lda, k->ta, dnnl_bf16) || md_init(&b, k->K, k->N, k->ldb, k->tb, dnnl_bf16) ||
        md_init(&c, k->M, k->N, k->ldc, false, dnnl_f32) || dnnl_matmul_desc_init(&desc, &a, &b, NULL, &c))
        goto out;
    if (dnnl_primitive_attr_create(&attr))
        goto out;
    if (k->acc && (dnnl_post_ops_create(&ops) || dnnl_post_ops_append_sum(ops, 1.0f) ||
                   dnnl_primitive_attr_set_post_ops(attr, ops)))
        goto out;
    if (dnnl_primitive_desc_create(&pd, &desc, attr, dn.eng, NULL) || dnnl_primitive_create(&p->prim, pd))
        goto out;
    if (impl && dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, (void *)impl))
        *impl = "?";
    if (dnnl_memory_create(&p->a, &a, dn.eng, DNNL_MEMORY_NONE) ||
        dnnl_memory_create(&p->b, &b, dn.eng, DNNL_MEMORY_NONE) ||
        dnnl_memory_create(&p->c, &c, dn.eng, DNNL_MEMORY_NONE))
        goto out;
    rc = 0;
out:
    if (rc)
        prim_free(p);
    if (pd)
        dnnl_primitive_desc_destroy(pd);
    if (ops)
        dnnl_post_ops_destroy(ops);
    if (attr)
        dnnl_primitive_attr_destroy(attr);
    return rc;
}

/* Native bf16 dot products (AVX512_BF16 or AMX) or nothing: oneDNN would otherwise emulate bf16, slower
 * than widening for sgemm. */
static void dnnl_setup(void)
{
    static char why[160];
    struct mm_prim probe;
    const char *impl = "?";
    dnnl_cpu_isa_t isa;

    dn.tried = true;
    isa = dnnl_get_effective_cpu_isa();
    if (((unsigned)isa & (unsigned)dnnl_cpu_isa_avx512_core_bf16) != (unsigned)dnnl_cpu_isa_avx512_core_bf16) {
        snprintf(why, sizeof(why), "oneDNN sees no native bf16 dot products on this CPU (isa 0x%x)", (unsigned)isa);
        dn.why = why;
        return;
    }
    if (dnnl_engine_create(&dn.eng, dnnl_cpu, 0) || dnnl_stream_create(&dn.stream, dn.eng, dnnl_stream_default_flags)) {
        dn.why = "oneDNN could not create a CPU engine and stream";
        return;
    }
    if (prim_make(&probe, &(struct mm_key){64, 64, 64, 64, 64, 64, false, false, false}, &impl)) {
        dn.why = "oneDNN refused a 64x64x64 bf16 matmul";
        return;
    }
    snprintf(why, sizeof(why), "oneDNN %s", impl);
    prim_free(&probe);
    dn.why = why;
    dn.ok = true;
}

static struct mm_prim *prim_get(const struct mm_key *k, struct mm_prim *tmp)
{
    for (int i = 0; i < dn.n; i++)
        if (!memcmp(&dn.cache[i].key, k, sizeof(*k)))
            return &dn.cache[i];
    struct mm_prim *p = dn.n < MM_CACHE ? &dn.cache[dn.n] : tmp;
    if (prim_make(p, k, NULL))
        return NULL;
    if (p != tmp)
        dn.n++;
    return p;
}

static int mm16_dnnl(const struct mm_key *k, const uint16_t *A, const uint16_t *B, float *C)
{
    struct mm_prim tmp = {0}, *p = prim_get(k, &tmp);
    int rc = -1;

    if (!p)
        return -1;
    if (!dnnl_memory_set_data_handle(p->a, (void *)A) && !dnnl_memory_set_data_handle(p->b, (void *)B) &&
        !dnnl_memory_set_data_handle(p->c, C)) {
        dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, p->a}, {DNNL_ARG_WEIGHTS, p->b}, {DNNL_ARG_DST, p->c}};
        rc = dnnl_primitive_execute(p->prim, dn.stream, 3, args) || dnnl_stream_wait(dn.stream) ? -1 : 0;
    }
    if (p == &tmp)
        prim_free(&tmp);
    return rc;
}

/* The primitive and the key are zero-filled, so memcmp sees no stray padding bytes. */
static void key_fill(struct mm_key *k, bool ta, bool tb, int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb,
                     int64_t ldc, float beta)
{
    memset(k, 0, sizeof(*k));
    k->M = M, k->N = N, k->K = K, k->lda = lda, k->ldb = ldb, k->ldc = ldc;
    k->ta = ta, k->tb = tb, k->acc = beta != 0;
}

bool gpt_mm16_available(const char **why)
{
    if (!dn.tried)
        dnnl_setup();
    if (why)
        *why = dn.why;
    return dn.ok;
}

void gpt_mm16_free(void)
{
    for (int i = 0; i < dn.n; i++)
        prim_free(&dn.cache[i]);
    dn.n = 0;
}

#else /* no oneDNN */

bool gpt_mm16_available(const char **why)
{
    if (why)
        *why = "built without oneDNN (apt-get install libdnnl-dev, then rebuild)";
    return false;
}

void gpt_mm16_free(void) {}

#endif

void gpt_mm16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const uint16_t *A, int64_t lda, const uint16_t *B,
              int64_t ldb, float beta, float *C, int64_t ldc)
{
    static bool warned;

#ifdef ZS_HAVE_DNNL
    struct mm_key k;

    key_fill(&k, ta, tb, M, N, K, lda, ldb, ldc, beta);
    if (gpt_mm16_available(NULL) && !mm16_dnnl(&k, A, B, C))
        return;
#endif
    if (!warned) {
        fprintf(stderr, "zs-train-gpt: a bf16 matmul (%lldx%lldx%lld) went through widened sgemm\n", (long long)M,
                (long long)N, (long long)K);
        warned = true;
    }
    if (mm16_sgemm(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc))
        gpt_mm16_ref(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc);
}
