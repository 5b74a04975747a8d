/* common.c - the example programs' shared parts: strict command-line parsing with --help, 16-bit
 * conversions, the parameter hash and the memory lines. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <mpi.h>

#include "common.h"

/* ---------------------------------------------------------------- command line */

static void cli_help(const struct cli_flag *flags, int nflags, const char *usage)
{
    static const char *const arg[] = {"", " PATH", " N", " N", " X", " TEXT"};

    printf("%s\n\nOptions:\n", usage);
    for (int i = 0; i < nflags; i++) {
        char left[40];
        snprintf(left, sizeof(left), "%s%s", flags[i].name, arg[flags[i].kind]);
        printf("  %-22s %s\n", left, flags[i].help);
    }
    printf("  %-22s %s\n", "--help", "print this and exit");
}

static int cli_value(const struct cli_flag *f, const char *v)
{
    char *end = NULL;

    errno = 0;
    switch (f->kind) {
    case CLI_STR:
    case CLI_TEXT:
        *(const char **)f->dst = v;
        return 0;
    case CLI_INT:
        *(int64_t *)f->dst = strtoll(v, &end, 10);
        break;
    case CLI_U64:
        if (v[0] == '-')
            break;
        *(uint64_t *)f->dst = strtoull(v, &end, 0);
        break;
    case CLI_NUM:
        *(double *)f->dst = strtod(v, &end);
        if (end && !*end && !isfinite(*(double *)f->dst))
            end = NULL;
        break;
    case CLI_SWITCH:
        break;
    }
    if (!end || end == v || *end || errno) {
        fprintf(stderr, "zeroshard: error: %s: expected %s, got '%s'\n", f->name,
                f->kind == CLI_NUM ? "a number" : f->kind == CLI_U64 ? "a non-negative integer" : "an integer", v);
        return -1;
    }
    return 0;
}

int cli_parse(int argc, char **argv, const struct cli_flag *flags, int nflags, const char *usage)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const struct cli_flag *f = NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            cli_help(flags, nflags, usage);
            return 1;
        }
        for (int k = 0; k < nflags && !f; k++)
            if (!strcmp(a, flags[k].name))
                f = &flags[k];
        if (!f) {
            fprintf(stderr, "zeroshard: error: unknown option %s (--help lists them)\n", a);
            return -1;
        }
        if (f->kind == CLI_SWITCH) {
            *(int *)f->dst = 1;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "zeroshard: error: %s needs a value\n", a);
            return -1;
        }
        if (cli_value(f, argv[++i]))
            return -1;
    }
    return 0;
}

#define EX_RUN_FLAGS 12
#define EX_MAX_FLAGS 64

static void run_flags(struct ex_run_opts *o, struct cli_flag *flags)
{
    const struct cli_flag run[EX_RUN_FLAGS] = {
        {"--config", CLI_STR, &o->config, "DeepSpeed-style JSON config (required)"},
        {"--steps", CLI_INT, &o->steps, "train until this optimizer step (a resumed run carries on)"},
        {"--seed", CLI_U64, &o->seed, "initial weights and data order"},
        {"--micro-batch", CLI_INT, &o->micro, "per rank per micro-step, for \"auto\" (default 8)"},
        {"--lr", CLI_NUM, &o->lr, "learning rate, for \"auto\""},
        {"--save-dir", CLI_STR, &o->save_dir, "checkpoint directory (saved at the end, and every --save-every)"},
        {"--save-every", CLI_INT, &o->save_every, "checkpoint every N steps (needs --save-dir)"},
        {"--load", CLI_STR, &o->load, "resume from a checkpoint directory"},
        {"--init-from", CLI_STR, &o->init_from, "initial weights from a safetensors file"},
        {"--dump", CLI_STR, &o->dump, "write the final parameters as fp32 to FILE"},
        {"--memory-json", CLI_SWITCH, &o->memory_json, "print each rank's memory as a JSON line at start"},
        {"--quiet", CLI_SWITCH, &o->quiet, "no start-up lines from the runtime"},
    };
    memcpy(flags, run, sizeof(run));
}

