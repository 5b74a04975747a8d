/* test_quant_comm.c - comm/comm_quant.h at 4 ranks, in one run: with two forced nodes of 2 the all-gather gives
 * this node's chunks bit for bit and the other node's as kernels/quant.h's dequantize(quantize(chunk)) on every
 * rank, the reduce-scatter stays within the bound the block size implies and repeats its bits, and the traffic
 * counter sees the quantized bytes cross; on one node both are comm.h's exact collectives, bit for bit; a layout
 * of unequal nodes is refused. fp32, bf16 and fp16. And an all-gather one rank marks failed ends with an error on
 * every rank naming that rank, in the world's numbering, and leaves the comms usable. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <mpi.h>

#include "check.h"
#include "comm/comm.h"
#include "comm/comm_quant.h"
#include "kernels/convert.h"
#include "kernels/quant.h"

#define COUNT 1000 /* elements per chunk: three full blocks of 256 and a short one */
#define BLOCK 256

static int rank, world;
static const char *dt_name[] = {"fp32", "bf16", "fp16"};

/* Rank j's value i of chunk c: a spread of signs and magnitudes, different per rank and chunk. */
static float value(int j, int c, int i)
{
    uint32_t h = (uint32_t)(j * 7919 + c * 104729 + i * 2654435761u);
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    return ((float)(h % 20001) - 10000.0f) / 10000.0f * (float)(1 << (h % 5));
}

static size_t esz(int dt) { return dt == 0 ? 4 : 2; }

static double half_ulp(int dt, double v)
{
    int e;
    if (dt == 0)
        return 0;
    frexp(v, &e);
    if (dt == 2 && e < -13)
        e = -13;
    return v == 0 ? (dt == 2 ? ldexp(1, -25) : 0) : ldexp(1, e - (dt == 1 ? 8 : 11) - 1);
}

static struct zs_comm *comm_with(int32_t fake)
{
    struct zs_comm_opts o = {.mode = ZS_COMM_AUTO, .fake_node_size = fake, .timeout_s = 60};
    struct zs_comm *c = NULL;
    zs_status st = zs_comm_init(&c, MPI_COMM_WORLD, &o);
    CHECK(st == ZS_OK, "zs_comm_init (nodes of %d): %s", fake, zs_last_error());
    return c;
}

/* All-gather of dtype dt; L ranks per node (0: one node). */
static void all_gather(struct zs_comm *c, struct zs_qcomm *qc, int dt, int L)
{
    char *buf = calloc((size_t)world * COUNT, esz(dt)), *x = malloc(COUNT * esz(dt)), *want = malloc(COUNT * esz(dt));
    int8_t q[COUNT];
    float s[COUNT / BLOCK + 1];
    struct zs_qcomm_req *req = NULL;
    uint64_t c0, i0, c1, i1;
    int bad = 0;

    for (int i = 0; i < COUNT; i++)
        zs_elem_set(buf, (int64_t)rank * COUNT + i, dt, value(rank, 0, i));
    zs_comm_traffic(&c0, &i0, NULL);
    zs_status st = zs_qcomm_all_gather(qc, buf, dt, COUNT, &req);
    if (!st)
        st = zs_qcomm_wait(qc, req);
    zs_comm_traffic(&c1, &i1, NULL);
    CHECK(st == ZS_OK, "all-gather %s: %s", dt_name[dt], zs_last_error());
    for (int j = 0; j < world; j++) {
        bool same_node = !L || j / L == rank / L;
        for (int i = 0; i < COUNT; i++)
            zs_elem_set(x, i, dt, value(j, 0, i));
        if (same_node) {
            memcpy(want, x, COUNT * esz(dt));
        } else {
            zs_quantize_ref(x, dt, COUNT, BLOCK, q, s);
            zs_dequantize_ref(q, s, COUNT, BLOCK, want, dt);
            for (int i = 0; i < COUNT; i++) { /* and the header's bound, against the original */
                double xi = zs_elem_get(x, i, dt), yi = zs_elem_get(want, i, dt);
                bad += fabs(xi - yi) > s[i / BLOCK] * (0.5 + ldexp(1, -16)) + half_ulp(dt, yi);
            }
        }
        bad += memcmp(buf + (size_t)j * COUNT * esz(dt), want, COUNT * esz(dt)) != 0;
    }
    CHECK(bad == 0, "all-gather %s, nodes of %d, rank %d: %d chunks or elements wrong", dt_name[dt], L, rank, bad);
    if (L && rank == 0) { /* one quantized chunk to each of the other nodes' ranks of my local index */
        int32_t M = world / L;
        uint64_t wire = (uint64_t)(M - 1) * (uint64_t)(zs_quant_blocks(COUNT, BLOCK) * 4 + (COUNT + 3) / 4 * 4);
        uint64_t flat = (uint64_t)(world - L) * COUNT * esz(dt);
        CHECK(c1 - c0 == wire, "all-gather %s: %llu bytes crossed, want %llu", dt_name[dt],
              (unsigned long long)(c1 - c0), (unsigned long long)wire);
        CHECK(i1 - i0 == (uint64_t)(L - 1) * (uint64_t)M * COUNT * esz(dt), "all-gather %s: %llu bytes inside",
              dt_name[dt], (unsigned long long)(i1 - i0));
        printf("all-gather %s, %d elements a rank: %llu bytes cross the node boundary per rank (flat all-gather %llu: "
               "%.2fx less), %llu inside\n", dt_name[dt], COUNT, (unsigned long long)(c1 - c0),
               (unsigned long long)flat, (double)flat / (double)(c1 - c0), (unsigned long long)(i1 - i0));
    }
    free(buf);
    free(x);
    free(want);
}

