/* comm_nccl_impl.h - what comm_nccl.c (set-up, the collectives) and comm_nccl_wait.c (every wait on NCCL work,
 * under the watchdog's deadline) share: the loaded NCCL functions and the transport's state. */
#ifndef ZS_COMM_NCCL_IMPL_H
#define ZS_COMM_NCCL_IMPL_H

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "comm_nccl.h"

/* The NCCL functions used, resolved from libnccl.so.2 when a communicator is first made. init_config is
 * NULL where libnccl predates it (2.14): the communicator is then a blocking one. */
struct nccl_api {
    ncclResult_t (*get_unique_id)(ncclUniqueId *);
    ncclResult_t (*comm_init_rank)(ncclComm_t *, int, ncclUniqueId, int);
    ncclResult_t (*comm_destroy)(ncclComm_t);
    ncclResult_t (*comm_abort)(ncclComm_t);
    ncclResult_t (*get_async_error)(ncclComm_t, ncclResult_t *);
    ncclResult_t (*reduce_scatter)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                                   cudaStream_t);
    ncclResult_t (*all_gather)(const void *, void *, size_t, ncclDataType_t, ncclComm_t, cudaStream_t);
    ncclResult_t (*send)(const void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*recv)(void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*group_start)(void);
    ncclResult_t (*group_end)(void);
    const char *(*error_string)(ncclResult_t);
    ncclResult_t (*init_config)(ncclComm_t *, int, ncclUniqueId, int, ncclConfig_t *);
};

/* The last operations queued, each with an event after it, so a wait that times out names the first one
 * that has not completed. */
#define ZS_NCCL_RING 16

struct nccl_op {
    const char *name;
    uint64_t bytes, seq;
    cudaEvent_t done;
};

struct zs_nccl {
    struct nccl_api api;
    void *lib;
    ncclComm_t comm;
    int32_t rank, size;
    int dev;                 /* the rank's GPU, current on the thread that made the communicator */
    enum zs_nccl_mode mode;
    cudaStream_t stream;
    cudaEvent_t ready;       /* marks the caller's stream at each collective */
    void *stage;             /* size pieces of piece bytes, allocated at set-up, never grown */
    size_t piece;
    struct zs_shm *shm;      /* the node's ranks: their NCCL counts and liveness (NULL: not checked) */
    double timeout_s;        /* zeroshard.timeout_s / ZS_TIMEOUT: the longest any wait on NCCL lasts */
    double live_at;          /* when a wait last checked that the node's ranks exist */
    struct nccl_op ops[ZS_NCCL_RING];
    uint64_t issued;         /* operations queued so far (ops[seq % ZS_NCCL_RING] holds the newest) */
    zs_status broken;        /* the communicator was aborted: every later call fails with this */
    char broken_why[512];
};

/* Makes the rank's GPU current on the calling thread: the stream, the staging and the rank-order kernels are
 * that GPU's, and a framework may call from a thread whose current device is another (item 5 of issue 26). */
static inline void zs_nccl_use(const struct zs_nccl *n)
{
    int cur = -1;

    if (cudaGetDevice(&cur) != cudaSuccess || cur != n->dev) {
        (void)cudaGetLastError();
        if (cudaSetDevice(n->dev) != cudaSuccess)
            (void)cudaGetLastError(); /* the next call on the GPU reports it */
    }
}

/* Sets the message (naming what failed and r), aborts the communicator. */
zs_status zs_nccl_fail(struct zs_nccl *n, ncclResult_t r, const char *what);
/* After an NCCL call returned r: ncclInProgress (a non-blocking communicator) is polled to its end under
 * the deadline; other errors abort the communicator. */
zs_status zs_nccl_issued(struct zs_nccl *n, ncclResult_t r, const char *what);
/* st, its message followed by the node's ranks behind this one in NCCL operations (a timed-out set-up). */
zs_status zs_nccl_late(struct zs_nccl *n, zs_status st);
/* Marks the operation just queued, for the messages of a wait that times out. */
void zs_nccl_mark(struct zs_nccl *n, const char *name, uint64_t bytes);
/* Waits under the deadline until ev (NULL: everything queued on the stream) completes. */
zs_status zs_nccl_wait_event(struct zs_nccl *n, cudaEvent_t ev, const char *what);

#endif /* ZS_COMM_NCCL_IMPL_H */
