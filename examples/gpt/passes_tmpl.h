/* passes_tmpl.h - the model's forward and backward over its units, written once for GPT_REAL (see
 * layers_tmpl.h). Units are fetched in forward order and released after use; in backward each unit's
 * gradient is handed over as soon as it is complete, so its reduction overlaps the rest of backward.
 * The including file has included model.h first. */
#include <stdlib.h>

#include "layers_tmpl.h"  /* defines: linear_*, layernorm_*, gelu_*, attention_*, embed_*, xent_forward_backward */

typedef struct GPT_SUF(gpt_model) model_t;
typedef struct GPT_SUF(gpt_block_acts) acts_t;
typedef struct GPT_SUF(gpt_io) io_t;

static real *alloc_real(int64_t n, int *fail)
{
    real *p = calloc((size_t)n, sizeof(real));

    *fail |= !p;
    return p;
}

static void acts_alloc(acts_t *a, int64_t B, const struct gpt_config *c, int *fail)
{
    int64_t N = B * c->ctx, C = c->dim;

    a->ln1 = alloc_real(N * C, fail);
    a->ln1_mean = alloc_real(N, fail);
    a->ln1_rstd = alloc_real(N, fail);
    a->qkv = alloc_real(N * 3 * C, fail);
    a->att = alloc_real(B * c->heads * c->ctx * c->ctx, fail);
    a->atty = alloc_real(N * C, fail);
    a->res2 = alloc_real(N * C, fail);
    a->ln2 = alloc_real(N * C, fail);
    a->ln2_mean = alloc_real(N, fail);
    a->ln2_rstd = alloc_real(N, fail);
    a->fch = alloc_real(N * 4 * C, fail);
    a->fchg = alloc_real(N * 4 * C, fail);
#if GPT_MM16 /* untouched (no resident pages) unless the products run in bf16 */
    a->ln1_16 = calloc((size_t)(N * C), sizeof(uint16_t));
    a->atty16 = calloc((size_t)(N * C), sizeof(uint16_t));
    a->ln2_16 = calloc((size_t)(N * C), sizeof(uint16_t));
    a->fchg16 = calloc((size_t)(N * 4 * C), sizeof(uint16_t));
    *fail |= !a->ln1_16 || !a->atty16 || !a->ln2_16 || !a->fchg16;
#endif
}

static void acts_free(acts_t *a)
{
    real *all[] = {a->ln1, a->ln1_mean, a->ln1_rstd, a->qkv, a->att, a->atty, a->res2, a->ln2, a->ln2_mean,
                   a->ln2_rstd, a->fch, a->fchg};
    uint16_t *all16[] = {a->ln1_16, a->atty16, a->ln2_16, a->fchg16};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
        free(all[i]);
    for (size_t i = 0; i < sizeof(all16) / sizeof(all16[0]); i++)
        free(all16[i]);
}

int GPT_SUF(gpt_model_init)(model_t *m, const struct gpt_config *cfg, const struct gpt_layout *lay,
                            int64_t max_batch, int recompute)
{
    int64_t L = cfg->layers, N = max_batch * cfg->ctx, C = cfg->dim;
    int fail = 0;

    *m = (model_t){.cfg = *cfg, .lay = lay, .max_batch = max_batch, .recompute = recompute};
    m->resid = calloc((size_t)L + 1, sizeof(real *));
    m->acts = calloc(recompute ? 1 : (size_t)L, sizeof(acts_t));
    m->row_loss = calloc((size_t)N, sizeof(double));
    if (!m->resid || !m->acts || !m->row_loss) {
        GPT_SUF(gpt_model_free)(m);
        return -1;
    }
    for (int64_t l = 0; l <= L; l++)
        m->resid[l] = alloc_real(N * C, &fail);
    for (int64_t l = 0; l < (recompute ? 1 : L); l++)
        acts_alloc(&m->acts[l], max_batch, cfg, &fail);
    m->lnf = alloc_real(N * C, &fail);
    m->lnf_mean = alloc_real(N, &fail);
    m->lnf_rstd = alloc_real(N, &fail);
    m->logits = alloc_real(N * cfg->vocab, &fail);
    m->dres = alloc_real(N * C, &fail);
    m->dln = alloc_real(N * C, &fail);
    m->dh = alloc_real(N * 4 * C, &fail);
    m->dqkv = alloc_real(N * 3 * C, &fail);
    m->datt = alloc_real(max_batch * cfg->heads * cfg->ctx * cfg->ctx, &fail);
#if GPT_MM16 /* untouched (no resident pages) unless the products run in bf16 */
    m->x16 = calloc((size_t)(N * C), sizeof(uint16_t));
    m->y16 = calloc((size_t)(N * (cfg->vocab > 4 * C ? cfg->vocab : 4 * C)), sizeof(uint16_t));
    fail |= !m->x16 || !m->y16;
#endif
    if (fail) {
        GPT_SUF(gpt_model_free)(m);
        return -1;
    }
    return 0;
}

