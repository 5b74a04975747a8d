/* exact.c - zeroshard.deterministic "world_size_invariant": gradients summed exactly on a fixed grid, so
 * that the sum over micro-shards, micro-batches and ranks has the same bits whatever the order and
 * grouping, hence whatever the number of ranks.
 *
 * Each gradient value is an fp32 x = M * 2^(s - 149) with M below 2^24 and s >= 0 (16-bit gradients are
 * widened first, exactly). Think of |x| * 2^149 as an integer of up to 277 bits cut into bands of 16
 * bits; band b holds bits [16b, 16b + 16). Every element has its own top band T: the band of the highest
 * bit of its largest magnitude in the window, over all micro-shards and all ranks (a maximum, so
 * independent of order). The element's sum keeps the bits of every summand at or above 2^(16(T-2) - 149),
 * the bottom of band T - 2, and drops the rest of each summand (truncation of |x| toward zero). What is
 * dropped depends only on x and T, so the kept sum is one exact integer, whatever the order.
 *
 * Locally each element has 3 int32 counters, for bands T-0, T-1, T-2 of its own top so far: a summand's
 * kept part (below 2^48 in units of the grid) adds its three 16-bit pieces, with its sign. When a rank's
 * top rises, the counters move down a band and the lowest drop out: exactly the pieces a rank that knew
 * the final top from the start would have dropped. At the boundary the ranks agree on each element's top
 * (an int8 maximum), align their counters to it and fold them into one int64, V = c0 2^32 + c1 2^16 +
 * c2, whose sum over ranks is computed by an integer reduce-scatter: integer addition is associative, so
 * any algorithm and any number of ranks give the same V. With S micro-shards in the window |V| < S 2^48,
 * so S <= 2^15 keeps every partial sum inside int64 (and every counter inside int32); zs_exact_setup
 * refuses more.
 *
 * What the result guarantees, per element: V 2^(16(T-2) - 149) differs from the true sum of the S values
 * by less than S 2^(16(T-2) - 149) <= S 2^-32 max|x| (the top bit of max|x| lies in band T, so at least 32
 * bits of it are kept); summands whose leading bit lies at most 9 binades below the largest's are kept
 * whole, so a window whose values all do is summed with no error at all. V is then
 * rounded once to double (53 bits), divided by S and rounded to fp32: the normal mode's fp32 sum in rank
 * order has an error bound of about (S - 1) 2^-24 sum|x|, some 2^8 times wider. Every rank rounds the same
 * integer, computes the norm over all of it in element order (world-size independent too), and keeps its
 * shard of the result for the optimizer.
 *
 * Each unit's vote, fold and reduce-scatter start at its zs_grad_ready in the window's last micro-batch and
 * run while backward goes on (see "the sum's collectives" below); the step only waits for the last ones
 * and sums the norm's counters.
 *
 * Cost per element: 12 bytes of counters, 1 byte of top band and 1 of agreed top band on every rank; into
 * the collectives, 1 byte (the tops' all-reduce) and 8 bytes (V's reduce-scatter). The fold and the norm's
 * exact squares have their fast loops and references in exact_local.c. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <mpi.h>

#include "base/clock.h" /* defines: zs_now_s */
#include "base/error.h"
#include "kernels/convert.h" /* defines: zs_cvt_to_f32, zs_cvt_from_f32 */
#include "core/ctx.h"
#include "core/memory.h"
#include "core/ranks.h"
#include "bucket.h"   /* defines: struct zs_bucket */
#include "exact_grid.h"  /* defines: XK, XW, XBANDS, XMAX_SHARDS, zs_exact_window_shards */
#include "exact_local.h" /* defines: zs_exact_path, XFAST_TARGET */
#include "exact_state.h" /* defines: struct zs_exact */
#include "sharding.h"

typedef uint32_t u32_alias __attribute__((may_alias)); /* an fp32 gradient's bits, read in place */

_Static_assert(ZS_SHARD_ALIGN % 2 == 0, "units at even offsets: the 12-byte counters fold into aligned int64");

/* Drops one element's counters below a top band raised by `by`: counter k becomes counter k - by. */
static void shift_down(int32_t *a, int32_t by)
{
    for (int32_t k = XK - 1; k >= 0; k--)
        a[k] = k >= by ? a[k - by] : 0;
}

/* acc += the kept pieces of the n fp32 values x, each element's top band in top[] rising as needed;
 * first: the window's first deposit, which starts the counters and tops. *bad: an Inf or NaN was seen
 * (left out of the counters; the whole window's result is not finite). */
