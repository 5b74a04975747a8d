/* bench_overlap.c - zs-bench overlap: how much of a collective hides behind compute, for each way of
 * making progress while the program computes: none (launch, compute, wait), explicit test calls
 * between slices of compute (what the engine does from its API calls), or a progress thread.
 * overlap = (T_comm + T_compute - T_both) / min(T_comm, T_compute): 1 hides the shorter one entirely,
 * 0 is no better than running them one after the other. */
#ifndef _GNU_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <mpi.h>

#include "bench.h" /* defines: bench_now, bench_parse_*, bench_cmdline */
#include "comm/comm.h"  /* defines: zs_comm_init, zs_comm_alloc, zs_comm_all_reduce, zs_comm_test, zs_comm_wait */

#define MAX_REPS 1000
#define WORK_FLOATS 4096 /* 16 KB: the compute stays in L1/L2 and leaves the memory bus to the collective */

const char bench_overlap_usage[] =
    "[--size 64M] [--op all_reduce|reduce_scatter] [--impl zeroshard,zeroshard-mpi] [--reps R]\n"
    "        [--slice-us U]\n"
    "    Under mpirun. Times the collective alone, a compute loop of the same length alone, and both\n"
    "    together with no progress calls, with a test call every U microseconds of compute (default 50),\n"
    "    and with a progress thread; medians of R repetitions (default 9), each at its slowest rank.";

enum mode { MODE_NONE, MODE_TEST, MODE_THREAD, MODE_COUNT };
static const char *const mode_names[MODE_COUNT] = {"none", "test", "thread"};

struct overlap_args {
    int64_t size;
    bool reduce_scatter;
    bool impl[2]; /* zeroshard (automatic: shm on a node), zeroshard-mpi */
    int reps;
    double slice_us;
};

struct run {
    struct zs_comm *c;
    float *buf;
    int64_t count; /* elements per rank's chunk */
    bool reduce_scatter;
    int64_t units; /* compute work units matching the collective's time */
    int64_t slice; /* work units between two test calls */
    float work[WORK_FLOATS];
    /* the progress thread */
    pthread_mutex_t lock;
    struct zs_comm_req *req;
    volatile bool stop;
};

// ---------------------------------------------------------------------------- pieces

/* One unit of compute: a few passes of a dependent multiply-add over an in-cache array. Never inlined:
 * every mode must run the same machine code as the calibration (an inlined copy the compiler vectorized
 * differently once ran at half the speed and looked like negative overlap). */
__attribute__((noinline)) static void work_units(float *w, int64_t n)
{
    for (int64_t u = 0; u < n; u++)
        for (int p = 0; p < 4; p++)
            for (int i = 0; i < WORK_FLOATS; i++)
                w[i] = w[i] * 0.999f + 0.001f;
}

static struct zs_comm_req *launch(struct run *r)
{
    struct zs_comm_req *q = NULL;
    int size = zs_comm_size(r->c), rank = zs_comm_rank(r->c);
    zs_status st;

    /* scale 1/N keeps the values where they are, repetition after repetition */
    if (r->reduce_scatter)
        st = zs_comm_reduce_scatter(r->c, r->buf, r->buf + (size_t)rank * (size_t)r->count, r->count,
                                    1.0f / (float)size, &q);
    else
        st = zs_comm_all_reduce(r->c, r->buf, r->count, 1.0f / (float)size, &q);
    if (st) {
        fprintf(stderr, "zs-bench overlap: %s\n", zs_last_error());
        MPI_Abort(MPI_COMM_WORLD, BENCH_FAIL);
    }
    return q;
}

static void finish(struct run *r, struct zs_comm_req *q)
{
    if (zs_comm_wait(r->c, q)) {
        fprintf(stderr, "zs-bench overlap: %s\n", zs_last_error());
        MPI_Abort(MPI_COMM_WORLD, BENCH_FAIL);
    }
}

static void *progress_thread(void *arg)
{
    struct run *r = arg;
    bool done = false;

    while (!r->stop && !done) {
        pthread_mutex_lock(&r->lock);
        if (zs_comm_test(r->c, r->req, &done))
            done = true; /* the error surfaces again in the main thread's wait */
        pthread_mutex_unlock(&r->lock);
        sched_yield();
    }
    return NULL;
}

