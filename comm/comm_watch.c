/* comm_watch.c - the watchdog: no wait in the collectives lasts longer than the configured timeout, and
 * a wait notices at once (within a second) when a peer on its node has exited. Either way the wait
 * ends with one message that names the operation, how long it waited, and who had not arrived. */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "base/backoff.h" /* defines: zs_backoff */
#include "base/clock.h" /* defines: zs_now_s */
#include "base/error.h"
#include "comm_impl.h"
#include "comm/flight.h" /* defines: zs_flight_signalled */

#define WATCH_POLLS 64    /* polls between reading the clock: a poll is far cheaper than a second */
#define WATCH_LIVE_S 1.0  /* how often a wait checks that its local peers still exist */
#define WATCH_RANKS 16    /* ranks named in a message before "..." */

void zs_watch_start(struct zs_watch *w)
{
    w->start = w->live_at = zs_now_s();
    w->polls = 0;
}

/* ---------------------------------------------------------------- who has not arrived */

static bool data_local(const struct zs_comm_req *q, int32_t j)
{
    return q->shm && q->peer && q->peer[j];
}

/* The k-th peer reached by MPI for data, in the order the pieces post their receive/send pairs. */
static int32_t data_peer(const struct zs_comm *c, const struct zs_comm_req *q, int k)
{
    for (int32_t j = 0; j < c->size; j++)
        if (j != c->rank && !data_local(q, j) && k-- == 0)
            return j;
    return -1;
}

static int32_t header_peer(const struct zs_comm *c, int k)
{
    for (int32_t j = 0; j < c->size; j++)
        if (zs_comm_is_remote(c, j) && k-- == 0)
            return j;
    return -1;
}

/* The peers of pairs (receive, send) whose receive is still open. Testing completes those that can:
 * harmless, since the progress loop treats a completed (null) request as done. */
static int32_t open_receives(const struct zs_comm *c, const struct zs_comm_req *q, MPI_Request *r, int npairs,
                             int peers, bool header, int32_t *out, int32_t n, int32_t max)
{
    for (int k = 0; k < npairs && n < max; k++) {
        int flag = 1;
        if (r[2 * k] != MPI_REQUEST_NULL)
            MPI_Test(&r[2 * k], &flag, MPI_STATUS_IGNORE);
        if (!flag)
            out[n++] = header ? header_peer(c, k) : data_peer(c, q, k % peers);
    }
    return n;
}

/* Keeps the first of each rank (pieces of one peer each leave a receive open). */
static int32_t unique(int32_t *out, int32_t n)
{
    int32_t m = 0;

    for (int32_t i = 0; i < n; i++) {
        bool seen = out[i] < 0;
        for (int32_t k = 0; k < m && !seen; k++)
            seen = out[k] == out[i];
        if (!seen)
            out[m++] = out[i];
    }
    return m;
}

/* The ranks q is waiting for in its present stage, and the stage's name. */
static int32_t missing(struct zs_comm *c, struct zs_comm_req *q, int32_t *out, int32_t max, const char **phase)
{
    uint64_t ag_seq = q->kind == REQ_AR ? q->seq + 1 : q->seq;
    int32_t n = 0, peers = 0;

    for (int32_t j = 0; j < c->size; j++)
        peers += j != c->rank && !data_local(q, j);
    switch (q->stage) {
    case ST_CHECK:
        *phase = "the cross-rank check of what each rank issued";
        if (q->local_check && !zs_shm_all_posted(c->shm, q->seq))
            return zs_shm_not_posted(c->shm, q->seq, out, max);
        if (q->hreq)
            n = open_receives(c, q, q->hreq, q->nremote, q->nremote, true, out, 0, max);
        return n;
    case ST_RS_RUN:
        *phase = "the reduction's data";
        if (q->shm && !q->posted_seen)
            n = zs_shm_not_posted(c->shm, q->seq, out, max);
        for (int s = 0; s < ZS_COMM_SLOTS && peers > 0; s++)
            if (q->slot[s].active && q->slot[s].mr)
                n = open_receives(c, q, q->slot[s].mr, q->slot[s].nmr / 2, peers, false, out, n, max);
        return unique(out, n);
    case ST_RS_DRAIN:
        *phase = "peers finishing reading this rank's buffer";
        return zs_shm_not_done(c->shm, q->seq, out, max);
    case ST_AG_START:
    case ST_AG_RUN:
        *phase = "the gather's data";
        if (q->shm && !q->copied)
            n = zs_shm_not_posted(c->shm, ag_seq, out, max);
        if (q->agr && peers > 0)
            n = open_receives(c, q, q->agr, q->nagr / 2, peers, false, out, n, max);
        return unique(out, n);
    case ST_AG_DRAIN:
        *phase = "peers finishing reading this rank's buffer";
        return zs_shm_not_done(c->shm, ag_seq, out, max);
    case ST_DONE:
        break;
    }
    *phase = "completion";
    return 0;
}

static void ranks_text(const struct zs_comm *c, char *b, size_t n, const int32_t *r, int32_t k)
{
    size_t l = 0;

    b[0] = '\0';
    for (int32_t i = 0; i < k && i < WATCH_RANKS && l < n; i++)
        l += (size_t)snprintf(b + l, n - l, "%s%d", i ? ", " : "", zs_comm_rank_name(c, r[i]));
    if (k > WATCH_RANKS && l < n)
        snprintf(b + l, n - l, ", ...");
}

/* " (host NAME)" or " (hosts A, B)": the hosts of the named ranks other than this rank's own, where a lost
 * host is the likely cause; nothing when they all share this rank's host (or a forced node layout). */
