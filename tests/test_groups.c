/* test_groups.c - parameter groups and frozen parameters through the public API: every stage and offload
 * gives the same bits, equal to torch.optim's per-group formulas recomputed here in double; a frozen unit
 * never moves and leaves the others as if it did not exist; misuse is refused by name; a checkpoint keeps
 * the groups across a change of world size. Run under mpirun with 1-4 ranks; the ranks' gradients differ. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <mpi.h>

#include "check.h"
#include "zeroshard.h"

static int rank, world;
static char scratch[256]; /* a directory for the NVMe and checkpoint cases, shared by the ranks */

enum { NP = 7, MAXN = 96, STEPS = 4, SET_AFTER = 2 };
/* Groups change inside units (so inside a rank's shard), at unit ends and across alignment gaps. Unit 3 is
 * frozen in the frozen cases (unit_of -1: left out of the model). */
static const int64_t sizes[NP] = { 37, 5, 64, 11, 90, 3, 41 };
static const int32_t unit_of[NP] = { 0, 0, 0, 1, 1, 2, 3 };
static const int32_t group_of[NP] = { 1, 0, 2, 2, 0, 1, 0 };

enum opt { OPT_ADAMW, OPT_ADAM, OPT_SGD };
enum model { MODEL_ALL, MODEL_FROZEN, MODEL_NO_FROZEN };

/* What a misuse case breaks before zs_setup (MISUSE_NONE: nothing). */
enum misuse { MISUSE_NONE, MISUSE_MIXED, MISUSE_RANKS, MISUSE_MOMENTUM };

struct run {
    enum opt opt;
    enum model model;
    int stage;
    const char *offload; /* "none", "cpu", "nvme" */
    bool separate;       /* the separate test device: the offloaded step from a device */
    enum misuse misuse;
};

static const char *opt_name[] = { "AdamW", "Adam", "SGD" };
static const char *const sched_json = "{\"type\": \"WarmupLR\", \"params\": {\"warmup_min_lr\": 0.001, "
                                      "\"warmup_max_lr\": 0.01, \"warmup_num_steps\": 3, \"warmup_type\": \"linear\"}}";
#define CFG_LR 0.02 /* the config's lr the schedule's ratio divides by */

/* The extra groups (group 0 is the config's), and what zs_group_set changes after SET_AFTER steps. */
static zs_group_opts group_opts(enum opt o, int g)
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

static zs_group_opts group_change(void)
{
    return (zs_group_opts){ .set = ZS_GROUP_LR | ZS_GROUP_WEIGHT_DECAY, .lr = 0.007, .weight_decay = 0.05 };
}

static bool in_model(enum model m, int j) { return m != MODEL_NO_FROZEN || unit_of[j] != 3; }
static int nunits_of(enum model m) { return m == MODEL_NO_FROZEN ? 3 : 4; }
static bool frozen_param(enum model m, int j) { return m == MODEL_FROZEN && unit_of[j] == 3; }

static float init_value(int j, int64_t i) { return 0.25f + (float)((i * 7 + j * 3) % 13) / 64.0f; }

static float grad_value(int r, int k, int j, int64_t i)
{
    return (float)(0.3 * sin(0.37 * (double)i + 1.3 * k + 0.71 * r + 2.1 * j));
}

static void config_json(const struct run *r, char *json, size_t len)
{
    const char *params = r->misuse == MISUSE_MOMENTUM ? "\"lr\": 0.02"
                         : r->opt == OPT_SGD ? "\"lr\": 0.02, \"momentum\": 0.9, \"dampening\": 0.1, "
                                             "\"weight_decay\": 0.01"
                                           : "\"lr\": 0.02, \"betas\": [0.9, 0.999], \"eps\": 1e-8, "
                                             "\"weight_decay\": 0.1";
    char off[512] = "";

    if (strcmp(r->offload, "none"))
        snprintf(off, sizeof(off), ", \"offload_optimizer\": {\"device\": \"%s\"%s%s%s}", r->offload,
                 strcmp(r->offload, "nvme") ? "" : ", \"nvme_path\": \"", strcmp(r->offload, "nvme") ? "" : scratch,
                 strcmp(r->offload, "nvme") ? "" : "\"");
    snprintf(json, len, "{\"train_micro_batch_size_per_gpu\": 1, \"steps_per_print\": 0, \"optimizer\": "
             "{\"type\": \"%s\", \"params\": {%s%s}}%s%s, \"zero_optimization\": {\"stage\": %d, "
             "\"stage3_param_persistence_threshold\": 0, \"sub_group_size\": 50%s}}",
             r->opt == OPT_ADAM ? "Adam" : opt_name[r->opt], params, r->opt == OPT_ADAM ? ", \"adam_w_mode\": false" : "",
             r->opt == OPT_ADAMW ? ", \"scheduler\": " : "", r->opt == OPT_ADAMW ? sched_json : "", r->stage, off);
}

