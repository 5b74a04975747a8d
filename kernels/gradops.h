/* gradops.h - the kernels around the optimizer: folding a reduced gradient into its accumulator, scaling
 * gradients, the squares of the global norm (in one fixed order), fp32 to the training dtype. The C forms here
 * are the CPU device's and the reference of kernels/gradops_cuda.cu, which must give their bits. */
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
/* ---------------------------------------------------------------- the norm's one order
 * The squares of a tensor are summed in one fixed order, the same on every device, so that the CPU's threads
 * and a GPU's blocks give the same bits: the tensor is cut into segments of ZS_SUMSQ_SEG elements (the last one
 * shorter); each segment's squares, v * v of the float value in double, are summed left to right from 0.0;
 * the segments' sums of each group of ZS_SUMSQ_GROUP segments are added left to right from 0.0; the groups'
 * sums are added left to right from 0.0. Segments run in parallel (a CPU thread or a GPU thread each) and their
 * left-to-right sum keeps the order the CPU always had within 4096 elements; the groups keep every fold short
 * and sequential (a GPU thread folds 256 partials, then one thread per tensor folds the groups), which a GPU
 * runs fast without a tree whose shape would depend on the launch. zs_grad_sumsq is the definition. */
#define ZS_SUMSQ_SEG 4096
#define ZS_SUMSQ_GROUP 256

/* The squares of n elements of dtype dt in the order above: the scalar reference every other form matches. */
double zs_grad_sumsq(const void *x, zs_dtype dt, int64_t n);
/* Elements [begin, end) of x (dtype dt), their squares summed left to right in double from 0.0: one segment. */
double zs_grad_sumsq_seg(const void *x, zs_dtype dt, int64_t begin, int64_t end);
/* One tensor's nseg segment sums folded in the order above: groups of ZS_SUMSQ_GROUP, then the groups. */
double zs_grad_sumsq_fold(const double *seg, int64_t nseg);
struct zs_pool;
/* out[k] = zs_grad_sumsq(x[k], dt, n[k]) for count tensors, the segments of all of them spread over the pool's
 * threads: 0, or -ENOMEM (no room for the segment sums). */
int zs_grad_sumsq_pool(struct zs_pool *pool, const void *const *x, const int64_t *n, int32_t count, zs_dtype dt,
                       double *out);
/* dst (dtype dt) = src rounded to nearest even (a copy for fp32). */
void zs_grad_convert(void *dst, zs_dtype dt, const float *src, int64_t n);

/* The CUDA forms (kernels/gradops_cuda.cu), on `stream` (a cudaStream_t): 0 or the cudaError_t. sumsq
 * takes host arrays of count device pointers x and lengths n, and writes each tensor's partial, summed in
 * zs_grad_sumsq's order, to out (host memory), complete on return. Its scratch (device memory for the segment
 * and group sums, a pinned host block for the launch's tables and the results) is *scratch, made at the first
 * call, grown only when a larger launch comes and kept across calls, so a step allocates nothing;
 * zs_cuda_grad_sumsq_free releases it (the device's close). */
int zs_cuda_grad_accumulate(void *dst, const void *src, zs_dtype dt, int64_t n, void *stream);
int zs_cuda_grad_scale(void *x, zs_dtype dt, int64_t n, float f, void *stream);
int zs_cuda_grad_convert(void *dst, zs_dtype dt, const float *src, int64_t n, void *stream);
int zs_cuda_grad_sumsq(void **scratch, const void *const *x, const int64_t *n, int32_t count, zs_dtype dt, double *out,
                       void *stream);
void zs_cuda_grad_sumsq_free(void *scratch);

#ifdef __cplusplus
}
#endif

#endif /* ZS_GRADOPS_H */
