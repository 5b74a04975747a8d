/* coll.c - the collectives on the engine's device buffers, whichever transport carries them. Where the host
 * can read the device's memory (the CPU) they are comm.c's, nonblocking and in place; on GPUs of their own,
 * NCCL (the ordered mode, comm.c's bits, or NCCL's own sums) on NCCL's stream; otherwise (ranks sharing a
 * GPU, the separate test device) the host-staged transport on the communication stream. Either stream starts
 * after the compute stream's work (an event); the compute stream waits for the collective's own event only in
 * zs_coll_wait, where the engine needs the result. */
#include <stdlib.h>

#include <time.h>

#include "base/clock.h" /* defines: zs_now_s */
#include "base/error.h" /* defines: zs_fail, zs_error_prefix */
#include "coll.h"

static zs_status dev_fail(zs_status st, const char *what)
{
    zs_error_prefix("device %s", what);
    return st;
}

/* One collective in flight. Where the host reads the device in place it is comm.c's request; on device
 * buffers, an event recorded on the stream the collective runs on (the communication stream, or NCCL's), which
 * the compute stream waits for only when the engine needs the result (zs_coll_wait): the program's backward
 * and the engine's other work keep the compute stream busy meanwhile. Recycled through c->req_free. */
struct zs_coll_req {
    struct zs_comm_req *host;
    struct zs_dev_event *done;
    uint64_t staged;             /* the host-staged operation's number (0: not one), which records `done` */
    double t0;                   /* when an NCCL collective was queued: its deadline counts from here */
    struct zs_coll_req *next_free, *next_all;
};

