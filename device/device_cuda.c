/* device_cuda.c - a CUDA GPU as the device: cudaMalloc'd memory (never managed memory), asynchronous copies,
 * streams and events, and the optimizer kernels of kernels/optim_cuda.cu. Built only with the CUDA
 * backend (CMakeLists.txt); plain C against the CUDA runtime API. */
#include <cuda_runtime_api.h>

#include "base/error.h" /* defines: zs_fail */
#include "kernels/gradops.h" /* defines: zs_cuda_grad_accumulate, zs_cuda_grad_scale, zs_cuda_grad_convert, zs_cuda_grad_sumsq[_free] */
#include "device.h"

/* The error is the caller's status from here on, so the thread's last error is cleared: left there, the next
 * kernel launch's check would report it as its own, and so would a host program's cudaGetLastError. */
static zs_status cuda_fail(cudaError_t e, const char *what)
{
    cudaGetLastError();
    return zs_fail(e == cudaErrorMemoryAllocation ? ZS_ERR_NOMEM : ZS_ERR_UNSUPPORTED, "%s: %s (%s)", what,
                   cudaGetErrorString(e), cudaGetErrorName(e));
}

/* CUDA keeps the current device per host thread (0 on a new one), and a kernel launched on a stream of
 * another device fails, while memory, streams and events made there land on GPU 0. A framework may call the
 * engine from a thread other than zs_init's, so every op that calls the runtime makes the rank's GPU current
 * first. The runtime's own answer is asked, not a cache of ours: the program may switch the thread's device
 * between our calls (PyTorch's device guards do), and cudaGetDevice reads thread-local state. */
static cudaError_t cuda_use(const struct zs_device *d)
{
    int cur = -1;

    if (cudaGetDevice(&cur) == cudaSuccess && cur == d->ordinal)
        return cudaSuccess;
    return cudaSetDevice(d->ordinal);
}

#define CUDA_USE(d)                                                                         \
    do {                                                                                    \
        cudaError_t use_ = cuda_use(d);                                                     \
        if (use_ != cudaSuccess)                                                            \
            return cuda_fail(use_, "cudaSetDevice (the rank's GPU, on the calling thread)"); \
    } while (0)

/* For the ops that return nothing: a free goes on whatever happens (the runtime finds the object's device). */
static void cuda_use_quiet(const struct zs_device *d)
{
    if (cuda_use(d) != cudaSuccess)
        cudaGetLastError();
}

static int32_t cuda_count(void)
{
    int n = 0;

    if (cudaGetDeviceCount(&n) == cudaSuccess)
        return n;
    cudaGetLastError(); /* no driver or no GPU: an answer (0), not an error to leave behind */
    return 0;
}

/* The node-local rank picks the GPU, round robin: ranks beyond the GPU count share one, which the CUDA
 * runtime allows (NCCL does not: its transport needs one GPU per rank). */
static zs_status cuda_open(struct zs_device *d, int32_t local_rank, int32_t local_size)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);

    if (e != cudaSuccess)
        return cuda_fail(e, "no CUDA device visible (cudaGetDeviceCount)");
    if (n <= 0)
        return zs_fail(ZS_ERR_UNSUPPORTED, "no CUDA device visible (cudaGetDeviceCount found 0)");
    d->ordinal = local_rank % n;
    e = cudaSetDevice(d->ordinal);
    if (e != cudaSuccess)
        return cuda_fail(e, "cudaSetDevice");
    /* the program's kernels and the engine's copies meet on this one stream */
    e = cudaStreamCreateWithFlags((cudaStream_t *)&d->own_compute, cudaStreamNonBlocking);
    d->compute = d->own_compute;
    return e == cudaSuccess ? ZS_OK : cuda_fail(e, "cudaStreamCreateWithFlags (compute stream)");
}

static void cuda_close(struct zs_device *d)
{
    cuda_use_quiet(d);
    zs_cuda_grad_sumsq_free(d->norm_scratch);
    d->norm_scratch = NULL;
    if (d->switch_ev && cudaEventDestroy((cudaEvent_t)d->switch_ev) != cudaSuccess)
        cudaGetLastError();
    if (d->sync_ev && cudaEventDestroy((cudaEvent_t)d->sync_ev) != cudaSuccess)
        cudaGetLastError();
    /* a stream the program handed over (zs_cuda_set_stream) is the program's to destroy */
    if (d->own_compute && cudaStreamDestroy((cudaStream_t)d->own_compute) != cudaSuccess)
        cudaGetLastError();
    d->compute = d->own_compute = NULL;
    d->switch_ev = d->sync_ev = NULL;
}

