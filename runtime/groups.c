/* groups.c - parameter groups (torch's param_groups: each group's lr, weight decay and the optimizer's own
 * hyper-parameters over the config's optimizer.params) and frozen parameters: registration, the checks every
 * rank agrees on at set-up, and each group's lr at a step. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/hash.h" /* defines: zs_fnv1a */
#include "core/ctx.h"
#include "core/ranks.h" /* defines: zs_label */
#include "core/schedule.h" /* defines: zs_schedule_lr */
#include "runtime.h"

#define GROUP_FIELDS (ZS_GROUP_LR | ZS_GROUP_WEIGHT_DECAY | ZS_GROUP_BETAS | ZS_GROUP_EPS | ZS_GROUP_MOMENTUM | \
                      ZS_GROUP_DAMPENING | ZS_GROUP_NESTEROV)

/* groups[0] exists from the first call that needs it on: the config's values, nothing set. */
static zs_status groups_grow(struct zs_ctx *ctx, int32_t n, const char *fn)
{
    struct zs_group *g;

    if (n <= ctx->ngroups)
        return ZS_OK;
    g = realloc(ctx->groups, (size_t)n * sizeof(*g));
    if (!g)
        return zs_fail(ZS_ERR_NOMEM, "%s: out of memory", fn);
    memset(g + ctx->ngroups, 0, (size_t)(n - ctx->ngroups) * sizeof(*g));
    ctx->groups = g;
    ctx->ngroups = n;
    return ZS_OK;
}

void zs_group_values(const struct zs_ctx *ctx, int32_t group, zs_group_opts *out)
{
    const struct zs_optim_config *o = &ctx->cfg.optim;
    const zs_group_opts *g = group < ctx->ngroups ? &ctx->groups[group].opts : NULL;
    uint32_t set = g ? g->set : 0;

    *out = (zs_group_opts){ .set = set, .lr = o->lr, .weight_decay = o->weight_decay, .beta1 = o->beta1,
                            .beta2 = o->beta2, .eps = o->eps, .momentum = o->momentum, .dampening = o->dampening,
                            .nesterov = o->nesterov };
    if (set & ZS_GROUP_LR)
        out->lr = g->lr;
    if (set & ZS_GROUP_WEIGHT_DECAY)
        out->weight_decay = g->weight_decay;
    if (set & ZS_GROUP_BETAS) {
        out->beta1 = g->beta1;
        out->beta2 = g->beta2;
    }
    if (set & ZS_GROUP_EPS)
        out->eps = g->eps;
    if (set & ZS_GROUP_MOMENTUM)
        out->momentum = g->momentum;
    if (set & ZS_GROUP_DAMPENING)
        out->dampening = g->dampening;
    if (set & ZS_GROUP_NESTEROV)
        out->nesterov = g->nesterov != 0;
}

/* The fields of v (a group's resolved values) torch's optimizers would refuse, and SGD momentum without the
 * buffer the config's optimizer.params.momentum sized the state for. */
static zs_status check_values(const struct zs_ctx *ctx, const zs_group_opts *v, const char *fn, int32_t group)
{
    const char *bad = NULL;

    if (v->set & ~(uint32_t)GROUP_FIELDS)
        return zs_fail(ZS_ERR_INVALID, "%s: group %d: unknown field bits 0x%x in set", fn, group,
                       v->set & ~(uint32_t)GROUP_FIELDS);
    if (!(isfinite(v->lr) && v->lr >= 0.0))
        bad = "lr";
    else if (!(isfinite(v->weight_decay) && v->weight_decay >= 0.0))
        bad = "weight_decay";
    else if (!(v->beta1 >= 0.0 && v->beta1 < 1.0 && v->beta2 >= 0.0 && v->beta2 < 1.0))
        bad = "betas";
    else if (!(isfinite(v->eps) && v->eps >= 0.0))
        bad = "eps";
    else if (!(isfinite(v->momentum) && v->momentum >= 0.0))
        bad = "momentum";
    else if (!isfinite(v->dampening))
        bad = "dampening";
    if (bad)
        return zs_fail(ZS_ERR_INVALID, "%s: group %d: invalid %s (lr %g, weight_decay %g, betas [%g, %g], eps %g, "
                       "momentum %g, dampening %g)", fn, group, bad, v->lr, v->weight_decay, v->beta1, v->beta2,
                       v->eps, v->momentum, v->dampening);
    if (ctx->cfg.optim.type != ZS_OPTIM_SGD)
        return ZS_OK;
    if (v->nesterov && (v->momentum <= 0.0 || v->dampening != 0.0))
        return zs_fail(ZS_ERR_INVALID, "%s: group %d: nesterov needs momentum > 0 and dampening 0 (as torch.optim.SGD)",
                       fn, group);
    if (v->momentum > 0.0 && ctx->cfg.optim.momentum <= 0.0)
        return zs_fail(ZS_ERR_INVALID, "%s: group %d: momentum %g needs a momentum buffer, which the config's "
                       "optimizer.params.momentum (0) does not keep: set it nonzero there", fn, group, v->momentum);
    return ZS_OK;
}

