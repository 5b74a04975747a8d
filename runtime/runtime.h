/* runtime.h - what the life cycle, set-up, the step and the checkpoints share inside runtime/ and ckpt/. */
#ifndef ZS_RUNTIME_H
#define ZS_RUNTIME_H

#include "core/ctx.h" /* defines: struct zs_ctx */

/* "Adam", "AdamW", "SGD", "Lion", "Adagrad" (DeepSpeed's spelling of the config's optimizer type) */
const char *zs_optim_name(int type);

/* runtime/devio.c: collective: NCCL carries the device collectives when every rank has its own GPU */
zs_status zs_dev_nccl_open(struct zs_ctx *ctx);
/* runtime/devplace.c: on a device with a PCI bus id, moves the rank's threads to the cores nearest it and
 * records its NUMA node for the host pool (ctx->place); warnings, never errors, where that cannot be done.
 * Collective over the node. */
zs_status zs_dev_place(struct zs_ctx *ctx);

/* runtime/groups.c */
/* Group g's values: its own fields over the config's optimizer.params (out->set: the fields it set). */
void zs_group_values(const struct zs_ctx *ctx, int32_t group, zs_group_opts *out);
/* Group g's lr at a step whose schedule gives sched_lr for the config's lr; recorded for zs_group_get. */
double zs_group_lr(struct zs_ctx *ctx, int32_t group, double sched_lr);
/* Collective, in zs_setup after the registration check: every rank holds the same groups, group ids and
 * frozen flags (an error names the parameter); marks frozen units and refuses a unit that mixes. */
zs_status zs_groups_setup(struct zs_ctx *ctx);

/* runtime/hybrid.c */
/* ctx's flat layout (every rank one shard group), right after the world is known. */
void zs_hybrid_flat(struct zs_ctx *ctx);
/* Collective, after the device opened: with zero_optimization.mics_shard_size G (1 <= G < world) the shard
 * group's and the replicas' comms and collectives; refuses a G that does not divide the world, and stage 0.
 * Then with zero_hpz_partition_size H (1 < H < G, stage 3) the secondary group's; refuses an H not dividing G. */
zs_status zs_hybrid_start(struct zs_ctx *ctx);
void zs_hybrid_free(struct zs_ctx *ctx);
/* "flat: 4 ranks" or "hybrid: 2 groups of 2 ranks", for the start-up line */
void zs_hybrid_describe(const struct zs_ctx *ctx, char *buf, size_t len);

/* runtime/memory.c */
void zs_memory_log(const struct zs_ctx *ctx); /* rank 0's report line at start (unless quiet) */
void zs_memory_peak_log(const struct zs_ctx *ctx); /* rank 0's line of zs_memory_peak after the first step */
/* zs_memory without the libraries' data (a /proc/self/smaps read): each sample's snapshot at a new high */
zs_status zs_mem_snapshot(const struct zs_ctx *ctx, zs_memory_report *out);
void zs_mem_watch_start(struct zs_ctx *ctx); /* the RSS watcher's thread (none where /proc is missing) */
void zs_mem_watch_stop(struct zs_ctx *ctx);

/* runtime/step.c */
zs_status zs_step_boundary(struct zs_ctx *ctx);
/* Marks the context unusable (a step or a load failed part-way): zs_step and zs_checkpoint_save refuse,
 * naming why (printf-style). */
void zs_ctx_break(struct zs_ctx *ctx, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void zs_scaler_init(struct zs_ctx *ctx); /* the loss scale fp16's config starts with (1 otherwise) */

#endif /* ZS_RUNTIME_H */
