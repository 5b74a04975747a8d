/* exact_sum.c - zeroshard.deterministic's boundary (exact.c explains the grid): each unit's vote on the tops,
 * fold, integer reduce-scatter and rounding, moved along by the engine's progress calls, and the norm. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <mpi.h>

#include "base/clock.h" /* defines: zs_now_s */
#include "base/error.h"
#include "kernels/convert.h" /* defines: zs_cvt_to_f32, zs_cvt_from_f32 */
#include "core/ctx.h"
#include "core/memory.h"
#include "core/ranks.h"
#include "bucket.h"      /* defines: struct zs_bucket */
#include "exact_grid.h"  /* defines: XK, XW, XBIAS, XBANDS, XBAD, i64_alias, zs_exact_window_shards */
#include "exact_local.h" /* defines: zs_exact_fold, zs_exact_path, zs_xsq_*, XFAST_TARGET */
#include "exact_state.h" /* defines: struct zs_exact */
#include "sharding.h"

/* The norm's squares, exactly (sharding/exact_local.c): 32-bit bands, bit 0 of band 0 is 2^-350. */
#define SQ_BANDS ZS_EXACT_SQ_BANDS /* bands 0-17 hold a square's top bit, two more its lower pieces */
_Static_assert(SQ_BANDS == ZS_XSQ_BANDS, "the norm's bands: one count in both files");

static double sumsq_value(const uint64_t *c)
{
    double t = 0.0;

    for (int32_t b = SQ_BANDS - 1; b >= 0; b--) /* a function of the summed counters alone */
        t += ldexp((double)c[b], 32 * b - ZS_XSQ_BIAS);
    return t;
}

/* k folded sums v (their agreed tops t < XBANDS) to fp32: the integer to double, times the grid's unit
 * scale[t + 1] (a power of two, so exact; scale[0] = 0 for an element with no nonzero value anywhere, whose
 * sum is 0), divided by the micro-shard count, rounded to fp32. */
static inline __attribute__((always_inline)) void round_body(const i64_alias *restrict v, const int8_t *restrict agreed,
                                                             const double *restrict scale, double count,
                                                             float *restrict f, int64_t k)
{
    for (int64_t i = 0; i < k; i++)
        f[i] = (float)((double)v[i] * scale[agreed[i] + 1] / count);
}

static void round_f32(const i64_alias *restrict v, const int8_t *restrict agreed, const double *restrict scale,
                      double count, float *restrict f, int64_t k)
{
    round_body(v, agreed, scale, count, f, k);
}

#ifdef XFAST
XFAST_TARGET
static void round_f32_avx512(const i64_alias *restrict v, const int8_t *restrict agreed, const double *restrict scale,
                             double count, float *restrict f, int64_t k)
{
    round_body(v, agreed, scale, count, f, k);
}
#endif

/* Rounds the n exact sums at acc (folded; their tops in agreed) to dt at out, adding the squares of the
 * values the optimizer will read to the norm's counters sq. */
static void round_range(const i64_alias *acc, const int8_t *agreed, int64_t n, bool bad, double count, zs_dtype dt,
                        void *out, uint64_t *sq)
{
    size_t esz = zs_dtype_bytes(dt);
    double scale[XBANDS + 1] = {0.0};
    struct zs_xsq hist; /* the fast loops' squares (about 30 KB; the reference adds to sq directly) */
    float f[256];
    uint16_t h[256];
    int path = zs_exact_path();

    if (path != 0)
        zs_xsq_start(&hist, path);
    for (int32_t t = 0; t < XBANDS; t++) /* powers of two: the products are exact */
        scale[t + 1] = ldexp(1.0, XW * (t - (XK - 1)) - XBIAS);
    for (int64_t i0 = 0; i0 < n; i0 += 256) {
        int64_t k = n - i0 < 256 ? n - i0 : 256;
        if (bad) /* the agreed tops are XBAD */
            for (int64_t i = 0; i < k; i++)
                f[i] = INFINITY;
#ifdef XFAST
        else if (path == 2)
            round_f32_avx512(acc + i0, agreed + i0, scale, count, f, k);
#endif
        else
            round_f32(acc + i0, agreed + i0, scale, count, f, k);
        if (dt != ZS_DTYPE_FP32) { /* what the optimizer reads: rounded once more, to 16 bits */
            zs_cvt_from_f32(h, (int)dt, f, k);
            zs_cvt_to_f32(f, h, (int)dt, k);
            memcpy(zs_at(out, i0, esz), h, (size_t)k * esz);
        } else {
            memcpy(zs_at(out, i0, esz), f, (size_t)k * esz);
        }
        for (int64_t i = 0; i < k && !bad && path == 0; i++)
            zs_xsq_add_ref(sq, f[i]);
        if (!bad && path != 0)
            zs_xsq_add(&hist, f, k, sq);
    }
    if (path != 0) /* integer sums: the grouping changes nothing */
        zs_xsq_end(&hist, sq);
}

