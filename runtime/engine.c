/* engine.c - the life cycle of a ZeroShard context: init (config, communicator, cross-rank checks),
 * parameter registration, set-up (partition, allocate, broadcast initial values), queries. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/hash.h" /* defines: zs_fnv1a */
#include "core/ctx.h"
#include "core/host_pool.h"
#include "core/memory.h"
#include "core/ranks.h"
#include "core/units.h"
#include "offload/nvme_optim.h"
#include "offload/offload.h"
#include "sharding/quant_path.h" /* defines: zs_quant_path_open, zs_quant_path_close */
#include "sharding/sharding.h"
#include "runtime.h"

/* ---------------------------------------------------------------- cross-rank agreement */

struct cfg_summary {
    int32_t status;  /* 0 = this rank resolved its config */
    int32_t stage;
    uint64_t hash;
    int64_t micro, gas;
    double lr;
    int32_t optim, pad;
};

const char *zs_optim_name(int t)
{
    static const char *const names[] = { "Adam", "AdamW", "SGD", "Lion", "Adagrad" };

    return t >= 0 && t < (int)(sizeof(names) / sizeof(names[0])) ? names[t] : "?";
}

/* Every rank reaches this exchange whether or not its own parse succeeded, so no rank is left
 * waiting in a later collective: all of them fail together with a message that names the ranks. */
static zs_status agree_on_config(struct zs_ctx *ctx, zs_status local)
{
    struct cfg_summary mine = {0}, *all;
    char diff[512] = "";
    size_t dl = 0;
    int32_t bad = -1;
    zs_status st;

    mine.status = local;
    if (!local) {
        mine.hash = zs_fnv1a(ZS_FNV_SEED, &ctx->cfg, sizeof(ctx->cfg));
        mine.stage = ctx->cfg.zero.stage;
        mine.micro = ctx->cfg.micro_batch_size;
        mine.gas = ctx->cfg.grad_accum_steps;
        mine.lr = ctx->cfg.optim.lr;
        mine.optim = (int32_t)ctx->cfg.optim.type;
    }
    all = calloc((size_t)ctx->world, sizeof(*all));
    if (!all)
        return zs_fail(ZS_ERR_NOMEM, "init: out of memory");
    MPI_Request q;
    st = MPI_Iallgather(&mine, sizeof(mine), MPI_BYTE, all, sizeof(mine), MPI_BYTE, ctx->parent, &q) == MPI_SUCCESS
             ? zs_vote_wait(ctx, &q, "init: the vote on the config")
             : zs_fail(ZS_ERR_COMM, "init: all-gather of the config summaries failed");
    if (st) {
        free(all);
        return st;
    }
    for (int32_t r = 0; r < ctx->world; r++) {
        if (all[r].status) {
            zs_status code = (zs_status)all[r].status;
            free(all);
            return zs_share_error(ctx, r, code);
        }
    }
    for (int32_t r = 1; r < ctx->world && bad < 0; r++)
        if (all[r].hash != all[0].hash)
            bad = r;
    if (bad >= 0) {
        const struct cfg_summary *a = &all[0], *b = &all[bad];
        if (a->stage != b->stage)
            dl += (size_t)snprintf(diff + dl, sizeof(diff) - dl, "; zero_optimization.stage %d vs %d", a->stage, b->stage);
        if (a->micro != b->micro && dl < sizeof(diff))
            dl += (size_t)snprintf(diff + dl, sizeof(diff) - dl, "; train_micro_batch_size_per_gpu %lld vs %lld",
                                   (long long)a->micro, (long long)b->micro);
        if (a->gas != b->gas && dl < sizeof(diff))
            dl += (size_t)snprintf(diff + dl, sizeof(diff) - dl, "; gradient_accumulation_steps %lld vs %lld",
                                   (long long)a->gas, (long long)b->gas);
        if (a->optim != b->optim && dl < sizeof(diff))
            dl += (size_t)snprintf(diff + dl, sizeof(diff) - dl, "; optimizer.type %s vs %s", zs_optim_name(a->optim),
                                   zs_optim_name(b->optim));
        if (a->lr != b->lr && dl < sizeof(diff))
            snprintf(diff + dl, sizeof(diff) - dl, "; optimizer.params.lr %g vs %g", a->lr, b->lr);
        char ranks[256] = "";
        size_t rl = 0;
        for (int32_t r = 1; r < ctx->world && rl < sizeof(ranks) - 16; r++)
            if (all[r].hash != all[0].hash)
                rl += (size_t)snprintf(ranks + rl, sizeof(ranks) - rl, "%s%d", rl ? "," : "", r);
        free(all);
        return zs_fail(ZS_ERR_MISMATCH, "config differs between ranks: rank(s) %s resolved a different config than rank 0%s",
                       ranks, diff[0] ? diff : " (values outside stage/batch/optimizer differ)");
    }
    free(all);
    return ZS_OK;
}

