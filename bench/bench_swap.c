/* bench_swap.c - zs-bench swap: the NVMe swapper's sequential write and read bandwidth against fio with the
 * same block size, queue depth and file size, interleaved in one run; then the pipelined optimizer step
 * over NVMe-resident AdamW state against the same step in memory and against the bare disk time. */
#ifndef _GNU_SOURCE
#define _XOPEN_SOURCE 700 /* posix_memalign, popen, realpath, sysconf */
#endif
#include <errno.h>
#include <fcntl.h>
#include <jansson.h> /* defines: json_load_file, json_object_get, json_array_get, json_number_value */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <sys/mman.h>
#include <unistd.h>

#include "bench.h"   /* defines: bench_now, bench_parse_*, bench_opt_value, bench_cmdline */
#include "kernels/optim.h"   /* defines: zs_optim_kernel, zs_kpath_best, struct zs_optim_step */
#include "offload/swap.h"    /* defines: zs_swap_open, zs_swap_reserve, zs_swap_register, zs_swap_read/write/wait */
#include "kernels/threads.h" /* defines: zs_pool_create, zs_pool_run */

#define XFER_BYTES ((int64_t)64 << 20) /* one transfer: what one zs_swap_write/read call moves */
#define MAX_BUFS 16
#define MAX_REPS 1000
#define SLOTS 3 /* as offload/nvme_optim.c */

const char bench_swap_usage[] =
    "[--dir D] [--size 2G] [--block-size 1M] [--queue-depth 16] [--reps 2] [--verify on|off]\n"
    "        [--no-fio] [--require-fio] [--step-n 128M] [--step-group 16M] [--no-step]\n"
    "    D (default .) must be on the disk under test; a private run directory D/zeroshard-rank0 holds the\n"
    "    files and is removed at the end. Rep 1 writes a new (preallocated) file, later reps overwrite it;\n"
    "    zeroshard and fio alternate. --step-n/--step-group: parameters and sub-group size of the simulated\n"
    "    AdamW step with m,v on disk (offload/nvme_optim.c's pipeline); --no-step skips it.";

enum op { OP_WRITE_NEW, OP_WRITE, OP_READ, OP_COUNT };
enum impl { IMPL_ZS, IMPL_FIO, IMPL_COUNT };
enum step_impl { STEP_MEM, STEP_DISK, STEP_NVME, STEP_COUNT };

static const char *const op_names[OP_COUNT] = {"write-new", "write", "read"};
static const char *const impl_names[IMPL_COUNT] = {"zeroshard", "fio"};
static const char *const step_names[STEP_COUNT] = {"in_memory", "disk_only", "nvme_pipelined"};

struct swap_args {
    const char *dir;
    int64_t size, block_size, step_n, step_group;
    int queue_depth, reps;
    bool verify, fio, require_fio, step;
};

struct swap_bench {
    const struct swap_args *a;
    char run_dir[512], fio_path[600], fio_file[1200], fio_json[600], fio_version[64]; /* fio_file: escaped */
    bool have_fio, stale;
    bool direct;  /* the bandwidth swapper runs O_DIRECT */
    bool unlike;  /* it fell back to buffered I/O: no comparison with fio --direct=1 */
    struct zs_swap *sw;
    char *buf; /* nbuf transfers of xfer bytes, one registered region */
    size_t xfer;
    int nbuf;
    char reg[512]; /* "registered", or why not */
    double secs[IMPL_COUNT][OP_COUNT]; /* best of the reps; INFINITY: not measured */
    double step_secs[STEP_COUNT];
    int64_t step_n;
};

// ---------------------------------------------------------------------------- arguments

static const char *const option_names[] = {"--dir",    "--size",    "--block-size", "--queue-depth",
                                           "--reps",   "--verify",  "--step-n",     "--step-group"};

static int parse_onoff(const char *v, bool *out)
{
    if (strcmp(v, "on") && strcmp(v, "off"))
        return -EINVAL;
    *out = !strcmp(v, "on");
    return 0;
}

