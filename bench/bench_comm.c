/* bench_comm.c - zs-bench comm: reduce-scatter, all-gather and all-reduce through ZeroShard's collectives
 * (shared memory, and its MPI backend) against plain MPI, interleaved in one run, nccl-tests style. */
#ifndef _GNU_SOURCE
#define _POSIX_C_SOURCE 200809L /* clock_gettime, posix_memalign, strtok_r, sysconf */
#endif
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <mpi.h>

#include "bench.h" /* defines: bench_now, bench_parse_*, bench_opt_value, bench_cmdline, bench_alloc */
#include "comm/comm.h"  /* defines: zs_comm_init, zs_comm_alloc, zs_comm_reduce_scatter, ..., zs_comm_wait */

#define MAX_SIZES 32
#define MAX_ITERS 100000
#define SIZE_16M ((int64_t)16 << 20)
#define SIZE_64K ((int64_t)64 << 10)
#define SIZE_64M ((int64_t)64 << 20)

const char bench_comm_usage[] =
    "[--sizes 1K..256M] [--ops reduce_scatter,all_gather,all_reduce]\n"
    "        [--impl zeroshard,zeroshard-mpi,mpi] [--iters N] [--warmup W] [--min-time S]\n"
    "    Under mpirun. Sizes: bytes of the whole fp32 array, a list (K/M/G suffixes; LO..HI steps x4).\n"
    "    zeroshard (shm): automatic backend, ZS_FAKE_NODE_SIZE honoured; zeroshard-mpi (zs-mpi): its MPI\n"
    "    backend; mpi: MPI_Reduce_scatter_block, MPI_Allgather, MPI_Allreduce. N: interleaved rounds to fill\n"
    "    S seconds per row (default 0.2), at least 3. W: 5, or 1 from 16M up.";

enum op { OP_RS, OP_AG, OP_AR, OP_COUNT };
enum impl { IMPL_ZS, IMPL_ZS_MPI, IMPL_MPI, IMPL_COUNT };

static const char *const op_names[OP_COUNT] = {"reduce_scatter", "all_gather", "all_reduce"};
static const char *const impl_names[IMPL_COUNT] = {"zeroshard", "zeroshard-mpi", "mpi"};

struct comm_args {
    int64_t sizes[MAX_SIZES];
    int nsizes;
    int ops[OP_COUNT], nops;       /* enum op */
    int impls[IMPL_COUNT], nimpls; /* enum impl */
    int iters;  /* 0: from min_time */
    int warmup; /* -1: by size */
    double min_time;
};

struct row {
    enum op op;
    enum impl impl;
    int64_t nominal, bytes, count; /* count: elements per rank (RS, AG) or of the whole array (AR) */
    int iters;
    double t_avg, t_min; /* seconds, each iteration counted at its slowest rank */
    struct bench_spread t; /* the same iterations' median and range */
    long long wrong;
};

/* The all-reduce's memory reference: a memcpy of the whole array on every rank at once, timed in the
 * same rounds as the collectives it is compared with (a reference measured at another minute
 * compares the machine's drift, not the code). */
struct memref {
    int64_t nominal;        /* the all-reduce size that carries it; 0: none */
    int64_t bytes;
    struct bench_spread t;  /* seconds per memcpy, at the slowest rank */
    struct bench_spread zs; /* zeroshard's all-reduce over the same rounds */
    struct bench_spread ratio; /* per round: zeroshard's time / the memcpy's beside it */
};

struct bench {
    const struct comm_args *a;
    int rank, size, node_ranks;
    struct zs_comm *zs[2]; /* IMPL_ZS, IMPL_ZS_MPI */
    float ref[17];         /* the reduction's result by global index mod 17 */
    struct row rows[MAX_SIZES * OP_COUNT * IMPL_COUNT];
    int nrows;
    struct memref memref;
};

