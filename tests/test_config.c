/* test_config.c - the DeepSpeed config reader: every refusal names its key path, and the forms real configs
 * use (legacy keys, "auto", whole reals, aliases, comment keys) resolve as DeepSpeed resolves them. */
#define _POSIX_C_SOURCE 200809L /* mkstemp, strdup */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"  /* defines: zs_test_report and the pass/fail counters */
#include <fcntl.h>
#include <unistd.h>

#include "core/config.h"  /* defines: zs_config_parse, zs_config_read_file */


/* Tests write JSON with single quotes to stay readable; this turns them into double quotes. */
static char *dq(const char *s)
{
    char *t = strdup(s);

    for (char *c = t; c && *c; c++)
        if (*c == '\'')
            *c = '"';
    return t;
}

static int parse(const char *json, int world, const zs_auto_values *av, struct zs_config *cfg, char *err,
                 size_t errlen)
{
    char *text = dq(json);
    int rc;

    if (!text)
        return -ENOMEM;
    rc = zs_config_parse(cfg, text, "<json>", world, av, err, errlen);
    free(text);
    return rc;
}

/* ---------------------------------------------------------------- refusals */

struct err_case {
    const char *name, *json;
    const char *prefix;    /* the message must start with this (the key path) */
    const char *contains;  /* and contain this, when set */
    int world;             /* 0 means 1 */
};

#define MB "'train_micro_batch_size_per_gpu': 1, "