static int run_check(const struct ex_run_opts *o)
{
    if (!o->config) {
        fprintf(stderr, "zeroshard: error: --config FILE is required (examples/configs/ has one per stage)\n");
        return -1;
    }
    if (o->save_every < 0 || (o->save_every && !o->save_dir)) {
        fprintf(stderr, "zeroshard: error: --save-every K needs K >= 0 and --save-dir DIR\n");
        return -1;
    }
    if (o->steps < 0 || o->micro < 1 || o->lr <= 0) {
        fprintf(stderr, "zeroshard: error: --steps must be >= 0, --micro-batch and --lr positive\n");
        return -1;
    }
    return 0;
}

int ex_parse(int argc, char **argv, struct ex_run_opts *run, const struct cli_flag *own, int nown,
             const char *usage)
{
    struct cli_flag flags[EX_MAX_FLAGS];
    int rc;

    if (nown > EX_MAX_FLAGS - EX_RUN_FLAGS)
        return -1;
    run_flags(run, flags);
    memcpy(flags + EX_RUN_FLAGS, own, (size_t)nown * sizeof(*own));
    rc = cli_parse(argc, argv, flags, EX_RUN_FLAGS + nown, usage);
    return rc ? rc : run_check(run);
}

/* Gradient accumulation is left to the config (derived from the batch sizes, else 1); warmup is a tenth
 * of the run, since DeepSpeed's default (1000 steps) would outlast a short one. */
zs_auto_values ex_auto_values(const struct ex_run_opts *o)
{
    return (zs_auto_values){.micro_batch_size = o->micro, .lr = o->lr,
                            .total_num_steps = o->steps > 0 ? o->steps : 1,
                            .warmup_num_steps = o->steps / 10 > 0 ? o->steps / 10 : 1, .gradient_clipping = 1.0,
                            .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8};
}

static char last_failure[1200];

int ex_die(const char *what, zs_status st)
{
    snprintf(last_failure, sizeof(last_failure), "%s: %s", what, zs_last_error());
    fprintf(stderr, "zeroshard: error: %s\n", last_failure);
    return st ? (int)st : 1;
}

/* A failure the ranks share (a collective that carried one rank's error) reaches every rank within
 * milliseconds, and each prints its own line naming the cause; an abort at once from the first would kill
 * the others before they print (on a loaded machine it did). So a failing rank waits, in a barrier that
 * only failing ranks enter, until every rank has failed too or EX_ABORT_GRACE_S has passed: a rank still
 * blocked elsewhere, or cut off (a node whose link went down), is then ended by the abort. Short, since a
 * node's loss is reported when the abort comes (tests/netns4.sh wants every rank gone within 5 s). */
#define EX_ABORT_GRACE_S 2

void ex_abort(zs_ctx *ctx, int rc)
{
    MPI_Request rq;
    int done = 0;

    if (ctx)
        zs_flight_dump(ctx, last_failure[0] ? last_failure : "the program failed");
    fflush(NULL);
    if (MPI_Ibarrier(MPI_COMM_WORLD, &rq) == MPI_SUCCESS) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        for (int i = 0; i < EX_ABORT_GRACE_S * 100 && !done; i++) {
            if (MPI_Test(&rq, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS)
                break;
            if (!done)
                nanosleep(&ts, NULL);
        }
    }
    MPI_Abort(MPI_COMM_WORLD, rc ? rc : 1);
}

void ex_preempt_enable(zs_ctx *ctx, const struct ex_run_opts *o)
{
    if (o->save_dir && zs_preempt_enable(ctx))
        fprintf(stderr, "zeroshard: warning: %s\n", zs_last_error());
}

bool ex_preempted(zs_ctx *ctx, const struct ex_run_opts *o, bool saved, int rank, int *rc)
{
    zs_step_stats s;
    zs_status st;
    int stop = 0;

    if (!o->save_dir)
        return false;
    if ((st = zs_preempt_requested(ctx, &stop))) {
        *rc = ex_die("preemption vote", st);
        return true;
    }
    if (!stop)
        return false;
    if (!saved && (st = zs_checkpoint_save(ctx, o->save_dir))) {
        *rc = ex_die("save", st);
        return true;
    }
    zs_stats(ctx, &s);
    if (rank == 0)
        printf("preempted: stopped after step %lld, checkpoint in %s (resume with --load %s)\n",
               (long long)s.global_step, o->save_dir, o->save_dir);
    fflush(stdout);
    return true;
}

