/* test_cuda_sem.c MODE - the engine on the emulated GPU (tests/cuda_emu) where CUDA's error and device semantics
 * decide the outcome. MODE:
 *   overlap  stage 3 with overlap_comm on: the collectives' events are polled (cudaEventQuery answers
 *            not-ready, which is also the thread's last error) and the step's kernels launch after; the run
 *            must match the same run on the CPU device, bit for bit.
 *   thread   every step from a thread other than the one that called zs_init, each rank on its own GPU
 *            (ZS_CUDA_EMU_GPUS=2: rank 1 drives GPU 1, and a new thread starts on GPU 0): the run must match
 *            the same run on the main thread.
 *   fault    the emulator faults a kernel of the first step (ZS_CUDA_EMU_FAULT): a step fails naming
 *            cudaErrorIllegalAddress, and zs_finalize returns.
 *   current  what include/zeroshard.h says the engine does to the calling thread's current device, each rank on
 *            its own GPU (ZS_CUDA_EMU_GPUS=2): before every call the thread's device is set to the other GPU; after
 *            zs_init and each call that works on the GPU it is the rank's GPU, after the queries still the other.
 * Runs under mpirun (overlap, thread, current: 2 ranks; fault: 1). Exits 0 (pass) or 1. */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <mpi.h>

#include <cuda_runtime_api.h> /* tests/cuda_emu's: cudaSetDevice, cudaGetDevice */

#include "check.h"
#include "zeroshard.h"

unsigned long long zs_emu_launches(void); /* tests/cuda_emu: kernels launched so far */

static int rank, world;

#define NU 3
static const int64_t sizes[NU] = { 1000, 37, 300 };

struct run {
    zs_ctx *ctx;
    int32_t unit[NU], param[NU];
    int steps;
    zs_status st;
    uint64_t hash;
};

static float value(uint64_t k)
{
    k = (k ^ (k >> 31)) * 0x7fb5d329728ea185ULL;
    k = (k ^ (k >> 27)) * 0x81dadef4bc2dd44dULL;
    return (float)((k >> 40) & 0xffffff) / 16777216.0f - 0.5f;
}

static void init_values(void *arg, int32_t param, int64_t first, int64_t count, float *dst)
{
    for (int64_t i = 0; i < count; i++)
        dst[i] = value(((uint64_t)param << 32) + (uint64_t)(first + i));
}

static zs_status run_open(struct run *r, const char *device, bool overlap)
{
    char json[768];
    zs_status st;

    snprintf(json, sizeof(json),
             "{\"train_micro_batch_size_per_gpu\": 1, \"gradient_accumulation_steps\": 1, \"gradient_clipping\": 0.5,"
             "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01, \"weight_decay\": 0.01}},"
             "\"zero_optimization\": {\"stage\": 3, \"overlap_comm\": %s, \"reduce_bucket_size\": 500,"
             "\"stage3_param_persistence_threshold\": 0},"
             "\"zeroshard\": {\"device\": \"%s\", \"timeout_s\": 20}}",
             overlap ? "true" : "false", device);
    zs_init_opts o = { .config_json = json, .use_comm = 1, .comm = MPI_COMM_WORLD, .quiet = 1 };
    memset(r, 0, sizeof(*r));
    st = zs_init(&r->ctx, &o);
    for (int u = 0; !st && u < NU; u++) {
        char name[32];
        snprintf(name, sizeof(name), "u%d", u);
        st = zs_unit_add(r->ctx, name, &r->unit[u]);
        snprintf(name, sizeof(name), "u%d.w", u);
        if (!st)
            st = zs_param_add_init(r->ctx, r->unit[u], name, sizes[u], init_values, NULL, &r->param[u]);
    }
    return st ? st : zs_setup(r->ctx);
}

/* One micro-batch and its step: each unit fetched, a gradient that depends on its values, the rank and the
 * step copied in, released; then the step's reductions, norm and optimizer kernels. */