/* ---------------------------------------------------------------- the sum's collectives
 * At the window's last zs_grad_ready each unit starts its own sum, while backward goes on: the tops' vote
 * (an int8 maximum), then the fold and the sums' reduce-scatter (landing in this rank's chunk of the folded sums),
 * then the rounding of this rank's part where the optimizer reads it, and at stage 0 its all-gather. Each
 * kind of collective has its own communicator (the reduce-scatters a ZeroShard comm, ctx->exact->sum, whose
 * shared-memory path sums the local peers' int64 in place) and is started in the units' zs_grad_ready order
 * on every rank: a unit starts its reduce-scatter (or all-gather) only after the unit before it has started
 * its own, however the ranks' progress calls fall. The engine's progress calls move the units along. */
enum { XPH_IDLE, XPH_VOTE, XPH_SUM, XPH_XSUM, XPH_GATHER, XPH_DONE };

static const char *const xphase_what[] = {"", "the top bands' vote", "the sums' reduce-scatter",
                                          "the sums' all-reduce across shard groups",
                                          "the rounded gradients' all-gather", ""};

static int32_t next_phase(const struct zs_ctx *ctx, int32_t ph)
{
    if (ph == XPH_SUM && ctx->nreplicas > 1) /* hybrid: the group's sums, then across the groups */
        return XPH_XSUM;
    return (ph == XPH_SUM || ph == XPH_XSUM) && ctx->cfg.zero.stage != 0 ? XPH_DONE : ph == XPH_SUM ? XPH_GATHER : ph + 1;
}

/* Unit un's reduce-scatter ended with an error on every rank, its data untouched: the first such error of the
 * window is kept for zs_step, which refuses the step on every rank (the units' other sums go on, so that
 * every rank's collectives stay matched). */
static void sum_failed(struct zs_ctx *ctx, struct zs_unit *un)
{
    struct zs_exact_unit *xu = zs_exact_unit_of(ctx, un);

    if (!ctx->exact->err[0])
        snprintf(ctx->exact->err, sizeof(ctx->exact->err), "%s", zs_last_error());
    xu->failed = true;
    xu->sumq = NULL;
}

/* This rank's part of unit un's exact sums (in acc, their tops in agreed, from element b), rounded to where the
 * optimizer reads them; at stage 0 the all-gather of the rounded gradients starts. */
static int round_unit(struct zs_ctx *ctx, struct zs_unit *un, const int32_t *acc, const int8_t *agreed, int64_t b)
{
    struct zs_exact_unit *xu = zs_exact_unit_of(ctx, un);
    bool bad = agreed[0] == XBAD; /* some rank saw a non-finite value: the unit's result is not finite */
    void *g = ctx->cfg.zero.stage >= 2 ? un->grad_shard : zs_at(un->grad, b, ctx->psz);

    ctx->exact->anybad |= bad;
    round_range((const i64_alias *)(const void *)acc + b, agreed + b, un->part.shard, bad,
                (double)zs_exact_window_shards(ctx), ctx->gdt, g, ctx->exact->sq);
    if (ctx->cfg.zero.stage == 0) /* whose optimizer reads every element */
        return MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, un->grad, (int)(un->part.shard * (int64_t)ctx->psz),
                              MPI_BYTE, ctx->exact->comm[1], &xu->req);
    return MPI_SUCCESS;
}

