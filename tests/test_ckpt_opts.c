/* test_ckpt_opts.c - loads mid-training and a parameter's full state (zs_param_read / zs_param_write) at every
 * stage and offload; run under mpirun -np 2 (the model: ckpt_model.h).
 * For stages 0-3, offload none/cpu/nvme, fp32, bf16, fp16, accumulation 1 and 2 and deterministic mode: 2
 * steps, a save under the tag "checkpoint", step 3, a load of it there and step 3 again, step 4, a partial
 * evaluation pass (stage 3 keeps prefetched copies), then a load of "checkpoint" and steps 3 and 4 again,
 * which must give the same state bit for bit, and a fetch right after the load must show step 2's values.
 * The state read at step 3 (parameters, the reduced gradient before the step, both moments) must equal the
 * first set-up's of the same accumulation (stage 0: whole state on every rank) bit for bit: the made-up
 * gradients are exact in binary, so no stage or dtype rounds differently. A write from rank 1 must show in
 * the next fetch and carry into the next step. A one-rank world loads the two-rank checkpoint and reads the
 * same parameters. With ZS_TEST_DEVICE=separate the engine's memory is where the host faults, so every
 * access must copy; with the argument "cuda" the engine runs on zeroshard.device "cuda" (a GPU, or
 * tests/cuda_emu's emulation). */
#include "ckpt_model.h"

/* What a set-up's run leaves for the comparison with the reference set-up's. */
struct record {
    float grad3[TOTAL], param3[TOTAL], m3[TOTAL], v3[TOTAL], after_write[TOTAL];
};

