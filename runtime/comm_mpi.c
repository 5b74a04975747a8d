/* comm_mpi.c - the MPI collective backend: point-to-point exchanges in pipelined pieces, summed
 * here in rank order so results never depend on MPI's choice of reduction algorithm. Progress is
 * explicit: every engine call tests the outstanding requests. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "error.h"

#define ZS_COMM_PIECE_DEFAULT (1 << 18) /* elements per peer per piece: 1 MiB of fp32 */
#define ZS_COMM_AG_PIECE (1 << 24)      /* all-gather messages stay well inside int counts */
#define ZS_COMM_SLOTS 2                 /* reduce-scatter pieces in flight per request */
#define ZS_TAG_PIECES 4096

enum req_kind { REQ_RS, REQ_AG, REQ_AR };

struct scratch {
    struct scratch *next;
    float *data;
};

struct rs_slot {
    bool active;
    int64_t off, len;
    struct scratch *tmp;
    int32_t piece;
    MPI_Request *mr; /* 2 * (N - 1) */
};

struct zs_comm_req {
    struct zs_comm_req *next;
    enum req_kind kind;
    int phase;             /* all-reduce: 0 reduce-scatter, 1 all-gather */
    uint32_t seq;          /* tag base, agreed by all ranks through call order */
    const float *src;
    float *out, *gbuf;
    int64_t count, next_off;
    int32_t next_piece;
    float scale;
    struct rs_slot slot[ZS_COMM_SLOTS];
    MPI_Request *agr;
    int nagr;
    bool done;
    zs_status err;
};

struct zs_comm {
    MPI_Comm comm;
    int32_t rank, size;
    int64_t piece;
    int tag_mod;
    uint32_t seq;
    struct scratch *free_scratch;
    uint64_t scratch_bytes;
    struct zs_comm_req *active;
};

static zs_status mpi_fail(int rc, const char *what, int peer)
{
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;

    MPI_Error_string(rc, msg, &len);
    msg[len] = '\0';
    if (peer >= 0)
        return zs_fail(ZS_ERR_COMM, "%s with rank %d failed: %s", what, peer, msg);
    return zs_fail(ZS_ERR_COMM, "%s failed: %s", what, msg);
}

