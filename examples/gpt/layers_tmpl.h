/* layers_tmpl.h - the transformer's layers, forward and backward, written once for GPT_REAL (float or
 * double; passes_f32.c and passes_f64.c include it). Matrix products go to BLAS; the rest are plain loops
 * the compiler vectorizes, threaded over rows or (sequence, head) pairs with OpenMP. Every output element
 * is computed by one thread in a fixed order, so results never depend on the thread count. The float
 * passes (GPT_FAST) take attention through matrix products (attention.c) and their exp, GELU, softmax and
 * cross-entropy from vmath.h's 16-lane kernels; the double passes keep the plain loops, the reference. */
#include <math.h>
#include <stdbool.h>
#include <string.h>
#include <cblas.h>  /* defines: cblas_sgemm, cblas_dgemm */
#if GPT_MM16
#include "mm16.h"   /* defines: gpt_mm16, gpt_f32_to_bf16 */
#endif
#if GPT_FAST
#include "attention.h" /* defines: gpt_attention_forward, gpt_attention_backward (matrix products) */
#include "vmath.h"     /* defines: gpt_vmath (16-lane exp, GELU, softmax rows, cross-entropy rows) */
#endif

typedef GPT_REAL real;

/* ---------------------------------------------------------------- matrix products (row-major) */

/* A weight matrix: its fp32 values, or, when the products run in bf16 (GPT_MM16 builds), its bf16 storage
 * h, with f left unread (the training program does not widen it). */
struct mat {
    const real *f;
    const uint16_t *h;
};

/* y[N, out] = x[N, in] @ w[in, out] + b (+ res, the residual stream, when given: one pass adds both, in the
 * order (x @ w + b) + res). In bf16, x rounded lies in x16 [N, in]: rounded here unless x16_ready; the
 * backward reads it there again. */
static void linear_forward(real *y, const real *x, struct mat w, uint16_t *x16, bool x16_ready, const real *b,
                           const real *res, int64_t N, int64_t in, int64_t out)
{
#if GPT_MM16
    if (w.h) {
        if (!x16_ready)
            gpt_f32_to_bf16(x16, x, N * in);
        gpt_mm16(false, false, N, out, in, x16, in, w.h, out, 0, y, out);
    } else
#endif
        GPT_GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)N, (int)out, (int)in, 1, x, (int)in, w.f, (int)out, 0,
                 y, (int)out);
    (void)x16;
    (void)x16_ready;
    if (!b && !res)
        return;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N; i++) {
        real *yi = y + i * out;
        if (b)
            for (int64_t j = 0; j < out; j++)
                yi[j] += b[j];
        if (res)
            for (int64_t j = 0; j < out; j++)
                yi[j] += res[i * out + j];
    }
}

/* dx = dy @ w^T (overwritten); dw += x^T @ dy; db += column sums of dy. In bf16, x16 holds x rounded (by the
 * forward) and dy is rounded into dy16 [N, out] unless dy16_ready; dw still sums in fp32. */
static void linear_backward(real *dx, real *dw, real *db, const real *dy, const real *x, struct mat w,
                            const uint16_t *x16, uint16_t *dy16, bool dy16_ready, int64_t N, int64_t in, int64_t out)
{
#if GPT_MM16
    if (w.h) {
        if (!dy16_ready)
            gpt_f32_to_bf16(dy16, dy, N * out);
        gpt_mm16(false, true, N, in, out, dy16, out, w.h, out, 0, dx, in);
        gpt_mm16(true, false, in, out, N, x16, in, dy16, out, 1, dw, out);
    } else
#endif
    {
        GPT_GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, (int)N, (int)in, (int)out, 1, dy, (int)out, w.f, (int)out, 0,
                 dx, (int)in);
        GPT_GEMM(CblasRowMajor, CblasTrans, CblasNoTrans, (int)in, (int)out, (int)N, 1, x, (int)in, dy, (int)out, 1,
                 dw, (int)out);
    }
    (void)x16;
    (void)dy16;
    (void)dy16_ready;
    if (!db)
        return;
    for (int64_t i = 0; i < N; i++)
        for (int64_t j = 0; j < out; j++)
            db[j] += dy[i * out + j];
}

/* ---------------------------------------------------------------- LayerNorm (eps 1e-5, as GPT-2) */

