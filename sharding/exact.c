/* exact.c - zeroshard.deterministic "world_size_invariant": gradients summed exactly, so that the sum
 * over micro-shards, micro-batches and ranks has the same bits whatever the order and grouping, hence
 * whatever the number of ranks.
 *
 * Each gradient value is an fp32 x = M * 2^(s - 149) with M below 2^24 and s >= 0 (16-bit gradients are
 * widened first, exactly). Think of |x| * 2^149 as an integer of up to 277 bits cut into bands of 32
 * bits; band b holds bits [32b, 32b + 32). A unit keeps, per element, XK int64 counters for the top XK
 * bands below the unit's top band T (the band of its largest value so far): counter k adds the band
 * T - k pieces of every value, with their sign. A piece is below 2^32, so a counter absorbs 2^31 values
 * before it could overflow. Pieces below band T - XK + 1 are dropped, and which are dropped depends only
 * on T, the band of the largest magnitude of the whole window - a maximum, independent of order. A rank
 * whose T rises shifts its counters (the lowest drop out, exactly the pieces a rank that knew the final
 * T from the start would have dropped). At the boundary the ranks agree on each unit's T, align their
 * counters to it, and sum them with an integer all-reduce: integer addition is associative, so any MPI
 * algorithm gives the same bits. Every rank then rounds the whole exact sum once (one division by the
 * global micro-shard count) and computes the norm over all of it in element order, so the norm is
 * world-size independent too; each rank keeps its shard of the result for the optimizer.
 *
 * The precision kept: 3 bands below the largest value's band, at least 64 bits below its leading bit,
 * so a dropped remainder is below n * 2^-64 of the largest value (n summands). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <mpi.h>

#include "engine.h"
#include "error.h"
#include "convert.h" /* defines: zs_cvt_to_f32, zs_cvt_from_f32 */

#define XK 3        /* counters per element */
#define XW 32       /* bits per band */
#define XBIAS 149   /* 2^-149, fp32's least subnormal, is bit 0 */

/* Band of the highest bit a value with these magnitude bits (sign cleared) can have. */
static int32_t top_band(uint32_t bits)
{
    uint32_t e = bits >> 23;
    uint32_t s = e ? e - 1 : 0;

    return (int32_t)((s + 23) / XW);
}

/* Drops counters below the new top: counter k becomes counter k - by. */
static void shift_down(int64_t *acc, int64_t n, int32_t by)
{
    if (by <= 0)
        return;
    for (int64_t i = 0; i < n; i++) {
        int64_t *a = acc + i * XK;
        for (int32_t k = XK - 1; k >= 0; k--)
            a[k] = k >= by ? a[k - by] : 0;
    }
}

/* acc += the band pieces of the n fp32 values x, for top band T; first: acc = them (no clearing pass). */
static void deposit_f32(int64_t *acc, const float *x, int64_t n, int32_t T, bool first)
{
    if (first)
        memset(acc, 0, (size_t)n * XK * sizeof(int64_t)); /* a chunk, while it is in cache */
    for (int64_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], sizeof(u));
        uint32_t bits = u & 0x7fffffffu, e = bits >> 23;
        if (!bits)
            continue;
        uint64_t m = (bits & 0x7fffffu) | (e ? 0x800000u : 0u);
        uint32_t s = e ? e - 1 : 0;
        uint64_t v = m << (s % XW);
        int64_t lo = (int64_t)(v & 0xffffffffu), hi = (int64_t)(v >> XW);
        int32_t k = T - (int32_t)(s / XW); /* counter of the low piece; the high one is k - 1 */
        int64_t *a = acc + i * XK;
        if (u >> 31) {
            lo = -lo;
            hi = -hi;
        }
        if (k >= 0 && k < XK)
            a[k] += lo;
        if (k >= 1 && k - 1 < XK)
            a[k - 1] += hi;
    }
}

/* Widens a chunk of the program's buffer to fp32 (exact for bf16 and fp16). */
static const float *chunk_f32(const struct zs_ctx *ctx, void *buf, int64_t i0, int64_t k, float *tmp)
{
    if (ctx->pdt == ZS_DTYPE_FP32)
        return (const float *)zs_at(buf, i0, 4);
    zs_cvt_to_f32(tmp, zs_at(buf, i0, 2), (int)ctx->pdt, k);
    return tmp;
}

