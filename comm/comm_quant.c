/* comm_quant.c - comm_quant.h's hierarchical quantized collectives: the layout check, the two sub-communicators,
 * and each operation as a nonblocking first phase and a wait that runs the rest. */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "comm.h"
#include "comm_impl.h"       /* defines: struct zs_comm (its timeout), zs_comm_count */
#include "comm_quant.h"
#include "kernels/convert.h" /* defines: zs_cvt_from_f32 */
#include "kernels/quant.h"   /* defines: zs_quantize, zs_dequantize, zs_dequantize_add */

struct zs_qcomm {
    struct zs_comm *parent;
    struct zs_comm *node, *cross; /* NULL on one node */
    int32_t rank, size;
    int32_t L, M;                 /* ranks per node, nodes */
    int32_t l, n;                 /* this rank's local index and node */
    int64_t block;
    bool fail_next;               /* zs_qcomm_fail_next */
};

struct zs_qcomm_req {
    bool rs, plain;
    bool failed;                  /* marked by zs_qcomm_fail_next: this rank cannot take part */
    zs_status first_st;           /* the first phase ended, failed, in its start (first stays NULL) */
    struct zs_comm_req *first;    /* the phase posted at the start */
    zs_dtype dt_in, dt_out;
    int64_t count;
    float scale;
    char *buf, *out;
    float *blob;                  /* all-gather: one quantized chunk per node */
    char *stage;                  /* the node phase's buffer: L chunks of M * count elements */
    float *partial;               /* reduce-scatter: this node's sums of the M chunks of this local index (fp32) */
};

static size_t esz(zs_dtype dt)
{
    return dt == ZS_DTYPE_FP32 ? 4 : 2;
}

/* A quantized chunk on the wire: the block scales, then the int8 values padded to whole 4-byte words. */
static int64_t blob_words(const struct zs_qcomm *qc, int64_t count)
{
    return zs_quant_blocks(count, qc->block) + (count + 3) / 4;
}

static void blob_put(const struct zs_qcomm *qc, float *blob, const void *x, zs_dtype dt, int64_t count)
{
    zs_quantize(x, (int)dt, count, qc->block, (int8_t *)(blob + zs_quant_blocks(count, qc->block)), blob);
}

static const int8_t *blob_q(const struct zs_qcomm *qc, const float *blob, int64_t count)
{
    return (const int8_t *)(blob + zs_quant_blocks(count, qc->block));
}

/* ---------------------------------------------------------------- set-up */

/* Every rank's (local index, local size) must say: nodes of one size, in consecutive blocks of ranks. */
static zs_status layout_check(struct zs_qcomm *qc)
{
    int32_t mine[2] = {zs_comm_local_rank(qc->parent), zs_comm_local_size(qc->parent)};
    int32_t *all = malloc((size_t)qc->size * sizeof(mine));
    MPI_Request r;
    zs_status st;

    if (!all)
        return zs_fail(ZS_ERR_NOMEM, "comm_quant: out of memory");
    if (MPI_Iallgather(mine, 2, MPI_INT32_T, all, 2, MPI_INT32_T, zs_comm_mpi(qc->parent), &r) != MPI_SUCCESS) {
        free(all);
        return zs_fail(ZS_ERR_COMM, "comm_quant: the node layout exchange failed");
    }
    st = zs_mpi_wait_timeout(&r, qc->parent->timeout_s, qc->rank, "the quantized collectives' node layout", NULL);
    for (int32_t j = 0; !st && j < qc->size; j++) {
        int32_t L = all[1];
        if (all[2 * j + 1] != L || all[2 * j] != j % L)
            st = zs_fail(ZS_ERR_UNSUPPORTED, "comm_quant: the quantized collectives need nodes of one size in consecutive "
                         "blocks of ranks (mpirun's by-slot mapping, or ZS_FAKE_NODE_SIZE dividing the world): rank %d "
                         "is local rank %d of a %d-rank node, rank 0's node has %d ranks", j, all[2 * j],
                         all[2 * j + 1], L);
    }
    if (!st) {
        qc->L = mine[1];
        qc->l = mine[0];
        qc->M = qc->size / qc->L;
        qc->n = qc->rank / qc->L;
    }
    free(all);
    return st;
}

