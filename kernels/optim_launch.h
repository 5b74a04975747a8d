/* optim_launch.h - one multi-tensor optimizer launch: what a device's optimizer op takes (device/device.h) and
 * the CUDA kernels run (optim_cuda.cu). */
#ifndef ZS_OPTIM_LAUNCH_H
#define ZS_OPTIM_LAUNCH_H

#include <stdint.h>

#include "zeroshard.h" /* defines: zs_dtype */
#include "optim.h"     /* defines: struct zs_optim_step, struct zs_optim_bufs, enum zs_kopt */

#ifdef __cplusplus /* optim_cuda.cu */
extern "C" {
#endif

/* One tensor of a multi-tensor optimizer launch: n elements of each array in bufs, stepped with `step`
 * (a parameter group's scalars) or, when NULL, the launch's. */
struct zs_optim_tensor {
    struct zs_optim_bufs bufs;
    int64_t n;
    const struct zs_optim_step *step;
};

/* Every tensor gets the same optimizer and dtypes, and the launch's step scalars unless it has its own; the
 * tensors are independent, so the order the device visits them in never changes a bit. */
struct zs_optim_launch {
    enum zs_kopt opt;
    zs_dtype pdt, gdt;
    const struct zs_optim_step *step;
    const struct zs_optim_tensor *t;
    int32_t count;
};

/* The CUDA optimizer kernels (kernels/optim_cuda.cu): every tensor of l in one launch on `stream` (a
 * cudaStream_t). 0, or the cudaError_t of the launch. */
int zs_cuda_optim_launch(const struct zs_optim_launch *l, void *stream);

#ifdef __cplusplus
}
#endif

#endif /* ZS_OPTIM_LAUNCH_H */
