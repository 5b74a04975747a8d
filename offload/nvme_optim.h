/* nvme_optim.h - optimizer state on NVMe: each unit's shard state (m, v, ...) has a fixed region of one
 * swap file per rank; the optimizer step walks sub-groups of units (sub_group_size elements) through
 * three host-pool slots, reading group g+1 and writing group g-1 while the kernel updates group g. */
#ifndef ZS_NVME_OPTIM_H
#define ZS_NVME_OPTIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "zeroshard.h" /* defines: zs_status */

struct zs_config;
struct zs_ctx;
struct zs_nvme_optim;
struct zs_dev_stream;

/* Lays out the file and the sub-groups; *pool_bytes is the host memory it needs: three slots, and with
 * offload_param nvme the parameter read-ahead buffers. */
zs_status zs_nvme_optim_plan(struct zs_ctx *ctx, struct zs_nvme_optim **n, size_t *pool_bytes);
/* The same sizes before any rank starts (zs_estimate_memory), for units described by their shard: the pool, the
 * file, and of the file the working parameter shards. */
struct zs_nvme_unit {
    int64_t shard;  /* elements per rank */
    bool sharded;   /* stage 3 shards it (not kept whole by the persistence threshold) */
    bool frozen;    /* no optimizer state */
    uint32_t grad_elem; /* bytes of a reduced gradient element when its gradient shard lives in the file too
                         * (the plan's grads_nvme), else 0 */
};
zs_status zs_nvme_optim_size(const struct zs_config *cfg, int32_t nunits, const struct zs_nvme_unit *units,
                             uint64_t *pool_bytes, uint64_t *file_bytes, uint64_t *param_bytes);
/* Creates the run directory and the file, registers the pool (pool_bytes at slots) with io_uring,
 * zero-fills the state. */
zs_status zs_nvme_optim_open(struct zs_ctx *ctx, struct zs_nvme_optim *n, char *slots);
/* True when I/Os timed out and the kernel may still write into the pool: the caller must not free it. */
bool zs_nvme_optim_close(struct zs_nvme_optim *n, int rank, bool quiet);
const char *zs_nvme_optim_describe(const struct zs_nvme_optim *n);
uint64_t zs_nvme_optim_file_bytes(const struct zs_nvme_optim *n); /* 0 when n is NULL */
/* Of those, the regions holding the working parameter shards (offload_param nvme); the rest is optimizer
 * state and masters. */
uint64_t zs_nvme_optim_param_bytes(const struct zs_nvme_optim *n, int32_t nunits);
/* ... and the gradient shards' (the plan's grads_nvme; 0 otherwise). */
uint64_t zs_nvme_optim_grad_bytes(const struct zs_nvme_optim *n, int32_t nunits);

/* Runs fn over every unit's owned elements [begin, end), in chunks, with its state paged in (s1, s2 point
 * at the unit's element 0; p at its fp32 masters when those live on disk too, w at its 16-bit working shard
 * when that does (offload_param nvme), g at its reduced gradient shard when that does, else NULL), pipelined
 * with the I/O. */
typedef void (*zs_unit_state_fn)(struct zs_ctx *ctx, int32_t unit, float *p, void *w, float *s1, float *s2,
                                 void *g, int64_t begin, int64_t end, void *arg);
zs_status zs_nvme_optim_step(struct zs_ctx *ctx, struct zs_nvme_optim *n, zs_unit_state_fn fn, void *arg);

/* A unit's region starts with this rank's parameter values when they live on disk: its fp32 masters (the
 * parameter shard itself with fp32 and offload_param nvme, or the masters of 16-bit parameters), then with
 * 16-bit parameters and offload_param nvme the working shard. Whether unit u's region holds any, and whether
 * it holds the working parameters a fetch reads (false when n is NULL). */
bool zs_nvme_params_in_file(const struct zs_nvme_optim *n, int32_t u);
bool zs_nvme_param_on_disk(const struct zs_nvme_optim *n, int32_t u);
/* Queues a read of u's shard into a free read-ahead buffer (nothing when none is free or it is already
 * there); *queued tells whether a read was issued. */
zs_status zs_nvme_param_ahead(struct zs_nvme_optim *n, int32_t u, bool *queued);
/* u's shard (bytes) into dst, from its read-ahead buffer or by reading it now: on the CPU copied before the
 * return; on a device the host cannot read in place (dst device memory) uploaded asynchronously on s, the
 * stream that reads dst next, after the host waited only for the read. */
zs_status zs_nvme_param_read(struct zs_nvme_optim *n, int32_t u, void *dst, size_t bytes, struct zs_dev_stream *s);
/* Writes u's shard (count fp32 initial values at set-up): the masters, and the working shard rounded. */
zs_status zs_nvme_param_write(struct zs_nvme_optim *n, int32_t u, const float *src, int64_t count);
/* Outside a step: reads unit u's whole region into the first slot; *p (NULL unless the masters are on disk),
 * *w (NULL unless the 16-bit working shard is), *s1, *s2 point into it (shard-local element 0).
 * zs_nvme_unit_store writes it back. */
zs_status zs_nvme_unit_load(struct zs_nvme_optim *n, int32_t u, float **p, void **w, float **s1, float **s2);
zs_status zs_nvme_unit_store(struct zs_nvme_optim *n, int32_t u);
/* Waits for every read ahead and forgets them (before the step rewrites the shards). */
zs_status zs_nvme_param_drop(struct zs_nvme_optim *n);
/* ZeRO-Infinity's gradient offload (the plan's grads_nvme): each unit's reduced gradient shard lives in the file
 * after its sub-group's state, and the step reads it with that state. During backward a unit's shard is made in
 * a slot (the step's slots are idle then; each takes the next, once its previous write has landed):
 * zs_nvme_grad_slot gives it (load: with the shard read back from the file, to accumulate into), and
 * zs_nvme_grad_write sends it off asynchronously. zs_nvme_grads_settle waits for every such write (the step and
 * every other use of the slots call it first). zs_nvme_grad_read reads a unit's shard back outside a step, into
 * slot 0. */
bool zs_nvme_grads_on_disk(const struct zs_nvme_optim *n, int32_t u); /* false when n is NULL */
zs_status zs_nvme_grad_slot(struct zs_nvme_optim *n, int32_t u, bool load, void **buf);
zs_status zs_nvme_grad_write(struct zs_nvme_optim *n, int32_t u, const void *buf);
zs_status zs_nvme_grads_settle(struct zs_nvme_optim *n);
zs_status zs_nvme_grad_read(struct zs_nvme_optim *n, int32_t u, void **buf);
/* Seconds spent waiting for this rank's NVMe transfers so far (0 without NVMe). */
double zs_nvme_waited(const struct zs_nvme_optim *n);

#endif /* ZS_NVME_OPTIM_H */
