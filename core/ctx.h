/* ctx.h - the context behind zs_ctx: the units and parameters, the device, the communicators and the
 * accounting every layer above core/ shares. Internal: nothing here is exported. */
#ifndef ZS_CTX_H
#define ZS_CTX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <mpi.h>
#include <pthread.h>

#include "zeroshard.h"
#include "base/dtype.h"       /* defines: zs_at, zs_dtype_bytes */
#include "kernels/optim.h"    /* defines: enum zs_kpath, enum zs_kopt */
#include "kernels/threads.h"  /* defines: struct zs_pool */
#include "device/arena.h"     /* defines: struct zs_dev_arena */
#include "device/device.h"    /* defines: struct zs_device */
#include "comm/coll.h"        /* defines: struct zs_coll, zs_coll_* */
#include "comm/comm.h"        /* defines: struct zs_comm, zs_comm_* */
#include "config.h"           /* defines: struct zs_config */
#include "memory.h"           /* defines: enum zs_mem_cat */
#include "partition.h"        /* defines: struct zs_partition */
#include "plan.h"             /* defines: struct zs_plan, zs_plan_opt_elems */

enum zs_gather_state { ZS_GATHER_NONE, ZS_GATHER_PENDING, ZS_GATHER_READY };
enum zs_grad_state { ZS_GRAD_IDLE, ZS_GRAD_OPEN, ZS_GRAD_REDUCING };

struct zs_param_rec {
    char *name;
    int32_t unit;
    int64_t numel, offset; /* offset inside the unit's flat buffer */
    const float *init;     /* borrowed until zs_setup */
    zs_init_fn init_fn;    /* or this, called for the elements a rank stores */
    void *init_arg;
    int32_t ndim;          /* 0: [numel] */
    int64_t shape[8];
    int32_t group;         /* its parameter group (0: the config's optimizer.params) */
    bool frozen;           /* no gradient, no optimizer state, never updated */
};

/* A parameter group: the fields in opts.set are its own, the rest the config's (runtime/groups.c). */
struct zs_group {
    zs_group_opts opts;
    double lr_used;              /* the lr the last optimizer step used (after the schedule) */
    bool stepped;                /* lr_used is set */
};

struct zs_unit {
    char *name;
    int32_t first_param, nparams;
    int64_t numel;               /* last parameter's end, alignment gaps included */
    bool frozen;                 /* every parameter frozen: no gradients, no optimizer state, never stepped */
    struct zs_partition part;
    bool sharded;                /* stage 3 and not kept whole by the persistence threshold */
    /* Parameter and gradient buffers hold ctx->pdt elements (grad_shard: ctx->cdt); zs_at() indexes. */
    void *full;                  /* whole parameters: persistent unless sharded */
    void *shard;                 /* sharded: this rank's persistent shard */
    void *gathered;              /* sharded: the gathered unit while live */
    enum zs_gather_state gather;
    struct zs_coll_req *gather_req;
    bool prefetched;             /* gathered ahead of its fetch, not yet fetched */
    int32_t fetched;             /* program references (fetch minus release) */
    void *grad;                  /* stages 0-1: persistent full gradients; 2-3: bucket staging */
    void *grad_shard;            /* stages 2-3: persistent accumulator for this rank's shard (cdt); NULL where the
                                  * plan streams it to the NVMe swap file (grads_nvme) */
    void *reduced;               /* stages 2-3: where the reduce-scatter puts this rank's part */
    enum zs_grad_state grad_state;
    struct zs_coll_req *reduce_req;
    int64_t ready_micro;         /* micro-step of the last zs_grad_ready, -1 before any */
    int64_t accumulated;         /* micro-batches folded into grad_shard this window */
    double grad_sumsq;           /* grads_nvme: the squares of the shard as last written in the window's last
                                  * micro-batch, for the norm (the step does not read it back for that) */
    int64_t grad_sumsq_at;       /* the fold (accumulated) they are of; 0: none */
    float *master;               /* 16-bit params: fp32 masters (whole at stage 0, shard otherwise), unless
                                  * they live in the NVMe swap file */
    float *m, *v;                /* optimizer state (whole at stage 0, shard otherwise) */
    /* ZeRO++ hpZ (sharding/fetch.c): this rank's slice of the gathered unit for the secondary group of hpz_size
     * ranks, padded / hpz_size elements, taken from the first full gather after each parameter change */
    void *secondary;
    bool secondary_valid;        /* holds the current parameters: later fetches gather it inside the group */
    bool secondary_fill;         /* the gather in flight is a full one whose landing fills the secondary */
    bool from_secondary;         /* the gather in flight runs over the secondary group (ctx->hcoll) */
};

