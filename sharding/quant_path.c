/* quant_path.c - the decision and the calls behind zero_quantized_weights / zero_quantized_gradients (quant_path.h):
 * one hierarchical quantized comm over the engine's ranks, used by sharding/fetch.c and sharding/grads.c. */
#include "base/error.h"
#include "comm/comm_quant.h" /* defines: zs_qcomm_* */
#include "quant_path.h"

zs_status zs_quant_path_open(struct zs_ctx *ctx)
{
    const struct zs_zero_config *z = &ctx->cfg.zero;
    const char *key = z->quantized_weights ? "zero_quantized_weights" : "zero_quantized_gradients";
    zs_status st;

    if (!z->quantized_weights && !z->quantized_gradients)
        return ZS_OK;
    if (z->quantized_weights && z->stage != 3)
        return zs_fail(ZS_ERR_UNSUPPORTED, "zero_optimization.zero_quantized_weights: quantizes stage 3's parameter "
                       "gather; this is stage %d", z->stage);
    if (z->quantized_gradients && z->stage < 2)
        return zs_fail(ZS_ERR_UNSUPPORTED, "zero_optimization.zero_quantized_gradients: quantizes the gradients' "
                       "reduce-scatter of stages 2 and 3; this is stage %d", z->stage);
    if (ctx->nreplicas > 1)
        return zs_fail(ZS_ERR_UNSUPPORTED, "zero_optimization.%s: not implemented with hybrid sharding "
                       "(zero_optimization.mics_shard_size %d): a shard group's collectives are not quantized",
                       key, ctx->shard_size);
    if (!ctx->dev.host_access)
        return zs_fail(ZS_ERR_UNSUPPORTED, "zero_optimization.%s: not implemented on a device the host cannot read in "
                       "place (zeroshard.device \"cpu\" only)", key);
    st = zs_qcomm_init(&ctx->qcomm, ctx->comm, 0);
    if (st)
        return st;
    if (ctx->rank == 0 && !ctx->quiet)
        zs_log("quantized collectives (lossy): %s%s%s across %d nodes of %d ranks, int8 blocks of 256",
               z->quantized_weights ? "parameter gathers" : "", z->quantized_weights && z->quantized_gradients ? " and " : "",
               z->quantized_gradients ? "gradient reduce-scatters" : "", zs_qcomm_nodes(ctx->qcomm),
               zs_qcomm_local_size(ctx->qcomm));
    return ZS_OK;
}

void zs_quant_path_close(struct zs_ctx *ctx)
{
    zs_qcomm_free(ctx->qcomm);
    ctx->qcomm = NULL;
}

bool zs_quant_weights(const struct zs_ctx *ctx)
{
    return ctx->qcomm && ctx->cfg.zero.quantized_weights;
}

bool zs_quant_grads(const struct zs_ctx *ctx)
{
    return ctx->qcomm && ctx->cfg.zero.quantized_gradients;
}

zs_status zs_quant_gather(struct zs_ctx *ctx, void *buf, int64_t shard)
{
    struct zs_qcomm_req *r = NULL;
    zs_status st = zs_qcomm_all_gather(ctx->qcomm, buf, ctx->pdt, shard, &r);

    return st ? st : zs_qcomm_wait(ctx->qcomm, r);
}

zs_status zs_quant_reduce(struct zs_ctx *ctx, const void *g, void *out, zs_dtype dt_out, int64_t shard)
{
    struct zs_qcomm_req *r = NULL;
    zs_status st = zs_qcomm_reduce_scatter(ctx->qcomm, g, ctx->pdt, out, dt_out, shard, ctx->post_scale, &r);

    return st ? st : zs_qcomm_wait(ctx->qcomm, r);
}
