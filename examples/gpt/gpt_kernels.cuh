/* gpt_kernels.cuh - the transformer's elementwise and row-wise layers as CUDA kernels, one per loop of
 * layers_tmpl.h (the CPU reference: each kernel names the function it follows). Included by gpt_cuda.cu
 * only. Row-wise kernels give each row to one warp (rows never straddle warps, so a warp leaves together);
 * column sums (parameter gradients shared by all rows) add fixed chunks of rows, then the chunks, in order,
 * so every result is the same from run to run. No atomics. */
#ifndef GPT_KERNELS_CUH
#define GPT_KERNELS_CUH

#include <math.h>
#include <stdint.h>

#define GK_THREADS 256                    /* threads per block, 8 warps */
#define GK_WARPS (GK_THREADS / 32)
#define GK_GELU_K 0.7978845608028654f    /* sqrt(2 / pi) */

/* kernel<<<grid, GK_THREADS, 0, stream>>>: one spelling, so that tests/cuda_emu can run the kernels on a CPU */
#ifndef GK_LAUNCH
#define GK_LAUNCH(kernel, grid, stream) kernel<<<(grid), GK_THREADS, 0, (stream)>>>
#endif

static inline unsigned gk_blocks(int64_t n) { return (unsigned)((n + GK_THREADS - 1) / GK_THREADS); }
static inline unsigned gk_row_blocks(int64_t rows) { return (unsigned)((rows + GK_WARPS - 1) / GK_WARPS); }

__device__ static inline float gk_warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ static inline float gk_warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* this thread's element, or -1 past n */
__device__ static inline int64_t gk_index(int64_t n)
{
    int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    return t < n ? t : -1;
}

/* this warp's row, or -1 past rows (the same for all 32 lanes) */
__device__ static inline int64_t gk_row(int64_t rows)
{
    int64_t r = (int64_t)blockIdx.x * GK_WARPS + threadIdx.x / 32;
    return r < rows ? r : -1;
}

/* ---------------------------------------------------------------- embeddings (embed_forward, embed_backward) */

__global__ void gk_embed_forward(float *x, const int32_t *tok, const float *wte, const float *wpe, int64_t N,
                                 int64_t T, int64_t C)
{
    int64_t t = gk_index(N * C);
    if (t < 0)
        return;
    int64_t n = t / C, j = t % C;
    x[t] = wte[(int64_t)tok[n] * C + j] + wpe[(n % T) * C + j];
}

/* dwte[v][j] += dx[n][j] over the positions n holding token v, in position order */
__global__ void gk_embed_backward_wte(float *dwte, const float *dx, const int32_t *tok, int64_t N, int64_t V,
                                      int64_t C)
{
    int64_t t = gk_index(V * C);
    if (t < 0)
        return;
    int64_t v = t / C, j = t % C;
    float s = 0.0f;
    for (int64_t n = 0; n < N; n++)
        if (tok[n] == v)
            s += dx[n * C + j];
    dwte[t] += s;
}

/* dwpe[p][j] += dx[b * T + p][j] over the sequences b */
__global__ void gk_embed_backward_wpe(float *dwpe, const float *dx, int64_t B, int64_t T, int64_t C)
{
    int64_t t = gk_index(T * C);
    if (t < 0)
        return;
    int64_t p = t / C, j = t % C;
    float s = 0.0f;
    for (int64_t b = 0; b < B; b++)
        s += dx[(b * T + p) * C + j];
    dwpe[t] += s;
}

/* ---------------------------------------------------------------- elementwise */

/* y[i][j] += b[j] (linear_forward's bias) */
__global__ void gk_add_bias(float *y, const float *b, int64_t N, int64_t out)
{
    int64_t t = gk_index(N * out);
    if (t >= 0)
        y[t] += b[t % out];
}

/* y += x (the residual connections) */
__global__ void gk_add(float *y, const float *x, int64_t n)
{
    int64_t t = gk_index(n);
    if (t >= 0)
        y[t] += x[t];
}

/* Column sums in two passes, so that a few hundred columns still fill the GPU: pass 1 sums each chunk of
 * GK_CHUNK rows per column (grid.y: the chunk), pass 2 adds the chunks' sums in chunk order. */
#define GK_CHUNK 64
static inline unsigned gk_chunks(int64_t N) { return (unsigned)((N + GK_CHUNK - 1) / GK_CHUNK); }

/* part[r][j] = sum over chunk r's rows i of dy[i][j] (linear_backward's bias gradient) */
__global__ void gk_col_sum_part(float *part, const float *dy, int64_t N, int64_t out)
{
    int64_t j = gk_index(out), r = blockIdx.y, end = (r + 1) * GK_CHUNK < N ? (r + 1) * GK_CHUNK : N;
    if (j < 0)
        return;
    float s = 0.0f;
    for (int64_t i = r * GK_CHUNK; i < end; i++)
        s += dy[i * out + j];
    part[r * out + j] = s;
}

/* dst[j] += part[0][j] + part[1][j] + ... (R chunks of width columns; the chunk sums of cols columns from
 * column `at` of each) */
