/* emu_runtime.cpp (tests/cuda_emu) - the CUDA runtime stand-in of cuda_runtime_api.h: streams as queues run
 * as late as CUDA's ordering rules allow, events as positions in a stream's queue, device and pinned host
 * memory as tracked host memory. */
#include "cuda_runtime.h"

#include <sched.h>
#include <stdio.h>

#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <vector>

/* An operation, and what must hold before it may run (empty: nothing): a NCCL collective waits for its peers. */
struct emu_op {
    std::function<bool()> ready;
    std::function<void()> run;
};

struct emu_stream {
    std::deque<emu_op> q;
    unsigned long long issued = 0, done = 0; /* operations queued so far, operations run so far */
};

struct emu_event {
    emu_stream *s = nullptr; /* where it was last recorded (nullptr: never, so waits pass at once) */
    unsigned long long seq = 0;
};

namespace {

std::recursive_mutex lock;
emu_stream legacy; /* stream 0 */
std::set<emu_stream *> streams = { &legacy };
std::set<emu_event *> events;
std::map<const char *, size_t> device_mem, pinned_mem; /* start -> bytes */
std::set<const char *> host_alloced;                   /* the pinned blocks cudaHostAlloc made */
cudaError_t last_error = cudaSuccess;
unsigned long long ran_ops;
int depth; /* nested waits while running a queue */

cudaError_t fail(cudaError_t e, const char *what)
{
    fprintf(stderr, "cuda_emu: %s: %s\n", what, cudaGetErrorName(e));
    return e;
}

emu_stream *stream_of(cudaStream_t s) { return s ? s : &legacy; }

/* Runs s's queue until `upto` operations have run or one is not ready to run; a wait met on the way first
 * runs the stream it waits on as far as its event. Whether s got that far. */
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

/* A host that synchronizes waits, as on a GPU: for a peer that never arrives, forever. */
void spin_until(emu_stream *s, unsigned long long upto)
{
    while (!run_until(s, upto))
        sched_yield();
}

void run_all(void)
{
    bool left = true;

    while (left) {
        left = false;
        for (emu_stream *s : streams)
            left = !run_until(s, s->issued) || left;
        if (left)
            sched_yield();
    }
}

/* ZS_CUDA_EMU=eager runs each operation when it is queued, as if the GPU were always idle: a test that fails
 * only without it depends on an order CUDA does not promise. */
bool eager(void)
{
    static int e = -1;

    if (e < 0) {
        const char *v = getenv("ZS_CUDA_EMU");
        e = v && !strcmp(v, "eager");
    }
    return e;
}

void enqueue(emu_stream *s, std::function<void()> op, std::function<bool()> ready = nullptr)
{
    s->q.push_back(emu_op{ std::move(ready), std::move(op) });
    s->issued++;
    if (eager())
        run_until(s, s->issued);
}

/* The allocation of `tab` holding [p, p + bytes), or nullptr. */
const char *inside(const std::map<const char *, size_t> &tab, const void *p, size_t bytes)
{
    const char *c = (const char *)p;
    auto it = tab.upper_bound(c);

    if (it == tab.begin())
        return nullptr;
    --it;
    return c >= it->first && c + bytes <= it->first + it->second ? it->first : nullptr;
}

bool touches(const std::map<const char *, size_t> &tab, const void *p, size_t bytes)
{
    const char *c = (const char *)p;
    auto it = tab.upper_bound(c + (bytes ? bytes - 1 : 0));

    if (it == tab.begin())
        return false;
    --it;
    return it->first + it->second > c;
}

enum side { PAGEABLE, PINNED, DEVICE, BAD };

/* Where [p, p + bytes) lies: device memory must lie within one allocation, a range that only overlaps one
 * is an out-of-bounds copy. */
side side_of(const void *p, size_t bytes)
{
    if (inside(device_mem, p, bytes))
        return DEVICE;
    if (touches(device_mem, p, bytes))
        return BAD;
    return inside(pinned_mem, p, bytes) ? PINNED : PAGEABLE;
}

} // namespace

void emu_enqueue(cudaStream_t s, std::function<void()> op)
{
    std::lock_guard<std::recursive_mutex> g(lock);

    enqueue(stream_of(s), std::move(op));
}