/* Unit u's collective has completed: the local work that follows it, and the next collective. */
static zs_status unit_next(struct zs_ctx *ctx, int32_t u)
{
    struct zs_unit *un = &ctx->units[u];
    struct zs_exact_unit *xu = zs_exact_unit_of(ctx, un);
    int64_t n = un->part.padded, b = zs_partition_begin(&un->part, ctx->shard_rank);
    int32_t *acc = ctx->exact->acc + xu->off * XK;
    int8_t *agreed = ctx->exact->vote + xu->off;
    int rc = MPI_SUCCESS;

    if (xu->phase == XPH_VOTE) {
        zs_exact_fold(acc, ctx->exact->top + xu->off, agreed, n, zs_exact_path()); /* in place, to one int64 each */
        /* labelled with the window's last micro-step, the same on every rank, though the sum may start in a
         * later engine call on some ranks than on others */
        zs_comm_set_step(ctx->exact->sum, un->ready_micro);
        zs_comm_label_next(ctx->exact->sum, ZS_PURPOSE_GRAD, u);
        zs_status st = zs_comm_reduce_scatter_i64(ctx->exact->sum, (const int64_t *)(void *)acc,
                                                  (int64_t *)(void *)acc + b, un->part.shard, &xu->sumq);
        if (st && zs_comm_broken(ctx->exact->sum))
            return st;
        if (st) /* ended on every rank before any data moved (it differed between ranks): zs_step says so */
            sum_failed(ctx, un);
    } else if (xu->phase == XPH_SUM && xu->failed) {
        xu->phase = XPH_DONE; /* nothing to round or gather: the step is refused */
        return ZS_OK;
    } else if (xu->phase == XPH_SUM && ctx->nreplicas > 1) {
        /* Hybrid sharding: the group's integer sums added across the groups holding the same shard. Integers add
         * exactly in any order, so the result is the flat run's sum, bit for bit. Started in unit order like the
         * reduce-scatters (progress_pass), since MPI matches the replicas' collectives by order alone. */
        rc = MPI_Iallreduce(MPI_IN_PLACE, (i64_alias *)(void *)acc + b, (int)un->part.shard, MPI_INT64_T, MPI_SUM,
                            ctx->rmpi, &xu->req);
    } else if (xu->phase == XPH_SUM || xu->phase == XPH_XSUM) {
        rc = round_unit(ctx, un, acc, agreed, b);
    }
    if (rc)
        return zs_fail(ZS_ERR_COMM, "deterministic gradient sum of unit '%s': %s: MPI error %d", un->name,
                       xphase_what[next_phase(ctx, xu->phase)], rc);
    xu->phase = next_phase(ctx, xu->phase);
    return ZS_OK;
}

/* Whether unit un's collective has completed (the reduce-scatter's request is then freed). */
static zs_status phase_test(struct zs_ctx *ctx, struct zs_unit *un, bool *done)
{
    struct zs_exact_unit *xu = zs_exact_unit_of(ctx, un);
    int flag = 0, rc;

    if (xu->phase == XPH_SUM) {
        if (xu->failed) {
            *done = true;
            return ZS_OK;
        }
        zs_status st = zs_comm_test(ctx->exact->sum, xu->sumq, done);
        if (*done) {
            zs_status w = zs_comm_wait(ctx->exact->sum, xu->sumq); /* over: returns at once and frees it */
            if (w && !zs_comm_broken(ctx->exact->sum)) {
                sum_failed(ctx, un);
                return ZS_OK;
            }
            xu->sumq = NULL;
            return w;
        }
        return st;
    }
    rc = MPI_Test(&xu->req, &flag, MPI_STATUS_IGNORE);
    if (rc)
        return zs_fail(ZS_ERR_COMM, "deterministic gradient sum of unit '%s': %s: MPI error %d", un->name,
                       xphase_what[xu->phase], rc);
    *done = flag;
    return ZS_OK;
}

/* Moves every unit as far as its collectives and its predecessor allow; *moved: some unit did. */
static zs_status progress_pass(struct zs_ctx *ctx, bool *moved)
{
    int32_t cap = XPH_DONE; /* the phase of the unit before: no unit starts a collective ahead of it */
    zs_status st = zs_comm_progress(ctx->exact->sum); /* every reduce-scatter in flight, oldest first */

    if (st)
        return st;
    for (int32_t q = 0; q < ctx->bucket->npending; q++) {
        struct zs_unit *un = &ctx->units[ctx->bucket->pending[q]];
        struct zs_exact_unit *xu = zs_exact_unit_of(ctx, un);
        while (xu->phase != XPH_DONE) {
            int32_t next = next_phase(ctx, xu->phase);
            bool done = false;
            if (next != XPH_DONE && next > cap)
                break;
            st = phase_test(ctx, un, &done);
            if (st)
                return st;
            if (!done)
                break;
            st = unit_next(ctx, ctx->bucket->pending[q]);
            if (st)
                return st;
            *moved = true;
        }
        cap = xu->phase;
    }
    while (ctx->bucket->npending > 0 && ctx->exact->units[ctx->bucket->pending[0]].phase == XPH_DONE) {
        ctx->exact->units[ctx->bucket->pending[0]].phase = XPH_IDLE;
        ctx->units[ctx->bucket->pending[0]].grad_state = ZS_GRAD_IDLE;
        memmove(ctx->bucket->pending, ctx->bucket->pending + 1, (size_t)(--ctx->bucket->npending) * sizeof(int32_t));
    }
    return ZS_OK;
}

