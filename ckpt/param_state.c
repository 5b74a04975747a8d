/* param_state.c - one parameter's whole fp32 state (master, reduced gradient, optimizer moments), gathered
 * from the slices the ranks own, or written into them from one rank's values (DeepSpeed's safe_get_full_*
 * and safe_set_full_*). Every rank owns the slice [r * shard, (r + 1) * shard) of each unit's elements, at
 * every stage: the checkpoints' arithmetic, so a read is what a checkpoint would hold. */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "kernels/convert.h" /* defines: zs_cvt_to_f32, zs_cvt_from_f32 */
#include "kernels/optim.h"   /* defines: zs_dtype_name */
#include "core/ctx.h"
#include "core/ranks.h"      /* defines: zs_agree */
#include "core/units.h"      /* defines: zs_unit_grad_shard */
#include "offload/nvme_optim.h"
#include "sharding/sharding.h" /* defines: zs_grads_flush, zs_fetch_invalidate */
#include "runtime/runtime.h" /* defines: zs_optim_name */
#include "ckpt_opts.h"       /* defines: struct unit_view, zs_ckpt_view_unit */

#define CHUNK_BYTES (64 << 20) /* per rank and all-gather: the byte count MPI's int holds, with room */

static const char *const state_names[] = {"ZS_STATE_PARAM", "ZS_STATE_GRAD", "ZS_STATE_EXP_AVG",
                                          "ZS_STATE_EXP_AVG_SQ"};

/* Arguments, and whether the state exists: the optimizer's arrays, gradients that are complete. */
static zs_status state_check(const struct zs_ctx *ctx, int32_t param, enum zs_state which, const char *who)
{
    int k;

    if (!ctx || !ctx->set_up)
        return zs_fail(ZS_ERR_INVALID, "%s: call zs_setup first", who);
    if (param < 0 || param >= ctx->nparams)
        return zs_fail(ZS_ERR_INVALID, "%s: no parameter %d", who, param);
    if ((int)which < ZS_STATE_PARAM || (int)which > ZS_STATE_EXP_AVG_SQ)
        return zs_fail(ZS_ERR_INVALID, "%s: no state %d", who, (int)which);
    if (ctx->broken)
        return zs_fail(ZS_ERR_INVALID, "%s: refused: %s", who, ctx->broken_why);
    k = zs_config_state_arrays(&ctx->cfg);
    if ((which == ZS_STATE_EXP_AVG && k < 1) || (which == ZS_STATE_EXP_AVG_SQ && k < 2))
        return zs_fail(ZS_ERR_INVALID, "%s: the optimizer %s has no %s", who, zs_optim_name(ctx->cfg.optim.type),
                       state_names[which]);
    if (which != ZS_STATE_GRAD)
        return ZS_OK;
    if (ctx->cfg.zs.deterministic)
        return zs_fail(ZS_ERR_UNSUPPORTED, "%s: ZS_STATE_GRAD with zeroshard.deterministic: the reduced gradient is "
                       "an exact sum that exists only inside zs_step", who);
    if (!zs_window_last(ctx))
        return zs_fail(ZS_ERR_INVALID, "%s: ZS_STATE_GRAD at micro-step %lld: the gradients are reduced only in the "
                       "accumulation window's last micro-batch", who, (long long)ctx->micro_step);
    for (int32_t u = 0; u < ctx->nunits; u++)
        if (!ctx->units[u].frozen && ctx->units[u].ready_micro != ctx->micro_step) /* frozen: no gradient */
            return zs_fail(ZS_ERR_INVALID, "%s: ZS_STATE_GRAD before unit '%s''s zs_grad_ready in the window's last "
                           "micro-batch (read it between those calls and zs_step)", who, ctx->units[u].name);
    return ZS_OK;
}

static zs_status no_state(const struct zs_ctx *ctx, int32_t param, enum zs_state which, const char *who)
{
    return zs_fail(ZS_ERR_INVALID, "%s: parameter '%s' has no %s (a frozen parameter has only ZS_STATE_PARAM)", who,
                   ctx->params[param].name, state_names[which]);
}

/* This rank's owned elements of unit u's reduced gradient as fp32, unscaled, into mine[0..shard): at stages
 * 0-1 from the full buffer reduced in place, at 2-3 from the shard accumulator (ctx->gdt either way). */
