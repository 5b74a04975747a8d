/* plan.h - the memory plan: from the parsed config, the world size and the units' sizes, every buffer a rank
 * keeps (what it is, its category, its elements and bytes, where it lives) and the totals. Set-up allocates
 * from it, the device arena, the budget check and the host pool are sized from it, zs-estimate reports it. */
#ifndef ZS_PLAN_H
#define ZS_PLAN_H

#include <stdbool.h>
#include <stdint.h>

#include "config.h"    /* defines: struct zs_config, enum zs_offload_device */
#include "partition.h" /* defines: struct zs_partition */
#include "zeroshard.h"

/* PARAMS: working parameters (the param dtype); GRADS: gradients; MASTER: fp32 masters of 16-bit parameters;
 * OPTIM: optimizer moments; BUFFERS: the gradient bucket; SWAP: NVMe swap slots and read-ahead (in the
 * host pool); LIVE: gathered stage-3 units. */
enum zs_mem_cat {
    ZS_MEM_PARAMS, ZS_MEM_GRADS, ZS_MEM_MASTER, ZS_MEM_OPTIM, ZS_MEM_BUFFERS, ZS_MEM_SWAP, ZS_MEM_LIVE, ZS_MEM_NCAT
};
extern const char *const zs_mem_cat_names[ZS_MEM_NCAT]; /* "parameters", ... (messages, the arena's regions) */

/* Where a buffer lives: device memory; device memory other ranks read in the collectives (the node's shared
 * heap on the CPU); the pinned host pool (offloaded); the NVMe swap file (never allocated in memory). */
enum zs_home { ZS_HOME_DEV, ZS_HOME_COMM, ZS_HOME_HOST, ZS_HOME_NVME, ZS_HOME_N };

/* Which of a unit's pointers a buffer fills: the working parameters (whole, or the stage-3 shard), the
 * gradients (whole at stages 0-1, the reduced shard at 2-3), the fp32 masters, the moments m and v; ZeRO++
 * hpZ's secondary parameter shard (stage 3). */
enum zs_slot { ZS_SLOT_PARAMS, ZS_SLOT_GRAD, ZS_SLOT_MASTER, ZS_SLOT_M, ZS_SLOT_V, ZS_SLOT_SECONDARY };

struct zs_plan_buf {
    enum zs_slot slot;
    enum zs_mem_cat cat;
    enum zs_home home;
    int64_t elems;
    uint64_t bytes;
};

#define ZS_PLAN_UNIT_BUFS 6

/* One unit's buffers, in the order set-up allocates them. */
struct zs_plan_unit {
    struct zs_partition part;
    bool sharded; /* stage 3 above the persistence threshold: each rank keeps its shard, gathers the rest */
    int32_t nbufs;
    struct zs_plan_buf buf[ZS_PLAN_UNIT_BUFS];
};

/* The stage, and where the optimizer state and the stage-3 parameter shards go: what a config says
 * (zs_placement_of), or an alternative the budget check weighs. */
struct zs_placement {
    int stage;
    enum zs_offload_device opt, param;
    bool device_apart; /* the host cannot read the device's memory in place (a GPU): its gradients stay on it */
};

/* Deterministic mode's bytes per (padded) element: three int32 counters, the top band and the agreed top
 * band (sharding/exact.c holds itself to this). */
#define ZS_EXACT_ELEM_BYTES 14

/* Shards are equal on every rank (partition.h), so one plan holds for all of them. Fill it with
 * zs_plan_init, zs_plan_add per unit, then zs_plan_finish; every figure is bytes per rank unless named. */
struct zs_plan {
    /* inputs, from the config and the placement */
    struct zs_placement pl;
    int32_t world, nunits;        /* world: the ranks a unit is sharded over (the shard group's, when hybrid) */
    uint64_t psz, csz;            /* bytes of a parameter element, and of a reduced gradient element */
    int arrays;                   /* fp32 state arrays the optimizer keeps per element */
    bool master;                  /* 16-bit parameters keep fp32 masters */
    bool exact;                   /* deterministic mode */
    /* ZeRO-Infinity's gradient offload: at stages 2-3 with the optimizer on NVMe, on a device the host reads in
     * place, without hybrid sharding or deterministic mode, the reduced gradient shard of each unit goes to the
     * swap file beside its optimizer state (sharding/grads.c) instead of staying in memory */
    bool grads_nvme;
    int64_t persist, bucket_cap, max_live;
    uint64_t bucket_elem_bytes;   /* a bucket element: its staging, and its reduced part when that is wider */

