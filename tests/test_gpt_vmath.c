/* test_gpt_vmath.c - the float passes' 16-lane math (examples/gpt/vmath.c) against double-precision libm, and
 * its two paths against each other:
 * - exp within 2 ulp of the correctly rounded exp over [-87.3, 88] (a grid and random points), exactly 0
 *   below -87.34, exp(0) = 1, NaN stays NaN;
 * - GELU and its derivative against double within 8 ulp plus what rounding the argument to float costs
 *   (see check_gelu);
 * - a causal softmax row, its backward and a cross-entropy row (loss and gradient) within 1e-6 relative
 *   of double, with the entries past the row's length zeroed;
 * - bits: the AVX512 path (where the CPU has it) equals the generic one, and an element's result does not
 *   depend on where it lies in the array (whole-array calls against one-element calls, all lengths 1-67),
 *   which is what keeps the passes' bits independent of the thread count; bf16 accumulation equals the
 *   one-element formula (its rounding is test_gpt_mm16's); GELU and its derivative fused with bf16 rounding
 *   give what the separate passes give. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vmath.h"

static int failures;

/* prints the first 20 failures */
#define CHECK(cond, ...)                           \
    do {                                           \
        if (!(cond) && failures++ < 20) {          \
            printf("FAIL: " __VA_ARGS__);          \
            printf("\n");                          \
        }                                          \
    } while (0)

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static double uniform(void) /* xorshift64, in [0, 1) */
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) * (1.0 / 9007199254740992.0);
}

/* |got - want| in units of the last place of want (as a float) */
static double ulps(float got, double want)
{
    float w = (float)want;
    double ulp = (double)nextafterf(fabsf(w), INFINITY) - (double)fabsf(w);
    return fabs((double)got - want) / ulp;
}

/* 0.5 x (1 + tanh u) and its derivative in double, with 1 + tanh u = 2 / (1 + exp(-2u)) and
 * 1 - tanh^2 u = 4 exp(-2u) / (1 + exp(-2u))^2: the tanh form itself cancels to 0 in double below u = -19 */
static double gelu_ref(double x)
{
    return x / (1 + exp(-2 * 0.7978845608028654 * (x + 0.044715 * x * x * x)));
}

static double dgelu_ref(double x)
{
    double e = exp(-2 * 0.7978845608028654 * (x + 0.044715 * x * x * x)), s = 1 / (1 + e);
    return s + 2 * x * e * s * s * 0.7978845608028654 * (1 + 3 * 0.044715 * x * x);
}

/* the references against the plain tanh form where it does not cancel */
static void check_refs(void)
{
    for (double x = -4; x <= 4; x += 0.01) {
        double th = tanh(0.7978845608028654 * (x + 0.044715 * x * x * x));
        double f = 0.5 * x * (1 + th);
        double b = 0.5 * (1 + th) + 0.5 * x * (1 - th * th) * 0.7978845608028654 * (1 + 3 * 0.044715 * x * x);
        CHECK(fabs(gelu_ref(x) - f) <= 1e-14 && fabs(dgelu_ref(x) - b) <= 1e-14, "reference gelu at %g", x);
    }
}

static void check_exp(const struct gpt_vmath *v)
{
    enum { N = 1 << 20 };
    float *x = malloc(N * sizeof(float)), *y = malloc(N * sizeof(float));
    double worst = 0;

    for (int i = 0; i < N; i++)
        x[i] = i < N / 2 ? (float)(-87.3 + 175.3 * i / (N / 2)) : (float)(-87.3 + 175.3 * uniform());
    v->exp(y, x, N);
    for (int i = 0; i < N; i++) {
        double e = ulps(y[i], exp((double)x[i]));
        worst = e > worst ? e : worst;
    }
    printf("%s exp: worst %.2f ulp over [-87.3, 88]\n", v->name, worst);
    CHECK(worst <= 2, "%s exp: %.2f ulp", v->name, worst);
    float sp[4] = {0, -87.5f, -1000, NAN}, so[4];
    v->exp(so, sp, 4);
    CHECK(so[0] == 1 && so[1] == 0 && so[2] == 0 && isnan(so[3]), "%s exp(0, -87.5, -1000, nan) = %g %g %g %g",
          v->name, so[0], so[1], so[2], so[3]);
    free(x);
    free(y);
}

/* GELU is ill-conditioned for large negative x: u = k (x + 0.044715 x^3), rounded to float, goes into
 * exp(-2u), so |2u| ulp of relative error come from the argument alone (libm's tanhf has the same). The
 * allowance: 8 + 8 |u| ulp of the value (of the derivative: of the larger of its two terms, which cancel
 * at its root near x = -0.75); below 1e-30 (where exp(-2u) meets its clamp at 88), 1e-35 absolute. */
