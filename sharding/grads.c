/* grads.c - gradient buffers and their reduction. Stages 0-1 keep full gradients and reduce them once
 * per accumulation window; stages 2-3 hand out staging buffers from one bucket (reduce_bucket_size),
 * reduce-scatter every micro-batch as backward produces it, and fold the result into a persistent
 * shard. With overlap_comm the reduction runs while the program keeps computing. */
#include <string.h>

#include "engine.h"
#include "error.h"

static bool at_boundary(const struct zs_ctx *ctx)
{
    return (ctx->micro_step + 1) % ctx->cfg.grad_accum_steps == 0;
}

/* Completion of one unit's reduction: at stages 2-3 the reduced shard lands in the accumulator
 * (copied for the first micro-batch so that no extra rounding or -0.0 + 0.0 creeps in). */
static void finish_reduction(struct zs_ctx *ctx, int32_t u)
{
    struct zs_unit *un = &ctx->units[u];

    un->grad_state = ZS_GRAD_IDLE;
    if (ctx->cfg.zero.stage < 2)
        return;
    const float *src = un->grad + zs_partition_begin(&un->part, ctx->rank);
    float *dst = un->grad_shard;
    if (un->accumulated == 0)
        memcpy(dst, src, (size_t)un->part.shard * sizeof(float));
    else
        for (int64_t i = 0; i < un->part.shard; i++)
            dst[i] += src[i];
    un->accumulated++;
    un->grad = NULL;
}

static zs_status pop_head(struct zs_ctx *ctx)
{
    int32_t u = ctx->pending[0];
    struct zs_unit *un = &ctx->units[u];
    zs_status st = zs_comm_wait(ctx->comm, un->reduce_req);

    un->reduce_req = NULL;
    memmove(ctx->pending, ctx->pending + 1, (size_t)(--ctx->npending) * sizeof(int32_t));
    if (st) {
        zs_error_prefix("reduce gradients of unit '%s'", un->name);
        return st;
    }
    finish_reduction(ctx, u);
    return ZS_OK;
}

/* Completions are taken in launch order, so accumulation order never depends on timing. */
zs_status zs_grads_progress(struct zs_ctx *ctx)
{
    zs_status st = zs_comm_progress(ctx->comm);

    while (!st && ctx->npending > 0) {
        bool done = false;
        st = zs_comm_test(ctx->comm, ctx->units[ctx->pending[0]].reduce_req, &done);
        if (st || !done)
            break;
        st = pop_head(ctx);
    }
    return st;
}

zs_status zs_grads_flush(struct zs_ctx *ctx)
{
    zs_status st = ZS_OK;

    while (!st && ctx->npending > 0)
        st = pop_head(ctx);
    return st;
}

static zs_status launch(struct zs_ctx *ctx, int32_t u)
{
    struct zs_unit *un = &ctx->units[u];
    int64_t s = un->part.shard;
    float *g = un->grad;
    zs_status st;

    if (ctx->pre_scale != 1.0f)
        for (int64_t i = 0; i < un->part.padded; i++)
            g[i] *= ctx->pre_scale;
    if (ctx->cfg.zero.stage == 0 || (ctx->cfg.zero.stage == 1 && !ctx->cfg.zero.reduce_scatter))
        st = zs_comm_all_reduce(ctx->comm, g, s, ctx->post_scale, &un->reduce_req);
    else
        st = zs_comm_reduce_scatter(ctx->comm, g, g + zs_partition_begin(&un->part, ctx->rank), s, ctx->post_scale,
                                    &un->reduce_req);
    if (st) {
        zs_error_prefix("reduce gradients of unit '%s'", un->name);
        return st;
    }
    un->grad_state = ZS_GRAD_REDUCING;
    ctx->pending[ctx->npending++] = u;
    if (!ctx->cfg.zero.overlap_comm)
        return zs_grads_flush(ctx);
    return zs_grads_progress(ctx);
}

