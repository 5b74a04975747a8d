/* bench_swap_step.c - zs-bench swap's optimizer-step part: the pipelined AdamW step over NVMe-resident m and
 * v (offload/nvme_optim.c's three slots) against the same step in memory and against the bare disk time. */
#ifndef _GNU_SOURCE
#define _XOPEN_SOURCE 700 /* posix_memalign, popen, realpath, sysconf */
#endif
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"       /* defines: bench_now, BENCH_OK, BENCH_FAIL */
#include "bench_swap.h"  /* defines: struct swap_bench, swap_align_up, swap_page_alloc */
#include "kernels/optim.h" /* defines: zs_optim_kernel, zs_kpath_best, struct zs_optim_step */
#include "offload/swap.h" /* defines: zs_swap_open, zs_swap_read/write/wait */
#include "kernels/threads.h" /* defines: zs_pool_create, zs_pool_run */

// ---------------------------------------------------------------------------- optimizer step

/* N parameters in sub-groups of G; group g's m and v lie back to back in one block-aligned region of
 * the file, read into and written from three slots exactly as offload/nvme_optim.c does. */
struct step_run {
    struct zs_swap *sw;
    struct zs_pool *pool;
    zs_optim_fn fn;
    struct zs_optim_step step;
    float *param, *grad, *m, *v;
    char *slots;
    int64_t n, group;
    int32_t ngroups;
    uint64_t region; /* a full group's m and v, each 4096-aligned, together block-aligned */
};

struct kernel_arg {
    const struct step_run *r;
    struct zs_optim_bufs bufs;
};

static void kernel_chunk(void *arg, int64_t begin, int64_t end)
{
    struct kernel_arg *k = arg;

    k->r->fn(&k->r->step, &k->bufs, begin, end);
}

static int64_t group_len(const struct step_run *r, int32_t g)
{
    int64_t begin = (int64_t)g * r->group;

    return r->n - begin < r->group ? r->n - begin : r->group;
}

static uint64_t group_bytes(const struct step_run *r, int32_t g, uint64_t block)
{
    return swap_align_up(2 * swap_align_up((uint64_t)group_len(r, g) * 4, 4096), block);
}

/* As offload/nvme_optim.c does: the kernel runs in 1M-element chunks with a look at the disk between
 * them, so the swapper keeps issuing the queued reads and writes while the kernel computes. */
static void step_kernel(const struct step_run *r, int32_t g, float *s1, float *s2)
{
    int64_t begin = (int64_t)g * r->group, len = group_len(r, g);

    for (int64_t c = 0; c < len; c += 1 << 20) {
        int64_t n = len - c < (1 << 20) ? len - c : (1 << 20);
        struct kernel_arg k = {r, {r->param + begin + c, r->grad + begin + c, NULL, s1 + c, s2 + c}};
        zs_pool_run(r->pool, kernel_chunk, &k, n);
        if (r->sw)
            zs_swap_progress(r->sw);
    }
}

static double step_in_memory(const struct step_run *r)
{
    double t0 = bench_now();

    for (int32_t g = 0; g < r->ngroups; g++)
        step_kernel(r, g, r->m + (int64_t)g * r->group, r->v + (int64_t)g * r->group);
    return bench_now() - t0;
}

struct nvme_job {
    const struct step_run *r;
    uint64_t block;
    bool compute;
};

static void nvme_group_at(void *arg, int32_t g, uint64_t *off, size_t *bytes, size_t *wbytes)
{
    const struct nvme_job *j = arg;

    *off = (uint64_t)g * j->r->region;
    *bytes = *wbytes = group_bytes(j->r, g, j->block);
}

static int nvme_group(void *arg, int32_t g, char *base)
{
    const struct nvme_job *j = arg;

    if (j->compute)
        step_kernel(j->r, g, (float *)base, (float *)(base + swap_align_up((uint64_t)group_len(j->r, g) * 4, 4096)));
    return 0;
}

/* The runtime's pipeline (zs_swap_pipeline, as zs_nvme_optim_step runs it); without compute it is the
 * disk alone. */
static int step_nvme(const struct step_run *r, uint64_t block, bool compute, double *secs)
{
    struct nvme_job job = {r, block, compute};
    char *const slot[SLOTS] = {r->slots, r->slots + r->region, r->slots + 2 * r->region};
    double t0 = bench_now();
    int rc = zs_swap_pipeline(r->sw, r->ngroups, slot, nvme_group_at, nvme_group, &job);

    *secs = bench_now() - t0;
    return rc;
}

