/* units.c - which of a unit's elements the optimizer updates on this rank, in which buffers, with which
 * gradients. */
#include "units.h"

void *zs_unit_working(struct zs_ctx *ctx, int32_t u)
{
    struct zs_unit *un = &ctx->units[u];

    if (ctx->cfg.zero.stage == 0)
        return un->full;
    return un->sharded ? un->shard : zs_at(un->full, zs_partition_begin(&un->part, ctx->shard_rank), ctx->psz);
}

float *zs_unit_master(struct zs_ctx *ctx, int32_t u, int64_t *n)
{
    struct zs_unit *un = &ctx->units[u];

    *n = zs_plan_opt_elems(ctx->cfg.zero.stage, &un->part);
    if (ctx->pdt != ZS_DTYPE_FP32)
        return un->master;
    return zs_unit_working(ctx, u);
}

void *zs_unit_grad_shard(struct zs_ctx *ctx, int32_t u)
{
    struct zs_unit *un = &ctx->units[u];

    if (ctx->cfg.zero.stage >= 2)
        return un->grad_shard;
    return zs_at(un->grad, zs_partition_begin(&un->part, ctx->shard_rank), ctx->psz); /* stage 0: the norm's part */
}

void zs_unit_tensor(struct zs_ctx *ctx, int32_t u, float *disk_p, void *disk_w, float *s1, float *s2, int64_t begin,
                    int64_t end, struct zs_optim_tensor *t)
{
    struct zs_unit *un = &ctx->units[u];
    int64_t n;
    float *master = disk_p ? disk_p : zs_unit_master(ctx, u, &n);
    void *g = ctx->cfg.zero.stage == 0 ? un->grad : zs_unit_grad_shard(ctx, u);

    *t = (struct zs_optim_tensor){ .n = end - begin };
    if (ctx->pdt == ZS_DTYPE_FP32) {
        t->bufs.param = master + begin;
    } else { /* the kernel updates the fp32 master and writes its rounding to the working copy */
        t->bufs.param = zs_at(disk_w ? disk_w : zs_unit_working(ctx, u), begin, ctx->psz);
        t->bufs.master = master + begin;
    }
    t->bufs.grad = zs_at(g, begin, zs_dtype_bytes(ctx->gdt));
    t->bufs.s1 = s1 ? s1 + begin : NULL;
    t->bufs.s2 = s2 ? s2 + begin : NULL;
}

struct zs_optim_launch zs_unit_launch(const struct zs_ctx *ctx, const struct zs_optim_step *s,
                                      const struct zs_optim_tensor *t, int32_t count)
{
    return (struct zs_optim_launch){ .opt = ctx->kopt, .pdt = ctx->pdt, .gdt = ctx->gdt,
                                     .step = s, .t = t, .count = count };
}

/* t's buffers moved k elements on. */
static void tensor_advance(const struct zs_ctx *ctx, struct zs_optim_tensor *t, int64_t k)
{
    t->bufs.param = zs_at(t->bufs.param, k, ctx->psz);
    t->bufs.grad = zs_at((void *)t->bufs.grad, k, zs_dtype_bytes(ctx->gdt));
    t->bufs.master = t->bufs.master ? t->bufs.master + k : NULL;
    t->bufs.s1 = t->bufs.s1 ? t->bufs.s1 + k : NULL;
    t->bufs.s2 = t->bufs.s2 ? t->bufs.s2 + k : NULL;
}

static void split_piece(const struct zs_ctx *ctx, const struct zs_optim_tensor *t, int64_t from, int64_t to,
                        const struct zs_optim_step *s, struct zs_optim_tensor *out)
{
    *out = *t;
    tensor_advance(ctx, out, from);
    out->n = to - from;
    out->step = s;
    if (ctx->kopt == ZS_KOPT_SGD && s->momentum == 0.0f)
        out->bufs.s1 = NULL;
}

int32_t zs_unit_split(const struct zs_ctx *ctx, int32_t u, const struct zs_optim_tensor *t, int64_t begin,
                      const struct zs_optim_step *steps, struct zs_optim_tensor *out)
{
    const struct zs_unit *un = &ctx->units[u];
    const struct zs_param_rec *pr = &ctx->params[un->first_param];
    int64_t origin = ctx->cfg.zero.stage == 0 ? 0 : zs_partition_begin(&un->part, ctx->shard_rank);
    int64_t a = origin + begin, b = a + t->n, from = a;
    int32_t p = 0, n = 0, g;

    while (p + 1 < un->nparams && pr[p + 1].offset <= a)
        p++;
    g = pr[p].group;
    for (p++; p < un->nparams && pr[p].offset < b; p++) {
        if (pr[p].group == g)
            continue;
        split_piece(ctx, t, from - a, pr[p].offset - a, &steps[g], &out[n++]);
        from = pr[p].offset;
        g = pr[p].group;
    }
    split_piece(ctx, t, from - a, b - a, &steps[g], &out[n++]);
    return n;
}
