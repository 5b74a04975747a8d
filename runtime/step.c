/* step.c - zs_step: at each accumulation boundary, wait for the gradient reductions, compute the global
 * norm in a fixed order, clip, run the optimizer on this rank's shard, and make the updated parameters
 * visible again (all-gather at stages 1-2, drop stale gathered copies at stage 3). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine.h"
#include "error.h"
#include "nvme_optim.h"
#include "optim.h"
#include "schedule.h"
#include "base/test_hooks.h"

static double now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void *zs_unit_working(struct zs_ctx *ctx, int32_t u)
{
    struct zs_unit *un = &ctx->units[u];

    if (ctx->cfg.zero.stage == 0)
        return un->full;
    return un->sharded ? un->shard : zs_at(un->full, zs_partition_begin(&un->part, ctx->rank), ctx->psz);
}

float *zs_unit_master(struct zs_ctx *ctx, int32_t u, int64_t *n)
{
    struct zs_unit *un = &ctx->units[u];

    *n = ctx->cfg.zero.stage == 0 ? un->part.padded : un->part.shard;
    if (ctx->pdt != ZS_DTYPE_FP32)
        return un->master;
    return zs_unit_working(ctx, u);
}

/* Test hook: ZS_TEST_OVERFLOW=R:B1,B2,... makes rank R see an overflow (an Inf in its gradients) at the
 * accumulation boundaries B1, B2, ... (1 = the first), as fp16 gradients that overflowed there would. */
static bool injected_overflow(const struct zs_ctx *ctx)
{
    const char *e = getenv(ZS_TEST_HOOK_OVERFLOW), *p;
    char *end;
    long r;

    if (!e || !*e || (r = strtol(e, &end, 10), *end != ':') || r != ctx->rank)
        return false;
    for (p = end + 1; *p;) {
        long long b = strtoll(p, &end, 10);
        if (end == p)
            return false;
        if (b == ctx->global_step + 1)
            return true;
        p = *end == ',' ? end + 1 : end;
        if (*end && *end != ',')
            return false;
    }
    return false;
}

/* Per rank: squares summed over its shard range of each unit in unit order; across ranks: the partials
 * gathered and added in rank order. Every stage sums the same ranges in the same order. The result is
 * of the gradients as reduced (times the loss scale); *overflow: some rank's partial is not finite,
 * which every rank sees alike, from the same gathered partials. */
static zs_status global_grad_norm(struct zs_ctx *ctx, double *norm, bool *overflow)
{
    double mine = 0.0, total = 0.0, *all;
    zs_status st;

    if (ctx->cfg.zs.deterministic) { /* every rank rounds and squares the whole exact sum, in one order */
        st = zs_exact_reduce(ctx, &total);
        *overflow = !isfinite(total) || injected_overflow(ctx);
        *norm = *overflow ? INFINITY : sqrt(total);
        return st;
    }

    /* the device sums each unit's shard in the fixed order; the host adds the partials in unit order */
    all = malloc((size_t)(ctx->world > ctx->nunits ? ctx->world : ctx->nunits) * sizeof(double));
    const void **x = malloc((size_t)ctx->nunits * sizeof(*x));
    int64_t *n = malloc((size_t)ctx->nunits * sizeof(*n));
    st = all && x && n ? ZS_OK : zs_fail(ZS_ERR_NOMEM, "zs_step: out of memory");
    for (int32_t u = 0; !st && u < ctx->nunits; u++) {
        x[u] = zs_grads_shard(ctx, u);
        n[u] = ctx->units[u].part.shard;
    }
    if (!st)
        st = ctx->dev.ops->sumsq(&ctx->dev, x, n, ctx->nunits, ctx->gdt, all, ctx->dev.compute);
    for (int32_t u = 0; !st && u < ctx->nunits; u++)
        mine += all[u];
    free(x);
    free(n);
    if (st) {
        free(all);
        zs_error_prefix("zs_step: the gradient norm's partials");
        return st;
    }
    if (injected_overflow(ctx))
        mine = INFINITY;
    zs_label(ctx, ZS_PURPOSE_NORM, -1);
    st = zs_comm_allgather_bytes(ctx->comm, &mine, all, (int32_t)sizeof(double));
    *overflow = false;
    for (int32_t r = 0; !st && r < ctx->world; r++) {
        total += all[r];
        *overflow |= !isfinite(all[r]);
    }
    free(all);
    *norm = sqrt(total);
    return st;
}

