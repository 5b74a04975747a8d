/* test_gpt_grad.c - the transformer's backward against central finite differences of its forward, both
 * in double, for every element of every parameter tensor of a tiny model, with and without activation
 * recomputation; and the float backward (the one that trains) against the double one.
 *
 * Tolerances, as relative L2 error per tensor: 1e-6 for double analytic vs finite difference (step 1e-5:
 * truncation error ~h^2 * f''' ~ 1e-10 and rounding ~1e-16 * loss / h ~ 1e-11 per element, against
 * gradients of ~1e-4 and more, so a correct backward lands near 1e-7; a wrong term is off by O(1));
 * 1e-4 for float vs double (float rounding through ~30 layers of operations, ~1e-6 typical). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"

#define FD_STEP 1e-5
#define TOL_FD 1e-6
#define TOL_F32 1e-4
#define BATCH 2

struct flat {
    const struct gpt_layout *lay;
    int64_t *start;      /* unit offsets in the flat arrays */
    double *w, *g;
    float *wf, *gf;
};

static int fetch64(void *a, int32_t u, const double **w) { struct flat *f = a; *w = f->w + f->start[u]; return 0; }
static int fetch32(void *a, int32_t u, const float **w) { struct flat *f = a; *w = f->wf + f->start[u]; return 0; }
static int nop(void *a, int32_t u) { (void)a; (void)u; return 0; }
static int grad64(void *a, int32_t u, double **g)
{
    struct flat *f = a;
    *g = f->g + f->start[u];
    memset(*g, 0, (size_t)f->lay->unit_numel[u] * sizeof(double));
    return 0;
}
static int grad32(void *a, int32_t u, float **g)
{
    struct flat *f = a;
    *g = f->gf + f->start[u];
    memset(*g, 0, (size_t)f->lay->unit_numel[u] * sizeof(float));
    return 0;
}

static double rel_l2(const double *a, const double *b, int64_t n)
{
    double d = 0, r = 0;
    for (int64_t i = 0; i < n; i++) {
        d += (a[i] - b[i]) * (a[i] - b[i]);
        r += b[i] * b[i];
    }
    return sqrt(d) / (sqrt(r) > 1e-30 ? sqrt(r) : 1e-30);
}

int main(void)
{
    struct gpt_config cfg = {.layers = 2, .dim = 16, .heads = 2, .ctx = 8, .vocab = 256};
    struct gpt_layout lay;
    struct flat f = {.lay = &lay};
    struct gpt_model_f64 m64, m64r;
    struct gpt_model_f32 m32;
    int32_t in[BATCH * 8], tg[BATCH * 8];
    int fails = 0;

    if (gpt_layout_alloc(&lay, &cfg))
        return 1;
    gpt_layout_pack(&lay, &cfg);
    int32_t U = gpt_unit_count(&cfg);
    int64_t total = 0;
    f.start = calloc((size_t)U, sizeof(int64_t));
    for (int32_t u = 0; u < U; u++) {
        f.start[u] = total;
        total += lay.unit_numel[u];
    }
    f.w = calloc((size_t)total, sizeof(double));
    f.g = calloc((size_t)total, sizeof(double));
    f.wf = calloc((size_t)total, sizeof(float));
    f.gf = calloc((size_t)total, sizeof(float));
    double *ga = calloc((size_t)total, sizeof(double)), *gf64 = calloc((size_t)total, sizeof(double));
    /* Weights 10x GPT-2's scale and perturbed LayerNorm parameters, so attention is far from uniform and
     * GELU far from linear: every term of the backward matters. */
    for (int32_t u = 0; u < U; u++)
        for (int32_t k = 0; k < gpt_unit_tensors(&cfg, u); k++) {
            struct gpt_tensor_info t;
            gpt_tensor_info(&cfg, u, k, &t);
            struct gpt_tensor_info noise = t;
            noise.init = GPT_INIT_NORMAL;
            noise.std = 0.1;
            for (int64_t i = 0; i < t.numel; i++) {
                double v = 10.0 * gpt_init_value(&t, 7, u, k, i) + gpt_init_value(&noise, 8, u, k, i);
                f.w[f.start[u] + lay.off[u][k] + i] = v;
                f.wf[f.start[u] + lay.off[u][k] + i] = (float)v;
            }
        }
    for (int i = 0; i < BATCH * 8; i++) {
        in[i] = (i * 37 + 11) % 256;
        tg[i] = (i * 53 + 5) % 256;
    }
    struct gpt_io_f64 io64 = {&f, fetch64, nop, grad64, nop, NULL};
    struct gpt_io_f32 io32 = {&f, fetch32, nop, grad32, nop, NULL};
    if (gpt_model_init_f64(&m64, &cfg, &lay, BATCH, 0) || gpt_model_init_f64(&m64r, &cfg, &lay, BATCH, 1) ||
        gpt_model_init_f32(&m32, &cfg, &lay, BATCH, 0)) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    double loss, lp, lm;
    gpt_model_run_f64(&m64, &io64, in, tg, BATCH, 1, 1.0, &loss);
    memcpy(ga, f.g, (size_t)total * sizeof(double));
    printf("tiny model: %lld parameters, loss %.6f (ln 256 = %.6f)\n", (long long)total, loss, log(256.0));
    for (int64_t i = 0; i < total; i++) { /* every element, central difference */
        double keep = f.w[i];
        f.w[i] = keep + FD_STEP;
        gpt_model_run_f64(&m64, &io64, in, tg, BATCH, 0, 1.0, &lp);
        f.w[i] = keep - FD_STEP;
        gpt_model_run_f64(&m64, &io64, in, tg, BATCH, 0, 1.0, &lm);
        f.w[i] = keep;
        f.g[i] = (lp - lm) / (2 * FD_STEP);
    }
    double *gfd = f.g;
    f.g = calloc((size_t)total, sizeof(double));
    gpt_model_run_f64(&m64r, &io64, in, tg, BATCH, 1, 1.0, &loss); /* recompute on */
    int same = memcmp(f.g, ga, (size_t)total * sizeof(double)) == 0;
    printf("recompute on: gradient %s the gradient without it\n", same ? "bit-identical to" : "DIFFERS from");
    fails += !same;
    gpt_model_run_f32(&m32, &io32, in, tg, BATCH, 1, 1.0, &loss);
    for (int64_t i = 0; i < total; i++)
        gf64[i] = f.gf[i];
    for (int32_t u = 0; u < U; u++)
        for (int32_t k = 0; k < gpt_unit_tensors(&cfg, u); k++) {
            struct gpt_tensor_info t;
            gpt_tensor_info(&cfg, u, k, &t);
            int64_t o = f.start[u] + lay.off[u][k];
            double efd = rel_l2(ga + o, gfd + o, t.numel), erc = rel_l2(f.g + o, gfd + o, t.numel);
            double e32 = rel_l2(gf64 + o, ga + o, t.numel);
            int ok = efd < TOL_FD && erc < TOL_FD && e32 < TOL_F32;
            printf("%-22s %6lld  vs finite difference %.2e (recompute %.2e)  float vs double %.2e  %s\n", t.name,
                   (long long)t.numel, efd, erc, e32, ok ? "ok" : "FAIL");
            fails += !ok;
        }
    gpt_model_free_f64(&m64);
    gpt_model_free_f64(&m64r);
    gpt_model_free_f32(&m32);
    gpt_layout_free(&lay);
    free(f.start); free(f.w); free(f.g); free(f.wf); free(f.gf); free(ga); free(gf64); free(gfd);
    printf("gpt gradient check: %s\n", fails ? "FAILED" : "passed");
    return fails ? 1 : 0;
}
