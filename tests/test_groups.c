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
#include "groups_fixture.h"

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
        { 0, 0, 0, "none", false, 0, false }, { 0, 0, 1, "none", false, 0, false },
        { 0, 0, 1, "cpu", false, 0, false },  { 0, 0, 2, "none", false, 0, false },
        { 0, 0, 2, "cpu", false, 0, false },  { 0, 0, 3, "none", false, 0, false },
        { 0, 0, 3, "cpu", false, 0, false },  { 0, 0, 2, "cpu", true, 0, false },
        { 0, 0, 3, "nvme", false, 0, false },
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
        { 0, 0, 0, "none", false, 0, false }, { 0, 0, 1, "cpu", false, 0, false }, { 0, 0, 2, "none", false, 0, false },
        { 0, 0, 2, "cpu", true, 0, false },   { 0, 0, 3, "none", false, 0, false }, { 0, 0, 3, "cpu", false, 0, false },
        { 0, 0, 3, "nvme", false, 0, false }, { 0, 0, 0, "none", false, 0, true }, { 0, 0, 3, "cpu", false, 0, true },
        { 0, 0, 2, "nvme", false, 0, true },  { 0, 0, 3, "cpu+params", false, 0, false },
        { 0, 0, 3, "nvme+params", false, 0, false }, { 0, 0, 3, "nvme+params", false, 0, true },
    };
    static float with[NP][MAXN], without[NP][MAXN], first[2][NP][MAXN];
    bool have[2] = { false, false };
    zs_memory_report mw, mo;
    double lr1;
    char name[96];
    const char *why;

    for (size_t c = 0; c < sizeof(runs) / sizeof(runs[0]); c++) {
        struct run a = runs[c], b = runs[c];
        a.model = MODEL_FROZEN;
        b.model = MODEL_NO_FROZEN;
        if (!strncmp(a.offload, "nvme", 4) && !nvme_works)
            continue;
        snprintf(name, sizeof(name), "frozen unit stage %d offload %s%s%s", a.stage, a.offload,
                 a.separate ? " separate device" : "", a.bf16 ? " bf16" : "");
        if (!run_model(&a, with, &lr1, &mw) || !run_model(&b, without, &lr1, &mo)) {
            zs_test_report(name, "run failed");
            continue;
        }
        why = NULL;
        for (int j = 0; j < NP && !why; j++)
            for (int64_t i = 0; i < sizes[j] && !why; i++)
                if (unit_of[j] == 3 ? with[j][i] != (a.bf16 ? from_bf16(to_bf16(init_value(j, i))) : init_value(j, i))
                                    : with[j][i] != without[j][i])
                    why = unit_of[j] == 3 ? "the frozen unit moved" : "trainable units differ from a model without it";
        if (!why && !have[a.bf16]) /* the first run of each dtype is the one the others match */
            memcpy(first[a.bf16], with, sizeof(with));
        have[a.bf16] = true;
        if (!why && memcmp(first[a.bf16], with, sizeof(with)))
            why = "bits differ from the dtype's first run";
        if (!why && (mw.grads != mo.grads || mw.optimizer != mo.optimizer || mw.master != mo.master ||
                     mw.expect_grads != mo.expect_grads ||
                     mw.expect_optimizer != mo.expect_optimizer))
            why = "the frozen unit has gradient or optimizer bytes";
        if (!why && mw.params + mw.nvme <= mo.params + mo.nvme) /* in memory, or in the swap file */
            why = "the frozen unit's parameters are not counted";
        zs_test_report(name, why);
    }
}

/* Deterministic mode leaves a frozen unit out of its exact sums: the others as without it. */
static void check_frozen_exact(void)
{
    static float with[NP][MAXN], without[NP][MAXN];
    double lr1;
    char name[96];

    deterministic = true;
    for (int stage = 0; stage <= 3; stage += 3) {
        struct run a = { OPT_ADAMW, MODEL_FROZEN, stage, "none", false, 0, false }, b = a;
        bool same = true;
        b.model = MODEL_NO_FROZEN;
        snprintf(name, sizeof(name), "frozen unit in deterministic mode, stage %d", stage);
        if (!run_model(&a, with, &lr1, NULL) || !run_model(&b, without, &lr1, NULL)) {
            zs_test_report(name, "run failed");
            continue;
        }
        for (int j = 0; j < NP; j++)
            for (int64_t i = 0; i < sizes[j]; i++)
                same &= unit_of[j] == 3 ? with[j][i] == init_value(j, i) : with[j][i] == without[j][i];
        zs_test_report(name, same ? NULL : "the frozen unit moved, or the others differ from a model without it");
    }
    deterministic = false;
}

static void expect_error(const char *name, zs_status st, const char *text);