zs_status zs_exact_deposit(struct zs_ctx *ctx, int32_t u)
{
    struct zs_unit *un = &ctx->units[u];
    int64_t n = un->part.padded;
    int64_t *acc = ctx->xacc + un->xoff * XK;
    uint32_t mx = 0;
    float tmp[256];

    if (un->grad_state != ZS_GRAD_OPEN)
        return zs_fail(ZS_ERR_INVALID, "zs_grad_deposit: unit '%s': call zs_grad_buffer first in this micro-batch",
                       un->name);
    for (int64_t i0 = 0; i0 < n; i0 += 256) {
        int64_t k = n - i0 < 256 ? n - i0 : 256;
        const float *x = chunk_f32(ctx, un->grad, i0, k, tmp);
        for (int64_t i = 0; i < k; i++) {
            uint32_t b;
            memcpy(&b, &x[i], sizeof(b));
            b &= 0x7fffffffu;
            mx = b > mx ? b : mx;
        }
    }
    bool first = un->xdeposits++ == 0; /* the counters were not cleared after the last window */
    if (first && (mx >= 0x7f800000u || !mx))
        memset(acc, 0, (size_t)n * XK * sizeof(int64_t));
    if (mx >= 0x7f800000u) { /* Inf or NaN: the window's result for this unit is not finite */
        un->xbad = true;
    } else if (mx) {
        int32_t t = top_band(mx);
        if (un->xtop < 0)
            un->xtop = t;
        if (t > un->xtop) {
            shift_down(acc, n, t - un->xtop);
            un->xtop = t;
        }
        for (int64_t i0 = 0; i0 < n; i0 += 256) {
            int64_t k = n - i0 < 256 ? n - i0 : 256;
            deposit_f32(acc + i0 * XK, chunk_f32(ctx, un->grad, i0, k, tmp), k, un->xtop, first);
        }
    }
    memset(un->grad, 0, (size_t)n * ctx->psz);
    return ZS_OK;
}

/* At zs_grad_ready: every micro-shard must have been deposited, and nothing added since the last one. */
zs_status zs_exact_ready(struct zs_ctx *ctx, int32_t u)
{
    struct zs_unit *un = &ctx->units[u];
    int64_t per = ctx->cfg.micro_batch_size / ctx->cfg.cpu.micro_shard_size;
    int64_t want = per * (ctx->micro_step % ctx->cfg.grad_accum_steps + 1);
    const unsigned char *g = un->grad;
    size_t nb = (size_t)un->part.padded * ctx->psz, i = 0;
    uint64_t any = 0, w;

    for (; i + 8 <= nb; i += 8) { /* no early exit: a branch-free pass the compiler vectorizes */
        memcpy(&w, g + i, sizeof(w));
        any |= w;
    }
    for (; i < nb; i++)
        any |= g[i];
    if (any)
        return zs_fail(ZS_ERR_INVALID, "zs_grad_ready: unit '%s': gradient added after the last zs_grad_deposit "
                       "(zeroshard.deterministic: deposit every micro-shard)", un->name);
    if (un->xdeposits != want)
        return zs_fail(ZS_ERR_INVALID, "zs_grad_ready: unit '%s': %lld micro-shard gradients deposited in this window, "
                       "expected %lld (train_micro_batch_size_per_gpu %lld / zeroshard.micro_shard_size %lld per "
                       "micro-batch)", un->name, (long long)un->xdeposits, (long long)want,
                       (long long)ctx->cfg.micro_batch_size, (long long)ctx->cfg.cpu.micro_shard_size);
    return ZS_OK;
}

/* The norm's squares, exactly: a square of an fp32 value is a double with at most 48 significant bits,
 * between 2^-298 and 2^256. Cut at fixed bit positions (bit 0 = 2^-350) into 32-bit bands, each band's
 * pieces summed in a uint64 (all positive; 2^32 squares per rank before one could wrap), the sum over all
 * elements and ranks is exact whatever the shard ranges. */
#define SQ_BANDS 22 /* bands 0-17 hold a square's top bit, two more its lower pieces */
#define SQ_BIAS 350

static void sumsq_add(uint64_t *c, float f)
{
    double q = (double)f * (double)f;
    uint64_t u, m;
    uint32_t e;

    if (q == 0.0)
        return;
    memcpy(&u, &q, sizeof(u));
    e = (uint32_t)(u >> 52);
    m = ((u & 0xfffffffffffffULL) | 0x10000000000000ULL) >> 5; /* the 5 low bits are zero: 48 significant */
    int32_t s = (int32_t)e - 1075 + SQ_BIAS + 5;                /* bit position of m's lowest bit, >= 0 */
    unsigned __int128 v = (unsigned __int128)m << (s % 32);
    int32_t b = s / 32;
    c[b] += (uint64_t)(v & 0xffffffffu);
    c[b + 1] += (uint64_t)((v >> 32) & 0xffffffffu);
    c[b + 2] += (uint64_t)(v >> 64);
}

