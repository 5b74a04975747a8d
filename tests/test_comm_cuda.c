/* test_comm_cuda.c - the collectives' CUDA kernels (kernels/comm_cuda.h) against comm/comm.c under mpirun:
 * zs_cuda_sum_ranks, given every rank's chunk of this rank's share, writes the bits comm/comm.c's
 * reduce-scatter gives (fp32, bf16, fp16 in; fp32 or the input dtype out; lengths around the kernels' block),
 * and zs_cuda_scale multiplies as fp32 does. Built against the CUDA emulator (test_comm_cuda_emu, every CI
 * run) and, where the backend is built, against the real one (77 on every rank without a GPU). NaN equals
 * NaN whatever its payload (a GPU writes its own canonical NaN). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <mpi.h>

#include "check.h"
#include "comm/comm.h"      /* defines: zs_comm_init, zs_comm_reduce_scatter_dt, zs_comm_wait */
#include "kernels/comm_cuda.h" /* defines: zs_cuda_sum_ranks, zs_cuda_scale */
#include "kernels/convert.h"   /* defines: zs_cvt_*, zs_float */
#include "device/device.h"

static int32_t rank, size;
static struct zs_device dev;

static size_t esz(zs_dtype dt) { return dt == ZS_DTYPE_FP32 ? 4 : 2; }

static uint64_t mix(uint64_t k)
{
    k = (k ^ (k >> 31)) * 0x7fb5d329728ea185ULL;
    k = (k ^ (k >> 27)) * 0x81dadef4bc2dd44dULL;
    return k ^ (k >> 33);
}

/* Element i of rank j's input for case c: mostly ordinary, some NaN, Inf, subnormal and huge values. */
static float value(uint64_t c, int32_t j, int64_t i)
{
    uint64_t k = mix((c << 40) ^ ((uint64_t)j << 32) ^ (uint64_t)i);

    switch (k % 40) {
    case 0: return NAN;
    case 1: return INFINITY;
    case 2: return zs_float((uint32_t)(k >> 8) & 0x807fffffu);
    case 3: return 3.0e38f;
    default: return (float)((k >> 16) & 0xffffff) / 8388608.0f - 1.0f;
    }
}

static void put(void *p, zs_dtype dt, int64_t i, float v)
{
    if (dt == ZS_DTYPE_FP32)
        ((float *)p)[i] = v;
    else
        ((uint16_t *)p)[i] = dt == ZS_DTYPE_BF16 ? zs_cvt_f32_bf16(v) : zs_cvt_f32_f16(v);
}

static bool same(const void *a, const void *b, zs_dtype dt, int64_t n, int64_t *at)
{
    for (*at = 0; *at < n; (*at)++) {
        float x = zs_elem_get(a, *at, (int)dt), y = zs_elem_get(b, *at, (int)dt);
        if (memcmp((const char *)a + *at * esz(dt), (const char *)b + *at * esz(dt), esz(dt)) && !(x != x && y != y))
            return false;
    }
    return true;
}

static void *dev_put(const void *h, size_t bytes)
{
    void *d = dev.ops->alloc(&dev, bytes);

    if (d && dev.ops->copy(&dev, d, h, bytes, ZS_COPY_H2D, dev.compute))
        return NULL;
    return d;
}

/* This rank's share of the reduce-scatter of count elements per chunk: comm.c on the host, the kernel on
 * the device from the N chunks gathered in rank order. */