/* One operation at one size: each implementation's buffer (the whole array) and MPI's separate output. */
struct size_run {
    enum op op;
    int64_t nominal, count; /* count: elements per rank */
    float *buf[IMPL_COUNT];
    float *out; /* MPI_Reduce_scatter_block's receive buffer */
    char *msrc, *mdst; /* the memory reference's memcpy, when this size carries it */
    bool memref;
    int iters;
    double *times; /* [impl][iter], then the memcpy's [iter] */
};

// ---------------------------------------------------------------------------- data

/* Rank r holds (r*7 + i*13) % 17 - 8 at global index i: small integers, so every sum is exact in any
 * order and MPI's results can be held to the same reference. Both depend only on i mod 17 for a rank. */
static void gen_table(int r, float t[17])
{
    for (int k = 0; k < 17; k++)
        t[k] = (float)(((r % 17) * 7 + k * 13) % 17) - 8.0f;
}

static void ref_table(int ranks, float ref[17])
{
    float t[17];

    gen_table(0, ref);
    for (int r = 1; r < ranks; r++) {
        gen_table(r, t);
        for (int k = 0; k < 17; k++)
            ref[k] += t[k];
    }
}

static void fill_table(float *dst, int64_t i0, int64_t n, const float t[17])
{
    int k = (int)(i0 % 17);

    for (int64_t i = 0; i < n; i++) {
        dst[i] = t[k];
        if (++k == 17)
            k = 0;
    }
}

static long long count_wrong(const float *got, int64_t i0, int64_t n, const float t[17])
{
    long long bad = 0;
    int k = (int)(i0 % 17);

    for (int64_t i = 0; i < n; i++) {
        bad += got[i] != t[k]; /* NaN poison counts too */
        if (++k == 17)
            k = 0;
    }
    return bad;
}

static void fill_nan(float *dst, int64_t n) { for (int64_t i = 0; i < n; i++) dst[i] = NAN; }

// ---------------------------------------------------------------------------- arguments

/* "64M", or "1K..256M" for every fourfold step from the first to at most the last. */
static int add_size(void *arg, const char *tok)
{
    struct comm_args *a = arg;
    const char *dots = strstr(tok, "..");
    size_t len = dots ? (size_t)(dots - tok) : strlen(tok);
    char lo[64];
    int64_t first, last;

    if (len >= sizeof(lo))
        return -EINVAL;
    memcpy(lo, tok, len);
    lo[len] = '\0';
    if (bench_parse_count(lo, &first) || bench_parse_count(dots ? dots + 2 : lo, &last) || first > last)
        return -EINVAL;
    for (int64_t s = first; s <= last; s *= 4) {
        if (a->nsizes == MAX_SIZES)
            return -EINVAL;
        a->sizes[a->nsizes++] = s;
    }
    return 0;
}

/* A repeat is refused: each implementation has one buffer per size, each row one (op, impl). */
static int append_once(int *list, int *n, int v)
{
    for (int k = 0; k < *n; k++)
        if (list[k] == v)
            return -EINVAL;
    list[(*n)++] = v;
    return 0;
}

static int add_op(void *arg, const char *tok)
{
    struct comm_args *a = arg;
    for (int o = 0; o < OP_COUNT; o++)
        if (!strcmp(tok, op_names[o]))
            return append_once(a->ops, &a->nops, o);
    return -EINVAL;
}

static int add_impl(void *arg, const char *tok)
{
    struct comm_args *a = arg;
    static const char *const aliases[IMPL_COUNT] = {"shm", "zs-mpi", "mpi"};

    for (int m = 0; m < IMPL_COUNT; m++)
        if (!strcmp(tok, impl_names[m]) || !strcmp(tok, aliases[m]))
            return append_once(a->impls, &a->nimpls, m);
    return -EINVAL;
}

static const char *const option_names[] = {"--sizes", "--ops", "--impl", "--iters", "--warmup", "--min-time"};

