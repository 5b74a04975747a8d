/* fetch.c - making a unit's parameters visible: a no-op below stage 3, a gather at stage 3, with
 * prefetch of the next units (stage3_prefetch_bucket_size), a cap on gathered elements alive at once
 * (stage3_max_live_parameters) and reuse of released units that come back soon
 * (stage3_max_reuse_distance). The unit order comes from the trace of the previous window. With ZeRO++ hpZ
 * the first gather of a unit after its parameters change is the shard group's, and leaves a secondary slice
 * behind; every later one gathers those slices inside the secondary group. */
#include <stdio.h>  /* defines: snprintf */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/clock.h" /* defines: zs_now_s */
#include "base/error.h"
#include "core/ctx.h"
#include "core/memory.h"
#include "core/ranks.h"
#include "core/units.h"
#include "offload/nvme_optim.h"
#include "quant_path.h" /* defines: zs_quant_weights, zs_quant_gather, zs_quant_gather_fail_next */
#include "sharding.h"

/* The unit order of one accumulation window, used to prefetch and to decide which released units are worth
 * keeping. */
struct zs_fetch {
    int32_t *trace, *rec;        /* the previous window's order, and the one being recorded */
    int64_t trace_len, trace_cap, trace_pos, rec_len, rec_cap;
    bool trace_valid, trace_broken;
};

zs_status zs_fetch_open(struct zs_ctx *ctx)
{
    ctx->fetch = calloc(1, sizeof(*ctx->fetch));
    return ctx->fetch ? ZS_OK : zs_fail(ZS_ERR_NOMEM, "zs_init: out of memory");
}

static uint64_t unit_bytes(const struct zs_ctx *ctx, const struct zs_unit *un)
{
    return (uint64_t)un->part.padded * ctx->psz;
}
static uint64_t live_elems(const struct zs_ctx *ctx) { return ctx->mem[ZS_MEM_LIVE] / ctx->psz; }

/* offload_param nvme: queue reads of the shards the next fetches will want (the trace's order, or unit
 * order before there is one) into the free read-ahead buffers, so the disk works ahead of the program. */
static zs_status read_ahead(struct zs_ctx *ctx, int32_t u)
{
    int64_t window = 2 * ctx->cfg.zero.offload_param.buffer_count;
    bool traced = ctx->fetch->trace_valid && !ctx->fetch->trace_broken, queued;

    for (int64_t i = 0; i < window; i++) {
        int64_t at = traced ? ctx->fetch->trace_pos + i : u + 1 + i;
        if (at >= (traced ? ctx->fetch->trace_len : ctx->nunits))
            break;
        int32_t v = traced ? ctx->fetch->trace[at] : (int32_t)at;
        if (v == u || ctx->units[v].gather != ZS_GATHER_NONE)
            continue;
        zs_status st = zs_nvme_param_ahead(ctx->nvme, v, &queued);
        if (st)
            return st;
    }
    return ZS_OK;
}

/* This rank's shard into its place in the gathered buffer: from memory, or from the swap file (on a device the
 * host cannot read in place, uploaded on the compute stream, which the gather follows). */
static zs_status shard_in(struct zs_ctx *ctx, int32_t u)
{
    struct zs_unit *un = &ctx->units[u];
    void *dst = zs_at(un->gathered, zs_partition_begin(&un->part, ctx->shard_rank), ctx->psz);
    zs_status st;

    if (!zs_nvme_param_on_disk(ctx->nvme, u))
        return zs_device_copy(&ctx->dev, dst, !ctx->dev.host_access, un->shard, !zs_params_on_host(ctx, un),
                           (size_t)un->part.shard * ctx->psz);
    st = zs_nvme_param_read(ctx->nvme, u, dst, (size_t)un->part.shard * ctx->psz, ctx->dev.compute);
    if (!st)
        st = read_ahead(ctx, u);
    return st;
}

/* hpZ: the secondary slice's elements, and where this rank's slice sits in the gathered unit. */
static int64_t secondary_elems(const struct zs_ctx *ctx, const struct zs_unit *un)
{
    return un->part.padded / ctx->hpz_size;
}
static void *secondary_place(const struct zs_ctx *ctx, const struct zs_unit *un)
{
    return zs_at(un->gathered, (int64_t)ctx->hpz_rank * secondary_elems(ctx, un), ctx->psz);
}

