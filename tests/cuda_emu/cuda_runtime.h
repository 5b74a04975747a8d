/* cuda_runtime.h (tests/cuda_emu) - a CPU stand-in for the CUDA kernel language, on top of the host API of
 * cuda_runtime_api.h, so that CUDA sources compiled with g++ and this directory first on the include path run
 * where no GPU is: examples/gpt/gpt_cuda.cu (tests/test_gpt_cuda_emu.cpp) and the .cu files of kernels/
 * (the _emu.cpp files here). A launch is queued on its stream like any other work (cuda_runtime_api.h says
 * when queued work runs) with its arguments copied, as CUDA copies them. GK_LAUNCH runs each CUDA thread as
 * a fiber (ucontext): a warp's 32 run in turn and meet at every shuffle and __syncwarp, so warp-level code runs
 * as on a GPU. ZS_LAUNCH, for kernels without warp-level code, calls the kernel once per thread, blocks and
 * threads in reverse order, so a kernel whose threads depend on each other's order shows. A kernel that reads
 * or writes out of bounds is caught by AddressSanitizer like any host code. Not a general CUDA. */
#ifndef ZS_CUDA_EMU_RUNTIME_H
#define ZS_CUDA_EMU_RUNTIME_H

#include <math.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

#include <functional>
#include <tuple>
#include <type_traits>

#include "cuda_runtime_api.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(...)

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};

/* the running fiber's coordinates, set by the scheduler before each switch into a lane */
static dim3 blockIdx, threadIdx, blockDim, gridDim;

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
    bool fibers;             /* a GK_LAUNCH is running (ZS_LAUNCH has no warps to meet in) */
};
static emu_warp emu_w;

/* back to the scheduler: the lane waits there until every lane of the warp has reached the same point */
static inline void emu_yield(void)
{
    if (!emu_w.fibers) {
        fprintf(stderr, "cuda_emu: a warp-level call in a kernel launched with ZS_LAUNCH (use fibers)\n");
        abort();
    }
    swapcontext(&emu_w.lane[emu_w.cur], &emu_w.sched);
}

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
    emu_w.fibers = true;
    gridDim = grid;
    blockDim = dim3(threads);
    for (unsigned by = 0; by < grid.y; by++)
        for (unsigned bx = 0; bx < grid.x; bx++)
            for (unsigned w0 = 0; w0 < threads; w0 += 32)
                emu_run_warp(dim3(bx, by), w0, threads - w0 < 32 ? threads - w0 : 32);
    emu_w.fibers = false;
}

/* runs body once per thread, the last block's last thread first */
static inline void emu_run_plain(dim3 grid, unsigned threads, const std::function<void()> &body)
{
    gridDim = grid;
    blockDim = dim3(threads);
    for (unsigned by = grid.y; by-- > 0;)
        for (unsigned bx = grid.x; bx-- > 0;)
            for (unsigned t = threads; t-- > 0;) {
                blockIdx = dim3(bx, by);
                threadIdx = dim3(t);
                body();
            }
}

/* emu_runtime.cpp: queues work on a stream; records a launch's configuration error for cudaGetLastError */
void emu_enqueue(cudaStream_t s, std::function<void()> op);
/* the same, but the stream runs past op only once ready() holds (asked when op is reached, until it holds):
 * queries of work behind it say not ready, synchronizing waits for it (the sem lane's version replaces this) */
void emu_enqueue_until(cudaStream_t s, std::function<bool()> ready, std::function<void()> op);
void emu_launch_error(cudaError_t e, const char *what);
/* whether a kernel may dereference p: device memory, or pinned host memory (mapped, as CUDA maps it) */
bool emu_device_visible(const void *p);

/* a pointer argument must be one the GPU can reach (null passes): pageable host memory would fault there */
template <typename T> static inline bool emu_arg_ok(const T &a)
{
    if constexpr (std::is_pointer<T>::value)
        return !a || emu_device_visible((const void *)a);
    else
        return true;
}

/* kernel(args...) for every thread of the grid, queued on the stream; the arguments are converted to the
 * kernel's parameter types and copied now, as a CUDA launch copies them */
template <typename... P> struct emu_launch {
    void (*k)(P...);
    dim3 grid;
    unsigned threads;
    cudaStream_t stream;
    bool fibers;
    template <typename... A> void operator()(A... a)
    {
        if (!threads || threads > 1024 || !grid.x || !grid.y || grid.y > 65535)
            return emu_launch_error(cudaErrorInvalidConfiguration, "kernel launch");
        void (*kernel)(P...) = k;
        std::tuple<P...> args(((P)a)...);
        bool visible = std::apply([](const auto &...x) { return (emu_arg_ok(x) && ...); }, args);
        if (!visible)
            return emu_launch_error(cudaErrorInvalidValue, "kernel launch with a pointer to pageable host memory");
        dim3 g = grid;
        unsigned n = threads;
        if (fibers)
            emu_enqueue(stream, [kernel, args, g, n]() {
                auto bound = [&]() { std::apply(kernel, args); };
                using B = decltype(bound);
                emu_run(g, n, [](void *p) { (*(B *)p)(); }, &bound);
            });
        else
            emu_enqueue(stream, [kernel, args, g, n]() { emu_run_plain(g, n, [&]() { std::apply(kernel, args); }); });
    }
};
template <typename... P>
static emu_launch<P...> emu_make_launch(void (*k)(P...), dim3 grid, unsigned threads, cudaStream_t s, bool fibers)
{
    return emu_launch<P...>{ k, grid, threads, s, fibers };
}
/* GK_LAUNCH(kernel, grid, stream)(args...): examples/gpt's spelling, warp-level code allowed */
#define GK_LAUNCH(kernel, grid, stream) emu_make_launch(kernel, dim3(grid), GK_THREADS, (stream), true)
/* ZS_LAUNCH(kernel, grid, threads, stream)(args...): kernels/cuda_launch.h's spelling */
#define ZS_LAUNCH(kernel, grid, threads, stream) emu_make_launch(kernel, dim3(grid), (threads), (stream), false)

#endif /* ZS_CUDA_EMU_RUNTIME_H */