/* DeepSpeed's DynamicLossScaler.update_scale, step for step: an overflow shrinks the scale once
 * `hysteresis` overflows have used up the delay; loss_scale_window clean iterations since the last
 * overflow grow it. */
static zs_status scaler_update(struct zs_ctx *ctx, bool overflow)
{
    struct zs_scaler *s = &ctx->scaler;
    const struct zs_fp16_config *f = &ctx->cfg.fp16;

    if (!s->dynamic)
        return ZS_OK;
    if (overflow) {
        if (f->hysteresis == 1 || s->cur_hysteresis == 1) {
            if (s->scale <= f->min_loss_scale)
                return zs_fail(ZS_ERR_INVALID, "zs_step: the fp16 gradients overflow at the minimum loss scale "
                               "(fp16.min_loss_scale %g): the run cannot go on", f->min_loss_scale);
            s->scale = s->scale / 2.0 > f->min_loss_scale ? s->scale / 2.0 : f->min_loss_scale;
        } else {
            s->cur_hysteresis--;
        }
        s->last_overflow_iter = s->cur_iter;
    } else {
        if (f->consecutive_hysteresis)
            s->cur_hysteresis = f->hysteresis;
        if ((s->cur_iter - s->last_overflow_iter) % f->loss_scale_window == 0) {
            if (!f->consecutive_hysteresis)
                s->cur_hysteresis = f->hysteresis;
            s->scale *= 2.0;
        }
    }
    s->cur_iter++;
    return ZS_OK;
}

void zs_scaler_init(struct zs_ctx *ctx)
{
    const struct zs_fp16_config *f = &ctx->cfg.fp16;

    ctx->scaler = (struct zs_scaler){.scale = 1.0, .last_overflow_iter = -1};
    if (ctx->pdt == ZS_DTYPE_FP16) {
        ctx->scaler.dynamic = f->loss_scale == 0.0;
        ctx->scaler.scale = f->loss_scale > 0.0 ? f->loss_scale : ldexp(1.0, (int)f->initial_scale_power);
        ctx->scaler.cur_hysteresis = f->hysteresis;
    }
    ctx->stats.loss_scale = ctx->scaler.scale;
}

/* The per-step scalars of the configured optimizer, in double and rounded once to float. */
static void step_scalars(const struct zs_ctx *ctx, double lr, float coef, struct zs_optim_step *s)
{
    const struct zs_optim_config *o = &ctx->cfg.optim;
    double t = (double)(ctx->global_step - ctx->skipped_steps + 1); /* steps the optimizer has taken */
    bool adam = o->type == ZS_OPTIM_ADAM || o->type == ZS_OPTIM_ADAMW;
    double bc1 = adam && o->bias_correction ? 1.0 - pow(o->beta1, t) : 1.0;
    double bc2 = adam && o->bias_correction ? 1.0 - pow(o->beta2, t) : 1.0;

    memset(s, 0, sizeof(*s));
    s->lr = (float)lr;
    s->beta1 = (float)o->beta1;
    s->beta2 = (float)o->beta2;
    s->one_minus_beta1 = (float)(1.0 - o->beta1);
    s->one_minus_beta2 = (float)(1.0 - o->beta2);
    s->eps = (float)o->eps;
    s->weight_decay = (float)o->weight_decay;
    s->step_size = (float)(lr / bc1);
    s->inv_sqrt_bc2 = (float)(1.0 / sqrt(bc2));
    s->decay = (float)(lr * o->weight_decay);
    s->grad_scale = coef;
    s->momentum = (float)o->momentum;
    s->dampening_c = (float)(1.0 - o->dampening);
    s->nesterov = o->nesterov;
    s->first = ctx->global_step - ctx->skipped_steps == 0;
}

