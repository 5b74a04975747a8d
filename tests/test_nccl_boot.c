/* test_nccl_boot.c CASE MODE - NCCL's set-up (comm/comm_nccl.c) when one rank cannot take part, through zs_init
 * on the emulated NCCL (2 ranks, a GPU each). CASE "id": rank 0's ncclGetUniqueId fails
 * (ZS_CUDA_EMU_NCCL_ID_FAIL=0); "stage": rank 1's cudaMalloc of the NCCL staging buffer fails
 * (ZS_CUDA_EMU_MALLOC_FAIL, set on rank 1 only); "none": nothing fails. MODE: zeroshard.device_comm "auto" (every
 * rank keeps the host-staged transport, or takes NCCL where nothing failed) or "ordered" (every rank's zs_init
 * fails naming the key and the rank that failed). Every rank must learn of the failure at once, not at its
 * deadline: under ZS_TIMEOUT=120 the set-up ends in under half of it on every rank. With ZS_CUDA_EMU_NCCL_OLD=1
 * (NCCL older than 2.14: a blocking set-up, without a deadline) the same, since no rank enters ncclCommInitRank
 * unless every rank got there. Exits 0 (pass) or 1. */
#include <stdlib.h>
#include <string.h>
#include <mpi.h>

#include "check.h"
#include "base/clock.h"     /* defines: zs_now_s */
#include "comm/comm_nccl.h" /* defines: zs_nccl_stage_bytes */
#include "core/ctx.h"       /* defines: struct zs_ctx (its collectives' NCCL transport) */
#include "zeroshard.h"

static int rank, world;

/* zs_init with device_comm `mode`, timed; the failure's message in msg. */
static zs_status boot(const char *mode, zs_ctx **ctx, double *took, char *msg, size_t len)
{
    char json[256];
    zs_status st;
    double t;

    snprintf(json, sizeof(json), "{\"train_micro_batch_size_per_gpu\": 1, \"zeroshard\": {\"device\": \"cuda\", "
             "\"device_comm\": \"%s\"}}", mode);
    zs_init_opts o = { .config_json = json, .use_comm = 1, .comm = MPI_COMM_WORLD, .quiet = 1 };
    t = zs_now_s();
    st = zs_init(ctx, &o);
    *took = zs_now_s() - t;
    snprintf(msg, len, "%s", st ? zs_last_error() : "");
    return st;
}

int main(int argc, char **argv)
{
    const char *which = argc > 2 ? argv[1] : "", *mode = argc > 2 ? argv[2] : "";
    const char *tv = getenv("ZS_TIMEOUT");
    double timeout = tv ? atof(tv) : 0, took = 0;
    bool fails = strcmp(which, "none") != 0;
    zs_ctx *ctx = NULL;
    char msg[1024], stage[32];
    int any = 0;
    zs_status st;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (world != 2 || timeout < 60 || (strcmp(which, "id") && strcmp(which, "stage") && strcmp(which, "none")) ||
        (strcmp(mode, "auto") && strcmp(mode, "ordered"))) {
        printf("usage: ZS_TIMEOUT=120 mpirun -n 2 test_nccl_boot id|stage|none auto|ordered (with "
               "ZS_CUDA_EMU_GPUS=2 ZS_CUDA_EMU_NCCL=1)\n");
        MPI_Finalize();
        return 1;
    }
    if (!strcmp(which, "id"))
        setenv("ZS_CUDA_EMU_NCCL_ID_FAIL", "0", 1);
    snprintf(stage, sizeof(stage), "%llu", (unsigned long long)zs_nccl_stage_bytes(world));
    if (!strcmp(which, "stage") && rank == 1)
        setenv("ZS_CUDA_EMU_MALLOC_FAIL", stage, 1);
    st = boot(mode, &ctx, &took, msg, sizeof(msg));
    unsetenv("ZS_CUDA_EMU_MALLOC_FAIL");
    unsetenv("ZS_CUDA_EMU_NCCL_ID_FAIL");
    printf("rank %d: %s %s: zs_init %s after %.1f s%s%s\n", rank, which, mode, st ? "failed" : "returned", took,
           st ? ": " : "", msg);
    /* the peers hear of the failure at once: the exchanges of the set-up are always matched */
    CHECK(took < timeout / 2, "rank %d: the set-up took %.1f s, the deadline is %g s: a rank waited for a peer "
          "that had failed", rank, took, timeout);
    if (!strcmp(mode, "auto") || !fails) {
        bool nccl = !st && ctx->coll.nccl;
        CHECK(!st, "rank %d: zs_init with \"%s\": %s", rank, mode, msg);
        CHECK(nccl == !fails, "rank %d: the collectives are %s, expected %s", rank, nccl ? "NCCL's" : "host-staged",
              fails ? "host-staged" : "NCCL's");
    } else if (!strcmp(which, "id")) { /* zs_init's agreement gives every rank the first failed rank's message */
        CHECK(st && strstr(msg, "zeroshard.device_comm: \"ordered\"") && strstr(msg, "rank 0: ncclGetUniqueId"),
              "rank %d: the error names neither the key nor rank 0's ncclGetUniqueId: %s", rank, msg);
    } else {
        CHECK(st && strstr(msg, "zeroshard.device_comm: \"ordered\"") && strstr(msg, "failed on rank 1") &&
              strstr(msg, "staging buffer"), "rank %d: the error names neither the key nor rank 1's staging buffer: %s",
              rank, msg);
    }
    if (!st) { /* the engine's communicator carries on: nothing of the set-up is left posted on it */
        double v = rank + 1.0;
        CHECK(!zs_allreduce_sum(ctx, &v, 1) && v == 3.0, "rank %d: an all-reduce after the set-up: %s", rank,
              zs_last_error());
    }
    if (ctx)
        zs_finalize(ctx);
    MPI_Allreduce(&zs_test_fail, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    MPI_Finalize();
    if (rank == 0) {
        char name[64];
        snprintf(name, sizeof(name), "nccl_boot %s %s", which, mode);
        return zs_test_summary(name) || any;
    }
    return zs_test_fail ? 1 : 0;
}