void emu_enqueue_until(cudaStream_t s, std::function<bool()> ready, std::function<void()> op)
{
    std::lock_guard<std::recursive_mutex> g(lock);

    enqueue(stream_of(s), std::move(op), std::move(ready));
}

bool emu_device_visible(const void *p)
{
    std::lock_guard<std::recursive_mutex> g(lock);

    return inside(device_mem, p, 0) || inside(pinned_mem, p, 0);
}

void emu_launch_error(cudaError_t e, const char *what)
{
    std::lock_guard<std::recursive_mutex> g(lock);

    last_error = fail(e, what);
}

extern "C" {

void zs_emu_counts(unsigned long long *ran, unsigned long long *queued)
{
    std::lock_guard<std::recursive_mutex> g(lock);

    *ran = ran_ops;
    *queued = 0;
    for (emu_stream *s : streams)
        *queued += s->q.size();
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
    case cudaErrorHostMemoryAlreadyRegistered: return "cudaErrorHostMemoryAlreadyRegistered";
    case cudaErrorHostMemoryNotRegistered: return "cudaErrorHostMemoryNotRegistered";
    }
    return "cudaErrorUnknown";
}

const char *cudaGetErrorString(cudaError_t e) { return e ? "emulated CUDA error" : "no error"; }

cudaError_t cudaGetLastError(void)
{
    std::lock_guard<std::recursive_mutex> g(lock);
    cudaError_t e = last_error;

    last_error = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void)
{
    std::lock_guard<std::recursive_mutex> g(lock);

    return last_error;
}

/* ---------------------------------------------------------------- the device */

/* ZS_CUDA_EMU_GPUS=N: the GPUs each process sees (1 by default). Each process emulates the one it picks on its
 * own; ranks that pick the same ordinal share it (the same PCI address), as on one host. */
static int gpus(void)
{
    const char *e = getenv("ZS_CUDA_EMU_GPUS");
    int n = e ? atoi(e) : 1;

    return n < 1 ? 1 : n > 16 ? 16 : n;
}

static int current;

cudaError_t cudaGetDeviceCount(int *n)
{
    *n = gpus();
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int d)
{
    if (d < 0 || d >= gpus())
        return fail(cudaErrorInvalidDevice, "cudaSetDevice");
    current = d;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *d)
{
    *d = current;
    return cudaSuccess;
}

/* Device d's PCI bus number. ZS_CUDA_EMU_BUS=local: each process sees its own of the node's GPUs, from its
 * node-local rank (Open MPI's OMPI_COMM_WORLD_LOCAL_RANK), as per-rank CUDA_VISIBLE_DEVICES (Slurm, torchrun)
 * shows every rank one GPU with its own bus id. */
static int bus_of(int d)
{
    const char *e = getenv("ZS_CUDA_EMU_BUS"), *l = getenv("OMPI_COMM_WORLD_LOCAL_RANK");

    return d + 1 + (e && !strcmp(e, "local") && l ? atoi(l) * gpus() : 0);
}

cudaError_t cudaDeviceGetPCIBusId(char *bus, int len, int d)
{
    if (d < 0 || d >= gpus() || len < 1)
        return fail(cudaErrorInvalidValue, "cudaDeviceGetPCIBusId");
    snprintf(bus, (size_t)len, "0000:%02x:00.0", bus_of(d));
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int d)
{
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

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes)
{
    std::lock_guard<std::recursive_mutex> g(lock);
    size_t used = 0;

    for (auto &a : device_mem)
        used += a.second;
    *total_bytes = (size_t)16 << 30;
    *free_bytes = used < *total_bytes ? *total_bytes - used : 0;
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void)
{
    std::lock_guard<std::recursive_mutex> g(lock);

    run_all();
    return cudaSuccess;
}

/* ---------------------------------------------------------------- streams and events */

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags)
{
    std::lock_guard<std::recursive_mutex> g(lock);

    *s = new emu_stream;
    streams.insert(*s);
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }

/* CUDA lets queued work finish after the destroy; here it runs first. */
cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    std::lock_guard<std::recursive_mutex> g(lock);

    if (!s || !streams.count(s))
        return fail(cudaErrorInvalidResourceHandle, "cudaStreamDestroy");
    spin_until(s, s->issued);
    streams.erase(s);
    for (emu_event *e : events)
        if (e->s == s)
            e->s = nullptr; /* complete */
    delete s;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    std::lock_guard<std::recursive_mutex> g(lock);
    emu_stream *q = stream_of(s);

    if (!streams.count(q))
        return fail(cudaErrorInvalidResourceHandle, "cudaStreamSynchronize");
    spin_until(q, q->issued);
    return cudaSuccess;
}

