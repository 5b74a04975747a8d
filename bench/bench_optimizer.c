/* bench_optimizer.c - zs-bench optimizer: times each optimizer kernel per dtype and size through the thread
 * pool, against a STREAM triad run interleaved with it in the same process (bandwidth here swings 2x). */
#ifndef _GNU_SOURCE
#define _POSIX_C_SOURCE 200809L /* clock_gettime, posix_memalign, strtok_r, sysconf */
#endif
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"   /* defines: bench_now, bench_parse_*, bench_alloc */
#include "optim.h"   /* defines: zs_optim_kernel, zs_kpath_*, zs_optim_bytes_per_param, zs_f32_to_bf16 */
#include "threads.h" /* defines: zs_pool_create, zs_pool_run */

#define MAX_SIZES 16
#define MAX_ROWS (MAX_SIZES * ZS_KOPT_COUNT * 3)
#define MAX_REPS 1000000
#define SIZE_1M ((int64_t)1 << 20)
#define SIZE_64M ((int64_t)1 << 26)

const char bench_optimizer_usage[] =
    "[--threads T] [--path scalar|avx2|avx512|auto] [--sizes 1M,4M,16M,64M,256M]\n"
    "        [--opt adamw,adam,sgd,lion,adagrad] [--dtype fp32,bf16,fp16] [--reps R] [--min-time S]\n"
    "    T defaults to every online core; R to as many interleaved reps as fill S seconds (default 0.2),\n"
    "    at least 3. Sizes take K/M/G suffixes (powers of two). SGD runs with momentum 0.9.";

struct bench_args {
    int threads;
    enum zs_kpath path;
    int64_t sizes[MAX_SIZES];
    int nsizes;
    enum zs_kopt opts[ZS_KOPT_COUNT];
    int nopts;
    zs_dtype dtypes[3];
    int ndtypes;
    int reps; /* 0: chosen from min_time */
    double min_time;
};

/* One size's arrays, each sized for n floats so every dtype fits; master and s2 only when a selected
 * row uses them. */
struct arrays {
    int64_t n;
    void *param, *grad;
    float *master, *s1, *s2;
    float *ta, *tb, *tc; /* triad */
};

struct row {
    enum zs_kopt opt;
    zs_dtype dt;
    int64_t n;
    int threads, reps, bytes;
    double t_kernel, t_triad; /* best of the reps, seconds */
};

// ---------------------------------------------------------------------------- pool work

typedef void (*triad_fn)(float *restrict a, const float *restrict b, const float *restrict c, float s,
                         int64_t begin, int64_t end);

/* For CPUs without AVX2; whatever the compiler makes of it. */
static void triad_plain(float *restrict a, const float *restrict b, const float *restrict c, float s,
                        int64_t begin, int64_t end)
{
    for (int64_t i = begin; i < end; i++)
        a[i] = b[i] + s * c[i];
}

#if defined(__x86_64__) || defined(__i386__)
/* Explicit vectors, so the triad is vectorized whatever the auto-vectorizer's cost model says at -O2.
 * aligned(4) and may_alias make an access through this type an unaligned vector access to floats. */
typedef float bench_v8f __attribute__((vector_size(32), aligned(4), may_alias));

/* Two vectors an iteration: one cache line written per iteration. */
__attribute__((target("avx2"))) static void triad_avx2(float *restrict a, const float *restrict b,
                                                       const float *restrict c, float s, int64_t begin,
                                                       int64_t end)
{
    int64_t i = begin;

    for (; i + 16 <= end; i += 16) {
        *(bench_v8f *)(a + i) = *(const bench_v8f *)(b + i) + s * *(const bench_v8f *)(c + i);
        *(bench_v8f *)(a + i + 8) = *(const bench_v8f *)(b + i + 8) + s * *(const bench_v8f *)(c + i + 8);
    }
    for (; i < end; i++)
        a[i] = b[i] + s * c[i];
}
#endif

static triad_fn triad_pick(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2"))
        return triad_avx2;
#endif
    return triad_plain;
}

