/* devio.c - the engine's reach into the device that holds its model states: copies to and from it that are
 * finished before the host looks, and the collectives on its buffers. Where the host can read the device's
 * memory (the CPU) they are comm/comm.c's, nonblocking and in place; on GPUs of their own, NCCL (the ordered
 * mode, comm.c's bits, or NCCL's own sums: zeroshard.device_comm) on NCCL's stream; otherwise (ranks sharing a
 * GPU, the separate test device) the host-staged transport on the communication stream. Either stream starts
 * after the compute stream's work (an event); the compute stream waits for the collective's own event only in
 * zs_coll_wait, where the engine needs the result. */
#include <stdlib.h>
#include <string.h>

#include "comm/comm_nccl.h" /* defines: zs_nccl_init, zs_nccl_reduce_scatter, zs_nccl_all_gather, zs_nccl_all_reduce */
#include "engine.h"
#include "base/error.h"

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

/* One collective in flight. Where the host reads the device in place it is comm.c's request; on device
 * buffers, an event recorded on the stream the collective runs on (the communication stream, or NCCL's), which
 * the compute stream waits for only when the engine needs the result (zs_coll_wait): the program's backward
 * and the engine's other work keep the compute stream busy meanwhile. Recycled through ctx->req_free. */
struct zs_coll_req {
    struct zs_comm_req *host;
    struct zs_dev_event *done;
    uint64_t staged;             /* the host-staged operation's number (0: not one), which records `done` */
    struct zs_coll_req *next_free, *next_all;
};

static zs_status req_get(struct zs_ctx *ctx, struct zs_coll_req **out)
{
    struct zs_device *d = &ctx->dev;
    struct zs_coll_req *r = ctx->req_free;
    zs_status st;

    if (r) {
        ctx->req_free = r->next_free;
        *out = r;
        return ZS_OK;
    }
    r = calloc(1, sizeof(*r));
    if (!r)
        return zs_fail(ZS_ERR_NOMEM, "collective request: out of memory");
    if (!d->host_access && (st = d->ops->event_create(d, &r->done))) {
        free(r);
        return dev_fail(st, "event (collective)");
    }
    r->next_all = ctx->req_all;
    ctx->req_all = r;
    *out = r;
    return ZS_OK;
}

static void req_put(struct zs_ctx *ctx, struct zs_coll_req *r)
{
    r->host = NULL;
    r->staged = 0;
    r->next_free = ctx->req_free;
    ctx->req_free = r;
}

static void reqs_free(struct zs_ctx *ctx)
{
    struct zs_device *d = &ctx->dev;

    while (ctx->req_all) {
        struct zs_coll_req *r = ctx->req_all;
        ctx->req_all = r->next_all;
        if (r->done)
            d->ops->event_free(d, r->done);
        free(r);
    }
    ctx->req_free = NULL;
}

zs_status zs_dev_streams_open(struct zs_ctx *ctx)
{
    struct zs_device *d = &ctx->dev;
    zs_status st = d->ops->stream_create(d, &ctx->comm_stream);

    if (!st)
        st = d->ops->event_create(d, &ctx->ev_compute);
    if (!st && !d->host_access)
        zs_staged_init(&ctx->staged, ctx->comm, d);
    return st ? dev_fail(st, "streams") : ZS_OK;
}

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
        zs_staged_free(&ctx->staged); /* lands the operation in flight, records its event: before reqs_free */
    zs_nccl_free(ctx->nccl);
    ctx->nccl = NULL;
    reqs_free(ctx);
    if (ctx->ev_compute)
        d->ops->event_free(d, ctx->ev_compute);
    if (ctx->comm_stream)
        d->ops->stream_free(d, ctx->comm_stream);
    ctx->ev_compute = NULL;
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
    if (st)
        zs_comm_fail_next(ctx->comm); /* the peers' operation still ends, failed, on every rank */
    return st ? dev_fail(st, "event (compute -> communication)") : ZS_OK;
}

/* A launched collective on the host transports becomes a request; where none can be had (out of memory) it
 * is completed here, and the caller sees a finished one (*req NULL). q by address: the launch that sets it is
 * a sibling argument, evaluated in no fixed order. */
static zs_status host_req(struct zs_ctx *ctx, zs_status st, struct zs_comm_req *const *qp, struct zs_coll_req **req)
{
    struct zs_comm_req *q = *qp;
    struct zs_coll_req *r = NULL;

    if (st || !q)
        return st;
    if (req_get(ctx, &r))
        return zs_comm_wait(ctx->comm, q);
    r->host = q;
    *req = r;
    return ZS_OK;
}

/* The same for work queued on the device stream s: an event marks its end. Without a request, the stream is
 * waited for here. */
static zs_status dev_req(struct zs_ctx *ctx, zs_status st, struct zs_dev_stream *s, struct zs_coll_req **req)
{
    struct zs_device *d = &ctx->dev;
    struct zs_coll_req *r = NULL;

    if (st)
        return st;
    if (!req_get(ctx, &r)) {
        st = d->ops->event_record(d, r->done, s);
        if (!st) {
            *req = r;
            return ZS_OK;
        }
        req_put(ctx, r);
    }
    st = d->ops->stream_sync(d, s);
    return st ? dev_fail(st, "communication stream") : ZS_OK;
}

/* A host-staged collective: the communication stream after the compute stream, and the request taken first,
 * as the transport records its event when the operation lands (r NULL: none could be had). */