/* Not ready while anything is queued: a host that polls gets there, as the query runs the queue too. */
cudaError_t cudaStreamQuery(cudaStream_t s)
{
    std::lock_guard<std::recursive_mutex> g(lock);
    emu_stream *q = stream_of(s);
    bool pending = q->done < q->issued;

    return !run_until(q, q->issued) || pending ? cudaErrorNotReady : cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags)
{
    std::lock_guard<std::recursive_mutex> g(lock);

    *e = new emu_event;
    events.insert(*e);
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }

cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    std::lock_guard<std::recursive_mutex> g(lock);

    if (!events.erase(e))
        return fail(cudaErrorInvalidResourceHandle, "cudaEventDestroy");
    delete e;
    return cudaSuccess;
}

/* The event marks everything queued on s so far; a later record moves it. */
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
    std::lock_guard<std::recursive_mutex> g(lock);
    emu_stream *q = stream_of(s);

    if (!events.count(e) || !streams.count(q))
        return fail(cudaErrorInvalidResourceHandle, "cudaEventRecord");
    e->s = q;
    e->seq = q->issued;
    return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
    std::lock_guard<std::recursive_mutex> g(lock);

    if (!events.count(e))
        return fail(cudaErrorInvalidResourceHandle, "cudaEventSynchronize");
    if (e->s)
        spin_until(e->s, e->seq);
    return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t e)
{
    std::lock_guard<std::recursive_mutex> g(lock);
    bool pending = e->s && e->s->done < e->seq;

    if (!events.count(e))
        return fail(cudaErrorInvalidResourceHandle, "cudaEventQuery");
    if (pending)
        run_until(e->s, e->seq); /* as far as it can: the next query may find it done */
    return pending ? cudaErrorNotReady : cudaSuccess;
}

/* Work queued on s from now on starts after the event's work: the position is taken now, as CUDA takes it. */
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags)
{
    std::lock_guard<std::recursive_mutex> g(lock);
    emu_stream *q = stream_of(s), *on;
    unsigned long long seq;

    if (!events.count(e) || !streams.count(q))
        return fail(cudaErrorInvalidResourceHandle, "cudaStreamWaitEvent");
    on = e->s;
    seq = e->seq;
    if (!on || on == q)
        return cudaSuccess;
    enqueue(q, []() {}, [on, seq]() { return !streams.count(on) || run_until(on, seq); });
    return cudaSuccess;
}

/* ---------------------------------------------------------------- memory */

cudaError_t cudaMalloc(void **p, size_t bytes)
{
    std::lock_guard<std::recursive_mutex> g(lock);
    char *m = (char *)malloc(bytes ? bytes : 1);

    *p = m;
    if (!m)
        return fail(cudaErrorMemoryAllocation, "cudaMalloc");
    memset(m, 0xff, bytes); /* NaN: a value read before it is written shows in the results */
    device_mem[m] = bytes ? bytes : 1;
    return cudaSuccess;
}

/* Synchronizes the device first, as cudaFree does. */
cudaError_t cudaFree(void *p)
{
    std::lock_guard<std::recursive_mutex> g(lock);

    if (!p)
        return cudaSuccess;
    run_all();
    if (!device_mem.erase((const char *)p))
        return fail(cudaErrorInvalidValue, "cudaFree of memory cudaMalloc did not return");
    free(p);
    return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *p, int v, size_t bytes, cudaStream_t s)
{
    std::lock_guard<std::recursive_mutex> g(lock);
    emu_stream *q = stream_of(s);

    if (!bytes)
        return cudaSuccess;
    if (side_of(p, bytes) != DEVICE)
        return fail(cudaErrorInvalidValue, "cudaMemset(Async) outside a device allocation");
    if (!streams.count(q))
        return fail(cudaErrorInvalidResourceHandle, "cudaMemsetAsync");
    enqueue(q, [p, v, bytes]() { memset(p, v, bytes); });
    return cudaSuccess;
}