    /* the units */
    uint64_t numel, numel_padded; /* real and padded elements of all units */
    uint64_t numel_trained;       /* real elements of the units that are not frozen */
    uint64_t largest;             /* the largest unit's padded elements */
    int32_t gathered;             /* stage 3: the sharded units, their padded elements, the largest of them */
    uint64_t gathered_padded, gathered_largest;
    uint64_t home[ZS_HOME_N];    /* the units' buffers by where they live */
    uint64_t host_pool;           /* the host buffers in whole pages, as the pool hands them out */

    /* the rest, after zs_plan_finish */
    int64_t bucket_elems;         /* stages 2-3: the gradient bucket's capacity */
    uint64_t bucket_bytes;        /* its bytes, with each unit's 64-byte alignment slack */
    uint64_t live_bytes;          /* stage 3: the gathered cap (max_live_parameters, at least the largest unit) */
    uint64_t exact_bytes;         /* deterministic mode: whole gradient buffers (stages 2-3) and the counters */
    uint64_t nccl_stage_bytes;    /* device "cuda", several ranks, device_comm not "staged", flat sharding: the NCCL
                                   * transport's staging buffer (comm/comm_nccl.c), made once whatever the collective's
                                   * size (hybrid sharding makes none: runtime/devio.c) */
    uint64_t cat[ZS_MEM_NCAT];    /* what set-up allocates, by category (nothing on NVMe, nothing gathered) */
    int32_t replicas;             /* shard groups holding the same shards (1: flat sharding) */
    /* ZeRO++ hpZ (zero_optimization.zero_hpz_partition_size H, 1 < H < world): each sharded unit also keeps a
     * secondary shard of padded / H elements (in cat[ZS_MEM_PARAMS], device memory); 0: off */
    int32_t hpz;
    uint64_t hpz_bytes;           /* the secondary shards' bytes */
};

/* Elements a rank steps of a unit (its masters and optimizer state): the whole unit at stage 0, its shard
 * otherwise. */
static inline int64_t zs_plan_opt_elems(int stage, const struct zs_partition *part)
{
    return stage == 0 ? part->padded : part->shard;
}

/* The config's own placement: offloads apply from stage 1 (optimizer) and at stage 3 (parameters). */
struct zs_placement zs_placement_of(const struct zs_config *cfg);

/* world: the job's ranks; with zero_optimization.mics_shard_size the plan is the shard group's. hpZ is on when
 * zero_hpz_partition_size is above 1 and below the shard group's size (the caller refused one that does not
 * divide it: zs_hpz_size). */
void zs_plan_init(struct zs_plan *p, const struct zs_config *cfg, struct zs_placement pl, int32_t world);
/* One unit's buffers under p's inputs (nothing added up); a frozen unit keeps only its parameters. 0, or
 * -EINVAL when it cannot be partitioned. */
int zs_plan_unit(const struct zs_plan *p, int64_t numel, bool frozen, struct zs_plan_unit *out);
/* Adds a unit of `numel` elements; 0, or -EINVAL when it cannot be partitioned. */
int zs_plan_add(struct zs_plan *p, int64_t numel, bool frozen);
void zs_plan_finish(struct zs_plan *p);

/* Device bytes as the budget check weighs a placement: the units' device and comm-heap buffers, the bucket's
 * elements, the gathered cap and the NCCL staging buffer. */
uint64_t zs_plan_device_need(const struct zs_plan *p);

/* The hpZ group's size in effect for this config and shard group of g ranks: the key's value when it is above 1
 * and below g at stage 3, else 0 (off; equal to g, the secondary would be the primary). */
int32_t zs_hpz_size(const struct zs_config *cfg, int32_t g);

/* The hybrid and ZeRO++ keys as the engine reads them (mics -1: every rank; hpz 0 or 1: off). */
struct zs_layout_keys {
    int32_t stage;
    int64_t mics, hpz;
    bool quant_weights, quant_grads;
};
/* What the engine refuses of these keys at `world` ranks, before any group opens: ZS_OK, or the status with the
 * reason (naming the key) in why. The one rule for the engine (runtime/hybrid.c), its memory estimate
 * (runtime/memory.c) and the step-time model (tools/zs_time_model.c). */
zs_status zs_layout_check(const struct zs_layout_keys *k, int32_t world, char *why, size_t len);

#endif /* ZS_PLAN_H */