/* opts' set fields over group's own. */
static zs_status group_merge(struct zs_ctx *ctx, int32_t group, const zs_group_opts *opts, const char *fn)
{
    struct zs_group *g = &ctx->groups[group];
    zs_group_opts old = g->opts, merged = g->opts, v;
    zs_status st;

    merged.set |= opts->set;
    if (opts->set & ZS_GROUP_LR)
        merged.lr = opts->lr;
    if (opts->set & ZS_GROUP_WEIGHT_DECAY)
        merged.weight_decay = opts->weight_decay;
    if (opts->set & ZS_GROUP_BETAS) {
        merged.beta1 = opts->beta1;
        merged.beta2 = opts->beta2;
    }
    if (opts->set & ZS_GROUP_EPS)
        merged.eps = opts->eps;
    if (opts->set & ZS_GROUP_MOMENTUM)
        merged.momentum = opts->momentum;
    if (opts->set & ZS_GROUP_DAMPENING)
        merged.dampening = opts->dampening;
    if (opts->set & ZS_GROUP_NESTEROV)
        merged.nesterov = opts->nesterov != 0;
    g->opts = merged;
    zs_group_values(ctx, group, &v);
    v.set = opts->set;
    st = check_values(ctx, &v, fn, group);
    if (st)
        g->opts = old; /* a refused change leaves the group as it was */
    return st;
}

zs_status zs_group_add(zs_ctx *ctx, const zs_group_opts *opts, int32_t *group)
{
    int32_t g;
    zs_status st;

    if (!ctx || !opts || !group)
        return zs_fail(ZS_ERR_INVALID, "zs_group_add: NULL argument");
    if (ctx->set_up)
        return zs_fail(ZS_ERR_INVALID, "zs_group_add: called after zs_setup (groups are fixed at set-up)");
    g = ctx->ngroups ? ctx->ngroups : 1;
    st = groups_grow(ctx, g + 1, "zs_group_add");
    if (!st)
        st = group_merge(ctx, g, opts, "zs_group_add");
    if (st) {
        ctx->ngroups = g; /* the new entry is dropped */
        return st;
    }
    *group = g;
    return ZS_OK;
}

static zs_status param_check(zs_ctx *ctx, int32_t param, const char *fn)
{
    if (!ctx)
        return zs_fail(ZS_ERR_INVALID, "%s: NULL context", fn);
    if (param < 0 || param >= ctx->nparams)
        return zs_fail(ZS_ERR_INVALID, "%s: no parameter %d", fn, param);
    if (ctx->set_up)
        return zs_fail(ZS_ERR_INVALID, "%s: parameter '%s': called after zs_setup", fn, ctx->params[param].name);
    return ZS_OK;
}

zs_status zs_param_group(zs_ctx *ctx, int32_t param, int32_t group)
{
    zs_status st = param_check(ctx, param, "zs_param_group");

    if (st)
        return st;
    if (group < 0 || group >= zs_group_count(ctx))
        return zs_fail(ZS_ERR_INVALID, "zs_param_group: parameter '%s': no group %d (%d groups)",
                       ctx->params[param].name, group, zs_group_count(ctx));
    ctx->params[param].group = group;
    return ZS_OK;
}

