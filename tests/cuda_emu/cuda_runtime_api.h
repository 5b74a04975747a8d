/* cuda_runtime_api.h (tests/cuda_emu) - a CPU stand-in for the CUDA runtime's host API, for C and C++, so that
 * the CUDA backend's host code (device/device_cuda.c, comm/comm_nccl.c) and its kernels (the .cu files of kernels/, through
 * cuda_runtime.h) run where no GPU is. Implemented in emu_runtime.cpp and emu_memory.cpp.
 *
 * The point is the ordering rules, not speed. Work queued on a stream (copies, memsets, kernels, event
 * records, waits) runs as late as CUDA allows: only when the host synchronizes (stream, event, device), when
 * a call that CUDA documents as synchronous needs it (a copy into pageable host memory, cudaFree), or when a
 * stream that waits on an event needs the work before it. So a host that reads a pinned buffer before it
 * synchronized sees the old bytes, and a stream that uses another's result without an event sees it unmade,
 * much as a GPU would let happen some of the time. The legacy default stream (0) is one more stream per device:
 * the backend's streams are non-blocking, so nothing orders them with it.
 * Device memory is host memory filled with 0xff (NaN) at cudaMalloc; every copy and memset checks that its
 * device side lies inside one allocation.
 * Errors and devices as CUDA keeps them: each host thread has its own last error (every failed call sets it,
 * cudaErrorNotReady from a query too; cudaGetLastError returns and clears it) and its own current device (0
 * on a new thread; ZS_CUDA_EMU_GPUS=N devices per process). Streams, events and allocations belong to the
 * device current when they were made: a kernel launched onto a stream of another device than the current one
 * fails (cudaErrorInvalidResourceHandle), as does recording an event on a stream of another device; copies
 * may go to any device's stream, as CUDA allows. Test knobs: ZS_CUDA_EMU_PIN_FAIL=1 makes cudaHostRegister
 * refuse (cudaErrorMemoryAllocation), as a GPU over the locked-memory limit does; ZS_CUDA_EMU_MALLOC_FAIL=BYTES
 * makes every cudaMalloc of exactly BYTES refuse (cudaErrorMemoryAllocation); ZS_CUDA_EMU_FAULT=K makes
 * the K-th kernel launched fault when it runs: the launch succeeded, the next synchronizing call and every
 * call after return cudaErrorIllegalAddress (a broken context). Calls are serialized by one lock.  */
#ifndef ZS_CUDA_EMU_RUNTIME_API_H
#define ZS_CUDA_EMU_RUNTIME_API_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorNotReady = 600,
    cudaErrorIllegalAddress = 700,
    cudaErrorHostMemoryAlreadyRegistered = 712,
    cudaErrorHostMemoryNotRegistered = 713,
} cudaError_t;

typedef enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4,
} cudaMemcpyKind;

typedef struct emu_stream *cudaStream_t;
typedef struct emu_event *cudaEvent_t;

#define cudaStreamDefault 0x0
#define cudaStreamNonBlocking 0x1
#define cudaEventDefault 0x0
#define cudaEventDisableTiming 0x2
#define cudaHostRegisterDefault 0x0
#define cudaHostRegisterPortable 0x1
#define cudaHostAllocDefault 0x0
#define cudaHostAllocPortable 0x1

struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem;
    int major, minor;
    int multiProcessorCount;
    int pciBusID, pciDeviceID, pciDomainID;
    int warpSize;
    int maxThreadsPerBlock;
};

enum cudaDeviceAttr { cudaDevAttrMaxThreadsPerBlock = 1, cudaDevAttrMultiProcessorCount = 16,
                      cudaDevAttrComputeCapabilityMajor = 75, cudaDevAttrComputeCapabilityMinor = 76 };

const char *cudaGetErrorString(cudaError_t e);
const char *cudaGetErrorName(cudaError_t e);
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);

cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaSetDevice(int d);
cudaError_t cudaGetDevice(int *d);
cudaError_t cudaDeviceGetPCIBusId(char *bus, int len, int d);
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int d);
cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr a, int d);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);
cudaError_t cudaDeviceSynchronize(void);

cudaError_t cudaStreamCreate(cudaStream_t *s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamQuery(cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags);

cudaError_t cudaEventCreate(cudaEvent_t *e);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventQuery(cudaEvent_t e);

cudaError_t cudaMalloc(void **p, size_t bytes);
cudaError_t cudaFree(void *p);
cudaError_t cudaMemset(void *p, int v, size_t bytes);
cudaError_t cudaMemsetAsync(void *p, int v, size_t bytes, cudaStream_t s);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s);

cudaError_t cudaHostRegister(void *p, size_t bytes, unsigned flags);
cudaError_t cudaHostUnregister(void *p);
cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned flags);
cudaError_t cudaMallocHost(void **p, size_t bytes);
cudaError_t cudaFreeHost(void *p);

/* Test hooks (not CUDA): how many queued operations have run, and how many are still queued on any stream. */
void zs_emu_counts(unsigned long long *ran, unsigned long long *queued);
/* How many kernels have been launched in this process (ZS_CUDA_EMU_FAULT counts the same way). */
unsigned long long zs_emu_launches(void);

#ifdef __cplusplus
}
#endif

#endif /* ZS_CUDA_EMU_RUNTIME_API_H */
