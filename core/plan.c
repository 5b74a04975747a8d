/* plan.c - the memory plan's arithmetic: what each unit keeps at a stage and placement, and where; the
 * gradient bucket, the stage-3 gathered cap and deterministic mode's buffers; the totals. */
#include <errno.h>
#include <stdio.h> /* defines: snprintf */
#include <string.h>

#include "base/dtype.h" /* defines: zs_dtype_bytes */
#include "comm/comm_nccl.h" /* defines: zs_nccl_stage_bytes */
#include "plan.h"

const char *const zs_mem_cat_names[ZS_MEM_NCAT] = { "parameters", "gradients", "fp32 masters", "optimizer state",
                                                    "gradient bucket", "swap buffers", "gathered parameters" };

struct zs_placement zs_placement_of(const struct zs_config *cfg)
{
    int stage = cfg->zero.stage;

    return (struct zs_placement){ stage, stage >= 1 ? cfg->zero.offload_optimizer.device : ZS_OFFLOAD_NONE,
                                  stage == 3 ? cfg->zero.offload_param.device : ZS_OFFLOAD_NONE,
                                  !strcmp(cfg->zs.device, "cuda") };
}

void zs_plan_init(struct zs_plan *p, const struct zs_config *cfg, struct zs_placement pl, int32_t world)
{
    uint64_t c = zs_dtype_bytes(cfg->comm_dtype);

    memset(p, 0, sizeof(*p));
    p->pl = pl;
    p->world = zs_partition_group_size(cfg->zero.mics_shard_size, world);
    p->replicas = world / p->world;
    p->hpz = zs_hpz_size(cfg, p->world);
    p->psz = zs_dtype_bytes(cfg->param_dtype);
    p->csz = c;
    p->arrays = zs_config_state_arrays(cfg);
    p->master = cfg->param_dtype != ZS_DTYPE_FP32;
    p->exact = cfg->zs.deterministic;
    p->grads_nvme = pl.stage >= 2 && pl.opt == ZS_OFFLOAD_NVME && !pl.device_apart && p->replicas == 1 && !p->exact;
    p->persist = cfg->zero.param_persistence_threshold;
    p->bucket_cap = cfg->zero.reduce_bucket_size;
    p->max_live = cfg->zero.max_live_parameters;
    p->bucket_elem_bytes = p->psz + (cfg->comm_dtype != cfg->param_dtype ? c : 0);
    /* where NCCL may carry the collectives: "auto" takes it when the ranks have GPUs of their own; hybrid
     * sharding's collectives are never NCCL's (runtime/devio.c) */
    if (!strcmp(cfg->zs.device, "cuda") && world > 1 && strcmp(cfg->zs.device_comm, "staged") && p->replicas == 1)
        p->nccl_stage_bytes = zs_nccl_stage_bytes(world);
}

static void put(struct zs_plan_unit *u, enum zs_slot slot, enum zs_mem_cat cat, enum zs_home home, int64_t elems,
                uint64_t esz)
{
    u->buf[u->nbufs++] = (struct zs_plan_buf){ slot, cat, home, elems, (uint64_t)elems * esz };
}

static enum zs_home offload_home(enum zs_offload_device d, enum zs_home otherwise)
{
    return d == ZS_OFFLOAD_NVME ? ZS_HOME_NVME : d == ZS_OFFLOAD_CPU ? ZS_HOME_HOST : otherwise;
}

/* Adam keeps m and v; SGD a momentum buffer when it has momentum; Lion m; Adagrad the squared sum. With the
 * optimizer on NVMe they (and the fp32 masters of 16-bit parameters) live in the swap file, and so does a
 * stage-3 shard with offload_param nvme, in the training dtype (with fp32 the shard is its own master). */
