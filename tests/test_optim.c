/* test_optim.c - the optimizer kernels: every fast path (one ctest each) is bit-identical to the scalar
 * reference for every optimizer and dtype pair on awkward lengths and hostile values (NaN, Inf,
 * subnormals, huge, tiny), whatever the range or thread count; known answers against a double-precision
 * reference within 1 ulp; and the bf16/fp16 conversions round to nearest even at the boundaries. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "kernels/convert.h"
#include "kernels/optim.h"
#include "kernels/threads.h"

static const zs_dtype pairs[][2] = {
    { ZS_DTYPE_FP32, ZS_DTYPE_FP32 }, { ZS_DTYPE_BF16, ZS_DTYPE_BF16 }, { ZS_DTYPE_BF16, ZS_DTYPE_FP32 },
    { ZS_DTYPE_FP16, ZS_DTYPE_FP16 }, { ZS_DTYPE_FP16, ZS_DTYPE_FP32 },
};
#define NPAIRS (sizeof(pairs) / sizeof(pairs[0]))

static uint64_t rng = 0x9e3779b97f4a7c15ULL;
static uint32_t next32(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

/* Mostly ordinary values, with NaN, +-Inf, subnormals, huge and tiny ones sprinkled in. */
static float hostile(float scale)
{
    uint32_t r = next32() % 64;
    switch (r) {
    case 0: return NAN;
    case 1: return INFINITY;
    case 2: return -INFINITY;
    case 3: return zs_float(next32() & 0x807fffffu);         /* subnormal, either sign */
    case 4: return (next32() & 1 ? 1.0f : -1.0f) * 3.0e38f;  /* huge */
    case 5: return (next32() & 1 ? 1.0f : -1.0f) * 1.5e-38f; /* tiny normal */
    case 6: return 0.0f;
    case 7: return -0.0f;
    default: return scale * ((float)(next32() & 0xffffff) / 8388608.0f - 1.0f);
    }
}

struct arrays {
    int64_t n;
    void *param, *grad;
    float *master, *s1, *s2;
};

static size_t dsize(zs_dtype t) { return t == ZS_DTYPE_FP32 ? 4 : 2; }

static void alloc_arrays(struct arrays *a, int64_t n, zs_dtype pdt, zs_dtype gdt)
{
    a->n = n;
    a->param = malloc((size_t)n * dsize(pdt) + 64);
    a->grad = malloc((size_t)n * dsize(gdt) + 64);
    a->master = malloc((size_t)n * 4 + 64);
    a->s1 = malloc((size_t)n * 4 + 64);
    a->s2 = malloc((size_t)n * 4 + 64);
}

/* Element i's parameter (and its fp32 master) and gradient, each rounded to its dtype. */
static void set_element(struct arrays *a, int64_t i, float p, float g, zs_dtype pdt, zs_dtype gdt)
{
    a->master[i] = p;
    if (pdt == ZS_DTYPE_FP32)
        ((float *)a->param)[i] = p;
    else
        ((uint16_t *)a->param)[i] = pdt == ZS_DTYPE_BF16 ? zs_cvt_f32_bf16(p) : zs_cvt_f32_f16(p);
    if (gdt == ZS_DTYPE_FP32)
        ((float *)a->grad)[i] = g;
    else
        ((uint16_t *)a->grad)[i] = gdt == ZS_DTYPE_BF16 ? zs_cvt_f32_bf16(g) : zs_cvt_f32_f16(g);
}

static void fill_arrays(struct arrays *a, zs_dtype pdt, zs_dtype gdt)
{
    for (int64_t i = 0; i < a->n; i++) {
        float p = hostile(1.0f), g = hostile(0.1f);
        set_element(a, i, p, g, pdt, gdt);
        a->s1[i] = hostile(0.01f);
        a->s2[i] = fabsf(hostile(1e-4f)); /* second moments and sums are never negative */
    }
}

static void copy_arrays(struct arrays *dst, const struct arrays *src, zs_dtype pdt, zs_dtype gdt)
{
    memcpy(dst->param, src->param, (size_t)src->n * dsize(pdt));
    memcpy(dst->grad, src->grad, (size_t)src->n * dsize(gdt));
    memcpy(dst->master, src->master, (size_t)src->n * 4);
    memcpy(dst->s1, src->s1, (size_t)src->n * 4);
    memcpy(dst->s2, src->s2, (size_t)src->n * 4);
}