/* hpZ, after the full gather landed: this rank's slice of it is the secondary copy until the parameters change.
 * Taken after a quantized gather too (qwZ + hpZ): the copy is of the dequantized parameters every fetch until
 * then would have seen. */
static zs_status secondary_keep(struct zs_ctx *ctx, struct zs_unit *un)
{
    zs_status st = zs_device_copy(&ctx->dev, un->secondary, !ctx->dev.host_access, secondary_place(ctx, un),
                                  !ctx->dev.host_access, (size_t)secondary_elems(ctx, un) * ctx->psz);

    un->secondary_fill = false;
    if (st)
        return st;
    un->secondary_valid = true;
    return ZS_OK;
}

static zs_status gather_wait(struct zs_ctx *ctx, struct zs_unit *un);

/* The gather of unit u over the shard group (the shards) or, with a valid hpZ secondary copy, over the secondary
 * group (the slices): this rank's part into the gathered buffer, then the all-gather. */
static zs_status gather_start(struct zs_ctx *ctx, int32_t u)
{
    struct zs_unit *un = &ctx->units[u];
    bool sec = ctx->hpz_size > 0 && un->secondary_valid;
    struct zs_coll *coll = sec ? &ctx->hcoll : ctx->scoll;
    struct zs_comm *comm = sec ? ctx->hcomm : ctx->scomm;
    int64_t count = sec ? secondary_elems(ctx, un) : un->part.shard;
    zs_status st;

    /* not zero-filled: the all-gather writes all of it (world x shard = padded elements) before a read */
    un->gathered = zs_mem_alloc_fill(ctx, ctx->comm, ZS_MEM_LIVE, unit_bytes(ctx, un), ZS_FILL_NONE);
    if (!un->gathered) { /* this rank's budget, or the node's verdict (which names the rank that refused) */
        zs_error_prefix("fetch unit '%s' (%lld elements)", un->name, (long long)un->part.padded);
        return ZS_ERR_NOMEM;
    }
    un->from_secondary = sec;
    un->secondary_fill = ctx->hpz_size > 0 && !sec;
    st = sec ? zs_device_copy(&ctx->dev, secondary_place(ctx, un), !ctx->dev.host_access, un->secondary,
                              !ctx->dev.host_access, (size_t)count * ctx->psz)
             : shard_in(ctx, u);
    if (st && !sec && zs_quant_weights(ctx)) {
        /* The peers are inside the quantized gather, on its own communicators: it goes out from here too, failed,
         * so that it ends with an error on every rank (naming this one) instead of at the peers' timeout. It
         * completes in its call, so the buffer is dropped here as on the peers (gather_start's error below). */
        char why[512];
        snprintf(why, sizeof(why), "%s", zs_last_error());
        zs_quant_gather_fail_next(ctx);
        (void)zs_quant_gather(ctx, un->gathered, un->part.shard);
        st = zs_fail(st, "%s", why);
    } else if (st) {
        /* The peers are about to gather with this rank and hold the same block of the shared heap: the
         * gather still goes out, marked failed, so that it ends with an error on every rank and the block is
         * dropped on every rank alike. It is waited for here: the peers on other nodes learn of the failure
         * from this rank's header, which goes out only as the request progresses (left pending, they waited
         * for it until the comm's timeout while this rank ended the program). */
        char why[512];
        snprintf(why, sizeof(why), "%s", zs_last_error());
        zs_comm_fail_next(comm);
        zs_label_on(ctx, comm, ZS_PURPOSE_FETCH, u);
        if (!zs_coll_all_gather(coll, un->gathered, ctx->pdt, count, &un->gather_req)) {
            un->gather = ZS_GATHER_PENDING;
            (void)gather_wait(ctx, un); /* fails, and drops the buffer */
        }
        st = zs_fail(st, "%s", why);
    }
    if (!st && !sec && zs_quant_weights(ctx)) { /* complete here: gather_req stays NULL */
        st = zs_quant_gather(ctx, un->gathered, un->part.shard);
    } else if (!st) {
        zs_label_on(ctx, comm, ZS_PURPOSE_FETCH, u);
        st = zs_coll_all_gather(coll, un->gathered, ctx->pdt, count, &un->gather_req);
    }
    if (st && un->gather == ZS_GATHER_PENDING) {
        zs_error_prefix("fetch unit '%s'", un->name);
        return st;
    }
    if (st) {
        if (un->gathered) /* not when the failed gather's wait dropped it */
            zs_mem_free_comm(ctx, ZS_MEM_LIVE, un->gathered, unit_bytes(ctx, un));
        un->gathered = NULL;
        zs_error_prefix("fetch unit '%s'", un->name);
        return st;
    }
    un->gather = ZS_GATHER_PENDING;
    return ZS_OK;
}

