/* bench.h - what the zs-bench subcommands share: the command table entry, timing, size parsing and
 * aligned buffers. Each subcommand lives in its own bench_<name>.c. */
#ifndef ZS_BENCH_H
#define ZS_BENCH_H

#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>

/* Exit statuses: 0 success, 1 a run that failed, 2 a usage error. */
enum { BENCH_OK = 0, BENCH_FAIL = 1, BENCH_USAGE = 2 };

/* A subcommand gets the whole command line: argv[0] is the program, argv[1] the subcommand name. */
struct bench_cmd {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *help;  /* one line for the usage listing */
    const char *usage; /* the option synopsis */
};

int bench_optimizer(int argc, char **argv);
extern const char bench_optimizer_usage[];
/* Run under mpirun; calls MPI_Init and MPI_Finalize itself. */
int bench_comm(int argc, char **argv);
extern const char bench_comm_usage[];
/* Writes, reads and removes files under --dir (default: the current directory); runs fio when on PATH. */
int bench_swap(int argc, char **argv);
extern const char bench_swap_usage[];
/* Run under mpirun; initialises MPI with MPI_THREAD_SERIALIZED (the progress thread). */
int bench_overlap(int argc, char **argv);
extern const char bench_overlap_usage[];

/* The optimizer step through the device interface against the device's own copy bandwidth. */
int bench_device(int argc, char **argv);
extern const char bench_device_usage[];

/* ZeRO-Offload's step from the device against the device's host<->device copy of the same bytes. Calls
 * MPI_Init and MPI_Finalize itself (one rank). */
int bench_offload(int argc, char **argv);
extern const char bench_offload_usage[];

/* The gradient norm's fixed order against the sequential sum it replaced, on the CPU or a GPU. */
int bench_norm(int argc, char **argv);
extern const char bench_norm_usage[];

/* kernels/quant.h's block quantization against memcpy of the same bytes, and its scalar reference. */
int bench_quant(int argc, char **argv);
extern const char bench_quant_usage[];

/* Monotonic seconds. */
double bench_now(void);

/* "4096", "1K", "4M", "2G" (powers of two); 0 or -EINVAL. The value must be at least 1. */
int bench_parse_count(const char *s, int64_t *out);
/* A positive integer no larger than max; 0 or -EINVAL. */
int bench_parse_int(const char *s, int max, int *out);
/* "cpu" or "cuda" (--device); 0 or -EINVAL. */
int bench_parse_device(const char *s, const char **out);
/* A finite number >= 0; 0 or -EINVAL. */
int bench_parse_double(const char *s, double *out);
/* Splits a comma-separated list and calls add(arg, item) for each item; 0, or -EINVAL when the list is
 * empty, too long, or add refuses an item. */
int bench_parse_list(void *arg, const char *v, int (*add)(void *arg, const char *item));

/* For "--name V" and "--name=V": when argv[*i] is option name, sets *val to its value, advances *i past
 * it and returns 1; 0 when argv[*i] is another option; -EINVAL when the value is missing. */
int bench_opt_value(int argc, char **argv, int *i, const char *name, const char **val);
/* Walks argv[2..] for one subcommand: "--name value" options from names go to set(arg, index, value),
 * value-less flags to flag(arg, option) (may be NULL; returns true when it took the option). Returns
 * BENCH_OK, BENCH_USAGE after a one-line complaint (when loud), or -1 for -h/--help. */
int bench_parse_options(const char *cmd, int argc, char **argv, const char *const *names, int nnames,
                        int (*set)(void *arg, int which, const char *v), bool (*flag)(void *arg, const char *opt),
                        void *arg, bool loud);

/* The options of the benchmarks that run on one device (device, norm): --device cpu|cuda, --size N, --reps R
 * (at most BENCH_DEV_MAX_REPS), --threads T (the CPU's pool); for bench_parse_options. */
#define BENCH_DEV_MAX_REPS 1000
struct bench_dev_args {
    const char *device;
    int64_t n;
    int reps, threads;
};
extern const char *const bench_dev_option_names[4];
int bench_dev_set_option(void *arg, int which, const char *v);

/* The command line as one string for the header line; truncated to fit. */
void bench_cmdline(int argc, char **argv, char *buf, size_t len);

/* 64-byte aligned (cache line, AVX-512 vector); NULL on failure. Free with bench_free. */
void *bench_alloc(size_t bytes);
void bench_free(void *p);

/* Median and range of n samples, reported together wherever one figure is compared with another:
 * the median resists a noisy neighbour, the range shows how much the machine moved. Sorts x in place. */
struct bench_spread {
    double median, min, max;
};
struct bench_spread bench_spread_of(double *x, int n);

#endif /* ZS_BENCH_H */
