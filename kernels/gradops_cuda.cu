/* gradops_cuda.cu - gradops.h's kernels on a GPU: accumulate, scale and convert elementwise, and the norm's
 * partials one tensor per thread, each summed left to right in double as the CPU does, which is what makes
 * them equal bit for bit (a tree sum would not be). Built with the library's IEEE flags (--fmad=false, no
 * flush to zero); tests/test_device.c holds every kernel to its CPU form. */
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

/* The fixed order is the point: one thread walks a whole tensor, so this is slow on large shards. */
__global__ void sumsq_kernel(const void *const *x, const int64_t *n, int32_t count, int dt, double *out)
{
    int32_t k = (int32_t)(blockIdx.x * blockDim.x + threadIdx.x);

    if (k >= count)
        return;
    double s = 0.0;
    for (int64_t i = 0; i < n[k]; i++) {
        double v = (double)zs_elem_get(x[k], i, dt);
        s += v * v;
    }
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

/* x and n are host arrays of device pointers and lengths; out is host memory, filled on return. */
extern "C" int zs_cuda_grad_sumsq(const void *const *x, const int64_t *n, int32_t count, zs_dtype dt, double *out,
                                  void *stream)
{
    cudaStream_t s = (cudaStream_t)stream;
    size_t b = (size_t)count * 8;
    char *d = NULL;
    cudaError_t e;

    if (count <= 0)
        return 0;
    e = cudaMalloc((void **)&d, 3 * b);
    if (e != cudaSuccess)
        return (int)e;
    if ((e = cudaMemcpyAsync(d, x, b, cudaMemcpyHostToDevice, s)) == cudaSuccess &&
        (e = cudaMemcpyAsync(d + b, n, b, cudaMemcpyHostToDevice, s)) == cudaSuccess) {
        ZS_LAUNCH(sumsq_kernel, (unsigned)((count + 127) / 128), 128, s)((const void *const *)d, (const int64_t *)(d + b),
                                                                         count, (int)dt, (double *)(d + 2 * b));
        e = cudaGetLastError();
    }
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(out, d + 2 * b, b, cudaMemcpyDeviceToHost, s);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(s);
    cudaFree(d);
    return (int)e;
}