static zs_status gather_wait(struct zs_ctx *ctx, struct zs_unit *un)
{
    zs_status st;

    if (un->gather != ZS_GATHER_PENDING)
        return ZS_OK;
    st = zs_coll_wait(un->from_secondary ? &ctx->hcoll : ctx->scoll, un->gather_req);
    un->gather_req = NULL;
    if (st) { /* the request is gone and the copy is not the unit: dropped here, on every rank alike */
        zs_mem_free_comm(ctx, ZS_MEM_LIVE, un->gathered, unit_bytes(ctx, un));
        un->gathered = NULL;
        un->gather = ZS_GATHER_NONE;
        un->prefetched = false;
        un->secondary_fill = false;
        zs_error_prefix("gather unit '%s'", un->name);
        return st;
    }
    un->gather = ZS_GATHER_READY;
    st = un->secondary_fill ? secondary_keep(ctx, un) : ZS_OK;
    if (st)
        zs_error_prefix("keep unit '%s''s hpZ secondary copy", un->name);
    return st;
}

/* hpZ: the parameters of units [lo, hi) changed (after their gathered copies were dropped, so that a gather that
 * landed during the drop cannot leave an old slice valid): the next fetch of each is a full gather again. */
static void secondary_stale(struct zs_ctx *ctx, int32_t lo, int32_t hi)
{
    for (int32_t i = lo; i < hi; i++)
        ctx->units[i].secondary_valid = false;
}

static zs_status gather_drop(struct zs_ctx *ctx, struct zs_unit *un)
{
    zs_status st = gather_wait(ctx, un);

    zs_mem_free_comm(ctx, ZS_MEM_LIVE, un->gathered, unit_bytes(ctx, un));
    un->gathered = NULL;
    un->gather = ZS_GATHER_NONE;
    un->prefetched = false;
    return st;
}

/* Frees kept or prefetched units nobody holds until `need` more elements fit under the cap.
 * A unit the program fetches is always gathered, even alone above the cap. */
static zs_status make_room(struct zs_ctx *ctx, int64_t need, int32_t except)
{
    for (int32_t u = 0; u < ctx->nunits && live_elems(ctx) + (uint64_t)need > (uint64_t)ctx->cfg.zero.max_live_parameters;
         u++) {
        struct zs_unit *un = &ctx->units[u];
        if (u == except || un->gather == ZS_GATHER_NONE || un->fetched > 0)
            continue;
        zs_status st = gather_drop(ctx, un);
        if (st)
            return st;
    }
    return ZS_OK;
}

static zs_status trace_note(struct zs_ctx *ctx, int32_t u)
{
    if (ctx->fetch->trace_valid && !ctx->fetch->trace_broken) {
        if (ctx->fetch->trace_pos < ctx->fetch->trace_len && ctx->fetch->trace[ctx->fetch->trace_pos] == u)
            ctx->fetch->trace_pos++;
        else
            ctx->fetch->trace_broken = true; /* the program changed its order: no prefetch until re-learned */
    }
    if (ctx->fetch->rec_len == ctx->fetch->rec_cap) {
        int64_t cap = ctx->fetch->rec_cap ? ctx->fetch->rec_cap * 2 : 256;
        int32_t *p = realloc(ctx->fetch->rec, (size_t)cap * sizeof(int32_t));
        if (!p)
            return zs_fail(ZS_ERR_NOMEM, "fetch: out of memory for the fetch trace");
        ctx->fetch->rec = p;
        ctx->fetch->rec_cap = cap;
    }
    ctx->fetch->rec[ctx->fetch->rec_len++] = u;
    return ZS_OK;
}

