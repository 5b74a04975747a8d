/* config_optim.c - the optimizer and scheduler sections of a DeepSpeed config: the optimizers ZeroShard runs
 * with their parameters and defaults, and the warmup and decay learning-rate schedules. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "config.h"       /* defines: struct zs_optim_config, struct zs_sched_config */
#include "config_json.h"  /* defines: struct zs_cfg_parser, zs_cfg_get_num, zs_cfg_fail */

typedef struct zs_cfg_parser parser;
typedef struct zs_cfg_spec spec;

/* ---------------------------------------------------------------- optimizer */

#define IMPLEMENTED_OPTIMIZERS "Adam, AdamW, SGD, Lion, Adagrad"

static const char *const adam_keys[] = {
    "lr", "betas", "eps", "weight_decay", "adam_w_mode", "bias_correction", "amsgrad", "torch_adam", "fused",
    "max_grad_norm", NULL,
};
static const char *const sgd_keys[] = {"lr", "momentum", "dampening", "nesterov", "weight_decay", NULL};
static const char *const lion_keys[] = {"lr", "betas", "weight_decay", NULL};
static const char *const adagrad_keys[] = {"lr", "eps", "weight_decay", "lr_decay", "initial_accumulator_value", NULL};
/* Every optimizer's keys: one given to the wrong optimizer is "not a parameter of X", not an unknown key. */
static const char *const all_optim_keys[] = {
    "lr", "betas", "eps", "weight_decay", "adam_w_mode", "bias_correction", "amsgrad", "torch_adam", "fused",
    "max_grad_norm", "momentum", "dampening", "nesterov", "lr_decay", "initial_accumulator_value", NULL,
};
static const char *const type_params_keys[] = {"type", "params", NULL};
/* DeepSpeed optimizers ZeroShard knows by name but does not run: refused naming the key (compared lower-case). */
static const char *const refused_optimizers[] = {
    "lamb", "onebitadam", "zerooneadam", "onebitlamb", "muadam", "muadamw", "musgd", "fusedadam", "cpuadam",
    "cpuadagrad", "muon", NULL,
};

static bool in_list_nocase(const char *s, const char *const *list)
{
    for (; *list; list++)
        if (zs_cfg_streq_nocase(s, *list))
            return true;
    return false;
}

/* Absent or "auto" leaves the defaults already in *o. */
static int get_betas(parser *p, json_t *params, struct zs_optim_config *o)
{
    json_t *v = params ? json_object_get(params, "betas") : NULL;
    const spec beta = {ZS_IN_CO(0, 1)};
    char got[64];

    if (v && zs_cfg_is_auto(v) && p->av.beta1 > 0 && p->av.beta2 > 0) {
        o->beta1 = p->av.beta1;
        o->beta2 = p->av.beta2;
    }
    if (!v || zs_cfg_is_auto(v))
        return 0;
    if (!json_is_array(v) || json_array_size(v) != 2) {
        zs_cfg_describe(v, got, sizeof(got));
        return zs_cfg_fail(p, "optimizer.params", "betas", "expected [beta1, beta2], got %s%s", got,
                           json_is_array(v) ? " of another length" : "");
    }
    return zs_cfg_num_value(p, json_array_get(v, 0), "optimizer.params", "betas[0]", &beta, &o->beta1) ||
           zs_cfg_num_value(p, json_array_get(v, 1), "optimizer.params", "betas[1]", &beta, &o->beta2)
               ? -EINVAL : 0;
}

/* torch_adam: true makes DeepSpeed build torch.optim.AdamW (torch.optim.Adam when adam_w_mode is false for
 * type Adam) from the remaining params. Our kernels compute exactly that update, so the key is honoured:
 * torch's defaults apply (AdamW's weight_decay is 0.01 when the config gives none) and keys torch does not
 * take are refused, as torch would refuse them. */