/* ---------------------------------------------------------------- init / finalize */

static zs_status load_config(struct zs_ctx *ctx, const zs_init_opts *o)
{
    char err[768];
    char *text = NULL;
    const char *source = "<json>";
    int rc;

    if (o->config_path) {
        rc = zs_config_read_file(o->config_path, &text);
        if (rc)
            return zs_fail(ZS_ERR_CONFIG, "%s: cannot read config: %s", o->config_path, strerror(-rc));
        source = o->config_path;
    } else if (o->config_json) {
        text = strdup(o->config_json);
        if (!text)
            return zs_fail(ZS_ERR_NOMEM, "init: out of memory");
    } else {
        return zs_fail(ZS_ERR_INVALID, "init: neither config_path nor config_json given");
    }
    memset(&ctx->cfg, 0, sizeof(ctx->cfg)); /* the resolved struct is hashed: keep padding zero */
    rc = zs_config_parse(&ctx->cfg, text, source, ctx->world, &o->auto_values, err, sizeof(err));
    ctx->config_text = text; /* kept for checkpoint manifests */
    if (rc)
        return zs_fail(ZS_ERR_CONFIG, "%s", err);
    return ZS_OK;
}

static enum zs_kopt kernel_opt(enum zs_optim_type t)
{
    switch (t) {
    case ZS_OPTIM_ADAM: return ZS_KOPT_ADAM;
    case ZS_OPTIM_ADAMW: return ZS_KOPT_ADAMW;
    case ZS_OPTIM_SGD: return ZS_KOPT_SGD;
    case ZS_OPTIM_LION: return ZS_KOPT_LION;
    case ZS_OPTIM_ADAGRAD: return ZS_KOPT_ADAGRAD;
    }
    return ZS_KOPT_ADAMW;
}

/* The kernel path: ZS_KERNEL in the environment, else zeroshard.kernel, else the best the CPU runs.
 * Resolved before the ranks compare notes, so a rank that cannot honour it fails them all. */
static zs_status choose_kernel(struct zs_ctx *ctx)
{
    const char *env = getenv("ZS_KERNEL"), *name = env && *env ? env : ctx->cfg.zs.kernel;
    const char *what = env && *env ? "ZS_KERNEL" : "zeroshard.kernel";
    int rc = zs_kpath_parse(name[0] ? name : "auto", &ctx->kpath);

    if (rc == -ENOTSUP)
        return zs_fail(ZS_ERR_UNSUPPORTED, "%s: this CPU cannot run the '%s' kernels (best here: %s)", what, name,
                       zs_kpath_name(zs_kpath_best()));
    if (rc)
        return zs_fail(ZS_ERR_CONFIG, "%s: unknown kernel path '%s' (auto, scalar, avx2, avx512)", what, name);
    /* 16-bit parameters: the kernel updates the fp32 master and writes the rounded working copy; it reads
     * gradients as reduced (stages 2-3) or as accumulated in place (stages 0-1). */
    ctx->pdt = ctx->cfg.param_dtype;
    ctx->cdt = ctx->cfg.comm_dtype;
    ctx->gdt = ctx->cfg.zero.stage <= 1 ? ctx->pdt : ctx->cdt;
    ctx->psz = zs_dtype_bytes(ctx->pdt);
    ctx->csz = zs_dtype_bytes(ctx->cdt);
    ctx->kopt = kernel_opt(ctx->cfg.optim.type);
    if (!zs_optim_kernel(ctx->kpath, ctx->kopt, ctx->pdt, ctx->gdt))
        return zs_fail(ZS_ERR_UNSUPPORTED, "no %s kernel for %s with %s parameters and %s gradients",
                       zs_kpath_name(ctx->kpath), zs_kopt_name(ctx->kopt),
                       zs_dtype_name(ctx->pdt), zs_dtype_name(ctx->gdt));
    return ZS_OK;
}

