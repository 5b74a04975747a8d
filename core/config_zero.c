/* config_zero.c - the zero_optimization and aio sections of a DeepSpeed config: stage, bucket sizes, stage-3
 * knobs and offload, including the legacy spellings (cpu_offload, unprefixed stage-3 keys) real files carry. */
#include <errno.h>
#include <stddef.h>
#include <string.h>

#include "config.h"       /* defines: struct zs_zero_config, struct zs_aio_config */
#include "config_json.h"  /* defines: zs_cfg_get_int, zs_cfg_fail, zs_cfg_defer */

typedef struct zs_cfg_parser parser;

static const char *const zero_keys[] = {
    "stage", "contiguous_gradients", "reduce_scatter", "allgather_partitions", "overlap_comm",
    "round_robin_gradients", "reduce_bucket_size", "allgather_bucket_size", "sub_group_size",
    "stage3_prefetch_bucket_size", "prefetch_bucket_size", "stage3_param_persistence_threshold",
    "param_persistence_threshold", "stage3_max_live_parameters", "max_live_parameters",
    "stage3_max_reuse_distance", "max_reuse_distance", "stage3_gather_16bit_weights_on_model_save",
    "gather_16bit_weights_on_model_save", "stage3_gather_fp16_weights_on_model_save", "offload_optimizer",
    "offload_param", "cpu_offload", "cpu_offload_params", "cpu_offload_use_pin_memory", "load_from_fp32_weights",
    "elastic_checkpoint", "ignore_unused_parameters", "memory_efficient_linear", "use_multi_rank_bucket_allreduce",
    "legacy_stage1", "zero_hpz_partition_size", "zero_quantized_weights", "zero_quantized_nontrainable_weights",
    "zero_quantized_gradients", "mics_shard_size", "mics_hierarchical_params_gather", NULL,
};

/* Sizes in elements; the stage-3 ones also go by their unprefixed names. "auto" takes the default, since
 * the model dimension the Hugging Face trainer would derive them from is not known here. */
static const struct zero_int {
    const char *key, *alt;
    double lo, def;
    size_t off;
} zero_ints[] = {
    {"reduce_bucket_size", NULL, 1, 5e8, offsetof(struct zs_zero_config, reduce_bucket_size)},
    {"allgather_bucket_size", NULL, 1, 5e8, offsetof(struct zs_zero_config, allgather_bucket_size)},
    {"sub_group_size", NULL, 0, 1e9, offsetof(struct zs_zero_config, sub_group_size)},
    {"stage3_prefetch_bucket_size", "prefetch_bucket_size", 0, 5e7,
     offsetof(struct zs_zero_config, prefetch_bucket_size)},
    {"stage3_param_persistence_threshold", "param_persistence_threshold", 0, 1e5,
     offsetof(struct zs_zero_config, param_persistence_threshold)},
    {"stage3_max_live_parameters", "max_live_parameters", 0, 1e9,
     offsetof(struct zs_zero_config, max_live_parameters)},
    {"stage3_max_reuse_distance", "max_reuse_distance", 0, 1e9, offsetof(struct zs_zero_config, max_reuse_distance)},
};

static const struct zero_bool {
    const char *key;
    bool def;
    size_t off;
} zero_bools[] = {
    {"contiguous_gradients", true, offsetof(struct zs_zero_config, contiguous_gradients)},
    {"reduce_scatter", true, offsetof(struct zs_zero_config, reduce_scatter)},
    {"allgather_partitions", true, offsetof(struct zs_zero_config, allgather_partitions)},
    {"round_robin_gradients", false, offsetof(struct zs_zero_config, round_robin_gradients)},
};

/* Accepted, named in the warning: they tune DeepSpeed internals ZeroShard does not have. */
static const char *const zero_noeffect[] = {
    "round_robin_gradients", "load_from_fp32_weights", "elastic_checkpoint", "ignore_unused_parameters",
    "memory_efficient_linear", "use_multi_rank_bucket_allreduce", NULL,
};

static const struct zs_cfg_gate zero_gates[] = {
    {"legacy_stage1", false, 0, 0, "the legacy stage-1 implementation is not supported"},
    {"zero_quantized_nontrainable_weights", false, 0, 0, "ZeRO++ quantized weights are not supported"},
    {"mics_hierarchical_params_gather", false, 0, 0,
     "MiCS hierarchical gathering is not supported (a shard group's gather is one collective)"},
};

