/* world.c - the MPI world as a front end in another language needs it before (or without) a context: the
 * size of MPI_Comm here, the rank and node-local rank, and a broadcast for its own rendezvous. */
#include <stdint.h>

#include <mpi.h>

#include "base/error.h"
#include "zeroshard.h"

int32_t zs_mpi_comm_bytes(void)
{
    return (int32_t)sizeof(MPI_Comm);
}

static zs_status mpi_ready(const char *who)
{
    int init = 0, done = 0;

    MPI_Initialized(&init);
    MPI_Finalized(&done);
    if (!init || done)
        return zs_fail(ZS_ERR_INVALID, "%s: MPI is %s; the caller initialises it (MPI_Init, mpi4py, a front end)",
                       who, done ? "already finalised" : "not initialised");
    return ZS_OK;
}

zs_status zs_world_info(int32_t *rank, int32_t *world, int32_t *local_rank, int32_t *local_size)
{
    MPI_Comm node = MPI_COMM_NULL;
    int r = 0, n = 0, lr = 0, ln = 0, rc;
    zs_status st = mpi_ready("zs_world_info");

    if (st)
        return st;
    rc = MPI_Comm_rank(MPI_COMM_WORLD, &r);
    if (rc == MPI_SUCCESS)
        rc = MPI_Comm_size(MPI_COMM_WORLD, &n);
    /* collective over the world: the ranks sharing this node's memory, in world order */
    if (rc == MPI_SUCCESS)
        rc = MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, r, MPI_INFO_NULL, &node);
    if (rc == MPI_SUCCESS)
        rc = MPI_Comm_rank(node, &lr);
    if (rc == MPI_SUCCESS)
        rc = MPI_Comm_size(node, &ln);
    if (node != MPI_COMM_NULL)
        MPI_Comm_free(&node);
    if (rc != MPI_SUCCESS)
        return zs_fail(ZS_ERR_COMM, "zs_world_info: MPI error %d splitting MPI_COMM_WORLD by node", rc);
    if (rank)
        *rank = r;
    if (world)
        *world = n;
    if (local_rank)
        *local_rank = lr;
    if (local_size)
        *local_size = ln;
    return ZS_OK;
}

zs_status zs_world_bcast(void *buf, int64_t bytes, int32_t root)
{
    int n = 0, rc;
    zs_status st = mpi_ready("zs_world_bcast");

    if (st)
        return st;
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    if (bytes < 0 || (bytes > 0 && !buf) || root < 0 || root >= n)
        return zs_fail(ZS_ERR_INVALID, "zs_world_bcast: %lld bytes at %p from root %d of %d ranks", (long long)bytes,
                       buf, root, n);
    /* in pieces MPI's int count can hold */
    for (int64_t off = 0; off < bytes; off += INT32_MAX / 2) {
        int64_t len = bytes - off < INT32_MAX / 2 ? bytes - off : INT32_MAX / 2;
        rc = MPI_Bcast((char *)buf + off, (int)len, MPI_BYTE, root, MPI_COMM_WORLD);
        if (rc != MPI_SUCCESS)
            return zs_fail(ZS_ERR_COMM, "zs_world_bcast: MPI error %d broadcasting %lld bytes from rank %d", rc,
                           (long long)bytes, root);
    }
    return ZS_OK;
}
