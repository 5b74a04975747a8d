/* test_nccl_deadline.c - no wait on NCCL work outlasts zeroshard.timeout_s (ZS_TIMEOUT), on the emulated NCCL
 * (2 ranks, a GPU each). stop: rank 1 arrives at an all-gather only after rank 0's deadline; rank 0's wait
 * ends after the timeout with an error naming ncclAllGather and rank 1, and rank 1 still completes once it
 * comes. async: the emulator fails rank 0's first operation asynchronously (ZS_CUDA_EMU_NCCL_FAULT=0:1);
 * the wait ends at once with an error naming ncclAllGather and NCCL's report. die (under mpirun
 * --enable-recovery, with a long timeout): rank 1 exits before the all-gather; rank 0's wait ends within
 * seconds naming it as exited, and rank 0 leaves without MPI's clean-up, which would wait for the dead rank.
 * coll: stop through the engine's path (comm/coll.c), whose zs_coll_wait polls the request's event under the
 * same deadline. init: rank 1 comes to zs_nccl_init after the deadline; rank 0's set-up fails naming it. After each, later calls on the communicator fail and zs_nccl_free aborts it instead of
 * waiting. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "base/clock.h" /* defines: zs_now_s */
#include "comm/coll.h"
#include "comm/comm.h"
#include "comm/comm_nccl.h"
#include "device/device.h"

#define COUNT 1000

static int32_t rank;

/* One in-place all-gather of fp32 and the wait for it; the seconds it took in *took. */
static zs_status gather(struct zs_nccl *n, struct zs_device *dev, float *d, double *took)
{
    double t = zs_now_s();
    zs_status st = zs_nccl_all_gather(n, d, ZS_DTYPE_FP32, COUNT, NULL);

    if (!st)
        st = zs_nccl_sync(n);
    *took = zs_now_s() - t;
    return st;
}

static void t_stop(struct zs_nccl *n, struct zs_device *dev, float *d, double timeout)
{
    double took;
    zs_status st;
    const char *msg;

    if (rank == 1)
        sleep((unsigned)timeout + 3); /* past rank 0's deadline, then it comes */
    st = gather(n, dev, d, &took);
    msg = st ? zs_last_error() : "";
    if (rank == 1) {
        CHECK(!st, "rank 1: the late rank's all-gather: %s", msg);
        return;
    }
    CHECK(st, "rank 0: the all-gather completed without rank 1 (after %.1f s)", took);
    /* the bound above only tells a wait that ended at its deadline from one that something else ended: 30 s
     * leaves a loaded machine its slowness */
    CHECK(took >= timeout && took < timeout + 30, "rank 0: the wait took %.1f s, the timeout is %g s", took, timeout);
    CHECK(strstr(msg, "timeout: ncclAllGather of 8000 bytes") && strstr(msg, "ranks not arrived: 1;"),
          "rank 0: the message names neither the operation nor rank 1: %s", msg);
    printf("rank 0: %s\n", msg);
    CHECK(zs_nccl_all_gather(n, d, ZS_DTYPE_FP32, COUNT, NULL) && strstr(zs_last_error(), "unusable"),
          "rank 0: a call after the abort: %s", zs_last_error());
}

static void t_die(struct zs_nccl *n, struct zs_device *dev, float *d, double timeout)
{
    double took;
    zs_status st;
    const char *msg;

    if (rank == 1)
        _exit(0);
    st = gather(n, dev, d, &took);
    msg = st ? zs_last_error() : "";
    /* the exit is seen within about a second (LIVE_S, comm_nccl_wait.c); the 30 s timeout leaves a loaded
     * machine room, and the message below says which of the two ended the wait */
    CHECK(st && took < timeout, "rank 0: the all-gather %s after %.1f s", st ? "ended" : "completed", took);
    CHECK(strstr(msg, "ncclAllGather of 8000 bytes") && strstr(msg, "has exited: rank 1 (pid"),
          "rank 0: the message names neither the operation nor the dead rank 1: %s", msg);
    printf("rank 0: %s\n", msg);
    zs_nccl_free(n);
    printf("nccl_deadline die: rank 0: %d passed, %d failed\n", zs_test_pass, zs_test_fail);
    fflush(stdout);
    _exit(zs_test_fail ? 1 : 0);
}

