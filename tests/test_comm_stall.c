/* test_comm_stall.c - a peer that never posts while this rank keeps launching: once the window of operations
 * in flight is full, the next launch waits for the oldest, and that wait ends in the watchdog's timeout
 * naming the missing rank, not in a hang. Run at 2 ranks: test_comm_stall shm|mpi (the backend). */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <mpi.h>

#include "check.h"
#include "comm/comm.h"

#define TIMEOUT_S 2.0
#define MAX_LAUNCHES 4096 /* well past any window: a launch that never waits is a failure too */

/* Rank 0 launches small reduce-scatters without waiting any, until a launch fails; rank 1 posts none. */
static void launch_until_refused(struct zs_comm *c, int rank)
{
    const int64_t count = 4;
    float *buf = malloc((size_t)count * 2 * sizeof(float));
    struct zs_comm_req *q = NULL;
    zs_status st = ZS_OK;
    int k = 0;

    for (int64_t i = 0; i < count * 2; i++)
        buf[i] = (float)i;
    while (rank == 0 && !st && k < MAX_LAUNCHES) {
        st = zs_comm_reduce_scatter(c, buf, buf + rank * count, count, 1.0f, &q);
        k += !st;
    }
    if (rank == 0) {
        const char *m = zs_last_error();
        printf("%d operations in flight, then: %s\n", k, st ? m : "(no error)");
        CHECK(st == ZS_ERR_COMM, "launch %d: status %d, expected the watchdog's ZS_ERR_COMM: %s", k, (int)st, m);
        CHECK(k > 1, "the first launch failed: nothing was in flight");
        CHECK(!st || (strstr(m, "timeout") && strstr(m, "ranks not arrived: 1")),
              "the error does not name the timeout and rank 1: %s", m);
    }
    MPI_Barrier(MPI_COMM_WORLD); /* rank 1 waits here the whole time, having posted nothing */
    zs_comm_free(c);
    free(buf);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    struct zs_comm_opts o;
    struct zs_comm *c = NULL;
    int rank, world, fails, any = 0;
    char err[256];

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    alarm(30); /* the backstop: SIGALRM's default action ends a rank stuck in the full window */
    CHECK(world == 2, "run at 2 ranks, not %d", world);
    CHECK(!strcmp(mode, "shm") || !strcmp(mode, "mpi"), "unknown backend '%s' (shm, mpi)", mode);
    CHECK(zs_comm_opts_from_env(&o, err, sizeof(err)) == 0, "%s", err);
    o.mode = !strcmp(mode, "mpi") ? ZS_COMM_MPI : ZS_COMM_SHM;
    o.timeout_s = TIMEOUT_S;
    if (!zs_test_fail)
        CHECK(zs_comm_init(&c, MPI_COMM_WORLD, &o) == ZS_OK, "%s", zs_last_error());
    if (c)
        launch_until_refused(c, rank);
    fails = zs_test_fail;
    MPI_Allreduce(&fails, &any, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Finalize();
    return any ? 1 : zs_test_summary(mode);
}
