/* device_cuda.c - a CUDA GPU as the device: cudaMalloc'd memory (never managed memory), asynchronous copies,
 * streams and events, and the optimizer kernels of kernels/optim_cuda.cu. Built only with the CUDA
 * backend (CMakeLists.txt); plain C against the CUDA runtime API. */
#include <cuda_runtime_api.h>

#include "base/error.h" /* defines: zs_fail */
#include "kernels/gradops.h" /* defines: zs_cuda_grad_accumulate, zs_cuda_grad_scale, zs_cuda_grad_convert, zs_cuda_grad_sumsq[_free] */
#include "device.h"

static zs_status cuda_fail(cudaError_t e, const char *what)
{
    return zs_fail(e == cudaErrorMemoryAllocation ? ZS_ERR_NOMEM : ZS_ERR_UNSUPPORTED, "%s: %s (%s)", what,
                   cudaGetErrorString(e), cudaGetErrorName(e));
}

static int32_t cuda_count(void)
{
    int n = 0;

    return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

/* The node-local rank picks the GPU, round robin: ranks beyond the GPU count share one, which the CUDA
 * runtime allows (NCCL does not: its transport needs one GPU per rank). */
static zs_status cuda_open(struct zs_device *d, int32_t local_rank, int32_t local_size)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);

    if (e != cudaSuccess)
        return zs_fail(ZS_ERR_UNSUPPORTED, "no CUDA device visible (cudaGetDeviceCount: %s)", cudaGetErrorString(e));
    if (n <= 0)
        return zs_fail(ZS_ERR_UNSUPPORTED, "no CUDA device visible (cudaGetDeviceCount found 0)");
    d->ordinal = local_rank % n;
    e = cudaSetDevice(d->ordinal);
    if (e != cudaSuccess)
        return cuda_fail(e, "cudaSetDevice");
    /* the program's kernels and the engine's copies meet on this one stream */
    e = cudaStreamCreateWithFlags((cudaStream_t *)&d->compute, cudaStreamNonBlocking);
    return e == cudaSuccess ? ZS_OK : cuda_fail(e, "cudaStreamCreateWithFlags (compute stream)");
}

static void cuda_close(struct zs_device *d)
{
    zs_cuda_grad_sumsq_free(d->norm_scratch);
    d->norm_scratch = NULL;
    if (d->compute)
        cudaStreamDestroy((cudaStream_t)d->compute);
    d->compute = NULL;
}

static void *cuda_alloc(struct zs_device *d, size_t bytes)
{
    void *p = NULL;

    if (cudaMalloc(&p, bytes ? bytes : 64) != cudaSuccess)
        return NULL;
    /* cudaMemset queues on the legacy default stream and, on device memory, returns before it runs; our
     * streams are non-blocking, so nothing would order a later upload on the compute stream after the zeroing
     * (tests/cuda_emu found it): it is done before the memory is handed out */
    if (cudaMemset(p, 0, bytes ? bytes : 64) != cudaSuccess || cudaStreamSynchronize(0) != cudaSuccess) {
        cudaFree(p);
        return NULL;
    }
    return p;
}

static void cuda_free(struct zs_device *d, void *p)
{
    cudaFree(p);
}

static zs_status cuda_copy(struct zs_device *d, void *dst, const void *src, size_t bytes, enum zs_copy_dir dir,
                           struct zs_dev_stream *s)
{
    /* the runtime tells the sides apart by address (unified addressing), so pageable, pinned and device
     * memory all copy right whatever dir says */
    enum cudaMemcpyKind kind = cudaMemcpyDefault;
    cudaError_t e = bytes ? cudaMemcpyAsync(dst, src, bytes, kind, (cudaStream_t)s) : cudaSuccess;

    return e == cudaSuccess ? ZS_OK : cuda_fail(e, "cudaMemcpyAsync");
}

/* Non-blocking: a stream of ours never waits for the legacy default stream, only for the events it is
 * told to. */
static zs_status cuda_stream_create(struct zs_device *d, struct zs_dev_stream **s)
{
    cudaStream_t cs;
    cudaError_t e = cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking);

    if (e != cudaSuccess)
        return cuda_fail(e, "cudaStreamCreateWithFlags");
    *s = (struct zs_dev_stream *)cs;
    return ZS_OK;
}

static void cuda_stream_free(struct zs_device *d, struct zs_dev_stream *s)
{
    if (s)
        cudaStreamDestroy((cudaStream_t)s);
}

static zs_status cuda_stream_sync(struct zs_device *d, struct zs_dev_stream *s)
{
    cudaError_t e = cudaStreamSynchronize((cudaStream_t)s);

    return e == cudaSuccess ? ZS_OK : cuda_fail(e, "cudaStreamSynchronize");
}

static zs_status cuda_event_create(struct zs_device *d, struct zs_dev_event **ev)
{
    cudaEvent_t ce;
    cudaError_t e = cudaEventCreateWithFlags(&ce, cudaEventDisableTiming);

    if (e != cudaSuccess)
        return cuda_fail(e, "cudaEventCreateWithFlags");
    *ev = (struct zs_dev_event *)ce;
    return ZS_OK;
}

