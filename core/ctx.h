/* ctx.h - the context behind zs_ctx: the units and parameters, the device, the communicators and the
 * accounting every layer above core/ shares. Internal: nothing here is exported. */
#ifndef ZS_CTX_H
#define ZS_CTX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <mpi.h>

#include "base/dtype.h"       /* defines: zs_at, zs_dtype_bytes */
#include "comm/coll.h"        /* defines: struct zs_coll, zs_coll_* */
#include "comm/comm.h"        /* defines: struct zs_comm, zs_comm_* */
#include "config.h"           /* defines: struct zs_config */
#include "device/arena.h"     /* defines: struct zs_dev_arena */
#include "device/device.h"    /* defines: struct zs_device */
#include "kernels/optim.h"    /* defines: enum zs_kpath, enum zs_kopt */
#include "kernels/threads.h"  /* defines: struct zs_pool */
#include "memory.h"           /* defines: enum zs_mem_cat */
#include "partition.h"        /* defines: struct zs_partition */
#include "zeroshard.h"

enum zs_gather_state { ZS_GATHER_NONE, ZS_GATHER_PENDING, ZS_GATHER_READY };
enum zs_grad_state { ZS_GRAD_IDLE, ZS_GRAD_OPEN, ZS_GRAD_REDUCING };

#define ZS_EXACT_SQ_BANDS 22 /* deterministic mode: 32-bit bands of the norm's exact sum of squares */

struct zs_param_rec {
    char *name;
    int32_t unit;
    int64_t numel, offset; /* offset inside the unit's flat buffer */
    const float *init;     /* borrowed until zs_setup */
    zs_init_fn init_fn;    /* or this, called for the elements a rank stores */
    void *init_arg;
    int32_t ndim;          /* 0: [numel] */
    int64_t shape[8];
};

struct zs_unit {
    char *name;
    int32_t first_param, nparams;
    int64_t numel;               /* last parameter's end, alignment gaps included */
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
    void *grad_shard;            /* stages 2-3: persistent accumulator for this rank's shard (cdt) */
    void *reduced;               /* stages 2-3: where the reduce-scatter puts this rank's part */
    enum zs_grad_state grad_state;
    struct zs_coll_req *reduce_req;
    int64_t ready_micro;         /* micro-step of the last zs_grad_ready, -1 before any */
    int64_t accumulated;         /* micro-batches folded into grad_shard this window */
    float *master;               /* 16-bit params: fp32 masters (whole at stage 0, shard otherwise), unless
                                  * they live in the NVMe swap file */
    float *m, *v;                /* optimizer state (whole at stage 0, shard otherwise) */
    /* deterministic mode (sharding/exact.c): the unit's counters start at ctx->xacc + xoff * 3, its
     * elements' top bands at ctx->xtop + xoff */
    int64_t xoff, xdeposits;     /* element offset; micro-shards deposited this window */
    bool xbad;                   /* some deposited value was Inf or NaN */
    bool xfailed;                /* its reduce-scatter ended with an error on every rank (ctx->xerr) */
    int32_t xphase;              /* at the boundary: which of the sum's collectives is in flight (exact.c): */
    MPI_Request xreq;            /* the vote or the all-gather, */
    struct zs_comm_req *xsumq;   /* or the sums' reduce-scatter */
};

/* ZeRO-Offload from a device the host cannot read in place (offload/offload_dev.c): pinned host staging of
 * two parameter slots, then every unit's gradients (grad_at: offsets after the slots); a copy stream down and
 * one up, so that the CPU steps one unit while the next comes down and the previous goes up. */
struct zs_offdev {
    void *buf;
    bool pinned;                     /* the device took buf's pin (else it stays pageable) */
    size_t bytes, slot;
    size_t *grad_at;
    bool *grad_down;                 /* this window's gradients of the unit are queued down */
    struct zs_dev_stream *down, *up;
    struct zs_dev_event *ev_grad, *ev_up[2], *ev_done;
    int32_t k;                       /* optimizer state on NVMe: slices stepped this step (slot k % 2) */
    zs_status st;                    /* and the first failure among them */
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
    struct zs_offdev off;            /* offloaded optimizer from such a device (offload/offload_dev.c) */
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
    uint64_t numel, numel_padded;

    /* Gradient bucket (stages 2-3): a bump arena of staging buffers, reset when all its reductions end. */
    char *arena;
    int64_t arena_cap, arena_used;   /* bytes; restarts only at deterministic points (full, step) */
    int32_t *pending;            /* units with a reduction in flight, in launch order */
    int32_t npending;

    /* Stage 3 fetch trace: the unit order of one accumulation window, used to prefetch and to decide
     * which released units are worth keeping. */
    int32_t *trace, *rec;        /* the previous window's order, and the one being recorded */
    int64_t trace_len, trace_cap, trace_pos, rec_len, rec_cap;
    bool trace_valid, trace_broken;

    int64_t micro_step, global_step;
    float pre_scale, post_scale;
    zs_step_stats stats;
    double t_reduce, t_optim, t_gather; /* wall_clock_breakdown, seconds since last print */
    double t_fetch, swap_mark;          /* fetch time since the last step; NVMe wait total at the last step */

    uint64_t mem[ZS_MEM_NCAT];
    uint64_t peak_live;
    uint64_t mem_host;               /* of mem[], the bytes living in the host pool (offloaded) */
    uint64_t device_budget;          /* 0: none; else device (non-host) bytes a rank may hold */
    bool over_budget;                /* the last failed allocation hit the budget or the arena (message set) */
    struct zs_host_pool *host;       /* offloaded optimizer state / stage-3 parameter shards */
    struct zs_nvme_optim *nvme;      /* optimizer state on NVMe (offload_optimizer.device nvme) */
    int32_t *xacc;                   /* deterministic mode: exact gradient counters, 3 per element, in xsum's
                                      * heap (the sums' reduce-scatter reads local peers' in place) */
    int8_t *xtop;                    /* each element's top band this window, -1 before any nonzero value */
    int8_t *xvote;                   /* the agreed top bands, every element (units vote while others sum) */
    int64_t xnumel;                  /* elements of xacc, xtop and xvote (the padded model) */
    MPI_Comm xcomm[2];               /* the tops' votes, stage 0's all-gathers */
    int32_t nxcomm;                  /* of xcomm, duplicated so far */
    struct zs_comm *xsum;            /* the sums' reduce-scatters (int64, zero-copy inside a node) */
    uint64_t xsq[ZS_EXACT_SQ_BANDS]; /* the norm's exact counters, this rank's shards so far */
    bool xanybad;                    /* some unit's agreed sum is not finite */
    uint64_t xorder;                 /* a hash of this window's zs_grad_ready order (units' sums start in it) */
    char xerr[640];                  /* the first sum of this window that every rank ended with an error */
};

#endif /* ZS_CTX_H */