/* Elements [begin, end) of what this rank owns of unit u as one tensor of a launch; s1, s2 point at the
 * unit's element 0, disk_p at its fp32 masters when they were paged in from NVMe. */
static void optim_tensor(struct zs_ctx *ctx, int32_t u, float *disk_p, float *s1, float *s2, int64_t begin,
                         int64_t end, struct zs_optim_tensor *t)
{
    struct zs_unit *un = &ctx->units[u];
    int64_t n;
    float *master = disk_p ? disk_p : zs_unit_master(ctx, u, &n);
    void *g = ctx->cfg.zero.stage == 0 ? un->grad : zs_grads_shard(ctx, u);

    *t = (struct zs_optim_tensor){ .n = end - begin };
    if (ctx->pdt == ZS_DTYPE_FP32) {
        t->bufs.param = master + begin;
    } else { /* the kernel updates the fp32 master and writes its rounding to the working copy */
        t->bufs.param = zs_at(zs_unit_working(ctx, u), begin, ctx->psz);
        t->bufs.master = master + begin;
    }
    t->bufs.grad = zs_at(g, begin, zs_dtype_bytes(ctx->gdt));
    t->bufs.s1 = s1 ? s1 + begin : NULL;
    t->bufs.s2 = s2 ? s2 + begin : NULL;
}

static struct zs_optim_launch optim_launch(const struct zs_ctx *ctx, const struct zs_optim_step *s,
                                           const struct zs_optim_tensor *t, int32_t count)
{
    return (struct zs_optim_launch){ .opt = ctx->kopt, .pdt = ctx->pdt, .gdt = ctx->gdt,
                                     .step = s, .t = t, .count = count };
}

/* A sub-group's slice of one unit, its state paged in from NVMe: a launch of one tensor. A failure can only
 * be a kernel missing, which set-up already ruled out (choose_kernel). */
static void optim_paged(struct zs_ctx *ctx, int32_t u, float *disk_p, float *s1, float *s2, int64_t begin,
                        int64_t end, void *arg)
{
    struct zs_optim_tensor t;
    struct zs_optim_launch l;

    optim_tensor(ctx, u, disk_p, s1, s2, begin, end, &t);
    l = optim_launch(ctx, arg, &t, 1);
    ctx->dev.ops->optim(&ctx->dev, &l, ctx->dev.compute);
}

/* The optimizer state on NVMe from a device the host cannot read in place: one slice of unit u, its state
 * paged into the swapper's slot (nvme_optim.c's pipeline). The slice's parameters come down into pinned slot
 * k % 2 once that slot's last copy up is done, the CPU kernels step them with the gradients that came down
 * during backward, and they go up on the other copy stream while the next slice comes down. */
static void optim_paged_dev(struct zs_ctx *ctx, int32_t u, float *disk_p, float *s1, float *s2, int64_t begin,
                            int64_t end, void *arg)
{
    struct zs_device *d = &ctx->dev;
    struct zs_offdev *o = &ctx->off;
    struct zs_optim_tensor t;
    struct zs_optim_launch l;
    size_t bytes = (size_t)(end - begin) * ctx->psz;
    int32_t k = o->k++;
    void *param;
    zs_status st;

    if (o->st)
        return;
    optim_tensor(ctx, u, disk_p, s1, s2, begin, end, &t);
    t.bufs.grad = zs_at(zs_offdev_grads(ctx, u), begin, zs_dtype_bytes(ctx->gdt));
    l = optim_launch(ctx, arg, &t, 1);
    if (zs_params_on_host(ctx, &ctx->units[u])) { /* a stage-3 shard with offload_param cpu: stepped in place */
        st = ctx->host_dev.ops->optim(&ctx->host_dev, &l, NULL);
        goto out;
    }
    param = t.bufs.param;
    t.bufs.param = zs_offdev_slot(ctx, k);
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
    optim_tensor(ctx, u, NULL, NULL, NULL, 0, n, &t);
    st = d->ops->stream_wait(d, ctx->off.down, ctx->off.ev_up[k & 1]);
    return st ? st : d->ops->copy(d, zs_offdev_slot(ctx, k), t.bufs.param, (size_t)n * ctx->psz, ZS_COPY_D2H,
                                  ctx->off.down);
}

