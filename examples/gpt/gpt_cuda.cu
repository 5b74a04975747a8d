/* gpt_cuda.cu - zs-train-gpt's transformer on a CUDA GPU (see gpt_cuda.h): passes_tmpl.h's walk over the
 * units with each layer on the GPU, the matrix products through cuBLAS in fp32 (no TF32) and the rest in
 * gpt_kernels.cuh. One stream; every host copy waits for its stream, so a unit's host buffer is never read
 * after it is released, and a gradient is complete in host memory before the engine is told. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <new>

#include <cublas_v2.h>
#include <cuda_runtime.h>

extern "C" {
#include "model.h" /* defines: gpt_config, gpt_layout, gpt_io_f32, GPT_UNIT_*, the tensors' order */
}
#include "gpt_cuda.h"
#include "gpt_kernels.cuh" /* defines: gk_* kernels, gk_blocks, gk_row_blocks, GK_THREADS */

struct gpu_acts { /* as gpt_block_acts_f32, on the device */
    float *ln1, *ln1_mean, *ln1_rstd, *qkv, *att, *atty, *res2, *ln2, *ln2_mean, *ln2_rstd, *fch, *fchg;
};

struct gpt_gpu {
    struct gpt_config cfg;
    const struct gpt_layout *lay;
    int64_t max_batch;
    cudaStream_t s;
    cublasHandle_t blas;
    void **mem;               /* every device array, for close */
    int nmem, cap;
    int32_t *in, *tg;         /* [N] */
    float *w[2], *gr[2];      /* unit parameters and gradients: slot 0 the embeddings, 1 any other unit */
    float **resid;            /* [layers + 1] of [N, C] */
    struct gpu_acts *acts;    /* [layers] */
    float *lnf, *lnf_mean, *lnf_rstd, *logits, *row_loss;
    float *dres, *dln, *dh, *dqkv, *datt;
    float *q, *k, *v, *yh, *dq, *dk, *dv; /* per-head copies [B, H, T, hs] */
    float *part;                          /* column sums' chunk sums [chunks of N, 4C] */
    float *host_loss, *host_logits;       /* [N], [N, V] */
    bool have_logits;
    char err[256];
};

static int fail(struct gpt_gpu *g, const char *what, cudaError_t e)
{
    snprintf(g->err, sizeof(g->err), "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
    return -1;
}

static int blas_fail(struct gpt_gpu *g, const char *what, cublasStatus_t e)
{
    snprintf(g->err, sizeof(g->err), "%s: cuBLAS status %d", what, (int)e);
    return -1;
}

/* after each launch: its configuration error, if any (faults inside kernels surface at the next copy) */
static int launched(struct gpt_gpu *g, const char *what)
{
    cudaError_t e = cudaGetLastError();

    return e == cudaSuccess ? 0 : fail(g, what, e);
}

/* a copy between host and device that is complete when it returns */
static int copy(struct gpt_gpu *g, void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, const char *what)
{
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kind, g->s);

    if (e == cudaSuccess)
        e = cudaStreamSynchronize(g->s);
    return e == cudaSuccess ? 0 : fail(g, what, e);
}

static int zero(struct gpt_gpu *g, void *p, size_t bytes)
{
    cudaError_t e = cudaMemsetAsync(p, 0, bytes, g->s);

    return e == cudaSuccess ? 0 : fail(g, "cudaMemsetAsync", e);
}

/* ---------------------------------------------------------------- products, row-major as cblas_sgemm */

/* C[M, N] = op(A)[M, K] op(B)[K, N] + beta C, all row-major with leading dimensions as the CPU's GPT_GEMM
 * calls, batch matrices apart by the strides (batch 1: plain sgemm). Row-major X is column-major X^T, so
 * cuBLAS computes C^T = op(B)^T op(A)^T: the operands swap, the dimensions and transposes carry over. */
