/* offload_dev.c - ZeRO-Offload from a device the host cannot read in place (offload_optimizer cpu or nvme
 * with zeroshard.device cuda): the pinned host staging that each unit's reduced gradients stream down into as soon
 * as its last reduction of the window lands (sharding/grads.c), while backward goes on, and the two parameter
 * slots through which offload_step.c's pipeline steps unit k on the CPU while unit k+1's parameters come down
 * and unit k-1's go up (with nvme: slice by slice of the swapper's sub-groups). */
#include <stdlib.h>
#include <string.h>

#include "base/error.h" /* defines: zs_fail, zs_error_prefix */
#include "core/ctx.h"
#include "core/units.h"
#include "offdev.h" /* defines: struct zs_offdev */
#include "offload.h"

static size_t round64(uint64_t b)
{
    return (size_t)((b + 63) / 64 * 64);
}

static zs_status off_fail(zs_status st, const char *what)
{
    zs_error_prefix("zs_setup: offload staging, %s", what);
    return st;
}

zs_status zs_offdev_setup(struct zs_ctx *ctx)
{
    struct zs_offdev *o;
    struct zs_device *d = &ctx->dev;
    size_t slot = 64, grads = 0;
    zs_status st;

    if (d->host_access || (!zs_offload_optimizer_on_host(ctx) && !zs_offload_optimizer_on_nvme(ctx)))
        return ZS_OK;
    o = ctx->off = calloc(1, sizeof(*o));
    if (!o)
        return zs_fail(ZS_ERR_NOMEM, "zs_setup: out of memory");
    o->grad_at = calloc((size_t)(ctx->nunits ? ctx->nunits : 1), sizeof(*o->grad_at));
    o->grad_down = calloc((size_t)(ctx->nunits ? ctx->nunits : 1), sizeof(*o->grad_down));
    if (!o->grad_at || !o->grad_down)
        return zs_fail(ZS_ERR_NOMEM, "zs_setup: out of memory");
    for (int32_t u = 0; u < ctx->nunits; u++) {
        int64_t n = ctx->units[u].frozen ? 0 : zs_plan_opt_elems(ctx->cfg.zero.stage, &ctx->units[u].part);
        size_t p = round64((uint64_t)n * ctx->psz);
        slot = p > slot ? p : slot;
        o->grad_at[u] = grads;
        grads += round64((uint64_t)n * zs_dtype_bytes(ctx->gdt));
    }
    o->slot = slot;
    o->bytes = 2 * slot + grads;
    if (posix_memalign(&o->buf, 64, o->bytes))
        return zs_fail(ZS_ERR_NOMEM, "zs_setup: out of memory for %zu bytes of offload staging", o->bytes);
    /* a refused pin leaves the staging pageable (slower copies, the same bits) rather than failing this rank
     * alone while its peers go on into a collective */
    o->pinned = !d->ops->host_register(d, o->buf, o->bytes);
    if (!o->pinned && !ctx->quiet)
        zs_log("rank %d: warning: the offload staging stays pageable: %s", ctx->rank, zs_last_error());
    if ((st = d->ops->stream_create(d, &o->down)) || (st = d->ops->stream_create(d, &o->up)) ||
        (st = d->ops->event_create(d, &o->ev_grad)) || (st = d->ops->event_create(d, &o->ev_up[0])) ||
        (st = d->ops->event_create(d, &o->ev_up[1])) || (st = d->ops->event_create(d, &o->ev_done)))
        return off_fail(st, "streams");
    return ZS_OK;
}

void zs_offdev_free(struct zs_ctx *ctx)
{
    struct zs_offdev *o = ctx->off;
    struct zs_device *d = &ctx->dev;

    if (!o || !d->ops)
        return;
    struct zs_dev_event *ev[4] = { o->ev_grad, o->ev_up[0], o->ev_up[1], o->ev_done };
    /* copies may still read or fill the staging */
    if (o->down)
        d->ops->stream_sync(d, o->down);
    if (o->up)
        d->ops->stream_sync(d, o->up);
    for (int k = 0; k < 4; k++)
        if (ev[k])
            d->ops->event_free(d, ev[k]);
    if (o->down)
        d->ops->stream_free(d, o->down);
    if (o->up)
        d->ops->stream_free(d, o->up);
    if (o->buf) {
        if (o->pinned)
            d->ops->host_unregister(d, o->buf);
        free(o->buf);
    }
    free(o->grad_at);
    free(o->grad_down);
    free(o);
    ctx->off = NULL;
}

void *zs_offdev_grads(struct zs_ctx *ctx, int32_t u)
{
    return (char *)ctx->off->buf + 2 * ctx->off->slot + ctx->off->grad_at[u];
}

void *zs_offdev_slot(struct zs_ctx *ctx, int32_t k)
{
    return (char *)ctx->off->buf + (size_t)(k & 1) * ctx->off->slot;
}

/* Unit u's gradients (shard: this rank's reduced part, on the device) are final for this window (its last
 * reduction folded in, on the compute stream): they go down on the copy stream after that work, and the
 * step finds them on the host. */
zs_status zs_offdev_grads_final(struct zs_ctx *ctx, int32_t u, const void *shard)
{
    struct zs_offdev *o = ctx->off;
    struct zs_device *d = &ctx->dev;
    struct zs_unit *un = &ctx->units[u];
    size_t bytes = (size_t)zs_plan_opt_elems(ctx->cfg.zero.stage, &un->part) * zs_dtype_bytes(ctx->gdt);
    zs_status st;

    if (!o || !o->buf || o->grad_down[u])
        return ZS_OK;
    st = d->ops->event_record(d, o->ev_grad, d->compute);
    if (!st)
        st = d->ops->stream_wait(d, o->down, o->ev_grad);
    if (!st && bytes)
        st = d->ops->copy(d, zs_offdev_grads(ctx, u), shard, bytes, ZS_COPY_D2H, o->down);
    if (st) {
        zs_error_prefix("offloaded optimizer: gradients of unit '%s' down", un->name);
        return st;
    }
    o->grad_down[u] = true;
    return ZS_OK;
}

void zs_offdev_window_end(struct zs_ctx *ctx)
{
    if (ctx->off && ctx->off->grad_down)
        memset(ctx->off->grad_down, 0, (size_t)ctx->nunits * sizeof(*ctx->off->grad_down));
}
