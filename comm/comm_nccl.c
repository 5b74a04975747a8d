/* comm_nccl.c - the NCCL transport (comm_nccl.h): libnccl loaded at run time, a non-blocking communicator
 * bootstrapped over MPI (rank 0's ncclGetUniqueId broadcast with MPI_Ibcast), collectives queued on a
 * communication stream that an event orders after the caller's compute stream, staged through one buffer
 * of fixed size made at set-up. Every wait is comm_nccl_wait.c's, under the watchdog's deadline. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"      /* defines: zs_fail, zs_log */
#include "base/test_hooks.h" /* defines: ZS_TEST_HOOK_NCCL_PIECE */
#include "kernels/comm_cuda.h" /* defines: zs_cuda_sum_ranks, zs_cuda_scale */
#include "comm_impl.h"       /* defines: struct zs_comm (its timeout and node) */
#include "comm_nccl_impl.h"
#include "shm.h"             /* defines: zs_shm_nccl_count */

static zs_status load_api(struct zs_nccl *n)
{
    static const char *const names[] = { "ncclGetUniqueId", "ncclCommInitRank", "ncclCommDestroy", "ncclCommAbort",
                                         "ncclCommGetAsyncError", "ncclReduceScatter", "ncclAllGather", "ncclSend",
                                         "ncclRecv", "ncclGroupStart", "ncclGroupEnd", "ncclGetErrorString" };
    void **slot = (void **)&n->api;

    n->lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!n->lib)
        return zs_fail(ZS_ERR_UNSUPPORTED, "cannot load NCCL (libnccl.so.2): %s", dlerror());
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        slot[i] = dlsym(n->lib, names[i]);
        if (!slot[i])
            return zs_fail(ZS_ERR_UNSUPPORTED, "NCCL (libnccl.so.2) lacks %s", names[i]);
    }
    n->api.init_config = (ncclResult_t(*)(ncclComm_t *, int, ncclUniqueId, int, ncclConfig_t *))dlsym(
        n->lib, "ncclCommInitRankConfig"); /* NCCL 2.14 and later */
    return ZS_OK;
}

/* The error is the caller's status from here on: cleared as the thread's last error, which a host program's
 * cudaGetLastError would otherwise report after the engine fell back to the host-staged transport. */
static zs_status cuda_fail(struct zs_nccl *n, int e, const char *what)
{
    (void)cudaGetLastError();
    return zs_fail(e == cudaErrorMemoryAllocation ? ZS_ERR_NOMEM : ZS_ERR_COMM, "rank %d: %s: %s", n->rank, what,
                   cudaGetErrorString((cudaError_t)e));
}

#define GPU_ID 64 /* "PCI bus id@host", NUL-padded */

/* A set-up exchange, nonblocking and waited for under the watchdog's deadline (watch NULL: the default), so a
 * rank that never comes to NCCL's set-up ends it with an error rather than a hang. After a timeout the request
 * stays posted (MPI cannot cancel a collective): the caller keeps its buffers, on the heap, for MPI to land in. */
static void *kept[16]; /* buffers of timed-out exchanges, still reachable for MPI (and leak checkers) */

static void keep(void *p)
{
    for (size_t i = 0; i < sizeof(kept) / sizeof(kept[0]); i++)
        if (!kept[i]) {
            kept[i] = p;
            return;
        }
}

static zs_status boot_wait(MPI_Comm comm, MPI_Request *r, int rc, struct zs_comm *watch, const char *what)
{
    int rank = 0;

    MPI_Comm_rank(comm, &rank);
    if (rc != MPI_SUCCESS)
        return zs_fail(ZS_ERR_COMM, "NCCL set-up: %s failed", what);
    return zs_mpi_wait_timeout(r, watch ? watch->timeout_s : ZS_TIMEOUT_DEFAULT, rank, what, watch ? watch->shm : NULL);
}

