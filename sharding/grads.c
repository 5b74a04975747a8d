/* grads.c - gradient buffers and their reduction. Stages 0-1 keep full gradients and reduce them once
 * per accumulation window; stages 2-3 hand out staging buffers from one bucket (reduce_bucket_size),
 * reduce-scatter every micro-batch as backward produces it, and fold the result into a persistent
 * shard. With overlap_comm the reduction runs while the program keeps computing. */
#include <stdint.h>
#include <stdio.h> /* defines: snprintf */
#include <stdlib.h>
#include <string.h>

#include "base/clock.h" /* defines: zs_now_s */
#include "base/error.h"
#include "kernels/optim.h"   /* defines: zs_dtype_name */
#include "core/ctx.h"
#include "core/memory.h"
#include "core/ranks.h"
#include "core/units.h" /* defines: zs_unit_grad_shard */
#include "offload/nvme_optim.h" /* defines: zs_nvme_grad_slot, zs_nvme_grad_write, zs_nvme_grad_read */
#include "offload/offload.h"
#include "bucket.h"   /* defines: struct zs_bucket */
#include "quant_path.h" /* defines: zs_quant_grads, zs_quant_reduce */
#include "sharding.h"

/* Hybrid sharding: the group's reduce-scatter summed this group's gradients into the shard at `shard`; the sum
 * across groups is an all-reduce among the ranks holding the same shard (in rank order, so every replica keeps
 * the same bits). The shard is a whole number of nreplicas chunks (core/partition.c). Waited for with the
 * group's operations in flight (stage 3's prefetched gathers) moving on meanwhile: a peer of the group may
 * wait on them while its replica waits on this rank. */
static zs_status replicas_wait(struct zs_ctx *ctx, int32_t u, struct zs_coll_req *req)
{
    zs_status st = ZS_OK;
    double t0 = zs_now_s(); /* past the watchdog's limit, zs_coll_wait names the late ranks */

    for (bool done = false; !st && req && !done && zs_now_s() - t0 < zs_wait_limit_s(ctx);) {
        st = zs_coll_test(&ctx->rcoll, req, &done);
        if (!st && !done)
            st = zs_comm_progress(ctx->scomm);
    }
    /* waited for after an error too: only the wait completes the request and gives it back to the pool (a
     * failed one returns at once); else it stays in flight on the replica comm, aimed at the gradient shard */
    zs_status w = zs_coll_wait(&ctx->rcoll, req);
    if (!st)
        st = w;
    if (st)
        zs_error_prefix("sum the gradients of unit '%s' across the shard groups", ctx->units[u].name);
    return st;
}

/* ZeRO-Infinity's gradient offload (the plan's grads_nvme): the reduced shard lands in a swap slot, copied for the
 * window's first micro-batch and added to the shard read back from the file for the later ones (the same
 * operations on the same values as the accumulator in memory), then goes to the file. In the window's last
 * micro-batch its squares for the norm are taken on the way. */
static zs_status stream_reduction(struct zs_ctx *ctx, int32_t u)
{
    struct zs_unit *un = &ctx->units[u];
    struct zs_device *d = &ctx->dev;
    bool first = un->accumulated == 0;
    const void *x;
    void *slot;
    zs_status st = zs_nvme_grad_slot(ctx->nvme, u, !first, &slot);

    if (!st && first)
        st = zs_device_copy(d, slot, false, un->reduced, false, (size_t)un->part.shard * ctx->csz);
    else if (!st)
        st = d->ops->accumulate(d, slot, un->reduced, ctx->cdt, un->part.shard, d->compute);
    un->accumulated++;
    un->grad = NULL;
    un->reduced = NULL;
    x = slot;
    if (!st && zs_window_last(ctx)) {
        st = d->ops->sumsq(d, &x, &un->part.shard, 1, ctx->gdt, &un->grad_sumsq, d->compute);
        un->grad_sumsq_at = st ? 0 : un->accumulated;
    }
    if (!st)
        st = zs_nvme_grad_write(ctx->nvme, u, slot);
    if (st)
        zs_error_prefix("fold the reduced gradients of unit '%s' (gradients on NVMe)", un->name);
    return st;
}

