/* optim.h - elementwise optimizer kernels over one shard. Pure: step count, bias corrections and the
 * learning rate come from the engine. The scalar versions here are the reference every fast path
 * (a later SIMD issue) must match bit for bit, so the arithmetic order is spelled out and the library is
 * compiled with -ffp-contract=off. */
#ifndef ZS_OPTIM_H
#define ZS_OPTIM_H

#include <stdint.h>

/* Per-step scalars, computed once by the engine in double and rounded to float. */
struct zs_adam_step {
    float lr;          /* learning rate of this step */
    float beta1, beta2;
    float one_minus_beta1, one_minus_beta2;
    float eps;
    float weight_decay;
    float step_size;   /* lr / (1 - beta1^t), or lr without bias correction */
    float inv_sqrt_bc2; /* 1 / sqrt(1 - beta2^t), or 1 */
    float decay;       /* lr * weight_decay (AdamW, decoupled) */
    float grad_scale;  /* applied to every gradient first (clipping coefficient) */
    int adamw;         /* 1: decoupled weight decay; 0: L2 added to the gradient */
};

struct zs_sgd_step {
    float lr, momentum, dampening_c; /* dampening_c = 1 - dampening */
    float weight_decay;
    float grad_scale;
    int nesterov;
    int first;         /* first step: the momentum buffer starts as the gradient (as in PyTorch) */
};

void zs_adam_ref(float *p, const float *g, float *m, float *v, int64_t n, const struct zs_adam_step *s);
/* buf may be NULL when momentum is 0. */
void zs_sgd_ref(float *p, const float *g, float *buf, int64_t n, const struct zs_sgd_step *s);

/* Sum of squares of x[0..n) in double, left to right; the engine combines these partials in a fixed
 * order so that every stage gets the same norm bits. */
double zs_sumsq_ref(const float *x, int64_t n);

#endif /* ZS_OPTIM_H */
