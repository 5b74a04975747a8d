/* setup.c - zs_setup: check that every rank registered the same model, partition each unit, allocate
 * what this stage keeps, and load rank 0's initial values; plus the read-only queries. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/hash.h" /* defines: zs_fnv1a */
#include "kernels/convert.h" /* defines: zs_cvt_from_f32 */
#include "core/ctx.h"
#include "core/memory.h"
#include "core/ranks.h"
#include "core/units.h"
#include "offload/nvme_optim.h"
#include "offload/offload.h"
#include "sharding/sharding.h"
#include "runtime.h"

struct reg_summary {
    uint64_t hash;
    int64_t numel;
    int32_t nunits, nparams;
};

static struct reg_summary registration_summary(const struct zs_ctx *ctx)
{
    struct reg_summary s = { .hash = ZS_FNV_SEED, .nunits = ctx->nunits, .nparams = ctx->nparams };

    for (int32_t p = 0; p < ctx->nparams; p++) {
        const struct zs_param_rec *pr = &ctx->params[p];
        s.hash = zs_fnv1a(s.hash, pr->name, strlen(pr->name) + 1);
        s.hash = zs_fnv1a(s.hash, &pr->unit, sizeof(pr->unit));
        s.hash = zs_fnv1a(s.hash, &pr->numel, sizeof(pr->numel));
        s.numel += pr->numel;
    }
    for (int32_t u = 0; u < ctx->nunits; u++)
        s.hash = zs_fnv1a(s.hash, ctx->units[u].name, strlen(ctx->units[u].name) + 1);
    return s;
}

/* Before any collective that could hang on a different model, all ranks compare what they registered. */
static zs_status agree_on_registration(struct zs_ctx *ctx)
{
    struct reg_summary mine = registration_summary(ctx), *all;
    char ranks[256] = "";
    size_t rl = 0;
    int32_t bad = -1;
    zs_status st;

    all = calloc((size_t)ctx->world, sizeof(*all));
    if (!all)
        return zs_fail(ZS_ERR_NOMEM, "zs_setup: out of memory");
    zs_label(ctx, ZS_PURPOSE_SETUP, -1);
    st = zs_comm_allgather_bytes(ctx->comm, &mine, all, (int32_t)sizeof(mine));
    if (st) {
        free(all);
        return st;
    }
    for (int32_t r = 1; r < ctx->world; r++) {
        if (all[r].hash == all[0].hash && all[r].numel == all[0].numel)
            continue;
        if (bad < 0)
            bad = r;
        if (rl < sizeof(ranks) - 16)
            rl += (size_t)snprintf(ranks + rl, sizeof(ranks) - rl, "%s%d", rl ? "," : "", r);
    }
    if (bad >= 0) {
        st = zs_fail(ZS_ERR_MISMATCH,
                     "parameter registration differs between ranks: rank(s) %s differ from rank 0 "
                     "(rank 0: %d units, %d params, %lld elements; rank %d: %d units, %d params, %lld elements%s)",
                     ranks, all[0].nunits, all[0].nparams, (long long)all[0].numel, bad, all[bad].nunits,
                     all[bad].nparams, (long long)all[bad].numel,
                     all[0].numel == all[bad].numel && all[0].nparams == all[bad].nparams ? ", names differ" : "");
    }
    free(all);
    return st;
}

/* The unit's buffers as the plan lists them (core/plan.c), in its order; the device arena's plan adds
 * up the same list, so the two cannot drift apart. Nothing is allocated for what lives on NVMe. */
static zs_status alloc_unit(struct zs_ctx *ctx, struct zs_unit *un)
{
    struct zs_plan_unit pu;

    zs_plan_unit(&ctx->plan, un->numel, un->frozen, &pu); /* partitioned already: cannot fail */
    un->sharded = pu.sharded;
    for (int32_t i = 0; i < pu.nbufs; i++) {
        const struct zs_plan_buf *b = &pu.buf[i];
        void *p;
        if (b->home == ZS_HOME_NVME)
            continue;
        p = b->home == ZS_HOME_HOST   ? zs_mem_alloc_host(ctx, b->cat, b->bytes)
            : b->home == ZS_HOME_COMM ? zs_mem_alloc_comm(ctx, b->cat, b->bytes)
                                        : zs_mem_alloc(ctx, b->cat, b->bytes);
        if (!p)
            return ctx->over_budget ? ZS_ERR_NOMEM
                                    : zs_fail(ZS_ERR_NOMEM, "zs_setup: out of memory allocating unit '%s' (%lld elements)",
                                              un->name, (long long)un->part.padded);
        switch (b->slot) {
        case ZS_SLOT_PARAMS: *(un->sharded ? &un->shard : &un->full) = p; break;
        case ZS_SLOT_GRAD: *(ctx->cfg.zero.stage <= 1 ? &un->grad : &un->grad_shard) = p; break;
        case ZS_SLOT_MASTER: un->master = p; break;
        case ZS_SLOT_M: un->m = p; break;
        case ZS_SLOT_V: un->v = p; break;
        case ZS_SLOT_SECONDARY: un->secondary = p; break; /* filled by the unit's first gather (fetch.c) */
        }
    }
    return ZS_OK;
}

