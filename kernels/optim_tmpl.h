/* optim_tmpl.h - the optimizer kernels, written once. Included by optim_scalar.c, optim_avx2.c and
 * optim_avx512.c, each compiled for its instruction set with ZS_PATH_SUFFIX set; the compiler
 * specializes every (optimizer, param dtype, grad dtype) combination and vectorizes the loops of the
 * fast paths. Each element sees the same IEEE operations in the same order on every path: explicit
 * fmaf where a fused operation is wanted (it halves the rounding of the moment updates), no implicit
 * contraction anywhere, and NaN results written as one canonical quiet NaN, because x86 propagates NaN
 * signs differently in scalar and vector code. */
#include <math.h>

#include "convert.h"
#include "optim.h"

#define ZS_INLINE static inline __attribute__((always_inline))

ZS_INLINE float load(const void *p, int64_t i, int dt)
{
    if (dt == ZS_DTYPE_BF16)
        return zs_cvt_bf16_f32(((const uint16_t *)p)[i]);
    if (dt == ZS_DTYPE_FP16)
        return zs_cvt_f16_f32(((const uint16_t *)p)[i]);
    return ((const float *)p)[i];
}

ZS_INLINE void store16(void *p, int64_t i, float f, int dt)
{
    ((uint16_t *)p)[i] = dt == ZS_DTYPE_BF16 ? zs_cvt_f32_bf16(f) : zs_cvt_f32_f16(f);
}

/* The parameter the update reads: the fp32 master copy for 16-bit parameters, else the parameter. */
ZS_INLINE float *master_of(const struct zs_optim_bufs *b, int pdt)
{
    return pdt == ZS_DTYPE_FP32 ? (float *)b->param : b->master;
}

/* 16-bit gradients are widened a block at a time into a small float buffer: the conversion and the
 * update then vectorize as two simple loops (one fused loop defeats GCC's vectorizer for fp16). */
#define ZS_BLOCK 512

ZS_INLINE const float *grad_block(const void *grad, int64_t i0, int64_t n, int gdt, float *buf)
{
    if (gdt == ZS_DTYPE_FP32)
        return (const float *)grad + i0;
    for (int64_t j = 0; j < n; j++)
        buf[j] = load(grad, i0 + j, gdt);
    return buf;
}

/* 16-bit parameters are rounded from the block of master values just written (still in L1), again
 * as a loop of its own. */
ZS_INLINE void param_block(void *param, const float *master, int64_t i0, int64_t n, int pdt)
{
    if (pdt != ZS_DTYPE_FP32)
        for (int64_t j = 0; j < n; j++)
            store16(param, i0 + j, master[i0 + j], pdt);
}

/* Runs BODY for every element of [begin, end) with `i` the element and `gi` its fp32 gradient; BODY
 * writes the fp32 master value, the block's 16-bit parameters follow. */
#define ZS_FOR_EACH(b, begin, end, pdt, gdt, BODY)                                                        \
    do {                                                                                                   \
        float gbuf_[ZS_BLOCK];                                                                             \
        for (int64_t i0_ = (begin); i0_ < (end); i0_ += ZS_BLOCK) {                                        \
            int64_t n_ = (end) - i0_ < ZS_BLOCK ? (end) - i0_ : ZS_BLOCK;                                   \
            const float *restrict gb_ = grad_block((b)->grad, i0_, n_, (gdt), gbuf_);                      \
            for (int64_t j_ = 0; j_ < n_; j_++) {                                                          \
                const int64_t i = i0_ + j_;                                                                \
                const float gi = gb_[j_];                                                                  \
                BODY                                                                                       \
            }                                                                                              \
            param_block((b)->param, master, i0_, n_, (pdt));                                               \
        }                                                                                                  \
    } while (0)

/* NaN stays NaN, but always the same NaN. */
ZS_INLINE float canon(float x)
{
    return x == x ? x : zs_float(0x7fc00000u);
}

#define ZS_WRITE_PARAM(b, i, w, pdt) (master[i] = canon(w))

ZS_INLINE void adam_body(const struct zs_optim_step *s, const struct zs_optim_bufs *b, int64_t begin, int64_t end,
                         int pdt, int gdt, int adamw)
{
    float *restrict master = master_of(b, pdt);
    float *restrict m = b->s1, *restrict v = b->s2;

    ZS_FOR_EACH(b, begin, end, pdt, gdt, {
        float g = gi * s->grad_scale;
        float p = master[i];
        if (!adamw)
            g = fmaf(s->weight_decay, p, g);
        float mi = fmaf(m[i], s->beta1, g * s->one_minus_beta1);
        float vi = fmaf(v[i], s->beta2, g * (g * s->one_minus_beta2));
        float denom = fmaf(sqrtf(vi), s->inv_sqrt_bc2, s->eps);
        if (adamw)
            p = fmaf(-s->decay, p, p);
        p = fmaf(-s->step_size, mi / denom, p);
        m[i] = canon(mi);
        v[i] = canon(vi);
        ZS_WRITE_PARAM(b, i, p, pdt);
    });
}