/* On device memory, asynchronous with respect to the host (CUDA's "synchronous" memset only waits for
 * pinned or managed targets), on the legacy default stream. */
cudaError_t cudaMemset(void *p, int v, size_t bytes) { return cudaMemsetAsync(p, v, bytes, nullptr); }

/* CUDA's rules: a copy into pageable host memory returns when it is done; one from pageable host memory
 * takes the bytes at the call (staged) and lands in stream order; between device and pinned memory it is
 * all in stream order. The kind must agree with where the pointers lie (cudaMemcpyDefault: any). */
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s)
{
    std::lock_guard<std::recursive_mutex> g(lock);
    emu_stream *q = stream_of(s);
    side ds, ss;

    if (!bytes)
        return cudaSuccess;
    if (!streams.count(q))
        return fail(cudaErrorInvalidResourceHandle, "cudaMemcpyAsync");
    ds = side_of(dst, bytes);
    ss = side_of(src, bytes);
    if (ds == BAD || ss == BAD)
        return fail(cudaErrorInvalidValue, "cudaMemcpy(Async) past the end of a device allocation");
    if ((kind == cudaMemcpyHostToDevice && (ds != DEVICE || ss == DEVICE)) ||
        (kind == cudaMemcpyDeviceToHost && (ds == DEVICE || ss != DEVICE)) ||
        (kind == cudaMemcpyDeviceToDevice && (ds != DEVICE || ss != DEVICE)) ||
        (kind == cudaMemcpyHostToHost && (ds == DEVICE || ss == DEVICE)))
        return fail(cudaErrorInvalidValue, "cudaMemcpy(Async): the kind does not match where the pointers lie");
    if (ss == PAGEABLE) {
        std::vector<char> staged((const char *)src, (const char *)src + bytes);
        enqueue(q, [dst, staged]() { memcpy(dst, staged.data(), staged.size()); });
    } else {
        enqueue(q, [dst, src, bytes]() { memcpy(dst, src, bytes); });
    }
    if (ds == PAGEABLE)
        spin_until(q, q->issued);
    return cudaSuccess;
}

/* On the legacy default stream; complete on return except between device buffers. */
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind)
{
    std::lock_guard<std::recursive_mutex> g(lock);
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kind, nullptr);

    if (!e && !(side_of(dst, bytes) == DEVICE && side_of(src, bytes) == DEVICE))
        spin_until(&legacy, legacy.issued);
    return e;
}

cudaError_t cudaHostRegister(void *p, size_t bytes, unsigned flags)
{
    std::lock_guard<std::recursive_mutex> g(lock);

    if (!p || !bytes || touches(device_mem, p, bytes))
        return fail(cudaErrorInvalidValue, "cudaHostRegister");
    if (touches(pinned_mem, p, bytes))
        return fail(cudaErrorHostMemoryAlreadyRegistered, "cudaHostRegister");
    pinned_mem[(const char *)p] = bytes;
    return cudaSuccess;
}

/* Waits for the device: queued copies may still use the pages. */
cudaError_t cudaHostUnregister(void *p)
{
    std::lock_guard<std::recursive_mutex> g(lock);

    run_all();
    if (host_alloced.count((const char *)p) || !pinned_mem.erase((const char *)p))
        return fail(cudaErrorHostMemoryNotRegistered, "cudaHostUnregister");
    return cudaSuccess;
}

cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned flags)
{
    std::lock_guard<std::recursive_mutex> g(lock);
    char *m = (char *)malloc(bytes ? bytes : 1);

    *p = m;
    if (!m)
        return fail(cudaErrorMemoryAllocation, "cudaHostAlloc");
    pinned_mem[m] = bytes ? bytes : 1;
    host_alloced.insert(m);
    return cudaSuccess;
}

cudaError_t cudaMallocHost(void **p, size_t bytes) { return cudaHostAlloc(p, bytes, cudaHostAllocDefault); }

cudaError_t cudaFreeHost(void *p)
{
    std::lock_guard<std::recursive_mutex> g(lock);

    if (!p)
        return cudaSuccess;
    run_all();
    if (!host_alloced.erase((const char *)p))
        return fail(cudaErrorInvalidValue, "cudaFreeHost of memory cudaHostAlloc did not return");
    pinned_mem.erase((const char *)p);
    free(p);
    return cudaSuccess;
}

} /* extern "C" */