/* ---------------------------------------------------------------- offload */

static const char *const offload_optimizer_keys[] = {
    "device", "nvme_path", "pin_memory", "buffer_count", "pipeline_read", "pipeline_write", "fast_init", "ratio", NULL,
};
static const char *const offload_param_keys[] = {
    "device", "nvme_path", "pin_memory", "buffer_count", "buffer_size", "max_in_cpu", NULL,
};

static int get_device(parser *p, json_t *sec, const char *path, enum zs_offload_device *out)
{
    const char *s;

    if (zs_cfg_get_str(p, sec, path, "device", &s))
        return -EINVAL;
    *out = ZS_OFFLOAD_NONE;
    if (!s || strcmp(s, "none") == 0)
        return 0;
    if (strcmp(s, "cpu") == 0 || strcmp(s, "nvme") == 0) {
        *out = s[0] == 'c' ? ZS_OFFLOAD_CPU : ZS_OFFLOAD_NVME;
        return 0;
    }
    return zs_cfg_fail(p, path, "device", "expected \"none\", \"cpu\" or \"nvme\", got \"%.40s\"", s);
}

/* Keys of the other block were refused by the key check, so reading all of them (absent -> default) is safe. */
static int parse_offload(parser *p, json_t *zo, const char *name, bool param, struct zs_offload_config *o)
{
    char path[64];
    const char *nvme;
    json_t *sec;

    snprintf(path, sizeof(path), "zero_optimization.%s", name);
    if (zs_cfg_get_obj(p, zo, "zero_optimization", name, &sec) ||
        (sec && zs_cfg_check_keys(p, sec, path, param ? offload_param_keys : offload_optimizer_keys, NULL, NULL)) ||
        get_device(p, sec, path, &o->device) || zs_cfg_get_str(p, sec, path, "nvme_path", &nvme) ||
        zs_cfg_get_bool(p, sec, path, "pin_memory", true, false, &o->pin_memory) ||
        zs_cfg_get_int(p, sec, path, "buffer_count", &(struct zs_cfg_spec){ZS_GE(1), .def = param ? 5 : 4},
                       &o->buffer_count) ||
        zs_cfg_get_int(p, sec, path, "buffer_size", &(struct zs_cfg_spec){ZS_GE(1), .def = 1e8}, &o->buffer_size) ||
        zs_cfg_get_int(p, sec, path, "max_in_cpu", &(struct zs_cfg_spec){ZS_GE(0), .def = 1e9}, &o->max_in_cpu) ||
        zs_cfg_get_bool(p, sec, path, "pipeline_read", false, false, &o->pipeline_read) ||
        zs_cfg_get_bool(p, sec, path, "pipeline_write", false, false, &o->pipeline_write) ||
        zs_cfg_get_bool(p, sec, path, "fast_init", false, false, &o->fast_init) ||
        zs_cfg_get_num(p, sec, path, "ratio", &(struct zs_cfg_spec){ZS_IN_OC(0, 1), .def = 1.0}, &o->ratio))
        return -EINVAL;
    /* The swapper always reads ahead and writes behind, and holds no parameters in host memory beyond
     * buffer_count read-ahead shards: these tune DeepSpeed's swapper and change nothing here. */
    static const char *const tuning[] = {"buffer_size", "max_in_cpu", "pipeline_read", "pipeline_write", "fast_init",
                                         NULL};
    for (const char *const *k = tuning; sec && *k; k++)
        if (json_object_get(sec, *k))
            zs_cfg_list_add(p->noeffect, sizeof(p->noeffect), ", ", path, *k);
    if (nvme && strlen(nvme) >= sizeof(o->nvme_path))
        return zs_cfg_fail(p, path, "nvme_path", "longer than %zu bytes", sizeof(o->nvme_path) - 1);
    if (nvme)
        memcpy(o->nvme_path, nvme, strlen(nvme) + 1);
    return 0;
}