static zs_status staged_begin(struct zs_ctx *ctx, struct zs_coll_req **r)
{
    if (req_get(ctx, r))
        *r = NULL;
    return comm_begin(ctx);
}

/* ... and launched: in flight behind the request. Without one, or when ordering the streams failed (`begun`:
 * the collective went out marked failed), it lands here and its stream is waited for, so that nothing is left
 * in flight for a caller that sees an error. */
static zs_status staged_end(struct zs_ctx *ctx, zs_status begun, zs_status st, struct zs_coll_req *r,
                            struct zs_coll_req **req)
{
    struct zs_device *d = &ctx->dev;

    if (r && !st && !begun) {
        r->staged = ctx->staged.started;
        *req = r;
        return ZS_OK;
    }
    if (!st)
        st = zs_staged_finish(&ctx->staged);
    if (!st && (st = d->ops->stream_sync(d, ctx->comm_stream)))
        dev_fail(st, "communication stream");
    if (r)
        req_put(ctx, r);
    return begun ? begun : st;
}

static struct zs_dev_stream *nccl_stream(struct zs_ctx *ctx)
{
    return (struct zs_dev_stream *)zs_nccl_stream(ctx->nccl);
}

zs_status zs_coll_reduce_scatter(struct zs_ctx *ctx, const void *buf, zs_dtype dt_in, void *out, zs_dtype dt_out,
                                 int64_t count, float scale, struct zs_coll_req **req)
{
    struct zs_comm_req *q = NULL;
    struct zs_coll_req *r = NULL;
    zs_status st, begun;

    *req = NULL;
    if (ctx->dev.host_access)
        return host_req(ctx, zs_comm_reduce_scatter_dt(ctx->comm, buf, dt_in, out, dt_out, count, scale, &q), &q, req);
    if (ctx->nccl)
        return dev_req(ctx, zs_nccl_reduce_scatter(ctx->nccl, buf, dt_in, out, dt_out, count, scale, ctx->dev.compute),
                       nccl_stream(ctx), req);
    begun = staged_begin(ctx, &r);
    st = zs_staged_reduce_scatter(&ctx->staged, buf, dt_in, out, dt_out, count, scale, ctx->comm_stream,
                                  r ? r->done : NULL);
    return staged_end(ctx, begun, st, r, req);
}

zs_status zs_coll_all_gather(struct zs_ctx *ctx, void *buf, zs_dtype dt, int64_t count, struct zs_coll_req **req)
{
    struct zs_comm_req *q = NULL;
    struct zs_coll_req *r = NULL;
    zs_status st, begun;

    *req = NULL;
    if (ctx->dev.host_access)
        return host_req(ctx, zs_comm_all_gather_dt(ctx->comm, buf, dt, count, &q), &q, req);
    if (ctx->nccl)
        return dev_req(ctx, zs_nccl_all_gather(ctx->nccl, buf, dt, count, ctx->dev.compute), nccl_stream(ctx), req);
    begun = staged_begin(ctx, &r);
    st = zs_staged_all_gather(&ctx->staged, buf, dt, count, ctx->comm_stream, r ? r->done : NULL);
    return staged_end(ctx, begun, st, r, req);
}

zs_status zs_coll_all_reduce(struct zs_ctx *ctx, void *buf, zs_dtype dt, int64_t count, float scale,
                             struct zs_coll_req **req)
{
    struct zs_comm_req *q = NULL;
    struct zs_coll_req *r = NULL;
    zs_status st, begun;

    *req = NULL;
    if (ctx->dev.host_access)
        return host_req(ctx, zs_comm_all_reduce_dt(ctx->comm, buf, dt, count, scale, &q), &q, req);
    if (ctx->nccl)
        return dev_req(ctx, zs_nccl_all_reduce(ctx->nccl, buf, dt, count, scale, ctx->dev.compute), nccl_stream(ctx),
                       req);
    begun = staged_begin(ctx, &r);
    st = zs_staged_all_reduce(&ctx->staged, buf, dt, count, scale, ctx->comm_stream, r ? r->done : NULL);
    return staged_end(ctx, begun, st, r, req);
}

/* The result is the compute stream's from here on: later work queued on it starts after the collective. */
zs_status zs_coll_wait(struct zs_ctx *ctx, struct zs_coll_req *req)
{
    struct zs_device *d = &ctx->dev;
    zs_status st;

    if (!req)
        return ZS_OK;
    if (d->host_access)
        st = req->host ? zs_comm_wait(ctx->comm, req->host) : ZS_OK;
    else if (req->staged && (st = req->staged > ctx->staged.finished ? zs_staged_finish(&ctx->staged) /* lands now */
                                                                      : ctx->staged.failed))
        ;
    else if ((st = d->ops->stream_wait(d, d->compute, req->done)))
        dev_fail(st, "event (communication -> compute)");
    req_put(ctx, req);
    return st;
}

zs_status zs_coll_test(struct zs_ctx *ctx, struct zs_coll_req *req, bool *done)
{
    struct zs_device *d = &ctx->dev;
    zs_status st;

    *done = true;
    if (!req)
        return ZS_OK;
    if (d->host_access)
        return req->host ? zs_comm_test(ctx->comm, req->host, done) : ZS_OK;
    if (req->staged > ctx->staged.finished && ((st = zs_staged_test(&ctx->staged, done)) || !*done))
        return st;
    st = d->ops->event_query(d, req->done, done);
    return st ? dev_fail(st, "event query") : ZS_OK;
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
