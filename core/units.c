/* units.c - which of a unit's elements the optimizer updates on this rank, in which buffers. */
#include "units.h"

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
