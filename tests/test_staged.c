/* test_staged.c - host-staged collectives on device buffers (comm/comm_staged.c) under mpirun: reduce-scatter
 * (fp32, bf16, fp16 in; fp32 or the input dtype out), all-gather and all-reduce give exactly the bits of
 * comm/comm.c's collectives run on host buffers, over sizes that grow the scratch; an operation stays in flight
 * until a later launch, zs_staged_test or zs_staged_finish lands it. `test_staged cpu` runs
 * everywhere (the copies are memcpy); `test_staged cuda` needs a GPU (77 on every rank without one), and
 * its ranks may share one: that is what the transport is for. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "comm/comm_staged.h"
#include "kernels/convert.h" /* defines: zs_cvt_* */

static int32_t rank, size;
static struct zs_device dev;
static struct zs_staged stg;
static struct zs_comm *comm;

static size_t esz(zs_dtype dt) { return dt == ZS_DTYPE_FP32 ? 4 : 2; }

/* Rank r's element i, over a spread of binades so that a changed summation order changes bits. */
static void fill(void *p, zs_dtype dt, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        uint32_t h = (uint32_t)(i * 2654435761u) ^ (uint32_t)(rank + 1) * 0x85ebca6bu;
        float f = ldexpf((float)(h % 1000003u) / 1000003.0f - 0.5f, (int)(h >> 27) - 12);
        if (dt == ZS_DTYPE_FP32)
            ((float *)p)[i] = f;
        else
            ((uint16_t *)p)[i] = dt == ZS_DTYPE_BF16 ? zs_cvt_f32_bf16(f) : zs_cvt_f32_f16(f);
    }
}

static void *up(const void *h, size_t bytes)
{
    void *d = dev.ops->alloc(&dev, bytes);

    if (d && dev.ops->copy(&dev, d, h, bytes, ZS_COPY_H2D, NULL) == ZS_OK &&
        dev.ops->stream_sync(&dev, NULL) == ZS_OK)
        return d;
    CHECK(0, "rank %d: device buffer of %zu bytes: %s", rank, bytes, zs_last_error());
    return d;
}

/* The device buffer d (bytes) equals the host buffer want. */
static void same(const char *what, const void *d, const void *want, size_t bytes)
{
    char *got = malloc(bytes);
    bool ok = got && dev.ops->copy(&dev, got, d, bytes, ZS_COPY_D2H, NULL) == ZS_OK &&
              dev.ops->stream_sync(&dev, NULL) == ZS_OK && !memcmp(got, want, bytes);

    CHECK(ok, "rank %d: %s differs from the host collective", rank, what);
    free(got);
}

static void t_reduce_scatter(zs_dtype in, zs_dtype out, int64_t count)
{
    size_t bi = (size_t)count * (size_t)size * esz(in), bo = (size_t)count * esz(out);
    char *h = malloc(bi), *want = malloc(bo), what[96];
    struct zs_comm_req *req = NULL;
    void *d, *dout;

    fill(h, in, count * size);
    d = up(h, bi);
    dout = dev.ops->alloc(&dev, bo);
    CHECK(zs_comm_reduce_scatter_dt(comm, h, in, want, out, count, 0.5f, &req) == ZS_OK &&
          zs_comm_wait(comm, req) == ZS_OK, "host reduce-scatter: %s", zs_last_error());
    snprintf(what, sizeof(what), "reduce-scatter %s->%s count %lld", zs_dtype_name(in), zs_dtype_name(out),
             (long long)count);
    CHECK(zs_staged_reduce_scatter(&stg, d, in, dout, out, count, 0.5f, NULL, NULL) == ZS_OK &&
          zs_staged_finish(&stg) == ZS_OK, "%s: %s", what, zs_last_error());
    same(what, dout, want, bo);
    dev.ops->free(&dev, d);
    dev.ops->free(&dev, dout);
    free(h);
    free(want);
}

/* all-gather (reduce false) or all-reduce of size chunks of count */
static void t_gather_reduce(zs_dtype dt, int64_t count, bool reduce)
{
    size_t b = (size_t)count * (size_t)size * esz(dt);
    char *h = malloc(b), what[96];
    struct zs_comm_req *req = NULL;
    void *d;
    zs_status st;

    fill(h, dt, count * size);
    d = up(h, b);
    st = reduce ? zs_comm_all_reduce_dt(comm, h, dt, count, 0.25f, &req) : zs_comm_all_gather_dt(comm, h, dt, count, &req);
    CHECK(st == ZS_OK && zs_comm_wait(comm, req) == ZS_OK, "host collective: %s", zs_last_error());
    snprintf(what, sizeof(what), "%s %s count %lld", reduce ? "all-reduce" : "all-gather", zs_dtype_name(dt),
             (long long)count);
    st = reduce ? zs_staged_all_reduce(&stg, d, dt, count, 0.25f, NULL, NULL)
                : zs_staged_all_gather(&stg, d, dt, count, NULL, NULL);
    if (!st)
        st = zs_staged_finish(&stg);
    CHECK(st == ZS_OK, "%s: %s", what, zs_last_error());
    same(what, d, h, b);
    dev.ops->free(&dev, d);
    free(h);
}

/* One operation in flight: a reduce-scatter launched and left; an all-reduce launched after it lands it first
 * (the scratch is shared); zs_staged_test lands the second without blocking once comm.c is done. Both results
 * are comm.c's, each operation's event is recorded when it lands, and the counters say so. */
