/* bench_optimizer.c - zs-bench optimizer: times each optimizer kernel per dtype and size through the thread
 * pool, against the memory traffic of an Adam step (the Adam-pattern stream) run interleaved with it rep by
 * rep in the same process (bandwidth here swings 2x); medians with their range. */
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
#include "kernels/optim.h"   /* defines: zs_optim_kernel, zs_kpath_*, zs_optim_bytes_per_param, zs_f32_to_bf16 */
#include "kernels/threads.h" /* defines: zs_pool_create, zs_pool_run */

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
    float *sp, *sg, *sm, *sv; /* the Adam-pattern stream's own p, g, m, v */
};

struct row {
    enum zs_kopt opt;
    zs_dtype dt;
    int64_t n;
    int threads, reps, bytes;
    struct bench_spread t_kernel, t_stream; /* seconds per call over the reps */
    struct bench_spread ratio;              /* per rep: kernel GB/s / the stream's GB/s beside it */
};

// ---------------------------------------------------------------------------- pool work

/* The reference: the memory traffic of an fp32 Adam step without its arithmetic. It touches arrays of its
 * own as the step touches p, g, m, v, in place: g read; p, m, v read and written back. Each line written
 * was just read, so no write-allocate traffic hides in it: (4 reads + 3 writes) x 4 bytes = 28 bytes per
 * element. (A STREAM triad a = b + s*c is counted as 12 bytes but moves 16 with write-allocate, which
 * made an optimizer look up to 1.33x closer to the machine's limit than it is.) */
#define STREAM_READS 4
#define STREAM_WRITES 3
#define STREAM_BYTES ((STREAM_READS + STREAM_WRITES) * (int)sizeof(float))

typedef void (*stream_fn)(float *restrict p, float *restrict m, float *restrict v, const float *restrict g,
                          float s, int64_t begin, int64_t end);

/* For CPUs without AVX2; whatever the compiler makes of it. */
static void stream_plain(float *restrict p, float *restrict m, float *restrict v, const float *restrict g, float s,
                         int64_t begin, int64_t end)
{
    for (int64_t i = begin; i < end; i++) {
        float gi = g[i];

        m[i] += s * gi;
        v[i] += s * gi;
        p[i] -= s * gi;
    }
}

#if defined(__x86_64__) || defined(__i386__)
/* Explicit vectors, so the stream is vectorized whatever the auto-vectorizer's cost model says at -O2.
 * aligned(4) and may_alias make an access through this type an unaligned vector access to floats. */
typedef float bench_v8f __attribute__((vector_size(32), aligned(4), may_alias));

__attribute__((target("avx2"))) static inline void stream_v8(float *p, float *m, float *v, const float *g, float s)
{
    bench_v8f gv = *(const bench_v8f *)g;

    *(bench_v8f *)m = *(bench_v8f *)m + s * gv;
    *(bench_v8f *)v = *(bench_v8f *)v + s * gv;
    *(bench_v8f *)p = *(bench_v8f *)p - s * gv;
}

/* Two vectors of each array an iteration: one cache line of each. */
__attribute__((target("avx2"))) static void stream_avx2(float *restrict p, float *restrict m, float *restrict v,
                                                        const float *restrict g, float s, int64_t begin,
                                                        int64_t end)
{
    int64_t i = begin;

    for (; i + 16 <= end; i += 16) {
        stream_v8(p + i, m + i, v + i, g + i, s);
        stream_v8(p + i + 8, m + i + 8, v + i + 8, g + i + 8, s);
    }
    stream_plain(p, m, v, g, s, i, end);
}
#endif

static stream_fn stream_pick(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2"))
        return stream_avx2;
#endif
    return stream_plain;
}

struct stream_arg {
    stream_fn fn;
    float *p, *m, *v;
    const float *g;
    float s;
};

