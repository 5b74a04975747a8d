/* ranks.h - the cross-rank helpers every layer above core/ uses: agreeing on a failure, waiting for a vote
 * under the watchdog's deadline, the collective backend's options, and labelling the next collective. */
#ifndef ZS_RANKS_H
#define ZS_RANKS_H

#include <mpi.h>

#include "comm/comm.h"   /* defines: struct zs_comm_opts, enum zs_comm_purpose, zs_comm_label_next */
#include "comm/flight.h" /* defines: zs_flight_call */
#include "ctx.h"         /* defines: struct zs_ctx */
#include "memory.h"      /* defines: zs_mem_sample */

/* Collective: every rank learns whether any rank failed; the first failure's message (prefixed
 * "rank R: ") becomes every rank's, so no rank walks on into a collective the others never reach. */
zs_status zs_agree(struct zs_ctx *ctx, zs_status local);
/* Collective: rank r's message becomes every rank's error, with code (r == 0 unprefixed). */
zs_status zs_share_error(struct zs_ctx *ctx, int32_t r, zs_status code);

/* Waits for a nonblocking MPI collective under the watchdog's deadline. */
zs_status zs_vote_wait(struct zs_ctx *ctx, MPI_Request *r, const char *what);
double zs_wait_limit_s(const struct zs_ctx *ctx); /* how long zs_vote_wait and the like may wait */
/* The collective backend's options from the environment and the config (for every comm the engine opens). */
zs_status zs_comm_opts_for(const struct zs_ctx *ctx, struct zs_comm_opts *co);

/* The next collective's label (what it is for, which unit, this micro-step): compared across ranks
 * before its data moves, so ranks that drifted apart fail naming both operations. */
static inline void zs_label_on(struct zs_ctx *ctx, struct zs_comm *c, enum zs_comm_purpose what, int32_t unit)
{
    zs_comm_set_step(c, ctx->micro_step);
    zs_comm_label_next(c, what, unit);
}

static inline void zs_label(struct zs_ctx *ctx, enum zs_comm_purpose what, int32_t unit)
{
    zs_label_on(ctx, ctx->comm, what, unit);
}

/* An engine call, for the flight recorder and the memory report's RSS samples. */
static inline void zs_note(struct zs_ctx *ctx, const char *call, int32_t unit)
{
    zs_flight_call(zs_comm_flight(ctx->comm), call, unit, ctx->micro_step);
    zs_mem_sample(ctx);
}

#endif /* ZS_RANKS_H */