static int set_option(void *arg, int which, const char *v)
{
    struct swap_args *a = arg;
    switch (which) {
    case 0: a->dir = v; return *v ? 0 : -EINVAL;
    case 1: return bench_parse_count(v, &a->size);
    case 2: return bench_parse_count(v, &a->block_size);
    case 3: return bench_parse_int(v, 4096, &a->queue_depth);
    case 4: return bench_parse_int(v, MAX_REPS, &a->reps);
    case 5: return parse_onoff(v, &a->verify);
    case 6: return bench_parse_count(v, &a->step_n);
    default: return bench_parse_count(v, &a->step_group);
    }
}

static bool set_flag(void *argp, const char *opt)
{
    struct swap_args *a = argp;

    if (!strcmp(opt, "--no-fio"))
        a->fio = false;
    else if (!strcmp(opt, "--require-fio"))
        a->require_fio = true;
    else if (!strcmp(opt, "--no-step"))
        a->step = false;
    else
        return false;
    return true;
}

/* The swapper's own limits, checked here so that a bad value is a usage error (2), not a failed run. */
static int check_args(const struct swap_args *a)
{
    const char *why = NULL;

    if (a->block_size % 4096 || a->block_size > ((int64_t)1 << 30))
        why = "--block-size must be a multiple of 4096 up to 1G";
    else if (a->size % a->block_size)
        why = "--size must be a multiple of --block-size (fio and zeroshard then issue the same I/Os)";
    else if (a->require_fio && !a->fio)
        why = "--require-fio contradicts --no-fio";
    if (why)
        fprintf(stderr, "zs-bench swap: %s\n", why);
    return why ? BENCH_USAGE : BENCH_OK;
}

/* BENCH_OK, BENCH_USAGE, or -1 when --help asked for the usage only. */
static int parse_args(struct swap_args *a, int argc, char **argv)
{
    const int nnames = (int)(sizeof(option_names) / sizeof(option_names[0]));

    *a = (struct swap_args){.dir = ".", .size = (int64_t)2 << 30, .block_size = 1 << 20, .queue_depth = 16,
                            .reps = 2, .verify = true, .fio = true, .step = true,
                            .step_n = (int64_t)128 << 20, .step_group = (int64_t)16 << 20};
    int rc = bench_parse_options("swap", argc, argv, option_names, nnames, set_option, set_flag, a, true);
    return rc ? rc : check_args(a);
}

// ---------------------------------------------------------------------------- helpers

static uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

/* O_DIRECT wants page-aligned buffers; bench_alloc only gives cache lines. NULL on failure; free(). */
/* 2 MiB-aligned and asked for transparent huge pages, as the runtime's host pool is (offload/host_pool.c):
 * a direct I/O then carries one segment per huge page instead of one per 4 KiB page. */
static void *page_alloc(size_t bytes)
{
    void *p = NULL;

    if (posix_memalign(&p, 2u << 20, bytes))
        return NULL;
    madvise(p, bytes, MADV_HUGEPAGE);
    return p;
}

static bool fits_in_memory(double bytes)
{
    double phys = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);

    return !(phys > 0 && bytes > 0.8 * phys); /* with overcommit the OOM killer would end the run instead */
}

/* Incompressible, so that no layer below can shortcut zeros. */
static void fill_random(char *p, size_t bytes)
{
    uint64_t x = 0x9E3779B97F4A7C15ull;

    for (size_t i = 0; i + 8 <= bytes; i += 8) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        memcpy(p + i, &x, 8);
    }
}

static void swap_report(const struct swap_bench *b, struct zs_swap *sw)
{
    fprintf(stderr, "zs-bench swap: %s\n", zs_swap_error(sw ? sw : b->sw));
}

// ---------------------------------------------------------------------------- fio

/* fio splits --filename at ':'; escape it. */
static void fio_escape(char *dst, size_t len, const char *src)
{
    size_t j = 0;

    for (; *src && j + 3 < len; src++) {
        if (*src == ':')
            dst[j++] = '\\';
        dst[j++] = *src;
    }
    dst[j] = '\0';
}

/* The same file size, block size, queue depth and preallocation (posix_fallocate, as zs_swap_reserve),
 * one job, O_DIRECT, io_uring, registered buffers when zeroshard's are. argv strings live in s. */
