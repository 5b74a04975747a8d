/* zeroshard.h - public C API of ZeroShard, a ZeRO-style sharded optimizer runtime.
 *
 * A training program drives the runtime through these hooks, shaped like DeepSpeed's and FSDP's:
 *   zs_init -> zs_unit_add / zs_param_add ... -> zs_setup
 *   per micro-batch:  forward  zs_unit_fetch / zs_unit_release   (unit order)
 *                     backward zs_unit_fetch, zs_grad_get, zs_grad_ready, zs_unit_release (reverse order)
 *                     zs_step (steps the optimizer at each gradient-accumulation boundary)
 *   a short last window (an epoch's end): zs_window_end before that micro-batch's backward
 *   zs_finalize
 * Every call returns a zs_status; zs_last_error() gives a one-line message naming what was wrong
 * (config key path, parameter, rank). The library never exits the process.
 */
#ifndef ZEROSHARD_H
#define ZEROSHARD_H

#include <stddef.h>
#include <stdint.h>
#include <mpi.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The library is built with hidden visibility; everything declared here is its exported API. */
#if defined(__GNUC__)
#pragma GCC visibility push(default)
#endif

#define ZS_VERSION_MAJOR 0
#define ZS_VERSION_MINOR 1
#define ZS_VERSION_PATCH 0

typedef enum zs_status {
    ZS_OK = 0,
    ZS_ERR_INVALID = 1,   /* bad argument or call order */
    ZS_ERR_CONFIG = 2,    /* config could not be read, parsed or honoured */
    ZS_ERR_NOMEM = 3,     /* allocation failed */
    ZS_ERR_COMM = 4,      /* a collective failed */
    ZS_ERR_MISMATCH = 5,  /* ranks disagree (config or parameter registration) */
    ZS_ERR_IO = 6,        /* a file could not be read or written */
    ZS_ERR_UNSUPPORTED = 7, /* a feature this build or version does not implement */
} zs_status;

typedef enum zs_dtype {
    ZS_DTYPE_FP32 = 0,
    ZS_DTYPE_BF16 = 1,
    ZS_DTYPE_FP16 = 2,
} zs_dtype;

typedef struct zs_ctx zs_ctx;

/* Values a program can supply for keys its config sets to "auto" (as the Hugging Face trainer does).
 * Zero means "not supplied": the key then takes DeepSpeed's default, or is rejected by name when it has
 * none (optimizer lr, scheduler total_num_steps). */
typedef struct zs_auto_values {
    int64_t micro_batch_size;     /* train_micro_batch_size_per_gpu */
    int64_t grad_accum_steps;     /* gradient_accumulation_steps */
    double lr;                    /* optimizer.params.lr, scheduler warmup_max_lr */
    int64_t total_num_steps;      /* scheduler total_num_steps */
    int64_t warmup_num_steps;     /* scheduler warmup_num_steps */
    double gradient_clipping;     /* gradient_clipping */
    double beta1, beta2;          /* optimizer.params.betas */
    double eps;                   /* optimizer.params.eps */
    double weight_decay;          /* optimizer.params.weight_decay */
} zs_auto_values;

typedef struct zs_init_opts {
    const char *config_path;      /* a DeepSpeed-style JSON file, or */
    const char *config_json;      /* the JSON text itself (used when config_path is NULL) */
    MPI_Comm comm;                /* MPI_COMM_NULL (or zero-initialised) means MPI_COMM_WORLD */
    int use_comm;                 /* nonzero: use .comm; zero: MPI_COMM_WORLD */
    zs_auto_values auto_values;
    int quiet;                    /* nonzero: rank 0 prints no start-up lines */
} zs_init_opts;