static zs_status grad_slice(struct zs_ctx *ctx, int32_t u, float *mine, bool *absent)
{
    struct zs_unit *un = &ctx->units[u];
    int64_t n = un->part.shard;
    size_t bytes = (size_t)n * zs_dtype_bytes(ctx->gdt);
    void *h;
    zs_status st;

    bool on_disk = zs_nvme_grads_on_disk(ctx->nvme, u);
    void *src = NULL;

    *absent = !on_disk && !(ctx->cfg.zero.stage >= 2 ? un->grad_shard : un->grad);
    if (*absent)
        return ZS_OK;
    h = malloc(bytes ? bytes : 1);
    if (!h)
        return zs_fail(ZS_ERR_NOMEM, "zs_param_read: out of memory");
    st = on_disk ? zs_nvme_grad_read(ctx->nvme, u, &src) : ZS_OK; /* ZeRO-Infinity: the shard in the swap file */
    if (!st)
        st = zs_device_copy(&ctx->dev, h, false, on_disk ? src : zs_unit_grad_shard(ctx, u),
                            !on_disk && !ctx->dev.host_access, bytes);
    if (!st) {
        zs_cvt_to_f32(mine, h, (int)ctx->gdt, n);
        for (int64_t i = 0; i < n; i++)
            mine[i] = (float)((double)mine[i] / ctx->scaler.scale);
    }
    free(h);
    return st;
}

/* This rank's owned elements of unit u's `which` (fp32 master or a moment) into mine[0..shard). */
static zs_status view_slice(struct zs_ctx *ctx, int32_t u, enum zs_state which, float *mine, bool *absent)
{
    struct zs_unit *un = &ctx->units[u];
    int64_t begin = zs_partition_begin(&un->part, ctx->shard_rank), n = zs_partition_valid(&un->part, ctx->shard_rank);
    struct unit_view v;
    zs_status st = zs_ckpt_view_unit(ctx, u, &v);
    const float *src, *base;

    if (st)
        return st;
    base = which == ZS_STATE_PARAM ? v.p : which == ZS_STATE_EXP_AVG ? v.s1 : v.s2;
    *absent = !base;
    if (base) {
        src = base + (begin - (which == ZS_STATE_PARAM ? v.p_base : v.s_base));
        memcpy(mine, src, (size_t)n * sizeof(float));
    }
    return zs_ckpt_view_done(ctx, &v, false);
}

/* mine[0..shard) of every rank, in rank order, into full[0..padded): the unit's flat elements. */
static zs_status gather_unit(struct zs_ctx *ctx, int32_t u, const float *mine, float *full)
{
    int64_t shard = ctx->units[u].part.shard, step = CHUNK_BYTES / (int64_t)sizeof(float);
    float *all = malloc((size_t)(shard < step ? shard : step) * (size_t)ctx->world * sizeof(float));
    zs_status st = all ? ZS_OK : zs_fail(ZS_ERR_NOMEM, "zs_param_read: out of memory");

    for (int64_t at = 0; !st && at < shard; at += step) {
        int64_t c = shard - at < step ? shard - at : step;
        zs_label(ctx, ZS_PURPOSE_GATHER, u);
        st = zs_comm_allgather_bytes(ctx->comm, mine + at, all, (int32_t)(c * (int64_t)sizeof(float)));
        for (int32_t r = 0; !st && r < ctx->world; r++)
            memcpy(full + (int64_t)r * shard + at, all + (int64_t)r * c, (size_t)c * sizeof(float));
    }
    free(all);
    return st;
}

zs_status zs_param_read(zs_ctx *ctx, int32_t param, enum zs_state which, float *out)
{
    const struct zs_param_rec *pr;
    struct zs_unit *un;
    float *mine = NULL, *full = NULL;
    bool absent = false;
    zs_status st = state_check(ctx, param, which, "zs_param_read");

    if (!st && !out)
        st = zs_fail(ZS_ERR_INVALID, "zs_param_read: out is NULL");
    if (st)
        return st;
    pr = &ctx->params[param];
    un = &ctx->units[pr->unit];
    mine = calloc((size_t)un->part.shard, sizeof(float));
    full = malloc((size_t)un->part.padded * sizeof(float));
    st = mine && full ? ZS_OK : zs_fail(ZS_ERR_NOMEM, "zs_param_read: out of memory for unit '%s'", un->name);
    if (!st && which == ZS_STATE_GRAD)
        st = zs_grads_flush(ctx); /* the boundary's reductions may still run */
    if (!st && which == ZS_STATE_GRAD)
        st = grad_slice(ctx, pr->unit, mine, &absent);
    else if (!st)
        st = view_slice(ctx, pr->unit, which, mine, &absent);
    if (!st && absent)
        st = no_state(ctx, param, which, "zs_param_read");
    st = zs_agree(ctx, st);
    if (!st)
        st = gather_unit(ctx, pr->unit, mine, full);
    if (!st)
        memcpy(out, full + pr->offset, (size_t)pr->numel * sizeof(float));
    free(mine);
    free(full);
    return st;
}