static const struct err_case err_cases[] = {
    {"syntax error gives line and column", "{'a': }", "<json>:1:", NULL, 0},
    {"duplicate key rejected", "{" MB "'steps_per_print': 1, 'steps_per_print': 2}", "<json>:1:", "duplicate", 0},
    {"top level must be an object", "[1, 2]", "<json>: the top level must be a JSON object", NULL, 0},
    {"world size below 1", "{" MB "}", "world size must be >= 1", NULL, -1},
    {"stage out of range", "{" MB "'zero_optimization': {'stage': 5}}",
     "zero_optimization.stage: expected an integer 0..3, got 5", NULL, 0},
    {"stage auto is meaningless", "{" MB "'zero_optimization': {'stage': 'auto'}}",
     "zero_optimization.stage: \"auto\" cannot be resolved here; give a value", NULL, 0},
    {"non-whole real for an integer", "{" MB "'zero_optimization': {'reduce_bucket_size': 6.5}}",
     "zero_optimization.reduce_bucket_size: expected an integer", "got 6.5", 0},
    {"zero_optimization of the wrong type", "{" MB "'zero_optimization': 'yes'}",
     "zero_optimization: expected an object", NULL, 0},
    {"offload device unknown", "{" MB "'zero_optimization': {'stage': 3, 'offload_param': {'device': 'gpu'}}}",
     "zero_optimization.offload_param.device: expected \"none\", \"cpu\" or \"nvme\", got \"gpu\"", NULL, 0},
    {"did-you-mean on a misspelled stage-3 key",
     "{" MB "'zero_optimization': {'stage': 3, 'stage3_param_persitance_threshold': 1e5}}",
     "zero_optimization.stage3_param_persitance_threshold: unknown key (did you mean "
     "'stage3_param_persistence_threshold'?)", NULL, 0},
    {"unknown zero key without a near name", "{" MB "'zero_optimization': {'foo': 1}}",
     "zero_optimization.foo: unknown key", NULL, 0},
    {"unknown top-level key with did-you-mean", "{" MB "'optimiser': {}}",
     "optimiser: unknown key (did you mean 'optimizer'?)", NULL, 0},
    {"unknown offload key with did-you-mean", "{" MB "'zero_optimization': {'offload_optimizer': {'devcie': 'cpu'}}}",
     "zero_optimization.offload_optimizer.devcie: unknown key (did you mean 'device'?)", NULL, 0},
    {"lr auto without a program value", "{" MB "'optimizer': {'type': 'AdamW', 'params': {'lr': 'auto'}}}",
     "optimizer.params.lr: \"auto\" needs a value from the program (zs_auto_values.lr)", NULL, 0},
    {"lr missing", "{" MB "'optimizer': {'type': 'Adam', 'params': {'eps': 1e-8}}}", "optimizer.params.lr: missing",
     NULL, 0},
    {"lr must be positive", "{" MB "'optimizer': {'type': 'Adam', 'params': {'lr': 0}}}",
     "optimizer.params.lr: expected a number > 0, got 0", NULL, 0},
    {"known optimizer not implemented", "{" MB "'optimizer': {'type': 'Lamb', 'params': {'lr': 1e-4}}}",
     "optimizer.type: 'Lamb' is not implemented yet (implemented: Adam, AdamW, SGD, Lion, Adagrad)", NULL, 0},
    {"CPU Adagrad by name not implemented", "{" MB "'optimizer': {'type': 'CPUAdagrad', 'params': {'lr': 1e-2}}}",
     "optimizer.type: 'CPUAdagrad' is not implemented yet (implemented: Adam, AdamW, SGD, Lion, Adagrad)", NULL, 0},
    {"unknown optimizer", "{" MB "'optimizer': {'type': 'Foo', 'params': {'lr': 1}}}",
     "optimizer.type: unknown optimizer 'Foo' (implemented: Adam, AdamW, SGD, Lion, Adagrad)", NULL, 0},
    {"SGD key given to Lion", "{" MB "'optimizer': {'type': 'Lion', 'params': {'lr': 1e-4, 'momentum': 0.9}}}",
     "optimizer.params.momentum: not a parameter of Lion", NULL, 0},
    {"Adam key given to Lion", "{" MB "'optimizer': {'type': 'lion', 'params': {'lr': 1e-4, 'eps': 1e-8}}}",
     "optimizer.params.eps: not a parameter of Lion", NULL, 0},
    {"Adagrad key given to Adam", "{" MB "'optimizer': {'type': 'Adam', 'params': {'lr': 1e-4, 'lr_decay': 0}}}",
     "optimizer.params.lr_decay: not a parameter of Adam", NULL, 0},
    {"Lion lr missing", "{" MB "'optimizer': {'type': 'Lion', 'params': {'betas': [0.9, 0.99]}}}",
     "optimizer.params.lr: missing", NULL, 0},
    {"Lion beta1 out of range", "{" MB "'optimizer': {'type': 'Lion', 'params': {'lr': 1e-4, 'betas': [1, 0.99]}}}",
     "optimizer.params.betas[0]: expected a number in [0, 1), got 1", NULL, 0},
    {"Lion weight_decay negative", "{" MB "'optimizer': {'type': 'Lion', 'params': {'lr': 1e-4, 'weight_decay': -1}}}",
     "optimizer.params.weight_decay: expected a number >= 0, got -1", NULL, 0},
    /* torch_adam builds torch.optim.Adam(W), which has no bias_correction */
    {"torch_adam with bias_correction refused", "{" MB "'optimizer': {'type': 'AdamW', 'params': {'lr': 1e-3, "
     "'torch_adam': true, 'bias_correction': true}}}", "optimizer.params.bias_correction: not a parameter of "
     "torch.optim.AdamW (torch_adam: true", NULL, 0},
    {"Adagrad lr_decay not implemented", "{" MB "'optimizer': {'type': 'Adagrad', 'params': {'lr': 1e-2, "
     "'lr_decay': 0.1}}}", "optimizer.params.lr_decay:", "not implemented yet", 0},
    {"Adagrad initial_accumulator_value not implemented", "{" MB "'optimizer': {'type': 'Adagrad', 'params': "
     "{'lr': 1e-2, 'initial_accumulator_value': 0.1}}}", "optimizer.params.initial_accumulator_value:",
     "not implemented yet", 0},
    {"Adagrad lr_decay negative", "{" MB "'optimizer': {'type': 'Adagrad', 'params': {'lr': 1, 'lr_decay': -1}}}",
     "optimizer.params.lr_decay: expected a number >= 0, got -1", NULL, 0},
    {"Adagrad eps must be positive", "{" MB "'optimizer': {'type': 'Adagrad', 'params': {'lr': 1, 'eps': 0}}}",
     "optimizer.params.eps: expected a number > 0, got 0", NULL, 0},
    {"Adam key given to Adagrad", "{" MB "'optimizer': {'type': 'Adagrad', 'params': {'lr': 1, 'betas': [0.9, 0.99]}}}",
     "optimizer.params.betas: not a parameter of Adagrad", NULL, 0},
    {"Adam key given to SGD", "{" MB "'optimizer': {'type': 'SGD', 'params': {'lr': 0.1, 'betas': [0.9, 0.99]}}}",
     "optimizer.params.betas: not a parameter of SGD", NULL, 0},
    {"misspelled optimizer parameter", "{" MB "'optimizer': {'type': 'Adam', 'params': {'lrr': 0.1}}}",
     "optimizer.params.lrr: unknown key (did you mean 'lr'?)", NULL, 0},
    {"betas of the wrong length", "{" MB "'optimizer': {'type': 'Adam', 'params': {'lr': 1, 'betas': [0.9]}}}",
     "optimizer.params.betas: expected [beta1, beta2]", NULL, 0},
    {"beta2 out of range", "{" MB "'optimizer': {'type': 'Adam', 'params': {'lr': 1, 'betas': [0.9, 1.0]}}}",
     "optimizer.params.betas[1]: expected a number in [0, 1), got 1", NULL, 0},
    {"eps must be positive", "{" MB "'optimizer': {'type': 'AdamW', 'params': {'lr': 1, 'eps': 0}}}",
     "optimizer.params.eps: expected a number > 0, got 0", NULL, 0},
    {"amsgrad refused", "{" MB "'optimizer': {'type': 'Adam', 'params': {'lr': 1, 'amsgrad': true}}}",
     "optimizer.params.amsgrad: AMSGrad is not implemented yet", NULL, 0},
    {"nesterov needs momentum", "{" MB "'optimizer': {'type': 'SGD', 'params': {'lr': 1, 'nesterov': true}}}",
     "optimizer.params.nesterov: needs momentum > 0 and dampening 0", NULL, 0},
    {"OneCycle not implemented", "{" MB "'scheduler': {'type': 'OneCycle', 'params': {'cycle_min_lr': 1e-4}}}",
     "scheduler.type: 'OneCycle' is not implemented yet (implemented: WarmupLR, WarmupDecayLR, WarmupCosineLR)", NULL,
     0},
    {"unknown scheduler", "{" MB "'scheduler': {'type': 'Cosine'}}", "scheduler.type: unknown scheduler 'Cosine'",
     NULL, 0},
    {"total_num_steps auto without a program value",
     "{" MB "'scheduler': {'type': 'WarmupDecayLR', 'params': {'total_num_steps': 'auto'}}}",
     "scheduler.params.total_num_steps: \"auto\" needs a value from the program (zs_auto_values.total_num_steps)", NULL,
     0},
    {"total_num_steps missing", "{" MB "'scheduler': {'type': 'WarmupDecayLR', 'params': {}}}",
     "scheduler.params.total_num_steps: missing", NULL, 0},
    {"WarmupLR key given to WarmupCosineLR",
     "{" MB "'scheduler': {'type': 'WarmupCosineLR', 'params': {'total_num_steps': 10, 'warmup_max_lr': 1}}}",
     "scheduler.params.warmup_max_lr: not a parameter of WarmupCosineLR", NULL, 0},
    {"warmup_type unknown", "{" MB "'scheduler': {'type': 'WarmupLR', 'params': {'warmup_type': 'cosine'}}}",
     "scheduler.params.warmup_type: expected \"log\" or \"linear\", got \"cosine\"", NULL, 0},
    {"last_batch_iteration other than -1",
     "{" MB "'scheduler': {'type': 'WarmupLR', 'params': {'last_batch_iteration': 5}}}",
     "scheduler.params.last_batch_iteration:", "checkpoint, not the config", 0},
    {"warmup_num_steps negative", "{" MB "'scheduler': {'type': 'WarmupLR', 'params': {'warmup_num_steps': -1}}}",
     "scheduler.params.warmup_num_steps: expected an integer >= 0, got -1", NULL, 0},
    {"fp16 and bf16 together", "{" MB "'fp16': {'enabled': true}, 'bf16': {'enabled': true}}",
     "bf16.enabled: fp16 and bf16 cannot both be enabled", NULL, 0},
    {"fp32 reduction of bf16 gradients at stage 1",
     "{" MB "'bf16': {'enabled': true}, 'communication_data_type': 'fp32', 'zero_optimization': {'stage': 1}}",
     "communication_data_type: \"fp32\" with bf16 needs ZeRO stage 2 or 3", NULL, 0},
    {"bfloat16 spelling named in messages", "{" MB "'bfloat16': {'enabled': 1}}",
     "bfloat16.enabled: expected true or false, got 1", NULL, 0},
    {"bf16 and bfloat16 together", "{" MB "'bf16': {}, 'bfloat16': {}}", "bfloat16: same setting as bf16", NULL, 0},
    {"fp16 and bf16 both enabled", "{" MB "'fp16': {'enabled': true}, 'bf16': {'enabled': true}}",
     "bf16.enabled: fp16 and bf16 cannot both be enabled", NULL, 0},
    {"bf16 master weights refused", "{" MB "'bf16': {'bf16_master_weights_and_grads': true}}",
     "bf16.bf16_master_weights_and_grads:", "not implemented", 0},
    {"fp8 enabled refused", "{" MB "'fp8': {'enabled': true, 'hysteresis': 2}}",
     "fp8.enabled: fp8 training is not supported", NULL, 0},
    {"initial_scale_power above 63", "{" MB "'fp16': {'initial_scale_power': 64}}",
     "fp16.initial_scale_power: expected an integer 0..63, got 64", NULL, 0},
    {"hysteresis zero", "{" MB "'fp16': {'hysteresis': 0}}", "fp16.hysteresis: expected an integer >= 1, got 0", NULL,
     0},
    {"nvme without nvme_path", "{" MB "'zero_optimization': {'stage': 2, 'offload_optimizer': {'device': 'nvme'}}}",
     "zero_optimization.offload_optimizer.nvme_path: missing", NULL, 0},
    {"optimizer offload at stage 0",
     "{" MB "'zero_optimization': {'stage': 0, 'offload_optimizer': {'device': 'cpu'}}}",
     "zero_optimization.offload_optimizer: optimizer offload needs ZeRO stage 1, 2 or 3", NULL, 0},
    {"param offload below stage 3", "{" MB "'zero_optimization': {'stage': 2, 'offload_param': {'device': 'cpu'}}}",
     "zero_optimization.offload_param: parameter offload needs ZeRO stage 3 (stage is 2)", NULL, 0},
    {"nvme parameter offload without nvme optimizer offload",
     "{" MB "'zero_optimization': {'stage': 3, 'offload_param': {'device': 'nvme', 'nvme_path': '/x'}}}",
     "zero_optimization.offload_param.device: \"nvme\" needs offload_optimizer.device \"nvme\" too", NULL, 0},
    {"nvme parameter offload to another directory",
     "{" MB "'zero_optimization': {'stage': 3, 'offload_param': {'device': 'nvme', 'nvme_path': '/x'}, "
     "'offload_optimizer': {'device': 'nvme', 'nvme_path': '/y'}}}",
     "zero_optimization.offload_param.nvme_path: \"/x\" differs from offload_optimizer.nvme_path \"/y\"", NULL, 0},
    {"partial offload not implemented",
     "{" MB "'zero_optimization': {'stage': 2, 'offload_optimizer': {'device': 'cpu', 'ratio': 0.5}}}",
     "zero_optimization.offload_optimizer.ratio: partial offload", NULL, 0},
    {"legacy cpu_offload_params below stage 3", "{" MB "'zero_optimization': {'stage': 2, 'cpu_offload_params': true}}",
     "zero_optimization.cpu_offload_params: parameter offload needs ZeRO stage 3", NULL, 0},
    {"legacy cpu_offload beside offload_optimizer",
     "{" MB "'zero_optimization': {'stage': 2, 'cpu_offload': false, 'offload_optimizer': {}}}",
     "zero_optimization.cpu_offload: legacy form of offload_optimizer", NULL, 0},
    {"both spellings of a stage-3 key",
     "{" MB "'zero_optimization': {'stage3_max_live_parameters': 1, 'max_live_parameters': 1}}",
     "zero_optimization.max_live_parameters: same setting as stage3_max_live_parameters", NULL, 0},
    {"deprecated and current gather key together",
     "{" MB "'zero_optimization': {'stage3_gather_16bit_weights_on_model_save': true, "
     "'stage3_gather_fp16_weights_on_model_save': true}}",
     "zero_optimization.stage3_gather_fp16_weights_on_model_save: same setting as", NULL, 0},
    {"stage3_max_reuse_distance negative", "{" MB "'zero_optimization': {'stage3_max_reuse_distance': -1}}",
     "zero_optimization.stage3_max_reuse_distance: expected an integer >= 0, got -1", NULL, 0},
    {"offload ratio zero", "{" MB "'zero_optimization': {'offload_optimizer': {'ratio': 0}}}",
     "zero_optimization.offload_optimizer.ratio: expected a number in (0, 1], got 0", NULL, 0},
    {"boolean auto is meaningless", "{" MB "'zero_optimization': {'contiguous_gradients': 'auto'}}",
     "zero_optimization.contiguous_gradients: \"auto\" cannot be resolved here; give a value", NULL, 0},
    {"hpZ below stage 3 refused", "{" MB "'zero_optimization': {'stage': 2, 'zero_hpz_partition_size': 8}}",
     "zero_optimization.zero_hpz_partition_size: 8 needs ZeRO stage 3", "this is stage 2", 0},
    {"hpZ with offload_param refused", "{" MB "'zero_optimization': {'stage': 3, 'zero_hpz_partition_size': 8, "
     "'offload_param': {'device': 'cpu'}}}", "zero_optimization.zero_hpz_partition_size: 8 is not implemented with "
     "zero_optimization.offload_param", NULL, 0},
    {"MiCS shard size 0 refused", "{" MB "'zero_optimization': {'mics_shard_size': 0}}",
     "zero_optimization.mics_shard_size:", "0 is not a shard group size", 0},
    {"MiCS hierarchical gather refused", "{" MB "'zero_optimization': {'mics_shard_size': 2, "
     "'mics_hierarchical_params_gather': true}}", "zero_optimization.mics_hierarchical_params_gather:", "not supported", 0},
    {"quantized weights and gradients refused in deterministic mode", "{" MB "'zero_optimization': "
     "{'zero_quantized_gradients': true}, 'zeroshard': {'deterministic': 'world_size_invariant'}}",
     "zeroshard.deterministic:", "zero_optimization.zero_quantized_weights and zero_optimization.zero_quantized_gradients "
     "are lossy", 0},
    {"legacy_stage1 refused", "{" MB "'zero_optimization': {'legacy_stage1': true}}",
     "zero_optimization.legacy_stage1:", "not supported", 0},
    {"batch sizes inconsistent", "{'train_batch_size': 32, 'train_micro_batch_size_per_gpu': 4, "
     "'gradient_accumulation_steps': 2}", "train_batch_size: 32 != train_micro_batch_size_per_gpu 4 * "
     "gradient_accumulation_steps 2 * world size 2", NULL, 2},
    {"train batch not divisible by micro * world", "{'train_batch_size': 12, 'train_micro_batch_size_per_gpu': 4}",
     "train_batch_size: 12 is not divisible by train_micro_batch_size_per_gpu 4 * world size 2", NULL, 2},
    {"train batch not divisible by world", "{'train_batch_size': 7}",
     "train_batch_size: 7 is not divisible by the world size 2", NULL, 2},
    {"no batch size at all", "{'gradient_accumulation_steps': 2}",
     "train_batch_size: neither train_batch_size nor train_micro_batch_size_per_gpu is set", NULL, 0},
    {"micro auto without a program value", "{'train_micro_batch_size_per_gpu': 'auto'}",
     "train_batch_size: neither train_batch_size nor train_micro_batch_size_per_gpu is set",
     "zs_auto_values.micro_batch_size", 0},
    {"micro batch zero", "{'train_micro_batch_size_per_gpu': 0}",
     "train_micro_batch_size_per_gpu: expected an integer >= 1, got 0", NULL, 0},
    {"accumulation steps non-whole", "{" MB "'gradient_accumulation_steps': 2.5}",
     "gradient_accumulation_steps: expected an integer >= 1, got 2.5", NULL, 0},
    {"integer beyond int64", "{'train_micro_batch_size_per_gpu': 1e19}",
     "train_micro_batch_size_per_gpu: expected an integer", NULL, 0},
    {"gradient_clipping negative", "{" MB "'gradient_clipping': -1}",
     "gradient_clipping: expected a number >= 0, got -1", NULL, 0},
    {"wall_clock_breakdown as a string", "{" MB "'wall_clock_breakdown': 'yes'}",
     "wall_clock_breakdown: expected true or false, got \"yes\"", NULL, 0},
    {"steps_per_print as a boolean", "{" MB "'steps_per_print': true}",
     "steps_per_print: expected an integer >= 0, got true", NULL, 0},
    {"gradient_predivide_factor zero", "{" MB "'gradient_predivide_factor': 0}",
     "gradient_predivide_factor: expected a number > 0", NULL, 0},
    {"tensor parallelism refused", "{" MB "'tensor_parallel': {'autotp_size': 2}}",
     "tensor_parallel.autotp_size: tensor parallelism is not supported", NULL, 0},
    {"pipeline parallelism refused", "{" MB "'pipeline': {'stages': 2}}",
     "pipeline.stages: pipeline parallelism is not supported", NULL, 0},
    {"elasticity refused", "{" MB "'elasticity': {'enabled': true}}", "elasticity.enabled:", "not supported", 0},
    {"amp refused", "{" MB "'amp': {'enabled': true, 'opt_level': 'O1'}}", "amp.enabled:", "not supported", 0},
    {"sparse gradients refused", "{" MB "'sparse_gradients': true}", "sparse_gradients:", "not supported", 0},
    {"sequence parallelism refused", "{" MB "'sequence_parallel_size': 4}", "sequence_parallel_size:",
     "not supported", 0},
    {"fp16 communication of fp32 training", "{" MB "'communication_data_type': 'fp16'}",
     "communication_data_type: \"fp16\" differs from the training dtype fp32", NULL, 0},
    {"unknown communication dtype", "{" MB "'communication_data_type': 'int8'}",
     "communication_data_type: expected \"fp32\", \"fp16\" or \"bf16\", got \"int8\"", NULL, 0},
    {"aio alias given twice", "{" MB "'aio': {'intra_op_parallelism': 2, 'thread_count': 2}}",
     "aio.thread_count: same setting as intra_op_parallelism", NULL, 0},
    {"aio block size too small", "{" MB "'aio': {'block_size': 100}}",
     "aio.block_size: expected an integer >= 512, got 100", NULL, 0},
    {"aio GPUDirect refused", "{" MB "'aio': {'use_gds': true}}", "aio.use_gds:", "not supported", 0},
    {"optimizer params of the wrong type", "{" MB "'optimizer': {'type': 'Adam', 'params': [1]}}",
     "optimizer.params: expected an object, got an array", NULL, 0},
    {"config mistake reported before an unsupported feature", "{" MB "'fp16': {'enabled': true}, "
     "'zero_optimization': {'stage': 7}}", "zero_optimization.stage:", NULL, 0},
    {"zeroshard kernel unknown", "{" MB "'zeroshard': {'kernel': 'sse'}}",
     "zeroshard.kernel: expected \"auto\", \"scalar\", \"avx2\" or \"avx512\", got \"sse\"", NULL, 0},
    {"zeroshard device unknown", "{" MB "'zeroshard': {'device': 'gpu'}}",
     "zeroshard.device: expected \"cpu\" or \"cuda\", got \"gpu\"", NULL, 0},
    {"zeroshard device_comm unknown", "{" MB "'zeroshard': {'device_comm': 'gloo'}}",
     "zeroshard.device_comm: expected \"auto\", \"nccl\", \"ordered\" or \"staged\", got \"gloo\"", NULL, 0},
    {"zeroshard device_comm nccl refused in deterministic mode",
     "{" MB "'zeroshard': {'device_comm': 'nccl', 'deterministic': 'world_size_invariant'}}",
     "zeroshard.device_comm: \"nccl\" sums in NCCL's order, not bit-identical", NULL, 0},
    {"zeroshard kernel not a string", "{" MB "'zeroshard': {'kernel': 2}}", "zeroshard.kernel: expected a string",
     NULL, 0},
    {"zeroshard cpu_threads negative", "{" MB "'zeroshard': {'cpu_threads': -1}}",
     "zeroshard.cpu_threads: expected an integer >= 0, got -1", NULL, 0},
    {"zeroshard bind_threads as a string", "{" MB "'zeroshard': {'bind_threads': 'yes'}}",
     "zeroshard.bind_threads: expected true or false, got \"yes\"", NULL, 0},
    {"zeroshard unknown key names the nearest word", "{" MB "'zeroshard': {'threads': 4}}",
     "zeroshard.threads: unknown key (did you mean 'cpu_threads'?)", NULL, 0},
    {"zeroshard misspelled key", "{" MB "'zeroshard': {'kernal': 'avx2'}}",
     "zeroshard.kernal: unknown key (did you mean 'kernel'?)", NULL, 0},
    {"zeroshard of the wrong type", "{" MB "'zeroshard': true}", "zeroshard: expected an object, got true", NULL, 0},
    {"control characters kept off the message line", "{" MB "'bad\\nkey': 1}", "bad?key: unknown key", NULL, 0},
};

