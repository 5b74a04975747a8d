/* test_cuda_emu_sem.cpp - the CUDA semantics tests/cuda_emu models beyond ordering, each held against what the
 * CUDA runtime documents: a last error per host thread that failed calls (a not-ready query too) set and
 * cudaGetLastError clears; a current device per host thread, a kernel refused on another device's stream; a
 * refused pin (ZS_CUDA_EMU_PIN_FAIL); an operation that holds its stream until a condition holds
 * (emu_enqueue_until: queries answer not-ready, a synchronize waits); a kernel fault reported by the next
 * synchronizing call and every call after (ZS_CUDA_EMU_FAULT). No GPU, no MPI. Exits 0 (pass) or 1. */
#include "cuda_runtime.h"

#include <pthread.h>
#include <time.h>

#include <atomic>

#include "check.h"

__global__ static void add_one(float *x, int n)
{
    int i = (int)(blockIdx.x * blockDim.x + threadIdx.x);

    if (i < n)
        x[i] += 1.0f;
}

static cudaError_t launch(float *x, int n, cudaStream_t s)
{
    ZS_KERNEL(add_one, 1, 32, s)(x, n);
    return cudaGetLastError();
}

/* ---------------------------------------------------------------- the last error, per thread */

static void *other_thread_error(void *arg)
{
    *(cudaError_t *)arg = cudaPeekAtLastError();
    return NULL;
}

static void t_last_error(void)
{
    pthread_t t;
    cudaError_t seen = (cudaError_t)-1;

    cudaGetLastError();
    CHECK(cudaSetDevice(99) == cudaErrorInvalidDevice, "cudaSetDevice(99) accepted");
    CHECK(cudaPeekAtLastError() == cudaErrorInvalidDevice, "peek: %d", cudaPeekAtLastError());
    CHECK(pthread_create(&t, NULL, other_thread_error, &seen) == 0 && pthread_join(t, NULL) == 0, "thread");
    CHECK(seen == cudaSuccess, "another thread sees this thread's error: %d", seen);
    CHECK(cudaGetLastError() == cudaErrorInvalidDevice && cudaGetLastError() == cudaSuccess,
          "cudaGetLastError does not return and clear");

    /* a query whose work has not run answers not-ready, and that is the last error too */
    float *x = NULL;
    cudaStream_t s;
    cudaEvent_t e;
    CHECK(cudaMalloc((void **)&x, 64 * sizeof(float)) == cudaSuccess && cudaMemset(x, 0, 64 * sizeof(float)) == 0 &&
          cudaDeviceSynchronize() == cudaSuccess, "malloc");
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess && cudaEventCreate(&e) == cudaSuccess,
          "stream, event");
    CHECK(launch(x, 64, s) == cudaSuccess && cudaEventRecord(e, s) == cudaSuccess, "launch");
    CHECK(cudaEventQuery(e) == cudaErrorNotReady, "query of queued work not ready");
    CHECK(cudaGetLastError() == cudaErrorNotReady, "not-ready is not the last error");
    CHECK(launch(x, 64, s) == cudaSuccess && cudaStreamQuery(s) == cudaErrorNotReady &&
          cudaGetLastError() == cudaErrorNotReady, "stream query");
    CHECK(cudaStreamSynchronize(s) == cudaSuccess && cudaStreamQuery(s) == cudaSuccess, "sync");

    /* a refused pin */
    static char page[4096];
    setenv("ZS_CUDA_EMU_PIN_FAIL", "1", 1);
    CHECK(cudaHostRegister(page, sizeof(page), 0) == cudaErrorMemoryAllocation, "pin not refused");
    unsetenv("ZS_CUDA_EMU_PIN_FAIL");
    CHECK(cudaGetLastError() == cudaErrorMemoryAllocation, "a refused pin is not the last error");
    CHECK(cudaHostRegister(page, sizeof(page), 0) == cudaSuccess && cudaHostUnregister(page) == cudaSuccess, "pin");
    cudaEventDestroy(e);
    cudaStreamDestroy(s);
    cudaFree(x);
}

/* ---------------------------------------------------------------- the current device, per thread */

struct on_thread {
    cudaStream_t s;
    float *x;
    int dev_seen;
    cudaError_t before, copy, after;
};

static void *launch_from_thread(void *arg)
{
    struct on_thread *o = (struct on_thread *)arg;
    float one = 1.0f;

    cudaGetDevice(&o->dev_seen);
    o->before = launch(o->x, 64, o->s);
    o->copy = cudaMemcpyAsync(o->x, &one, sizeof(one), cudaMemcpyHostToDevice, o->s);
    o->after = cudaSetDevice(1) ? cudaErrorInvalidDevice : launch(o->x, 64, o->s);
    cudaStreamSynchronize(o->s);
    return NULL;
}

