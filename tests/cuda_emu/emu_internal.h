/* emu_internal.h (tests/cuda_emu) - the state emu_runtime.cpp (streams, events, errors, devices) and
 * emu_memory.cpp (allocations, copies) share; not part of the stand-in's interface. */
#ifndef ZS_CUDA_EMU_INTERNAL_H
#define ZS_CUDA_EMU_INTERNAL_H

#include "cuda_runtime.h"

#include <stdio.h>

#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <vector>

#define EMU_MAX_GPUS 16

/* One queued operation: run() once ready() holds (no ready: at once). */
struct emu_op {
    std::function<bool()> ready;
    std::function<void()> run;
};

struct emu_stream {
    std::deque<emu_op> q;
    unsigned long long issued = 0, done = 0; /* operations queued so far, operations run so far */
    int dev = 0;                             /* the device current when it was made: its context's */
    bool destroyed = false;                  /* by cudaStreamDestroy while work was still held in it */
};

struct emu_event {
    emu_stream *s = nullptr; /* where it was last recorded (nullptr: never, so waits pass at once) */
    unsigned long long seq = 0;
    int dev = 0;
};

namespace emu_rt {

/* One lock serializes every call; a call holds it for its whole length, nested calls nest. The per-thread
 * state stays inside emu_runtime.cpp (a thread_local shared across files trips UBSan in some links). */
struct guard {
    guard();
    ~guard();
};

extern emu_stream legacy[EMU_MAX_GPUS]; /* stream 0 of each device */
extern std::set<emu_stream *> streams;
int current_device(void); /* the calling thread's (CUDA keeps it per host thread; 0 on a new one) */
/* set when a kernel faults: the context is broken, every call from then on returns it (process-wide here) */
extern cudaError_t sticky;

/* an error: printed, made this thread's last error, returned */
__attribute__((format(printf, 2, 3))) cudaError_t fail(cudaError_t e, const char *fmt, ...);
cudaError_t broken(void); /* the fault again, as the last error too */
emu_stream *stream_of(cudaStream_t s); /* 0: the current device's legacy stream */
bool live(emu_stream *s);              /* a handle the program may still use */
void enqueue(emu_stream *s, emu_op op);
/* runs s to `upto` operations or to one not ready yet (whether it got there); drain waits for `upto` */
bool run_until(emu_stream *s, unsigned long long upto);
void drain(emu_stream *s, unsigned long long upto);
void drain_all(int dev); /* every stream of device dev (-1: of every device) */

} // namespace emu_rt

/* the first thing of a call that touches the context: a fault has broken it */
#define STICKY()                     \
    do {                             \
        if (emu_rt::sticky)          \
            return emu_rt::broken(); \
    } while (0)

#endif /* ZS_CUDA_EMU_INTERNAL_H */
