/* vmath.h - the float passes' elementwise math 16 lanes at a time: exp, GELU (tanh form) and its
 * derivative, the causal softmax of an attention row and its backward, the cross-entropy of a logit row,
 * bf16 rounding and widening.
 * Written once in GCC vector extensions (vmath_tmpl.h) and compiled twice: for the baseline x86-64 (the
 * portable path) and for AVX512. Neither contracts a multiply and an add, both take the same IEEE
 * operations in the same order (tails are padded into a whole vector, lane sums are folded in one fixed
 * order), so the two paths give the same bits, whatever the thread count or the place an element takes in
 * its array. The double passes (passes_f64.c) keep libm: they are the reference. */
#ifndef GPT_VMATH_H
#define GPT_VMATH_H

#include <stdbool.h>
#include <stdint.h>

struct gpt_vmath {
    const char *name; /* "avx512" or "generic" */
    /* y[i] = exp(x[i]) (within 2 ulp for x in [-87.3, 88]; 0 below -87.3; exp(88) above 88) */
    void (*exp)(float *y, const float *x, int64_t n);
    /* y = gelu(x) = 0.5 x (1 + tanh(k (x + 0.044715 x^3))), computed as x / (1 + exp(-2 k (...))) */
    void (*gelu_forward)(float *y, const float *x, int64_t n);
    /* d *= gelu'(x) */
    void (*gelu_backward)(float *d, const float *x, int64_t n);
    /* fused with the rounding of the result (the bf16 products' input): h = bf16(gelu(x)); and
     * d *= gelu'(x), h = bf16(d). The same bits as gelu_forward or gelu_backward followed by to_bf16. */
    void (*gelu_forward16)(uint16_t *h, const float *x, int64_t n);
    void (*gelu_backward16)(float *d, uint16_t *h, const float *x, int64_t n);
    /* a[0..n) = softmax(a[0..n)), a[n..len) = 0 */
    void (*softmax_causal)(float *a, int64_t n, int64_t len);
    /* In: d[0..n) the gradient at the probabilities p. Out: d[s] = scale * p[s] (d[s] - sum p d) for s < n,
     * 0 for n <= s < len (the gradient at the scores before scaling). */
    void (*softmax_backward)(float *d, const float *p, int64_t n, int64_t len, float scale);
    /* -log softmax(z)[target]; with f != 0, z is replaced by f * (softmax(z) - onehot(target)) */
    double (*xent)(float *z, int64_t n, int32_t target, float f);
    /* bf16 storage, threaded (integer rounding, so every path gives the same bits): dst = src rounded to
     * bf16 (nearest, ties to even; NaN stays NaN), dst = src widened, h = bf16(float(h) + g) */
    void (*to_bf16)(uint16_t *dst, const float *src, int64_t n);
    void (*from_bf16)(float *dst, const uint16_t *src, int64_t n);
    void (*add_bf16)(uint16_t *h, const float *g, int64_t n);
};

/* the fastest path this CPU runs (chosen once) */
const struct gpt_vmath *gpt_vmath(void);
/* the portable path, which the tests hold the fast one equal to */
const struct gpt_vmath *gpt_vmath_generic(void);
/* the AVX512 path, or NULL where the CPU lacks AVX512F */
const struct gpt_vmath *gpt_vmath_avx512(void);

#endif /* GPT_VMATH_H */