static void *cuda_alloc(struct zs_device *d, size_t bytes)
{
    void *p = NULL;

    if (cuda_use(d) != cudaSuccess || cudaMalloc(&p, bytes ? bytes : 64) != cudaSuccess) {
        cudaGetLastError(); /* the caller names the failure (out of memory) */
        return NULL;
    }
    /* cudaMemset queues on the legacy default stream and, on device memory, returns before it runs; our
     * streams are non-blocking, so nothing would order a later upload on the compute stream after the zeroing
     * (tests/cuda_emu found it): it is done before the memory is handed out */
    if (cudaMemset(p, 0, bytes ? bytes : 64) != cudaSuccess || cudaStreamSynchronize(0) != cudaSuccess) {
        cudaFree(p);
        cudaGetLastError();
        return NULL;
    }
    return p;
}

/* The void ops' errors are the broken device's, reported by the next call that returns one; each is cleared
 * so that a later launch does not take it for its own. */
static void cuda_free(struct zs_device *d, void *p)
{
    cuda_use_quiet(d);
    if (cudaFree(p) != cudaSuccess)
        cudaGetLastError();
}

static zs_status cuda_copy(struct zs_device *d, void *dst, const void *src, size_t bytes, enum zs_copy_dir dir,
                           struct zs_dev_stream *s)
{
    /* the runtime tells the sides apart by address (unified addressing), so pageable, pinned and device
     * memory all copy right whatever dir says */
    enum cudaMemcpyKind kind = cudaMemcpyDefault;
    cudaError_t e;

    CUDA_USE(d);
    e = bytes ? cudaMemcpyAsync(dst, src, bytes, kind, (cudaStream_t)s) : cudaSuccess;
    return e == cudaSuccess ? ZS_OK : cuda_fail(e, "cudaMemcpyAsync");
}

/* Non-blocking: a stream of ours never waits for the legacy default stream, only for the events it is
 * told to. */
static zs_status cuda_stream_create(struct zs_device *d, struct zs_dev_stream **s)
{
    cudaStream_t cs;
    cudaError_t e;

    CUDA_USE(d);
    e = cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking);
    if (e != cudaSuccess)
        return cuda_fail(e, "cudaStreamCreateWithFlags");
    *s = (struct zs_dev_stream *)cs;
    return ZS_OK;
}

static void cuda_stream_free(struct zs_device *d, struct zs_dev_stream *s)
{
    cuda_use_quiet(d);
    if (s && cudaStreamDestroy((cudaStream_t)s) != cudaSuccess)
        cudaGetLastError();
}

static zs_status cuda_stream_sync(struct zs_device *d, struct zs_dev_stream *s)
{
    cudaError_t e;

    CUDA_USE(d);
    e = cudaStreamSynchronize((cudaStream_t)s);
    return e == cudaSuccess ? ZS_OK : cuda_fail(e, "cudaStreamSynchronize");
}

static zs_status cuda_event_create(struct zs_device *d, struct zs_dev_event **ev)
{
    cudaEvent_t ce;
    cudaError_t e;

    CUDA_USE(d);
    e = cudaEventCreateWithFlags(&ce, cudaEventDisableTiming);
    if (e != cudaSuccess)
        return cuda_fail(e, "cudaEventCreateWithFlags");
    *ev = (struct zs_dev_event *)ce;
    return ZS_OK;
}

static void cuda_event_free(struct zs_device *d, struct zs_dev_event *ev)
{
    cuda_use_quiet(d);
    if (ev && cudaEventDestroy((cudaEvent_t)ev) != cudaSuccess)
        cudaGetLastError();
}

static zs_status cuda_event_record(struct zs_device *d, struct zs_dev_event *ev, struct zs_dev_stream *s)
{
    cudaError_t e;

    CUDA_USE(d);
    e = cudaEventRecord((cudaEvent_t)ev, (cudaStream_t)s);
    return e == cudaSuccess ? ZS_OK : cuda_fail(e, "cudaEventRecord");
}