static void cuda_event_free(struct zs_device *d, struct zs_dev_event *ev)
{
    if (ev)
        cudaEventDestroy((cudaEvent_t)ev);
}

static zs_status cuda_event_record(struct zs_device *d, struct zs_dev_event *ev, struct zs_dev_stream *s)
{
    cudaError_t e = cudaEventRecord((cudaEvent_t)ev, (cudaStream_t)s);

    return e == cudaSuccess ? ZS_OK : cuda_fail(e, "cudaEventRecord");
}

static zs_status cuda_event_query(struct zs_device *d, struct zs_dev_event *ev, bool *done)
{
    cudaError_t e = cudaEventQuery((cudaEvent_t)ev);

    *done = e == cudaSuccess;
    return e == cudaSuccess || e == cudaErrorNotReady ? ZS_OK : cuda_fail(e, "cudaEventQuery");
}

static zs_status cuda_stream_wait(struct zs_device *d, struct zs_dev_stream *s, struct zs_dev_event *ev)
{
    cudaError_t e = cudaStreamWaitEvent((cudaStream_t)s, (cudaEvent_t)ev, 0);

    return e == cudaSuccess ? ZS_OK : cuda_fail(e, "cudaStreamWaitEvent");
}

static zs_status cuda_optim(struct zs_device *d, const struct zs_optim_launch *l, struct zs_dev_stream *s)
{
    int e = zs_cuda_optim_launch(l, s);

    if (e)
        return cuda_fail((cudaError_t)e, zs_kopt_name(l->opt));
    return ZS_OK;
}

static zs_status cuda_zero(struct zs_device *d, void *p, size_t bytes, struct zs_dev_stream *s)
{
    cudaError_t e = bytes ? cudaMemsetAsync(p, 0, bytes, (cudaStream_t)s) : cudaSuccess;

    return e == cudaSuccess ? ZS_OK : cuda_fail(e, "cudaMemsetAsync");
}

static zs_status kernel_status(int e, const char *what)
{
    return e ? cuda_fail((cudaError_t)e, what) : ZS_OK;
}

static zs_status cuda_accumulate(struct zs_device *d, void *dst, const void *src, zs_dtype dt, int64_t n,
                                 struct zs_dev_stream *s)
{
    return kernel_status(zs_cuda_grad_accumulate(dst, src, dt, n, s), "gradient accumulation kernel");
}

static zs_status cuda_scale(struct zs_device *d, void *x, zs_dtype dt, int64_t n, float f, struct zs_dev_stream *s)
{
    return kernel_status(zs_cuda_grad_scale(x, dt, n, f, s), "gradient scale kernel");
}

static zs_status cuda_convert(struct zs_device *d, void *dst, zs_dtype dt, const float *src, int64_t n,
                              struct zs_dev_stream *s)
{
    return kernel_status(zs_cuda_grad_convert(dst, dt, src, n, s), "conversion kernel");
}

static zs_status cuda_sumsq(struct zs_device *d, const void *const *x, const int64_t *n, int32_t count, zs_dtype dt,
                            double *out, struct zs_dev_stream *s)
{
    return kernel_status(zs_cuda_grad_sumsq(&d->norm_scratch, x, n, count, dt, out, s), "gradient norm kernel");
}

static zs_status cuda_host_register(struct zs_device *d, void *p, size_t bytes)
{
    cudaError_t e = cudaHostRegister(p, bytes, cudaHostRegisterDefault);

    return e == cudaSuccess ? ZS_OK : cuda_fail(e, "cudaHostRegister (pinned host staging)");
}

static void cuda_host_unregister(struct zs_device *d, void *p)
{
    cudaHostUnregister(p);
}

static zs_status cuda_pci_bus_id(struct zs_device *d, char *buf, size_t len)
{
    cudaError_t e = cudaDeviceGetPCIBusId(buf, (int)len, d->ordinal);

    return e == cudaSuccess ? ZS_OK : cuda_fail(e, "cudaDeviceGetPCIBusId");
}

const struct zs_device_ops zs_device_cuda_ops = {
    .name = "cuda", .count = cuda_count, .open = cuda_open, .close = cuda_close, .alloc = cuda_alloc,
    .free = cuda_free, .copy = cuda_copy, .stream_create = cuda_stream_create, .stream_free = cuda_stream_free,
    .stream_sync = cuda_stream_sync, .event_create = cuda_event_create, .event_free = cuda_event_free,
    .event_record = cuda_event_record, .event_query = cuda_event_query, .stream_wait = cuda_stream_wait,
    .optim = cuda_optim, .zero = cuda_zero,
    .accumulate = cuda_accumulate, .scale = cuda_scale, .convert = cuda_convert, .sumsq = cuda_sumsq,
    .host_register = cuda_host_register, .host_unregister = cuda_host_unregister, .pci_bus_id = cuda_pci_bus_id,
};