/* Bytes a rank holds, by category. Persistent bytes are those alive across steps. */
typedef struct zs_memory_report {
    int32_t rank, world, stage;
    uint64_t params;        /* persistent parameter bytes (full or shard, by stage) */
    uint64_t grads;         /* persistent gradient bytes (full or shard, by stage) */
    uint64_t optimizer;     /* optimizer state bytes (moments, and the fp32 masters of 16-bit parameters) */
    uint64_t buffers;       /* communication and staging buffers sized by the config */
    uint64_t formula;       /* what the ZeRO formula predicts for params + grads + optimizer */
    uint64_t live_params;   /* gathered (stage 3) parameter bytes alive right now */
    uint64_t peak_live_params;
    uint64_t numel;         /* registered parameter elements (Psi) */
    uint64_t numel_padded;  /* elements after padding units to equal shards */
    uint64_t host;          /* of params/grads/optimizer, the bytes offloaded to the pinned host pool */
    uint64_t device_budget; /* the CPU backend's device memory limit per rank (0 = none) */
    uint64_t nvme;          /* bytes of model state in this rank's NVMe swap file (optimizer state; parameter
                             * shards with offload_param nvme; at stages 2-3 on the CPU the reduced gradient
                             * shards), not counted above */
    zs_dtype dtype;         /* the training dtype the figures are for */
    uint64_t master;        /* fp32 master weights of bf16/fp16 parameters (also in `optimizer`) */
    /* What the ZeRO formulas predict for each category at this stage, dtype and world size (16 bytes a
     * parameter with Adam: 2+2+12 with 16-bit parameters, 4+4+8 with fp32); their sum is `formula`. */
    uint64_t expect_params, expect_grads, expect_optimizer;
    /* Buffers, broken down (`buffers` is comm_buffers + swap_buffers) */
    uint64_t comm_buffers;  /* gradient bucket and collective scratch */
    uint64_t swap_buffers;  /* NVMe swap slots and parameter read-ahead (in the pinned pool) */
    uint64_t prefetch_cap;  /* stage 3: the most gathered-parameter bytes alive at once (live cap) */
    uint64_t pinned_pool;   /* the host pool's size (offloaded state and swap buffers live in it) */
    uint64_t nccl_staging;  /* the NCCL transport's staging buffer in GPU memory, fixed at set-up (not in
                             * buffers); the estimate counts it wherever NCCL may carry the collectives */
    int32_t shard_size;     /* ranks a shard is split over (zero_optimization.mics_shard_size; else the world):
                             * the N of the formulas above */
    int32_t hpz_size;       /* ZeRO++ hpZ's secondary group (zero_hpz_partition_size H; 0: off) */
    uint64_t hpz_secondary; /* of params, the secondary copy's bytes (padded / H elements a stage-3 unit); the
                             * formula's expect_params adds ZeRO++'s psz x Psi / H for it */
    /* Where the engine's bytes live, and what else the process holds: read from Linux (/proc/self/status) and
     * glibc (mallinfo2) at the call; 0 where unavailable, and 0 from zs_estimate_memory. The engine's bytes in
     * this process's memory (engine_rss) are params + grads + optimizer + live_params + comm_buffers +
     * swap_buffers + pool_free on the CPU device; with a GPU, its host pool, host staging and shared heap only.
     * rss = engine_rss + heap_other + heap_free + shared_peers + rss_file + lib_data + other. */
    uint64_t shared_heap;   /* of the engine's bytes, those in the node's shared heap (read in place by peers) */
    uint64_t pool_free;     /* the host pool's bytes not handed out (resident too: the pool is page-locked) */
    uint64_t engine_rss;    /* the engine's bytes in this process's RSS (the sum above) */
    uint64_t rss, peak_rss; /* the process's resident set now (VmRSS) and its high-water mark (VmHWM) */
    uint64_t rss_file;      /* of rss, mapped files: the program's, Python's, torch's and every library's code */
    uint64_t heap_in_use;   /* the C heap's bytes in use (malloc, posix_memalign; glibc's mallinfo2) */
    uint64_t heap_free;     /* the C heap's free bytes that malloc keeps mapped (freed, not given back) */
    uint64_t heap_other;    /* of heap_in_use, not the engine's: a front end's tensors (torch's activations, the
                             * gradients autograd makes before they are handed over, stand-ins, buffers), Python
                             * objects, MPI's buffers */
    uint64_t shared_peers;  /* shared memory mapped beyond the engine's own: the peers' blocks this rank reads in
                             * place (an all-gather's shards, a reduce-scatter's pieces), MPI's segments */
    uint64_t lib_data;      /* the libraries' zero-initialised data that is resident (.bss: cuBLAS's ~90 MiB,
                             * loaded with torch even on the CPU): read at zs_memory's and zs_memory_peak's call */
    int64_t other;          /* rss less all of the above: Python's objects (its own allocator's arenas), the
                             * threads' stacks */
    int64_t step;           /* the optimizer steps taken when the figures were read (zs_memory_peak: its moment) */
} zs_memory_report;

