/* comm_req.c - the collectives' requests (comm.c describes them): their life cycle, the state table that
 * moves each one along, and the nonblocking calls that start, test and wait for them. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "comm_impl.h" /* defines: struct zs_comm, struct zs_comm_req, piece_tag, zs_comm_check_progress */
#include "kernels/convert.h" /* defines: zs_cvt_* (16-bit inputs are summed in fp32) */
#include "kernels/copy.h"    /* defines: zs_copy_stream */
#include "base/backoff.h" /* defines: zs_backoff */
#include "base/error.h"
#include "flight.h" /* defines: zs_flight_op_start, zs_flight_op_end, zs_flight_write */
#include "shm.h"

/* ---------------------------------------------------------------- request life cycle */

/* Zero copy needs the buffer in the shared heap; then every local peer's copy is found by offset.
 * The heap is symmetric, so every rank of the node reaches the same verdict (and the descriptors
 * check that it did). */
static zs_status attach_peers(struct zs_comm *c, struct zs_comm_req *q, const void *buf, size_t esz)
{
    size_t bytes = (size_t)q->count * (size_t)c->size * esz;

    q->remote = c->size > 1;
    q->hdr.d.heap_off = UINT64_MAX;
    if (zs_comm_fault_hit(c, FAULT_ATTACH, q->seq))
        return zs_fail(ZS_ERR_NOMEM, "comm: test fault: operation %llu could not find its peers (ZS_TEST_COMM_FAULT)",
                       (unsigned long long)q->seq);
    if (!c->shm || zs_shm_local_size(c->shm) == 1 || q->count == 0)
        return ZS_OK;
    q->peer = calloc((size_t)c->size, sizeof(*q->peer));
    if (!q->peer)
        return zs_fail(ZS_ERR_NOMEM, "comm: out of memory");
    for (int32_t j = 0; j < c->size; j++) {
        int32_t l = zs_shm_local_index(c->shm, j);
        if (j == c->rank || l < 0)
            continue;
        q->peer[j] = zs_shm_peer(c->shm, buf, bytes, l);
        if (!q->peer[j]) { /* not from the heap: every peer over MPI */
            free(q->peer);
            q->peer = NULL;
            return ZS_OK;
        }
    }
    q->shm = true;
    q->remote = zs_shm_local_size(c->shm) < c->size;
    q->hdr.d.heap_off = zs_shm_offset(c->shm, buf, bytes);
    return ZS_OK;
}

static MPI_Request *requests_new(size_t n)
{
    MPI_Request *r = malloc((n ? n : 1) * sizeof(*r));

    for (size_t i = 0; r && i < n; i++)
        r[i] = MPI_REQUEST_NULL;
    return r;
}

/* Everything an operation may need is taken here, before its sequence number: after that, only a
 * failure of MPI itself can stop it part-way. */
static zs_status req_buffers(struct zs_comm *c, struct zs_comm_req *q)
{
    int32_t mpi_peers = 0;

    q->nremote = c->nremote;
    for (int32_t j = 0; j < c->size; j++)
        mpi_peers += j != c->rank && !zs_comm_is_local(q, j);
    if (q->nremote > 0) {
        q->hdr_in = calloc((size_t)q->nremote, sizeof(*q->hdr_in));
        q->hreq = requests_new(2 * (size_t)q->nremote);
        if (!q->hdr_in || !q->hreq)
            goto nomem;
    }
    if (mpi_peers > 0 && q->kind != REQ_AG && q->count > 0) {
        int64_t pieces = (q->count + q->piece - 1) / q->piece;
        for (int s = 0; s < ZS_COMM_SLOTS && s < pieces; s++) {
            q->slot[s].mr = requests_new(2 * (size_t)mpi_peers);
            q->slot[s].tmp = zs_comm_scratch_get(c);
            if (!q->slot[s].mr || !q->slot[s].tmp)
                return zs_fail(ZS_ERR_NOMEM, "comm: out of memory for a %lld-element scratch buffer",
                               (long long)((c->size - 1) * q->piece));
        }
    }
    if (mpi_peers > 0 && q->kind != REQ_RS && q->count > 0) {
        q->agr = requests_new(2 * (size_t)mpi_peers * (size_t)zs_comm_ag_pieces(q));
        if (!q->agr)
            goto nomem;
    }
    return ZS_OK;
nomem:
    return zs_fail(ZS_ERR_NOMEM, "comm: out of memory");
}