static int mm(struct gpt_gpu *g, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda,
              long long sa, const float *B, int64_t ldb, long long sb, float beta, float *C, int64_t ldc,
              long long sc, int64_t batch, const char *what)
{
    const float one = 1.0f;
    cublasOperation_t oa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, ob = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasStatus_t e;

    if (batch == 1)
        e = cublasSgemm(g->blas, ob, oa, (int)N, (int)M, (int)K, &one, B, (int)ldb, A, (int)lda, &beta, C, (int)ldc);
    else
        e = cublasSgemmStridedBatched(g->blas, ob, oa, (int)N, (int)M, (int)K, &one, B, (int)ldb, sb, A, (int)lda,
                                      sa, &beta, C, (int)ldc, sc, (int)batch);
    return e == CUBLAS_STATUS_SUCCESS ? 0 : blas_fail(g, what, e);
}

/* y[N, out] = x[N, in] @ w[in, out] + b (linear_forward) */
static int linear_forward(struct gpt_gpu *g, float *y, const float *x, const float *w, const float *b, int64_t N,
                          int64_t in, int64_t out)
{
    GPT_TRY(mm(g, false, false, N, out, in, x, in, 0, w, out, 0, 0.0f, y, out, 0, 1, "cublasSgemm (linear forward)"));
    GK_LAUNCH(gk_add_bias, gk_blocks(N * out), g->s)(y, b, N, out);
    return launched(g, "bias kernel");
}

/* dx = dy @ w^T; dw += x^T @ dy; db += column sums of dy (linear_backward) */
static int linear_backward(struct gpt_gpu *g, float *dx, float *dw, float *db, const float *dy, const float *x,
                           const float *w, int64_t N, int64_t in, int64_t out)
{
    GPT_TRY(mm(g, false, true, N, in, out, dy, out, 0, w, out, 0, 0.0f, dx, in, 0, 1, "cublasSgemm (input gradient)"));
    GPT_TRY(mm(g, true, false, in, out, N, x, in, 0, dy, out, 0, 1.0f, dw, out, 0, 1, "cublasSgemm (weight gradient)"));
    GK_LAUNCH(gk_col_sum_part, dim3(gk_blocks(out), gk_chunks(N)), g->s)(g->part, dy, N, out);
    GPT_TRY(launched(g, "bias gradient kernel"));
    GK_LAUNCH(gk_col_fold, gk_blocks(out), g->s)(db, g->part, gk_chunks(N), out, 0, out);
    return launched(g, "bias gradient fold kernel");
}

static int layernorm_forward(struct gpt_gpu *g, float *y, float *mean, float *rstd, const float *x, const float *w,
                             const float *b, int64_t N, int64_t C)
{
    GK_LAUNCH(gk_layernorm_forward, gk_row_blocks(N), g->s)(y, mean, rstd, x, w, b, N, C);
    return launched(g, "layernorm kernel");
}

static int layernorm_backward(struct gpt_gpu *g, float *dx, float *dw, float *db, const float *dy, const float *x,
                              const float *mean, const float *rstd, const float *w, int64_t N, int64_t C)
{
    GK_LAUNCH(gk_layernorm_backward_x, gk_row_blocks(N), g->s)(dx, dy, x, mean, rstd, w, N, C);
    GPT_TRY(launched(g, "layernorm backward kernel"));
    GK_LAUNCH(gk_layernorm_backward_part, dim3(gk_blocks(C), gk_chunks(N)), g->s)(g->part, dy, x, mean,
                                                                                         rstd, N, C);
    GPT_TRY(launched(g, "layernorm parameter gradient kernel"));
    GK_LAUNCH(gk_col_fold, gk_blocks(C), g->s)(dw, g->part, gk_chunks(N), 2 * C, 0, C);
    GPT_TRY(launched(g, "layernorm weight gradient fold kernel"));
    GK_LAUNCH(gk_col_fold, gk_blocks(C), g->s)(db, g->part, gk_chunks(N), 2 * C, C, C);
    return launched(g, "layernorm bias gradient fold kernel");
}

/* ---------------------------------------------------------------- attention */