/* One timed repetition: what = -1 times the collective alone, -2 the compute alone, else a mode. */
static double rep(struct run *r, int what)
{
    struct zs_comm_req *q = NULL;
    pthread_t th;
    double t0, t, tmax;
    bool done = false;

    MPI_Barrier(MPI_COMM_WORLD);
    t0 = bench_now();
    if (what != -2)
        q = launch(r);
    if (what == MODE_THREAD) {
        r->req = q;
        r->stop = false;
        if (pthread_create(&th, NULL, progress_thread, r)) {
            fprintf(stderr, "zs-bench overlap: pthread_create failed\n");
            MPI_Abort(MPI_COMM_WORLD, BENCH_FAIL);
        }
    }
    if (what == -2 || what == MODE_NONE || what == MODE_THREAD) {
        work_units(r->work, what == -1 ? 0 : r->units);
    } else if (what == MODE_TEST) {
        for (int64_t u = 0; u < r->units; u += r->slice) {
            work_units(r->work, r->units - u < r->slice ? r->units - u : r->slice);
            if (!done && zs_comm_test(r->c, q, &done))
                done = true;
        }
    }
    if (what == MODE_THREAD) {
        pthread_mutex_lock(&r->lock);
        r->stop = true;
        pthread_mutex_unlock(&r->lock);
        pthread_join(th, NULL);
    }
    if (q)
        finish(r, q);
    t = bench_now() - t0;
    MPI_Allreduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return tmax;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median_of(double *t, int reps)
{
    qsort(t, (size_t)reps, sizeof(t[0]), cmp_double);
    return t[reps / 2];
}

static double median(struct run *r, int what, int reps)
{
    double t[MAX_REPS];

    for (int i = 0; i < reps; i++)
        t[i] = rep(r, what);
    return median_of(t, reps);
}

/* The compute alone and the three ways together, interleaved rep by rep so that a machine whose speed
 * drifts (shared memory bus, neighbours) favours none of them. */
static void measure_interleaved(struct run *r, int reps, double *t_comp, double t_both[MODE_COUNT])
{
    static double t[MODE_COUNT + 1][MAX_REPS];

    for (int i = 0; i < reps; i++)
        for (int m = -1; m < MODE_COUNT; m++)
            t[m + 1][i] = rep(r, m < 0 ? -2 : m);
    *t_comp = median_of(t[0], reps);
    for (int m = 0; m < MODE_COUNT; m++)
        t_both[m] = median_of(t[m + 1], reps);
}

/* Work units per second on this rank, agreed as the slowest rank's, so every rank computes as long. */
static void calibrate(struct run *r, double t_comm, double slice_us)
{
    double t0 = bench_now(), t, rate, rmin;
    int64_t n = 16;

    for (;;) {
        work_units(r->work, n);
        t = bench_now() - t0;
        if (t > 0.05)
            break;
        n *= 2;
        t0 = bench_now();
    }
    rate = (double)n / t;
    MPI_Allreduce(&rate, &rmin, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
    r->units = (int64_t)(rmin * t_comm) + 1;
    r->slice = (int64_t)(rmin * slice_us * 1e-6) + 1;
}

// ---------------------------------------------------------------------------- options

static const char *const option_names[] = {"--size", "--op", "--impl", "--reps", "--slice-us"};

static int add_impl(void *arg, const char *tok)
{
    struct overlap_args *a = arg;

    if (!strcmp(tok, "zeroshard") || !strcmp(tok, "shm"))
        a->impl[0] = true;
    else if (!strcmp(tok, "zeroshard-mpi") || !strcmp(tok, "zs-mpi"))
        a->impl[1] = true;
    else
        return -EINVAL;
    return 0;
}

static int set_option(void *arg, int which, const char *v)
{
    struct overlap_args *a = arg;

    switch (which) {
    case 0: return bench_parse_count(v, &a->size);
    case 1:
        if (strcmp(v, "all_reduce") && strcmp(v, "reduce_scatter"))
            return -EINVAL;
        a->reduce_scatter = !strcmp(v, "reduce_scatter");
        return 0;
    case 2:
        a->impl[0] = a->impl[1] = false;
        return bench_parse_list(a, v, add_impl);
    case 3: return bench_parse_int(v, MAX_REPS, &a->reps);
    default: return bench_parse_double(v, &a->slice_us);
    }
}

// ---------------------------------------------------------------------------- main

static int run_impl(const struct overlap_args *a, int which, int rank, int size)
{
    struct zs_comm_opts o = {.mode = which ? ZS_COMM_MPI : ZS_COMM_AUTO, .fake_node_size = 0};
    double t_comm, t_comp, t_both[MODE_COUNT];
    struct run *r = calloc(1, sizeof(*r));
    char err[256] = "";

    if (!r || (which == 0 && zs_comm_opts_from_env(&o, err, sizeof(err)))) {
        fprintf(stderr, "zs-bench overlap: %s\n", r ? err : "out of memory");
        free(r);
        return BENCH_FAIL;
    }
    if (zs_comm_init(&r->c, MPI_COMM_WORLD, &o)) {
        fprintf(stderr, "zs-bench overlap: %s\n", zs_last_error());
        MPI_Abort(MPI_COMM_WORLD, BENCH_FAIL);
    }
    pthread_mutex_init(&r->lock, NULL);
    r->reduce_scatter = a->reduce_scatter;
    r->count = (a->size / 4 + size - 1) / size;
    r->buf = zs_comm_alloc(r->c, (size_t)r->count * (size_t)size * sizeof(float));
    if (!r->buf) {
        fprintf(stderr, "zs-bench overlap: out of memory for %lld bytes\n", (long long)a->size);
        MPI_Abort(MPI_COMM_WORLD, BENCH_FAIL);
    }
    for (int64_t i = 0; i < r->count * size; i++)
        r->buf[i] = (float)((i * 13 + rank * 7) % 17) - 8.0f;
    for (int i = 0; i < WORK_FLOATS; i++)
        r->work[i] = 1.0f;
    median(r, -1, 3 < a->reps ? 3 : a->reps); /* warm up: pages, shared heap, MPI connections */
    t_comm = median(r, -1, a->reps);
    calibrate(r, t_comm, a->slice_us);
    measure_interleaved(r, a->reps, &t_comp, t_both);
    if (rank == 0) {
        const char *impl = which ? "zeroshard-mpi" : zs_comm_describe(r->c);
        double lo = t_comm < t_comp ? t_comm : t_comp;
        printf("\n# %s %s, %lld bytes: collective alone %.0f us, compute alone %.0f us\n",
               a->reduce_scatter ? "reduce_scatter" : "all_reduce", impl, (long long)a->size, t_comm * 1e6,
               t_comp * 1e6);
        printf("%-8s %12s %10s\n", "progress", "both(us)", "overlap");
        for (int m = 0; m < MODE_COUNT; m++)
            printf("%-8s %12.0f %10.2f\n", mode_names[m], t_both[m] * 1e6, (t_comm + t_comp - t_both[m]) / lo);
        for (int m = 0; m < MODE_COUNT; m++)
            printf("{\"bench\": \"overlap\", \"op\": \"%s\", \"impl\": \"%s\", \"ranks\": %d, \"bytes\": %lld, "
                   "\"progress\": \"%s\", \"comm_us\": %.1f, \"compute_us\": %.1f, \"both_us\": %.1f, "
                   "\"overlap\": %.3f}\n",
                   a->reduce_scatter ? "reduce_scatter" : "all_reduce", which ? "zeroshard-mpi" : "zeroshard",
                   size, (long long)a->size, mode_names[m], t_comm * 1e6, t_comp * 1e6, t_both[m] * 1e6,
                   (t_comm + t_comp - t_both[m]) / lo);
    }
    zs_comm_release(r->c, r->buf);
    zs_comm_free(r->c);
    pthread_mutex_destroy(&r->lock);
    free(r);
    return BENCH_OK;
}

int bench_overlap(int argc, char **argv)
{
    struct overlap_args a = {.size = (int64_t)64 << 20, .impl = {true, true}, .reps = 9, .slice_us = 50};
    int inited = 0, rank = 0, size = 1, provided = 0, rc;
    char line[512];

    MPI_Initialized(&inited);
    if (!inited)
        MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
    else
        MPI_Query_thread(&provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    rc = bench_parse_options("overlap", argc, argv, option_names, 5, set_option, NULL, &a, rank == 0);
    if (rc) {
        if (rank == 0)
            fprintf(rc < 0 ? stdout : stderr, "usage: %s overlap %s\n", argv[0], bench_overlap_usage);
        rc = rc < 0 ? BENCH_OK : rc;
        goto out;
    }
    if (provided < MPI_THREAD_SERIALIZED) {
        if (rank == 0)
            fprintf(stderr, "zs-bench overlap: MPI gives thread level %d, below MPI_THREAD_SERIALIZED\n", provided);
        rc = BENCH_FAIL;
        goto out;
    }
    if (rank == 0) {
        bench_cmdline(argc, argv, line, sizeof(line));
        printf("# %s\n# ranks %d; test calls every %.0f us of compute; medians of %d\n", line, size, a.slice_us,
               a.reps);
    }
    for (int w = 0; w < 2 && !rc; w++)
        if (a.impl[w])
            rc = run_impl(&a, w, rank, size);
out:
    if (!inited)
        MPI_Finalize();
    return rc;
}