static void check_gelu(const struct gpt_vmath *v)
{
    enum { N = 1 << 18 };
    float *x = malloc(N * sizeof(float)), *y = malloc(N * sizeof(float)), *d = malloc(N * sizeof(float));
    double worst = 0;

    for (int i = 0; i < N; i++) {
        x[i] = (float)(-12 + 24.0 * i / N);
        d[i] = 1;
    }
    v->gelu_forward(y, x, N);
    v->gelu_backward(d, x, N);
    for (int i = 0; i < N; i++) {
        double u = 0.7978845608028654 * (x[i] + 0.044715 * x[i] * x[i] * x[i]), allow = 8 + 8 * fabs(u);
        double want[2] = {gelu_ref(x[i]), dgelu_ref(x[i])}, s = gelu_ref(x[i]) / x[i];
        double scale[2] = {fabs(want[0]), fmax(fabs(want[1]), fmax(s, fabs(want[1] - s)))};
        float got[2] = {y[i], d[i]};
        for (int k = 0; k < 2; k++)
            if (fabs(want[k]) > 1e-30)
                worst = fmax(worst, ulps(got[k], want[k]) * fabs(want[k]) / scale[k] / allow);
            else
                CHECK(fabs(got[k] - want[k]) < 1e-35, "%s gelu%s(%g) = %g, want %g", v->name, k ? "'" : "", x[i],
                      got[k], want[k]);
    }
    printf("%s gelu and its derivative over [-12, 12]: worst error %.2f of the allowance\n", v->name, worst);
    CHECK(worst <= 1, "%s gelu: %.2f of the allowance", v->name, worst);
    free(x);
    free(y);
    free(d);
}

/* a softmax row of length n in a row of len, its backward, a cross-entropy row: against double */
static void check_rows(const struct gpt_vmath *v)
{
    enum { LEN = 83 };
    float a[LEN], p[LEN], d[LEN], z[LEN];
    double worst = 0, r[LEN];

    for (int n = 1; n <= LEN; n += 7) {
        double mx = -INFINITY, sum = 0, dot = 0, scale = 0.125;
        for (int i = 0; i < LEN; i++) {
            a[i] = (float)(8 * uniform() - 4);
            d[i] = (float)(2 * uniform() - 1);
            z[i] = a[i];
        }
        for (int i = 0; i < n; i++)
            mx = fmax(mx, a[i]);
        for (int i = 0; i < n; i++)
            sum += r[i] = exp(a[i] - mx);
        memcpy(p, a, sizeof(p));
        v->softmax_causal(p, n, LEN);
        for (int i = 0; i < n; i++) {
            r[i] /= sum;
            worst = fmax(worst, fabs(p[i] - r[i]) / r[i]);
            dot += (double)p[i] * d[i];
        }
        for (int i = n; i < LEN; i++)
            CHECK(p[i] == 0, "%s softmax: entry %d past length %d is %g", v->name, i, n, p[i]);
        float dd[LEN];
        memcpy(dd, d, sizeof(dd));
        v->softmax_backward(dd, p, n, LEN, (float)scale);
        for (int i = 0; i < n; i++) {
            double want = scale * p[i] * (d[i] - dot);
            worst = fmax(worst, fabs(dd[i] - want) / (scale * p[i] * (fabs(d[i]) + fabs(dot)) + 1e-30));
        }
        for (int i = n; i < LEN; i++)
            CHECK(dd[i] == 0, "%s softmax backward: entry %d past length %d is %g", v->name, i, n, dd[i]);
        /* cross-entropy over the whole row of n, target n / 2, gradient scaled by 0.5 */
        int t = n / 2;
        double zm = -INFINITY, zs = 0;
        for (int i = 0; i < n; i++)
            zm = fmax(zm, z[i]);
        for (int i = 0; i < n; i++)
            zs += exp(z[i] - zm);
        double loss_want = log(zs) + zm - z[t];
        float zl[LEN];
        memcpy(zl, z, sizeof(zl));
        double loss = v->xent(zl, n, t, 0);
        CHECK(!memcmp(zl, z, sizeof(zl)), "%s xent without gradient changed the logits", v->name);
        CHECK(fabs(loss - loss_want) <= 1e-6 * fmax(1, fabs(loss_want)), "%s xent n %d: %.9g, want %.9g", v->name, n,
              loss, loss_want);
        loss = v->xent(zl, n, t, 0.5f);
        for (int i = 0; i < n; i++) {
            double want = 0.5 * (exp(z[i] - zm) / zs - (i == t));
            worst = fmax(worst, fabs(zl[i] - want) / (0.5 * exp(z[i] - zm) / zs + 0.5 * (i == t)));
        }
    }
    printf("%s softmax, its backward, cross-entropy: worst relative error %.2e\n", v->name, worst);
    CHECK(worst <= 1e-6, "%s rows: relative error %.2e", v->name, worst);
}

/* GELU fused with bf16 rounding against GELU, then to_bf16, on lengths 1-67 (the tails), values around the
 * rounding's ties included: the differences */
