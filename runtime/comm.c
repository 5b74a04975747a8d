/* comm.c - the collectives: reduce-scatter, all-gather and all-reduce on fp32, nonblocking, summed
 * here in rank order so results never depend on the transport. Peers on this rank's node are read
 * straight from the shared heap (zero copy) when the buffer lives there; every other peer is reached by
 * MPI point-to-point in pipelined pieces. Progress is explicit: every engine call tests the requests. */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "convert.h" /* defines: zs_cvt_* (16-bit inputs are summed in fp32) */
#include "copy.h"    /* defines: zs_copy_stream */
#include "error.h"
#include "shm.h"

#define ZS_COMM_PIECE_DEFAULT (1 << 18) /* elements per peer per piece: 1 MiB of fp32 */
#define ZS_COMM_AG_PIECE (1 << 24)      /* all-gather messages stay well inside int counts */
#define ZS_COMM_SLOTS 2                 /* reduce-scatter pieces in flight per request */
#define ZS_TAG_PIECES 4096
#define ZS_MAX_IN_FLIGHT (ZS_SHM_FLAG_RING / 2)

enum req_kind { REQ_RS, REQ_AG, REQ_AR };
enum req_stage { ST_RS_RUN, ST_RS_DRAIN, ST_AG_START, ST_AG_RUN, ST_AG_DRAIN, ST_DONE };

struct scratch {
    struct scratch *next;
    float *data;
};

struct rs_slot {
    bool active;
    int64_t off, len;
    struct scratch *tmp;
    int32_t piece;
    MPI_Request *mr; /* 2 * remote peers */
    int nmr;
};

struct zs_comm_req {
    struct zs_comm_req *next;
    enum req_kind kind;
    enum req_stage stage;
    uint32_t seq;          /* tag base and flag index, agreed by all ranks through call order */
    const char *src;       /* reduce-scatter input: N chunks of count elements of dt_in */
    char *out, *gbuf;      /* its output (dt_out); the all-gather buffer (dt_out) */
    zs_dtype dt_in, dt_out;
    size_t esz_in, esz_out;
    int64_t count, next_off;
    int32_t next_piece;
    float scale;
    struct rs_slot slot[ZS_COMM_SLOTS];
    MPI_Request *agr;
    int nagr;
    bool shm;              /* local peers are read from the shared heap */
    bool remote;           /* some peer is reached by MPI */
    bool posted_seen, copied;
    const char **peer;     /* by global rank: that local peer's copy of the buffer, else NULL */
    zs_status err;
};

