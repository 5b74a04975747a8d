/* engine.h - the context behind zs_ctx, shared by runtime/ (life cycle, step) and sharding/ (fetch,
 * gradients, buckets). Internal: nothing here is exported. */
#ifndef ZS_ENGINE_H
#define ZS_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "arena.h"     /* defines: struct zs_dev_arena */
#include "comm.h"      /* defines: struct zs_comm, zs_comm_* */
#include "comm_staged.h" /* defines: struct zs_staged */
#include "config.h"    /* defines: struct zs_config */
#include "device.h"    /* defines: struct zs_device, zs_device_open */
#include "optim.h"     /* defines: zs_optim_fn, enum zs_kpath */
#include "partition.h" /* defines: struct zs_partition */
#include "plan.h"      /* defines: struct zs_plan, enum zs_mem_cat */
#include "threads.h"   /* defines: struct zs_pool */
#include "zeroshard.h"
#include "flight.h"    /* defines: zs_flight_call */

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
    struct zs_dev_stream *comm_stream;  /* the collectives' stream (devio.c) */
    struct zs_dev_event *ev_compute;  /* compute -> communication */
    struct zs_coll_req *req_free, *req_all; /* devio.c's collective requests: recycled, and all of them */
    struct zs_staged staged;         /* collectives on device buffers (when !dev.host_access) */
    struct zs_nccl *nccl;            /* or NCCL's (ordered mode), when every rank has a GPU of its own */
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
    struct zs_plan plan;             /* what this rank allocates, and where (set-up fills it) */

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

/* "Adam", "AdamW", "SGD", "Lion", "Adagrad" (DeepSpeed's spelling of the config's optimizer type) */
const char *zs_optim_name(int type);

/* Element i of a buffer of esz-byte elements. */
static inline void *zs_at(void *base, int64_t i, size_t esz) { return (char *)base + (size_t)i * esz; }

