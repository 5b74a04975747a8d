/* mlp_layers.h - zs-train-mlp's layers as the engine holds them: each layer's weights fetched and seen as
 * fp32, its gradient built in fp32 and handed over, whatever the parameters' dtype. */
#ifndef ZS_EXAMPLES_MLP_LAYERS_H
#define ZS_EXAMPLES_MLP_LAYERS_H

#include <stdint.h>

#include "zeroshard.h"

/* One linear layer: its unit and its weight (out x in) and bias parameters. */
struct layer {
    int32_t unit, w, b;
    int64_t in, out;
};

/* With bf16 or fp16 training ZeroShard hands out 16-bit parameters and gradient buffers. This example
 * computes in fp32: it widens the fetched weights into a scratch buffer, builds the micro-batch gradient
 * in fp32 and adds it into the 16-bit buffer, rounding to nearest even. */

struct wide {
    zs_dtype dt;
    float *w, *b, *gw, *gb; /* scratch, the largest layer's size */
};

/* A layer's gradient as its backward sees it: the fp32 weights, the engine's gradient buffer with the
 * offsets of the weight and bias in it, and the fp32 arrays a piece of the gradient goes into. */
struct grad_view {
    void *gp;
    const float *w;
    float *gw, *gb;
    int64_t woff, boff;
};

/* A layer's forward begins: its unit fetched, its weights and biases as fp32 (widened if 16-bit). */
zs_status mlp_layer_begin(zs_ctx *ctx, const struct layer *L, const struct wide *wd, const float **w,
                          const float **b);
/* A layer's backward begins: its unit fetched, its fp32 weights in v->w, its gradient buffer in v. */
zs_status mlp_grad_begin(zs_ctx *ctx, const struct layer *L, const struct wide *wd, struct grad_view *v);
/* A piece of the gradient (the whole micro-batch, or one micro-shard in deterministic mode) opens v->gw
 * and v->gb to be added into ... */
void mlp_grad_open(const struct layer *L, const struct wide *wd, struct grad_view *v);
/* ... and closes: a 16-bit piece rounded into the buffer, then handed to zs_grad_deposit. */
zs_status mlp_grad_close(zs_ctx *ctx, const struct layer *L, const struct wide *wd, const struct grad_view *v);
/* The layer's backward ends: the unit handed over and released. */
zs_status mlp_grad_end(zs_ctx *ctx, const struct layer *L);

#endif /* ZS_EXAMPLES_MLP_LAYERS_H */
