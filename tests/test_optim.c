/* test_optim.c - the scalar optimizers against an independent double-precision textbook reference
 * (PyTorch's formulas) over several steps, plus hand-computed first steps and sum-of-squares. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "optim.h"

#define N 257
#define STEPS 6

static float rnd(unsigned *s)
{
    *s = *s * 1664525u + 1013904223u;
    return (float)((*s >> 8) & 0xffff) / 32768.0f - 1.0f;
}

/* relative error, floored at 0.1 so that parameters crossing zero are judged on their absolute error */
static double rel(double a, double b) { return fabs(a - b) / fmax(fabs(b), 0.1); }

static void adam_case(int adamw, double wd)
{
    float p[N], g[N], m[N] = {0}, v[N] = {0};
    double pd[N], md[N] = {0}, vd[N] = {0}, worst = 0;
    const double lr = 1e-2, b1 = 0.9, b2 = 0.999, eps = 1e-8;
    unsigned s = 7;

    for (int i = 0; i < N; i++)
        pd[i] = p[i] = rnd(&s);
    for (int t = 1; t <= STEPS; t++) {
        struct zs_adam_step st = {
            .lr = (float)lr, .beta1 = (float)b1, .beta2 = (float)b2, .one_minus_beta1 = (float)(1 - b1),
            .one_minus_beta2 = (float)(1 - b2), .eps = (float)eps, .weight_decay = (float)wd,
            .step_size = (float)(lr / (1 - pow(b1, t))), .inv_sqrt_bc2 = (float)(1 / sqrt(1 - pow(b2, t))),
            .decay = (float)(lr * wd), .grad_scale = 1.0f, .adamw = adamw,
        };
        for (int i = 0; i < N; i++)
            g[i] = rnd(&s);
        zs_adam_ref(p, g, m, v, N, &st);
        for (int i = 0; i < N; i++) {
            double gi = g[i];
            if (!adamw)
                gi += wd * pd[i];
            else
                pd[i] -= lr * wd * pd[i];
            md[i] = b1 * md[i] + (1 - b1) * gi;
            vd[i] = b2 * vd[i] + (1 - b2) * gi * gi;
            double mh = md[i] / (1 - pow(b1, t)), vh = vd[i] / (1 - pow(b2, t));
            pd[i] -= lr * mh / (sqrt(vh) + eps);
        }
    }
    for (int i = 0; i < N; i++)
        worst = fmax(worst, rel(p[i], pd[i]));
    CHECK(worst < 2e-6, "%s wd %g: worst relative error %.3g after %d steps", adamw ? "AdamW" : "Adam", wd, worst,
          STEPS);
}

static void sgd_case(double momentum, double dampening, int nesterov, double wd)
{
    float p[N], g[N], buf[N] = {0};
    double pd[N], bd[N] = {0}, worst = 0;
    const double lr = 0.05;
    unsigned s = 11;

    for (int i = 0; i < N; i++)
        pd[i] = p[i] = rnd(&s);
    for (int t = 1; t <= STEPS; t++) {
        struct zs_sgd_step st = { .lr = (float)lr, .momentum = (float)momentum, .dampening_c = (float)(1 - dampening),
                                  .weight_decay = (float)wd, .grad_scale = 1.0f, .nesterov = nesterov, .first = t == 1 };
        for (int i = 0; i < N; i++)
            g[i] = rnd(&s);
        zs_sgd_ref(p, g, momentum != 0 ? buf : NULL, N, &st);
        for (int i = 0; i < N; i++) {
            double gi = g[i] + wd * pd[i];
            if (momentum != 0) {
                bd[i] = t == 1 ? gi : momentum * bd[i] + (1 - dampening) * gi;
                gi = nesterov ? gi + momentum * bd[i] : bd[i];
            }
            pd[i] -= lr * gi;
        }
    }
    for (int i = 0; i < N; i++)
        worst = fmax(worst, rel(p[i], pd[i]));
    CHECK(worst < 2e-6, "SGD momentum %g nesterov %d: worst relative error %.3g", momentum, nesterov, worst);
}

int main(void)
{
    /* AdamW by hand, first step: m = 0.05, v = 0.00025, bias-corrected update = 0.05/0.1 / (0.5 + 1e-8);
     * p = 1 - 0.1*0.01*1 - 0.1 * 0.99999998 = 0.899000002 */
    float p = 1.0f, g = 0.5f, m = 0.0f, v = 0.0f;
    struct zs_adam_step st = { .lr = 0.1f, .beta1 = 0.9f, .beta2 = 0.999f, .one_minus_beta1 = 0.1f,
                               .one_minus_beta2 = 0.001f, .eps = 1e-8f, .weight_decay = 0.01f,
                               .step_size = (float)(0.1 / 0.1), .inv_sqrt_bc2 = (float)(1 / sqrt(0.001)),
                               .decay = 0.001f, .grad_scale = 1.0f, .adamw = 1 };
    zs_adam_ref(&p, &g, &m, &v, 1, &st);
    CHECK(fabs(p - 0.899000002) < 1e-6, "AdamW first step by hand: %.9g", p);
    CHECK(fabs(m - 0.05f) < 1e-9 && fabs(v - 0.00025f) < 1e-10, "moments after one step: %g %g", m, v);

    /* SGD by hand: p = 2 - 0.1 * 3 = 1.7; clipping scale halves the gradient: 2 - 0.1 * 1.5 = 1.85 */
    float q = 2.0f, gq = 3.0f;
    struct zs_sgd_step ss = { .lr = 0.1f, .dampening_c = 1.0f, .grad_scale = 1.0f, .first = 1 };
    zs_sgd_ref(&q, &gq, NULL, 1, &ss);
    CHECK(fabs(q - 1.7f) < 1e-6, "SGD by hand: %g", q);
    q = 2.0f;
    ss.grad_scale = 0.5f;
    zs_sgd_ref(&q, &gq, NULL, 1, &ss);
    CHECK(fabs(q - 1.85f) < 1e-6, "SGD with clip scale: %g", q);

    adam_case(1, 0.0);
    adam_case(1, 0.1);
    adam_case(0, 0.0);
    adam_case(0, 0.05);
    sgd_case(0.0, 0.0, 0, 0.0);
    sgd_case(0.9, 0.0, 0, 0.0);
    sgd_case(0.9, 0.1, 0, 1e-3);
    sgd_case(0.9, 0.0, 1, 1e-3);

    float x[5] = { 1, -2, 3, 0.5f, -0.25f };
    CHECK(zs_sumsq_ref(x, 5) == 14.3125, "sum of squares: %.17g", zs_sumsq_ref(x, 5));
    CHECK(zs_sumsq_ref(x, 0) == 0.0, "empty sum of squares");
    return zs_test_summary("test_optim");
}
