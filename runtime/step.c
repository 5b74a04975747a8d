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

#include "base/clock.h" /* defines: zs_now_s */
#include "base/error.h"
#include "base/test_hooks.h"
#include "kernels/optim.h"
#include "core/ctx.h"
#include "core/ranks.h"
#include "core/schedule.h"
#include "core/units.h"
#include "offload/nvme_optim.h"
#include "offload/offload.h"
#include "sharding/sharding.h"
#include "runtime.h"

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
    int32_t k = 0; /* the trainable units in memory: a frozen one has no gradients */
    for (int32_t u = 0; !st && u < ctx->nunits; u++) {
        if (ctx->units[u].frozen || zs_nvme_grads_on_disk(ctx->nvme, u))
            continue;
        x[k] = zs_unit_grad_shard(ctx, u);
        n[k++] = ctx->units[u].part.shard;
    }
    if (!st && k)
        st = ctx->dev.ops->sumsq(&ctx->dev, x, n, k, ctx->gdt, all, ctx->dev.compute);
    /* added in unit order; a shard on NVMe brings the partial taken as it was written (each unit's partial
     * is its own segments folded alike, whichever call sums it: the same bits as in memory) */
    for (int32_t u = 0, i = 0; !st && u < ctx->nunits; u++) {
        if (ctx->units[u].frozen)
            continue;
        if (!zs_nvme_grads_on_disk(ctx->nvme, u))
            mine += all[i++];
        else if ((st = zs_grads_nvme_sumsq(ctx, u)) == ZS_OK)
            mine += ctx->units[u].grad_sumsq;
    }
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
        if (r < ctx->shard_size) /* hybrid: each shard once, from the first group (the others hold copies) */
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

/* The per-step scalars of the configured optimizer for a group's values v, in double and rounded once to
 * float. Adam's bias correction and SGD's first step count the engine's steps, whatever the group. */
static void step_scalars(const struct zs_ctx *ctx, const zs_group_opts *v, double lr, float coef,
                         struct zs_optim_step *s)
{
    const struct zs_optim_config *o = &ctx->cfg.optim;
    double t = (double)(ctx->optim_steps + 1); /* steps the optimizer has taken */
    bool adam = o->type == ZS_OPTIM_ADAM || o->type == ZS_OPTIM_ADAMW;
    double bc1 = adam && o->bias_correction ? 1.0 - pow(v->beta1, t) : 1.0;
    double bc2 = adam && o->bias_correction ? 1.0 - pow(v->beta2, t) : 1.0;

    memset(s, 0, sizeof(*s));
    s->lr = (float)lr;
    s->beta1 = (float)v->beta1;
    s->beta2 = (float)v->beta2;
    s->one_minus_beta1 = (float)(1.0 - v->beta1);
    s->one_minus_beta2 = (float)(1.0 - v->beta2);
    s->eps = (float)v->eps;
    s->weight_decay = (float)v->weight_decay;
    s->step_size = (float)(lr / bc1);
    s->inv_sqrt_bc2 = (float)(1.0 / sqrt(bc2));
    s->decay = (float)(lr * v->weight_decay);
    s->grad_scale = coef;
    s->momentum = (float)v->momentum;
    s->dampening_c = (float)(1.0 - v->dampening);
    s->nesterov = v->nesterov;
    s->first = ctx->optim_steps == 0;
}

/* A sub-group's slice of one unit, its state paged in from NVMe: a launch of its groups' pieces. A failure
 * can only be a kernel missing, which set-up already ruled out (choose_kernel). */
static void optim_paged(struct zs_ctx *ctx, int32_t u, float *disk_p, void *disk_w, float *s1, float *s2,
                        void *disk_g, int64_t begin, int64_t end, void *arg)
{
    const struct zs_optim_groups *gr = arg;
    struct zs_optim_tensor t;
    struct zs_optim_launch l;
    int32_t n;

    zs_unit_tensor(ctx, u, disk_p, disk_w, s1, s2, begin, end, &t);
    if (disk_g) /* the gradient shard paged in with the state */
        t.bufs.grad = zs_at(disk_g, begin, zs_dtype_bytes(ctx->gdt));
    n = zs_unit_split(ctx, u, &t, begin, gr->steps, gr->t);
    l = zs_unit_launch(ctx, &gr->steps[0], gr->t, n);
    ctx->dev.ops->optim(&ctx->dev, &l, ctx->dev.compute);
}

/* Every trainable unit's owned range in one launch on the device, split where the parameter group changes.
 * The kernel is elementwise, so neither the thread count, the path nor the device's order of the tensors
 * changes a bit of the result. With the state on NVMe the units come in sub-groups, their state paged in
 * and out around the kernel. */
static zs_status launch_all(struct zs_ctx *ctx, const struct zs_optim_groups *gr)
{
    struct zs_optim_tensor *t, one;
    struct zs_optim_launch l;
    int32_t count = 0;
    zs_status st;

    t = malloc((size_t)(ctx->nparams ? ctx->nparams : 1) * sizeof(*t));
    if (!t)
        return zs_fail(ZS_ERR_NOMEM, "zs_step: out of memory");
    for (int32_t u = 0; u < ctx->nunits; u++) {
        int64_t n;
        if (ctx->units[u].frozen)
            continue;
        zs_unit_master(ctx, u, &n);
        zs_unit_tensor(ctx, u, NULL, NULL, ctx->units[u].m, ctx->units[u].v, 0, n, &one);
        count += zs_unit_split(ctx, u, &one, 0, gr->steps, t + count);
    }
    l = zs_unit_launch(ctx, &gr->steps[0], t, count);
    st = ctx->dev.ops->optim(&ctx->dev, &l, ctx->dev.compute);
    free(t);
    return st;
}