/* FNV-1a, for the cross-rank agreement hashes (config, registration). */
#define ZS_FNV_SEED 0xcbf29ce484222325ULL
static inline uint64_t zs_fnv1a(uint64_t h, const void *data, size_t n)
{
    const unsigned char *p = data;

    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

/* Accounted allocation: every byte the runtime holds is counted in one category. 64-byte aligned,
 * zero-filled. */
void *zs_mem_alloc(struct zs_ctx *ctx, enum zs_mem_cat cat, uint64_t bytes);
void zs_mem_free(struct zs_ctx *ctx, enum zs_mem_cat cat, void *p, uint64_t bytes);
/* The same for buffers other ranks read during collectives (the shared heap with the shm backend).
 * Every rank must make the same calls in the same order. */
void *zs_mem_alloc_comm(struct zs_ctx *ctx, enum zs_mem_cat cat, uint64_t bytes);
void zs_mem_free_comm(struct zs_ctx *ctx, enum zs_mem_cat cat, void *p, uint64_t bytes);
/* The same on another communicator of the engine (deterministic mode's own, ctx->xsum). */
void *zs_mem_alloc_on(struct zs_ctx *ctx, struct zs_comm *comm, enum zs_mem_cat cat, uint64_t bytes);
void zs_mem_free_on(struct zs_ctx *ctx, struct zs_comm *comm, enum zs_mem_cat cat, void *p, uint64_t bytes);
/* The collective backend's options from the environment and the config (for every comm the engine opens). */
zs_status zs_comm_opts_for(const struct zs_ctx *ctx, struct zs_comm_opts *co);

/* Collective: every rank learns whether any rank failed; the first failure's message (prefixed
 * "rank R: ") becomes every rank's, so no rank walks on into a collective the others never reach. */
zs_status zs_agree(struct zs_ctx *ctx, zs_status local);

/* offload/offload.c: where offloaded state lives, and the device memory budget of the CPU backend */
zs_status zs_offload_setup(struct zs_ctx *ctx);     /* sizes and creates the host pool; checks the budget */
/* On a device the host cannot read in place, pins the host pool through the device (cudaHostRegister), near
 * the device's NUMA node where it is known; a refusal leaves it pageable with a warning, never an error, so
 * no rank fails where its peers go on into a collective. zs_offload_unpin undoes it before the pool goes. */
void zs_offload_pin(struct zs_ctx *ctx);
void zs_offload_unpin(struct zs_ctx *ctx);
void *zs_mem_alloc_host(struct zs_ctx *ctx, enum zs_mem_cat cat, uint64_t bytes);
bool zs_offload_optimizer_on_host(const struct zs_ctx *ctx);
bool zs_offload_params_on_host(const struct zs_ctx *ctx);
bool zs_offload_optimizer_on_nvme(const struct zs_ctx *ctx);
bool zs_offload_params_on_nvme(const struct zs_ctx *ctx);

/* Stage 3 shards a unit unless the persistence threshold keeps it whole on every rank. */
static inline bool zs_unit_is_sharded(const struct zs_ctx *ctx, const struct zs_unit *un)
{
    return ctx->cfg.zero.stage == 3 && un->numel >= ctx->cfg.zero.param_persistence_threshold;
}
/* Whether `bytes` more device memory fit the budget; on failure sets the error (names the budget). */
bool zs_budget_admit(struct zs_ctx *ctx, uint64_t bytes, const char *what);

/* sharding/fetch.c */
zs_status zs_fetch_acquire(struct zs_ctx *ctx, int32_t u, void **data);
zs_status zs_fetch_unref(struct zs_ctx *ctx, int32_t u);
zs_status zs_fetch_step_end(struct zs_ctx *ctx);  /* drops stale gathered copies, closes the trace window */
void zs_fetch_free_all(struct zs_ctx *ctx);

/* sharding/grads.c */
zs_status zs_grads_open(struct zs_ctx *ctx, int32_t u, void **grad);
zs_status zs_grads_submit(struct zs_ctx *ctx, int32_t u);
zs_status zs_grads_progress(struct zs_ctx *ctx);
zs_status zs_grads_flush(struct zs_ctx *ctx);      /* waits for every reduction in flight */
/* This rank's reduced gradient shard of unit u, ctx->gdt elements (valid after flush at a boundary). */
void *zs_grads_shard(struct zs_ctx *ctx, int32_t u);
zs_status zs_grads_zero(struct zs_ctx *ctx);       /* starts a new accumulation window */

/* sharding/exact.c: zeroshard.deterministic "world_size_invariant" */
zs_status zs_exact_setup(struct zs_ctx *ctx);       /* the counters, and full gradient buffers at stages 2-3 */
void zs_exact_free(struct zs_ctx *ctx);
zs_status zs_exact_deposit(struct zs_ctx *ctx, int32_t u); /* folds the unit's buffer in, zeroes it */
zs_status zs_exact_ready(struct zs_ctx *ctx, int32_t u);   /* checks every micro-shard was deposited */
zs_status zs_exact_launch(struct zs_ctx *ctx, int32_t u); /* at the boundary's zs_grad_ready: starts the sum */
zs_status zs_exact_progress(struct zs_ctx *ctx, bool all); /* advances the units' sums; all: to the end */
zs_status zs_exact_reduce(struct zs_ctx *ctx, double *sumsq); /* at the step, after all: the norm */
void zs_exact_zero(struct zs_ctx *ctx);

/* runtime/devio.c: host <-> device copies, complete on return (dst_dev / src_dev: which side is device
 * memory; host to host is a memmove); the collectives on device buffers, comm.h's where the host reaches the
 * device's memory, NCCL or the host-staged transport otherwise. Each returns a request (*req NULL: already
 * complete); zs_coll_wait makes the result the compute stream's (on a device, without blocking the host),
 * zs_coll_test says whether it has landed. */
struct zs_coll_req;
zs_status zs_dev_copy(struct zs_ctx *ctx, void *dst, bool dst_dev, const void *src, bool src_dev, size_t bytes);
zs_status zs_dev_streams_open(struct zs_ctx *ctx);
void zs_dev_streams_close(struct zs_ctx *ctx);
zs_status zs_dev_nccl_open(struct zs_ctx *ctx); /* collective: NCCL when every rank has its own GPU */
zs_status zs_coll_reduce_scatter(struct zs_ctx *ctx, const void *buf, zs_dtype dt_in, void *out, zs_dtype dt_out,
                                 int64_t count, float scale, struct zs_coll_req **req);
zs_status zs_coll_all_gather(struct zs_ctx *ctx, void *buf, zs_dtype dt, int64_t count, struct zs_coll_req **req);
zs_status zs_coll_all_reduce(struct zs_ctx *ctx, void *buf, zs_dtype dt, int64_t count, float scale,
                             struct zs_coll_req **req);
zs_status zs_coll_wait(struct zs_ctx *ctx, struct zs_coll_req *req);
zs_status zs_coll_test(struct zs_ctx *ctx, struct zs_coll_req *req, bool *done);
/* offload/offload_dev.c: the offloaded optimizer's staging when the device is not the host's */
zs_status zs_offdev_setup(struct zs_ctx *ctx);
void zs_offdev_free(struct zs_ctx *ctx);
zs_status zs_offdev_grads_final(struct zs_ctx *ctx, int32_t u); /* unit u's gradients down, on the copy stream */
void zs_offdev_window_end(struct zs_ctx *ctx);
void *zs_offdev_grads(struct zs_ctx *ctx, int32_t u);           /* where they land on the host */
void *zs_offdev_slot(struct zs_ctx *ctx, int32_t k);            /* parameter slot k % 2 */
/* Whether unit u's working parameters (the shard, at stage 3 with offload_param cpu) are host memory. */
static inline bool zs_params_on_host(const struct zs_ctx *ctx, const struct zs_unit *un)
{
    return ctx->dev.host_access || (un->sharded && zs_offload_params_on_host(ctx));
}
/* Whether the optimizer's fp32 arrays (masters, moments) are host memory. */
static inline bool zs_optstate_on_host(const struct zs_ctx *ctx)
{
    return ctx->dev.host_access || zs_offload_optimizer_on_host(ctx);
}

/* runtime/devplace.c: on a device with a PCI bus id, moves the rank's threads to the cores nearest it and
 * records its NUMA node for the host pool (ctx->place); warnings, never errors, where that cannot be done.
 * Collective over the node. */
zs_status zs_dev_place(struct zs_ctx *ctx);

/* runtime/memory.c */
void zs_memory_log(const struct zs_ctx *ctx); /* rank 0's report line at start (unless quiet) */

/* runtime/engine.c: waits for a nonblocking MPI collective under the watchdog's deadline */
zs_status zs_vote_wait(struct zs_ctx *ctx, MPI_Request *r, const char *what);
double zs_wait_limit_s(const struct zs_ctx *ctx); /* how long zs_vote_wait and the like may wait */

/* runtime/step.c */
zs_status zs_step_boundary(struct zs_ctx *ctx);
/* Marks the context unusable (a step or a load failed part-way): zs_step and zs_checkpoint_save refuse,
 * naming why (printf-style). */
void zs_ctx_break(struct zs_ctx *ctx, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void zs_scaler_init(struct zs_ctx *ctx); /* the loss scale fp16's config starts with (1 otherwise) */

/* The fp32 parameters the optimizer updates for unit u on this rank (the working parameters in fp32,
 * the masters with 16-bit ones; NULL when those live in the swap file), and how many elements. */
float *zs_unit_master(struct zs_ctx *ctx, int32_t u, int64_t *n);
/* The working parameters (ctx->pdt) of the same elements. */
void *zs_unit_working(struct zs_ctx *ctx, int32_t u);

/* The next collective's label (what it is for, which unit, this micro-step): compared across ranks
 * before its data moves, so ranks that drifted apart fail naming both operations. */
static inline void zs_label(struct zs_ctx *ctx, enum zs_comm_purpose what, int32_t unit)
{
    zs_comm_set_step(ctx->comm, ctx->micro_step);
    zs_comm_label_next(ctx->comm, what, unit);
}

/* An engine call, for the flight recorder. */
static inline void zs_note(struct zs_ctx *ctx, const char *call, int32_t unit)
{
    zs_flight_call(zs_comm_flight(ctx->comm), call, unit, ctx->micro_step);
}

#endif /* ZS_ENGINE_H */