static void free_arrays(struct arrays *a)
{
    free(a->param);
    free(a->grad);
    free(a->master);
    free(a->s1);
    free(a->s2);
}

static struct zs_optim_bufs bufs_of(const struct arrays *a, zs_dtype pdt, int with_s1)
{
    struct zs_optim_bufs b = { .param = a->param, .grad = a->grad, .s1 = with_s1 ? a->s1 : NULL, .s2 = a->s2 };
    b.master = pdt == ZS_DTYPE_FP32 ? NULL : a->master;
    return b;
}

static struct zs_optim_step some_step(int first, int nesterov)
{
    struct zs_optim_step s = {
        .lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .one_minus_beta1 = 0.1f, .one_minus_beta2 = 0.001f,
        .eps = 1e-8f, .weight_decay = 0.01f, .step_size = 1e-3f / 0.271f, .inv_sqrt_bc2 = 1.0f / sqrtf(0.00995f),
        .decay = 1e-5f, .grad_scale = 0.75f, .momentum = 0.9f, .dampening_c = 0.95f, .nesterov = nesterov,
        .first = first,
    };
    return s;
}

static int64_t count_diff(const void *x, const void *y, int64_t n, size_t size)
{
    int64_t d = 0;
    for (int64_t i = 0; i < n; i++)
        d += memcmp((const char *)x + i * size, (const char *)y + i * size, size) != 0;
    return d;
}

static int64_t diff_arrays(const struct arrays *a, const struct arrays *b, zs_dtype pdt)
{
    return count_diff(a->param, b->param, a->n, dsize(pdt)) + count_diff(a->master, b->master, a->n, 4) +
           count_diff(a->s1, b->s1, a->n, 4) + count_diff(a->s2, b->s2, a->n, 4);
}

/* One path against the scalar reference over [begin, end) of n hostile elements. */
static void check_path(enum zs_kpath path, enum zs_kopt opt, int pi, int64_t n, int64_t begin, int64_t end,
                       struct zs_optim_step s, int with_s1)
{
    zs_dtype pdt = pairs[pi][0], gdt = pairs[pi][1];
    zs_optim_fn ref = zs_optim_kernel(ZS_KPATH_SCALAR, opt, pdt, gdt), fast = zs_optim_kernel(path, opt, pdt, gdt);
    struct arrays a, b;

    alloc_arrays(&a, n, pdt, gdt);
    alloc_arrays(&b, n, pdt, gdt);
    fill_arrays(&a, pdt, gdt);
    copy_arrays(&b, &a, pdt, gdt);
    struct zs_optim_bufs ba = bufs_of(&a, pdt, with_s1), bb = bufs_of(&b, pdt, with_s1);
    ref(&s, &ba, begin, end);
    fast(&s, &bb, begin, end);
    int64_t d = diff_arrays(&a, &b, pdt);
    for (int64_t i = 0; d && i < n && getenv("ZS_TEST_VERBOSE"); i++)
        if (memcmp(&a.master[i], &b.master[i], 4) || memcmp(&a.s1[i], &b.s1[i], 4) || memcmp(&a.s2[i], &b.s2[i], 4))
            printf("  element %lld: master %08x %08x s1 %08x %08x s2 %08x %08x\n", (long long)i, zs_bits(a.master[i]),
                   zs_bits(b.master[i]), zs_bits(a.s1[i]), zs_bits(b.s1[i]), zs_bits(a.s2[i]), zs_bits(b.s2[i]));
    CHECK(d == 0, "%s %s %s/%s n %lld [%lld,%lld): %lld elements differ from scalar", zs_kpath_name(path),
          zs_kopt_name(opt), zs_dtype_name(pdt), zs_dtype_name(gdt), (long long)n, (long long)begin,
          (long long)end, (long long)d);
    free_arrays(&a);
    free_arrays(&b);
}

static void test_bit_exact(enum zs_kpath path)
{
    static const int64_t lengths[] = { 0, 1, 15, 17, 1000003 };

    for (int opt = 0; opt < ZS_KOPT_COUNT; opt++)
        for (int pi = 0; pi < (int)NPAIRS; pi++) {
            for (size_t l = 0; l < sizeof(lengths) / sizeof(lengths[0]); l++)
                check_path(path, opt, pi, lengths[l], 0, lengths[l], some_step(0, 0), 1);
            check_path(path, opt, pi, 1000, 3, 997, some_step(0, 0), 1); /* unaligned start and end */
            if (opt == ZS_KOPT_SGD) {
                check_path(path, opt, pi, 1003, 0, 1003, some_step(1, 0), 1); /* first step */
                check_path(path, opt, pi, 1003, 0, 1003, some_step(0, 1), 1); /* Nesterov */
                check_path(path, opt, pi, 1003, 0, 1003, some_step(0, 0), 0); /* no momentum */
            }
        }
}