struct triad_arg {
    triad_fn fn;
    float *a;
    const float *b, *c;
    float s;
};

static void triad_chunk(void *arg, int64_t begin, int64_t end)
{
    struct triad_arg *t = arg;

    t->fn(t->a, t->b, t->c, t->s, begin, end);
}

struct kernel_arg {
    zs_optim_fn fn;
    const struct zs_optim_step *step;
    const struct zs_optim_bufs *bufs;
};

static void kernel_chunk(void *arg, int64_t begin, int64_t end)
{
    struct kernel_arg *k = arg;

    k->fn(k->step, k->bufs, begin, end);
}

/* First touch of every array by the thread that later streams that range, so pages land near it. */
static void touch_chunk(void *arg, int64_t begin, int64_t end)
{
    const struct arrays *r = arg;
    float *bufs[] = {r->param, (float *)r->grad, r->master, r->s1, r->s2, r->ta};

    for (size_t k = 0; k < sizeof(bufs) / sizeof(bufs[0]); k++)
        if (bufs[k])
            memset(bufs[k] + begin, 0, (size_t)(end - begin) * sizeof(float));
    for (int64_t i = begin; i < end; i++) {
        r->tb[i] = 1.0f;
        r->tc[i] = 2.0f;
    }
}

/* Magnitudes in [0.25, 1], alternating sign: gradients stay normal even in fp16 (>= 6.1e-5), and
 * parameters drift both ways rather than all towards zero. */
static float pattern(int64_t i)
{
    float mag = 0.25f + (float)(i % 251) * (1.0f / 334.0f);

    return (i & 1) ? -mag : mag;
}

struct init_arg {
    const struct arrays *r;
    zs_dtype dt;
};

static void init_chunk(void *arg, int64_t begin, int64_t end)
{
    const struct init_arg *a = arg;
    const struct arrays *r = a->r;
    uint16_t (*to16)(float) = a->dt == ZS_DTYPE_BF16 ? zs_f32_to_bf16 : zs_f32_to_f16;

    for (int64_t i = begin; i < end; i++) {
        float p = 0.5f + 0.25f * pattern(i), g = 1e-3f * pattern(i);

        if (a->dt == ZS_DTYPE_FP32) {
            ((float *)r->param)[i] = p;
            ((float *)r->grad)[i] = g;
        } else {
            ((uint16_t *)r->param)[i] = to16(p);
            ((uint16_t *)r->grad)[i] = to16(g);
            r->master[i] = p;
        }
        r->s1[i] = 1e-4f * fabsf(pattern(i)); /* near the steady state of m, momentum, Adagrad's sum */
        if (r->s2)
            r->s2[i] = 1e-6f * fabsf(pattern(i)); /* near g^2, Adam's v */
    }
}

// ---------------------------------------------------------------------------- arguments

/* Calls add for each comma-separated item of v; -EINVAL when one is refused or v is empty. */
static int add_size(void *arg, const char *tok)
{
    struct bench_args *a = arg;
    if (a->nsizes == MAX_SIZES || bench_parse_count(tok, &a->sizes[a->nsizes]))
        return -EINVAL;
    a->nsizes++;
    return 0;
}

static int add_opt(void *arg, const char *tok)
{
    struct bench_args *a = arg;
    for (int o = 0; o < ZS_KOPT_COUNT && a->nopts < ZS_KOPT_COUNT; o++) {
        if (!strcmp(tok, zs_kopt_name((enum zs_kopt)o))) {
            a->opts[a->nopts++] = (enum zs_kopt)o;
            return 0;
        }
    }
    return -EINVAL;
}

static int add_dtype(void *arg, const char *tok)
{
    struct bench_args *a = arg;
    static const zs_dtype all[] = {ZS_DTYPE_FP32, ZS_DTYPE_BF16, ZS_DTYPE_FP16};

    for (int d = 0; d < 3 && a->ndtypes < 3; d++) {
        if (!strcmp(tok, zs_dtype_name(all[d]))) {
            a->dtypes[a->ndtypes++] = all[d];
            return 0;
        }
    }
    return -EINVAL;
}