/* DeepSpeed's DynamicLossScaler state (fp16 with loss_scale 0); a static scale otherwise. */
struct zs_scaler {
    double scale;
    int64_t cur_hysteresis, last_overflow_iter, cur_iter;
    bool dynamic;
};

/* Where the rank sits relative to its GPU (engine.c: place_near_device): the NUMA node nearest it (-1: not
 * known, the host pool then goes near the rank's cores as on the CPU), for the start-up line. */
struct zs_place {
    int32_t numa;
    char desc[256];
};

struct zs_ctx {
    struct zs_config cfg;
    char *config_text;               /* the config as given (for checkpoint manifests) */
    struct zs_comm *comm;
    MPI_Comm parent;                 /* the program's communicator (not owned) */
    int32_t rank, world;
    int32_t local_rank, local_size;  /* among the ranks sharing this node */
    struct zs_pool *pool;            /* the optimizer's threads, bound to this rank's cores */
    struct zs_device dev;            /* where model states live and the optimizer runs */
    struct zs_device host_dev;       /* the CPU, for the optimizer offloaded from a device the host cannot reach */
    struct zs_place place;           /* the threads and the host pool near the device's PCI link */
    struct zs_coll coll;             /* the collectives on dev's buffers, whichever transport */
    bool pool_pinned;                /* the device pinned the host pool (offload.c: zs_offload_pin) */
    struct zs_dev_arena dev_arena;   /* the device's memory, where the host cannot read it in place */
    enum zs_kpath kpath;
    enum zs_kopt kopt;               /* the config's optimizer as the kernels name it */
    zs_dtype pdt, cdt, gdt;          /* parameters; reduced gradients; what the optimizer reads (pdt or cdt) */
    size_t psz, csz;                 /* their element sizes */
    struct zs_scaler scaler;
    int64_t skipped_steps;           /* boundaries skipped for overflow (global_step counts them too) */
    bool own_mpi, quiet, set_up, broken;
    char broken_why[640];            /* when broken: what left the state inconsistent (for step and save) */

    struct zs_param_rec *params;
    int32_t nparams, cap_params;
    struct zs_unit *units;
    int32_t nunits, cap_units;
    struct zs_group *groups;         /* [0] the config's optimizer.params, then zs_group_add's (NULL: only [0]) */
    int32_t ngroups;                 /* groups' entries (0 until the first zs_group_add or zs_group_set) */
    uint64_t numel, numel_padded;
    struct zs_plan plan;             /* what this rank allocates, and where (set-up fills it) */

    int64_t micro_step, global_step;
    /* The accumulation window: micro-batches already stepped in it (0 at a boundary), and whether
     * zs_window_end made the current micro-batch its last. micro_step counts every micro-batch ever seen, so
     * after a short window it is no longer a multiple of gradient_accumulation_steps: zs_window_last decides. */
    int64_t window_micro;
    bool window_end;
    /* Updates since the optimizer's moments started (Adam's step count less one) and since the learning-rate
     * schedule started: global_step less skipped steps, unless a load kept one of them (zs_ckpt_opts). */
    int64_t optim_steps, sched_steps;
    char ckpt_tag[256];              /* the tag the last checkpoint save or load used */
    float pre_scale, post_scale;
    zs_step_stats stats;
    double t_reduce, t_optim, t_gather; /* wall_clock_breakdown, seconds since last print */
    double t_fetch, swap_mark;          /* fetch time since the last step; NVMe wait total at the last step */