static zs_status cuda_event_query(struct zs_device *d, struct zs_dev_event *ev, bool *done)
{
    cudaError_t e;

    CUDA_USE(d);
    e = cudaEventQuery((cudaEvent_t)ev);
    *done = e == cudaSuccess;
    if (e == cudaErrorNotReady)
        cudaGetLastError(); /* an answer, not a failure: it must not stay the thread's last error */
    return e == cudaSuccess || e == cudaErrorNotReady ? ZS_OK : cuda_fail(e, "cudaEventQuery");
}

static zs_status cuda_event_sync(struct zs_device *d, struct zs_dev_event *ev)
{
    cudaError_t e;

    CUDA_USE(d);
    e = cudaEventSynchronize((cudaEvent_t)ev);
    return e == cudaSuccess ? ZS_OK : cuda_fail(e, "cudaEventSynchronize");
}

static zs_status cuda_stream_wait(struct zs_device *d, struct zs_dev_stream *s, struct zs_dev_event *ev)
{
    cudaError_t e;

    CUDA_USE(d);
    e = cudaStreamWaitEvent((cudaStream_t)s, (cudaEvent_t)ev, 0);
    return e == cudaSuccess ? ZS_OK : cuda_fail(e, "cudaStreamWaitEvent");
}

static zs_status cuda_optim(struct zs_device *d, const struct zs_optim_launch *l, struct zs_dev_stream *s)
{
    int e;

    CUDA_USE(d);
    e = zs_cuda_optim_launch(l, s);
    if (e)
        return cuda_fail((cudaError_t)e, zs_kopt_name(l->opt));
    return ZS_OK;
}

static zs_status cuda_zero(struct zs_device *d, void *p, size_t bytes, struct zs_dev_stream *s)
{
    cudaError_t e;

    CUDA_USE(d);
    e = bytes ? cudaMemsetAsync(p, 0, bytes, (cudaStream_t)s) : cudaSuccess;
    return e == cudaSuccess ? ZS_OK : cuda_fail(e, "cudaMemsetAsync");
}

static zs_status kernel_status(int e, const char *what)
{
    return e ? cuda_fail((cudaError_t)e, what) : ZS_OK;
}

static zs_status cuda_accumulate(struct zs_device *d, void *dst, const void *src, zs_dtype dt, int64_t n,
                                 struct zs_dev_stream *s)
{
    CUDA_USE(d);
    return kernel_status(zs_cuda_grad_accumulate(dst, src, dt, n, s), "gradient accumulation kernel");
}

static zs_status cuda_scale(struct zs_device *d, void *x, zs_dtype dt, int64_t n, float f, struct zs_dev_stream *s)
{
    CUDA_USE(d);
    return kernel_status(zs_cuda_grad_scale(x, dt, n, f, s), "gradient scale kernel");
}

static zs_status cuda_convert(struct zs_device *d, void *dst, zs_dtype dt, const float *src, int64_t n,
                              struct zs_dev_stream *s)
{
    CUDA_USE(d);
    return kernel_status(zs_cuda_grad_convert(dst, dt, src, n, s), "conversion kernel");
}

static zs_status cuda_sumsq(struct zs_device *d, const void *const *x, const int64_t *n, int32_t count, zs_dtype dt,
                            double *out, struct zs_dev_stream *s)
{
    CUDA_USE(d);
    return kernel_status(zs_cuda_grad_sumsq(&d->norm_scratch, x, n, count, dt, out, s), "gradient norm kernel");
}

static zs_status cuda_host_register(struct zs_device *d, void *p, size_t bytes)
{
    cudaError_t e;

    CUDA_USE(d); /* else a new thread's pin makes a context on GPU 0 */
    e = cudaHostRegister(p, bytes, cudaHostRegisterDefault);
    return e == cudaSuccess ? ZS_OK : cuda_fail(e, "cudaHostRegister (pinned host staging)");
}

static void cuda_host_unregister(struct zs_device *d, void *p)
{
    cuda_use_quiet(d);
    if (cudaHostUnregister(p) != cudaSuccess)
        cudaGetLastError();
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
    .event_record = cuda_event_record, .event_query = cuda_event_query, .event_sync = cuda_event_sync,
    .stream_wait = cuda_stream_wait,
    .optim = cuda_optim, .zero = cuda_zero,
    .accumulate = cuda_accumulate, .scale = cuda_scale, .convert = cuda_convert, .sumsq = cuda_sumsq,
    .host_register = cuda_host_register, .host_unregister = cuda_host_unregister, .pci_bus_id = cuda_pci_bus_id,
};
