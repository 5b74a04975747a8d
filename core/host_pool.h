/* host_pool.h - the pinned host pool: one region per rank, sized once at set-up from what the offload
 * settings put on the host, allocated near the rank's cores (hwloc) and page-locked (mlock) when
 * pin_memory asks for it. Blocks are handed out by bumping; nothing is allocated per step. */
#ifndef ZS_HOST_POOL_H
#define ZS_HOST_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct zs_host_pool;

/* 0 or -errno. A pin that the memlock limit refuses is reported in warn and is not an error. numa >= 0 binds
 * the pool to that NUMA node (the one nearest the rank's GPU), -1 to the nodes near this thread's cores. */
int zs_host_pool_create(struct zs_host_pool **p, size_t bytes, bool pin, int numa, char *warn, size_t warnlen);
void zs_host_pool_free(struct zs_host_pool *p);
/* 4096-aligned, zero-filled; NULL when the pool is exhausted (a sizing bug: the pool is sized exactly). */
void *zs_host_pool_alloc(struct zs_host_pool *p, size_t bytes);
uint64_t zs_host_pool_size(const struct zs_host_pool *p);
bool zs_host_pool_pinned(const struct zs_host_pool *p);
void *zs_host_pool_base(const struct zs_host_pool *p);
/* The device page-locked the pool (cudaHostRegister) instead of mlock: for its pinned flag and description. */
void zs_host_pool_set_device_pinned(struct zs_host_pool *p, bool pinned);
const char *zs_host_pool_describe(const struct zs_host_pool *p);

#endif /* ZS_HOST_POOL_H */