static zs_status micro_batch(struct run *r, int step)
{
    float w[1000], g[1000];
    zs_status st = ZS_OK;

    for (int u = NU - 1; !st && u >= 0; u--) {
        void *p = NULL, *gb = NULL;
        st = zs_unit_fetch(r->ctx, r->unit[u], NULL);
        if (!st)
            st = zs_param_data(r->ctx, r->param[u], &p);
        if (!st)
            st = zs_copy_to_host(r->ctx, w, p, (size_t)sizes[u] * sizeof(float));
        for (int64_t i = 0; i < sizes[u]; i++)
            g[i] = w[i] - value(((uint64_t)step << 40) ^ ((uint64_t)rank << 32) ^ (uint64_t)(u * 4096 + i));
        if (!st)
            st = zs_grad_buffer(r->ctx, r->unit[u], &gb);
        if (!st)
            st = zs_copy_from_host(r->ctx, gb, g, (size_t)sizes[u] * sizeof(float));
        if (!st)
            st = zs_grad_ready(r->ctx, r->unit[u]);
        if (!st)
            st = zs_unit_release(r->ctx, r->unit[u]);
    }
    return st ? st : zs_step(r->ctx);
}

/* FNV-1a over every parameter's values after training. */
static zs_status params_hash(struct run *r, uint64_t *h)
{
    float w[1000];
    zs_status st = ZS_OK;

    *h = 0xcbf29ce484222325ULL;
    for (int u = 0; !st && u < NU; u++) {
        void *p = NULL;
        st = zs_unit_fetch(r->ctx, r->unit[u], NULL);
        if (!st)
            st = zs_param_data(r->ctx, r->param[u], &p);
        if (!st)
            st = zs_copy_to_host(r->ctx, w, p, (size_t)sizes[u] * sizeof(float));
        if (!st)
            st = zs_unit_release(r->ctx, r->unit[u]);
        for (size_t i = 0; !st && i < (size_t)sizes[u] * sizeof(float); i++)
            *h = (*h ^ ((const unsigned char *)w)[i]) * 0x100000001b3ULL;
    }
    return st;
}

static void *train(void *arg)
{
    struct run *r = arg;

    for (int s = 0; !r->st && s < r->steps; s++)
        r->st = micro_batch(r, s);
    if (!r->st)
        r->st = params_hash(r, &r->hash);
    if (r->st)
        fprintf(stderr, "rank %d: %s\n", rank, zs_last_error());
    return NULL;
}

/* A run of `steps` on `device`, trained on the calling thread or on a new one; its parameters' hash. */
static zs_status run_all(const char *device, bool overlap, bool on_thread, int steps, uint64_t *hash)
{
    struct run r;
    zs_status st = run_open(&r, device, overlap);
    pthread_t t;

    r.steps = steps;
    if (st) {
        fprintf(stderr, "rank %d: set-up: %s\n", rank, zs_last_error());
    } else if (on_thread) {
        if (pthread_create(&t, NULL, train, &r) || pthread_join(t, NULL))
            r.st = ZS_ERR_INVALID;
        st = r.st;
    } else {
        train(&r);
        st = r.st;
    }
    *hash = r.hash;
    if (!st && getenv("ZS_CUDA_EMU_NCCL")) { /* the NCCL variant: the collectives really were NCCL's */
        zs_memory_report m = { 0 };
        CHECK(!zs_memory(r.ctx, &m) && m.nccl_staging > 0, "rank %d: ZS_CUDA_EMU_NCCL=1 but no NCCL staging "
              "(%llu bytes): the collectives stayed host-staged", rank, (unsigned long long)m.nccl_staging);
    }
    zs_finalize(r.ctx);
    return st;
}