static void run_err_case(const struct err_case *c)
{
    struct zs_config cfg;
    char err[512] = "", why[1200];
    int rc = parse(c->json, c->world ? c->world : 1, NULL, &cfg, err, sizeof(err));

    if (c->world < 0)
        rc = parse(c->json, 0, NULL, &cfg, err, sizeof(err));
    if (rc != -EINVAL)
        snprintf(why, sizeof(why), "rc %d, expected -EINVAL (err \"%s\")", rc, err);
    else if (strncmp(err, c->prefix, strlen(c->prefix)) != 0)
        snprintf(why, sizeof(why), "message \"%s\" does not start with \"%s\"", err, c->prefix);
    else if (c->contains && !strstr(err, c->contains))
        snprintf(why, sizeof(why), "message \"%s\" does not contain \"%s\"", err, c->contains);
    else if (strchr(err, '\n'))
        snprintf(why, sizeof(why), "message spans lines");
    else
        why[0] = '\0';
    zs_test_report(c->name, why[0] ? why : NULL);
}

/* ---------------------------------------------------------------- resolutions */

static char why[1024];

#define EXPECT(cond)                                                                   \
    do {                                                                               \
        if (!(cond)) {                                                                 \
            snprintf(why, sizeof(why), "line %d: %s", __LINE__, #cond);                \
            return false;                                                              \
        }                                                                              \
    } while (0)

#define PARSE_OK(json, world, av, cfg)                                                 \
    do {                                                                               \
        char err_[512];                                                                \
        int rc_ = parse(json, world, av, cfg, err_, sizeof(err_));                     \
        if (rc_) {                                                                     \
            snprintf(why, sizeof(why), "line %d: rc %d: %s", __LINE__, rc_, err_);     \
            return false;                                                              \
        }                                                                              \
    } while (0)

static bool t_defaults(void)
{
    struct zs_config c;

    PARSE_OK("{'train_micro_batch_size_per_gpu': 4}", 1, NULL, &c);
    EXPECT(c.world_size == 1 && c.train_batch_size == 4 && c.micro_batch_size == 4 && c.grad_accum_steps == 1);
    EXPECT(c.gradient_clipping == 0 && c.steps_per_print == 10 && !c.wall_clock_breakdown && !c.prescale_gradients);
    EXPECT(c.gradient_predivide_factor == 1.0);
    EXPECT(c.optim.type == ZS_OPTIM_ADAMW && c.optim.lr == 1e-3 && c.optim.beta1 == 0.9 && c.optim.beta2 == 0.999);
    EXPECT(c.optim.eps == 1e-8 && c.optim.weight_decay == 0 && c.optim.bias_correction);
    EXPECT(c.sched.type == ZS_SCHED_NONE);
    EXPECT(!c.fp16.enabled && c.fp16.loss_scale == 0 && c.fp16.initial_scale_power == 16);
    EXPECT(c.fp16.loss_scale_window == 1000 && c.fp16.hysteresis == 2 && c.fp16.min_loss_scale == 1);
    EXPECT(!c.bf16_enabled && c.zero.stage == 0 && !c.zero.overlap_comm && c.zero.contiguous_gradients);
    EXPECT(c.zero.reduce_scatter && c.zero.allgather_partitions && !c.zero.round_robin_gradients);
    EXPECT(c.zero.reduce_bucket_size == 500000000 && c.zero.allgather_bucket_size == 500000000);
    EXPECT(c.zero.sub_group_size == 1000000000 && c.zero.prefetch_bucket_size == 50000000);
    EXPECT(c.zero.param_persistence_threshold == 100000 && c.zero.max_live_parameters == 1000000000);
    EXPECT(c.zero.max_reuse_distance == 1000000000 && !c.zero.gather_16bit_weights_on_model_save);
    EXPECT(c.zero.offload_optimizer.device == ZS_OFFLOAD_NONE && c.zero.offload_optimizer.buffer_count == 4);
    EXPECT(c.zero.offload_param.buffer_count == 5 && c.zero.offload_param.buffer_size == 100000000);
    EXPECT(c.zero.offload_param.max_in_cpu == 1000000000 && c.zero.offload_param.pin_memory);
    EXPECT(c.zero.offload_optimizer.ratio == 1.0);
    EXPECT(c.aio.block_size == 1048576 && c.aio.queue_depth == 8 && c.aio.intra_op_parallelism == 1);
    EXPECT(!c.aio.single_submit && c.aio.overlap_events);
    EXPECT(strcmp(c.warning, "config: no optimizer section: using AdamW(lr=0.001)") == 0);
    return true;
}

static bool t_batch_arithmetic(void)
{
    struct zs_config c;

    PARSE_OK("{'train_batch_size': 64, 'train_micro_batch_size_per_gpu': 4}", 2, NULL, &c);
    EXPECT(c.grad_accum_steps == 8 && c.micro_batch_size == 4);
    PARSE_OK("{'train_batch_size': 64, 'gradient_accumulation_steps': 4}", 2, NULL, &c);
    EXPECT(c.micro_batch_size == 8 && c.grad_accum_steps == 4);
    PARSE_OK("{'train_micro_batch_size_per_gpu': 3, 'gradient_accumulation_steps': 5}", 4, NULL, &c);
    EXPECT(c.train_batch_size == 60);
    PARSE_OK("{'train_batch_size': 16}", 2, NULL, &c);
    EXPECT(c.micro_batch_size == 8 && c.grad_accum_steps == 1);
    PARSE_OK("{'train_batch_size': 16, 'train_micro_batch_size_per_gpu': 2, 'gradient_accumulation_steps': 4}", 2, NULL,
             &c);
    EXPECT(c.train_batch_size == 16 && c.world_size == 2);
    PARSE_OK("{'train_micro_batch_size_per_gpu': 8, 'train_batch_size': 'auto'}", 3, NULL, &c);
    EXPECT(c.train_batch_size == 24 && c.grad_accum_steps == 1);
    return true;
}

static bool t_auto_from_program(void)
{
    zs_auto_values av = {.micro_batch_size = 2, .grad_accum_steps = 3, .lr = 5e-5, .total_num_steps = 900,
                         .warmup_num_steps = 50, .gradient_clipping = 0.5};
    struct zs_config c;

    PARSE_OK("{'train_batch_size': 'auto', 'train_micro_batch_size_per_gpu': 'auto', 'gradient_accumulation_steps': "
             "'auto', 'gradient_clipping': 'auto', 'optimizer': {'type': 'AdamW', 'params': {'lr': 'auto', 'betas': "
             "'auto', 'eps': 'auto', 'weight_decay': 'auto'}}, 'scheduler': {'type': 'WarmupDecayLR', 'params': "
             "{'warmup_min_lr': 'auto', 'warmup_max_lr': 'auto', 'warmup_num_steps': 'auto', 'total_num_steps': "
             "'auto'}}}", 2, &av, &c);
    EXPECT(c.micro_batch_size == 2 && c.grad_accum_steps == 3 && c.train_batch_size == 12);
    EXPECT(c.gradient_clipping == 0.5 && c.optim.lr == 5e-5 && c.optim.beta1 == 0.9 && c.optim.beta2 == 0.999);
    EXPECT(c.optim.eps == 1e-8 && c.optim.weight_decay == 0);
    EXPECT(c.sched.type == ZS_SCHED_WARMUP_DECAY_LR && c.sched.warmup_min_lr == 0 && c.sched.warmup_max_lr == 5e-5);
    EXPECT(c.sched.warmup_num_steps == 50 && c.sched.total_num_steps == 900);
    EXPECT(c.warning[0] == '\0');
    /* the optimizer's other "auto" values, from the program too; a value the config gives stays */
    av = (zs_auto_values){.micro_batch_size = 2, .lr = 1e-3, .beta1 = 0.8, .beta2 = 0.95, .eps = 1e-6,
                          .weight_decay = 0.05};
    PARSE_OK("{'train_micro_batch_size_per_gpu': 'auto', 'optimizer': {'type': 'AdamW', 'params': {'lr': 'auto', "
             "'betas': 'auto', 'eps': 'auto', 'weight_decay': 'auto'}}}", 1, &av, &c);
    EXPECT(c.optim.beta1 == 0.8 && c.optim.beta2 == 0.95 && c.optim.eps == 1e-6 && c.optim.weight_decay == 0.05);
    PARSE_OK("{'train_micro_batch_size_per_gpu': 'auto', 'optimizer': {'type': 'AdamW', 'params': {'lr': 'auto', "
             "'betas': [0.7, 0.9], 'eps': 1e-7, 'weight_decay': 0.2}}}", 1, &av, &c);
    EXPECT(c.optim.beta1 == 0.7 && c.optim.beta2 == 0.9 && c.optim.eps == 1e-7 && c.optim.weight_decay == 0.2);
    return true;
}

static bool t_auto_defaults(void)
{
    struct zs_config c;

    PARSE_OK("{" MB "'gradient_clipping': 'auto', 'steps_per_print': 'auto', 'fp16': {'enabled': 'auto'}, "
             "'bf16': {'enabled': 'auto'}, 'zero_optimization': {'stage': 3, 'reduce_bucket_size': 'auto', "
             "'stage3_prefetch_bucket_size': 'auto', 'stage3_param_persistence_threshold': 'auto', "
             "'sub_group_size': 'auto'}, 'scheduler': {'type': 'WarmupLR', 'params': {'warmup_num_steps': 'auto'}}}",
             1, NULL, &c);
    EXPECT(c.gradient_clipping == 0 && c.steps_per_print == 10 && !c.fp16.enabled && !c.bf16_enabled);
    EXPECT(c.zero.reduce_bucket_size == 500000000 && c.zero.prefetch_bucket_size == 50000000);
    EXPECT(c.zero.param_persistence_threshold == 100000 && c.zero.sub_group_size == 1000000000);
    EXPECT(c.sched.warmup_num_steps == 1000);
    return true;
}

static bool t_whole_reals(void)
{
    struct zs_config c;

    PARSE_OK("{'train_micro_batch_size_per_gpu': 4.0, 'zero_optimization': {'stage': 3.0, "
             "'reduce_bucket_size': 6.0e+07, 'stage3_max_live_parameters': 1.000000e+09, 'allgather_bucket_size': 2e8, "
             "'stage3_prefetch_bucket_size': 6.039798e+07, 'sub_group_size': 1e14}}", 1, NULL, &c);
    EXPECT(c.micro_batch_size == 4 && c.zero.stage == 3 && c.zero.reduce_bucket_size == 60000000);
    EXPECT(c.zero.max_live_parameters == 1000000000 && c.zero.allgather_bucket_size == 200000000);
    EXPECT(c.zero.prefetch_bucket_size == 60397980 && c.zero.sub_group_size == 100000000000000);
    return true;
}

static bool t_legacy_zero_bool(void)
{
    struct zs_config c;

    PARSE_OK("{" MB "'zero_optimization': true}", 1, NULL, &c);
    EXPECT(c.zero.stage == 1 && !c.zero.overlap_comm);
    PARSE_OK("{" MB "'zero_optimization': false}", 1, NULL, &c);
    EXPECT(c.zero.stage == 0);
    return true;
}

static bool t_stage3_defaults_and_aliases(void)
{
    struct zs_config c;

    PARSE_OK("{" MB "'zero_optimization': {'stage': 3, 'max_live_parameters': 0, 'max_reuse_distance': 0, "
             "'prefetch_bucket_size': 7, 'param_persistence_threshold': 9, 'sub_group_size': 0, "
             "'gather_16bit_weights_on_model_save': true}}", 1, NULL, &c);
    EXPECT(c.zero.overlap_comm && c.zero.max_live_parameters == 0 && c.zero.max_reuse_distance == 0);
    EXPECT(c.zero.prefetch_bucket_size == 7 && c.zero.param_persistence_threshold == 9 && c.zero.sub_group_size == 0);
    EXPECT(c.zero.gather_16bit_weights_on_model_save);
    PARSE_OK("{" MB "'zero_optimization': {'stage': 3, 'overlap_comm': false, "
             "'stage3_gather_fp16_weights_on_model_save': true}}", 1, NULL, &c);
    EXPECT(!c.zero.overlap_comm && c.zero.gather_16bit_weights_on_model_save);
    return true;
}

static bool t_comment_keys(void)
{
    struct zs_config c;

    PARSE_OK("{'_comment': 'x', " MB "'zero_optimization': {'_stage3_param_persistence_threshold': 1e9, 'stage': 2}, "
             "'optimizer': {'_note': 1, 'type': 'SGD', 'params': {'lr': 0.1, '_momentum': 'old'}}}", 1, NULL, &c);
    EXPECT(c.zero.stage == 2 && c.zero.param_persistence_threshold == 100000 && c.optim.type == ZS_OPTIM_SGD);
    EXPECT(c.optim.momentum == 0 && c.warning[0] == '\0');
    return true;
}

static bool t_warning_line(void)
{
    struct zs_config c;

    PARSE_OK("{" MB "'activation_checkpointing': {'partition_activations': true}, 'tensorboard': {'enabled': false}, "
             "'zero_allow_untested_optimizer': true, 'zero_optimization': {'stage': 1, 'round_robin_gradients': true}, "
             "'optimizer': {'type': 'Adam', 'params': {'lr': 1e-3}}}", 1, NULL, &c);
    EXPECT(strcmp(c.warning, "config: not handled by ZeroShard (left to the training program): "
                             "activation_checkpointing, tensorboard; no effect here: zero_allow_untested_optimizer, "
                             "zero_optimization.round_robin_gradients") == 0);
    PARSE_OK("{" MB "'bf16': {'enabled': false, 'loss_scale': 0, 'hysteresis': 2}, 'aio': {'thread_count': 3}, "
             "'optimizer': {'type': 'Adam', 'params': {'lr': 1e-3}}}", 1, NULL, &c);
    EXPECT(strcmp(c.warning, "config: no effect here: aio (no NVMe offload configured), bf16.loss_scale, "
                             "bf16.hysteresis") == 0);
    EXPECT(c.aio.intra_op_parallelism == 3);
    return true;
}

/* Every note at once: the line stays within its buffer, NUL-terminated, and says where it was cut. */
static bool t_warning_fits(void)
{
    struct zs_config c;

    PARSE_OK("{" MB "'activation_checkpointing': 1, 'tensorboard': 1, 'wandb': 1, 'csv_monitor': 1, 'comet': 1, "
             "'monitor_config': 1, 'flops_profiler': 1, 'comms_logger': 1, 'comms_config': 1, 'autotuning': 1, "
             "'checkpoint': 1, 'data_efficiency': 1, 'curriculum_learning': 1, 'compression_training': 1, "
             "'dump_state': 1, 'sparse_attention': 1, 'eigenvalue': 1, 'progressive_layer_drop': 1, 'timers': 1, "
             "'data_types': 1, 'weight_quantization': 1, 'hybrid_engine': 1, 'nebula': 1, 'quantize_training': 1, "
             "'zero_allow_untested_optimizer': true, 'zero_force_ds_cpu_optimizer': true, 'cuda_visible_devices': 0, "
             "'communication_data_type': 'fp32', 'disable_allgather': false, 'memory_breakdown': false, "
             "'bf16': {'loss_scale': 0, 'loss_scale_window': 1, 'hysteresis': 2, 'min_loss_scale': 1, "
             "'initial_scale_power': 3, 'consecutive_hysteresis': false}, 'aio': {}, 'zero_optimization': "
             "{'round_robin_gradients': false, 'load_from_fp32_weights': true, 'elastic_checkpoint': false, "
             "'ignore_unused_parameters': true, 'memory_efficient_linear': true, "
             "'use_multi_rank_bucket_allreduce': true}}", 1, NULL, &c);
    EXPECT(strlen(c.warning) < sizeof(c.warning));
    EXPECT(strstr(c.warning, "config: not handled by ZeroShard (left to the training program): "
                             "activation_checkpointing,") == c.warning);
    EXPECT(strstr(c.warning, "quantize_training; no effect here: zero_allow_untested_optimizer,") != NULL);
    EXPECT(strstr(c.warning, "no optimizer section") || strcmp(c.warning + strlen(c.warning) - 3, "...") == 0);
    return true;
}

static bool t_adam_modes(void)
{
    struct zs_config c;

    PARSE_OK("{" MB "'optimizer': {'type': 'Adam', 'params': {'lr': 0.001, 'betas': [0.8, 0.999], 'eps': 1e-8, "
             "'weight_decay': 3e-7}}}", 1, NULL, &c);
    EXPECT(c.optim.type == ZS_OPTIM_ADAMW && c.optim.beta1 == 0.8 && c.optim.weight_decay == 3e-7);
    PARSE_OK("{" MB "'optimizer': {'type': 'adam', 'params': {'lr': 0.1, 'adam_w_mode': false, "
             "'bias_correction': false, 'torch_adam': false, 'fused': false, 'amsgrad': false}}}", 1, NULL, &c);
    EXPECT(c.optim.type == ZS_OPTIM_ADAM && !c.optim.bias_correction);
    PARSE_OK("{" MB "'optimizer': {'type': 'ADAMW', 'params': {'lr': 0.1, 'adam_w_mode': false}}}", 1, NULL, &c);
    EXPECT(c.optim.type == ZS_OPTIM_ADAMW && c.optim.lr == 0.1);
    return true;
}

/* DeepSpeed refuses optimizer.params.max_grad_norm; taking it as gradient_clipping (or
 * ignoring it beside gradient_clipping) is said in the warning, naming both keys. */
static bool t_max_grad_norm(void)
{
    struct zs_config c;

    PARSE_OK("{" MB "'optimizer': {'type': 'Adam', 'params': {'lr': 1.5e-4, 'max_grad_norm': 1.0}}}", 1, NULL, &c);
    EXPECT(c.gradient_clipping == 1.0);
    EXPECT(strstr(c.warning, "optimizer.params.max_grad_norm 1 is used as gradient_clipping (DeepSpeed refuses "
                             "optimizer.params.max_grad_norm: move it to gradient_clipping)"));
    PARSE_OK("{" MB "'gradient_clipping': 2.0, 'optimizer': {'type': 'Adam', 'params': {'lr': 1, 'max_grad_norm': 1}}}",
             1, NULL, &c);
    EXPECT(c.gradient_clipping == 2.0);
    EXPECT(strstr(c.warning, "optimizer.params.max_grad_norm 1 is ignored: gradient_clipping 2 applies"));
    PARSE_OK("{" MB "'gradient_clipping': 2.0, 'optimizer': {'type': 'Adam', 'params': {'lr': 1}}}", 1, NULL, &c);
    EXPECT(!strstr(c.warning, "max_grad_norm"));
    return true;
}

/* torch_adam: true is DeepSpeed's torch.optim.AdamW (or Adam with adam_w_mode false for
 * type Adam), with torch's defaults: AdamW's weight_decay 0.01 unless the config gives one. */
static bool t_torch_adam(void)
{
    struct zs_config c;

    PARSE_OK("{" MB "'optimizer': {'type': 'AdamW', 'params': {'lr': 1e-3, 'torch_adam': true}}}", 1, NULL, &c);
    EXPECT(c.optim.type == ZS_OPTIM_ADAMW && c.optim.weight_decay == 0.01 && c.optim.bias_correction);
    EXPECT(c.optim.eps == 1e-8 && c.optim.beta1 == 0.9 && c.optim.beta2 == 0.999);
    EXPECT(strstr(c.warning, "optimizer.params.torch_adam: torch.optim.AdamW semantics (weight_decay 0.01)"));
    PARSE_OK("{" MB "'optimizer': {'type': 'Adam', 'params': {'lr': 1e-3, 'torch_adam': true}}}", 1, NULL, &c);
    EXPECT(c.optim.type == ZS_OPTIM_ADAMW && c.optim.weight_decay == 0.01); /* adam_w_mode defaults to true */
    PARSE_OK("{" MB "'optimizer': {'type': 'AdamW', 'params': {'lr': 1e-3, 'torch_adam': true, 'weight_decay': "
             "'auto'}}}", 1, NULL, &c);
    EXPECT(c.optim.weight_decay == 0.01);
    PARSE_OK("{" MB "'optimizer': {'type': 'AdamW', 'params': {'lr': 1e-3, 'torch_adam': true, 'weight_decay': 0}}}",
             1, NULL, &c);
    EXPECT(c.optim.type == ZS_OPTIM_ADAMW && c.optim.weight_decay == 0);
    PARSE_OK("{" MB "'optimizer': {'type': 'Adam', 'params': {'lr': 1e-3, 'torch_adam': true, 'adam_w_mode': "
             "false}}}", 1, NULL, &c);
    EXPECT(c.optim.type == ZS_OPTIM_ADAM && c.optim.weight_decay == 0); /* torch.optim.Adam: weight_decay 0 */
    EXPECT(strstr(c.warning, "torch.optim.Adam semantics (weight_decay 0)"));
    PARSE_OK("{" MB "'optimizer': {'type': 'AdamW', 'params': {'lr': 1e-3, 'torch_adam': false}}}", 1, NULL, &c);
    EXPECT(c.optim.weight_decay == 0 && !strstr(c.warning, "torch_adam"));
    return true;
}

static bool t_sgd(void)
{
    struct zs_config c;

    PARSE_OK("{" MB "'optimizer': {'type': 'SGD', 'params': {'lr': 0.1, 'momentum': 0.9, 'nesterov': true, "
             "'weight_decay': 1e-4}}}", 1, NULL, &c);
    EXPECT(c.optim.type == ZS_OPTIM_SGD && c.optim.momentum == 0.9 && c.optim.nesterov && c.optim.dampening == 0);
    EXPECT(c.optim.weight_decay == 1e-4);
    return true;
}

static bool t_lion(void)
{
    zs_auto_values av = {.lr = 3e-5};
    struct zs_config c;

    PARSE_OK("{" MB "'optimizer': {'type': 'Lion', 'params': {'lr': 1e-4}}}", 1, NULL, &c);
    EXPECT(c.optim.type == ZS_OPTIM_LION && c.optim.lr == 1e-4 && c.optim.beta1 == 0.9 && c.optim.beta2 == 0.999);
    EXPECT(c.optim.weight_decay == 0 && c.gradient_clipping == 0);
    PARSE_OK("{" MB "'optimizer': {'type': 'LION', 'params': {'lr': 2e-4, 'betas': [0.95, 0.98], "
             "'weight_decay': 0.1}}}", 1, NULL, &c);
    EXPECT(c.optim.type == ZS_OPTIM_LION && c.optim.beta1 == 0.95 && c.optim.beta2 == 0.98);
    EXPECT(c.optim.lr == 2e-4 && c.optim.weight_decay == 0.1);
    PARSE_OK("{" MB "'optimizer': {'type': 'lion', 'params': {'lr': 'auto', 'betas': 'auto', 'weight_decay': "
             "'auto'}}}", 1, &av, &c);
    EXPECT(c.optim.lr == 3e-5 && c.optim.beta1 == 0.9 && c.optim.beta2 == 0.999 && c.optim.weight_decay == 0);
    return true;
}

static bool t_adagrad(void)
{
    struct zs_config c;

    PARSE_OK("{" MB "'optimizer': {'type': 'Adagrad', 'params': {'lr': 1e-2}}}", 1, NULL, &c);
    EXPECT(c.optim.type == ZS_OPTIM_ADAGRAD && c.optim.lr == 1e-2 && c.optim.eps == 1e-10);
    EXPECT(c.optim.weight_decay == 0);
    PARSE_OK("{" MB "'optimizer': {'type': 'adagrad', 'params': {'lr': 0.1, 'eps': 1e-8, 'weight_decay': 1e-4, "
             "'lr_decay': 0, 'initial_accumulator_value': 0.0}}}", 1, NULL, &c);
    EXPECT(c.optim.type == ZS_OPTIM_ADAGRAD && c.optim.eps == 1e-8 && c.optim.weight_decay == 1e-4);
    PARSE_OK("{" MB "'optimizer': {'type': 'Adagrad', 'params': {'lr': 0.1, 'eps': 'auto'}}}", 1, NULL, &c);
    EXPECT(c.optim.eps == 1e-10);
    return true;
}

static bool t_zeroshard_section(void)
{
    struct zs_config c, d;

    PARSE_OK("{'train_micro_batch_size_per_gpu': 1}", 1, NULL, &c);
    EXPECT(c.zs.threads == 0 && strcmp(c.zs.kernel, "auto") == 0 && c.zs.bind && !strcmp(c.zs.device, "cpu"));
    PARSE_OK("{" MB "'zeroshard': {}}", 1, NULL, &d);
    EXPECT(memcmp(&c, &d, sizeof(c)) == 0);
    PARSE_OK("{" MB "'zeroshard': {'cpu_threads': 6, 'kernel': 'avx512', 'bind_threads': false, '_note': 1}}", 1,
             NULL, &c);
    EXPECT(c.zs.threads == 6 && strcmp(c.zs.kernel, "avx512") == 0 && !c.zs.bind);
    EXPECT(strstr(c.warning, "zeroshard") == NULL);
    PARSE_OK("{" MB "'zeroshard': {'cpu_threads': 'auto', 'kernel': 'scalar', 'bind_threads': true}}", 1, NULL, &c);
    EXPECT(c.zs.threads == 0 && strcmp(c.zs.kernel, "scalar") == 0 && c.zs.bind);
    PARSE_OK("{" MB "'zeroshard': {'cpu_threads': 2.0, 'kernel': 'avx2', 'bind_threads': true}}", 1, NULL, &c);
    EXPECT(c.zs.threads == 2 && strcmp(c.zs.kernel, "avx2") == 0);
    PARSE_OK("{" MB "'zeroshard': {'device': 'cuda'}}", 1, NULL, &c);
    EXPECT(!strcmp(c.zs.device, "cuda") && !strcmp(c.zs.device_comm, "auto"));
    PARSE_OK("{" MB "'zeroshard': {'device': 'cuda', 'device_comm': 'nccl'}}", 1, NULL, &c);
    EXPECT(!strcmp(c.zs.device_comm, "nccl"));
    PARSE_OK("{" MB "'zeroshard': {'device_comm': 'ordered', 'deterministic': 'world_size_invariant'}}", 1, NULL, &c);
    EXPECT(!strcmp(c.zs.device_comm, "ordered"));
    /* the bytes after the name are zero whatever was parsed before, so equal configs hash alike */
    PARSE_OK("{" MB "'zeroshard': {'kernel': 'auto'}}", 1, NULL, &d);
    PARSE_OK("{" MB "'zeroshard': {'kernel': 'avx512'}}", 1, NULL, &c);
    PARSE_OK("{" MB "'zeroshard': {'kernel': 'auto'}}", 1, NULL, &c);
    EXPECT(memcmp(&c, &d, sizeof(c)) == 0);
    return true;
}

static bool t_schedulers(void)
{
    struct zs_config c;

    PARSE_OK("{" MB "'optimizer': {'type': 'AdamW', 'params': {'lr': 3e-4}}, 'scheduler': {'type': 'warmuplr'}}", 1,
             NULL, &c);
    EXPECT(c.sched.type == ZS_SCHED_WARMUP_LR && c.sched.warmup_max_lr == 3e-4 && c.sched.warmup_min_lr == 0);
    EXPECT(c.sched.warmup_num_steps == 1000 && c.sched.warmup_type == ZS_WARMUP_LOG);
    PARSE_OK("{" MB "'scheduler': {'type': 'WarmupLR', 'params': {'warmup_min_lr': 1e-5, 'warmup_max_lr': 1e-3, "
             "'warmup_num_steps': 10, 'warmup_type': 'linear', 'last_batch_iteration': -1}}}", 1, NULL, &c);
    EXPECT(c.sched.warmup_min_lr == 1e-5 && c.sched.warmup_max_lr == 1e-3 && c.sched.warmup_type == ZS_WARMUP_LINEAR);
    PARSE_OK("{" MB "'scheduler': {'type': 'WarmupCosineLR', 'params': {'total_num_steps': 100, "
             "'warmup_min_ratio': 0.1, 'warmup_num_steps': 10}}}", 1, NULL, &c);
    EXPECT(c.sched.type == ZS_SCHED_WARMUP_COSINE_LR && c.sched.total_num_steps == 100);
    EXPECT(c.sched.warmup_min_ratio == 0.1 && c.sched.cos_min_ratio == 1e-4 && c.sched.warmup_num_steps == 10);
    /* DeepSpeed only warns when the schedule has no decay phase; so do we */
    PARSE_OK("{" MB "'optimizer': {'type': 'SGD', 'params': {'lr': 1}}, "
             "'scheduler': {'type': 'WarmupDecayLR', 'params': {'total_num_steps': 10}}}", 1, NULL, &c);
    EXPECT(strstr(c.warning, "total_num_steps 10 <= warmup_num_steps 1000") != NULL);
    return true;
}

static bool t_precision_disabled(void)
{
    struct zs_config c;

    PARSE_OK("{" MB "'fp16': {'enabled': false, 'loss_scale': 1024, 'initial_scale_power': 32, "
             "'loss_scale_window': 500, 'hysteresis': 3, 'consecutive_hysteresis': true, 'min_loss_scale': 0, "
             "'auto_cast': true}, "
             "'bfloat16': {'enabled': 'auto', 'immediate_grad_update': true}, 'fp8': {'enabled': false, 'x': 1}}",
             1, NULL, &c);
    EXPECT(!c.fp16.enabled && c.fp16.loss_scale == 1024 && c.fp16.initial_scale_power == 32);
    EXPECT(c.fp16.loss_scale_window == 500 && c.fp16.hysteresis == 3 && c.fp16.consecutive_hysteresis);
    EXPECT(c.fp16.min_loss_scale == 0 && !c.bf16_enabled);
    EXPECT(c.param_dtype == ZS_DTYPE_FP32 && c.comm_dtype == ZS_DTYPE_FP32);
    return true;
}

static bool t_precision_enabled(void)
{
    struct zs_config c;

    PARSE_OK("{" MB "'fp16': {'enabled': true}}", 1, NULL, &c);
    EXPECT(c.param_dtype == ZS_DTYPE_FP16 && c.comm_dtype == ZS_DTYPE_FP16 && c.fp16.loss_scale == 0);
    EXPECT(c.fp16.initial_scale_power == 16 && c.fp16.loss_scale_window == 1000 && c.fp16.hysteresis == 2);
    EXPECT(!c.fp16.consecutive_hysteresis && c.fp16.min_loss_scale == 1);
    PARSE_OK("{" MB "'bf16': {'enabled': true}, 'communication_data_type': 'fp32', 'zero_optimization': {'stage': 2}}",
             2, NULL, &c);
    EXPECT(c.param_dtype == ZS_DTYPE_BF16 && c.comm_dtype == ZS_DTYPE_FP32);
    EXPECT(!strstr(c.warning, "communication_data_type")); /* honoured: never listed as having no effect */
    EXPECT(zs_config_state_bytes(&c) == 12); /* fp32 master, m, v */
    PARSE_OK("{" MB "'bf16': {'enabled': true}, 'zero_optimization': {'stage': 3, 'offload_optimizer': {'device': "
             "'nvme', 'nvme_path': '/x'}, 'offload_param': {'device': 'nvme', 'nvme_path': '/x'}}}", 2, NULL, &c);
    EXPECT(c.param_dtype == ZS_DTYPE_BF16 && c.zero.offload_param.device == ZS_OFFLOAD_NVME); /* 16-bit shards on NVMe */
    return true;
}

static bool t_offload_none(void)
{
    struct zs_config c;

    PARSE_OK("{" MB "'zero_optimization': {'stage': 0, 'offload_optimizer': {'device': 'none', 'pin_memory': false, "
             "'buffer_count': 8, 'pipeline_read': true, 'fast_init': true, 'ratio': 0.5}, 'offload_param': "
             "{'device': null, 'nvme_path': '/mnt/nvme', 'buffer_size': 1e9, 'max_in_cpu': 1}}}",
             1, NULL, &c);
    EXPECT(c.zero.offload_optimizer.device == ZS_OFFLOAD_NONE && !c.zero.offload_optimizer.pin_memory);
    EXPECT(c.zero.offload_optimizer.buffer_count == 8 && c.zero.offload_optimizer.pipeline_read);
    EXPECT(c.zero.offload_optimizer.fast_init && c.zero.offload_optimizer.ratio == 0.5);
    EXPECT(c.zero.offload_param.device == ZS_OFFLOAD_NONE && strcmp(c.zero.offload_param.nvme_path, "/mnt/nvme") == 0);
    EXPECT(c.zero.offload_param.buffer_size == 1000000000 && c.zero.offload_param.max_in_cpu == 1);
    return true;
}

static bool t_case_and_nearby_keys(void)
{
    struct zs_config c;
    char err[256];

    PARSE_OK("{" MB "'optimizer': {'type': 'sGd', 'params': {'lr': 1}}, 'scheduler': {'type': 'WARMUPDECAYLR', "
             "'params': {'total_num_steps': 2000}}}", 1, NULL, &c);
    EXPECT(c.optim.type == ZS_OPTIM_SGD && c.sched.type == ZS_SCHED_WARMUP_DECAY_LR);
    /* a key that differs only in case is suggested; a distant short one is not */
    EXPECT(parse("{" MB "'Fp16': {}}", 1, NULL, &c, err, sizeof(err)) == -EINVAL);
    EXPECT(strcmp(err, "Fp16: unknown key (did you mean 'fp16'?)") == 0);
    EXPECT(parse("{" MB "'foo': {}}", 1, NULL, &c, err, sizeof(err)) == -EINVAL);
    EXPECT(strcmp(err, "foo: unknown key") == 0);
    return true;
}

static bool t_null_autov_is_zero_autov(void)
{
    zs_auto_values none = {0};
    struct zs_config a, b;
    const char *json = "{'train_batch_size': 32, 'gradient_clipping': 'auto', 'zero_optimization': {'stage': 2}}";

    PARSE_OK(json, 4, NULL, &a);
    PARSE_OK(json, 4, &none, &b);
    EXPECT(memcmp(&a, &b, sizeof(a)) == 0);
    EXPECT(a.micro_batch_size == 8 && a.world_size == 4);
    return true;
}

static bool t_small_error_buffers(void)
{
    struct zs_config c;
    char err[8];

    EXPECT(zs_config_parse(&c, "{\"zero_optimization\": {\"stage\": 9}}", "<json>", 1, NULL, err, sizeof(err)) ==
           -EINVAL);
    EXPECT(strlen(err) == sizeof(err) - 1);
    EXPECT(zs_config_parse(&c, "{\"zero_optimization\": {\"stage\": 9}}", "<json>", 1, NULL, NULL, 0) == -EINVAL);
    EXPECT(zs_config_parse(&c, "{", NULL, 1, NULL, err, sizeof(err)) == -EINVAL);
    EXPECT(zs_config_parse(&c, NULL, NULL, 1, NULL, err, sizeof(err)) == -EINVAL);
    {   /* a syntax error whose quoted text holds a newline and a tab: still one line (a fuzzer's find) */
        char msg[256];

        EXPECT(zs_config_parse(&c, "{\n  \"trap\\\n\t\"x\": 1}\n", "<json>", 1, NULL, msg, sizeof(msg)) == -EINVAL);
        EXPECT(msg[0] && !strchr(msg, '\n') && !strchr(msg, '\t'));
        EXPECT(strstr(msg, "\\n") != NULL);
    }
    return true;
}

static bool t_read_file(void)
{
    static const char text[] = "{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": 1}}\n";
    char path[] = "/tmp/zs_test_config_XXXXXX", err[256];
    struct zs_config c;
    char *got = NULL;
    bool same;
    int fd, rc;

    fd = mkstemp(path);
    EXPECT(fd >= 0);
    same = write(fd, text, sizeof(text) - 1) == (ssize_t)(sizeof(text) - 1);
    close(fd);
    rc = zs_config_read_file(path, &got);
    if (same && rc == 0)
        same = strcmp(got, text) == 0 && zs_config_parse(&c, got, path, 2, NULL, err, sizeof(err)) == 0 &&
               c.micro_batch_size == 4 && c.zero.stage == 1;
    free(got);
    fd = open(path, O_WRONLY | O_TRUNC);
    if (fd >= 0) {
        if (write(fd, "{}\0{}", 5) != 5)
            same = false;
        close(fd);
    }
    got = NULL;
    EXPECT(zs_config_read_file(path, &got) == -EINVAL && got == NULL);
    unlink(path);
    EXPECT(rc == 0 && same);
    EXPECT(zs_config_read_file(path, &got) == -ENOENT && got == NULL);
    EXPECT(zs_config_read_file("/tmp", &got) == -EISDIR && got == NULL);
    return true;
}