static void hosts_text(const struct zs_comm *c, char *b, size_t n, const int32_t *r, int32_t k)
{
    const char *seen[4];
    int32_t m = 0;
    size_t l = 0;

    b[0] = '\0';
    for (int32_t i = 0; c->hosts && i < k && m < 4; i++) {
        const char *h = r[i] >= 0 && r[i] < c->size ? c->hosts[r[i]] : NULL;
        bool dup = !h || !h[0] || !strncmp(h, c->hosts[c->rank], ZS_COMM_HOST_LEN);
        for (int32_t j = 0; j < m && !dup; j++)
            dup = !strncmp(seen[j], h, ZS_COMM_HOST_LEN);
        if (!dup)
            seen[m++] = h;
    }
    for (int32_t j = 0; j < m && l < n; j++)
        l += (size_t)snprintf(b + l, n - l, "%s%.*s", j ? ", " : (m > 1 ? " (hosts " : " (host "), ZS_COMM_HOST_LEN,
                              seen[j]);
    if (m && l < n)
        snprintf(b + l, n - l, ")");
}

/* ---------------------------------------------------------------- the verdicts */

/* After the message is set: a peer may still write into what this rank posted, so the comm is done. */
static zs_status watch_fail(struct zs_comm *c)
{
    zs_comm_mark_broken(c, ZS_ERR_COMM);
    zs_comm_flight_dump(c, zs_last_error());
    c->broken_dumped = true;
    return ZS_ERR_COMM;
}

static zs_status timed_out(struct zs_comm *c, struct zs_comm_req *q, double waited)
{
    char op[320], who[256] = "none named", where[300] = "";
    const char *phase;
    int32_t r[64], k;

    zs_comm_op_text(op, sizeof(op), c, q);
    k = missing(c, q, r, 64, &phase);
    if (k > 0) {
        ranks_text(c, who, sizeof(who), r, k);
        hosts_text(c, where, sizeof(where), r, k);
    }
    zs_fail(ZS_ERR_COMM, "comm: rank %d: timeout: %s did not complete in %.1f s (zeroshard.timeout_s / ZS_TIMEOUT = %g) "
            "waiting for %s; ranks not arrived: %s%s", zs_comm_rank_name(c, c->rank), op, waited, c->timeout_s, phase,
            who, where);
    return watch_fail(c);
}

static zs_status peer_gone(struct zs_comm *c, struct zs_comm_req *q, double waited, int32_t dead, int64_t pid)
{
    char op[320];

    zs_comm_op_text(op, sizeof(op), c, q);
    zs_fail(ZS_ERR_COMM, "comm: rank %d: %s cannot complete: after %.1f s a peer on this node has exited: rank %d "
            "(pid %lld)", zs_comm_rank_name(c, c->rank), op, waited, zs_comm_rank_name(c, dead), (long long)pid);
    return watch_fail(c);
}

zs_status zs_comm_watch(struct zs_comm *c, struct zs_watch *w, struct zs_comm_req *q)
{
    double t, waited;

    if (zs_flight_signalled())
        zs_comm_flight_dump(c, "SIGUSR1");
    if (++w->polls % WATCH_POLLS)
        return ZS_OK;
    t = zs_now_s();
    waited = t - w->start;
    if (c->shm && t - w->live_at >= WATCH_LIVE_S) {
        int64_t pid = 0;
        int32_t dead = zs_shm_gone(c->shm, &pid);
        w->live_at = t;
        if (dead >= 0)
            return peer_gone(c, q, waited, dead, pid);
    }
    if (waited >= c->timeout_s)
        return timed_out(c, q, waited);
    return ZS_OK;
}

zs_status zs_comm_mpi_wait(struct zs_comm *c, MPI_Request *r, const char *what)
{
    zs_status st = zs_mpi_wait_timeout(r, c->timeout_s, c->rank, what, c->shm);

    if (st) { /* the request stays posted: MPI cannot cancel a collective */
        zs_comm_mark_broken(c, st);
        zs_comm_flight_dump(c, zs_last_error());
        c->broken_dumped = true;
    }
    return st;
}

/* For the exchanges made outside an operation (the start-up votes, the heap's votes): the deadline, and
 * with `live` the liveness of the node's ranks. A nonblocking MPI collective does not tell who has not
 * joined it: the caller adds what it knows of the missing ranks. */
zs_status zs_mpi_wait_timeout(MPI_Request *r, double timeout_s, int32_t rank, const char *what,
                              const struct zs_shm *live)
{
    double start = zs_now_s(), live_at = start;
    struct zs_backoff b = ZS_BACKOFF_INIT;
    int flag = 0;

    for (uint32_t spins = 1;; spins++) {
        int rc = MPI_Test(r, &flag, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS)
            return zs_comm_mpi_fail(rc, what, -1);
        if (flag)
            return ZS_OK;
        if (spins % WATCH_POLLS == 0) {
            double t = zs_now_s();
            int64_t pid = 0;
            int32_t dead = live && t - live_at >= WATCH_LIVE_S ? zs_shm_gone(live, &pid) : -1;
            if (live && t - live_at >= WATCH_LIVE_S)
                live_at = t;
            if (dead >= 0)
                return zs_fail(ZS_ERR_COMM, "comm: rank %d: %s cannot complete: after %.1f s a peer on this node has "
                               "exited: rank %d (pid %lld)", rank, what, t - start, dead, (long long)pid);
            if (t - start >= timeout_s)
                return zs_fail(ZS_ERR_COMM, "comm: rank %d: timeout: %s did not complete in %.1f s (zeroshard.timeout_s "
                               "/ ZS_TIMEOUT = %g)", rank, what, t - start, timeout_s);
        }
        zs_backoff(&b, 0);
    }
}
