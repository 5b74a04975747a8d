/* comm_staged.h - collectives on device buffers through host memory: each operation copies its input down,
 * runs comm/comm.c's collective (rank-order sums, the CPU's bits whatever the device) and copies the
 * result up. The transport for ranks that share one GPU, which NCCL refuses in both of comm_nccl's modes;
 * slower than NCCL (two PCIe copies and a host reduction per operation). The caller waits only for the copy
 * down: comm.c's collective then progresses while the caller goes on, and the copy up is queued when it
 * lands. With the CPU device the copies are memcpy, which is how the CI checks it (the separate test device
 * runs a created stream's copies late, as a GPU may). */
#ifndef ZS_COMM_STAGED_H
#define ZS_COMM_STAGED_H

#include <stdbool.h>

#include "device/device.h" /* defines: struct zs_device, struct zs_dev_stream */
#include "comm.h"

/* The operation in flight: comm.c's request, and where its result goes up when it lands. */
struct zs_staged_op {
    struct zs_comm_req *req;
    void *dst;                   /* device memory */
    size_t off, bytes;           /* the result's place in the scratch */
    struct zs_dev_stream *stream;
    struct zs_dev_event *done;   /* recorded after the copy up (NULL: none) */
    zs_status err;               /* its copy down failed (the collective went out marked failed) */
};

struct zs_staged {
    struct zs_comm *comm;
    struct zs_device *dev;
    void *host;   /* from zs_comm_alloc: the shared heap with the shm backend, so the host step is zero copy */
    size_t cap;
    bool pinned;  /* host_register took: unregistered on free (a refusal leaves it pageable, still correct) */
    bool busy;    /* op is in flight: at most one, as they share the scratch */
    struct zs_staged_op op;
    uint64_t started, finished; /* operations launched and landed, counted from 1 */
    zs_status failed;           /* the first operation that failed to land: every later wait fails too */
};

void zs_staged_init(struct zs_staged *s, struct zs_comm *comm, struct zs_device *dev);
/* Collective over the node (the scratch is on the shared heap); finishes the operation in flight. */
void zs_staged_free(struct zs_staged *s);

/* comm.h's operations with device buffers, after the work queued on `stream` (NULL: the device's default
 * order). Each copies its input down (waiting for that copy) and launches comm.c's collective, then returns:
 * the operation is in flight. It lands in zs_staged_test or zs_staged_finish, or when the next operation
 * starts (one at a time: they share the scratch): its result's copy up is then queued on `stream` and `done`
 * recorded after it. The host scratch grows on demand, collectively: every rank must make the same calls in
 * the same order, as comm.h asks anyway. */
zs_status zs_staged_reduce_scatter(struct zs_staged *s, const void *buf, zs_dtype dt_in, void *out, zs_dtype dt_out,
                                   int64_t count, float scale, struct zs_dev_stream *stream, struct zs_dev_event *done);
zs_status zs_staged_all_gather(struct zs_staged *s, void *buf, zs_dtype dt, int64_t count,
                               struct zs_dev_stream *stream, struct zs_dev_event *done);
zs_status zs_staged_all_reduce(struct zs_staged *s, void *buf, zs_dtype dt, int64_t count, float scale,
                               struct zs_dev_stream *stream, struct zs_dev_event *done);
/* Lands the operation in flight, waiting for its collective; the first failure of any operation so far. */
zs_status zs_staged_finish(struct zs_staged *s);
/* Lands it if its collective is complete (*landed), without waiting. */
zs_status zs_staged_test(struct zs_staged *s, bool *landed);

#endif /* ZS_COMM_STAGED_H */
