/* partition.c - shard arithmetic: N need not divide anything, units smaller than N still work. */
#include <errno.h>

#include "partition.h"

static int64_t gcd64(int64_t a, int64_t b)
{
    while (b) {
        int64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

int zs_partition_init_hybrid(struct zs_partition *p, int64_t numel, int32_t group, int32_t replicas)
{
    int64_t per_rank, align;

    if (numel < 1 || group < 1 || replicas < 1)
        return -EINVAL;
    align = ZS_SHARD_ALIGN / gcd64(ZS_SHARD_ALIGN, replicas) * replicas; /* lcm */
    if (numel > INT64_MAX / 4 - (int64_t)group * align)
        return -EINVAL;
    per_rank = (numel + group - 1) / group;
    p->numel = numel;
    p->world = group;
    p->shard = zs_align_up(per_rank, align);
    p->padded = p->shard * group;
    return 0;
}

int zs_partition_init(struct zs_partition *p, int64_t numel, int32_t world)
{
    return zs_partition_init_hybrid(p, numel, world, 1);
}

int64_t zs_partition_valid(const struct zs_partition *p, int32_t r)
{
    int64_t begin = zs_partition_begin(p, r);
    int64_t end = begin + p->shard;

    if (begin >= p->numel)
        return 0;
    return (end <= p->numel ? end : p->numel) - begin;
}
