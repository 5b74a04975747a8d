/* quant_path.c - the decision and the calls behind zero_quantized_weights / zero_quantized_gradients (quant_path.h):
 * one hierarchical quantized comm over the engine's ranks, used by sharding/fetch.c and sharding/grads.c. On a
 * device the host cannot read in place (a GPU) each operation is host-staged: the data comes down, the CPU's
 * quantized collective runs on it, the result goes up, so a GPU run gives the CPU device's bits. */
#include "base/error.h"
#include "comm/comm_quant.h" /* defines: zs_qcomm_* */
#include "quant_path.h"

zs_status zs_quant_path_open(struct zs_ctx *ctx)
{
    const struct zs_zero_config *z = &ctx->cfg.zero;
    zs_status st;

    /* the stages and hybrid sharding they do not apply to were refused at zs_hybrid_start (zs_layout_check) */
    if (!z->quantized_weights && !z->quantized_gradients)
        return ZS_OK;
    st = zs_qcomm_init(&ctx->qcomm, ctx->comm, 0);
    if (st)
        return st;
    if (ctx->rank == 0 && !ctx->quiet)
        zs_log("quantized collectives (lossy): %s%s%s across %d nodes of %d ranks, int8 blocks of 256%s",
               z->quantized_weights ? "parameter gathers" : "", z->quantized_weights && z->quantized_gradients ? " and " : "",
               z->quantized_gradients ? "gradient reduce-scatters" : "", zs_qcomm_nodes(ctx->qcomm),
               zs_qcomm_local_size(ctx->qcomm), ctx->dev.host_access ? "" : ", host-staged from the device");
    return ZS_OK;
}

void zs_quant_path_close(struct zs_ctx *ctx)
{
    zs_comm_release(ctx->comm, ctx->qstage); /* every copy into or out of it completed in its call */
    ctx->qstage = NULL;
    ctx->qstage_cap = 0;
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

/* At least `bytes` of host memory for a device's operation. Every rank asks for the same sizes in the same
 * order (the units are the same everywhere), so the shared heap's collective allocation lines up, and a refusal
 * on one rank is a refusal on every rank of its node. Pageable: the copies complete in their calls anyway. */
static char *stage(struct zs_ctx *ctx, size_t bytes)
{
    if (bytes <= ctx->qstage_cap)
        return ctx->qstage;
    zs_comm_release(ctx->comm, ctx->qstage);
    ctx->qstage_cap = 0;
    ctx->qstage = zs_comm_alloc_agreed(ctx->comm, bytes, true);
    if (!ctx->qstage) {
        zs_fail(ZS_ERR_NOMEM, "quantized collectives: %zu bytes of host memory to stage the device's data", bytes);
        return NULL;
    }
    ctx->qstage_cap = bytes;
    return ctx->qstage;
}

zs_status zs_quant_gather(struct zs_ctx *ctx, void *buf, int64_t shard)
{
    struct zs_qcomm_req *r = NULL;
    size_t chunk = (size_t)shard * ctx->psz, mine = chunk * (size_t)zs_comm_rank(ctx->comm);
    zs_status st, down = ZS_OK;
    char *h = buf;

    if (!ctx->dev.host_access) { /* only this rank's chunk goes down: the others come from their owners */
        if (!(h = stage(ctx, chunk * (size_t)zs_comm_size(ctx->comm))))
            return ZS_ERR_NOMEM;
        down = zs_device_copy(&ctx->dev, h + mine, false, (char *)buf + mine, true, chunk);
    }
    st = zs_qcomm_all_gather(ctx->qcomm, h, ctx->pdt, shard, &r);
    if (!st)
        st = zs_qcomm_wait(ctx->qcomm, r);
    if (down) /* it still let the collective go out, with whatever the stage held, so no peer waits for this rank */
        st = down;
    if (!st && h != buf)
        st = zs_device_copy(&ctx->dev, buf, true, h, false, chunk * (size_t)zs_comm_size(ctx->comm));
    return st;
}

void zs_quant_gather_fail_next(struct zs_ctx *ctx)
{
    zs_qcomm_fail_next(ctx->qcomm);
}

zs_status zs_quant_reduce(struct zs_ctx *ctx, const void *g, void *out, zs_dtype dt_out, int64_t shard)
{
    struct zs_qcomm_req *r = NULL;
    size_t in = (size_t)shard * ctx->psz * (size_t)zs_comm_size(ctx->comm);
    size_t res = (size_t)shard * (size_t)zs_dtype_bytes(dt_out);
    size_t at = (in + 63) / 64 * 64; /* the result's place: 16-bit input of odd length must not misalign fp32 */
    zs_status st, down = ZS_OK;
    const char *h = g;
    char *o = out;

    if (!ctx->dev.host_access) {
        char *s = stage(ctx, at + res);
        if (!s)
            return ZS_ERR_NOMEM;
        down = zs_device_copy(&ctx->dev, s, false, g, true, in);
        h = s;
        o = s + at;
    }
    st = zs_qcomm_reduce_scatter(ctx->qcomm, h, ctx->pdt, o, dt_out, shard, ctx->post_scale, &r);
    if (!st)
        st = zs_qcomm_wait(ctx->qcomm, r);
    if (down)
        st = down;
    if (!st && o != out)
        st = zs_device_copy(&ctx->dev, out, true, o, false, res);
    return st;
}