/* Threads: ZS_THREADS, else zeroshard.cpu_threads, else this rank's share of the node's cores. */
static zs_status start_threads(struct zs_ctx *ctx)
{
    struct zs_pool_opts po = { .threads = (int32_t)ctx->cfg.zs.threads, .bind = ctx->cfg.zs.bind };
    const char *env = getenv("ZS_THREADS");
    char warning[256];
    MPI_Comm node;
    int rc;

    if (ctx->cfg.zs.threads > 4096)
        return zs_fail(ZS_ERR_CONFIG, "zeroshard.cpu_threads: %lld is more than 4096", (long long)ctx->cfg.zs.threads);
    if (env && *env) {
        char *end;
        long v = strtol(env, &end, 10);
        if (*end || v < 0 || v > 4096)
            return zs_fail(ZS_ERR_CONFIG, "ZS_THREADS: expected a thread count 0..4096, got '%s'", env);
        po.threads = (int32_t)v;
    }
    if (MPI_Comm_split_type(zs_comm_mpi(ctx->comm), MPI_COMM_TYPE_SHARED, ctx->rank, MPI_INFO_NULL, &node) !=
        MPI_SUCCESS)
        return zs_fail(ZS_ERR_COMM, "init: could not find the ranks sharing this node");
    MPI_Comm_rank(node, &ctx->local_rank);
    MPI_Comm_size(node, &ctx->local_size);
    MPI_Comm_free(&node);
    po.local_rank = ctx->local_rank;
    po.local_size = ctx->local_size;
    rc = zs_pool_create(&ctx->pool, &po, warning, (int)sizeof(warning));
    if (rc)
        return zs_fail(ZS_ERR_NOMEM, "init: could not start the optimizer threads: %s", strerror(-rc));
    if (warning[0] && !ctx->quiet)
        zs_log("rank %d: warning: %s", ctx->rank, warning);
    return ZS_OK;
}

static zs_status start_mpi(struct zs_ctx *ctx, const zs_init_opts *o)
{
    int inited = 0, provided = 0;

    MPI_Initialized(&inited);
    if (!inited) {
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
            return zs_fail(ZS_ERR_COMM, "init: MPI_Init_thread failed");
        ctx->own_mpi = true;
    }
    ctx->parent = o->use_comm ? o->comm : MPI_COMM_WORLD;
    MPI_Comm_rank(ctx->parent, &ctx->rank);
    MPI_Comm_size(ctx->parent, &ctx->world);
    return ZS_OK;
}

/* What the engine does not yet do on a device the host cannot reach, refused by name. */
static zs_status device_limits(struct zs_ctx *ctx)
{
    if (ctx->dev.host_access || !ctx->cfg.zs.deterministic)
        return ZS_OK;
    return zs_fail(ZS_ERR_UNSUPPORTED, "zeroshard.deterministic with zeroshard.device \"%s\" (%s): not implemented "
                   "on a device the host cannot read in place", ctx->cfg.zs.device, ctx->dev.ops->name);
}

/* The device: the CPU unless zeroshard.device asks for the GPU, which is refused by name where this library
 * has no CUDA backend or no GPU is visible. Needs the node-local rank, so it follows start_threads; the
 * collectives' stream and the host-staged transport follow it. */
