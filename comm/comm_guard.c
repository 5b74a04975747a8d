/* comm_guard.c - what keeps the ranks' collectives in step: every operation is checked across ranks before
 * its data moves (kind, dtype, count, and for local peers where the buffer sits in the shared heap); a
 * failure after data was posted cancels what it can, frees nothing still pending and marks the comm
 * unusable; and the test hooks that start the collectives in states a short test cannot otherwise reach. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/backoff.h" /* defines: zs_backoff */
#include "base/error.h"
#include "base/test_hooks.h"
#include "comm_impl.h"

zs_status zs_comm_mpi_fail(int rc, const char *what, int peer)
{
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;

    MPI_Error_string(rc, msg, &len);
    msg[len] = '\0';
    if (peer >= 0)
        return zs_fail(ZS_ERR_COMM, "%s with rank %d failed: %s", what, peer, msg);
    return zs_fail(ZS_ERR_COMM, "%s failed: %s", what, msg);
}

/* ---------------------------------------------------------------- test hooks and tags */

/* Test-only starting states, documented where they are read:
 *   ZS_TEST_COMM_SEQ=N   the first operation's sequence number (to cross 2^32 in a short test);
 *   ZS_TEST_TAG_UB=N     pretend MPI_TAG_UB is N (the MPI standard's minimum is 32767);
 *   ZS_TEST_COMM_FAULT   see enum fault_site. */
void zs_comm_hooks_from_env(struct zs_comm *c)
{
    const char *seq = getenv(ZS_TEST_HOOK_COMM_SEQ), *ub = getenv(ZS_TEST_HOOK_TAG_UB), *f = getenv(ZS_TEST_HOOK_COMM_FAULT);
    int n = 0;

    if (seq && *seq)
        c->seq = strtoull(seq, NULL, 0);
    if (ub && atoi(ub) > 0)
        c->tag_ub = atoi(ub);
    while (f && *f && n < ZS_COMM_FAULTS) {
        char site[16];
        unsigned long long at;
        int rank, used = 0;

        if (sscanf(f, "%15[a-z]:%llu:%d%n", site, &at, &rank, &used) != 3)
            break;
        if (rank == c->rank) {
            c->fault[n].site = !strcmp(site, "new")      ? FAULT_NEW
                             : !strcmp(site, "attach")   ? FAULT_ATTACH
                             : !strcmp(site, "progress") ? FAULT_PROGRESS
                             : !strcmp(site, "stop")     ? FAULT_STOP
                             : !strcmp(site, "die")      ? FAULT_DIE
                                                         : FAULT_NONE;
            c->fault[n++].seq = at;
            c->faults = true;
        }
        f += used;
        f += *f == ',';
    }
}

bool zs_comm_fault_find(struct zs_comm *c, enum fault_site site, uint64_t seq)
{
    for (int i = 0; i < ZS_COMM_FAULTS; i++)
        if (c->fault[i].site == site && c->fault[i].seq == seq) {
            c->fault[i].site = FAULT_NONE;
            return true;
        }
    return false;
}

/* Each operation in flight gets a block of tags: its header, then its pieces. Fewer than two tags per
 * block cannot work; fewer than the maximum only means pieces of one operation share tags more often,
 * which MPI's in-order matching makes safe. */
zs_status zs_comm_tags_plan(struct zs_comm *c)
{
    int64_t per = ((int64_t)c->tag_ub + 1) / ZS_COMM_WINDOW;

    if (per < 2)
        return zs_fail(ZS_ERR_COMM, "comm: MPI_TAG_UB is %d; %d operations in flight need at least %d tags "
                       "(a header and a piece each)", c->tag_ub, ZS_COMM_WINDOW, 2 * ZS_COMM_WINDOW);
    c->tag_pieces = per < ZS_TAG_PIECES_MAX ? (int)per : ZS_TAG_PIECES_MAX;
    return ZS_OK;
}

/* ---------------------------------------------------------------- checking an operation across ranks */

const char *zs_comm_kind_name(int32_t k)
{
    return k == REQ_RS ? "reduce-scatter" : k == REQ_AG ? "all-gather" : k == REQ_AR ? "all-reduce" : "?";
}

static const char *dtype_name(int32_t t)
{
    return t == ZS_DTYPE_FP32 ? "fp32" : t == ZS_DTYPE_BF16 ? "bf16" : t == ZS_DTYPE_FP16 ? "fp16" : t == ZS_COMM_INT64 ? "int64" : "?";
}

const char *zs_comm_purpose_name(int32_t p)
{
    static const char *const names[] = {"-", "fetch", "grad", "gather", "norm", "setup", "preempt", "program"};

    return p >= 0 && p < (int32_t)(sizeof(names) / sizeof(names[0])) ? names[p] : "?";
}

void zs_comm_label_next(struct zs_comm *c, enum zs_comm_purpose what, int32_t unit)
{
    c->next_purpose = (int32_t)what;
    c->next_unit = unit;
}

void zs_comm_set_step(struct zs_comm *c, int64_t step)
{
    c->step = step;
}

