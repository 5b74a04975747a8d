/* bench_swap_bw.c - zs-bench swap's bandwidth part: the NVMe swapper's sequential write and read against fio
 * with the same block size, queue depth and file size, interleaved rep by rep. */
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
#include <unistd.h>

#include "bench.h"       /* defines: bench_now, BENCH_OK, BENCH_FAIL */
#include "bench_swap.h"  /* defines: struct swap_bench, swap_page_alloc, swap_keep_best */
#include "offload/swap.h" /* defines: zs_swap_open, zs_swap_reserve, zs_swap_register, zs_swap_read/write/wait */

/* Incompressible, so that no layer below can shortcut zeros. */
static void fill_random(char *p, size_t bytes)
{
    uint64_t x = 0x9E3779B97F4A7C15ull;

    for (size_t i = 0; i + 8 <= bytes; i += 8) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        memcpy(p + i, &x, 8);
    }
}

// ---------------------------------------------------------------------------- fio

/* fio splits --filename at ':'; escape it. */
void swap_fio_escape(char *dst, size_t len, const char *src)
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
void swap_fio_probe(struct swap_bench *b)
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
int swap_bw_open(struct swap_bench *b)
{
    const struct swap_args *a = b->a;
    struct zs_swap_opts o = {.dir = b->run_dir, .name = "zs-swap.dat", .block_size = (uint32_t)a->block_size,
                             .queue_depth = (uint32_t)a->queue_depth, .direct = true, .verify = a->verify};
    uint64_t inflight = (uint64_t)a->queue_depth * (uint64_t)a->block_size;
    char err[512];
    int rc;

    b->xfer = (size_t)swap_align_up((uint64_t)XFER_BYTES, (uint64_t)a->block_size);
    b->nbuf = (int)((inflight + b->xfer - 1) / b->xfer) + 1;
    b->nbuf = b->nbuf < 3 ? 3 : b->nbuf > MAX_BUFS ? MAX_BUFS : b->nbuf;
    if (!swap_fits_in_memory((double)b->nbuf * (double)b->xfer) || !(b->buf = swap_page_alloc((size_t)b->nbuf * b->xfer))) {
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

void swap_bw_close(struct swap_bench *b)
{
    zs_swap_close(b->sw); /* before the registered region goes; NULL is fine */
    b->sw = NULL;
    free(b->buf);
    b->buf = NULL;
}

/* fio always runs --direct=1; zeroshard only where the file system takes O_DIRECT. */
const char *swap_io_mode(const struct swap_bench *b, enum impl m)
{
    return m == IMPL_FIO || b->direct ? "direct" : "buffered";
}


/* A ratio against fio only when both sides do direct I/O. Refused outright with
 * --require-fio; otherwise fio is not run and no ratio is printed, saying why. */
int swap_bw_check_like(struct swap_bench *b)
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
int swap_bw_run(struct swap_bench *b)
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
            swap_keep_best(&b->secs[m][w], t[m][0]);
            swap_keep_best(&b->secs[m][OP_READ], t[m][1]);
        }
        printf("# rep %d (%s first): %s zeroshard %.3f", rep + 1, swap_impl_names[b->have_fio ? rep % IMPL_COUNT : 0],
               swap_op_names[w], swap_gbs(b, t[IMPL_ZS][0]));
        if (b->have_fio)
            printf(" fio %.3f", swap_gbs(b, t[IMPL_FIO][0]));
        printf(" GB/s; read zeroshard %.3f", swap_gbs(b, t[IMPL_ZS][1]));
        if (b->have_fio)
            printf(" fio %.3f", swap_gbs(b, t[IMPL_FIO][1]));
        printf(" GB/s\n");
        fflush(stdout);
    }
    return BENCH_OK;
}