/* Collective: every rank's GPU id into all (GPU_ID bytes each, by rank), which the caller frees. */
static zs_status gather_gpus(MPI_Comm comm, struct zs_comm *watch, char **all)
{
    MPI_Request r;
    char mine[GPU_ID] = { 0 }, host[MPI_MAX_PROCESSOR_NAME] = { 0 }, *buf;
    int dev = 0, hlen = 0, size = 0;
    zs_status st;

    cudaGetDevice(&dev);
    MPI_Get_processor_name(host, &hlen);
    MPI_Comm_size(comm, &size);
    if (cudaDeviceGetPCIBusId(mine, 24, dev) != cudaSuccess) {
        (void)cudaGetLastError(); /* tolerated: not the next launch's error */
        strcpy(mine, "?");
    }
    strncat(mine, "@", sizeof(mine) - strlen(mine) - 1);
    strncat(mine, host, sizeof(mine) - strlen(mine) - 1);
    *all = NULL;
    buf = calloc((size_t)size + 1, GPU_ID); /* every rank's, then this rank's own */
    if (!buf)
        return zs_fail(ZS_ERR_NOMEM, "NCCL set-up: out of memory");
    memcpy(buf + (size_t)size * GPU_ID, mine, GPU_ID);
    st = boot_wait(comm, &r, MPI_Iallgather(buf + (size_t)size * GPU_ID, GPU_ID, MPI_CHAR, buf, GPU_ID, MPI_CHAR, comm,
                                            &r), watch, "NCCL set-up: the all-gather of the ranks' GPUs");
    if (st)
        keep(buf);
    else
        *all = buf;
    return st;
}

zs_status zs_nccl_shared_gpu(MPI_Comm comm, struct zs_comm *watch, int32_t *a, int32_t *b, char *gpu, size_t len)
{
    char *all = NULL;
    int size = 0;
    zs_status st = gather_gpus(comm, watch, &all);

    *a = *b = -1;
    MPI_Comm_size(comm, &size);
    for (int32_t i = 0; !st && *a < 0 && i < size; i++)
        for (int32_t j = i + 1; *a < 0 && j < size; j++)
            if (!strcmp(all + (size_t)i * GPU_ID, all + (size_t)j * GPU_ID)) {
                *a = i;
                *b = j;
                snprintf(gpu, len, "%s", all + (size_t)i * GPU_ID);
            }
    free(all);
    return st;
}

/* NCCL refuses two ranks on one GPU, and says so obscurely: the ranks compare their GPUs' PCI addresses
 * first and name the pair. Collective. */
static zs_status check_distinct_gpus(MPI_Comm comm, struct zs_comm *watch)
{
    char gpu[GPU_ID];
    int32_t a, b;
    zs_status st = zs_nccl_shared_gpu(comm, watch, &a, &b, gpu, sizeof(gpu));

    if (st || a < 0)
        return st;
    return zs_fail(ZS_ERR_UNSUPPORTED, "NCCL needs one GPU per rank, and ranks %d and %d share %s (use the "
                   "host-staged transport for ranks sharing a GPU)", a, b, gpu);
}

/* Whether any rank failed so far, so that no rank walks into a collective the others skip. A rank that
 * failed keeps its own message; the others name it and `what` it was doing. */
static zs_status agree(struct zs_nccl *n, MPI_Comm comm, struct zs_comm *watch, zs_status st, const char *what)
{
    int32_t *v = malloc(2 * sizeof(*v)), first; /* this rank's, the highest failed rank */
    MPI_Request r;
    zs_status vote;

    if (!v)
        return st ? st : zs_fail(ZS_ERR_NOMEM, "NCCL set-up: out of memory");
    v[0] = st ? n->rank : -1;
    vote = boot_wait(comm, &r, MPI_Iallreduce(&v[0], &v[1], 1, MPI_INT32_T, MPI_MAX, comm, &r), watch,
                     "NCCL set-up: the all-reduce of the ranks' status");
    if (vote) {
        keep(v);
        return st ? st : vote;
    }
    first = v[1];
    free(v);
    if (st || first < 0)
        return st;
    return zs_fail(ZS_ERR_COMM, "NCCL set-up failed on rank %d (%s)", first, what);
}

size_t zs_nccl_piece_bytes(int32_t nranks)
{
    const char *e = getenv(ZS_TEST_HOOK_NCCL_PIECE);
    long long v = e ? atoll(e) : 0;

    return v >= 4 ? (size_t)v / 4 * 4 : zs_nccl_piece_default(nranks);
}

uint64_t zs_nccl_stage_bytes(int32_t nranks)
{
    return (uint64_t)nranks * zs_nccl_piece_bytes(nranks);
}

/* The communicator, non-blocking where libnccl can (its set-up then runs under the deadline too). Called only
 * once every rank has agreed that it got here (zs_nccl_init), so a blocking set-up (NCCL < 2.14) never waits
 * for a rank that failed before it; one that fails or stops inside NCCL's own set-up still holds the others
 * there, without a deadline (docs/gpu.md). */