static zs_status start_device(struct zs_ctx *ctx)
{
    zs_status st = zs_device_open(&ctx->dev, ctx->cfg.zs.device, "zeroshard.device", ctx->pool, ctx->kpath,
                                  ctx->local_rank, ctx->local_size);

    if (st)
        return st;
    ctx->host_dev = (struct zs_device){ .ops = &zs_device_cpu_ops, .kind = ZS_DEV_CPU, .host_access = true,
                                        .pool = ctx->pool, .kpath = ctx->kpath };
    st = device_limits(ctx);
    if (!st)
        st = zs_coll_open(&ctx->coll, ctx->comm, &ctx->dev);
    return st;
}

/* The CUDA calls' refusal on another device, naming the key. */
static zs_status need_cuda(const zs_ctx *ctx, const char *fn)
{
    if (ctx->dev.kind != ZS_DEV_CUDA || !ctx->dev.own_compute)
        return zs_fail(ZS_ERR_UNSUPPORTED, "%s: zeroshard.device is \"%s\", not \"cuda\"", fn, ctx->cfg.zs.device);
    return ZS_OK;
}

zs_status zs_cuda_stream(const zs_ctx *ctx, void **stream)
{
    if (stream)
        *stream = NULL;
    if (!ctx || !stream)
        return zs_fail(ZS_ERR_INVALID, "zs_cuda_stream: NULL %s", ctx ? "stream" : "context");
    if (need_cuda(ctx, "zs_cuda_stream"))
        return ZS_ERR_UNSUPPORTED;
    *stream = ctx->dev.compute;
    return ZS_OK;
}

zs_status zs_cuda_set_stream(zs_ctx *ctx, void *stream)
{
    struct zs_device *d;
    struct zs_dev_stream *to;
    zs_status st;

    if (!ctx)
        return zs_fail(ZS_ERR_INVALID, "zs_cuda_set_stream: NULL context");
    if ((st = need_cuda(ctx, "zs_cuda_set_stream")))
        return st;
    d = &ctx->dev;
    to = stream ? (struct zs_dev_stream *)stream : d->own_compute;
    if (to == d->compute)
        return ZS_OK;
    /* the engine's work queued so far (a step's kernels, a wait on a gather) comes before the new stream's */
    if (!d->switch_ev && (st = d->ops->event_create(d, &d->switch_ev)))
        return st;
    if ((st = d->ops->event_record(d, d->switch_ev, d->compute)) || (st = d->ops->stream_wait(d, to, d->switch_ev)))
        return st;
    d->compute = to;
    return ZS_OK;
}

zs_status zs_cuda_device(const zs_ctx *ctx, int32_t *ordinal)
{
    zs_status st;

    if (!ctx || !ordinal)
        return zs_fail(ZS_ERR_INVALID, "zs_cuda_device: NULL %s", ctx ? "ordinal" : "context");
    *ordinal = -1;
    if ((st = need_cuda(ctx, "zs_cuda_device")))
        return st;
    *ordinal = ctx->dev.ordinal;
    return ZS_OK;
}

zs_status zs_cuda_synchronize(zs_ctx *ctx)
{
    struct zs_device *d;
    zs_status st;

    if (!ctx)
        return zs_fail(ZS_ERR_INVALID, "zs_cuda_synchronize: NULL context");
    if ((st = need_cuda(ctx, "zs_cuda_synchronize")))
        return st;
    d = &ctx->dev;
    if (!d->sync_ev && (st = d->ops->event_create(d, &d->sync_ev)))
        return st;
    if ((st = d->ops->event_record(d, d->sync_ev, d->compute)))
        return st;
    return zs_coll_host_wait(&ctx->coll, d->sync_ev, "zs_cuda_synchronize (the compute stream)");
}

/* Collective over the parent. */
static zs_status start_comm(struct zs_ctx *ctx)
{
    struct zs_comm_opts co;
    zs_status st = zs_comm_opts_for(ctx, &co);

    return st ? st : zs_comm_init(&ctx->comm, ctx->parent, &co);
}

