/* test_comm.c - collectives against a reference computed locally: every rank regenerates every rank's
 * data, sums it in rank order and compares bit for bit. Sizes are odd, some cross piece boundaries
 * (run it with ZS_COMM_PIECE small), many requests are in flight at once, and every check runs twice:
 * on buffers from zs_comm_alloc (zero copy between ranks of a node) and on plain malloc'd buffers.
 * The backend comes from ZS_COMM / ZS_FAKE_NODE_SIZE. Run under mpirun -np 1..4. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <mpi.h>

#include "check.h"
#include "comm/comm.h"
#include "kernels/convert.h"

static float value(int rank, int64_t i, int op)
{
    uint32_t h = (uint32_t)(rank * 2654435761u) ^ (uint32_t)(i * 40503u) ^ (uint32_t)(op * 97u);
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    return ((float)(h & 0xffffff) / 16777216.0f - 0.5f) * (float)(1 + (i % 7)); /* mixed magnitudes */
}

static void fill(float *buf, int rank, int64_t n, int op)
{
    for (int64_t i = 0; i < n; i++)
        buf[i] = value(rank, i, op);
}

static float reference_sum(int world, int64_t i, int op, float scale)
{
    float acc = value(0, i, op);
    for (int r = 1; r < world; r++)
        acc += value(r, i, op);
    return acc * scale;
}

static int use_heap;

/* A shared-heap block starts on a cache line in every process (a program's BLAS may round differently for a
 * parameter that does not: comm/shm.c). */
static float *tbuf(struct zs_comm *c, int64_t n)
{
    float *p = use_heap ? zs_comm_alloc(c, (size_t)(n + 1) * sizeof(float)) : malloc((size_t)(n + 1) * sizeof(float));

    CHECK(!use_heap || ((uintptr_t)p & 63) == 0, "a shared-heap block of %lld floats at %p: not 64-byte aligned",
          (long long)n + 1, (void *)p);
    return p;
}

static void tfree(struct zs_comm *c, float *p)
{
    if (use_heap)
        zs_comm_release(c, p);
    else
        free(p);
}

static void check_rs(struct zs_comm *c, int64_t count, int in_place, int op)
{
    int rank = zs_comm_rank(c), world = zs_comm_size(c);
    float *buf = tbuf(c, count * world);
    float *out = in_place ? buf + (size_t)rank * (size_t)count : malloc((size_t)(count + 1) * sizeof(float));
    struct zs_comm_req *q = NULL;
    int64_t bad = 0;
    const float scale = 1.0f / (float)world;

    fill(buf, rank, count * world, op);
    CHECK(zs_comm_reduce_scatter(c, buf, out, count, scale, &q) == ZS_OK, "%s", zs_last_error());
    CHECK(zs_comm_wait(c, q) == ZS_OK, "%s", zs_last_error());
    for (int64_t i = 0; i < count; i++) {
        float want = reference_sum(world, (int64_t)rank * count + i, op, scale);
        bad += memcmp(&out[i], &want, sizeof(float)) != 0;
    }
    CHECK(bad == 0, "reduce-scatter count %lld in_place %d heap %d: %lld wrong", (long long)count, in_place, use_heap,
          (long long)bad);
    if (!in_place)
        free(out);
    tfree(c, buf);
}

/* Integers over the whole int64 range, so that the sums wrap: the result is the sum modulo 2^64. */
static uint64_t value64(int rank, int64_t i, int op)
{
    uint64_t z = (uint64_t)rank * 0x9e3779b97f4a7c15ull + (uint64_t)i * 0xbf58476d1ce4e5b9ull + (uint64_t)op;

    z = (z ^ (z >> 31)) * 0x94d049bb133111ebull;
    return z ^ (z >> 29);
}

