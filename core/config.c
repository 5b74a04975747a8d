/* config.c - reads a DeepSpeed JSON config into struct zs_config: DeepSpeed's defaults and batch arithmetic,
 * "auto" resolution, and a refusal by key path of anything ZeroShard would otherwise silently not do. The
 * top level, batch sizes and precision are here; the other sections in config_optim.c (optimizer,
 * scheduler), config_zero.c (zero_optimization, aio) and config_zeroshard.c. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "config.h"       /* defines: struct zs_config, zs_config_parse */
#include "config_json.h"  /* defines: struct zs_cfg_parser, zs_cfg_get_int, zs_cfg_fail */

typedef struct zs_cfg_parser parser;
typedef struct zs_cfg_spec spec;

/* ---------------------------------------------------------------- top-level names */

static const char *const top_keys[] = {
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "gradient_clipping",
    "steps_per_print", "wall_clock_breakdown", "prescale_gradients", "gradient_predivide_factor", "optimizer",
    "scheduler", "fp16", "bf16", "bfloat16", "fp8", "zero_optimization", "aio", "sparse_gradients", "amp",
    "tensor_parallel", "pipeline", "elasticity", "sequence_parallel_size", "zeroshard", "communication_data_type",
    NULL,
};

/* Accepted with any content: the training program, not the optimizer runtime, acts on these. */
static const char *const program_sections[] = {
    "activation_checkpointing", "tensorboard", "wandb", "csv_monitor", "comet", "monitor_config",
    "flops_profiler", "comms_logger", "comms_config", "autotuning", "checkpoint", "data_efficiency",
    "curriculum_learning", "compression_training", "dump_state", "sparse_attention", "eigenvalue",
    "progressive_layer_drop", "timers", "data_types", "weight_quantization", "hybrid_engine", "nebula",
    "quantize_training", NULL,
};

static const char *const noeffect_keys[] = {
    "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer", "cuda_visible_devices",
    "disable_allgather", "memory_breakdown", NULL,
};

static int check_top_keys(parser *p, json_t *root)
{
    const char *const *const lists[] = {top_keys, program_sections, noeffect_keys, NULL};
    const char *key;
    json_t *v;

    json_object_foreach(root, key, v) {
        if (key[0] == '_' || zs_cfg_in_list(key, top_keys))
            continue;
        if (zs_cfg_in_list(key, program_sections))
            zs_cfg_list_add(p->program, sizeof(p->program), ", ", "", key);
        else if (zs_cfg_in_list(key, noeffect_keys))
            zs_cfg_list_add(p->noeffect, sizeof(p->noeffect), ", ", "", key);
        else
            return zs_cfg_unknown_key(p, "", key, lists);
    }
    return 0;
}

/* ---------------------------------------------------------------- batch sizes */

/* Absent or an unresolved "auto" reads as 0 (not set); the arithmetic below fills it in. */
static int get_batch(parser *p, json_t *root, const char *key, int64_t autov, int64_t *out, bool *is_auto)
{
    json_t *v = json_object_get(root, key);

    *out = 0;
    *is_auto = zs_cfg_is_auto(v);
    if (*is_auto) {
        *out = autov > 0 ? autov : 0;
        return 0;
    }
    return zs_cfg_get_int(p, root, "", key, &(spec){ZS_GE(1)}, out);
}

static bool mul_ok(int64_t a, int64_t b, int64_t *r)
{
    if (a > INT64_MAX / b)
        return false;
    *r = a * b;
    return true;
}

/* A batch size the others must divide; *q = tb / (x * world). */
static int divide_batch(parser *p, int64_t tb, int64_t x, const char *xname, int64_t w, int64_t *q)
{
    int64_t d;

    if (!mul_ok(x, w, &d) || tb % d)
        return zs_cfg_fail(p, "", "train_batch_size",
                           "%" PRId64 " is not divisible by %s %" PRId64 " * world size %" PRId64, tb, xname, x, w);
    *q = tb / d;
    return 0;
}