/* The unit with the most parameters: how many pieces a split may make. */
static int32_t most_params(const struct zs_ctx *ctx)
{
    int32_t most = 1;

    for (int32_t u = 0; u < ctx->nunits; u++)
        most = ctx->units[u].nparams > most ? ctx->units[u].nparams : most;
    return most;
}

/* Each group's scalars (its lr from the schedule's), then the launch on whichever path holds the state. */
static zs_status run_optimizer(struct zs_ctx *ctx, double sched_lr, float coef, double *lr0)
{
    int32_t ng = zs_group_count(ctx);
    struct zs_optim_step *steps = malloc((size_t)ng * sizeof(*steps));
    struct zs_optim_groups gr = { steps, malloc((size_t)most_params(ctx) * sizeof(*gr.t)) };
    zs_status st;

    if (!steps || !gr.t) {
        st = zs_fail(ZS_ERR_NOMEM, "zs_step: out of memory");
        goto out_free;
    }
    for (int32_t g = 0; g < ng; g++) {
        zs_group_opts v;
        double lr = zs_group_lr(ctx, g, sched_lr);
        zs_group_values(ctx, g, &v);
        step_scalars(ctx, &v, lr, coef, &steps[g]);
        if (g == 0)
            *lr0 = lr;
    }
    if (ctx->nvme && !ctx->dev.host_access)
        st = zs_offload_step_nvme_from_device(ctx, &gr);
    else if (ctx->nvme)
        st = zs_nvme_optim_step(ctx, ctx->nvme, optim_paged, &gr);
    else if (!ctx->dev.host_access && zs_offload_optimizer_on_host(ctx)) /* state on the host, the rest on the device */
        st = zs_offload_step_from_device(ctx, &gr);
    else
        st = launch_all(ctx, &gr);
out_free:
    free(gr.t);
    free(steps);
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
        if (ctx->units[u].sharded || ctx->units[u].frozen) /* a frozen unit never changes */
            continue;
        zs_label_on(ctx, ctx->scomm, ZS_PURPOSE_GATHER, u);
        st = zs_coll_all_gather(ctx->scoll, ctx->units[u].full, ctx->pdt, ctx->units[u].part.shard, &reqs[u]);
    }
    for (int32_t u = 0; u < ctx->nunits; u++) {
        if (!reqs[u])
            continue;
        st2 = zs_coll_wait(ctx->scoll, reqs[u]);
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
    ctx->window_micro = 0;
    ctx->window_end = false;
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
    double t0 = zs_now_s(), t1, t2, norm = 0.0, lr, scale = ctx->scaler.scale;
    float coef = 1.0f;
    bool overflow = false;
    zs_status st;

    st = zs_grads_flush(ctx);
    if (!st)
        st = zs_grads_sum_replicas(ctx);
    if (st)
        return st;
    t1 = zs_now_s();
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
    lr = zs_schedule_lr(&ctx->cfg.sched, ctx->cfg.optim.lr, ctx->sched_steps + 1);
    /* one factor for the kernel: unscale and clip (DeepSpeed's combined scale); stats report group 0's lr */
    st = run_optimizer(ctx, lr, scale == 1.0 ? coef : (float)((double)coef / scale), &lr);
    if (st)
        return st;
    st = scaler_update(ctx, false);
    if (st)
        return st;
    t2 = zs_now_s();
    ctx->optim_steps++;
    ctx->sched_steps++;
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
    ctx->stats.time_gather = zs_now_s() - t2;
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
        if (ctx->units[u].ready_micro != ctx->micro_step && !ctx->units[u].frozen)
            return zs_fail(ZS_ERR_INVALID,
                           "zs_step: unit '%s' had no zs_grad_ready in this micro-batch (every unit needs one)",
                           ctx->units[u].name);
    zs_note(ctx, "zs_step", -1);
    ctx->stats.stepped = 0;
    ctx->stats.micro_step = ++ctx->micro_step;
    if (!zs_window_last(ctx)) {
        ctx->window_micro++;
        return zs_grads_progress(ctx);
    }
    st = zs_step_boundary(ctx); /* window_micro stays the last micro-batch's until end_window resets it */
    if (st) { /* some sub-groups may be stepped and others not (a swap I/O error part-way) */
        zs_ctx_break(ctx, "step %lld failed part-way (%s)", (long long)ctx->global_step + 1, zs_last_error());
        return st;
    }
    zs_mem_sample(ctx);
    if (ctx->global_step == 1)
        zs_memory_peak_log(ctx);
    return ZS_OK;
}

zs_status zs_window_end(zs_ctx *ctx)
{
    if (!ctx || !ctx->set_up)
        return zs_fail(ZS_ERR_INVALID, "zs_window_end: call zs_setup first");
    if (ctx->broken)
        return zs_fail(ZS_ERR_INVALID, "zs_window_end: refused: %s; the context cannot continue", ctx->broken_why);
    /* Stages 0-1 (and the exact sums) start a unit's reduction at its zs_grad_ready in the window's last
     * micro-batch only: a unit handed over before this call would keep its gradients local and miss the step. */
    for (int32_t u = 0; u < ctx->nunits; u++)
        if (!ctx->units[u].frozen && ctx->units[u].ready_micro == ctx->micro_step)
            return zs_fail(ZS_ERR_INVALID, "zs_window_end: unit '%s' already had its zs_grad_ready in this "
                           "micro-batch (micro-step %lld); call zs_window_end before the micro-batch's first "
                           "zs_grad_ready", ctx->units[u].name, (long long)ctx->micro_step);
    zs_note(ctx, "zs_window_end", -1);
    ctx->window_end = true;
    return ZS_OK;
}
