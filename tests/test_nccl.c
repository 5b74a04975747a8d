/* test_nccl.c - the NCCL transport under mpirun, one GPU per rank: the ordered reduce-scatter gives
 * comm/comm.c's rank-order sums bit for bit (fp32, bf16, fp16 in; fp32 or the input dtype out; in place
 * too), all-gather moves every chunk exactly, all-reduce is the two of them, and the nccl mode's own sum
 * is close (fp32, and 16-bit inputs summed in fp32). Exits 77 (skip) on every rank when a rank sees no GPU
 * or ranks would have to share one. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "comm/comm_nccl.h"
#include "kernels/convert.h" /* defines: zs_cvt_* */
#include "device/device.h"

static int32_t rank, size;

/* Rank j's element i: magnitudes spread over many binades, so the summation order shows in the bits. */
static float value(int32_t j, int64_t i)
{
    uint64_t h = (uint64_t)(j + 1) * 0x9e3779b97f4a7c15ULL ^ (uint64_t)i * 0xbf58476d1ce4e5b9ULL;
    h ^= h >> 31;
    h *= 0x94d049bb133111ebULL;
    h ^= h >> 29;
    return ldexpf((float)(h & 0xffffff) / 16777216.0f - 0.5f, (int)((h >> 24) % 24) - 12);
}

static size_t esz(zs_dtype dt)
{
    return dt == ZS_DTYPE_FP32 ? 4 : 2;
}

static void put(void *p, int64_t i, zs_dtype dt, float f)
{
    if (dt == ZS_DTYPE_FP32)
        ((float *)p)[i] = f;
    else
        ((uint16_t *)p)[i] = dt == ZS_DTYPE_BF16 ? zs_cvt_f32_bf16(f) : zs_cvt_f32_f16(f);
}

static float get(const void *p, int64_t i, zs_dtype dt)
{
    if (dt == ZS_DTYPE_FP32)
        return ((const float *)p)[i];
    return dt == ZS_DTYPE_BF16 ? zs_cvt_bf16_f32(((const uint16_t *)p)[i]) : zs_cvt_f16_f32(((const uint16_t *)p)[i]);
}

/* Rank j's input buffer: size chunks of count elements of dt. */
static void fill(void *h, int32_t j, zs_dtype dt, int64_t count)
{
    for (int64_t i = 0; i < (int64_t)size * count; i++)
        put(h, i, dt, value(j, i));
}

/* comm/comm.c's definition: rank 0's value, the others added in rank order, the scale, one rounding. */
static void reference(void *want, zs_dtype dt_in, zs_dtype dt_out, int64_t count, float scale)
{
    void *h = malloc((size_t)size * (size_t)count * esz(dt_in) + 8);
    float *acc = malloc((size_t)count * sizeof(float) + 8);

    for (int32_t j = 0; j < size; j++) {
        fill(h, j, dt_in, count);
        for (int64_t i = 0; i < count; i++) {
            float x = get(h, (int64_t)rank * count + i, dt_in);
            acc[i] = j == 0 ? x : acc[i] + x;
        }
    }
    for (int64_t i = 0; i < count; i++)
        put(want, i, dt_out, acc[i] * scale);
    free(h);
    free(acc);
}

static struct zs_device dev;

static void t_reduce_scatter(struct zs_nccl *n, zs_dtype dt_in, zs_dtype dt_out, int64_t count, bool in_place)
{
    size_t in_bytes = (size_t)size * (size_t)count * esz(dt_in), out_bytes = (size_t)count * esz(dt_out);
    void *h = malloc(in_bytes + 8), *want = malloc(out_bytes + 8), *got = malloc(out_bytes + 8);
    void *d = dev.ops->alloc(&dev, in_bytes), *dout = in_place ? NULL : dev.ops->alloc(&dev, out_bytes);
    void *out = in_place ? (char *)d + (size_t)rank * out_bytes : dout;
    float scale = 1.0f / (float)(size * 3);
    zs_status st;

    fill(h, rank, dt_in, count);
    reference(want, dt_in, dt_out, count, scale);
    st = dev.ops->copy(&dev, d, h, in_bytes, ZS_COPY_H2D, NULL);
    if (!st) /* NCCL's stream is not ordered after the default stream's upload (tests/cuda_emu found it) */
        st = dev.ops->stream_sync(&dev, NULL);
    if (!st)
        st = zs_nccl_reduce_scatter(n, d, dt_in, out, dt_out, count, scale, NULL);
    if (!st)
        st = zs_nccl_sync(n);
    if (!st)
        st = dev.ops->copy(&dev, got, out, out_bytes, ZS_COPY_D2H, NULL);
    if (!st)
        st = dev.ops->stream_sync(&dev, NULL);
    CHECK(!st && !memcmp(want, got, out_bytes), "rank %d: ordered reduce-scatter %s -> %s, count %lld%s: %s", rank,
          zs_dtype_name(dt_in), zs_dtype_name(dt_out), (long long)count, in_place ? " in place" : "",
          st ? zs_last_error() : "differs from comm/comm.c's rank-order sum");
    dev.ops->free(&dev, d);
    if (dout)
        dev.ops->free(&dev, dout);
    free(h);
    free(want);
    free(got);
}