zs_status zs_init(zs_ctx **out, const zs_init_opts *o)
{
    struct zs_ctx *ctx;
    zs_status st;

    if (!out || !o)
        return zs_fail(ZS_ERR_INVALID, "zs_init: NULL argument");
    *out = NULL;
    ctx = calloc(1, sizeof(*ctx));
    if (!ctx)
        return zs_fail(ZS_ERR_NOMEM, "zs_init: out of memory");
    ctx->place.numa = -1;
    ctx->mem_snapshot = zs_mem_snapshot;
    pthread_mutex_init(&ctx->mem_lock, NULL);
    st = start_mpi(ctx, o);
    if (st) {
        pthread_mutex_destroy(&ctx->mem_lock);
        free(ctx);
        return st;
    }
    ctx->quiet = o->quiet != 0;
    st = load_config(ctx, o);
    if (!st)
        st = choose_kernel(ctx);
    if (!st)
        st = zs_fetch_open(ctx);
    st = agree_on_config(ctx, st);
    if (!st)
        st = start_comm(ctx);
    if (!st)
        zs_hybrid_flat(ctx);
    if (!st)
        st = start_threads(ctx);
    if (!st)
        st = zs_agree(ctx, start_device(ctx));
    if (!st)
        st = zs_agree(ctx, zs_hybrid_start(ctx));
    if (!st)
        st = zs_agree(ctx, zs_dev_place(ctx));
    if (!st)
        st = zs_dev_nccl_open(ctx);
    if (!st)
        st = zs_agree(ctx, zs_quant_path_open(ctx));
    if (st) {
        zs_finalize(ctx);
        return st;
    }
    zs_scaler_init(ctx);
    ctx->stats.clip_coef = 1.0;
    if (ctx->rank == 0 && !ctx->quiet) {
        zs_log("stage %d, world %d, micro-batch %lld, gradient accumulation %lld, train batch %lld, optimizer %s lr %g",
               ctx->cfg.zero.stage, ctx->world, (long long)ctx->cfg.micro_batch_size,
               (long long)ctx->cfg.grad_accum_steps, (long long)ctx->cfg.train_batch_size,
               zs_optim_name(ctx->cfg.optim.type), ctx->cfg.optim.lr);
        zs_log("optimizer kernels: %s, %s per rank (%d ranks on this node)", zs_kpath_name(ctx->kpath),
               zs_pool_describe(ctx->pool), ctx->local_size);
        char layout[512];
        zs_hybrid_describe(ctx, layout, sizeof(layout));
        zs_log("collectives: %s; %s", zs_comm_describe(ctx->comm), layout);
        if (!ctx->dev.host_access)
            zs_log("device: %s, %s", ctx->dev.ops->name, ctx->place.desc);
        if (ctx->cfg.warning[0])
            zs_log("warning: %s", ctx->cfg.warning);
    }
    *out = ctx;
    return ZS_OK;
}