zs_status zs_grads_get(struct zs_ctx *ctx, int32_t u, float **grad)
{
    struct zs_unit *un = &ctx->units[u];
    zs_status st;

    if (un->ready_micro == ctx->micro_step)
        return zs_fail(ZS_ERR_INVALID, "zs_grad_get: unit '%s' was already marked ready in this micro-batch", un->name);
    if (un->grad_state == ZS_GRAD_OPEN) {
        *grad = un->grad;
        return ZS_OK;
    }
    if (un->grad_state == ZS_GRAD_REDUCING) { /* last micro-batch's reduction of this unit still runs */
        st = zs_grads_flush(ctx);
        if (st)
            return st;
    }
    if (ctx->cfg.zero.stage >= 2) {
        /* The bucket restarts only here and at the step, never when reductions happen to finish: every
         * rank must place a unit's staging buffer at the same offset, because peers on the node read it
         * there. */
        if (ctx->arena_used + un->part.padded > ctx->arena_cap) {
            st = zs_grads_flush(ctx); /* the bucket is full: its reductions must land before reuse */
            if (st)
                return st;
            ctx->arena_used = 0;
        }
        un->grad = ctx->arena + ctx->arena_used;
        ctx->arena_used += un->part.padded;
        memset(un->grad, 0, (size_t)un->part.padded * sizeof(float));
    }
    un->grad_state = ZS_GRAD_OPEN;
    *grad = un->grad;
    return ZS_OK;
}

zs_status zs_grads_ready(struct zs_ctx *ctx, int32_t u)
{
    struct zs_unit *un = &ctx->units[u];

    if (un->grad_state != ZS_GRAD_OPEN)
        return zs_fail(ZS_ERR_INVALID, "zs_grad_ready: unit '%s': call zs_grad_get first in this micro-batch",
                       un->name);
    un->ready_micro = ctx->micro_step;
    if (ctx->cfg.zero.stage < 2 && !at_boundary(ctx)) {
        un->grad_state = ZS_GRAD_IDLE; /* keeps accumulating locally until the boundary */
        return ZS_OK;
    }
    return launch(ctx, u);
}

float *zs_grads_shard(struct zs_ctx *ctx, int32_t u)
{
    struct zs_unit *un = &ctx->units[u];

    if (ctx->cfg.zero.stage >= 2)
        return un->grad_shard;
    return un->grad + zs_partition_begin(&un->part, ctx->rank);
}

void zs_grads_zero(struct zs_ctx *ctx)
{
    ctx->arena_used = 0; /* called after the step flushed every reduction */
    for (int32_t u = 0; u < ctx->nunits; u++) {
        struct zs_unit *un = &ctx->units[u];
        if (ctx->cfg.zero.stage < 2)
            memset(un->grad, 0, (size_t)un->part.padded * sizeof(float));
        un->accumulated = 0;
    }
}

/* ---------------------------------------------------------------- public API */

zs_status zs_grad_get(zs_ctx *ctx, int32_t unit, float **grad)
{
    zs_status st;

    if (!ctx || !ctx->set_up || !grad)
        return zs_fail(ZS_ERR_INVALID, "zs_grad_get: call zs_setup first");
    if (unit < 0 || unit >= ctx->nunits)
        return zs_fail(ZS_ERR_INVALID, "zs_grad_get: no unit %d", unit);
    st = zs_grads_progress(ctx);
    return st ? st : zs_grads_get(ctx, unit, grad);
}

zs_status zs_grad_ready(zs_ctx *ctx, int32_t unit)
{
    if (!ctx || !ctx->set_up)
        return zs_fail(ZS_ERR_INVALID, "zs_grad_ready: call zs_setup first");
    if (unit < 0 || unit >= ctx->nunits)
        return zs_fail(ZS_ERR_INVALID, "zs_grad_ready: no unit %d", unit);
    return zs_grads_ready(ctx, unit);
}