/* ---------------------------------------------------------------- 16-bit values */

float ex_h2f(zs_dtype dt, uint16_t h)
{
    uint32_t u;
    float f;

    if (dt == ZS_DTYPE_BF16) {
        u = (uint32_t)h << 16;
        memcpy(&f, &u, 4);
        return f;
    }
    /* fp16: sign, 5-bit exponent, 10-bit mantissa */
    uint32_t sign = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 31, mant = h & 1023;
    if (e == 0)
        f = ldexpf((float)mant, -24);
    else if (e == 31)
        f = mant ? NAN : INFINITY;
    else
        f = ldexpf((float)(mant | 1024), (int)e - 25);
    memcpy(&u, &f, 4);
    u |= sign;
    memcpy(&f, &u, 4);
    return f;
}

/* Round to nearest even: bf16 by integer rounding of the upper half; fp16 through the float range. */
uint16_t ex_f2h(zs_dtype dt, float f)
{
    uint32_t u;

    memcpy(&u, &f, 4);
    if (dt == ZS_DTYPE_BF16) {
        if ((u & 0x7fffffff) > 0x7f800000)
            return (uint16_t)((u >> 16) | 0x40);
        return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
    }
    uint32_t sign = (u >> 16) & 0x8000;
    float a = fabsf(f);
    if (isnan(f))
        return (uint16_t)(sign | 0x7e00);
    if (a >= 65520.0f)
        return (uint16_t)(sign | 0x7c00);
    if (a < 0x1p-14f) /* subnormal: a multiple of 2^-24, rounded to nearest even by the conversion */
        return (uint16_t)(sign | (uint32_t)lrintf(a * 0x1p24f));
    int e;
    float m = frexpf(a, &e);                          /* a = m * 2^e, m in [0.5, 1) */
    uint32_t q = (uint32_t)lrintf(ldexpf(m, 11));     /* 11 significant bits, nearest even */
    if (q == 2048) {
        q = 1024;
        e++;
    }
    if (e + 14 >= 31)
        return (uint16_t)(sign | 0x7c00);
    return (uint16_t)(sign | ((uint32_t)(e + 14) << 10) | (q & 1023));
}

/* ---------------------------------------------------------------- hash and memory */

zs_status ex_params_hash(zs_ctx *ctx, uint64_t *hash, const char *dump, int rank)
{
    zs_dtype dt = zs_param_dtype(ctx);
    size_t esz = dt == ZS_DTYPE_FP32 ? 4 : 2;

    uint64_t h = 0xcbf29ce484222325ULL;
    FILE *f = NULL;
    zs_status st = ZS_OK;
    int32_t held = -1; /* the unit fetched */

    if (dump && rank == 0 && !(f = fopen(dump, "wb"))) {
        fprintf(stderr, "zeroshard: error: %s: %s\n", dump, strerror(errno));
        return ZS_ERR_IO;
    }
    /* a unit is fetched once for all its parameters: at stage 3 with offload_param nvme each fetch reads
     * the shard from disk and gathers the unit, so fetching per parameter read a GPT block 12 times */
    for (int32_t p = 0; p < zs_param_count(ctx); p++) {
        int32_t unit;
        int64_t n;
        const unsigned char *d;
        if ((st = zs_param_info(ctx, p, NULL, &n, &unit, NULL)))
            break;
        if (unit != held) {
            if (held >= 0 && (st = zs_unit_release(ctx, held)))
                break;
            held = -1;
            if ((st = zs_unit_fetch(ctx, unit, NULL)))
                break;
            held = unit;
        }
        if ((st = zs_param_data(ctx, p, (void **)&d)))
            break;
        for (int64_t i = 0; i < n * (int64_t)esz; i++) {
            h ^= d[i];
            h *= 0x100000001b3ULL;
        }
        for (int64_t i = 0; f && i < n; i++) {
            float v = esz == 4 ? ((const float *)d)[i] : ex_h2f(dt, ((const uint16_t *)d)[i]);
            fwrite(&v, 4, 1, f);
        }
    }
    if (held >= 0) {
        zs_status rs = zs_unit_release(ctx, held);
        st = st ? st : rs;
    }
    if (f)
        fclose(f);
    *hash = h;
    return st;
}

