/* nccl.h (tests/cuda_emu) - NCCL's types for comm/comm_nccl.c built against the CUDA emulator. The file's
 * run-time loading of libnccl.so.2 is pointed at the emulator, so the real library (which would look for a real
 * GPU) is never loaded: by default it finds nothing, zs_nccl_init fails naming the emulator and the engine keeps
 * the host-staged collectives (runtime/devio.c); with ZS_CUDA_EMU_NCCL=1 it finds emu_nccl.cpp's NCCL over MPI. */
#ifndef ZS_CUDA_EMU_NCCL_H
#define ZS_CUDA_EMU_NCCL_H

#include "cuda_runtime_api.h"

typedef enum { ncclSuccess = 0, ncclUnhandledCudaError = 1, ncclSystemError = 2, ncclInternalError = 3,
               ncclInvalidArgument = 4, ncclInvalidUsage = 5, ncclRemoteError = 6, ncclInProgress = 7 } ncclResult_t;
typedef enum { ncclInt8 = 0, ncclUint8 = 1, ncclInt32 = 2, ncclUint32 = 3, ncclInt64 = 4, ncclUint64 = 5,
               ncclFloat16 = 6, ncclFloat32 = 7, ncclFloat64 = 8, ncclBfloat16 = 9 } ncclDataType_t;
typedef enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4 } ncclRedOp_t;
typedef struct { char internal[128]; } ncclUniqueId;
typedef struct emu_nccl_comm *ncclComm_t;

/* The fields comm_nccl.c sets, under NCCL's names; NCCL's initializer leaves the others undefined. */
#define NCCL_CONFIG_UNDEF_INT (-2147483647 - 1)
typedef struct {
    size_t size;
    unsigned int magic, version;
    int blocking;
} ncclConfig_t;
#define NCCL_CONFIG_INITIALIZER { sizeof(ncclConfig_t), 0xcafebeef, 0, NCCL_CONFIG_UNDEF_INT }

#ifdef __cplusplus
extern "C" {
#endif
void *zs_emu_nccl_open(const char *name);
void *zs_emu_nccl_sym(void *lib, const char *name);
#ifdef __cplusplus
}
#endif

static inline void *zs_emu_dlopen(const char *name, int flags) { return zs_emu_nccl_open(name); }
static inline void *zs_emu_dlsym(void *lib, const char *name) { return zs_emu_nccl_sym(lib, name); }
static inline int zs_emu_dlclose(void *lib) { return 0; }
static inline char *zs_emu_dlerror(void)
{
    return (char *)"the CUDA emulator (tests/cuda_emu) has no NCCL unless ZS_CUDA_EMU_NCCL=1";
}
#define dlopen zs_emu_dlopen
#define dlsym zs_emu_dlsym
#define dlclose zs_emu_dlclose
#define dlerror zs_emu_dlerror

#endif /* ZS_CUDA_EMU_NCCL_H */
