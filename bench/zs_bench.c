/* zs_bench.c - zs-bench SUBCOMMAND [options]: the entry point of the ZeroShard benchmarks, a table of
 * subcommands, and the small helpers they share (timing, parsing, aligned buffers). */
#ifndef _GNU_SOURCE
#define _POSIX_C_SOURCE 200809L /* clock_gettime, posix_memalign, strtok_r, sysconf */
#endif
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h" /* defines: struct bench_cmd, bench_optimizer, bench_comm, bench_swap */

static const struct bench_cmd commands[] = {
    {"optimizer", bench_optimizer, "optimizer kernels per optimizer, dtype and size against a STREAM triad",
     bench_optimizer_usage},
    {"comm", bench_comm, "reduce-scatter, all-gather, all-reduce: ZeroShard's collectives against plain MPI",
     bench_comm_usage},
    {"swap", bench_swap, "NVMe swapper write/read bandwidth against fio, and the optimizer step with state on disk",
     bench_swap_usage},
    {"device", bench_device, "AdamW through the device interface (cpu or cuda) against the device's D2D copy",
     bench_device_usage},
    {"offload", bench_offload, "ZeRO-Offload's step from the device (down, CPU AdamW, up) against its copy bandwidth",
     bench_offload_usage},
    {"quant", bench_quant, "int8 block quantization (the quantized collectives' kernels) against memcpy",
     bench_quant_usage},
    {"norm", bench_norm, "the gradient norm: its fixed order, threaded or on a GPU, against the sequential sum",
     bench_norm_usage},
    {"overlap", bench_overlap, "a collective hidden behind compute: no progress, test calls, a progress thread",
     bench_overlap_usage},
};

#define NCOMMANDS ((int)(sizeof(commands) / sizeof(commands[0])))

// ---------------------------------------------------------------------------- shared helpers

double bench_now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int bench_parse_count(const char *s, int64_t *out)
{
    char *end;
    unsigned long long v;
    int shift = 0;

    if (*s < '0' || *s > '9') /* strtoull would accept "-1" and " 1" */
        return -EINVAL;
    errno = 0;
    v = strtoull(s, &end, 10);
    if (errno || end == s)
        return -EINVAL;
    if (*end == 'K' || *end == 'k')
        shift = 10;
    else if (*end == 'M' || *end == 'm')
        shift = 20;
    else if (*end == 'G' || *end == 'g')
        shift = 30;
    if (shift)
        end++;
    if (*end || v < 1 || v > (1ull << 40) >> shift)
        return -EINVAL;
    *out = (int64_t)(v << shift);
    return 0;
}

int bench_parse_int(const char *s, int max, int *out)
{
    char *end;
    long v;

    if (*s < '0' || *s > '9')
        return -EINVAL;
    errno = 0;
    v = strtol(s, &end, 10);
    if (errno || *end || v < 1 || v > max)
        return -EINVAL;
    *out = (int)v;
    return 0;
}

int bench_parse_list(void *arg, const char *v, int (*add)(void *arg, const char *item))
{
    char buf[512], *save, *tok;
    int items = 0;

    if (strlen(v) >= sizeof(buf))
        return -EINVAL;
    strcpy(buf, v);
    for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save), items++)
        if (add(arg, tok))
            return -EINVAL;
    return items ? 0 : -EINVAL;
}

int bench_parse_device(const char *s, const char **out)
{
    if (strcmp(s, "cpu") && strcmp(s, "cuda"))
        return -EINVAL;
    *out = s;
    return 0;
}

const char *const bench_dev_option_names[4] = {"--device", "--size", "--reps", "--threads"};

int bench_dev_set_option(void *arg, int which, const char *v)
{
    struct bench_dev_args *a = arg;

    switch (which) {
    case 0: return bench_parse_device(v, &a->device);
    case 1: return bench_parse_count(v, &a->n);
    case 2: return bench_parse_int(v, BENCH_DEV_MAX_REPS, &a->reps);
    default: return bench_parse_int(v, 4096, &a->threads);
    }
}