/* Predicts zs_memory's figures before launching: the config (JSON text) at `world` ranks for a model of
 * `nunits` units of unit_numel[i] elements each (a model of single-parameter units is fine: padding is
 * per unit). Categories are exact for the model states and the gradient bucket; collective scratch,
 * which depends on the backend, is not included. No MPI needed. */
zs_status zs_estimate_memory(const char *config_json, int32_t world, int32_t nunits, const int64_t *unit_numel,
                             zs_memory_report *out);

typedef struct zs_step_stats {
    int64_t global_step;    /* optimizer steps taken */
    int64_t micro_step;     /* micro-batches seen */
    int32_t stepped;        /* 1 when the last zs_step call ran the optimizer */
    int32_t skipped;        /* 1 when the last boundary skipped the update (overflow) */
    double lr;              /* learning rate used by the last optimizer step */
    double grad_norm;       /* global gradient norm before clipping (last step) */
    double clip_coef;       /* factor applied to gradients by clipping (1 = none) */
    double loss_scale;      /* current loss scale (1 without fp16) */
    /* Where this rank's time went in the last optimizer step (its micro-batches and the step itself), in
     * seconds; the rest of the step's wall time is the program's own compute. */
    double time_fetch;      /* in zs_unit_fetch: gathering parameters (stage 3), reading NVMe shards */
    double time_reduce;     /* at the step, waiting for gradient reductions still in flight */
    double time_optimizer;  /* the norm, clipping and the optimizer on this rank's shard */
    double time_gather;     /* making updated parameters visible (stages 1-2 all-gather) */
    double time_swap;       /* of the above, waiting for NVMe transfers */
    /* The accumulation window now (zs_stats reads them live, not as of the last step): */
    int64_t window_step;    /* micro-batches stepped in the current window (0 at a boundary) */
    int32_t window_end;     /* 1 when zs_window_end made the current micro-batch the window's last */
} zs_step_stats;

/* ---------------------------------------------------------------- lifetime */
zs_status zs_init(zs_ctx **ctx, const zs_init_opts *opts);
zs_status zs_finalize(zs_ctx *ctx);
const char *zs_last_error(void);   /* thread-local; valid until the next failing call */
const char *zs_status_str(zs_status s);

/* ---------------------------------------------------------------- registration (before zs_setup) */
zs_status zs_unit_add(zs_ctx *ctx, const char *name, int32_t *unit);
zs_status zs_param_add(zs_ctx *ctx, int32_t unit, const char *name, int64_t numel, const float *init,
                       int32_t *param);
/* Fills dst[0..count) with elements [first, first + count) of parameter `param`'s initial values. */
typedef void (*zs_init_fn)(void *arg, int32_t param, int64_t first, int64_t count, float *dst);
/* Like zs_param_add, but the initial values come from fn, called during zs_setup on every rank for just
 * the elements that rank stores (its shard at stage 3), so no rank ever holds the whole model. fn must
 * give every rank the same values (a counter-based generator, a file); nothing is broadcast. */
zs_status zs_param_add_init(zs_ctx *ctx, int32_t unit, const char *name, int64_t numel, zs_init_fn fn, void *arg,
                            int32_t *param);
/* Optional: the parameter's shape (row-major, product = numel), for checkpoints and safetensors export;
 * without it a parameter is one-dimensional. */
zs_status zs_param_shape(zs_ctx *ctx, int32_t param, int32_t ndim, const int64_t *dims);
/* Parameter groups (torch's param_groups): a group's optimizer hyper-parameters. A field is the group's own
 * when its bit is in `set`; otherwise it is the config's optimizer.params value (or its default). */
