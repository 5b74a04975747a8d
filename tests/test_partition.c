/* test_partition.c - shard arithmetic for N = 1..8 over prime, tiny and awkward sizes, and sizes past 2^32
 * elements (pure arithmetic: nothing is allocated). */
#include <errno.h>
#include <stdint.h>

#include "check.h"
#include "core/partition.h"

static void check_one(int64_t numel, int32_t world)
{
    struct zs_partition p;
    int64_t covered = 0, next = 0;

    CHECK(zs_partition_init(&p, numel, world) == 0, "numel %lld world %d", (long long)numel, world);
    CHECK(p.shard % ZS_SHARD_ALIGN == 0, "shard %lld not aligned", (long long)p.shard);
    CHECK(p.padded == p.shard * world, "padded %lld", (long long)p.padded);
    CHECK(p.padded >= numel, "padded %lld < numel %lld", (long long)p.padded, (long long)numel);
    /* padding never exceeds one alignment block per rank plus the rounding of numel / world */
    CHECK(p.padded - numel < (int64_t)world * (ZS_SHARD_ALIGN + 1), "padding %lld too large for world %d",
          (long long)(p.padded - numel), world);
    for (int32_t r = 0; r < world; r++) {
        int64_t begin = zs_partition_begin(&p, r), valid = zs_partition_valid(&p, r);
        CHECK(begin == next, "rank %d begins at %lld, expected %lld", r, (long long)begin, (long long)next);
        CHECK(valid >= 0 && valid <= p.shard, "rank %d valid %lld", r, (long long)valid);
        CHECK((begin * 4) % 64 == 0, "rank %d shard not 64-byte aligned", r);
        /* ranks hold real data first, padding after: no hole inside the real range */
        if (valid < p.shard)
            CHECK(begin + valid == numel || valid == 0, "rank %d has a hole", r);
        covered += valid;
        next = begin + p.shard;
    }
    CHECK(covered == numel, "covered %lld of %lld", (long long)covered, (long long)numel);
}

int main(void)
{
    static const int64_t sizes[] = { 1, 2, 3, 5, 7, 8, 11, 13, 15, 16, 17, 31, 97, 127, 1009, 65537, 1000003, 7919 * 7 };
    struct zs_partition p;

    for (int32_t world = 1; world <= 8; world++) {
        for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
            check_one(sizes[i], world);
        for (int64_t n = 1; n <= 3 * world; n++) /* smaller than, equal to and just above N */
            check_one(n, world);
    }
    /* sizes past 2^31 and 2^32 elements, where 32-bit arithmetic would wrap */
    static const int64_t big[] = { 2147483649LL, 3000000001LL, 4294967296LL, 4294967311LL, 8589934609LL,
                                   5000000000017LL };
    for (int32_t world = 1; world <= 8; world++)
        for (size_t i = 0; i < sizeof(big) / sizeof(big[0]); i++)
            check_one(big[i], world);
    CHECK(zs_partition_init(&p, 4294967297LL, 1) == 0 && p.shard == 4294967312LL && p.padded == 4294967312LL,
          "2^32 + 1 at one rank: shard %lld padded %lld", (long long)p.shard, (long long)p.padded);
    CHECK(zs_partition_init(&p, 3000000001LL, 3) == 0 && p.shard == 1000000016LL &&
              zs_partition_begin(&p, 2) == 2000000032LL && zs_partition_valid(&p, 2) == 999999969LL,
          "3e9 + 1 at three ranks: shard %lld, rank 2 at %lld with %lld", (long long)p.shard,
          (long long)zs_partition_begin(&p, 2), (long long)zs_partition_valid(&p, 2));
    CHECK(zs_partition_init(&p, 5000000000017LL, 7) == 0 && p.shard == 714285714304LL &&
              zs_partition_valid(&p, 6) == 5000000000017LL - 6 * 714285714304LL,
          "5e12 at seven ranks: shard %lld", (long long)p.shard);
    CHECK(zs_partition_init(&p, 0, 4) == -EINVAL, "zero elements must be rejected");
    CHECK(zs_partition_init(&p, -5, 4) == -EINVAL, "negative elements must be rejected");
    CHECK(zs_partition_init(&p, 10, 0) == -EINVAL, "world 0 must be rejected");
    CHECK(zs_partition_init(&p, INT64_MAX, 2) == -EINVAL, "overflowing size must be rejected");
    /* a unit smaller than N: one aligned block per rank, rank 0 owns everything real */
    CHECK(zs_partition_init(&p, 3, 8) == 0 && p.shard == ZS_SHARD_ALIGN && zs_partition_valid(&p, 0) == 3 &&
              zs_partition_valid(&p, 1) == 0, "tiny unit layout");
    return zs_test_summary("test_partition");
}
