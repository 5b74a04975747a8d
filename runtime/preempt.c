/* preempt.c - what a program sees of the fault handling: its own flight-recorder dumps, stopping cleanly
 * on SIGTERM (all ranks after the same step, so the checkpoint they save is one state), and a sum across
 * ranks under the watchdog, so a program's own exchanges cannot hang either. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/test_hooks.h"
#include "core/ctx.h"
#include "core/ranks.h"

static volatile sig_atomic_t term_seen;

static void on_term(int sig)
{
    (void)sig;
    term_seen = 1; /* async-signal-safe: the vote in zs_preempt_requested does the rest */
}

zs_status zs_flight_dump(zs_ctx *ctx, const char *why)
{
    if (!ctx || !ctx->comm)
        return zs_fail(ZS_ERR_INVALID, "zs_flight_dump: no context");
    zs_comm_flight_dump(ctx->comm, why ? why : "requested by the program");
    return ZS_OK;
}

zs_status zs_preempt_enable(zs_ctx *ctx)
{
    struct sigaction sa;

    if (!ctx)
        return zs_fail(ZS_ERR_INVALID, "zs_preempt_enable: NULL context");
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_term;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGTERM, &sa, NULL) != 0)
        return zs_fail(ZS_ERR_INVALID, "zs_preempt_enable: rank %d: cannot install the SIGTERM handler", ctx->rank);
    return ZS_OK;
}

/* Test hook: ZS_TEST_SIGTERM=STEP:RANK sends this rank SIGTERM itself when it asks at global step STEP,
 * as a scheduler would at that moment (through the real handler, when zs_preempt_enable installed it). */
static void test_signal(const struct zs_ctx *ctx)
{
    const char *e = getenv(ZS_TEST_HOOK_SIGTERM);
    long long step;
    int rank;

    if (e && sscanf(e, "%lld:%d", &step, &rank) == 2 && rank == ctx->rank && step == ctx->global_step)
        raise(SIGTERM);
}

/* One small checked all-gather: any rank's flag stops them all after this same call. */
zs_status zs_preempt_requested(zs_ctx *ctx, int *stop)
{
    int32_t mine, *all;
    zs_status st;

    if (!ctx || !stop)
        return zs_fail(ZS_ERR_INVALID, "zs_preempt_requested: NULL argument");
    *stop = 0;
    if (!ctx->set_up)
        return zs_fail(ZS_ERR_INVALID, "zs_preempt_requested: call zs_setup first");
    all = calloc((size_t)ctx->world, sizeof(*all));
    if (!all)
        return zs_fail(ZS_ERR_NOMEM, "zs_preempt_requested: out of memory");
    test_signal(ctx);
    mine = term_seen != 0;
    zs_label(ctx, ZS_PURPOSE_PREEMPT, -1);
    st = zs_comm_allgather_bytes(ctx->comm, &mine, all, (int32_t)sizeof(mine));
    for (int32_t r = 0; !st && r < ctx->world; r++)
        *stop |= all[r] != 0;
    free(all);
    return st;
}

zs_status zs_allreduce_sum(zs_ctx *ctx, double *values, int32_t n)
{
    double *all;
    zs_status st;

    if (!ctx || (!values && n > 0) || n < 0 || n > (1 << 20))
        return zs_fail(ZS_ERR_INVALID, "zs_allreduce_sum: bad argument (n = %d)", n);
    if (!ctx->comm)
        return zs_fail(ZS_ERR_INVALID, "zs_allreduce_sum: no context");
    all = calloc((size_t)ctx->world * (size_t)(n ? n : 1), sizeof(double));
    if (!all)
        return zs_fail(ZS_ERR_NOMEM, "zs_allreduce_sum: out of memory");
    zs_label(ctx, ZS_PURPOSE_PROGRAM, -1);
    st = zs_comm_allgather_bytes(ctx->comm, values, all, (int32_t)((size_t)n * sizeof(double)));
    for (int32_t i = 0; !st && i < n; i++) {
        double s = all[i];
        for (int32_t r = 1; r < ctx->world; r++)
            s += all[(size_t)r * (size_t)n + (size_t)i];
        values[i] = s;
    }
    free(all);
    return st;
}
