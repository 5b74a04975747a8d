/* emu_memory.cpp (tests/cuda_emu) - device and pinned host memory of cuda_runtime_api.h as tracked host memory:
 * every copy and memset checks that its device side lies inside one allocation, and the calls CUDA documents as
 * synchronizing wait for the device here too. */
#include "emu_internal.h"

#include <stdlib.h>
#include <string.h>

using namespace emu_rt;

namespace {

std::map<const char *, size_t> device_mem, pinned_mem; /* start -> bytes */
std::map<const char *, int> device_of;                 /* start -> the device it was allocated on */
std::set<const char *> host_alloced;                   /* the pinned blocks cudaHostAlloc made */

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

bool emu_device_visible(const void *p)
{
    guard g;

    return inside(device_mem, p, 0) || inside(pinned_mem, p, 0);
}

extern "C" {

/* ---------------------------------------------------------------- memory */

/* The current device's memory. */
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes)
{
    guard g;
    size_t used = 0;

    STICKY();
    for (auto &a : device_mem)
        if (device_of[a.first] == current_device())
            used += a.second;
    *total_bytes = (size_t)16 << 30;
    *free_bytes = used < *total_bytes ? *total_bytes - used : 0;
    return cudaSuccess;
}

/* ZS_CUDA_EMU_MALLOC_FAIL=BYTES (read at each call, so a test can set it on one rank only: this side of the
 * emulator has no MPI) refuses every cudaMalloc of exactly BYTES, as a GPU whose memory another process holds. */
cudaError_t cudaMalloc(void **p, size_t bytes)
{
    guard g;
    const char *refuse = getenv("ZS_CUDA_EMU_MALLOC_FAIL");
    char *m;

    STICKY();
    *p = nullptr;
    if (refuse && *refuse && strtoull(refuse, nullptr, 10) == bytes)
        return fail(cudaErrorMemoryAllocation, "cudaMalloc of %zu bytes refused (ZS_CUDA_EMU_MALLOC_FAIL)", bytes);
    m = (char *)malloc(bytes ? bytes : 1);
    *p = m;
    if (!m)
        return fail(cudaErrorMemoryAllocation, "cudaMalloc");
    memset(m, 0xff, bytes); /* NaN: a value read before it is written shows in the results */
    device_mem[m] = bytes ? bytes : 1;
    device_of[m] = current_device();
    return cudaSuccess;
}

/* Synchronizes the allocation's device first, as cudaFree does. */
cudaError_t cudaFree(void *p)
{
    guard g;
    auto it = device_of.find((const char *)p);

    STICKY();
    if (!p)
        return cudaSuccess;
    if (it == device_of.end())
        return fail(cudaErrorInvalidValue, "cudaFree of memory cudaMalloc did not return");
    drain_all(it->second);
    STICKY();
    device_mem.erase((const char *)p);
    device_of.erase(it);
    free(p);
    return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *p, int v, size_t bytes, cudaStream_t s)
{
    guard g;
    emu_stream *q = stream_of(s);

    STICKY();
    if (!bytes)
        return cudaSuccess;
    if (side_of(p, bytes) != DEVICE)
        return fail(cudaErrorInvalidValue, "cudaMemset(Async) outside a device allocation");
    if (!live(q))
        return fail(cudaErrorInvalidResourceHandle, "cudaMemsetAsync");
    enqueue(q, emu_op{ nullptr, [p, v, bytes]() { memset(p, v, bytes); } });
    return cudaSuccess;
}

/* On device memory, asynchronous with respect to the host (CUDA's "synchronous" memset only waits for
 * pinned or managed targets), on the legacy default stream. */
cudaError_t cudaMemset(void *p, int v, size_t bytes) { return cudaMemsetAsync(p, v, bytes, nullptr); }

/* CUDA's rules: a copy into pageable host memory returns when it is done; one from pageable host memory
 * takes the bytes at the call (staged) and lands in stream order; between device and pinned memory it is
 * all in stream order. The kind must agree with where the pointers lie (cudaMemcpyDefault: any). A copy may
 * go to a stream of another device than the current one (CUDA allows it, unlike a kernel launch). */
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s)
{
    guard g;
    emu_stream *q = stream_of(s);
    side ds, ss;

    STICKY();
    if (!bytes)
        return cudaSuccess;
    if (!live(q))
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
        enqueue(q, emu_op{ nullptr, [dst, staged]() { memcpy(dst, staged.data(), staged.size()); } });
    } else {
        enqueue(q, emu_op{ nullptr, [dst, src, bytes]() { memcpy(dst, src, bytes); } });
    }
    if (ds == PAGEABLE)
        drain(q, q->issued);
    STICKY();
    return cudaSuccess;
}

/* On the legacy default stream; complete on return except between device buffers. */
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind)
{
    guard g;
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kind, nullptr);

    if (!e && !(side_of(dst, bytes) == DEVICE && side_of(src, bytes) == DEVICE))
        drain(stream_of(nullptr), stream_of(nullptr)->issued);
    return e ? e : sticky ? broken() : cudaSuccess;
}

/* ZS_CUDA_EMU_PIN_FAIL=1 (read at each call, so a test can scope it) refuses every pin, as a GPU refuses one
 * over the locked-memory limit. */
cudaError_t cudaHostRegister(void *p, size_t bytes, unsigned flags)
{
    guard g;
    const char *refuse = getenv("ZS_CUDA_EMU_PIN_FAIL");

    STICKY();
    if (refuse && !strcmp(refuse, "1"))
        return fail(cudaErrorMemoryAllocation, "cudaHostRegister of %zu bytes refused (ZS_CUDA_EMU_PIN_FAIL)", bytes);
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
    guard g;

    STICKY();
    drain_all(-1);
    STICKY();
    if (host_alloced.count((const char *)p) || !pinned_mem.erase((const char *)p))
        return fail(cudaErrorHostMemoryNotRegistered, "cudaHostUnregister");
    return cudaSuccess;
}

cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned flags)
{
    guard g;
    char *m;

    STICKY();
    m = (char *)malloc(bytes ? bytes : 1);
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
    guard g;

    STICKY();
    if (!p)
        return cudaSuccess;
    drain_all(-1);
    STICKY();
    if (!host_alloced.erase((const char *)p))
        return fail(cudaErrorInvalidValue, "cudaFreeHost of memory cudaHostAlloc did not return");
    pinned_mem.erase((const char *)p);
    free(p);
    return cudaSuccess;
}

} /* extern "C" */