/* y [B, T, C] from qkv [B, T, 3C]; att [B, H, T, T] keeps the probabilities for backward */
static int attention_forward(struct gpt_gpu *g, float *y, float *att, const float *qkv, int64_t B)
{
    int64_t T = g->cfg.ctx, C = g->cfg.dim, H = g->cfg.heads, hs = C / H, BH = B * H;
    unsigned nb = gk_blocks(B * T * C);

    GK_LAUNCH(gk_qkv_split, nb, g->s)(g->q, g->k, g->v, qkv, B, T, C, H);
    GPT_TRY(launched(g, "qkv split kernel"));
    /* scores [T, T] = q [T, hs] @ k^T, per (b, h) */
    GPT_TRY(mm(g, false, true, T, T, hs, g->q, hs, T * hs, g->k, hs, T * hs, 0.0f, att, T, T * T, BH,
           "cublasSgemmStridedBatched (scores)"));
    GK_LAUNCH(gk_softmax_forward, gk_row_blocks(BH * T), g->s)(att, BH * T, T, 1.0f / sqrtf((float)hs));
    GPT_TRY(launched(g, "softmax kernel"));
    /* yh [T, hs] = att [T, T] @ v [T, hs]: the zeros above the diagonal add nothing */
    GPT_TRY(mm(g, false, false, T, hs, T, att, T, T * T, g->v, hs, T * hs, 0.0f, g->yh, hs, T * hs, BH,
           "cublasSgemmStridedBatched (attention output)"));
    GK_LAUNCH(gk_from_heads, nb, g->s)(y, g->yh, B, T, C, H);
    return launched(g, "head merge kernel");
}

/* dqkv [B, T, 3C] (overwritten) from dy [B, T, C]; datt is scratch of att's size */
static int attention_backward(struct gpt_gpu *g, float *dqkv, float *datt, const float *dy, const float *att,
                              const float *qkv, int64_t B)
{
    int64_t T = g->cfg.ctx, C = g->cfg.dim, H = g->cfg.heads, hs = C / H, BH = B * H;
    unsigned nb = gk_blocks(B * T * C);

    GK_LAUNCH(gk_qkv_split, nb, g->s)(g->q, g->k, g->v, qkv, B, T, C, H);
    GPT_TRY(launched(g, "qkv split kernel"));
    GK_LAUNCH(gk_to_heads, nb, g->s)(g->yh, dy, B, T, C, H);
    GPT_TRY(launched(g, "head split kernel"));
    /* datt [T, T] = dyh [T, hs] @ v^T; dv [T, hs] = att^T @ dyh */
    GPT_TRY(mm(g, false, true, T, T, hs, g->yh, hs, T * hs, g->v, hs, T * hs, 0.0f, datt, T, T * T, BH,
           "cublasSgemmStridedBatched (probability gradient)"));
    GPT_TRY(mm(g, true, false, T, hs, T, att, T, T * T, g->yh, hs, T * hs, 0.0f, g->dv, hs, T * hs, BH,
           "cublasSgemmStridedBatched (value gradient)"));
    GK_LAUNCH(gk_softmax_backward, gk_row_blocks(BH * T), g->s)(datt, att, BH * T, T,
                                                                         1.0f / sqrtf((float)hs));
    GPT_TRY(launched(g, "softmax backward kernel"));
    /* dq [T, hs] = ds [T, T] @ k; dk [T, hs] = ds^T @ q */
    GPT_TRY(mm(g, false, false, T, hs, T, datt, T, T * T, g->k, hs, T * hs, 0.0f, g->dq, hs, T * hs, BH,
           "cublasSgemmStridedBatched (query gradient)"));
    GPT_TRY(mm(g, true, false, T, hs, T, datt, T, T * T, g->q, hs, T * hs, 0.0f, g->dk, hs, T * hs, BH,
           "cublasSgemmStridedBatched (key gradient)"));
    GK_LAUNCH(gk_qkv_merge, nb, g->s)(dqkv, g->dq, g->dk, g->dv, B, T, C, H);
    return launched(g, "qkv merge kernel");
}

/* ---------------------------------------------------------------- one block (block_forward, block_backward) */