static int check_fused(const struct gpt_vmath *v)
{
    enum { M = 67 };
    float x[M], y[M], d[M], d2[M];
    uint16_t h[M], h2[M], e[M], e2[M];
    int bad = 0;

    for (int i = 0; i < M; i++)
        x[i] = (float)(16 * uniform() - 8);
    for (int n = 1; n <= M; n++) {
        memset(h, 0, sizeof(h));
        memset(h2, 0, sizeof(h2));
        memset(e, 0, sizeof(e));
        memset(e2, 0, sizeof(e2));
        v->gelu_forward(y, x, n);
        v->to_bf16(h, y, n);
        v->gelu_forward16(h2, x, n);
        for (int i = 0; i < M; i++)
            d[i] = d2[i] = (float)(uniform() - 0.5);
        v->gelu_backward(d, x, n);
        v->to_bf16(e, d, n);
        v->gelu_backward16(d2, e2, x, n);
        int diff = memcmp(h, h2, sizeof(h)) || memcmp(e, e2, sizeof(e)) || memcmp(d, d2, sizeof(d));
        if (diff && bad < 5)
            printf("%s: fused gelu and bf16 rounding differ from the two passes at length %d\n", v->name, n);
        bad += diff;
    }
    return bad;
}

/* every function on lengths 1-67: path against path, and whole arrays against one element at a time */
static void check_bits(const struct gpt_vmath *g, const struct gpt_vmath *f)
{
    enum { M = 67 };
    float x[M], a[4][M], b[4][M];
    int bad = 0;

    for (int i = 0; i < M; i++)
        x[i] = (float)(20 * uniform() - 10);
    for (int n = 1; n <= M; n++) {
        const struct gpt_vmath *v[2] = {g, f};
        memset(a, 0, sizeof(a));
        memset(b, 0, sizeof(b));
        for (int k = 0; k < 2; k++) {
            float (*o)[M] = k ? b : a;
            v[k]->exp(o[0], x, n);
            v[k]->gelu_forward(o[1], x, n);
            for (int i = 0; i < M; i++)
                o[2][i] = o[3][i] = x[i];
            v[k]->gelu_backward(o[2], x, n);
            v[k]->softmax_causal(o[3], n, M);
        }
        for (int k = 0; k < 4; k++)
            for (int i = 0; i < M; i++)
                if (memcmp(&a[k][i], &b[k][i], 4) && bad++ < 5)
                    printf("n %d function %d element %d: %s %a, %s %a\n", n, k, i, g->name, a[k][i], f->name, b[k][i]);
        for (int i = 0; i < n; i++) { /* element i alone: a vector's first lane, the rest padding */
            float e, y, d = x[i];
            f->exp(&e, &x[i], 1);
            f->gelu_forward(&y, &x[i], 1);
            f->gelu_backward(&d, &x[i], 1);
            bad += memcmp(&e, &b[0][i], 4) || memcmp(&y, &b[1][i], 4) || memcmp(&d, &b[2][i], 4);
        }
    }
    /* bf16: rounding, widening and accumulation, path against path and against the one-element formula */
    uint16_t h[2][M], w[2][M], acc[2][M];
    float wide[2][M];
    for (int k = 0; k < 2; k++) {
        const struct gpt_vmath *v = k ? f : g;
        v->to_bf16(h[k], x, M);
        v->from_bf16(wide[k], h[k], M);
        memcpy(acc[k], h[k], sizeof(acc[k]));
        v->add_bf16(acc[k], x, M);
        v->to_bf16(w[k], wide[k], M);
    }
    bad += memcmp(h[0], h[1], sizeof(h[0])) || memcmp(acc[0], acc[1], sizeof(acc[0])) ||
           memcmp(wide[0], wide[1], sizeof(wide[0])) || memcmp(w[1], h[1], sizeof(w[1]));
    for (int i = 0; i < M; i++) {
        uint32_t u;
        float s = wide[1][i] + x[i];
        memcpy(&u, &s, 4);
        bad += acc[1][i] != (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
    }
    bad += check_fused(g) + (f != g ? check_fused(f) : 0);
    printf("bits: %s against %s, whole arrays against single elements: %d differences\n", f->name, g->name, bad);
    CHECK(!bad, "%d differences in bits", bad);
}

int main(void)
{
    const struct gpt_vmath *g = gpt_vmath_generic(), *f = gpt_vmath_avx512();

    if (!f)
        printf("no AVX512 on this CPU: the generic path only\n");
    check_refs();
    check_exp(g);
    check_gelu(g);
    check_rows(g);
    if (f) {
        check_exp(f);
        check_gelu(f);
        check_rows(f);
    }
    check_bits(g, f ? f : g);
    CHECK(gpt_vmath() == (f ? f : g), "gpt_vmath() is not the fastest path");
    printf("gpt vmath: %s\n", failures ? "FAILED" : "passed");
    return failures ? 1 : 0;
}