/* t_stop through comm/coll.c, which takes n over (zs_coll_close frees it). */
static void t_coll(struct zs_nccl *n, struct zs_comm *comm, struct zs_device *dev, float *d, double timeout)
{
    struct zs_coll c = { 0 };
    struct zs_coll_req *req = NULL;
    double t;
    zs_status st = zs_coll_open(&c, comm, dev);
    const char *msg;

    c.nccl = n;
    if (rank == 1)
        sleep((unsigned)timeout + 3);
    t = zs_now_s();
    if (!st)
        st = zs_coll_all_gather(&c, d, ZS_DTYPE_FP32, COUNT, &req);
    if (!st)
        st = zs_coll_wait(&c, req);
    t = zs_now_s() - t;
    msg = st ? zs_last_error() : "";
    if (rank == 1) {
        CHECK(!st, "rank 1: the late rank's all-gather: %s", msg);
    } else {
        CHECK(st && t >= timeout && t < timeout + 30, "rank 0: zs_coll_wait %s after %.1f s (timeout %g s)",
              st ? "failed" : "completed", t, timeout);
        CHECK(strstr(msg, "timeout: ncclAllGather of 8000 bytes") && strstr(msg, "ranks not arrived: 1;"),
              "rank 0: the message names neither the operation nor rank 1: %s", msg);
        printf("rank 0: %s\n", msg);
    }
    zs_coll_close(&c);
}

static void t_async(struct zs_nccl *n, struct zs_device *dev, float *d, double timeout)
{
    double took;
    zs_status st = gather(n, dev, d, &took);
    const char *msg = st ? zs_last_error() : "";

    if (rank == 1) {
        CHECK(!st, "rank 1: its all-gather: %s", msg);
        return;
    }
    CHECK(st && took < timeout, "rank 0: the failed all-gather %s after %.1f s", st ? "ended" : "completed", took);
    CHECK(strstr(msg, "ncclAllGather of 8000 bytes") && strstr(msg, "ncclCommGetAsyncError"),
          "rank 0: the message names neither the operation nor NCCL's report: %s", msg);
    printf("rank 0: %s\n", msg);
}

/* Over a duplicate of the world: the timed-out exchanges stay posted there, out of the world's way. */
static void t_init(struct zs_comm *comm, double timeout)
{
    struct zs_nccl *n = NULL;
    MPI_Comm boot;
    double t;
    zs_status st;

    MPI_Comm_dup(MPI_COMM_WORLD, &boot);
    if (rank == 1)
        sleep((unsigned)timeout + 3);
    t = zs_now_s();
    st = zs_nccl_init(&n, boot, ZS_NCCL_ORDERED, comm);
    t = zs_now_s() - t;
    CHECK(st && !n, "rank %d: the set-up completed without its peer", rank);
    if (rank == 0) {
        CHECK(t >= timeout && t < timeout + 30, "rank 0: the set-up ended after %.1f s (timeout %g s)", t, timeout);
        CHECK(strstr(zs_last_error(), "timeout: NCCL set-up: the all-reduce of the ranks' status") &&
              strstr(zs_last_error(), "ranks not arrived: 1"),
              "rank 0: the message names neither NCCL's set-up nor rank 1: %s", zs_last_error());
        printf("rank 0: %s\n", zs_last_error());
    }
    zs_nccl_free(n);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    struct zs_comm_opts opts = { 0 };
    struct zs_comm *comm = NULL;
    struct zs_nccl *n = NULL;
    struct zs_device dev;
    char err[256];
    float *d;
    int fails;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (zs_comm_opts_from_env(&opts, err, sizeof(err)) || !opts.timeout_s || zs_comm_init(&comm, MPI_COMM_WORLD, &opts) ||
        zs_device_open(&dev, "cuda", "test_nccl_deadline", NULL, ZS_KPATH_SCALAR, zs_comm_local_rank(comm),
                       zs_comm_local_size(comm)) ||
        (strcmp(mode, "init") && zs_nccl_init(&n, MPI_COMM_WORLD, ZS_NCCL_ORDERED, comm))) {
        printf("FAIL: rank %d: set-up (needs ZS_TIMEOUT, ZS_CUDA_EMU_GPUS=2, ZS_CUDA_EMU_NCCL=1): %s\n", rank,
               comm ? zs_last_error() : err);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    d = dev.ops->alloc(&dev, 2 * COUNT * sizeof(float));
    if (!strcmp(mode, "stop"))
        t_stop(n, &dev, d, opts.timeout_s);
    else if (!strcmp(mode, "coll"))
        t_coll(n, comm, &dev, d, opts.timeout_s), n = NULL;
    else if (!strcmp(mode, "init"))
        t_init(comm, opts.timeout_s);
    else if (!strcmp(mode, "die"))
        t_die(n, &dev, d, opts.timeout_s);
    else if (!strcmp(mode, "async"))
        t_async(n, &dev, d, opts.timeout_s);
    else
        CHECK(0, "usage: test_nccl_deadline stop|async|die|coll|init, not \"%s\"", mode);
    zs_nccl_free(n); /* rank 0 aborts: no wait on the failed work */
    dev.ops->free(&dev, d);
    zs_device_close(&dev);
    MPI_Allreduce(&zs_test_fail, &fails, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    zs_comm_free(comm);
    if (rank == 0)
        printf("nccl_deadline %s: rank 0: %d passed, %d failed (all ranks: %d failed)\n", mode, zs_test_pass,
               zs_test_fail, fails);
    MPI_Finalize();
    return fails ? 1 : 0;
}