struct pool_job {
    zs_optim_fn fn;
    struct zs_optim_step s;
    struct zs_optim_bufs b;
};

static void pool_chunk(void *arg, int64_t begin, int64_t end)
{
    struct pool_job *j = arg;
    j->fn(&j->s, &j->b, begin, end);
}

/* The thread count never changes a bit: chunks are aligned and the kernels elementwise. */
static void test_threads(void)
{
    const int64_t n = 300007;
    struct arrays orig, ref, b;
    zs_optim_fn fn = zs_optim_kernel(zs_kpath_best(), ZS_KOPT_ADAMW, ZS_DTYPE_BF16, ZS_DTYPE_BF16);

    alloc_arrays(&orig, n, ZS_DTYPE_BF16, ZS_DTYPE_BF16);
    alloc_arrays(&ref, n, ZS_DTYPE_BF16, ZS_DTYPE_BF16);
    alloc_arrays(&b, n, ZS_DTYPE_BF16, ZS_DTYPE_BF16);
    fill_arrays(&orig, ZS_DTYPE_BF16, ZS_DTYPE_BF16);
    copy_arrays(&ref, &orig, ZS_DTYPE_BF16, ZS_DTYPE_BF16);
    struct zs_optim_step s = some_step(0, 0);
    struct zs_optim_bufs rb = bufs_of(&ref, ZS_DTYPE_BF16, 1);
    fn(&s, &rb, 0, n);
    for (int t = 1; t <= 3; t++) {
        struct zs_pool *pool;
        struct zs_pool_opts o = { .threads = t, .local_size = 1 };
        char warn[128];
        CHECK(zs_pool_create(&pool, &o, warn, sizeof(warn)) == 0, "pool of %d threads", t);
        CHECK(zs_pool_threads(pool) == t, "pool has %d threads", zs_pool_threads(pool));
        copy_arrays(&b, &orig, ZS_DTYPE_BF16, ZS_DTYPE_BF16);
        struct pool_job j = { .fn = fn, .s = s, .b = bufs_of(&b, ZS_DTYPE_BF16, 1) };
        zs_pool_run(pool, pool_chunk, &j, n);
        CHECK(diff_arrays(&ref, &b, ZS_DTYPE_BF16) == 0, "%d threads differ from one call", t);
        zs_pool_free(pool);
    }
    free_arrays(&orig);
    free_arrays(&ref);
    free_arrays(&b);
}

/* ---------------------------------------------------------------- known answers */

static double ulps(float got, double want)
{
    float w = (float)want;
    double ulp = nextafterf(fabsf(w), INFINITY) - fabsf(w);
    return fabs((double)got - want) / ulp;
}

/* Three steps; each step's reference is computed in double from the kernel's own float inputs (so
 * errors do not compound) with the float hyperparameters the kernel receives. */