zs_status zs_finalize(zs_ctx *ctx)
{
    bool own;

    if (!ctx)
        return ZS_OK;
    own = ctx->own_mpi;
    zs_mem_watch_stop(ctx); /* first: it reads the context */
    zs_fetch_free_all(ctx);
    zs_exact_free(ctx);
    for (int32_t u = 0; u < ctx->nunits; u++) {
        struct zs_unit *un = &ctx->units[u];
        uint64_t pad = (uint64_t)un->part.padded * ctx->psz, sh = (uint64_t)un->part.shard * ctx->psz;
        uint64_t opt = (uint64_t)zs_plan_opt_elems(ctx->cfg.zero.stage, &un->part) * sizeof(float);
        if (un->reduce_req)
            zs_coll_wait(ctx->scoll, un->reduce_req);
        if (ctx->cfg.zero.stage == 0)
            zs_mem_free(ctx, ZS_MEM_PARAMS, un->full, pad);
        else
            zs_mem_free_comm(ctx, ZS_MEM_PARAMS, un->full, pad);
        if (!zs_offload_params_on_host(ctx))
            zs_mem_free(ctx, ZS_MEM_PARAMS, un->shard, sh);
        if (ctx->cfg.zero.stage <= 1)
            zs_mem_free_comm(ctx, ZS_MEM_GRADS, un->grad, pad);
        zs_mem_free(ctx, ZS_MEM_GRADS, un->grad_shard, (uint64_t)un->part.shard * ctx->csz);
        if (!zs_offload_optimizer_on_host(ctx)) { /* host-pool blocks go with the pool */
            zs_mem_free(ctx, ZS_MEM_MASTER, un->master, opt);
            zs_mem_free(ctx, ZS_MEM_OPTIM, un->m, opt);
            zs_mem_free(ctx, ZS_MEM_OPTIM, un->v, opt);
        }
        free(un->name);
    }
    for (int32_t p = 0; p < ctx->nparams; p++)
        free(ctx->params[p].name);
    zs_grads_free(ctx);
    free(ctx->params);
    free(ctx->groups);
    free(ctx->config_text);
    free(ctx->units);
    /* every stream that may still copy into the arena, the host pool or a staging area has finished before
     * any of them is freed: the collectives' (gathers, reductions, host-staged copies up) closes here, the
     * offload staging's in zs_offdev_free, the compute stream is synchronized */
    zs_hybrid_free(ctx);
    zs_coll_close(&ctx->coll);
    if (ctx->dev.ops && ctx->dev.compute)
        ctx->dev.ops->stream_sync(&ctx->dev, ctx->dev.compute);
    /* after a swap timeout the kernel may still write into the pool's slots: leaking it on this fatal
     * path is the safe choice, freeing it could let a late I/O land in reused memory */
    zs_offdev_free(ctx);
    zs_dev_arena_close(&ctx->dev_arena);
    if (!zs_nvme_optim_close(ctx->nvme, ctx->rank, ctx->quiet)) {
        zs_offload_unpin(ctx);
        zs_host_pool_free(ctx->host);
    }
    zs_device_close(&ctx->dev);
    zs_pool_free(ctx->pool);
    zs_quant_path_close(ctx);
    zs_comm_free(ctx->comm);
    zs_mem_sample_close(ctx);
    pthread_mutex_destroy(&ctx->mem_lock);
    free(ctx);
    if (own) {
        int fin = 0;
        MPI_Finalized(&fin);
        if (!fin)
            MPI_Finalize();
    }
    return ZS_OK;
}

/* ---------------------------------------------------------------- registration */

zs_status zs_unit_add(zs_ctx *ctx, const char *name, int32_t *unit)
{
    struct zs_unit *un;

    if (!ctx || !name || !unit)
        return zs_fail(ZS_ERR_INVALID, "zs_unit_add: NULL argument");
    if (ctx->set_up)
        return zs_fail(ZS_ERR_INVALID, "zs_unit_add: unit '%s' added after zs_setup", name);
    if (ctx->nunits == ctx->cap_units) {
        int32_t cap = ctx->cap_units ? ctx->cap_units * 2 : 16;
        void *p = realloc(ctx->units, (size_t)cap * sizeof(*ctx->units));
        if (!p)
            return zs_fail(ZS_ERR_NOMEM, "zs_unit_add: out of memory");
        ctx->units = p;
        ctx->cap_units = cap;
    }
    un = &ctx->units[ctx->nunits];
    memset(un, 0, sizeof(*un));
    un->name = strdup(name);
    if (!un->name)
        return zs_fail(ZS_ERR_NOMEM, "zs_unit_add: out of memory");
    un->first_param = ctx->nparams;
    un->ready_micro = -1;
    *unit = ctx->nunits++;
    return ZS_OK;
}

