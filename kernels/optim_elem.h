/* optim_elem.h - each optimizer's update of one element, written once: gcc compiles it into the CPU
 * template (optim_tmpl.h: scalar reference, AVX2, AVX-512) and nvcc into the CUDA kernels (optim_cuda.cu).
 * Both compile it without contraction (-ffp-contract=off; nvcc --fmad=false), with IEEE division and square
 * root and no flush to zero, so the only fused operations are the explicit fmaf calls and every element
 * gets the same bits on every processor. Each function takes the fp32 gradient and the fp32 parameter
 * (the master of a 16-bit parameter), updates the state it is given and returns the new parameter. */
#ifndef ZS_OPTIM_ELEM_H
#define ZS_OPTIM_ELEM_H

#include <math.h>

#include "convert.h" /* defines: ZS_HD, zs_float */
#include "optim.h"   /* defines: struct zs_optim_step */

/* NaN stays NaN, but always the same NaN: x86 propagates NaN signs differently in scalar and vector code,
 * and a GPU differently again. */
ZS_HD float zs_canon(float x)
{
    return x == x ? x : zs_float(0x7fc00000u);
}

/* sign(c) as PyTorch computes it: NaN stays NaN, zero stays zero. */
ZS_HD float zs_sign_of(float c)
{
    return c > 0.0f ? 1.0f : (c < 0.0f ? -1.0f : c);
}

ZS_HD float zs_adam_elem(const struct zs_optim_step *s, float gi, float p, float *m, float *v, int adamw)
{
    float g = gi * s->grad_scale;

    if (!adamw)
        g = fmaf(s->weight_decay, p, g);
    float mi = fmaf(*m, s->beta1, g * s->one_minus_beta1);
    float vi = fmaf(*v, s->beta2, g * (g * s->one_minus_beta2));
    float denom = fmaf(sqrtf(vi), s->inv_sqrt_bc2, s->eps);
    if (adamw)
        p = fmaf(-s->decay, p, p);
    p = fmaf(-s->step_size, mi / denom, p);
    *m = zs_canon(mi);
    *v = zs_canon(vi);
    return zs_canon(p);
}

/* SGD's three forms: no momentum buffer, the first step (the buffer starts as the gradient, as in
 * PyTorch), and momentum. */
enum zs_sgd_form { ZS_SGD_PLAIN, ZS_SGD_FIRST, ZS_SGD_MOMENTUM };

ZS_HD float zs_sgd_elem(const struct zs_optim_step *s, float gi, float p, float *buf, int form)
{
    float g = fmaf(s->weight_decay, p, gi * s->grad_scale);
    float d = g;

    if (form == ZS_SGD_FIRST) {
        *buf = zs_canon(g);
        d = s->nesterov ? fmaf(s->momentum, g, g) : g;
    } else if (form == ZS_SGD_MOMENTUM) {
        float bi = fmaf(*buf, s->momentum, g * s->dampening_c);
        *buf = zs_canon(bi);
        d = s->nesterov ? fmaf(s->momentum, bi, g) : bi;
    }
    return zs_canon(fmaf(-s->lr, d, p));
}

ZS_HD float zs_lion_elem(const struct zs_optim_step *s, float gi, float p, float *m)
{
    float g = gi * s->grad_scale;
    float c = fmaf(*m, s->beta1, g * s->one_minus_beta1);

    p = fmaf(-s->decay, p, p);
    p = fmaf(-s->lr, zs_sign_of(c), p);
    *m = zs_canon(fmaf(*m, s->beta2, g * s->one_minus_beta2));
    return zs_canon(p);
}

ZS_HD float zs_adagrad_elem(const struct zs_optim_step *s, float gi, float p, float *sum)
{
    float g = fmaf(s->weight_decay, p, gi * s->grad_scale);
    float si = fmaf(g, g, *sum);

    *sum = zs_canon(si);
    return zs_canon(fmaf(-s->lr, g / (sqrtf(si) + s->eps), p));
}

#endif /* ZS_OPTIM_ELEM_H */