/* DeepSpeed refuses a deprecated key beside its replacement; so do we, whatever the values. */
static int parse_legacy_offload(parser *p, json_t *zo, struct zs_zero_config *zc, bool *opt, bool *param)
{
    const char *zp = "zero_optimization";
    bool has_opt = json_object_get(zo, "offload_optimizer"), has_param = json_object_get(zo, "offload_param");
    bool pin;

    if (json_object_get(zo, "cpu_offload") && has_opt)
        return zs_cfg_fail(p, zp, "cpu_offload", "legacy form of offload_optimizer; give only one of them");
    if (json_object_get(zo, "cpu_offload_params") && has_param)
        return zs_cfg_fail(p, zp, "cpu_offload_params", "legacy form of offload_param; give only one of them");
    if (json_object_get(zo, "cpu_offload_use_pin_memory") && (has_opt || has_param))
        return zs_cfg_fail(p, zp, "cpu_offload_use_pin_memory",
                           "legacy key; set pin_memory inside offload_optimizer / offload_param instead");
    if (zs_cfg_get_bool(p, zo, zp, "cpu_offload", false, false, opt) ||
        zs_cfg_get_bool(p, zo, zp, "cpu_offload_params", false, false, param) ||
        zs_cfg_get_bool(p, zo, zp, "cpu_offload_use_pin_memory", true, false, &pin))
        return -EINVAL;
    if (*opt)
        zc->offload_optimizer.device = ZS_OFFLOAD_CPU;
    if (*param)
        zc->offload_param.device = ZS_OFFLOAD_CPU;
    if (json_object_get(zo, "cpu_offload_use_pin_memory"))
        zc->offload_optimizer.pin_memory = zc->offload_param.pin_memory = pin;
    return 0;
}

/* Configuration mistakes first (hard errors), then the refusal of offload itself (deferred). */
static int check_offload(parser *p, const struct zs_zero_config *zc, bool param, bool legacy)
{
    const struct zs_offload_config *o = param ? &zc->offload_param : &zc->offload_optimizer;
    const char *path = param ? (legacy ? "zero_optimization.cpu_offload_params" : "zero_optimization.offload_param")
                             : (legacy ? "zero_optimization.cpu_offload" : "zero_optimization.offload_optimizer");

    if (o->device == ZS_OFFLOAD_NONE)
        return 0;
    if (o->device == ZS_OFFLOAD_NVME && !o->nvme_path[0])
        return zs_cfg_fail(p, path, "nvme_path", "missing; device \"nvme\" needs a directory");
    if (!param && zc->stage == 0)
        return zs_cfg_fail(p, path, NULL, "optimizer offload needs ZeRO stage 1, 2 or 3 (stage is 0)");
    if (param && zc->stage != 3)
        return zs_cfg_fail(p, path, NULL, "parameter offload needs ZeRO stage 3 (stage is %d)", zc->stage);
    /* NVMe parameter shards are the optimizer's fp32 masters: they live in the optimizer's swap file,
     * next to their moments, and are updated there by the pipelined step. */
    if (o->device == ZS_OFFLOAD_NVME && param && zc->offload_optimizer.device != ZS_OFFLOAD_NVME)
        return zs_cfg_fail(p, path, "device",
                           "\"nvme\" needs offload_optimizer.device \"nvme\" too (the parameter shards are the "
                           "optimizer's fp32 masters and share its swap file)");
    if (o->device == ZS_OFFLOAD_NVME && param && strcmp(o->nvme_path, zc->offload_optimizer.nvme_path) != 0)
        return zs_cfg_fail(p, path, "nvme_path", "\"%s\" differs from offload_optimizer.nvme_path \"%s\" "
                           "(the parameter shards share the optimizer's swap file)", o->nvme_path,
                           zc->offload_optimizer.nvme_path);
    if (!param && o->ratio != 1.0)
        zs_cfg_defer(p, path, "ratio", "partial offload (ratio %g < 1) is not implemented yet", o->ratio);
    return 0;
}

/* ---------------------------------------------------------------- aio */

static const char *const aio_keys[] = {
    "block_size", "queue_depth", "intra_op_parallelism", "thread_count", "single_submit", "overlap_events",
    "use_gds", NULL,
};