static int apply_torch_adam(parser *p, struct zs_config *cfg, json_t *params)
{
    json_t *wd = json_object_get(params, "weight_decay");
    const char *pp = "optimizer.params";
    char note[160];

    if (json_object_get(params, "bias_correction"))
        return zs_cfg_fail(p, pp, "bias_correction", "not a parameter of torch.optim.%s (torch_adam: true builds "
                           "it; torch always corrects the bias, and DeepSpeed fails on this key)",
                           cfg->optim.type == ZS_OPTIM_ADAMW ? "AdamW" : "Adam");
    cfg->optim.bias_correction = true;
    if (cfg->optim.type == ZS_OPTIM_ADAMW && (!wd || zs_cfg_is_auto(wd)))
        cfg->optim.weight_decay = 0.01;
    snprintf(note, sizeof(note), "optimizer.params.torch_adam: torch.optim.%s semantics (weight_decay %g)",
             cfg->optim.type == ZS_OPTIM_ADAMW ? "AdamW" : "Adam", cfg->optim.weight_decay);
    zs_cfg_list_add(p->notes, sizeof(p->notes), "; ", "", note);
    return 0;
}

/* apex-era configs put clipping inside the optimizer; DeepSpeed refuses the key there, we take it as
 * gradient_clipping (the top-level key wins when both are set), never silently. */
static void apply_max_grad_norm(parser *p, struct zs_config *cfg, double max_grad_norm)
{
    char note[224];

    if (cfg->gradient_clipping == 0) {
        cfg->gradient_clipping = max_grad_norm;
        snprintf(note, sizeof(note), "optimizer.params.max_grad_norm %g is used as gradient_clipping (DeepSpeed "
                 "refuses optimizer.params.max_grad_norm: move it to gradient_clipping)", max_grad_norm);
    } else {
        snprintf(note, sizeof(note), "optimizer.params.max_grad_norm %g is ignored: gradient_clipping %g applies "
                 "(DeepSpeed refuses optimizer.params.max_grad_norm)", max_grad_norm, cfg->gradient_clipping);
    }
    zs_cfg_list_add(p->notes, sizeof(p->notes), "; ", "", note);
}

static int parse_adam(parser *p, struct zs_config *cfg, json_t *params, enum zs_optim_type type)
{
    struct zs_optim_config *o = &cfg->optim;
    const char *pp = "optimizer.params";
    bool w_mode, amsgrad, torch_adam, unused;
    double max_grad_norm;

    if (get_betas(p, params, o) ||
        zs_cfg_get_num(p, params, pp, "eps",
                       &(spec){ZS_GT(0), .def = 1e-8, .has_autov = p->av.eps > 0, .autov = p->av.eps}, &o->eps) ||
        zs_cfg_get_bool(p, params, pp, "adam_w_mode", true, false, &w_mode) ||
        zs_cfg_get_bool(p, params, pp, "bias_correction", true, false, &o->bias_correction) ||
        zs_cfg_get_bool(p, params, pp, "amsgrad", false, false, &amsgrad) ||
        zs_cfg_get_bool(p, params, pp, "torch_adam", false, false, &torch_adam) ||
        zs_cfg_get_bool(p, params, pp, "fused", false, false, &unused) ||
        zs_cfg_get_num(p, params, pp, "max_grad_norm", &(spec){ZS_GE(0)}, &max_grad_norm))
        return -EINVAL;
    o->type = type == ZS_OPTIM_ADAMW || w_mode ? ZS_OPTIM_ADAMW : ZS_OPTIM_ADAM;
    if (amsgrad)
        zs_cfg_defer(p, pp, "amsgrad", "AMSGrad is not implemented yet");
    if (torch_adam && apply_torch_adam(p, cfg, params))
        return -EINVAL;
    if (params && json_object_get(params, "max_grad_norm"))
        apply_max_grad_norm(p, cfg, max_grad_norm);
    return 0;
}

