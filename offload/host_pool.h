/* host_pool.h - the pinned host pool: one region per rank, sized once at set-up from what the offload
 * settings put on the host, allocated near the rank's cores (hwloc) and page-locked (mlock) when
 * pin_memory asks for it. Blocks are handed out by bumping; nothing is allocated per step. */
#ifndef ZS_HOST_POOL_H
#define ZS_HOST_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct zs_host_pool;

/* 0 or -errno. A pin that the memlock limit refuses is reported in warn and is not an error. */
int zs_host_pool_create(struct zs_host_pool **p, size_t bytes, bool pin, char *warn, size_t warnlen);
void zs_host_pool_free(struct zs_host_pool *p);
/* 4096-aligned, zero-filled; NULL when the pool is exhausted (a sizing bug: the pool is sized exactly). */
void *zs_host_pool_alloc(struct zs_host_pool *p, size_t bytes);
uint64_t zs_host_pool_size(const struct zs_host_pool *p);
bool zs_host_pool_pinned(const struct zs_host_pool *p);
const char *zs_host_pool_describe(const struct zs_host_pool *p);

#endif /* ZS_HOST_POOL_H */
