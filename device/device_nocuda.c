/* device_nocuda.c - linked instead of device_cuda.c when the library is built without the CUDA backend:
 * asking for the GPU is refused by name rather than silently run on the CPU (comm/comm_nccl_none.c does
 * the same for NCCL). */
#include "base/error.h" /* defines: zs_fail */
#include "device.h"

static int32_t nocuda_count(void)
{
    return 0;
}

static zs_status nocuda_open(struct zs_device *d, int32_t local_rank, int32_t local_size)
{
    return zs_fail(ZS_ERR_UNSUPPORTED, "this library was built without the CUDA backend (ZS_CUDA=OFF, or no "
                                       "CUDA compiler, cuBLAS or NCCL at build time)");
}

const struct zs_device_ops zs_device_cuda_ops = { .name = "cuda", .count = nocuda_count, .open = nocuda_open };