static int block_forward(struct gpt_gpu *g, float *const *w, const float *x, struct gpu_acts *a, float *out,
                         int64_t B)
{
    int64_t C = g->cfg.dim, N = B * g->cfg.ctx;

    GPT_TRY(layernorm_forward(g, a->ln1, a->ln1_mean, a->ln1_rstd, x, w[GPT_LN1_W], w[GPT_LN1_B], N, C));
    GPT_TRY(linear_forward(g, a->qkv, a->ln1, w[GPT_QKV_W], w[GPT_QKV_B], N, C, 3 * C));
    GPT_TRY(attention_forward(g, a->atty, a->att, a->qkv, B));
    GPT_TRY(linear_forward(g, a->res2, a->atty, w[GPT_ATTPROJ_W], w[GPT_ATTPROJ_B], N, C, C));
    GK_LAUNCH(gk_add, gk_blocks(N * C), g->s)(a->res2, x, N * C);
    GPT_TRY(launched(g, "residual kernel"));
    GPT_TRY(layernorm_forward(g, a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, w[GPT_LN2_W], w[GPT_LN2_B], N, C));
    GPT_TRY(linear_forward(g, a->fch, a->ln2, w[GPT_FC_W], w[GPT_FC_B], N, C, 4 * C));
    GK_LAUNCH(gk_gelu_forward, gk_blocks(N * 4 * C), g->s)(a->fchg, a->fch, N * 4 * C);
    GPT_TRY(launched(g, "gelu kernel"));
    GPT_TRY(linear_forward(g, out, a->fchg, w[GPT_FCPROJ_W], w[GPT_FCPROJ_B], N, 4 * C, C));
    GK_LAUNCH(gk_add, gk_blocks(N * C), g->s)(out, a->res2, N * C);
    return launched(g, "residual kernel");
}

/* g->dres holds the gradient at the block's output and leaves with the gradient at its input x */
static int block_backward(struct gpt_gpu *g, float *const *w, float *const *gw, const float *x,
                          const struct gpu_acts *a, int64_t B)
{
    int64_t C = g->cfg.dim, N = B * g->cfg.ctx;
    float *dres = g->dres, *dln = g->dln;

    GPT_TRY(linear_backward(g, g->dh, gw[GPT_FCPROJ_W], gw[GPT_FCPROJ_B], dres, a->fchg, w[GPT_FCPROJ_W], N, 4 * C, C));
    GK_LAUNCH(gk_gelu_backward, gk_blocks(N * 4 * C), g->s)(g->dh, a->fch, N * 4 * C);
    GPT_TRY(launched(g, "gelu backward kernel"));
    GPT_TRY(linear_backward(g, dln, gw[GPT_FC_W], gw[GPT_FC_B], g->dh, a->ln2, w[GPT_FC_W], N, C, 4 * C));
    GPT_TRY(layernorm_backward(g, dres, gw[GPT_LN2_W], gw[GPT_LN2_B], dln, a->res2, a->ln2_mean, a->ln2_rstd,
                           w[GPT_LN2_W], N, C));
    GPT_TRY(linear_backward(g, dln, gw[GPT_ATTPROJ_W], gw[GPT_ATTPROJ_B], dres, a->atty, w[GPT_ATTPROJ_W], N, C, C));
    GPT_TRY(attention_backward(g, g->dqkv, g->datt, dln, a->att, a->qkv, B));
    GPT_TRY(linear_backward(g, dln, gw[GPT_QKV_W], gw[GPT_QKV_B], g->dqkv, a->ln1, w[GPT_QKV_W], N, C, 3 * C));
    return layernorm_backward(g, dres, gw[GPT_LN1_W], gw[GPT_LN1_B], dln, x, a->ln1_mean, a->ln1_rstd,
                              w[GPT_LN1_W], N, C);
}


/* ---------------------------------------------------------------- units: up, and their gradients down */

static int slot(int32_t unit) { return unit == GPT_UNIT_EMBED ? 0 : 1; }

static size_t unit_bytes(const struct gpt_gpu *g, int32_t unit)
{
    return (size_t)g->lay->unit_numel[unit] * sizeof(float);
}

