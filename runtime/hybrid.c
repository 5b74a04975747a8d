/* hybrid.c - hybrid sharding (DeepSpeed's MiCS, FSDP2's HSDP): zero_optimization.mics_shard_size G shards every
 * unit over a group of G consecutive ranks and replicates the group world / G times. Two communicators stand
 * for it: the group's (reduce-scatter and gathers) and the replicas' (the ranks with the same index in their
 * group: the gradients' sum across groups). ZeRO++ hpZ (zero_hpz_partition_size H) adds a third: H consecutive
 * ranks inside the shard group, over which stage 3's re-gathers run from a secondary copy (sharding/fetch.c). */
#include <stdio.h>
#include <string.h>

#include "base/error.h"
#include "core/ranks.h" /* defines: zs_comm_opts_for */
#include "runtime.h"

void zs_hybrid_flat(struct zs_ctx *ctx)
{
    ctx->shard_rank = ctx->rank;
    ctx->shard_size = ctx->world;
    ctx->replica = 0;
    ctx->nreplicas = 1;
    ctx->scoll = &ctx->coll;
    ctx->scomm = ctx->comm;
    ctx->rmpi = MPI_COMM_NULL;
}

/* A forced node layout (ZS_FAKE_NODE_SIZE F) as each sub-communicator sees it: the group's ranks fall in nodes
 * of F (G a multiple of F) or all in one (F a multiple of G); a node then holds one replica, or F / G. */
static zs_status fake_sizes(struct zs_ctx *ctx, int32_t f, int32_t g)
{
    if (f <= 0 || f >= ctx->world) {
        ctx->gfake = ctx->rfake = f > 0 ? (f < g ? f : g) : 0;
        if (f >= ctx->world)
            ctx->rfake = ctx->nreplicas;
        return ZS_OK;
    }
    if (g % f == 0) {
        ctx->gfake = f;
        ctx->rfake = 1;
    } else if (f % g == 0) {
        ctx->gfake = g;
        ctx->rfake = f / g;
    } else {
        return zs_fail(ZS_ERR_CONFIG, "zero_optimization.mics_shard_size %d and the forced node size %d "
                       "(ZS_FAKE_NODE_SIZE / zeroshard.fake_node_size): one must divide the other", g, f);
    }
    return ZS_OK;
}

/* The sub-comm's rank j is the program's rank base + j * stride (errors name it so). */
static zs_status open_sub(struct zs_ctx *ctx, int32_t color, const char *name, int32_t fake, int32_t base, int32_t stride,
                          struct zs_comm **comm, struct zs_coll *coll, MPI_Comm *keep)
{
    struct zs_comm_opts co;
    MPI_Comm split;
    zs_status st;

    if (MPI_Comm_split(zs_comm_mpi(ctx->comm), color, ctx->rank, &split) != MPI_SUCCESS)
        return zs_fail(ZS_ERR_COMM, "hybrid sharding: MPI_Comm_split for the %s communicator failed", name);
    st = zs_comm_opts_for(ctx, &co);
    co.fake_node_size = fake;
    co.name = name;
    co.name_base = base;
    co.name_stride = stride;
    if (!st)
        st = zs_comm_init(comm, split, &co);
    if (!st)
        st = zs_coll_open(coll, *comm, &ctx->dev);
    if (keep && !st)
        *keep = split;
    else
        MPI_Comm_free(&split);
    return st;
}

static zs_status hybrid_groups(struct zs_ctx *ctx)
{
    int64_t g = ctx->cfg.zero.mics_shard_size;
    zs_status st;

    if (g == -1 || g == ctx->world) /* zs_hybrid_start checked the rest (zs_layout_check) */
        return ZS_OK;
    ctx->shard_size = (int32_t)g;
    ctx->shard_rank = ctx->rank % (int32_t)g;
    ctx->replica = ctx->rank / (int32_t)g;
    ctx->nreplicas = ctx->world / (int32_t)g;
    struct zs_comm_opts co;
    st = zs_comm_opts_for(ctx, &co);
    if (!st)
        st = fake_sizes(ctx, co.fake_node_size, (int32_t)g);
    if (!st)
        st = open_sub(ctx, ctx->replica, "group", ctx->gfake, ctx->replica * (int32_t)g, 1, &ctx->gcomm, &ctx->gcoll,
                      NULL);
    if (!st)
        st = open_sub(ctx, ctx->shard_rank, "replica", ctx->rfake, ctx->shard_rank, (int32_t)g, &ctx->rcomm,
                      &ctx->rcoll, &ctx->rmpi);
    if (st)
        return st;
    ctx->scoll = &ctx->gcoll;
    ctx->scomm = ctx->gcomm;
    return ZS_OK;
}

/* The forced node layout as the secondary group sees it: its H consecutive ranks fall in nodes of F (H a multiple
 * of F) or all in one (F a multiple of H, or F at least the world). */