// ----------------------------------------------------------------------------------- write

/* dst[lo - base .. hi - base) = in[lo - off ..), for the part of [off, off + numel) inside [base, base + count). */
static void put_range(float *dst, int64_t base, int64_t count, const float *in, int64_t off, int64_t numel)
{
    int64_t lo = off > base ? off : base, hi = off + numel < base + count ? off + numel : base + count;

    if (dst && lo < hi)
        memcpy(dst + (lo - base), in + (lo - off), (size_t)(hi - lo) * sizeof(float));
}

/* The same into the working copy, rounded to the parameters' dtype. */
static void put_work(struct zs_ctx *ctx, const struct unit_view *v, const float *in, int64_t off, int64_t numel)
{
    int64_t lo = off > v->w_base ? off : v->w_base;
    int64_t hi = off + numel < v->w_base + v->w_count ? off + numel : v->w_base + v->w_count;

    if (v->work && lo < hi)
        zs_cvt_from_f32(zs_at(v->work, lo - v->w_base, ctx->psz), (int)ctx->pdt, in + (lo - off), hi - lo);
}

static zs_status write_unit(struct zs_ctx *ctx, int32_t param, enum zs_state which, const float *in)
{
    const struct zs_param_rec *pr = &ctx->params[param];
    struct zs_unit *un = &ctx->units[pr->unit];
    int64_t sn = zs_plan_opt_elems(ctx->cfg.zero.stage, &un->part);
    struct unit_view v;
    zs_status st = zs_ckpt_view_unit(ctx, pr->unit, &v);
    float *s = which == ZS_STATE_EXP_AVG ? v.s1 : v.s2;

    if (st)
        return st;
    if (which == ZS_STATE_PARAM) {
        put_range(v.p, v.p_base, v.p_count, in, pr->offset, pr->numel);
        put_work(ctx, &v, in, pr->offset, pr->numel);
    } else if (s) {
        put_range(s, v.s_base, sn, in, pr->offset, pr->numel);
    } else {
        st = no_state(ctx, param, which, "zs_param_write");
    }
    zs_status up = zs_ckpt_view_done(ctx, &v, !st);
    if (!st)
        st = up;
    if (!st && v.on_disk)
        st = zs_nvme_unit_store(ctx->nvme, pr->unit);
    return st;
}

zs_status zs_param_write(zs_ctx *ctx, int32_t param, enum zs_state which, const float *in, int32_t root)
{
    const struct zs_param_rec *pr;
    float *vals = NULL;
    zs_status st = state_check(ctx, param, which, "zs_param_write");

    if (st)
        return st;
    if (!st && (root < 0 || root >= ctx->world))
        st = zs_fail(ZS_ERR_INVALID, "zs_param_write: root %d is not a rank of %d", root, ctx->world);
    if (!st && which == ZS_STATE_GRAD)
        st = zs_fail(ZS_ERR_UNSUPPORTED, "zs_param_write: ZS_STATE_GRAD is read-only (the reduced gradient is "
                     "rebuilt from zs_grad_buffer every window)");
    if (!st && ctx->window_micro != 0)
        st = zs_fail(ZS_ERR_INVALID, "zs_param_write: in the middle of an accumulation window (micro-step %lld); "
                     "write at a step boundary", (long long)ctx->micro_step);
    if (!st && ctx->rank == root && !in)
        st = zs_fail(ZS_ERR_INVALID, "zs_param_write: in is NULL on the root rank %d", root);
    if (!st) {
        pr = &ctx->params[param];
        vals = malloc((size_t)pr->numel * sizeof(float));
        if (!vals)
            st = zs_fail(ZS_ERR_NOMEM, "zs_param_write: out of memory for '%s'", pr->name);
        else if (ctx->rank == root)
            memcpy(vals, in, (size_t)pr->numel * sizeof(float));
    }
    st = zs_agree(ctx, st);
    if (!st)
        st = zs_comm_bcast(ctx->comm, vals, ctx->params[param].numel * (int64_t)sizeof(float), root);
    /* stale gathered copies go first: a unit the program holds is refused before anything changes */
    if (!st && which == ZS_STATE_PARAM)
        st = zs_agree(ctx, zs_fetch_invalidate(ctx, ctx->params[param].unit, "zs_param_write"));
    if (!st) {
        st = zs_agree(ctx, write_unit(ctx, param, which, vals));
        if (st) /* written on some ranks and not others */
            zs_ctx_break(ctx, "zs_param_write of '%s' failed part-way (%s)", ctx->params[param].name, zs_last_error());
    }
    free(vals);
    return st;
}

