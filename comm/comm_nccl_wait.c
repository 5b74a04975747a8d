/* comm_nccl_wait.c - no wait on NCCL work lasts longer than zeroshard.timeout_s. Every wait polls its CUDA event
 * (or stream) and ncclCommGetAsyncError instead of blocking in the driver; on expiry, on an asynchronous NCCL
 * error, or when a peer on this node has exited, it aborts the communicator (NCCL's pending work ends, so its
 * stream moves on) and fails with one message naming the operation, how long it waited and who had not
 * arrived, as comm_watch.c's does for the CPU collectives. NCCL cannot say who has not arrived: the node's
 * ranks count the NCCL operations they queue in shared memory (shm.c), and the ranks behind are named. */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "base/clock.h" /* defines: zs_now_s */
#include "base/error.h" /* defines: zs_fail */
#include "comm_nccl_impl.h"
#include "shm.h" /* defines: zs_shm_nccl_behind, zs_shm_gone */

#define LIVE_S 1.0   /* how often a wait checks that its local peers still exist */
#define NAMED 16     /* ranks named before "..." */

/* The local ranks that have queued fewer NCCL operations than this one. */
static void who_text(const struct zs_nccl *n, char *b, size_t len)
{
    int32_t r[NAMED + 1], k;
    size_t l = 0;

    if (!n->shm) {
        snprintf(b, len, "unchecked (no node-local view of the ranks)");
        return;
    }
    k = zs_shm_nccl_behind(n->shm, r, NAMED + 1);
    b[0] = '\0';
    for (int32_t i = 0; i < k && i < NAMED && l < len; i++)
        l += (size_t)snprintf(b + l, len - l, "%s%d", i ? ", " : "", r[i]);
    if (l < len)
        snprintf(b + l, len - l, "%s%s", k > NAMED ? ", ..." : k ? "" : "none on this node",
                 zs_shm_nodes(n->shm) > 1 ? "; ranks on other nodes unchecked" : "");
}

zs_status zs_nccl_late(struct zs_nccl *n, zs_status st)
{
    char msg[768], who[256];

    snprintf(msg, sizeof(msg), "%s", zs_last_error());
    who_text(n, who, sizeof(who));
    return zs_fail(st, "%s; ranks not arrived: %s", msg, who);
}

/* The first marked operation that has not completed, else what the caller waits for. */
static void op_text(struct zs_nccl *n, char *b, size_t len, const char *what)
{
    uint64_t first = n->issued > ZS_NCCL_RING ? n->issued - ZS_NCCL_RING : 0;

    for (uint64_t s = first; s < n->issued; s++) {
        const struct nccl_op *o = &n->ops[s % ZS_NCCL_RING];
        if (cudaEventQuery(o->done) == cudaErrorNotReady) {
            (void)cudaGetLastError(); /* not ready is an answer, not an error: see zs_nccl_poll */
            snprintf(b, len, "%s of %llu bytes (NCCL operation %llu of this communicator)", o->name,
                     (unsigned long long)o->bytes, (unsigned long long)o->seq + 1);
            return;
        }
    }
    snprintf(b, len, "%s", what);
}

/* After the message is set: NCCL's pending work ends, and every later call on n fails with the message. */
static zs_status abort_comm(struct zs_nccl *n)
{
    if (n->comm)
        n->api.comm_abort(n->comm);
    n->comm = NULL;
    n->broken = ZS_ERR_COMM;
    snprintf(n->broken_why, sizeof(n->broken_why), "%s", zs_last_error());
    return ZS_ERR_COMM;
}

zs_status zs_nccl_fail(struct zs_nccl *n, ncclResult_t r, const char *what)
{
    zs_fail(ZS_ERR_COMM, "comm: rank %d: %s: %s; the NCCL communicator is aborted", n->rank, what,
            n->api.error_string(r));
    return abort_comm(n);
}

static zs_status broken_fail(const struct zs_nccl *n)
{
    return zs_fail(n->broken, "comm: rank %d: NCCL unusable after an earlier failure: %s", n->rank, n->broken_why);
}

