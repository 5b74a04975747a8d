/* ckpt_model.h - the small model the checkpoint-option tests train (test_ckpt_opts.c, test_ckpt_tags.c): four
 * parameters in three units (one kept whole at stage 3), made-up gradients that are exact in binary, and the
 * steps, fetches and state reads both tests take. Header-only, as check.h. */
#ifndef ZS_TEST_CKPT_MODEL_H
#define ZS_TEST_CKPT_MODEL_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <mpi.h>

#include "check.h"
#include "zeroshard.h"
#include "kernels/convert.h" /* defines: zs_elem_get, zs_elem_set */

#define NPARAMS 4
static int accum; /* gradient_accumulation_steps of the set-up being run */
static const char *zero_extra; /* more zero_optimization keys for open_ctx (", \"key\": value"), or NULL */
static const int64_t numel[NPARAMS] = {100, 37, 300, 50};
static const int32_t unit_of[NPARAMS] = {0, 0, 1, 2}; /* u2 (50 elements) stays whole at stage 3 */
#define NUNITS 3
#define TOTAL (100 + 37 + 300 + 50)

static int rank, world;
static char base[256];
static float reference_grad[TOTAL]; /* the reduced gradient read at step 3 of the normal mode's first set-up */
static bool on_gpu; /* argument "cuda": the engine on zeroshard.device "cuda" (a GPU, or tests/cuda_emu) */

struct setup {
    const char *name;
    int stage;
    const char *offload; /* none, cpu, nvme */
    const char *dtype;   /* fp32, bf16 */
    int accum;
    int det;             /* zeroshard.deterministic "world_size_invariant" */
};

static inline void init_values(void *arg, int32_t param, int64_t first, int64_t count, float *dst)
{
    (void)arg;
    for (int64_t i = 0; i < count; i++)
        dst[i] = (float)((param * 131 + first + i) % 97) / 128.0f - 0.375f;
}

static inline zs_status open_ctx(zs_ctx **ctx, const struct setup *s, MPI_Comm comm, int nranks, const char *extra)
{
    char json[4096], off[1200] = "", zs[200];
    zs_init_opts o = {.config_json = json, .use_comm = 1, .comm = comm, .quiet = 1};
    zs_status st;

    if (!strcmp(s->offload, "cpu"))
        snprintf(off, sizeof(off), ", \"offload_optimizer\": {\"device\": \"cpu\"}%s",
                 s->stage == 3 ? ", \"offload_param\": {\"device\": \"cpu\"}" : "");
    else if (!strcmp(s->offload, "nvme"))
        snprintf(off, sizeof(off), ", \"sub_group_size\": 100, \"offload_optimizer\": {\"device\": \"nvme\", "
                 "\"nvme_path\": \"%s/nvme\"}%s%s%s", base, s->stage == 3 ? ", \"offload_param\": {\"device\": "
                 "\"nvme\", \"nvme_path\": \"" : "", s->stage == 3 ? base : "", s->stage == 3 ? "/nvme\"}" : "");
    snprintf(zs, sizeof(zs), ", \"zeroshard\": {\"device\": \"%s\"%s}", on_gpu ? "cuda" : "cpu",
             s->det ? ", \"deterministic\": \"world_size_invariant\", \"micro_shard_size\": 1" : "");
    snprintf(json, sizeof(json), "{\"train_batch_size\": %d, \"train_micro_batch_size_per_gpu\": 1, "
             "\"gradient_accumulation_steps\": %d, \"steps_per_print\": 0, %s%s"
             "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01, \"weight_decay\": 0.01}}, "
             "\"zero_optimization\": {\"stage\": %d, \"stage3_param_persistence_threshold\": 60, "
             "\"stage3_max_reuse_distance\": 1000000, \"stage3_prefetch_bucket_size\": 1000000%s%s}%s}",
             nranks * accum, accum, !strcmp(s->dtype, "bf16") ? "\"bf16\": {\"enabled\": true}, "
                                    : !strcmp(s->dtype, "fp16") ? "\"fp16\": {\"enabled\": true}, " : "",
             extra ? extra : "", s->stage, off, zero_extra ? zero_extra : "", zs);
    st = zs_init(ctx, &o);
    for (int32_t p = 0, unit = -1; !st && p < NPARAMS; p++) { /* a unit is filled before the next is added */
        char name[16];
        int32_t id;
        if (unit != unit_of[p]) {
            snprintf(name, sizeof(name), "u%d", unit_of[p]);
            st = zs_unit_add(*ctx, name, &unit);
        }
        snprintf(name, sizeof(name), "p%d", p);
        if (!st)
            st = zs_param_add_init(*ctx, unit, name, numel[p], init_values, NULL, &id);
    }
    return st ? st : zs_setup(*ctx);
}

/* Made-up gradients of unit u's parameters, exact in binary (multiples of 1/64, small, exact in bf16 and fp16
 * too), different per rank, micro-step and element, times the loss scale (fp16), added through a host copy
 * (the engine's memory may be a device's). */