static zs_status prefetch(struct zs_ctx *ctx)
{
    int64_t budget = ctx->cfg.zero.prefetch_bucket_size, inflight = 0;

    if (!ctx->fetch->trace_valid || ctx->fetch->trace_broken || budget <= 0)
        return ZS_OK;
    for (int64_t i = ctx->fetch->trace_pos; i < ctx->fetch->trace_len; i++) {
        struct zs_unit *un = &ctx->units[ctx->fetch->trace[i]];
        if (!un->sharded || un->fetched > 0)
            continue;
        if (un->gather != ZS_GATHER_NONE) {
            if (un->prefetched)
                inflight += un->part.padded;
            continue;
        }
        if (inflight + un->part.padded > budget ||
            live_elems(ctx) + (uint64_t)un->part.padded > (uint64_t)ctx->cfg.zero.max_live_parameters)
            break;
        zs_status st = gather_start(ctx, ctx->fetch->trace[i]);
        if (st)
            return st;
        un->prefetched = true;
        inflight += un->part.padded;
    }
    return ZS_OK;
}

/* Elements fetched between now and the next use of u, or -1 if the trace does not bring it back. */
static int64_t reuse_distance(const struct zs_ctx *ctx, int32_t u)
{
    int64_t dist = 0;

    if (!ctx->fetch->trace_valid || ctx->fetch->trace_broken)
        return -1;
    for (int64_t i = ctx->fetch->trace_pos; i < ctx->fetch->trace_len; i++) {
        if (ctx->fetch->trace[i] == u)
            return dist;
        dist += ctx->units[ctx->fetch->trace[i]].part.padded;
    }
    return -1;
}

zs_status zs_fetch_acquire(struct zs_ctx *ctx, int32_t u, void **data)
{
    struct zs_unit *un = &ctx->units[u];
    zs_status st;

    st = trace_note(ctx, u);
    if (st)
        return st;
    if (!un->sharded) {
        un->fetched++;
        *data = un->full;
        return ZS_OK;
    }
    if (un->gather == ZS_GATHER_NONE) {
        st = make_room(ctx, un->part.padded, u);
        if (!st)
            st = gather_start(ctx, u);
        if (st)
            return st;
    }
    st = gather_wait(ctx, un);
    if (st)
        return st;
    un->prefetched = false;
    un->fetched++;
    *data = un->gathered;
    return prefetch(ctx);
}

zs_status zs_fetch_unref(struct zs_ctx *ctx, int32_t u)
{
    struct zs_unit *un = &ctx->units[u];
    int64_t dist;

    if (un->fetched <= 0)
        return zs_fail(ZS_ERR_INVALID, "zs_unit_release: unit '%s' is not fetched", un->name);
    if (--un->fetched > 0 || !un->sharded)
        return ZS_OK;
    dist = reuse_distance(ctx, u);
    if (dist >= 0 && dist <= ctx->cfg.zero.max_reuse_distance)
        return ZS_OK; /* comes back soon: keep it gathered (make_room frees it if space runs out) */
    return gather_drop(ctx, un);
}

void zs_fetch_free_all(struct zs_ctx *ctx)
{
    for (int32_t u = 0; u < ctx->nunits; u++) {
        struct zs_unit *un = &ctx->units[u];
        if (un->gather != ZS_GATHER_NONE)
            gather_drop(ctx, un);
        if (un->secondary) /* only hpZ's secondary slices: the set-up's other buffers are engine.c's to free */
            zs_mem_free(ctx, ZS_MEM_PARAMS, un->secondary, (uint64_t)secondary_elems(ctx, un) * ctx->psz);
        un->secondary = NULL;
        un->secondary_valid = false;
    }
    if (ctx->fetch) {
        free(ctx->fetch->trace);
        free(ctx->fetch->rec);
        free(ctx->fetch);
        ctx->fetch = NULL;
    }
}

/* After the optimizer step every gathered copy and hpZ secondary slice is stale; the window just recorded becomes
 * the trace. */
zs_status zs_fetch_step_end(struct zs_ctx *ctx)
{
    zs_status st = ZS_OK;

    for (int32_t u = 0; u < ctx->nunits; u++) {
        struct zs_unit *un = &ctx->units[u];
        if (un->fetched > 0)
            return zs_fail(ZS_ERR_INVALID, "zs_step: unit '%s' is still fetched; release every unit before the step",
                           un->name);
        if (un->gather != ZS_GATHER_NONE && !st)
            st = gather_drop(ctx, un);
    }
    secondary_stale(ctx, 0, ctx->nunits); /* the step wrote new shards (or skipped: one full gather more) */
    if (ctx->fetch->rec_len > 0 && (!ctx->fetch->trace_valid || ctx->fetch->rec_len != ctx->fetch->trace_len ||
                             memcmp(ctx->fetch->rec, ctx->fetch->trace, (size_t)ctx->fetch->rec_len * sizeof(int32_t)))) {
        int32_t *t = ctx->fetch->trace;
        int64_t cap = ctx->fetch->trace_cap;
        ctx->fetch->trace = ctx->fetch->rec;
        ctx->fetch->trace_cap = ctx->fetch->rec_cap;
        ctx->fetch->trace_len = ctx->fetch->rec_len;
        ctx->fetch->rec = t;
        ctx->fetch->rec_cap = cap;
        ctx->fetch->trace_valid = true;
    }
    ctx->fetch->rec_len = 0;
    ctx->fetch->trace_pos = 0;
    ctx->fetch->trace_broken = false;
    return st;
}