enum zs_group_field {
    ZS_GROUP_LR = 1u << 0,
    ZS_GROUP_WEIGHT_DECAY = 1u << 1,
    ZS_GROUP_BETAS = 1u << 2,      /* beta1 and beta2 (Adam, AdamW, Lion) */
    ZS_GROUP_EPS = 1u << 3,        /* Adam, AdamW, Adagrad */
    ZS_GROUP_MOMENTUM = 1u << 4,   /* SGD */
    ZS_GROUP_DAMPENING = 1u << 5,  /* SGD */
    ZS_GROUP_NESTEROV = 1u << 6,   /* SGD */
};
typedef struct zs_group_opts {
    uint32_t set;                  /* the zs_group_field bits given */
    double lr, weight_decay, beta1, beta2, eps, momentum, dampening;
    int32_t nesterov;
} zs_group_opts;
/* Before zs_setup. Group 0 always exists and holds the config's optimizer.params; every parameter starts in
 * it. Adds another group (ids count up from 1). */
zs_status zs_group_add(zs_ctx *ctx, const zs_group_opts *opts, int32_t *group);
/* Before zs_setup: moves a parameter into a group. */
zs_status zs_param_group(zs_ctx *ctx, int32_t param, int32_t group);
/* Before zs_setup: the parameter is frozen (requires_grad=False): partitioned and gathered like any other,
 * saved and exported, but it has no gradient buffer and no optimizer state, is never updated and is left
 * out of the gradient norm and of the memory formulas' gradient and optimizer terms. A unit holds either
 * frozen or trainable parameters; zs_setup refuses a unit mixing them, naming one of each (register them
 * as two units: the PyTorch front end does this for a block with both). */
zs_status zs_param_freeze(zs_ctx *ctx, int32_t param);
/* After zs_setup, at a step boundary (what a script or a torch scheduler writing param_groups does): the
 * group's fields in opts->set take these values from the next optimizer step on. With a config `scheduler`
 * the group's lr is the base the schedule scales: lr_g(t) = lr_g * sched(t) / optimizer.params.lr, as
 * torch's schedulers scale each group's initial lr. */
zs_status zs_group_set(zs_ctx *ctx, int32_t group, const zs_group_opts *opts);
/* The group's values; lr is what the last optimizer step used (after the schedule), or the base before the
 * first step. */
zs_status zs_group_get(const zs_ctx *ctx, int32_t group, zs_group_opts *out);
/* After zs_setup: the lr the group's next optimizer step will use (the config schedule's next value, scaled
 * as zs_group_set says). DeepSpeed's scheduler reports this as get_last_lr() after each step. */
zs_status zs_group_next_lr(const zs_ctx *ctx, int32_t group, double *lr);
int32_t zs_group_count(const zs_ctx *ctx);

/* Collective: checks every rank registered the same parameters, partitions, allocates, and
 * broadcasts rank 0's initial values. */
zs_status zs_setup(zs_ctx *ctx);

/* ---------------------------------------------------------------- checkpoints (collective) */
/* Writes the run's state (fp32 master parameters, optimizer state, step counters, config) as
 * dir/global_step<N>/: every rank writes its own shard file, rank 0 the manifest; everything goes to a
 * temporary directory, is fsynced and renamed into place, and dir/latest is updated last, so a crash at
 * any moment leaves the previous checkpoint loadable. */
zs_status zs_checkpoint_save(zs_ctx *ctx, const char *dir);
/* After zs_setup, at any step boundary (as zs_checkpoint_load_opts): loads dir/latest (or dir itself when it
 * is a tag directory) saved at any world size and stage; a directory without either is an error. Each rank
 * reads just the byte ranges of its own new shards. The registered units and parameters must match the
 * checkpoint's names and sizes. */
zs_status zs_checkpoint_load(zs_ctx *ctx, const char *dir);
/* What zs_checkpoint_save_opts and zs_checkpoint_load_opts take (zero-initialised: zs_checkpoint_save's and
 * zs_checkpoint_load's behaviour). */