static void t_in_flight(int64_t count)
{
    size_t bi = (size_t)count * (size_t)size * 4, bo = (size_t)count * 4;
    char *h = malloc(bi), *want_rs = calloc(1, bo), *want_ar = malloc(bi);
    struct zs_comm_req *req = NULL;
    struct zs_dev_event *ev[2] = { NULL, NULL };
    uint64_t started = stg.started, finished = stg.finished;
    bool landed = false, done = false;
    void *d, *dout, *d2;
    zs_status st;

    fill(h, ZS_DTYPE_FP32, count * size);
    d = up(h, bi);
    d2 = up(h, bi);
    dout = up(want_rs, bo); /* whatever bytes: checked only after landing */
    memcpy(want_ar, h, bi);
    CHECK(zs_comm_reduce_scatter_dt(comm, h, ZS_DTYPE_FP32, want_rs, ZS_DTYPE_FP32, count, 0.5f, &req) == ZS_OK &&
          zs_comm_wait(comm, req) == ZS_OK, "host reduce-scatter: %s", zs_last_error());
    CHECK(zs_comm_all_reduce_dt(comm, want_ar, ZS_DTYPE_FP32, count, 0.25f, &req) == ZS_OK &&
          zs_comm_wait(comm, req) == ZS_OK, "host all-reduce: %s", zs_last_error());
    st = dev.ops->event_create(&dev, &ev[0]);
    if (!st)
        st = dev.ops->event_create(&dev, &ev[1]);
    if (!st)
        st = zs_staged_reduce_scatter(&stg, d, ZS_DTYPE_FP32, dout, ZS_DTYPE_FP32, count, 0.5f, NULL, ev[0]);
    CHECK(!st && stg.busy && stg.started == started + 1 && stg.finished == finished,
          "rank %d: in flight: the reduce-scatter did not stay in flight (%s)", rank, st ? zs_last_error() : "counters");
    if (!st)
        st = zs_staged_all_reduce(&stg, d2, ZS_DTYPE_FP32, count, 0.25f, NULL, ev[1]);
    CHECK(!st && stg.busy && stg.started == started + 2 && stg.finished == finished + 1,
          "rank %d: in flight: the second launch did not land the first (%s)", rank, st ? zs_last_error() : "counters");
    for (int spin = 0; !st && !landed && spin < 100000000; spin++)
        st = zs_staged_test(&stg, &landed);
    CHECK(!st && landed && !stg.busy && stg.finished == finished + 2, "rank %d: in flight: zs_staged_test did not "
          "land the all-reduce (%s)", rank, st ? zs_last_error() : "not landed");
    if (!st)
        st = dev.ops->stream_wait(&dev, NULL, ev[1]);
    if (!st)
        st = dev.ops->event_query(&dev, ev[0], &done);
    CHECK(!st && done, "rank %d: in flight: the first operation's event: %s", rank, st ? zs_last_error() : "not done");
    same("in flight: reduce-scatter", dout, want_rs, bo);
    same("in flight: all-reduce", d2, want_ar, bi);
    for (int k = 0; k < 2; k++)
        if (ev[k])
            dev.ops->event_free(&dev, ev[k]);
    dev.ops->free(&dev, d);
    dev.ops->free(&dev, d2);
    dev.ops->free(&dev, dout);
    free(h);
    free(want_rs);
    free(want_ar);
}

int main(int argc, char **argv)
{
    const char *name = argc > 1 ? argv[1] : "cpu";
    const zs_dtype dts[] = { ZS_DTYPE_FP32, ZS_DTYPE_BF16, ZS_DTYPE_FP16 };
    int opened, all = 0, fails, any = 0;

    MPI_Init(&argc, &argv);
    if (zs_comm_init(&comm, MPI_COMM_WORLD, NULL)) {
        printf("FAIL: zs_comm_init: %s\n", zs_last_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    rank = zs_comm_rank(comm);
    size = zs_comm_size(comm);
    opened = zs_device_open(&dev, name, "test_staged", NULL, ZS_KPATH_SCALAR, zs_comm_local_rank(comm),
                            zs_comm_local_size(comm)) == ZS_OK;
    MPI_Allreduce(&opened, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!all) {
        if (rank == 0)
            printf("SKIP: the %s device did not open on every rank (here: %s)\n", name,
                   opened ? "opened" : zs_last_error());
        if (opened)
            zs_device_close(&dev);
        zs_comm_free(comm);
        MPI_Finalize();
        return 77;
    }
    zs_staged_init(&stg, comm, &dev);
    for (int64_t count = 1; count <= 40000; count *= 37) /* 1, 37, 1369, 50653 > 40000 stops: 3 sizes */
        for (size_t a = 0; a < 3; a++) {
            t_reduce_scatter(dts[a], ZS_DTYPE_FP32, count);
            t_reduce_scatter(dts[a], dts[a], count);
            t_gather_reduce(dts[a], count, false);
            t_gather_reduce(dts[a], count, true);
        }
    t_in_flight(1369);
    zs_staged_free(&stg);
    zs_device_close(&dev);
    zs_comm_free(comm);
    fails = zs_test_fail;
    MPI_Allreduce(&fails, &any, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Finalize();
    if (rank != 0)
        return any ? 1 : 0;
    return any ? (zs_test_summary("test_staged"), 1) : zs_test_summary("test_staged");
}