struct model_ctx {
    zs_ctx *ctx;
    int32_t unit[4], param[NP];
};

static zs_status model_open(struct model_ctx *m, const struct run *r)
{
    static float init[NP][MAXN];
    char json[1024];
    zs_init_opts io = { .config_json = json, .use_comm = 1, .comm = MPI_COMM_WORLD, .quiet = 1 };
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
static zs_status model_step(struct model_ctx *m, const struct run *r, int k)
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
        if (!st)
            st = zs_copy_from_host(m->ctx, buf, g, (size_t)end * sizeof(float));
        if (!st)
            st = zs_grad_ready(m->ctx, m->unit[u]);
        if (!st)
            st = zs_unit_release(m->ctx, m->unit[u]);
    }
    return st ? st : zs_step(m->ctx);
}

/* Every parameter's values, gathered, into out. */
static zs_status model_read(struct model_ctx *m, const struct run *r, float out[NP][MAXN])
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
            st = zs_copy_to_host(m->ctx, out[j], p, (size_t)sizes[j] * sizeof(float));
        if (!st)
            st = zs_unit_release(m->ctx, m->unit[unit_of[j]]);
    }
    return st;
}

/* The whole run: STEPS steps, zs_group_set after SET_AFTER of them; the values after, and group 1's lr as
 * zs_group_get reports it. */
static bool run_model(const struct run *r, float out[NP][MAXN], double *lr1, zs_memory_report *mem)
{
    struct model_ctx m;
    zs_group_opts got = { 0 };
    zs_status st = model_open(&m, r);

    if (!st && mem)
        st = zs_memory(m.ctx, mem);
    for (int k = 1; k <= STEPS && !st; k++) {
        st = model_step(&m, r, k);
        if (!st && k == SET_AFTER) {
            zs_group_opts c = group_change();
            st = zs_group_set(m.ctx, 1, &c);
        }
    }
    if (!st)
        st = model_read(&m, r, out);
    if (!st)
        st = zs_group_get(m.ctx, 1, &got);
    *lr1 = got.lr;
    if (st)
        CHECK(0, "%s stage %d offload %s%s: %s", opt_name[r->opt], r->stage, r->offload,
              r->separate ? " (separate device)" : "", zs_last_error());
    zs_finalize(m.ctx);
    return !st;
}

/* ---------------------------------------------------------------- the reference */

struct hyper {
    double lr, wd, b1, b2, eps, mom, damp;
    bool nesterov;
    bool lr_set;
};

static struct hyper group_hyper(enum opt o, int g, int step)
{
    struct hyper h = o == OPT_SGD ? (struct hyper){ .lr = CFG_LR, .wd = 0.01, .mom = 0.9, .damp = 0.1 }
                                  : (struct hyper){ .lr = CFG_LR, .wd = 0.1, .b1 = 0.9, .b2 = 0.999, .eps = 1e-8 };
    zs_group_opts v = g ? group_opts(o, g) : (zs_group_opts){ 0 };

