/* sharding.h - what the rest of the engine calls in sharding/: stage 3's fetches, the gradient reductions
 * and their bucket, and deterministic mode's exact sums. */
#ifndef ZS_SHARDING_H
#define ZS_SHARDING_H

#include <stdbool.h>
#include <stdint.h>

#include "core/ctx.h" /* defines: struct zs_ctx */

/* sharding/fetch.c */
zs_status zs_fetch_open(struct zs_ctx *ctx);      /* the fetch trace's state (zs_fetch_free_all frees it) */
zs_status zs_fetch_acquire(struct zs_ctx *ctx, int32_t u, void **data);
zs_status zs_fetch_unref(struct zs_ctx *ctx, int32_t u);
zs_status zs_fetch_step_end(struct zs_ctx *ctx);  /* drops stale gathered copies, closes the trace window */
void zs_fetch_free_all(struct zs_ctx *ctx);
/* Drops unit u's (u < 0: every unit's) stale gathered copies after its parameters changed outside a step;
 * refuses, naming `who`, a unit the program holds fetched. */
zs_status zs_fetch_invalidate(struct zs_ctx *ctx, int32_t u, const char *who);

/* sharding/grads.c */
zs_status zs_grads_setup(struct zs_ctx *ctx);      /* the queue of reductions in flight (zs_grads_free frees) */
/* Stages 2-3 (not deterministic mode): the bucket, bytes of staging for up to elems elements. */
zs_status zs_grads_bucket_open(struct zs_ctx *ctx, int64_t bytes, int64_t elems);
void zs_grads_free(struct zs_ctx *ctx);
zs_status zs_grads_open(struct zs_ctx *ctx, int32_t u, void **grad);
zs_status zs_grads_submit(struct zs_ctx *ctx, int32_t u);
/* The public gradient calls' check: set up, a unit that exists and is not frozen (the error names the call). */
zs_status zs_grad_unit_check(const struct zs_ctx *ctx, int32_t unit, const char *fn);
zs_status zs_grads_progress(struct zs_ctx *ctx);
zs_status zs_grads_flush(struct zs_ctx *ctx);      /* waits for every reduction in flight */
/* hybrid sharding, at the step after the flush: the window's gradients summed across the shard groups */
zs_status zs_grads_sum_replicas(struct zs_ctx *ctx);
zs_status zs_grads_zero(struct zs_ctx *ctx);       /* starts a new accumulation window */
/* The plan's grads_nvme: unit u's squares for the norm, of its shard as the window left it in the swap file
 * (un->grad_sumsq; taken as it was written, else read back now). */
zs_status zs_grads_nvme_sumsq(struct zs_ctx *ctx, int32_t u);

/* sharding/exact.c: zeroshard.deterministic "world_size_invariant" */
zs_status zs_exact_setup(struct zs_ctx *ctx);       /* the counters, and full gradient buffers at stages 2-3 */
void zs_exact_free(struct zs_ctx *ctx);
zs_status zs_exact_deposit(struct zs_ctx *ctx, int32_t u); /* folds the unit's buffer in, zeroes it */
zs_status zs_exact_ready(struct zs_ctx *ctx, int32_t u);   /* checks every micro-shard was deposited */
zs_status zs_exact_launch(struct zs_ctx *ctx, int32_t u); /* at the boundary's zs_grad_ready: starts the sum */
zs_status zs_exact_progress(struct zs_ctx *ctx, bool all); /* advances the units' sums; all: to the end */
zs_status zs_exact_reduce(struct zs_ctx *ctx, double *sumsq); /* at the step, after all: the norm */
void zs_exact_zero(struct zs_ctx *ctx);
uint64_t zs_exact_scratch_bytes(const struct zs_ctx *ctx); /* its communicator's scratch (0: none) */

#endif /* ZS_SHARDING_H */