static void fio_argv(const struct swap_bench *b, bool write, char s[6][1300], char *argv[20])
{
    int n = 0;

    snprintf(s[0], 1300, "--filename=%s", b->fio_file);
    snprintf(s[1], 1300, "--size=%lld", (long long)b->a->size);
    snprintf(s[2], 1300, "--bs=%lld", (long long)b->a->block_size);
    snprintf(s[3], 1300, "--iodepth=%d", b->a->queue_depth);
    snprintf(s[4], 1300, "--rw=%s", write ? "write" : "read");
    snprintf(s[5], 1300, "--output=%s", b->fio_json);
    argv[n++] = "fio";
    argv[n++] = "--name=zs";
    for (int k = 0; k < 5; k++)
        argv[n++] = s[k];
    argv[n++] = "--ioengine=io_uring";
    argv[n++] = "--direct=1";
    argv[n++] = "--numjobs=1";
    argv[n++] = "--fallocate=posix";
    argv[n++] = "--end_fsync=0";
    if (zs_swap_registered(b->sw))
        argv[n++] = "--fixedbufs";
    argv[n++] = "--output-format=json";
    argv[n++] = s[5];
    argv[n] = NULL;
}

/* jobs[0].write.bw_bytes (or read) from fio's JSON; 0 or -1 with a message. */
static int fio_parse(const struct swap_bench *b, bool write, double *bw)
{
    json_error_t jerr;
    json_t *root = json_load_file(b->fio_json, 0, &jerr), *job, *dir;
    long long err = -1, io = -1;

    *bw = 0;
    if (!root) {
        fprintf(stderr, "zs-bench swap: %s: %s (line %d)\n", b->fio_json, jerr.text, jerr.line);
        return -1;
    }
    job = json_array_get(json_object_get(root, "jobs"), 0);
    dir = json_object_get(job, write ? "write" : "read");
    if (dir) {
        err = json_integer_value(json_object_get(job, "error"));
        io = json_integer_value(json_object_get(dir, "io_bytes"));
        *bw = json_number_value(json_object_get(dir, "bw_bytes"));
    }
    json_decref(root);
    if (!dir || err || io != b->a->size || !(*bw > 0)) {
        fprintf(stderr, "zs-bench swap: %s: fio's %s job reports error %lld, %lld of %lld bytes, bw_bytes %g\n",
                b->fio_json, write ? "write" : "read", err, io, (long long)b->a->size, *bw);
        return -1;
    }
    return 0;
}

/* Runs fio (its report goes to fio_json, its messages to our stderr); seconds, or -1. */
static double fio_pass(const struct swap_bench *b, bool write)
{
    char s[6][1300], *argv[20];
    int status = 0;
    double bw;
    pid_t pid;

    fio_argv(b, write, s, argv);
    fflush(stdout);
    pid = fork();
    if (pid == 0) {
        int null = open("/dev/null", O_WRONLY);
        if (null >= 0)
            dup2(null, STDOUT_FILENO);
        execvp("fio", argv);
        _exit(127);
    }
    if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status)) {
        fprintf(stderr, "zs-bench swap: fio --rw=%s failed (%s %d)\n", write ? "write" : "read",
                pid < 0 ? "fork: errno" : WIFEXITED(status) ? "exit status" : "signal",
                pid < 0 ? errno : WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
        return -1;
    }
    if (fio_parse(b, write, &bw))
        return -1;
    unlink(b->fio_json);
    return (double)b->a->size / bw;
}

/* fio is there when "fio --version" answers (fio-3.33); the version goes in the header. */
static void fio_probe(struct swap_bench *b)
{
    FILE *f = b->a->fio ? popen("fio --version 2>/dev/null", "r") : NULL;

    if (!f)
        return;
    b->have_fio = fgets(b->fio_version, sizeof(b->fio_version), f) && !strncmp(b->fio_version, "fio", 3);
    b->fio_version[strcspn(b->fio_version, "\n")] = '\0';
    pclose(f);
}

// ---------------------------------------------------------------------------- zeroshard bandwidth

/* One pass over the whole file: transfers of xfer bytes from nbuf rotating buffers, each reused once
 * its previous transfer is done, so the swapper's queue never drains between transfers. */