static void check_i64(struct zs_comm *c, int64_t count, int in_place, int op)
{
    int rank = zs_comm_rank(c), world = zs_comm_size(c);
    int64_t *buf = (int64_t *)(void *)tbuf(c, 2 * count * world + 1);
    int64_t *out = in_place ? buf + (size_t)rank * (size_t)count : malloc((size_t)(count + 1) * sizeof(int64_t));
    struct zs_comm_req *q = NULL;
    int64_t bad = 0;

    for (int64_t i = 0; i < count * world; i++)
        buf[i] = (int64_t)value64(rank, i, op);
    CHECK(zs_comm_reduce_scatter_i64(c, buf, out, count, &q) == ZS_OK, "%s", zs_last_error());
    CHECK(zs_comm_wait(c, q) == ZS_OK, "%s", zs_last_error());
    for (int64_t i = 0; i < count; i++) {
        uint64_t want = 0;
        for (int j = world - 1; j >= 0; j--) /* another order than the comm's: integers do not mind */
            want += value64(j, (int64_t)rank * count + i, op);
        bad += (uint64_t)out[i] != want;
    }
    CHECK(bad == 0, "int64 reduce-scatter count %lld in_place %d heap %d: %lld wrong", (long long)count, in_place,
          use_heap, (long long)bad);
    if (!in_place)
        free(out);
    tfree(c, (float *)(void *)buf);
}

static void check_ag_ar(struct zs_comm *c, int64_t count, int op)
{
    int rank = zs_comm_rank(c), world = zs_comm_size(c);
    int64_t total = count * world, bad = 0;
    float *buf = tbuf(c, total), *two = tbuf(c, total);
    struct zs_comm_req *q = NULL;

    /* all-gather: only my chunk is valid before, every chunk after */
    memset(buf, 0xff, (size_t)total * sizeof(float));
    for (int64_t i = 0; i < count; i++)
        buf[rank * count + i] = value(rank, i, op);
    CHECK(zs_comm_all_gather(c, buf, count, &q) == ZS_OK && zs_comm_wait(c, q) == ZS_OK, "%s", zs_last_error());
    for (int r = 0; r < world; r++)
        for (int64_t i = 0; i < count; i++) {
            float want = value(r, i, op);
            bad += memcmp(&buf[r * count + i], &want, 4) != 0;
        }
    CHECK(bad == 0, "all-gather count %lld: %lld wrong", (long long)count, (long long)bad);

    /* all-reduce equals reduce-scatter followed by all-gather, bit for bit */
    fill(buf, rank, total, op + 1);
    memcpy(two, buf, (size_t)total * sizeof(float));
    CHECK(zs_comm_all_reduce(c, buf, count, 0.5f, &q) == ZS_OK && zs_comm_wait(c, q) == ZS_OK, "%s", zs_last_error());
    CHECK(zs_comm_reduce_scatter(c, two, two + rank * count, count, 0.5f, &q) == ZS_OK && zs_comm_wait(c, q) == ZS_OK,
          "%s", zs_last_error());
    CHECK(zs_comm_all_gather(c, two, count, &q) == ZS_OK && zs_comm_wait(c, q) == ZS_OK, "%s", zs_last_error());
    CHECK(memcmp(buf, two, (size_t)total * sizeof(float)) == 0, "all-reduce != reduce-scatter + all-gather, count %lld",
          (long long)count);
    bad = 0;
    for (int64_t i = 0; i < total; i++) {
        float want = reference_sum(world, i, op + 1, 0.5f);
        bad += memcmp(&buf[i], &want, 4) != 0;
    }
    CHECK(bad == 0, "all-reduce count %lld heap %d: %lld wrong", (long long)count, use_heap, (long long)bad);
    tfree(c, buf);
    tfree(c, two);
}

static uint16_t to16(float f, zs_dtype t) { return t == ZS_DTYPE_BF16 ? zs_cvt_f32_bf16(f) : zs_cvt_f32_f16(f); }
static float from16(uint16_t h, zs_dtype t) { return t == ZS_DTYPE_BF16 ? zs_cvt_bf16_f32(h) : zs_cvt_f16_f32(h); }