zs_status zs_grads_nvme_sumsq(struct zs_ctx *ctx, int32_t u)
{
    struct zs_unit *un = &ctx->units[u];
    const void *x;
    void *buf;
    zs_status st;

    if (un->grad_sumsq_at == un->accumulated && un->accumulated > 0)
        return ZS_OK;
    st = zs_nvme_grad_read(ctx->nvme, u, &buf);
    x = buf;
    if (!st)
        st = ctx->dev.ops->sumsq(&ctx->dev, &x, &un->part.shard, 1, ctx->gdt, &un->grad_sumsq, ctx->dev.compute);
    if (st)
        zs_error_prefix("zs_step: the gradient norm of unit '%s' (gradients on NVMe)", un->name);
    un->grad_sumsq_at = st ? 0 : un->accumulated;
    return st;
}

/* Completion of one unit's reduction: at stages 2-3 the reduced shard lands in the accumulator
 * (copied for the first micro-batch so that no extra rounding or -0.0 + 0.0 creeps in). Hybrid sharding: the
 * sum across shard groups waits for the step (zs_grads_sum_replicas), and so does the offloaded optimizer's copy. */
static zs_status finish_reduction(struct zs_ctx *ctx, int32_t u)
{
    struct zs_unit *un = &ctx->units[u];
    struct zs_device *d = &ctx->dev;
    bool dev = !d->host_access, hybrid = ctx->nreplicas > 1;
    zs_status st;

    un->grad_state = ZS_GRAD_IDLE;
    if (ctx->cfg.zero.stage < 2) /* reduced once, at the boundary: final (stage 1 may offload) */
        return ctx->cfg.zero.stage == 1 && !hybrid ? zs_offdev_grads_final(ctx, u, zs_unit_grad_shard(ctx, u)) : ZS_OK;
    if (zs_nvme_grads_on_disk(ctx->nvme, u))
        return stream_reduction(ctx, u);
    if (un->accumulated == 0)
        st = zs_device_copy(&ctx->dev, un->grad_shard, dev, un->reduced, dev, (size_t)un->part.shard * ctx->csz);
    else
        st = d->ops->accumulate(d, un->grad_shard, un->reduced, ctx->cdt, un->part.shard, d->compute);
    un->accumulated++;
    un->grad = NULL;
    un->reduced = NULL;
    if (st)
        zs_error_prefix("fold the reduced gradients of unit '%s'", un->name);
    /* the window's last micro-batch: an offloaded optimizer's gradients start down now, not at the step. A
     * reduction of an earlier micro-batch landing in a later one has accumulated <= window_micro. */
    if (!st && zs_window_last(ctx) && un->accumulated == ctx->window_micro + 1 && !hybrid)
        st = zs_offdev_grads_final(ctx, u, zs_unit_grad_shard(ctx, u));
    return st;
}

/* Collective at the step, after zs_grads_flush: each unit's window of gradients, reduced inside the shard
 * group, summed across the groups. Here, with every group operation of the window landed on every rank, no
 * rank can wait on a replica while its group waits on it (a sum taken as reductions land could: a stage-3
 * gather's shared-heap vote on one side, the replicas' sum on the other). Every unit's sum goes out before
 * the first is waited for, so that on a slow or oversubscribed network one sum's steps do not wait for the
 * previous sum to end; they are taken in unit order, and each is the same sum as alone. */
zs_status zs_grads_sum_replicas(struct zs_ctx *ctx)
{
    struct zs_coll_req **reqs;
    zs_status st = ZS_OK;
    int32_t launched = 0;
    char why[1024] = "";
    zs_dtype dt = ctx->cfg.zero.stage >= 2 ? ctx->cdt : ctx->pdt;

    if (ctx->nreplicas == 1 || ctx->cfg.zs.deterministic) /* deterministic mode: summed exactly (exact_sum.c) */
        return ZS_OK;
    reqs = calloc((size_t)ctx->nunits, sizeof(*reqs));
    if (!reqs)
        return zs_fail(ZS_ERR_NOMEM, "sum the gradients across the shard groups: out of memory");
    for (int32_t u = 0; !st && u < ctx->nunits; u++, launched = u) {
        if (ctx->units[u].frozen)
            continue;
        zs_label_on(ctx, ctx->rcomm, ZS_PURPOSE_GRAD, u);
        st = zs_coll_all_reduce(&ctx->rcoll, zs_unit_grad_shard(ctx, u), dt,
                                ctx->units[u].part.shard / ctx->nreplicas, 1.0f, &reqs[u]);
        if (st)
            zs_error_prefix("sum the gradients of unit '%s' across the shard groups", ctx->units[u].name);
    }
    if (st)
        snprintf(why, sizeof(why), "%s", zs_last_error());
    /* every sum that went out is waited for, after an error too: nothing is left in flight. The later waits of
     * a broken comm fail too, each naming its own unit: the first error is the one reported. */
    for (int32_t u = 0; u < launched; u++) {
        if (!reqs[u])
            continue;
        zs_status w = replicas_wait(ctx, u, reqs[u]);
        if (!st)
            st = w;
        if (!st)
            st = zs_offdev_grads_final(ctx, u, zs_unit_grad_shard(ctx, u));
        if (st && !why[0])
            snprintf(why, sizeof(why), "%s", zs_last_error());
    }
    free(reqs);
    return st ? zs_fail(st, "%s", why) : ZS_OK;
}

