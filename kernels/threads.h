/* threads.h - a persistent pool of worker threads for the CPU kernels: started once, woken per call,
 * each bound to one core of this rank's share (hwloc). Small calls run on the caller alone. */
#ifndef ZS_THREADS_H
#define ZS_THREADS_H

#include <stdint.h>

struct zs_pool;
struct hwloc_bitmap_s; /* hwloc's cpuset */

/* Work on [begin, end) of an n-element range; ranges are split into contiguous, 16-element aligned
 * chunks, one per thread, so results never depend on the thread count for elementwise work. */
typedef void (*zs_pool_fn)(void *arg, int64_t begin, int64_t end);

struct zs_pool_opts {
    int32_t threads;      /* 0: this rank's share of the node's cores */
    int32_t local_rank;   /* this rank's index among the ranks of its node */
    int32_t local_size;   /* ranks on this node */
    int32_t bind;         /* nonzero: bind each thread (caller included) to one core of the share */
};

/* 0 or -errno. A binding that fails is reported in *warning (may be NULL) and is not an error. */
int zs_pool_create(struct zs_pool **pool, const struct zs_pool_opts *o, char *warning, int warnlen);
void zs_pool_free(struct zs_pool *pool);
int32_t zs_pool_threads(const struct zs_pool *pool);
/* A description such as "2 threads on cores 0-1" for the start-up line. */
const char *zs_pool_describe(const struct zs_pool *pool);
/* Moves the pool's share to the cores inside `near` (the cores nearest the rank's GPU): this rank takes slice
 * `index` of `count` (the ranks placed near the same cores) and every thread is bound again; `what` names the
 * place for the description. 0 (nothing to do where binding is off), -ENOENT (no core inside), -ERANGE (its cores
 * are not one run in hwloc's order) or -errno of a binding. */
int zs_pool_place(struct zs_pool *pool, const struct hwloc_bitmap_s *near, int32_t index, int32_t count,
                  const char *what);
/* Runs fn over [0, n) and returns when every chunk is done. */
void zs_pool_run(struct zs_pool *pool, zs_pool_fn fn, void *arg, int64_t n);

#endif /* ZS_THREADS_H */