/* "all-gather (fetch of unit 5) of 1024 fp32 at micro-step 3 on a plain buffer" */
static void desc_text(char *b, size_t n, const struct zs_shm_desc *d)
{
    char where[64] = "a plain buffer", why[48] = "";

    if (d->heap_off != UINT64_MAX)
        snprintf(where, sizeof(where), "a shared-heap buffer at offset %llu:%llu",
                 (unsigned long long)(d->heap_off >> 48), (unsigned long long)(d->heap_off & ((1ull << 48) - 1)));
    if (d->purpose && d->unit >= 0)
        snprintf(why, sizeof(why), " (%s of unit %d)", zs_comm_purpose_name(d->purpose), d->unit);
    else if (d->purpose)
        snprintf(why, sizeof(why), " (%s)", zs_comm_purpose_name(d->purpose));
    snprintf(b, n, "%s%s of %llu %s%s%s at micro-step %lld on %s", zs_comm_kind_name(d->kind), why,
             (unsigned long long)d->count, dtype_name(d->dt_in), d->dt_out != d->dt_in ? " to " : "",
             d->dt_out != d->dt_in ? dtype_name(d->dt_out) : "", (long long)d->step, where);
}

void zs_comm_op_text(char *b, size_t n, const struct zs_comm *c, const struct zs_comm_req *q)
{
    char t[256];

    desc_text(t, sizeof(t), &q->hdr.d);
    snprintf(b, n, "operation %llu (%s, %llu bytes)", (unsigned long long)q->seq, t,
             (unsigned long long)(q->hdr.d.count * (uint64_t)c->size * (q->kind == REQ_AG ? q->esz_out : q->esz_in)));
}

/* Local peers also compare where the buffer is: zero copy reads a peer's buffer at the same offset. */
static bool desc_same(const struct zs_shm_desc *a, const struct zs_shm_desc *b, bool heap)
{
    return a->kind == b->kind && a->count == b->count && a->dt_in == b->dt_in && a->dt_out == b->dt_out &&
           a->purpose == b->purpose && a->unit == b->unit && a->step == b->step &&
           (!heap || a->heap_off == b->heap_off) && !a->failed && !b->failed;
}

/* One message for every way two ranks' views of operation seq can differ. */
static void mismatch_text(char *b, size_t n, uint64_t seq, int32_t me, const struct zs_shm_desc *mine, int32_t peer,
                          const struct zs_shm_desc *theirs)
{
    char t1[256], t2[256];

    desc_text(t1, sizeof(t1), mine);
    desc_text(t2, sizeof(t2), theirs);
    if (mine->failed || theirs->failed)
        snprintf(b, n, "comm: operation %llu (%s) cannot run: rank %d could not take part",
                 (unsigned long long)seq, t1, mine->failed ? me : peer);
    else
        snprintf(b, n, "comm: operation %llu differs between ranks: rank %d issued %s, rank %d %s (every rank must "
                 "issue the same collectives in the same order)", (unsigned long long)seq, me, t1, peer, t2);
}

/* Compares this rank's descriptor with every local peer's; a difference is noted in q->bad_peer and, through
 * the header, told to the remote peers too, so that every rank ends the operation. */
static void check_local(struct zs_comm *c, struct zs_comm_req *q)
{
    for (int32_t j = 0; j < c->size && q->bad_peer < 0; j++) {
        int32_t l = zs_shm_local_index(c->shm, j);

        if (l >= 0 && j != c->rank && !desc_same(&q->hdr.d, zs_shm_peer_desc(c->shm, q->seq, l), true))
            q->bad_peer = j;
    }
    if (q->bad_peer < 0 && q->hdr.d.failed)
        q->bad_peer = c->rank;
    q->hdr.node_bad = q->bad_peer >= 0;
}

/* The local verdict, once every header is in (the peer's descriptor cannot change before this rank's
 * operation ends: the window keeps its flag slot). */
static zs_status local_fail(struct zs_comm *c, struct zs_comm_req *q)
{
    const struct zs_shm_desc *d = &q->hdr.d;
    char msg[768];

    if (q->bad_peer != c->rank)
        d = zs_shm_peer_desc(c->shm, q->seq, zs_shm_local_index(c->shm, q->bad_peer));
    mismatch_text(msg, sizeof(msg), q->seq, c->rank, &q->hdr.d, q->bad_peer, d);
    return zs_fail(ZS_ERR_COMM, "%s", msg);
}

bool zs_comm_is_remote(const struct zs_comm *c, int32_t j)
{
    return j != c->rank && (!c->shm || zs_shm_local_index(c->shm, j) < 0);
}