static zs_status req_get(struct zs_coll *c, struct zs_coll_req **out)
{
    struct zs_device *d = c->dev;
    struct zs_coll_req *r = c->req_free;
    zs_status st;

    if (r) {
        c->req_free = r->next_free;
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
    r->next_all = c->req_all;
    c->req_all = r;
    *out = r;
    return ZS_OK;
}

static void req_put(struct zs_coll *c, struct zs_coll_req *r)
{
    r->host = NULL;
    r->staged = 0;
    r->next_free = c->req_free;
    c->req_free = r;
}

int32_t zs_coll_in_use(const struct zs_coll *c)
{
    int32_t n = 0;

    for (const struct zs_coll_req *r = c->req_all; r; r = r->next_all)
        n++;
    for (const struct zs_coll_req *r = c->req_free; r; r = r->next_free)
        n--;
    return n;
}

static void reqs_free(struct zs_coll *c)
{
    struct zs_device *d = c->dev;

    while (c->req_all) {
        struct zs_coll_req *r = c->req_all;
        c->req_all = r->next_all;
        if (r->done)
            d->ops->event_free(d, r->done);
        free(r);
    }
    c->req_free = NULL;
}

zs_status zs_coll_open(struct zs_coll *c, struct zs_comm *comm, struct zs_device *d)
{
    zs_status st;

    c->comm = comm;
    c->dev = d;
    st = d->ops->stream_create(d, &c->stream);
    if (!st)
        st = d->ops->event_create(d, &c->ev_compute);
    if (!st && !d->host_access)
        zs_staged_init(&c->staged, comm, d);
    return st ? dev_fail(st, "streams") : ZS_OK;
}

zs_status zs_coll_nccl_start(struct zs_coll *c, MPI_Comm mpi, enum zs_nccl_mode mode)
{
    return zs_nccl_init(&c->nccl, mpi, mode, c->comm); /* the CPU watchdog's deadline and view of the node */
}

void zs_coll_nccl_stop(struct zs_coll *c)
{
    zs_nccl_free(c->nccl);
    c->nccl = NULL;
}

void zs_coll_close(struct zs_coll *c)
{
    struct zs_device *d = c->dev;

    if (!d || !d->ops)
        return;
    if (c->staged.comm)
        zs_staged_free(&c->staged); /* lands the operation in flight, records its event: before reqs_free */
    zs_nccl_free(c->nccl);
    c->nccl = NULL;
    reqs_free(c);
    if (c->ev_compute)
        d->ops->event_free(d, c->ev_compute);
    /* a destroyed CUDA stream still runs what it holds: it finishes first, the memory its copies land in is
     * freed next (zs_finalize) */
    if (c->stream) {
        d->ops->stream_sync(d, c->stream);
        d->ops->stream_free(d, c->stream);
    }
    c->ev_compute = NULL;
    c->stream = NULL;
}

/* The communication stream starts after what the compute stream has queued (the program's gradients, the
 * engine's zeroing and scaling). */
static zs_status comm_begin(struct zs_coll *c)
{
    struct zs_device *d = c->dev;
    zs_status st = d->ops->event_record(d, c->ev_compute, d->compute);

    if (!st)
        st = d->ops->stream_wait(d, c->stream, c->ev_compute);
    if (st)
        zs_comm_fail_next(c->comm); /* the peers' operation still ends, failed, on every rank */
    return st ? dev_fail(st, "event (compute -> communication)") : ZS_OK;
}

/* A launched collective on the host transports becomes a request; where none can be had (out of memory) it
 * is completed here, and the caller sees a finished one (*req NULL). q by address: the launch that sets it is
 * a sibling argument, evaluated in no fixed order. */
static zs_status host_req(struct zs_coll *c, zs_status st, struct zs_comm_req *const *qp, struct zs_coll_req **req)
{
    struct zs_comm_req *q = *qp;
    struct zs_coll_req *r = NULL;

    if (st || !q)
        return st;
    if (req_get(c, &r))
        return zs_comm_wait(c->comm, q);
    r->host = q;
    *req = r;
    return ZS_OK;
}

/* The same for an NCCL collective, queued on NCCL's stream s: an event marks its end. Without a request, the
 * stream is waited for here, under the deadline. */
static zs_status dev_req(struct zs_coll *c, zs_status st, struct zs_dev_stream *s, struct zs_coll_req **req)
{
    struct zs_device *d = c->dev;
    struct zs_coll_req *r = NULL;

    if (st)
        return st;
    if (!req_get(c, &r)) {
        st = d->ops->event_record(d, r->done, s);
        if (!st) {
            r->t0 = zs_now_s();
            *req = r;
            return ZS_OK;
        }
        req_put(c, r);
    }
    return zs_nccl_sync(c->nccl);
}

/* An NCCL collective's event (or any event NCCL work may hold back), polled from t0: a GPU-side wait alone
 * would leave the host's next synchronize without a deadline. */
static zs_status nccl_poll_event(struct zs_coll *c, struct zs_dev_event *ev, double t0, const char *what)
{
    struct zs_device *d = c->dev;
    bool done = false;
    zs_status st;

    for (uint32_t spins = 0;; spins++) {
        struct timespec ts = { 0, spins < 64 ? 1000 : 100000 };
        if ((st = d->ops->event_query(d, ev, &done)))
            return dev_fail(st, "event query");
        if (done)
            return ZS_OK;
        if ((st = zs_nccl_poll(c->nccl, t0, what)))
            return st;
        nanosleep(&ts, NULL);
    }
}

static zs_status nccl_wait(struct zs_coll *c, struct zs_coll_req *req)
{
    return nccl_poll_event(c, req->done, req->t0, "an NCCL collective");
}

zs_status zs_coll_host_wait(struct zs_coll *c, struct zs_dev_event *ev, const char *what)
{
    struct zs_device *d = c->dev;
    zs_status st;

    if (c->nccl)
        return nccl_poll_event(c, ev, zs_now_s(), what);
    /* no NCCL: the compute stream waits only on collectives that have landed (zs_coll_wait) */
    return (st = d->ops->stream_sync(d, d->compute)) ? dev_fail(st, what) : ZS_OK;
}

/* A host-staged collective: the communication stream after the compute stream, and the request taken first,
 * as the transport records its event when the operation lands (r NULL: none could be had). */
static zs_status staged_begin(struct zs_coll *c, struct zs_coll_req **r)
{
    if (req_get(c, r))
        *r = NULL;
    return comm_begin(c);
}

/* ... and launched: in flight behind the request. Without one, or when ordering the streams failed (`begun`:
 * the collective went out marked failed), it lands here and its stream is waited for, so that nothing is left
 * in flight for a caller that sees an error. */
static zs_status staged_end(struct zs_coll *c, zs_status begun, zs_status st, struct zs_coll_req *r,
                            struct zs_coll_req **req)
{
    struct zs_device *d = c->dev;

    if (r && !st && !begun) {
        r->staged = c->staged.started;
        *req = r;
        return ZS_OK;
    }
    if (!st)
        st = zs_staged_finish(&c->staged);
    if (!st && (st = d->ops->stream_sync(d, c->stream)))
        dev_fail(st, "communication stream");
    if (r)
        req_put(c, r);
    return begun ? begun : st;
}

static struct zs_dev_stream *nccl_stream(struct zs_coll *c)
{
    return (struct zs_dev_stream *)zs_nccl_stream(c->nccl);
}

zs_status zs_coll_reduce_scatter(struct zs_coll *c, const void *buf, zs_dtype dt_in, void *out, zs_dtype dt_out,
                                 int64_t count, float scale, struct zs_coll_req **req)
{
    struct zs_comm_req *q = NULL;
    struct zs_coll_req *r = NULL;
    zs_status st, begun;

    *req = NULL;
    if (c->dev->host_access)
        return host_req(c, zs_comm_reduce_scatter_dt(c->comm, buf, dt_in, out, dt_out, count, scale, &q), &q, req);
    if (c->nccl)
        return dev_req(c, zs_nccl_reduce_scatter(c->nccl, buf, dt_in, out, dt_out, count, scale, c->dev->compute),
                       nccl_stream(c), req);
    begun = staged_begin(c, &r);
    st = zs_staged_reduce_scatter(&c->staged, buf, dt_in, out, dt_out, count, scale, c->stream,
                                  r ? r->done : NULL);
    return staged_end(c, begun, st, r, req);
}

zs_status zs_coll_all_gather(struct zs_coll *c, void *buf, zs_dtype dt, int64_t count, struct zs_coll_req **req)
{
    struct zs_comm_req *q = NULL;
    struct zs_coll_req *r = NULL;
    zs_status st, begun;

    *req = NULL;
    if (c->dev->host_access)
        return host_req(c, zs_comm_all_gather_dt(c->comm, buf, dt, count, &q), &q, req);
    if (c->nccl)
        return dev_req(c, zs_nccl_all_gather(c->nccl, buf, dt, count, c->dev->compute), nccl_stream(c), req);
    begun = staged_begin(c, &r);
    st = zs_staged_all_gather(&c->staged, buf, dt, count, c->stream, r ? r->done : NULL);
    return staged_end(c, begun, st, r, req);
}

zs_status zs_coll_all_reduce(struct zs_coll *c, void *buf, zs_dtype dt, int64_t count, float scale,
                             struct zs_coll_req **req)
{
    struct zs_comm_req *q = NULL;
    struct zs_coll_req *r = NULL;
    zs_status st, begun;

    *req = NULL;
    if (c->dev->host_access)
        return host_req(c, zs_comm_all_reduce_dt(c->comm, buf, dt, count, scale, &q), &q, req);
    if (c->nccl)
        return dev_req(c, zs_nccl_all_reduce(c->nccl, buf, dt, count, scale, c->dev->compute), nccl_stream(c),
                       req);
    begun = staged_begin(c, &r);
    st = zs_staged_all_reduce(&c->staged, buf, dt, count, scale, c->stream, r ? r->done : NULL);
    return staged_end(c, begun, st, r, req);
}

/* The result is the compute stream's from here on: later work queued on it starts after the collective. */
zs_status zs_coll_wait(struct zs_coll *c, struct zs_coll_req *req)
{
    struct zs_device *d = c->dev;
    zs_status st;

    if (!req)
        return ZS_OK;
    if (d->host_access)
        st = req->host ? zs_comm_wait(c->comm, req->host) : ZS_OK;
    else if (req->staged && (st = req->staged > c->staged.finished ? zs_staged_finish(&c->staged) /* lands now */
                                                                      : c->staged.failed))
        ;
    else if (c->nccl && (st = nccl_wait(c, req)))
        ;
    else if ((st = d->ops->stream_wait(d, d->compute, req->done)))
        dev_fail(st, "event (communication -> compute)");
    req_put(c, req);
    return st;
}

zs_status zs_coll_test(struct zs_coll *c, struct zs_coll_req *req, bool *done)
{
    struct zs_device *d = c->dev;
    zs_status st;

    *done = true;
    if (!req)
        return ZS_OK;
    if (d->host_access)
        return req->host ? zs_comm_test(c->comm, req->host, done) : ZS_OK;
    if (req->staged > c->staged.finished && ((st = zs_staged_test(&c->staged, done)) || !*done))
        return st;
    st = d->ops->event_query(d, req->done, done);
    if (st)
        return dev_fail(st, "event query");
    return c->nccl && !*done ? zs_nccl_poll(c->nccl, req->t0, "an NCCL collective") : ZS_OK;
}