zs_status zs_param_freeze(zs_ctx *ctx, int32_t param)
{
    zs_status st = param_check(ctx, param, "zs_param_freeze");

    if (!st)
        ctx->params[param].frozen = true;
    return st;
}

zs_status zs_group_set(zs_ctx *ctx, int32_t group, const zs_group_opts *opts)
{
    zs_status st;

    if (!ctx || !opts)
        return zs_fail(ZS_ERR_INVALID, "zs_group_set: NULL argument");
    if (!ctx->set_up)
        return zs_fail(ZS_ERR_INVALID, "zs_group_set: group %d: call zs_setup first", group);
    if (group < 0 || group >= zs_group_count(ctx))
        return zs_fail(ZS_ERR_INVALID, "zs_group_set: no group %d (%d groups)", group, zs_group_count(ctx));
    st = groups_grow(ctx, 1, "zs_group_set");
    return st ? st : group_merge(ctx, group, opts, "zs_group_set");
}

zs_status zs_group_get(const zs_ctx *ctx, int32_t group, zs_group_opts *out)
{
    if (!ctx || !out)
        return zs_fail(ZS_ERR_INVALID, "zs_group_get: NULL argument");
    if (group < 0 || group >= zs_group_count(ctx))
        return zs_fail(ZS_ERR_INVALID, "zs_group_get: no group %d (%d groups)", group, zs_group_count(ctx));
    zs_group_values(ctx, group, out);
    if (group < ctx->ngroups && ctx->groups[group].stepped)
        out->lr = ctx->groups[group].lr_used;
    return ZS_OK;
}

int32_t zs_group_count(const zs_ctx *ctx)
{
    return !ctx ? 0 : ctx->ngroups ? ctx->ngroups : 1;
}

/* ---------------------------------------------------------------- the step */

/* Group `group`'s lr for a schedule value: the config's lr is the schedule's value itself (every bit as it
 * was); a group's own lr is scaled by the schedule as torch's schedulers scale each group's initial lr. */
static double group_lr_for(const struct zs_ctx *ctx, int32_t group, double sched_lr)
{
    const struct zs_optim_config *o = &ctx->cfg.optim;
    zs_group_opts v;

    zs_group_values(ctx, group, &v);
    if (!(v.set & ZS_GROUP_LR))
        return sched_lr;
    if (ctx->cfg.sched.type == ZS_SCHED_NONE || o->lr == 0.0)
        return v.lr;
    return v.lr * (sched_lr / o->lr);
}

double zs_group_lr(struct zs_ctx *ctx, int32_t group, double sched_lr)
{
    double lr = group_lr_for(ctx, group, sched_lr);

    if (group < ctx->ngroups) {
        ctx->groups[group].lr_used = lr;
        ctx->groups[group].stepped = true;
    }
    return lr;
}

zs_status zs_group_next_lr(const zs_ctx *ctx, int32_t group, double *lr)
{
    if (!ctx || !lr)
        return zs_fail(ZS_ERR_INVALID, "zs_group_next_lr: NULL argument");
    if (!ctx->set_up)
        return zs_fail(ZS_ERR_INVALID, "zs_group_next_lr: call zs_setup first");
    if (group < 0 || group >= zs_group_count(ctx))
        return zs_fail(ZS_ERR_INVALID, "zs_group_next_lr: no group %d (%d groups)", group, zs_group_count(ctx));
    *lr = group_lr_for(ctx, group, zs_schedule_lr(&ctx->cfg.sched, ctx->cfg.optim.lr, ctx->sched_steps + 1));
    return ZS_OK;
}

/* ---------------------------------------------------------------- set-up */

/* Each unit is frozen or trainable as a whole. */
static zs_status units_frozen(struct zs_ctx *ctx)
{
    for (int32_t u = 0; u < ctx->nunits; u++) {
        struct zs_unit *un = &ctx->units[u];
        const struct zs_param_rec *frozen = NULL, *trained = NULL;
        for (int32_t p = un->first_param; p < un->first_param + un->nparams; p++) {
            const struct zs_param_rec **first = ctx->params[p].frozen ? &frozen : &trained;
            *first = *first ? *first : &ctx->params[p];
        }
        if (frozen && trained)
            return zs_fail(ZS_ERR_INVALID, "zs_setup: unit '%s' mixes frozen parameter '%s' and trainable parameter "
                           "'%s': register them as two units", un->name, frozen->name, trained->name);
        un->frozen = frozen != NULL;
    }
    return ZS_OK;
}

