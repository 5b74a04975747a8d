/* coll.h - the collectives on the engine's device buffers behind one interface: comm.c's in place where the
 * host reaches the device's memory, NCCL where every rank has a GPU of its own and it started, the
 * host-staged transport otherwise. Each returns a request (*req NULL: already complete); zs_coll_wait makes
 * the result the compute stream's (on a device, without blocking the host, except NCCL's: its event is polled
 * to its end under zeroshard.timeout_s, as a GPU-side wait would leave the host's next synchronize without a
 * deadline), zs_coll_test says whether it has landed (NCCL's: failing past the deadline). */
#ifndef ZS_COLL_H
#define ZS_COLL_H

#include <stdbool.h>
#include <stdint.h>
#include <mpi.h>

#include "device/device.h" /* defines: struct zs_device, struct zs_dev_stream, struct zs_dev_event */
#include "comm.h"        /* defines: struct zs_comm */
#include "comm_nccl.h"   /* defines: enum zs_nccl_mode */
#include "comm_staged.h" /* defines: struct zs_staged */

struct zs_coll_req;

struct zs_coll {
    struct zs_comm *comm;            /* not owned */
    struct zs_device *dev;           /* not owned: whose buffers, streams and events */
    struct zs_dev_stream *stream;    /* the host-staged collectives' stream */
    struct zs_dev_event *ev_compute; /* compute -> communication */
    struct zs_coll_req *req_free, *req_all; /* requests: recycled, and all of them */
    struct zs_staged staged;         /* collectives on device buffers (when !dev->host_access) */
    struct zs_nccl *nccl;            /* or NCCL's, when started */
};

/* The streams and the host-staged transport, on an open device; zs_coll_close frees what was made (also
 * after a failed open, or on a zeroed struct). */
zs_status zs_coll_open(struct zs_coll *c, struct zs_comm *comm, struct zs_device *d);
void zs_coll_close(struct zs_coll *c);
/* Collective over mpi: NCCL carries the device collectives from here on. The caller decides whether every
 * rank wants it, and stops it on every rank where some rank could not start it. */
zs_status zs_coll_nccl_start(struct zs_coll *c, MPI_Comm mpi, enum zs_nccl_mode mode);
void zs_coll_nccl_stop(struct zs_coll *c);
/* Waits on the host until ev (recorded on a device stream) has passed: with NCCL, polled within its deadline and
 * failing on its asynchronous errors as every NCCL wait; otherwise the device's own wait. `what` names it. */
zs_status zs_coll_host_wait(struct zs_coll *c, struct zs_dev_event *ev, const char *what);

zs_status zs_coll_reduce_scatter(struct zs_coll *c, const void *buf, zs_dtype dt_in, void *out, zs_dtype dt_out,
                                 int64_t count, float scale, struct zs_coll_req **req);
zs_status zs_coll_all_gather(struct zs_coll *c, void *buf, zs_dtype dt, int64_t count, struct zs_coll_req **req);
zs_status zs_coll_all_reduce(struct zs_coll *c, void *buf, zs_dtype dt, int64_t count, float scale,
                             struct zs_coll_req **req);
zs_status zs_coll_wait(struct zs_coll *c, struct zs_coll_req *req);
zs_status zs_coll_test(struct zs_coll *c, struct zs_coll_req *req, bool *done);
/* Requests handed out and not yet back through zs_coll_wait: 0 whenever nothing is in flight (a leak check). */
int32_t zs_coll_in_use(const struct zs_coll *c);

#endif /* ZS_COLL_H */
