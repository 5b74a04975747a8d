/* comm.c - the collectives: reduce-scatter, all-gather and all-reduce on fp32, nonblocking, summed
 * here in rank order so results never depend on the transport. Peers on this rank's node are read
 * straight from the shared heap (zero copy) when the buffer lives there; every other peer is reached by
 * MPI point-to-point in pipelined pieces. Progress is explicit: every engine call tests the requests. */
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "kernels/convert.h" /* defines: zs_cvt_* (16-bit inputs are summed in fp32) */
#include "kernels/copy.h"    /* defines: zs_copy_stream */
#include "comm.h"
#include "comm_impl.h" /* defines: struct zs_comm, struct zs_comm_req, piece_tag, zs_comm_check_progress */
#include "comm/flight.h" /* defines: zs_flight_op_start, zs_flight_op_end, zs_flight_write */
#include "shm.h"

int zs_comm_opts_from_env(struct zs_comm_opts *o, char *err, size_t errlen)
{
    const char *mode = getenv("ZS_COMM"), *fake = getenv("ZS_FAKE_NODE_SIZE"), *tmo = getenv("ZS_TIMEOUT");

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
    if (tmo && *tmo) {
        char *end;
        double v = strtod(tmo, &end);
        if (*end || !(v > 0) || v > 1e9) {
            snprintf(err, errlen, "ZS_TIMEOUT: expected seconds > 0, got '%s'", tmo);
            return -EINVAL;
        }
        o->timeout_s = v;
        o->timeout_env = true;
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
        return zs_comm_mpi_fail(rc, "MPI_Comm_dup", -1);
    }
    MPI_Comm_set_errhandler(c->comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(c->comm, &c->rank);
    MPI_Comm_size(c->comm, &c->size);
    MPI_Comm_get_attr(c->comm, MPI_TAG_UB, &ub, &flag);
    c->tag_ub = (flag && ub && *ub > 0) ? *ub : 32767;
    c->piece = ZS_COMM_PIECE_DEFAULT;
    c->timeout_s = opts->timeout_s > 0 ? opts->timeout_s : ZS_TIMEOUT_DEFAULT;
    c->next_unit = -1;
    c->flight = zs_flight_new(c->rank, c->size, opts->flight_dir);
    zs_flight_set_name(c->flight, opts->name);
    if (env && atoll(env) > 0)
        c->piece = atoll(env);
    zs_comm_hooks_from_env(c);
    st = zs_comm_tags_plan(c);
    if (!st && opts->mode != ZS_COMM_MPI && !(st = zs_shm_init(&c->shm, c->comm, opts->fake_node_size)))
        zs_shm_set_timeout(c->shm, c->timeout_s);
    if (st) {
        zs_flight_free(c->flight);
        MPI_Comm_free(&c->comm);
        free(c);
        return st;
    }
    for (int32_t j = 0; j < c->size; j++)
        c->nremote += zs_comm_is_remote(c, j);
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

static void req_reap_dead(struct zs_comm *c);

void zs_comm_free(struct zs_comm *c)
{
    if (!c)
        return;
    while (c->active)
        zs_comm_wait(c, c->active);
    req_reap_dead(c);
    while (c->free_scratch) {
        struct scratch *s = c->free_scratch;
        c->free_scratch = s->next;
        free(s->data);
        free(s);
    }
    zs_shm_free(c->shm);
    zs_flight_free(c->flight);
    MPI_Comm_free(&c->comm);
    free(c);
}

struct zs_flight *zs_comm_flight(const struct zs_comm *c)
{
    return c ? c->flight : NULL;
}

void zs_comm_flight_dump(struct zs_comm *c, const char *why)
{
    if (c)
        zs_flight_write(c->flight, why);
}


int32_t zs_comm_rank(const struct zs_comm *c) { return c->rank; }
int32_t zs_comm_size(const struct zs_comm *c) { return c->size; }
MPI_Comm zs_comm_mpi(const struct zs_comm *c) { return c->comm; }
const char *zs_comm_describe(const struct zs_comm *c) { return c->desc; }
int32_t zs_comm_local_size(const struct zs_comm *c) { return c->shm ? zs_shm_local_size(c->shm) : 1; }
int32_t zs_comm_local_rank(const struct zs_comm *c) { return c->shm ? zs_shm_local_rank(c->shm) : 0; }

bool zs_comm_broken(const struct zs_comm *c)
{
    return c->broken != ZS_OK;
}

uint64_t zs_comm_scratch_bytes(const struct zs_comm *c)
{
    return c->scratch_bytes;
}

void *zs_comm_alloc_agreed(struct zs_comm *c, size_t bytes, bool local_ok)
{
    void *p = NULL;
    size_t sz = (bytes + 63) / 64 * 64;

    if (c->shm)
        return zs_shm_alloc(c->shm, bytes, local_ok);
    if (!local_ok)
        return NULL;
    if (posix_memalign(&p, 64, sz ? sz : 64)) {
        zs_fail(ZS_ERR_NOMEM, "comm: out of memory for a %zu-byte buffer", bytes);
        return NULL;
    }
    memset(p, 0, sz);
    return p;
}

void *zs_comm_alloc(struct zs_comm *c, size_t bytes)
{
    return zs_comm_alloc_agreed(c, bytes, true);
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

static bool is_local(const struct zs_comm_req *q, int32_t j)
{
    return q->shm && q->peer[j];
}

/* Scratch buffers are pooled for the life of the comm: no allocation per piece after warm-up. */
static struct scratch *scratch_get(struct zs_comm *c)
{
    struct scratch *s = c->free_scratch;
    size_t per = (size_t)c->piece * sizeof(float); /* a piece of fp32, or of half as many int64 */
    size_t bytes = (size_t)(c->size - 1) * (per < sizeof(int64_t) ? sizeof(int64_t) : per);

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
    sl->len = q->count - q->next_off < q->piece ? q->count - q->next_off : q->piece;
    sl->piece = q->next_piece++;
    sl->nmr = 0;
    sl->active = true; /* before posting: a failure part-way must still see what is pending */
    q->next_off += sl->len;
    tag = piece_tag(c, q->seq, sl->piece);
    for (int32_t j = 0; j < n; j++) {
        if (j == r || is_local(q, j))
            continue;
        char *dst = (char *)sl->tmp->data + (size_t)(j < r ? j : j - 1) * (size_t)sl->len * q->esz_in;
        int bytes = (int)((size_t)sl->len * q->esz_in);
        int rc = MPI_Irecv(dst, bytes, MPI_BYTE, j, tag, c->comm, &sl->mr[sl->nmr++]);
        if (rc != MPI_SUCCESS)
            return zs_comm_mpi_fail(rc, "reduce-scatter receive", j);
        rc = MPI_Isend(q->src + ((size_t)j * (size_t)q->count + (size_t)sl->off) * q->esz_in, bytes, MPI_BYTE, j,
                       tag, c->comm, &sl->mr[sl->nmr++]);
        if (rc != MPI_SUCCESS)
            return zs_comm_mpi_fail(rc, "reduce-scatter send", j);
    }
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

/* Where rank j's contribution to this piece is: my own buffer, a local peer's, or the scratch it came into. */
static const char *rs_source(const struct zs_comm *c, const struct zs_comm_req *q, const struct rs_slot *sl, int32_t j)
{
    int32_t r = c->rank;
    size_t chunk = ((size_t)r * (size_t)q->count + (size_t)sl->off) * q->esz_in;

    if (j == r)
        return q->src + chunk;
    if (is_local(q, j))
        return q->peer[j] + chunk;
    return (const char *)sl->tmp->data + (size_t)(j < r ? j : j - 1) * (size_t)sl->len * q->esz_in;
}

/* Integer sums modulo 2^64: any order gives the same bits, so this rank's own chunk is the starting value
 * (in place: already there) and the others are added to the output, a cache-sized block at a time. */
static void rs_sum_piece_i64(struct zs_comm *c, struct zs_comm_req *q, struct rs_slot *sl)
{
    uint64_t *out = (uint64_t *)(void *)(q->out + (size_t)sl->off * sizeof(uint64_t));
    const char *mine = rs_source(c, q, sl, c->rank);

    if ((const char *)out != mine)
        memcpy(out, mine, (size_t)sl->len * sizeof(uint64_t));
    for (int64_t b0 = 0; b0 < sl->len; b0 += ZS_SUM_BLOCK) {
        int64_t bn = sl->len - b0 < ZS_SUM_BLOCK ? sl->len - b0 : ZS_SUM_BLOCK;
        for (int32_t j = 0; j < c->size; j++) {
            if (j == c->rank)
                continue;
            const uint64_t *x = (const uint64_t *)(const void *)(rs_source(c, q, sl, j) + (size_t)b0 * sizeof(uint64_t));
            for (int64_t i = 0; i < bn; i++)
                out[b0 + i] += x[i];
        }
    }
}

/* Rank order, left to right, in fp32, then the scale: the one definition of a ZeroShard reduction.
 * Done in cache-sized blocks, one pass per source, so each pass is a simple vectorizable loop; every
 * element still sees ((x_0 + x_1) + ...) * scale, rounded once to the output type. */
static void rs_sum_piece(struct zs_comm *c, struct zs_comm_req *q, struct rs_slot *sl)
{
    int32_t n = c->size, r = c->rank;
    float acc[ZS_SUM_BLOCK];

    if (q->dt_in == ZS_COMM_INT64) {
        rs_sum_piece_i64(c, q, sl);
        return;
    }
    for (int64_t b0 = 0; b0 < sl->len; b0 += ZS_SUM_BLOCK) {
        int64_t bn = sl->len - b0 < ZS_SUM_BLOCK ? sl->len - b0 : ZS_SUM_BLOCK;
        for (int32_t j = 0; j < n; j++)
            acc_block(acc, rs_source(c, q, sl, j) + (size_t)b0 * q->esz_in, bn, q->dt_in, j == 0);
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
                return zs_comm_mpi_fail(rc, "reduce-scatter", -1);
            if (!flag || (q->shm && !q->posted_seen)) {
                waiting = true;
                continue;
            }
            rs_sum_piece(c, q, sl);
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

static int64_t ag_pieces(const struct zs_comm_req *q)
{
    return (q->count + ZS_COMM_AG_PIECE - 1) / ZS_COMM_AG_PIECE;
}

static zs_status ag_start(struct zs_comm *c, struct zs_comm_req *q, uint64_t seq)
{
    int32_t n = c->size, r = c->rank;
    int64_t pieces = ag_pieces(q);

    if (!q->agr)
        return ZS_OK;
    for (int64_t p = 0; p < pieces; p++) {
        int64_t off = p * ZS_COMM_AG_PIECE;
        int64_t elems = q->count - off < ZS_COMM_AG_PIECE ? q->count - off : ZS_COMM_AG_PIECE;
        int len = (int)((size_t)elems * q->esz_out);
        int tag = piece_tag(c, seq, (int32_t)p);

        for (int32_t j = 0; j < n; j++) {
            if (j == r || is_local(q, j))
                continue;
            int rc = MPI_Irecv(q->gbuf + ((size_t)j * (size_t)q->count + (size_t)off) * q->esz_out, len, MPI_BYTE, j,
                               tag, c->comm, &q->agr[q->nagr++]);
            if (rc != MPI_SUCCESS)
                return zs_comm_mpi_fail(rc, "all-gather receive", j);
            rc = MPI_Isend(q->gbuf + ((size_t)r * (size_t)q->count + (size_t)off) * q->esz_out, len, MPI_BYTE, j, tag,
                           c->comm, &q->agr[q->nagr++]);
            if (rc != MPI_SUCCESS)
                return zs_comm_mpi_fail(rc, "all-gather send", j);
        }
    }
    return ZS_OK;
}

/* Local peers' chunks are copied straight from their buffers once they are posted. */
static zs_status ag_progress(struct zs_comm *c, struct zs_comm_req *q, uint64_t seq, bool block, bool *done)
{
    int flag = 1, rc;

    *done = false;
    if (q->nagr > 0) {
        rc = block && !q->shm ? MPI_Waitall(q->nagr, q->agr, MPI_STATUSES_IGNORE)
                              : MPI_Testall(q->nagr, q->agr, &flag, MPI_STATUSES_IGNORE);
        if (rc != MPI_SUCCESS)
            return zs_comm_mpi_fail(rc, "all-gather", -1);
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
        mpi_peers += j != c->rank && !is_local(q, j);
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
            q->slot[s].tmp = scratch_get(c);
            if (!q->slot[s].mr || !q->slot[s].tmp)
                return zs_fail(ZS_ERR_NOMEM, "comm: out of memory for a %lld-element scratch buffer",
                               (long long)((c->size - 1) * q->piece));
        }
    }
    if (mpi_peers > 0 && q->kind != REQ_RS && q->count > 0) {
        q->agr = requests_new(2 * (size_t)mpi_peers * (size_t)ag_pieces(q));
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
            scratch_put(c, q->slot[s].tmp);
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

static void req_reap_dead(struct zs_comm *c)
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

    zs_watch_start(&w);
    for (uint32_t spins = 1;; spins++) {
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
        relax(spins);
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

static zs_status req_advance(struct zs_comm *c, struct zs_comm_req *q, bool block)
{
    uint64_t ag_seq = q->kind == REQ_AR ? q->seq + 1 : q->seq;
    uint32_t spins = 0;
    zs_status st = ZS_OK;
    bool done;

    if (q->err || q->stage == ST_DONE)
        return q->err;
    if (c->broken) {
        st = zs_comm_broken_fail(c);
        goto out;
    }
    if (q->launched && q->stage != ST_CHECK && (st = fault_progress(c, q)))
        goto out;
    while (q->stage != ST_DONE) {
        switch (q->stage) {
        case ST_CHECK:
            st = zs_comm_check_progress(c, q, &done);
            if (st)
                goto out;
            if (!done)
                goto wait;
            q->posted_seen = q->shm; /* the check saw every local peer post */
            q->stage = q->kind == REQ_AG ? ST_AG_START : ST_RS_RUN;
            if ((st = fault_progress(c, q))) /* here too: else an operation whose check passes and whose */
                goto out;                    /* data is all in finishes in one call, never failing */
            break;
        case ST_RS_RUN:
            st = rs_progress(c, q, block);
            if (st || !rs_finished(q))
                goto out;
            scratch_return(c, q); /* every piece is in: nothing more will be received into it */
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
                zs_shm_post(c->shm, ag_seq, NULL);
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
    if (st) {
        q->err = st;
        if (q->clean) /* agreed by every rank: this operation is over, the comm is fine */
            q->stage = ST_DONE;
        else
            zs_comm_mark_broken(c, st);
    }
    return q->err;
}

static void local_reduce(struct zs_comm_req *q)
{
    float acc[ZS_SUM_BLOCK];

    if (q->dt_in == ZS_COMM_INT64) { /* one rank: the sum is the input */
        memmove(q->out, q->src, (size_t)q->count * sizeof(int64_t));
        return;
    }
    for (int64_t b0 = 0; b0 < q->count; b0 += ZS_SUM_BLOCK) {
        int64_t bn = q->count - b0 < ZS_SUM_BLOCK ? q->count - b0 : ZS_SUM_BLOCK;
        acc_block(acc, q->src + (size_t)b0 * q->esz_in, bn, q->dt_in, true);
        store_block(q->out + (size_t)b0 * q->esz_out, acc, bn, q->scale, q->dt_out);
    }
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
            local_reduce(q);
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

    zs_watch_start(&w);
    for (uint32_t spins = 1;; spins++) {
        st = req_advance(c, req, false);
        if (st || req->stage == ST_DONE)
            break;
        st = zs_comm_progress(c);
        if (st || req->stage == ST_DONE)
            break;
        st = zs_comm_watch(c, &w, req);
        if (st)
            break;
        relax(spins);
    }
    if (req->stage == ST_DONE)
        st = req->err;
    else if (!req->err)
        req->err = st;
    req_retire(c, req);
    return st;
}

/* ---------------------------------------------------------------- blocking helpers */

zs_status zs_comm_bcast(struct zs_comm *c, void *buf, int64_t bytes, int32_t root)
{
    char *p = buf, what[96];

    if (c->broken)
        return zs_comm_broken_fail(c);
    while (bytes > 0) {
        int len = bytes > (1 << 30) ? (1 << 30) : (int)bytes;
        MPI_Request r;
        int rc = MPI_Ibcast(p, len, MPI_BYTE, root, c->comm, &r);
        if (rc != MPI_SUCCESS)
            return zs_comm_mpi_fail(rc, "broadcast", root);
        snprintf(what, sizeof(what), "a broadcast of %d bytes from rank %d", len, root);
        zs_status st = zs_comm_mpi_wait(c, &r, what);
        if (st)
            return st;
        p += len;
        bytes -= len;
    }
    return ZS_OK;
}

/* Through the checked all-gather, on 4-byte words: every rank's share padded to whole words. */
zs_status zs_comm_allgather_bytes(struct zs_comm *c, const void *mine, void *all, int32_t bytes)
{
    int64_t words = ((int64_t)bytes + 3) / 4;
    float *buf = calloc((size_t)(words * c->size), sizeof(float));
    struct zs_comm_req *q = NULL;
    zs_status st;

    if (!buf)
        return zs_fail(ZS_ERR_NOMEM, "comm: out of memory");
    memcpy(buf + (size_t)c->rank * (size_t)words, mine, (size_t)bytes);
    st = zs_comm_all_gather(c, buf, words, &q);
    if (!st)
        st = zs_comm_wait(c, q);
    for (int32_t r = 0; !st && r < c->size; r++)
        memcpy((char *)all + (size_t)r * (size_t)bytes, buf + (size_t)r * (size_t)words, (size_t)bytes);
    if (!c->broken) /* else the network may still write into it: kept, like the request */
        free(buf);
    return st;
}