static void run_setup(const struct setup *s, struct record *rec, const struct record *ref)
{
    zs_ctx *ctx = NULL;
    char dir[400];
    static float f2[TOTAL], f2w[TOTAL], f3[TOTAL], f4[TOTAL], again[TOTAL], w[TOTAL], got[TOTAL], before[TOTAL];
    zs_ckpt_opts o = {.tag = "checkpoint"};
    zs_step_stats stats;
    int loaded = -1;
    zs_status st;

    snprintf(dir, sizeof(dir), "%s/%s", base, s->name);
    accum = s->accum;
    st = open_ctx(&ctx, s, MPI_COMM_WORLD, world, NULL);
    CHECK(!st, "%s: set-up: %s", s->name, zs_last_error());
    if (st)
        return;
    st = one_step(ctx, NULL);
    if (!st)
        st = one_step(ctx, NULL);
    if (!st)
        st = zs_checkpoint_save_opts(ctx, dir, &o);
    CHECK(!st, "%s: two steps and the save: %s", s->name, zs_last_error());
    CHECK(!strcmp(zs_checkpoint_tag(ctx), "checkpoint"), "%s: tag after the save '%s'", s->name,
          zs_checkpoint_tag(ctx));
    if (!st)
        st = read_all(ctx, ZS_STATE_PARAM, f2);
    if (!st)
        st = fetched(ctx, f2w);
    if (!st)
        st = one_step(ctx, rec->grad3);
    if (!st)
        st = read_all(ctx, ZS_STATE_PARAM, rec->param3);
    if (!st)
        st = read_all(ctx, ZS_STATE_EXP_AVG, rec->m3);
    if (!st)
        st = read_all(ctx, ZS_STATE_EXP_AVG_SQ, rec->v3);
    if (!st)
        st = read_all(ctx, ZS_STATE_PARAM, f3);
    /* after 3 steps, the step-2 checkpoint; step 3 again gives the same state */
    if (!st)
        st = zs_checkpoint_load_opts(ctx, dir, &o, &loaded);
    if (!st)
        st = one_step(ctx, NULL);
    if (!st)
        st = read_all(ctx, ZS_STATE_PARAM, got);
    CHECK(!st && same(got, f3, TOTAL), "%s: step 3 after loading at step 3 differs (%s)", s->name,
          st ? zs_last_error() : "values");
    if (!st)
        st = one_step(ctx, NULL);
    if (!st)
        st = read_all(ctx, ZS_STATE_PARAM, f4);
    CHECK(!st, "%s: steps 3 and 4 and their reads: %s", s->name, zs_last_error());
    if (st)
        goto out_finalize;
    /* an evaluation pass that stops after the first unit: stage 3 has prefetched the next ones */
    st = zs_unit_fetch(ctx, 0, NULL);
    if (!st)
        st = zs_unit_release(ctx, 0);
    if (!st)
        st = zs_checkpoint_load_opts(ctx, dir, &o, &loaded);
    CHECK(!st && loaded == 1, "%s: load mid-training: %s", s->name, st ? zs_last_error() : "loaded");
    zs_stats(ctx, &stats);
    CHECK(stats.global_step == 2 && stats.micro_step == 2 * accum, "%s: after the load step %lld micro %lld",
          s->name, (long long)stats.global_step, (long long)stats.micro_step);
    if (!st)
        st = fetched(ctx, got);
    CHECK(!st && same(got, f2w, TOTAL), "%s: a fetch right after the load does not show step 2's parameters (%s)",
          s->name, st ? zs_last_error() : "values");
    if (!st)
        st = one_step(ctx, NULL);
    if (!st)
        st = one_step(ctx, NULL);
    if (!st)
        st = read_all(ctx, ZS_STATE_PARAM, again);
    CHECK(!st && same(again, f4, TOTAL), "%s: steps 3-4 after the load differ from the uninterrupted run's (%s)",
          s->name, st ? zs_last_error() : "values");

    /* step 5 starts a window whose evaluation pass stops after unit 0 (stage 3 prefetches unit 1); rank 1
     * writes p2 (unit 1) and every rank fetches it; then a step from there */
    if (!st)
        st = one_step(ctx, NULL);
    if (!st)
        st = read_all(ctx, ZS_STATE_PARAM, before);
    if (!st)
        st = zs_unit_fetch(ctx, 0, NULL);
    if (!st)
        st = zs_unit_release(ctx, 0);
    for (int i = 0; i < TOTAL; i++)
        w[i] = rank == 1 ? (float)(i % 29) / 32.0f - 0.25f : NAN;
    if (!st)
        st = zs_param_write(ctx, 2, ZS_STATE_PARAM, rank == 1 ? w : NULL, 1);
    for (int i = 0; i < TOTAL; i++)
        w[i] = (float)(i % 29) / 32.0f - 0.25f; /* what rank 1 sent (exact in bf16 too) */
    if (!st)
        st = fetched(ctx, got);
    CHECK(!st && same(got + numel[0] + numel[1], w, numel[2]), "%s: the fetch after the write does not show it (%s)",
          s->name, st ? zs_last_error() : "values");
    if (!st)
        st = read_all(ctx, ZS_STATE_PARAM, got);
    memcpy(before + numel[0] + numel[1], w, (size_t)numel[2] * sizeof(float));
    CHECK(!st && same(got, before, TOTAL), "%s: the masters after the write (%s)", s->name,
          st ? zs_last_error() : "values");
    /* rank 0 writes p3's exp_avg (unit 2, whole on every rank at stage 3): read back, then in the next step */
    for (int i = 0; i < numel[3]; i++)
        w[i] = (float)(i % 5) / 1024.0f;
    if (!st)
        st = zs_param_write(ctx, 3, ZS_STATE_EXP_AVG, rank == 0 ? w : NULL, 0);
    if (!st)
        st = zs_param_read(ctx, 3, ZS_STATE_EXP_AVG, got);
    CHECK(!st && same(got, w, numel[3]), "%s: exp_avg written and read back (%s)", s->name,
          st ? zs_last_error() : "values");
    if (!st)
        st = one_step(ctx, NULL);
    if (!st)
        st = read_all(ctx, ZS_STATE_PARAM, rec->after_write);
    CHECK(!st, "%s: the step after the write: %s", s->name, zs_last_error());
    if (ref) {
        CHECK(same(rec->grad3, ref->grad3, TOTAL), "%s: reduced gradient at step 3 != the reference's", s->name);
        CHECK(same(rec->param3, ref->param3, TOTAL), "%s: parameters at step 3 != the reference's", s->name);
        CHECK(same(rec->m3, ref->m3, TOTAL), "%s: exp_avg at step 3 != the reference's", s->name);
        CHECK(same(rec->v3, ref->v3, TOTAL), "%s: exp_avg_sq at step 3 != the reference's", s->name);
        CHECK(same(rec->after_write, ref->after_write, TOTAL), "%s: the step after the write != the reference's",
              s->name);
    }
out_finalize:
    zs_finalize(ctx);

    /* a world of one rank loads the two-rank checkpoint */
    MPI_Comm solo;
    MPI_Comm_split(MPI_COMM_WORLD, rank, 0, &solo);
    if (rank == 0) {
        st = open_ctx(&ctx, s, solo, 1, NULL);
        if (!st)
            st = zs_checkpoint_load_opts(ctx, dir, &o, &loaded);
        if (!st)
            st = read_all(ctx, ZS_STATE_PARAM, got);
        CHECK(!st && same(got, f2, TOTAL), "%s: one rank loading the two-rank checkpoint (%s)", s->name,
              st ? zs_last_error() : "values differ");
        zs_finalize(ctx);
    }
    MPI_Comm_free(&solo);
    MPI_Barrier(MPI_COMM_WORLD);
}