static int parse_aio(parser *p, struct zs_config *cfg, json_t *root)
{
    static const struct zs_cfg_gate gds = {"use_gds", false, 0, 0, "GPUDirect Storage is not supported"};
    struct zs_aio_config *a = &cfg->aio;
    const char *threads;
    json_t *sec;
    bool nvme;

    if (zs_cfg_get_obj(p, root, "", "aio", &sec) ||
        (sec && zs_cfg_check_keys(p, sec, "aio", aio_keys, NULL, NULL)) ||
        zs_cfg_pick_alias(p, sec, "aio", "intra_op_parallelism", "thread_count", &threads) ||
        zs_cfg_get_int(p, sec, "aio", "block_size", &(struct zs_cfg_spec){ZS_GE(512), .def = 1048576},
                       &a->block_size) ||
        zs_cfg_get_int(p, sec, "aio", "queue_depth", &(struct zs_cfg_spec){ZS_GE(1), .def = 8}, &a->queue_depth) ||
        zs_cfg_get_int(p, sec, "aio", threads, &(struct zs_cfg_spec){ZS_GE(1), .def = 1}, &a->intra_op_parallelism) ||
        zs_cfg_get_bool(p, sec, "aio", "single_submit", false, false, &a->single_submit) ||
        zs_cfg_get_bool(p, sec, "aio", "overlap_events", true, false, &a->overlap_events) ||
        zs_cfg_check_gate(p, sec, "aio", &gds))
        return -EINVAL;
    static const char *const tuning[] = {"single_submit", "overlap_events", "intra_op_parallelism", "thread_count",
                                         NULL};
    nvme = cfg->zero.offload_optimizer.device == ZS_OFFLOAD_NVME || cfg->zero.offload_param.device == ZS_OFFLOAD_NVME;
    for (const char *const *k = tuning; nvme && sec && *k; k++) /* one ring, batched submits, completions as they come */
        if (json_object_get(sec, *k))
            zs_cfg_list_add(p->noeffect, sizeof(p->noeffect), ", ", "aio", *k);
    if (sec && !nvme)
        zs_cfg_list_add(p->noeffect, sizeof(p->noeffect), ", ", "", "aio (no NVMe offload configured)");
    return 0;
}

/* ---------------------------------------------------------------- zero_optimization */

/* Hybrid sharding: -1 (or absent) shards over every rank. Whether the size divides the world, and the stage it
 * needs, are checked where the engine starts (runtime/engine.c: start_hybrid), with the world size in hand. */
static int parse_mics(parser *p, json_t *zo, struct zs_zero_config *zc)
{
    const char *zp = "zero_optimization";

    if (zs_cfg_get_int(p, zo, zp, "mics_shard_size", &(struct zs_cfg_spec){ZS_GE(-1), .def = -1, .no_auto = true},
                       &zc->mics_shard_size))
        return -EINVAL;
    if (zc->mics_shard_size == 0)
        return zs_cfg_fail(p, zp, "mics_shard_size", "0 is not a shard group size (-1: every rank, else >= 1)");
    return 0;
}

/* ZeRO++ hpZ: 0 or 1 (or absent) is off. Stage 3 only (DeepSpeed applies it there), and not with offload_param (the
 * secondary copy would live in the memory the offload frees); whether it divides the shard group is checked where
 * the engine starts (runtime/hybrid.c: zs_hpz_start), with the world size in hand. Called after the offloads. */
static int check_hpz(parser *p, json_t *zo, struct zs_zero_config *zc)
{
    const char *zp = "zero_optimization", *k = "zero_hpz_partition_size";
    int64_t h = zc->hpz_partition_size;

    if (zs_cfg_get_int(p, zo, zp, k, &(struct zs_cfg_spec){ZS_GE(0), .def = 0, .no_auto = true}, &h))
        return -EINVAL;
    zc->hpz_partition_size = h;
    if (h <= 1)
        return 0;
    if (zc->stage != 3)
        return zs_cfg_fail(p, zp, k, "%lld needs ZeRO stage 3 (ZeRO++ hpZ: a secondary copy of stage 3's "
                           "parameter shards for its re-gathers); this is stage %d", (long long)h, zc->stage);
    if (zc->offload_param.device != ZS_OFFLOAD_NONE)
        return zs_cfg_fail(p, zp, k, "%lld is not implemented with zero_optimization.offload_param (the "
                           "secondary copy would live in the memory the offload frees)", (long long)h);
    return 0;
}