static int set_option(void *arg, int which, const char *v)
{
    struct comm_args *a = arg;
    switch (which) {
    case 0: a->nsizes = 0; return bench_parse_list(a, v, add_size);
    case 1: a->nops = 0; return bench_parse_list(a, v, add_op);
    case 2: a->nimpls = 0; return bench_parse_list(a, v, add_impl);
    case 3: return bench_parse_int(v, MAX_ITERS, &a->iters);
    case 4: if (!strcmp(v, "0")) { a->warmup = 0; return 0; } return bench_parse_int(v, 1000, &a->warmup);
    default: return bench_parse_double(v, &a->min_time);
    }
}

static void args_default(struct comm_args *a)
{
    memset(a, 0, sizeof(*a));
    for (int i = 0; i < 10; i++)
        a->sizes[i] = (int64_t)1024 << (2 * i);
    a->nsizes = 10;
    for (int o = 0; o < OP_COUNT; o++)
        a->ops[a->nops++] = o;
    for (int m = 0; m < IMPL_COUNT; m++)
        a->impls[a->nimpls++] = m;
    a->warmup = -1;
    a->min_time = 0.2;
}

/* BENCH_OK, BENCH_USAGE, or -1 when --help asked for the usage only. Quiet except on rank 0. */
static int parse_args(struct comm_args *a, int argc, char **argv, bool loud)
{
    const int nnames = (int)(sizeof(option_names) / sizeof(option_names[0]));

    args_default(a);
    return bench_parse_options("comm", argc, argv, option_names, nnames, set_option, NULL, a, loud);
}

// ---------------------------------------------------------------------------- one collective

/* A collective that fails on one rank leaves the others waiting in it forever: end them all. */
static _Noreturn void comm_fatal(const struct bench *b, const char *what)
{
    fprintf(stderr, "zs-bench comm: rank %d: %s\n", b->rank, what);
    MPI_Abort(MPI_COMM_WORLD, BENCH_FAIL);
    exit(BENCH_FAIL);
}

/* The timed part: the call and its completion. */
static void run_once(struct bench *b, const struct size_run *s, enum impl m)
{
    struct zs_comm *c = m == IMPL_MPI ? NULL : b->zs[m];
    struct zs_comm_req *req = NULL;
    float *buf = s->buf[m];
    int64_t n = s->count;
    zs_status st;

    if (m == IMPL_MPI) {
        int rc = s->op == OP_RS ? MPI_Reduce_scatter_block(buf, s->out, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD)
               : s->op == OP_AG ? MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, (int)n, MPI_FLOAT,
                                                MPI_COMM_WORLD)
                                : MPI_Allreduce(MPI_IN_PLACE, buf, (int)(n * b->size), MPI_FLOAT, MPI_SUM,
                                                MPI_COMM_WORLD);
        if (rc != MPI_SUCCESS)
            comm_fatal(b, "an MPI collective failed");
        return;
    }
    if (s->op == OP_RS)
        st = zs_comm_reduce_scatter(c, buf, buf + (size_t)b->rank * (size_t)n, n, 1.0f, &req);
    else if (s->op == OP_AG)
        st = zs_comm_all_gather(c, buf, n, &req);
    else
        st = zs_comm_all_reduce(c, buf, n, 1.0f, &req);
    if (!st)
        st = zs_comm_wait(c, req);
    if (st)
        comm_fatal(b, zs_last_error());
}

/* Every iteration starts from fresh input: in-place operations overwrite it, and the all-gather's
 * other chunks are poisoned so that only this iteration's delivery can pass the check. */
static void prepare(const struct bench *b, const struct size_run *s, enum impl m)
{
    int64_t n = s->count, mine = (int64_t)b->rank * n;
    float gen[17];

    gen_table(b->rank, gen);
    if (s->op == OP_AG) {
        fill_nan(s->buf[m], mine);
        fill_table(s->buf[m] + mine, mine, n, gen);
        fill_nan(s->buf[m] + mine + n, n * b->size - mine - n);
        return;
    }
    fill_table(s->buf[m], 0, n * b->size, gen);
    if (s->op == OP_RS && m == IMPL_MPI)
        fill_nan(s->out, n);
}

