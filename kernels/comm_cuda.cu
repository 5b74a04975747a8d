/* comm_cuda.cu - the collectives' GPU kernels: the rank-order sum (comm_cuda.h). Built with the optimizer
 * kernels' flags (no contraction, no flush to zero), so the sum is comm/comm.c's, bit for bit. */
#include <cuda_runtime.h>

#include "zeroshard.h" /* defines: ZS_DTYPE_* */
#include "comm_cuda.h"
#include "convert.h"   /* defines: zs_cvt_* */
#include "cuda_launch.h" /* defines: ZS_LAUNCH */

enum { THREADS = 256 };

__device__ __forceinline__ float load_in(const void *p, int64_t i, int dt)
{
    if (dt == ZS_DTYPE_BF16)
        return zs_cvt_bf16_f32(((const uint16_t *)p)[i]);
    if (dt == ZS_DTYPE_FP16)
        return zs_cvt_f16_f32(((const uint16_t *)p)[i]);
    return ((const float *)p)[i];
}

/* Element i: rank 0's value, then each later rank's added in order, then the scale, rounded once. */
__global__ void __launch_bounds__(THREADS) sum_ranks(const char *stage, int dt_in, void *out, int dt_out,
                                                     int64_t count, int32_t nranks, float scale)
{
    size_t esz = dt_in == ZS_DTYPE_FP32 ? 4 : 2;

    for (int64_t i = blockIdx.x * (int64_t)THREADS + threadIdx.x; i < count; i += (int64_t)gridDim.x * THREADS) {
        float acc = load_in(stage, i, dt_in);
        for (int32_t j = 1; j < nranks; j++)
            acc += load_in(stage + (size_t)j * (size_t)count * esz, i, dt_in);
        float r = acc * scale;
        if (dt_out == ZS_DTYPE_BF16)
            ((uint16_t *)out)[i] = zs_cvt_f32_bf16(r);
        else if (dt_out == ZS_DTYPE_FP16)
            ((uint16_t *)out)[i] = zs_cvt_f32_f16(r);
        else
            ((float *)out)[i] = r;
    }
}

__global__ void __launch_bounds__(THREADS) scale_f32(float *buf, int64_t count, float scale)
{
    for (int64_t i = blockIdx.x * (int64_t)THREADS + threadIdx.x; i < count; i += (int64_t)gridDim.x * THREADS)
        buf[i] = buf[i] * scale;
}

/* Enough blocks to fill any GPU; the loops stride over the rest. */
static unsigned grid_for(int64_t count)
{
    int64_t b = (count + THREADS - 1) / THREADS;
    return (unsigned)(b < 1 ? 1 : b > 65536 ? 65536 : b);
}

extern "C" int zs_cuda_sum_ranks(const void *stage, int dt_in, void *out, int dt_out, int64_t count, int32_t nranks,
                                 float scale, void *stream)
{
    if (count <= 0)
        return 0;
    ZS_LAUNCH(sum_ranks, grid_for(count), THREADS, (cudaStream_t)stream)((const char *)stage, dt_in, out, dt_out,
                                                                         count, nranks, scale);
    return (int)cudaGetLastError();
}

extern "C" int zs_cuda_scale(float *buf, int64_t count, float scale, void *stream)
{
    if (count <= 0)
        return 0;
    ZS_LAUNCH(scale_f32, grid_for(count), THREADS, (cudaStream_t)stream)(buf, count, scale);
    return (int)cudaGetLastError();
}