/* the unit's parameters, fetched by the io, copied into the unit's device slot (*dev) */
static int fetch_unit(struct gpt_gpu *g, const struct gpt_io_f32 *io, int32_t unit, float **dev)
{
    const float *host;

    GPT_TRY(io->fetch(io->arg, unit, &host));
    *dev = g->w[slot(unit)];
    return copy(g, *dev, host, unit_bytes(g, unit), cudaMemcpyHostToDevice, "parameters to the GPU");
}

/* the io's zeroed host buffer for the unit's gradient (*host), and a zeroed device slot to sum it in (*dev) */
static int grad_unit(struct gpt_gpu *g, const struct gpt_io_f32 *io, int32_t unit, float **dev, float **host)
{
    GPT_TRY(io->grad(io->arg, unit, host));
    *dev = g->gr[slot(unit)];
    return zero(g, *dev, unit_bytes(g, unit));
}

/* the complete gradient down into the io's buffer (the copy waits for every kernel before it), handed over */
static int grad_unit_done(struct gpt_gpu *g, const struct gpt_io_f32 *io, int32_t unit, const float *dev,
                          float *host)
{
    GPT_TRY(copy(g, host, dev, unit_bytes(g, unit), cudaMemcpyDeviceToHost, "gradient from the GPU"));
    return io->grad_done(io->arg, unit);
}

static void tensors(const struct gpt_gpu *g, int32_t unit, float *base, float *t[GPT_MAX_TENSORS])
{
    for (int32_t k = 0; k < GPT_MAX_TENSORS; k++)
        t[k] = base + g->lay->off[unit][k];
}

static int forward_blocks(struct gpt_gpu *g, const struct gpt_io_f32 *io, int64_t B)
{
    for (int64_t l = 0; l < g->cfg.layers; l++) {
        int32_t u = GPT_UNIT_BLOCK((int32_t)l);
        float *base, *w[GPT_MAX_TENSORS];
        GPT_TRY(fetch_unit(g, io, u, &base));
        tensors(g, u, base, w);
        GPT_TRY(block_forward(g, w, g->resid[l], &g->acts[l], g->resid[l + 1], B));
        GPT_TRY(io->release(io->arg, u)); /* the device copy is made: the kernels read only that */
    }
    return 0;
}

static int backward_blocks(struct gpt_gpu *g, const struct gpt_io_f32 *io, int64_t B)
{
    for (int64_t l = g->cfg.layers - 1; l >= 0; l--) {
        int32_t u = GPT_UNIT_BLOCK((int32_t)l);
        float *base, *w[GPT_MAX_TENSORS], *gbase, *host, *gw[GPT_MAX_TENSORS];
        GPT_TRY(fetch_unit(g, io, u, &base));
        tensors(g, u, base, w);
        GPT_TRY(grad_unit(g, io, u, &gbase, &host));
        tensors(g, u, gbase, gw);
        GPT_TRY(block_backward(g, w, gw, g->resid[l], &g->acts[l], B));
        GPT_TRY(grad_unit_done(g, io, u, gbase, host));
        GPT_TRY(io->release(io->arg, u));
    }
    return 0;
}

/* the loss: the rows' losses down, summed in double in row order as the CPU pass does */
static int loss_down(struct gpt_gpu *g, int64_t N, int train, double grad_scale, double *loss)
{
    double sum = 0;

    GK_LAUNCH(gk_xent, gk_row_blocks(N), g->s)(g->logits, g->row_loss, g->tg, N, g->cfg.vocab, train,
                                                      (float)(grad_scale / (double)N));
    GPT_TRY(launched(g, "cross-entropy kernel"));
    GPT_TRY(copy(g, g->host_loss, g->row_loss, (size_t)N * sizeof(float), cudaMemcpyDeviceToHost,
             "losses from the GPU"));
    for (int64_t i = 0; i < N; i++)
        sum += (double)g->host_loss[i];
    *loss = sum / (double)N;
    return 0;
}