/* Whether every rank agrees that cond holds. */
static bool all(bool cond)
{
    int mine = cond, every = 0;

    MPI_Allreduce(&mine, &every, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return every;
}

static void t_overlap(void)
{
    uint64_t gpu = 0, cpu = 0;
    zs_status sg = run_all("cuda", true, false, 3, &gpu);
    zs_status sc = run_all("cpu", true, false, 3, &cpu);

    CHECK(all(!sg), "rank %d: the emulated GPU's run at stage 3 with overlap_comm: status %d", rank, sg);
    CHECK(all(!sc && gpu == cpu), "rank %d: the GPU's parameters differ from the CPU's (%016llx, %016llx)", rank,
          (unsigned long long)gpu, (unsigned long long)cpu);
}

static void t_thread(void)
{
    uint64_t main_hash = 0, thread_hash = 0;
    zs_status sm = run_all("cuda", true, false, 3, &main_hash);
    zs_status st = run_all("cuda", true, true, 3, &thread_hash);

    CHECK(all(!sm), "rank %d: the run on the main thread: status %d", rank, sm);
    CHECK(all(!st), "rank %d: the run whose steps are on another thread: status %d", rank, st);
    CHECK(all(main_hash == thread_hash), "rank %d: the thread's parameters differ (%016llx, %016llx)", rank,
          (unsigned long long)main_hash, (unsigned long long)thread_hash);
}

static void t_fault(void)
{
    struct run r;
    char k[32];
    zs_status st = run_open(&r, "cuda", true);

    CHECK(!st, "set-up: %s", zs_last_error());
    snprintf(k, sizeof(k), "%llu", zs_emu_launches() + 1); /* the first kernel the steps launch */
    setenv("ZS_CUDA_EMU_FAULT", k, 1);
    for (int s = 0; !st && s < 3; s++)
        st = micro_batch(&r, s);
    unsetenv("ZS_CUDA_EMU_FAULT");
    CHECK(st != ZS_OK && strstr(zs_last_error(), "cudaErrorIllegalAddress"), "a faulted kernel went unreported: %s",
          st ? zs_last_error() : "every step succeeded");
    zs_finalize(r.ctx);
}

static int other_gpu; /* made current before each call: the GPU that is not the rank's */

static void before(void)
{
    cudaSetDevice(other_gpu);
}

/* After `what` (status st) ran with the other GPU current: the thread's device must be `want`. */
static void after(const char *what, zs_status st, int want)
{
    int cur = -1;

    cudaGetDevice(&cur);
    CHECK(!st && cur == want, "rank %d: %s (status %d): the thread's device is %d after it, the documented %d", rank,
          what, (int)st, cur, want);
}

static void t_current(void)
{
    int gpu = rank % 2; /* the node-local rank modulo the GPUs (ZS_CUDA_EMU_GPUS=2) */
    float w[1000], g[1000] = { 0 };
    struct run r;
    void *p = NULL, *gb = NULL, *stream = NULL;
    zs_memory_report m;
    zs_step_stats s;
    zs_status st;

    other_gpu = 1 - gpu;
    before();
    st = run_open(&r, "cuda", false);
    after("zs_init and zs_setup", st, gpu);
    for (int u = NU - 1; !st && u >= 0; u--) {
        before();
        st = zs_unit_fetch(r.ctx, r.unit[u], NULL);
        after("zs_unit_fetch", st, gpu);
        if (!st)
            st = zs_param_data(r.ctx, r.param[u], &p);
        before();
        st = st ? st : zs_copy_to_host(r.ctx, w, p, (size_t)sizes[u] * sizeof(float));
        after("zs_copy_to_host", st, gpu);
        if (!st)
            st = zs_grad_buffer(r.ctx, r.unit[u], &gb);
        before();
        st = st ? st : zs_copy_from_host(r.ctx, gb, g, (size_t)sizes[u] * sizeof(float));
        after("zs_copy_from_host", st, gpu);
        if (!st)
            st = zs_grad_ready(r.ctx, r.unit[u]);
        if (!st)
            st = zs_unit_release(r.ctx, r.unit[u]);
    }
    before();
    st = st ? st : zs_step(r.ctx);
    after("zs_step", st, gpu);
    /* the queries read the engine's state only */
    before();
    after("zs_cuda_stream", zs_cuda_stream(r.ctx, &stream), other_gpu);
    before();
    after("zs_memory", zs_memory(r.ctx, &m), other_gpu);
    before();
    after("zs_stats", zs_stats(r.ctx, &s), other_gpu);
    before();
    after("zs_finalize", zs_finalize(r.ctx), gpu);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    int failed, any = 0;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (!strcmp(mode, "overlap"))
        t_overlap();
    else if (!strcmp(mode, "thread"))
        t_thread();
    else if (!strcmp(mode, "fault"))
        t_fault();
    else if (!strcmp(mode, "current"))
        t_current();
    else
        CHECK(false, "usage: test_cuda_sem overlap|thread|fault|current");
    failed = zs_test_fail;
    MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    MPI_Finalize();
    if (rank == 0)
        return zs_test_summary(mode) || any;
    return failed ? 1 : 0;
}