static int parse_path(struct bench_args *a, const char *v)
{
    int rc = zs_kpath_parse(v, &a->path);

    if (rc == -ENOTSUP)
        fprintf(stderr, "zs-bench optimizer: path '%s' is not supported by this CPU (best: %s)\n", v,
                zs_kpath_name(zs_kpath_best()));
    return rc;
}

static const char *const option_names[] = {"--threads", "--path",  "--sizes",   "--opt",
                                           "--dtype",   "--reps",  "--min-time"};

static int set_option(void *arg, int which, const char *v)
{
    struct bench_args *a = arg;
    switch (which) {
    case 0: return bench_parse_int(v, 4096, &a->threads);
    case 1: return parse_path(a, v);
    case 2: a->nsizes = 0; return bench_parse_list(a, v, add_size);
    case 3: a->nopts = 0; return bench_parse_list(a, v, add_opt);
    case 4: a->ndtypes = 0; return bench_parse_list(a, v, add_dtype);
    case 5: return bench_parse_int(v, MAX_REPS, &a->reps);
    default: return bench_parse_double(v, &a->min_time);
    }
}

static void args_default(struct bench_args *a)
{
    static const enum zs_kopt opts[] = {ZS_KOPT_ADAMW, ZS_KOPT_ADAM, ZS_KOPT_SGD, ZS_KOPT_LION, ZS_KOPT_ADAGRAD};
    long cores = sysconf(_SC_NPROCESSORS_ONLN);

    memset(a, 0, sizeof(*a));
    a->threads = cores > 0 ? (int)cores : 1;
    a->path = zs_kpath_best();
    for (int i = 0; i < 5; i++)
        a->sizes[i] = SIZE_1M << (2 * i);
    a->nsizes = 5;
    memcpy(a->opts, opts, sizeof(opts));
    a->nopts = ZS_KOPT_COUNT;
    a->dtypes[0] = ZS_DTYPE_FP32;
    a->dtypes[1] = ZS_DTYPE_BF16;
    a->dtypes[2] = ZS_DTYPE_FP16;
    a->ndtypes = 3;
    a->min_time = 0.2;
}

/* BENCH_OK, BENCH_USAGE, or -1 when --help asked for the usage only. */
static int parse_args(struct bench_args *a, int argc, char **argv)
{
    const int nnames = (int)(sizeof(option_names) / sizeof(option_names[0]));

    args_default(a);
    return bench_parse_options("optimizer", argc, argv, option_names, nnames, set_option, NULL, a, true);
}

// ---------------------------------------------------------------------------- arrays

static bool args_need(const struct bench_args *a, bool (*pred)(enum zs_kopt, zs_dtype))
{
    for (int o = 0; o < a->nopts; o++)
        for (int d = 0; d < a->ndtypes; d++)
            if (pred(a->opts[o], a->dtypes[d]))
                return true;
    return false;
}

static bool needs_master(enum zs_kopt o, zs_dtype d) { (void)o; return d != ZS_DTYPE_FP32; }
static bool needs_s2(enum zs_kopt o, zs_dtype d) { (void)d; return o == ZS_KOPT_ADAM || o == ZS_KOPT_ADAMW; }

static void arrays_free(struct arrays *r)
{
    void *all[] = {r->param, r->grad, r->master, r->s1, r->s2, r->ta, r->tb, r->tc};

    for (size_t k = 0; k < sizeof(all) / sizeof(all[0]); k++)
        bench_free(all[k]);
    memset(r, 0, sizeof(*r));
}

/* Bytes arrays_alloc asks for: param, grad, s1, the triad's three, then master and s2 when needed. */
static double arrays_bytes(const struct bench_args *a, int64_t n)
{
    int floats = 6 + args_need(a, needs_master) + args_need(a, needs_s2);

    return (double)floats * 4.0 * (double)n;
}