int zs_plan_unit(const struct zs_plan *p, int64_t numel, bool frozen, struct zs_plan_unit *u)
{
    int stage = p->pl.stage;
    enum zs_home opt_home = offload_home(p->pl.opt, ZS_HOME_DEV);
    int64_t opt;

    memset(u, 0, sizeof(*u));
    if (zs_partition_init_hybrid(&u->part, numel, p->world, p->replicas))
        return -EINVAL;
    opt = zs_plan_opt_elems(stage, &u->part);
    u->sharded = stage == 3 && numel >= p->persist;
    if (u->sharded && p->pl.param == ZS_OFFLOAD_NVME)
        put(u, ZS_SLOT_PARAMS, ZS_MEM_PARAMS, ZS_HOME_NVME, u->part.shard, p->psz);
    else if (u->sharded)
        put(u, ZS_SLOT_PARAMS, ZS_MEM_PARAMS, offload_home(p->pl.param, ZS_HOME_DEV), u->part.shard, p->psz);
    else
        put(u, ZS_SLOT_PARAMS, ZS_MEM_PARAMS, stage == 0 ? ZS_HOME_DEV : ZS_HOME_COMM, u->part.padded, p->psz);
    if (u->sharded && p->hpz > 1) /* padded is world x shard, and hpz divides world */
        put(u, ZS_SLOT_SECONDARY, ZS_MEM_PARAMS, ZS_HOME_DEV, u->part.padded / p->hpz, p->psz);
    if (frozen) /* no gradients, no masters, no optimizer state */
        return 0;
    if (stage <= 1)
        put(u, ZS_SLOT_GRAD, ZS_MEM_GRADS, ZS_HOME_COMM, u->part.padded, p->psz);
    else if (p->grads_nvme)
        put(u, ZS_SLOT_GRAD, ZS_MEM_GRADS, ZS_HOME_NVME, u->part.shard, p->csz);
    else
        put(u, ZS_SLOT_GRAD, ZS_MEM_GRADS, ZS_HOME_DEV, u->part.shard, p->csz);
    if (p->master)
        put(u, ZS_SLOT_MASTER, ZS_MEM_MASTER, opt_home, opt, sizeof(float));
    if (p->arrays >= 1)
        put(u, ZS_SLOT_M, ZS_MEM_OPTIM, opt_home, opt, sizeof(float));
    if (p->arrays == 2)
        put(u, ZS_SLOT_V, ZS_MEM_OPTIM, opt_home, opt, sizeof(float));
    return 0;
}

static uint64_t page(uint64_t b) { return (b + 4095) / 4096 * 4096; }

int zs_plan_add(struct zs_plan *p, int64_t numel, bool frozen)
{
    struct zs_plan_unit u;
    uint64_t pad;

    if (zs_plan_unit(p, numel, frozen, &u))
        return -EINVAL;
    pad = (uint64_t)u.part.padded;
    p->nunits++;
    p->numel += (uint64_t)numel;
    p->numel_trained += frozen ? 0 : (uint64_t)numel;
    p->numel_padded += pad;
    p->largest = pad > p->largest ? pad : p->largest;
    if (u.sharded) {
        p->gathered++;
        p->gathered_padded += pad;
        p->gathered_largest = pad > p->gathered_largest ? pad : p->gathered_largest;
    }
    for (int32_t i = 0; i < u.nbufs; i++) {
        const struct zs_plan_buf *b = &u.buf[i];
        p->home[b->home] += b->bytes;
        if (b->home != ZS_HOME_NVME)
            p->cat[b->cat] += b->bytes;
        if (b->home == ZS_HOME_HOST)
            p->host_pool += page(b->bytes);
        if (b->slot == ZS_SLOT_SECONDARY)
            p->hpz_bytes += b->bytes;
    }
    if (p->exact && !frozen) /* stages 2-3: the program's whole buffer instead of a bucket slot (sharding/exact.c) */
        p->exact_bytes += (p->pl.stage >= 2 ? p->psz * pad : 0) + ZS_EXACT_ELEM_BYTES * pad;
    return 0;
}

/* The bucket holds the reduce_bucket_size elements (at most the model, at least its largest unit); each
 * unit's staging in it starts on a 64-byte boundary (grads.c): up to 63 bytes of slack per unit. Gathered
 * units are held under stage3_max_live_parameters, at least the largest unit (fetch.c). */
