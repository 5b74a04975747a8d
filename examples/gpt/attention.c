/* attention.c - attention.h's matrix-product attention. Each (sequence, head) is one OpenMP iteration that
 * makes all of its own products, single-threaded, in one fixed order, so its bits never depend on the
 * thread count or on which other sequences share the call. */
#include <math.h>
#include <cblas.h>  /* defines: cblas_sgemm, openblas_get_num_threads, openblas_set_num_threads */

#include "attention.h"
#include "vmath.h"   /* defines: gpt_vmath (softmax rows) */

#define RB 64 /* rows per block: the products' size against the share of the upper triangle computed */

static int64_t min64(int64_t a, int64_t b)
{
    return a < b ? a : b;
}

/* OpenBLAS keeps to the calling thread while the OpenMP threads each run their own heads */
static int blas_single_begin(void)
{
    int nt = openblas_get_num_threads();

    if (nt > 1)
        openblas_set_num_threads(1);
    return nt;
}

static void blas_single_end(int nt)
{
    if (nt > 1)
        openblas_set_num_threads(nt);
}

/* one call's tensors and shapes; head_* work on the (sequence, head) pair bh */
struct heads {
    float *y, *att, *dqkv, *datt; /* forward: y, att written; backward: dqkv, datt */
    const float *qkv, *dy, *p;    /* p: the forward's att, read by the backward */
    int64_t T, C, H, hs, ld;
    float scale;
    const struct gpt_vmath *vm;
};

static void head_forward(const struct heads *x, int64_t bh)
{
    int64_t b = bh / x->H, h = bh % x->H, T = x->T, C = x->C, hs = x->hs, ld = x->ld;
    const float *q = x->qkv + b * T * ld + h * hs, *k = q + C, *v = q + 2 * C;
    float *a = x->att + bh * T * T, *yb = x->y + b * T * C + h * hs;

    for (int64_t r0 = 0; r0 < T; r0 += RB) {
        int64_t r1 = min64(r0 + RB, T), m = r1 - r0;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m, (int)r1, (int)hs, x->scale, q + r0 * ld, (int)ld,
                    k, (int)ld, 0, a + r0 * T, (int)T);
        for (int64_t t = r0; t < r1; t++)
            x->vm->softmax_causal(a + t * T, t + 1, T);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m, (int)hs, (int)r1, 1, a + r0 * T, (int)T, v,
                    (int)ld, 0, yb + r0 * C, (int)C);
    }
}

static void head_backward(const struct heads *x, int64_t bh)
{
    int64_t b = bh / x->H, h = bh % x->H, T = x->T, C = x->C, hs = x->hs, ld = x->ld;
    const float *q = x->qkv + b * T * ld + h * hs, *k = q + C, *v = q + 2 * C;
    const float *a = x->p + bh * T * T, *dyb = x->dy + b * T * C + h * hs;
    float *dq = x->dqkv + b * T * ld + h * hs, *dk = dq + C, *dv = dq + 2 * C, *ds = x->datt + bh * T * T;

    /* row blocks: dP = dY V^T, through the softmax to dS (scaled, zero above the diagonal), dQ = dS K */
    for (int64_t r0 = 0; r0 < T; r0 += RB) {
        int64_t r1 = min64(r0 + RB, T), m = r1 - r0;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m, (int)r1, (int)hs, 1, dyb + r0 * C, (int)C, v,
                    (int)ld, 0, ds + r0 * T, (int)T);
        for (int64_t t = r0; t < r1; t++)
            x->vm->softmax_backward(ds + t * T, a + t * T, t + 1, T, x->scale);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m, (int)hs, (int)r1, 1, ds + r0 * T, (int)T, k,
                    (int)ld, 0, dq + r0 * ld, (int)ld);
    }
    /* column blocks: key s is seen by queries t >= s only, so dK = dS^T Q and dV = P^T dY from row c0 on */
    for (int64_t c0 = 0; c0 < T; c0 += RB) {
        int64_t m = min64(c0 + RB, T) - c0, rows = T - c0;
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)m, (int)hs, (int)rows, 1, ds + c0 * T + c0, (int)T,
                    q + c0 * ld, (int)ld, 0, dk + c0 * ld, (int)ld);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)m, (int)hs, (int)rows, 1, a + c0 * T + c0, (int)T,
                    dyb + c0 * C, (int)C, 0, dv + c0 * ld, (int)ld);
    }
}

/* every (sequence, head) pair as one OpenMP iteration */
static void for_heads(void (*fn)(const struct heads *, int64_t), struct heads *x, int64_t B, int64_t T, int64_t C,
                      int64_t H)
{
    int nt = blas_single_begin();

    x->T = T, x->C = C, x->H = H, x->hs = C / H, x->ld = 3 * C;
    x->scale = 1 / sqrtf((float)x->hs);
    x->vm = gpt_vmath();
#pragma omp parallel for schedule(static)
    for (int64_t bh = 0; bh < B * H; bh++)
        fn(x, bh);
    blas_single_end(nt);
}

void gpt_attention_forward(float *y, float *att, const float *qkv, int64_t B, int64_t T, int64_t C, int64_t H)
{
    struct heads x = {.y = y, .att = att, .qkv = qkv};

    for_heads(head_forward, &x, B, T, C, H);
}

void gpt_attention_backward(float *dqkv, float *datt, const float *dy, const float *att, const float *qkv, int64_t B,
                            int64_t T, int64_t C, int64_t H)
{
    struct heads x = {.dqkv = dqkv, .datt = datt, .dy = dy, .p = att, .qkv = qkv};

    for_heads(head_backward, &x, B, T, C, H);
}
