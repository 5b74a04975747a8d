/* partition.h - how a unit's flat buffer is padded and split into one equal, contiguous, aligned
 * shard per rank. Every stage and the checkpoint format use this arithmetic, so it lives in one place. */
#ifndef ZS_PARTITION_H
#define ZS_PARTITION_H

#include <stdint.h>

/* Shards start on 64-byte boundaries for fp32, so SIMD kernels and DMA never see a split line. */
#define ZS_SHARD_ALIGN 16
/* Each parameter starts on a 64-byte boundary inside its unit. */
#define ZS_PARAM_ALIGN 16

struct zs_partition {
    int64_t numel;   /* real elements of the unit (parameters plus alignment gaps) */
    int64_t shard;   /* elements per rank, a multiple of ZS_SHARD_ALIGN */
    int64_t padded;  /* shard * world >= numel */
    int32_t world;
};

static inline int64_t zs_align_up(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

/* 0, or -EINVAL when numel < 1, world < 1 or the padded size would overflow. */
int zs_partition_init(struct zs_partition *p, int64_t numel, int32_t world);
/* Hybrid sharding: the unit split over a shard group of `group` ranks, the group replicated `replicas` times.
 * The shard is also a whole number of `replicas` chunks, since the sum across replicas is an all-reduce of the
 * shard (for 1, 2, 4, 8 or 16 replicas the shard is the flat one of `group` ranks). */
int zs_partition_init_hybrid(struct zs_partition *p, int64_t numel, int32_t group, int32_t replicas);

/* Ranks per shard group for a job of `world` ranks and the config's zero_optimization.mics_shard_size
 * (-1: every rank); the caller checked that it divides the world. */
static inline int32_t zs_partition_group_size(int64_t mics_shard_size, int32_t world)
{
    return mics_shard_size > 0 && mics_shard_size < world ? (int32_t)mics_shard_size : world;
}

/* First element of rank r's shard in the unit's flat buffer. */
static inline int64_t zs_partition_begin(const struct zs_partition *p, int32_t r) { return (int64_t)r * p->shard; }

/* How many of rank r's shard elements hold real data (the rest is padding), 0..shard. */
int64_t zs_partition_valid(const struct zs_partition *p, int32_t r);

#endif /* ZS_PARTITION_H */
