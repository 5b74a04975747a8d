/* devio.c - the engine's reach into the device that holds its model states: copies to and from it that are
 * finished before the host looks, and the collectives on its buffers. Where the host can read the device's
 * memory (the CPU) they are comm/comm.c's, nonblocking and in place; on GPUs of their own, NCCL (the ordered
 * mode, comm.c's bits, or NCCL's own sums: zeroshard.device_comm) on NCCL's stream; otherwise (ranks sharing
 * a GPU, the separate test device) the host-staged transport on the communication stream. Either stream starts
 * after the compute stream's work (an event) and the compute stream's later work waits for it (another), so the
 * engine treats the collective as complete. */
#include <stdlib.h>
#include <string.h>

#include "comm_nccl.h" /* defines: zs_nccl_init, zs_nccl_reduce_scatter, zs_nccl_all_gather, zs_nccl_all_reduce */
#include "engine.h"
#include "error.h"

static zs_status dev_fail(zs_status st, const char *what)
{
    zs_error_prefix("device %s", what);
    return st;
}

zs_status zs_dev_copy(struct zs_ctx *ctx, void *dst, bool dst_dev, const void *src, bool src_dev, size_t bytes)
{
    struct zs_device *d = &ctx->dev;
    enum zs_copy_dir dir = dst_dev ? (src_dev ? ZS_COPY_D2D : ZS_COPY_H2D) : ZS_COPY_D2H;
    zs_status st;

    if (!bytes)
        return ZS_OK;
    if (!dst_dev && !src_dev) {
        memmove(dst, src, bytes);
        return ZS_OK;
    }
    st = d->ops->copy(d, dst, src, bytes, dir, d->compute);
    /* host memory on either side may be read or reused as soon as this returns */
    if (!st && dir != ZS_COPY_D2D)
        st = d->ops->stream_sync(d, d->compute);
    return st ? dev_fail(st, dir == ZS_COPY_H2D ? "copy up" : dir == ZS_COPY_D2H ? "copy down" : "copy") : ZS_OK;
}

zs_status zs_dev_streams_open(struct zs_ctx *ctx)
{
    struct zs_device *d = &ctx->dev;
    zs_status st = d->ops->stream_create(d, &ctx->comm_stream);

    if (!st)
        st = d->ops->event_create(d, &ctx->ev_compute);
    if (!st)
        st = d->ops->event_create(d, &ctx->ev_comm);
    if (!st && !d->host_access)
        zs_staged_init(&ctx->staged, ctx->comm, d);
    return st ? dev_fail(st, "streams") : ZS_OK;
}

/* zeroshard.device_comm, or ZS_DEVICE_COMM over it: "auto" (NCCL's ordered mode where every rank has a GPU of
 * its own and NCCL starts, host-staged otherwise), "nccl", "ordered" or "staged". */
static zs_status device_comm(struct zs_ctx *ctx, const char **mode, const char **key)
{
    const char *e = getenv("ZS_DEVICE_COMM");

    *mode = ctx->cfg.cpu.device_comm[0] ? ctx->cfg.cpu.device_comm : "auto";
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
    if (ctx->cfg.cpu.deterministic && !strcmp(*mode, "nccl"))
        return zs_fail(ZS_ERR_CONFIG, "%s: \"nccl\" is not bit-identical and zeroshard.deterministic needs exact "
                       "sums; use \"ordered\"", *key);
    if (ctx->dev.kind != ZS_DEV_CUDA && (!strcmp(*mode, "nccl") || !strcmp(*mode, "ordered")))
        return zs_fail(ZS_ERR_CONFIG, "%s: \"%s\" needs zeroshard.device \"cuda\"", *key, *mode);
    return ZS_OK;
}

/* Collective. "auto": NCCL (ordered) where every rank of every node has a GPU of its own (NCCL refuses two
 * ranks on one); where NCCL cannot start on some rank (no libnccl, ...), every rank keeps the host-staged
 * transport and rank 0 says why. "nccl" and "ordered" ask for NCCL and fail, naming the key, where it cannot
 * start; "staged" keeps the host-staged transport. */
zs_status zs_dev_nccl_open(struct zs_ctx *ctx)
{
    const char *mode, *key;
    zs_status st = zs_agree(ctx, device_comm(ctx, &mode, &key));
    bool asked = !st && (!strcmp(mode, "nccl") || !strcmp(mode, "ordered"));
    bool want = !st && ctx->dev.kind == ZS_DEV_CUDA && strcmp(mode, "staged") &&
                (asked || ctx->dev.ops->count() >= ctx->local_size);

    if (st || ctx->dev.host_access || zs_agree(ctx, want ? ZS_OK : ZS_ERR_UNSUPPORTED))
        return st; /* some rank shares its GPU, or "staged": host-staged everywhere */
    st = zs_agree(ctx, zs_nccl_init(&ctx->nccl, zs_comm_mpi(ctx->comm),
                                    !strcmp(mode, "nccl") ? ZS_NCCL_FAST : ZS_NCCL_ORDERED));
    if (st) {
        zs_nccl_free(ctx->nccl);
        ctx->nccl = NULL;
        if (asked) {
            zs_error_prefix("%s: \"%s\"", key, mode);
            return st;
        }
        if (ctx->rank == 0 && !ctx->quiet)
            zs_log("warning: NCCL did not start (%s); the collectives stay host-staged", zs_last_error());
    }
    return ZS_OK;
}