typedef struct zs_ckpt_opts {
    const char *tag;           /* NULL: global_step<N> (save), dir/latest (load); else a safe file name: not
                                * empty, no '/' or control characters, not "." or "..", not "latest" or
                                * "save.lock", not ending in ".tmp" or ".old" (a save's own names), at most
                                * 200 bytes */
    int32_t no_latest;         /* save: leave dir/latest as it was (DeepSpeed's save_latest=False) */
    int32_t module_only;       /* load: parameters only; optimizer state, step counts and schedule stay the
                                * running engine's (DeepSpeed's load_module_only) */
    int32_t no_optimizer;      /* load: parameters, step counts and schedule; optimizer moments start at zero
                                * and the optimizer's own step count (Adam's bias correction) at 0 */
    int32_t no_scheduler;      /* load: the learning-rate schedule keeps the running engine's position */
    /* save: a file rank 0 writes into the tag directory before it is published (the front end's client
     * state), so it is saved atomically with the rest: its failure fails the save on every rank and leaves
     * `latest` as it was; load: read back with zs_checkpoint_extra. */
    const char *extra_name;    /* a safe file name (as tag; not manifest.json or rank<N>.bin), or NULL */
    const void *extra_data;
    size_t extra_bytes;
} zs_ckpt_opts;
/* Collective. zs_checkpoint_save with a tag, save_latest and an extra file. */
zs_status zs_checkpoint_save_opts(zs_ctx *ctx, const char *dir, const zs_ckpt_opts *opts);
/* Collective. At any step boundary (before training or between zs_step's boundary and the next micro-batch's
 * first zs_grad_buffer, with no unit fetched): loads dir/<tag> (dir/latest without a tag) with the flags
 * above; *loaded (may be NULL) is 1, or 0 when no tag was given and dir has no `latest` (nothing loaded,
 * ZS_OK: DeepSpeed returns (None, None) then). A missing tag directory is an error naming it; a load inside
 * an accumulation window is an error naming the micro-step. Stage 3's gathered and prefetched copies are
 * dropped and gradients zeroed, so the next fetch and step see the loaded state. */
zs_status zs_checkpoint_load_opts(zs_ctx *ctx, const char *dir, const zs_ckpt_opts *opts, int *loaded);
/* After a load: the extra file's bytes, from dir/<tag> (tag NULL: the tag this context last loaded or saved,
 * else dir/latest's). With buf NULL, *bytes receives its size (0 when the checkpoint has none); else up to
 * *bytes are copied and *bytes is the count copied. Not collective (each rank reads it). */
zs_status zs_checkpoint_extra(zs_ctx *ctx, const char *dir, const char *tag, const char *name, void *buf,
                              size_t *bytes);
/* The tag the last load or save used (empty before any). */
const char *zs_checkpoint_tag(const zs_ctx *ctx);

/* After zs_setup, before training: sets the parameters from a safetensors file (F32, F16 or BF16), each
 * rank reading just the elements it stores. Every registered parameter needs a tensor of its name and
 * shape, and every tensor a parameter (as PyTorch's strict load_state_dict); the optimizer state starts
 * fresh. */
zs_status zs_import_safetensors(zs_ctx *ctx, const char *path);

/* ---------------------------------------------------------------- forward / backward / step */
/* Makes the unit's full parameters visible; *data (may be NULL) receives the unit's flat buffer.
 * At stage 3 this gathers the unit and prefetches the next ones. */
zs_status zs_unit_fetch(zs_ctx *ctx, int32_t unit, void **data);
zs_status zs_unit_release(zs_ctx *ctx, int32_t unit);
/* Pointer to one parameter inside its fetched unit. */
zs_status zs_param_data(zs_ctx *ctx, int32_t param, void **data);
/* The unit's gradient buffer (unit layout, the parameters' dtype: zs_param_dtype). The program ADDS its
 * micro-batch gradient into it (with fp16, the gradient of the loss times zs_stats().loss_scale). */
zs_status zs_grad_buffer(zs_ctx *ctx, int32_t unit, void **grad);
/* The same for fp32 parameters, typed (an error with bf16/fp16 parameters). */
zs_status zs_grad_get(zs_ctx *ctx, int32_t unit, float **grad);
/* The unit's gradients for this micro-batch are complete: starts their (bucketed) reduction. */
zs_status zs_grad_ready(zs_ctx *ctx, int32_t unit);
/* zeroshard.deterministic "world_size_invariant": the buffer holds the gradient of one micro-shard
 * (zeroshard.micro_shard_size samples, the mean over them, as the normal mode's micro-batch mean); this
 * folds it into an exact sum and zeroes the buffer. Every micro-shard of the micro-batch is deposited
 * before zs_grad_ready. In the normal mode it does nothing (the buffer keeps summing). */