void GPT_SUF(gpt_model_free)(model_t *m)
{
    for (int64_t l = 0; m->resid && l <= m->cfg.layers; l++)
        free(m->resid[l]);
    for (int64_t l = 0; m->acts && l < (m->recompute ? 1 : m->cfg.layers); l++)
        acts_free(&m->acts[l]);
    free(m->resid);
    free(m->acts);
    free(m->row_loss);
    free(m->lnf);
    free(m->lnf_mean);
    free(m->lnf_rstd);
    free(m->logits);
    free(m->dres);
    free(m->dln);
    free(m->dh);
    free(m->dqkv);
    free(m->datt);
    free(m->x16);
    free(m->y16);
    *m = (model_t){0};
}

/* ---------------------------------------------------------------- one block */

/* The block's tensors inside its unit buffer, and in bf16 storage (h, all NULL without it). */
static void tensors(const model_t *m, const io_t *io, int32_t unit, const real *base, const real *t[GPT_MAX_TENSORS],
                    const uint16_t *h[GPT_MAX_TENSORS])
{
    const uint16_t *base16 = io->fetched16 ? io->fetched16(io->arg, unit) : NULL;

    for (int32_t k = 0; k < GPT_MAX_TENSORS; k++) {
        t[k] = base + m->lay->off[unit][k];
        h[k] = base16 ? base16 + m->lay->off[unit][k] : NULL;
    }
}

#define MAT(k) ((struct mat){w[k], h[k]})

/* GELU, and in bf16 its result rounded in the same pass (the fp32 one is then never read) */
static void block_gelu(acts_t *a, bool mm16, int64_t n)
{
#if GPT_MM16
    if (mm16) {
        gpt_vmath()->gelu_forward16(a->fchg16, a->fch, n);
        return;
    }
#endif
    (void)mm16;
    gelu_forward(a->fchg, a->fch, n);
}

static void block_forward(const model_t *m, const real *const *w, const uint16_t *const *h, const real *x, acts_t *a,
                          real *out, int64_t B)
{
    int64_t T = m->cfg.ctx, C = m->cfg.dim, N = B * T;
    bool fc16 = h[GPT_FCPROJ_W] != NULL;

    layernorm_forward(a->ln1, a->ln1_mean, a->ln1_rstd, x, w[GPT_LN1_W], w[GPT_LN1_B], N, C);
    linear_forward(a->qkv, a->ln1, MAT(GPT_QKV_W), a->ln1_16, false, w[GPT_QKV_B], NULL, N, C, 3 * C);
    attention_forward(a->atty, a->att, a->qkv, B, T, C, m->cfg.heads);
    linear_forward(a->res2, a->atty, MAT(GPT_ATTPROJ_W), a->atty16, false, w[GPT_ATTPROJ_B], x, N, C, C);
    layernorm_forward(a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, w[GPT_LN2_W], w[GPT_LN2_B], N, C);
    linear_forward(a->fch, a->ln2, MAT(GPT_FC_W), a->ln2_16, false, w[GPT_FC_B], NULL, N, C, 4 * C);
    block_gelu(a, fc16, N * 4 * C);
    linear_forward(out, a->fchg, MAT(GPT_FCPROJ_W), a->fchg16, fc16, w[GPT_FCPROJ_B], a->res2, N, 4 * C, C);
}

/* d = dh * gelu'(fch) in place, and in bf16 also rounded into d16 for the next product */
static void block_dgelu(real *d, uint16_t *d16, const acts_t *a, bool mm16, int64_t n)
{
#if GPT_MM16
    if (mm16) {
        gpt_vmath()->gelu_backward16(d, d16, a->fch, n);
        return;
    }
#endif
    (void)d16;
    (void)mm16;
    gelu_backward(d, a->fch, n);
}