static zs_status sub_init(struct zs_qcomm *qc, struct zs_comm **sub, int color, enum zs_comm_mode mode, const char *name)
{
    struct zs_comm_opts o = {.mode = mode, .timeout_s = qc->parent->timeout_s, .name = name};
    MPI_Comm split;
    zs_status st;

    if (MPI_Comm_split(zs_comm_mpi(qc->parent), color, qc->rank, &split) != MPI_SUCCESS)
        return zs_fail(ZS_ERR_COMM, "comm_quant: MPI_Comm_split (%s) failed on rank %d", name, qc->rank);
    st = zs_comm_init(sub, split, &o);
    MPI_Comm_free(&split);
    return st;
}

zs_status zs_qcomm_init(struct zs_qcomm **out, struct zs_comm *parent, int64_t block)
{
    struct zs_qcomm *qc = calloc(1, sizeof(*qc));
    zs_status st;

    *out = NULL;
    if (!qc)
        return zs_fail(ZS_ERR_NOMEM, "comm_quant: out of memory");
    if (block < 0) { /* the same argument on every rank: all refuse alike */
        free(qc);
        return zs_fail(ZS_ERR_INVALID, "comm_quant: block size %lld: need >= 1 (0: the default %d)", (long long)block,
                       ZS_QUANT_BLOCK_DEFAULT);
    }
    qc->parent = parent;
    qc->rank = zs_comm_rank(parent);
    qc->size = zs_comm_size(parent);
    qc->block = block ? block : ZS_QUANT_BLOCK_DEFAULT;
    st = layout_check(qc);
    /* The node's ranks share memory: its comm finds that itself. Across nodes every rank is a node of its own
     * (MPI only, so ranks that a forced layout puts on one machine still count as cross-node traffic). */
    if (!st && qc->M > 1)
        st = sub_init(qc, &qc->node, qc->n, ZS_COMM_AUTO, "qnode");
    if (!st && qc->M > 1)
        st = sub_init(qc, &qc->cross, qc->l, ZS_COMM_MPI, "qcross");
    if (st) {
        zs_qcomm_free(qc);
        return st;
    }
    *out = qc;
    return ZS_OK;
}

void zs_qcomm_free(struct zs_qcomm *qc)
{
    if (!qc)
        return;
    if (qc->node)
        zs_comm_free(qc->node);
    if (qc->cross)
        zs_comm_free(qc->cross);
    free(qc);
}

int32_t zs_qcomm_nodes(const struct zs_qcomm *qc) { return qc->M; }
int32_t zs_qcomm_local_size(const struct zs_qcomm *qc) { return qc->L; }

void zs_qcomm_fail_next(struct zs_qcomm *qc)
{
    qc->fail_next = true;
}

/* ---------------------------------------------------------------- requests */

static zs_status req_new(struct zs_qcomm *qc, bool rs, zs_dtype dt_in, zs_dtype dt_out, int64_t count,
                         struct zs_qcomm_req **out)
{
    struct zs_qcomm_req *q = calloc(1, sizeof(*q));

