/* groups_fixture.c - test_groups' model: seven parameters in four units across three parameter groups, its
 * config per optimizer, stage and offload, and one step of it through the public API (forward, backward with
 * made-up gradients, zs_step), as every rank runs it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "groups_fixture.h"

int rank, world;
MPI_Comm run_comm;
bool same_grads;
bool deterministic;
const char *device = "cpu";
char scratch[256];

const int64_t sizes[NP] = { 37, 5, 64, 11, 90, 3, 41 };
const int32_t unit_of[NP] = { 0, 0, 0, 1, 1, 2, 3 };
const int32_t group_of[NP] = { 1, 0, 2, 2, 0, 1, 0 };

/* bf16 by round to nearest even (no NaN here), and back. */
uint16_t to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

float from_bf16(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

const char *const opt_name[] = { "AdamW", "Adam", "SGD" };
static const char *const sched_json = "{\"type\": \"WarmupLR\", \"params\": {\"warmup_min_lr\": 0.001, "
                                      "\"warmup_max_lr\": 0.01, \"warmup_num_steps\": 3, \"warmup_type\": \"linear\"}}";

/* The extra groups (group 0 is the config's), and what zs_group_set changes after SET_AFTER steps. */
zs_group_opts group_opts(enum opt o, int g)
{
    if (o == OPT_SGD)
        return g == 1 ? (zs_group_opts){ .set = ZS_GROUP_LR | ZS_GROUP_MOMENTUM, .lr = 0.05, .momentum = 0.5 }
                      : (zs_group_opts){ .set = ZS_GROUP_MOMENTUM | ZS_GROUP_NESTEROV | ZS_GROUP_DAMPENING |
                                                ZS_GROUP_WEIGHT_DECAY,
                                         .momentum = 0.8, .nesterov = 1, .dampening = 0.0, .weight_decay = 0.0 };
    return g == 1 ? (zs_group_opts){ .set = ZS_GROUP_LR | ZS_GROUP_WEIGHT_DECAY, .lr = 0.05, .weight_decay = 0.3 }
                  : (zs_group_opts){ .set = ZS_GROUP_BETAS | ZS_GROUP_EPS | ZS_GROUP_WEIGHT_DECAY, .beta1 = 0.8,
                                     .beta2 = 0.99, .eps = 1e-6, .weight_decay = 0.0 };
}

zs_group_opts group_change(void)
{
    return (zs_group_opts){ .set = ZS_GROUP_LR | ZS_GROUP_WEIGHT_DECAY, .lr = 0.007, .weight_decay = 0.05 };
}

bool in_model(enum model m, int j) { return m != MODEL_NO_FROZEN || unit_of[j] != 3; }
int nunits_of(enum model m) { return m == MODEL_NO_FROZEN ? 3 : 4; }
bool frozen_param(enum model m, int j) { return m == MODEL_FROZEN && unit_of[j] == 3; }

float init_value(int j, int64_t i) { return 0.25f + (float)((i * 7 + j * 3) % 13) / 64.0f; }

float grad_value(int r, int k, int j, int64_t i)
{
    if (same_grads)
        return (float)((i * 7 + j * 5 + k * 3) % 17 - 8) / 256.0f;
    return (float)(0.3 * sin(0.37 * (double)i + 1.3 * k + 0.71 * r + 2.1 * j));
}

void config_json(const struct run *r, char *json, size_t len)
{
    const char *params = r->misuse == MISUSE_MOMENTUM ? "\"lr\": 0.02"
                         : r->opt == OPT_SGD ? "\"lr\": 0.02, \"momentum\": 0.9, \"dampening\": 0.1, "
                                             "\"weight_decay\": 0.01"
                                           : "\"lr\": 0.02, \"betas\": [0.9, 0.999], \"eps\": 1e-8, "
                                             "\"weight_decay\": 0.1";
    bool nvme = !strncmp(r->offload, "nvme", 4), params_too = strchr(r->offload, '+') != NULL;
    char off[768] = "", dev[16];

    /* "cpu" or "nvme": the optimizer; "cpu+params" or "nvme+params": the stage-3 parameters too */
    snprintf(dev, sizeof(dev), "%.*s", (int)strcspn(r->offload, "+"), r->offload);
    if (strcmp(r->offload, "none"))
        snprintf(off, sizeof(off), ", \"offload_optimizer\": {\"device\": \"%s\"%s%s%s}%s%s%s%s%s%s", dev,
                 nvme ? ", \"nvme_path\": \"" : "", nvme ? scratch : "", nvme ? "\"" : "",
                 params_too ? ", \"offload_param\": {\"device\": \"" : "", params_too ? dev : "",
                 params_too ? "\"" : "", params_too && nvme ? ", \"nvme_path\": \"" : "",
                 params_too && nvme ? scratch : "", params_too ? (nvme ? "\"}" : "}") : "");
    snprintf(json, len, "{\"train_micro_batch_size_per_gpu\": 1, \"steps_per_print\": 0, \"optimizer\": "
             "{\"type\": \"%s\", \"params\": {%s%s}}%s%s,%s \"zero_optimization\": {\"stage\": %d, "
             "\"stage3_param_persistence_threshold\": 0, \"sub_group_size\": 50%s}, \"zeroshard\": {\"device\": "
             "\"%s\"%s}}",
             r->opt == OPT_ADAM ? "Adam" : opt_name[r->opt], params,
             r->opt == OPT_ADAM ? ", \"adam_w_mode\": false" : "",
             r->opt == OPT_ADAMW ? ", \"scheduler\": " : "", r->opt == OPT_ADAMW ? sched_json : "",
             r->bf16 ? " \"bf16\": {\"enabled\": true}," : "", r->stage, off, device,
             deterministic ? ", \"deterministic\": \"world_size_invariant\", \"micro_shard_size\": 1" : "");
}

zs_status model_open(struct model_ctx *m, const struct run *r)
{
    static float init[NP][MAXN];
    char json[1024];
    zs_init_opts io = { .config_json = json, .use_comm = 1, .comm = run_comm, .quiet = 1 };
    int32_t g;
    zs_status st;

    config_json(r, json, sizeof(json));
    if (r->separate)
        setenv("ZS_TEST_DEVICE", "separate", 1);
    st = zs_init(&m->ctx, &io);
    unsetenv("ZS_TEST_DEVICE");
    for (int gi = 1; gi <= 2 && !st; gi++) {
        zs_group_opts o = group_opts(r->opt, gi);
        st = zs_group_add(m->ctx, &o, &g);
    }
    for (int j = 0; j < NP && !st; j++) {
        char name[16];
        if (!in_model(r->model, j))
            continue;
        if (j == 0 || unit_of[j] != unit_of[j - 1]) {
            snprintf(name, sizeof(name), "u%d", unit_of[j]);
            st = zs_unit_add(m->ctx, name, &m->unit[unit_of[j]]);
        }
        snprintf(name, sizeof(name), "p%d", j);
        for (int64_t i = 0; i < sizes[j]; i++)
            init[j][i] = init_value(j, i);
        if (!st)
            st = zs_param_add(m->ctx, m->unit[unit_of[j]], name, sizes[j], init[j], &m->param[j]);
        if (!st)
            st = zs_param_group(m->ctx, m->param[j], group_of[j]);
        if (!st && (frozen_param(r->model, j) || (r->misuse == MISUSE_MIXED && j == 1)))
            st = zs_param_freeze(m->ctx, m->param[j]);
        if (!st && r->misuse == MISUSE_RANKS && rank == world - 1 && j == 4)
            st = zs_param_group(m->ctx, m->param[j], 2);
    }
    return st ? st : zs_setup(m->ctx);
}

/* One micro-batch and its step: forward, then backward writing this rank's gradients (frozen units
 * skipped). */
zs_status model_step(struct model_ctx *m, const struct run *r, int k)
{
    static float g[MAXN * 4];
    void *buf;
    zs_status st = ZS_OK;

    for (int u = 0; u < nunits_of(r->model) && !st; u++)
        if (!(st = zs_unit_fetch(m->ctx, m->unit[u], NULL)))
            st = zs_unit_release(m->ctx, m->unit[u]);
    for (int u = nunits_of(r->model) - 1; u >= 0 && !st; u--) {
        int64_t off, end = 0;
        if (r->model == MODEL_FROZEN && u == 3)
            continue;
        st = zs_unit_fetch(m->ctx, m->unit[u], NULL);
        if (!st)
            st = zs_grad_buffer(m->ctx, m->unit[u], &buf);
        memset(g, 0, sizeof(g));
        for (int j = 0; j < NP && !st; j++) {
            if (unit_of[j] != u)
                continue;
            zs_param_info(m->ctx, m->param[j], NULL, NULL, NULL, &off);
            for (int64_t i = 0; i < sizes[j]; i++)
                g[off + i] = grad_value(rank, k, j, i);
            end = off + sizes[j];
        }
        if (r->bf16) /* in place: element i's two bytes never overtake the floats still to read */
            for (int64_t i = 0; i < end; i++)
                ((uint16_t *)g)[i] = to_bf16(g[i]);
        if (!st)
            st = zs_copy_from_host(m->ctx, buf, g, (size_t)end * (r->bf16 ? 2 : sizeof(float)));
        if (!st)
            st = deterministic ? zs_grad_deposit(m->ctx, m->unit[u]) : ZS_OK;
        if (!st)
            st = zs_grad_ready(m->ctx, m->unit[u]);
        if (!st)
            st = zs_unit_release(m->ctx, m->unit[u]);
    }
    return st ? st : zs_step(m->ctx);
}

/* Every parameter's values, gathered, into out. */
zs_status model_read(struct model_ctx *m, const struct run *r, float out[NP][MAXN])
{
    zs_status st = ZS_OK;

    memset(out, 0, sizeof(float) * NP * MAXN);
    for (int j = 0; j < NP && !st; j++) {
        void *p;
        if (!in_model(r->model, j))
            continue;
        st = zs_unit_fetch(m->ctx, m->unit[unit_of[j]], NULL);
        if (!st)
            st = zs_param_data(m->ctx, m->param[j], &p);
        if (!st)
            st = zs_copy_to_host(m->ctx, out[j], p, (size_t)sizes[j] * (r->bf16 ? 2 : sizeof(float)));
        for (int64_t i = sizes[j] - 1; r->bf16 && i >= 0; i--) /* backwards: widening in place */
            out[j][i] = from_bf16(((uint16_t *)out[j])[i]);
        if (!st)
            st = zs_unit_release(m->ctx, m->unit[unit_of[j]]);
    }
    return st;
}

