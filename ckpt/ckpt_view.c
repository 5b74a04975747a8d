/* ckpt_view.c - where this rank's state of a unit lives right now (masters, working copy, moments: in host
 * memory, on a device the host cannot read in place, or in the NVMe swap file), as one host view for saves,
 * loads and a parameter's full state. */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "kernels/convert.h" /* defines: zs_cvt_from_f32, zs_cvt_to_f32 */
#include "core/ctx.h"
#include "core/units.h"
#include "offload/nvme_optim.h"
#include "ckpt_opts.h"   /* defines: struct unit_view */

/* The array *p (bytes long), when it is device memory, is replaced by a host copy of it. */
static zs_status view_down(struct zs_ctx *ctx, struct unit_view *v, void **p, bool on_dev, size_t bytes)
{
    void *h;
    zs_status st;

    if (!*p || !on_dev)
        return ZS_OK;
    h = malloc(bytes ? bytes : 1);
    if (!h)
        return zs_fail(ZS_ERR_NOMEM, "checkpoint: out of memory staging %zu bytes from the device", bytes);
    st = zs_device_copy(&ctx->dev, h, false, *p, true, bytes);
    v->copy[v->ncopy].host = h;
    v->copy[v->ncopy].dev = *p;
    v->copy[v->ncopy++].bytes = bytes;
    *p = h;
    return st;
}

/* Ends a view: the host copies go back up when the view was written (write_back) and are freed. */
zs_status zs_ckpt_view_done(struct zs_ctx *ctx, struct unit_view *v, bool write_back)
{
    zs_status st = ZS_OK;

    for (int i = 0; i < v->ncopy; i++) {
        if (write_back && !st && v->copy[i].dev)
            st = zs_device_copy(&ctx->dev, v->copy[i].dev, true, v->copy[i].host, false, v->copy[i].bytes);
        free(v->copy[i].host);
    }
    v->ncopy = 0;
    return st;
}

static zs_status view_stage(struct zs_ctx *ctx, const struct zs_unit *un, struct unit_view *v)
{
    size_t sb = (size_t)zs_plan_opt_elems(ctx->cfg.zero.stage, &un->part) * sizeof(float);
    /* state on NVMe: the arrays read from the swap file are host memory; the working parameters (and with
     * fp32 training the parameters the checkpoint holds, unless they came from the file too) are not */
    bool pdev = !zs_params_on_host(ctx, un), odev = !v->on_disk && !zs_optstate_on_host(ctx);
    zs_status st;

    if (ctx->dev.host_access)
        return ZS_OK;
    st = view_down(ctx, v, (void **)&v->p, v->p_disk ? false : v->work ? odev : pdev,
                   (size_t)v->p_count * sizeof(float));
    if (!st)
        st = view_down(ctx, v, &v->work, pdev && !v->w_disk, (size_t)v->w_count * ctx->psz);
    if (!st)
        st = view_down(ctx, v, (void **)&v->s1, odev, sb);
    if (!st)
        st = view_down(ctx, v, (void **)&v->s2, odev, sb);
    if (st)
        zs_ckpt_view_done(ctx, v, false);
    return st;
}

/* A frozen unit trained in 16 bits has no fp32 masters: the checkpoint holds its working values in fp32 (a
 * host array the view frees; loading writes the working copy, rounded back exactly). */
static zs_status frozen_values(struct zs_ctx *ctx, struct unit_view *v)
{
    float *h = malloc((size_t)(v->w_count ? v->w_count : 1) * sizeof(float));

    if (!h) {
        zs_ckpt_view_done(ctx, v, false);
        return zs_fail(ZS_ERR_NOMEM, "checkpoint: out of memory staging a frozen unit");
    }
    zs_cvt_to_f32(h, v->work, (int)ctx->pdt, v->w_count);
    v->p = h;
    v->p_base = v->w_base;
    v->p_count = v->w_count;
    v->copy[v->ncopy].host = h;
    v->copy[v->ncopy].dev = NULL; /* nothing to write back */
    v->copy[v->ncopy++].bytes = 0;
    return ZS_OK;
}

zs_status zs_ckpt_view_unit(struct zs_ctx *ctx, int32_t u, struct unit_view *v)
{
    struct zs_unit *un = &ctx->units[u];
    int64_t mine = zs_partition_begin(&un->part, ctx->shard_rank);
    bool s0 = ctx->cfg.zero.stage == 0;
    float *dp = NULL;
    void *dw = NULL;
    zs_status st;

    memset(v, 0, sizeof(*v));
    v->s_base = s0 ? 0 : mine;
    v->s1 = un->m;
    v->s2 = un->v;
    if (ctx->nvme) {
        st = zs_nvme_unit_load(ctx->nvme, u, &dp, &dw, &v->s1, &v->s2);
        if (st)
            return st;
        v->on_disk = true;
        v->p_disk = dp != NULL;
        v->w_disk = dw != NULL;
    }
    v->w_base = un->sharded ? mine : 0;
    v->w_count = un->sharded ? un->part.shard : un->part.padded;
    if (ctx->pdt == ZS_DTYPE_FP32) {
        v->p = dp ? dp : un->sharded ? un->shard : un->full;
        v->p_base = v->w_base;
        v->p_count = v->w_count;
    } else {
        v->work = dw ? dw : un->sharded ? un->shard : un->full;
        v->p = dp ? dp : un->master;
        v->p_base = v->s_base;
        v->p_count = s0 ? un->part.padded : un->part.shard;
    }
    st = view_stage(ctx, un, v);
    return st || v->p ? st : frozen_values(ctx, v);
}

/* New parameter values (fp32, vals[0] = unit element w_base, w_count of them) into the view: the working
 * parameters (rounded when 16-bit) and the masters. */
void zs_ckpt_apply_params(struct zs_ctx *ctx, const struct unit_view *v, const float *vals)
{
    if (!v->work) {
        memcpy(v->p, vals + (v->p_base - v->w_base), (size_t)v->p_count * sizeof(float));
        return;
    }
    zs_cvt_from_f32(v->work, (int)ctx->pdt, vals, v->w_count);
    memcpy(v->p, vals + (v->p_base - v->w_base), (size_t)v->p_count * sizeof(float));
}