    *out = NULL;
    if (!q)
        return zs_fail(ZS_ERR_NOMEM, "comm_quant: out of memory");
    if (count < 0 || dt_in < ZS_DTYPE_FP32 || dt_in > ZS_DTYPE_FP16 ||
        (dt_out != ZS_DTYPE_FP32 && dt_out != dt_in)) {
        free(q);
        return zs_fail(ZS_ERR_INVALID, "comm_quant: count %lld, dtypes %d -> %d: need count >= 0, fp32/bf16/fp16 in, "
                       "fp32 or the input's dtype out", (long long)count, (int)dt_in, (int)dt_out);
    }
    if (qc->M > 1 && (uint64_t)qc->M * (uint64_t)blob_words(qc, count) > INT32_MAX) {
        free(q);
        return zs_fail(ZS_ERR_INVALID, "comm_quant: %lld elements per chunk: the cross-node exchange holds at most "
                       "2^31 words", (long long)count);
    }
    q->rs = rs;
    q->plain = qc->M == 1;
    q->dt_in = dt_in;
    q->dt_out = dt_out;
    q->count = count;
    *out = q;
    return ZS_OK;
}

/* Frees q; buffers a failed operation may still receive into stay allocated (comm.c's rule). */
static void req_free(struct zs_qcomm *qc, struct zs_qcomm_req *q, zs_status st)
{
    bool pending = st && ((qc->node && zs_comm_broken(qc->node)) || (qc->cross && zs_comm_broken(qc->cross)) ||
                          zs_comm_broken(qc->parent));
    if (!pending) {
        free(q->blob);
        free(q->stage);
        free(q->partial);
    }
    free(q);
}

/* Chunk m * L + l of a buffer of N chunks, and chunk (l, m) of the node phase's L chunks of M * count. */
static char *chunk(const struct zs_qcomm *qc, char *p, int32_t m, int32_t l, int64_t count, size_t es)
{
    return p + ((size_t)m * (size_t)qc->L + (size_t)l) * (size_t)count * es;
}

static char *stage_at(const struct zs_qcomm *qc, char *p, int32_t l, int32_t m, int64_t count, size_t es)
{
    return p + ((size_t)l * (size_t)qc->M + (size_t)m) * (size_t)count * es;
}

zs_status zs_qcomm_all_gather(struct zs_qcomm *qc, void *buf, zs_dtype dt, int64_t count, struct zs_qcomm_req **req)
{
    struct zs_qcomm_req *q;
    int64_t W = blob_words(qc, count);
    zs_status st = req_new(qc, false, dt, dt, count, &q);

    if (st)
        return st;
    q->buf = buf;
    q->failed = qc->fail_next;
    qc->fail_next = false;
    if (q->failed) /* the first phase still goes out, failed: its peers end it with an error instead of waiting */
        zs_comm_fail_next(q->plain ? qc->parent : qc->cross);
    if (q->plain) {
        st = zs_comm_all_gather_dt(qc->parent, buf, dt, count, &q->first);
    } else if (!(q->blob = calloc((size_t)(qc->M * W) + 1, sizeof(float)))) {
        st = zs_fail(ZS_ERR_NOMEM, "comm_quant: out of memory for %d quantized chunks", qc->M);
    } else {
        blob_put(qc, q->blob + (size_t)qc->n * (size_t)W, chunk(qc, buf, qc->n, qc->l, count, esz(dt)), dt, count);
        st = zs_comm_all_gather(qc->cross, q->blob, W, &q->first);
        if (st && !zs_comm_broken(qc->cross)) { /* a verdict every rank reached at once: the wait goes on with it */
            q->first_st = st;
            st = ZS_OK;
        }
    }
    if (st) {
        req_free(qc, q, ZS_OK);
        return st;
    }
    *req = q;
    return ZS_OK;
}