static zs_status pop_head(struct zs_ctx *ctx)
{
    int32_t u = ctx->bucket->pending[0];
    struct zs_unit *un = &ctx->units[u];
    zs_status st = zs_coll_wait(ctx->scoll, un->reduce_req);

    un->reduce_req = NULL;
    memmove(ctx->bucket->pending, ctx->bucket->pending + 1, (size_t)(--ctx->bucket->npending) * sizeof(int32_t));
    if (st) {
        zs_error_prefix("reduce gradients of unit '%s'", un->name);
        return st;
    }
    return finish_reduction(ctx, u);
}

/* Completions are taken in launch order, so accumulation order never depends on timing. */
zs_status zs_grads_progress(struct zs_ctx *ctx)
{
    zs_status st = zs_comm_progress(ctx->comm);

    if (!st && ctx->cfg.zs.deterministic) /* the exact sums' own collectives (exact.c) */
        return zs_exact_progress(ctx, false);
    while (!st && ctx->bucket->npending > 0) {
        bool done = false;
        st = zs_coll_test(ctx->scoll, ctx->units[ctx->bucket->pending[0]].reduce_req, &done);
        if (st || !done)
            break;
        st = pop_head(ctx);
    }
    return st;
}

zs_status zs_grads_flush(struct zs_ctx *ctx)
{
    zs_status st = ZS_OK;

    if (ctx->cfg.zs.deterministic)
        return zs_exact_progress(ctx, true);
    while (!st && ctx->bucket->npending > 0)
        st = pop_head(ctx);
    return st;
}

static zs_status launch(struct zs_ctx *ctx, int32_t u)
{
    struct zs_unit *un = &ctx->units[u];
    int64_t s = un->part.shard;
    void *g = un->grad;
    zs_status st;

    /* prescale_gradients: in the gradients' dtype, as the program left them */
    st = ctx->pre_scale != 1.0f ? ctx->dev.ops->scale(&ctx->dev, g, ctx->pdt, un->part.padded, ctx->pre_scale,
                                                      ctx->dev.compute)
                                : ZS_OK;
    if (st) {
        zs_error_prefix("prescale gradients of unit '%s'", un->name);
        return st;
    }
    zs_label_on(ctx, ctx->scomm, ZS_PURPOSE_GRAD, u);
    if (ctx->cfg.zero.stage == 0 || (ctx->cfg.zero.stage == 1 && !ctx->cfg.zero.reduce_scatter))
        st = zs_coll_all_reduce(ctx->scoll, g, ctx->pdt, s, ctx->post_scale, &un->reduce_req);
    else if (ctx->cfg.zero.stage == 1)
        st = zs_coll_reduce_scatter(ctx->scoll, g, ctx->pdt, zs_at(g, zs_partition_begin(&un->part, ctx->shard_rank), ctx->psz),
                                    ctx->pdt, s, ctx->post_scale, &un->reduce_req);
    else if (zs_quant_grads(ctx)) /* complete here: reduce_req stays NULL */
        st = zs_quant_reduce(ctx, g, un->reduced, ctx->cdt, s);
    else
        st = zs_coll_reduce_scatter(ctx->scoll, g, ctx->pdt, un->reduced, ctx->cdt, s, ctx->post_scale, &un->reduce_req);
    if (st) {
        zs_error_prefix("reduce gradients of unit '%s'", un->name);
        return st;
    }
    un->grad_state = ZS_GRAD_REDUCING;
    ctx->bucket->pending[ctx->bucket->npending++] = u;
    if (!ctx->cfg.zero.overlap_comm)
        return zs_grads_flush(ctx);
    return zs_grads_progress(ctx);
}

/* Bytes a unit's slot in the bucket takes: the staging, then (fp32 reduction of 16-bit gradients) room
 * for this rank's reduced part; in place in the staging otherwise. */