__global__ void gk_col_fold(float *dst, const float *part, int64_t R, int64_t width, int64_t at, int64_t cols)
{
    int64_t j = gk_index(cols);
    if (j < 0)
        return;
    float s = 0.0f;
    for (int64_t r = 0; r < R; r++)
        s += part[r * width + at + j];
    dst[j] += s;
}

/* gelu_forward: the tanh form */
__global__ void gk_gelu_forward(float *y, const float *x, int64_t n)
{
    int64_t t = gk_index(n);
    if (t < 0)
        return;
    float v = x[t];
    y[t] = 0.5f * v * (1.0f + tanhf(GK_GELU_K * (v + 0.044715f * v * v * v)));
}

/* gelu_backward: d *= gelu'(x) */
__global__ void gk_gelu_backward(float *d, const float *x, int64_t n)
{
    int64_t t = gk_index(n);
    if (t < 0)
        return;
    float v = x[t], th = tanhf(GK_GELU_K * (v + 0.044715f * v * v * v));
    float dth = (1.0f - th * th) * GK_GELU_K * (1.0f + 3.0f * 0.044715f * v * v);
    d[t] *= 0.5f * (1.0f + th) + 0.5f * v * dth;
}

/* ---------------------------------------------------------------- LayerNorm, eps 1e-5 (layernorm_*) */

__global__ void gk_layernorm_forward(float *y, float *mean, float *rstd, const float *x, const float *w,
                                     const float *b, int64_t N, int64_t C)
{
    int64_t i = gk_row(N);
    if (i < 0)
        return;
    int lane = threadIdx.x % 32;
    const float *xi = x + i * C;
    float *yi = y + i * C;
    float m = 0.0f, v = 0.0f;
    for (int64_t j = lane; j < C; j += 32)
        m += xi[j];
    m = gk_warp_sum(m) / (float)C;
    for (int64_t j = lane; j < C; j += 32)
        v += (xi[j] - m) * (xi[j] - m);
    v = gk_warp_sum(v) / (float)C;
    float s = 1.0f / sqrtf(v + 1e-5f);
    for (int64_t j = lane; j < C; j += 32)
        yi[j] = (xi[j] - m) * s * w[j] + b[j];
    if (lane == 0) {
        mean[i] = m;
        rstd[i] = s;
    }
}

/* dx += the input gradient, row by row (a warp each) */
__global__ void gk_layernorm_backward_x(float *dx, const float *dy, const float *x, const float *mean,
                                        const float *rstd, const float *w, int64_t N, int64_t C)
{
    int64_t i = gk_row(N);
    if (i < 0)
        return;
    int lane = threadIdx.x % 32;
    const float *dyi = dy + i * C, *xi = x + i * C;
    float *dxi = dx + i * C;
    float m = mean[i], s = rstd[i], dsum = 0.0f, dnsum = 0.0f;
    for (int64_t j = lane; j < C; j += 32) {
        float n = (xi[j] - m) * s, dn = dyi[j] * w[j];
        dsum += dn;
        dnsum += dn * n;
    }
    dsum = gk_warp_sum(dsum) / (float)C;
    dnsum = gk_warp_sum(dnsum) / (float)C;
    for (int64_t j = lane; j < C; j += 32) {
        float n = (xi[j] - m) * s;
        dxi[j] += s * (dyi[j] * w[j] - dsum - n * dnsum);
    }
}

/* the parameter gradients' chunk sums (see gk_col_sum_part): part[r][j] of dy * normalized x (dw),
 * part[r][C + j] of dy (db) */
__global__ void gk_layernorm_backward_part(float *part, const float *dy, const float *x, const float *mean,
                                           const float *rstd, int64_t N, int64_t C)
{
    int64_t j = gk_index(C), r = blockIdx.y, end = (r + 1) * GK_CHUNK < N ? (r + 1) * GK_CHUNK : N;
    if (j < 0)
        return;
    float sw = 0.0f, sb = 0.0f;
    for (int64_t i = r * GK_CHUNK; i < end; i++) {
        float d = dy[i * C + j];
        sw += d * ((x[i * C + j] - mean[i]) * rstd[i]);
        sb += d;
    }
    part[r * 2 * C + j] = sw;
    part[r * 2 * C + C + j] = sb;
}

/* ---------------------------------------------------------------- attention (attention_forward, _backward)
 * The products run in cuBLAS on per-head copies: q, k, v [B, H, T, hs] gathered from qkv [B, T, 3C]. */

/* qkv [B, T, 3, H, hs] -> q, k, v [B, H, T, hs] */
__global__ void gk_qkv_split(float *q, float *k, float *v, const float *qkv, int64_t B, int64_t T, int64_t C,
                             int64_t H)
{
    int64_t t = gk_index(B * T * C);
    if (t < 0)
        return;
    int64_t hs = C / H, i = t % hs, tt = (t / hs) % T, h = (t / (hs * T)) % H, b = t / (hs * T * H);
    int64_t src = (b * T + tt) * 3 * C + h * hs + i;
    q[t] = qkv[src];
    k[t] = qkv[src + C];
    v[t] = qkv[src + 2 * C];
}

