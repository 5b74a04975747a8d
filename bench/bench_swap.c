/* bench_swap.c - zs-bench swap: the NVMe swapper's sequential write and read bandwidth against fio with the
 * same block size, queue depth and file size, interleaved in one run; then the pipelined optimizer step
 * over NVMe-resident AdamW state against the same step in memory and against the bare disk time. This file:
 * the arguments, the helpers the two parts share, the output and the driver. */
#ifndef _GNU_SOURCE
#define _XOPEN_SOURCE 700 /* posix_memalign, popen, realpath, sysconf */
#endif
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "bench.h"   /* defines: bench_now, bench_parse_*, bench_opt_value, bench_cmdline */
#include "offload/swap.h" /* defines: zs_swap_dir_create, zs_swap_direct, zs_swap_error */
#include "bench_swap.h"   /* defines: struct swap_bench, swap_bw_run, swap_step_bench */

#define MAX_REPS 1000

const char bench_swap_usage[] =
    "[--dir D] [--size 2G] [--block-size 1M] [--queue-depth 16] [--reps 2] [--verify on|off]\n"
    "        [--no-fio] [--require-fio] [--step-n 128M] [--step-group 16M] [--no-step]\n"
    "    D (default .) must be on the disk under test; a private run directory D/zeroshard-rank0 holds the\n"
    "    files and is removed at the end. Rep 1 writes a new (preallocated) file, later reps overwrite it;\n"
    "    zeroshard and fio alternate. --step-n/--step-group: parameters and sub-group size of the simulated\n"
    "    AdamW step with m,v on disk (offload/nvme_optim.c's pipeline); --no-step skips it.";

const char *const swap_op_names[OP_COUNT] = {"write-new", "write", "read"};
const char *const swap_impl_names[IMPL_COUNT] = {"zeroshard", "fio"};
const char *const swap_step_names[STEP_COUNT] = {"in_memory", "disk_only", "nvme_pipelined"};

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

uint64_t swap_align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

/* 2 MiB-aligned and asked for transparent huge pages, as the runtime's host pool is (offload/host_pool.c):
 * a direct I/O then carries one segment per huge page instead of one per 4 KiB page. */
void *swap_page_alloc(size_t bytes)
{
    void *p = NULL;

    if (posix_memalign(&p, 2u << 20, bytes))
        return NULL;
    madvise(p, bytes, MADV_HUGEPAGE);
    return p;
}

bool swap_fits_in_memory(double bytes)
{
    double phys = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);

    return !(phys > 0 && bytes > 0.8 * phys); /* with overcommit the OOM killer would end the run instead */
}

void swap_report(const struct swap_bench *b, struct zs_swap *sw)
{
    fprintf(stderr, "zs-bench swap: %s\n", zs_swap_error(sw ? sw : b->sw));
}

double swap_gbs(const struct swap_bench *b, double secs) { return (double)b->a->size / secs / 1e9; }
void swap_keep_best(double *best, double t) { *best = fmin(*best, fmax(t, 1e-9)); }

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
            printf("%-9s %-9s %-8s %10lld %11d %12lld %9.3f %8.3f ", swap_op_names[op], swap_impl_names[m], swap_io_mode(b, m),
                   (long long)a->block_size, a->queue_depth, (long long)a->size, t, swap_gbs(b, t));
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
                       swap_op_names[op], swap_impl_names[m], swap_io_mode(b, (enum impl)m), (long long)a->block_size, a->queue_depth,
                       (long long)a->size, swap_gbs(b, b->secs[m][op]));
    for (int k = 0; b->step_n && k < STEP_COUNT; k++)
        printf("{\"bench\": \"swap\", \"op\": \"optimizer_step\", \"impl\": \"%s\", \"n\": %lld, \"seconds\": %.6g}\n",
               swap_step_names[k], (long long)b->step_n, b->step_secs[k]);
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
    swap_fio_escape(b->fio_file, sizeof(b->fio_file), b->fio_path);
    snprintf(b->fio_json, sizeof(b->fio_json), "%s/zs-fio.json", b->run_dir);
    swap_fio_probe(b);
    if (!b->have_fio && b->a->require_fio) {
        fprintf(stderr, "zs-bench swap: --require-fio: fio is not on PATH\n");
        return BENCH_FAIL;
    }
    rc = swap_bw_open(b); /* a disk too small fails in zs_swap_reserve, naming the file */
    if (!rc)
        rc = swap_bw_check_like(b);
    if (!rc) {
        print_header(b, argc, argv);
        rc = swap_bw_run(b);
    }
    swap_bw_close(b);
    if (b->have_fio) {
        unlink(b->fio_path);
        unlink(b->fio_json);
    }
    if (rc)
        return rc;
    print_table(b);
    if (b->a->step)
        rc = swap_step_bench(b);
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
