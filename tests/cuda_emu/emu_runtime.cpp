/* emu_runtime.cpp (tests/cuda_emu) - the CUDA runtime stand-in of cuda_runtime_api.h: streams as queues run
 * as late as CUDA's ordering rules allow, events as positions in a stream's queue, a last error and a current
 * device per host thread as the runtime keeps them, kernel faults that break the context. Memory: emu_memory.cpp. */
#include "emu_internal.h"

#include <stdarg.h>
#include <time.h>

namespace emu_rt {

static std::recursive_mutex lock;
static thread_local int held; /* how deep this thread holds `lock` (spin() lets go of every level) */

guard::guard()
{
    lock.lock();
    held++;
}

guard::~guard()
{
    held--;
    lock.unlock();
}

emu_stream legacy[EMU_MAX_GPUS]; /* stream 0 of each device */
std::set<emu_stream *> streams = [] {
    std::set<emu_stream *> all;
    for (int d = 0; d < EMU_MAX_GPUS; d++) {
        legacy[d].dev = d;
        all.insert(&legacy[d]);
    }
    return all;
}();
/* CUDA keeps the last error and the current device per host thread; a new thread starts on device 0 */
static thread_local cudaError_t last_error = cudaSuccess;
static thread_local int current;
cudaError_t sticky = cudaSuccess;

static std::set<emu_event *> events;
static unsigned long long ran_ops, launches;
static int depth; /* nested waits while running a queue */

cudaError_t fail(cudaError_t e, const char *fmt, ...)
{
    va_list ap;

    fprintf(stderr, "cuda_emu: ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, ": %s\n", cudaGetErrorName(e));
    return last_error = e;
}

/* The answer of a query whose work has not finished: an error like any other for cudaGetLastError (PyTorch
 * clears it after such a query for this reason), but nothing to print. */
static cudaError_t not_ready(void) { return last_error = cudaErrorNotReady; }

/* What every call after a kernel fault returns. */
cudaError_t broken(void) { return last_error = sticky; }

emu_stream *stream_of(cudaStream_t s) { return s ? s : &legacy[current]; }

int current_device(void) { return current; }

bool live(emu_stream *s) { return streams.count(s) && !s->destroyed; }

/* Runs s's queue until `upto` operations have run or one is not ready yet; whether it got there. A wait met on
 * the way first runs the stream it waits on as far as its event. */
bool run_until(emu_stream *s, unsigned long long upto)
{
    if (++depth > 64) {
        fprintf(stderr, "cuda_emu: streams wait on each other in a cycle (a GPU would hang)\n");
        abort();
    }
    while (s->done < upto && !s->q.empty()) {
        if (s->q.front().ready && !s->q.front().ready())
            break;
        std::function<void()> op = std::move(s->q.front().run);
        s->q.pop_front();
        op();
        s->done++;
        ran_ops++;
    }
    depth--;
    return s->done >= upto;
}

/* A synchronizing call meets an operation that is not ready: it lets go of the lock (so the threads that make
 * it ready can call in), sleeps a moment and looks again, as a host blocked in cudaStreamSynchronize does.
 * A sleep, not sched_yield: on a loaded machine a task that yields waits behind every busy task on its core
 * before it runs again (see base/backoff.h), so a rank that yields here while its peer works comes back
 * milliseconds late at every exchange. */
static void spin(void)
{
    int n = held;
    struct timespec ts = { 0, 20000 };

    for (int i = 0; i < n; i++)
        lock.unlock();
    nanosleep(&ts, nullptr);
    for (int i = 0; i < n; i++)
        lock.lock();
}

void drain(emu_stream *s, unsigned long long upto)
{
    while (!run_until(s, upto))
        spin();
}

/* Every stream of device dev (-1: of every device) run to its end. */
void drain_all(int dev)
{
    for (;;) {
        bool left = false;
        for (emu_stream *s : streams)
            if (dev < 0 || s->dev == dev)
                left = !run_until(s, s->issued) || left;
        if (!left)
            return;
        spin();
    }
}

/* ZS_CUDA_EMU=eager runs each operation when it is queued, as if the GPU were always idle: a test that fails
 * only without it depends on an order CUDA does not promise. */
static bool eager(void)
{
    static int e = -1;

    if (e < 0) {
        const char *v = getenv("ZS_CUDA_EMU");
        e = v && !strcmp(v, "eager");
    }
    return e;
}

void enqueue(emu_stream *s, emu_op op)
{
    s->q.push_back(std::move(op));
    s->issued++;
    if (eager())
        run_until(s, s->issued);
}

/* ZS_CUDA_EMU_FAULT=K: the K-th kernel launched in the process (from 1) faults when it runs, as one that
 * reads a wild address does. Read at each launch, so a test can set it late. */
static unsigned long long fault_at(void)
{
    const char *v = getenv("ZS_CUDA_EMU_FAULT");
    long long k = v ? atoll(v) : 0;

    return k > 0 ? (unsigned long long)k : 0;
}

} // namespace emu_rt

using namespace emu_rt;

void emu_enqueue(cudaStream_t s, std::function<void()> op)
{
    guard g;

    enqueue(stream_of(s), emu_op{ nullptr, std::move(op) });
}

void emu_enqueue_until(cudaStream_t s, std::function<bool()> ready, std::function<void()> op)
{
    guard g;

    enqueue(stream_of(s), emu_op{ std::move(ready), std::move(op) });
}

/* A kernel runs in the context of its stream's device, so the stream must be the current device's (a launch
 * elsewhere fails through the last error, as CUDA's does); the K-th (ZS_CUDA_EMU_FAULT) is queued as a fault
 * instead, which the launch does not report: the next synchronizing call does. */
void emu_enqueue_kernel(cudaStream_t s, std::function<void()> kernel)
{
    guard g;
    emu_stream *q = stream_of(s);

    if (sticky) {
        broken();
        return;
    }
    if (!live(q)) {
        fail(cudaErrorInvalidResourceHandle, "kernel launch on a destroyed stream");
        return;
    }
    if (q->dev != current) {
        fail(cudaErrorInvalidResourceHandle, "kernel launch on a stream of device %d while device %d is current",
             q->dev, current);
        return;
    }
    if (++launches == fault_at()) {
        unsigned long long k = launches;
        kernel = [k]() {
            fprintf(stderr, "cuda_emu: kernel %llu faults (ZS_CUDA_EMU_FAULT)\n", k);
            sticky = cudaErrorIllegalAddress;
        };
    }
    enqueue(q, emu_op{ nullptr, std::move(kernel) });
}

void emu_launch_error(cudaError_t e, const char *what)
{
    guard g;

    fail(e, "%s", what);
}

extern "C" {

void zs_emu_counts(unsigned long long *ran, unsigned long long *queued)
{
    guard g;

    *ran = ran_ops;
    *queued = 0;
    for (emu_stream *s : streams)
        *queued += s->q.size();
}

unsigned long long zs_emu_launches(void)
{
    guard g;

    return launches;
}

const char *cudaGetErrorName(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorHostMemoryAlreadyRegistered: return "cudaErrorHostMemoryAlreadyRegistered";
    case cudaErrorHostMemoryNotRegistered: return "cudaErrorHostMemoryNotRegistered";
    }
    return "cudaErrorUnknown";
}

const char *cudaGetErrorString(cudaError_t e) { return e ? "emulated CUDA error" : "no error"; }

/* This thread's last error, cleared; a fault stays (a broken context cannot be cleared). */
cudaError_t cudaGetLastError(void)
{
    guard g;
    cudaError_t e = sticky ? sticky : last_error;

    last_error = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void)
{
    guard g;

    return sticky ? sticky : last_error;
}

/* ---------------------------------------------------------------- the device */

/* ZS_CUDA_EMU_GPUS=N: the GPUs each process sees (1 by default). Each process emulates the ones it picks on its
 * own; ranks that pick the same ordinal share it (the same PCI address), as on one host. */
static int gpus(void)
{
    const char *e = getenv("ZS_CUDA_EMU_GPUS");
    int n = e ? atoi(e) : 1;

    return n < 1 ? 1 : n > EMU_MAX_GPUS ? EMU_MAX_GPUS : n;
}

/* Device d's PCI bus number. ZS_CUDA_EMU_BUS=local: each process sees its own of the node's GPUs, from its
 * node-local rank (Open MPI's OMPI_COMM_WORLD_LOCAL_RANK), as per-rank CUDA_VISIBLE_DEVICES (Slurm, torchrun)
 * shows every rank one GPU with its own bus id. */
static int bus_of(int d)
{
    const char *e = getenv("ZS_CUDA_EMU_BUS"), *l = getenv("OMPI_COMM_WORLD_LOCAL_RANK");

    return d + 1 + (e && !strcmp(e, "local") && l ? atoi(l) * gpus() : 0);
}

cudaError_t cudaGetDeviceCount(int *n)
{
    *n = gpus();
    return cudaSuccess;
}

/* For the calling thread only, as CUDA's current device is. */
cudaError_t cudaSetDevice(int d)
{
    guard g;

    if (d < 0 || d >= gpus())
        return fail(cudaErrorInvalidDevice, "cudaSetDevice(%d)", d);
    current = d;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *d)
{
    *d = current;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetPCIBusId(char *bus, int len, int d)
{
    guard g;

    if (d < 0 || d >= gpus() || len < 1)
        return fail(cudaErrorInvalidValue, "cudaDeviceGetPCIBusId");
    snprintf(bus, (size_t)len, "0000:%02x:00.0", bus_of(d));
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int d)
{
    guard g;

    if (d < 0 || d >= gpus())
        return fail(cudaErrorInvalidDevice, "cudaGetDeviceProperties");
    memset(p, 0, sizeof(*p));
    snprintf(p->name, sizeof(p->name), "ZeroShard CUDA emulator (tests/cuda_emu)");
    p->totalGlobalMem = (size_t)16 << 30;
    p->major = 9;
    p->pciBusID = bus_of(d);
    p->multiProcessorCount = 4;
    p->warpSize = 32;
    p->maxThreadsPerBlock = 1024;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr a, int d)
{
    struct cudaDeviceProp p;
    cudaError_t e = cudaGetDeviceProperties(&p, d);

    if (e)
        return e;
    switch (a) {
    case cudaDevAttrMaxThreadsPerBlock: *v = p.maxThreadsPerBlock; return cudaSuccess;
    case cudaDevAttrMultiProcessorCount: *v = p.multiProcessorCount; return cudaSuccess;
    case cudaDevAttrComputeCapabilityMajor: *v = p.major; return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor: *v = p.minor; return cudaSuccess;
    }
    return fail(cudaErrorInvalidValue, "cudaDeviceGetAttribute");
}

/* The current device's streams, run to their ends. */
cudaError_t cudaDeviceSynchronize(void)
{
    guard g;

    STICKY();
    drain_all(current);
    STICKY();
    return cudaSuccess;
}

/* ---------------------------------------------------------------- streams and events */

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags)
{
    guard g;

    STICKY();
    *s = new emu_stream;
    (*s)->dev = current;
    streams.insert(*s);
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }

/* CUDA lets queued work finish after the destroy and returns at once: here what can run runs first, and a
 * stream held by an operation that is not ready (a collective whose peer is gone) stays, unusable, for the
 * device's synchronizations and the events recorded on it. */
cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    guard g;

