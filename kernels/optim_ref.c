/* optim_ref.c - scalar reference optimizers (Adam, AdamW, SGD with momentum / Nesterov). */
#include <math.h>

#include "optim.h"

void zs_adam_ref(float *p, const float *g, float *m, float *v, int64_t n, const struct zs_adam_step *s)
{
    for (int64_t i = 0; i < n; i++) {
        float gi = g[i] * s->grad_scale;
        float pi = p[i];

        if (!s->adamw)
            gi = gi + s->weight_decay * pi;
        float mi = m[i] * s->beta1 + gi * s->one_minus_beta1;
        float vi = v[i] * s->beta2 + (gi * gi) * s->one_minus_beta2;
        float denom = sqrtf(vi) * s->inv_sqrt_bc2 + s->eps;
        if (s->adamw)
            pi = pi - s->decay * pi;
        pi = pi - s->step_size * (mi / denom);
        m[i] = mi;
        v[i] = vi;
        p[i] = pi;
    }
}

void zs_sgd_ref(float *p, const float *g, float *buf, int64_t n, const struct zs_sgd_step *s)
{
    for (int64_t i = 0; i < n; i++) {
        float pi = p[i];
        float gi = g[i] * s->grad_scale + s->weight_decay * pi;

        if (buf) {
            float b = s->first ? gi : buf[i] * s->momentum + gi * s->dampening_c;
            buf[i] = b;
            gi = s->nesterov ? gi + s->momentum * b : b;
        }
        p[i] = pi - s->lr * gi;
    }
}

double zs_sumsq_ref(const float *x, int64_t n)
{
    double acc = 0.0;

    for (int64_t i = 0; i < n; i++)
        acc += (double)x[i] * (double)x[i];
    return acc;
}