/* 16-bit inputs: summed in fp32 in rank order, written as fp32 or rounded back; all-gather and
 * all-reduce of 16-bit data. */
static void check_16bit(struct zs_comm *c, zs_dtype t, int64_t count, int op)
{
    int rank = zs_comm_rank(c), world = zs_comm_size(c);
    int64_t total = count * world, bad = 0;
    uint16_t *buf = (uint16_t *)tbuf(c, total), *h = (uint16_t *)tbuf(c, total);
    float *out = malloc((size_t)(count + 1) * sizeof(float));
    struct zs_comm_req *q = NULL;

    for (int64_t i = 0; i < total; i++)
        buf[i] = to16(value(rank, i, op), t);
    memcpy(h, buf, (size_t)total * 2);
    CHECK(zs_comm_reduce_scatter_dt(c, buf, t, out, ZS_DTYPE_FP32, count, 0.5f, &q) == ZS_OK &&
              zs_comm_wait(c, q) == ZS_OK, "%s", zs_last_error());
    CHECK(zs_comm_reduce_scatter_dt(c, h, t, h + rank * count, t, count, 0.5f, &q) == ZS_OK &&
              zs_comm_wait(c, q) == ZS_OK, "%s", zs_last_error());
    for (int64_t i = 0; i < count; i++) {
        int64_t g = rank * count + i;
        float acc = from16(to16(value(0, g, op), t), t);
        for (int r = 1; r < world; r++)
            acc += from16(to16(value(r, g, op), t), t);
        acc *= 0.5f;
        bad += memcmp(&out[i], &acc, 4) != 0;
        bad += h[g] != to16(acc, t);
    }
    CHECK(bad == 0, "16-bit (%s) reduce-scatter count %lld heap %d: %lld wrong", t == ZS_DTYPE_BF16 ? "bf16" : "fp16",
          (long long)count, use_heap, (long long)bad);
    /* the rounded shards, gathered: every rank ends with every rank's result */
    CHECK(zs_comm_all_gather_dt(c, h, t, count, &q) == ZS_OK && zs_comm_wait(c, q) == ZS_OK, "%s", zs_last_error());
    for (int64_t i = 0; i < total; i++)
        buf[i] = to16(value(rank, i, op), t);
    CHECK(zs_comm_all_reduce_dt(c, buf, t, count, 0.5f, &q) == ZS_OK && zs_comm_wait(c, q) == ZS_OK, "%s",
          zs_last_error());
    CHECK(memcmp(buf, h, (size_t)total * 2) == 0, "16-bit all-reduce != reduce-scatter + all-gather, count %lld",
          (long long)count);
    free(out);
    tfree(c, (float *)buf);
    tfree(c, (float *)h);
}

/* Sixteen reductions in flight, completed in reverse order: no deadlock, no mix-up between them. */
static void check_many_in_flight(struct zs_comm *c)
{
    enum { K = 16 };
    int rank = zs_comm_rank(c), world = zs_comm_size(c);
    float *bufs[K];
    struct zs_comm_req *q[K];
    int64_t bad = 0;

    for (int k = 0; k < K; k++) {
        int64_t count = 1000 + 37 * k + (k % 4) * 300000; /* some span several pieces */
        bufs[k] = tbuf(c, count * world);
        fill(bufs[k], rank, count * world, 100 + k);
        CHECK(zs_comm_reduce_scatter(c, bufs[k], bufs[k] + rank * count, count, 1.0f, &q[k]) == ZS_OK, "%s",
              zs_last_error());
        CHECK(zs_comm_progress(c) == ZS_OK, "%s", zs_last_error());
    }
    for (int k = K - 1; k >= 0; k--) {
        int64_t count = 1000 + 37 * k + (k % 4) * 300000;
        CHECK(zs_comm_wait(c, q[k]) == ZS_OK, "%s", zs_last_error());
        for (int64_t i = 0; i < count; i++) {
            float want = reference_sum(world, rank * count + i, 100 + k, 1.0f);
            bad += memcmp(&bufs[k][rank * count + i], &want, 4) != 0;
        }
    }
    for (int k = 0; k < K; k++) /* the heap is freed in the same order on every rank */
        tfree(c, bufs[k]);
    CHECK(bad == 0, "many in flight (heap %d): %lld wrong", use_heap, (long long)bad);
}

