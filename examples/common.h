/* common.h - what the example programs share: a strict command-line parser with --help, 16-bit
 * conversions for widening parameters, the parameter hash, and the per-rank memory lines. */
#ifndef ZS_EXAMPLES_COMMON_H
#define ZS_EXAMPLES_COMMON_H

#include <stdbool.h>
#include <stdint.h>

#include "zeroshard.h"

enum cli_kind {
    CLI_SWITCH,  /* no value: sets an int to 1 */
    CLI_STR,     /* const char * */
    CLI_INT,     /* int64_t, the whole argument must be an integer */
    CLI_U64,     /* uint64_t (decimal or 0x hex) */
    CLI_NUM,     /* double, the whole argument must be a finite number */
    CLI_TEXT,    /* const char *, free text (shown as TEXT in --help, where CLI_STR says PATH) */
};

struct cli_flag {
    const char *name;   /* "--steps" */
    enum cli_kind kind;
    void *dst;
    const char *help;   /* one line; "(default ...)" is the program's to say */
};

/* The options both examples take: the run's config, length, seed, the values for "auto", checkpoints. */
struct ex_run_opts {
    const char *config, *dump, *save_dir, *load, *init_from;
    int64_t steps, micro, save_every;
    uint64_t seed;
    double lr;
    int memory_json, quiet;
};

/* Parses the run options and the program's own flags (after them in --help), and checks the run options;
 * returns as cli_parse. */
int ex_parse(int argc, char **argv, struct ex_run_opts *run, const struct cli_flag *own, int nown,
             const char *usage);
/* --help's sentence on "auto" */
#define EX_AUTO_HELP                                                                                          \
    "Config values set to \"auto\" take the program's values: the flags below, else their defaults\n"          \
    "(micro-batch 8, lr 1e-3, betas 0.9/0.999, eps 1e-8, weight decay 0, warmup steps/10, total steps --steps,\n" \
    "clipping 1.0)."

/* The program's values for the config's "auto" keys, as Hugging Face's Trainer fills them. */
zs_auto_values ex_auto_values(const struct ex_run_opts *o);

/* 0: run; 1: --help was printed (exit 0); -1: an error line was printed naming the flag (exit 2). */
int cli_parse(int argc, char **argv, const struct cli_flag *flags, int nflags, const char *usage);

/* Prints "zeroshard: error: WHAT: <last error>" and returns a non-zero exit code for st. */
int ex_die(const char *what, zs_status st);
/* Ends the job after a failure on this rank: its flight recorder is written (with ex_die's last
 * message), then MPI_Abort, since the other ranks may be waiting in a collective. */
void ex_abort(zs_ctx *ctx, int rc);
/* With --save-dir: SIGTERM (preemption) stops the run after the step in progress. */
void ex_preempt_enable(zs_ctx *ctx, const struct ex_run_opts *o);
/* After each step: true when the ranks agreed to stop; the checkpoint is then saved to --save-dir
 * (unless this step saved already) and *rc is set on failure. */
bool ex_preempted(zs_ctx *ctx, const struct ex_run_opts *o, bool saved, int rank, int *rc);

float ex_h2f(zs_dtype dt, uint16_t h);
uint16_t ex_f2h(zs_dtype dt, float f);

/* FNV-1a over every parameter's bytes (as trained: fp32, bf16 or fp16) in registration order: equal hashes
 * mean equal bits. dump (rank 0, may be NULL) receives the parameters as fp32. Collective at stage 3. */
zs_status ex_params_hash(zs_ctx *ctx, uint64_t *hash, const char *dump, int rank);

/* Whether the engine keeps its model states on a GPU (zeroshard.device "cuda"), which these examples' host
 * code cannot read in place: then rank 0 says so, naming the key, and every rank (one config) gets true. */
bool ex_engine_on_gpu(zs_ctx *ctx, int rank);
/* rank 0 prints one {"memory": ...} JSON line per rank. Collective. */
void ex_print_memory(zs_ctx *ctx, int rank, int world);
/* Deterministic mode: the mean loss of one step from each rank's gas * per micro-shard losses (mine[m *
 * per + j]: micro-batch m, micro-shard j), added in the global micro-shard order, so its bits do not
 * depend on the world size. Collective. */
double ex_det_loss(const double *mine, int64_t gas, int64_t per, int world);

/* The library's traffic counters (zs_traffic) and the global step when training starts; ex_traffic_print,
 * after it, has rank 0 print `traffic: cross-node N bytes/step/rank intra-node M bytes/step/rank`: the bytes
 * sent over the window, summed over ranks and divided by ranks and steps (0 without a step). Collective. */
struct ex_traffic {
    uint64_t cross, intra;
    int64_t step;
};
void ex_traffic_start(zs_ctx *ctx, struct ex_traffic *t);
void ex_traffic_print(zs_ctx *ctx, const struct ex_traffic *t, int rank, int world);

#endif /* ZS_EXAMPLES_COMMON_H */