zs_status zs_comm_init(struct zs_comm **out, MPI_Comm parent)
{
    struct zs_comm *c = calloc(1, sizeof(*c));
    int rc, flag = 0, *ub = NULL;
    const char *env = getenv("ZS_COMM_PIECE");

    if (!c)
        return zs_fail(ZS_ERR_NOMEM, "comm: out of memory");
    rc = MPI_Comm_dup(parent, &c->comm);
    if (rc != MPI_SUCCESS) {
        free(c);
        return mpi_fail(rc, "MPI_Comm_dup", -1);
    }
    MPI_Comm_set_errhandler(c->comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(c->comm, &c->rank);
    MPI_Comm_size(c->comm, &c->size);
    MPI_Comm_get_attr(c->comm, MPI_TAG_UB, &ub, &flag);
    c->tag_mod = (flag && ub && *ub > 0) ? *ub : 32767;
    c->piece = ZS_COMM_PIECE_DEFAULT;
    if (env && atoll(env) > 0)
        c->piece = atoll(env);
    *out = c;
    return ZS_OK;
}

void zs_comm_free(struct zs_comm *c)
{
    if (!c)
        return;
    while (c->active) {
        struct zs_comm_req *q = c->active;
        zs_comm_wait(c, q);
    }
    while (c->free_scratch) {
        struct scratch *s = c->free_scratch;
        c->free_scratch = s->next;
        free(s->data);
        free(s);
    }
    MPI_Comm_free(&c->comm);
    free(c);
}

int32_t zs_comm_rank(const struct zs_comm *c) { return c->rank; }
int32_t zs_comm_size(const struct zs_comm *c) { return c->size; }
MPI_Comm zs_comm_mpi(const struct zs_comm *c) { return c->comm; }
uint64_t zs_comm_scratch_bytes(const struct zs_comm *c) { return c->scratch_bytes; }

static int piece_tag(const struct zs_comm *c, uint32_t seq, int32_t piece)
{
    uint64_t t = (uint64_t)seq * ZS_TAG_PIECES + (uint64_t)(piece % ZS_TAG_PIECES);

    return (int)(t % (uint64_t)c->tag_mod);
}

/* Scratch buffers are pooled for the life of the comm: no allocation per piece after warm-up. */
static struct scratch *scratch_get(struct zs_comm *c)
{
    struct scratch *s = c->free_scratch;
    size_t bytes = (size_t)(c->size - 1) * (size_t)c->piece * sizeof(float);

    if (s) {
        c->free_scratch = s->next;
        return s;
    }
    s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    if (posix_memalign((void **)&s->data, 64, bytes ? bytes : 64)) {
        free(s);
        return NULL;
    }
    c->scratch_bytes += bytes;
    return s;
}

static void scratch_put(struct zs_comm *c, struct scratch *s)
{
    s->next = c->free_scratch;
    c->free_scratch = s;
}

/* ---------------------------------------------------------------- reduce-scatter pieces */

static zs_status rs_start_piece(struct zs_comm *c, struct zs_comm_req *q, struct rs_slot *sl)
{
    int32_t n = c->size, r = c->rank, k = 0;
    int tag;

    sl->off = q->next_off;
    sl->len = q->count - q->next_off < c->piece ? q->count - q->next_off : c->piece;
    sl->piece = q->next_piece++;
    q->next_off += sl->len;
    tag = piece_tag(c, q->seq, sl->piece);
    if (!sl->mr) {
        sl->mr = calloc(2 * (size_t)(n - 1) + 1, sizeof(MPI_Request));
        if (!sl->mr)
            return zs_fail(ZS_ERR_NOMEM, "comm: out of memory");
    }
    sl->tmp = scratch_get(c);
    if (!sl->tmp)
        return zs_fail(ZS_ERR_NOMEM, "comm: out of memory for a %lld-element scratch buffer",
                       (long long)((n - 1) * c->piece));
    for (int32_t j = 0; j < n; j++) {
        if (j == r)
            continue;
        float *dst = sl->tmp->data + (size_t)(j < r ? j : j - 1) * (size_t)sl->len;
        int rc = MPI_Irecv(dst, (int)sl->len, MPI_FLOAT, j, tag, c->comm, &sl->mr[k++]);
        if (rc != MPI_SUCCESS)
            return mpi_fail(rc, "reduce-scatter receive", j);
        rc = MPI_Isend(q->src + (size_t)j * (size_t)q->count + (size_t)sl->off, (int)sl->len, MPI_FLOAT, j,
                       tag, c->comm, &sl->mr[k++]);
        if (rc != MPI_SUCCESS)
            return mpi_fail(rc, "reduce-scatter send", j);
    }
    sl->active = true;
    return ZS_OK;
}

/* Rank order, left to right, then the scale: the one definition of a ZeroShard reduction. */
static void rs_sum_piece(struct zs_comm *c, struct zs_comm_req *q, struct rs_slot *sl)
{
    int32_t n = c->size, r = c->rank;
    const float *own = q->src + (size_t)r * (size_t)q->count + (size_t)sl->off;
    float *out = q->out + sl->off;

    for (int64_t i = 0; i < sl->len; i++) {
        float acc = r == 0 ? own[i] : sl->tmp->data[i];
        for (int32_t j = 1; j < n; j++) {
            const float *src = j == r ? own : sl->tmp->data + (size_t)(j < r ? j : j - 1) * (size_t)sl->len;
            acc += src[i];
        }
        out[i] = acc * q->scale;
    }
}

static zs_status rs_progress(struct zs_comm *c, struct zs_comm_req *q, bool block)
{
    int32_t nreq = 2 * (c->size - 1);

    for (;;) {
        bool any_active = false;

        for (int s = 0; s < ZS_COMM_SLOTS; s++) {
            struct rs_slot *sl = &q->slot[s];
            int flag = 1, rc;

            if (!sl->active && q->next_off < q->count) {
                zs_status st = rs_start_piece(c, q, sl);
                if (st)
                    return st;
            }
            if (!sl->active)
                continue;
            if (nreq > 0) {
                rc = block ? MPI_Waitall(nreq, sl->mr, MPI_STATUSES_IGNORE)
                           : MPI_Testall(nreq, sl->mr, &flag, MPI_STATUSES_IGNORE);
                if (rc != MPI_SUCCESS)
                    return mpi_fail(rc, "reduce-scatter", -1);
            }
            if (!flag) {
                any_active = true;
                continue;
            }
            rs_sum_piece(c, q, sl);
            scratch_put(c, sl->tmp);
            sl->tmp = NULL;
            sl->active = false;
            if (q->next_off < q->count) {
                zs_status st = rs_start_piece(c, q, sl);
                if (st)
                    return st;
                any_active = true;
            }
        }
        if (!any_active && q->next_off >= q->count) {
            bool idle = true;
            for (int s = 0; s < ZS_COMM_SLOTS; s++)
                idle = idle && !q->slot[s].active;
            if (idle)
                return ZS_OK; /* phase finished */
        }
        if (!block)
            return ZS_OK;
    }
}

static bool rs_finished(const struct zs_comm_req *q)
{
    for (int s = 0; s < ZS_COMM_SLOTS; s++)
        if (q->slot[s].active)
            return false;
    return q->next_off >= q->count;
}

/* ---------------------------------------------------------------- all-gather */

static zs_status ag_start(struct zs_comm *c, struct zs_comm_req *q, uint32_t seq)
{
    int32_t n = c->size, r = c->rank;
    int64_t pieces = (q->count + ZS_COMM_AG_PIECE - 1) / ZS_COMM_AG_PIECE;
    int k = 0;

    if (n == 1 || q->count == 0)
        return ZS_OK;
    q->agr = calloc((size_t)(2 * (n - 1) * pieces), sizeof(MPI_Request));
    if (!q->agr)
        return zs_fail(ZS_ERR_NOMEM, "comm: out of memory");
    for (int64_t p = 0; p < pieces; p++) {
        int64_t off = p * ZS_COMM_AG_PIECE;
        int len = (int)(q->count - off < ZS_COMM_AG_PIECE ? q->count - off : ZS_COMM_AG_PIECE);
        int tag = piece_tag(c, seq, (int32_t)p);

        for (int32_t j = 0; j < n; j++) {
            if (j == r)
                continue;
            int rc = MPI_Irecv(q->gbuf + (size_t)j * (size_t)q->count + (size_t)off, len, MPI_FLOAT, j, tag,
                               c->comm, &q->agr[k++]);
            if (rc != MPI_SUCCESS)
                return mpi_fail(rc, "all-gather receive", j);
            rc = MPI_Isend(q->gbuf + (size_t)r * (size_t)q->count + (size_t)off, len, MPI_FLOAT, j, tag,
                           c->comm, &q->agr[k++]);
            if (rc != MPI_SUCCESS)
                return mpi_fail(rc, "all-gather send", j);
        }
    }
    q->nagr = k;
    return ZS_OK;
}

static zs_status ag_progress(struct zs_comm *c, struct zs_comm_req *q, bool block, bool *done)
{
    int flag = 1, rc;

    (void)c;
    if (q->nagr > 0) {
        rc = block ? MPI_Waitall(q->nagr, q->agr, MPI_STATUSES_IGNORE)
                   : MPI_Testall(q->nagr, q->agr, &flag, MPI_STATUSES_IGNORE);
        if (rc != MPI_SUCCESS)
            return mpi_fail(rc, "all-gather", -1);
    }
    *done = flag;
    return ZS_OK;
}

/* ---------------------------------------------------------------- request life cycle */

static struct zs_comm_req *req_new(struct zs_comm *c, enum req_kind kind, int64_t count)
{
    struct zs_comm_req *q = calloc(1, sizeof(*q));

    if (!q)
        return NULL;
    q->kind = kind;
    q->count = count;
    q->seq = c->seq;
    c->seq += kind == REQ_AR ? 2 : 1;
    q->next = c->active;
    c->active = q;
    return q;
}

static void req_unlink_free(struct zs_comm *c, struct zs_comm_req *q)
{
    struct zs_comm_req **pp = &c->active;

    while (*pp && *pp != q)
        pp = &(*pp)->next;
    if (*pp)
        *pp = q->next;
    for (int s = 0; s < ZS_COMM_SLOTS; s++) {
        if (q->slot[s].tmp)
            scratch_put(c, q->slot[s].tmp);
        free(q->slot[s].mr);
    }
    free(q->agr);
    free(q);
}

static zs_status req_advance(struct zs_comm *c, struct zs_comm_req *q, bool block)
{
    zs_status st = ZS_OK;
    bool done = false;

    if (q->done || q->err)
        return q->err;
    if (q->kind == REQ_AG || (q->kind == REQ_AR && q->phase == 1)) {
        st = ag_progress(c, q, block, &done);
    } else {
        st = rs_progress(c, q, block);
        if (!st && rs_finished(q)) {
            if (q->kind == REQ_RS) {
                done = true;
            } else {
                q->phase = 1;
                st = ag_start(c, q, q->seq + 1);
                if (!st)
                    st = ag_progress(c, q, block, &done);
            }
        }
    }
    if (st)
        q->err = st;
    q->done = done;
    return st;
}

static zs_status req_launch(struct zs_comm *c, struct zs_comm_req *q, struct zs_comm_req **out)
{
    zs_status st;

    if (q->kind == REQ_AG)
        st = ag_start(c, q, q->seq);
    else if (c->size == 1) {
        for (int64_t i = 0; i < q->count; i++)
            q->out[i] = q->src[i] * q->scale;
        q->done = true;
        st = ZS_OK;
    } else
        st = req_advance(c, q, false);
    if (st) {
        req_unlink_free(c, q);
        return st;
    }
    *out = q;
    return ZS_OK;
}

zs_status zs_comm_reduce_scatter(struct zs_comm *c, const float *buf, float *out, int64_t count, float scale,
                                 struct zs_comm_req **req)
{
    struct zs_comm_req *q = req_new(c, REQ_RS, count);

    if (!q)
        return zs_fail(ZS_ERR_NOMEM, "comm: out of memory");
    q->src = buf;
    q->out = out;
    q->scale = scale;
    return req_launch(c, q, req);
}

zs_status zs_comm_all_gather(struct zs_comm *c, float *buf, int64_t count, struct zs_comm_req **req)
{
    struct zs_comm_req *q = req_new(c, REQ_AG, count);

    if (!q)
        return zs_fail(ZS_ERR_NOMEM, "comm: out of memory");
    q->gbuf = buf;
    return req_launch(c, q, req);
}

zs_status zs_comm_all_reduce(struct zs_comm *c, float *buf, int64_t count, float scale, struct zs_comm_req **req)
{
    struct zs_comm_req *q = req_new(c, REQ_AR, count);

    if (!q)
        return zs_fail(ZS_ERR_NOMEM, "comm: out of memory");
    q->src = buf;
    q->out = buf + (size_t)c->rank * (size_t)count;
    q->gbuf = buf;
    q->scale = scale;
    return req_launch(c, q, req);
}

zs_status zs_comm_progress(struct zs_comm *c)
{
    for (struct zs_comm_req *q = c->active; q; q = q->next) {
        zs_status st = req_advance(c, q, false);
        if (st)
            return st;
    }
    return ZS_OK;
}

zs_status zs_comm_test(struct zs_comm *c, struct zs_comm_req *req, bool *done)
{
    zs_status st = req_advance(c, req, false);

    *done = req->done;
    return st;
}

zs_status zs_comm_wait(struct zs_comm *c, struct zs_comm_req *req)
{
    zs_status st = ZS_OK;

    while (!req->done && !st)
        st = req_advance(c, req, true);
    if (!st)
        st = req->err;
    req_unlink_free(c, req);
    return st;
}

/* ---------------------------------------------------------------- blocking helpers */

zs_status zs_comm_bcast(struct zs_comm *c, void *buf, int64_t bytes, int32_t root)
{
    char *p = buf;

    while (bytes > 0) {
        int len = bytes > (1 << 30) ? (1 << 30) : (int)bytes;
        int rc = MPI_Bcast(p, len, MPI_BYTE, root, c->comm);
        if (rc != MPI_SUCCESS)
            return mpi_fail(rc, "broadcast", root);
        p += len;
        bytes -= len;
    }
    return ZS_OK;
}

zs_status zs_comm_allgather_bytes(struct zs_comm *c, const void *mine, void *all, int32_t bytes)
{
    int rc = MPI_Allgather(mine, bytes, MPI_BYTE, all, bytes, MPI_BYTE, c->comm);

    return rc == MPI_SUCCESS ? ZS_OK : mpi_fail(rc, "all-gather", -1);
}
