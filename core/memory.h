/* memory.h - the accounted allocator: every byte the engine holds is counted in one category, whether it
 * lives on the device (or in its arena), in the shared heap peers read during collectives, or in the host
 * pool; and the device memory budget the CPU backend can be given. */
#ifndef ZS_MEMORY_H
#define ZS_MEMORY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h" /* defines: struct zs_config */
#include "plan.h"   /* defines: enum zs_mem_cat, zs_mem_cat_names */

struct zs_comm;
struct zs_ctx;

/* Whether a device block must come zero-filled. Every buffer made at set-up must: the parameters' padding tails
 * (the all-gathers and the optimizer read them), gradients and the exact sum's counters (accumulated into),
 * optimizer states and fp32 masters (they start at zero or are filled only up to the unit's elements), the
 * gradient bucket (the reduce-scatter reads its padding tails). A stage-3 gathered unit need not: the all-gather
 * writes every element of it, padding included, before anything reads it. A zero-fill of the arena costs a
 * memset of the block on the device; a fresh device allocation is zero-filled whatever the fill. */
enum zs_mem_fill { ZS_FILL_ZERO, ZS_FILL_NONE };

/* Accounted allocation: every byte the runtime holds is counted in one category. 64-byte aligned,
 * zero-filled. */
void *zs_mem_alloc(struct zs_ctx *ctx, enum zs_mem_cat cat, uint64_t bytes);
void zs_mem_free(struct zs_ctx *ctx, enum zs_mem_cat cat, void *p, uint64_t bytes);
/* The same for buffers other ranks read during collectives (the shared heap with the shm backend).
 * Every rank must make the same calls in the same order. */
void *zs_mem_alloc_comm(struct zs_ctx *ctx, enum zs_mem_cat cat, uint64_t bytes);
void zs_mem_free_comm(struct zs_ctx *ctx, enum zs_mem_cat cat, void *p, uint64_t bytes);
/* The same on another communicator of the engine (deterministic mode's own). */
void *zs_mem_alloc_on(struct zs_ctx *ctx, struct zs_comm *comm, enum zs_mem_cat cat, uint64_t bytes);
/* zs_mem_alloc_on with the fill the caller needs (ZS_FILL_NONE: it writes every byte before any read). */
void *zs_mem_alloc_fill(struct zs_ctx *ctx, struct zs_comm *comm, enum zs_mem_cat cat, uint64_t bytes,
                        enum zs_mem_fill fill);
void zs_mem_free_on(struct zs_ctx *ctx, struct zs_comm *comm, enum zs_mem_cat cat, void *p, uint64_t bytes);
/* From the host pool (offloaded state): counted, and in mem_host too. */
void *zs_mem_alloc_host(struct zs_ctx *ctx, enum zs_mem_cat cat, uint64_t bytes);
/* Whether `bytes` more device memory fit the budget; on failure sets the error (names the budget). */
bool zs_budget_admit(struct zs_ctx *ctx, uint64_t bytes, const char *what);

/* At an engine call: the step and scratch the watcher reads; and, where no watcher runs (before zs_setup ends,
 * or no thread could start), an RSS sample (a pread of /proc/self/statm): at a new high the report of that
 * moment (ctx->mem_snapshot) is kept for zs_memory_peak. */
void zs_mem_sample(struct zs_ctx *ctx);
void zs_mem_sample_close(struct zs_ctx *ctx);
uint64_t zs_mem_rss(struct zs_ctx *ctx); /* the RSS now (0: unknown); the fd opens on the engine's thread first */

/* b bytes in a person's units ("1.5 GiB"), written into buf. */
const char *zs_mem_human(uint64_t b, char *buf, size_t len);

#endif /* ZS_MEMORY_H */