/* Elements of this rank's result that differ from the reference, after the last iteration. */
static long long check(const struct bench *b, const struct size_run *s, enum impl m)
{
    int64_t n = s->count, mine = (int64_t)b->rank * n;
    long long bad = 0;
    float gen[17];

    if (s->op == OP_RS)
        return count_wrong(m == IMPL_MPI ? s->out : s->buf[m] + mine, mine, n, b->ref);
    if (s->op == OP_AR)
        return count_wrong(s->buf[m], 0, n * b->size, b->ref);
    for (int j = 0; j < b->size; j++) {
        gen_table(j, gen);
        bad += count_wrong(s->buf[m] + (size_t)j * (size_t)n, (int64_t)j * n, n, gen);
    }
    return bad;
}

// ---------------------------------------------------------------------------- buffers

static void buffers_free(struct bench *b, struct size_run *s)
{
    for (int k = 0; k < b->a->nimpls; k++) { /* heap blocks: the same order on every rank */
        enum impl m = b->a->impls[k];
        if (m == IMPL_MPI)
            bench_free(s->buf[m]);
        else
            zs_comm_release(b->zs[m], s->buf[m]);
        s->buf[m] = NULL;
    }
    bench_free(s->out);
    bench_free(s->msrc);
    bench_free(s->mdst);
    s->out = NULL;
    s->msrc = s->mdst = NULL;
}

static double buffers_bytes(const struct bench *b, const struct size_run *s)
{
    double whole = 4.0 * (double)s->count * b->size;

    return whole * (b->a->nimpls + (s->memref ? 2 : 0)) + 4.0 * (double)s->count;
}

/* 0 on every rank, or -ENOMEM on every rank with nothing held. Over 80% of physical memory for the
 * ranks of this node is refused up front: with overcommit the OOM killer would end the run instead. */
static int buffers_alloc(struct bench *b, struct size_run *s)
{
    double phys = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    size_t whole = (size_t)s->count * (size_t)b->size * sizeof(float);
    int ok = !(phys > 0 && buffers_bytes(b, s) * b->node_ranks > 0.8 * phys);

    MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!ok)
        return -ENOMEM;
    for (int k = 0; k < b->a->nimpls; k++) {
        enum impl m = b->a->impls[k];
        s->buf[m] = m == IMPL_MPI ? bench_alloc(whole) : zs_comm_alloc(b->zs[m], whole);
        ok &= s->buf[m] != NULL;
        if (m == IMPL_MPI && s->op == OP_RS) {
            s->out = bench_alloc((size_t)s->count * sizeof(float));
            ok &= s->out != NULL;
        }
    }
    if (s->memref) {
        s->msrc = bench_alloc(whole);
        s->mdst = bench_alloc(whole);
        ok &= s->msrc && s->mdst;
    }
    if (s->msrc && s->mdst) { /* first touch outside the timing */
        memset(s->msrc, 1, whole);
        memset(s->mdst, 2, whole);
    }
    MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!ok) {
        buffers_free(b, s);
        return -ENOMEM;
    }
    return 0;
}

// ---------------------------------------------------------------------------- measuring

/* Fill, line up, time the call; returns the whole iteration's wall time (for choosing counts). */
static double iteration(struct bench *b, const struct size_run *s, enum impl m, double *t_call)
{
    double t0 = bench_now(), t1;

    prepare(b, s, m);
    MPI_Barrier(MPI_COMM_WORLD);
    t1 = bench_now();
    run_once(b, s, m);
    *t_call = bench_now() - t1;
    return bench_now() - t0;
}

/* Warm-up, then as many rounds as make each implementation's row last about min_time on average;
 * every rank must agree on the count, so the slowest rank's estimates decide. */