struct zs_comm {
    MPI_Comm comm;
    int32_t rank, size;
    int64_t piece;
    int tag_mod;
    uint32_t seq;
    int32_t in_flight;
    struct scratch *free_scratch;
    uint64_t scratch_bytes;
    struct zs_comm_req *active;
    struct zs_shm *shm;    /* NULL with the MPI backend */
    char desc[160];
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

int zs_comm_opts_from_env(struct zs_comm_opts *o, char *err, size_t errlen)
{
    const char *mode = getenv("ZS_COMM"), *fake = getenv("ZS_FAKE_NODE_SIZE");

    memset(o, 0, sizeof(*o));
    if (mode && *mode) {
        if (!strcmp(mode, "auto"))
            o->mode = ZS_COMM_AUTO;
        else if (!strcmp(mode, "mpi"))
            o->mode = ZS_COMM_MPI;
        else if (!strcmp(mode, "shm"))
            o->mode = ZS_COMM_SHM;
        else {
            snprintf(err, errlen, "ZS_COMM: unknown backend '%s' (auto, mpi, shm)", mode);
            return -EINVAL;
        }
    }
    if (fake && *fake) {
        char *end;
        long v = strtol(fake, &end, 10);
        if (*end || v < 1 || v > 1 << 20) {
            snprintf(err, errlen, "ZS_FAKE_NODE_SIZE: expected a rank count >= 1, got '%s'", fake);
            return -EINVAL;
        }
        o->fake_node_size = (int32_t)v;
    }
    return 0;
}

zs_status zs_comm_init(struct zs_comm **out, MPI_Comm parent, const struct zs_comm_opts *opts)
{
    struct zs_comm_opts none = {0};
    struct zs_comm *c = calloc(1, sizeof(*c));
    int rc, flag = 0, *ub = NULL;
    const char *env = getenv("ZS_COMM_PIECE");
    zs_status st;

    if (!opts)
        opts = &none;
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
    if (opts->mode != ZS_COMM_MPI) {
        st = zs_shm_init(&c->shm, c->comm, opts->fake_node_size);
        if (st) {
            MPI_Comm_free(&c->comm);
            free(c);
            return st;
        }
    }
    if (!c->shm)
        snprintf(c->desc, sizeof(c->desc), "mpi (point-to-point between all %d ranks)", c->size);
    else if (zs_shm_nodes(c->shm) == 1)
        snprintf(c->desc, sizeof(c->desc), "shm (one node of %d ranks%s)", c->size,
                 opts->fake_node_size ? ", forced" : "");
    else
        snprintf(c->desc, sizeof(c->desc), "shm+mpi (%d nodes%s, shared memory inside, MPI between)",
                 zs_shm_nodes(c->shm), opts->fake_node_size ? " forced by ZS_FAKE_NODE_SIZE" : "");
    *out = c;
    return ZS_OK;
}

void zs_comm_free(struct zs_comm *c)
{
    if (!c)
        return;
    while (c->active)
        zs_comm_wait(c, c->active);
    while (c->free_scratch) {
        struct scratch *s = c->free_scratch;
        c->free_scratch = s->next;
        free(s->data);
        free(s);
    }
    zs_shm_free(c->shm);
    MPI_Comm_free(&c->comm);
    free(c);
}

int32_t zs_comm_rank(const struct zs_comm *c) { return c->rank; }
int32_t zs_comm_size(const struct zs_comm *c) { return c->size; }
MPI_Comm zs_comm_mpi(const struct zs_comm *c) { return c->comm; }
const char *zs_comm_describe(const struct zs_comm *c) { return c->desc; }
int32_t zs_comm_local_size(const struct zs_comm *c) { return c->shm ? zs_shm_local_size(c->shm) : 1; }
int32_t zs_comm_local_rank(const struct zs_comm *c) { return c->shm ? zs_shm_local_rank(c->shm) : 0; }

uint64_t zs_comm_scratch_bytes(const struct zs_comm *c)
{
    return c->scratch_bytes;
}

void *zs_comm_alloc(struct zs_comm *c, size_t bytes)
{
    void *p = NULL;
    size_t sz = (bytes + 63) / 64 * 64;

    if (c->shm)
        return zs_shm_alloc(c->shm, bytes);
    if (posix_memalign(&p, 64, sz ? sz : 64))
        return NULL;
    memset(p, 0, sz);
    return p;
}

void zs_comm_release(struct zs_comm *c, void *p)
{
    if (!p)
        return;
    if (c->shm)
        zs_shm_release(c->shm, p);
    else
        free(p);
}

/* Waiting on a peer: spin briefly (a small operation finishes in a microsecond, less than a system call),
 * then give the core away, which matters when ranks outnumber cores. */
static void relax(uint32_t spins)
{
    if (spins % 64 == 0)
        sched_yield();
    else
        __builtin_ia32_pause();
}

static int piece_tag(const struct zs_comm *c, uint32_t seq, int32_t piece)
{
    uint64_t t = (uint64_t)seq * ZS_TAG_PIECES + (uint64_t)(piece % ZS_TAG_PIECES);

    return (int)(t % (uint64_t)c->tag_mod);
}

static bool is_local(const struct zs_comm_req *q, int32_t j)
{
    return q->shm && q->peer[j];
}

/* Scratch buffers are pooled for the life of the comm: no allocation per piece after warm-up. */
static struct scratch *scratch_get(struct zs_comm *c)
{
    struct scratch *s = c->free_scratch;
    size_t bytes = (size_t)(c->size - 1) * (size_t)c->piece * sizeof(float); /* fits every dtype */

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
    int32_t n = c->size, r = c->rank;
    int tag;

