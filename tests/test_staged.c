/* test_staged.c - host-staged collectives on device buffers (comm/comm_staged.c) under mpirun: reduce-scatter
 * (fp32, bf16, fp16 in; fp32 or the input dtype out), all-gather and all-reduce give exactly the bits of
 * comm/comm.c's collectives run on host buffers, over sizes that grow the scratch. `test_staged cpu` runs
 * everywhere (the copies are memcpy); `test_staged cuda` needs a GPU (77 on every rank without one), and
 * its ranks may share one: that is what the transport is for. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "comm_staged.h"
#include "convert.h" /* defines: zs_cvt_* */

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
    CHECK(zs_staged_reduce_scatter(&stg, d, in, dout, out, count, 0.5f, NULL) == ZS_OK, "%s: %s", what,
          zs_last_error());
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
    st = reduce ? zs_staged_all_reduce(&stg, d, dt, count, 0.25f, NULL) : zs_staged_all_gather(&stg, d, dt, count, NULL);
    CHECK(st == ZS_OK, "%s: %s", what, zs_last_error());
    same(what, d, h, b);
    dev.ops->free(&dev, d);
    free(h);
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
