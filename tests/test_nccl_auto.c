/* test_nccl_auto.c EXPECT - which transport zeroshard.device_comm "auto" picks on the emulated GPUs: "nccl"
 * where no two ranks share a GPU by their PCI bus ids, even when each rank sees only one GPU (per-rank
 * CUDA_VISIBLE_DEVICES: ZS_CUDA_EMU_GPUS=1 ZS_CUDA_EMU_BUS=local), "staged" (host-staged) where ranks really
 * share one. Every rank must agree. The memory report names the NCCL staging buffer it holds (none when
 * host-staged), and the estimate before launch the same bytes. EXPECT "hybrid": GPUs of their own, but hybrid
 * sharding (mics_shard_size 1 at 2 ranks), whose collectives are never NCCL's: no NCCL communicator is made
 * (the emulator counts them), the report and the estimate count no staging, and "ordered" is refused naming the
 * key. */
#include <string.h>
#include <mpi.h>

#include "check.h"
#include "comm/comm_nccl.h" /* defines: zs_nccl_stage_bytes */
#include "core/ctx.h" /* defines: struct zs_ctx (its collectives' NCCL transport) */
#include "zeroshard.h"

unsigned long long zs_emu_nccl_inits(void); /* tests/cuda_emu: NCCL communicators this process began to make */

static const char *config(bool hybrid, const char *comm)
{
    static char json[256];

    snprintf(json, sizeof(json), "{\"train_micro_batch_size_per_gpu\": 1, %s\"zeroshard\": {\"device\": \"cuda\", "
             "\"device_comm\": \"%s\"}}", hybrid ? "\"zero_optimization\": {\"stage\": 3, \"mics_shard_size\": 1}, " : "",
             comm);
    return json;
}

int main(int argc, char **argv)
{
    const char *expect = argc > 1 ? argv[1] : "";
    bool hybrid = !strcmp(expect, "hybrid"), nccl = !strcmp(expect, "nccl");
    const char *json = config(hybrid, "auto");
    zs_init_opts o = { .config_json = json, .use_comm = 1, .comm = MPI_COMM_WORLD, .quiet = 1 };
    zs_ctx *ctx = NULL;
    const char *got = "none";
    int rank, fails;
    zs_status st;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    st = zs_init(&ctx, &o);
    if (!st)
        got = ctx->coll.nccl ? "nccl" : "staged";
    CHECK(!st && !strcmp(got, nccl ? "nccl" : "staged"), "rank %d: \"auto\" picked %s, expected %s%s%s", rank, got,
          nccl ? "nccl" : "staged", st ? ": " : "", st ? zs_last_error() : "");
    CHECK(zs_emu_nccl_inits() == (nccl ? 1 : 0), "rank %d: %llu NCCL communicators made, expected %d", rank,
          zs_emu_nccl_inits(), nccl ? 1 : 0);
    if (!st) {
        zs_memory_report r, e;
        int64_t unit = 1000;
        uint64_t want = ctx->coll.nccl ? zs_nccl_stage_bytes(ctx->world) : 0;
        st = zs_memory(ctx, &r);
        CHECK(!st && r.nccl_staging == want && (want > 0) == nccl,
              "rank %d: the report's NCCL staging %llu bytes, held %llu", rank, (unsigned long long)r.nccl_staging,
              (unsigned long long)want);
        /* the plan before launch: staging wherever NCCL may start, none with hybrid sharding */
        want = hybrid ? 0 : zs_nccl_stage_bytes(ctx->world);
        st = zs_estimate_memory(json, ctx->world, 1, &unit, &e);
        CHECK(!st && e.nccl_staging == want, "rank %d: the estimate's NCCL staging %llu bytes, expected %llu", rank,
              (unsigned long long)e.nccl_staging, (unsigned long long)want);
    }
    if (ctx)
        zs_finalize(ctx);
    if (hybrid) { /* asked for by name, NCCL would carry nothing: refused */
        ctx = NULL;
        o.config_json = config(true, "ordered");
        st = zs_init(&ctx, &o);
        CHECK(st == ZS_ERR_CONFIG && strstr(zs_last_error(), "zeroshard.device_comm: \"ordered\"") &&
              strstr(zs_last_error(), "mics_shard_size 1"), "rank %d: \"ordered\" with hybrid sharding: status %d, %s",
              rank, (int)st, st ? zs_last_error() : "accepted");
        CHECK(zs_emu_nccl_inits() == 0, "rank %d: the refused run made an NCCL communicator", rank);
        if (ctx)
            zs_finalize(ctx);
    }
    MPI_Allreduce(&zs_test_fail, &fails, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0)
        printf("nccl_auto: rank 0 picked %s (expected %s); all ranks: %d failed\n", got, expect, fails);
    MPI_Finalize();
    return fails ? 1 : 0;
}