/* gpt_model_run_f32 (passes_tmpl.h), unit for unit */
extern "C" int gpt_gpu_run(struct gpt_gpu *g, const struct gpt_io_f32 *io, const int32_t *in,
                           const int32_t *targets, int64_t B, int train, double grad_scale, double *loss)
{
    const struct gpt_config *c = &g->cfg;
    int64_t T = c->ctx, C = c->dim, V = c->vocab, N = B * T;
    int32_t E = GPT_UNIT_EMBED, F = GPT_UNIT_LNF(c);
    const int64_t *oe = g->lay->off[E], *of = g->lay->off[F];
    float *e, *f, *ge = NULL, *he = NULL, *gf, *hf;
    size_t ntok = (size_t)N * sizeof(int32_t);

    g->err[0] = 0;
    g->have_logits = false;
    if (B < 1 || B > g->max_batch) {
        snprintf(g->err, sizeof(g->err), "%lld sequences in a micro-batch, the GPU was opened for 1 to %lld",
                 (long long)B, (long long)g->max_batch);
        return -1;
    }
    train = train && targets;
    GPT_TRY(copy(g, g->in, in, ntok, cudaMemcpyHostToDevice, "tokens to the GPU"));
    if (targets)
        GPT_TRY(copy(g, g->tg, targets, ntok, cudaMemcpyHostToDevice, "targets to the GPU"));
    GPT_TRY(fetch_unit(g, io, E, &e));
    GK_LAUNCH(gk_embed_forward, gk_blocks(N * C), g->s)(g->resid[0], g->in, e + oe[GPT_WTE],
                                                                e + oe[GPT_WPE], N, T, C);
    GPT_TRY(launched(g, "embedding kernel"));
    GPT_TRY(io->release(io->arg, E));
    GPT_TRY(forward_blocks(g, io, B));
    GPT_TRY(fetch_unit(g, io, F, &f));
    GPT_TRY(layernorm_forward(g, g->lnf, g->lnf_mean, g->lnf_rstd, g->resid[c->layers], f + of[GPT_LNF_W],
                          f + of[GPT_LNF_B], N, C));
    GPT_TRY(fetch_unit(g, io, E, &e));
    const float *wte = e + oe[GPT_WTE];
    /* the head, tied to wte [V, C]: logits = lnf @ wte^T */
    GPT_TRY(mm(g, false, true, N, V, C, g->lnf, C, 0, wte, C, 0, 0.0f, g->logits, V, 0, 1, "cublasSgemm (head)"));
    if (targets) {
        GPT_TRY(loss_down(g, N, train, grad_scale, loss));
    } else {
        GPT_TRY(copy(g, g->host_logits, g->logits, (size_t)(N * V) * sizeof(float), cudaMemcpyDeviceToHost,
                 "logits from the GPU"));
        g->have_logits = true;
    }
    if (train) { /* g->logits now holds dlogits: dln = dlogits @ wte; gwte += dlogits^T @ lnf */
        GPT_TRY(grad_unit(g, io, E, &ge, &he));
        GPT_TRY(mm(g, false, false, N, C, V, g->logits, V, 0, wte, C, 0, 0.0f, g->dln, C, 0, 1,
               "cublasSgemm (head input gradient)"));
        GPT_TRY(mm(g, true, false, V, C, N, g->logits, V, 0, g->lnf, C, 0, 1.0f, ge + oe[GPT_WTE], C, 0, 1,
               "cublasSgemm (head weight gradient)"));
    }
    GPT_TRY(io->release(io->arg, E));
    if (!train)
        return io->release(io->arg, F);
    GPT_TRY(grad_unit(g, io, F, &gf, &hf));
    GPT_TRY(zero(g, g->dres, (size_t)(N * C) * sizeof(float)));
    GPT_TRY(layernorm_backward(g, g->dres, gf + of[GPT_LNF_W], gf + of[GPT_LNF_B], g->dln, g->resid[c->layers],
                           g->lnf_mean, g->lnf_rstd, f + of[GPT_LNF_W], N, C));
    GPT_TRY(grad_unit_done(g, io, F, gf, hf));
    GPT_TRY(io->release(io->arg, F));
    GPT_TRY(backward_blocks(g, io, B));
    GK_LAUNCH(gk_embed_backward_wte, gk_blocks(V * C), g->s)(ge + oe[GPT_WTE], g->dres, g->in, N, V, C);
    GPT_TRY(launched(g, "embedding gradient kernel"));
    GK_LAUNCH(gk_embed_backward_wpe, gk_blocks(T * C), g->s)(ge + oe[GPT_WPE], g->dres, B, T, C);
    GPT_TRY(launched(g, "position embedding gradient kernel"));
    return grad_unit_done(g, io, E, ge, he);
}

