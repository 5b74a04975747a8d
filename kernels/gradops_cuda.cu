/* gradops_cuda.cu - gradops.h's kernels on a GPU: accumulate, scale and convert elementwise, and the norm's
 * partials in gradops.h's fixed order (segments, groups, tensors), each level summed left to right in double
 * as the CPU does, which is what makes them equal bit for bit. Built with the library's IEEE flags
 * (--fmad=false, no flush to zero); tests/test_device.c holds every kernel to its CPU form. */
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "convert.h" /* defines: zs_elem_get, zs_elem_set */
#include "cuda_launch.h" /* defines: ZS_LAUNCH */
#include "gradops.h"

enum { THREADS = 256 };

__global__ void accumulate_kernel(void *dst, const void *src, int dt, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        zs_elem_set(dst, i, dt, zs_elem_get(dst, i, dt) + zs_elem_get(src, i, dt));
}

__global__ void scale_kernel(void *x, int dt, int64_t n, float f)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        zs_elem_set(x, i, dt, zs_elem_get(x, i, dt) * f);
}

__global__ void convert_kernel(void *dst, int dt, const float *src, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        zs_elem_set(dst, i, dt, src[i]);
}

/* ---------------------------------------------------------------- the norm, in gradops.h's order
 * Three launches, one per level of the order: a thread per segment, a thread per group of segments, a thread
 * per tensor. Each thread adds left to right, so no launch shape changes a bit, and no thread waits for
 * another inside a launch (stream order separates the levels). The segments of all tensors are numbered one
 * after another: tensor k's are sfirst[k] .. sfirst[k + 1] - 1, its groups gfirst[k] .. gfirst[k + 1] - 1. */

