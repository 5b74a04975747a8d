/* bucket.h - sharding/'s own: the gradient reductions in flight, in launch order (grads.c launches them,
 * exact.c's sums join the same queue), and at stages 2-3 the bucket their staging buffers come from. */
#ifndef ZS_BUCKET_H
#define ZS_BUCKET_H

#include <stdint.h>

struct zs_bucket {
    /* stages 2-3: a bump arena of staging buffers, reset when all its reductions end */
    char *arena;
    int64_t arena_cap, arena_used;   /* bytes; restarts only at deterministic points (full, step) */
    int32_t *pending;                /* units with a reduction in flight, in launch order */
    int32_t npending;
};

#endif /* ZS_BUCKET_H */
