/* hpz_reload.c - ZeRO++ hpZ's secondary copy never outlives the parameters it was taken from: a checkpoint load
 * and a zs_param_write in the middle of a run, after the secondary slices were filled, must show in the next
 * fetch. Run under mpirun -np 4 with ZS_FAKE_NODE_SIZE=2 (the model: ckpt_model.h, stage 3, accumulation 2).
 * The same sequence runs flat and with zero_hpz_partition_size 2, under a live cap that makes every fetch a
 * re-gather (so the hpZ run's come from the secondary group): two steps and a save, steps 3 and 4, a fetch of
 * every unit (each unit's secondary slice filled), a load of the step-2 checkpoint and a fetch (must show step 2's
 * parameters), steps 3 and 4 again, a fetch of every unit, rank 1 writes p2, a fetch (must show the write), a
 * step. Every value read must equal the flat run's bit for bit. With ZS_TEST_DEVICE=separate (memory the host can
 * only copy) or the argument "cuda" (zeroshard.device "cuda": a GPU) the slices live in the device arena and the
 * secondary group's gathers go through the host-staged transport. */
#include "ckpt_model.h"

#define NREC 6

/* What one run leaves: the fetched parameters at each point of the sequence, and the parameters at its end. */
struct record {
    float at[NREC][TOTAL];
};

static zs_status fetch_all(zs_ctx *ctx, struct record *rec, int *k)
{
    return fetched(ctx, rec->at[(*k)++]);
}

static zs_status steps(zs_ctx *ctx, int n)
{
    zs_status st = ZS_OK;

    for (int i = 0; i < n && !st; i++)
        st = one_step(ctx, NULL);
    return st;
}

static void run(const struct setup *s, const char *keys, struct record *rec)
{
    zs_ctx *ctx = NULL;
    char dir[400];
    zs_ckpt_opts o = {.tag = "checkpoint"};
    static float w[TOTAL];
    int loaded = -1, k = 0;
    zs_status st;

    snprintf(dir, sizeof(dir), "%s/%s", base, s->name);
    accum = s->accum;
    zero_extra = keys;
    st = open_ctx(&ctx, s, MPI_COMM_WORLD, world, NULL);
    if (!st && !(st = steps(ctx, 2)) && !(st = zs_checkpoint_save_opts(ctx, dir, &o)))
        st = fetch_all(ctx, rec, &k); /* step 2's parameters */
    if (!st && !(st = steps(ctx, 2)))
        st = fetch_all(ctx, rec, &k); /* step 4's: the secondary slices now hold them */
    if (!st)
        st = zs_checkpoint_load_opts(ctx, dir, &o, &loaded);
    if (!st)
        st = fetch_all(ctx, rec, &k); /* step 2's again */
    CHECK(!st && loaded == 1, "%s: up to the load: %s", s->name, st ? zs_last_error() : "not loaded");
    CHECK(!st && same(rec->at[2], rec->at[0], TOTAL), "%s: a fetch after the load does not show step 2's parameters",
          s->name);
    if (!st && !(st = steps(ctx, 2)))
        st = fetch_all(ctx, rec, &k); /* step 4's again */
    CHECK(!st && same(rec->at[3], rec->at[1], TOTAL), "%s: steps 3-4 after the load differ (%s)", s->name,
          st ? zs_last_error() : "values");
    for (int i = 0; i < TOTAL; i++)
        w[i] = (float)(i % 29) / 32.0f - 0.25f;
    if (!st)
        st = zs_param_write(ctx, 2, ZS_STATE_PARAM, rank == 1 ? w : NULL, 1);
    if (!st)
        st = fetch_all(ctx, rec, &k);
    CHECK(!st && same(rec->at[4] + numel[0] + numel[1], w, numel[2]), "%s: the fetch after the write does not show "
          "it (%s)", s->name, st ? zs_last_error() : "values");
    if (!st && !(st = steps(ctx, 1)))
        st = read_all(ctx, ZS_STATE_PARAM, rec->at[k++]);
    CHECK(!st, "%s: the step after the write: %s", s->name, st ? zs_last_error() : "");
    zs_finalize(ctx);
    MPI_Barrier(MPI_COMM_WORLD);
}

int main(int argc, char **argv)
{
    /* a live cap below the largest sharded unit (300 elements): every fetch gathers, none is kept */
    static const struct setup flat = {"flat", 3, "none", "fp32", 2, 0}, hpz = {"hpz", 3, "none", "fp32", 2, 0};
    static struct record a, b;
    int diff = -1;

    on_gpu = argc > 1 && !strcmp(argv[1], "cuda");
    model_begin(&argc, &argv, "hpz-reload");
    CHECK(world == 4, "run with mpirun -np 4 (got %d ranks)", world);
    if (world == 4) {
        run(&flat, ", \"stage3_max_live_parameters\": 200", &a);
        run(&hpz, ", \"stage3_max_live_parameters\": 200, \"zero_hpz_partition_size\": 2", &b);
        for (int i = 0; i < NREC && diff < 0; i++)
            diff = same(a.at[i], b.at[i], TOTAL) ? -1 : i;
        CHECK(diff < 0, "hpZ: the values read at point %d differ from the flat run's", diff);
        if (rank == 0)
            printf("flat and hpZ 2 runs (engine memory: %s): every fetch and the final parameters equal: %s\n",
                   on_gpu ? "a CUDA device" : getenv("ZS_TEST_DEVICE") ? getenv("ZS_TEST_DEVICE") : "host",
                   diff < 0 ? "ok" : "bad");
    }
    return model_end("hpz_reload");
}
