/* comm_pieces.c - the collectives' data path (comm.c describes them): reduce-scatter pieces summed in rank
 * order from local peers' buffers and MPI scratch, all-gather pieces, and the pooled scratch they use. */
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

bool zs_comm_is_local(const struct zs_comm_req *q, int32_t j)
{
    return q->shm && q->peer[j];
}

/* Scratch buffers are pooled for the life of the comm: no allocation per piece after warm-up. */
struct scratch *zs_comm_scratch_get(struct zs_comm *c)
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

void zs_comm_scratch_put(struct zs_comm *c, struct scratch *s)
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
        if (j != r) /* a local peer reads this piece of my chunk j from the shared heap; a remote one gets it */
            zs_comm_count(c, j, (uint64_t)sl->len * q->esz_in);
        if (j == r || zs_comm_is_local(q, j))
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
    if (zs_comm_is_local(q, j))
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
                if (j != r && zs_comm_is_local(q, j)) {
                    memcpy((char *)q->peer[j] + (dst - q->gbuf), dst, (size_t)bn * q->esz_out);
                    zs_comm_count(c, j, (uint64_t)bn * q->esz_out);
                }
    }
}

bool zs_comm_rs_finished(const struct zs_comm_req *q)
{
    for (int s = 0; s < ZS_COMM_SLOTS; s++)
        if (q->slot[s].active)
            return false;
    return q->next_off >= q->count;
}

zs_status zs_comm_rs_progress(struct zs_comm *c, struct zs_comm_req *q, bool block)
{
    struct zs_backoff b = ZS_BACKOFF_INIT;

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
            c->moves++;
            if (q->next_off < q->count) {
                zs_status st = rs_start_piece(c, q, sl);
                if (st)
                    return st;
                waiting = true;
            }
        }
        if (zs_comm_rs_finished(q) || !block)
            return ZS_OK;
        if (waiting)
            zs_backoff(&b, c->moves);
    }
}

/* ---------------------------------------------------------------- all-gather */

int64_t zs_comm_ag_pieces(const struct zs_comm_req *q)
{
    return (q->count + ZS_COMM_AG_PIECE - 1) / ZS_COMM_AG_PIECE;
}

zs_status zs_comm_ag_start(struct zs_comm *c, struct zs_comm_req *q, uint64_t seq)
{
    int32_t n = c->size, r = c->rank;
    int64_t pieces = zs_comm_ag_pieces(q);

    /* Local peers copy my chunk from the shared heap (unless an all-reduce already wrote it into theirs) */
    for (int32_t j = 0; q->shm && !q->copied && j < n; j++)
        if (j != r && zs_comm_is_local(q, j))
            zs_comm_count(c, j, (uint64_t)q->count * q->esz_out);
    if (!q->agr)
        return ZS_OK;
    for (int64_t p = 0; p < pieces; p++) {
        int64_t off = p * ZS_COMM_AG_PIECE;
        int64_t elems = q->count - off < ZS_COMM_AG_PIECE ? q->count - off : ZS_COMM_AG_PIECE;
        int len = (int)((size_t)elems * q->esz_out);
        int tag = piece_tag(c, seq, (int32_t)p);

        for (int32_t j = 0; j < n; j++) {
            if (j == r || zs_comm_is_local(q, j))
                continue;
            int rc = MPI_Irecv(q->gbuf + ((size_t)j * (size_t)q->count + (size_t)off) * q->esz_out, len, MPI_BYTE, j,
                               tag, c->comm, &q->agr[q->nagr++]);
            if (rc != MPI_SUCCESS)
                return zs_comm_mpi_fail(rc, "all-gather receive", j);
            rc = MPI_Isend(q->gbuf + ((size_t)r * (size_t)q->count + (size_t)off) * q->esz_out, len, MPI_BYTE, j, tag,
                           c->comm, &q->agr[q->nagr++]);
            if (rc != MPI_SUCCESS)
                return zs_comm_mpi_fail(rc, "all-gather send", j);
            zs_comm_count(c, j, (uint64_t)len);
        }
    }
    return ZS_OK;
}

/* Local peers' chunks are copied straight from their buffers once they are posted. */
zs_status zs_comm_ag_progress(struct zs_comm *c, struct zs_comm_req *q, uint64_t seq, bool block, bool *done)
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
            if (j != c->rank && zs_comm_is_local(q, j))
                zs_copy_stream(q->gbuf + (size_t)j * (size_t)q->count * q->esz_out,
                               q->peer[j] + (size_t)j * (size_t)q->count * q->esz_out, (size_t)q->count * q->esz_out);
        q->copied = true;
    }
    *done = flag;
    return ZS_OK;
}

/* One rank: the sum is its own input, converted and scaled as a reduction would. */
void zs_comm_local_reduce(struct zs_comm_req *q)
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