static int parse_sgd(parser *p, struct zs_config *cfg, json_t *params, enum zs_optim_type type)
{
    struct zs_optim_config *o = &cfg->optim;
    const char *pp = "optimizer.params";

    o->type = type;
    if (zs_cfg_get_num(p, params, pp, "momentum", &(spec){ZS_IN_CO(0, 1)}, &o->momentum) ||
        zs_cfg_get_num(p, params, pp, "dampening", &(spec){ZS_GE(0)}, &o->dampening) ||
        zs_cfg_get_bool(p, params, pp, "nesterov", false, false, &o->nesterov))
        return -EINVAL;
    if (o->nesterov && (o->momentum <= 0 || o->dampening != 0))
        return zs_cfg_fail(p, pp, "nesterov", "needs momentum > 0 and dampening 0 (momentum %g, dampening %g)",
                           o->momentum, o->dampening);
    return 0;
}

/* DeepSpeed's FusedLion / DeepSpeedCPULion: betas default to (0.9, 0.999), the Adam defaults already set. */
static int parse_lion(parser *p, struct zs_config *cfg, json_t *params, enum zs_optim_type type)
{
    cfg->optim.type = type;
    return get_betas(p, params, &cfg->optim);
}

/* DeepSpeed builds DeepSpeedCPUAdagrad with offload and torch.optim.Adagrad without, so torch's lr_decay and
 * initial_accumulator_value appear in real configs: read (a bad value is named) but run only at 0 so far. */
static int parse_adagrad(parser *p, struct zs_config *cfg, json_t *params, enum zs_optim_type type)
{
    struct zs_optim_config *o = &cfg->optim;
    const char *pp = "optimizer.params";
    double lr_decay, initial_acc;

    o->type = type;
    if (zs_cfg_get_num(p, params, pp, "eps",
                       &(spec){ZS_GT(0), .def = 1e-10, .has_autov = p->av.eps > 0, .autov = p->av.eps}, &o->eps) ||
        zs_cfg_get_num(p, params, pp, "lr_decay", &(spec){ZS_GE(0)}, &lr_decay) ||
        zs_cfg_get_num(p, params, pp, "initial_accumulator_value", &(spec){ZS_GE(0)}, &initial_acc))
        return -EINVAL;
    if (lr_decay != 0)
        zs_cfg_defer(p, pp, "lr_decay", "a non-zero lr_decay is not implemented yet (only 0)");
    if (initial_acc != 0)
        zs_cfg_defer(p, pp, "initial_accumulator_value",
                     "a non-zero initial_accumulator_value is not implemented yet (only 0)");
    return 0;
}

static const struct optim_kind {
    const char *name;  /* DeepSpeed's spelling; matched ignoring case */
    enum zs_optim_type type;
    const char *const *keys;
    int (*parse)(parser *p, struct zs_config *cfg, json_t *params, enum zs_optim_type type);
} optim_kinds[] = {
    {"Adam", ZS_OPTIM_ADAM, adam_keys, parse_adam},
    {"AdamW", ZS_OPTIM_ADAMW, adam_keys, parse_adam},
    {"SGD", ZS_OPTIM_SGD, sgd_keys, parse_sgd},
    {"Lion", ZS_OPTIM_LION, lion_keys, parse_lion},
    {"Adagrad", ZS_OPTIM_ADAGRAD, adagrad_keys, parse_adagrad},
};