zs_status zs_grad_deposit(zs_ctx *ctx, int32_t unit);
/* Called once per micro-batch; at each accumulation boundary it clips, runs the optimizer on this
 * rank's shard and makes updated parameters visible again. A boundary is the window's
 * gradient_accumulation_steps-th micro-batch, or the one zs_window_end marked; the count restarts after it. */
zs_status zs_step(zs_ctx *ctx);
/* The current micro-batch ends the accumulation window (DeepSpeed's set_gradient_accumulation_boundary(True),
 * which Accelerate and the Trainer call at an epoch's last micro-batch): its zs_step is a boundary (reduce,
 * clip, optimizer step) although fewer than gradient_accumulation_steps micro-batches ran. The gradients are
 * still averaged over world x gradient_accumulation_steps, as DeepSpeed's are, so a window of k micro-batches
 * sums k of them divided by that. Call it on every rank in the same micro-batch, before its first
 * zs_grad_ready (after one, an error names the unit); calling it again, or in a window's natural last
 * micro-batch, changes nothing. Every stage, offload, overlap_comm, hybrid sharding and zeroshard.deterministic
 * take it. A checkpoint saved after such a step resumes as any other: the manifest keeps micro_step. */
zs_status zs_window_end(zs_ctx *ctx);

/* ---------------------------------------------------------------- full state of one parameter (collective) */
enum zs_state {
    ZS_STATE_PARAM = 0,      /* the fp32 master (the parameter itself with fp32 training) */
    ZS_STATE_GRAD = 1,       /* the reduced gradient the next optimizer step will use (mean over ranks and
                              * micro-batches, before clipping, divided by fp16's loss scale): readable only
                              * in the window's last micro-batch, after every unit's zs_grad_ready and
                              * before its zs_step (stages 0-1 reduce the full buffers at those
                              * zs_grad_ready calls; stages 2-3 have folded every micro-batch into the
                              * gradient shards by then). Read-only; ZS_ERR_UNSUPPORTED with
                              * zeroshard.deterministic, whose exact sums exist only inside zs_step. */
    ZS_STATE_EXP_AVG = 2,    /* Adam's m, SGD's momentum buffer, Lion's m, Adagrad's sum */
    ZS_STATE_EXP_AVG_SQ = 3, /* Adam's v */
};
/* Every rank receives parameter `param`'s whole `which` in out[0..numel) as fp32 (deepspeed.utils'
 * safe_get_full_fp32_param, safe_get_full_grad, safe_get_full_optimizer_state): what a checkpoint saved now
 * would hold for it. A frozen parameter has only ZS_STATE_PARAM; a state the optimizer lacks (SGD without
 * momentum has no EXP_AVG_SQ) is ZS_ERR_INVALID naming it. */
zs_status zs_param_read(zs_ctx *ctx, int32_t param, enum zs_state which, float *out);
/* Rank root's in[0..numel) becomes parameter `param`'s `which` on every rank (other ranks' in is not read
 * and may be NULL). ZS_STATE_PARAM sets the master and the working parameter (its training-dtype copy), so
 * the next fetch sees it (GatheredParameters(modifier_rank=root), safe_set_full_fp32_param); the moments
 * likewise (safe_set_full_optimizer_state); ZS_STATE_GRAD is ZS_ERR_UNSUPPORTED. At a step boundary, with
 * the parameter's unit not fetched. */