static int parse_zero_keys(parser *p, json_t *zo, struct zs_zero_config *zc)
{
    const char *zp = "zero_optimization", *key;

    for (size_t i = 0; i < sizeof(zero_ints) / sizeof(zero_ints[0]); i++) {
        const struct zero_int *t = &zero_ints[i];
        key = t->key;
        if ((t->alt && zs_cfg_pick_alias(p, zo, zp, t->key, t->alt, &key)) ||
            zs_cfg_get_int(p, zo, zp, key, &(struct zs_cfg_spec){ZS_GE(t->lo), .def = t->def},
                           (int64_t *)((char *)zc + t->off)))
            return -EINVAL;
    }
    for (size_t i = 0; i < sizeof(zero_bools) / sizeof(zero_bools[0]); i++)
        if (zs_cfg_get_bool(p, zo, zp, zero_bools[i].key, zero_bools[i].def, false,
                            (bool *)((char *)zc + zero_bools[i].off)))
            return -EINVAL;
    if (zs_cfg_pick_alias(p, zo, zp, "stage3_gather_16bit_weights_on_model_save",
                          "gather_16bit_weights_on_model_save", &key) ||
        zs_cfg_pick_alias(p, zo, zp, key, "stage3_gather_fp16_weights_on_model_save", &key) ||
        zs_cfg_get_bool(p, zo, zp, key, false, false, &zc->gather_16bit_weights_on_model_save) ||
        zs_cfg_get_bool(p, zo, zp, "overlap_comm", zc->stage == 3, false, &zc->overlap_comm) ||
        parse_mics(p, zo, zc) ||
        zs_cfg_get_bool(p, zo, zp, "zero_quantized_weights", false, false, &zc->quantized_weights) ||
        zs_cfg_get_bool(p, zo, zp, "zero_quantized_gradients", false, false, &zc->quantized_gradients))
        return -EINVAL;
    for (size_t i = 0; i < sizeof(zero_gates) / sizeof(zero_gates[0]); i++)
        if (zs_cfg_check_gate(p, zo, zp, &zero_gates[i]))
            return -EINVAL;
    for (const char *const *k = zero_noeffect; zo && *k; k++) {
        bool unused;
        if (zs_cfg_get_bool(p, zo, zp, *k, false, false, &unused))
            return -EINVAL;
        if (json_object_get(zo, *k))
            zs_cfg_list_add(p->noeffect, sizeof(p->noeffect), ", ", zp, *k);
    }
    return 0;
}

int zs_cfg_parse_zero(parser *p, struct zs_config *cfg, json_t *root)
{
    struct zs_zero_config *zc = &cfg->zero;
    json_t *v = json_object_get(root, "zero_optimization"), *zo = NULL;
    bool legacy_opt = false, legacy_param = false;
    int64_t stage = 0;
    char got[64];

    if (json_is_boolean(v)) {
        stage = json_is_true(v); /* the pre-stage form: true meant ZeRO stage 1 */
    } else if (json_is_object(v)) {
        zo = v;
    } else if (v && !json_is_null(v)) {
        zs_cfg_describe(v, got, sizeof(got));
        return zs_cfg_fail(p, "", "zero_optimization", "expected an object (or legacy true/false), got %s", got);
    }
    if ((zo && zs_cfg_check_keys(p, zo, "zero_optimization", zero_keys, NULL, NULL)) ||
        zs_cfg_get_int(p, zo, "zero_optimization", "stage", &(struct zs_cfg_spec){ZS_IN(0, 3), .def = (double)stage,
                       .no_auto = true}, &stage))
        return -EINVAL;
    zc->stage = (int)stage;
    if (parse_zero_keys(p, zo, zc) ||
        parse_offload(p, zo, "offload_optimizer", false, &zc->offload_optimizer) ||
        parse_offload(p, zo, "offload_param", true, &zc->offload_param) ||
        (zo && parse_legacy_offload(p, zo, zc, &legacy_opt, &legacy_param)) ||
        check_offload(p, zc, false, legacy_opt) || check_offload(p, zc, true, legacy_param) || check_hpz(p, zo, zc))
        return -EINVAL;
    return parse_aio(p, cfg, root);
}