static void t_current_device(void)
{
    struct on_thread o = {};
    pthread_t t;
    cudaEvent_t e0;
    int dev = -1;

    CHECK(cudaSetDevice(1) == cudaSuccess && cudaGetDevice(&dev) == cudaSuccess && dev == 1, "set device 1");
    CHECK(cudaStreamCreateWithFlags(&o.s, cudaStreamNonBlocking) == cudaSuccess &&
          cudaMalloc((void **)&o.x, 64 * sizeof(float)) == cudaSuccess, "stream and memory on device 1");
    CHECK(pthread_create(&t, NULL, launch_from_thread, &o) == 0 && pthread_join(t, NULL) == 0, "thread");
    CHECK(o.dev_seen == 0, "a new thread starts on device %d, not 0", o.dev_seen);
    CHECK(o.before == cudaErrorInvalidResourceHandle, "a launch on device 1's stream from device 0: %s",
          cudaGetErrorName(o.before));
    CHECK(o.copy == cudaSuccess, "a copy on another device's stream refused: %s", cudaGetErrorName(o.copy));
    CHECK(o.after == cudaSuccess, "the launch after cudaSetDevice(1) on that thread: %s", cudaGetErrorName(o.after));
    CHECK(cudaGetDevice(&dev) == cudaSuccess && dev == 1, "the other thread's cudaSetDevice moved this one's");
    /* an event of device 0 cannot be recorded on device 1's stream */
    CHECK(cudaSetDevice(0) == cudaSuccess && cudaEventCreate(&e0) == cudaSuccess, "event on device 0");
    CHECK(cudaEventRecord(e0, o.s) == cudaErrorInvalidResourceHandle && cudaGetLastError(), "cross-device record");
    CHECK(launch(o.x, 64, o.s) == cudaErrorInvalidResourceHandle, "a launch on device 1's stream from device 0");
    CHECK(cudaEventRecord(e0, 0) == cudaSuccess, "record on the current device's stream 0");
    cudaEventDestroy(e0);
    cudaStreamDestroy(o.s);
    cudaFree(o.x);
}

/* ---------------------------------------------------------------- an operation that waits for a condition */

static std::atomic<bool> go;

static void *release_later(void *arg)
{
    struct timespec ts = { 0, 50 * 1000 * 1000 };

    nanosleep(&ts, NULL);
    go = true;
    return NULL;
}

static void t_enqueue_until(void)
{
    cudaStream_t s, w;
    cudaEvent_t e;
    pthread_t t;
    int ran = 0, after = 0;

    go = false;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == 0 && cudaStreamCreate(&w) == 0 &&
          cudaEventCreate(&e) == 0, "streams");
    emu_enqueue_until(s, []() { return go.load(); }, [&ran]() { ran++; });
    emu_enqueue(s, [&after]() { after++; });
    CHECK(cudaEventRecord(e, s) == cudaSuccess && cudaStreamWaitEvent(w, e, 0) == cudaSuccess, "record, wait");
    CHECK(cudaStreamQuery(s) == cudaErrorNotReady && cudaEventQuery(e) == cudaErrorNotReady &&
          cudaStreamQuery(w) == cudaErrorNotReady, "queries past the blocked operation ready");
    CHECK(cudaStreamQuery(s) == cudaErrorNotReady && !ran && !after, "the blocked operation ran: %d %d", ran, after);
    cudaGetLastError();
    CHECK(pthread_create(&t, NULL, release_later, NULL) == 0, "thread");
    CHECK(cudaStreamSynchronize(w) == cudaSuccess, "synchronize");
    CHECK(go && ran == 1 && after == 1, "synchronize returned before the condition held: %d %d %d", (int)go, ran, after);
    pthread_join(t, NULL);
    CHECK(cudaEventQuery(e) == cudaSuccess && cudaStreamQuery(s) == cudaSuccess, "queries after");

    /* a stream destroyed while an operation holds it: the destroy returns at once (as CUDA's does), the work
     * still runs once ready, and a device synchronization waits for it */
    go = false;
    ran = 0;
    emu_enqueue_until(s, []() { return go.load(); }, [&ran]() { ran++; });
    CHECK(cudaEventRecord(e, s) == cudaSuccess && cudaStreamDestroy(s) == cudaSuccess && !ran, "destroy held");
    CHECK(cudaStreamQuery(s) == cudaErrorInvalidResourceHandle && cudaGetLastError(), "a destroyed stream in use");
    CHECK(cudaEventQuery(e) == cudaErrorNotReady && cudaGetLastError() == cudaErrorNotReady, "its event ready");
    CHECK(pthread_create(&t, NULL, release_later, NULL) == 0, "thread");
    CHECK(cudaDeviceSynchronize() == cudaSuccess && go && ran == 1, "device sync did not wait: %d %d", (int)go, ran);
    pthread_join(t, NULL);
    CHECK(cudaEventQuery(e) == cudaSuccess, "its event after the device sync");
    cudaEventDestroy(e);
    cudaStreamDestroy(w);
}

/* ---------------------------------------------------------------- an asynchronous kernel fault (last: it breaks the process's context) */

static void t_fault(void)
{
    char k[32];
    float *x = NULL, h = 0;
    cudaStream_t s;

    CHECK(cudaMalloc((void **)&x, 64 * sizeof(float)) == 0 && cudaStreamCreateWithFlags(&s, 1) == 0, "set-up");
    snprintf(k, sizeof(k), "%llu", zs_emu_launches() + 2);
    setenv("ZS_CUDA_EMU_FAULT", k, 1);
    CHECK(launch(x, 64, s) == cudaSuccess && launch(x, 64, s) == cudaSuccess, "the faulting launch itself fails");
    CHECK(cudaMemcpyAsync(&h, x, 0, cudaMemcpyDeviceToHost, s) == cudaSuccess, "a call before the fault ran");
    CHECK(cudaStreamSynchronize(s) == cudaErrorIllegalAddress, "the sync after the fault");
    CHECK(cudaGetLastError() == cudaErrorIllegalAddress && cudaGetLastError() == cudaErrorIllegalAddress,
          "the fault is not sticky in cudaGetLastError");
    CHECK(cudaMalloc((void **)&x, 4) == cudaErrorIllegalAddress && launch(x, 1, s) == cudaErrorIllegalAddress,
          "calls after the fault succeed");
    unsetenv("ZS_CUDA_EMU_FAULT");
}

int main(void)
{
    setenv("ZS_CUDA_EMU_GPUS", "2", 1);
    t_last_error();
    t_current_device();
    t_enqueue_until();
    t_fault();
    return zs_test_summary("cuda_emu semantics");
}
