/* comm_staged.c - host-staged collectives on device buffers (see comm_staged.h). */
#include "base/error.h" /* defines: zs_fail, zs_error_prefix */
#include "comm_staged.h"

static size_t esz(zs_dtype dt) { return dt == ZS_DTYPE_FP32 ? 4 : 2; }

void zs_staged_init(struct zs_staged *s, struct zs_comm *comm, struct zs_device *dev)
{
    *s = (struct zs_staged){ .comm = comm, .dev = dev };
}

/* The device copy. Down: finished before the host reads the data (and with it, in stream order, the last
 * operation's copy up: the host and the peers write the scratch only after this). Up: left queued on the
 * stream; the operation's event marks it. */
static zs_status move(struct zs_staged *s, void *dst, const void *src, size_t bytes, enum zs_copy_dir dir,
                      struct zs_dev_stream *stream)
{
    zs_status st = s->dev->ops->copy(s->dev, dst, src, bytes, dir, stream);

    if (!st && dir == ZS_COPY_D2H)
        st = s->dev->ops->stream_sync(s->dev, stream);
    if (st)
        zs_error_prefix("host-staged collective, copy %s", dir == ZS_COPY_D2H ? "down" : "up");
    return st;
}

/* The operation in flight has landed on the host (comm.c's request complete, or failed): its result's copy up
 * is queued and its event recorded after it. */
static zs_status land(struct zs_staged *s, zs_status st)
{
    const struct zs_staged_op *o = &s->op;

    s->busy = false;
    s->finished++;
    if (!st)
        st = o->err; /* its copy down failed: the collective went out marked failed */
    if (!st)
        st = move(s, o->dst, (char *)s->host + o->off, o->bytes, ZS_COPY_H2D, o->stream);
    if (!st && o->done && (st = s->dev->ops->event_record(s->dev, o->done, o->stream)))
        zs_error_prefix("host-staged collective, event");
    if (st && !s->failed)
        s->failed = st;
    return st;
}

zs_status zs_staged_finish(struct zs_staged *s)
{
    zs_status st;

    if (!s->busy)
        return s->failed;
    st = zs_comm_wait(s->comm, s->op.req);
    s->op.req = NULL;
    return land(s, st);
}

zs_status zs_staged_test(struct zs_staged *s, bool *landed)
{
    bool done = true;
    zs_status st = s->busy ? zs_comm_test(s->comm, s->op.req, &done) : ZS_OK;

    *landed = !s->busy || done || st;
    return *landed ? zs_staged_finish(s) : ZS_OK;
}

void zs_staged_free(struct zs_staged *s)
{
    zs_staged_finish(s);
    if (s->host) {
        /* its copy up may still read the scratch; a failure here is the broken device's, already reported */
        if (s->op.stream)
            s->dev->ops->stream_sync(s->dev, s->op.stream);
        if (s->pinned)
            s->dev->ops->host_unregister(s->dev, s->host);
        zs_comm_release(s->comm, s->host);
    }
    s->host = NULL;
    s->cap = 0;
    s->pinned = false;
}

/* At least `bytes` of host scratch, with no operation in flight on it (finished first: a failure there goes
 * on as a failed copy down of the next one). Every rank asks for the same sizes in the same order, so the
 * shared heap's collective allocation lines up; zs_comm_alloc_agreed makes a refusal on one rank a refusal on
 * all. */
static zs_status reserve(struct zs_staged *s, size_t bytes, zs_status *prev)
{
    *prev = zs_staged_finish(s);
    if (bytes <= s->cap)
        return ZS_OK;
    zs_staged_free(s);
    s->host = zs_comm_alloc_agreed(s->comm, bytes, true);
    if (!s->host)
        return zs_fail(ZS_ERR_NOMEM, "host-staged collectives: %zu bytes of host scratch", bytes);
    s->cap = bytes;
    /* pinned, so the copies down and up are DMA at full speed (cudaHostRegister on a GPU). Only this rank can
     * fail here while its peers go on into the collective, so a refusal is not an error: the scratch stays
     * pageable, which the copies (cudaMemcpyDefault) handle, only slower. */
    s->pinned = s->dev->ops->host_register(s->dev, s->host, bytes) == ZS_OK;
    return ZS_OK;
}