/* zs_qcomm_fail_next on rank `who` only: every rank's wait fails, naming rank `who` of the world (not its rank
 * in a sub-communicator, nor the rank that passed the failure on), within the comm's timeout rather than at it. */
static void failed_gather(struct zs_qcomm *qc, int who, int L)
{
    float *buf = calloc((size_t)world * COUNT, sizeof(float));
    struct zs_qcomm_req *req = NULL;
    char want[64];

    if (rank == who)
        zs_qcomm_fail_next(qc);
    zs_status st = zs_qcomm_all_gather(qc, buf, ZS_DTYPE_FP32, COUNT, &req);
    if (!st)
        st = zs_qcomm_wait(qc, req);
    snprintf(want, sizeof(want), "rank %d could not take part", who);
    CHECK(st == ZS_ERR_COMM && strstr(zs_last_error(), want), "failed all-gather (rank %d), nodes of %d, rank %d: "
          "status %d, '%s'", who, L, rank, st, zs_last_error());
    if (rank == 0)
        printf("all-gather marked failed on rank %d, nodes of %d: %s\n", who, L, zs_last_error());
    free(buf);
}

/* Reduce-scatter of dt_in to dt_out, twice (the same bits); L ranks per node (0: one node: comm.h's bits). */
static void reduce_scatter(struct zs_comm *c, struct zs_qcomm *qc, int dt_in, int dt_out, int L)
{
    const float scale = 0.25f;
    char *in = malloc((size_t)world * COUNT * esz(dt_in)), *out = malloc(COUNT * 4), *again = malloc(COUNT * 4);
    struct zs_qcomm_req *req = NULL;
    int bad = 0;

    for (int ch = 0; ch < world; ch++)
        for (int i = 0; i < COUNT; i++)
            zs_elem_set(in, (int64_t)ch * COUNT + i, dt_in, value(rank, ch, i));
    for (int pass = 0; pass < 2; pass++) {
        zs_status st = zs_qcomm_reduce_scatter(qc, in, dt_in, pass ? again : out, dt_out, COUNT, scale, &req);
        if (!st)
            st = zs_qcomm_wait(qc, req);
        CHECK(st == ZS_OK, "reduce-scatter %s: %s", dt_name[dt_in], zs_last_error());
    }
    CHECK(memcmp(out, again, COUNT * esz(dt_out)) == 0, "reduce-scatter %s: two runs differ", dt_name[dt_in]);
    if (dt_out == dt_in) { /* in place: the result lands on this rank's own chunk, with the same bits */
        char *inplace = malloc((size_t)world * COUNT * esz(dt_in)), *mine = inplace + (size_t)rank * COUNT * esz(dt_in);
        memcpy(inplace, in, (size_t)world * COUNT * esz(dt_in));
        zs_status st = zs_qcomm_reduce_scatter(qc, inplace, dt_in, mine, dt_out, COUNT, scale, &req);
        if (!st)
            st = zs_qcomm_wait(qc, req);
        CHECK(st == ZS_OK && memcmp(mine, out, COUNT * esz(dt_out)) == 0, "reduce-scatter %s in place: %s",
              dt_name[dt_in], st ? zs_last_error() : "other bits");
        free(inplace);
    }
    if (!L) { /* one node: the exact collective's bits */
        struct zs_comm_req *r = NULL;
        zs_status st = zs_comm_reduce_scatter_dt(c, in, dt_in, again, dt_out, COUNT, scale, &r);
        if (!st)
            st = zs_comm_wait(c, r);
        CHECK(st == ZS_OK && memcmp(out, again, COUNT * esz(dt_out)) == 0, "reduce-scatter %s, one node: not comm.h's",
              dt_name[dt_in]);
    } else {
        int32_t M = world / L;
        float part[COUNT], s[COUNT / BLOCK + 1];
        int8_t q[COUNT];
        double sbound[16][COUNT / BLOCK + 1];
        /* each other node's partial (fp32, in rank order) and its block scales: the bound the blocks imply */
        for (int32_t m = 0; m < M; m++) {
            for (int i = 0; i < COUNT; i++) {
                part[i] = 0;
                for (int l = 0; l < L; l++) {
                    _Alignas(float) char one[4];
                    zs_elem_set(one, 0, dt_in, value(m * L + l, rank, i));
                    part[i] += zs_elem_get(one, 0, dt_in);
                }
            }
            zs_quantize_ref(part, 0, COUNT, BLOCK, q, s);
            for (int b = 0; b < zs_quant_blocks(COUNT, BLOCK); b++)
                sbound[m][b] = m == rank / L ? 0 : s[b] * (0.5 + ldexp(1, -16)) + 127 * s[b] * world * ldexp(1, -23);
        }
        for (int i = 0; i < COUNT; i++) {
            double exact = 0, mag = 0, quant = 0;
            for (int j = 0; j < world; j++) {
                _Alignas(float) char one[4];
                zs_elem_set(one, 0, dt_in, value(j, rank, i));
                exact += zs_elem_get(one, 0, dt_in);
                mag += fabs(zs_elem_get(one, 0, dt_in));
            }
            for (int32_t m = 0; m < M; m++)
                quant += sbound[m][i / BLOCK];
            double got = zs_elem_get(out, i, dt_out);
            double lim = scale * (quant + mag * world * ldexp(1, -23)) + half_ulp(dt_out, got);
            if (fabs(got - scale * exact) > lim && bad++ < 3)
                fprintf(stderr, "rank %d reduce-scatter %s -> %s element %d: %.9g, exact %.9g, bound %.3g\n", rank,
                        dt_name[dt_in], dt_name[dt_out], i, got, scale * exact, lim);
        }
    }
    CHECK(bad == 0, "reduce-scatter %s -> %s, nodes of %d, rank %d: %d elements outside the bound", dt_name[dt_in],
          dt_name[dt_out], L, rank, bad);
    free(in);
    free(out);
    free(again);
}

