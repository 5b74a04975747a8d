/* vmath.c - vmath.h's two paths from one body (vmath_tmpl.h): the baseline x86-64 one and the AVX512
 * one, picked once by cpuid. */
#include <math.h>
#include <string.h>

#include "vmath.h"

#define VN 16
typedef float vf __attribute__((vector_size(4 * VN)));
typedef int32_t vi __attribute__((vector_size(4 * VN)));
typedef uint32_t vu __attribute__((vector_size(4 * VN)));
typedef uint16_t vh __attribute__((vector_size(2 * VN)));

/* macros, not functions: each expands inside the path's own (target-specific) code */
#define vload(p) ({ vf v_; memcpy(&v_, (p), sizeof(v_)); v_; })
#define vstore(p, x) ({ vf s_ = (x); memcpy((p), &s_, sizeof(s_)); })
#define hload(p) ({ vh h_; memcpy(&h_, (p), sizeof(h_)); h_; })
#define hstore(p, x) ({ vh t_ = (x); memcpy((p), &t_, sizeof(t_)); })
#define splat(c) ((vf){0} + (float)(c))
/* lanes of a where the mask m (all ones or zeros per lane) is set, of b elsewhere */
#define vsel(m, a, b) ((vf)(((vi)(a) & (m)) | ((vi)(b) & ~(m))))

#define vmax(a, b) ({ vf a_ = (a), b_ = (b); vsel(a_ > b_, a_, b_); })

/* The body runs once per whole vector of n elements (the last may be partial), in parallel: i is its first
 * element, k its length. An element's lanes and arithmetic never depend on the thread count. */
#define VM_CHUNKS(n, i, k)                                               \
    _Pragma("omp parallel for schedule(static)")                         \
    for (int64_t c_ = 0; c_ < ((n) + VN - 1) / VN; c_++)                 \
        for (int64_t i = c_ * VN, k = (n) - i < VN ? (n) - i : VN, o_ = 1; o_; o_ = 0)

#define VM_SUF(x) x##_generic
#include "vmath_tmpl.h"
#undef VM_SUF

#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq,avx512bw,avx512vl")
#define VM_SUF(x) x##_avx512
#include "vmath_tmpl.h"
#undef VM_SUF
#pragma GCC pop_options

static struct gpt_vmath generic, avx512;

const struct gpt_vmath *gpt_vmath_generic(void)
{
    generic = ops_generic;
    generic.name = "generic";
    return &generic;
}

const struct gpt_vmath *gpt_vmath_avx512(void)
{
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
        !__builtin_cpu_supports("avx512vl") || !__builtin_cpu_supports("avx512dq"))
        return NULL;
    avx512 = ops_avx512;
    avx512.name = "avx512";
    return &avx512;
}

const struct gpt_vmath *gpt_vmath(void)
{
    static const struct gpt_vmath *best;

    if (!best) {
        const struct gpt_vmath *v = gpt_vmath_avx512();
        best = v ? v : gpt_vmath_generic();
    }
    return best;
}