/* The layout this run must have, from its ctest entry: ZS_EXPECT_LAYOUT=BACKEND:NODE, with
 * BACKEND how zs_comm_describe starts ("mpi", "shm" or "shm+mpi") and NODE the ranks per node (the last
 * node may hold fewer). A forced layout (ZS_FAKE_NODE_SIZE) that is parsed but not applied fails here,
 * instead of quietly testing another path. */
static void check_layout(struct zs_comm *c)
{
    const char *e = getenv("ZS_EXPECT_LAYOUT"), *d = zs_comm_describe(c);
    int rank = zs_comm_rank(c), n = zs_comm_size(c), node = 0, nodes = 1;
    char backend[16] = "";

    CHECK(e && sscanf(e, "%15[a-z+]:%d", backend, &node) == 2 && node > 0,
          "ZS_EXPECT_LAYOUT must be BACKEND:RANKS_PER_NODE, got '%s'", e ? e : "(unset)");
    if (node <= 0)
        return;
    int first = rank / node * node, local = n - first < node ? n - first : node;
    size_t bl = strlen(backend);
    CHECK(!strncmp(d, backend, bl) && d[bl] == ' ', "layout: expected the %s backend, the run reports '%s'", backend,
          d);
    CHECK(zs_comm_local_size(c) == local, "layout: rank %d expected %d ranks on its node, the run reports %d (%s)",
          rank, local, (int)zs_comm_local_size(c), d);
    if (!strcmp(backend, "shm+mpi"))
        CHECK(sscanf(d, "shm+mpi (%d nodes", &nodes) == 1 && nodes == (n + node - 1) / node,
              "layout: expected %d nodes, the run reports '%s'", (n + node - 1) / node, d);
}

int main(int argc, char **argv)
{
    static const int64_t counts[] = { 0, 1, 3, 16, 17, 1000, 4099, 300001 };
    struct zs_comm *c = NULL;
    struct zs_comm_opts o;
    char err[256];
    int rank;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    CHECK(zs_comm_opts_from_env(&o, err, sizeof(err)) == 0, "%s", err);
    CHECK(zs_comm_init(&c, MPI_COMM_WORLD, &o) == ZS_OK, "%s", zs_last_error());
    if (rank == 0)
        printf("backend: %s\n", zs_comm_describe(c));
    check_layout(c);
    for (use_heap = 0; use_heap <= 1; use_heap++) {
        for (size_t i = 0; i < sizeof(counts) / sizeof(counts[0]); i++) {
            check_rs(c, counts[i], 0, (int)i);
            check_rs(c, counts[i], 1, (int)i + 50);
            check_ag_ar(c, counts[i], (int)i + 200);
            check_16bit(c, ZS_DTYPE_BF16, counts[i], (int)i + 300);
            check_16bit(c, ZS_DTYPE_FP16, counts[i], (int)i + 400);
            check_i64(c, counts[i], 0, (int)i + 500);
            check_i64(c, counts[i], 1, (int)i + 550);
        }
        check_many_in_flight(c);
    }
    zs_comm_free(c);
    int fails = zs_test_fail, any = 0;
    MPI_Allreduce(&fails, &any, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Finalize();
    if (rank == 0)
        printf("(all ranks: %d failed checks)\n", any);
    return any ? 1 : zs_test_summary("test_comm");
}