    if (v.set & ZS_GROUP_LR)
        h.lr = v.lr, h.lr_set = true;
    if (v.set & ZS_GROUP_WEIGHT_DECAY)
        h.wd = v.weight_decay;
    if (v.set & ZS_GROUP_BETAS)
        h.b1 = v.beta1, h.b2 = v.beta2;
    if (v.set & ZS_GROUP_EPS)
        h.eps = v.eps;
    if (v.set & ZS_GROUP_MOMENTUM)
        h.mom = v.momentum;
    if (v.set & ZS_GROUP_DAMPENING)
        h.damp = v.dampening;
    if (v.set & ZS_GROUP_NESTEROV)
        h.nesterov = v.nesterov;
    if (g == 1 && step > SET_AFTER) {
        zs_group_opts c = group_change();
        h.lr = c.lr, h.wd = c.weight_decay, h.lr_set = true;
    }
    return h;
}

/* DeepSpeed's WarmupLR (linear): step t runs at iteration t - 2. */
static double sched_lr(int64_t t)
{
    int64_t it = t - 2;
    return it < 0 ? 0.001 : 0.001 + 0.009 * (it >= 3 ? 1.0 : (double)it / 3.0);
}

static double group_lr(enum opt o, const struct hyper *h, int64_t t)
{
    if (o != OPT_ADAMW)
        return h->lr;
    return h->lr_set ? h->lr * (sched_lr(t) / CFG_LR) : sched_lr(t);
}

/* torch.optim's Adam, AdamW and SGD, group by group, on the ranks' mean gradient. */
static void reference(enum opt o, enum model model, double p[NP][MAXN], double *lr1)
{
    static double m[NP][MAXN], v[NP][MAXN];

    memset(m, 0, sizeof(m));
    memset(v, 0, sizeof(v));
    for (int j = 0; j < NP; j++)
        for (int64_t i = 0; i < sizes[j]; i++)
            p[j][i] = init_value(j, i);
    struct hyper h1 = group_hyper(o, 1, STEPS);
    *lr1 = group_lr(o, &h1, STEPS);
    for (int t = 1; t <= STEPS; t++)
        for (int j = 0; j < NP; j++) {
            struct hyper h = group_hyper(o, group_of[j], t);
            double lr = group_lr(o, &h, t), bc1 = 1.0 - pow(h.b1, t), bc2 = 1.0 - pow(h.b2, t);
            if (!in_model(model, j) || frozen_param(model, j))
                continue;
            for (int64_t i = 0; i < sizes[j]; i++) {
                double g = 0.0, *pi = &p[j][i], *mi = &m[j][i], *vi = &v[j][i];
                for (int r = 0; r < world; r++)
                    g += grad_value(r, t, j, i);
                g /= world;
                if (o == OPT_SGD) {
                    double d = g + h.wd * *pi;
                    if (h.mom != 0.0) {
                        *mi = t == 1 ? d : h.mom * *mi + (1.0 - h.damp) * d;
                        d = h.nesterov ? d + h.mom * *mi : *mi;
                    }
                    *pi -= lr * d;
                    continue;
                }
                if (o == OPT_ADAMW)
                    *pi *= 1.0 - lr * h.wd;
                else
                    g += h.wd * *pi;
                *mi = h.b1 * *mi + (1.0 - h.b1) * g;
                *vi = h.b2 * *vi + (1.0 - h.b2) * g * g;
                *pi -= lr / bc1 * *mi / (sqrt(*vi) / sqrt(bc2) + h.eps);
            }
        }
}

/* ---------------------------------------------------------------- (a) groups across stages and offloads */

static bool nvme_works = true;