/* Down to the host; a rank that failed (here, or finishing the last operation) still takes the operation's
 * place, marked failed, so that every rank's wait fails. */
static zs_status down(struct zs_staged *s, zs_status prev, void *dst, const void *src, size_t bytes,
                      struct zs_dev_stream *stream)
{
    zs_status st = prev ? prev : move(s, dst, src, bytes, ZS_COPY_D2H, stream);

    if (st)
        zs_comm_fail_next(s->comm);
    return st;
}

/* The launched collective becomes the operation in flight; one comm.c could not launch (it retired it) is
 * over here, on every rank alike. */
static zs_status pend(struct zs_staged *s, zs_status launched, struct zs_comm_req *req, struct zs_staged_op op)
{
    if (launched)
        return op.err ? op.err : launched;
    op.req = req;
    s->op = op;
    s->busy = true;
    s->started++;
    return ZS_OK;
}

zs_status zs_staged_reduce_scatter(struct zs_staged *s, const void *buf, zs_dtype dt_in, void *out, zs_dtype dt_out,
                                   int64_t count, float scale, struct zs_dev_stream *stream, struct zs_dev_event *done)
{
    size_t in = (size_t)count * (size_t)zs_comm_size(s->comm) * esz(dt_in), res = (size_t)count * esz(dt_out);
    size_t at = (in + 63) / 64 * 64; /* the result's place: 16-bit input of odd length must not misalign fp32 */
    struct zs_staged_op op = { .dst = out, .off = at, .bytes = res, .stream = stream, .done = done };
    struct zs_comm_req *req = NULL;
    zs_status st, prev;
    char *h;

    if ((st = reserve(s, at + res, &prev)))
        return st; /* agreed: no rank goes on */
    h = s->host;
    op.err = down(s, prev, h, buf, in, stream);
    st = zs_comm_reduce_scatter_dt(s->comm, h, dt_in, h + at, dt_out, count, scale, &req);
    return pend(s, st, req, op);
}

zs_status zs_staged_all_gather(struct zs_staged *s, void *buf, zs_dtype dt, int64_t count,
                               struct zs_dev_stream *stream, struct zs_dev_event *done)
{
    size_t chunk = (size_t)count * esz(dt), all = chunk * (size_t)zs_comm_size(s->comm);
    size_t mine = chunk * (size_t)zs_comm_rank(s->comm);
    struct zs_staged_op op = { .dst = buf, .off = 0, .bytes = all, .stream = stream, .done = done };
    struct zs_comm_req *req = NULL;
    zs_status st, prev;
    char *h;

    if ((st = reserve(s, all, &prev)))
        return st;
    h = s->host;
    /* only this rank's chunk goes down: the others come from their owners */
    op.err = down(s, prev, h + mine, (const char *)buf + mine, chunk, stream);
    st = zs_comm_all_gather_dt(s->comm, h, dt, count, &req);
    return pend(s, st, req, op);
}

zs_status zs_staged_all_reduce(struct zs_staged *s, void *buf, zs_dtype dt, int64_t count, float scale,
                               struct zs_dev_stream *stream, struct zs_dev_event *done)
{
    size_t all = (size_t)count * (size_t)zs_comm_size(s->comm) * esz(dt);
    struct zs_staged_op op = { .dst = buf, .off = 0, .bytes = all, .stream = stream, .done = done };
    struct zs_comm_req *req = NULL;
    zs_status st, prev;
    char *h;

    if ((st = reserve(s, all, &prev)))
        return st;
    h = s->host;
    op.err = down(s, prev, h, buf, all, stream);
    st = zs_comm_all_reduce_dt(s->comm, h, dt, count, scale, &req);
    return pend(s, st, req, op);
}