static void deposit_f32(int32_t *acc, int8_t *top, const float *x, int64_t n, bool first, bool *bad)
{
    for (int64_t i = 0; i < n; i++) {
        int32_t *a = acc + i * XK;
        uint32_t u;
        if (first) {
            a[0] = a[1] = a[2] = 0;
            top[i] = -1;
        }
        memcpy(&u, &x[i], sizeof(u));
        uint32_t bits = u & 0x7fffffffu, e = bits >> 23;
        if (!bits)
            continue;
        if (e == 0xff) {
            *bad = true;
            continue;
        }
        uint64_t m = (bits & 0x7fffffu) | (e ? 0x800000u : 0u);
        int32_t s = e ? (int32_t)e - 1 : 0, t = (s + 23) / XW;
        if (t > top[i]) {
            if (top[i] >= 0)
                shift_down(a, t - top[i]);
            top[i] = (int8_t)t;
        }
        /* m's lowest bit relative to the grid's bottom 16 (T - 2): at most 24, so v < 2^48 */
        int32_t sh = s - XW * (top[i] - (XK - 1));
        uint64_t v = sh >= 0 ? m << sh : sh > -24 ? m >> -sh : 0;
        int32_t p0 = (int32_t)(v >> 32), p1 = (int32_t)((v >> 16) & 0xffff), p2 = (int32_t)(v & 0xffff);
        if (u >> 31) {
            p0 = -p0;
            p1 = -p1;
            p2 = -p2;
        }
        a[0] += p0;
        a[1] += p1;
        a[2] += p2;
    }
}

/* The window's first deposit of these elements: no counters or tops yet, so each value sets its element's
 * top band and its three pieces outright. The same result as deposit_f32 with first set (the reference),
 * without branches and in 32-bit lanes: a nonzero finite value's lowest bit lies sh = 9 to 24 bits above
 * the bottom of band t - 2, so its kept part m 2^sh has m >> (32 - sh) above bit 32 and m << sh (mod 2^32)
 * below. Returns nonzero if a value was an Inf or NaN (left out, as a zero is). */
static inline __attribute__((always_inline)) uint32_t first_body(int32_t *restrict acc, int8_t *restrict top,
                                                                 const float *restrict x, int64_t n)
{
    uint32_t nonfinite = 0;

    for (int64_t i = 0; i < n; i++) {
        uint32_t u = ((const u32_alias *)(const void *)x)[i];
        uint32_t bits = u & 0x7fffffffu, e = bits >> 23;
        bool keep = bits != 0 && e != 0xff;
        uint32_t m = keep ? (bits & 0x7fffffu) | (e ? 0x800000u : 0u) : 0u;
        uint32_t s = e ? e - 1 : 0, t = (s + 23) / XW;
        uint32_t sh = s + XW * (XK - 1) - XW * t, lo = m << sh;
        int32_t sg = -(int32_t)(u >> 31); /* 0 or -1: (p ^ sg) - sg is p or -p */
        nonfinite |= e == 0xff ? 1u : 0u;
        acc[i * XK] = ((int32_t)(m >> (32 - sh)) ^ sg) - sg;
        acc[i * XK + 1] = ((int32_t)(lo >> 16) ^ sg) - sg;
        acc[i * XK + 2] = ((int32_t)(lo & 0xffff) ^ sg) - sg;
        top[i] = keep ? (int8_t)t : (int8_t)-1;
    }
    return nonfinite;
}

static uint32_t deposit_first_f32(int32_t *restrict acc, int8_t *restrict top, const float *restrict x, int64_t n)
{
    return first_body(acc, top, x, n);
}