zs_status zs_exact_progress(struct zs_ctx *ctx, bool all)
{
    double start = 0.0;

    for (uint32_t idle = 0;;) {
        bool moved = false;
        zs_status st = progress_pass(ctx, &moved);
        if (st || !all || ctx->bucket->npending == 0)
            return st;
        if (moved) {
            idle = 0;
            continue;
        }
        /* Nothing moved: some rank is behind. Every unit is tried again after a short sleep rather than a
         * spin on one request, which leaves the core to that rank when ranks outnumber cores. */
        if (idle++ == 0) {
            start = zs_now_s();
        } else if (idle % 64 == 0 && zs_now_s() - start >= zs_wait_limit_s(ctx)) {
            struct zs_unit *un = &ctx->units[ctx->bucket->pending[0]];
            const struct zs_exact_unit *xu = zs_exact_unit_of(ctx, un);

            return zs_fail(ZS_ERR_COMM, "comm: rank %d: timeout: deterministic gradient sum of unit '%s': %s did not "
                           "complete in %.1f s (zeroshard.timeout_s / ZS_TIMEOUT = %g); some rank has not reached "
                           "it (an MPI collective does not say which)", ctx->rank, un->name, xphase_what[xu->phase],
                           zs_now_s() - start, zs_wait_limit_s(ctx));
        }
        nanosleep(&(struct timespec){.tv_nsec = 20000}, NULL);
    }
}

zs_status zs_exact_launch(struct zs_ctx *ctx, int32_t u)
{
    struct zs_unit *un = &ctx->units[u];
    struct zs_exact_unit *xu = zs_exact_unit_of(ctx, un);
    int64_t n = un->part.padded;

    if (n > INT32_MAX || un->part.shard * (int64_t)ctx->psz > INT32_MAX)
        return zs_fail(ZS_ERR_UNSUPPORTED, "zs_grad_ready: deterministic mode: unit '%s' has %lld elements, more than "
                       "MPI can count in one piece", un->name, (long long)n);
    if (xu->bad)
        memset(ctx->exact->top + xu->off, XBAD, (size_t)n);
    int rc = MPI_Iallreduce(ctx->exact->top + xu->off, ctx->exact->vote + xu->off, (int)n, MPI_INT8_T, MPI_MAX, ctx->exact->comm[0],
                            &xu->req);
    if (rc)
        return zs_fail(ZS_ERR_COMM, "deterministic gradient sum of unit '%s': %s: MPI error %d", un->name,
                       xphase_what[XPH_VOTE], rc);
    xu->phase = XPH_VOTE;
    un->grad_state = ZS_GRAD_REDUCING;
    ctx->exact->order = (ctx->exact->order ^ (uint64_t)(u + 1)) * 0x100000001b3ull; /* FNV-1a over the unit indices */
    ctx->bucket->pending[ctx->bucket->npending++] = u;
    return zs_exact_progress(ctx, !ctx->cfg.zero.overlap_comm);
}

/* Collective, at the step, after every unit's sum: the norm's counters summed over the ranks. *sumsq: the
 * exact sum of the squares of the whole result, rounded once; INFINITY if not finite. */
zs_status zs_exact_reduce(struct zs_ctx *ctx, double *sumsq)
{
    MPI_Request r;
    zs_status st;
    uint64_t buf[SQ_BANDS + 1];
    int rc;

    /* The units' collectives were matched by start order alone: ranks that marked units ready in different
     * orders may have summed one unit's counters with another's of the same size. The order's hash rides with
     * the norm's bands; a sum of hashes that is not world times this rank's own fails the step on every rank
     * (but with odds of 2^-64), before the optimizer reads anything. */
    memcpy(buf, ctx->exact->sq, sizeof(ctx->exact->sq));
    if (ctx->replica != 0) /* hybrid: each shard's squares once, from the first shard group */
        memset(buf, 0, sizeof(ctx->exact->sq));
    buf[SQ_BANDS] = ctx->exact->order;
    rc = MPI_Iallreduce(MPI_IN_PLACE, buf, SQ_BANDS + 1, MPI_UINT64_T, MPI_SUM, ctx->exact->comm[0], &r);
    if (rc)
        return zs_fail(ZS_ERR_COMM, "zs_step: deterministic sum: the norm's bands: MPI error %d", rc);
    st = zs_vote_wait(ctx, &r, "zs_step: deterministic sum: the norm's bands");
    if (st)
        return st; /* a wait that ran out names itself */
    if (ctx->exact->err[0])
        return zs_fail(ZS_ERR_COMM, "zs_step: deterministic sum refused on every rank: %s", ctx->exact->err);
    if (buf[SQ_BANDS] != (uint64_t)ctx->world * ctx->exact->order)
        return zs_fail(ZS_ERR_COMM, "zs_step: deterministic mode: rank %d marked the units ready (zs_grad_ready) in "
                       "another order than some other rank; the units' sums are matched by that order, so this "
                       "window's gradients are not trusted and the step is refused", ctx->rank);
    memcpy(ctx->exact->sq, buf, sizeof(ctx->exact->sq));
    *sumsq = ctx->exact->anybad ? INFINITY : sumsq_value(ctx->exact->sq);
    return ZS_OK;
}