// ----------------------------------------------------------------------------------- step counters

/* -1 keeps the running value; else v must be at least 0. */
static zs_status count_arg(int64_t v, const char *what)
{
    if (v < -1)
        return zs_fail(ZS_ERR_INVALID, "zs_step_counts_set: %s %lld is negative (-1 keeps the running count)", what,
                       (long long)v);
    return ZS_OK;
}

zs_status zs_step_counts_set(zs_ctx *ctx, int64_t global_step, int64_t optimizer_steps, int64_t schedule_steps)
{
    int64_t want[3] = {global_step, optimizer_steps, schedule_steps}, root[3];
    int64_t g, o, micro = 0;
    zs_status st = ZS_OK;

    if (!ctx || !ctx->set_up)
        return zs_fail(ZS_ERR_INVALID, "zs_step_counts_set: call zs_setup first");
    if (ctx->broken)
        st = zs_fail(ZS_ERR_INVALID, "zs_step_counts_set: refused: %s", ctx->broken_why);
    if (!st && ctx->window_micro != 0)
        st = zs_fail(ZS_ERR_INVALID, "zs_step_counts_set: in the middle of an accumulation window (micro-batch %lld "
                     "of %lld per step); set the counts at a step boundary", (long long)ctx->window_micro + 1,
                     (long long)ctx->cfg.grad_accum_steps);
    if (!st)
        st = count_arg(global_step, "global_step");
    if (!st)
        st = count_arg(optimizer_steps, "optimizer_steps");
    if (!st)
        st = count_arg(schedule_steps, "schedule_steps");
    g = global_step < 0 ? ctx->global_step : global_step;
    o = optimizer_steps < 0 ? ctx->optim_steps : optimizer_steps;
    if (!st && o > g)
        st = zs_fail(ZS_ERR_INVALID, "zs_step_counts_set: optimizer_steps %lld is more than global_step %lld (the "
                     "optimizer steps at most once per global step)", (long long)o, (long long)g);
    if (!st && __builtin_mul_overflow(g, ctx->cfg.grad_accum_steps, &micro))
        st = zs_fail(ZS_ERR_INVALID, "zs_step_counts_set: global_step %lld x gradient_accumulation_steps %lld "
                     "overflows the micro-step count", (long long)g, (long long)ctx->cfg.grad_accum_steps);
    memcpy(root, want, sizeof(root));
    st = zs_agree(ctx, st);
    if (!st)
        st = zs_comm_bcast(ctx->comm, root, (int64_t)sizeof(root), 0);
    if (!st && memcmp(root, want, sizeof(root)) != 0)
        st = zs_fail(ZS_ERR_INVALID, "zs_step_counts_set: rank %d passed (%lld, %lld, %lld), rank 0 (%lld, %lld, "
                     "%lld): every rank passes the same counts", ctx->rank, (long long)want[0], (long long)want[1],
                     (long long)want[2], (long long)root[0], (long long)root[1], (long long)root[2]);
    st = zs_agree(ctx, st);
    if (st)
        return st;
    ctx->global_step = g;
    ctx->micro_step = micro;
    ctx->window_micro = 0;
    ctx->window_end = false;
    ctx->optim_steps = o;
    if (schedule_steps >= 0)
        ctx->sched_steps = schedule_steps;
    ctx->skipped_steps = 0; /* the overflow count is fp16's, which a resumed foreign run does not carry */
    ctx->stats.global_step = ctx->global_step;
    ctx->stats.micro_step = ctx->micro_step;
    return ZS_OK;
}
