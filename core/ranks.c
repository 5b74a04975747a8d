/* ranks.c - the cross-rank helpers: every rank learns the first failure, votes wait under the watchdog's
 * deadline, and every communicator the engine opens gets the same backend options. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "ranks.h"

/* The votes are MPI's nonblocking collectives under the watchdog's deadline: before the comm exists the
 * config's timeout (or ZS_TIMEOUT, or the default when this rank's config did not parse). */
double zs_wait_limit_s(const struct zs_ctx *ctx)
{
    struct zs_comm_opts o;
    char err[256];
    double t = ctx->cfg.zs.timeout_s > 0 ? ctx->cfg.zs.timeout_s : ZS_TIMEOUT_DEFAULT;

    if (zs_comm_opts_from_env(&o, err, sizeof(err)) == 0 && o.timeout_env)
        t = o.timeout_s;
    return t;
}

zs_status zs_vote_wait(struct zs_ctx *ctx, MPI_Request *r, const char *what)
{
    if (!zs_mpi_wait_timeout(r, zs_wait_limit_s(ctx), ctx->rank, what, NULL))
        return ZS_OK;
    char msg[768];
    snprintf(msg, sizeof(msg), "%s", zs_last_error());
    return zs_fail(ZS_ERR_COMM, "%s; some rank has not reached it (an MPI vote does not say which)", msg);
}

/* The first failing rank's message goes to every rank, so each reports the same line. */
zs_status zs_share_error(struct zs_ctx *ctx, int32_t r, zs_status code)
{
    char msg[1024];

    snprintf(msg, sizeof(msg), "%s", zs_last_error());
    MPI_Request q;
    if (MPI_Ibcast(msg, sizeof(msg), MPI_BYTE, r, ctx->parent, &q) != MPI_SUCCESS)
        return zs_fail(ZS_ERR_COMM, "broadcast of rank %d's error failed", r);
    if (zs_vote_wait(ctx, &q, "the broadcast of a rank's error"))
        return ZS_ERR_COMM;
    msg[sizeof(msg) - 1] = '\0';
    if (r == 0)
        return zs_fail(code, "%s", msg);
    return zs_fail(code, "rank %d: %s", r, msg);
}

zs_status zs_agree(struct zs_ctx *ctx, zs_status local)
{
    int32_t *all = calloc((size_t)ctx->world, sizeof(int32_t)), mine = (int32_t)local;
    zs_status st = ZS_OK;

    if (!all)
        return zs_fail(ZS_ERR_NOMEM, "out of memory");
    MPI_Request q;
    if (MPI_Iallgather(&mine, 1, MPI_INT32_T, all, 1, MPI_INT32_T, ctx->parent, &q) != MPI_SUCCESS)
        st = zs_fail(ZS_ERR_COMM, "all-gather of the ranks' status failed");
    else
        st = zs_vote_wait(ctx, &q, "the vote on every rank's status");
    for (int32_t r = 0; !st && r < ctx->world; r++)
        if (all[r]) {
            st = zs_share_error(ctx, r, (zs_status)all[r]);
            break;
        }
    free(all);
    return st;
}

/* The collective backend's options: ZS_COMM / ZS_FAKE_NODE_SIZE in the environment, else the zeroshard
 * section, else automatic (shared memory inside a node, MPI between nodes). */
zs_status zs_comm_opts_for(const struct zs_ctx *ctx, struct zs_comm_opts *co)
{
    char err[256];

    if (zs_comm_opts_from_env(co, err, sizeof(err)))
        return zs_fail(ZS_ERR_CONFIG, "%s", err);
    if (!getenv("ZS_COMM") || !*getenv("ZS_COMM"))
        co->mode = !strcmp(ctx->cfg.zs.comm, "mpi") ? ZS_COMM_MPI : !strcmp(ctx->cfg.zs.comm, "shm") ? ZS_COMM_SHM
                                                                                                         : ZS_COMM_AUTO;
    if (co->fake_node_size == 0)
        co->fake_node_size = (int32_t)ctx->cfg.zs.fake_node_size;
    if (!co->timeout_env)
        co->timeout_s = ctx->cfg.zs.timeout_s;
    co->flight_dir = ctx->cfg.zs.flight_dir;
    return ZS_OK;
}