int zs_cfg_parse_optimizer(parser *p, struct zs_config *cfg, json_t *root)
{
    const struct optim_kind *kind = NULL;
    struct zs_optim_config *o = &cfg->optim;
    double lr_auto = p->av.lr;
    json_t *sec, *params;
    const char *type;

    /* field by field: a struct copy could carry a temporary's padding into the hashed config */
    o->type = ZS_OPTIM_ADAMW;
    o->lr = lr_auto > 0 ? lr_auto : 1e-3;
    o->beta1 = 0.9;
    o->beta2 = 0.999;
    o->eps = 1e-8;
    o->bias_correction = true;
    if (zs_cfg_get_obj(p, root, "", "optimizer", &sec))
        return -EINVAL;
    if (!sec) {
        char note[96];
        snprintf(note, sizeof(note), "no optimizer section: using AdamW(lr=%g)", o->lr);
        zs_cfg_list_add(p->notes, sizeof(p->notes), "; ", "", note);
        return 0;
    }
    if (zs_cfg_check_keys(p, sec, "optimizer", type_params_keys, NULL, NULL) ||
        zs_cfg_get_str(p, sec, "optimizer", "type", &type))
        return -EINVAL;
    if (!type)
        return zs_cfg_fail(p, "optimizer", "type", "missing");
    if (in_list_nocase(type, refused_optimizers)) {
        /* its params belong to an optimizer we do not model: leave them unchecked */
        zs_cfg_defer(p, "optimizer", "type", "'%s' is not implemented yet (implemented: " IMPLEMENTED_OPTIMIZERS ")",
                     type);
        return 0;
    }
    for (size_t i = 0; i < sizeof(optim_kinds) / sizeof(optim_kinds[0]); i++)
        if (zs_cfg_streq_nocase(type, optim_kinds[i].name))
            kind = &optim_kinds[i];
    if (!kind)
        return zs_cfg_fail(p, "optimizer", "type", "unknown optimizer '%s' (implemented: " IMPLEMENTED_OPTIMIZERS ")",
                           type);
    if (zs_cfg_get_obj(p, sec, "optimizer", "params", &params) ||
        (params && zs_cfg_check_keys(p, params, "optimizer.params", kind->keys, all_optim_keys, kind->name)) ||
        zs_cfg_get_num(p, params, "optimizer.params", "lr",
                       &(spec){ZS_GT(0), .required = true, .has_autov = lr_auto > 0, .autov = lr_auto, .need = "lr"},
                       &o->lr) ||
        zs_cfg_get_num(p, params, "optimizer.params", "weight_decay",
                       &(spec){ZS_GE(0), .has_autov = p->av.weight_decay > 0, .autov = p->av.weight_decay},
                       &o->weight_decay))
        return -EINVAL;
    return kind->parse(p, cfg, params, kind->type);
}

/* ---------------------------------------------------------------- scheduler */

static const char *const warmup_keys[] = {
    "warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type", "last_batch_iteration", NULL,
};
static const char *const decay_keys[] = {
    "warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type", "last_batch_iteration",
    "total_num_steps", NULL,
};
static const char *const cosine_keys[] = {
    "total_num_steps", "warmup_min_ratio", "warmup_num_steps", "cos_min_ratio", "warmup_type",
    "last_batch_iteration", NULL,
};
static const char *const all_sched_keys[] = {
    "warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type", "last_batch_iteration",
    "total_num_steps", "warmup_min_ratio", "cos_min_ratio", NULL,
};

static const struct sched_kind {
    const char *name;
    enum zs_sched_type type;
    const char *const *keys;
} sched_kinds[] = {
    {"WarmupLR", ZS_SCHED_WARMUP_LR, warmup_keys},
    {"WarmupDecayLR", ZS_SCHED_WARMUP_DECAY_LR, decay_keys},
    {"WarmupCosineLR", ZS_SCHED_WARMUP_COSINE_LR, cosine_keys},
};
/* DeepSpeed schedulers ZeroShard knows by name but does not run: refused naming the key. */
static const char *const refused_schedulers[] = {"onecycle", "lrrangetest", NULL};

static int get_warmup_type(parser *p, json_t *params, enum zs_warmup_type *out)
{
    const char *s;

    if (zs_cfg_get_str(p, params, "scheduler.params", "warmup_type", &s))
        return -EINVAL;
    *out = ZS_WARMUP_LOG;
    if (!s || strcmp(s, "log") == 0 || strcmp(s, "auto") == 0)
        return 0;
    if (strcmp(s, "linear") == 0) {
        *out = ZS_WARMUP_LINEAR;
        return 0;
    }
    return zs_cfg_fail(p, "scheduler.params", "warmup_type", "expected \"log\" or \"linear\", got \"%.40s\"", s);
}

