/* optim_tmpl.h - the optimizer loops, written once. Included by optim_scalar.c, optim_avx2.c and
 * optim_avx512.c, each compiled for its instruction set with ZS_PATH_SUFFIX set; the compiler
 * specializes every (optimizer, param dtype, grad dtype) combination and vectorizes the loops of the
 * fast paths. The arithmetic of one element is optim_elem.h's, which the CUDA kernels share: each
 * element sees the same IEEE operations in the same order on every path and processor (explicit fmaf
 * where a fused operation is wanted, no implicit contraction, one canonical quiet NaN). */
#include <math.h>

#include "convert.h"
#include "optim.h"
#include "optim_elem.h" /* defines: zs_adam_elem, zs_sgd_elem, zs_lion_elem, zs_adagrad_elem */

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

ZS_INLINE void adam_body(const struct zs_optim_step *s, const struct zs_optim_bufs *b, int64_t begin, int64_t end,
                         int pdt, int gdt, int adamw)
{
    float *restrict master = master_of(b, pdt);
    float *restrict m = b->s1, *restrict v = b->s2;

    ZS_FOR_EACH(b, begin, end, pdt, gdt, { master[i] = zs_adam_elem(s, gi, master[i], &m[i], &v[i], adamw); });
}

ZS_INLINE void sgd_body(const struct zs_optim_step *s, const struct zs_optim_bufs *b, int64_t begin, int64_t end,
                        int pdt, int gdt)
{
    float *restrict master = master_of(b, pdt);
    float *restrict buf = b->s1;

    /* one loop per form, so each loop's body is branch-free for the vectorizer */
    if (!buf)
        ZS_FOR_EACH(b, begin, end, pdt, gdt, { master[i] = zs_sgd_elem(s, gi, master[i], NULL, ZS_SGD_PLAIN); });
    else if (s->first)
        ZS_FOR_EACH(b, begin, end, pdt, gdt, { master[i] = zs_sgd_elem(s, gi, master[i], &buf[i], ZS_SGD_FIRST); });
    else
        ZS_FOR_EACH(b, begin, end, pdt, gdt, { master[i] = zs_sgd_elem(s, gi, master[i], &buf[i], ZS_SGD_MOMENTUM); });
}

ZS_INLINE void lion_body(const struct zs_optim_step *s, const struct zs_optim_bufs *b, int64_t begin, int64_t end,
                         int pdt, int gdt)
{
    float *restrict master = master_of(b, pdt);
    float *restrict m = b->s1;

    ZS_FOR_EACH(b, begin, end, pdt, gdt, { master[i] = zs_lion_elem(s, gi, master[i], &m[i]); });
}

ZS_INLINE void adagrad_body(const struct zs_optim_step *s, const struct zs_optim_bufs *b, int64_t begin,
                            int64_t end, int pdt, int gdt)
{
    float *restrict master = master_of(b, pdt);
    float *restrict sum = b->s1;

    ZS_FOR_EACH(b, begin, end, pdt, gdt, { master[i] = zs_adagrad_elem(s, gi, master[i], &sum[i]); });
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