static void scratch_return(struct zs_comm *c, struct zs_comm_req *q)
{
    for (int s = 0; s < ZS_COMM_SLOTS; s++) {
        if (q->slot[s].tmp)
            zs_comm_scratch_put(c, q->slot[s].tmp);
        q->slot[s].tmp = NULL;
    }
}

static void req_free(struct zs_comm *c, struct zs_comm_req *q)
{
    scratch_return(c, q);
    for (int s = 0; s < ZS_COMM_SLOTS; s++)
        free(q->slot[s].mr);
    free(q->agr);
    free(q->hreq);
    free(q->hdr_in);
    free(q->peer);
    free(q);
}

/* Off the active list, then freed; but a request that failed with messages still pending keeps its
 * memory and scratch for good (on the dead list), since the network may yet write into them. */
static void req_retire(struct zs_comm *c, struct zs_comm_req *q)
{
    struct zs_comm_req **pp = &c->active;

    while (*pp && *pp != q)
        pp = &(*pp)->next;
    if (*pp) {
        *pp = q->next;
        c->in_flight--;
    }
    zs_flight_op_end(c->flight, q->seq, q->err);
    if (q->err && !c->broken_dumped) { /* once per failure that broke the comm, else per failed operation */
        zs_flight_write(c->flight, zs_last_error());
        c->broken_dumped = c->broken != ZS_OK;
    }
    if (q->err && !q->clean && !zs_comm_req_quiesce(q)) {
        q->next = c->dead;
        c->dead = q;
        return;
    }
    req_free(c, q);
}

void zs_comm_reap_dead(struct zs_comm *c)
{
    struct zs_comm_req **pp = &c->dead;

    while (*pp) {
        struct zs_comm_req *q = *pp;
        if (zs_comm_req_quiesce(q)) {
            *pp = q->next;
            req_free(c, q);
        } else {
            pp = &q->next; /* still pending at the end: leaked on purpose rather than freed under MPI */
        }
    }
}

/* Waits until an operation spanning `span` sequence numbers fits in the window of the oldest unfinished
 * one (see ZS_COMM_WINDOW). The active list is in launch order, so the first unfinished is the oldest. */
static zs_status gate(struct zs_comm *c, uint64_t span)
{
    struct zs_watch w;
    struct zs_backoff b = ZS_BACKOFF_INIT;

    zs_watch_start(&w);
    for (;;) {
        struct zs_comm_req *o = c->active;

        while (o && o->stage == ST_DONE)
            o = o->next;
        if (!o || c->seq + span - o->seq <= ZS_COMM_WINDOW)
            return ZS_OK;
        zs_status st = zs_comm_progress(c);
        if (!st)
            st = zs_comm_watch(c, &w, o);
        if (st)
            return st;
        zs_backoff(&b, c->moves);
    }
}

static size_t dtype_size(zs_dtype t)
{
    return t == ZS_COMM_INT64 ? 8 : t == ZS_DTYPE_FP32 ? 4 : 2;
}

static zs_status req_new(struct zs_comm *c, enum req_kind kind, int64_t count, const void *buf, zs_dtype dt_in,
                         zs_dtype dt_out, struct zs_comm_req **out)
{
    uint64_t span = kind == REQ_AR ? 2 : 1;
    struct zs_comm_req *q, **tail;
    bool failed = c->fail_next; /* for this operation only, whether or not it gets going */
    zs_status st;

    c->fail_next = false;
    if (zs_flight_signalled())
        zs_flight_write(c->flight, "SIGUSR1");
    if (c->broken)
        return zs_comm_broken_fail(c);
    st = gate(c, span);
    if (st)
        return st;
    if (zs_comm_fault_hit(c, FAULT_STOP, c->seq)) /* a rank that stops (SIGSTOP, a debugger, swapping) */
        raise(SIGSTOP);
    if (zs_comm_fault_hit(c, FAULT_DIE, c->seq)) /* kill -9 mid-step */
        raise(SIGKILL);
    if (zs_comm_fault_hit(c, FAULT_NEW, c->seq))
        return zs_fail(ZS_ERR_NOMEM, "comm: test fault: operation %llu could not be set up (ZS_TEST_COMM_FAULT)",
                       (unsigned long long)c->seq);
    q = calloc(1, sizeof(*q));
    if (!q)
        return zs_fail(ZS_ERR_NOMEM, "comm: out of memory");
    q->kind = kind;
    q->count = count;
    q->seq = c->seq;
    q->dt_in = dt_in;
    q->dt_out = dt_out;
    q->esz_in = dtype_size(dt_in);
    q->esz_out = dtype_size(dt_out);
    q->piece = q->esz_in > sizeof(float) ? (c->piece > 1 ? c->piece / 2 : 1) : c->piece;
    q->stage = ST_CHECK;
    q->bad_peer = -1;
    q->local_check = c->size > 1 && c->shm && zs_shm_local_size(c->shm) > 1;
    st = attach_peers(c, q, buf, kind == REQ_AG ? q->esz_out : q->esz_in);
    if (!st)
        st = req_buffers(c, q);
    if (st) {
        req_free(c, q);
        return st;
    }
    /* Nothing can fail locally from here on: only now is the sequence number taken, so a rank that
     * failed above has not drifted from its peers. */
    c->seq += span;
    q->hdr.seq = q->seq;
    q->hdr.d = (struct zs_shm_desc){ .count = (uint64_t)count, .heap_off = q->hdr.d.heap_off, .kind = kind,
                                     .dt_in = dt_in, .dt_out = dt_out, .failed = failed,
                                     .purpose = c->next_purpose, .unit = c->next_unit, .step = c->step };
    c->next_purpose = ZS_PURPOSE_NONE;
    c->next_unit = -1;
    zs_flight_op_start(c->flight, q->seq, kind, &q->hdr.d,
                       (uint64_t)count * (uint64_t)c->size * (kind == REQ_AG ? q->esz_out : q->esz_in));
    for (tail = &c->active; *tail; tail = &(*tail)->next)
        ;
    *tail = q; /* oldest first */
    c->in_flight++;
    *out = q;
    return ZS_OK;
}