static double sumsq_value(const uint64_t *c)
{
    double t = 0.0;

    for (int32_t b = SQ_BANDS - 1; b >= 0; b--) /* a function of the summed counters alone */
        t += ldexp((double)c[b], 32 * b - SQ_BIAS);
    return t;
}

/* Rounds the n exact sums at acc (top band T) to dt at out, adding the squares of the values the
 * optimizer will read to the norm's counters. */
static void round_range(const int64_t *acc, int64_t n, int32_t T, bool bad, double count, zs_dtype dt, void *out,
                        uint64_t *sq)
{
    size_t esz = zs_dtype_bytes(dt);
    double scale = T < 0 ? 0.0 : ldexp(1.0, XW * (T - (XK - 1)) - XBIAS); /* a power of two: exact */
    float f[256];
    uint16_t h[256];

    for (int64_t i0 = 0; i0 < n; i0 += 256) {
        int64_t k = n - i0 < 256 ? n - i0 : 256;
        for (int64_t i = 0; i < k; i++) {
            const int64_t *a = acc + (i0 + i) * XK;
            /* multiplied, not shifted: a left shift of a negative value is undefined in C */
            __int128 v = (__int128)a[0] * ((__int128)1 << (2 * XW)) + (__int128)a[1] * ((__int128)1 << XW) +
                         (__int128)a[2];
            f[i] = bad ? INFINITY : (float)((double)v * scale / count);
        }
        if (dt != ZS_DTYPE_FP32) { /* what the optimizer reads: rounded once more, to 16 bits */
            zs_cvt_from_f32(h, (int)dt, f, k);
            zs_cvt_to_f32(f, h, (int)dt, k);
            memcpy(zs_at(out, i0, esz), h, (size_t)k * esz);
        } else {
            memcpy(zs_at(out, i0, esz), f, (size_t)k * esz);
        }
        for (int64_t i = 0; i < k && !bad; i++)
            sumsq_add(sq, f[i]);
    }
}

/* Collective, at the boundary: agrees on each unit's top band and on any non-finite value, aligns the
 * counters, reduce-scatters them (integer sums: any MPI algorithm gives the same bits), and rounds this
 * rank's part where the optimizer reads it (all-gathered at stage 0, whose optimizer reads everything).
 * *sumsq: the exact sum of the squares of the whole result, rounded once; INFINITY if not finite. */
zs_status zs_exact_reduce(struct zs_ctx *ctx, double *sumsq)
{
    int32_t n = ctx->nunits, *agreed = malloc((size_t)n * 2 * sizeof(int32_t));
    MPI_Comm mc = zs_comm_mpi(ctx->comm);
    /* the window's micro-shards (train_batch_size / micro_shard_size): DeepSpeed's 1/(N * accumulation) */
    double count = (double)(ctx->world * ctx->cfg.grad_accum_steps *
                            (ctx->cfg.micro_batch_size / ctx->cfg.cpu.micro_shard_size));
    uint64_t sq[SQ_BANDS] = {0};
    bool any_bad = false;
    MPI_Request r;
    zs_status st = ZS_OK;
    int rc;

    if (!agreed)
        return zs_fail(ZS_ERR_NOMEM, "zs_step: out of memory");
    for (int32_t u = 0; u < n; u++) {
        agreed[u] = ctx->units[u].xtop;
        agreed[n + u] = ctx->units[u].xbad;
    }
    rc = MPI_Iallreduce(MPI_IN_PLACE, agreed, 2 * n, MPI_INT32_T, MPI_MAX, mc, &r);
    if (!rc)
        st = zs_vote_wait(ctx, &r, "zs_step: deterministic sum: the top bands' vote");
    for (int32_t u = 0; !rc && !st && u < n; u++) {
        struct zs_unit *un = &ctx->units[u];
        int64_t *acc = ctx->xacc + un->xoff * XK, b = zs_partition_begin(&un->part, ctx->rank);
        void *g = ctx->cfg.zero.stage >= 2 ? un->grad_shard : zs_at(un->grad, b, ctx->psz);
        if (un->xtop >= 0)
            shift_down(acc, un->part.padded, agreed[u] - un->xtop);
        un->xtop = agreed[u];
        any_bad |= agreed[n + u] != 0;
        if (un->part.shard * XK > INT32_MAX) {
            free(agreed);
            return zs_fail(ZS_ERR_UNSUPPORTED, "zs_step: deterministic mode: unit '%s' has %lld elements per shard, "
                           "more than MPI can count in one piece", un->name, (long long)un->part.shard);
        }
        /* this rank's sums land at the start of its counters */
        rc = MPI_Ireduce_scatter_block(MPI_IN_PLACE, acc, (int)(un->part.shard * XK), MPI_INT64_T, MPI_SUM, mc, &r);
        if (!rc)
            st = zs_vote_wait(ctx, &r, "zs_step: deterministic sum: the counters' reduce-scatter");
        if (!rc && !st)
            round_range(acc, un->part.shard, agreed[u], agreed[n + u] != 0, count, ctx->gdt, g, sq);
        if (!rc && !st && ctx->cfg.zero.stage == 0) {
            rc = MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, un->grad,
                                (int)(un->part.shard * (int64_t)ctx->psz), MPI_BYTE, mc, &r);
            if (!rc)
                st = zs_vote_wait(ctx, &r, "zs_step: deterministic sum: the rounded gradients' all-gather");
        }
    }
    if (!rc && !st) {
        rc = MPI_Iallreduce(MPI_IN_PLACE, sq, SQ_BANDS, MPI_UINT64_T, MPI_SUM, mc, &r);
        if (!rc)
            st = zs_vote_wait(ctx, &r, "zs_step: deterministic sum: the norm's bands");
    }
    free(agreed);
    if (st)
        return st; /* a wait that ran out names itself */
    if (rc)
        return zs_fail(ZS_ERR_COMM, "zs_step: deterministic gradient sum: MPI error %d", rc);
    *sumsq = any_bad ? INFINITY : sumsq_value(sq);
    return ZS_OK;
}

