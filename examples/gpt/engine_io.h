/* engine_io.h - zs-train-gpt's view of the engine: the model's tensors registered as units, and the
 * model's fetch and gradient callbacks (model.h's gpt_io_f32) served from the engine's buffers. */
#ifndef GPT_ENGINE_IO_H
#define GPT_ENGINE_IO_H

#include <stdbool.h>
#include <stdint.h>

#include "model.h"
#include "zeroshard.h"

struct tensor_init {
    struct gpt_tensor_info info;
    uint64_t seed;
    int32_t unit, k;
};

/* The program's view of the engine: fetched units widened to fp32 when the parameters are 16-bit, and
 * fp32 gradient scratch folded into the engine's buffer when a unit is complete. Two slots, since the
 * embedding unit is live (head) while the final LayerNorm is. With bf16 products (mm16) the blocks'
 * weight matrices stay in the engine's bf16 buffer (io_fetched16) and only the rest is widened. */
struct engine_io {
    zs_ctx *ctx;
    const struct gpt_config *cfg;
    const struct gpt_layout *lay;
    zs_dtype dt;
    bool mm16;
    const uint16_t *raw[2];
    float *w[2], *g[2];
    bool not_last; /* deterministic mode: a micro-shard before the micro-batch's last (deposit, no ready) */
};

/* The fp32 slot a unit's view lives in: 0 for the embeddings, 1 for any other. */
int gpt_io_slot(int32_t unit);
/* Registers every tensor (unit by unit), its initial values from ti (one per tensor, read by zs_setup),
 * and reads back where the engine put each one. */
zs_status gpt_register_model(zs_ctx *ctx, const struct gpt_config *cfg, uint64_t seed, struct tensor_init *ti,
                             struct gpt_layout *lay);
/* The callbacks the model runs through, reading and writing the engine's buffers via e. */
struct gpt_io_f32 gpt_engine_io(struct engine_io *e);

#endif /* GPT_ENGINE_IO_H */