static int zs_pass(struct swap_bench *b, bool write, double *secs)
{
    uint64_t tickets[MAX_BUFS] = {0};
    uint64_t size = (uint64_t)b->a->size;
    double t0 = bench_now();
    int rc = 0, rc2, i = 0;

    for (uint64_t off = 0; off < size; off += b->xfer, i = (i + 1) % b->nbuf) {
        size_t len = size - off < b->xfer ? (size_t)(size - off) : b->xfer;
        char *p = b->buf + (size_t)i * b->xfer;

        if (tickets[i] && (rc = zs_swap_wait(b->sw, tickets[i])))
            break;
        tickets[i] = 0;
        rc = write ? zs_swap_write(b->sw, off, p, len, &tickets[i]) : zs_swap_read(b->sw, off, p, len, &tickets[i]);
        if (rc)
            break;
    }
    rc2 = zs_swap_wait_all(b->sw);
    *secs = bench_now() - t0;
    return rc ? rc : rc2;
}

/* Enough buffers to keep queue_depth I/Os in flight across transfer boundaries, plus the one filling. */
static int bw_open(struct swap_bench *b)
{
    const struct swap_args *a = b->a;
    struct zs_swap_opts o = {.dir = b->run_dir, .name = "zs-swap.dat", .block_size = (uint32_t)a->block_size,
                             .queue_depth = (uint32_t)a->queue_depth, .direct = true, .verify = a->verify};
    uint64_t inflight = (uint64_t)a->queue_depth * (uint64_t)a->block_size;
    char err[512];
    int rc;

    b->xfer = (size_t)align_up((uint64_t)XFER_BYTES, (uint64_t)a->block_size);
    b->nbuf = (int)((inflight + b->xfer - 1) / b->xfer) + 1;
    b->nbuf = b->nbuf < 3 ? 3 : b->nbuf > MAX_BUFS ? MAX_BUFS : b->nbuf;
    if (!fits_in_memory((double)b->nbuf * (double)b->xfer) || !(b->buf = page_alloc((size_t)b->nbuf * b->xfer))) {
        fprintf(stderr, "zs-bench swap: cannot allocate %d x %zu bytes of buffers\n", b->nbuf, b->xfer);
        return BENCH_FAIL;
    }
    fill_random(b->buf, (size_t)b->nbuf * b->xfer);
    rc = zs_swap_open(&b->sw, &o, err, sizeof(err));
    if (rc) {
        fprintf(stderr, "zs-bench swap: %s\n", err);
        return BENCH_FAIL;
    }
    if (zs_swap_reserve(b->sw, (uint64_t)a->size)) {
        swap_report(b, NULL);
        return BENCH_FAIL;
    }
    snprintf(b->reg, sizeof(b->reg), "registered");
    if (zs_swap_register(b->sw, b->buf, (size_t)b->nbuf * b->xfer))
        snprintf(b->reg, sizeof(b->reg), "unregistered (%s)", zs_swap_error(b->sw));
    return BENCH_OK;
}

static void bw_close(struct swap_bench *b)
{
    zs_swap_close(b->sw); /* before the registered region goes; NULL is fine */
    b->sw = NULL;
    free(b->buf);
    b->buf = NULL;
}

/* fio always runs --direct=1; zeroshard only where the file system takes O_DIRECT. */
static const char *io_mode(const struct swap_bench *b, enum impl m)
{
    return m == IMPL_FIO || b->direct ? "direct" : "buffered";
}

#define UNLIKE_WHY "zeroshard fell back to buffered I/O here (the file system refused O_DIRECT) and fio runs " \
                   "--direct=1: the page cache against the disk is not a like-for-like comparison"

/* Issue 11 item 20: a ratio against fio only when both sides do direct I/O. Refused outright with
 * --require-fio; otherwise fio is not run and no ratio is printed, saying why. */
static int bw_check_like(struct swap_bench *b)
{
    b->direct = zs_swap_direct(b->sw);
    if (b->direct)
        return BENCH_OK;
    b->unlike = true;
    b->have_fio = false;
    if (b->a->require_fio) {
        fprintf(stderr, "zs-bench swap: --require-fio: " UNLIKE_WHY "\n");
        return BENCH_FAIL;
    }
    return BENCH_OK;
}

static double gbs(const struct swap_bench *b, double secs) { return (double)b->a->size / secs / 1e9; }