/* the inverse, for the gradients: dq, dk, dv [B, H, T, hs] -> dqkv [B, T, 3C] (every element written) */
__global__ void gk_qkv_merge(float *dqkv, const float *dq, const float *dk, const float *dv, int64_t B, int64_t T,
                             int64_t C, int64_t H)
{
    int64_t t = gk_index(B * T * C);
    if (t < 0)
        return;
    int64_t hs = C / H, i = t % hs, tt = (t / hs) % T, h = (t / (hs * T)) % H, b = t / (hs * T * H);
    int64_t dst = (b * T + tt) * 3 * C + h * hs + i;
    dqkv[dst] = dq[t];
    dqkv[dst + C] = dk[t];
    dqkv[dst + 2 * C] = dv[t];
}

/* y [B, T, C] -> yh [B, H, T, hs] (the attention output's gradient, per head) */
__global__ void gk_to_heads(float *yh, const float *y, int64_t B, int64_t T, int64_t C, int64_t H)
{
    int64_t t = gk_index(B * T * C);
    if (t < 0)
        return;
    int64_t hs = C / H, i = t % hs, tt = (t / hs) % T, h = (t / (hs * T)) % H, b = t / (hs * T * H);
    yh[t] = y[(b * T + tt) * C + h * hs + i];
}

/* yh [B, H, T, hs] -> y [B, T, C] (the attention output) */
__global__ void gk_from_heads(float *y, const float *yh, int64_t B, int64_t T, int64_t C, int64_t H)
{
    int64_t t = gk_index(B * T * C);
    if (t < 0)
        return;
    int64_t hs = C / H, i = t % hs, tt = (t / hs) % T, h = (t / (hs * T)) % H, b = t / (hs * T * H);
    y[(b * T + tt) * C + h * hs + i] = yh[t];
}

/* att holds q.k for every (b, h, t, s); row (bh, t) becomes the causal softmax of scale * q.k over s <= t,
 * zero above the diagonal */
__global__ void gk_softmax_forward(float *att, int64_t rows, int64_t T, float scale)
{
    int64_t r = gk_row(rows);
    if (r < 0)
        return;
    int lane = threadIdx.x % 32;
    int64_t t = r % T;
    float *a = att + r * T, mx = -INFINITY, sum = 0.0f;
    for (int64_t s = lane; s <= t; s += 32) {
        a[s] = a[s] * scale;
        mx = fmaxf(mx, a[s]);
    }
    mx = gk_warp_max(mx);
    for (int64_t s = lane; s <= t; s += 32) {
        a[s] = expf(a[s] - mx);
        sum += a[s];
    }
    sum = gk_warp_sum(sum);
    for (int64_t s = lane; s < T; s += 32)
        a[s] = s <= t ? a[s] / sum : 0.0f;
}

/* datt holds dy.v for every (b, h, t, s); row (bh, t) becomes the gradient of the scaled scores:
 * a[s] (da[s] - sum_s' a[s'] da[s']) scale for s <= t, zero above the diagonal */
__global__ void gk_softmax_backward(float *datt, const float *att, int64_t rows, int64_t T, float scale)
{
    int64_t r = gk_row(rows);
    if (r < 0)
        return;
    int lane = threadIdx.x % 32;
    int64_t t = r % T;
    const float *a = att + r * T;
    float *da = datt + r * T, dot = 0.0f;
    for (int64_t s = lane; s <= t; s += 32)
        dot += a[s] * da[s];
    dot = gk_warp_sum(dot);
    for (int64_t s = lane; s < T; s += 32)
        da[s] = s <= t ? a[s] * (da[s] - dot) * scale : 0.0f;
}

/* ---------------------------------------------------------------- the loss (xent_forward_backward) */

/* row_loss[i] = -log softmax(z)[target]; with grad, z becomes f (softmax(z) - onehot(target)), f = scale / N */
__global__ void gk_xent(float *logits, float *row_loss, const int32_t *targets, int64_t N, int64_t V, int grad,
                        float f)
{
    int64_t i = gk_row(N);
    if (i < 0)
        return;
    int lane = threadIdx.x % 32;
    float *z = logits + i * V, mx = -INFINITY, sum = 0.0f;
    int64_t tg = targets[i];
    for (int64_t j = lane; j < V; j += 32)
        mx = fmaxf(mx, z[j]);
    mx = gk_warp_max(mx);
    for (int64_t j = lane; j < V; j += 32)
        sum += expf(z[j] - mx);
    sum = gk_warp_sum(sum);
    if (lane == 0)
        row_loss[i] = logf(sum) + mx - z[tg];
    if (!grad)
        return;
    __syncwarp(); /* lane 0 has read z[tg] before any lane rewrites it */
    for (int64_t j = lane; j < V; j += 32) {
        float d = expf(z[j] - mx) / sum * f;
        z[j] = j == tg ? d - f : d;
    }
}

#endif /* GPT_KERNELS_CUH */