static void layernorm_forward(real *y, real *mean, real *rstd, const real *x, const real *w, const real *b,
                              int64_t N, int64_t C)
{
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N; i++) {
        const real *xi = x + i * C;
        real *yi = y + i * C;
        real m = 0, v = 0;
        for (int64_t j = 0; j < C; j++)
            m += xi[j];
        m /= (real)C;
        for (int64_t j = 0; j < C; j++)
            v += (xi[j] - m) * (xi[j] - m);
        v /= (real)C;
        real s = 1 / GPT_SQRT(v + (real)1e-5);
        for (int64_t j = 0; j < C; j++)
            yi[j] = (xi[j] - m) * s * w[j] + b[j];
        mean[i] = m;
        rstd[i] = s;
    }
}

/* dx += the input gradient; dw, db += the parameter gradients. Rows in order: dw and db are shared. */
static void layernorm_backward(real *dx, real *dw, real *db, const real *dy, const real *x, const real *mean,
                               const real *rstd, const real *w, int64_t N, int64_t C)
{
    for (int64_t i = 0; i < N; i++) {
        const real *dyi = dy + i * C, *xi = x + i * C;
        real *dxi = dx + i * C;
        real m = mean[i], s = rstd[i], dsum = 0, dnsum = 0;
        for (int64_t j = 0; j < C; j++) {
            real n = (xi[j] - m) * s, dn = dyi[j] * w[j];
            dsum += dn;
            dnsum += dn * n;
            dw[j] += dyi[j] * n;
            db[j] += dyi[j];
        }
        dsum /= (real)C;
        dnsum /= (real)C;
        for (int64_t j = 0; j < C; j++) {
            real n = (xi[j] - m) * s;
            dxi[j] += s * (dyi[j] * w[j] - dsum - n * dnsum);
        }
    }
}

/* ---------------------------------------------------------------- GELU, tanh approximation (GPT-2) */

#define GELU_K ((real)0.7978845608028654) /* sqrt(2 / pi) */

static void gelu_forward(real *y, const real *x, int64_t n)
{
#if GPT_FAST
    gpt_vmath()->gelu_forward(y, x, n);
    return;
#endif
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        real v = x[i];
        y[i] = (real)0.5 * v * (1 + GPT_TANH(GELU_K * (v + (real)0.044715 * v * v * v)));
    }
}

/* d = dy * gelu'(x), in place over dy */
static void gelu_backward(real *d, const real *x, int64_t n)
{
#if GPT_FAST
    gpt_vmath()->gelu_backward(d, x, n);
    return;
#endif
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        real v = x[i], th = GPT_TANH(GELU_K * (v + (real)0.044715 * v * v * v));
        real dth = (1 - th * th) * GELU_K * (1 + 3 * (real)0.044715 * v * v);
        d[i] *= (real)0.5 * (1 + th) + (real)0.5 * v * dth;
    }
}

/* ---------------------------------------------------------------- causal self-attention */

/* qkv [B, T, 3C] (q, k, v per token; head h is columns h*hs .. h*hs+hs of each); att [B, H, T, T];
 * y [B, T, C]. Scores above the diagonal are never read and stay zero. */
static void attention_forward(real *y, real *att, const real *qkv, int64_t B, int64_t T, int64_t C, int64_t H)
{
#if GPT_FAST
    gpt_attention_forward(y, att, qkv, B, T, C, H);
    return;
#endif
    int64_t hs = C / H;
    real scale = 1 / GPT_SQRT((real)hs);

#pragma omp parallel for schedule(static)
    for (int64_t bh = 0; bh < B * H; bh++) {
        int64_t b = bh / H, h = bh % H;
        for (int64_t t = 0; t < T; t++) {
            const real *q = qkv + (b * T + t) * 3 * C + h * hs;
            real *a = att + (bh * T + t) * T, mx = -INFINITY, sum = 0;
            for (int64_t s = 0; s <= t; s++) {
                const real *k = qkv + (b * T + s) * 3 * C + C + h * hs;
                real d = 0;
                for (int64_t i = 0; i < hs; i++)
                    d += q[i] * k[i];
                a[s] = d * scale;
                mx = a[s] > mx ? a[s] : mx;
            }
            for (int64_t s = 0; s <= t; s++) {
                a[s] = GPT_EXP(a[s] - mx);
                sum += a[s];
            }
            for (int64_t s = 0; s <= t; s++)
                a[s] /= sum;
            for (int64_t s = t + 1; s < T; s++)
                a[s] = 0;
            real *yt = y + (b * T + t) * C + h * hs;
            for (int64_t i = 0; i < hs; i++)
                yt[i] = 0;
            for (int64_t s = 0; s <= t; s++) {
                const real *v = qkv + (b * T + s) * 3 * C + 2 * C + h * hs;
                for (int64_t i = 0; i < hs; i++)
                    yt[i] += a[s] * v[i];
            }
        }
    }
}