extern "C" const float *gpt_gpu_logits(const struct gpt_gpu *g) { return g->have_logits ? g->host_logits : NULL; }

/* ---------------------------------------------------------------- open and close */

extern "C" const char *gpt_gpu_error(const struct gpt_gpu *g) { return g ? g->err : ""; }

extern "C" void gpt_gpu_close(struct gpt_gpu *g)
{
    if (!g)
        return;
    for (int i = 0; i < g->nmem; i++)
        cudaFree(g->mem[i]);
    delete[] g->mem;
    delete[] g->resid;
    delete[] g->acts;
    delete[] g->host_loss;
    delete[] g->host_logits;
    if (g->blas)
        cublasDestroy(g->blas);
    if (g->s)
        cudaStreamDestroy(g->s);
    delete g;
}

/* n elements of T on the device, recorded for close; after a failure, nothing more */
template <typename T> static void dalloc(struct gpt_gpu *g, T **p, int64_t n)
{
    size_t bytes = (size_t)n * sizeof(T);
    cudaError_t e;

    *p = NULL;
    if (g->err[0])
        return;
    if (g->nmem == g->cap) {
        snprintf(g->err, sizeof(g->err), "more device arrays than counted (%d)", g->cap);
        return;
    }
    if ((e = cudaMalloc((void **)p, bytes)) != cudaSuccess) {
        char what[64];
        snprintf(what, sizeof(what), "cudaMalloc of %zu bytes", bytes);
        fail(g, what, e);
        *p = NULL;
        return;
    }
    g->mem[g->nmem++] = *p;
}

static void open_acts(struct gpt_gpu *g, struct gpu_acts *a, int64_t N, int64_t C, int64_t att)
{
    dalloc(g, &a->ln1, N * C);
    dalloc(g, &a->ln1_mean, N);
    dalloc(g, &a->ln1_rstd, N);
    dalloc(g, &a->qkv, N * 3 * C);
    dalloc(g, &a->att, att);
    dalloc(g, &a->atty, N * C);
    dalloc(g, &a->res2, N * C);
    dalloc(g, &a->ln2, N * C);
    dalloc(g, &a->ln2_mean, N);
    dalloc(g, &a->ln2_rstd, N);
    dalloc(g, &a->fch, N * 4 * C);
    dalloc(g, &a->fchg, N * 4 * C);
}

#define GPU_ACT_ARRAYS 12 /* open_acts */
#define GPU_OTHER_ARRAYS 28 /* open_arrays, beyond the blocks' and the residuals': at least as many as it makes */