zs_status zs_param_write(zs_ctx *ctx, int32_t param, enum zs_state which, const float *in, int32_t root);
/* Collective, at a step boundary: sets the step counters a run resumed from another format's checkpoint carries
 * on from (zs_checkpoint_load sets them from its own manifest). global_step: optimizer boundaries so far (the
 * micro-step count becomes global_step x gradient_accumulation_steps); optimizer_steps: updates since the
 * optimizer's moments started (Adam's bias correction uses optimizer_steps + 1 at the next step); schedule_steps:
 * the config scheduler's position (its next step uses schedule_steps + 1; DeepSpeed's last_batch_iteration + 1).
 * -1 keeps the running value. The fp16 skipped-step count restarts at 0. Every rank passes the same counts; a
 * negative count other than -1, optimizer_steps above global_step, or differing ranks are ZS_ERR_INVALID naming
 * the values. */
zs_status zs_step_counts_set(zs_ctx *ctx, int64_t global_step, int64_t optimizer_steps, int64_t schedule_steps);

/* ---------------------------------------------------------------- faults and preemption */
/* Every wait on other ranks ends after zeroshard.timeout_s (ZS_TIMEOUT overrides; default 600 s) with
 * ZS_ERR_COMM and a message naming the operation, the wait and the ranks that had not arrived, and
 * within a second when a rank on this node has exited. The context cannot continue after that: print
 * the message and end the job (MPI_Abort). */

/* Writes this rank's flight recorder (its last few hundred collectives and engine calls) to
 * <dir>/flight-rank<R>.txt, `why` in its header (dir: zeroshard.flight_dir, ZS_FLIGHT_DIR, else
 * /tmp/zeroshard-flight-<job id>). The library does this itself on a timeout, a failed collective and
 * SIGUSR1; a program calls it on its own errors. Not collective. tools/zs_flight.c lines the files up. */
zs_status zs_flight_dump(zs_ctx *ctx, const char *why);

/* Preemption (what Slurm and Kubernetes send before killing a job): after zs_preempt_enable, SIGTERM
 * only sets a flag (the handler does nothing else), and zs_preempt_requested, collective, sets *stop
 * on every rank when any rank has received it, so that all ranks stop after the same step. The program
 * then saves a checkpoint and exits 0. Without zs_preempt_enable, SIGTERM keeps its default effect. */
zs_status zs_preempt_enable(zs_ctx *ctx);
zs_status zs_preempt_requested(zs_ctx *ctx, int *stop);
/* Collective: each of values[0..n) becomes its sum over the ranks, added in rank order (the same bits
 * on every rank and every run), under the watchdog, e.g. for a program's loss. */
zs_status zs_allreduce_sum(zs_ctx *ctx, double *values, int32_t n);

/* ---------------------------------------------------------------- for front ends in other languages */
/* sizeof(MPI_Comm) in the MPI this library was built with (a pointer in Open MPI, an int in MPICH), so a
 * foreign binding lays out zs_init_opts right. */
int32_t zs_mpi_comm_bytes(void);
/* With MPI initialised, before or without a context: this process's rank and size in MPI_COMM_WORLD and
 * among the ranks of its node (MPI_Comm_split_type shared), whichever launcher started it. */
zs_status zs_world_info(int32_t *rank, int32_t *world, int32_t *local_rank, int32_t *local_size);
/* Collective over MPI_COMM_WORLD, no context needed: root's buf[0..bytes) to every rank (a front end's
 * rendezvous, e.g. the address of torch.distributed's store). */
zs_status zs_world_bcast(void *buf, int64_t bytes, int32_t root);

/* ---------------------------------------------------------------- queries */
int32_t zs_world_size(const zs_ctx *ctx);
int32_t zs_rank(const zs_ctx *ctx);
zs_status zs_param_info(const zs_ctx *ctx, int32_t param, const char **name, int64_t *numel,
                        int32_t *unit, int64_t *offset);
int32_t zs_param_count(const zs_ctx *ctx);
int32_t zs_unit_count(const zs_ctx *ctx);
zs_dtype zs_param_dtype(const zs_ctx *ctx);
zs_status zs_memory(const zs_ctx *ctx, zs_memory_report *out);
/* zs_memory's figures at the moment this rank's RSS was highest, of the moments the engine samples it (every
 * millisecond from zs_setup's end, by a thread; the whole report at a new high); peak_rss is the high-water mark
 * now, which a moment between samples can exceed. The rank-0 line after the first step prints it. */
