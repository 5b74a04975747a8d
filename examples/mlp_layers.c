/* mlp_layers.c - zs-train-mlp's layers as the engine holds them (mlp_layers.h): fetches, fp32 views of
 * 16-bit parameters, and gradients rounded into the engine's buffers and handed over. */
#include <stdint.h>
#include <string.h>

#include "common.h" /* defines: ex_h2f, ex_f2h */
#include "mlp_layers.h"

/* fp32 view of n parameters: the data itself (fp32) or a widened copy in scratch. */
static const float *widen(const struct wide *wd, const void *p, int64_t n, float *scratch)
{
    if (wd->dt == ZS_DTYPE_FP32)
        return p;
    for (int64_t i = 0; i < n; i++)
        scratch[i] = ex_h2f(wd->dt, ((const uint16_t *)p)[i]);
    return scratch;
}

static void fold_grad(const struct wide *wd, void *g16, const float *g, int64_t n)
{
    uint16_t *h = g16;

    for (int64_t i = 0; i < n; i++)
        h[i] = ex_f2h(wd->dt, ex_h2f(wd->dt, h[i]) + g[i]);
}

/* A layer's forward begins: its unit fetched, its weights and biases as fp32 (widened if 16-bit). */
zs_status mlp_layer_begin(zs_ctx *ctx, const struct layer *L, const struct wide *wd, const float **w,
                          const float **b)
{
    zs_status st;
    void *wp, *bp;

    if ((st = zs_unit_fetch(ctx, L->unit, NULL)) || (st = zs_param_data(ctx, L->w, &wp)) ||
        (st = zs_param_data(ctx, L->b, &bp)))
        return st;
    *w = widen(wd, wp, L->in * L->out, wd->w);
    *b = widen(wd, bp, L->out, wd->b);
    return ZS_OK;
}

zs_status mlp_grad_begin(zs_ctx *ctx, const struct layer *L, const struct wide *wd, struct grad_view *v)
{
    zs_status st;
    void *wp;

    if ((st = zs_unit_fetch(ctx, L->unit, NULL)) || (st = zs_param_data(ctx, L->w, &wp)) ||
        (st = zs_grad_buffer(ctx, L->unit, &v->gp)) || (st = zs_param_info(ctx, L->w, NULL, NULL, NULL, &v->woff)) ||
        (st = zs_param_info(ctx, L->b, NULL, NULL, NULL, &v->boff)))
        return st;
    v->w = widen(wd, wp, L->in * L->out, wd->w);
    return ZS_OK;
}

/* A piece of the layer's gradient (the whole micro-batch, or one micro-shard in deterministic mode) opens
 * its fp32 arrays: the buffer itself (fp32) or zeroed scratch (16-bit)... */
void mlp_grad_open(const struct layer *L, const struct wide *wd, struct grad_view *v)
{
    if (wd->dt == ZS_DTYPE_FP32) { /* straight into the buffer */
        v->gw = (float *)v->gp + v->woff;
        v->gb = (float *)v->gp + v->boff;
    } else {
        v->gw = wd->gw;
        v->gb = wd->gb;
        memset(v->gw, 0, (size_t)(L->in * L->out) * sizeof(float));
        memset(v->gb, 0, (size_t)L->out * sizeof(float));
    }
}

/* ... and closes: a 16-bit piece rounded into the buffer, then handed to zs_grad_deposit (nothing outside
 * deterministic mode). */
zs_status mlp_grad_close(zs_ctx *ctx, const struct layer *L, const struct wide *wd,
                         const struct grad_view *v)
{
    if (wd->dt != ZS_DTYPE_FP32) {
        fold_grad(wd, (uint16_t *)v->gp + v->woff, v->gw, L->in * L->out);
        fold_grad(wd, (uint16_t *)v->gp + v->boff, v->gb, L->out);
    }
    return zs_grad_deposit(ctx, L->unit);
}

/* The layer's backward ends: the unit handed over and released. */
zs_status mlp_grad_end(zs_ctx *ctx, const struct layer *L)
{
    zs_status st;

    if ((st = zs_grad_ready(ctx, L->unit)) || (st = zs_unit_release(ctx, L->unit)))
        return st;
    return ZS_OK;
}