/* m->dres holds the gradient at the block's output and leaves with the gradient at its input x */
static void block_backward(model_t *m, const real *const *w, const uint16_t *const *h, real *const *g, const real *x,
                           const acts_t *a, int64_t B)
{
    int64_t T = m->cfg.ctx, C = m->cfg.dim, N = B * T;
    real *dres = m->dres, *dln = m->dln;
    uint16_t *y16 = m->y16;
    bool fc16 = h[GPT_FC_W] != NULL;

    linear_backward(m->dh, g[GPT_FCPROJ_W], g[GPT_FCPROJ_B], dres, a->fchg, MAT(GPT_FCPROJ_W), a->fchg16, y16, false,
                    N, 4 * C, C);
    block_dgelu(m->dh, y16, a, fc16, N * 4 * C);
    linear_backward(dln, g[GPT_FC_W], g[GPT_FC_B], m->dh, a->ln2, MAT(GPT_FC_W), a->ln2_16, y16, fc16, N, C, 4 * C);
    layernorm_backward(dres, g[GPT_LN2_W], g[GPT_LN2_B], dln, a->res2, a->ln2_mean, a->ln2_rstd, w[GPT_LN2_W], N, C);
    linear_backward(dln, g[GPT_ATTPROJ_W], g[GPT_ATTPROJ_B], dres, a->atty, MAT(GPT_ATTPROJ_W), a->atty16, y16, false,
                    N, C, C);
    attention_backward(m->dqkv, m->datt, dln, a->att, a->qkv, B, T, C, m->cfg.heads);
    linear_backward(dln, g[GPT_QKV_W], g[GPT_QKV_B], m->dqkv, a->ln1, MAT(GPT_QKV_W), a->ln1_16, y16, false, N, C,
                    3 * C);
    layernorm_backward(dres, g[GPT_LN1_W], g[GPT_LN1_B], dln, x, a->ln1_mean, a->ln1_rstd, w[GPT_LN1_W], N, C);
}

#undef MAT

/* ---------------------------------------------------------------- the whole model */

static int forward_blocks(model_t *m, const io_t *io, int64_t B)
{
    for (int64_t l = 0; l < m->cfg.layers; l++) {
        int32_t u = GPT_UNIT_BLOCK((int32_t)l);
        const real *base, *w[GPT_MAX_TENSORS];
        const uint16_t *h[GPT_MAX_TENSORS];
        GPT_TRY(io->fetch(io->arg, u, &base));
        tensors(m, io, u, base, w, h);
        block_forward(m, w, h, m->resid[l], &m->acts[m->recompute ? 0 : l], m->resid[l + 1], B);
        GPT_TRY(io->release(io->arg, u));
    }
    return 0;
}

static int backward_blocks(model_t *m, const io_t *io, int64_t B)
{
    for (int64_t l = m->cfg.layers - 1; l >= 0; l--) {
        int32_t u = GPT_UNIT_BLOCK((int32_t)l);
        const real *base, *w[GPT_MAX_TENSORS];
        const uint16_t *h[GPT_MAX_TENSORS];
        real *gbase, *g[GPT_MAX_TENSORS];
        acts_t *a = &m->acts[m->recompute ? 0 : l];
        GPT_TRY(io->fetch(io->arg, u, &base));
        tensors(m, io, u, base, w, h);
        if (m->recompute) /* the same operations on the same input: the same activations, bit for bit */
            block_forward(m, w, h, m->resid[l], a, m->resid[l + 1], B);
        GPT_TRY(io->grad(io->arg, u, &gbase));
        for (int32_t k = 0; k < GPT_MAX_TENSORS; k++)
            g[k] = gbase + m->lay->off[u][k];
        block_backward(m, w, h, g, m->resid[l], a, B);
        GPT_TRY(io->grad_done(io->arg, u));
        GPT_TRY(io->release(io->arg, u));
    }
    return 0;
}

/* The head, tied to wte [V, C]: logits = lnf @ wte^T */
static void head_forward(model_t *m, struct mat wte, int64_t N)
{
    int64_t C = m->cfg.dim, V = m->cfg.vocab;

#if GPT_MM16
    if (wte.h) {
        gpt_f32_to_bf16(m->x16, m->lnf, N * C);
        gpt_mm16(false, true, N, V, C, m->x16, C, wte.h, C, 0, m->logits, V);
        return;
    }
#endif
    GPT_GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, (int)N, (int)V, (int)C, 1, m->lnf, (int)C, wte.f, (int)C, 0,
             m->logits, (int)V);
}