/* Fills dst (unit elements [begin, end), zeroed) with what the parameters' init arrays (with_arrays) and
 * init functions give for that range. */
static void fill_range(struct zs_ctx *ctx, const struct zs_unit *un, int64_t begin, int64_t end, float *dst,
                       bool with_arrays)
{
    for (int32_t i = 0; i < un->nparams; i++) {
        const struct zs_param_rec *pr = &ctx->params[un->first_param + i];
        int64_t lo = pr->offset > begin ? pr->offset : begin;
        int64_t hi = pr->offset + pr->numel < end ? pr->offset + pr->numel : end;
        if (lo >= hi)
            continue;
        if (pr->init_fn)
            pr->init_fn(pr->init_arg, un->first_param + i, lo - pr->offset, hi - lo, dst + (lo - begin));
        else if (pr->init && with_arrays)
            memcpy(dst + (lo - begin), pr->init + (lo - pr->offset), (size_t)(hi - lo) * sizeof(float));
    }
}

static bool has_init_arrays(const struct zs_ctx *ctx, const struct zs_unit *un)
{
    for (int32_t i = 0; i < un->nparams; i++)
        if (ctx->params[un->first_param + i].init)
            return true;
    return false;
}

/* The fp32 values of what this rank stores of a unit (vals, `n` elements from unit element `begin`) go
 * to the working parameters (rounded when 16-bit), and to the fp32 masters: in memory, or in the swap
 * file with the shard (NVMe parameters, 16-bit ones with their masters, or 16-bit masters with the optimizer
 * on NVMe). */
static zs_status place_values(struct zs_ctx *ctx, struct zs_unit *un, int32_t u, const float *vals, int64_t begin)
{
    int64_t mine = zs_partition_begin(&un->part, ctx->shard_rank), sh = un->part.shard;
    int64_t mfirst = ctx->cfg.zero.stage == 0 ? 0 : mine; /* unit element of the masters' first */
    int64_t mcount = zs_plan_opt_elems(ctx->cfg.zero.stage, &un->part);
    void *work = un->sharded ? un->shard : un->full;
    int64_t wn = un->sharded ? sh : un->part.padded;
    zs_status st = ZS_OK;

    if (work && zs_params_on_host(ctx, un)) {
        zs_cvt_from_f32(work, ctx->pdt, vals, wn);
    } else if (work) { /* rounded on the host, then up */
        void *tmp = ctx->pdt == ZS_DTYPE_FP32 ? NULL : malloc((size_t)wn * ctx->psz);
        if (ctx->pdt != ZS_DTYPE_FP32 && !tmp)
            return zs_fail(ZS_ERR_NOMEM, "zs_setup: out of memory staging unit '%s'", un->name);
        if (tmp)
            zs_cvt_from_f32(tmp, ctx->pdt, vals, wn);
        st = zs_device_copy(&ctx->dev, work, true, tmp ? tmp : vals, false, (size_t)wn * ctx->psz);
        free(tmp);
    }
    if (!st && un->master)
        st = zs_device_copy(&ctx->dev, un->master, !zs_optstate_on_host(ctx), vals + (mfirst - begin), false,
                         (size_t)mcount * sizeof(float));
    if (st)
        return st;
    if (zs_nvme_params_in_file(ctx->nvme, u))
        return zs_nvme_param_write(ctx->nvme, u, vals + (mine - begin), sh);
    return ZS_OK;
}

/* Initial values: a rank fills just what it stores from the init functions; where a unit has init
 * arrays, rank 0's values win and are broadcast (as in DeepSpeed), so ranks that seeded differently
 * still agree. */
static zs_status load_initial_values(struct zs_ctx *ctx, struct zs_unit *un, int32_t u)
{
    bool bcast = has_init_arrays(ctx, un);
    int64_t begin = un->sharded && !bcast ? zs_partition_begin(&un->part, ctx->shard_rank) : 0;
    int64_t n = un->sharded && !bcast ? un->part.shard : un->part.padded;
    float *buf = calloc((size_t)n, sizeof(float));
    zs_status st = ZS_OK;

    if (!buf)
        return zs_fail(ZS_ERR_NOMEM, "zs_setup: out of memory staging unit '%s'", un->name);
    if (bcast) {
        if (ctx->rank == 0)
            fill_range(ctx, un, 0, n, buf, true);
        st = zs_comm_bcast(ctx->comm, buf, n * (int64_t)sizeof(float), 0);
    } else {
        fill_range(ctx, un, begin, begin + n, buf, false);
    }
    int64_t skip = un->sharded && bcast ? zs_partition_begin(&un->part, ctx->shard_rank) : 0; /* to the shard */
    if (!st)
        st = place_values(ctx, un, u, buf + skip, begin + skip);
    free(buf);
    return st;
}

