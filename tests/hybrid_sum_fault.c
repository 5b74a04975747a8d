/* hybrid_sum_fault.c - hybrid sharding (mics_shard_size 2, 4 ranks in two forced nodes of 2, stage 2): the sum of
 * the gradients across the shard groups fails on rank 2 (ZS_TEST_COMM_FAULT on its replica comm) and the step
 * returns the error naming that sum (the first unit's, not a later one whose wait found the comm broken); the
 * failed request is completed and back in the replica collectives' pool, not left in flight on the replica comm
 * with the gradient shard as its target. */
#include "core/ctx.h" /* defines: struct zs_ctx (its rcoll); first: its prototypes' names are ckpt_model.h's globals */
#include "ckpt_model.h"

int main(int argc, char **argv)
{
    static const struct setup s = {"hybrid", 2, "none", "fp32", 1, 0};
    zs_ctx *ctx = NULL;
    zs_status st;

    model_begin(&argc, &argv, "hybrid-sum-fault");
    CHECK(world == 4, "run with mpirun -np 4 and ZS_FAKE_NODE_SIZE=2 (got %d ranks)", world);
    if (world != 4)
        return model_end("hybrid_sum_fault");
    /* rank 2 is rank 1 of its replica comm only (rank 0 of its shard group); read when the comms open */
    if (rank == 2)
        setenv("ZS_TEST_COMM_FAULT", getenv("HYBRID_SUM_FAULT") ? getenv("HYBRID_SUM_FAULT") : "progress:0:1", 1);
    accum = s.accum;
    zero_extra = ", \"mics_shard_size\": 2";
    st = open_ctx(&ctx, &s, MPI_COMM_WORLD, world, NULL);
    unsetenv("ZS_TEST_COMM_FAULT");
    CHECK(!st, "open: %s", st ? zs_last_error() : "");
    if (!st)
        st = one_step(ctx, NULL);
    if (rank == 2) {
        CHECK(st && strstr(zs_last_error(), "unit 'u0' across the shard groups"), "rank 2's step: status %d, '%s'", st,
              st ? zs_last_error() : "no error");
        printf("rank 2's step: %s\n", st ? zs_last_error() : "ok");
        CHECK(zs_coll_in_use(&ctx->rcoll) == 0, "rank 2: %d replica-sum requests left in flight after the error",
              zs_coll_in_use(&ctx->rcoll));
        printf("rank 2: replica-sum requests left in flight: %d\n", zs_coll_in_use(&ctx->rcoll));
    }
    zs_finalize(ctx);
    return model_end("hybrid_sum_fault");
}