zs_status zs_memory_peak(const zs_ctx *ctx, zs_memory_report *out);
/* The CUDA stream (a cudaStream_t) the engine orders its work after, for the program's kernels, when
 * zeroshard.device is "cuda". Otherwise ZS_ERR_UNSUPPORTED naming the key, and *stream is NULL.
 * The calling thread's current CUDA device: with zeroshard.device "cuda" the rank's GPU is the node-local
 * rank modulo the GPUs the process sees. zs_init makes it the calling thread's current device, and every later
 * call that works on the engine's GPU memory or streams (fetches, copies, gradients, the step, checkpoints,
 * zs_finalize) makes it current on its calling thread first, whatever was current, and leaves it current on
 * return: the engine never restores the thread's earlier device. The calls that only read the engine's state
 * (zs_cuda_stream, zs_memory, zs_stats, zs_rank and the other queries) leave the thread's device as it was. A
 * program that drives another GPU from the same thread sets its own device again after each call. */
zs_status zs_cuda_stream(const zs_ctx *ctx, void **stream);
/* Makes `stream` (a cudaStream_t of the rank's GPU, e.g. PyTorch's current stream) the engine's compute stream:
 * what zs_cuda_stream returns from here on, where the engine queues its own kernels (the optimizer, the
 * gradient folding) and which its collectives are ordered against with events, both ways (a gather's result
 * before the stream's later work, the stream's earlier work before a reduction reads a gradient or a gather
 * overwrites a released unit). A program computing on that stream therefore needs no further ordering with
 * the engine. What the engine queued on the stream it used before comes first (an event: no host wait).
 * NULL hands the engine its own stream back. The stream is the program's: it must stay alive until it is
 * replaced or zs_finalize returns (zs_finalize waits for it). ZS_ERR_UNSUPPORTED naming the key unless
 * zeroshard.device is "cuda". */
zs_status zs_cuda_set_stream(zs_ctx *ctx, void *stream);
/* The CUDA device ordinal this rank's engine uses (its node-local rank modulo the GPUs visible), for the
 * program to compute on the same GPU. ZS_ERR_UNSUPPORTED naming the key unless zeroshard.device is "cuda". */
zs_status zs_cuda_device(const zs_ctx *ctx, int32_t *ordinal);
/* Waits on the host for the work queued on the engine's compute stream so far (and so for the collectives it
 * waits on), as every wait of the engine does: within zeroshard.timeout_s, polling NCCL's asynchronous errors,
 * failing with a message naming the operation rather than blocking for good as cudaStreamSynchronize would
 * behind a failed NCCL collective. ZS_ERR_UNSUPPORTED naming the key unless zeroshard.device is "cuda". */
zs_status zs_cuda_synchronize(zs_ctx *ctx);
/* Copies between host memory and the engine's (the buffers zs_unit_fetch, zs_param_data and zs_grad_buffer
 * hand out), complete on return: a memcpy with zeroshard.device "cpu", a copy on the engine's stream with
 * "cuda". For a program whose own code runs on the host while the engine's memory is on the device. */
zs_status zs_copy_to_host(zs_ctx *ctx, void *host_dst, const void *engine_src, size_t bytes);
zs_status zs_copy_from_host(zs_ctx *ctx, void *engine_dst, const void *host_src, size_t bytes);
zs_status zs_stats(const zs_ctx *ctx, zs_step_stats *out);
int64_t zs_grad_accum_steps(const zs_ctx *ctx);
int64_t zs_micro_batch_size(const zs_ctx *ctx);
/* Deterministic mode: samples per micro-shard (the data split's unit); 0 in the normal mode. */
int64_t zs_micro_shard_size(const zs_ctx *ctx);
/* Bytes of collective payload this process has sent to ranks on other nodes and on its own node since it
 * started, counted by the library where the data is posted (every comm of the process; a shared-memory
 * peer's read of this rank's buffer counts as sent). ctx may be NULL. Check headers, set-up broadcasts and
 * NCCL's own transfers are not in these sums. Take the difference across the steps to time a window. */
zs_status zs_traffic(const zs_ctx *ctx, uint64_t *cross_node_bytes, uint64_t *intra_node_bytes);

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif

#ifdef __cplusplus
}
#endif
#endif /* ZEROSHARD_H */