static uint64_t groups_hash(const struct zs_ctx *ctx)
{
    uint64_t h = ZS_FNV_SEED;

    for (int32_t p = 0; p < ctx->nparams; p++) {
        int32_t gf[2] = { ctx->params[p].group, ctx->params[p].frozen };
        h = zs_fnv1a(h, gf, sizeof(gf));
    }
    for (int32_t g = 0; g < zs_group_count(ctx); g++) {
        zs_group_opts v;
        zs_group_values(ctx, g, &v);
        double d[8] = { v.lr, v.weight_decay, v.beta1, v.beta2, v.eps, v.momentum, v.dampening, v.nesterov };
        h = zs_fnv1a(h, d, sizeof(d));
        h = zs_fnv1a(h, &v.set, sizeof(v.set));
    }
    return h;
}

/* After the registration check (names and sizes agree): which parameter or group differs from rank 0's. */
static zs_status name_difference(struct zs_ctx *ctx, int32_t r, const int32_t *all)
{
    const int32_t *mine0 = all, *theirs = all + (size_t)r * (size_t)ctx->nparams;

    for (int32_t p = 0; p < ctx->nparams; p++)
        if (mine0[p] != theirs[p])
            return zs_fail(ZS_ERR_MISMATCH, "zs_setup: parameter '%s' is in group %d%s on rank 0 but in group %d%s "
                           "on rank %d", ctx->params[p].name, mine0[p] >> 1, mine0[p] & 1 ? " (frozen)" : "",
                           theirs[p] >> 1, theirs[p] & 1 ? " (frozen)" : "", r);
    return zs_fail(ZS_ERR_MISMATCH, "zs_setup: the parameter groups' values (lr, weight_decay, betas, eps, momentum, "
                   "dampening, nesterov, or the fields set) differ between rank 0 and rank %d", r);
}

/* Every rank must hold the same groups and the same group and frozen flag per parameter. */
static zs_status groups_agree(struct zs_ctx *ctx)
{
    uint64_t mine[2] = { groups_hash(ctx), (uint64_t)zs_group_count(ctx) }, *all;
    int32_t *codes = NULL, bad = -1;
    zs_status st;

    all = calloc((size_t)ctx->world, sizeof(mine));
    if (!all)
        return zs_fail(ZS_ERR_NOMEM, "zs_setup: out of memory");
    zs_label(ctx, ZS_PURPOSE_SETUP, -1);
    st = zs_comm_allgather_bytes(ctx->comm, mine, all, (int32_t)sizeof(mine));
    for (int32_t r = 1; !st && r < ctx->world && bad < 0; r++)
        if (all[2 * r] != all[0] || all[2 * r + 1] != all[1])
            bad = r;
    if (st || bad < 0)
        goto out_free_all;
    if (all[2 * bad + 1] != all[1]) {
        st = zs_fail(ZS_ERR_MISMATCH, "zs_setup: rank 0 has %d parameter groups, rank %d has %d", (int)all[1], bad,
                     (int)all[2 * bad + 1]);
        goto out_free_all;
    }
    /* every rank saw the same mismatch: all take part in naming it */
    codes = malloc((size_t)ctx->world * (size_t)ctx->nparams * 2 * sizeof(int32_t));
    if (!codes) {
        st = zs_fail(ZS_ERR_NOMEM, "zs_setup: out of memory");
        goto out_free_all;
    }
    int32_t *own = codes + (size_t)ctx->world * (size_t)ctx->nparams;
    for (int32_t p = 0; p < ctx->nparams; p++)
        own[p] = ctx->params[p].group * 2 + ctx->params[p].frozen;
    st = zs_comm_allgather_bytes(ctx->comm, own, codes, ctx->nparams * (int32_t)sizeof(int32_t));
    if (!st)
        st = name_difference(ctx, bad, codes);
    free(codes);
out_free_all:
    free(all);
    return st;
}

zs_status zs_groups_setup(struct zs_ctx *ctx)
{
    zs_status st = groups_agree(ctx);

    return st ? st : units_frozen(ctx);
}