static int64_t slot_bytes(const struct zs_ctx *ctx, const struct zs_unit *un)
{
    int64_t need = un->part.padded * (int64_t)ctx->psz;

    if (ctx->cdt != ctx->pdt)
        need += un->part.shard * (int64_t)ctx->csz;
    return (need + 63) / 64 * 64;
}

/* The first offset at or after `at` where `need` bytes overlap no open slot. A unit between zs_grad_get
 * and zs_grad_ready keeps its slot when the bucket restarts; placing the next unit over it would sum
 * two units' gradients into one buffer without a word. Every rank makes the same calls, so every rank
 * finds the same offset. */
static int64_t slot_place(const struct zs_ctx *ctx, int64_t at, int64_t need)
{
    bool moved = true;

    while (moved) {
        moved = false;
        for (int32_t u = 0; u < ctx->nunits; u++) {
            const struct zs_unit *o = &ctx->units[u];
            int64_t off = o->grad_state == ZS_GRAD_OPEN ? (char *)o->grad - (char *)ctx->bucket->arena : 0;
            if (o->grad_state == ZS_GRAD_OPEN && at < off + slot_bytes(ctx, o) && off < at + need) {
                at = off + slot_bytes(ctx, o);
                moved = true;
            }
        }
    }
    return at;
}

static zs_status open_slots_fail(const struct zs_ctx *ctx, const struct zs_unit *un, int64_t need)
{
    const char *open = "?";

    for (int32_t u = 0; u < ctx->nunits; u++)
        if (ctx->units[u].grad_state == ZS_GRAD_OPEN) {
            open = ctx->units[u].name;
            break;
        }
    return zs_fail(ZS_ERR_INVALID, "zs_grad_get: unit '%s' needs %lld bytes of the reduction bucket "
                   "(zero_optimization.reduce_bucket_size, %lld bytes here), but units still between zs_grad_get "
                   "and zs_grad_ready hold its free room (first: '%s'); hand them over sooner or raise "
                   "reduce_bucket_size", un->name, (long long)need, (long long)ctx->bucket->arena_cap, open);
}

zs_status zs_grads_open(struct zs_ctx *ctx, int32_t u, void **grad)
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
    if (ctx->cfg.zero.stage >= 2 && !ctx->cfg.zs.deterministic) {
        /* The bucket restarts only here and at the step, never when reductions happen to finish: every
         * rank must place a unit's staging buffer at the same offset, because peers on the node read it
         * there. */
        int64_t stage_b = un->part.padded * (int64_t)ctx->psz;
        int64_t need = slot_bytes(ctx, un), at = slot_place(ctx, ctx->bucket->arena_used, need);
        if (at + need > ctx->bucket->arena_cap) {
            st = zs_grads_flush(ctx); /* the bucket is full: its reductions must land before reuse */
            if (st)
                return st;
            at = slot_place(ctx, 0, need);
            if (at + need > ctx->bucket->arena_cap)
                return open_slots_fail(ctx, un, need);
        }
        ctx->bucket->arena_used = at;
        un->grad = ctx->bucket->arena + ctx->bucket->arena_used;
        un->reduced = ctx->cdt != ctx->pdt ? ctx->bucket->arena + ctx->bucket->arena_used + stage_b
                                           : zs_at(un->grad, zs_partition_begin(&un->part, ctx->shard_rank), ctx->psz);
        ctx->bucket->arena_used += need;
        st = ctx->dev.ops->zero(&ctx->dev, un->grad, (size_t)stage_b, ctx->dev.compute);
        if (st)
            return st;
    }
    un->grad_state = ZS_GRAD_OPEN;
    *grad = un->grad;
    return ZS_OK;
}

zs_status zs_grads_submit(struct zs_ctx *ctx, int32_t u)
{
    struct zs_unit *un = &ctx->units[u];

    if (un->grad_state != ZS_GRAD_OPEN)
        return zs_fail(ZS_ERR_INVALID, "zs_grad_ready: unit '%s': call zs_grad_get first in this micro-batch",
                       un->name);
    if (ctx->cfg.zs.deterministic) { /* summed exactly, starting at the window's last micro-batch (exact.c) */
        zs_status st = zs_exact_ready(ctx, u);
        if (st)
            return st;
        un->ready_micro = ctx->micro_step;
        un->grad_state = ZS_GRAD_IDLE;
        return zs_window_last(ctx) ? zs_exact_launch(ctx, u) : ZS_OK;
    }
    un->ready_micro = ctx->micro_step;
    if (ctx->cfg.zero.stage < 2 && !zs_window_last(ctx)) {
        un->grad_state = ZS_GRAD_IDLE; /* keeps accumulating locally until the boundary */
        return ZS_OK;
    }
    return launch(ctx, u);
}