void zs_comm_fail_next(struct zs_comm *c)
{
    c->fail_next = true;
}

/* ZS_TEST_COMM_FAULT=progress:SEQ:RANK: operation SEQ fails once its cross-rank check has passed. */
static zs_status fault_progress(struct zs_comm *c, const struct zs_comm_req *q)
{
    if (!zs_comm_fault_hit(c, FAULT_PROGRESS, q->seq))
        return ZS_OK;
    return zs_fail(ZS_ERR_COMM, "comm: test fault: operation %llu failed in progress (ZS_TEST_COMM_FAULT)",
                   (unsigned long long)q->seq);
}

/* The request's state table, one function per stage. Each returns STAGE_MOVED when it set q->stage to the
 * next, STAGE_WAIT when the stage waits on peers (the caller spins if it blocks), or STAGE_STOP when this
 * call ends here: an error in *st, or reduce-scatter pieces still out after rs_progress's pass. */
enum stage_result { STAGE_MOVED, STAGE_WAIT, STAGE_STOP };

/* The all-gather's sequence number: an all-reduce's follows its reduce-scatter's. */
static uint64_t ag_seq(const struct zs_comm_req *q)
{
    return q->kind == REQ_AR ? q->seq + 1 : q->seq;
}

static enum stage_result stage_check(struct zs_comm *c, struct zs_comm_req *q, bool block, zs_status *st)
{
    bool done;

    if ((*st = zs_comm_check_progress(c, q, &done)))
        return STAGE_STOP;
    if (!done)
        return STAGE_WAIT;
    q->posted_seen = q->shm; /* the check saw every local peer post */
    q->stage = q->kind == REQ_AG ? ST_AG_START : ST_RS_RUN;
    /* here too: else an operation whose check passes and whose data is all in finishes in one call, never
     * failing */
    return (*st = fault_progress(c, q)) ? STAGE_STOP : STAGE_MOVED;
}

static enum stage_result stage_rs_run(struct zs_comm *c, struct zs_comm_req *q, bool block, zs_status *st)
{
    if ((*st = zs_comm_rs_progress(c, q, block)) || !zs_comm_rs_finished(q))
        return STAGE_STOP;
    scratch_return(c, q); /* every piece is in: nothing more will be received into it */
    if (q->shm)
        zs_shm_done(c->shm, q->seq);
    q->stage = ST_RS_DRAIN;
    return STAGE_MOVED;
}

/* Peers must be done reading my buffer before anything writes it again. */
static enum stage_result stage_rs_drain(struct zs_comm *c, struct zs_comm_req *q, bool block, zs_status *st)
{
    if (q->shm && !zs_shm_all_done(c->shm, q->seq))
        return STAGE_WAIT;
    q->stage = q->kind == REQ_RS ? ST_DONE : ST_AG_START;
    q->posted_seen = false;
    q->copied = q->kind == REQ_AR && q->shm; /* local peers already wrote their chunks here */
    if (q->copied && !q->remote) /* and they are all done: nothing left to gather */
        q->stage = ST_DONE;
    return STAGE_MOVED;
}