static zs_status setup_bucket(struct zs_ctx *ctx)
{
    if (ctx->cfg.zero.stage < 2)
        return ZS_OK;
    return zs_grads_bucket_open(ctx, (int64_t)ctx->plan.bucket_bytes, ctx->plan.bucket_elems);
}

/* ---------------------------------------------------------------- the device arena's plan */

static uint64_t arena_block(uint64_t b)
{
    return b ? (b + ZS_ARENA_ALIGN - 1) / ZS_ARENA_ALIGN * ZS_ARENA_ALIGN : ZS_ARENA_ALIGN;
}

/* Device bytes per category, each buffer of the plan rounded as the arena hands it out: the units' buffers,
 * the bucket, and at stage 3 the gathered units. Those come and go, so their region holds the live cap
 * (stage3_max_live_parameters, at least the largest unit: fetch.c keeps non-held units under it) plus one
 * largest unit, for a unit the program holds above the cap and for the holes blocks of different sizes leave. */
static void arena_plan(struct zs_ctx *ctx, uint64_t plan[ZS_MEM_NCAT])
{
    const struct zs_plan *p = &ctx->plan;
    uint64_t live;

    memset(plan, 0, ZS_MEM_NCAT * sizeof(plan[0]));
    for (int32_t u = 0; u < ctx->nunits; u++) {
        struct zs_plan_unit pu;
        zs_plan_unit(p, ctx->units[u].numel, ctx->units[u].frozen, &pu);
        for (int32_t i = 0; i < pu.nbufs; i++)
            if (pu.buf[i].home == ZS_HOME_DEV || pu.buf[i].home == ZS_HOME_COMM)
                plan[pu.buf[i].cat] += arena_block(pu.buf[i].bytes);
    }
    if (ctx->cfg.zero.stage >= 2)
        plan[ZS_MEM_BUFFERS] += arena_block(p->bucket_bytes);
    if (!p->gathered)
        return;
    live = (uint64_t)ctx->cfg.zero.max_live_parameters;
    live = live > p->gathered_padded ? p->gathered_padded : live;
    live = live < p->gathered_largest ? p->gathered_largest : live;
    plan[ZS_MEM_LIVE] = ctx->psz * (live + p->gathered_largest) + (uint64_t)p->gathered * ZS_ARENA_ALIGN;
}

/* On a device the host cannot read in place, every accounted buffer comes from the arena (engine.c:
 * zs_mem_alloc); the CPU device keeps one allocation per buffer (its collectives' buffers come from the node's
 * shared heap, and each rank's pages are first touched by its own bound threads). */
static zs_status open_arena(struct zs_ctx *ctx)
{
    uint64_t plan[ZS_MEM_NCAT];
    int regions = 0;
    zs_status st;

    if (ctx->dev.host_access)
        return ZS_OK;
    arena_plan(ctx, plan);
    for (int c = 0; c < ZS_MEM_NCAT; c++)
        regions += plan[c] != 0;
    st = zs_dev_arena_open(&ctx->dev_arena, &ctx->dev, plan, zs_mem_cat_names, ZS_MEM_NCAT);
    if (st)
        return st;
    if (ctx->rank == 0 && !ctx->quiet)
        zs_log("device arena per rank: %.2f MiB in %d regions (parameters %.2f, gradients %.2f, fp32 masters %.2f, "
               "optimizer state %.2f, gradient bucket %.2f, gathered parameters %.2f MiB)",
               (double)zs_dev_arena_size(&ctx->dev_arena) / (1 << 20), regions,
               (double)plan[ZS_MEM_PARAMS] / (1 << 20), (double)plan[ZS_MEM_GRADS] / (1 << 20),
               (double)plan[ZS_MEM_MASTER] / (1 << 20), (double)plan[ZS_MEM_OPTIM] / (1 << 20),
               (double)plan[ZS_MEM_BUFFERS] / (1 << 20), (double)plan[ZS_MEM_LIVE] / (1 << 20));
    return ZS_OK;
}