zs_status zs_grads_setup(struct zs_ctx *ctx)
{
    struct zs_bucket *b = calloc(1, sizeof(*b));

    if (b)
        b->pending = calloc((size_t)ctx->nunits, sizeof(int32_t));
    if (!b || !b->pending) {
        free(b);
        return zs_fail(ZS_ERR_NOMEM, "zs_setup: out of memory");
    }
    ctx->bucket = b;
    return ZS_OK;
}

zs_status zs_grads_bucket_open(struct zs_ctx *ctx, int64_t bytes, int64_t elems)
{
    struct zs_bucket *b = ctx->bucket;

    b->arena = zs_mem_alloc_comm(ctx, ZS_MEM_BUFFERS, (uint64_t)bytes);
    if (!b->arena)
        return ctx->over_budget ? ZS_ERR_NOMEM
                                : zs_fail(ZS_ERR_NOMEM, "zs_setup: out of memory for a %lld-element gradient bucket",
                                          (long long)elems);
    b->arena_cap = bytes;
    return ZS_OK;
}

void zs_grads_free(struct zs_ctx *ctx)
{
    struct zs_bucket *b = ctx->bucket;

    if (!b)
        return;
    zs_mem_free_comm(ctx, ZS_MEM_BUFFERS, b->arena, (uint64_t)b->arena_cap);
    free(b->pending);
    free(b);
    ctx->bucket = NULL;
}

zs_status zs_grads_zero(struct zs_ctx *ctx)
{
    zs_status st = ZS_OK;

    ctx->bucket->arena_used = 0; /* called after the step flushed every reduction */
    for (int32_t u = 0; u < ctx->nunits; u++) {
        struct zs_unit *un = &ctx->units[u];
        if (ctx->cfg.zero.stage < 2 && !st && !un->frozen) /* deterministic mode: the deposits left the stage 2-3 buffers zero */
            st = ctx->dev.ops->zero(&ctx->dev, un->grad, (size_t)un->part.padded * ctx->psz, ctx->dev.compute);
        un->accumulated = 0;
        un->grad_sumsq_at = 0;
    }
    if (ctx->cfg.zs.deterministic)
        zs_exact_zero(ctx);
    zs_offdev_window_end(ctx);
    return st;
}

/* ---------------------------------------------------------------- public API */

zs_status zs_grad_unit_check(const struct zs_ctx *ctx, int32_t unit, const char *fn)
{
    if (!ctx || !ctx->set_up)
        return zs_fail(ZS_ERR_INVALID, "%s: call zs_setup first", fn);
    if (unit < 0 || unit >= ctx->nunits)
        return zs_fail(ZS_ERR_INVALID, "%s: no unit %d", fn, unit);
    if (ctx->units[unit].frozen)
        return zs_fail(ZS_ERR_INVALID, "%s: unit '%s' is frozen: it has no gradients (skip it in backward)", fn,
                       ctx->units[unit].name);
    return ZS_OK;
}

zs_status zs_grad_buffer(zs_ctx *ctx, int32_t unit, void **grad)
{
    zs_status st;

    if (!grad)
        return zs_fail(ZS_ERR_INVALID, "zs_grad_buffer: NULL argument");
    st = zs_grad_unit_check(ctx, unit, "zs_grad_buffer");
    if (!st)
        st = zs_grads_progress(ctx);
    return st ? st : zs_grads_open(ctx, unit, grad);
}

zs_status zs_grad_get(zs_ctx *ctx, int32_t unit, float **grad)
{
    if (ctx && ctx->pdt != ZS_DTYPE_FP32)
        return zs_fail(ZS_ERR_INVALID, "zs_grad_get: the parameters are %s; use zs_grad_buffer, whose buffer has "
                       "the parameters' dtype", zs_dtype_name(ctx->pdt));
    return zs_grad_buffer(ctx, unit, (void **)grad);
}

zs_status zs_grad_ready(zs_ctx *ctx, int32_t unit)
{
    zs_status st = zs_grad_unit_check(ctx, unit, "zs_grad_ready");

    if (!st)
        zs_mem_sample(ctx); /* the program's gradients of the unit are all made */
    return st ? st : zs_grads_submit(ctx, unit);
}