    STICKY();
    if (!s || !live(s))
        return fail(cudaErrorInvalidResourceHandle, "cudaStreamDestroy");
    if (!run_until(s, s->issued)) {
        s->destroyed = true;
        return cudaSuccess;
    }
    streams.erase(s);
    for (emu_event *e : events)
        if (e->s == s)
            e->s = nullptr; /* complete */
    delete s;
    STICKY();
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    guard g;
    emu_stream *q = stream_of(s);

    STICKY();
    if (!live(q))
        return fail(cudaErrorInvalidResourceHandle, "cudaStreamSynchronize");
    drain(q, q->issued);
    STICKY();
    return cudaSuccess;
}

/* Not ready while anything is queued: a host that polls gets there, as the query runs what it can of the
 * queue too. */
cudaError_t cudaStreamQuery(cudaStream_t s)
{
    guard g;
    emu_stream *q = stream_of(s);
    bool pending;

    STICKY();
    if (!live(q))
        return fail(cudaErrorInvalidResourceHandle, "cudaStreamQuery");
    pending = q->done < q->issued;
    run_until(q, q->issued);
    STICKY();
    return pending ? not_ready() : cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags)
{
    guard g;

    STICKY();
    *e = new emu_event;
    (*e)->dev = current;
    events.insert(*e);
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }

cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    guard g;

    STICKY();
    if (!events.erase(e))
        return fail(cudaErrorInvalidResourceHandle, "cudaEventDestroy");
    delete e;
    return cudaSuccess;
}

/* The event marks everything queued on s so far; a later record moves it. Event and stream must belong to
 * one device (CUDA's rule: the current device does not matter here, unlike for a kernel launch). */
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
    guard g;
    emu_stream *q = stream_of(s);

    STICKY();
    if (!events.count(e) || !live(q))
        return fail(cudaErrorInvalidResourceHandle, "cudaEventRecord");
    if (e->dev != q->dev)
        return fail(cudaErrorInvalidResourceHandle, "cudaEventRecord of an event of device %d on a stream of device %d",
                    e->dev, q->dev);
    e->s = q;
    e->seq = q->issued;
    return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
    guard g;

    STICKY();
    if (!events.count(e))
        return fail(cudaErrorInvalidResourceHandle, "cudaEventSynchronize");
    if (e->s)
        drain(e->s, e->seq);
    STICKY();
    return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t e)
{
    guard g;
    bool pending;

    STICKY();
    if (!events.count(e))
        return fail(cudaErrorInvalidResourceHandle, "cudaEventQuery");
    pending = e->s && e->s->done < e->seq;
    if (pending)
        run_until(e->s, e->seq);
    STICKY();
    return pending ? not_ready() : cudaSuccess;
}

/* Work queued on s from now on starts after the event's work: the position is taken now, as CUDA takes it. */
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags)
{
    guard g;
    emu_stream *q = stream_of(s), *on;
    unsigned long long seq;

    STICKY();
    if (!events.count(e) || !live(q))
        return fail(cudaErrorInvalidResourceHandle, "cudaStreamWaitEvent");
    on = e->s;
    seq = e->seq;
    if (!on || on == q)
        return cudaSuccess;
    enqueue(q, emu_op{ [on, seq]() { return !streams.count(on) || run_until(on, seq); }, []() {} });
    return cudaSuccess;
}

} /* extern "C" */
