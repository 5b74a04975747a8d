/* devio.c - which transport carries the engine's device collectives (zeroshard.device_comm, agreed by every
 * rank; comm/coll.c carries them), and the public copies to and from the engine's device memory. */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "comm/comm_nccl.h" /* defines: zs_nccl_shared_gpu */
#include "core/ctx.h"
#include "core/ranks.h"
#include "runtime.h"

/* zeroshard.device_comm, or ZS_DEVICE_COMM over it: "auto" (NCCL's ordered mode where every rank has a GPU of
 * its own and NCCL starts, host-staged otherwise), "nccl", "ordered" or "staged". */
static zs_status device_comm(struct zs_ctx *ctx, const char **mode, const char **key)
{
    const char *e = getenv("ZS_DEVICE_COMM");

    *mode = ctx->cfg.zs.device_comm[0] ? ctx->cfg.zs.device_comm : "auto";
    *key = "zeroshard.device_comm";
    if (e && *e) {
        *mode = e;
        *key = "ZS_DEVICE_COMM";
    }
    if (strcmp(*mode, "auto") && strcmp(*mode, "nccl") && strcmp(*mode, "ordered") && strcmp(*mode, "staged"))
        return zs_fail(ZS_ERR_CONFIG, "%s: expected \"auto\", \"nccl\", \"ordered\" or \"staged\", got \"%.40s\"",
                       *key, *mode);
    /* the environment may be the job's, set for its GPU runs: the CPU device, which has no device transport,
     * ignores it; the config key asks for one and is refused */
    if (ctx->dev.host_access && strcmp(*mode, "auto")) {
        if (e && *e)
            return ZS_OK;
        return zs_fail(ZS_ERR_CONFIG, "%s: \"%s\" needs zeroshard.device \"cuda\" (the CPU device's collectives "
                       "are comm/comm.c's, in place)", *key, *mode);
    }
    if (ctx->cfg.zs.deterministic && !strcmp(*mode, "nccl"))
        return zs_fail(ZS_ERR_CONFIG, "%s: \"nccl\" is not bit-identical and zeroshard.deterministic needs exact "
                       "sums; use \"ordered\"", *key);
    if (ctx->dev.kind != ZS_DEV_CUDA && (!strcmp(*mode, "nccl") || !strcmp(*mode, "ordered")))
        return zs_fail(ZS_ERR_CONFIG, "%s: \"%s\" needs zeroshard.device \"cuda\"", *key, *mode);
    return ZS_OK;
}

/* Collective. "auto": NCCL (ordered) where no two ranks share a GPU, by the ranks' gathered (PCI bus id, host)
 * pairs (NCCL refuses two ranks on one; a count of visible GPUs says nothing where each rank's
 * CUDA_VISIBLE_DEVICES shows it one); where NCCL cannot start on some rank (no libnccl, ...), every rank keeps
 * the host-staged transport and rank 0 says why. "nccl" and "ordered" ask for NCCL and fail, naming the key,
 * where it cannot start; "staged" keeps the host-staged transport. NCCL carries only the world's collectives,
 * which hybrid sharding never uses (its shard group's and replicas' are host-staged): there no NCCL
 * communicator or staging buffer is made (the memory plan counts none either, core/plan.c), and "nccl" or
 * "ordered" are refused naming the key. */
zs_status zs_dev_nccl_open(struct zs_ctx *ctx)
{
    const char *mode, *key;
    zs_status st = device_comm(ctx, &mode, &key);
    bool asked = !st && (!strcmp(mode, "nccl") || !strcmp(mode, "ordered"));
    bool want = !st && ctx->dev.kind == ZS_DEV_CUDA && strcmp(mode, "staged") && ctx->nreplicas == 1;
    char gpu[64];
    int32_t a = -1, b = -1;

    if (asked && ctx->nreplicas > 1)
        st = zs_fail(ZS_ERR_CONFIG, "%s: \"%s\": NCCL carries only the world's collectives, and hybrid sharding "
                     "(zero_optimization.mics_shard_size %d) has none (its shard group's and replicas' collectives "
                     "are host-staged); use \"auto\" or \"staged\"", key, mode, ctx->shard_size);
    st = zs_agree(ctx, st);
    if (st || ctx->dev.host_access || zs_agree(ctx, want ? ZS_OK : ZS_ERR_UNSUPPORTED))
        return st; /* "staged", or hybrid sharding: host-staged everywhere */
    if (!asked)
        st = zs_agree(ctx, zs_nccl_shared_gpu(zs_comm_mpi(ctx->comm), ctx->comm, &a, &b, gpu, sizeof(gpu)));
    if (st)
        return st;
    if (a >= 0)
        return ZS_OK; /* ranks a and b share a GPU (every rank has the same gathered answer): host-staged */
    st = zs_agree(ctx, zs_coll_nccl_start(&ctx->coll, zs_comm_mpi(ctx->comm),
                                          !strcmp(mode, "nccl") ? ZS_NCCL_FAST : ZS_NCCL_ORDERED));
    if (st) {
        zs_coll_nccl_stop(&ctx->coll); /* where NCCL started here but not on some other rank */
        if (asked) {
            zs_error_prefix("%s: \"%s\"", key, mode);
            return st;
        }
        if (ctx->rank == 0 && !ctx->quiet)
            zs_log("warning: NCCL did not start (%s); the collectives stay host-staged", zs_last_error());
    }
    return ZS_OK;
}

/* ---------------------------------------------------------------- public API */

zs_status zs_copy_to_host(zs_ctx *ctx, void *host_dst, const void *engine_src, size_t bytes)
{
    if (!ctx || !ctx->dev.ops || (bytes && (!host_dst || !engine_src)))
        return zs_fail(ZS_ERR_INVALID, "zs_copy_to_host: NULL argument");
    return zs_device_copy(&ctx->dev, host_dst, false, engine_src, !ctx->dev.host_access, bytes);
}

zs_status zs_copy_from_host(zs_ctx *ctx, void *engine_dst, const void *host_src, size_t bytes)
{
    if (!ctx || !ctx->dev.ops || (bytes && (!engine_dst || !host_src)))
        return zs_fail(ZS_ERR_INVALID, "zs_copy_from_host: NULL argument");
    return zs_device_copy(&ctx->dev, engine_dst, !ctx->dev.host_access, host_src, false, bytes);
}