/* The parameters of unit u (every unit when u < 0) changed outside a step (a checkpoint load, a write of one
 * parameter): gathered copies are stale and dropped, hpZ secondary slices marked stale. For every unit the window
 * being recorded restarts; the learned order stays, since the program's order has not changed. */
zs_status zs_fetch_invalidate(struct zs_ctx *ctx, int32_t u, const char *who)
{
    zs_status st = ZS_OK;

    for (int32_t i = u < 0 ? 0 : u; i < (u < 0 ? ctx->nunits : u + 1); i++)
        if (ctx->units[i].fetched > 0)
            return zs_fail(ZS_ERR_INVALID, "%s: unit '%s' is fetched; release it first", who, ctx->units[i].name);
    for (int32_t i = u < 0 ? 0 : u; i < (u < 0 ? ctx->nunits : u + 1); i++) {
        zs_status s = ctx->units[i].gather != ZS_GATHER_NONE ? gather_drop(ctx, &ctx->units[i]) : ZS_OK;
        if (s && !st)
            st = s;
    }
    secondary_stale(ctx, u < 0 ? 0 : u, u < 0 ? ctx->nunits : u + 1);
    if (u < 0) {
        ctx->fetch->rec_len = 0;
        ctx->fetch->trace_pos = 0;
        ctx->fetch->trace_broken = false;
    }
    return st;
}

/* ---------------------------------------------------------------- public API */

zs_status zs_unit_fetch(zs_ctx *ctx, int32_t unit, void **data)
{
    void *p = NULL;
    zs_status st;

    if (!ctx || !ctx->set_up)
        return zs_fail(ZS_ERR_INVALID, "zs_unit_fetch: call zs_setup first");
    if (unit < 0 || unit >= ctx->nunits)
        return zs_fail(ZS_ERR_INVALID, "zs_unit_fetch: no unit %d", unit);
    double t0 = zs_now_s();
    zs_note(ctx, "zs_unit_fetch", unit);
    st = zs_grads_progress(ctx);
    if (!st)
        st = zs_fetch_acquire(ctx, unit, &p);
    if (!st && data)
        *data = p;
    ctx->t_fetch += zs_now_s() - t0;
    zs_mem_sample(ctx); /* the unit gathered */
    return st;
}

zs_status zs_unit_release(zs_ctx *ctx, int32_t unit)
{
    if (!ctx || !ctx->set_up)
        return zs_fail(ZS_ERR_INVALID, "zs_unit_release: call zs_setup first");
    if (unit < 0 || unit >= ctx->nunits)
        return zs_fail(ZS_ERR_INVALID, "zs_unit_release: no unit %d", unit);
    zs_note(ctx, "zs_unit_release", unit);
    return zs_fetch_unref(ctx, unit);
}

zs_status zs_param_data(zs_ctx *ctx, int32_t param, void **data)
{
    const struct zs_param_rec *pr;
    const struct zs_unit *un;

    if (!ctx || !ctx->set_up || !data)
        return zs_fail(ZS_ERR_INVALID, "zs_param_data: call zs_setup first");
    if (param < 0 || param >= ctx->nparams)
        return zs_fail(ZS_ERR_INVALID, "zs_param_data: no parameter %d", param);
    pr = &ctx->params[param];
    un = &ctx->units[pr->unit];
    if (un->sharded && (un->fetched == 0 || !un->gathered))
        return zs_fail(ZS_ERR_INVALID, "zs_param_data: parameter '%s': unit '%s' is not fetched", pr->name, un->name);
    *data = zs_at(un->sharded ? un->gathered : un->full, pr->offset, ctx->psz);
    return ZS_OK;
}