/* Whatever the bytes, the parser answers 0 or -EINVAL; AddressSanitizer watches for the rest. */
static bool t_mangled_input(void)
{
    static const char base[] =
        "{\"train_batch_size\": 16, \"gradient_accumulation_steps\": 1, \"optimizer\": {\"type\": \"AdamW\", "
        "\"params\": {\"lr\": 1e-4, \"betas\": [0.9, 0.95]}}, \"scheduler\": {\"type\": \"WarmupDecayLR\", "
        "\"params\": {\"total_num_steps\": 100}}, \"zero_optimization\": {\"stage\": 3, \"offload_param\": "
        "{\"device\": \"none\"}, \"stage3_max_live_parameters\": 1e9}, \"aio\": {\"thread_count\": 1}, "
        "\"fp16\": {\"enabled\": \"auto\"}, \"_c\": null, \"tensorboard\": {\"enabled\": false}, "
        "\"zeroshard\": {\"kernel\": \"avx2\", \"cpu_threads\": 2}}";
    char buf[sizeof(base)], err[128];
    struct zs_config c;
    unsigned int seed = 12345;
    size_t n = sizeof(base) - 1;

    EXPECT(zs_config_parse(&c, base, "<json>", 2, NULL, err, sizeof(err)) == 0);
    for (size_t cut = 0; cut < n; cut++) {
        memcpy(buf, base, cut);
        buf[cut] = '\0';
        int rc = zs_config_parse(&c, buf, "<json>", 2, NULL, err, sizeof(err));
        EXPECT(rc == 0 || rc == -EINVAL);
    }
    for (int i = 0; i < 4000; i++) {
        memcpy(buf, base, sizeof(base));
        for (int k = 0; k < 3; k++) {
            seed = seed * 1103515245u + 12345u;
            size_t at = (seed >> 8) % n;
            seed = seed * 1103515245u + 12345u;
            buf[at] = "{}[]\":,0123456789.eE-+ \\aAtfnu_"[(seed >> 8) % 32];
        }
        int rc = zs_config_parse(&c, buf, "<json>", 1 + i % 3, NULL, err, sizeof(err));
        EXPECT((rc == 0 || rc == -EINVAL) && strlen(err) < sizeof(err) && !strchr(err, '\n'));
    }
    return true;
}