static void test_known_answers(void)
{
    enum { N = 64 };
    for (int opt = 0; opt < ZS_KOPT_COUNT; opt++) {
        float p[N], g[N], s1[N] = {0}, s2[N] = {0};
        double worst = 0, wm = 0, wv = 0;
        struct zs_optim_step s = some_step(1, 0);
        s.grad_scale = 1.0f;
        for (int i = 0; i < N; i++)
            p[i] = 0.5f + (float)(next32() % 1000) / 1000.0f; /* updates never cancel the parameter */
        for (int t = 1; t <= 3; t++) {
            double rp[N], r1[N], r2[N];
            for (int i = 0; i < N; i++)
                g[i] = 0.1f + (float)(next32() % 1000) / 1000.0f; /* one sign: no cancellation to amplify */
            s.first = t == 1;
            s.step_size = (float)(1e-3 / (1 - pow(0.9, t)));
            s.inv_sqrt_bc2 = (float)(1 / sqrt(1 - pow(0.999, t)));
            for (int i = 0; i < N; i++) {
                double P = p[i], G = g[i], M = s1[i], V = s2[i];
                switch (opt) {
                case ZS_KOPT_ADAM:
                case ZS_KOPT_ADAMW:
                    if (opt == ZS_KOPT_ADAM)
                        G += (double)s.weight_decay * P;
                    M = M * s.beta1 + G * s.one_minus_beta1;
                    V = V * s.beta2 + G * (G * s.one_minus_beta2);
                    if (opt == ZS_KOPT_ADAMW)
                        P -= (double)s.decay * P;
                    P -= (double)s.step_size * M / (sqrt(V) * s.inv_sqrt_bc2 + s.eps);
                    break;
                case ZS_KOPT_SGD:
                    G += (double)s.weight_decay * P;
                    M = t == 1 ? G : M * s.momentum + G * s.dampening_c;
                    P -= (double)s.lr * M;
                    break;
                case ZS_KOPT_LION: {
                    double c = M * s.beta1 + G * s.one_minus_beta1;
                    P -= (double)s.decay * P;
                    P -= (double)s.lr * (c > 0 ? 1 : c < 0 ? -1 : 0);
                    M = M * s.beta2 + G * s.one_minus_beta2;
                    break;
                }
                case ZS_KOPT_ADAGRAD:
                    G += (double)s.weight_decay * P;
                    M = M + G * G;
                    P -= (double)s.lr * G / (sqrt(M) + s.eps);
                    break;
                }
                rp[i] = P;
                r1[i] = M;
                r2[i] = V;
            }
            struct zs_optim_bufs b = { .param = p, .grad = g, .s1 = s1, .s2 = s2 };
            zs_optim_kernel(ZS_KPATH_SCALAR, (enum zs_kopt)opt, ZS_DTYPE_FP32, ZS_DTYPE_FP32)(&s, &b, 0, N);
            for (int i = 0; i < N; i++) {
                worst = fmax(worst, ulps(p[i], rp[i]));
                wm = fmax(wm, ulps(s1[i], r1[i]));
                if (opt <= ZS_KOPT_ADAMW)
                    wv = fmax(wv, ulps(s2[i], r2[i]));
            }
        }
        printf("known answers %s: worst %.3f ulp (params), %.3f (state 1), %.3f (state 2) over 3 steps\n",
               zs_kopt_name((enum zs_kopt)opt), worst, wm, wv);
        CHECK(worst <= 1.0, "%s: parameters %.3f ulp from the double reference", zs_kopt_name((enum zs_kopt)opt),
              worst);
        /* With an L2 term the decayed gradient is itself an fp32 value (0.5 ulp), which squaring doubles:
         * the state of Adam, SGD and Adagrad may sit a little over 1 ulp from the exact value. */
        double state_tol = opt == ZS_KOPT_ADAMW || opt == ZS_KOPT_LION ? 1.0 : 2.0;
        CHECK(wm <= state_tol && wv <= state_tol, "%s: state %.3f / %.3f ulp from the double reference",
              zs_kopt_name((enum zs_kopt)opt), wm, wv);
    }
}

/* ---------------------------------------------------------------- conversions */