static zs_status comm_start(struct zs_nccl *n, ncclUniqueId id)
{
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    ncclResult_t r;

    if (!n->api.init_config) {
        if (n->rank == 0)
            zs_log("warning: NCCL (libnccl.so.2) lacks ncclCommInitRankConfig (NCCL < 2.14): its set-up waits for "
                   "every rank without a deadline");
        r = n->api.comm_init_rank(&n->comm, n->size, id, n->rank);
        return r == ncclSuccess ? ZS_OK : zs_nccl_fail(n, r, "ncclCommInitRank");
    }
    cfg.blocking = 0;
    r = n->api.init_config(&n->comm, n->size, id, n->rank, &cfg);
    return zs_nccl_issued(n, r, "ncclCommInitRankConfig");
}

/* The stream, the events and the staging buffer: everything but the communicator. */
static zs_status cuda_start(struct zs_nccl *n)
{
    cudaError_t e = cudaStreamCreateWithFlags(&n->stream, cudaStreamNonBlocking);

    if (e == cudaSuccess)
        e = cudaEventCreateWithFlags(&n->ready, cudaEventDisableTiming);
    for (int i = 0; i < ZS_NCCL_RING && e == cudaSuccess; i++)
        e = cudaEventCreateWithFlags(&n->ops[i].done, cudaEventDisableTiming);
    if (e != cudaSuccess)
        return cuda_fail(n, e, "NCCL set-up: streams and events");
    e = cudaMalloc(&n->stage, zs_nccl_stage_bytes(n->size));
    return e == cudaSuccess ? ZS_OK : cuda_fail(n, e, "NCCL staging buffer");
}

/* What rank 0 broadcasts: its unique id, and whether it could make one. */
struct nccl_boot {
    ncclUniqueId id;
    int32_t ok;
};

/* Rank 0's unique id to every rank. The broadcast goes out whether or not ncclGetUniqueId worked, so the peers
 * learn of a failure at once rather than at their deadline, and no broadcast is left posted on comm for a later
 * one to match. After a timeout *b stays MPI's (kept) and is NULL here. */
static zs_status boot_id(struct zs_nccl *n, MPI_Comm comm, struct zs_comm *watch, struct nccl_boot **b)
{
    ncclResult_t r = ncclSuccess;
    MPI_Request rq;
    zs_status st;

    if (n->rank == 0) {
        r = n->api.get_unique_id(&(*b)->id);
        (*b)->ok = r == ncclSuccess;
    }
    st = boot_wait(comm, &rq, MPI_Ibcast(*b, sizeof(**b), MPI_BYTE, 0, comm, &rq), watch,
                   "NCCL set-up: the broadcast of the unique id");
    if (st) {
        keep(*b);
        *b = NULL;
        return st;
    }
    if ((*b)->ok)
        return ZS_OK;
    if (n->rank == 0)
        return zs_fail(ZS_ERR_COMM, "rank 0: ncclGetUniqueId: %s", n->api.error_string(r));
    return zs_fail(ZS_ERR_COMM, "NCCL set-up: rank 0 could not make a unique id (its ncclGetUniqueId failed)");
}

zs_status zs_nccl_init(struct zs_nccl **out, MPI_Comm comm, enum zs_nccl_mode mode, struct zs_comm *watch)
{
    struct zs_nccl *n = calloc(1, sizeof(*n));
    struct nccl_boot *boot = calloc(1, sizeof(*boot));
    zs_status st;

    *out = NULL;
    if (!n || !boot) {
        free(n);
        free(boot);
        return zs_fail(ZS_ERR_NOMEM, "NCCL set-up: out of memory");
    }
    n->mode = mode;
    if (cudaGetDevice(&n->dev) != cudaSuccess)
        (void)cudaGetLastError(); /* the set-up's first call on the GPU reports it */
    MPI_Comm_rank(comm, &n->rank);
    MPI_Comm_size(comm, &n->size);
    n->piece = zs_nccl_piece_bytes(n->size);
    n->timeout_s = watch ? watch->timeout_s : ZS_TIMEOUT_DEFAULT;
    n->shm = watch ? watch->shm : NULL;
    if (n->shm)
        zs_shm_nccl_count(n->shm); /* the set-up is counted, so a rank that never comes to it is named */
    st = agree(n, comm, watch, load_api(n), "loading libnccl.so.2");
    if (!st)
        st = check_distinct_gpus(comm, watch); /* the same gathered answer on every rank */
    if (!st)
        st = boot_id(n, comm, watch, &boot); /* rank 0's failure too reaches every rank */
    /* A staging cudaMalloc can fail on one rank alone: every rank hears of it before any enters NCCL's set-up,
     * which would wait for that rank until the deadline (or, blocking, for ever). */
    if (!st)
        st = agree(n, comm, watch, cuda_start(n), "its NCCL stream, events or staging buffer");
    if (st == ZS_ERR_COMM && strstr(zs_last_error(), "timeout: NCCL set-up"))
        st = zs_nccl_late(n, st);
    if (!st)
        st = comm_start(n, boot->id);
    free(boot);
    if (st) {
        zs_nccl_free(n);
        return st;
    }
    *out = n;
    return ZS_OK;
}

