/* engine_io.c - zs-train-gpt's view of the engine (engine_io.h): fetched units widened to fp32 for the
 * model, its fp32 gradients folded back into the engine's 16-bit or fp32 buffers. */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "../common.h" /* defines: ex_h2f, ex_f2h */
#include "engine_io.h"
#include "vmath.h" /* defines: gpt_vmath (bf16 widening and accumulation, 16 lanes at a time) */

int gpt_io_slot(int32_t unit)
{
    return unit == GPT_UNIT_EMBED ? 0 : 1;
}

static int io_fetch(void *arg, int32_t unit, const float **w)
{
    struct engine_io *e = arg;
    void *data;
    zs_status st = zs_unit_fetch(e->ctx, unit, &data);

    if (st)
        return (int)st;
    if (e->dt == ZS_DTYPE_FP32) {
        *w = data;
        return 0;
    }
    float *dst = e->w[gpt_io_slot(unit)];
    const uint16_t *src = data;
    bool block = unit != GPT_UNIT_EMBED && unit != GPT_UNIT_LNF(e->cfg);
    for (int32_t k = 0; k < gpt_unit_tensors(e->cfg, unit); k++) {
        struct gpt_tensor_info t;
        gpt_tensor_info(e->cfg, unit, k, &t);
        if (e->mm16 && block && t.ndim == 2) /* read in bf16 by the products, never widened */
            continue;
        if (e->dt == ZS_DTYPE_BF16)
            gpt_vmath()->from_bf16(dst + e->lay->off[unit][k], src + e->lay->off[unit][k], t.numel);
        else
            for (int64_t i = e->lay->off[unit][k]; i < e->lay->off[unit][k] + t.numel; i++)
                dst[i] = ex_h2f(e->dt, src[i]);
    }
    e->raw[gpt_io_slot(unit)] = src;
    *w = dst;
    return 0;
}

static const uint16_t *io_fetched16(void *arg, int32_t unit)
{
    struct engine_io *e = arg;

    return e->mm16 ? e->raw[gpt_io_slot(unit)] : NULL;
}

static int io_release(void *arg, int32_t unit)
{
    return (int)zs_unit_release(((struct engine_io *)arg)->ctx, unit);
}

static int io_grad(void *arg, int32_t unit, float **g)
{
    struct engine_io *e = arg;

    *g = e->g[gpt_io_slot(unit)];
    memset(*g, 0, (size_t)e->lay->unit_numel[unit] * sizeof(float));
    return 0;
}

static int io_grad_done(void *arg, int32_t unit)
{
    struct engine_io *e = arg;
    const float *g = e->g[gpt_io_slot(unit)];
    void *buf;
    zs_status st = zs_grad_buffer(e->ctx, unit, &buf);

    if (st)
        return (int)st;
    if (e->dt == ZS_DTYPE_BF16)
        gpt_vmath()->add_bf16(buf, g, e->lay->unit_numel[unit]);
    else
        for (int64_t i = 0; i < e->lay->unit_numel[unit]; i++) {
            if (e->dt == ZS_DTYPE_FP32)
                ((float *)buf)[i] += g[i];
            else
                ((uint16_t *)buf)[i] = ex_f2h(e->dt, ex_h2f(e->dt, ((uint16_t *)buf)[i]) + g[i]);
        }
    if ((st = zs_grad_deposit(e->ctx, unit)) || e->not_last) /* the deposit: a no-op in the normal mode */
        return (int)st;
    return (int)zs_grad_ready(e->ctx, unit);
}

static void init_values(void *arg, int32_t param, int64_t first, int64_t count, float *dst)
{
    const struct tensor_init *t = arg;

    (void)param;
    for (int64_t i = 0; i < count; i++)
        dst[i] = gpt_init_value(&t->info, t->seed, t->unit, t->k, first + i);
}

zs_status gpt_register_model(zs_ctx *ctx, const struct gpt_config *cfg, uint64_t seed, struct tensor_init *ti,
                             struct gpt_layout *lay)
{
    zs_status st = ZS_OK;
    int32_t n = 0, unit, param;

    for (int32_t u = 0; u < lay->nunits && !st; u++) {
        char name[32];
        snprintf(name, sizeof(name), u == GPT_UNIT_EMBED ? "embed" : u == GPT_UNIT_LNF(cfg) ? "ln_f" : "h.%d",
                 u - 1);
        if ((st = zs_unit_add(ctx, name, &unit)))
            break;
        for (int32_t k = 0; k < gpt_unit_tensors(cfg, u) && !st; k++, n++) {
            struct tensor_init *t = &ti[n];
            int64_t off;
            *t = (struct tensor_init){.seed = seed, .unit = u, .k = k};
            gpt_tensor_info(cfg, u, k, &t->info);
            if (!(st = zs_param_add_init(ctx, unit, t->info.name, t->info.numel, init_values, t, &param)) &&
                !(st = zs_param_shape(ctx, param, t->info.ndim, t->info.dims)) &&
                !(st = zs_param_info(ctx, param, NULL, NULL, NULL, &off))) {
                lay->off[u][k] = off;
                lay->unit_numel[u] = off + t->info.numel;
            }
        }
    }
    return st;
}

struct gpt_io_f32 gpt_engine_io(struct engine_io *e)
{
    return (struct gpt_io_f32){e, io_fetch, io_release, io_grad, io_grad_done, io_fetched16};
}