/* All-gather of rank-stamped chunks, then all-reduce against the reduce-scatter's reference. */
static void t_gather_reduce(struct zs_nccl *n, zs_dtype dt, int64_t count)
{
    size_t chunk = (size_t)count * esz(dt), all = chunk * (size_t)size;
    void *h = malloc(all + 8), *got = malloc(all + 8), *want = malloc(chunk + 8);
    void *d = dev.ops->alloc(&dev, all);
    bool same = true;
    zs_status st;

    for (int32_t j = 0; j < size; j++)
        for (int64_t i = 0; i < count; i++)
            put(h, (int64_t)j * count + i, dt, j == rank ? value(j, i) : 0.0f);
    st = dev.ops->copy(&dev, d, h, all, ZS_COPY_H2D, NULL);
    if (!st)
        st = dev.ops->stream_sync(&dev, NULL);
    if (!st)
        st = zs_nccl_all_gather(n, d, dt, count, NULL);
    if (!st)
        st = zs_nccl_sync(n);
    if (!st)
        st = dev.ops->copy(&dev, got, d, all, ZS_COPY_D2H, NULL);
    dev.ops->stream_sync(&dev, NULL);
    for (int32_t j = 0; !st && j < size; j++)
        for (int64_t i = 0; i < count; i++) {
            unsigned char e[4];
            put(e, 0, dt, value(j, i));
            same = same && !memcmp((char *)got + ((size_t)j * (size_t)count + (size_t)i) * esz(dt), e, esz(dt));
        }
    CHECK(!st && same, "rank %d: all-gather %s count %lld: %s", rank, zs_dtype_name(dt), (long long)count,
          st ? zs_last_error() : "a chunk differs from its owner's");

    fill(h, rank, dt, count);
    st = dev.ops->copy(&dev, d, h, all, ZS_COPY_H2D, NULL);
    if (!st)
        st = dev.ops->stream_sync(&dev, NULL);
    if (!st)
        st = zs_nccl_all_reduce(n, d, dt, count, 0.5f, NULL);
    if (!st)
        st = zs_nccl_sync(n);
    if (!st)
        st = dev.ops->copy(&dev, got, d, all, ZS_COPY_D2H, NULL);
    dev.ops->stream_sync(&dev, NULL);
    same = true;
    for (int32_t j = 0; !st && j < size; j++) {
        int32_t saved = rank;
        rank = j; /* rank j's chunk of the sum */
        reference(want, dt, dt, count, 0.5f);
        rank = saved;
        same = same && !memcmp((char *)got + (size_t)j * chunk, want, chunk);
    }
    CHECK(!st && same, "rank %d: all-reduce %s count %lld: %s", rank, zs_dtype_name(dt), (long long)count,
          st ? zs_last_error() : "not the reduce-scatter's sums, gathered");
    dev.ops->free(&dev, d);
    free(h);
    free(got);
    free(want);
}

/* NCCL's own order: close to the rank-order sum, not necessarily equal (16-bit inputs summed in fp32, one
 * rounding to a 16-bit output: within that dtype's half ulp, plus the order's fp32 error). */