static zs_status timed_out(struct zs_nccl *n, const char *what, double waited)
{
    char op[256], who[256];

    op_text(n, op, sizeof(op), what);
    who_text(n, who, sizeof(who));
    zs_fail(ZS_ERR_COMM, "comm: rank %d: timeout: %s did not complete in %.1f s (zeroshard.timeout_s / ZS_TIMEOUT "
            "= %g); ranks not arrived: %s; the NCCL communicator is aborted", n->rank, op, waited, n->timeout_s, who);
    return abort_comm(n);
}

zs_status zs_nccl_poll(struct zs_nccl *n, double since, const char *what)
{
    double t = zs_now_s();
    ncclResult_t a = ncclSuccess, r;
    char op[256];

    /* the not-ready answer that brought the caller here stays as the runtime's last error, which the next
     * kernel launch's check would report as its own */
    (void)cudaGetLastError();
    if (n->broken)
        return broken_fail(n);
    r = n->api.get_async_error(n->comm, &a);
    if (r != ncclSuccess || (a != ncclSuccess && a != ncclInProgress)) {
        op_text(n, op, sizeof(op), what);
        zs_fail(ZS_ERR_COMM, "comm: rank %d: %s failed after %.1f s: NCCL reports \"%s\" (ncclCommGetAsyncError); "
                "the NCCL communicator is aborted", n->rank, op, t - since, n->api.error_string(r ? r : a));
        return abort_comm(n);
    }
    if (n->shm && t - n->live_at >= LIVE_S) {
        int64_t pid = 0;
        int32_t dead = zs_shm_gone(n->shm, &pid);
        n->live_at = t;
        if (dead >= 0) {
            op_text(n, op, sizeof(op), what);
            zs_fail(ZS_ERR_COMM, "comm: rank %d: %s cannot complete: after %.1f s a peer on this node has exited: "
                    "rank %d (pid %lld); the NCCL communicator is aborted", n->rank, op, t - since, dead,
                    (long long)pid);
            return abort_comm(n);
        }
    }
    return t - since >= n->timeout_s ? timed_out(n, what, t - since) : ZS_OK;
}

/* Between polls: short, so a wait ends soon after its work, and the CPU is left to the peers (ranks may
 * outnumber cores). */
static void pause_briefly(uint32_t spins)
{
    struct timespec ts = { 0, spins < 64 ? 1000 : 100000 };

    nanosleep(&ts, NULL);
}

zs_status zs_nccl_wait_event(struct zs_nccl *n, cudaEvent_t ev, const char *what)
{
    double start = zs_now_s();

    zs_nccl_use(n);
    if (n->broken)
        return broken_fail(n);
    for (uint32_t spins = 0;; spins++) {
        cudaError_t e = ev ? cudaEventQuery(ev) : cudaStreamQuery(n->stream);
        zs_status st;
        if (e == cudaSuccess)
            return ZS_OK;
        if (e != cudaErrorNotReady) {
            zs_fail(ZS_ERR_COMM, "comm: rank %d: %s: %s; the NCCL communicator is aborted", n->rank, what,
                    cudaGetErrorString(e));
            return abort_comm(n);
        }
        if ((st = zs_nccl_poll(n, start, what)))
            return st;
        pause_briefly(spins);
    }
}

zs_status zs_nccl_issued(struct zs_nccl *n, ncclResult_t r, const char *what)
{
    double start = zs_now_s();
    ncclResult_t a = ncclInProgress;

    if (r == ncclSuccess)
        return ZS_OK;
    if (r != ncclInProgress)
        return zs_nccl_fail(n, r, what);
    for (uint32_t spins = 0; a == ncclInProgress; spins++) {
        double t = zs_now_s();
        r = n->api.get_async_error(n->comm, &a);
        if (r != ncclSuccess)
            return zs_nccl_fail(n, r, "ncclCommGetAsyncError");
        if (a != ncclSuccess && a != ncclInProgress)
            return zs_nccl_fail(n, a, what);
        if (a == ncclInProgress && t - start >= n->timeout_s)
            return timed_out(n, what, t - start);
        if (a == ncclInProgress)
            pause_briefly(spins);
    }
    return ZS_OK;
}

void zs_nccl_mark(struct zs_nccl *n, const char *name, uint64_t bytes)
{
    struct nccl_op *o = &n->ops[n->issued % ZS_NCCL_RING];

    o->name = name;
    o->bytes = bytes;
    o->seq = n->issued++;
    cudaEventRecord(o->done, n->stream);
}