static int open_arrays(struct gpt_gpu *g)
{
    const struct gpt_config *c = &g->cfg;
    int64_t L = c->layers, C = c->dim, V = c->vocab, N = g->max_batch * c->ctx;
    int64_t att = g->max_batch * c->heads * c->ctx * c->ctx, big = 0;

    if (gk_chunks(N) > 65535) { /* the column sums' chunks are grid.y */
        snprintf(g->err, sizeof(g->err), "%lld rows in a micro-batch (sequences x --ctx), above the %d the column "
                 "sums take", (long long)N, 65535 * GK_CHUNK);
        return -1;
    }
    for (int32_t u = 0; u < g->lay->nunits; u++)
        if (u != GPT_UNIT_EMBED && g->lay->unit_numel[u] > big)
            big = g->lay->unit_numel[u];
    g->cap = (int)(L * GPU_ACT_ARRAYS + L + 1 + GPU_OTHER_ARRAYS);
    g->mem = new (std::nothrow) void *[g->cap]();
    g->resid = new (std::nothrow) float *[L + 1]();
    g->acts = new (std::nothrow) gpu_acts[L]();
    g->host_loss = new (std::nothrow) float[N];
    g->host_logits = new (std::nothrow) float[N * V];
    if (!g->mem || !g->resid || !g->acts || !g->host_loss || !g->host_logits) {
        snprintf(g->err, sizeof(g->err), "out of host memory");
        return -1;
    }
    dalloc(g, &g->in, N);
    dalloc(g, &g->tg, N);
    dalloc(g, &g->w[0], g->lay->unit_numel[GPT_UNIT_EMBED]);
    dalloc(g, &g->gr[0], g->lay->unit_numel[GPT_UNIT_EMBED]);
    dalloc(g, &g->w[1], big);
    dalloc(g, &g->gr[1], big);
    for (int64_t l = 0; l <= L; l++)
        dalloc(g, &g->resid[l], N * C);
    for (int64_t l = 0; l < L; l++)
        open_acts(g, &g->acts[l], N, C, att);
    float **other[] = {&g->lnf, &g->dres, &g->dln, &g->q, &g->k, &g->v, &g->yh, &g->dq, &g->dk, &g->dv};
    for (size_t i = 0; i < sizeof(other) / sizeof(other[0]); i++)
        dalloc(g, other[i], N * C);
    dalloc(g, &g->lnf_mean, N);
    dalloc(g, &g->lnf_rstd, N);
    dalloc(g, &g->row_loss, N);
    dalloc(g, &g->logits, N * V);
    dalloc(g, &g->dh, N * 4 * C);
    dalloc(g, &g->dqkv, N * 3 * C);
    dalloc(g, &g->datt, att);
    dalloc(g, &g->part, (int64_t)gk_chunks(N) * 4 * C); /* the widest: the MLP's 4C bias, LayerNorm's 2C */
    return g->err[0] ? -1 : 0;
}

static int open_blas(struct gpt_gpu *g)
{
    cublasStatus_t e = cublasCreate(&g->blas);

    if (e != CUBLAS_STATUS_SUCCESS) {
        g->blas = NULL;
        return blas_fail(g, "cublasCreate", e);
    }
    /* fp32 products on the fp32 units: the default math mode never picks TF32 for cublasSgemm */
    if ((e = cublasSetMathMode(g->blas, CUBLAS_DEFAULT_MATH)) != CUBLAS_STATUS_SUCCESS ||
        (e = cublasSetStream(g->blas, g->s)) != CUBLAS_STATUS_SUCCESS)
        return blas_fail(g, "cublasSetMathMode/SetStream", e);
    return 0;
}

extern "C" struct gpt_gpu *gpt_gpu_open(int local_rank, const struct gpt_config *cfg, const struct gpt_layout *lay,
                                        int64_t max_batch, char *err, size_t errlen)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    struct gpt_gpu *g;

    if (e != cudaSuccess || n <= 0) {
        snprintf(err, errlen, "no CUDA device visible (cudaGetDeviceCount: %s)",
                 e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        return NULL;
    }
    g = new (std::nothrow) gpt_gpu();
    if (!g) {
        snprintf(err, errlen, "out of host memory");
        return NULL;
    }
    g->cfg = *cfg;
    g->lay = lay;
    g->max_batch = max_batch;
    /* ranks beyond the GPU count share one: the CUDA runtime allows it, and the example needs no NCCL */
    if ((e = cudaSetDevice(local_rank % n)) != cudaSuccess)
        fail(g, "cudaSetDevice", e);
    else if ((e = cudaStreamCreateWithFlags(&g->s, cudaStreamNonBlocking)) != cudaSuccess)
        fail(g, "cudaStreamCreateWithFlags", e);
    else if (!open_blas(g))
        open_arrays(g);
    if (g->err[0]) {
        snprintf(err, errlen, "%s", g->err);
        gpt_gpu_close(g);
        return NULL;
    }
    return g;
}