static void keep_best(double *best, double t) { *best = fmin(*best, fmax(t, 1e-9)); }

static int impl_pass(struct swap_bench *b, enum impl m, bool write, double *secs)
{
    if (m == IMPL_FIO)
        return (*secs = fio_pass(b, write)) < 0 ? -1 : 0;
    if (zs_pass(b, write, secs)) {
        swap_report(b, NULL);
        return -1;
    }
    return 0;
}

/* Each implementation reads its file right after writing it: a write-back cache below (a virtual disk's
 * host) serves the most recently written file faster, so both must read equally recent data. Which one
 * goes first alternates by rep, so a disk that drifts favours neither. Rep 1 writes into freshly
 * preallocated (unwritten) extents; later reps overwrite. */
static int bw_run(struct swap_bench *b)
{
    for (int rep = 0; rep < b->a->reps; rep++) {
        enum op w = rep ? OP_WRITE : OP_WRITE_NEW;
        double t[IMPL_COUNT][2] = {{0}}; /* write, read */

        for (int k = 0; k < IMPL_COUNT; k++) {
            enum impl m = (enum impl)((k + rep) % IMPL_COUNT);
            if (m == IMPL_FIO && !b->have_fio)
                continue;
            if (impl_pass(b, m, true, &t[m][0]) || impl_pass(b, m, false, &t[m][1]))
                return BENCH_FAIL;
            keep_best(&b->secs[m][w], t[m][0]);
            keep_best(&b->secs[m][OP_READ], t[m][1]);
        }
        printf("# rep %d (%s first): %s zeroshard %.3f", rep + 1, impl_names[b->have_fio ? rep % IMPL_COUNT : 0],
               op_names[w], gbs(b, t[IMPL_ZS][0]));
        if (b->have_fio)
            printf(" fio %.3f", gbs(b, t[IMPL_FIO][0]));
        printf(" GB/s; read zeroshard %.3f", gbs(b, t[IMPL_ZS][1]));
        if (b->have_fio)
            printf(" fio %.3f", gbs(b, t[IMPL_FIO][1]));
        printf(" GB/s\n");
        fflush(stdout);
    }
    return BENCH_OK;
}

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
    return align_up(2 * align_up((uint64_t)group_len(r, g) * 4, 4096), block);
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

static void nvme_group_at(void *arg, int32_t g, uint64_t *off, size_t *bytes)
{
    const struct nvme_job *j = arg;

    *off = (uint64_t)g * j->r->region;
    *bytes = group_bytes(j->r, g, j->block);
}

static int nvme_group(void *arg, int32_t g, char *base)
{
    const struct nvme_job *j = arg;

    if (j->compute)
        step_kernel(j->r, g, (float *)base, (float *)(base + align_up((uint64_t)group_len(j->r, g) * 4, 4096)));
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
        memcpy(r->slots + align_up((uint64_t)len * 4, 4096), r->v + begin, (size_t)len * 4);
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

    if (!fits_in_memory(4.0 * (double)bytes + SLOTS * (double)r->region)) {
        fprintf(stderr, "zs-bench swap: the step needs %.2f GiB of memory; lower --step-n\n",
                (4.0 * (double)bytes + SLOTS * (double)r->region) / (1 << 30));
        return BENCH_FAIL;
    }
    r->param = page_alloc(bytes);
    r->grad = page_alloc(bytes);
    r->m = page_alloc(bytes);
    r->v = page_alloc(bytes);
    r->slots = page_alloc(SLOTS * r->region);
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
        printf("%-15s %9.3f %9.3f ", step_names[k], t[k], (double)r->n / t[k] / 1e9);
        if (k == STEP_MEM)
            printf("%10s\n", "-");
        else
            printf("%10.3f\n", 2.0 * file / t[k] / 1e9);
    }
    fflush(stdout);
}