/* Step t = 10 of the usual AdamW hyperparameters, as bench_optimizer.c. */
static void step_scalars(struct zs_optim_step *s)
{
    const double lr = 1e-3, b1 = 0.9, b2 = 0.999, wd = 0.01, t = 10;

    *s = (struct zs_optim_step){.lr = (float)lr, .beta1 = (float)b1, .beta2 = (float)b2,
                                .one_minus_beta1 = (float)(1 - b1), .one_minus_beta2 = (float)(1 - b2),
                                .eps = 1e-8f, .weight_decay = (float)wd, .step_size = (float)(lr / (1 - pow(b1, t))),
                                .inv_sqrt_bc2 = (float)(1 / sqrt(1 - pow(b2, t))), .decay = (float)(lr * wd),
                                .grad_scale = 1.0f};
}

struct init_arg {
    float *param, *grad, *m, *v;
};

/* Run by the pool, so each thread first-touches the range it later updates. */
static void init_chunk(void *arg, int64_t begin, int64_t end)
{
    struct init_arg *a = arg;

    for (int64_t i = begin; i < end; i++) {
        float mag = 0.25f + (float)(i % 251) * (1.0f / 334.0f), p = (i & 1) ? -mag : mag;
        a->param[i] = 0.5f + 0.25f * p;
        a->grad[i] = 1e-3f * p;
        a->m[i] = 1e-4f * mag;
        a->v[i] = 1e-6f * mag;
    }
}

/* The file starts with the same m, v as memory. */
static int step_fill_file(struct step_run *r, uint64_t block)
{
    for (int32_t g = 0; g < r->ngroups; g++) {
        int64_t begin = (int64_t)g * r->group, len = group_len(r, g);
        uint64_t t;
        int rc;

        memcpy(r->slots, r->m + begin, (size_t)len * 4);
        memcpy(r->slots + swap_align_up((uint64_t)len * 4, 4096), r->v + begin, (size_t)len * 4);
        rc = zs_swap_write(r->sw, (uint64_t)g * r->region, r->slots, group_bytes(r, g, block), &t);
        if (rc || (rc = zs_swap_wait(r->sw, t)))
            return rc;
    }
    return 0;
}

static bool step_finite(const struct step_run *r)
{
    for (int k = 0; k < 64; k++)
        if (!isfinite(r->param[(r->n - 1) * k / 63]))
            return false;
    return true;
}

static void step_free(struct step_run *r)
{
    if (r->sw)
        zs_swap_close(r->sw); /* before the registered slots go */
    if (r->pool)
        zs_pool_free(r->pool);
    free(r->param);
    free(r->grad);
    free(r->m);
    free(r->v);
    free(r->slots);
}

static int step_open(struct swap_bench *b, struct step_run *r, char *reg, size_t reglen)
{
    const struct swap_args *a = b->a;
    struct zs_swap_opts o = {.dir = b->run_dir, .name = "optimizer.swap", .block_size = (uint32_t)a->block_size,
                             .queue_depth = (uint32_t)a->queue_depth, .direct = true, .verify = a->verify};
    struct zs_pool_opts po = {.threads = 0, .local_rank = 0, .local_size = 1, .bind = 1};
    size_t bytes = (size_t)r->n * 4;
    char err[512] = "";
    int rc;

    if (!swap_fits_in_memory(4.0 * (double)bytes + SLOTS * (double)r->region)) {
        fprintf(stderr, "zs-bench swap: the step needs %.2f GiB of memory; lower --step-n\n",
                (4.0 * (double)bytes + SLOTS * (double)r->region) / (1 << 30));
        return BENCH_FAIL;
    }
    r->param = swap_page_alloc(bytes);
    r->grad = swap_page_alloc(bytes);
    r->m = swap_page_alloc(bytes);
    r->v = swap_page_alloc(bytes);
    r->slots = swap_page_alloc(SLOTS * r->region);
    if (!r->param || !r->grad || !r->m || !r->v || !r->slots) {
        fprintf(stderr, "zs-bench swap: out of memory for the step\n");
        return BENCH_FAIL;
    }
    memset(r->slots, 0, SLOTS * r->region); /* the padding between m and v goes to disk too */
    rc = zs_pool_create(&r->pool, &po, err, (int)sizeof(err));
    if (rc) {
        fprintf(stderr, "zs-bench swap: cannot start the thread pool: %s\n", strerror(-rc));
        return BENCH_FAIL;
    }
    if (err[0])
        printf("# warning: %s\n", err);
    zs_pool_run(r->pool, init_chunk, &(struct init_arg){r->param, r->grad, r->m, r->v}, r->n);
    rc = zs_swap_open(&r->sw, &o, err, sizeof(err));
    if (rc) {
        fprintf(stderr, "zs-bench swap: %s\n", err);
        return BENCH_FAIL;
    }
    snprintf(reg, reglen, "registered");
    rc = zs_swap_reserve(r->sw, (uint64_t)r->ngroups * r->region);
    if (!rc && zs_swap_register(r->sw, r->slots, SLOTS * r->region))
        snprintf(reg, reglen, "unregistered (%s)", zs_swap_error(r->sw));
    if (!rc)
        rc = step_fill_file(r, (uint64_t)a->block_size);
    if (rc)
        swap_report(b, r->sw);
    return rc ? BENCH_FAIL : BENCH_OK;
}

