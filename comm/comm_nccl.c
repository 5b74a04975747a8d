/* comm_nccl.c - the NCCL transport (comm_nccl.h): libnccl loaded at run time, a communicator bootstrapped
 * over MPI (rank 0's ncclGetUniqueId broadcast with MPI_Bcast), collectives queued on a communication
 * stream that an event orders after the caller's compute stream. */
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include "base/error.h"     /* defines: zs_fail, zs_error_prefix */
#include "kernels/comm_cuda.h" /* defines: zs_cuda_sum_ranks, zs_cuda_scale */
#include "comm_nccl.h"

/* The NCCL functions used, resolved from libnccl.so.2 when a communicator is first made. */
struct nccl_api {
    ncclResult_t (*get_unique_id)(ncclUniqueId *);
    ncclResult_t (*comm_init_rank)(ncclComm_t *, int, ncclUniqueId, int);
    ncclResult_t (*comm_destroy)(ncclComm_t);
    ncclResult_t (*reduce_scatter)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                                   cudaStream_t);
    ncclResult_t (*all_gather)(const void *, void *, size_t, ncclDataType_t, ncclComm_t, cudaStream_t);
    ncclResult_t (*send)(const void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*recv)(void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*group_start)(void);
    ncclResult_t (*group_end)(void);
    const char *(*error_string)(ncclResult_t);
};

struct zs_nccl {
    struct nccl_api api;
    void *lib;
    ncclComm_t comm;
    int32_t rank, size;
    enum zs_nccl_mode mode;
    cudaStream_t stream;
    cudaEvent_t ready;       /* marks the caller's stream at each collective */
    void *stage;             /* ordered mode: N received chunks, grown on demand */
    size_t stage_bytes;
};

static zs_status load_api(struct zs_nccl *n)
{
    static const char *const names[] = { "ncclGetUniqueId", "ncclCommInitRank", "ncclCommDestroy",
                                         "ncclReduceScatter", "ncclAllGather", "ncclSend", "ncclRecv",
                                         "ncclGroupStart", "ncclGroupEnd", "ncclGetErrorString" };
    void **slot = (void **)&n->api;

    n->lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!n->lib)
        return zs_fail(ZS_ERR_UNSUPPORTED, "cannot load NCCL (libnccl.so.2): %s", dlerror());
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        slot[i] = dlsym(n->lib, names[i]);
        if (!slot[i])
            return zs_fail(ZS_ERR_UNSUPPORTED, "NCCL (libnccl.so.2) lacks %s", names[i]);
    }
    return ZS_OK;
}

static zs_status nccl_fail(struct zs_nccl *n, ncclResult_t r, const char *what)
{
    return zs_fail(ZS_ERR_COMM, "rank %d: %s: %s", n->rank, what, n->api.error_string(r));
}

static zs_status cuda_fail(struct zs_nccl *n, int e, const char *what)
{
    return zs_fail(e == cudaErrorMemoryAllocation ? ZS_ERR_NOMEM : ZS_ERR_COMM, "rank %d: %s: %s", n->rank, what,
                   cudaGetErrorString((cudaError_t)e));
}

/* NCCL refuses two ranks on one GPU, and says so obscurely: the ranks compare their GPUs' PCI addresses
 * first and name the pair. Collective. */
