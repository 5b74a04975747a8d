/* offload.c - where offloaded state lives (the pinned host pool) and the device memory budget that makes
 * the CPU backend behave like a GPU of a given size: set-up checks the whole stage against it and names
 * the stage and offload settings that would fit; gathers at run time are admitted against it too. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"
#include "core/ctx.h"
#include "core/host_pool.h"
#include "core/memory.h"
#include "core/units.h"
#include "nvme_optim.h"
#include "offload.h"

struct placement {
    int stage;
    bool opt_host, param_host; /* offloaded, to the host pool or (nvme) to disk */
    bool nvme;
};

/* Device bytes one rank needs for a placement (the plan's, as the budget weighs them): persistent model
 * states, the gradient bucket, and at stage 3 the gathered units. Offloaded to the host pool or to NVMe,
 * state is off the device alike. */
static uint64_t device_need(const struct zs_ctx *ctx, struct placement pl)
{
    enum zs_offload_device off = pl.nvme ? ZS_OFFLOAD_NVME : ZS_OFFLOAD_CPU;
    struct zs_placement zp = { pl.stage, pl.opt_host ? off : ZS_OFFLOAD_NONE, pl.param_host ? off : ZS_OFFLOAD_NONE,
                               !ctx->dev.host_access };
    struct zs_plan p;

    zs_plan_init(&p, &ctx->cfg, zp, ctx->world);
    for (int32_t u = 0; u < ctx->nunits; u++)
        zs_plan_add(&p, ctx->units[u].numel, ctx->units[u].frozen); /* partitioned by set-up: cannot fail */
    zs_plan_finish(&p);
    return zs_plan_device_need(&p);
}

static const char *describe(struct placement pl, char *buf, size_t len)
{
    const char *dev = pl.nvme ? "nvme" : "cpu";

    snprintf(buf, len, "stage %d%s%s%s%s", pl.stage, pl.opt_host ? " with offload_optimizer " : "",
             pl.opt_host ? dev : "", pl.param_host ? (pl.opt_host ? " and offload_param " : " with offload_param ") : "",
             pl.param_host ? dev : "");
    return buf;
}

/* The budget: ZS_DEVICE_MEMORY (bytes, or with a K/M/G suffix) wins over zeroshard.device_memory. */
static zs_status read_budget(struct zs_ctx *ctx)
{
    const char *env = getenv("ZS_DEVICE_MEMORY");
    char *end;

    ctx->device_budget = (uint64_t)ctx->cfg.zs.device_memory;
    if (!env || !*env)
        return ZS_OK;
    double v = strtod(env, &end);
    uint64_t mult = 1;
    if (*end == 'K' || *end == 'k')
        mult = 1ull << 10, end++;
    else if (*end == 'M' || *end == 'm')
        mult = 1ull << 20, end++;
    else if (*end == 'G' || *end == 'g')
        mult = 1ull << 30, end++;
    if (*end || v < 0)
        return zs_fail(ZS_ERR_CONFIG, "ZS_DEVICE_MEMORY: expected bytes with an optional K, M or G, got '%s'", env);
    ctx->device_budget = (uint64_t)(v * (double)mult);
    return ZS_OK;
}

/* On the CPU backend "device" and pinned host memory are the same RAM: only NVMe takes state out of it. */
static uint64_t ram_need(const struct zs_ctx *ctx, struct placement pl)
{
    if (!pl.nvme)
        pl.opt_host = pl.param_host = false;
    return device_need(ctx, pl);
}

/* Without a budget, a placement that cannot fit this node's RAM fails at start, naming one that would,
 * rather than running into the kernel's OOM killer mid-setup. */
static zs_status check_ram(struct zs_ctx *ctx, struct placement now)
{
    static const struct placement options[] = {
        { 1, false, false, false }, { 2, false, false, false }, { 3, false, false, false },
        { 1, true, false, true },   { 2, true, false, true },   { 3, true, false, true },  { 3, true, true, true },
    };
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    uint64_t ram = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0, share, need = ram_need(ctx, now);
    char a[96], b[96], h1[32], h2[32], h3[32], h4[32];
    int32_t local = ctx->local_size > 0 ? ctx->local_size : 1;

    share = ram / (uint64_t)local;
    if (!ram || need <= share)
        return ZS_OK;
    for (size_t i = 0; i < sizeof(options) / sizeof(options[0]); i++) {
        uint64_t n = ram_need(ctx, options[i]);
        if (n > share)
            continue;
        return zs_fail(ZS_ERR_NOMEM, "out of memory: %s needs %s per rank, but this node's %s of RAM gives each of "
                       "its %d ranks %s; %s would need %s", describe(now, a, sizeof(a)), zs_mem_human(need, h1, sizeof(h1)),
                       zs_mem_human(ram, h2, sizeof(h2)), local, zs_mem_human(share, h3, sizeof(h3)),
                       describe(options[i], b, sizeof(b)), zs_mem_human(n, h4, sizeof(h4)));
    }
    return zs_fail(ZS_ERR_NOMEM, "out of memory: %s needs %s per rank, but this node's %s of RAM gives each of its "
                   "%d ranks %s, and even stage 3 with both offloads on NVMe needs %s with this config's buffers (lower "
                   "stage3_max_live_parameters and reduce_bucket_size, or add ranks or nodes)",
                   describe(now, a, sizeof(a)), zs_mem_human(need, h1, sizeof(h1)), zs_mem_human(ram, h2, sizeof(h2)), local,
                   zs_mem_human(share, h3, sizeof(h3)), zs_mem_human(ram_need(ctx, options[6]), h4, sizeof(h4)));
}

