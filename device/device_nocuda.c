/* device_nocuda.c - linked instead of device_cuda.c and comm/comm_nccl.c when the library is built without
 * the CUDA backend: asking for the GPU (or NCCL) is refused by name rather than silently run on the CPU. */
#include "comm/comm_nccl.h"
#include "device.h"
#include "base/error.h" /* defines: zs_fail */

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


zs_status zs_nccl_init(struct zs_nccl **n, MPI_Comm comm, enum zs_nccl_mode mode)
{
    *n = NULL;
    return zs_fail(ZS_ERR_UNSUPPORTED, "NCCL: this library was built without the CUDA backend");
}

void zs_nccl_free(struct zs_nccl *n)
{
}

void *zs_nccl_stream(struct zs_nccl *n)
{
    return NULL;
}

zs_status zs_nccl_sync(struct zs_nccl *n)
{
    return ZS_ERR_UNSUPPORTED;
}

zs_status zs_nccl_reduce_scatter(struct zs_nccl *n, const void *buf, zs_dtype dt_in, void *out, zs_dtype dt_out,
                                 int64_t count, float scale, void *after)
{
    return ZS_ERR_UNSUPPORTED;
}

zs_status zs_nccl_all_gather(struct zs_nccl *n, void *buf, zs_dtype dt, int64_t count, void *after)
{
    return ZS_ERR_UNSUPPORTED;
}

zs_status zs_nccl_all_reduce(struct zs_nccl *n, void *buf, zs_dtype dt, int64_t count, float scale, void *after)
{
    return ZS_ERR_UNSUPPORTED;
}