static void check_groups(enum opt o)
{
    static const struct run runs[] = {
        { 0, 0, 0, "none", false, 0 }, { 0, 0, 1, "none", false, 0 }, { 0, 0, 1, "cpu", false, 0 },
        { 0, 0, 2, "none", false, 0 }, { 0, 0, 2, "cpu", false, 0 },  { 0, 0, 3, "none", false, 0 },
        { 0, 0, 3, "cpu", false, 0 },  { 0, 0, 2, "cpu", true, 0 },   { 0, 0, 3, "nvme", false, 0 },
    };
    static float first[NP][MAXN], got[NP][MAXN];
    static double ref[NP][MAXN];
    double lr1 = 0.0, ref_lr1 = 0.0, worst = 0.0;
    char name[96];

    reference(o, MODEL_ALL, ref, &ref_lr1);
    for (size_t c = 0; c < sizeof(runs) / sizeof(runs[0]); c++) {
        struct run r = runs[c];
        r.opt = o;
        r.model = MODEL_ALL;
        if (!strcmp(r.offload, "nvme") && !nvme_works)
            continue;
        snprintf(name, sizeof(name), "groups %s stage %d offload %s%s", opt_name[o], r.stage, r.offload,
                 r.separate ? " separate device" : "");
        if (!run_model(&r, c ? got : first, &lr1, NULL)) {
            zs_test_report(name, "run failed");
            continue;
        }
        if (c && memcmp(got, first, sizeof(got))) {
            zs_test_report(name, "bits differ from stage 0");
            continue;
        }
        zs_test_report(name, NULL);
    }
    for (int j = 0; j < NP; j++)
        for (int64_t i = 0; i < sizes[j]; i++) {
            double d = fabs((double)first[j][i] - ref[j][i]) / (1e-6 + 1e-4 * fabs(ref[j][i]));
            worst = d > worst ? d : worst;
        }
    snprintf(name, sizeof(name), "groups %s equal torch.optim's per-group formulas", opt_name[o]);
    zs_test_report(name, worst <= 1.0 ? NULL : "parameters differ from the reference");
    CHECK(fabs(lr1 - ref_lr1) <= 1e-9 * ref_lr1, "group 1 lr %.17g, reference %.17g", lr1, ref_lr1);
}

/* ---------------------------------------------------------------- (b) a frozen unit */

static void check_frozen(void)
{
    static const struct run runs[] = {
        { 0, 0, 0, "none", false, 0 }, { 0, 0, 1, "cpu", false, 0 }, { 0, 0, 2, "none", false, 0 },
        { 0, 0, 2, "cpu", true, 0 },   { 0, 0, 3, "none", false, 0 }, { 0, 0, 3, "cpu", false, 0 },
        { 0, 0, 3, "nvme", false, 0 },
    };
    static float with[NP][MAXN], without[NP][MAXN], first[NP][MAXN];
    zs_memory_report mw, mo;
    double lr1;
    char name[96];
    const char *why;

    for (size_t c = 0; c < sizeof(runs) / sizeof(runs[0]); c++) {
        struct run a = runs[c], b = runs[c];
        a.model = MODEL_FROZEN;
        b.model = MODEL_NO_FROZEN;
        if (!strcmp(a.offload, "nvme") && !nvme_works)
            continue;
        snprintf(name, sizeof(name), "frozen unit stage %d offload %s%s", a.stage, a.offload,
                 a.separate ? " separate device" : "");
        if (!run_model(&a, with, &lr1, &mw) || !run_model(&b, without, &lr1, &mo)) {
            zs_test_report(name, "run failed");
            continue;
        }
        why = NULL;
        for (int j = 0; j < NP && !why; j++)
            for (int64_t i = 0; i < sizes[j] && !why; i++)
                if (unit_of[j] == 3 ? with[j][i] != init_value(j, i) : with[j][i] != without[j][i])
                    why = unit_of[j] == 3 ? "the frozen unit moved" : "trainable units differ from a model without it";
        if (!why && c == 0)
            memcpy(first, with, sizeof(first));
        if (!why && memcmp(first, with, sizeof(first)))
            why = "bits differ from stage 0";
        if (!why && (mw.grads != mo.grads || mw.optimizer != mo.optimizer || mw.expect_grads != mo.expect_grads ||
                     mw.expect_optimizer != mo.expect_optimizer))
            why = "the frozen unit has gradient or optimizer bytes";
        if (!why && mw.params <= mo.params)
            why = "the frozen unit's parameters are not counted";
        zs_test_report(name, why);
    }
}

/* ---------------------------------------------------------------- (c) misuse */

static void expect_error(const char *name, zs_status st, const char *text)
{
    char why[600];

    snprintf(why, sizeof(why), "got status %d: '%s', want the text '%s'", (int)st, st ? zs_last_error() : "",
             text);
    zs_test_report(name, st && strstr(zs_last_error(), text) ? NULL : why);
}

