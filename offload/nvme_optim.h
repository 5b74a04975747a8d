/* nvme_optim.h - optimizer state on NVMe: each unit's shard state (m, v, ...) has a fixed region of one
 * swap file per rank; the optimizer step walks sub-groups of units (sub_group_size elements) through
 * three host-pool slots, reading group g+1 and writing group g-1 while the kernel updates group g. */
#ifndef ZS_NVME_OPTIM_H
#define ZS_NVME_OPTIM_H

#include <stddef.h>
#include <stdint.h>

#include "zeroshard.h" /* defines: zs_status */

struct zs_ctx;
struct zs_nvme_optim;

/* Lays out the file and the sub-groups; *slot_bytes is the size of one slot (the pool holds three). */
zs_status zs_nvme_optim_plan(struct zs_ctx *ctx, struct zs_nvme_optim **n, size_t *slot_bytes);
/* Creates the run directory and the file, registers the pool with io_uring, zero-fills the state. */
zs_status zs_nvme_optim_open(struct zs_ctx *ctx, struct zs_nvme_optim *n, char *slots);
void zs_nvme_optim_close(struct zs_nvme_optim *n, int rank, bool quiet);
const char *zs_nvme_optim_describe(const struct zs_nvme_optim *n);

/* Runs fn over every unit's owned elements [begin, end), in chunks, with its state paged in (s1, s2 point
 * at the unit's element 0), pipelined with the I/O. */
typedef void (*zs_unit_state_fn)(struct zs_ctx *ctx, int32_t unit, float *s1, float *s2, int64_t begin,
                                 int64_t end, void *arg);
zs_status zs_nvme_optim_step(struct zs_ctx *ctx, struct zs_nvme_optim *n, zs_unit_state_fn fn, void *arg);

#endif /* ZS_NVME_OPTIM_H */