/* The tensor that holds item j: the last k with first[k] <= j (empty tensors share their successor's first). */
__device__ static int32_t owner(const int64_t *first, int32_t count, int64_t j)
{
    int32_t lo = 0, hi = count - 1;

    while (lo < hi) {
        int32_t mid = lo + (hi - lo + 1) / 2;
        if (first[mid] <= j)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

__global__ void sumsq_seg_kernel(const void *const *x, const int64_t *n, const int64_t *sfirst, int32_t count, int dt,
                                 double *seg)
{
    for (int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; j < sfirst[count];
         j += (int64_t)gridDim.x * blockDim.x) {
        int32_t k = owner(sfirst, count, j);
        int64_t b = (j - sfirst[k]) * ZS_SUMSQ_SEG, e = b + ZS_SUMSQ_SEG < n[k] ? b + ZS_SUMSQ_SEG : n[k];
        double s = 0.0;
        for (int64_t i = b; i < e; i++) {
            double v = (double)zs_elem_get(x[k], i, dt);
            s += v * v;
        }
        seg[j] = s;
    }
}

__global__ void sumsq_group_kernel(const double *seg, const int64_t *sfirst, const int64_t *gfirst, int32_t count,
                                   double *grp)
{
    for (int64_t q = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; q < gfirst[count];
         q += (int64_t)gridDim.x * blockDim.x) {
        int32_t k = owner(gfirst, count, q);
        int64_t b = sfirst[k] + (q - gfirst[k]) * ZS_SUMSQ_GROUP;
        int64_t e = b + ZS_SUMSQ_GROUP < sfirst[k + 1] ? b + ZS_SUMSQ_GROUP : sfirst[k + 1];
        double s = 0.0;
        for (int64_t i = b; i < e; i++)
            s += seg[i];
        grp[q] = s;
    }
}

__global__ void sumsq_tensor_kernel(const double *grp, const int64_t *gfirst, int32_t count, double *out)
{
    int32_t k = (int32_t)(blockIdx.x * blockDim.x + threadIdx.x);

    if (k >= count)
        return;
    double s = 0.0;
    for (int64_t i = gfirst[k]; i < gfirst[k + 1]; i++)
        s += grp[i];
    out[k] = s;
}

static unsigned blocks(int64_t n)
{
    int64_t b = (n + THREADS - 1) / THREADS;

    return (unsigned)(b < 1 ? 1 : b > 65535 ? 65535 : b);
}

extern "C" int zs_cuda_grad_accumulate(void *dst, const void *src, zs_dtype dt, int64_t n, void *stream)
{
    if (n <= 0)
        return 0;
    ZS_LAUNCH(accumulate_kernel, blocks(n), THREADS, (cudaStream_t)stream)(dst, src, (int)dt, n);
    return (int)cudaGetLastError();
}

extern "C" int zs_cuda_grad_scale(void *x, zs_dtype dt, int64_t n, float f, void *stream)
{
    if (n <= 0)
        return 0;
    ZS_LAUNCH(scale_kernel, blocks(n), THREADS, (cudaStream_t)stream)(x, (int)dt, n, f);
    return (int)cudaGetLastError();
}

extern "C" int zs_cuda_grad_convert(void *dst, zs_dtype dt, const float *src, int64_t n, void *stream)
{
    if (n <= 0)
        return 0;
    ZS_LAUNCH(convert_kernel, blocks(n), THREADS, (cudaStream_t)stream)(dst, (int)dt, src, n);
    return (int)cudaGetLastError();
}

/* The norm's kept scratch. The launch's tables go up in one copy from the pinned block, whose tail receives
 * the results. Device block: x, n, sfirst, gfirst (the tables, as on the host), then out, seg, grp. */
struct sumsq_scratch {
    char *dev, *host;
    size_t dev_bytes, host_bytes;
};

enum { TABLE_WORDS = 4 }; /* 8-byte words per tensor in the tables: x, n, sfirst, gfirst (the last two count + 1) */

static size_t table_bytes(int32_t count) { return ((size_t)TABLE_WORDS * count + 2) * 8; }

/* Room for the tables, count results and nseg + ngrp partials; a larger launch frees and allocates again (a
 * device-wide sync, once per new size, never per step). A few bytes per 4096 elements, outside the memory
 * plan: about 2 MB for a billion elements. */
static cudaError_t scratch_reserve(struct sumsq_scratch *sc, int32_t count, int64_t nseg, int64_t ngrp)
{
    size_t host = table_bytes(count) + (size_t)count * 8, dev = host + (size_t)(nseg + ngrp) * 8;
    cudaError_t e;

    if (sc->dev_bytes < dev) {
        cudaFree(sc->dev);
        sc->dev = NULL;
        sc->dev_bytes = 0;
        dev += dev / 2; /* half as much again: a launch a little larger than this one allocates nothing */
        if ((e = cudaMalloc((void **)&sc->dev, dev)) != cudaSuccess)
            return e;
        sc->dev_bytes = dev;
    }
    if (sc->host_bytes < host) {
        cudaFreeHost(sc->host);
        sc->host = NULL;
        sc->host_bytes = 0;
        host += host / 2;
        if ((e = cudaMallocHost((void **)&sc->host, host)) != cudaSuccess)
            return e;
        sc->host_bytes = host;
    }
    return cudaSuccess;
}

extern "C" void zs_cuda_grad_sumsq_free(void *scratch)
{
    struct sumsq_scratch *sc = (struct sumsq_scratch *)scratch;

    if (!sc)
        return;
    cudaFree(sc->dev);
    cudaFreeHost(sc->host);
    free(sc);
}

/* The tables in the pinned block: x, n, then each tensor's first segment and first group (count + 1 each). */
static void tables_fill(char *h, const void *const *x, const int64_t *n, int32_t count, int64_t *nseg, int64_t *ngrp)
{
    int64_t *sfirst = (int64_t *)(h + (size_t)count * 16), *gfirst = sfirst + count + 1;

    memcpy(h, x, (size_t)count * 8);
    memcpy(h + (size_t)count * 8, n, (size_t)count * 8);
    sfirst[0] = gfirst[0] = 0;
    for (int32_t k = 0; k < count; k++) {
        int64_t segs = (n[k] + ZS_SUMSQ_SEG - 1) / ZS_SUMSQ_SEG;
        sfirst[k + 1] = sfirst[k] + segs;
        gfirst[k + 1] = gfirst[k] + (segs + ZS_SUMSQ_GROUP - 1) / ZS_SUMSQ_GROUP;
    }
    *nseg = sfirst[count];
    *ngrp = gfirst[count];
}

static cudaError_t sumsq_launch(struct sumsq_scratch *sc, int32_t count, int dt, int64_t nseg, int64_t ngrp,
                                cudaStream_t s)
{
    char *d = sc->dev;
    const void *const *x = (const void *const *)d;
    const int64_t *n = (const int64_t *)(d + (size_t)count * 8), *sfirst = n + count, *gfirst = sfirst + count + 1;
    double *out = (double *)(d + table_bytes(count)), *seg = out + count, *grp = seg + nseg;
    cudaError_t e;

    if (nseg) {
        ZS_LAUNCH(sumsq_seg_kernel, blocks(nseg), THREADS, s)(x, n, sfirst, count, dt, seg);
        if ((e = cudaGetLastError()) != cudaSuccess)
            return e;
        ZS_LAUNCH(sumsq_group_kernel, blocks(ngrp), THREADS, s)(seg, sfirst, gfirst, count, grp);
        if ((e = cudaGetLastError()) != cudaSuccess)
            return e;
    }
    ZS_LAUNCH(sumsq_tensor_kernel, blocks(count), THREADS, s)(grp, gfirst, count, out);
    return cudaGetLastError();
}

/* x and n are host arrays of device pointers and lengths; out is host memory, filled on return. */
extern "C" int zs_cuda_grad_sumsq(void **scratch, const void *const *x, const int64_t *n, int32_t count, zs_dtype dt,
                                  double *out, void *stream)
{
    cudaStream_t s = (cudaStream_t)stream;
    struct sumsq_scratch *sc = (struct sumsq_scratch *)*scratch;
    int64_t nseg = 0, ngrp = 0;
    cudaError_t e;

    if (count <= 0)
        return 0;
    if (!sc && !(sc = (struct sumsq_scratch *)calloc(1, sizeof(*sc))))
        return (int)cudaErrorMemoryAllocation;
    *scratch = sc;
    for (int32_t k = 0; k < count; k++) { /* the partial counts first: they size the scratch */
        nseg += (n[k] + ZS_SUMSQ_SEG - 1) / ZS_SUMSQ_SEG;
        ngrp += ((n[k] + ZS_SUMSQ_SEG - 1) / ZS_SUMSQ_SEG + ZS_SUMSQ_GROUP - 1) / ZS_SUMSQ_GROUP;
    }
    if ((e = scratch_reserve(sc, count, nseg, ngrp)) != cudaSuccess)
        return (int)e;
    /* the pinned block is free to refill: the last call synchronized before it returned */
    tables_fill(sc->host, x, n, count, &nseg, &ngrp);
    size_t tb = table_bytes(count);
    if ((e = cudaMemcpyAsync(sc->dev, sc->host, tb, cudaMemcpyHostToDevice, s)) == cudaSuccess &&
        (e = sumsq_launch(sc, count, (int)dt, nseg, ngrp, s)) == cudaSuccess &&
        (e = cudaMemcpyAsync(sc->host + tb, sc->dev + tb, (size_t)count * 8, cudaMemcpyDeviceToHost, s)) == cudaSuccess)
        e = cudaStreamSynchronize(s);
    if (e == cudaSuccess)
        memcpy(out, sc->host + tb, (size_t)count * 8);
    return (int)e;
}