static void misuse_setup(const char *name, enum misuse mu, const char *text)
{
    struct run r = { OPT_SGD, MODEL_ALL, 2, "none", false, mu };
    struct model_ctx m;

    expect_error(name, model_open(&m, &r), text);
    zs_finalize(m.ctx);
}

static void check_misuse(void)
{
    struct run r = { OPT_ADAMW, MODEL_FROZEN, 2, "none", false, 0 };
    struct model_ctx m;
    zs_group_opts o = { .set = ZS_GROUP_LR, .lr = 0.1 }, bad = { .set = ZS_GROUP_LR, .lr = -1.0 };
    char json[1024];
    zs_init_opts io = { .config_json = json, .use_comm = 1, .comm = MPI_COMM_WORLD, .quiet = 1 };
    int32_t g, u, p;
    void *buf;

    misuse_setup("misuse: a unit mixing frozen and trainable parameters", MISUSE_MIXED,
                 "unit 'u0' mixes frozen parameter 'p1' and trainable parameter 'p0'");
    misuse_setup("misuse: SGD group momentum without the config's buffer", MISUSE_MOMENTUM,
                 "group 1: momentum 0.5 needs a momentum buffer");
    if (world > 1)
        misuse_setup("misuse: ranks disagree on a parameter's group", MISUSE_RANKS, "parameter 'p4' is in group 0 on "
                     "rank 0 but in group 2 on rank");

    config_json(&r, json, sizeof(json));
    zs_status st = zs_init(&m.ctx, &io);
    if (!st)
        st = zs_unit_add(m.ctx, "u0", &u);
    if (!st)
        st = zs_param_add(m.ctx, u, "w", 10, NULL, &p);
    expect_error("misuse: a parameter moved into a group that does not exist", st ? st : zs_param_group(m.ctx, 0, 3),
                 "zs_param_group: parameter '");
    expect_error("misuse: a negative lr", zs_group_add(m.ctx, &bad, &g), "group 1: invalid lr");
    expect_error("misuse: zs_group_set before zs_setup", zs_group_set(m.ctx, 0, &o), "call zs_setup first");
    zs_finalize(m.ctx);

    st = model_open(&m, &r);
    CHECK(!st, "model_open: %s", zs_last_error());
    if (st)
        return;
    expect_error("misuse: zs_group_add after zs_setup", zs_group_add(m.ctx, &o, &g), "called after zs_setup");
    expect_error("misuse: zs_param_freeze after zs_setup", zs_param_freeze(m.ctx, 0), "parameter 'p0': called after");
    expect_error("misuse: zs_group_set of an unknown group", zs_group_set(m.ctx, 3, &o), "no group 3 (3 groups)");
    expect_error("misuse: zs_grad_buffer on a frozen unit", zs_grad_buffer(m.ctx, m.unit[3], &buf),
                 "zs_grad_buffer: unit 'u3' is frozen");
    expect_error("misuse: zs_grad_ready on a frozen unit", zs_grad_ready(m.ctx, m.unit[3]),
                 "zs_grad_ready: unit 'u3' is frozen");
    expect_error("misuse: zs_grad_deposit on a frozen unit", zs_grad_deposit(m.ctx, m.unit[3]),
                 "zs_grad_deposit: unit 'u3' is frozen");
    zs_finalize(m.ctx);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    snprintf(scratch, sizeof(scratch), "zs_groups_XXXXXX");
    if (rank == 0 && !mkdtemp(scratch))
        scratch[0] = 0;
    MPI_Bcast(scratch, sizeof(scratch), MPI_CHAR, 0, MPI_COMM_WORLD);
    nvme_works = scratch[0] != 0;

    for (int o = OPT_ADAMW; o <= OPT_SGD; o++)
        check_groups((enum opt)o);
    check_frozen();
    check_misuse();

    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0 && scratch[0]) {
        char cmd[300];
        snprintf(cmd, sizeof(cmd), "rm -rf %s", scratch);
        if (system(cmd))
            fprintf(stderr, "could not remove %s\n", scratch);
    }
    int rc = zs_test_summary("test_groups");
    MPI_Finalize();
    return rc;
}