    /* The accounted allocator's counters (core/memory.c). The engine's thread writes them under mem_lock and reads
     * them without it; the memory watcher's thread (runtime/memory.c) reads them under it. */
    pthread_mutex_t mem_lock;
    uint64_t mem[ZS_MEM_NCAT];
    uint64_t peak_live;
    uint64_t mem_host;               /* of mem[], the bytes living in the host pool (offloaded) */
    uint64_t mem_shared;             /* of mem[], the bytes in the node's shared heap */
    uint64_t mem_scratch;            /* the comms' scratch and global_step at the last sample, for the watcher */
    int64_t mem_step;
    /* The memory report at the highest RSS sampled (under mem_lock): by the engine's thread at each engine call
     * (zs_mem_sample), and every millisecond by the watcher. */
    int statm;                       /* /proc/self/statm's fd + 1 (0: not open yet, -1: none) */
    uint64_t peak_rss_seen;
    zs_memory_report peak_report;
    zs_status (*mem_snapshot)(const struct zs_ctx *, zs_memory_report *); /* set by zs_init */
    struct zs_mem_watch *watch;      /* runtime/memory.c's thread, from zs_setup to zs_finalize (NULL: none) */
    uint64_t device_budget;          /* 0: none; else device (non-host) bytes a rank may hold */
    bool over_budget;                /* the last failed allocation hit the budget or the arena (message set) */
    struct zs_host_pool *host;       /* offloaded optimizer state / stage-3 parameter shards */

    /* The state of the folders above, each defined (and owned) by the folder named. */
    struct zs_nvme_optim *nvme;      /* optimizer state on NVMe (offload/nvme_optim.h), or NULL */
    struct zs_offdev *off;           /* offloaded optimizer from such a device (offload/offdev.h), or NULL */
    struct zs_bucket *bucket;        /* the gradient reductions in flight and their staging (sharding/bucket.h) */
    struct zs_fetch *fetch;          /* stage 3's fetch trace (sharding/fetch.c) */
    struct zs_exact *exact;          /* deterministic mode's exact sums (sharding/exact_state.h), or NULL */

    /* Hybrid sharding (zero_optimization.mics_shard_size, runtime/hybrid.c): units are sharded over a group of
     * shard_size consecutive ranks (group `replica` = rank / shard_size, shard_rank = rank % shard_size) and
     * replicated over the nreplicas groups. Flat: shard_rank = rank, shard_size = world, scoll = &coll. */
    int32_t shard_rank, shard_size, replica, nreplicas;
    struct zs_coll *scoll;           /* the shards' collectives (reduce-scatter, gathers): &gcoll or &coll */
    struct zs_comm *scomm;           /* its comm */
    struct zs_comm *gcomm, *rcomm;   /* hybrid: the shard group's and the replicas' (same index in group) */
    struct zs_coll gcoll, rcoll;     /* hybrid: the collectives over them, on dev's buffers */
    MPI_Comm rmpi;                   /* hybrid: the replicas' MPI communicator (deterministic mode's int64 sum) */
    int32_t gfake, rfake;            /* ZS_FAKE_NODE_SIZE as the group's and the replicas' comms see it (0: real) */
    struct zs_qcomm *qcomm;          /* ZeRO++'s quantized collectives (sharding/quant_path.c), or NULL */
    void *qstage;                    /* on a device the host cannot read: their host stage (grown on demand) */
    size_t qstage_cap;
    /* ZeRO++ hpZ (zero_optimization.zero_hpz_partition_size, runtime/hybrid.c): a secondary copy of every
     * stage-3 unit sharded over hpz_size consecutive ranks (hpz_rank = rank % hpz_size) inside the shard group;
     * hpz_size 0: off. */
    int32_t hpz_size, hpz_rank, hfake;
    struct zs_comm *hcomm;           /* the secondary group's comm, and its collectives on dev's buffers */
    struct zs_coll hcoll;
};

/* Whether the current micro-batch (the one between the last zs_step and the next) ends its accumulation
 * window: the configured gradient_accumulation_steps ran, or the program ended it early (zs_window_end). */
static inline bool zs_window_last(const struct zs_ctx *ctx)
{
    return ctx->window_end || ctx->window_micro + 1 >= ctx->cfg.grad_accum_steps;
}

#endif /* ZS_CTX_H */