static enum stage_result stage_ag_start(struct zs_comm *c, struct zs_comm_req *q, bool block, zs_status *st)
{
    if (q->shm)
        zs_shm_post(c->shm, ag_seq(q), NULL);
    if ((*st = zs_comm_ag_start(c, q, ag_seq(q))))
        return STAGE_STOP;
    q->stage = ST_AG_RUN;
    return STAGE_MOVED;
}

static enum stage_result stage_ag_run(struct zs_comm *c, struct zs_comm_req *q, bool block, zs_status *st)
{
    bool done;

    if ((*st = zs_comm_ag_progress(c, q, ag_seq(q), block, &done)))
        return STAGE_STOP;
    if (!done)
        return STAGE_WAIT;
    if (q->shm)
        zs_shm_done(c->shm, ag_seq(q));
    q->stage = ST_AG_DRAIN;
    return STAGE_MOVED;
}

static enum stage_result stage_ag_drain(struct zs_comm *c, struct zs_comm_req *q, bool block, zs_status *st)
{
    if (q->shm && !zs_shm_all_done(c->shm, ag_seq(q)))
        return STAGE_WAIT;
    q->stage = ST_DONE;
    return STAGE_MOVED;
}

typedef enum stage_result (*stage_fn)(struct zs_comm *c, struct zs_comm_req *q, bool block, zs_status *st);

static const stage_fn stages[ST_DONE] = {
    [ST_CHECK] = stage_check,       [ST_RS_RUN] = stage_rs_run, [ST_RS_DRAIN] = stage_rs_drain,
    [ST_AG_START] = stage_ag_start, [ST_AG_RUN] = stage_ag_run, [ST_AG_DRAIN] = stage_ag_drain,
};

/* Runs q's stages until it is done, waits on peers (block: spins there), or fails. A failure agreed by every
 * rank ends only this operation; any other breaks the comm. */
static zs_status req_advance(struct zs_comm *c, struct zs_comm_req *q, bool block)
{
    struct zs_backoff b = ZS_BACKOFF_INIT;
    zs_status st = ZS_OK;

    if (q->err || q->stage == ST_DONE)
        return q->err;
    if (c->broken)
        st = zs_comm_broken_fail(c);
    else if (q->launched && q->stage != ST_CHECK)
        st = fault_progress(c, q);
    while (!st && q->stage != ST_DONE) {
        enum stage_result r = stages[q->stage](c, q, block, &st);
        if (r == STAGE_MOVED)
            c->moves++;
        if (r == STAGE_STOP || (r == STAGE_WAIT && !block))
            break;
        if (r == STAGE_WAIT)
            zs_backoff(&b, c->moves);
    }
    if (st) {
        q->err = st;
        if (q->clean) /* agreed by every rank: this operation is over, the comm is fine */
            q->stage = ST_DONE;
        else
            zs_comm_mark_broken(c, st);
    }
    return q->err;
}

static zs_status req_launch(struct zs_comm *c, struct zs_comm_req *q, struct zs_comm_req **out)
{
    zs_status st = ZS_OK;

    if (c->size == 1) {
        q->stage = ST_DONE;
        q->clean = true;
        if (q->hdr.d.failed)
            st = q->err = zs_fail(ZS_ERR_COMM, "comm: operation %llu (%s) cannot run: rank 0 could not take part",
                                  (unsigned long long)q->seq, zs_comm_kind_name(q->kind));
        else if (q->kind != REQ_AG)
            zs_comm_local_reduce(q);
    } else {
        if (q->local_check) /* my data and descriptor for this operation are ready: local peers may read them */
            zs_shm_post(c->shm, q->seq, &q->hdr.d);
        st = zs_comm_post_headers(c, q);
        if (st)
            q->err = st;
        else
            st = req_advance(c, q, false);
        q->launched = true;
    }
    if (st) {
        if (!q->clean)
            zs_comm_mark_broken(c, st);
        req_retire(c, q);
        return st;
    }
    *out = q;
    return ZS_OK;
}

static bool valid_dtype(zs_dtype t)
{
    return t == ZS_DTYPE_FP32 || t == ZS_DTYPE_BF16 || t == ZS_DTYPE_FP16;
}

zs_status zs_comm_reduce_scatter_dt(struct zs_comm *c, const void *buf, zs_dtype dt_in, void *out, zs_dtype dt_out,
                                    int64_t count, float scale, struct zs_comm_req **req)
{
    bool ints = dt_in == ZS_COMM_INT64 && dt_out == ZS_COMM_INT64; /* zs_comm_reduce_scatter_i64 */
    struct zs_comm_req *q;
    zs_status st;

    if (!ints && (!valid_dtype(dt_in) || !valid_dtype(dt_out) || (dt_out != dt_in && dt_out != ZS_DTYPE_FP32)))
        return zs_fail(ZS_ERR_INVALID, "reduce-scatter: output must be fp32 or the input type");
    st = req_new(c, REQ_RS, count, buf, dt_in, dt_out, &q);
    if (st)
        return st;
    q->src = buf;
    q->out = out;
    q->scale = scale;
    return req_launch(c, q, req);
}