static const struct {
    const char *name;
    bool (*fn)(void);
} ok_cases[] = {
    {"defaults", t_defaults},
    {"batch arithmetic", t_batch_arithmetic},
    {"auto from the program", t_auto_from_program},
    {"auto takes DeepSpeed defaults", t_auto_defaults},
    {"whole reals as integers", t_whole_reals},
    {"legacy zero_optimization true/false", t_legacy_zero_bool},
    {"stage-3 defaults and unprefixed aliases", t_stage3_defaults_and_aliases},
    {"underscore keys are comments", t_comment_keys},
    {"warning line", t_warning_line},
    {"warning line fits its buffer", t_warning_fits},
    {"Adam, AdamW and adam_w_mode", t_adam_modes},
    {"legacy max_grad_norm warns naming both keys", t_max_grad_norm},
    {"torch_adam: torch.optim.AdamW defaults", t_torch_adam},
    {"SGD with nesterov", t_sgd},
    {"Lion defaults and explicit betas", t_lion},
    {"Adagrad defaults", t_adagrad},
    {"zeroshard section defaults and values", t_zeroshard_section},
    {"schedulers", t_schedulers},
    {"precision blocks parsed while disabled", t_precision_disabled},
    {"fp16 and bf16 enabled: dtypes and DeepSpeed's loss-scale defaults", t_precision_enabled},
    {"offload blocks with device none", t_offload_none},
    {"type names ignore case; did-you-mean limits", t_case_and_nearby_keys},
    {"NULL auto values equal zero auto values", t_null_autov_is_zero_autov},
    {"small and missing error buffers", t_small_error_buffers},
    {"zs_config_read_file", t_read_file},
    {"mangled input never crashes", t_mangled_input},
};

int main(void)
{
    for (size_t i = 0; i < sizeof(err_cases) / sizeof(err_cases[0]); i++)
        run_err_case(&err_cases[i]);
    for (size_t i = 0; i < sizeof(ok_cases) / sizeof(ok_cases[0]); i++) {
        why[0] = '\0';
        zs_test_report(ok_cases[i].name, ok_cases[i].fn() ? NULL : why);
    }
    printf("%d passed, %d failed\n", zs_test_pass, zs_test_fail);
    return zs_test_fail > 0;
}
