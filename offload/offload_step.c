/* offload_step.c - ZeRO-Offload's step from a device the host cannot read in place: the CPU kernels step the
 * units (or, with the state on NVMe, the swapper's slices) against the host pool while the next unit's
 * parameters come down on one copy stream and the previous one's go up on the other (offload_dev.c's
 * staging). */
#include "base/dtype.h" /* defines: zs_at, zs_dtype_bytes */
#include "base/error.h" /* defines: zs_error_prefix */
#include "core/ctx.h"
#include "core/units.h" /* defines: zs_unit_tensor, zs_unit_launch, zs_unit_master, zs_params_on_host */
#include "nvme_optim.h" /* defines: zs_nvme_optim_step */
#include "offdev.h"     /* defines: struct zs_offdev */
#include "offload.h"

/* The optimizer state on NVMe from a device the host cannot read in place: one slice of unit u, its state
 * paged into the swapper's slot (nvme_optim.c's pipeline). The slice's parameters come down into pinned slot
 * k % 2 once that slot's last copy up is done, the CPU kernels step them with the gradients that came down
 * during backward, and they go up on the other copy stream while the next slice comes down. A stage-3 shard
 * that lives off the device (offload_param cpu, or nvme: paged into the slot with its state and written back
 * to the swap file with it, for the next fetch to read) is stepped where it is, with nothing to copy. */
static void optim_paged_dev(struct zs_ctx *ctx, int32_t u, float *disk_p, void *disk_w, float *s1, float *s2,
                            void *disk_g, int64_t begin, int64_t end, void *arg)
{
    const struct zs_optim_groups *gr = arg;
    struct zs_device *d = &ctx->dev;
    struct zs_offdev *o = ctx->off;
    struct zs_optim_tensor t;
    struct zs_optim_launch l;
    size_t bytes = (size_t)(end - begin) * ctx->psz;
    int32_t k = o->k++;
    void *param;
    zs_status st;

    (void)disk_g; /* NULL: from such a device the gradients come down into the staging (the plan's grads_nvme) */
    if (o->st)
        return;
    zs_unit_tensor(ctx, u, disk_p, disk_w, s1, s2, begin, end, &t);
    t.bufs.grad = zs_at(zs_offdev_grads(ctx, u), begin, zs_dtype_bytes(ctx->gdt));
    param = t.bufs.param;
    if (!zs_params_on_host(ctx, &ctx->units[u]) && !zs_nvme_param_on_disk(ctx->nvme, u))
        t.bufs.param = zs_offdev_slot(ctx, k);
    l = zs_unit_launch(ctx, &gr->steps[0], gr->t, zs_unit_split(ctx, u, &t, begin, gr->steps, gr->t));
    if (t.bufs.param == param) {
        st = ctx->host_dev.ops->optim(&ctx->host_dev, &l, NULL);
        goto out;
    }
    st = d->ops->stream_wait(d, o->down, o->ev_up[k & 1]);
    if (!st)
        st = d->ops->copy(d, t.bufs.param, param, bytes, ZS_COPY_D2H, o->down);
    if (!st)
        st = d->ops->stream_sync(d, o->down);
    if (!st)
        st = ctx->host_dev.ops->optim(&ctx->host_dev, &l, NULL);
    if (!st)
        st = d->ops->copy(d, param, t.bufs.param, bytes, ZS_COPY_H2D, o->up);
    if (!st)
        st = d->ops->event_record(d, o->ev_up[k & 1], o->up);
out:
    if (st) {
        zs_error_prefix("zs_step: offloaded optimizer (nvme), unit '%s'", ctx->units[u].name);
        o->st = st;
    }
}

/* Unit u's working parameters into slot k on the copy stream down, once that slot's last copy up is done
 * (fp32: the masters are the working parameters, on the device; 16-bit: the kernel writes their rounding). */
static zs_status params_down(struct zs_ctx *ctx, int32_t u, int32_t k)
{
    struct zs_device *d = &ctx->dev;
    int64_t n;
    struct zs_optim_tensor t;
    zs_status st;

    zs_unit_master(ctx, u, &n);
    zs_unit_tensor(ctx, u, NULL, NULL, NULL, NULL, 0, n, &t);
    st = d->ops->stream_wait(d, ctx->off->down, ctx->off->ev_up[k & 1]);
    return st ? st : d->ops->copy(d, zs_offdev_slot(ctx, k), t.bufs.param, (size_t)n * ctx->psz, ZS_COPY_D2H,
                                  ctx->off->down);
}

/* The next unit after u with elements to step and parameters on the device, or nunits. */
static int32_t next_staged(struct zs_ctx *ctx, int32_t u)
{
    int64_t n;

    for (u++; u < ctx->nunits; u++) {
        zs_unit_master(ctx, u, &n);
        if (n > 0 && !ctx->units[u].frozen && !zs_params_on_host(ctx, &ctx->units[u]))
            break;
    }
    return u;
}