/* DeepSpeed's rule: train_batch_size = micro * gas * world; any two given fix the third. */
static int parse_batch(parser *p, struct zs_config *cfg, json_t *root)
{
    int64_t tb, mb, gas, w = cfg->world_size, t = 0;
    bool tb_auto, mb_auto, gas_auto;

    if (get_batch(p, root, "train_batch_size", 0, &tb, &tb_auto) ||
        get_batch(p, root, "train_micro_batch_size_per_gpu", p->av.micro_batch_size, &mb, &mb_auto) ||
        get_batch(p, root, "gradient_accumulation_steps", p->av.grad_accum_steps, &gas, &gas_auto))
        return -EINVAL;
    if (tb && mb && gas) {
        if (!mul_ok(mb, gas, &t) || !mul_ok(t, w, &t) || t != tb)
            return zs_cfg_fail(p, "", "train_batch_size",
                               "%" PRId64 " != train_micro_batch_size_per_gpu %" PRId64
                               " * gradient_accumulation_steps %" PRId64 " * world size %" PRId64,
                               tb, mb, gas, w);
    } else if (tb && mb) {
        if (divide_batch(p, tb, mb, "train_micro_batch_size_per_gpu", w, &gas))
            return -EINVAL;
    } else if (tb && gas) {
        if (divide_batch(p, tb, gas, "gradient_accumulation_steps", w, &mb))
            return -EINVAL;
    } else if (tb) {
        gas = 1;
        if (tb % w)
            return zs_cfg_fail(p, "", "train_batch_size", "%" PRId64 " is not divisible by the world size %" PRId64,
                               tb, w);
        mb = tb / w;
    } else if (mb) {
        gas = gas ? gas : 1;
        if (!mul_ok(mb, gas, &tb) || !mul_ok(tb, w, &tb))
            return zs_cfg_fail(p, "", "train_batch_size", "micro-batch * accumulation * world size overflows");
    } else {
        return zs_cfg_fail(p, "", "train_batch_size", "neither train_batch_size nor train_micro_batch_size_per_gpu "
                           "is set%s", mb_auto ? " (train_micro_batch_size_per_gpu is \"auto\": the program must "
                           "supply zs_auto_values.micro_batch_size)" : "");
    }
    cfg->train_batch_size = tb;
    cfg->micro_batch_size = mb;
    cfg->grad_accum_steps = gas;
    return 0;
}

static int parse_scalars(parser *p, struct zs_config *cfg, json_t *root)
{
    double clip = p->av.gradient_clipping;

    return zs_cfg_get_num(p, root, "", "gradient_clipping", &(spec){ZS_GE(0), .has_autov = clip > 0, .autov = clip},
                          &cfg->gradient_clipping) ||
           zs_cfg_get_int(p, root, "", "steps_per_print", &(spec){ZS_GE(0), .def = 10}, &cfg->steps_per_print) ||
           zs_cfg_get_bool(p, root, "", "wall_clock_breakdown", false, false, &cfg->wall_clock_breakdown) ||
           zs_cfg_get_bool(p, root, "", "prescale_gradients", false, false, &cfg->prescale_gradients) ||
           zs_cfg_get_num(p, root, "", "gradient_predivide_factor", &(spec){ZS_GT(0), .def = 1.0},
                          &cfg->gradient_predivide_factor)
               ? -EINVAL : 0;
}

/* ---------------------------------------------------------------- precision */

static const char *const loss_scale_keys[] = {
    "loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis", "consecutive_hysteresis",
    "min_loss_scale", NULL,
};
static const char *const fp16_keys[] = {
    "enabled", "auto_cast", "fp16_master_weights_and_grads", "loss_scale", "initial_scale_power",
    "loss_scale_window", "hysteresis", "consecutive_hysteresis", "min_loss_scale", NULL,
};
static const char *const bf16_keys[] = {
    "enabled", "immediate_grad_update", "bf16_master_weights_and_grads", "loss_scale", "initial_scale_power",
    "loss_scale_window", "hysteresis", "consecutive_hysteresis", "min_loss_scale", NULL,
};

