/* units.h - where a unit's state lives on this rank (host or device memory, the swap file) and which of its
 * elements the optimizer updates: what sharding/, offload/ and the step all ask. */
#ifndef ZS_UNITS_H
#define ZS_UNITS_H

#include <stdbool.h>
#include <stdint.h>

#include "ctx.h" /* defines: struct zs_ctx, struct zs_unit */

/* The offload settings: optimizer state (stages 1-3) and parameter shards (stage 3) on the host or NVMe. */
static inline bool zs_offload_optimizer_on_host(const struct zs_ctx *ctx)
{
    return ctx->cfg.zero.stage >= 1 && ctx->cfg.zero.offload_optimizer.device == ZS_OFFLOAD_CPU;
}

static inline bool zs_offload_optimizer_on_nvme(const struct zs_ctx *ctx)
{
    return ctx->cfg.zero.stage >= 1 && ctx->cfg.zero.offload_optimizer.device == ZS_OFFLOAD_NVME;
}

static inline bool zs_offload_params_on_nvme(const struct zs_ctx *ctx)
{
    return ctx->cfg.zero.stage == 3 && ctx->cfg.zero.offload_param.device == ZS_OFFLOAD_NVME;
}

static inline bool zs_offload_params_on_host(const struct zs_ctx *ctx)
{
    return ctx->cfg.zero.stage == 3 && ctx->cfg.zero.offload_param.device == ZS_OFFLOAD_CPU;
}

/* Stage 3 shards a unit unless the persistence threshold keeps it whole on every rank. */
static inline bool zs_unit_is_sharded(const struct zs_ctx *ctx, const struct zs_unit *un)
{
    return ctx->cfg.zero.stage == 3 && un->numel >= ctx->cfg.zero.param_persistence_threshold;
}
/* Whether unit u's working parameters (the shard, at stage 3 with offload_param cpu) are host memory. */
static inline bool zs_params_on_host(const struct zs_ctx *ctx, const struct zs_unit *un)
{
    return ctx->dev.host_access || (un->sharded && zs_offload_params_on_host(ctx));
}
/* Whether the optimizer's fp32 arrays (masters, moments) are host memory. */
static inline bool zs_optstate_on_host(const struct zs_ctx *ctx)
{
    return ctx->dev.host_access || zs_offload_optimizer_on_host(ctx);
}


/* The fp32 parameters the optimizer updates for unit u on this rank (the working parameters in fp32,
 * the masters with 16-bit ones; NULL when those live in the swap file), and how many elements. */
float *zs_unit_master(struct zs_ctx *ctx, int32_t u, int64_t *n);
/* The working parameters (ctx->pdt) of the same elements. */
void *zs_unit_working(struct zs_ctx *ctx, int32_t u);

/* This rank's reduced gradient shard of unit u, ctx->gdt elements (valid after flush at a boundary). */
void *zs_unit_grad_shard(struct zs_ctx *ctx, int32_t u);
/* Elements [begin, end) of what this rank owns of unit u as one tensor of an optimizer launch; s1, s2 point at
 * the unit's element 0, disk_p at its fp32 masters and disk_w at its 16-bit working shard when they were paged
 * in from NVMe (else NULL). */
void zs_unit_tensor(struct zs_ctx *ctx, int32_t u, float *disk_p, void *disk_w, float *s1, float *s2, int64_t begin,
                    int64_t end, struct zs_optim_tensor *t);
/* What the optimizer steps with: each parameter group's scalars, and room for a unit split by group (as many
 * tensors as the unit with the most parameters has). */
struct zs_optim_groups {
    const struct zs_optim_step *steps; /* [group] */
    struct zs_optim_tensor *t;
};
/* Splits t (elements [begin, begin + t->n) of what this rank owns of unit u, as zs_unit_tensor makes them,
 * buffers possibly moved to staging) where its parameters' group changes, each piece with its group's step
 * (an alignment gap goes with the parameter before it); an SGD piece whose group has no momentum goes
 * without the momentum buffer, as torch's. Writes at most the unit's parameter count into out; returns how
 * many. */
int32_t zs_unit_split(const struct zs_ctx *ctx, int32_t u, const struct zs_optim_tensor *t, int64_t begin,
                      const struct zs_optim_step *steps, struct zs_optim_tensor *out);
/* A launch of the config's optimizer over count such tensors. */
struct zs_optim_launch zs_unit_launch(const struct zs_ctx *ctx, const struct zs_optim_step *s,
                                      const struct zs_optim_tensor *t, int32_t count);

#endif /* ZS_UNITS_H */