/* Both offloaded steps from such a device start here: every unit's gradients queued down (any unit whose did
 * not go during backward, now), and the copy stream down ordered after everything the compute stream did to
 * the parameters (the last step's gather). */
static zs_status offdev_step_begin(struct zs_ctx *ctx)
{
    struct zs_device *d = &ctx->dev;
    zs_status st = ZS_OK;

    for (int32_t v = 0; v < ctx->nunits && !st; v++)
        if (!ctx->units[v].frozen)
            st = zs_offdev_grads_final(ctx, v, zs_unit_grad_shard(ctx, v));
    if (!st)
        st = d->ops->event_record(d, ctx->off->ev_grad, d->compute);
    return st ? st : d->ops->stream_wait(d, ctx->off->down, ctx->off->ev_grad);
}

/* ... and end here: the compute stream waits for the last copy up. */
static zs_status offdev_step_end(struct zs_ctx *ctx)
{
    struct zs_device *d = &ctx->dev;
    zs_status st = d->ops->event_record(d, ctx->off->ev_done, ctx->off->up);

    return st ? st : d->ops->stream_wait(d, d->compute, ctx->off->ev_done);
}

/* The optimizer offloaded (offload_optimizer cpu) from a device the host cannot read in place. The reduced
 * gradients came down during backward (offload_dev.c; any unit that did not, now); then unit by unit, in two
 * pinned slots: while the CPU kernels step unit k against the masters and moments in the host pool, unit k+1's
 * parameters come down on one copy stream and unit k-1's go up on the other. The compute stream waits for the
 * last copy up. */
zs_status zs_offload_step_from_device(struct zs_ctx *ctx, const struct zs_optim_groups *gr)
{
    struct zs_device *d = &ctx->dev;
    struct zs_offdev *o = ctx->off;
    int32_t k = 0, u = next_staged(ctx, -1);
    zs_status st = offdev_step_begin(ctx);

    if (!st && u < ctx->nunits)
        st = params_down(ctx, u, 0);
    for (int32_t v = 0; v < ctx->nunits && !st; v++) {
        struct zs_unit *un = &ctx->units[v];
        struct zs_optim_tensor t;
        struct zs_optim_launch l;
        int64_t n;
        bool staged = v == u;
        zs_unit_master(ctx, v, &n);
        if (!n || un->frozen)
            continue;
        zs_unit_tensor(ctx, v, NULL, NULL, un->m, un->v, 0, n, &t);
        void *param = t.bufs.param;
        st = d->ops->stream_sync(d, o->down); /* this unit's parameters, and every gradient */
        if (!st && staged) {
            u = next_staged(ctx, v);
            if (u < ctx->nunits)
                st = params_down(ctx, u, k + 1);
            t.bufs.param = zs_offdev_slot(ctx, k);
        }
        t.bufs.grad = zs_offdev_grads(ctx, v);
        l = zs_unit_launch(ctx, &gr->steps[0], gr->t, zs_unit_split(ctx, v, &t, 0, gr->steps, gr->t));
        if (!st)
            st = ctx->host_dev.ops->optim(&ctx->host_dev, &l, NULL);
        if (!st && staged)
            st = d->ops->copy(d, param, t.bufs.param, (size_t)n * ctx->psz, ZS_COPY_H2D, o->up);
        if (!st && staged)
            st = d->ops->event_record(d, o->ev_up[k++ & 1], o->up);
        if (st)
            zs_error_prefix("zs_step: offloaded optimizer, unit '%s'", un->name);
    }
    return st ? st : offdev_step_end(ctx);
}

/* The optimizer state on NVMe from a device the host cannot read in place: the gradients down and waited for
 * (with everything the compute stream did before them), then nvme_optim.c's pipeline with optim_paged_dev per
 * slice; the compute stream waits for the last copy up. */
zs_status zs_offload_step_nvme_from_device(struct zs_ctx *ctx, const struct zs_optim_groups *gr)
{
    struct zs_device *d = &ctx->dev;
    struct zs_offdev *o = ctx->off;
    zs_status st = offdev_step_begin(ctx);

    if (!st) /* every gradient on the host, and (offload_param cpu) nothing on the device still reading a shard */
        st = d->ops->stream_sync(d, o->down);
    if (st)
        return st;
    o->st = ZS_OK;
    o->k = 0;
    st = zs_nvme_optim_step(ctx, ctx->nvme, optim_paged_dev, (void *)gr);
    if (!st)
        st = o->st;
    return st ? st : offdev_step_end(ctx);
}