static inline zs_status unit_grads(zs_ctx *ctx, int32_t u, char *g, int64_t micro)
{
    static float host[TOTAL];
    int dt = (int)zs_param_dtype(ctx);
    size_t esz = dt == ZS_DTYPE_FP32 ? 4 : 2;
    zs_step_stats s;
    zs_status st = zs_stats(ctx, &s);

    for (int32_t p = 0; !st && p < NPARAMS; p++) {
        int64_t off;
        int32_t unit;
        zs_param_info(ctx, p, NULL, NULL, &unit, &off);
        if (unit != u)
            continue;
        st = zs_copy_to_host(ctx, host, g + off * (int64_t)esz, (size_t)numel[p] * esz);
        for (int64_t i = 0; !st && i < numel[p]; i++) {
            float v = (float)((i * 7 + p * 3 + micro * 5 + rank * 11) % 13 - 6) / 64.0f;
            zs_elem_set(host, i, dt, zs_elem_get(host, i, dt) + v * (float)s.loss_scale);
        }
        if (!st)
            st = zs_copy_from_host(ctx, g + off * (int64_t)esz, host, (size_t)numel[p] * esz);
    }
    return st;
}

/* One micro-batch: every unit fetched, its gradients added and handed over, released. */
static inline zs_status grads_in(zs_ctx *ctx, int64_t micro)
{
    void *g = NULL;
    zs_status st = ZS_OK;

    for (int32_t u = 0; !st && u < NUNITS; u++) {
        if ((st = zs_unit_fetch(ctx, u, NULL)) || (st = zs_grad_buffer(ctx, u, &g)))
            break;
        /* one micro-shard per micro-batch: deposited (deterministic mode), then handed in */
        if (!(st = unit_grads(ctx, u, g, micro)) && !(st = zs_grad_deposit(ctx, u)) && !(st = zs_grad_ready(ctx, u)))
            st = zs_unit_release(ctx, u);
    }
    return st;
}

/* One optimizer step (accum micro-batches); with grad set, the reduced gradients read before zs_step. */
static inline zs_status one_step(zs_ctx *ctx, float *grad)
{
    zs_step_stats s;
    zs_status st = ZS_OK;

    for (int m = 0; !st && m < accum; m++) {
        zs_stats(ctx, &s);
        st = grads_in(ctx, s.micro_step);
        for (int32_t p = 0, at = 0; !st && grad && m == accum - 1 && p < NPARAMS; at += (int32_t)numel[p++])
            st = zs_param_read(ctx, p, ZS_STATE_GRAD, grad + at);
        if (st == ZS_ERR_UNSUPPORTED && strstr(zs_last_error(), "zeroshard.deterministic")) {
            memcpy(grad, reference_grad, sizeof(reference_grad)); /* no reduced gradient outside zs_step */
            st = ZS_OK;
        }
        if (!st)
            st = zs_step(ctx);
    }
    return st;
}

/* Every parameter's working values as fp32, from fetches (not from zs_param_read). */
static inline zs_status fetched(zs_ctx *ctx, float *out)
{
    static float h[TOTAL];
    int dt = (int)zs_param_dtype(ctx);
    zs_status st = ZS_OK;

    for (int32_t p = 0, at = 0; !st && p < NPARAMS; at += (int32_t)numel[p++]) {
        void *d;
        st = zs_unit_fetch(ctx, unit_of[p], NULL);
        if (!st)
            st = zs_param_data(ctx, p, &d);
        if (!st)
            st = zs_copy_to_host(ctx, h, d, (size_t)numel[p] * (dt == ZS_DTYPE_FP32 ? 4 : 2));
        for (int64_t i = 0; !st && i < numel[p]; i++)
            out[at + i] = zs_elem_get(h, i, dt);
        if (!st)
            st = zs_unit_release(ctx, unit_of[p]);
    }
    return st;
}

static inline zs_status read_all(zs_ctx *ctx, enum zs_state which, float *out)
{
    zs_status st = ZS_OK;

    for (int32_t p = 0, at = 0; !st && p < NPARAMS; at += (int32_t)numel[p++])
        st = zs_param_read(ctx, p, which, out + at);
    return st;
}

/* Everything a set-up's run leaves for the cross-stage comparison. */
static inline bool same(const float *a, const float *b, int64_t n) { return !memcmp(a, b, (size_t)n * sizeof(float)); }

/* MPI and a scratch directory shared by the ranks (with an nvme/ folder for the swap files). */
static inline void model_begin(int *argc, char ***argv, const char *what)
{
    char dir[300];

    MPI_Init(argc, argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (rank == 0) {
        snprintf(base, sizeof(base), "/tmp/zs-%s-XXXXXX", what);
        if (!mkdtemp(base))
            base[0] = '\0';
    }
    MPI_Bcast(base, sizeof(base), MPI_CHAR, 0, MPI_COMM_WORLD);
    snprintf(dir, sizeof(dir), "%s/nvme", base);
    if (rank == 0)
        mkdir(dir, 0700);
    MPI_Barrier(MPI_COMM_WORLD);
}

/* Removes the scratch directory; the verdict is any rank's failure. */
static inline int model_end(const char *name)
{
    int failed = zs_test_fail, any = 0;
    char cmd[600];

    MPI_Barrier(MPI_COMM_WORLD);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", base);
    if (rank == 0 && base[0] && system(cmd))
        fprintf(stderr, "could not remove %s\n", base);
    MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0)
        zs_test_summary(name);
    MPI_Finalize();
    return any ? 1 : 0;
}

#endif /* ZS_TEST_CKPT_MODEL_H */