static zs_status check_remote(struct zs_comm *c, struct zs_comm_req *q)
{
    char msg[768] = "";

    for (int32_t j = 0, i = 0; j < c->size && !msg[0]; j++) {
        const struct op_header *h = &q->hdr_in[i];

        if (!zs_comm_is_remote(c, j))
            continue;
        i++;
        if (h->seq != q->seq)
            snprintf(msg, sizeof(msg), "comm: rank %d sent operation %llu where this rank (%d) is at %llu", j,
                     (unsigned long long)h->seq, c->rank, (unsigned long long)q->seq);
        else if (!desc_same(&q->hdr.d, &h->d, false))
            mismatch_text(msg, sizeof(msg), q->seq, c->rank, &q->hdr.d, j, &h->d);
        else if (h->node_bad)
            snprintf(msg, sizeof(msg), "comm: operation %llu cannot run: rank %d found the ranks of its node "
                     "disagreeing about it", (unsigned long long)q->seq, j);
    }
    return msg[0] ? zs_fail(ZS_ERR_COMM, "%s", msg) : ZS_OK;
}

/* Before any data moves: local peers' descriptors are read from the flags, then a header goes to each
 * remote peer (after the local check, so it carries the node's verdict) and theirs are compared. A
 * verdict against the operation is reached by every rank and leaves nothing pending (q->clean). */
zs_status zs_comm_check_progress(struct zs_comm *c, struct zs_comm_req *q, bool *done)
{
    int flag = 1;

    *done = false;
    if (!q->hdr_sent) {
        if (q->local_check) {
            if (!zs_shm_all_posted(c->shm, q->seq))
                return ZS_OK;
            check_local(c, q);
        }
        for (int32_t j = 0, i = 0; q->nremote > 0 && j < c->size; j++) {
            if (!zs_comm_is_remote(c, j))
                continue;
            int rc = MPI_Isend(&q->hdr, sizeof(q->hdr), MPI_BYTE, j, header_tag(c, q->seq), c->comm,
                               &q->hreq[2 * i++ + 1]);
            if (rc != MPI_SUCCESS)
                return zs_comm_mpi_fail(rc, "operation header send", j);
            zs_comm_count_header(sizeof(q->hdr));
        }
        q->hdr_sent = true;
    }
    if (q->nremote > 0 && MPI_Testall(2 * q->nremote, q->hreq, &flag, MPI_STATUSES_IGNORE) != MPI_SUCCESS)
        return zs_fail(ZS_ERR_COMM, "comm: exchanging the header of operation %llu failed",
                       (unsigned long long)q->seq);
    if (!flag)
        return ZS_OK;
    *done = true;
    q->clean = true; /* a verdict from here on leaves nothing pending */
    if (q->bad_peer >= 0)
        return local_fail(c, q);
    if (check_remote(c, q))
        return ZS_ERR_COMM;
    q->clean = false;
    return ZS_OK;
}

zs_status zs_comm_post_headers(struct zs_comm *c, struct zs_comm_req *q)
{
    if (q->nremote == 0)
        return ZS_OK;
    for (int32_t j = 0, i = 0; j < c->size; j++) {
        if (!zs_comm_is_remote(c, j))
            continue;
        int rc = MPI_Irecv(&q->hdr_in[i], sizeof(q->hdr_in[i]), MPI_BYTE, j, header_tag(c, q->seq), c->comm,
                           &q->hreq[2 * i]);
        i++;
        if (rc != MPI_SUCCESS)
            return zs_comm_mpi_fail(rc, "operation header receive", j);
    }
    return ZS_OK;
}

/* ---------------------------------------------------------------- failures */

/* Requests are posted in pairs, receive then send. A receive is cancelled (it then either is cancelled
 * or completes, and either way MPI is done with its buffer); a send is left to finish. True when none
 * of the n is pending any more. */
static bool settle_pairs(MPI_Request *r, int n)
{
    struct zs_backoff b = ZS_BACKOFF_INIT;
    int flag = 0;

    for (int i = 0; i < n; i += 2)
        if (r[i] != MPI_REQUEST_NULL)
            MPI_Cancel(&r[i]);
    for (int tries = 0; tries < 1000; tries++) {
        if (MPI_Testall(n, r, &flag, MPI_STATUSES_IGNORE) != MPI_SUCCESS)
            return false;
        if (flag)
            return true;
        zs_backoff(&b, 0);
    }
    return false;
}

/* After a failure with messages posted: true when the network can no longer touch q's buffers. */
bool zs_comm_req_quiesce(struct zs_comm_req *q)
{
    bool idle = !q->hreq || settle_pairs(q->hreq, 2 * q->nremote);

    for (int s = 0; s < ZS_COMM_SLOTS; s++)
        if (q->slot[s].mr)
            idle &= settle_pairs(q->slot[s].mr, q->slot[s].nmr);
    if (q->agr)
        idle &= settle_pairs(q->agr, q->nagr);
    return idle;
}

zs_status zs_comm_broken_fail(const struct zs_comm *c)
{
    return zs_fail(c->broken, "%s", c->broken_why); /* the first failure is the one worth reading */
}

void zs_comm_mark_broken(struct zs_comm *c, zs_status st)
{
    if (c->broken)
        return;
    c->broken = st;
    snprintf(c->broken_why, sizeof(c->broken_why), "%s", zs_last_error());
}
