/* gradops.h - the elementwise kernels around the optimizer: folding a reduced gradient into its
 * accumulator, scaling gradients, the squares of the global norm, fp32 to the training dtype. The C
 * forms here are the CPU device's and the reference of kernels/gradops_cuda.cu, which must give their bits. */
#ifndef ZS_GRADOPS_H
#define ZS_GRADOPS_H

#include <stdint.h>

#include "zeroshard.h" /* defines: zs_dtype */

#ifdef __cplusplus
extern "C" {
#endif

/* dst += src over n elements of dtype dt: in fp32, rounded back to nearest even for 16-bit. */
void zs_grad_accumulate(void *dst, const void *src, zs_dtype dt, int64_t n);
/* x *= f over n elements of dtype dt, in fp32, rounded back for 16-bit. */
void zs_grad_scale(void *x, zs_dtype dt, int64_t n, float f);
/* The squares of n elements of dtype dt summed in double, left to right (fp32: zs_sumsq_ref's order). */
double zs_grad_sumsq(const void *x, zs_dtype dt, int64_t n);
/* dst (dtype dt) = src rounded to nearest even (a copy for fp32). */
void zs_grad_convert(void *dst, zs_dtype dt, const float *src, int64_t n);

/* The CUDA forms (kernels/gradops_cuda.cu), on `stream` (a cudaStream_t): 0 or the cudaError_t. sumsq
 * takes host arrays of count device pointers x and lengths n, and writes each tensor's partial, summed in
 * zs_grad_sumsq's order, to out (host memory), complete on return. */
int zs_cuda_grad_accumulate(void *dst, const void *src, zs_dtype dt, int64_t n, void *stream);
int zs_cuda_grad_scale(void *x, zs_dtype dt, int64_t n, float f, void *stream);
int zs_cuda_grad_convert(void *dst, zs_dtype dt, const float *src, int64_t n, void *stream);
int zs_cuda_grad_sumsq(const void *const *x, const int64_t *n, int32_t count, zs_dtype dt, double *out, void *stream);

#ifdef __cplusplus
}
#endif

#endif /* ZS_GRADOPS_H */