/* dqkv (overwritten) from dy; datt is scratch of the att's size. Each (b, h) writes only its own head's
 * columns, so the pairs run in parallel. */
static void attention_backward(real *dqkv, real *datt, const real *dy, const real *att, const real *qkv, int64_t B,
                               int64_t T, int64_t C, int64_t H)
{
#if GPT_FAST
    gpt_attention_backward(dqkv, datt, dy, att, qkv, B, T, C, H);
    return;
#endif
    int64_t hs = C / H;
    real scale = 1 / GPT_SQRT((real)hs);

    memset(dqkv, 0, (size_t)(B * T * 3 * C) * sizeof(real));
#pragma omp parallel for schedule(static)
    for (int64_t bh = 0; bh < B * H; bh++) {
        int64_t b = bh / H, h = bh % H;
        for (int64_t t = 0; t < T; t++) {
            const real *a = att + (bh * T + t) * T, *dyt = dy + (b * T + t) * C + h * hs;
            const real *q = qkv + (b * T + t) * 3 * C + h * hs;
            real *da = datt + (bh * T + t) * T, *dq = dqkv + (b * T + t) * 3 * C + h * hs, dot = 0;
            for (int64_t s = 0; s <= t; s++) {
                const real *v = qkv + (b * T + s) * 3 * C + 2 * C + h * hs;
                real *dv = dqkv + (b * T + s) * 3 * C + 2 * C + h * hs;
                real d = 0;
                for (int64_t i = 0; i < hs; i++) {
                    d += dyt[i] * v[i];
                    dv[i] += a[s] * dyt[i];
                }
                da[s] = d;
                dot += a[s] * d;
            }
            for (int64_t s = 0; s <= t; s++) { /* through the softmax, then the scaled dot product */
                const real *k = qkv + (b * T + s) * 3 * C + C + h * hs;
                real *dk = dqkv + (b * T + s) * 3 * C + C + h * hs;
                real ds = a[s] * (da[s] - dot) * scale;
                for (int64_t i = 0; i < hs; i++) {
                    dq[i] += ds * k[i];
                    dk[i] += ds * q[i];
                }
            }
        }
    }
}

/* ---------------------------------------------------------------- embeddings and the loss */

static void embed_forward(real *x, const int32_t *tok, const real *wte, const real *wpe, int64_t B, int64_t T,
                          int64_t C)
{
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < B * T; n++)
        for (int64_t j = 0; j < C; j++)
            x[n * C + j] = wte[tok[n] * C + j] + wpe[(n % T) * C + j];
}

/* in token order: tokens repeat, so rows of dwte are shared */
static void embed_backward(real *dwte, real *dwpe, const real *dx, const int32_t *tok, int64_t B, int64_t T,
                           int64_t C)
{
    for (int64_t n = 0; n < B * T; n++)
        for (int64_t j = 0; j < C; j++) {
            dwte[tok[n] * C + j] += dx[n * C + j];
            dwpe[(n % T) * C + j] += dx[n * C + j];
        }
}

/* Softmax cross-entropy per row: row_loss[i] = -log p[target]; with dlogits, the logits are replaced by
 * the gradient of scale * mean loss over the N rows. */
static void xent_forward_backward(real *logits, double *row_loss, const int32_t *targets, int64_t N, int64_t V,
                                  int grad, double scale)
{
#if GPT_FAST
    const struct gpt_vmath *vm = gpt_vmath();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N; i++)
        row_loss[i] = vm->xent(logits + i * V, V, targets[i], grad ? (real)(scale / (double)N) : 0);
    return;
#endif
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N; i++) {
        real *z = logits + i * V, mx = z[0], sum = 0;
        for (int64_t j = 1; j < V; j++)
            mx = z[j] > mx ? z[j] : mx;
        for (int64_t j = 0; j < V; j++)
            sum += GPT_EXP(z[j] - mx);
        row_loss[i] = (double)(GPT_LOG(sum) + mx - z[targets[i]]);
        if (!grad)
            continue;
        real f = (real)(scale / (double)N);
        for (int64_t j = 0; j < V; j++)
            z[j] = GPT_EXP(z[j] - mx) / sum * f;
        z[targets[i]] -= f;
    }
}