static zs_status hpz_fake(struct zs_ctx *ctx, int32_t f, int32_t h)
{
    if (f <= 0 || f >= ctx->world || f % h == 0)
        ctx->hfake = f > 0 ? h : 0;
    else if (h % f == 0)
        ctx->hfake = f;
    else
        return zs_fail(ZS_ERR_CONFIG, "zero_optimization.zero_hpz_partition_size %d and the forced node size %d "
                       "(ZS_FAKE_NODE_SIZE / zeroshard.fake_node_size): one must divide the other", h, f);
    return ZS_OK;
}

/* ZeRO++ hpZ: H must divide the shard group (the secondary groups then tile it); H equal to the group is the
 * primary gather again, accepted as off. */
static zs_status hpz_start(struct zs_ctx *ctx)
{
    int64_t h = ctx->cfg.zero.hpz_partition_size;
    struct zs_comm_opts co;
    zs_status st;

    if (h <= 1 || ctx->cfg.zero.stage != 3) /* stages 0-2 were refused by the parser, the rest by zs_layout_check */
        return ZS_OK;
    ctx->hpz_size = zs_hpz_size(&ctx->cfg, ctx->shard_size);
    if (!ctx->hpz_size)
        return ZS_OK;
    ctx->hpz_rank = ctx->rank % ctx->hpz_size;
    st = zs_comm_opts_for(ctx, &co);
    if (!st)
        st = hpz_fake(ctx, co.fake_node_size, ctx->hpz_size);
    if (!st)
        st = open_sub(ctx, ctx->rank / ctx->hpz_size, "secondary", ctx->hfake, ctx->rank - ctx->hpz_rank, 1,
                      &ctx->hcomm, &ctx->hcoll, NULL);
    /* The quantized gather leaves this node's shards exact and the other nodes' dequantized: a slice taken from
     * it across nodes is other bits than a fetch from the full gather (forward and backward of one micro-batch
     * would see different weights), and the secondary gather would cross nodes at full width. Every rank sees
     * the same layout, so all refuse alike. */
    if (!st && ctx->cfg.zero.quantized_weights && zs_comm_local_size(ctx->hcomm) < ctx->hpz_size)
        st = zs_fail(ZS_ERR_CONFIG, "zero_optimization.zero_hpz_partition_size %d with "
                     "zero_optimization.zero_quantized_weights: the secondary group of %d ranks crosses nodes (%d of "
                     "its ranks on this rank's node); make it a node or part of one, or drop one of the keys",
                     ctx->hpz_size, ctx->hpz_size, zs_comm_local_size(ctx->hcomm));
    if (st)
        ctx->hpz_size = 0;
    return st;
}

zs_status zs_hybrid_start(struct zs_ctx *ctx)
{
    const struct zs_zero_config *z = &ctx->cfg.zero;
    struct zs_layout_keys k = {.stage = z->stage, .mics = z->mics_shard_size, .hpz = z->hpz_partition_size,
                               .quant_weights = z->quantized_weights, .quant_grads = z->quantized_gradients};
    char why[400];
    zs_status st = zs_layout_check(&k, ctx->world, why, sizeof(why));

    if (st)
        return zs_fail(st, "%s", why);
    st = hybrid_groups(ctx);

    return st ? st : hpz_start(ctx);
}

void zs_hybrid_free(struct zs_ctx *ctx)
{
    zs_coll_close(&ctx->gcoll);
    zs_coll_close(&ctx->rcoll);
    zs_coll_close(&ctx->hcoll);
    zs_comm_free(ctx->gcomm);
    zs_comm_free(ctx->rcomm);
    zs_comm_free(ctx->hcomm);
    ctx->gcomm = ctx->rcomm = ctx->hcomm = NULL;
    if (ctx->rmpi != MPI_COMM_NULL && ctx->rmpi != 0)
        MPI_Comm_free(&ctx->rmpi);
    ctx->scoll = &ctx->coll;
    ctx->scomm = ctx->comm;
}

void zs_hybrid_describe(const struct zs_ctx *ctx, char *buf, size_t len)
{
    int n;

    if (ctx->nreplicas == 1)
        n = snprintf(buf, len, "flat: one shard group of %d ranks", ctx->world);
    else
        n = snprintf(buf, len, "hybrid: %d groups of %d ranks (sharded inside a group, replicated across groups; "
                     "group: %s, replicas: %s)", ctx->nreplicas, ctx->shard_size, zs_comm_describe(ctx->gcomm),
                     zs_comm_describe(ctx->rcomm));
    if (n < 0 || (size_t)n >= len || ctx->cfg.zero.hpz_partition_size <= 1 || ctx->cfg.zero.stage != 3)
        return;
    if (ctx->hpz_size)
        snprintf(buf + n, len - (size_t)n, "; hpZ: secondary copy over %d ranks (%s)", ctx->hpz_size,
                 zs_comm_describe(ctx->hcomm));
    else
        snprintf(buf + n, len - (size_t)n, "; hpZ: off (zero_hpz_partition_size %lld is the shard group)",
                 (long long)ctx->cfg.zero.hpz_partition_size);
}