bool ex_engine_on_gpu(zs_ctx *ctx, int rank)
{
    void *stream;

    if (zs_cuda_stream(ctx, &stream) != ZS_OK)
        return false;
    if (rank == 0)
        fprintf(stderr, "zeroshard: error: zeroshard.device: \"cuda\": this example reads and writes the engine's "
                "buffers on the host (its --device cuda copies them up); keep zeroshard.device \"cpu\"\n");
    return true;
}

void ex_print_memory(zs_ctx *ctx, int rank, int world)
{
    zs_memory_report mine, *all = NULL;

    zs_memory(ctx, &mine);
    if (rank == 0)
        all = calloc((size_t)world, sizeof(*all));
    MPI_Gather(&mine, sizeof(mine), MPI_BYTE, all, sizeof(mine), MPI_BYTE, 0, MPI_COMM_WORLD);
    for (int r = 0; rank == 0 && r < world; r++)
        printf("{\"memory\": {\"rank\": %d, \"stage\": %d, \"world\": %d, \"params\": %llu, \"grads\": %llu, "
               "\"optimizer\": %llu, \"buffers\": %llu, \"formula\": %llu, \"numel\": %llu, \"host\": %llu, "
               "\"nvme\": %llu}}\n",
               all[r].rank, all[r].stage, all[r].world, (unsigned long long)all[r].params,
               (unsigned long long)all[r].grads, (unsigned long long)all[r].optimizer,
               (unsigned long long)all[r].buffers, (unsigned long long)all[r].formula,
               (unsigned long long)all[r].numel, (unsigned long long)all[r].host, (unsigned long long)all[r].nvme);
    free(all);
}


double ex_det_loss(const double *mine, int64_t gas, int64_t per, int world)
{
    int64_t n = gas * per;
    double *all = malloc((size_t)(n * world) * sizeof(double)), sum = 0.0;

    if (!all)
        return NAN;
    MPI_Allgather(mine, (int)n, MPI_DOUBLE, all, (int)n, MPI_DOUBLE, MPI_COMM_WORLD);
    /* micro-batch m of rank r holds global micro-shards (m * world + r) * per ... + per - 1 */
    for (int64_t m = 0; m < gas; m++)
        for (int r = 0; r < world; r++)
            for (int64_t j = 0; j < per; j++)
                sum += all[r * n + m * per + j];
    free(all);
    return sum / (double)(n * world);
}

void ex_traffic_start(zs_ctx *ctx, struct ex_traffic *t)
{
    zs_step_stats s;

    zs_traffic(ctx, &t->cross, &t->intra);
    zs_stats(ctx, &s);
    t->step = s.global_step;
}

void ex_traffic_print(zs_ctx *ctx, const struct ex_traffic *t, int rank, int world)
{
    uint64_t now[2], mine[2], sum[2] = {0, 0};
    zs_step_stats s;

    zs_traffic(ctx, &now[0], &now[1]);
    zs_stats(ctx, &s);
    mine[0] = now[0] - t->cross;
    mine[1] = now[1] - t->intra;
    MPI_Reduce(mine, sum, 2, MPI_UINT64_T, MPI_SUM, 0, MPI_COMM_WORLD);
    double per = (double)(s.global_step > t->step ? s.global_step - t->step : 0) * (double)world;
    if (rank == 0)
        printf("traffic: cross-node %.0f bytes/step/rank intra-node %.0f bytes/step/rank\n",
               per > 0 ? (double)sum[0] / per : 0.0, per > 0 ? (double)sum[1] / per : 0.0);
    fflush(stdout);
}