/* 0, or -ENOMEM with every array freed. Over 80% of physical memory is refused up front: with overcommit
 * the allocation would succeed and the OOM killer would end the run during the first touch. */
static int arrays_alloc(struct arrays *r, const struct bench_args *a, int64_t n)
{
    double phys = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    size_t bytes = (size_t)n * sizeof(float);

    memset(r, 0, sizeof(*r));
    if (phys > 0 && arrays_bytes(a, n) > 0.8 * phys)
        return -ENOMEM;
    r->n = n;
    r->param = bench_alloc(bytes);
    r->grad = bench_alloc(bytes);
    r->s1 = bench_alloc(bytes);
    r->ta = bench_alloc(bytes);
    r->tb = bench_alloc(bytes);
    r->tc = bench_alloc(bytes);
    if (args_need(a, needs_master))
        r->master = bench_alloc(bytes);
    if (args_need(a, needs_s2))
        r->s2 = bench_alloc(bytes);
    if (!r->param || !r->grad || !r->s1 || !r->ta || !r->tb || !r->tc ||
        (args_need(a, needs_master) && !r->master) || (args_need(a, needs_s2) && !r->s2)) {
        arrays_free(r);
        return -ENOMEM;
    }
    return 0;
}

// ---------------------------------------------------------------------------- measuring

/* Step t = 10 of the usual hyperparameters, computed in double and rounded once, as the engine does. */
static void step_init(struct zs_optim_step *s)
{
    const double lr = 1e-3, b1 = 0.9, b2 = 0.999, wd = 0.01, t = 10;

    memset(s, 0, sizeof(*s));
    s->lr = (float)lr;
    s->beta1 = (float)b1;
    s->beta2 = (float)b2;
    s->one_minus_beta1 = (float)(1 - b1);
    s->one_minus_beta2 = (float)(1 - b2);
    s->eps = 1e-8f;
    s->weight_decay = (float)wd;
    s->step_size = (float)(lr / (1 - pow(b1, t)));
    s->inv_sqrt_bc2 = (float)(1 / sqrt(1 - pow(b2, t)));
    s->decay = (float)(lr * wd);
    s->grad_scale = 1.0f;
    s->momentum = 0.9f;
    s->dampening_c = 1.0f;
}

static double time_run(struct zs_pool *pool, zs_pool_fn fn, void *arg, int64_t n)
{
    double t0 = bench_now();

    zs_pool_run(pool, fn, arg, n);
    return bench_now() - t0;
}

/* A cheap guard that the data stayed finite, so a NaN slow path cannot pass for a result. */
static bool arrays_finite(const struct arrays *r, zs_dtype dt)
{
    const float *x = dt == ZS_DTYPE_FP32 ? r->param : r->master;

    for (int k = 0; k < 64; k++) {
        int64_t i = (r->n - 1) * k / 63;

        if (!isfinite(x[i]) || !isfinite(r->s1[i]) || (r->s2 && !isfinite(r->s2[i])))
            return false;
    }
    return true;
}

/* Triad and kernel alternate, so both see the same minutes of a bandwidth that drifts; best of each. */
static void measure(struct zs_pool *pool, const struct bench_args *a, struct kernel_arg *k,
                    struct triad_arg *t, struct row *row)
{
    int64_t n = row->n;
    double est;

    time_run(pool, triad_chunk, t, n); /* warm-up: caches, TLB, sleeping workers */
    est = time_run(pool, kernel_chunk, k, n);
    row->reps = a->reps;
    if (!row->reps) {
        double want = ceil(a->min_time / (est > 1e-9 ? est : 1e-9));
        row->reps = want < 3 ? 3 : want > MAX_REPS ? MAX_REPS : (int)want;
    }
    row->t_kernel = row->t_triad = INFINITY;
    for (int rep = 0; rep < row->reps; rep++) {
        row->t_triad = fmin(row->t_triad, time_run(pool, triad_chunk, t, n));
        row->t_kernel = fmin(row->t_kernel, time_run(pool, kernel_chunk, k, n));
    }
    /* Below the clock's resolution a tiny n would divide by zero and print inf, which is not JSON. */
    row->t_triad = fmax(row->t_triad, 1e-9);
    row->t_kernel = fmax(row->t_kernel, 1e-9);
}