/* Keys of another schedule were already refused, so reading every key (absent -> default) is safe. */
static int parse_sched_params(parser *p, struct zs_sched_config *s, json_t *params, double lr)
{
    const char *pp = "scheduler.params";
    int64_t warm = p->av.warmup_num_steps, total = p->av.total_num_steps, last;
    bool needs_total = s->type != ZS_SCHED_WARMUP_LR;

    if (zs_cfg_get_num(p, params, pp, "warmup_min_lr", &(spec){ZS_GE(0)}, &s->warmup_min_lr) ||
        zs_cfg_get_num(p, params, pp, "warmup_max_lr", &(spec){ZS_GE(0), .def = lr}, &s->warmup_max_lr) ||
        zs_cfg_get_int(p, params, pp, "warmup_num_steps",
                       &(spec){ZS_GE(0), .def = 1000, .has_autov = warm > 0, .autov = (double)warm},
                       &s->warmup_num_steps) ||
        get_warmup_type(p, params, &s->warmup_type) ||
        zs_cfg_get_int(p, params, pp, "last_batch_iteration", &(spec){ZS_ANY, .def = -1}, &last) ||
        zs_cfg_get_int(p, params, pp, "total_num_steps",
                       &(spec){ZS_GE(1), .required = needs_total, .has_autov = total > 0,
                               .autov = (double)total, .need = "total_num_steps"},
                       &s->total_num_steps) ||
        zs_cfg_get_num(p, params, pp, "warmup_min_ratio", &(spec){ZS_IN(0, 1)}, &s->warmup_min_ratio) ||
        zs_cfg_get_num(p, params, pp, "cos_min_ratio", &(spec){ZS_IN(0, 1), .def = 1e-4}, &s->cos_min_ratio))
        return -EINVAL;
    if (last != -1)
        return zs_cfg_fail(p, pp, "last_batch_iteration", "only -1 is accepted; resuming a schedule comes from a "
                           "checkpoint, not the config");
    if (needs_total && s->total_num_steps <= s->warmup_num_steps) {
        char note[160];
        snprintf(note, sizeof(note), "scheduler.params.total_num_steps %" PRId64 " <= warmup_num_steps %" PRId64
                 " (no decay phase)", s->total_num_steps, s->warmup_num_steps);
        zs_cfg_list_add(p->notes, sizeof(p->notes), "; ", "", note);
    }
    return 0;
}

int zs_cfg_parse_scheduler(parser *p, struct zs_config *cfg, json_t *root)
{
    const struct sched_kind *kind = NULL;
    json_t *sec, *params;
    const char *type;

    cfg->sched.type = ZS_SCHED_NONE;
    cfg->sched.warmup_max_lr = cfg->optim.lr;
    cfg->sched.warmup_num_steps = 1000;
    cfg->sched.cos_min_ratio = 1e-4;
    if (zs_cfg_get_obj(p, root, "", "scheduler", &sec))
        return -EINVAL;
    if (!sec)
        return 0;
    if (zs_cfg_check_keys(p, sec, "scheduler", type_params_keys, NULL, NULL) ||
        zs_cfg_get_str(p, sec, "scheduler", "type", &type))
        return -EINVAL;
    if (!type)
        return zs_cfg_fail(p, "scheduler", "type", "missing");
    if (in_list_nocase(type, refused_schedulers)) {
        zs_cfg_defer(p, "scheduler", "type",
                     "'%s' is not implemented yet (implemented: WarmupLR, WarmupDecayLR, WarmupCosineLR)", type);
        return 0;
    }
    for (size_t i = 0; i < sizeof(sched_kinds) / sizeof(sched_kinds[0]); i++)
        if (zs_cfg_streq_nocase(type, sched_kinds[i].name))
            kind = &sched_kinds[i];
    if (!kind)
        return zs_cfg_fail(p, "scheduler", "type",
                           "unknown scheduler '%s' (implemented: WarmupLR, WarmupDecayLR, WarmupCosineLR)", type);
    cfg->sched.type = kind->type;
    if (zs_cfg_get_obj(p, sec, "scheduler", "params", &params) ||
        (params && zs_cfg_check_keys(p, params, "scheduler.params", kind->keys, all_sched_keys, kind->name)))
        return -EINVAL;
    return parse_sched_params(p, &cfg->sched, params, cfg->optim.lr);
}
