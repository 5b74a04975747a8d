/* comm_staged.h - collectives on device buffers through host memory: each operation copies its input down,
 * runs comm/comm.c's collective (rank-order sums, the CPU's bits whatever the device) and copies the
 * result up. The transport for ranks that share one GPU, which NCCL refuses in both of comm_nccl's modes;
 * slower than NCCL (two PCIe copies and a host reduction per operation) and blocking. With the CPU device
 * the copies are memcpy, which is how the CI checks it. */
#ifndef ZS_COMM_STAGED_H
#define ZS_COMM_STAGED_H

#include <stdbool.h>

#include "comm.h"
#include "device.h" /* defines: struct zs_device, struct zs_dev_stream */

struct zs_staged {
    struct zs_comm *comm;
    struct zs_device *dev;
    void *host;   /* from zs_comm_alloc: the shared heap with the shm backend, so the host step is zero copy */
    size_t cap;
    bool pinned;  /* host_register took: unregistered on free (a refusal leaves it pageable, still correct) */
};

void zs_staged_init(struct zs_staged *s, struct zs_comm *comm, struct zs_device *dev);
/* Collective over the node (the scratch is on the shared heap). */
void zs_staged_free(struct zs_staged *s);

/* comm.h's operations with device buffers, after the work queued on `stream` (NULL: the device's default
 * order): complete on return. The host scratch grows on demand, collectively: every rank must make the
 * same calls in the same order, as comm.h asks anyway. */
zs_status zs_staged_reduce_scatter(struct zs_staged *s, const void *buf, zs_dtype dt_in, void *out, zs_dtype dt_out,
                                   int64_t count, float scale, struct zs_dev_stream *stream);
zs_status zs_staged_all_gather(struct zs_staged *s, void *buf, zs_dtype dt, int64_t count,
                               struct zs_dev_stream *stream);
zs_status zs_staged_all_reduce(struct zs_staged *s, void *buf, zs_dtype dt, int64_t count, float scale,
                               struct zs_dev_stream *stream);

#endif /* ZS_COMM_STAGED_H */