static void test_conversions(void)
{
    /* bf16: ties go to even, above-half rounds up, NaN stays a quiet NaN, Inf stays, overflow to Inf */
    CHECK(zs_cvt_f32_bf16(zs_float(0x3f808000u)) == 0x3f80, "tie to even (down)");
    CHECK(zs_cvt_f32_bf16(zs_float(0x3f818000u)) == 0x3f82, "tie to even (up)");
    CHECK(zs_cvt_f32_bf16(zs_float(0x3f808001u)) == 0x3f81, "above half rounds up");
    CHECK(zs_cvt_f32_bf16(zs_float(0x7f7fffffu)) == 0x7f80, "max float rounds to Inf");
    CHECK(zs_cvt_f32_bf16(INFINITY) == 0x7f80 && zs_cvt_f32_bf16(-INFINITY) == 0xff80, "Inf");
    CHECK(zs_cvt_f32_bf16(zs_float(0x7f800001u)) == 0x7fc0, "signalling NaN becomes quiet, stays NaN");
    CHECK(zs_cvt_f32_bf16(zs_float(0xffc12345u)) == 0xffc1, "NaN keeps sign and top payload");
    CHECK(zs_cvt_f32_bf16(zs_float(0x00008000u)) == 0x0000 && zs_cvt_f32_bf16(zs_float(0x00018000u)) == 0x0002,
          "subnormal ties to even");
    CHECK(zs_cvt_f32_bf16(-0.0f) == 0x8000, "-0");
    /* fp16 */
    CHECK(zs_cvt_f32_f16(65504.0f) == 0x7bff && zs_cvt_f32_f16(65519.99f) == 0x7bff, "max finite");
    CHECK(zs_cvt_f32_f16(65520.0f) == 0x7c00, "65520 is the tie above max: to Inf");
    CHECK(zs_cvt_f32_f16(1.0f + 1.0f / 2048) == 0x3c00, "tie to even (down)");
    CHECK(zs_cvt_f32_f16(1.0f + 3.0f / 2048) == 0x3c02, "tie to even (up)");
    CHECK(zs_cvt_f32_f16(5.960464477539063e-08f) == 0x0001, "smallest subnormal");
    CHECK(zs_cvt_f32_f16(2.98023223876953125e-08f) == 0x0000, "half the smallest subnormal ties to 0");
    CHECK(zs_cvt_f32_f16(2.98023259e-08f) == 0x0001, "just above half rounds up");
    CHECK(zs_cvt_f32_f16(6.097555160522461e-05f) == 0x03ff, "largest subnormal");
    CHECK(zs_cvt_f32_f16(6.1035156e-05f) == 0x0400, "smallest normal");
    CHECK(zs_cvt_f32_f16(NAN) != 0 && (zs_cvt_f32_f16(NAN) & 0x7e00) == 0x7e00, "NaN stays a quiet NaN");
    CHECK(zs_cvt_f32_f16(-INFINITY) == 0xfc00 && zs_cvt_f32_f16(-1e10f) == 0xfc00, "-Inf and overflow");
    /* every fp16 value survives f16 -> f32 -> f16; NaNs stay NaN */
    int64_t bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = zs_cvt_f16_f32((uint16_t)h);
        uint16_t back = zs_cvt_f32_f16(f);
        bool nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff);
        bad += nan ? !(isnan(f) && (back & 0x7c00) == 0x7c00 && (back & 0x3ff)) : back != h;
        float fb = zs_cvt_bf16_f32((uint16_t)h);
        bool bnan = (h & 0x7f80) == 0x7f80 && (h & 0x7f);
        bad += bnan ? !isnan(fb) : zs_cvt_f32_bf16(fb) != h;
    }
    CHECK(bad == 0, "%lld fp16/bf16 values do not round-trip", (long long)bad);
#ifdef __FLT16_MANT_DIG__ /* the compiler has _Float16 here (GCC 12 on x86-64; clang 14 does not) */
    /* against the compiler's own IEEE conversion on random floats */
    bad = 0;
    for (int i = 0; i < 2000000; i++) {
        float f = zs_float(next32());
        if (isnan(f))
            continue;
        _Float16 h = (_Float16)f;
        uint16_t hb;
        memcpy(&hb, &h, 2);
        bad += hb != zs_cvt_f32_f16(f);
        bad += zs_cvt_f16_f32(hb) != (float)h;
    }
    CHECK(bad == 0, "%lld random floats convert differently from _Float16", (long long)bad);
#endif
}

/* ---------------------------------------------------------------- Lion on a zero direction */

/* Where the interpolation c = beta1 m + (1 - beta1) g is exactly zero (either sign), the
 * paper's rule sign(0) = 0 holds: the parameter takes the decoupled decay and nothing else. DeepSpeed's CPU
 * Lion moves it by lr with the sign of the zero and its GPU Lion by +lr; ZeroShard keeps torch.sign's 0.
 * Elements 0..2 of each group of four have c = +0, -0 and a cancelling 0; element 3 moves (a control). */
static void lion_zero_fill(struct arrays *a, zs_dtype pdt, zs_dtype gdt, float *p0)
{
    static const float ps[] = { 1.5f, -0.75f, 3.25f, -2.0f, 0.5f };
    for (int64_t i = 0; i < a->n; i++) {
        float p = ps[i % 5], g, m;
        switch (i % 4) {
        case 0: m = 0.0f; g = 0.0f; break;   /* c = +0 */
        case 1: m = -0.0f; g = -0.0f; break; /* c = -0 */
        case 2: m = 0.5f; g = -1.0f; break;  /* 0.5*0.5 + (-1*0.5)*0.5: an exact cancellation */
        default: m = 0.25f; g = 1.0f; break; /* c > 0: moves by -lr */
        }
        p0[i] = p;
        set_element(a, i, p, g, pdt, gdt);
        a->s1[i] = m;
    }
}

