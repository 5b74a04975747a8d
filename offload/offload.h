/* offload.h - ZeRO-Offload: the host pool's set-up and pin, and the offloaded optimizer's staging from a
 * device the host cannot read in place. */
#ifndef ZS_OFFLOAD_H
#define ZS_OFFLOAD_H

#include <stdint.h>

#include "core/ctx.h"   /* defines: struct zs_ctx */
#include "core/units.h" /* defines: struct zs_optim_groups */

/* offload/offload.c: where offloaded state lives, and the device memory budget of the CPU backend */
zs_status zs_offload_setup(struct zs_ctx *ctx);     /* sizes and creates the host pool; checks the budget */
/* On a device the host cannot read in place, pins the host pool through the device (cudaHostRegister), near
 * the device's NUMA node where it is known; a refusal leaves it pageable with a warning, never an error, so
 * no rank fails where its peers go on into a collective. zs_offload_unpin undoes it before the pool goes. */
void zs_offload_pin(struct zs_ctx *ctx);
void zs_offload_unpin(struct zs_ctx *ctx);

/* offload/offload_dev.c: the offloaded optimizer's staging when the device is not the host's */
zs_status zs_offdev_setup(struct zs_ctx *ctx);
void zs_offdev_free(struct zs_ctx *ctx);
/* Unit u's reduced gradients (shard, where grads.c keeps them) down, on the copy stream. */
zs_status zs_offdev_grads_final(struct zs_ctx *ctx, int32_t u, const void *shard);
void zs_offdev_window_end(struct zs_ctx *ctx);
void *zs_offdev_grads(struct zs_ctx *ctx, int32_t u);           /* where they land on the host */
void *zs_offdev_slot(struct zs_ctx *ctx, int32_t k);            /* parameter slot k % 2 */


/* offload/offload_step.c: the optimizer step from such a device, with the state in the host pool (cpu) or
 * paged in from NVMe; gr: each parameter group's scalars and room to split a unit by group. */
zs_status zs_offload_step_from_device(struct zs_ctx *ctx, const struct zs_optim_groups *gr);
zs_status zs_offload_step_nvme_from_device(struct zs_ctx *ctx, const struct zs_optim_groups *gr);

#endif /* ZS_OFFLOAD_H */
