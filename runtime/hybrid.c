/* hybrid.c - hybrid sharding (DeepSpeed's MiCS, FSDP2's HSDP): zero_optimization.mics_shard_size G shards every
 * unit over a group of G consecutive ranks and replicates the group world / G times. Two communicators stand
 * for it: the group's (reduce-scatter and gathers) and the replicas' (the ranks with the same index in their
 * group: the gradients' sum across groups). */
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

zs_status zs_hybrid_start(struct zs_ctx *ctx)
{
    int64_t g = ctx->cfg.zero.mics_shard_size;
    zs_status st;

    if (g == -1 || g == ctx->world)
        return ZS_OK;
    if (g < 1 || g > ctx->world || ctx->world % g != 0)
        return zs_fail(ZS_ERR_CONFIG, "zero_optimization.mics_shard_size %lld does not divide the world size %d "
                       "(shard groups must be equal)", (long long)g, ctx->world);
    if (ctx->cfg.zero.stage == 0)
        return zs_fail(ZS_ERR_CONFIG, "zero_optimization.mics_shard_size %lld needs ZeRO stage 1, 2 or 3 (stage 0 "
                       "shards nothing)", (long long)g);
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

void zs_hybrid_free(struct zs_ctx *ctx)
{
    zs_coll_close(&ctx->gcoll);
    zs_coll_close(&ctx->rcoll);
    zs_comm_free(ctx->gcomm);
    zs_comm_free(ctx->rcomm);
    ctx->gcomm = ctx->rcomm = NULL;
    if (ctx->rmpi != MPI_COMM_NULL && ctx->rmpi != 0)
        MPI_Comm_free(&ctx->rmpi);
    ctx->scoll = &ctx->coll;
    ctx->scomm = ctx->comm;
}

void zs_hybrid_describe(const struct zs_ctx *ctx, char *buf, size_t len)
{
    if (ctx->nreplicas == 1)
        snprintf(buf, len, "flat: one shard group of %d ranks", ctx->world);
    else
        snprintf(buf, len, "hybrid: %d groups of %d ranks (sharded inside a group, replicated across groups; "
                 "group: %s, replicas: %s)", ctx->nreplicas, ctx->shard_size, zs_comm_describe(ctx->gcomm),
                 zs_comm_describe(ctx->rcomm));
}