/* ---------------------------------------------------------------- (d) a checkpoint resharded */

/* Steps 1-2 on max(world - 1, 1) ranks at stage 3, zs_group_set, a save, steps 3-4 (the uninterrupted run);
 * then every rank loads the checkpoint at stage 1 with the optimizer offloaded (bf16: at stage 2 with it on
 * NVMe), without the zs_group_set, and
 * steps 3-4 again: the same bits, the set group's lr, and a model registered otherwise refused by name. */
static bool ckpt_saver(const struct run *r, const char *dir, float out[NP][MAXN])
{
    struct model_ctx m;
    zs_group_opts c = group_change();
    zs_status st = model_open(&m, r);

    for (int k = 1; k <= STEPS && !st; k++) {
        st = model_step(&m, r, k);
        if (!st && k == SET_AFTER && !(st = zs_group_set(m.ctx, 1, &c)))
            st = zs_checkpoint_save(m.ctx, dir);
    }
    if (!st)
        st = model_read(&m, r, out);
    CHECK(!st, "checkpoint saver: %s", zs_last_error());
    zs_finalize(m.ctx);
    return !st;
}

static void check_ckpt(bool bf16)
{
    struct run save = { OPT_ADAMW, MODEL_FROZEN, 3, "none", false, 0, bf16 },
               load = { OPT_ADAMW, MODEL_FROZEN, bf16 ? 2 : 1, bf16 && nvme_works ? "nvme" : "cpu", false, 0, bf16 };
    static float want[NP][MAXN], got[NP][MAXN];
    int savers = world > 1 ? world - 1 : 1, ok = 1;
    char dir[300], name[96];
    struct model_ctx m;
    zs_group_opts g1;
    zs_status st;

    snprintf(dir, sizeof(dir), "%s/ckpt%s", scratch, bf16 ? "_bf16" : "");
    snprintf(name, sizeof(name), "checkpoint saved at %d ranks, loaded at %d: the same next steps%s", savers, world,
             bf16 ? " (bf16)" : "");
    same_grads = true;
    MPI_Comm_split(MPI_COMM_WORLD, rank < savers ? 0 : MPI_UNDEFINED, rank, &run_comm);
    if (rank < savers) {
        ok = ckpt_saver(&save, dir, want);
        MPI_Comm_free(&run_comm);
    }
    run_comm = MPI_COMM_WORLD;
    MPI_Bcast(want, NP * MAXN, MPI_FLOAT, 0, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    st = ok ? model_open(&m, &load) : ZS_ERR_INVALID;
    if (!st)
        st = zs_checkpoint_load(m.ctx, dir);
    for (int k = SET_AFTER + 1; k <= STEPS && !st; k++)
        st = model_step(&m, &load, k);
    if (!st)
        st = model_read(&m, &load, got);
    if (!st)
        st = zs_group_get(m.ctx, 1, &g1);
    zs_test_report(name, st ? zs_last_error() : memcmp(got, want, sizeof(got)) ? "parameters differ" : NULL);
    CHECK(st || g1.weight_decay == group_change().weight_decay, "group 1's weight decay %g after the load",
          g1.weight_decay);
    zs_finalize(m.ctx);

    if (bf16)
        goto out;
    load.model = MODEL_ALL; /* the unit saved frozen is trainable here */
    st = model_open(&m, &load);
    expect_error("a checkpoint's frozen parameter registered trainable", st ? st : zs_checkpoint_load(m.ctx, dir),
                 "parameter 'p6' was saved frozen, the program registered it trainable");
    zs_finalize(m.ctx);
out:
    same_grads = false;
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
    struct run r = { OPT_SGD, MODEL_ALL, 2, "none", false, mu, false };
    struct model_ctx m;

    expect_error(name, model_open(&m, &r), text);
    zs_finalize(m.ctx);
}

static void check_misuse(void)
{
    struct run r = { OPT_ADAMW, MODEL_FROZEN, 2, "none", false, 0, false };
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
    run_comm = MPI_COMM_WORLD;
    snprintf(scratch, sizeof(scratch), "zs_groups_XXXXXX");
    if (rank == 0 && !mkdtemp(scratch))
        scratch[0] = 0;
    MPI_Bcast(scratch, sizeof(scratch), MPI_CHAR, 0, MPI_COMM_WORLD);
    nvme_works = scratch[0] != 0;

    if (argc > 1)
        device = argv[1];
    for (int o = OPT_ADAMW; o <= OPT_SGD; o++)
        check_groups((enum opt)o);
    check_frozen();
    if (strcmp(device, "cpu")) /* the rest is the device's business nowhere (deterministic mode: the CPU only) */
        goto out;
    check_frozen_exact();
    check_misuse();
    check_ckpt(false);
    check_ckpt(true);

out:
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
