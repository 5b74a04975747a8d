/* comm_cuda.h - the GPU side of the collectives (kernels/comm_cuda.cu): the rank-order sum that makes an
 * NCCL reduction give the CPU transports' bits, and the scale after NCCL's own sum. Streams are
 * cudaStream_t passed as void *; each returns 0 or the cudaError_t of the launch. */
#ifndef ZS_COMM_CUDA_H
#define ZS_COMM_CUDA_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* stage holds nranks chunks of count elements of dt_in (ZS_DTYPE_*), chunk j from rank j; out[i] becomes
 * ((x_0 + x_1) + ... + x_{nranks-1}) * scale in fp32, written as dt_out (fp32, or dt_in rounded to nearest
 * even): comm/comm.c's reduction, element for element. */
int zs_cuda_sum_ranks(const void *stage, int dt_in, void *out, int dt_out, int64_t count, int32_t nranks,
                      float scale, void *stream);
/* buf[i] *= scale (fp32), in place. */
int zs_cuda_scale(float *buf, int64_t count, float scale, void *stream);

#ifdef __cplusplus
}
#endif

#endif /* ZS_COMM_CUDA_H */