#ifdef XFAST
XFAST_TARGET
static uint32_t deposit_first_avx512(int32_t *restrict acc, int8_t *restrict top, const float *restrict x, int64_t n)
{
    return first_body(acc, top, x, n);
}
#endif

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
    struct zs_exact_unit *xu = zs_exact_unit_of(ctx, un);
    int64_t n = un->part.padded;
    int32_t *acc = ctx->exact->acc + xu->off * XK;
    int8_t *top = ctx->exact->top + xu->off;
    float tmp[256];

    if (un->grad_state != ZS_GRAD_OPEN)
        return zs_fail(ZS_ERR_INVALID, "zs_grad_deposit: unit '%s': call zs_grad_buffer first in this micro-batch",
                       un->name);
    bool first = xu->deposits++ == 0; /* the counters were not cleared after the last window */
    int path = first ? zs_exact_path() : 0;
    for (int64_t i0 = 0; i0 < n; i0 += 256) {
        int64_t k = n - i0 < 256 ? n - i0 : 256;
        const float *x = chunk_f32(ctx, un->grad, i0, k, tmp);
        if (path == 0)
            deposit_f32(acc + i0 * XK, top + i0, x, k, first, &xu->bad);
#ifdef XFAST
        else if (path == 2)
            xu->bad |= deposit_first_avx512(acc + i0 * XK, top + i0, x, k) != 0;
#endif
        else
            xu->bad |= deposit_first_f32(acc + i0 * XK, top + i0, x, k) != 0;
        memset(zs_at(un->grad, i0, ctx->psz), 0, (size_t)k * ctx->psz); /* while the chunk is in cache */
    }
    return ZS_OK;
}
/* At zs_grad_ready: every micro-shard must have been deposited, and nothing added since the last one. */
zs_status zs_exact_ready(struct zs_ctx *ctx, int32_t u)
{
    struct zs_unit *un = &ctx->units[u];
    struct zs_exact_unit *xu = zs_exact_unit_of(ctx, un);
    int64_t per = ctx->cfg.micro_batch_size / ctx->cfg.zs.micro_shard_size;
    int64_t want = per * (ctx->window_micro + 1); /* a window ended early (zs_window_end) holds fewer */
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
    if (xu->deposits != want)
        return zs_fail(ZS_ERR_INVALID, "zs_grad_ready: unit '%s': %lld micro-shard gradients deposited in this window, "
                       "expected %lld (train_micro_batch_size_per_gpu %lld / zeroshard.micro_shard_size %lld per "
                       "micro-batch)", un->name, (long long)xu->deposits, (long long)want,
                       (long long)ctx->cfg.micro_batch_size, (long long)ctx->cfg.zs.micro_shard_size);
    return ZS_OK;
}

/* A new window: each unit's first deposit starts its counters and tops (the program's buffers were
 * zeroed by each deposit). */
void zs_exact_zero(struct zs_ctx *ctx)
{
    for (int32_t u = 0; u < ctx->nunits; u++) {
        ctx->exact->units[u].bad = false;
        ctx->exact->units[u].failed = false;
        ctx->exact->units[u].deposits = 0;
    }
    ctx->exact->err[0] = '\0';
    memset(ctx->exact->sq, 0, sizeof(ctx->exact->sq));
    ctx->exact->anybad = false;
    ctx->exact->order = 0xcbf29ce484222325ull;
}

/* The memory plan (plan.h) counts what zs_exact_setup allocates per element: counters, top, agreed top. */
_Static_assert(XK * sizeof(int32_t) + 2 == ZS_EXACT_ELEM_BYTES, "the plan's deterministic-mode bytes");

/* The sum's own communicators, so that each kind of collective keeps one order on every rank: MPI ones for
 * the votes and all-gathers, and a ZeroShard comm (shared memory inside a node) for the reduce-scatters. A
 * rank that never arrives is reported when the wait runs out. */
static zs_status open_comms(struct zs_ctx *ctx)
{
    struct zs_comm_opts co;
    zs_status st;

    while (ctx->exact->ncomm < 2) {
        MPI_Request r;
        if (MPI_Comm_idup(zs_comm_mpi(ctx->comm), &ctx->exact->comm[ctx->exact->ncomm], &r))
            return zs_fail(ZS_ERR_COMM, "zs_setup: deterministic mode: MPI_Comm_idup failed");
        st = zs_vote_wait(ctx, &r, "zs_setup: deterministic mode: the exact sum's communicators");
        if (st)
            return st;
        ctx->exact->ncomm++;
    }
    if (ctx->exact->sum)
        return ZS_OK;
    st = zs_comm_opts_for(ctx, &co);
    co.name = "xsum";
    if (ctx->nreplicas > 1) { /* hybrid: the reduce-scatter inside the shard group, the replicas' sum after it */
        co.fake_node_size = ctx->gfake;
        co.name_base = ctx->replica * ctx->shard_size;
        co.name_stride = 1;
    }
    return st ? st : zs_comm_init(&ctx->exact->sum, zs_comm_mpi(ctx->scomm), &co);
}

