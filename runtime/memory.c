/* memory.c - what a rank holds, by category, next to what the ZeRO formulas predict (REFERENCE: with
 * Adam, 2+2+12 bytes a parameter for 16-bit training, 4+4+8 for fp32; stage 1 shards the optimizer
 * state, stage 2 the gradients too, stage 3 the parameters too), and the same figures predicted before
 * launching (zs_estimate_memory, the zs-estimate tool). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "kernels/optim.h" /* defines: zs_dtype_name */
#include "core/ctx.h"
#include "core/host_pool.h"
#include "core/memory.h"
#include "comm/comm_nccl.h" /* defines: zs_nccl_stage_bytes */
#include "offload/nvme_optim.h"
#include "sharding/sharding.h"
#include "runtime.h"

/* The formulas, per category, for psi parameters (of them `trained` not frozen) at n ranks; with hpZ over h ranks
 * (stage 3) ZeRO++'s secondary copy adds p x psi / h to the parameters. */
static void expect(const struct zs_config *cfg, uint64_t psi, uint64_t trained, uint64_t n, uint64_t h,
                   zs_memory_report *out)
{
    uint64_t p = zs_dtype_bytes(cfg->param_dtype), c = zs_dtype_bytes(cfg->comm_dtype);
    uint64_t k = zs_config_state_bytes(cfg);
    int stage = cfg->zero.stage;

    out->expect_params = stage == 3 ? p * psi / n + (h > 1 ? p * psi / h : 0) : p * psi;
    out->expect_grads = stage <= 1 ? p * trained : c * trained / n;
    out->expect_optimizer = stage == 0 ? k * trained : k * trained / n;
    out->formula = out->expect_params + out->expect_grads + out->expect_optimizer;
}

zs_status zs_memory(const zs_ctx *ctx, zs_memory_report *out)
{
    if (!ctx || !out)
        return zs_fail(ZS_ERR_INVALID, "zs_memory: NULL argument");
    memset(out, 0, sizeof(*out));
    out->rank = ctx->rank;
    out->world = ctx->world;
    out->stage = ctx->cfg.zero.stage;
    out->dtype = ctx->pdt;
    out->params = ctx->mem[ZS_MEM_PARAMS];
    out->grads = ctx->mem[ZS_MEM_GRADS];
    out->master = ctx->mem[ZS_MEM_MASTER];
    out->optimizer = ctx->mem[ZS_MEM_OPTIM] + ctx->mem[ZS_MEM_MASTER];
    out->comm_buffers = ctx->mem[ZS_MEM_BUFFERS] + zs_comm_scratch_bytes(ctx->comm) +
                        zs_exact_scratch_bytes(ctx);
    out->swap_buffers = ctx->mem[ZS_MEM_SWAP];
    out->buffers = out->comm_buffers + out->swap_buffers;
    out->live_params = ctx->mem[ZS_MEM_LIVE];
    out->peak_live_params = ctx->peak_live;
    out->prefetch_cap = ctx->plan.live_bytes;
    out->host = ctx->mem_host;
    out->pinned_pool = zs_host_pool_size(ctx->host);
    out->device_budget = ctx->device_budget;
    out->numel = ctx->numel;
    out->numel_padded = ctx->numel_padded;
    out->nvme = zs_nvme_optim_file_bytes(ctx->nvme);
    out->nccl_staging = ctx->coll.nccl ? zs_nccl_stage_bytes(ctx->world) : 0;
    out->shard_size = ctx->shard_size;
    out->hpz_size = ctx->hpz_size;
    out->hpz_secondary = ctx->plan.hpz_bytes;
    expect(&ctx->cfg, ctx->numel, ctx->plan.numel_trained, (uint64_t)ctx->shard_size, (uint64_t)ctx->hpz_size, out);
    return ZS_OK;
}

static const char *mib(uint64_t b, char *buf, size_t len)
{
    snprintf(buf, len, "%.2f MiB", (double)b / (double)(1 << 20));
    return buf;
}

static double ratio(uint64_t a, uint64_t b) { return b ? (double)a / (double)b : 0.0; }

/* "12.00 MiB", or with state on NVMe "0.02 MiB + 301.72 MiB on NVMe": what the ZeRO formula counts is
 * the sum, wherever it lives. */
static const char *placed(uint64_t ram, uint64_t disk, char *buf, size_t len)
{
    if (!disk)
        return mib(ram, buf, len);
    snprintf(buf, len, "%.2f MiB + %.2f MiB on NVMe", (double)ram / (double)(1 << 20),
             (double)disk / (double)(1 << 20));
    return buf;
}

