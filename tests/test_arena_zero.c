/* test_arena_zero.c DEVICE - what a stage-3 step zero-fills in the device arena: the gathered units come from
 * the arena at every fetch, and the all-gather writes each of them whole, so the step zero-fills none of their
 * bytes (a memset of the whole model per step before); the set-up's buffers, read or accumulated into before
 * they are written whole, still come zero-filled. DEVICE: "separate" (the separate CPU test device) or "cuda"
 * (the emulated GPU, tests/cuda_emu), under mpirun. That the bits stay those of the CPU device is the devpath
 * tests' work. */
#include <stdlib.h>
#include <string.h>
#include <mpi.h>

#include "check.h"
#include "core/ctx.h"       /* defines: struct zs_ctx, its arena and units */
#include "base/error.h"     /* defines: zs_last_error */
#include "zeroshard.h"

static void fill(void *arg, int32_t param, int64_t first, int64_t count, float *dst)
{
    for (int64_t i = 0; i < count; i++)
        dst[i] = 0.001f * (float)((first + i + param * 7) % 97);
}

/* Three units of 1000 elements, stage 3, nothing kept gathered between fetches. */
static zs_status open_engine(zs_ctx **ctx, int32_t *unit, bool cuda)
{
    const char *json =
        "{\"train_micro_batch_size_per_gpu\": 1, \"gradient_accumulation_steps\": 1,"
        "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01}},"
        "\"zero_optimization\": {\"stage\": 3, \"stage3_param_persistence_threshold\": 0,"
        "\"stage3_max_live_parameters\": 1000, \"stage3_prefetch_bucket_size\": 0},"
        "\"zeroshard\": {\"device\": \"%s\"}}";
    char cfg[1024];
    zs_status st;

    snprintf(cfg, sizeof(cfg), json, cuda ? "cuda" : "cpu");
    zs_init_opts o = { .config_json = cfg, .use_comm = 1, .comm = MPI_COMM_WORLD, .quiet = 1 };
    if (!cuda)
        setenv("ZS_TEST_DEVICE", "separate", 1);
    st = zs_init(ctx, &o);
    unsetenv("ZS_TEST_DEVICE");
    for (int u = 0; !st && u < 3; u++) {
        char name[16];
        int32_t p;
        snprintf(name, sizeof(name), "u%d", u);
        st = zs_unit_add(*ctx, name, &unit[u]);
        snprintf(name, sizeof(name), "u%d.w", u);
        if (!st)
            st = zs_param_add_init(*ctx, unit[u], name, 1000, fill, NULL, &p);
    }
    return st ? st : zs_setup(*ctx);
}

/* One micro-batch, every unit fetched (gathered from the arena) and released, then the step; *gathered: the
 * bytes the fetches took from the arena. */
static zs_status one_step(zs_ctx *ctx, const int32_t *unit, uint64_t *gathered)
{
    static float g[1000];
    zs_status st = ZS_OK;

    for (int i = 0; i < 1000; i++)
        g[i] = 0.01f * (float)(i % 13) - 0.05f;
    for (int u = 2; !st && u >= 0; u--) {
        void *buf = NULL;
        st = zs_unit_fetch(ctx, unit[u], NULL);
        *gathered += (uint64_t)ctx->units[unit[u]].part.padded * ctx->psz;
        if (!st)
            st = zs_grad_buffer(ctx, unit[u], &buf);
        if (!st)
            st = zs_copy_from_host(ctx, buf, g, sizeof(g));
        if (!st)
            st = zs_grad_ready(ctx, unit[u]);
        if (!st)
            st = zs_unit_release(ctx, unit[u]);
    }
    return st ? st : zs_step(ctx);
}

static uint64_t zeroed_all(const zs_ctx *ctx)
{
    uint64_t s = 0;

    for (int i = 0; i < ZS_ARENA_REGIONS; i++)
        s += ctx->dev_arena.zeroed[i];
    return s;
}

int main(int argc, char **argv)
{
    bool cuda = argc > 1 && !strcmp(argv[1], "cuda");
    zs_ctx *ctx = NULL;
    int32_t unit[3];
    int rank = 0;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    zs_status st = open_engine(&ctx, unit, cuda);
    CHECK(!st, "set-up: %s", zs_last_error());
    if (!st) {
        CHECK(ctx->dev_arena.open && ctx->dev_arena.zeroed[ZS_MEM_PARAMS] > 0 && ctx->dev_arena.zeroed[ZS_MEM_GRADS] > 0,
              "rank %d: the set-up's parameters and gradients were not zero-filled", rank);
        for (int step = 0; step < 2; step++) {
            uint64_t live = ctx->dev_arena.zeroed[ZS_MEM_LIVE], all = zeroed_all(ctx), gathered = 0;
            CHECK(one_step(ctx, unit, &gathered) == ZS_OK, "step %d: %s", step, zs_last_error());
            uint64_t dlive = ctx->dev_arena.zeroed[ZS_MEM_LIVE] - live, dall = zeroed_all(ctx) - all;
            if (rank == 0)
                printf("step %d: %llu bytes gathered from the arena, %llu of them zero-filled; %llu zero-filled in all\n",
                       step, (unsigned long long)gathered, (unsigned long long)dlive, (unsigned long long)dall);
            CHECK(gathered > 0 && dlive == 0, "rank %d, step %d: %llu of the %llu gathered bytes zero-filled", rank, step,
                  (unsigned long long)dlive, (unsigned long long)gathered);
        }
    }
    CHECK(zs_finalize(ctx) == ZS_OK, "finalize: %s", zs_last_error());
    int failed = zs_test_fail, any = 0;
    MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    MPI_Finalize();
    if (rank == 0)
        return zs_test_summary(cuda ? "arena zero-fill (emulated GPU)" : "arena zero-fill (separate device)") || any;
    return failed ? 1 : 0;
}