/* The next unit after u with elements to step and parameters on the device, or nunits. */
static int32_t next_staged(struct zs_ctx *ctx, int32_t u)
{
    int64_t n;

    for (u++; u < ctx->nunits; u++) {
        zs_unit_master(ctx, u, &n);
        if (n > 0 && !zs_params_on_host(ctx, &ctx->units[u]))
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
        st = zs_offdev_grads_final(ctx, v);
    if (!st)
        st = d->ops->event_record(d, ctx->off.ev_grad, d->compute);
    return st ? st : d->ops->stream_wait(d, ctx->off.down, ctx->off.ev_grad);
}

/* ... and end here: the compute stream waits for the last copy up. */
static zs_status offdev_step_end(struct zs_ctx *ctx)
{
    struct zs_device *d = &ctx->dev;
    zs_status st = d->ops->event_record(d, ctx->off.ev_done, ctx->off.up);

    return st ? st : d->ops->stream_wait(d, d->compute, ctx->off.ev_done);
}

/* The optimizer offloaded (offload_optimizer cpu) from a device the host cannot read in place. The reduced
 * gradients came down during backward (offload_dev.c; any unit that did not, now); then unit by unit, in two
 * pinned slots: while the CPU kernels step unit k against the masters and moments in the host pool, unit k+1's
 * parameters come down on one copy stream and unit k-1's go up on the other. The compute stream waits for the
 * last copy up. */
static zs_status optim_from_device(struct zs_ctx *ctx, const struct zs_optim_step *s)
{
    struct zs_device *d = &ctx->dev;
    struct zs_offdev *o = &ctx->off;
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
        if (!n)
            continue;
        optim_tensor(ctx, v, NULL, un->m, un->v, 0, n, &t);
        void *param = t.bufs.param;
        st = d->ops->stream_sync(d, o->down); /* this unit's parameters, and every gradient */
        if (!st && staged) {
            u = next_staged(ctx, v);
            if (u < ctx->nunits)
                st = params_down(ctx, u, k + 1);
            t.bufs.param = zs_offdev_slot(ctx, k);
        }
        t.bufs.grad = zs_offdev_grads(ctx, v);
        l = optim_launch(ctx, s, &t, 1);
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
static zs_status optim_nvme_from_device(struct zs_ctx *ctx, const struct zs_optim_step *s)
{
    struct zs_device *d = &ctx->dev;
    struct zs_offdev *o = &ctx->off;
    zs_status st = offdev_step_begin(ctx);

    if (!st) /* every gradient on the host, and (offload_param cpu) nothing on the device still reading a shard */
        st = d->ops->stream_sync(d, o->down);
    if (st)
        return st;
    o->st = ZS_OK;
    o->k = 0;
    st = zs_nvme_optim_step(ctx, ctx->nvme, optim_paged_dev, (void *)s);
    if (!st)
        st = o->st;
    return st ? st : offdev_step_end(ctx);
}

/* Every unit's owned range in one launch on the device. The kernel is elementwise, so neither the thread
 * count, the path nor the device's order of the tensors changes a bit of the result. With the state on
 * NVMe the units come in sub-groups, their state paged in and out around the kernel. */
static zs_status run_optimizer(struct zs_ctx *ctx, double lr, float coef)
{
    struct zs_optim_step s;
    struct zs_optim_tensor *t;
    struct zs_optim_launch l;
    zs_status st;

    step_scalars(ctx, lr, coef, &s);
    if (ctx->nvme && !ctx->dev.host_access)
        return optim_nvme_from_device(ctx, &s);
    if (ctx->nvme)
        return zs_nvme_optim_step(ctx, ctx->nvme, optim_paged, &s);
    if (!ctx->dev.host_access && zs_offload_optimizer_on_host(ctx)) /* state on the host, the rest on the device */
        return optim_from_device(ctx, &s);
    t = malloc((size_t)(ctx->nunits ? ctx->nunits : 1) * sizeof(*t));
    if (!t)
        return zs_fail(ZS_ERR_NOMEM, "zs_step: out of memory");
    for (int32_t u = 0; u < ctx->nunits; u++) {
        int64_t n;
        zs_unit_master(ctx, u, &n);
        optim_tensor(ctx, u, NULL, ctx->units[u].m, ctx->units[u].v, 0, n, &t[u]);
    }
    l = optim_launch(ctx, &s, t, ctx->nunits);
    st = ctx->dev.ops->optim(&ctx->dev, &l, ctx->dev.compute);
    free(t);
    return st;
}

/* Stages 1-2 (and units kept whole at stage 3): every rank's updated shard is gathered in place. */
static zs_status gather_updated(struct zs_ctx *ctx)
{
    struct zs_coll_req **reqs;
    zs_status st = ZS_OK, st2;

    if (ctx->cfg.zero.stage == 0)
        return ZS_OK;
    reqs = calloc((size_t)ctx->nunits, sizeof(*reqs));
    if (!reqs)
        return zs_fail(ZS_ERR_NOMEM, "zs_step: out of memory");
    for (int32_t u = 0; u < ctx->nunits && !st; u++) {
        if (ctx->units[u].sharded)
            continue;
        zs_label(ctx, ZS_PURPOSE_GATHER, u);
        st = zs_coll_all_gather(ctx, ctx->units[u].full, ctx->pdt, ctx->units[u].part.shard, &reqs[u]);
    }
    for (int32_t u = 0; u < ctx->nunits; u++) {
        if (!reqs[u])
            continue;
        st2 = zs_coll_wait(ctx, reqs[u]);
        if (st2 && !st) {
            st = st2;
            zs_error_prefix("gather updated parameters of unit '%s'", ctx->units[u].name);
        }
    }
    free(reqs);
    return st;
}

/* An fp16 overflow on any rank: no update anywhere, the scale shrinks (after the hysteresis), the
 * gradients are dropped; the learning-rate schedule and Adam's step count stay where they were. */
static zs_status end_window(struct zs_ctx *ctx)
{
    zs_status st = zs_fetch_step_end(ctx);

    if (!st)
        st = zs_grads_zero(ctx);
    if (st)
        return st;
    ctx->global_step++;
    return ZS_OK;
}

static zs_status skip_step(struct zs_ctx *ctx)
{
    zs_status st = scaler_update(ctx, true);

    if (!st)
        st = end_window(ctx);
    if (st)
        return st;
    ctx->skipped_steps++;
    ctx->stats = (zs_step_stats){.global_step = ctx->global_step, .micro_step = ctx->micro_step, .stepped = 0,
                                 .skipped = 1, .lr = ctx->stats.lr, .grad_norm = INFINITY, .clip_coef = 0.0,
                                 .loss_scale = ctx->scaler.scale};
    if (ctx->rank == 0 && !ctx->quiet)
        zs_log("step %lld skipped: fp16 gradients overflowed; loss scale now %g", (long long)ctx->global_step,
               ctx->scaler.scale);
    return ZS_OK;
}

zs_status zs_step_boundary(struct zs_ctx *ctx)
{
    double t0 = now(), t1, t2, norm = 0.0, lr, scale = ctx->scaler.scale;
    float coef = 1.0f;
    bool overflow = false;
    zs_status st;

    st = zs_grads_flush(ctx);
    if (st)
        return st;
    t1 = now();
    /* The norm, always: it is reported every step, decides clipping, and (fp16) reveals an overflow. */
    st = global_grad_norm(ctx, &norm, &overflow);
    if (st)
        return st;
    if (overflow && ctx->pdt == ZS_DTYPE_FP16)
        return skip_step(ctx);
    norm /= scale; /* of the true gradients */
    if (ctx->cfg.gradient_clipping > 0.0) {
        double c = ctx->cfg.gradient_clipping / (norm + 1e-6);
        if (c < 1.0)
            coef = (float)c;
    }
    lr = zs_schedule_lr(&ctx->cfg.sched, ctx->cfg.optim.lr, ctx->global_step - ctx->skipped_steps + 1);
    /* one factor for the kernel: unscale and clip (DeepSpeed's combined scale) */
    st = run_optimizer(ctx, lr, scale == 1.0 ? coef : (float)((double)coef / scale));
    if (st)
        return st;
    st = scaler_update(ctx, false);
    if (st)
        return st;
    t2 = now();
    st = gather_updated(ctx);
    if (!st)
        st = end_window(ctx);
    if (st)
        return st;
    ctx->stats.global_step = ctx->global_step;
    ctx->stats.stepped = 1;
    ctx->stats.skipped = 0;
    ctx->stats.lr = lr;
    ctx->stats.grad_norm = norm;
    ctx->stats.clip_coef = coef;
    ctx->stats.loss_scale = ctx->scaler.scale;
    ctx->stats.time_fetch = ctx->t_fetch;
    ctx->stats.time_reduce = t1 - t0;
    ctx->stats.time_optimizer = t2 - t1;
    ctx->stats.time_gather = now() - t2;
    ctx->stats.time_swap = zs_nvme_waited(ctx->nvme) - ctx->swap_mark;
    ctx->swap_mark += ctx->stats.time_swap;
    ctx->t_fetch = 0.0;
    ctx->t_reduce += ctx->stats.time_reduce;
    ctx->t_optim += ctx->stats.time_optimizer;
    ctx->t_gather += ctx->stats.time_gather;
    if (ctx->rank == 0 && !ctx->quiet && ctx->cfg.steps_per_print > 0 &&
        ctx->global_step % ctx->cfg.steps_per_print == 0) {
        zs_log("step %lld lr %.6g grad_norm %.6g", (long long)ctx->global_step, lr, norm);
        if (ctx->cfg.wall_clock_breakdown)
            zs_log("time (ms, last %lld steps): reduce-wait %.3f optimizer %.3f gather %.3f",
                   (long long)ctx->cfg.steps_per_print, 1e3 * ctx->t_reduce, 1e3 * ctx->t_optim, 1e3 * ctx->t_gather);
        ctx->t_reduce = ctx->t_optim = ctx->t_gather = 0.0;
    }
    return ZS_OK;
}

void zs_ctx_break(struct zs_ctx *ctx, const char *fmt, ...)
{
    va_list ap;

    ctx->broken = true;
    va_start(ap, fmt);
    vsnprintf(ctx->broken_why, sizeof(ctx->broken_why), fmt, ap);
    va_end(ap);
}

zs_status zs_step(zs_ctx *ctx)
{
    zs_status st;

    if (!ctx || !ctx->set_up)
        return zs_fail(ZS_ERR_INVALID, "zs_step: call zs_setup first");
    if (ctx->broken)
        return zs_fail(ZS_ERR_INVALID, "zs_step: refused: %s; the context cannot continue", ctx->broken_why);
    for (int32_t u = 0; u < ctx->nunits; u++)
        if (ctx->units[u].ready_micro != ctx->micro_step)
            return zs_fail(ZS_ERR_INVALID,
                           "zs_step: unit '%s' had no zs_grad_ready in this micro-batch (every unit needs one)",
                           ctx->units[u].name);
    zs_note(ctx, "zs_step", -1);
    ctx->stats.stepped = 0;
    ctx->stats.micro_step = ++ctx->micro_step;
    if (ctx->micro_step % ctx->cfg.grad_accum_steps != 0)
        return zs_grads_progress(ctx);
    st = zs_step_boundary(ctx);
    if (st) { /* some sub-groups may be stepped and others not (a swap I/O error part-way) */
        zs_ctx_break(ctx, "step %lld failed part-way (%s)", (long long)ctx->global_step + 1, zs_last_error());
    }
    return st;
}