/* After a failure the communicator was aborted (comm_nccl_wait.c): nothing is waited for. Otherwise its work
 * is waited for under the deadline, and aborted if that fails. */
void zs_nccl_free(struct zs_nccl *n)
{
    if (!n)
        return;
    zs_nccl_use(n);
    if (n->comm && !n->broken && n->stream && !zs_nccl_wait_event(n, NULL, "the NCCL work left at close"))
        n->api.comm_destroy(n->comm);
    else if (n->comm)
        n->api.comm_abort(n->comm);
    if (n->stage)
        cudaFree(n->stage);
    for (int i = 0; i < ZS_NCCL_RING; i++)
        if (n->ops[i].done)
            cudaEventDestroy(n->ops[i].done);
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
    return zs_nccl_wait_event(n, NULL, "the NCCL stream's work");
}

/* A collective's start: refused after a failure; counted for the node (who_text); the communication stream
 * waits for what `after` has queued so far. */
static zs_status coll_begin(struct zs_nccl *n, void *after)
{
    cudaError_t e;

    zs_nccl_use(n);
    if (n->broken)
        return zs_fail(n->broken, "comm: rank %d: NCCL unusable after an earlier failure: %s", n->rank,
                       n->broken_why);
    if (n->shm)
        zs_shm_nccl_count(n->shm);
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

/* One piece of k elements at the same offset of every rank's chunk (buf: rank 0's piece; chunks `stride`
 * bytes apart): each rank's piece arrives in stage[j] (own piece copied), then one kernel sums them in rank
 * order. The next piece reuses the stage after this one's sum, in stream order. */
static zs_status ordered_piece(struct zs_nccl *n, const char *buf, size_t stride, zs_dtype dt_in, void *out,
                               zs_dtype dt_out, int64_t k, float scale)
{
    size_t bytes = (size_t)k * esz(dt_in);
    char *stage = n->stage;
    ncclResult_t r = ncclSuccess, r2;
    cudaError_t e;
    int err;

    e = cudaMemcpyAsync(stage + (size_t)n->rank * bytes, buf + (size_t)n->rank * stride, bytes,
                        cudaMemcpyDeviceToDevice, n->stream);
    if (e != cudaSuccess)
        return cuda_fail(n, e, "reduce-scatter: own chunk");
    n->api.group_start();
    for (int32_t j = 0; j < n->size && r == ncclSuccess; j++) {
        if (j == n->rank)
            continue;
        r = n->api.send(buf + (size_t)j * stride, bytes, ncclUint8, j, n->comm, n->stream);
        if (r == ncclSuccess)
            r = n->api.recv(stage + (size_t)j * bytes, bytes, ncclUint8, j, n->comm, n->stream);
    }
    r2 = n->api.group_end();
    if (r != ncclSuccess)
        return zs_nccl_fail(n, r, "reduce-scatter ncclSend/ncclRecv");
    if (zs_nccl_issued(n, r2, "reduce-scatter ncclSend/ncclRecv"))
        return n->broken;
    err = zs_cuda_sum_ranks(stage, dt_in, out, dt_out, k, n->size, scale, n->stream);
    return err ? cuda_fail(n, err, "reduce-scatter: rank-order sum") : ZS_OK;
}

/* Walks the chunks in pieces whose staging fits the buffer: each element's sum is the same whatever the
 * piece, so the bits are comm/comm.c's. */
static zs_status rs_ordered(struct zs_nccl *n, const char *buf, zs_dtype dt_in, void *out, zs_dtype dt_out,
                            int64_t count, float scale)
{
    int64_t per = (int64_t)(n->piece / esz(dt_in));
    zs_status st = ZS_OK;

    for (int64_t at = 0; !st && at < count; at += per)
        st = ordered_piece(n, buf + (size_t)at * esz(dt_in), (size_t)count * esz(dt_in), dt_in,
                           (char *)out + (size_t)at * esz(dt_out), dt_out, count - at < per ? count - at : per, scale);
    return st;
}

/* A 16-bit piece for NCCL's own sum: every rank's piece widened into stage[j] as fp32, summed there in place
 * (NCCL takes the receive buffer at this rank's piece of the send buffer), then scaled and narrowed by the
 * rank-order kernel over one "rank". */
static zs_status fast_piece(struct zs_nccl *n, const char *buf, size_t stride, zs_dtype dt_in, void *out,
                            zs_dtype dt_out, int64_t k, float scale)
{
    float *wide = n->stage, *mine = wide + (size_t)n->rank * (size_t)k;
    ncclResult_t r;
    int err = 0;

    for (int32_t j = 0; j < n->size && !err; j++)
        err = zs_cuda_sum_ranks(buf + (size_t)j * stride, dt_in, wide + (size_t)j * (size_t)k, ZS_DTYPE_FP32, k, 1,
                                1.0f, n->stream);
    if (err)
        return cuda_fail(n, err, "reduce-scatter: widen to fp32");
    r = n->api.reduce_scatter(wide, mine, (size_t)k, ncclFloat32, ncclSum, n->comm, n->stream);
    if (zs_nccl_issued(n, r, "ncclReduceScatter"))
        return n->broken;
    err = zs_cuda_sum_ranks(mine, ZS_DTYPE_FP32, out, dt_out, k, 1, scale, n->stream);
    return err ? cuda_fail(n, err, "reduce-scatter: scale and narrow") : ZS_OK;
}

/* NCCL's own sum (its ring or tree order: close to comm.c's rank-order sum, not bit-identical), in fp32:
 * fp32 inputs straight from buf, 16-bit ones in pieces through the staging buffer. */
static zs_status rs_fast(struct zs_nccl *n, const char *buf, zs_dtype dt_in, void *out, zs_dtype dt_out,
                         int64_t count, float scale)
{
    int64_t per = (int64_t)(n->piece / sizeof(float));
    ncclResult_t r;
    zs_status st = ZS_OK;
    int err;

    if (dt_in == ZS_DTYPE_FP32) { /* then dt_out is fp32 too */
        r = n->api.reduce_scatter(buf, out, (size_t)count, ncclFloat32, ncclSum, n->comm, n->stream);
        if (zs_nccl_issued(n, r, "ncclReduceScatter"))
            return n->broken;
        err = scale == 1.0f ? 0 : zs_cuda_scale(out, count, scale, n->stream);
        return err ? cuda_fail(n, err, "reduce-scatter: scale") : ZS_OK;
    }
    for (int64_t at = 0; !st && at < count; at += per)
        st = fast_piece(n, buf + (size_t)at * esz(dt_in), (size_t)count * esz(dt_in), dt_in,
                        (char *)out + (size_t)at * esz(dt_out), dt_out, count - at < per ? count - at : per, scale);
    return st;
}

zs_status zs_nccl_reduce_scatter(struct zs_nccl *n, const void *buf, zs_dtype dt_in, void *out, zs_dtype dt_out,
                                 int64_t count, float scale, void *after)
{
    zs_status st;

    if (count < 0 || (dt_out != ZS_DTYPE_FP32 && dt_out != dt_in))
        return zs_fail(ZS_ERR_INVALID, "NCCL reduce-scatter: output dtype must be fp32 or the input's");
    st = coll_begin(n, after);
    if (st || count == 0)
        return st;
    if (n->mode == ZS_NCCL_ORDERED)
        st = rs_ordered(n, buf, dt_in, out, dt_out, count, scale);
    else
        st = rs_fast(n, buf, dt_in, out, dt_out, count, scale);
    if (!st)
        zs_nccl_mark(n, n->mode == ZS_NCCL_ORDERED ? "reduce-scatter (ordered: ncclSend/ncclRecv)" : "ncclReduceScatter",
                     (uint64_t)count * (uint64_t)n->size * esz(dt_in));
    return st;
}

zs_status zs_nccl_all_gather(struct zs_nccl *n, void *buf, zs_dtype dt, int64_t count, void *after)
{
    size_t chunk = (size_t)count * esz(dt);
    zs_status st = coll_begin(n, after);
    ncclResult_t r;

    if (st || count <= 0)
        return st;
    /* in place: NCCL takes the send buffer at this rank's offset of the receive buffer */
    r = n->api.all_gather((char *)buf + (size_t)n->rank * chunk, buf, (size_t)count, nccl_type(dt), n->comm,
                          n->stream);
    if (zs_nccl_issued(n, r, "ncclAllGather"))
        return n->broken;
    zs_nccl_mark(n, "ncclAllGather", chunk * (size_t)n->size);
    return ZS_OK;
}

zs_status zs_nccl_all_reduce(struct zs_nccl *n, void *buf, zs_dtype dt, int64_t count, float scale, void *after)
{
    void *mine = (char *)buf + (size_t)n->rank * (size_t)count * esz(dt);
    zs_status st = zs_nccl_reduce_scatter(n, buf, dt, mine, dt, count, scale, after);

    return st ? st : zs_nccl_all_gather(n, buf, dt, count, NULL);
}