/* A new window: the counters restart; each unit's first deposit overwrites them (the program's buffers
 * were zeroed by each deposit). */
void zs_exact_zero(struct zs_ctx *ctx)
{
    for (int32_t u = 0; u < ctx->nunits; u++) {
        ctx->units[u].xtop = -1;
        ctx->units[u].xbad = false;
        ctx->units[u].xdeposits = 0;
    }
}

zs_status zs_exact_setup(struct zs_ctx *ctx)
{
    int64_t off = 0;

    for (int32_t u = 0; u < ctx->nunits; u++) {
        struct zs_unit *un = &ctx->units[u];
        un->xoff = off;
        off += un->part.padded;
        if (ctx->cfg.zero.stage >= 2) { /* the program's buffer: persistent and whole, no bucket */
            un->grad = zs_mem_alloc(ctx, ZS_MEM_GRADS, (uint64_t)un->part.padded * ctx->psz);
            if (!un->grad)
                return ctx->over_budget ? ZS_ERR_NOMEM
                                        : zs_fail(ZS_ERR_NOMEM, "zs_setup: out of memory for unit '%s''s gradients",
                                                  un->name);
        }
    }
    ctx->xnumel = off;
    ctx->xacc = zs_mem_alloc(ctx, ZS_MEM_GRADS, (uint64_t)off * XK * sizeof(int64_t));
    if (!ctx->xacc)
        return ctx->over_budget ? ZS_ERR_NOMEM
                                : zs_fail(ZS_ERR_NOMEM, "zs_setup: out of memory for %lld exact gradient counters",
                                          (long long)off * XK);
    zs_exact_zero(ctx);
    return ZS_OK;
}

void zs_exact_free(struct zs_ctx *ctx)
{
    if (!ctx->xacc)
        return;
    if (ctx->cfg.zero.stage >= 2)
        for (int32_t u = 0; u < ctx->nunits; u++)
            zs_mem_free(ctx, ZS_MEM_GRADS, ctx->units[u].grad, (uint64_t)ctx->units[u].part.padded * ctx->psz);
    zs_mem_free(ctx, ZS_MEM_GRADS, ctx->xacc, (uint64_t)ctx->xnumel * XK * sizeof(int64_t));
    ctx->xacc = NULL;
}

/* ---------------------------------------------------------------- public API */

zs_status zs_grad_deposit(zs_ctx *ctx, int32_t unit)
{
    if (!ctx || !ctx->set_up)
        return zs_fail(ZS_ERR_INVALID, "zs_grad_deposit: call zs_setup first");
    if (unit < 0 || unit >= ctx->nunits)
        return zs_fail(ZS_ERR_INVALID, "zs_grad_deposit: no unit %d", unit);
    if (!ctx->cfg.cpu.deterministic) /* the buffer keeps summing, as it always has */
        return ZS_OK;
    return zs_exact_deposit(ctx, unit);
}

int64_t zs_micro_shard_size(const zs_ctx *ctx)
{
    return ctx && ctx->cfg.cpu.deterministic ? ctx->cfg.cpu.micro_shard_size : 0;
}