static void t_sum_ranks(struct zs_comm *comm, uint64_t c, zs_dtype in, zs_dtype out, int64_t count, float scale)
{
    size_t ci = (size_t)count * esz(in), co = (size_t)count * esz(out);
    char *buf = malloc(ci * (size_t)size), *stage = malloc(ci * (size_t)size), *want = malloc(co), *got = malloc(co);
    void *dstage = NULL, *dout = NULL;
    struct zs_comm_req *req = NULL;
    int64_t at = 0;

    for (int32_t j = 0; j < size; j++)
        for (int64_t i = 0; i < count; i++) {
            put(buf, in, (int64_t)j * count + i, value(c, rank, (int64_t)j * count + i)); /* mine, chunk j */
            put(stage, in, (int64_t)j * count + i, value(c, j, (int64_t)rank * count + i)); /* rank j's, chunk mine */
        }
    CHECK(zs_comm_reduce_scatter_dt(comm, buf, in, want, out, count, scale, &req) == ZS_OK &&
          zs_comm_wait(comm, req) == ZS_OK, "host reduce-scatter: %s", zs_last_error());
    dstage = dev_put(stage, ci * (size_t)size);
    dout = dev.ops->alloc(&dev, co);
    CHECK(dstage && dout, "device allocation");
    if (dstage && dout) {
        int e = zs_cuda_sum_ranks(dstage, (int)in, dout, (int)out, count, size, scale, dev.compute);
        bool ok = !e && !dev.ops->copy(&dev, got, dout, co, ZS_COPY_D2H, dev.compute) &&
                  !dev.ops->stream_sync(&dev, dev.compute);
        CHECK(ok && same(got, want, out, count, &at), "sum_ranks %s -> %s, count %lld, scale %g, %d ranks: error %d, "
              "first difference at element %lld", zs_dtype_name(in), zs_dtype_name(out), (long long)count,
              (double)scale, size, e, (long long)at);
    }
    if (dstage)
        dev.ops->free(&dev, dstage);
    if (dout)
        dev.ops->free(&dev, dout);
    free(buf);
    free(stage);
    free(want);
    free(got);
}

static void t_scale(uint64_t c, int64_t count, float scale)
{
    float *h = malloc((size_t)count * 4), *want = malloc((size_t)count * 4), *got = malloc((size_t)count * 4);
    float *d;
    int64_t at = 0;

    for (int64_t i = 0; i < count; i++) {
        h[i] = value(c, rank, i);
        want[i] = h[i] * scale;
    }
    d = dev_put(h, (size_t)count * 4);
    CHECK(d, "device allocation");
    if (d) {
        int e = zs_cuda_scale(d, count, scale, dev.compute);
        bool ok = !e && !dev.ops->copy(&dev, got, d, (size_t)count * 4, ZS_COPY_D2H, dev.compute) &&
                  !dev.ops->stream_sync(&dev, dev.compute);
        CHECK(ok && same(got, want, ZS_DTYPE_FP32, count, &at), "scale, count %lld: error %d, first difference at %lld",
              (long long)count, e, (long long)at);
        dev.ops->free(&dev, d);
    }
    free(h);
    free(want);
    free(got);
}

int main(int argc, char **argv)
{
    static const int64_t counts[] = { 1, 17, 255, 256, 257, 4099 };
    static const zs_dtype dts[] = { ZS_DTYPE_FP32, ZS_DTYPE_BF16, ZS_DTYPE_FP16 };
    struct zs_comm *comm = NULL;
    int provided, opened, all = 0;
    uint64_t c = 0;

    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (zs_comm_init(&comm, MPI_COMM_WORLD, NULL)) {
        printf("FAIL: zs_comm_init: %s\n", zs_last_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    opened = zs_device_open(&dev, "cuda", "test_comm_cuda", NULL, ZS_KPATH_SCALAR, zs_comm_local_rank(comm),
                            zs_comm_local_size(comm)) == ZS_OK;
    MPI_Allreduce(MPI_IN_PLACE, &opened, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!opened) {
        if (rank == 0)
            printf("SKIP: no CUDA device on some rank: %s\n", zs_last_error());
        zs_device_close(&dev);
        zs_comm_free(comm);
        MPI_Finalize();
        return 77;
    }
    for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]); k++)
        for (int d = 0; d < 3; d++)
            for (int o = 0; o < (dts[d] == ZS_DTYPE_FP32 ? 1 : 2); o++)
                t_sum_ranks(comm, ++c, dts[d], o ? dts[d] : ZS_DTYPE_FP32, counts[k], k % 2 ? 1.0f / 3.0f : 1.0f);
    for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]); k++)
        t_scale(++c, counts[k], 0.125f + (float)k);
    zs_device_close(&dev);
    zs_comm_free(comm);
    MPI_Allreduce(&zs_test_fail, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0)
        zs_test_summary("test_comm_cuda");
    MPI_Finalize();
    return all ? 1 : 0;
}