static void stream_chunk(void *arg, int64_t begin, int64_t end)
{
    struct stream_arg *t = arg;

    t->fn(t->p, t->m, t->v, t->g, t->s, begin, end);
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
    float *bufs[] = {r->param, (float *)r->grad, r->master, r->s1, r->s2, r->sp, r->sm, r->sv};

    for (size_t k = 0; k < sizeof(bufs) / sizeof(bufs[0]); k++)
        if (bufs[k])
            memset(bufs[k] + begin, 0, (size_t)(end - begin) * sizeof(float));
    for (int64_t i = begin; i < end; i++)
        r->sg[i] = 1.0f;
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
    void *all[] = {r->param, r->grad, r->master, r->s1, r->s2, r->sp, r->sg, r->sm, r->sv};

    for (size_t k = 0; k < sizeof(all) / sizeof(all[0]); k++)
        bench_free(all[k]);
    memset(r, 0, sizeof(*r));
}

/* Bytes arrays_alloc asks for: param, grad, s1, the stream's four, then master and s2 when needed. */
static double arrays_bytes(const struct bench_args *a, int64_t n)
{
    int floats = 7 + args_need(a, needs_master) + args_need(a, needs_s2);

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
    r->sp = bench_alloc(bytes);
    r->sg = bench_alloc(bytes);
    r->sm = bench_alloc(bytes);
    r->sv = bench_alloc(bytes);
    if (args_need(a, needs_master))
        r->master = bench_alloc(bytes);
    if (args_need(a, needs_s2))
        r->s2 = bench_alloc(bytes);
    if (!r->param || !r->grad || !r->s1 || !r->sp || !r->sg || !r->sm || !r->sv ||
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

/* Stream and kernel alternate rep by rep, so both see the same minutes of a bandwidth that drifts; each
 * rep's ratio pairs a kernel run with the stream run beside it. 0, or -ENOMEM. */
static int measure(struct zs_pool *pool, const struct bench_args *a, struct kernel_arg *k,
                   struct stream_arg *st, struct row *row)
{
    int64_t n = row->n;
    double est, *tk, *ts, *ratio;

    time_run(pool, stream_chunk, st, n); /* warm-up: caches, TLB, sleeping workers */
    est = time_run(pool, kernel_chunk, k, n);
    row->reps = a->reps;
    if (!row->reps) {
        double want = ceil(a->min_time / (est > 1e-9 ? est : 1e-9));
        row->reps = want < 3 ? 3 : want > MAX_REPS ? MAX_REPS : (int)want;
    }
    tk = malloc(3 * (size_t)row->reps * sizeof(double));
    if (!tk)
        return -ENOMEM;
    ts = tk + row->reps;
    ratio = ts + row->reps;
    for (int rep = 0; rep < row->reps; rep++) {
        /* below the clock's resolution a tiny n would divide by zero and print inf, which is not JSON */
        ts[rep] = fmax(time_run(pool, stream_chunk, st, n), 1e-9);
        tk[rep] = fmax(time_run(pool, kernel_chunk, k, n), 1e-9);
        ratio[rep] = ((double)row->bytes / tk[rep]) / ((double)STREAM_BYTES / ts[rep]);
    }
    row->t_kernel = bench_spread_of(tk, row->reps);
    row->t_stream = bench_spread_of(ts, row->reps);
    row->ratio = bench_spread_of(ratio, row->reps);
    free(tk);
    return 0;
}

// ---------------------------------------------------------------------------- output

static void print_header(int argc, char **argv, const struct bench_args *a, struct zs_pool *pool)
{
    char cmd[1024];

    bench_cmdline(argc, argv, cmd, sizeof(cmd));
    printf("# %s\n", cmd);
    printf("# path %s, %d threads (%s)\n", zs_kpath_name(a->path), zs_pool_threads(pool), zs_pool_describe(pool));
    printf("# reference: the Adam-pattern stream (arrays of its own: g read; p, m, v read and written in place; "
           "%d B/element, no write-allocate), run interleaved rep by rep with each kernel\n", STREAM_BYTES);
    printf("# medians over the reps, [min..max] beside them; ratio: median of the per-rep kernel GB/s / stream "
           "GB/s\n");
    printf("%-9s %-5s %10s %7s %9s %8s %8s %7s %8s %15s %8s %15s %6s %13s %6s\n", "optimizer", "dtype", "n",
           "threads", "ms/step", "ns/param", "Gparam/s", "B/param", "GB/s", "[min..max]", "strm GB/s", "[min..max]",
           "ratio", "[min..max]", "reps");
}

/* GB/s of bytes per element at a time per call (median, or the range's ends: the slowest call is the min). */
static double gbytes(const struct row *r, int bytes, double t) { return (double)r->n * bytes / t / 1e9; }

static void print_row(const struct row *r)
{
    const struct bench_spread *k = &r->t_kernel, *s = &r->t_stream, *q = &r->ratio;
    char kr[32], sr[32], qr[32];

    snprintf(kr, sizeof(kr), "[%.1f..%.1f]", gbytes(r, r->bytes, k->max), gbytes(r, r->bytes, k->min));
    snprintf(sr, sizeof(sr), "[%.1f..%.1f]", gbytes(r, STREAM_BYTES, s->max), gbytes(r, STREAM_BYTES, s->min));
    snprintf(qr, sizeof(qr), "[%.3f..%.3f]", q->min, q->max);
    printf("%-9s %-5s %10lld %7d %9.3f %8.3f %8.3f %7d %8.2f %15s %8.2f %15s %6.3f %13s %6d\n", zs_kopt_name(r->opt),
           zs_dtype_name(r->dt), (long long)r->n, r->threads, k->median * 1e3, k->median * 1e9 / (double)r->n,
           (double)r->n / k->median / 1e9, r->bytes, gbytes(r, r->bytes, k->median), kr,
           gbytes(r, STREAM_BYTES, s->median), sr, q->median, qr, r->reps);
    fflush(stdout);
}

static void print_json(const struct row *r, enum zs_kpath path)
{
    const struct bench_spread *k = &r->t_kernel, *s = &r->t_stream, *q = &r->ratio;

    printf("{\"bench\": \"optimizer\", \"optimizer\": \"%s\", \"param_dtype\": \"%s\", \"n\": %lld, "
           "\"threads\": %d, \"gparam_s\": %.6g, \"gbytes_s\": %.6g, \"gbytes_s_min\": %.6g, \"gbytes_s_max\": %.6g, "
           "\"stream_bytes_per_element\": %d, \"stream_gbytes_s\": %.6g, \"stream_gbytes_s_min\": %.6g, "
           "\"stream_gbytes_s_max\": %.6g, \"ratio\": %.6g, \"ratio_min\": %.6g, \"ratio_max\": %.6g, "
           "\"ms_per_step\": %.6g, \"reps\": %d, \"path\": \"%s\"}\n",
           zs_kopt_name(r->opt), zs_dtype_name(r->dt), (long long)r->n, r->threads, (double)r->n / k->median / 1e9,
           gbytes(r, r->bytes, k->median), gbytes(r, r->bytes, k->max), gbytes(r, r->bytes, k->min), STREAM_BYTES,
           gbytes(r, STREAM_BYTES, s->median), gbytes(r, STREAM_BYTES, s->max), gbytes(r, STREAM_BYTES, s->min),
           q->median, q->min, q->max, k->median * 1e3, r->reps, zs_kpath_name(path));
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
            small = r->t_kernel.median / (double)r->n;
        if (r->n == SIZE_64M)
            large = r->t_kernel.median / (double)r->n;
    }
    if (small > 0 && large > 0)
        printf("overhead: ns/param at 1M / ns/param at 64M = %.3f\n", small / large);
}

// ---------------------------------------------------------------------------- driver

struct bench_run {
    const struct bench_args *a;
    struct zs_pool *pool;
    struct zs_optim_step step;
    stream_fn stream;
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
    struct stream_arg st = {b->stream, r->sp, r->sm, r->sv, r->sg, 1e-7f};
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
    if (measure(b->pool, b->a, &k, &st, row)) {
        printf("# skip %s %s n=%lld: out of memory for the rep times\n", zs_kopt_name(opt), zs_dtype_name(dt),
               (long long)r->n);
        return false;
    }
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
    b->stream = stream_pick();
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
