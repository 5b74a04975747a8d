/* partition.c - shard arithmetic: N need not divide anything, units smaller than N still work. */
#include <errno.h>

#include "partition.h"

int zs_partition_init(struct zs_partition *p, int64_t numel, int32_t world)
{
    int64_t per_rank;

    if (numel < 1 || world < 1)
        return -EINVAL;
    if (numel > INT64_MAX / 4 - (int64_t)world * ZS_SHARD_ALIGN)
        return -EINVAL;
    per_rank = (numel + world - 1) / world;
    p->numel = numel;
    p->world = world;
    p->shard = zs_align_up(per_rank, ZS_SHARD_ALIGN);
    p->padded = p->shard * world;
    return 0;
}

int64_t zs_partition_valid(const struct zs_partition *p, int32_t r)
{
    int64_t begin = zs_partition_begin(p, r);
    int64_t end = begin + p->shard;

    if (begin >= p->numel)
        return 0;
    return (end <= p->numel ? end : p->numel) - begin;
}