static int parse_loss_scaling(parser *p, json_t *sec, const char *path, struct zs_fp16_config *f)
{
    return zs_cfg_get_num(p, sec, path, "loss_scale", &(spec){ZS_GE(0)}, &f->loss_scale) ||
           zs_cfg_get_int(p, sec, path, "initial_scale_power", &(spec){ZS_IN(0, 63), .def = 16},
                          &f->initial_scale_power) ||
           zs_cfg_get_int(p, sec, path, "loss_scale_window", &(spec){ZS_GE(1), .def = 1000},
                          &f->loss_scale_window) ||
           zs_cfg_get_int(p, sec, path, "hysteresis", &(spec){ZS_GE(1), .def = 2}, &f->hysteresis) ||
           zs_cfg_get_bool(p, sec, path, "consecutive_hysteresis", false, false, &f->consecutive_hysteresis) ||
           zs_cfg_get_num(p, sec, path, "min_loss_scale", &(spec){ZS_GE(0), .def = 1}, &f->min_loss_scale)
               ? -EINVAL : 0;
}

static int parse_fp16(parser *p, struct zs_config *cfg, json_t *root)
{
    json_t *sec;
    bool unused, master;

    if (zs_cfg_get_obj(p, root, "", "fp16", &sec) ||
        (sec && zs_cfg_check_keys(p, sec, "fp16", fp16_keys, NULL, NULL)) ||
        zs_cfg_get_bool(p, sec, "fp16", "enabled", false, true, &cfg->fp16.enabled) ||
        zs_cfg_get_bool(p, sec, "fp16", "auto_cast", false, false, &unused) ||
        zs_cfg_get_bool(p, sec, "fp16", "fp16_master_weights_and_grads", false, false, &master) ||
        parse_loss_scaling(p, sec, "fp16", &cfg->fp16))
        return -EINVAL;
    if (master)
        zs_cfg_defer(p, "fp16", "fp16_master_weights_and_grads", "16-bit master weights are not implemented yet");
    if (cfg->fp16.enabled)
        cfg->param_dtype = ZS_DTYPE_FP16;
    return 0;
}

/* "bfloat16" is the older name of the same section; messages use the spelling the file used. */
static int parse_bf16(parser *p, struct zs_config *cfg, json_t *root)
{
    struct zs_fp16_config ignored;
    const char *name;
    json_t *sec;
    bool unused, master;

    if (zs_cfg_pick_alias(p, root, "", "bf16", "bfloat16", &name) ||
        zs_cfg_get_obj(p, root, "", name, &sec) ||
        (sec && zs_cfg_check_keys(p, sec, name, bf16_keys, NULL, NULL)) ||
        zs_cfg_get_bool(p, sec, name, "enabled", false, true, &cfg->bf16_enabled) ||
        zs_cfg_get_bool(p, sec, name, "immediate_grad_update", false, false, &unused) ||
        zs_cfg_get_bool(p, sec, name, "bf16_master_weights_and_grads", false, false, &master) ||
        parse_loss_scaling(p, sec, name, &ignored))
        return -EINVAL;
    for (const char *const *k = loss_scale_keys; sec && *k; k++)
        if (json_object_get(sec, *k))
            zs_cfg_list_add(p->noeffect, sizeof(p->noeffect), ", ", name, *k);
    if (cfg->fp16.enabled && cfg->bf16_enabled)
        return zs_cfg_fail(p, name, "enabled", "fp16 and bf16 cannot both be enabled");
    if (master)
        zs_cfg_defer(p, name, "bf16_master_weights_and_grads", "16-bit master weights are not implemented yet");
    if (cfg->bf16_enabled)
        cfg->param_dtype = ZS_DTYPE_BF16;
    return 0;
}

static int parse_fp8(parser *p, json_t *root)
{
    json_t *sec;
    bool on;

    if (zs_cfg_get_obj(p, root, "", "fp8", &sec) || zs_cfg_get_bool(p, sec, "fp8", "enabled", false, false, &on))
        return -EINVAL;
    if (on)
        zs_cfg_defer(p, "fp8", "enabled", "fp8 training is not supported");
    return 0;
}

/* ---------------------------------------------------------------- features switched off here */