void zs_dev_streams_close(struct zs_ctx *ctx)
{
    struct zs_device *d = &ctx->dev;

    if (!d->ops)
        return;
    if (ctx->staged.comm)
        zs_staged_free(&ctx->staged);
    zs_nccl_free(ctx->nccl);
    ctx->nccl = NULL;
    if (ctx->ev_comm)
        d->ops->event_free(d, ctx->ev_comm);
    if (ctx->ev_compute)
        d->ops->event_free(d, ctx->ev_compute);
    if (ctx->comm_stream)
        d->ops->stream_free(d, ctx->comm_stream);
    ctx->ev_comm = ctx->ev_compute = NULL;
    ctx->comm_stream = NULL;
}

/* The communication stream starts after what the compute stream has queued (the program's gradients, the
 * engine's zeroing and scaling). */
static zs_status comm_begin(struct zs_ctx *ctx)
{
    struct zs_device *d = &ctx->dev;
    zs_status st = d->ops->event_record(d, ctx->ev_compute, d->compute);

    if (!st)
        st = d->ops->stream_wait(d, ctx->comm_stream, ctx->ev_compute);
    return st ? dev_fail(st, "event (compute -> communication)") : ZS_OK;
}

/* ... and the compute stream's later work after the result is in place. */
static zs_status comm_end(struct zs_ctx *ctx, zs_status op)
{
    struct zs_device *d = &ctx->dev;
    zs_status st = d->ops->event_record(d, ctx->ev_comm, ctx->comm_stream);

    if (!st)
        st = d->ops->stream_wait(d, d->compute, ctx->ev_comm);
    if (op)
        return op;
    return st ? dev_fail(st, "event (communication -> compute)") : ZS_OK;
}

/* After an NCCL launch: the compute stream's later work waits for NCCL's stream. */
static zs_status nccl_end(struct zs_ctx *ctx, zs_status op)
{
    struct zs_device *d = &ctx->dev;
    struct zs_dev_stream *ns = zs_nccl_stream(ctx->nccl);
    zs_status st;

    if (op)
        return op;
    st = d->ops->event_record(d, ctx->ev_comm, ns);
    if (!st)
        st = d->ops->stream_wait(d, d->compute, ctx->ev_comm);
    return st ? dev_fail(st, "event (NCCL -> compute)") : ZS_OK;
}

zs_status zs_coll_reduce_scatter(struct zs_ctx *ctx, const void *buf, zs_dtype dt_in, void *out, zs_dtype dt_out,
                                 int64_t count, float scale, struct zs_comm_req **req)
{
    zs_status st;

    *req = NULL;
    if (ctx->dev.host_access)
        return zs_comm_reduce_scatter_dt(ctx->comm, buf, dt_in, out, dt_out, count, scale, req);
    if (ctx->nccl)
        return nccl_end(ctx, zs_nccl_reduce_scatter(ctx->nccl, buf, dt_in, out, dt_out, count, scale, ctx->dev.compute));
    st = comm_begin(ctx);
    if (st)
        zs_comm_fail_next(ctx->comm); /* the peers' operation still ends, failed, on every rank */
    return comm_end(ctx, zs_staged_reduce_scatter(&ctx->staged, buf, dt_in, out, dt_out, count, scale,
                                                  ctx->comm_stream));
}

zs_status zs_coll_all_gather(struct zs_ctx *ctx, void *buf, zs_dtype dt, int64_t count, struct zs_comm_req **req)
{
    zs_status st;

    *req = NULL;
    if (ctx->dev.host_access)
        return zs_comm_all_gather_dt(ctx->comm, buf, dt, count, req);
    if (ctx->nccl)
        return nccl_end(ctx, zs_nccl_all_gather(ctx->nccl, buf, dt, count, ctx->dev.compute));
    st = comm_begin(ctx);
    if (st)
        zs_comm_fail_next(ctx->comm);
    return comm_end(ctx, zs_staged_all_gather(&ctx->staged, buf, dt, count, ctx->comm_stream));
}

zs_status zs_coll_all_reduce(struct zs_ctx *ctx, void *buf, zs_dtype dt, int64_t count, float scale,
                             struct zs_comm_req **req)
{
    zs_status st;

    *req = NULL;
    if (ctx->dev.host_access)
        return zs_comm_all_reduce_dt(ctx->comm, buf, dt, count, scale, req);
    if (ctx->nccl)
        return nccl_end(ctx, zs_nccl_all_reduce(ctx->nccl, buf, dt, count, scale, ctx->dev.compute));
    st = comm_begin(ctx);
    if (st)
        zs_comm_fail_next(ctx->comm);
    return comm_end(ctx, zs_staged_all_reduce(&ctx->staged, buf, dt, count, scale, ctx->comm_stream));
}

zs_status zs_coll_wait(struct zs_ctx *ctx, struct zs_comm_req *req)
{
    return req ? zs_comm_wait(ctx->comm, req) : ZS_OK;
}

zs_status zs_coll_test(struct zs_ctx *ctx, struct zs_comm_req *req, bool *done)
{
    if (!req) {
        *done = true;
        return ZS_OK;
    }
    return zs_comm_test(ctx->comm, req, done);
}

/* ---------------------------------------------------------------- public API */

zs_status zs_copy_to_host(zs_ctx *ctx, void *host_dst, const void *engine_src, size_t bytes)
{
    if (!ctx || !ctx->dev.ops || (bytes && (!host_dst || !engine_src)))
        return zs_fail(ZS_ERR_INVALID, "zs_copy_to_host: NULL argument");
    return zs_dev_copy(ctx, host_dst, false, engine_src, !ctx->dev.host_access, bytes);
}

zs_status zs_copy_from_host(zs_ctx *ctx, void *engine_dst, const void *host_src, size_t bytes)
{
    if (!ctx || !ctx->dev.ops || (bytes && (!engine_dst || !host_src)))
        return zs_fail(ZS_ERR_INVALID, "zs_copy_from_host: NULL argument");
    return zs_dev_copy(ctx, engine_dst, !ctx->dev.host_access, host_src, false, bytes);
}