static void run_layout(int32_t fake)
{
    struct zs_comm *c = comm_with(fake);
    struct zs_qcomm *qc = NULL;

    if (!c)
        return;
    zs_status st = zs_qcomm_init(&qc, c, BLOCK);
    CHECK(st == ZS_OK, "zs_qcomm_init (nodes of %d): %s", fake, zs_last_error());
    if (!st) {
        CHECK(zs_qcomm_nodes(qc) == (fake ? world / fake : 1), "nodes %d", zs_qcomm_nodes(qc));
        failed_gather(qc, world - 1, fake);
        for (int dt = 0; dt < 3; dt++) { /* after it: the comms still work */
            all_gather(c, qc, dt, fake);
            reduce_scatter(c, qc, dt, dt, fake);
        }
        reduce_scatter(c, qc, 1, 0, fake); /* bf16 in, fp32 out */
        zs_qcomm_free(qc);
    }
    zs_comm_free(c);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (world != 4) {
        if (rank == 0)
            printf("test_quant_comm: needs 4 ranks\n");
        MPI_Finalize();
        return 1;
    }
    run_layout(2); /* two nodes of two */
    run_layout(0); /* one node: exact */
    struct zs_comm *c = comm_with(3); /* nodes of 3 and 1: refused, naming the layout */
    struct zs_qcomm *qc = NULL;
    if (c) {
        zs_status st = zs_qcomm_init(&qc, c, BLOCK);
        CHECK(st == ZS_ERR_UNSUPPORTED && strstr(zs_last_error(), "consecutive") && !qc, "unequal nodes: %d %s", st,
              zs_last_error());
        if (rank == 0)
            printf("nodes of 3 and 1: %s\n", zs_last_error());
        zs_comm_free(c);
    }
    int fails = zs_test_fail, all = 0;
    MPI_Allreduce(&fails, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    int rc = rank == 0 ? zs_test_summary("quant_comm") : zs_test_fail != 0;
    MPI_Finalize();
    return all ? 1 : rc;
}