ZS_INLINE void sgd_body(const struct zs_optim_step *s, const struct zs_optim_bufs *b, int64_t begin, int64_t end,
                        int pdt, int gdt)
{
    float *restrict master = master_of(b, pdt);
    float *restrict buf = b->s1;

    if (!buf) {
        ZS_FOR_EACH(b, begin, end, pdt, gdt, {
            float p = master[i];
            float g = fmaf(s->weight_decay, p, gi * s->grad_scale);
            ZS_WRITE_PARAM(b, i, fmaf(-s->lr, g, p), pdt);
        });
    } else if (s->first) {
        ZS_FOR_EACH(b, begin, end, pdt, gdt, {
            float p = master[i];
            float g = fmaf(s->weight_decay, p, gi * s->grad_scale);
            buf[i] = canon(g);
            float d = s->nesterov ? fmaf(s->momentum, g, g) : g;
            ZS_WRITE_PARAM(b, i, fmaf(-s->lr, d, p), pdt);
        });
    } else {
        ZS_FOR_EACH(b, begin, end, pdt, gdt, {
            float p = master[i];
            float g = fmaf(s->weight_decay, p, gi * s->grad_scale);
            float bi = fmaf(buf[i], s->momentum, g * s->dampening_c);
            buf[i] = canon(bi);
            float d = s->nesterov ? fmaf(s->momentum, bi, g) : bi;
            ZS_WRITE_PARAM(b, i, fmaf(-s->lr, d, p), pdt);
        });
    }
}

/* sign(c) as PyTorch computes it: NaN stays NaN, zero stays zero. */
ZS_INLINE float sign_of(float c)
{
    return c > 0.0f ? 1.0f : (c < 0.0f ? -1.0f : c);
}

ZS_INLINE void lion_body(const struct zs_optim_step *s, const struct zs_optim_bufs *b, int64_t begin, int64_t end,
                         int pdt, int gdt)
{
    float *restrict master = master_of(b, pdt);
    float *restrict m = b->s1;

    ZS_FOR_EACH(b, begin, end, pdt, gdt, {
        float g = gi * s->grad_scale;
        float p = master[i];
        float c = fmaf(m[i], s->beta1, g * s->one_minus_beta1);
        p = fmaf(-s->decay, p, p);
        p = fmaf(-s->lr, sign_of(c), p);
        m[i] = canon(fmaf(m[i], s->beta2, g * s->one_minus_beta2));
        ZS_WRITE_PARAM(b, i, p, pdt);
    });
}

ZS_INLINE void adagrad_body(const struct zs_optim_step *s, const struct zs_optim_bufs *b, int64_t begin,
                            int64_t end, int pdt, int gdt)
{
    float *restrict master = master_of(b, pdt);
    float *restrict sum = b->s1;

    ZS_FOR_EACH(b, begin, end, pdt, gdt, {
        float p = master[i];
        float g = fmaf(s->weight_decay, p, gi * s->grad_scale);
        float si = fmaf(g, g, sum[i]);
        sum[i] = canon(si);
        p = fmaf(-s->lr, g / (sqrtf(si) + s->eps), p);
        ZS_WRITE_PARAM(b, i, p, pdt);
    });
}

#define ZS_CAT2(a, b) a##_##b
#define ZS_CAT(a, b) ZS_CAT2(a, b)
#define ZS_KNAME(opt, p, g) ZS_CAT(ZS_CAT(ZS_CAT(opt, p), g), ZS_PATH_SUFFIX)

/* One exported-to-the-table function per (optimizer, param dtype, grad dtype). */
#define ZS_DEFINE(opt, P, G, call)                                                                         \
    static void ZS_KNAME(opt, P, G)(const struct zs_optim_step *s, const struct zs_optim_bufs *b,          \
                                    int64_t begin, int64_t end)                                            \
    {                                                                                                      \
        call;                                                                                              \
    }

#define ZS_DEFINE_ALL(P, G)                                                                                \
    ZS_DEFINE(adam, P, G, adam_body(s, b, begin, end, P, G, 0))                                            \
    ZS_DEFINE(adamw, P, G, adam_body(s, b, begin, end, P, G, 1))                                           \
    ZS_DEFINE(sgd, P, G, sgd_body(s, b, begin, end, P, G))                                                 \
    ZS_DEFINE(lion, P, G, lion_body(s, b, begin, end, P, G))                                               \
    ZS_DEFINE(adagrad, P, G, adagrad_body(s, b, begin, end, P, G))

#define F32 ZS_DTYPE_FP32
#define BF16 ZS_DTYPE_BF16
#define F16 ZS_DTYPE_FP16
ZS_DEFINE_ALL(F32, F32)
ZS_DEFINE_ALL(BF16, BF16)
ZS_DEFINE_ALL(BF16, F32)
ZS_DEFINE_ALL(F16, F16)
ZS_DEFINE_ALL(F16, F32)

#define ZS_FILL(P, G)                                                                                      \
    do {                                                                                                   \
        tab[ZS_KOPT_ADAM][P][G] = ZS_KNAME(adam, P, G);                                                    \
        tab[ZS_KOPT_ADAMW][P][G] = ZS_KNAME(adamw, P, G);                                                  \
        tab[ZS_KOPT_SGD][P][G] = ZS_KNAME(sgd, P, G);                                                      \
        tab[ZS_KOPT_LION][P][G] = ZS_KNAME(lion, P, G);                                                    \
        tab[ZS_KOPT_ADAGRAD][P][G] = ZS_KNAME(adagrad, P, G);                                              \
    } while (0)

void ZS_CAT(zs_optim_table, ZS_PATH_SUFFIX)(zs_optim_fn tab[ZS_KOPT_COUNT][3][3]);
void ZS_CAT(zs_optim_table, ZS_PATH_SUFFIX)(zs_optim_fn tab[ZS_KOPT_COUNT][3][3])
{
    ZS_FILL(F32, F32);
    ZS_FILL(BF16, BF16);
    ZS_FILL(BF16, F32);
    ZS_FILL(F16, F16);
    ZS_FILL(F16, F32);
}