static zs_status check_budget(struct zs_ctx *ctx)
{
    const struct zs_zero_config *z = &ctx->cfg.zero;
    struct placement now = { z->stage, zs_offload_optimizer_on_host(ctx) || zs_offload_optimizer_on_nvme(ctx),
                             zs_offload_params_on_host(ctx) || zs_offload_params_on_nvme(ctx),
                             zs_offload_optimizer_on_nvme(ctx) };
    static const struct placement options[] = {
        { 1, false, false, false }, { 2, false, false, false }, { 3, false, false, false }, { 1, true, false, false },
        { 2, true, false, false },  { 3, true, false, false },  { 3, true, true, false },
    };
    uint64_t need = device_need(ctx, now);
    char a[96], b[96], h1[32], h2[32], h3[32];

    if (!ctx->device_budget)
        return check_ram(ctx, now);
    if (need <= ctx->device_budget)
        return ZS_OK;
    for (size_t i = 0; i < sizeof(options) / sizeof(options[0]); i++) {
        uint64_t n = device_need(ctx, options[i]);
        if (n <= ctx->device_budget)
            return zs_fail(ZS_ERR_NOMEM, "out of device memory: %s needs %s per rank, the budget is %s; %s would need %s",
                           describe(now, a, sizeof(a)), zs_mem_human(need, h1, sizeof(h1)),
                           zs_mem_human(ctx->device_budget, h2, sizeof(h2)), describe(options[i], b, sizeof(b)),
                           zs_mem_human(n, h3, sizeof(h3)));
    }
    return zs_fail(ZS_ERR_NOMEM,
                   "out of device memory: %s needs %s per rank, the budget is %s, and even stage 3 with both offloads "
                   "needs %s (lower stage3_max_live_parameters or reduce_bucket_size, or add ranks)",
                   describe(now, a, sizeof(a)), zs_mem_human(need, h1, sizeof(h1)), zs_mem_human(ctx->device_budget, h2, sizeof(h2)),
                   zs_mem_human(device_need(ctx, options[6]), h3, sizeof(h3)));
}

static void log_pool(const struct zs_ctx *ctx)
{
    if (ctx->rank == 0 && !ctx->quiet)
        zs_log("offload: host pool per rank %s (%s%s)", zs_host_pool_describe(ctx->host),
               ctx->nvme ? "NVMe swap slots" : zs_offload_optimizer_on_host(ctx) ? "optimizer state" : "",
               zs_offload_params_on_host(ctx) ? ", parameter shards"
               : zs_offload_params_on_nvme(ctx) ? ", parameter read-ahead buffers" : "");
}

zs_status zs_offload_setup(struct zs_ctx *ctx)
{
    uint64_t bytes;
    size_t slots = 0;
    char warn[256];
    bool pin;
    zs_status st = read_budget(ctx);
    int rc;

    if (!st)
        st = check_budget(ctx);
    if (!st && zs_offload_optimizer_on_nvme(ctx))
        st = zs_nvme_optim_plan(ctx, &ctx->nvme, &slots);
    if (st)
        return st;
    bytes = ctx->plan.host_pool + (uint64_t)slots; /* offloaded optimizer state and parameter shards */
    if (!bytes)
        return ZS_OK;
    pin = (zs_offload_optimizer_on_host(ctx) || zs_offload_optimizer_on_nvme(ctx)) ?
              ctx->cfg.zero.offload_optimizer.pin_memory : ctx->cfg.zero.offload_param.pin_memory;
    /* on a device the host cannot read in place the device pins the pool (zs_offload_pin), not mlock */
    rc = zs_host_pool_create(&ctx->host, bytes, pin && ctx->dev.host_access, ctx->place.numa, warn, sizeof(warn));
    if (rc)
        return zs_fail(ZS_ERR_NOMEM, "offload: cannot allocate the %.1f MiB host pool", (double)bytes / (1 << 20));
    if (warn[0] && !ctx->quiet)
        zs_log("rank %d: warning: %s", ctx->rank, warn);
    if (ctx->dev.host_access)
        log_pool(ctx);
    if (ctx->nvme) {
        char *buf = zs_mem_alloc_host(ctx, ZS_MEM_SWAP, (uint64_t)slots);
        st = buf ? zs_nvme_optim_open(ctx, ctx->nvme, buf)
                 : zs_fail(ZS_ERR_NOMEM, "offload: the host pool has no room for the swap slots");
        if (st)
            return st;
        if (!ctx->quiet)
            zs_log("rank %d: optimizer state on NVMe: %s", ctx->rank, zs_nvme_optim_describe(ctx->nvme));
    }
    return ZS_OK;
}

/* Asynchronous copies between a GPU and pageable memory go through the driver's own bounce buffers; pinned,
 * they are DMA at full PCIe speed. The whole pool is registered, whatever pin_memory says: every byte of it
 * crosses to the device (masters' updates, offloaded parameter shards). */
void zs_offload_pin(struct zs_ctx *ctx)
{
    struct zs_device *d = &ctx->dev;

    if (!ctx->host || d->host_access)
        return;
    ctx->pool_pinned = !d->ops->host_register(d, zs_host_pool_base(ctx->host), (size_t)zs_host_pool_size(ctx->host));
    zs_host_pool_set_device_pinned(ctx->host, ctx->pool_pinned);
    if (!ctx->pool_pinned && !ctx->quiet)
        zs_log("rank %d: warning: the host pool stays pageable (copies to the device are slower): %s", ctx->rank,
               zs_last_error());
    log_pool(ctx);
}

void zs_offload_unpin(struct zs_ctx *ctx)
{
    if (ctx->pool_pinned)
        ctx->dev.ops->host_unregister(&ctx->dev, zs_host_pool_base(ctx->host));
    ctx->pool_pinned = false;
}