static zs_status check_distinct_gpus(struct zs_nccl *n, MPI_Comm comm)
{
    char mine[64] = { 0 }, *all;
    char host[MPI_MAX_PROCESSOR_NAME] = { 0 };
    int dev = 0, len = 0;
    zs_status st = ZS_OK;

    cudaGetDevice(&dev);
    MPI_Get_processor_name(host, &len);
    if (cudaDeviceGetPCIBusId(mine, 24, dev) != cudaSuccess)
        strcpy(mine, "?");
    strncat(mine, "@", sizeof(mine) - strlen(mine) - 1);
    strncat(mine, host, sizeof(mine) - strlen(mine) - 1);
    all = calloc((size_t)n->size, sizeof(mine));
    if (!all)
        return zs_fail(ZS_ERR_NOMEM, "NCCL set-up: out of memory");
    if (MPI_Allgather(mine, sizeof(mine), MPI_CHAR, all, sizeof(mine), MPI_CHAR, comm) != MPI_SUCCESS)
        st = zs_fail(ZS_ERR_COMM, "NCCL set-up: all-gather of the ranks' GPUs failed");
    for (int32_t a = 0; !st && a < n->size; a++)
        for (int32_t b = a + 1; !st && b < n->size; b++)
            if (!strcmp(all + a * sizeof(mine), all + b * sizeof(mine)))
                st = zs_fail(ZS_ERR_UNSUPPORTED, "NCCL needs one GPU per rank, and ranks %d and %d share %s "
                             "(use the host-staged transport for ranks sharing a GPU)", a, b, all + a * sizeof(mine));
    free(all);
    return st;
}

/* Whether any rank failed so far, so that no rank walks into a collective the others skip. A rank that
 * failed keeps its own message; the others name it. */
static zs_status agree(struct zs_nccl *n, MPI_Comm comm, zs_status st)
{
    int32_t mine = st ? n->rank : -1, first = -1;

    if (MPI_Allreduce(&mine, &first, 1, MPI_INT32_T, MPI_MAX, comm) != MPI_SUCCESS)
        return st ? st : zs_fail(ZS_ERR_COMM, "NCCL set-up: all-reduce of the ranks' status failed");
    if (st || first < 0)
        return st;
    return zs_fail(ZS_ERR_COMM, "NCCL set-up failed on rank %d", first);
}

zs_status zs_nccl_init(struct zs_nccl **out, MPI_Comm comm, enum zs_nccl_mode mode)
{
    struct zs_nccl *n = calloc(1, sizeof(*n));
    struct {
        ncclUniqueId id;
        int32_t ok;
    } boot = { .ok = 0 };
    ncclResult_t r = ncclSuccess;
    zs_status st;

    *out = NULL;
    if (!n)
        return zs_fail(ZS_ERR_NOMEM, "NCCL set-up: out of memory");
    n->mode = mode;
    MPI_Comm_rank(comm, &n->rank);
    MPI_Comm_size(comm, &n->size);
    st = agree(n, comm, load_api(n));
    if (!st)
        st = check_distinct_gpus(n, comm); /* the same gathered answer on every rank */
    if (!st && n->rank == 0) {
        r = n->api.get_unique_id(&boot.id);
        boot.ok = r == ncclSuccess;
        if (!boot.ok)
            st = nccl_fail(n, r, "ncclGetUniqueId");
    }
    if (!st && MPI_Bcast(&boot, sizeof(boot), MPI_BYTE, 0, comm) != MPI_SUCCESS)
        st = zs_fail(ZS_ERR_COMM, "NCCL set-up: broadcast of the unique id failed");
    if (!st && !boot.ok)
        st = zs_fail(ZS_ERR_COMM, "NCCL set-up: rank 0 could not make a unique id");
    if (!st && (r = n->api.comm_init_rank(&n->comm, n->size, boot.id, n->rank)) != ncclSuccess)
        st = nccl_fail(n, r, "ncclCommInitRank");
    if (!st && cudaStreamCreateWithFlags(&n->stream, cudaStreamNonBlocking) != cudaSuccess)
        st = zs_fail(ZS_ERR_COMM, "NCCL set-up: cudaStreamCreateWithFlags failed");
    if (!st && cudaEventCreateWithFlags(&n->ready, cudaEventDisableTiming) != cudaSuccess)
        st = zs_fail(ZS_ERR_COMM, "NCCL set-up: cudaEventCreateWithFlags failed");
    if (st) {
        zs_nccl_free(n);
        return st;
    }
    *out = n;
    return ZS_OK;
}

