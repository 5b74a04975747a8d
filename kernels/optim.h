/* optim.h - elementwise optimizer kernels over one shard: Adam, AdamW, SGD (momentum, Nesterov), Lion,
 * Adagrad, with parameters and gradients in fp32, bf16 or fp16 and fp32 state. Pure: step count, bias
 * corrections and learning rate come from the engine.
 *
 * One template (optim_tmpl.h) is compiled three times: a scalar reference (no vectorization), AVX2 and
 * AVX-512. The arithmetic is written once, without fused multiply-add (-ffp-contract=off) and with
 * conversions done by integer and exact float operations, so every path gives the same bits for every
 * element, tail included. */
#ifndef ZS_OPTIM_H
#define ZS_OPTIM_H

#include <stdbool.h>
#include <stdint.h>

#include "zeroshard.h" /* defines: zs_dtype */

enum zs_kopt { ZS_KOPT_ADAM, ZS_KOPT_ADAMW, ZS_KOPT_SGD, ZS_KOPT_LION, ZS_KOPT_ADAGRAD, ZS_KOPT_COUNT };
enum zs_kpath { ZS_KPATH_SCALAR, ZS_KPATH_AVX2, ZS_KPATH_AVX512, ZS_KPATH_COUNT };

/* Per-step scalars, computed once by the engine in double and rounded to float. */
struct zs_optim_step {
    float lr;
    float beta1, beta2;            /* Adam(W), Lion */
    float one_minus_beta1, one_minus_beta2;
    float eps;                     /* Adam(W), Adagrad */
    float weight_decay;            /* L2 (Adam, SGD, Adagrad) */
    float step_size;               /* Adam(W): lr / (1 - beta1^t), or lr without bias correction */
    float inv_sqrt_bc2;            /* Adam(W): 1 / sqrt(1 - beta2^t), or 1 */
    float decay;                   /* decoupled decay lr * weight_decay (AdamW, Lion) */
    float grad_scale;              /* applied to every gradient first (clipping, loss-scale inverse) */
    float momentum, dampening_c;   /* SGD; dampening_c = 1 - dampening */
    int32_t nesterov;              /* SGD */
    int32_t first;                 /* SGD: the momentum buffer starts as the gradient (PyTorch) */
};

/* The arrays of one shard. Element i of every array belongs to the same parameter element. */
struct zs_optim_bufs {
    void *param;                   /* working parameters, dtype pdt; updated in place */
    const void *grad;              /* gradients, dtype gdt */
    float *master;                 /* fp32 master copy when pdt is 16-bit (read, updated), else NULL */
    float *s1, *s2;                /* state: Adam m, v; SGD momentum (NULL when momentum 0); Lion m; Adagrad sum */
};

typedef void (*zs_optim_fn)(const struct zs_optim_step *s, const struct zs_optim_bufs *b, int64_t begin,
                            int64_t end);

/* The kernel for one optimizer and dtype pair on one path; NULL when the path is not compiled in or the
 * CPU lacks it. Pairs: pdt any of fp32/bf16/fp16, gdt either pdt or fp32. */
zs_optim_fn zs_optim_kernel(enum zs_kpath path, enum zs_kopt opt, zs_dtype pdt, zs_dtype gdt);

/* Paths: what the CPU supports (cpuid and OS state), the best of those, names for logs and the env. */
bool zs_kpath_supported(enum zs_kpath path);
enum zs_kpath zs_kpath_best(void);
const char *zs_kpath_name(enum zs_kpath path);
/* "scalar", "avx2", "avx512" or "auto"; 0, or -EINVAL for another name, -ENOTSUP for a path the CPU lacks. */
int zs_kpath_parse(const char *name, enum zs_kpath *path);
const char *zs_kopt_name(enum zs_kopt opt);
const char *zs_dtype_name(zs_dtype t);
/* Bytes a step moves per parameter (reads + writes) for the benchmark's bandwidth figure. */
int zs_optim_bytes_per_param(enum zs_kopt opt, zs_dtype pdt, zs_dtype gdt, bool momentum);

/* fp32 <-> bf16 / fp16 with round-to-nearest-even; NaN stays NaN (quiet), Inf stays Inf, subnormals
 * are kept (never flushed). The scalar forms the kernels and tests share. */
uint16_t zs_f32_to_bf16(float f);
float zs_bf16_to_f32(uint16_t h);
uint16_t zs_f32_to_f16(float f);
float zs_f16_to_f32(uint16_t h);

/* Sum of squares of x[0..n) in double, left to right; the engine combines these partials in a fixed
 * order so that every stage gets the same norm bits. */
double zs_sumsq_ref(const float *x, int64_t n);

#endif /* ZS_OPTIM_H */