int bench_parse_double(const char *s, double *out)
{
    char *end;
    double v;

    errno = 0;
    v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v) || v < 0)
        return -EINVAL;
    *out = v;
    return 0;
}

int bench_parse_options(const char *cmd, int argc, char **argv, const char *const *names, int nnames,
                        int (*set)(void *arg, int which, const char *v), bool (*flag)(void *arg, const char *opt),
                        void *arg, bool loud)
{
    for (int i = 2; i < argc; i++) {
        const char *v = NULL, *opt = argv[i];
        int which = 0, rc = 0;

        if (!strcmp(opt, "-h") || !strcmp(opt, "--help"))
            return -1;
        if (flag && flag(arg, opt))
            continue;
        for (; which < nnames; which++)
            if ((rc = bench_opt_value(argc, argv, &i, names[which], &v)))
                break;
        if (which == nnames) {
            if (loud)
                fprintf(stderr, "zs-bench %s: unknown option '%s'\n", cmd, opt);
            return BENCH_USAGE;
        }
        if (rc < 0 || set(arg, which, v)) {
            if (loud)
                fprintf(stderr, "zs-bench %s: bad value for %s: '%s'\n", cmd, names[which], v ? v : "");
            return BENCH_USAGE;
        }
    }
    return BENCH_OK;
}

int bench_opt_value(int argc, char **argv, int *i, const char *name, const char **val)
{
    const char *a = argv[*i];
    size_t len = strlen(name);

    if (strncmp(a, name, len))
        return 0;
    if (a[len] == '=') {
        *val = a + len + 1;
        return 1;
    }
    if (a[len])
        return 0;
    if (*i + 1 >= argc)
        return -EINVAL;
    *val = argv[++*i];
    return 1;
}

void bench_cmdline(int argc, char **argv, char *buf, size_t len)
{
    size_t used = 0;

    buf[0] = '\0';
    for (int i = 0; i < argc && used < len; i++) {
        int w = snprintf(buf + used, len - used, "%s%s", i ? " " : "", argv[i]);
        if (w < 0)
            break;
        used += (size_t)w;
    }
}

void *bench_alloc(size_t bytes)
{
    void *p = NULL;

    /* Round up so a vector loop over the last line never reads past the allocation. */
    bytes = (bytes + 63) & ~(size_t)63;
    if (posix_memalign(&p, 64, bytes ? bytes : 64))
        return NULL;
    return p;
}

void bench_free(void *p)
{
    free(p);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return (x > y) - (x < y);
}

struct bench_spread bench_spread_of(double *x, int n)
{
    struct bench_spread s = {NAN, NAN, NAN};

    if (n <= 0)
        return s;
    qsort(x, (size_t)n, sizeof(x[0]), cmp_double);
    /* an even count takes the mean of the middle two, so two reps give their midpoint */
    s.median = n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
    s.min = x[0];
    s.max = x[n - 1];
    return s;
}

// ---------------------------------------------------------------------------- main

static void usage(FILE *f, const char *prog)
{
    fprintf(f, "usage: %s SUBCOMMAND [options]\n\nsubcommands:\n", prog);
    for (int i = 0; i < NCOMMANDS; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "\n");
    for (int i = 0; i < NCOMMANDS; i++)
        fprintf(f, "%s %s %s\n", prog, commands[i].name, commands[i].usage);
}

int main(int argc, char **argv)
{
    const char *prog = argc > 0 ? argv[0] : "zs-bench";

    if (argc < 2) {
        usage(stderr, prog);
        return BENCH_USAGE;
    }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(stdout, prog);
        return BENCH_OK;
    }
    for (int i = 0; i < NCOMMANDS; i++)
        if (!strcmp(argv[1], commands[i].name))
            return commands[i].run(argc, argv);
    fprintf(stderr, "%s: unknown subcommand '%s'\n", prog, argv[1]);
    usage(stderr, prog);
    return BENCH_USAGE;
}