zs_status zs_qcomm_reduce_scatter(struct zs_qcomm *qc, const void *buf, zs_dtype dt_in, void *out, zs_dtype dt_out,
                                  int64_t count, float scale, struct zs_qcomm_req **req)
{
    struct zs_qcomm_req *q;
    size_t es;
    zs_status st = req_new(qc, true, dt_in, dt_out, count, &q);

    if (st)
        return st;
    q->out = out;
    q->scale = scale;
    es = esz(dt_in);
    if (q->plain) {
        st = zs_comm_reduce_scatter_dt(qc->parent, buf, dt_in, out, dt_out, count, scale, &q->first);
    } else if (!(q->stage = malloc((size_t)qc->size * (size_t)count * es + 1)) ||
               !(q->partial = malloc((size_t)qc->M * (size_t)count * sizeof(float) + 1))) {
        st = zs_fail(ZS_ERR_NOMEM, "comm_quant: out of memory for a %lld-element reduce-scatter", (long long)count);
    } else {
        /* local rank l' reduces, for every node m, chunk m * L + l' */
        for (int32_t l = 0; l < qc->L; l++)
            for (int32_t m = 0; m < qc->M; m++)
                memcpy(stage_at(qc, q->stage, l, m, count, es), chunk(qc, (char *)buf, m, l, count, es),
                       (size_t)count * es);
        st = zs_comm_reduce_scatter_dt(qc->node, q->stage, dt_in, q->partial, ZS_DTYPE_FP32, qc->M * count, 1.0f,
                                       &q->first);
    }
    if (st) {
        req_free(qc, q, ZS_OK);
        return st;
    }
    *req = q;
    return ZS_OK;
}

/* The quantized chunks of this local index are in: each at its place in the node phase's column l (this rank's
 * own exact), then the node all-gathers the columns exactly. failed: this rank's first phase ended in an error
 * (its own, or a peer's across nodes): the node phase still goes out, failed, so that the node's other ranks,
 * whose first phase went through, end with an error too instead of waiting for this rank. */
static zs_status ag_finish(struct zs_qcomm *qc, struct zs_qcomm_req *q, bool failed)
{
    size_t es = esz(q->dt_in);
    int64_t count = q->count, W = blob_words(qc, count);
    struct zs_comm_req *r = NULL;
    zs_status st;

    if (!(q->stage = malloc((size_t)qc->size * (size_t)count * es + 1)))
        return zs_fail(ZS_ERR_NOMEM, "comm_quant: out of memory for a %lld-element all-gather", (long long)count);
    for (int32_t m = 0; m < qc->M && !failed; m++) {
        char *dst = stage_at(qc, q->stage, qc->l, m, count, es);
        const float *b = q->blob + (size_t)m * (size_t)W;
        if (m == qc->n)
            memcpy(dst, chunk(qc, q->buf, m, qc->l, count, es), (size_t)count * es);
        else
            zs_dequantize(blob_q(qc, b, count), b, count, qc->block, dst, (int)q->dt_in);
    }
    if (failed)
        zs_comm_fail_next(qc->node);
    st = zs_comm_all_gather_dt(qc->node, q->stage, q->dt_in, qc->M * count, &r);
    if (!st)
        st = zs_comm_wait(qc->node, r);
    for (int32_t l = 0; !st && !failed && l < qc->L; l++)
        for (int32_t m = 0; m < qc->M; m++)
            if (m != qc->n || l != qc->l)
                memcpy(chunk(qc, q->buf, m, l, count, es), stage_at(qc, q->stage, l, m, count, es),
                       (size_t)count * es);
    return st;
}

/* This node's partial sums are in: the ones for other nodes go out quantized (all-to-all over the ranks of this
 * local index), and every node's partial for this rank's chunk is added in node order. */
