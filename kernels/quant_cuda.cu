/* quant_cuda.cu - kernels/quant.h's block quantization on a GPU, with quant_elem.h's element steps, so its bits
 * are the CPU reference's: a thread per block for quantize (its max over bit patterns, then its values: no
 * thread waits for another, so no launch shape changes a bit), a thread per element for dequantize. Built with
 * the library's IEEE flags (IEEE division, --fmad=false); tests/test_quant_cuda.c holds it to the reference. */
#include <cuda_runtime.h>

#include "convert.h"     /* defines: zs_elem_get, zs_elem_set */
#include "cuda_launch.h" /* defines: ZS_LAUNCH */
#include "quant.h"
#include "quant_elem.h"  /* defines: zs_quant_absbits, zs_quant_scale, zs_quant_scale_ok, zs_quant_one */

enum { QTHREADS = 256 };

__global__ void quantize_kernel(const void *x, int dt, int64_t n, int64_t block, int8_t *q, float *scale)
{
    int64_t nb = (n + block - 1) / block;

    for (int64_t b = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; b < nb; b += (int64_t)gridDim.x * blockDim.x) {
        int64_t b0 = b * block, end = n - b0 < block ? n : b0 + block;
        uint32_t m = 0;
        for (int64_t i = b0; i < end; i++) {
            uint32_t a = zs_quant_absbits(zs_elem_get(x, i, dt));
            m = a > m ? a : m;
        }
        float s = zs_quant_scale(m);
        int ok = zs_quant_scale_ok(s);
        scale[b] = s;
        for (int64_t i = b0; i < end; i++)
            q[i] = zs_quant_one(zs_elem_get(x, i, dt), s, ok);
    }
}

__global__ void dequantize_kernel(const int8_t *q, const float *scale, int64_t n, int64_t block, void *y, int dt)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        zs_elem_set(y, i, dt, (float)q[i] * scale[i / block]);
}

__global__ void dequantize_add_kernel(const int8_t *q, const float *scale, int64_t n, int64_t block, float *acc)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        acc[i] += (float)q[i] * scale[i / block];
}

static unsigned qblocks(int64_t n)
{
    int64_t b = (n + QTHREADS - 1) / QTHREADS;

    return (unsigned)(b < 1 ? 1 : b > 65535 ? 65535 : b);
}

extern "C" int zs_cuda_quantize(const void *x, int dt, int64_t n, int64_t block, int8_t *q, float *scale, void *stream)
{
    if (n <= 0)
        return 0;
    ZS_LAUNCH(quantize_kernel, qblocks(zs_quant_blocks(n, block)), QTHREADS, (cudaStream_t)stream)(x, dt, n, block, q,
                                                                                                   scale);
    return (int)cudaGetLastError();
}

extern "C" int zs_cuda_dequantize(const int8_t *q, const float *scale, int64_t n, int64_t block, void *y, int dt,
                                  void *stream)
{
    if (n <= 0)
        return 0;
    ZS_LAUNCH(dequantize_kernel, qblocks(n), QTHREADS, (cudaStream_t)stream)(q, scale, n, block, y, dt);
    return (int)cudaGetLastError();
}

extern "C" int zs_cuda_dequantize_add(const int8_t *q, const float *scale, int64_t n, int64_t block, float *acc,
                                      void *stream)
{
    if (n <= 0)
        return 0;
    ZS_LAUNCH(dequantize_add_kernel, qblocks(n), QTHREADS, (cudaStream_t)stream)(q, scale, n, block, acc);
    return (int)cudaGetLastError();
}
