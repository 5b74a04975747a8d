/* ckpt_groups.c - what a checkpoint save records of the parameter groups and frozen parameters, and what a
 * load checks and restores (the manifest's side: ckpt_format_groups.c). */
#include <stdlib.h>

#include "base/error.h"
#include "core/ctx.h"
#include "runtime/runtime.h" /* defines: zs_group_values */
#include "ckpt_groups.h"

zs_status zs_ckpt_groups_fill(const struct zs_ctx *ctx, struct zs_ckpt_manifest *m)
{
    for (int32_t p = 0; p < ctx->nparams && p < m->nparams; p++) {
        m->params[p].group = ctx->params[p].group;
        m->params[p].frozen = ctx->params[p].frozen;
    }
    if (!ctx->ngroups) /* nothing beyond the config's values: the manifest has no "groups" */
        return ZS_OK;
    m->groups = calloc((size_t)ctx->ngroups, sizeof(*m->groups));
    if (!m->groups)
        return zs_fail(ZS_ERR_NOMEM, "checkpoint: out of memory for the manifest");
    m->ngroups = ctx->ngroups;
    for (int32_t g = 0; g < ctx->ngroups; g++) {
        zs_group_opts v;
        zs_group_values(ctx, g, &v);
        m->groups[g] = (struct zs_ckpt_group){ .set = v.set, .lr = v.lr, .weight_decay = v.weight_decay,
                                               .beta1 = v.beta1, .beta2 = v.beta2, .eps = v.eps,
                                               .momentum = v.momentum, .dampening = v.dampening,
                                               .nesterov = v.nesterov != 0, .stepped = ctx->groups[g].stepped,
                                               .lr_used = ctx->groups[g].lr_used };
    }
    return ZS_OK;
}

zs_status zs_ckpt_groups_match(const struct zs_ctx *ctx, const struct zs_ckpt_manifest *m, const char *where)
{
    int32_t saved = m->ngroups ? m->ngroups : 1;

    for (int32_t p = 0; p < ctx->nparams && p < m->nparams; p++) {
        const struct zs_param_rec *pr = &ctx->params[p];
        if (pr->group != m->params[p].group)
            return zs_fail(ZS_ERR_MISMATCH, "checkpoint %s: parameter '%s' was saved in group %d, the program put it "
                           "in group %d", where, pr->name, m->params[p].group, pr->group);
        if (pr->frozen != m->params[p].frozen)
            return zs_fail(ZS_ERR_MISMATCH, "checkpoint %s: parameter '%s' was saved %s, the program registered it "
                           "%s", where, pr->name, m->params[p].frozen ? "frozen" : "trainable",
                           pr->frozen ? "frozen" : "trainable");
    }
    if (saved != zs_group_count(ctx))
        return zs_fail(ZS_ERR_MISMATCH, "checkpoint %s: %d parameter groups saved, the program has %d", where, saved,
                       zs_group_count(ctx));
    return ZS_OK;
}

zs_status zs_ckpt_groups_apply(struct zs_ctx *ctx, const struct zs_ckpt_manifest *m)
{
    struct zs_group *g;

    if (!m->ngroups) /* saved without groups: the config's values, as the program has them */
        return ZS_OK;
    g = ctx->ngroups >= m->ngroups ? ctx->groups : realloc(ctx->groups, (size_t)m->ngroups * sizeof(*g));
    if (!g)
        return zs_fail(ZS_ERR_NOMEM, "checkpoint: out of memory restoring the parameter groups");
    ctx->groups = g;
    ctx->ngroups = m->ngroups;
    for (int32_t i = 0; i < m->ngroups; i++) {
        const struct zs_ckpt_group *s = &m->groups[i];
        g[i].opts = (zs_group_opts){ .set = s->set, .lr = s->lr, .weight_decay = s->weight_decay, .beta1 = s->beta1,
                                     .beta2 = s->beta2, .eps = s->eps, .momentum = s->momentum,
                                     .dampening = s->dampening, .nesterov = s->nesterov };
        g[i].stepped = s->stepped;
        g[i].lr_used = s->lr_used;
    }
    return ZS_OK;
}