void zs_nccl_free(struct zs_nccl *n)
{
    if (!n)
        return;
    if (n->stream)
        cudaStreamSynchronize(n->stream);
    if (n->comm)
        n->api.comm_destroy(n->comm);
    if (n->stage)
        cudaFree(n->stage);
    if (n->ready)
        cudaEventDestroy(n->ready);
    if (n->stream)
        cudaStreamDestroy(n->stream);
    if (n->lib)
        dlclose(n->lib);
    free(n);
}

void *zs_nccl_stream(struct zs_nccl *n)
{
    return n->stream;
}

zs_status zs_nccl_sync(struct zs_nccl *n)
{
    cudaError_t e = cudaStreamSynchronize(n->stream);

    return e == cudaSuccess ? ZS_OK : cuda_fail(n, e, "cudaStreamSynchronize");
}

/* The communication stream waits for what `after` has queued so far. */
static zs_status order_after(struct zs_nccl *n, void *after)
{
    cudaError_t e;

    if (!after)
        return ZS_OK;
    e = cudaEventRecord(n->ready, (cudaStream_t)after);
    if (e == cudaSuccess)
        e = cudaStreamWaitEvent(n->stream, n->ready, 0);
    return e == cudaSuccess ? ZS_OK : cuda_fail(n, e, "ordering the communication stream");
}

static size_t esz(zs_dtype dt)
{
    return dt == ZS_DTYPE_FP32 ? 4 : 2;
}

static ncclDataType_t nccl_type(zs_dtype dt)
{
    return dt == ZS_DTYPE_BF16 ? ncclBfloat16 : dt == ZS_DTYPE_FP16 ? ncclFloat16 : ncclFloat32;
}

/* The staging area only grows; the stream is synchronized first, as an earlier collective may still read it. */
static zs_status stage_reserve(struct zs_nccl *n, size_t bytes)
{
    cudaError_t e;

    if (bytes <= n->stage_bytes)
        return ZS_OK;
    cudaStreamSynchronize(n->stream);
    if (n->stage)
        cudaFree(n->stage);
    n->stage = NULL;
    n->stage_bytes = 0;
    e = cudaMalloc(&n->stage, bytes);
    if (e != cudaSuccess)
        return cuda_fail(n, e, "NCCL staging buffer");
    n->stage_bytes = bytes;
    return ZS_OK;
}

/* Every rank's chunk r arrives in stage[j] (own chunk copied), then one kernel sums them in rank order. */
static zs_status rs_ordered(struct zs_nccl *n, const char *buf, zs_dtype dt_in, void *out, zs_dtype dt_out,
                            int64_t count, float scale)
{
    size_t chunk = (size_t)count * esz(dt_in);
    zs_status st = stage_reserve(n, chunk * (size_t)n->size);
    ncclResult_t r = ncclSuccess, r2;
    cudaError_t e;
    int k;

    if (st)
        return st;
    e = cudaMemcpyAsync((char *)n->stage + (size_t)n->rank * chunk, buf + (size_t)n->rank * chunk, chunk,
                        cudaMemcpyDeviceToDevice, n->stream);
    if (e != cudaSuccess)
        return cuda_fail(n, e, "reduce-scatter: own chunk");
    n->api.group_start();
    for (int32_t j = 0; j < n->size && r == ncclSuccess; j++) {
        if (j == n->rank)
            continue;
        r = n->api.send(buf + (size_t)j * chunk, chunk, ncclUint8, j, n->comm, n->stream);
        if (r == ncclSuccess)
            r = n->api.recv((char *)n->stage + (size_t)j * chunk, chunk, ncclUint8, j, n->comm, n->stream);
    }
    r2 = n->api.group_end();
    if (r != ncclSuccess || r2 != ncclSuccess)
        return nccl_fail(n, r != ncclSuccess ? r : r2, "reduce-scatter send/recv");
    k = zs_cuda_sum_ranks(n->stage, dt_in, out, dt_out, count, n->size, scale, n->stream);
    return k ? cuda_fail(n, k, "reduce-scatter: rank-order sum") : ZS_OK;
}

