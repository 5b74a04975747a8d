/* model.h - a GPT-2-style decoder-only transformer on the CPU: the parameter layout (names, shapes, units,
 * initial values) and the forward and backward passes, in float (training) and double (gradient check). */
#ifndef GPT_MODEL_H
#define GPT_MODEL_H

#include <stdint.h>

/* ---------------------------------------------------------------- shape and layout */

struct gpt_config {
    int64_t layers, dim, heads, ctx, vocab;
};

/* The model's units, in forward order: the embeddings (wte, wpe), one per block, the final LayerNorm.
 * The output head is tied to wte, so the embedding unit is used again at the end of the forward. */
#define GPT_UNIT_EMBED 0
#define GPT_UNIT_BLOCK(l) (1 + (l))
#define GPT_UNIT_LNF(cfg) (1 + (int32_t)(cfg)->layers)
#define GPT_MAX_TENSORS 12

/* a block's tensors, in unit order (Hugging Face GPT-2 names and Conv1D layout: y = x @ W + b, W [in, out]) */
enum gpt_block_tensor {
    GPT_LN1_W, GPT_LN1_B, GPT_QKV_W, GPT_QKV_B, GPT_ATTPROJ_W, GPT_ATTPROJ_B,
    GPT_LN2_W, GPT_LN2_B, GPT_FC_W, GPT_FC_B, GPT_FCPROJ_W, GPT_FCPROJ_B, GPT_BLOCK_TENSORS
};
enum { GPT_WTE, GPT_WPE };        /* the embedding unit */
enum { GPT_LNF_W, GPT_LNF_B };    /* the final LayerNorm unit */

enum gpt_init_kind { GPT_INIT_NORMAL, GPT_INIT_ONE, GPT_INIT_ZERO };

struct gpt_tensor_info {
    char name[64];
    int32_t ndim;
    int64_t dims[2], numel;
    enum gpt_init_kind init;
    double std;               /* GPT_INIT_NORMAL: 0.02, residual projections 0.02 / sqrt(2 * layers) */
};

int32_t gpt_unit_count(const struct gpt_config *cfg);
int32_t gpt_unit_tensors(const struct gpt_config *cfg, int32_t unit);
void gpt_tensor_info(const struct gpt_config *cfg, int32_t unit, int32_t k, struct gpt_tensor_info *out);
/* 0, or -1 with a message in err: dims must be positive, dim divisible by heads */
int gpt_config_check(const struct gpt_config *cfg, char *err, int errlen);
int64_t gpt_param_count(const struct gpt_config *cfg);

/* Where each tensor lies in its unit's flat buffer (elements), and the buffer's size. The training
 * program fills it from the engine's offsets; gpt_layout_pack lays tensors end to end. */
struct gpt_layout {
    int32_t nunits;
    int64_t (*off)[GPT_MAX_TENSORS];
    int64_t *unit_numel;
};
int gpt_layout_alloc(struct gpt_layout *lay, const struct gpt_config *cfg);
void gpt_layout_pack(struct gpt_layout *lay, const struct gpt_config *cfg);
void gpt_layout_free(struct gpt_layout *lay);

/* Initial value of element i of a tensor: a counter-based generator of (seed, unit, tensor, i), so any rank
 * can produce any element alone. */
float gpt_init_value(const struct gpt_tensor_info *t, uint64_t seed, int32_t unit, int32_t k, int64_t i);

/* ---------------------------------------------------------------- the passes, in float and double */
#define GPT_REAL float
#define GPT_SUF(x) x##_f32
#include "model_decl.h"
#undef GPT_REAL
#undef GPT_SUF
#define GPT_REAL double
#define GPT_SUF(x) x##_f64
#include "model_decl.h"
#undef GPT_REAL
#undef GPT_SUF

/* a step of a pass that returns the callbacks' nonzero status (the CPU passes and gpt_cuda.cu) */
#define GPT_TRY(call)        \
    do {                     \
        int rc_ = (call);    \
        if (rc_)             \
            return rc_;      \
    } while (0)

#endif /* GPT_MODEL_H */
