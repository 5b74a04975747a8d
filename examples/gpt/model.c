/* model.c - the transformer's parameters: which unit holds which tensor, their Hugging Face GPT-2 names
 * and shapes, and their initial values from a counter-based generator. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "model.h"
#include "../splitmix.h" /* defines: ex_splitmix64 */

int32_t gpt_unit_count(const struct gpt_config *cfg)
{
    return (int32_t)cfg->layers + 2;
}

int32_t gpt_unit_tensors(const struct gpt_config *cfg, int32_t unit)
{
    return unit == GPT_UNIT_EMBED || unit == GPT_UNIT_LNF(cfg) ? 2 : GPT_BLOCK_TENSORS;
}

static void set2(struct gpt_tensor_info *t, int64_t d0, int64_t d1)
{
    t->ndim = d1 ? 2 : 1;
    t->dims[0] = d0;
    t->dims[1] = d1;
    t->numel = d1 ? d0 * d1 : d0;
}

void gpt_tensor_info(const struct gpt_config *cfg, int32_t unit, int32_t k, struct gpt_tensor_info *t)
{
    static const char *const block_names[GPT_BLOCK_TENSORS] = {
        "ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
        "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight",
        "mlp.c_proj.bias"};
    int64_t C = cfg->dim;

    *t = (struct gpt_tensor_info){.init = GPT_INIT_NORMAL, .std = 0.02};
    if (unit == GPT_UNIT_EMBED) {
        snprintf(t->name, sizeof(t->name), "%s", k == GPT_WTE ? "wte.weight" : "wpe.weight");
        set2(t, k == GPT_WTE ? cfg->vocab : cfg->ctx, C);
        return;
    }
    if (unit == GPT_UNIT_LNF(cfg)) {
        snprintf(t->name, sizeof(t->name), "%s", k == GPT_LNF_W ? "ln_f.weight" : "ln_f.bias");
        set2(t, C, 0);
        t->init = k == GPT_LNF_W ? GPT_INIT_ONE : GPT_INIT_ZERO;
        return;
    }
    snprintf(t->name, sizeof(t->name), "h.%d.%s", unit - GPT_UNIT_BLOCK(0), block_names[k]);
    switch (k) {
    case GPT_LN1_W: case GPT_LN2_W: set2(t, C, 0); t->init = GPT_INIT_ONE; break;
    case GPT_LN1_B: case GPT_LN2_B: case GPT_ATTPROJ_B: case GPT_FCPROJ_B: set2(t, C, 0); t->init = GPT_INIT_ZERO; break;
    case GPT_QKV_W: set2(t, C, 3 * C); break;
    case GPT_QKV_B: set2(t, 3 * C, 0); t->init = GPT_INIT_ZERO; break;
    case GPT_FC_W: set2(t, C, 4 * C); break;
    case GPT_FC_B: set2(t, 4 * C, 0); t->init = GPT_INIT_ZERO; break;
    case GPT_ATTPROJ_W: set2(t, C, C); t->std = 0.02 / sqrt(2.0 * (double)cfg->layers); break;
    case GPT_FCPROJ_W: set2(t, 4 * C, C); t->std = 0.02 / sqrt(2.0 * (double)cfg->layers); break;
    }
}

int gpt_config_check(const struct gpt_config *cfg, char *err, int errlen)
{
    if (cfg->layers < 1 || cfg->dim < 1 || cfg->heads < 1 || cfg->ctx < 1 || cfg->vocab < 1) {
        snprintf(err, (size_t)errlen, "--layers, --dim, --heads and --ctx must be at least 1");
        return -1;
    }
    if (cfg->dim % cfg->heads) {
        snprintf(err, (size_t)errlen, "--dim %lld is not a multiple of --heads %lld", (long long)cfg->dim,
                 (long long)cfg->heads);
        return -1;
    }
    return 0;
}

int64_t gpt_param_count(const struct gpt_config *cfg)
{
    int64_t n = 0;
    struct gpt_tensor_info t;

    for (int32_t u = 0; u < gpt_unit_count(cfg); u++)
        for (int32_t k = 0; k < gpt_unit_tensors(cfg, u); k++) {
            gpt_tensor_info(cfg, u, k, &t);
            n += t.numel;
        }
    return n;
}

int gpt_layout_alloc(struct gpt_layout *lay, const struct gpt_config *cfg)
{
    lay->nunits = gpt_unit_count(cfg);
    lay->off = calloc((size_t)lay->nunits, sizeof(*lay->off));
    lay->unit_numel = calloc((size_t)lay->nunits, sizeof(*lay->unit_numel));
    if (!lay->off || !lay->unit_numel) {
        gpt_layout_free(lay);
        return -1;
    }
    return 0;
}

void gpt_layout_pack(struct gpt_layout *lay, const struct gpt_config *cfg)
{
    struct gpt_tensor_info t;

    for (int32_t u = 0; u < lay->nunits; u++) {
        int64_t at = 0;
        for (int32_t k = 0; k < gpt_unit_tensors(cfg, u); k++) {
            gpt_tensor_info(cfg, u, k, &t);
            lay->off[u][k] = at;
            at += t.numel;
        }
        lay->unit_numel[u] = at;
    }
}

void gpt_layout_free(struct gpt_layout *lay)
{
    free(lay->off);
    free(lay->unit_numel);
    lay->off = NULL;
    lay->unit_numel = NULL;
}

/* ---------------------------------------------------------------- initial values */

/* A standard normal by Box-Muller from two uniforms in (0, 1], both hashed from the element's key. */
float gpt_init_value(const struct gpt_tensor_info *t, uint64_t seed, int32_t unit, int32_t k, int64_t i)
{
    if (t->init != GPT_INIT_NORMAL)
        return t->init == GPT_INIT_ONE ? 1.0f : 0.0f;
    uint64_t key =
        ex_splitmix64(ex_splitmix64(ex_splitmix64(seed) + (uint64_t)unit * 64 + (uint64_t)k) + (uint64_t)i);
    double u1 = ((double)(key >> 11) + 1.0) * (1.0 / 9007199254740992.0);
    double u2 = (double)(ex_splitmix64(key) >> 11) * (1.0 / 9007199254740992.0);
    return (float)(t->std * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}