void zs_memory_log(const struct zs_ctx *ctx)
{
    zs_memory_report r;
    char a[7][64];

    if (ctx->rank != 0 || ctx->quiet || zs_memory(ctx, &r))
        return;
    uint64_t dp = zs_nvme_optim_param_bytes(ctx->nvme, ctx->nunits), dopt = r.nvme - dp;
    char grp[160] = "";
    int gl;
    if (r.shard_size < r.world) /* hybrid: the formula's N is the shard group's size */
        gl = snprintf(grp, sizeof(grp), ", shard group of %d; ZeRO formula with N = %d", r.shard_size, r.shard_size);
    else
        gl = snprintf(grp, sizeof(grp), "; ZeRO formula");
    if (r.hpz_size && gl > 0 && (size_t)gl < sizeof(grp)) /* hpZ: its secondary copy is a term of params */
        snprintf(grp + gl, sizeof(grp) - (size_t)gl, " + hpZ's %s secondary copy over %d", mib(r.hpz_secondary,
                 a[0], 64), r.hpz_size);
    zs_log("memory per rank (rank 0, stage %d, %s, %d ranks%s and ratio "
           "in brackets): params %s [%s %.3f], grads %s [%s %.3f], optimizer %s (fp32 masters %s) [%s %.3f]",
           r.stage, zs_dtype_name(r.dtype), r.world, grp, placed(r.params, dp, a[0], 64), mib(r.expect_params, a[1], 64),
           ratio(r.params + dp, r.expect_params), mib(r.grads, a[2], 64), mib(r.expect_grads, a[3], 64),
           ratio(r.grads, r.expect_grads), placed(r.optimizer, dopt, a[4], 64), mib(r.master, a[5], 64),
           mib(r.expect_optimizer, a[6], 64), ratio(r.optimizer + dopt, r.expect_optimizer));
    zs_log("buffers per rank: communication %s, stage-3 gathered cap %s, pinned host pool %s (swap buffers %s), "
           "on NVMe %s%s%s", mib(r.comm_buffers, a[0], 64), mib(r.prefetch_cap, a[1], 64), mib(r.pinned_pool, a[2], 64),
           mib(r.swap_buffers, a[3], 64), mib(r.nvme, a[4], 64), r.nccl_staging ? ", NCCL staging " : "",
           r.nccl_staging ? mib(r.nccl_staging, a[5], 64) : "");
}

/* ---------------------------------------------------------------- the estimator */

/* The plan's totals, for units of these sizes under this config, before any rank starts. */
zs_status zs_estimate_memory(const char *config_json, int32_t world, int32_t nunits, const int64_t *unit_numel,
                             zs_memory_report *out)
{
    struct zs_config cfg;
    struct zs_plan p;
    char err[768];

    if (!config_json || !unit_numel || !out || world < 1 || nunits < 1)
        return zs_fail(ZS_ERR_INVALID, "zs_estimate_memory: bad argument");
    memset(&cfg, 0, sizeof(cfg));
    if (zs_config_parse(&cfg, config_json, "<config>", world, NULL, err, sizeof(err)))
        return zs_fail(ZS_ERR_CONFIG, "%s", err);
    struct zs_layout_keys k = {.stage = cfg.zero.stage, .mics = cfg.zero.mics_shard_size,
                               .hpz = cfg.zero.hpz_partition_size, .quant_weights = cfg.zero.quantized_weights,
                               .quant_grads = cfg.zero.quantized_gradients};
    zs_status st = zs_layout_check(&k, world, err, sizeof(err)); /* what the engine would refuse at zs_init */
    if (st)
        return zs_fail(st, "%s", err);
    zs_plan_init(&p, &cfg, zs_placement_of(&cfg), world);
    for (int32_t u = 0; u < nunits; u++)
        if (zs_plan_add(&p, unit_numel[u], false))
            return zs_fail(ZS_ERR_INVALID, "zs_estimate_memory: unit %d: bad size %lld", u, (long long)unit_numel[u]);
    zs_plan_finish(&p);
    memset(out, 0, sizeof(*out));
    out->world = world;
    out->stage = cfg.zero.stage;
    out->dtype = cfg.param_dtype;
    out->params = p.cat[ZS_MEM_PARAMS];
    out->grads = p.cat[ZS_MEM_GRADS];
    out->master = p.cat[ZS_MEM_MASTER];
    out->optimizer = p.cat[ZS_MEM_MASTER] + p.cat[ZS_MEM_OPTIM];
    out->comm_buffers = out->buffers = p.cat[ZS_MEM_BUFFERS];
    out->prefetch_cap = p.live_bytes;
    out->host = out->pinned_pool = p.host_pool;
    out->nvme = p.home[ZS_HOME_NVME];
    out->nccl_staging = p.nccl_stage_bytes;
    out->numel = p.numel;
    out->numel_padded = p.numel_padded;
    out->shard_size = p.world;
    out->hpz_size = p.hpz;
    out->hpz_secondary = p.hpz_bytes;
    expect(&cfg, p.numel, p.numel, (uint64_t)p.world, (uint64_t)p.hpz, out);
    return ZS_OK;
}
