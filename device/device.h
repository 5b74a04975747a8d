/* device.h - the one interface through which the engine reaches the memory, copies and optimizer kernels
 * of the processor that holds its model states: the CPU (device_cpu.c, what the engine always did) or a
 * CUDA GPU (device_cuda.c, built only with the CUDA backend; device_nocuda.c stands in otherwise). The
 * choice is made at link time by CMake, so no engine source carries an #ifdef for CUDA. */
#ifndef ZS_DEVICE_H
#define ZS_DEVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "zeroshard.h" /* defines: zs_status, zs_dtype */
#include "kernels/optim.h"     /* defines: struct zs_optim_step, struct zs_optim_bufs, enum zs_kopt, enum zs_kpath */
#include "kernels/optim_launch.h" /* defines: struct zs_optim_launch */

#ifdef __cplusplus /* kernels/optim_cuda.cu */
extern "C" {
#endif

struct zs_pool;
/* Opaque handles. The CPU backend runs everything on the caller, in order, so its streams and events are
 * tokens; a CUDA stream orders work on the GPU and an event marks a point in one. */
struct zs_dev_stream;
struct zs_dev_event;

enum zs_dev_kind { ZS_DEV_CPU, ZS_DEV_CUDA };
enum zs_copy_dir { ZS_COPY_H2D, ZS_COPY_D2H, ZS_COPY_D2D };

struct zs_device;

struct zs_device_ops {
    const char *name;
    /* How many such devices this process sees: 1 for the CPU, the GPU count (0 where the driver or the
     * GPU is missing, or the library has no CUDA backend) for CUDA. */
    int32_t (*count)(void);
    /* Picks the processor for this rank (a GPU: from the node-local rank) and checks it can run. */
    zs_status (*open)(struct zs_device *d, int32_t local_rank, int32_t local_size);
    void (*close)(struct zs_device *d);
    /* Zero-filled, 64-byte aligned memory on the device; NULL when out of memory. */
    void *(*alloc)(struct zs_device *d, size_t bytes);
    void (*free)(struct zs_device *d, void *p);
    /* Queued on s (NULL: the device's default order); completes in stream order. */
    zs_status (*copy)(struct zs_device *d, void *dst, const void *src, size_t bytes, enum zs_copy_dir dir,
                      struct zs_dev_stream *s);
    zs_status (*stream_create)(struct zs_device *d, struct zs_dev_stream **s);
    void (*stream_free)(struct zs_device *d, struct zs_dev_stream *s);
    zs_status (*stream_sync)(struct zs_device *d, struct zs_dev_stream *s);
    zs_status (*event_create)(struct zs_device *d, struct zs_dev_event **e);
    void (*event_free)(struct zs_device *d, struct zs_dev_event *e);
    /* e marks everything queued on s so far; wait makes work queued on s later start after e; query says
     * whether that work has finished (without waiting). */
    zs_status (*event_record)(struct zs_device *d, struct zs_dev_event *e, struct zs_dev_stream *s);
    zs_status (*event_query)(struct zs_device *d, struct zs_dev_event *e, bool *done);
    /* Blocks the host until e's work has finished (only that, unlike stream_sync on a stream queued past it). */
    zs_status (*event_sync)(struct zs_device *d, struct zs_dev_event *e);
    zs_status (*stream_wait)(struct zs_device *d, struct zs_dev_stream *s, struct zs_dev_event *e);
    /* Every tensor of l, on s; the arrays are device memory. */
    zs_status (*optim)(struct zs_device *d, const struct zs_optim_launch *l, struct zs_dev_stream *s);
    /* Zero-fills `bytes` of device memory at p, on s. */
    zs_status (*zero)(struct zs_device *d, void *p, size_t bytes, struct zs_dev_stream *s);
    /* kernels/gradops.h's kernels on device memory, on s, with the CPU forms' bits. */
    zs_status (*accumulate)(struct zs_device *d, void *dst, const void *src, zs_dtype dt, int64_t n,
                            struct zs_dev_stream *s);
    zs_status (*scale)(struct zs_device *d, void *x, zs_dtype dt, int64_t n, float f, struct zs_dev_stream *s);
    zs_status (*convert)(struct zs_device *d, void *dst, zs_dtype dt, const float *src, int64_t n,
                         struct zs_dev_stream *s);
    /* The norm's partials: out[k] = zs_grad_sumsq(x[k], dt, n[k]) for each of count tensors, each in its
     * fixed order. out is host memory and holds them on return (after the work queued on s). */
    zs_status (*sumsq)(struct zs_device *d, const void *const *x, const int64_t *n, int32_t count, zs_dtype dt,
                       double *out, struct zs_dev_stream *s);
    /* Pins host memory for asynchronous copies (cudaHostRegister): the offload staging, the host-staged
     * collectives' scratch and the host pool (offload.c: zs_offload_pin); nothing to do on the CPU. The separate
     * test device records each range and refuses an overlapping one or an unknown unregister, as CUDA does. */
    zs_status (*host_register)(struct zs_device *d, void *p, size_t bytes);
    void (*host_unregister)(struct zs_device *d, void *p);
    /* The PCI bus id of the processor ("0000:3b:00.0", cudaDeviceGetPCIBusId), to place the rank's threads and
     * host pool near it (device/placement.c); NULL (the op) where there is none to place near (the CPU). */
    zs_status (*pci_bus_id)(struct zs_device *d, char *buf, size_t len);
};

struct zs_device {
    const struct zs_device_ops *ops;
    enum zs_dev_kind kind;
    /* The host may read and write this device's memory in place (the CPU). Otherwise every host access
     * is a copy, and the collectives take a transport for device buffers (comm/comm_staged.c). */
    bool host_access;
    int32_t ordinal;          /* the GPU this rank drives; 0 on the CPU */
    struct zs_pool *pool;     /* CPU: the optimizer's threads (borrowed) */
    enum zs_kpath kpath;      /* CPU: the kernel path */
    struct zs_dev_stream *compute; /* CUDA: the stream the program computes on (zs_cuda_stream) */
    struct zs_dev_stream *own_compute; /* CUDA: the engine's own, which `compute` is unless the program handed
                                        * it another (zs_cuda_set_stream); destroyed at close */
    struct zs_dev_event *switch_ev; /* CUDA: orders a handed stream after the previous one (zs_cuda_set_stream) */
    struct zs_dev_event *sync_ev;   /* CUDA: the point zs_cuda_synchronize waits for */
    void *priv;               /* the backend's own state */
    void *norm_scratch;       /* CUDA: the norm's scratch, kept from step to step (kernels/gradops_cuda.cu) */
};

extern const struct zs_device_ops zs_device_cpu_ops;
extern const struct zs_device_ops zs_device_separate_ops; /* device_cpu.c: the test hook's device */
extern const struct zs_device_ops zs_device_cuda_ops; /* device_cuda.c, or device_nocuda.c's refusal */

/* "cpu" or "cuda", as the config key `key` names it (for the error message). On failure *d is unusable
 * and the message names the key and why (no CUDA in this build, no GPU visible). Test hook:
 * ZS_TEST_DEVICE=separate makes "cpu" the separate CPU device, whose memory the host reaches only through
 * its copies (device_cpu.c), so the CPU suite runs the GPU's data path and catches a host access that skips
 * a copy. */
zs_status zs_device_open(struct zs_device *d, const char *name, const char *key, struct zs_pool *pool,
                         enum zs_kpath kpath, int32_t local_rank, int32_t local_size);
void zs_device_close(struct zs_device *d);
/* A host <-> device copy, complete on return (dst_dev / src_dev: which side is device memory; host to host is
 * a memmove), on the compute stream after what it had queued. */
zs_status zs_device_copy(struct zs_device *d, void *dst, bool dst_dev, const void *src, bool src_dev, size_t bytes);

/* Test hooks of the separate device (its pins are one registry per process): whether [p, p + bytes) lies inside
 * one range pinned through it; how many ranges are pinned now, -1 once an unregister named no pinned range.
 * ZS_TEST_PIN_FAIL=1 makes it refuse every pin, as a GPU refuses one over the locked-memory limit. */
bool zs_device_separate_pinned(const void *p, size_t bytes);
int zs_device_separate_pin_count(void);

#ifdef __cplusplus
}
#endif

#endif /* ZS_DEVICE_H */