static void step_print(const struct swap_bench *b, const struct step_run *r, const char *reg)
{
    const double *t = b->step_secs;
    double file = (double)r->ngroups * (double)r->region;

    printf("\n# optimizer step: adamw fp32 (path %s, %s), n=%lld in %d sub-groups of %lld, m,v on disk "
           "(%.1f MiB file, %s, read and written each step), %d slots of %.1f MiB %s; best of %d interleaved reps\n",
           zs_kpath_name(zs_kpath_best()), zs_pool_describe(r->pool), (long long)r->n, r->ngroups,
           (long long)r->group, file / (1 << 20), zs_swap_direct(r->sw) ? "O_DIRECT" : "buffered (O_DIRECT refused)",
           SLOTS, (double)r->region / (1 << 20), reg, b->a->reps);
    printf("%-15s %9s %9s %10s\n", "impl", "seconds", "Gparam/s", "disk GB/s");
    for (int k = 0; k < STEP_COUNT; k++) {
        printf("%-15s %9.3f %9.3f ", swap_step_names[k], t[k], (double)r->n / t[k] / 1e9);
        if (k == STEP_MEM)
            printf("%10s\n", "-");
        else
            printf("%10.3f\n", 2.0 * file / t[k] / 1e9);
    }
    fflush(stdout);
}

/* in_memory, disk_only, nvme_pipelined in turn each rep; best of each. */
int swap_step_bench(struct swap_bench *b)
{
    const struct swap_args *a = b->a;
    uint64_t block = (uint64_t)a->block_size;
    struct step_run r = {.n = a->step_n, .group = a->step_group < a->step_n ? a->step_group : a->step_n};
    char reg[512];
    int rc;

    r.ngroups = (int32_t)((r.n + r.group - 1) / r.group);
    r.region = swap_align_up(2 * swap_align_up((uint64_t)r.group * 4, 4096), block);
    r.fn = zs_optim_kernel(zs_kpath_best(), ZS_KOPT_ADAMW, ZS_DTYPE_FP32, ZS_DTYPE_FP32);
    step_scalars(&r.step);
    for (int k = 0; k < STEP_COUNT; k++)
        b->step_secs[k] = INFINITY;
    if (!r.fn) {
        fprintf(stderr, "zs-bench swap: no AdamW fp32 kernel on path %s\n", zs_kpath_name(zs_kpath_best()));
        return BENCH_FAIL;
    }
    rc = step_open(b, &r, reg, sizeof(reg));
    for (int rep = 0; !rc && rep < a->reps; rep++) {
        double t_disk, t_nvme;

        swap_keep_best(&b->step_secs[STEP_MEM], step_in_memory(&r));
        if (step_nvme(&r, block, false, &t_disk) || step_nvme(&r, block, true, &t_nvme)) {
            swap_report(b, r.sw);
            rc = BENCH_FAIL;
            break;
        }
        swap_keep_best(&b->step_secs[STEP_DISK], t_disk);
        swap_keep_best(&b->step_secs[STEP_NVME], t_nvme);
    }
    if (!rc && !step_finite(&r)) {
        fprintf(stderr, "zs-bench swap: the parameters went non-finite in the step\n");
        rc = BENCH_FAIL;
    }
    if (!rc) {
        b->step_n = r.n;
        step_print(b, &r, reg);
    }
    step_free(&r);
    return rc;
}