static zs_status param_add(zs_ctx *ctx, int32_t unit, const char *name, int64_t numel, const float *init,
                           zs_init_fn fn, void *arg, int32_t *param)
{
    struct zs_unit *un;
    struct zs_param_rec *pr;

    if (!ctx || !name || !param)
        return zs_fail(ZS_ERR_INVALID, "zs_param_add: NULL argument");
    if (ctx->set_up)
        return zs_fail(ZS_ERR_INVALID, "zs_param_add: parameter '%s' added after zs_setup", name);
    if (unit < 0 || unit >= ctx->nunits)
        return zs_fail(ZS_ERR_INVALID, "zs_param_add: parameter '%s': no unit %d", name, unit);
    if (unit != ctx->nunits - 1)
        return zs_fail(ZS_ERR_INVALID, "zs_param_add: parameter '%s': units are filled in order; unit %d is closed",
                       name, unit);
    if (numel < 1)
        return zs_fail(ZS_ERR_INVALID, "zs_param_add: parameter '%s' has %lld elements (must be >= 1)", name,
                       (long long)numel);
    if (ctx->nparams == ctx->cap_params) {
        int32_t cap = ctx->cap_params ? ctx->cap_params * 2 : 32;
        void *p = realloc(ctx->params, (size_t)cap * sizeof(*ctx->params));
        if (!p)
            return zs_fail(ZS_ERR_NOMEM, "zs_param_add: out of memory");
        ctx->params = p;
        ctx->cap_params = cap;
    }
    un = &ctx->units[unit];
    pr = &ctx->params[ctx->nparams];
    pr->name = strdup(name);
    if (!pr->name)
        return zs_fail(ZS_ERR_NOMEM, "zs_param_add: out of memory");
    pr->unit = unit;
    pr->numel = numel;
    pr->offset = zs_align_up(un->numel, ZS_PARAM_ALIGN);
    pr->init = init;
    pr->init_fn = fn;
    pr->init_arg = arg;
    pr->ndim = 0;
    pr->group = 0;
    pr->frozen = false;
    un->numel = pr->offset + numel;
    un->nparams++;
    *param = ctx->nparams++;
    return ZS_OK;
}

zs_status zs_param_shape(zs_ctx *ctx, int32_t param, int32_t ndim, const int64_t *dims)
{
    int64_t prod = 1;

    if (!ctx || (ndim > 0 && !dims))
        return zs_fail(ZS_ERR_INVALID, "zs_param_shape: NULL argument");
    if (ctx->set_up)
        return zs_fail(ZS_ERR_INVALID, "zs_param_shape: called after zs_setup");
    if (param < 0 || param >= ctx->nparams)
        return zs_fail(ZS_ERR_INVALID, "zs_param_shape: no parameter %d", param);
    struct zs_param_rec *pr = &ctx->params[param];
    if (ndim < 1 || ndim > 8)
        return zs_fail(ZS_ERR_INVALID, "zs_param_shape: parameter '%s': %d dimensions (1 to 8)", pr->name, ndim);
    for (int32_t i = 0; i < ndim; i++) {
        if (dims[i] < 1 || prod > INT64_MAX / dims[i])
            return zs_fail(ZS_ERR_INVALID, "zs_param_shape: parameter '%s': bad dimension %lld", pr->name,
                           (long long)dims[i]);
        prod *= dims[i];
    }
    if (prod != pr->numel)
        return zs_fail(ZS_ERR_INVALID, "zs_param_shape: parameter '%s': shape has %lld elements, the parameter %lld",
                       pr->name, (long long)prod, (long long)pr->numel);
    pr->ndim = ndim;
    memcpy(pr->shape, dims, (size_t)ndim * sizeof(int64_t));
    return ZS_OK;
}

zs_status zs_param_add(zs_ctx *ctx, int32_t unit, const char *name, int64_t numel, const float *init, int32_t *param)
{
    return param_add(ctx, unit, name, numel, init, NULL, NULL, param);
}

zs_status zs_param_add_init(zs_ctx *ctx, int32_t unit, const char *name, int64_t numel, zs_init_fn fn, void *arg,
                            int32_t *param)
{
    if (!fn)
        return zs_fail(ZS_ERR_INVALID, "zs_param_add_init: parameter '%s': NULL init function", name ? name : "?");
    return param_add(ctx, unit, name, numel, NULL, fn, arg, param);
}
