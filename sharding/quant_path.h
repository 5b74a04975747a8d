/* quant_path.h - ZeRO++'s quantized collectives in the engine: zero_quantized_weights (stage 3's gather of the
 * parameters) and zero_quantized_gradients (the gradients' reduce-scatter at stages 2-3) cross the node boundary
 * as int8 blocks (comm/comm_quant.h) and stay exact inside a node. Lossy: refused with zeroshard.deterministic
 * (core/config_zeroshard.c). On one node they are the exact collectives. */
#ifndef ZS_QUANT_PATH_H
#define ZS_QUANT_PATH_H

#include <stdbool.h>
#include <stdint.h>

#include "core/ctx.h" /* defines: struct zs_ctx */

/* Collective: the quantized collectives when either key is on (where they do not apply, stage < 3 for weights,
 * stage < 2 for gradients, hybrid sharding, zs_hybrid_start refused them first: core/plan.h's zs_layout_check). On a device the host cannot read in
 * place (a GPU) they run host-staged, with the CPU's quantization: the CPU device's bits. */
zs_status zs_quant_path_open(struct zs_ctx *ctx);
void zs_quant_path_close(struct zs_ctx *ctx);
bool zs_quant_weights(const struct zs_ctx *ctx);
bool zs_quant_grads(const struct zs_ctx *ctx);
/* The unit's gather (buf: world chunks of shard elements of the parameter dtype) and its gradients'
 * reduce-scatter (into out, dt_out, times the post-scale), each complete on return: the engine's request
 * stays NULL, which its waits take as done. */
zs_status zs_quant_gather(struct zs_ctx *ctx, void *buf, int64_t shard);
/* This rank's part of the next zs_quant_gather could not be had: the gather still runs on every phase, failed,
 * and ends with an error on every rank naming this one (comm_quant.h's zs_qcomm_fail_next). */
void zs_quant_gather_fail_next(struct zs_ctx *ctx);
zs_status zs_quant_reduce(struct zs_ctx *ctx, const void *g, void *out, zs_dtype dt_out, int64_t shard);

#endif /* ZS_QUANT_PATH_H */