void zs_plan_finish(struct zs_plan *p)
{
    int64_t cap = p->bucket_cap;

    if (p->pl.stage >= 2) {
        cap = cap > (int64_t)p->numel_padded ? (int64_t)p->numel_padded : cap;
        p->bucket_elems = cap < (int64_t)p->largest ? (int64_t)p->largest : cap;
        p->bucket_bytes = p->bucket_elem_bytes * (uint64_t)p->bucket_elems + 64 * (uint64_t)p->nunits;
    }
    if (p->pl.stage == 3) {
        uint64_t live = (uint64_t)p->max_live;
        live = live > p->numel_padded ? p->numel_padded : live;
        p->live_bytes = p->psz * (live < p->largest ? p->largest : live);
    }
    if (p->exact) /* deterministic mode sums without a bucket */
        p->cat[ZS_MEM_GRADS] += p->exact_bytes;
    else
        p->cat[ZS_MEM_BUFFERS] += p->bucket_bytes;
}

/* The bucket counted by its elements, and deterministic mode's buffers not at all: the budget check has
 * always weighed a placement so, and its verdicts and the figures it prints stay as they were. */
uint64_t zs_plan_device_need(const struct zs_plan *p)
{
    return p->home[ZS_HOME_DEV] + p->home[ZS_HOME_COMM] + p->bucket_elem_bytes * (uint64_t)p->bucket_elems +
           p->live_bytes + p->nccl_stage_bytes;
}

int32_t zs_hpz_size(const struct zs_config *cfg, int32_t g)
{
    int64_t h = cfg->zero.hpz_partition_size;

    return cfg->zero.stage == 3 && h > 1 && h < g ? (int32_t)h : 0;
}

zs_status zs_layout_check(const struct zs_layout_keys *k, int32_t world, char *why, size_t len)
{
    int64_t g = k->mics, h = k->hpz;
    int32_t group = g > 0 && g < world ? (int32_t)g : world;
    const char *q = k->quant_weights ? "zero_quantized_weights" : "zero_quantized_gradients";

    if (g > 0 && g != world && (g > world || world % g != 0)) {
        snprintf(why, len, "zero_optimization.mics_shard_size %lld does not divide the world size %d (shard groups "
                 "must be equal)", (long long)g, world);
        return ZS_ERR_CONFIG;
    }
    if (group < world && k->stage == 0) {
        snprintf(why, len, "zero_optimization.mics_shard_size %lld needs ZeRO stage 1, 2 or 3 (stage 0 shards "
                 "nothing)", (long long)g);
        return ZS_ERR_CONFIG;
    }
    if (k->stage == 3 && h > 1 && (h > group || group % h != 0)) { /* h equal to the group: off */
        snprintf(why, len, "zero_optimization.zero_hpz_partition_size %lld does not divide the shard group's size "
                 "%d (%s; the secondary groups must tile it)", (long long)h, group,
                 group < world ? "zero_optimization.mics_shard_size" : "the world size");
        return ZS_ERR_CONFIG;
    }
    if (k->quant_weights && k->stage != 3) {
        snprintf(why, len, "zero_optimization.zero_quantized_weights: quantizes stage 3's parameter gather; this is "
                 "stage %d", k->stage);
        return ZS_ERR_UNSUPPORTED;
    }
    if (k->quant_grads && k->stage < 2) {
        snprintf(why, len, "zero_optimization.zero_quantized_gradients: quantizes the gradients' reduce-scatter of "
                 "stages 2 and 3; this is stage %d", k->stage);
        return ZS_ERR_UNSUPPORTED;
    }
    if ((k->quant_weights || k->quant_grads) && group < world) {
        snprintf(why, len, "zero_optimization.%s: not implemented with hybrid sharding (zero_optimization."
                 "mics_shard_size %d): a shard group's collectives are not quantized", q, group);
        return ZS_ERR_UNSUPPORTED;
    }
    return ZS_OK;
}