/* NCCL's own sum (its ring or tree order: close to comm.c's rank-order sum, not bit-identical), in fp32. A
 * 16-bit input is widened into the staging area first, summed there in place (NCCL takes the receive buffer at
 * this rank's chunk of the send buffer), and scaled and narrowed by the rank-order kernel over one "rank". */
static zs_status rs_fast(struct zs_nccl *n, const void *buf, zs_dtype dt_in, void *out, zs_dtype dt_out,
                         int64_t count, float scale)
{
    float *wide, *mine;
    ncclResult_t r;
    zs_status st;
    int k;

    if (dt_in == ZS_DTYPE_FP32) { /* then dt_out is fp32 too */
        r = n->api.reduce_scatter(buf, out, (size_t)count, ncclFloat32, ncclSum, n->comm, n->stream);
        if (r != ncclSuccess)
            return nccl_fail(n, r, "ncclReduceScatter");
        k = scale == 1.0f ? 0 : zs_cuda_scale(out, count, scale, n->stream);
        return k ? cuda_fail(n, k, "reduce-scatter: scale") : ZS_OK;
    }
    st = stage_reserve(n, (size_t)count * (size_t)n->size * sizeof(float));
    if (st)
        return st;
    wide = n->stage;
    mine = wide + (size_t)n->rank * (size_t)count;
    k = zs_cuda_sum_ranks(buf, dt_in, wide, ZS_DTYPE_FP32, count * n->size, 1, 1.0f, n->stream);
    if (k)
        return cuda_fail(n, k, "reduce-scatter: widen to fp32");
    r = n->api.reduce_scatter(wide, mine, (size_t)count, ncclFloat32, ncclSum, n->comm, n->stream);
    if (r != ncclSuccess)
        return nccl_fail(n, r, "ncclReduceScatter");
    k = zs_cuda_sum_ranks(mine, ZS_DTYPE_FP32, out, dt_out, count, 1, scale, n->stream);
    return k ? cuda_fail(n, k, "reduce-scatter: scale and narrow") : ZS_OK;
}

zs_status zs_nccl_reduce_scatter(struct zs_nccl *n, const void *buf, zs_dtype dt_in, void *out, zs_dtype dt_out,
                                 int64_t count, float scale, void *after)
{
    zs_status st;

    if (count < 0 || (dt_out != ZS_DTYPE_FP32 && dt_out != dt_in))
        return zs_fail(ZS_ERR_INVALID, "NCCL reduce-scatter: output dtype must be fp32 or the input's");
    st = order_after(n, (void *)after);
    if (st || count == 0)
        return st;
    if (n->mode == ZS_NCCL_ORDERED)
        return rs_ordered(n, buf, dt_in, out, dt_out, count, scale);
    return rs_fast(n, buf, dt_in, out, dt_out, count, scale);
}

zs_status zs_nccl_all_gather(struct zs_nccl *n, void *buf, zs_dtype dt, int64_t count, void *after)
{
    size_t chunk = (size_t)count * esz(dt);
    zs_status st = order_after(n, after);
    ncclResult_t r;

    if (st || count <= 0)
        return st;
    /* in place: NCCL takes the send buffer at this rank's offset of the receive buffer */
    r = n->api.all_gather((char *)buf + (size_t)n->rank * chunk, buf, (size_t)count, nccl_type(dt), n->comm,
                          n->stream);
    return r == ncclSuccess ? ZS_OK : nccl_fail(n, r, "ncclAllGather");
}

zs_status zs_nccl_all_reduce(struct zs_nccl *n, void *buf, zs_dtype dt, int64_t count, float scale, void *after)
{
    void *mine = (char *)buf + (size_t)n->rank * (size_t)count * esz(dt);
    zs_status st = zs_nccl_reduce_scatter(n, buf, dt, mine, dt, count, scale, after);

    return st ? st : zs_nccl_all_gather(n, buf, dt, count, NULL);
}
