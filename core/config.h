/* config.h - the DeepSpeed-style JSON config, parsed, validated and resolved into plain C values. */
#ifndef ZS_CONFIG_H
#define ZS_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "zeroshard.h" /* defines: zs_auto_values */

/* Append only: existing values keep their numbers. */
enum zs_optim_type { ZS_OPTIM_ADAM, ZS_OPTIM_ADAMW, ZS_OPTIM_SGD, ZS_OPTIM_LION, ZS_OPTIM_ADAGRAD };
enum zs_sched_type { ZS_SCHED_NONE, ZS_SCHED_WARMUP_LR, ZS_SCHED_WARMUP_DECAY_LR, ZS_SCHED_WARMUP_COSINE_LR };
enum zs_warmup_type { ZS_WARMUP_LOG, ZS_WARMUP_LINEAR };
enum zs_offload_device { ZS_OFFLOAD_NONE, ZS_OFFLOAD_CPU, ZS_OFFLOAD_NVME };

struct zs_offload_config {
    enum zs_offload_device device;
    char nvme_path[512];
    bool pin_memory;
    int64_t buffer_count, buffer_size, max_in_cpu;
    bool pipeline_read, pipeline_write, fast_init;
    double ratio;
};

struct zs_optim_config {
    enum zs_optim_type type;   /* "Adam" with adam_w_mode true (the default) resolves to ADAMW */
    double lr;
    double beta1, beta2;       /* Adam(W), Lion */
    double eps;                /* Adam(W), Adagrad */
    double weight_decay;       /* decoupled for AdamW and Lion; L2 for Adam, SGD and Adagrad */
    bool bias_correction;
    double momentum, dampening; /* SGD */
    bool nesterov;
};

struct zs_sched_config {
    enum zs_sched_type type;
    double warmup_min_lr, warmup_max_lr;  /* WarmupLR, WarmupDecayLR */
    int64_t warmup_num_steps;
    enum zs_warmup_type warmup_type;
    int64_t total_num_steps;              /* WarmupDecayLR, WarmupCosineLR */
    double warmup_min_ratio, cos_min_ratio; /* WarmupCosineLR */
};

struct zs_fp16_config {
    bool enabled;
    double loss_scale;          /* 0 = dynamic */
    int64_t initial_scale_power;
    int64_t loss_scale_window;
    int64_t hysteresis;
    bool consecutive_hysteresis;
    double min_loss_scale;
};

struct zs_zero_config {
    int stage;
    bool contiguous_gradients, reduce_scatter, allgather_partitions, overlap_comm, round_robin_gradients;
    int64_t reduce_bucket_size, allgather_bucket_size, sub_group_size;
    int64_t prefetch_bucket_size, param_persistence_threshold, max_live_parameters, max_reuse_distance;
    bool gather_16bit_weights_on_model_save;
    struct zs_offload_config offload_optimizer, offload_param;
    int64_t mics_shard_size;  /* ranks per shard group (hybrid sharding); -1: every rank (flat) */
    bool quantized_weights, quantized_gradients; /* ZeRO++ qwZ / qgZ across nodes (sharding/quant_path.c): lossy */
    int64_t hpz_partition_size; /* ZeRO++ hpZ: ranks of the stage-3 secondary copy's group; 0 or 1: off */
};

struct zs_aio_config {
    int64_t block_size, queue_depth, intra_op_parallelism;
    bool single_submit, overlap_events;
};

/* The ZeroShard-only "zeroshard" section (DeepSpeed ignores it). The engine applies ZS_THREADS and ZS_KERNEL
 * on top of these; the parser never reads the environment, so the resolved config depends on the text alone. */
struct zs_zeroshard_config {
    int64_t threads;    /* 0: this rank's share of the node's cores */
    char kernel[16];    /* "auto", "scalar", "avx2" or "avx512" */
    bool bind;          /* bind each worker thread to one core */
    char comm[8];       /* collective backend: "auto", "mpi" or "shm" */
    int64_t fake_node_size; /* > 0: treat blocks of this many consecutive ranks as nodes (testing) */
    int64_t device_memory;  /* bytes of "device" memory per rank the CPU backend allows; 0 = no limit */
    char device[8];     /* where model states live and the optimizer runs: "cpu" or "cuda" */
    char device_comm[8]; /* collectives on device buffers: "auto", "nccl", "ordered" or "staged"
                          * (ZS_DEVICE_COMM overrides; runtime/devio.c) */
    double timeout_s;       /* the watchdog: how long any wait on peers may last (ZS_TIMEOUT overrides) */
    char flight_dir[256];   /* the flight recorder's directory ("": ZS_FLIGHT_DIR or /tmp/zeroshard-flight-<job>) */
    bool deterministic;     /* "world_size_invariant": exact gradient sums (sharding/exact.c) */
    int64_t micro_shard_size; /* deterministic mode: samples per micro-shard, the unit of the data split */
};

struct zs_config {
    int world_size;
    int64_t train_batch_size, micro_batch_size, grad_accum_steps;
    double gradient_clipping;   /* 0 = off */
    int64_t steps_per_print;
    bool wall_clock_breakdown, prescale_gradients;
    double gradient_predivide_factor;
    struct zs_optim_config optim;
    struct zs_sched_config sched;
    struct zs_fp16_config fp16;
    bool bf16_enabled;
    zs_dtype param_dtype;       /* fp32, or bf16/fp16 with fp32 masters (resolved from fp16/bf16.enabled) */
    zs_dtype comm_dtype;        /* what gradients are reduced to: param_dtype or fp32 */
    struct zs_aio_config aio;
    struct zs_zero_config zero;
    struct zs_zeroshard_config zs;   /* the "zeroshard" section */
    /* One line naming the sections that belong to the training program or have no effect here, or
     * "" when there are none. The engine prints it once on rank 0. */
    char warning[1024];
};

/* Parses and resolves `text` for a world of `world_size` ranks. `source` names the text in messages
 * (a file path, or "<json>"). `autov` may be NULL. Returns 0, or -EINVAL with a one-line message in
 * err: "<key.path>: <what is wrong>" (or "<source>:<line>:<col>: <parse error>"). */
int zs_config_parse(struct zs_config *cfg, const char *text, const char *source, int world_size,
                    const zs_auto_values *autov, char *err, size_t errlen);

/* Bytes of optimizer state per parameter: Adam keeps m and v; SGD a momentum buffer when it has
 * momentum; Lion its momentum; Adagrad its squared sum. */
/* fp32 state arrays the optimizer keeps per element: Adam m and v; SGD a momentum buffer when it has
 * momentum; Lion m; Adagrad the squared sum. */
static inline int zs_config_state_arrays(const struct zs_config *c)
{
    if (c->optim.type == ZS_OPTIM_ADAM || c->optim.type == ZS_OPTIM_ADAMW)
        return 2;
    return c->optim.type == ZS_OPTIM_SGD && c->optim.momentum == 0.0 ? 0 : 1;
}

static inline uint64_t zs_config_state_bytes(const struct zs_config *c)
{
    uint64_t master = c->param_dtype == ZS_DTYPE_FP32 ? 0 : 4; /* the fp32 master copy of 16-bit params */

    return 4 * (uint64_t)zs_config_state_arrays(c) + master;
}

/* Reads a whole file into a malloc'd NUL-terminated string; 0 or -errno. */
int zs_config_read_file(const char *path, char **text);

#endif /* ZS_CONFIG_H */