// ---------------------------------------------------------------------------- output

static void print_header(int argc, char **argv, const struct bench_args *a, struct zs_pool *pool)
{
    char cmd[1024];

    bench_cmdline(argc, argv, cmd, sizeof(cmd));
    printf("# %s\n", cmd);
    printf("# path %s, %d threads (%s); triad a[i] = b[i] + s*c[i] counted as 12 B/element (STREAM), "
           "run interleaved with each kernel; times are the best of the reps\n",
           zs_kpath_name(a->path), zs_pool_threads(pool), zs_pool_describe(pool));
    printf("%-9s %-5s %10s %7s %9s %8s %8s %7s %8s %10s %6s %6s\n", "optimizer", "dtype", "n", "threads",
           "ms/step", "ns/param", "Gparam/s", "B/param", "GB/s", "triad GB/s", "ratio", "reps");
}

static double row_gbytes(const struct row *r) { return (double)r->n * r->bytes / r->t_kernel / 1e9; }
static double row_triad(const struct row *r) { return 12.0 * (double)r->n / r->t_triad / 1e9; }

static void print_row(const struct row *r)
{
    printf("%-9s %-5s %10lld %7d %9.3f %8.3f %8.3f %7d %8.2f %10.2f %6.3f %6d\n", zs_kopt_name(r->opt),
           zs_dtype_name(r->dt), (long long)r->n, r->threads, r->t_kernel * 1e3, r->t_kernel * 1e9 / (double)r->n,
           (double)r->n / r->t_kernel / 1e9, r->bytes, row_gbytes(r), row_triad(r),
           row_gbytes(r) / row_triad(r), r->reps);
    fflush(stdout);
}

static void print_json(const struct row *r, enum zs_kpath path)
{
    printf("{\"bench\": \"optimizer\", \"optimizer\": \"%s\", \"param_dtype\": \"%s\", \"n\": %lld, "
           "\"threads\": %d, \"gparam_s\": %.6g, \"gbytes_s\": %.6g, \"roofline_gbytes_s\": %.6g, "
           "\"ratio\": %.6g, \"ms_per_step\": %.6g, \"path\": \"%s\"}\n",
           zs_kopt_name(r->opt), zs_dtype_name(r->dt), (long long)r->n, r->threads,
           (double)r->n / r->t_kernel / 1e9, row_gbytes(r), row_triad(r), row_gbytes(r) / row_triad(r),
           r->t_kernel * 1e3, zs_kpath_name(path));
}

/* Fixed cost per call (pool wake-up, chunking) shows as a higher ns/param at small sizes. */
static void print_overhead(const struct row *rows, int nrows)
{
    double small = 0, large = 0;

    for (int i = 0; i < nrows; i++) {
        const struct row *r = &rows[i];

        if (r->opt != ZS_KOPT_ADAMW || r->dt != ZS_DTYPE_FP32)
            continue;
        if (r->n == SIZE_1M)
            small = r->t_kernel / (double)r->n;
        if (r->n == SIZE_64M)
            large = r->t_kernel / (double)r->n;
    }
    if (small > 0 && large > 0)
        printf("overhead: ns/param at 1M / ns/param at 64M = %.3f\n", small / large);
}

// ---------------------------------------------------------------------------- driver

struct bench_run {
    const struct bench_args *a;
    struct zs_pool *pool;
    struct zs_optim_step step;
    triad_fn triad;
    struct row rows[MAX_ROWS];
    int nrows;
};