static float param_value(const struct arrays *a, int64_t i, zs_dtype pdt)
{
    if (pdt == ZS_DTYPE_FP32)
        return ((float *)a->param)[i];
    uint16_t h = ((uint16_t *)a->param)[i];
    return pdt == ZS_DTYPE_BF16 ? zs_cvt_bf16_f32(h) : zs_cvt_f16_f32(h);
}

static void test_lion_zero_direction(enum zs_kpath path)
{
    enum { N = 1037 }; /* whole vectors and a tail on every path */
    for (int pi = 0; pi < (int)NPAIRS; pi++)
        for (int with_decay = 0; with_decay < 2; with_decay++) {
            zs_dtype pdt = pairs[pi][0], gdt = pairs[pi][1];
            struct zs_optim_step s = { .lr = 0.125f, .beta1 = 0.5f, .one_minus_beta1 = 0.5f, .beta2 = 0.99f,
                                       .one_minus_beta2 = 0.01f, .decay = with_decay ? 0.0625f : 0.0f,
                                       .grad_scale = 0.5f };
            struct arrays a;
            float p0[N];
            int64_t bad = 0, first = -1;
            alloc_arrays(&a, N, pdt, gdt);
            lion_zero_fill(&a, pdt, gdt, p0);
            struct zs_optim_bufs b = bufs_of(&a, pdt, 1);
            zs_optim_kernel(path, ZS_KOPT_LION, pdt, gdt)(&s, &b, 0, N);
            for (int64_t i = 0; i < N; i++) {
                float want = fmaf(-s.decay, p0[i], p0[i]); /* decay only */
                if (i % 4 == 3)
                    want = fmaf(-s.lr, 1.0f, want);
                float got = pdt == ZS_DTYPE_FP32 ? param_value(&a, i, pdt) : a.master[i];
                float want16 = pdt == ZS_DTYPE_BF16 ? zs_cvt_bf16_f32(zs_cvt_f32_bf16(want))
                               : pdt == ZS_DTYPE_FP16 ? zs_cvt_f16_f32(zs_cvt_f32_f16(want)) : want;
                if (got != want || param_value(&a, i, pdt) != want16) {
                    bad++;
                    first = first < 0 ? i : first;
                }
            }
            CHECK(bad == 0, "lion zero direction, %s %s/%s decay %g: %lld of %d parameters wrong (first: element "
                  "%lld, c %s, %g -> %g, expected %g)", zs_kpath_name(path), zs_dtype_name(pdt), zs_dtype_name(gdt),
                  (double)s.decay, (long long)bad, N, (long long)first,
                  first < 0 ? "-" : first % 4 == 0 ? "+0" : first % 4 == 1 ? "-0" : first % 4 == 2 ? "0 (cancelled)" : "> 0",
                  first < 0 ? 0.0 : (double)p0[first],
                  first < 0 ? 0.0 : (double)(pdt == ZS_DTYPE_FP32 ? param_value(&a, first, pdt) : a.master[first]),
                  first < 0 ? 0.0 : (double)fmaf(-s.decay, p0[first], p0[first]));
            free_arrays(&a);
        }
    printf("lion zero direction on the %s path: checked\n", zs_kpath_name(path));
}

/* No argument: the conversions, the known answers, threads and the scalar reference. With a SIMD path's
 * name: that path against the scalar reference; exit 77 (a skip ctest shows) when this CPU lacks it. */
int main(int argc, char **argv)
{
    enum zs_kpath path;

    if (argc > 1) {
        int rc = zs_kpath_parse(argv[1], &path);
        if (rc == -ENOTSUP) {
            printf("skip: this CPU has no %s path (bit-exactness and the Lion zero rule not checked for it)\n",
                   argv[1]);
            return 77;
        }
        if (rc || path == ZS_KPATH_SCALAR) {
            fprintf(stderr, "usage: test_optim [avx2|avx512]\n");
            return 2;
        }
        test_bit_exact(path);
        test_lion_zero_direction(path);
        return zs_test_summary("test_optim");
    }
    test_conversions();
    test_known_answers();
    test_threads();
    test_lion_zero_direction(ZS_KPATH_SCALAR);
    printf("best path on this CPU: %s\n", zs_kpath_name(zs_kpath_best()));
    return zs_test_summary("test_optim");
}