zs_status zs_comm_all_gather_dt(struct zs_comm *c, void *buf, zs_dtype dt, int64_t count, struct zs_comm_req **req)
{
    struct zs_comm_req *q;
    zs_status st;

    if (!valid_dtype(dt))
        return zs_fail(ZS_ERR_INVALID, "all-gather: unknown dtype %d", (int)dt);
    st = req_new(c, REQ_AG, count, buf, dt, dt, &q);
    if (st)
        return st;
    q->gbuf = buf;
    return req_launch(c, q, req);
}

zs_status zs_comm_all_reduce_dt(struct zs_comm *c, void *buf, zs_dtype dt, int64_t count, float scale,
                                struct zs_comm_req **req)
{
    struct zs_comm_req *q;
    zs_status st;

    if (!valid_dtype(dt))
        return zs_fail(ZS_ERR_INVALID, "all-reduce: unknown dtype %d", (int)dt);
    st = req_new(c, REQ_AR, count, buf, dt, dt, &q);
    if (st)
        return st;
    q->src = buf;
    q->out = (char *)buf + (size_t)c->rank * (size_t)count * q->esz_in;
    q->gbuf = buf;
    q->scale = scale;
    return req_launch(c, q, req);
}

zs_status zs_comm_reduce_scatter_i64(struct zs_comm *c, const int64_t *buf, int64_t *out, int64_t count,
                                     struct zs_comm_req **req)
{
    return zs_comm_reduce_scatter_dt(c, buf, ZS_COMM_INT64, out, ZS_COMM_INT64, count, 1.0f, req);
}

zs_status zs_comm_reduce_scatter(struct zs_comm *c, const float *buf, float *out, int64_t count, float scale,
                                 struct zs_comm_req **req)
{
    return zs_comm_reduce_scatter_dt(c, buf, ZS_DTYPE_FP32, out, ZS_DTYPE_FP32, count, scale, req);
}

zs_status zs_comm_all_gather(struct zs_comm *c, float *buf, int64_t count, struct zs_comm_req **req)
{
    return zs_comm_all_gather_dt(c, buf, ZS_DTYPE_FP32, count, req);
}

zs_status zs_comm_all_reduce(struct zs_comm *c, float *buf, int64_t count, float scale, struct zs_comm_req **req)
{
    return zs_comm_all_reduce_dt(c, buf, ZS_DTYPE_FP32, count, scale, req);
}

/* An operation that every rank agreed to end (q->clean) reports its error to its own test and wait
 * only; any other failure stops everything. */
zs_status zs_comm_progress(struct zs_comm *c)
{
    for (struct zs_comm_req *q = c->active; q; q = q->next) {
        zs_status st = req_advance(c, q, false);
        if (st && !q->clean)
            return st;
    }
    return ZS_OK;
}

zs_status zs_comm_test(struct zs_comm *c, struct zs_comm_req *req, bool *done)
{
    zs_status st = req_advance(c, req, false);

    *done = req->stage == ST_DONE;
    return st;
}

/* Completes and frees req. While waiting it advances every request, not just this one: a peer may be
 * waiting on an older operation that needs this rank's next piece or done flag, so waiting on one
 * request alone could deadlock when callers complete operations in different orders. When another
 * request fails meanwhile, this one cannot complete either: its receives are cancelled and, if
 * anything is still pending, it is kept rather than freed (req_retire). */
zs_status zs_comm_wait(struct zs_comm *c, struct zs_comm_req *req)
{
    zs_status st = ZS_OK;
    struct zs_watch w;
    struct zs_backoff b = ZS_BACKOFF_INIT;

    zs_watch_start(&w);
    for (;;) {
        st = req_advance(c, req, false);
        if (st || req->stage == ST_DONE)
            break;
        st = zs_comm_progress(c);
        if (st || req->stage == ST_DONE)
            break;
        st = zs_comm_watch(c, &w, req);
        if (st)
            break;
        zs_backoff(&b, c->moves);
    }
    if (req->stage == ST_DONE)
        st = req->err;
    else if (!req->err)
        req->err = st;
    req_retire(c, req);
    return st;
}