static zs_status rs_finish(struct zs_qcomm *qc, struct zs_qcomm_req *q)
{
    int64_t count = q->count, W = blob_words(qc, count);
    size_t bytes = (size_t)qc->M * (size_t)W * sizeof(float);
    float *send = calloc(1, bytes + 4), *recv = calloc(1, bytes + 4), *acc = calloc((size_t)count + 1, sizeof(float));
    MPI_Request r;
    zs_status st = ZS_OK;

    if (!send || !recv || !acc) {
        st = zs_fail(ZS_ERR_NOMEM, "comm_quant: out of memory for a %lld-element reduce-scatter", (long long)count);
        goto out;
    }
    for (int32_t m = 0; m < qc->M; m++)
        if (m != qc->n)
            blob_put(qc, send + (size_t)m * (size_t)W, q->partial + (size_t)m * (size_t)count, ZS_DTYPE_FP32, count);
    if (MPI_Ialltoall(send, (int)W, MPI_FLOAT, recv, (int)W, MPI_FLOAT, zs_comm_mpi(qc->cross), &r) != MPI_SUCCESS) {
        st = zs_fail(ZS_ERR_COMM, "comm_quant: the quantized reduce-scatter's cross-node exchange failed on rank %d",
                     qc->rank);
        goto out;
    }
    for (int32_t m = 0; m < qc->M; m++)
        if (m != qc->n)
            zs_comm_count(qc->cross, m, (uint64_t)W * sizeof(float));
    st = zs_mpi_wait_timeout(&r, qc->parent->timeout_s, qc->rank, "the quantized reduce-scatter's cross-node exchange",
                             NULL);
    if (st) {
        send = recv = NULL; /* MPI may still use them */
        goto out;
    }
    for (int32_t m = 0; m < qc->M; m++) {
        const float *b = recv + (size_t)m * (size_t)W, *p = q->partial + (size_t)qc->n * (size_t)count;
        if (m != qc->n)
            zs_dequantize_add(blob_q(qc, b, count), b, count, qc->block, acc);
        else
            for (int64_t i = 0; i < count; i++)
                acc[i] += p[i];
    }
    for (int64_t i = 0; i < count; i++)
        acc[i] *= q->scale;
    zs_cvt_from_f32(q->out, (int)q->dt_out, acc, count);
out:
    free(send);
    free(recv);
    free(acc);
    return st;
}

/* A two-phase all-gather that some rank could not take part in ended, failed and clean, on every rank (ag_finish):
 * a sub-communicator's rank number, or the rank that passed the failure on, would name the wrong rank, so the
 * ranks agree on the lowest one that marked its operation failed and name it in the parent's numbering. */
static zs_status ag_failed(struct zs_qcomm *qc, const struct zs_qcomm_req *q)
{
    int32_t mine = q->failed ? qc->rank : INT32_MAX, first = INT32_MAX;
    MPI_Request r;
    zs_status st;

    if (zs_comm_broken(qc->node) || zs_comm_broken(qc->cross)) /* not agreed by every rank: keep the message */
        return ZS_ERR_COMM;
    if (MPI_Iallreduce(&mine, &first, 1, MPI_INT32_T, MPI_MIN, zs_comm_mpi(qc->parent), &r) != MPI_SUCCESS)
        return zs_fail(ZS_ERR_COMM, "comm_quant: the failed all-gather's exchange failed on rank %d", qc->rank);
    st = zs_mpi_wait_timeout(&r, qc->parent->timeout_s, qc->rank, "the failed quantized all-gather's exchange", NULL);
    if (st)
        return st;
    return zs_fail(ZS_ERR_COMM, "comm_quant: the quantized all-gather (%lld elements per rank) cannot run: rank %d "
                   "could not take part", (long long)q->count, first);
}

zs_status zs_qcomm_wait(struct zs_qcomm *qc, struct zs_qcomm_req *q)
{
    zs_status st = q->first_st ? q->first_st : zs_comm_wait(q->plain ? qc->parent : q->rs ? qc->node : qc->cross,
                                                             q->first);

    if (!q->plain && !q->rs && !(st && zs_comm_broken(qc->cross))) {
        /* a failed first phase still runs the node phase (failed); either phase's clean failure, on every rank */
        bool failed = st || q->failed;
        zs_status fin = ag_finish(qc, q, failed);
        if ((failed || fin) && !zs_comm_broken(qc->node))
            st = ag_failed(qc, q);
        else if (fin)
            st = fin;
    } else if (!st && !q->plain) {
        st = rs_finish(qc, q);
    }
    req_free(qc, q, st);
    return st;
}