int main(int argc, char **argv)
{
    static const struct setup setups[] = {
        {"s0", 0, "none", "fp32", 2, 0},      {"s1", 1, "none", "fp32", 2, 0},     {"s2", 2, "none", "fp32", 2, 0},
        {"s3", 3, "none", "fp32", 2, 0},      {"s2cpu", 2, "cpu", "fp32", 2, 0},   {"s3cpu", 3, "cpu", "fp32", 2, 0},
        {"s3nvme", 3, "nvme", "fp32", 2, 0},  {"s1bf16", 1, "none", "bf16", 2, 0}, {"s3bf16", 3, "cpu", "bf16", 2, 0},
        {"s0acc1", 0, "none", "fp32", 1, 0},  {"s3acc1", 3, "none", "fp32", 1, 0}, {"s2nvme1", 2, "nvme", "fp32", 1, 0},
        {"s0det", 0, "none", "fp32", 2, 1}, {"s3det", 3, "cpu", "fp32", 2, 1},
        {"s0fp16", 0, "none", "fp16", 2, 0}, {"s2fp16", 2, "cpu", "fp16", 2, 0}, {"s3fp16", 3, "none", "fp16", 2, 0},
        {"s3nvmebf16", 3, "nvme", "bf16", 2, 0},
    };
    static struct record recs[sizeof(setups) / sizeof(setups[0])];
    const char *only = argc > 1 && strcmp(argv[1], "cuda") ? argv[1] : NULL, *dev = getenv("ZS_TEST_DEVICE");
    bool separate;

    on_gpu = argc > 1 && !strcmp(argv[1], "cuda");
    separate = on_gpu || (dev && !strcmp(dev, "separate")); /* the host cannot read the engine's memory */

    model_begin(&argc, &argv, "ckpt-opts");
    if (rank == 0)
        printf("engine memory: %s\n", on_gpu ? "a CUDA device" : separate ? "the separate test device (no access "
               "without a copy)" : "host");
    for (size_t i = 0; i < sizeof(setups) / sizeof(setups[0]); i++) {
        const struct record *ref = NULL;
        if ((only && strcmp(only, setups[i].name)) || (separate && setups[i].det))
            continue; /* deterministic mode needs a device the host reads in place */
        /* the first set-up of the same dtype (fp16's masters move exactly as fp32's) and accumulation */
        for (size_t j = 0; j < i && !only; j++)
            if ((!strcmp(setups[j].dtype, setups[i].dtype) ||
                 (!strcmp(setups[i].dtype, "fp16") && !strcmp(setups[j].dtype, "fp32"))) &&
                setups[j].accum == setups[i].accum) {
                ref = &recs[j];
                break;
            }
        run_setup(&setups[i], &recs[i], ref);
        if (i == 0)
            memcpy(reference_grad, recs[0].grad3, sizeof(reference_grad));
    }
    return model_end("test_ckpt_opts");
}