zs_status zs_setup(zs_ctx *ctx)
{
    zs_status st;

    if (!ctx)
        return zs_fail(ZS_ERR_INVALID, "zs_setup: NULL context");
    if (ctx->set_up)
        return zs_fail(ZS_ERR_INVALID, "zs_setup: called twice");
    st = agree_on_registration(ctx);
    if (!st)
        st = zs_groups_setup(ctx);
    if (st)
        return st;
    if (ctx->nunits == 0)
        return zs_fail(ZS_ERR_INVALID, "zs_setup: no units registered");
    for (int32_t u = 0; u < ctx->nunits; u++) {
        struct zs_unit *un = &ctx->units[u];
        if (un->nparams == 0)
            return zs_fail(ZS_ERR_INVALID, "zs_setup: unit '%s' has no parameters (zero-size units are not allowed)",
                           un->name);
        if (zs_partition_init_hybrid(&un->part, un->numel, ctx->shard_size, ctx->nreplicas))
            return zs_fail(ZS_ERR_INVALID, "zs_setup: unit '%s' of %lld elements cannot be partitioned", un->name,
                           (long long)un->numel);
        ctx->numel_padded += (uint64_t)un->part.padded;
    }
    for (int32_t p = 0; p < ctx->nparams; p++)
        ctx->numel += (uint64_t)ctx->params[p].numel;
    struct zs_placement pl = zs_placement_of(&ctx->cfg);
    pl.device_apart = !ctx->dev.host_access; /* the device as opened (the tests' separate CPU device too) */
    zs_plan_init(&ctx->plan, &ctx->cfg, pl, ctx->world);
    for (int32_t u = 0; u < ctx->nunits; u++)
        zs_plan_add(&ctx->plan, ctx->units[u].numel, ctx->units[u].frozen); /* partitioned above: cannot fail */
    zs_plan_finish(&ctx->plan);
    if (!ctx->bucket && (st = zs_grads_setup(ctx)))
        return st;
    st = zs_agree(ctx, zs_offload_setup(ctx)); /* a disk or budget problem on one rank stops them all */
    if (!st)
        st = zs_agree(ctx, open_arena(ctx));
    if (!st)
        zs_offload_pin(ctx); /* never fails: a refused pin leaves the pool pageable (a warning) */
    if (st)
        return st;
    for (int32_t u = 0; u < ctx->nunits; u++) {
        st = alloc_unit(ctx, &ctx->units[u]);
        if (!st)
            st = load_initial_values(ctx, &ctx->units[u], u);
        if (st)
            return st;
    }
    st = ctx->cfg.zs.deterministic ? zs_exact_setup(ctx) : setup_bucket(ctx);
    if (!st)
        st = zs_offdev_setup(ctx);
    if (st)
        return st;
    for (int32_t p = 0; p < ctx->nparams; p++)
        ctx->params[p].init = NULL;
    /* DeepSpeed's averaging: 1/(N * accumulation) after the sum, or the predivide factor split around it. */
    double n = (double)ctx->world * (double)ctx->cfg.grad_accum_steps;
    double pre = ctx->cfg.prescale_gradients ? ctx->cfg.gradient_predivide_factor : 1.0;
    ctx->pre_scale = (float)(1.0 / pre);
    ctx->post_scale = (float)(pre / n);
    ctx->set_up = true;
    zs_memory_log(ctx);
    zs_mem_sample(ctx);
    zs_mem_watch_start(ctx);
    return ZS_OK;
}

/* ---------------------------------------------------------------- queries */

int32_t zs_world_size(const zs_ctx *ctx) { return ctx ? ctx->world : 0; }
int32_t zs_rank(const zs_ctx *ctx) { return ctx ? ctx->rank : -1; }
int32_t zs_param_count(const zs_ctx *ctx) { return ctx ? ctx->nparams : 0; }
int32_t zs_unit_count(const zs_ctx *ctx) { return ctx ? ctx->nunits : 0; }
zs_dtype zs_param_dtype(const zs_ctx *ctx) { return ctx ? ctx->pdt : ZS_DTYPE_FP32; }
int64_t zs_grad_accum_steps(const zs_ctx *ctx) { return ctx ? ctx->cfg.grad_accum_steps : 0; }
int64_t zs_micro_batch_size(const zs_ctx *ctx) { return ctx ? ctx->cfg.micro_batch_size : 0; }

zs_status zs_param_info(const zs_ctx *ctx, int32_t param, const char **name, int64_t *numel, int32_t *unit,
                        int64_t *offset)
{
    if (!ctx || param < 0 || param >= ctx->nparams)
        return zs_fail(ZS_ERR_INVALID, "zs_param_info: no parameter %d", param);
    const struct zs_param_rec *pr = &ctx->params[param];
    if (name)
        *name = pr->name;
    if (numel)
        *numel = pr->numel;
    if (unit)
        *unit = pr->unit;
    if (offset)
        *offset = pr->offset;
    return ZS_OK;
}

zs_status zs_stats(const zs_ctx *ctx, zs_step_stats *out)
{
    if (!ctx || !out)
        return zs_fail(ZS_ERR_INVALID, "zs_stats: NULL argument");
    *out = ctx->stats;
    out->window_step = ctx->window_micro;
    out->window_end = ctx->window_end;
    return ZS_OK;
}