/* Sections that are fine while switched off; switched on, ZeroShard cannot honour them. */
static const struct {
    const char *section;
    struct zs_cfg_gate gate;
} feature_gates[] = {
    {"", {"sparse_gradients", false, 0, 0, "sparse gradients are not supported"}},
    {"amp", {"enabled", false, 0, 0, "apex AMP is not supported"}},
    {"tensor_parallel", {"autotp_size", true, 0, 1, "tensor parallelism is not supported"}},
    {"tensor_parallel", {"tp_size", true, 0, 1, "tensor parallelism is not supported"}},
    {"pipeline", {"stages", true, 1, 1, "pipeline parallelism is not supported"}},
    {"elasticity", {"enabled", false, 0, 0, "DeepSpeed's elasticity is not supported (DeepSpeed 0.19.8 removed it "
                    "too); restart on the ranks that remain with zeroshard-run --max-restarts"}},
    {"", {"sequence_parallel_size", true, 1, 1, "sequence parallelism is not supported"}},
};

/* communication_data_type: the dtype gradients are reduced to (fp32 accumulation inside the reduction
 * either way). Default: the training dtype. Runs after the precision sections. */
static int parse_comm_dtype(parser *p, struct zs_config *cfg, json_t *root)
{
    const char *comm;
    zs_dtype want;

    cfg->comm_dtype = cfg->param_dtype;
    if (zs_cfg_get_str(p, root, "", "communication_data_type", &comm))
        return -EINVAL;
    if (!comm)
        return 0;
    if (!strcmp(comm, "fp32"))
        want = ZS_DTYPE_FP32;
    else if (!strcmp(comm, "bf16"))
        want = ZS_DTYPE_BF16;
    else if (!strcmp(comm, "fp16"))
        want = ZS_DTYPE_FP16;
    else
        return zs_cfg_fail(p, "", "communication_data_type", "expected \"fp32\", \"fp16\" or \"bf16\", got \"%.40s\"",
                           comm);
    if (want != ZS_DTYPE_FP32 && want != cfg->param_dtype)
        return zs_cfg_fail(p, "", "communication_data_type", "\"%s\" differs from the training dtype %s (reduce in "
                           "the training dtype or in fp32)", comm, cfg->param_dtype == ZS_DTYPE_FP32 ? "fp32"
                           : cfg->param_dtype == ZS_DTYPE_BF16 ? "bf16" : "fp16");
    cfg->comm_dtype = want;
    return 0;
}

/* 16-bit training against the ZeRO settings (after both are parsed). */
static int check_precision(parser *p, const struct zs_config *cfg)
{
    const char *sec = cfg->fp16.enabled ? "fp16" : "bf16";

    if (cfg->param_dtype == ZS_DTYPE_FP32)
        return 0;
    if (cfg->comm_dtype != cfg->param_dtype && cfg->zero.stage < 2)
        return zs_cfg_fail(p, "", "communication_data_type", "\"fp32\" with %s needs ZeRO stage 2 or 3 (stages 0-1 "
                           "reduce the %s gradient buffers in place)", sec, sec);
    return 0;
}

static int parse_runtime_keys(parser *p, json_t *root)
{
    static const char *const bools[] = {"zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer",
                                        "disable_allgather", "memory_breakdown", NULL};
    bool unused;

    for (const char *const *k = bools; *k; k++)
        if (zs_cfg_get_bool(p, root, "", *k, false, false, &unused))
            return -EINVAL;
    for (size_t i = 0; i < sizeof(feature_gates) / sizeof(feature_gates[0]); i++) {
        const char *name = feature_gates[i].section;
        json_t *sec = root;
        if ((name[0] && zs_cfg_get_obj(p, root, "", name, &sec)) ||
            zs_cfg_check_gate(p, sec, name, &feature_gates[i].gate))
            return -EINVAL;
    }
    return 0;
}

/* ---------------------------------------------------------------- entry points */

