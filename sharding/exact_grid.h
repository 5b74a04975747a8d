/* exact_grid.h - the deterministic sum's grid (exact.c explains it), shared by the deposits (exact.c) and
 * the boundary's collectives, rounding and norm (exact_sum.c). Internal to sharding/. */
#ifndef ZS_EXACT_GRID_H
#define ZS_EXACT_GRID_H

#include <stdint.h>

#include "core/ctx.h"     /* defines: struct zs_ctx, struct zs_unit */
#include "exact_state.h" /* defines: struct zs_exact, struct zs_exact_unit */

#define XK 3              /* counters per element */
#define XW 16             /* bits per band */
#define XBIAS 149         /* 2^-149, fp32's least subnormal, is bit 0 */
#define XBANDS 18         /* bands 0-17: a top band fits an int8 */
#define XMAX_SHARDS 32768 /* micro-shards per window: |V| < 2^15 * 2^48 stays inside int64 */

typedef int64_t i64_alias __attribute__((may_alias)); /* a folded sum, where the counters were */

#define XBAD 127 /* every top band of a unit a rank saw an Inf or NaN in: the agreed maximum marks it */

/* The window's micro-shards (train_batch_size / micro_shard_size): DeepSpeed's 1/(N * accumulation). */
static inline int64_t zs_exact_window_shards(const struct zs_ctx *ctx)
{
    return ctx->world * ctx->cfg.grad_accum_steps * (ctx->cfg.micro_batch_size / ctx->cfg.zs.micro_shard_size);
}

/* A unit's part of the exact state. */
static inline struct zs_exact_unit *zs_exact_unit_of(const struct zs_ctx *ctx, const struct zs_unit *un)
{
    return &ctx->exact->units[un - ctx->units];
}

#endif /* ZS_EXACT_GRID_H */