static void t_fast(struct zs_nccl *n, zs_dtype dt_in, zs_dtype dt_out, int64_t count)
{
    size_t in_bytes = (size_t)size * (size_t)count * esz(dt_in), out_bytes = (size_t)count * esz(dt_out);
    void *h = malloc(in_bytes), *want = malloc(out_bytes), *got = malloc(out_bytes);
    void *d = dev.ops->alloc(&dev, in_bytes), *out = dev.ops->alloc(&dev, out_bytes);
    double err = 0.0, norm = 0.0, tol = dt_out == ZS_DTYPE_FP32 ? 1e-5 : dt_out == ZS_DTYPE_BF16 ? 1e-2 : 2e-3;
    zs_status st;

    fill(h, rank, dt_in, count);
    reference(want, dt_in, dt_out, count, 0.25f);
    st = dev.ops->copy(&dev, d, h, in_bytes, ZS_COPY_H2D, NULL);
    dev.ops->stream_sync(&dev, NULL);
    if (!st)
        st = zs_nccl_reduce_scatter(n, d, dt_in, out, dt_out, count, 0.25f, NULL);
    if (!st)
        st = zs_nccl_sync(n);
    if (!st)
        st = dev.ops->copy(&dev, got, out, out_bytes, ZS_COPY_D2H, NULL);
    dev.ops->stream_sync(&dev, NULL);
    for (int64_t i = 0; !st && i < count; i++) {
        double g = get(got, i, dt_out), w = get(want, i, dt_out);
        err += (g - w) * (g - w);
        norm += w * w;
    }
    CHECK(!st && sqrt(err) <= tol * sqrt(norm), "rank %d: nccl-mode reduce-scatter %s->%s: %s (relative error %g)",
          rank, zs_dtype_name(dt_in), zs_dtype_name(dt_out), st ? zs_last_error() : "too far from the rank-order sum",
          norm > 0 ? sqrt(err / norm) : 0.0);
    dev.ops->free(&dev, d);
    dev.ops->free(&dev, out);
    free(h);
    free(want);
    free(got);
}

int main(int argc, char **argv)
{
    static const int64_t counts[] = { 1, 1000, 70001 };
    static const zs_dtype dts[] = { ZS_DTYPE_FP32, ZS_DTYPE_BF16, ZS_DTYPE_FP16 };
    int32_t local_rank, local_size, gpus = zs_device_cuda_ops.count(), skip, any_skip;
    struct zs_nccl *ordered = NULL, *fast = NULL;
    MPI_Comm node;
    int fails;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &local_rank);
    MPI_Comm_size(node, &local_size);
    MPI_Comm_free(&node);
    skip = gpus <= 0 ? 1 : local_size > gpus ? 2 : 0;
    MPI_Allreduce(&skip, &any_skip, 1, MPI_INT32_T, MPI_MAX, MPI_COMM_WORLD);
    if (any_skip) {
        if (rank == 0)
            printf("SKIP: %s\n", any_skip == 1 ? "a rank sees no GPU (no GPU, no driver, or no CUDA backend)"
                                               : "fewer GPUs than ranks on a node: NCCL needs one GPU per rank");
        MPI_Finalize();
        return 77;
    }
    if (zs_device_open(&dev, "cuda", "test_nccl", NULL, ZS_KPATH_SCALAR, local_rank, local_size) ||
        zs_nccl_init(&ordered, MPI_COMM_WORLD, ZS_NCCL_ORDERED, NULL) ||
        zs_nccl_init(&fast, MPI_COMM_WORLD, ZS_NCCL_FAST, NULL)) {
        printf("FAIL: rank %d: set-up: %s\n", rank, zs_last_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++)
        for (size_t t = 0; t < sizeof(dts) / sizeof(dts[0]); t++) {
            t_reduce_scatter(ordered, dts[t], ZS_DTYPE_FP32, counts[c], false);
            t_reduce_scatter(ordered, dts[t], dts[t], counts[c], false);
            t_reduce_scatter(ordered, dts[t], dts[t], counts[c], true);
            t_gather_reduce(ordered, dts[t], counts[c]);
        }
    t_fast(fast, ZS_DTYPE_FP32, ZS_DTYPE_FP32, 70001);
    t_fast(fast, ZS_DTYPE_BF16, ZS_DTYPE_FP32, 70001);
    t_fast(fast, ZS_DTYPE_BF16, ZS_DTYPE_BF16, 70001);
    t_fast(fast, ZS_DTYPE_FP16, ZS_DTYPE_FP16, 1000);
    zs_nccl_free(fast);
    zs_nccl_free(ordered);
    zs_device_close(&dev);
    MPI_Allreduce(&zs_test_fail, &fails, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0)
        printf("nccl: %d ranks, rank 0: %d passed, %d failed (all ranks: %d failed)\n", size, zs_test_pass,
               zs_test_fail, fails);
    MPI_Finalize();
    return fails ? 1 : 0;
}