/* in_memory, disk_only, nvme_pipelined in turn each rep; best of each. */
static int step_bench(struct swap_bench *b)
{
    const struct swap_args *a = b->a;
    uint64_t block = (uint64_t)a->block_size;
    struct step_run r = {.n = a->step_n, .group = a->step_group < a->step_n ? a->step_group : a->step_n};
    char reg[512];
    int rc;

    r.ngroups = (int32_t)((r.n + r.group - 1) / r.group);
    r.region = align_up(2 * align_up((uint64_t)r.group * 4, 4096), block);
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

        keep_best(&b->step_secs[STEP_MEM], step_in_memory(&r));
        if (step_nvme(&r, block, false, &t_disk) || step_nvme(&r, block, true, &t_nvme)) {
            swap_report(b, r.sw);
            rc = BENCH_FAIL;
            break;
        }
        keep_best(&b->step_secs[STEP_DISK], t_disk);
        keep_best(&b->step_secs[STEP_NVME], t_nvme);
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

// ---------------------------------------------------------------------------- output

static void print_header(const struct swap_bench *b, int argc, char **argv)
{
    const struct swap_args *a = b->a;
    char cmd[1024];

    bench_cmdline(argc, argv, cmd, sizeof(cmd));
    printf("# %s\n", cmd);
    printf("# dir %s (run directory %s%s), %s, buffers %s, verify %s (CRC32C per block)\n", a->dir, b->run_dir,
           b->stale ? ", a stale one cleared" : "", zs_swap_direct(b->sw) ? "O_DIRECT" : "buffered (no O_DIRECT here)",
           b->reg, a->verify ? "on" : "off");
    printf("# zeroshard: %d rotating transfers of %zu MiB, each split into %lld-byte I/Os, %d in flight; "
           "file preallocated with posix_fallocate (zs_swap_reserve)\n",
           b->nbuf, b->xfer >> 20, (long long)a->block_size, a->queue_depth);
    if (b->have_fio)
        printf("# %s: one job, io_uring, O_DIRECT, same bs/iodepth/size, --fallocate=posix, --end_fsync=0%s\n",
               b->fio_version, zs_swap_registered(b->sw) ? ", --fixedbufs" : "");
    else if (b->unlike)
        printf("# fio: not run, no ratio: " UNLIKE_WHY "\n");
    else
        printf("# fio: %s; the fio rows are skipped\n", a->fio ? "not found on PATH (apt-get install fio)" : "--no-fio");
    printf("# write-new: rep 1 into freshly preallocated extents; write, read: best of the other reps "
           "(read: of all); GB/s = 1e9 bytes/s\n");
    fflush(stdout);
}

static double ratio(const struct swap_bench *b, enum op op)
{
    return b->secs[IMPL_FIO][op] / b->secs[IMPL_ZS][op]; /* NaN or inf when either is missing */
}

static void print_table(const struct swap_bench *b)
{
    const struct swap_args *a = b->a;

    printf("\n%-9s %-9s %-8s %10s %11s %12s %9s %8s %7s\n", "op", "impl", "io", "block_size", "queue_depth", "bytes",
           "seconds", "GB/s", "ratio");
    for (int op = 0; op < OP_COUNT; op++)
        for (int m = 0; m < IMPL_COUNT; m++) {
            double t = b->secs[m][op];
            if (isinf(t))
                continue;
            printf("%-9s %-9s %-8s %10lld %11d %12lld %9.3f %8.3f ", op_names[op], impl_names[m], io_mode(b, m),
                   (long long)a->block_size, a->queue_depth, (long long)a->size, t, gbs(b, t));
            if (m == IMPL_ZS && isfinite(ratio(b, (enum op)op)))
                printf("%7.3f\n", ratio(b, (enum op)op));
            else
                printf("%7s\n", "-");
        }
}

static void print_json(const struct swap_bench *b)
{
    const struct swap_args *a = b->a;

    printf("\n");
    for (int op = 0; op < OP_COUNT; op++)
        for (int m = 0; m < IMPL_COUNT; m++)
            if (!isinf(b->secs[m][op]))
                printf("{\"bench\": \"swap\", \"op\": \"%s\", \"impl\": \"%s\", \"io\": \"%s\", \"block_size\": %lld, "
                       "\"queue_depth\": %d, \"bytes\": %lld, \"gbytes_s\": %.6g}\n",
                       op_names[op], impl_names[m], io_mode(b, (enum impl)m), (long long)a->block_size, a->queue_depth,
                       (long long)a->size, gbs(b, b->secs[m][op]));
    for (int k = 0; b->step_n && k < STEP_COUNT; k++)
        printf("{\"bench\": \"swap\", \"op\": \"optimizer_step\", \"impl\": \"%s\", \"n\": %lld, \"seconds\": %.6g}\n",
               step_names[k], (long long)b->step_n, b->step_secs[k]);
}

/* With a single rep there is no overwrite pass; the write ratio is then the first write's. */
static void print_summary(const struct swap_bench *b)
{
    const double *t = b->step_secs;
    enum op w = isinf(b->secs[IMPL_ZS][OP_WRITE]) ? OP_WRITE_NEW : OP_WRITE;
    char rw[32] = "-", rr[32] = "-";

    if (b->step_n) {
        double slower = fmax(t[STEP_MEM], t[STEP_DISK]);
        printf("optimizer step: nvme_pipelined / max(in_memory, disk_only) = %.3f (1: compute hidden behind the disk; "
               "%.3f: no overlap at all)\n", t[STEP_NVME] / slower, (t[STEP_MEM] + t[STEP_DISK]) / slower);
    }
    if (isfinite(ratio(b, w)))
        snprintf(rw, sizeof(rw), "%.3f", ratio(b, w));
    if (isfinite(ratio(b, OP_READ)))
        snprintf(rr, sizeof(rr), "%.3f", ratio(b, OP_READ));
    printf("ratio write: %s, read: %s%s\n", rw, rr,
           b->unlike ? " (refused: zeroshard buffered, fio O_DIRECT; not like for like)" : b->have_fio ? "" : " (no fio)");
}

// ---------------------------------------------------------------------------- driver

static int bench_run(struct swap_bench *b, int argc, char **argv)
{
    int rc;

    snprintf(b->fio_path, sizeof(b->fio_path), "%s/zs-fio.dat", b->run_dir);
    fio_escape(b->fio_file, sizeof(b->fio_file), b->fio_path);
    snprintf(b->fio_json, sizeof(b->fio_json), "%s/zs-fio.json", b->run_dir);
    fio_probe(b);
    if (!b->have_fio && b->a->require_fio) {
        fprintf(stderr, "zs-bench swap: --require-fio: fio is not on PATH\n");
        return BENCH_FAIL;
    }
    rc = bw_open(b); /* a disk too small fails in zs_swap_reserve, naming the file */
    if (!rc)
        rc = bw_check_like(b);
    if (!rc) {
        print_header(b, argc, argv);
        rc = bw_run(b);
    }
    bw_close(b);
    if (b->have_fio) {
        unlink(b->fio_path);
        unlink(b->fio_json);
    }
    if (rc)
        return rc;
    print_table(b);
    if (b->a->step)
        rc = step_bench(b);
    print_json(b);
    print_summary(b);
    return rc;
}

int bench_swap(int argc, char **argv)
{
    struct swap_args a;
    struct swap_bench *b;
    char err[512], dir[4096];
    int rc = parse_args(&a, argc, argv);

    if (rc) {
        fprintf(rc < 0 ? stdout : stderr, "usage: %s swap %s\n", argv[0], bench_swap_usage);
        return rc < 0 ? BENCH_OK : rc;
    }
    b = calloc(1, sizeof(*b));
    if (!b) {
        fprintf(stderr, "zs-bench swap: out of memory\n");
        return BENCH_FAIL;
    }
    if (realpath(a.dir, dir)) /* absolute paths in the header and for fio */
        a.dir = dir;
    b->a = &a;
    for (int m = 0; m < IMPL_COUNT; m++)
        for (int op = 0; op < OP_COUNT; op++)
            b->secs[m][op] = INFINITY;
    rc = zs_swap_dir_create(a.dir, 0, b->run_dir, sizeof(b->run_dir), &b->stale, err, sizeof(err));
    if (rc) {
        fprintf(stderr, "zs-bench swap: --dir: %s\n", err);
        rc = BENCH_FAIL;
        goto out_free;
    }
    rc = bench_run(b, argc, argv);
    if (zs_swap_dir_remove(b->run_dir))
        fprintf(stderr, "zs-bench swap: could not remove %s\n", b->run_dir);
out_free:
    free(b);
    return rc;
}