static int parse_root(parser *p, struct zs_config *cfg, json_t *root)
{
    if (check_top_keys(p, root) || parse_batch(p, cfg, root) || parse_scalars(p, cfg, root) ||
        zs_cfg_parse_zero(p, cfg, root) || zs_cfg_parse_optimizer(p, cfg, root) || zs_cfg_parse_scheduler(p, cfg, root) ||
        parse_fp16(p, cfg, root) || parse_bf16(p, cfg, root) || parse_fp8(p, root) || parse_comm_dtype(p, cfg, root) ||
        parse_runtime_keys(p, root) || check_precision(p, cfg) ||
        zs_cfg_parse_zeroshard(p, cfg, root))
        return -EINVAL;
    return 0;
}

/* "config: <part>; <part>", each part only when it has something to say. */
static void build_warning(const parser *p, char *w, size_t n)
{
    char parts[2400] = "", part[1100];

    if (p->program[0]) {
        snprintf(part, sizeof(part), "not handled by ZeroShard (left to the training program): %s", p->program);
        zs_cfg_list_add(parts, sizeof(parts), "; ", "", part);
    }
    if (p->noeffect[0]) {
        snprintf(part, sizeof(part), "no effect here: %s", p->noeffect);
        zs_cfg_list_add(parts, sizeof(parts), "; ", "", part);
    }
    if (p->notes[0])
        zs_cfg_list_add(parts, sizeof(parts), "; ", "", p->notes);
    w[0] = '\0';
    if (parts[0] && snprintf(w, n, "config: %s", parts) >= (int)n && n > 4)
        memcpy(w + n - 4, "...", 4);
}
/* jansson's message quotes the text near the fault, newlines and all: escaped here, so that an error stays one
 * line (the control characters as \n, \t, \r or \xNN). */
static void one_line(char *dst, size_t n, const char *src)
{
    static const char hex[] = "0123456789abcdef";
    size_t o = 0;

    for (; *src && o + 5 < n; src++) {
        unsigned char c = (unsigned char)*src;

        if (c >= 0x20 && c != 0x7f) {
            dst[o++] = (char)c;
            continue;
        }
        dst[o++] = '\\';
        if (c == '\n' || c == '\t' || c == '\r') {
            dst[o++] = c == '\n' ? 'n' : c == '\t' ? 't' : 'r';
        } else {
            dst[o++] = 'x';
            dst[o++] = hex[c >> 4];
            dst[o++] = hex[c & 15];
        }
    }
    dst[o] = '\0';
}


int zs_config_parse(struct zs_config *cfg, const char *text, const char *source, int world_size,
                    const zs_auto_values *autov, char *err, size_t errlen)
{
    parser p = {.err = err, .errlen = errlen};
    json_error_t jerr;
    json_t *root;
    char got[64];
    int rc;

    if (err && errlen)
        err[0] = '\0';
    if (!cfg || !text)
        return zs_cfg_fail(&p, "", source ? source : "<json>", "no config given");
    memset(cfg, 0, sizeof(*cfg)); /* the engine hashes the struct across ranks: padding must be zero */
    if (world_size < 1) {
        if (err && errlen)
            snprintf(err, errlen, "world size must be >= 1, got %d", world_size);
        return -EINVAL;
    }
    cfg->world_size = world_size;
    if (autov)
        p.av = *autov;
    root = json_loads(text, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        if (err && errlen) {
            char near[2 * sizeof(jerr.text)];

            one_line(near, sizeof(near), jerr.text);
            snprintf(err, errlen, "%s:%d:%d: %s", source ? source : "<json>", jerr.line, jerr.column, near);
        }
        return -EINVAL;
    }
    if (!json_is_object(root)) {
        zs_cfg_describe(root, got, sizeof(got));
        rc = zs_cfg_fail(&p, "", source ? source : "<json>", "the top level must be a JSON object, got %s", got);
    } else {
        rc = parse_root(&p, cfg, root);
    }
    json_decref(root);
    if (rc == 0 && p.deferred[0]) {
        if (err && errlen)
            snprintf(err, errlen, "%s", p.deferred);
        rc = -EINVAL;
    }
    if (rc == 0)
        build_warning(&p, cfg->warning, sizeof(cfg->warning));
    return rc;
}