zs_status zs_exact_setup(struct zs_ctx *ctx)
{
    int64_t off = 0, shards = zs_exact_window_shards(ctx);
    zs_status st;

    if (shards > XMAX_SHARDS)
        return zs_fail(ZS_ERR_CONFIG, "zeroshard.micro_shard_size: %lld micro-shards per window (train_batch_size / "
                       "micro_shard_size) exceed the deterministic sum's %d; raise micro_shard_size",
                       (long long)shards, XMAX_SHARDS);
    if (!ctx->exact && !(ctx->exact = calloc(1, sizeof(*ctx->exact))))
        return zs_fail(ZS_ERR_NOMEM, "zs_setup: out of memory");
    if (!ctx->exact->units && !(ctx->exact->units = calloc((size_t)ctx->nunits, sizeof(*ctx->exact->units))))
        return zs_fail(ZS_ERR_NOMEM, "zs_setup: out of memory");
    st = open_comms(ctx);
    if (st)
        return st;
    for (int32_t u = 0; u < ctx->nunits; u++) {
        struct zs_unit *un = &ctx->units[u];
        ctx->exact->units[u].off = off;
        if (un->frozen) /* no gradients to sum */
            continue;
        off += un->part.padded; /* a multiple of ZS_SHARD_ALIGN (even): the folded int64 sums stay aligned */
        if (ctx->cfg.zero.stage >= 2) { /* the program's buffer: persistent and whole, no bucket */
            un->grad = zs_mem_alloc(ctx, ZS_MEM_GRADS, (uint64_t)un->part.padded * ctx->psz);
            if (!un->grad)
                return ctx->over_budget ? ZS_ERR_NOMEM
                                        : zs_fail(ZS_ERR_NOMEM, "zs_setup: out of memory for unit '%s''s gradients",
                                                  un->name);
        }
    }
    ctx->exact->numel = off;
    ctx->exact->acc = zs_mem_alloc_on(ctx, ctx->exact->sum, ZS_MEM_GRADS, (uint64_t)off * XK * sizeof(int32_t));
    ctx->exact->top = ctx->exact->acc ? zs_mem_alloc(ctx, ZS_MEM_GRADS, (uint64_t)off) : NULL;
    ctx->exact->vote = ctx->exact->top ? zs_mem_alloc(ctx, ZS_MEM_GRADS, (uint64_t)off) : NULL;
    if (!ctx->exact->vote)
        return ctx->over_budget ? ZS_ERR_NOMEM
                                : zs_fail(ZS_ERR_NOMEM, "zs_setup: out of memory for %lld exact gradient counters",
                                          (long long)off * XK);
    zs_exact_zero(ctx);
    return ZS_OK;
}

void zs_exact_free(struct zs_ctx *ctx)
{
    int fin = 0;

    if (ctx->cfg.zs.deterministic && ctx->cfg.zero.stage >= 2) /* grads_get hands out none in this mode */
        for (int32_t u = 0; u < ctx->nunits; u++) /* NULL for a frozen unit */
            zs_mem_free(ctx, ZS_MEM_GRADS, ctx->units[u].grad, (uint64_t)ctx->units[u].part.padded * ctx->psz);
    if (!ctx->exact)
        return;
    zs_mem_free(ctx, ZS_MEM_GRADS, ctx->exact->vote, (uint64_t)ctx->exact->numel);
    zs_mem_free(ctx, ZS_MEM_GRADS, ctx->exact->top, (uint64_t)ctx->exact->numel);
    if (ctx->exact->acc)
        zs_mem_free_on(ctx, ctx->exact->sum, ZS_MEM_GRADS, ctx->exact->acc, (uint64_t)ctx->exact->numel * XK * sizeof(int32_t));
    ctx->exact->acc = NULL;
    ctx->exact->top = ctx->exact->vote = NULL;
    ctx->exact->numel = 0;
    MPI_Finalized(&fin);
    while (!fin && ctx->exact->ncomm > 0)
        MPI_Comm_free(&ctx->exact->comm[--ctx->exact->ncomm]);
    if (ctx->exact->sum)
        zs_comm_free(ctx->exact->sum);
    free(ctx->exact->units);
    free(ctx->exact);
    ctx->exact = NULL;
}

uint64_t zs_exact_scratch_bytes(const struct zs_ctx *ctx)
{
    return ctx->exact && ctx->exact->sum ? zs_comm_scratch_bytes(ctx->exact->sum) : 0;
}

/* ---------------------------------------------------------------- public API */

zs_status zs_grad_deposit(zs_ctx *ctx, int32_t unit)
{
    zs_status st = zs_grad_unit_check(ctx, unit, "zs_grad_deposit");

    if (st)
        return st;
    if (!ctx->cfg.zs.deterministic) /* the buffer keeps summing, as it always has */
        return ZS_OK;
    return zs_exact_deposit(ctx, unit);
}

int64_t zs_micro_shard_size(const zs_ctx *ctx)
{
    return ctx && ctx->cfg.zs.deterministic ? ctx->cfg.zs.micro_shard_size : 0;
}