/* m->logits holds dlogits: dln = dlogits @ wte; gwte += dlogits^T @ lnf */
static void head_backward(model_t *m, struct mat wte, real *gwte, int64_t N)
{
    int64_t C = m->cfg.dim, V = m->cfg.vocab;

#if GPT_MM16
    if (wte.h) {
        gpt_f32_to_bf16(m->y16, m->logits, N * V); /* m->x16 still holds lnf rounded by head_forward */
        gpt_mm16(false, false, N, C, V, m->y16, V, wte.h, C, 0, m->dln, C);
        gpt_mm16(true, false, V, C, N, m->y16, V, m->x16, C, 1, gwte, C);
        return;
    }
#endif
    GPT_GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)N, (int)C, (int)V, 1, m->logits, (int)V, wte.f, (int)C, 0,
             m->dln, (int)C);
    GPT_GEMM(CblasRowMajor, CblasTrans, CblasNoTrans, (int)V, (int)C, (int)N, 1, m->logits, (int)V, m->lnf, (int)C, 1,
             gwte, (int)C);
}

int GPT_SUF(gpt_model_run)(model_t *m, const io_t *io, const int32_t *in, const int32_t *targets, int64_t B,
                           int train, double grad_scale, double *loss)
{
    const struct gpt_config *c = &m->cfg;
    int64_t T = c->ctx, C = c->dim, V = c->vocab, N = B * T;
    int32_t E = GPT_UNIT_EMBED, F = GPT_UNIT_LNF(c);
    const real *e, *f, *wte;
    const uint16_t *e16;
    real *ge = NULL, *gf;

    if (B > m->max_batch)
        return -1;
    train = train && targets;
    GPT_TRY(io->fetch(io->arg, E, &e));
    embed_forward(m->resid[0], in, e + m->lay->off[E][GPT_WTE], e + m->lay->off[E][GPT_WPE], B, T, C);
    GPT_TRY(io->release(io->arg, E));
    GPT_TRY(forward_blocks(m, io, B));
    GPT_TRY(io->fetch(io->arg, F, &f));
    layernorm_forward(m->lnf, m->lnf_mean, m->lnf_rstd, m->resid[c->layers], f + m->lay->off[F][GPT_LNF_W],
                      f + m->lay->off[F][GPT_LNF_B], N, C);
    GPT_TRY(io->fetch(io->arg, E, &e));
    wte = e + m->lay->off[E][GPT_WTE];
    e16 = io->fetched16 ? io->fetched16(io->arg, E) : NULL;
    head_forward(m, (struct mat){wte, e16 ? e16 + m->lay->off[E][GPT_WTE] : NULL}, N);
    if (targets) {
        double sum = 0;
        xent_forward_backward(m->logits, m->row_loss, targets, N, V, train, grad_scale);
        for (int64_t i = 0; i < N; i++)
            sum += m->row_loss[i];
        *loss = sum / (double)N;
    }
    if (train) { /* m->logits now holds dlogits */
        GPT_TRY(io->grad(io->arg, E, &ge));
        head_backward(m, (struct mat){wte, e16 ? e16 + m->lay->off[E][GPT_WTE] : NULL},
                      ge + m->lay->off[E][GPT_WTE], N);
    }
    GPT_TRY(io->release(io->arg, E));
    if (!train)
        return io->release(io->arg, F);
    GPT_TRY(io->grad(io->arg, F, &gf));
    memset(m->dres, 0, (size_t)(N * C) * sizeof(real));
    layernorm_backward(m->dres, gf + m->lay->off[F][GPT_LNF_W], gf + m->lay->off[F][GPT_LNF_B], m->dln,
                       m->resid[c->layers], m->lnf_mean, m->lnf_rstd, f + m->lay->off[F][GPT_LNF_W], N, C);
    GPT_TRY(io->grad_done(io->arg, F));
    GPT_TRY(io->release(io->arg, F));
    GPT_TRY(backward_blocks(m, io, B));
    embed_backward(ge + m->lay->off[E][GPT_WTE], ge + m->lay->off[E][GPT_WPE], m->dres, in, B, T, C);
    return io->grad_done(io->arg, E);
}