/* One optimizer x dtype row on the arrays of one size; false when it was skipped. */
static bool run_row(struct bench_run *b, struct arrays *r, enum zs_kopt opt, zs_dtype dt)
{
    zs_optim_fn fn = zs_optim_kernel(b->a->path, opt, dt, dt);
    struct zs_optim_bufs bufs = {r->param, r->grad, dt == ZS_DTYPE_FP32 ? NULL : r->master, r->s1, NULL};
    struct init_arg init = {r, dt};
    struct kernel_arg k = {fn, &b->step, &bufs};
    struct triad_arg t = {b->triad, r->ta, r->tb, r->tc, 3.0f};
    struct row *row = &b->rows[b->nrows];

    if (!fn) {
        printf("# skip %s %s n=%lld: no kernel on path %s\n", zs_kopt_name(opt), zs_dtype_name(dt),
               (long long)r->n, zs_kpath_name(b->a->path));
        return false;
    }
    if (needs_s2(opt, dt))
        bufs.s2 = r->s2;
    zs_pool_run(b->pool, init_chunk, &init, r->n);
    *row = (struct row){.opt = opt, .dt = dt, .n = r->n, .threads = zs_pool_threads(b->pool),
                        .bytes = zs_optim_bytes_per_param(opt, dt, dt, true)};
    measure(b->pool, b->a, &k, &t, row);
    if (!arrays_finite(r, dt)) {
        printf("# skip %s %s n=%lld: the data went non-finite\n", zs_kopt_name(opt), zs_dtype_name(dt),
               (long long)r->n);
        return false;
    }
    print_row(row);
    b->nrows++;
    return true;
}

/* BENCH_OK, or BENCH_FAIL when the arrays of this size could not be allocated. */
static int run_size(struct bench_run *b, int64_t n)
{
    struct arrays r;

    if (arrays_alloc(&r, b->a, n)) {
        printf("# skip n=%lld: cannot allocate %.2f GiB\n", (long long)n, arrays_bytes(b->a, n) / (1 << 30));
        fprintf(stderr, "zs-bench optimizer: cannot allocate %.2f GiB for n=%lld; skipped that size\n",
                arrays_bytes(b->a, n) / (1 << 30), (long long)n);
        return BENCH_FAIL;
    }
    zs_pool_run(b->pool, touch_chunk, &r, n);
    for (int o = 0; o < b->a->nopts; o++)
        for (int d = 0; d < b->a->ndtypes; d++)
            run_row(b, &r, b->a->opts[o], b->a->dtypes[d]);
    arrays_free(&r);
    return BENCH_OK;
}

static int pool_start(struct zs_pool **pool, int threads)
{
    struct zs_pool_opts o = {.threads = threads, .local_rank = 0, .local_size = 1, .bind = 1};
    char warning[256] = "";
    int rc = zs_pool_create(pool, &o, warning, sizeof(warning));

    if (rc) {
        fprintf(stderr, "zs-bench optimizer: cannot start %d threads: %s\n", threads, strerror(-rc));
        return BENCH_FAIL;
    }
    if (warning[0])
        printf("# warning: %s\n", warning);
    return BENCH_OK;
}

int bench_optimizer(int argc, char **argv)
{
    struct bench_run *b;
    struct bench_args a;
    int rc = parse_args(&a, argc, argv);

    if (rc) {
        fprintf(rc < 0 ? stdout : stderr, "usage: %s optimizer %s\n", argv[0], bench_optimizer_usage);
        return rc < 0 ? BENCH_OK : rc;
    }
    b = calloc(1, sizeof(*b));
    if (!b) {
        fprintf(stderr, "zs-bench optimizer: out of memory\n");
        return BENCH_FAIL;
    }
    b->a = &a;
    b->triad = triad_pick();
    step_init(&b->step);
    rc = pool_start(&b->pool, a.threads);
    if (rc)
        goto out_free_run;
    print_header(argc, argv, &a, b->pool);
    for (int s = 0; s < a.nsizes; s++)
        rc |= run_size(b, a.sizes[s]);
    printf("\n");
    for (int i = 0; i < b->nrows; i++)
        print_json(&b->rows[i], a.path);
    print_overhead(b->rows, b->nrows);
    if (!b->nrows)
        rc = BENCH_FAIL;
    zs_pool_free(b->pool);
out_free_run:
    free(b);
    return rc;
}