    sl->off = q->next_off;
    sl->len = q->count - q->next_off < c->piece ? q->count - q->next_off : c->piece;
    sl->piece = q->next_piece++;
    sl->nmr = 0;
    q->next_off += sl->len;
    tag = piece_tag(c, q->seq, sl->piece);
    if (!sl->mr) {
        sl->mr = calloc(2 * (size_t)n + 1, sizeof(MPI_Request));
        if (!sl->mr)
            return zs_fail(ZS_ERR_NOMEM, "comm: out of memory");
    }
    for (int32_t j = 0; j < n; j++) {
        if (j == r || is_local(q, j))
            continue;
        if (!sl->tmp && !(sl->tmp = scratch_get(c)))
            return zs_fail(ZS_ERR_NOMEM, "comm: out of memory for a %lld-element scratch buffer",
                           (long long)((n - 1) * c->piece));
        char *dst = (char *)sl->tmp->data + (size_t)(j < r ? j : j - 1) * (size_t)sl->len * q->esz_in;
        int bytes = (int)((size_t)sl->len * q->esz_in);
        int rc = MPI_Irecv(dst, bytes, MPI_BYTE, j, tag, c->comm, &sl->mr[sl->nmr++]);
        if (rc != MPI_SUCCESS)
            return mpi_fail(rc, "reduce-scatter receive", j);
        rc = MPI_Isend(q->src + ((size_t)j * (size_t)q->count + (size_t)sl->off) * q->esz_in, bytes, MPI_BYTE, j,
                       tag, c->comm, &sl->mr[sl->nmr++]);
        if (rc != MPI_SUCCESS)
            return mpi_fail(rc, "reduce-scatter send", j);
    }
    sl->active = true;
    return ZS_OK;
}

#define ZS_SUM_BLOCK 1024

/* Adds one source block into the accumulator (or starts it), widening 16-bit inputs to fp32. */
static void acc_block(float *acc, const char *src, int64_t n, zs_dtype dt, bool first)
{
    const uint16_t *h = (const uint16_t *)src;
    const float *f = (const float *)src;

    if (dt == ZS_DTYPE_FP32) {
        if (first)
            for (int64_t i = 0; i < n; i++)
                acc[i] = f[i];
        else
            for (int64_t i = 0; i < n; i++)
                acc[i] += f[i];
    } else if (dt == ZS_DTYPE_BF16) {
        if (first)
            for (int64_t i = 0; i < n; i++)
                acc[i] = zs_cvt_bf16_f32(h[i]);
        else
            for (int64_t i = 0; i < n; i++)
                acc[i] += zs_cvt_bf16_f32(h[i]);
    } else {
        if (first)
            for (int64_t i = 0; i < n; i++)
                acc[i] = zs_cvt_f16_f32(h[i]);
        else
            for (int64_t i = 0; i < n; i++)
                acc[i] += zs_cvt_f16_f32(h[i]);
    }
}

static void store_block(char *out, const float *acc, int64_t n, float scale, zs_dtype dt)
{
    uint16_t *h = (uint16_t *)out;
    float *f = (float *)out;

    if (dt == ZS_DTYPE_FP32)
        for (int64_t i = 0; i < n; i++)
            f[i] = acc[i] * scale;
    else if (dt == ZS_DTYPE_BF16)
        for (int64_t i = 0; i < n; i++)
            h[i] = zs_cvt_f32_bf16(acc[i] * scale);
    else
        for (int64_t i = 0; i < n; i++)
            h[i] = zs_cvt_f32_f16(acc[i] * scale);
}

/* Rank order, left to right, in fp32, then the scale: the one definition of a ZeroShard reduction.
 * Done in cache-sized blocks, one pass per source, so each pass is a simple vectorizable loop; every
 * element still sees ((x_0 + x_1) + ...) * scale, rounded once to the output type. */
static void rs_sum_piece(struct zs_comm *c, struct zs_comm_req *q, struct rs_slot *sl)
{
    int32_t n = c->size, r = c->rank;
    size_t chunk = ((size_t)r * (size_t)q->count + (size_t)sl->off) * q->esz_in;
    float acc[ZS_SUM_BLOCK];

    for (int64_t b0 = 0; b0 < sl->len; b0 += ZS_SUM_BLOCK) {
        int64_t bn = sl->len - b0 < ZS_SUM_BLOCK ? sl->len - b0 : ZS_SUM_BLOCK;
        for (int32_t j = 0; j < n; j++) {
            const char *src;
            if (j == r)
                src = q->src + chunk;
            else if (is_local(q, j))
                src = q->peer[j] + chunk;
            else
                src = (const char *)sl->tmp->data + (size_t)(j < r ? j : j - 1) * (size_t)sl->len * q->esz_in;
            acc_block(acc, src + (size_t)b0 * q->esz_in, bn, q->dt_in, j == 0);
        }
        char *dst = q->out + ((size_t)sl->off + (size_t)b0) * q->esz_out;
        store_block(dst, acc, bn, q->scale, q->dt_out);
        /* All-reduce on a node: write the finished block straight into every local peer's buffer too,
         * while it is still in cache, instead of having each peer copy it later. Only this rank reads
         * or writes chunk r of a peer's buffer, and it has finished reading this block. (Streaming
         * stores here measured slower: the block is hot, and a 4 KB stream per peer thrashes.) */
        if (q->kind == REQ_AR && q->shm)
            for (int32_t j = 0; j < n; j++)
                if (j != r && is_local(q, j))
                    memcpy((char *)q->peer[j] + (dst - q->gbuf), dst, (size_t)bn * q->esz_out);
    }
}

static bool rs_finished(const struct zs_comm_req *q)
{
    for (int s = 0; s < ZS_COMM_SLOTS; s++)
        if (q->slot[s].active)
            return false;
    return q->next_off >= q->count;
}

static zs_status rs_progress(struct zs_comm *c, struct zs_comm_req *q, bool block)
{
    for (;;) {
        bool waiting = false;

        if (q->shm && !q->posted_seen)
            q->posted_seen = zs_shm_all_posted(c->shm, q->seq);
        for (int s = 0; s < ZS_COMM_SLOTS; s++) {
            struct rs_slot *sl = &q->slot[s];
            int flag = 1, rc = MPI_SUCCESS;

            if (!sl->active && q->next_off < q->count) {
                zs_status st = rs_start_piece(c, q, sl);
                if (st)
                    return st;
            }
            if (!sl->active)
                continue;
            if (sl->nmr > 0)
                rc = block && !q->shm ? MPI_Waitall(sl->nmr, sl->mr, MPI_STATUSES_IGNORE)
                                      : MPI_Testall(sl->nmr, sl->mr, &flag, MPI_STATUSES_IGNORE);
            if (rc != MPI_SUCCESS)
                return mpi_fail(rc, "reduce-scatter", -1);
            if (!flag || (q->shm && !q->posted_seen)) {
                waiting = true;
                continue;
            }
            rs_sum_piece(c, q, sl);
            if (sl->tmp)
                scratch_put(c, sl->tmp);
            sl->tmp = NULL;
            sl->active = false;
            if (q->next_off < q->count) {
                zs_status st = rs_start_piece(c, q, sl);
                if (st)
                    return st;
                waiting = true;
            }
        }
        if (rs_finished(q) || !block)
            return ZS_OK;
        if (waiting)
            sched_yield();
    }
}

/* ---------------------------------------------------------------- all-gather */

static zs_status ag_start(struct zs_comm *c, struct zs_comm_req *q, uint32_t seq)
{
    int32_t n = c->size, r = c->rank;
    int64_t pieces = (q->count + ZS_COMM_AG_PIECE - 1) / ZS_COMM_AG_PIECE;
    int k = 0;

    if (n == 1 || q->count == 0)
        return ZS_OK;
    q->agr = calloc((size_t)(2 * n * pieces), sizeof(MPI_Request));
    if (!q->agr)
        return zs_fail(ZS_ERR_NOMEM, "comm: out of memory");
    for (int64_t p = 0; p < pieces; p++) {
        int64_t off = p * ZS_COMM_AG_PIECE;
        int64_t elems = q->count - off < ZS_COMM_AG_PIECE ? q->count - off : ZS_COMM_AG_PIECE;
        int len = (int)((size_t)elems * q->esz_out);
        int tag = piece_tag(c, seq, (int32_t)p);

        for (int32_t j = 0; j < n; j++) {
            if (j == r || is_local(q, j))
                continue;
            int rc = MPI_Irecv(q->gbuf + ((size_t)j * (size_t)q->count + (size_t)off) * q->esz_out, len, MPI_BYTE, j,
                               tag, c->comm, &q->agr[k++]);
            if (rc != MPI_SUCCESS)
                return mpi_fail(rc, "all-gather receive", j);
            rc = MPI_Isend(q->gbuf + ((size_t)r * (size_t)q->count + (size_t)off) * q->esz_out, len, MPI_BYTE, j, tag,
                           c->comm, &q->agr[k++]);
            if (rc != MPI_SUCCESS)
                return mpi_fail(rc, "all-gather send", j);
        }
    }
    q->nagr = k;
    return ZS_OK;
}

/* Local peers' chunks are copied straight from their buffers once they are posted. */
static zs_status ag_progress(struct zs_comm *c, struct zs_comm_req *q, uint32_t seq, bool block, bool *done)
{
    int flag = 1, rc;

    *done = false;
    if (q->nagr > 0) {
        rc = block && !q->shm ? MPI_Waitall(q->nagr, q->agr, MPI_STATUSES_IGNORE)
                              : MPI_Testall(q->nagr, q->agr, &flag, MPI_STATUSES_IGNORE);
        if (rc != MPI_SUCCESS)
            return mpi_fail(rc, "all-gather", -1);
    }
    if (q->shm && !q->copied) {
        if (!q->posted_seen)
            q->posted_seen = zs_shm_all_posted(c->shm, seq);
        if (!q->posted_seen)
            return ZS_OK;
        for (int32_t j = 0; j < c->size; j++)
            if (j != c->rank && is_local(q, j))
                zs_copy_stream(q->gbuf + (size_t)j * (size_t)q->count * q->esz_out,
                               q->peer[j] + (size_t)j * (size_t)q->count * q->esz_out, (size_t)q->count * q->esz_out);
        q->copied = true;
    }
    *done = flag;
    return ZS_OK;
}

/* ---------------------------------------------------------------- request life cycle */

/* Zero copy needs the buffer in the shared heap; then every local peer's copy is found by offset.
 * The heap is symmetric, so every rank of the node reaches the same verdict. */
static zs_status attach_peers(struct zs_comm *c, struct zs_comm_req *q, const void *buf, size_t esz)
{
    size_t bytes = (size_t)q->count * (size_t)c->size * esz;

    q->remote = c->size > 1;
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
    return ZS_OK;
}

static void req_unlink_free(struct zs_comm *c, struct zs_comm_req *q)
{
    struct zs_comm_req **pp = &c->active;

    while (*pp && *pp != q)
        pp = &(*pp)->next;
    if (*pp) {
        *pp = q->next;
        c->in_flight--;
    }
    for (int s = 0; s < ZS_COMM_SLOTS; s++) {
        if (q->slot[s].tmp)
            scratch_put(c, q->slot[s].tmp);
        free(q->slot[s].mr);
    }
    free(q->agr);
    free(q->peer);
    free(q);
}

static int32_t count_unfinished(const struct zs_comm *c)
{
    int32_t n = 0;

    for (const struct zs_comm_req *q = c->active; q; q = q->next)
        n += q->stage != ST_DONE;
    return n;
}

static zs_status req_new(struct zs_comm *c, enum req_kind kind, int64_t count, const void *buf, zs_dtype dt_in,
                         zs_dtype dt_out, struct zs_comm_req **out)
{
    struct zs_comm_req *q, **tail;
    zs_status st;

    /* The flag ring must never wrap over an unfinished operation: past the limit, finish some first. */
    while (count_unfinished(c) >= ZS_MAX_IN_FLIGHT) {
        st = zs_comm_progress(c);
        if (st)
            return st;
        sched_yield();
    }
    q = calloc(1, sizeof(*q));
    if (!q)
        return zs_fail(ZS_ERR_NOMEM, "comm: out of memory");
    q->kind = kind;
    q->count = count;
    q->seq = c->seq;
    q->dt_in = dt_in;
    q->dt_out = dt_out;
    q->esz_in = dt_in == ZS_DTYPE_FP32 ? 4 : 2;
    q->esz_out = dt_out == ZS_DTYPE_FP32 ? 4 : 2;
    q->stage = kind == REQ_AG ? ST_AG_START : ST_RS_RUN;
    c->seq += kind == REQ_AR ? 2 : 1;
    st = attach_peers(c, q, buf, kind == REQ_AG ? q->esz_out : q->esz_in);
    if (st) {
        free(q);
        return st;
    }
    for (tail = &c->active; *tail; tail = &(*tail)->next)
        ;
    *tail = q; /* oldest first */
    c->in_flight++;
    *out = q;
    return ZS_OK;
}

static zs_status req_advance(struct zs_comm *c, struct zs_comm_req *q, bool block)
{
    uint32_t ag_seq = q->kind == REQ_AR ? q->seq + 1 : q->seq, spins = 0;
    zs_status st = ZS_OK;
    bool done;

    while (!q->err && q->stage != ST_DONE) {
        switch (q->stage) {
        case ST_RS_RUN:
            st = rs_progress(c, q, block);
            if (st || !rs_finished(q))
                goto out;
            if (q->shm)
                zs_shm_done(c->shm, q->seq);
            q->stage = ST_RS_DRAIN;
            break;
        case ST_RS_DRAIN: /* peers must be done reading my buffer before anything writes it again */
            if (q->shm && !zs_shm_all_done(c->shm, q->seq))
                goto wait;
            q->stage = q->kind == REQ_RS ? ST_DONE : ST_AG_START;
            q->posted_seen = false;
            q->copied = q->kind == REQ_AR && q->shm; /* local peers already wrote their chunks here */
            if (q->copied && !q->remote) /* and they are all done: nothing left to gather */
                q->stage = ST_DONE;
            break;
        case ST_AG_START:
            if (q->shm)
                zs_shm_post(c->shm, ag_seq);
            st = ag_start(c, q, ag_seq);
            if (st)
                goto out;
            q->stage = ST_AG_RUN;
            break;
        case ST_AG_RUN:
            st = ag_progress(c, q, ag_seq, block, &done);
            if (st)
                goto out;
            if (!done)
                goto wait;
            if (q->shm)
                zs_shm_done(c->shm, ag_seq);
            q->stage = ST_AG_DRAIN;
            break;
        case ST_AG_DRAIN:
            if (q->shm && !zs_shm_all_done(c->shm, ag_seq))
                goto wait;
            q->stage = ST_DONE;
            break;
        case ST_DONE:
            break;
        }
        continue;
    wait:
        if (!block)
            goto out;
        relax(++spins);
    }
out:
    if (st)
        q->err = st;
    return q->err;
}

static zs_status req_launch(struct zs_comm *c, struct zs_comm_req *q, struct zs_comm_req **out)
{
    zs_status st = ZS_OK;

    if (c->size == 1) {
        if (q->kind != REQ_AG) {
            float acc[ZS_SUM_BLOCK];
            for (int64_t b0 = 0; b0 < q->count; b0 += ZS_SUM_BLOCK) {
                int64_t bn = q->count - b0 < ZS_SUM_BLOCK ? q->count - b0 : ZS_SUM_BLOCK;
                acc_block(acc, q->src + (size_t)b0 * q->esz_in, bn, q->dt_in, true);
                store_block(q->out + (size_t)b0 * q->esz_out, acc, bn, q->scale, q->dt_out);
            }
        }
        q->stage = ST_DONE;
    } else {
        if (q->shm) /* my data for this operation is ready: local peers may read it */
            zs_shm_post(c->shm, q->seq);
        st = req_advance(c, q, false);
    }
    if (st) {
        req_unlink_free(c, q);
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
    struct zs_comm_req *q;
    zs_status st;

    if (!valid_dtype(dt_in) || !valid_dtype(dt_out) || (dt_out != dt_in && dt_out != ZS_DTYPE_FP32))
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

    *done = req->stage == ST_DONE;
    return st;
}

/* Completes and frees req. While waiting it advances every request, not just this one: a peer may be
 * waiting on an older operation that needs this rank's next piece or done flag, so waiting on one
 * request alone could deadlock when callers complete operations in different orders. */
zs_status zs_comm_wait(struct zs_comm *c, struct zs_comm_req *req)
{
    zs_status st = ZS_OK;

    for (uint32_t spins = 1;; spins++) {
        st = req_advance(c, req, false);
        if (st || req->stage == ST_DONE)
            break;
        st = zs_comm_progress(c);
        if (st || req->stage == ST_DONE)
            break;
        relax(spins);
    }
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