static int choose_iters(struct bench *b, struct size_run *s)
{
    const struct comm_args *a = b->a;
    double est[IMPL_COUNT] = {0}, sum = 0, t, want;
    int warmup = a->warmup >= 0 ? a->warmup : s->nominal >= SIZE_16M ? 1 : 5;

    if (!a->iters && warmup < 1) /* the count comes from a warm-up's time */
        warmup = 1;

    for (int w = 0; w < warmup; w++)
        for (int k = 0; k < a->nimpls; k++)
            est[a->impls[k]] = iteration(b, s, a->impls[k], &t);
    if (a->iters)
        return a->iters;
    MPI_Allreduce(MPI_IN_PLACE, est, IMPL_COUNT, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    for (int m = 0; m < IMPL_COUNT; m++)
        sum += est[m];
    want = ceil(a->nimpls * a->min_time / fmax(sum, 1e-9));
    return want < 3 ? 3 : want > MAX_ITERS ? MAX_ITERS : (int)want;
}

/* The memory reference's iteration: lined up like a collective, then one memcpy of the array. */
static void memcpy_iteration(const struct size_run *s, size_t bytes, double *t_call)
{
    double t0;

    MPI_Barrier(MPI_COMM_WORLD);
    t0 = bench_now();
    memcpy(s->mdst, s->msrc, bytes);
    *t_call = bench_now() - t0;
}

/* Median and range of iters times; t is left as it was (the spread sorts a copy). */
static struct bench_spread spread_copy(const double *t, int iters, double *scratch)
{
    memcpy(scratch, t, (size_t)iters * sizeof(double));
    return bench_spread_of(scratch, iters);
}

/* The reference against zeroshard's all-reduce, round by round. */
static void memref_store(struct bench *b, const struct size_run *s, const double *t_zs, const double *t_mem,
                         double *scratch)
{
    struct memref *r = &b->memref;

    r->bytes = 4 * s->count * b->size;
    r->t = spread_copy(t_mem, s->iters, scratch);
    r->zs = spread_copy(t_zs, s->iters, scratch);
    for (int it = 0; it < s->iters; it++)
        scratch[it] = t_zs[it] / fmax(t_mem[it], 1e-9);
    r->ratio = bench_spread_of(scratch, s->iters);
}

/* Rounds of every implementation in turn (and of the memcpy reference where this size carries it), so
 * all see the same minutes of a memory bus that drifts; then one row per implementation into
 * rows[0..nimpls). */
static void measure(struct bench *b, struct size_run *s, struct row *rows, double *scratch)
{
    const struct comm_args *a = b->a;
    size_t per = (size_t)s->iters, ncols = (size_t)a->nimpls + s->memref;
    double *t_mem = &s->times[(size_t)a->nimpls * per];

    for (int it = 0; it < s->iters; it++) {
        for (int k = 0; k < a->nimpls; k++)
            iteration(b, s, a->impls[k], &s->times[(size_t)k * per + (size_t)it]);
        if (s->memref)
            memcpy_iteration(s, (size_t)(4 * s->count * b->size), &t_mem[it]);
    }
    /* An iteration ends when its slowest rank is done. */
    MPI_Allreduce(MPI_IN_PLACE, s->times, (int)(per * ncols), MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    for (int k = 0; k < a->nimpls; k++) {
        const double *t = &s->times[(size_t)k * per];
        double sum = 0, lo = INFINITY;
        long long bad = check(b, s, a->impls[k]);

        for (int it = 0; it < s->iters; it++) {
            sum += t[it];
            lo = fmin(lo, t[it]);
        }
        MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
        rows[k] = (struct row){.op = s->op, .impl = a->impls[k], .nominal = s->nominal,
                               .bytes = 4 * s->count * b->size,
                               .count = s->op == OP_AR ? s->count * b->size : s->count, .iters = s->iters,
                               .t_avg = fmax(sum / s->iters, 1e-9), .t_min = fmax(lo, 1e-9),
                               .t = spread_copy(t, s->iters, scratch), .wrong = bad};
        if (s->memref && a->impls[k] == IMPL_ZS)
            memref_store(b, s, t, t_mem, scratch);
    }
}

// ---------------------------------------------------------------------------- output

static double row_algbw(const struct row *r) { return (double)r->bytes / r->t_avg / 1e9; }

static double row_busbw(const struct row *r, int n)
{
    return row_algbw(r) * (r->op == OP_AR ? 2.0 : 1.0) * (n - 1) / n;
}

static void print_header(const struct bench *b, int argc, char **argv)
{
    char cmd[1024], lib[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;

    bench_cmdline(argc, argv, cmd, sizeof(cmd));
    MPI_Get_library_version(lib, &len);
    lib[strcspn(lib, ",\n")] = '\0';
    printf("# %s\n# ranks %d (%d on this node)\n", cmd, b->size, b->node_ranks);
    for (int k = 0; k < b->a->nimpls; k++)
        if (b->a->impls[k] != IMPL_MPI)
            printf("# %s: %s\n", impl_names[b->a->impls[k]], zs_comm_describe(b->zs[b->a->impls[k]]));
    printf("# mpi: %s; fp32, sum, scale 1; time = average over iterations after warm-up, each iteration at its\n"
           "# slowest rank, input re-filled outside the timed call; busbw as nccl-tests\n", lib);
}

static void print_table_header(enum op op)
{
    printf("\n# %s\n%12s %12s %6s %6s %-14s %11s %11s %8s %8s %7s %6s\n", op_names[op], "size(B)", "count", "type",
           "redop", "impl", "time(us)", "min(us)", "algbw", "busbw", "#wrong", "iters");
    printf("%78s %8s %8s\n", "", "(GB/s)", "(GB/s)");
}

static void print_row(const struct row *r, int n)
{
    printf("%12lld %12lld %6s %6s %-14s %11.2f %11.2f %8.3f %8.3f %7lld %6d\n", (long long)r->bytes,
           (long long)r->count, "float", r->op == OP_AG ? "none" : "sum", impl_names[r->impl], r->t_avg * 1e6,
           r->t_min * 1e6, row_algbw(r), row_busbw(r, n), r->wrong, r->iters);
    fflush(stdout);
}

static void print_json(const struct row *r, int n)
{
    printf("{\"bench\": \"comm\", \"op\": \"%s\", \"impl\": \"%s\", \"ranks\": %d, \"bytes\": %lld, "
           "\"time_us\": %.6g, \"time_us_median\": %.6g, \"time_us_min\": %.6g, \"time_us_max\": %.6g, "
           "\"algbw\": %.6g, \"busbw\": %.6g, \"wrong\": %lld}\n",
           op_names[r->op], impl_names[r->impl], n, (long long)r->bytes, r->t_avg * 1e6, r->t.median * 1e6,
           r->t.min * 1e6, r->t.max * 1e6, row_algbw(r), row_busbw(r, n), r->wrong);
}

static const struct row *find_row(const struct bench *b, enum op op, enum impl m, int64_t nominal)
{
    for (int i = 0; i < b->nrows; i++)
        if (b->rows[i].op == op && b->rows[i].impl == m && b->rows[i].nominal == nominal)
            return &b->rows[i];
    return NULL;
}

/* Bandwidth at 64 MB (a gradient bucket's order), and the worst latency at small sizes, where a fixed
 * cost per call shows. */
static void print_summary(const struct bench *b)
{
    static const enum op order[] = {OP_RS, OP_AR, OP_AG};

    for (int o = 0; o < OP_COUNT; o++) {
        const char *name = op_names[order[o]];
        const struct row *z = find_row(b, order[o], IMPL_ZS, SIZE_64M), *p = find_row(b, order[o], IMPL_MPI, SIZE_64M);
        double worst = 0;
        int64_t at = 0;

        if (z && p)
            printf("%s 64MB busbw: zeroshard %.2f GB/s, mpi %.2f GB/s, ratio %.2f\n", name, row_busbw(z, b->size),
                   row_busbw(p, b->size), row_busbw(z, b->size) / fmax(row_busbw(p, b->size), 1e-12));
        for (int i = 0; i < b->nrows; i++) {
            z = &b->rows[i];
            if (z->op != order[o] || z->impl != IMPL_ZS || z->nominal > SIZE_64K ||
                !(p = find_row(b, order[o], IMPL_MPI, z->nominal)) || z->t_avg / p->t_avg <= worst)
                continue;
            worst = z->t_avg / p->t_avg;
            at = z->bytes;
        }
        if (worst > 0)
            printf("%s latency <= 64KB: zeroshard/mpi time ratio max %.2f (at %lld B)\n", name, worst, (long long)at);
    }
}

/* The memory roofline of an all-reduce: every rank must read the whole array once (its chunk from every
 * rank) and write it once (its reduced chunk to every rank), the traffic of one memcpy of the array.
 * Timed in the same rounds as the collective, every rank at once, at the slowest rank, and reported the
 * same way: median [min..max] of both, and the median of the per-round ratios. */
static void print_roofline(const struct bench *b)
{
    const struct memref *r = &b->memref;

    if (!r->nominal || !r->bytes)
        return;
    printf("all_reduce %lld B memory reference: memcpy of the array on every rank at once, interleaved round by "
           "round: median %.0f us [%.0f..%.0f] (the least traffic an all-reduce moves per rank); zeroshard "
           "median %.0f us [%.0f..%.0f]; zeroshard/memcpy per round: median %.2fx [%.2f..%.2f]\n",
           (long long)r->bytes, r->t.median * 1e6, r->t.min * 1e6, r->t.max * 1e6, r->zs.median * 1e6,
           r->zs.min * 1e6, r->zs.max * 1e6, r->ratio.median, r->ratio.min, r->ratio.max);
}

// ---------------------------------------------------------------------------- driver

/* BENCH_OK, or BENCH_FAIL when this size was skipped for want of memory. */
static int run_size(struct bench *b, enum op op, int64_t nominal)
{
    struct size_run s = {.op = op, .nominal = nominal, .count = nominal / 4 / b->size,
                         .memref = op == OP_AR && nominal == b->memref.nominal};
    const struct comm_args *a = b->a;
    bool lead = b->rank == 0;

    if (s.count < 1 || s.count * b->size > INT_MAX) { /* MPI counts are int */
        if (lead)
            printf("# skip %lld B: %s\n", (long long)nominal, s.count < 1 ? "under one float per rank"
                                                                         : "over INT_MAX elements");
        return BENCH_OK;
    }
    if (buffers_alloc(b, &s)) {
        if (lead) {
            printf("# skip %lld B: cannot allocate %.2f GiB per rank\n", (long long)nominal,
                   buffers_bytes(b, &s) / (1 << 30));
            fprintf(stderr, "zs-bench comm: cannot allocate buffers for %lld B; skipped\n", (long long)nominal);
        }
        return BENCH_FAIL;
    }
    s.iters = choose_iters(b, &s);
    s.times = calloc((size_t)s.iters * ((size_t)a->nimpls + 2), sizeof(double)); /* + memcpy + scratch */
    if (!s.times)
        comm_fatal(b, "out of memory for the timings"); /* the other ranks are about to time with us */
    measure(b, &s, &b->rows[b->nrows], s.times + (size_t)s.iters * ((size_t)a->nimpls + 1));
    for (int k = 0; k < a->nimpls; k++, b->nrows++)
        if (lead)
            print_row(&b->rows[b->nrows], b->size);
    free(s.times);
    buffers_free(b, &s);
    return BENCH_OK;
}

static int node_ranks(void)
{
    MPI_Comm node;
    int n = 1;

    if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) == MPI_SUCCESS) {
        MPI_Comm_size(node, &n);
        MPI_Comm_free(&node);
    }
    return n;
}

/* Both comms are collective to create; the automatic one honours ZS_FAKE_NODE_SIZE from the environment. */
static int comms_init(struct bench *b)
{
    struct zs_comm_opts o;
    char err[256] = "";

    if (zs_comm_opts_from_env(&o, err, sizeof(err))) {
        if (b->rank == 0)
            fprintf(stderr, "zs-bench comm: %s\n", err);
        return BENCH_USAGE;
    }
    o.mode = ZS_COMM_AUTO;
    if (zs_comm_init(&b->zs[IMPL_ZS], MPI_COMM_WORLD, &o))
        comm_fatal(b, zs_last_error());
    o.mode = ZS_COMM_MPI;
    if (zs_comm_init(&b->zs[IMPL_ZS_MPI], MPI_COMM_WORLD, &o))
        comm_fatal(b, zs_last_error());
    return BENCH_OK;
}

/* The all-reduce size that carries the memory reference: 64 MB (a gradient bucket's order) when it is
 * run, else the largest all-reduce size; none without zeroshard's all-reduce to compare. */
static void memref_choose(struct bench *b)
{
    const struct comm_args *a = b->a;
    bool ar = false, zs = false;

    for (int o = 0; o < a->nops; o++)
        ar |= a->ops[o] == OP_AR;
    for (int k = 0; k < a->nimpls; k++)
        zs |= a->impls[k] == IMPL_ZS;
    b->memref.nominal = 0;
    for (int i = 0; ar && zs && i < a->nsizes; i++)
        if (b->memref.nominal != SIZE_64M && (a->sizes[i] == SIZE_64M || a->sizes[i] > b->memref.nominal))
            b->memref.nominal = a->sizes[i];
}

static int bench_run(struct bench *b, int argc, char **argv)
{
    const struct comm_args *a = b->a;
    long long wrong = 0;
    int rc = comms_init(b);

    if (rc)
        return rc;
    memref_choose(b);
    if (b->rank == 0)
        print_header(b, argc, argv);
    for (int o = 0; o < a->nops; o++) {
        if (b->rank == 0)
            print_table_header(a->ops[o]);
        for (int i = 0; i < a->nsizes; i++)
            rc |= run_size(b, a->ops[o], a->sizes[i]);
    }
    for (int i = 0; i < b->nrows; i++)
        wrong += b->rows[i].wrong;
    if (b->rank == 0) {
        printf("\n");
        for (int i = 0; i < b->nrows; i++)
            print_json(&b->rows[i], b->size);
        print_summary(b);
        print_roofline(b);
        if (wrong)
            fprintf(stderr, "zs-bench comm: %lld wrong elements in all\n", wrong);
    }
    zs_comm_free(b->zs[IMPL_ZS_MPI]);
    zs_comm_free(b->zs[IMPL_ZS]);
    return wrong || !b->nrows ? BENCH_FAIL : rc;
}

int bench_comm(int argc, char **argv)
{
    struct comm_args a;
    struct bench *b;
    int inited = 0, rank = 0, rc;

    MPI_Initialized(&inited);
    if (!inited)
        MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    rc = parse_args(&a, argc, argv, rank == 0);
    if (rc) {
        if (rank == 0)
            fprintf(rc < 0 ? stdout : stderr, "usage: %s comm %s\n", argv[0], bench_comm_usage);
        rc = rc < 0 ? BENCH_OK : rc;
        goto out_finalize;
    }
    b = calloc(1, sizeof(*b));
    if (!b) {
        fprintf(stderr, "zs-bench comm: out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, BENCH_FAIL);
        exit(BENCH_FAIL);
    }
    b->a = &a;
    b->rank = rank;
    b->node_ranks = node_ranks();
    MPI_Comm_size(MPI_COMM_WORLD, &b->size);
    ref_table(b->size, b->ref);
    rc = bench_run(b, argc, argv);
    free(b);
out_finalize:
    if (!inited)
        MPI_Finalize();
    return rc;
}
