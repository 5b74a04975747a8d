/* cuda_runtime.h (tests/cuda_emu) - a CPU stand-in for the few CUDA runtime calls and kernel features that
 * examples/gpt/gpt_cuda.cu uses, so that its kernels and its walk over the units run (slowly) where no GPU
 * is: tests/test_gpt_cuda_emu.cpp compiles gpt_cuda.cu with g++ and this directory first on the include path.
 * Device memory is host memory; each CUDA thread is a fiber (ucontext), a warp's 32 run in turn and meet at
 * every shuffle and __syncwarp, so warp-level code runs as on a GPU. Launches are synchronous; a kernel
 * that reads or writes out of bounds is caught by AddressSanitizer like any host code. Not a general CUDA. */
#ifndef ZS_CUDA_EMU_RUNTIME_H
#define ZS_CUDA_EMU_RUNTIME_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

#define __global__
#define __device__

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};

/* the running fiber's coordinates, set by the scheduler before each switch into a lane */
static dim3 blockIdx, threadIdx, blockDim, gridDim;

/* ---------------------------------------------------------------- the runtime's calls */

enum cudaError_t { cudaSuccess = 0, cudaErrorMemoryAllocation = 2, cudaErrorInvalidValue = 1 };
enum cudaMemcpyKind { cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2 };
typedef struct emu_stream *cudaStream_t;
#define cudaStreamNonBlocking 1

static inline const char *cudaGetErrorString(cudaError_t e) { return e ? "emulated failure" : "no error"; }
static inline const char *cudaGetErrorName(cudaError_t e) { return e ? "cudaErrorEmulated" : "cudaSuccess"; }
static inline cudaError_t cudaGetLastError(void) { return cudaSuccess; }
static inline cudaError_t cudaGetDeviceCount(int *n)
{
    *n = 1;
    return cudaSuccess;
}
static inline cudaError_t cudaSetDevice(int d) { return d == 0 ? cudaSuccess : cudaErrorInvalidValue; }
static inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned)
{
    *s = (cudaStream_t)malloc(1);
    return *s ? cudaSuccess : cudaErrorMemoryAllocation;
}
static inline cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    free(s);
    return cudaSuccess;
}
static inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }

/* fresh device memory holds NaN bytes (0xff), so a value read before it is written shows in the results */
static inline cudaError_t cudaMalloc(void **p, size_t bytes)
{
    *p = malloc(bytes ? bytes : 1);
    if (!*p)
        return cudaErrorMemoryAllocation;
    memset(*p, 0xff, bytes);
    return cudaSuccess;
}
static inline cudaError_t cudaFree(void *p)
{
    free(p);
    return cudaSuccess;
}
static inline cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind, cudaStream_t)
{
    memcpy(dst, src, bytes);
    return cudaSuccess;
}
static inline cudaError_t cudaMemsetAsync(void *p, int v, size_t bytes, cudaStream_t)
{
    memset(p, v, bytes);
    return cudaSuccess;
}

/* ---------------------------------------------------------------- fibers: one warp at a time */

#define EMU_STACK (64 * 1024)

struct emu_warp {
    ucontext_t sched, lane[32];
    bool done[32];
    float slot[32];          /* shuffle values */
    int cur;
    void (*body)(void *);    /* runs the kernel for the current lane */
    void *arg;
    char *stacks;
};
static emu_warp emu_w;

/* back to the scheduler: the lane waits there until every lane of the warp has reached the same point */
static inline void emu_yield(void) { swapcontext(&emu_w.lane[emu_w.cur], &emu_w.sched); }

static inline void __syncwarp(unsigned = 0xffffffffu) { emu_yield(); }

static inline float __shfl_xor_sync(unsigned, float v, int o)
{
    int me = emu_w.cur;
    emu_w.slot[me] = v;
    emu_yield(); /* every lane has written */
    float r = emu_w.slot[me ^ o];
    emu_yield(); /* every lane has read: the slots may be written again */
    return r;
}

static void emu_lane_entry(void)
{
    emu_w.body(emu_w.arg);
    emu_w.done[emu_w.cur] = true;
    /* uc_link returns to the scheduler */
}

/* one warp of n lanes (threads w0 .. w0 + n - 1 of block b), round robin until every lane is done; the
 * locals live across swapcontext, hence volatile */
static void emu_run_warp(dim3 b, unsigned w0, unsigned n)
{
    for (volatile unsigned l = 0; l < n; l++) {
        getcontext(&emu_w.lane[l]);
        emu_w.lane[l].uc_stack.ss_sp = emu_w.stacks + (size_t)l * EMU_STACK;
        emu_w.lane[l].uc_stack.ss_size = EMU_STACK;
        emu_w.lane[l].uc_link = &emu_w.sched;
        makecontext(&emu_w.lane[l], emu_lane_entry, 0);
        emu_w.done[l] = false;
    }
    for (volatile bool left = true; left;) {
        left = false;
        for (volatile unsigned l = 0; l < n; l++) {
            if (emu_w.done[l])
                continue;
            emu_w.cur = (int)l;
            blockIdx = b;
            threadIdx = dim3(w0 + l);
            swapcontext(&emu_w.sched, &emu_w.lane[l]);
            left = left || !emu_w.done[l];
        }
    }
}

/* runs body for each thread of the grid, warp by warp */
static inline void emu_run(dim3 grid, unsigned threads, void (*body)(void *), void *arg)
{
    if (!emu_w.stacks && !(emu_w.stacks = (char *)malloc((size_t)32 * EMU_STACK)))
        abort();
    emu_w.body = body;
    emu_w.arg = arg;
    gridDim = grid;
    blockDim = dim3(threads);
    for (unsigned by = 0; by < grid.y; by++)
        for (unsigned bx = 0; bx < grid.x; bx++)
            for (unsigned w0 = 0; w0 < threads; w0 += 32)
                emu_run_warp(dim3(bx, by), w0, threads - w0 < 32 ? threads - w0 : 32);
}

/* GK_LAUNCH(kernel, grid, stream)(args...): the kernel with its arguments, for every thread */
template <typename... P> struct emu_launch {
    void (*k)(P...);
    dim3 grid;
    unsigned threads;
    template <typename... A> void operator()(A... a)
    {
        void (*kernel)(P...) = k;
        auto bound = [&]() { kernel(((P)a)...); };
        using B = decltype(bound);
        emu_run(grid, threads, [](void *p) { (*(B *)p)(); }, &bound);
    }
};
template <typename... P> static emu_launch<P...> emu_make_launch(void (*k)(P...), dim3 grid, unsigned threads)
{
    return emu_launch<P...>{k, grid, threads};
}
#define GK_LAUNCH(kernel, grid, stream) emu_make_launch(kernel, dim3(grid), GK_THREADS)

#endif /* ZS_CUDA_EMU_RUNTIME_H */
