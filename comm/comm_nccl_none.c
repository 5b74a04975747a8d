/* comm_nccl_none.c - linked instead of comm_nccl.c when the library is built without the CUDA backend:
 * NCCL never starts, so the device collectives stay host-staged (or a config that asks for NCCL is refused
 * by name). */
#include "base/error.h" /* defines: zs_fail */
#include "comm_nccl.h"

zs_status zs_nccl_init(struct zs_nccl **n, MPI_Comm comm, enum zs_nccl_mode mode, struct zs_comm *watch)
{
    *n = NULL;
    return zs_fail(ZS_ERR_UNSUPPORTED, "NCCL: this library was built without the CUDA backend");
}

zs_status zs_nccl_shared_gpu(MPI_Comm comm, struct zs_comm *watch, int32_t *a, int32_t *b, char *gpu, size_t len)
{
    *a = *b = -1;
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

zs_status zs_nccl_poll(struct zs_nccl *n, double since, const char *what)
{
    return ZS_ERR_UNSUPPORTED;
}

size_t zs_nccl_piece_bytes(int32_t nranks)
{
    return zs_nccl_piece_default(nranks);
}

uint64_t zs_nccl_stage_bytes(int32_t nranks)
{
    return (uint64_t)nranks * zs_nccl_piece_bytes(nranks); /* what a CUDA build would hold, for estimates */
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
