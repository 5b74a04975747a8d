/* mlp_cuda.cu - the MLP example's layers on a CUDA GPU (see mlp_gpu.h). Built with the library's IEEE flags
 * (--fmad=false, IEEE division and square root, no flush to zero): the "exact" kernels then compute every
 * element with the same operations in the same order as train_mlp.c's CPU loops, so the bits agree. */
#include <stdio.h>
#include <string.h>

#include <new>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "mlp_gpu.h"

struct mlp_gpu {
    cudaStream_t s;
    cublasHandle_t blas; /* NULL: the exact kernels */
    int nlayers;
    int64_t B, width;
    float **act;         /* nlayers + 1 device arrays of B x width */
    float *dy, *dx;      /* B x width */
    float *w, *gw;       /* width x width */
    float *b, *gb;       /* width */
    char err[256];
};

static int fail(struct mlp_gpu *g, const char *what, cudaError_t e)
{
    snprintf(g->err, sizeof(g->err), "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
    return -1;
}

static int blas_fail(struct mlp_gpu *g, const char *what, cublasStatus_t e)
{
    snprintf(g->err, sizeof(g->err), "%s: cuBLAS status %d", what, (int)e);
    return -1;
}

/* A launch's own error, then (the example is synchronous) the stream's. */
static int settle(struct mlp_gpu *g, const char *what)
{
    cudaError_t e = cudaGetLastError();

    if (e == cudaSuccess)
        e = cudaStreamSynchronize(g->s);
    return e == cudaSuccess ? 0 : fail(g, what, e);
}

static int copy(struct mlp_gpu *g, void *dst, const void *src, int64_t n, cudaMemcpyKind k, const char *what)
{
    cudaError_t e = cudaMemcpyAsync(dst, src, (size_t)n * sizeof(float), k, g->s);

    if (e != cudaSuccess)
        return fail(g, what, e);
    e = cudaStreamSynchronize(g->s);
    return e == cudaSuccess ? 0 : fail(g, what, e);
}

static unsigned blocks(int64_t n) { return (unsigned)((n + 127) / 128); }

/* ---------------------------------------------------------------- the CPU loops' order, one thread per output */

/* y[k][r] = b[r] + w[r][0] x[k][0] + w[r][1] x[k][1] + ..., then the ReLU */
__global__ void k_forward(const float *w, const float *b, const float *x, float *y, int64_t B, int64_t in,
                          int64_t out, bool relu)
{
    int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;

    if (t >= B * out)
        return;
    int64_t k = t / out, r = t % out;
    float s = b[r];
    for (int64_t c = 0; c < in; c++)
        s += w[r * in + c] * x[k * in + c];
    y[t] = (relu && s < 0.0f) ? 0.0f : s;
}

/* gw[r][c] += dy[0][r] x[0][c], then dy[1][r] x[1][c], ...: the CPU adds each sample in turn */
__global__ void k_grad_w(const float *dy, const float *x, float *gw, int64_t B, int64_t in, int64_t out)
{
    int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;

    if (t >= out * in)
        return;
    int64_t r = t / in, c = t % in;
    float s = gw[t];
    for (int64_t k = 0; k < B; k++)
        s += dy[k * out + r] * x[k * in + c];
    gw[t] = s;
}

__global__ void k_grad_b(const float *dy, float *gb, int64_t B, int64_t out)
{
    int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;

    if (r >= out)
        return;
    float s = gb[r];
    for (int64_t k = 0; k < B; k++)
        s += dy[k * out + r];
    gb[r] = s;
}

/* dx[k][c] = sum over r of w[r][c] dy[k][r], from 0.0f, zeroed where the layer below's ReLU was off */
__global__ void k_grad_x(const float *w, const float *dy, const float *x, float *dx, int64_t B, int64_t in,
                         int64_t out, bool relu_below)
{
    int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;

    if (t >= B * in)
        return;
    int64_t k = t / in, c = t % in;
    float s = 0.0f;
    for (int64_t r = 0; r < out; r++)
        s += w[r * in + c] * dy[k * out + r];
    dx[t] = (relu_below && x[t] <= 0.0f) ? 0.0f : s;
}

/* ---------------------------------------------------------------- cuBLAS: the products, then the elementwise rest */

__global__ void k_bias_relu(const float *b, float *y, int64_t B, int64_t out, bool relu)
{
    int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;

    if (t >= B * out)
        return;
    float s = y[t] + b[t % out];
    y[t] = (relu && s < 0.0f) ? 0.0f : s;
}

__global__ void k_relu_mask(const float *x, float *dx, int64_t n)
{
    int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;

    if (t < n && x[t] <= 0.0f)
        dx[t] = 0.0f;
}

/* Row-major A (m x k) is column-major A^T, so each product below is written for the transposes. */
static int blas_forward(struct mlp_gpu *g, const float *x, float *y, int64_t in, int64_t out)
{
    const float one = 1.0f, zero = 0.0f;
    /* y^T (out x B) = W (out x in) x^T (in x B); W is stored as W^T column-major */
    cublasStatus_t e = cublasSgemm(g->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)out, (int)g->B, (int)in, &one, g->w,
                                   (int)in, x, (int)in, &zero, y, (int)out);

    return e == CUBLAS_STATUS_SUCCESS ? 0 : blas_fail(g, "cublasSgemm (forward)", e);
}

static int blas_backward(struct mlp_gpu *g, const float *x, int64_t in, int64_t out)
{
    const float one = 1.0f, zero = 0.0f;
    /* gw^T (in x out) += x^T (in x B) dy (B x out) */
    cublasStatus_t e = cublasSgemm(g->blas, CUBLAS_OP_N, CUBLAS_OP_T, (int)in, (int)out, (int)g->B, &one, x,
                                   (int)in, g->dy, (int)out, &one, g->gw, (int)in);

    if (e != CUBLAS_STATUS_SUCCESS)
        return blas_fail(g, "cublasSgemm (weight gradient)", e);
    /* dx^T (in x B) = W^T (in x out) dy^T (out x B) */
    e = cublasSgemm(g->blas, CUBLAS_OP_N, CUBLAS_OP_N, (int)in, (int)g->B, (int)out, &one, g->w, (int)in, g->dy,
                    (int)out, &zero, g->dx, (int)in);
    return e == CUBLAS_STATUS_SUCCESS ? 0 : blas_fail(g, "cublasSgemm (input gradient)", e);
}

/* ---------------------------------------------------------------- the interface */

extern "C" const char *mlp_gpu_error(const struct mlp_gpu *g) { return g ? g->err : ""; }

extern "C" void mlp_gpu_close(struct mlp_gpu *g)
{
    if (!g)
        return;
    if (g->act)
        for (int i = 0; i <= g->nlayers; i++)
            cudaFree(g->act[i]);
    delete[] g->act;
    cudaFree(g->dy);
    cudaFree(g->dx);
    cudaFree(g->w);
    cudaFree(g->gw);
    cudaFree(g->b);
    cudaFree(g->gb);
    if (g->blas)
        cublasDestroy(g->blas);
    if (g->s)
        cudaStreamDestroy(g->s);
    delete g;
}

static cudaError_t alloc(float **p, int64_t n) { return cudaMalloc((void **)p, (size_t)n * sizeof(float)); }

static int open_arrays(struct mlp_gpu *g)
{
    int64_t a = g->B * g->width, ww = g->width * g->width;
    cudaError_t e = cudaSuccess;

    g->act = new (std::nothrow) float *[g->nlayers + 1]();
    if (!g->act)
        return fail(g, "activations", cudaErrorMemoryAllocation);
    for (int i = 0; i <= g->nlayers && e == cudaSuccess; i++)
        e = alloc(&g->act[i], a);
    if (e == cudaSuccess)
        e = alloc(&g->dy, a);
    if (e == cudaSuccess)
        e = alloc(&g->dx, a);
    if (e == cudaSuccess)
        e = alloc(&g->w, ww);
    if (e == cudaSuccess)
        e = alloc(&g->gw, ww);
    if (e == cudaSuccess)
        e = alloc(&g->b, g->width);
    if (e == cudaSuccess)
        e = alloc(&g->gb, g->width);
    return e == cudaSuccess ? 0 : fail(g, "cudaMalloc", e);
}

extern "C" struct mlp_gpu *mlp_gpu_open(int local_rank, int nlayers, int64_t B, int64_t width, bool cublas,
                                        char *err, size_t errlen)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    struct mlp_gpu *g;

    if (e != cudaSuccess || n <= 0) {
        snprintf(err, errlen, "no CUDA device visible (cudaGetDeviceCount: %s)",
                 e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        return NULL;
    }
    g = new (std::nothrow) mlp_gpu();
    if (!g) {
        snprintf(err, errlen, "out of host memory");
        return NULL;
    }
    g->nlayers = nlayers;
    g->B = B;
    g->width = width;
    /* ranks beyond the GPU count share one: the CUDA runtime allows it, and the example needs no NCCL */
    e = cudaSetDevice(local_rank % n);
    if (e != cudaSuccess)
        fail(g, "cudaSetDevice", e);
    else if ((e = cudaStreamCreateWithFlags(&g->s, cudaStreamNonBlocking)) != cudaSuccess)
        fail(g, "cudaStreamCreateWithFlags", e);
    else if (!open_arrays(g) && cublas) {
        cublasStatus_t be = cublasCreate(&g->blas);
        if (be != CUBLAS_STATUS_SUCCESS)
            blas_fail(g, "cublasCreate", be);
        /* pedantic: no TF32, no reduced-precision reductions, whatever the environment asks for */
        else if ((be = cublasSetMathMode(g->blas, CUBLAS_PEDANTIC_MATH)) != CUBLAS_STATUS_SUCCESS ||
                 (be = cublasSetStream(g->blas, g->s)) != CUBLAS_STATUS_SUCCESS)
            blas_fail(g, "cublasSetMathMode/SetStream", be);
    }
    if (g->err[0]) {
        snprintf(err, errlen, "%s", g->err);
        mlp_gpu_close(g);
        return NULL;
    }
    return g;
}

extern "C" int mlp_gpu_put_act(struct mlp_gpu *g, int i, const float *host, int64_t n)
{
    return copy(g, g->act[i], host, n, cudaMemcpyHostToDevice, "activations to the GPU");
}

extern "C" int mlp_gpu_get_act(struct mlp_gpu *g, int i, float *host, int64_t n)
{
    return copy(g, host, g->act[i], n, cudaMemcpyDeviceToHost, "activations from the GPU");
}

extern "C" int mlp_gpu_put_dy(struct mlp_gpu *g, const float *host, int64_t n)
{
    return copy(g, g->dy, host, n, cudaMemcpyHostToDevice, "output gradient to the GPU");
}

extern "C" int mlp_gpu_forward(struct mlp_gpu *g, int i, const float *w, const float *b, int64_t in, int64_t out,
                               bool relu)
{
    if (copy(g, g->w, w, in * out, cudaMemcpyHostToDevice, "weights to the GPU") ||
        copy(g, g->b, b, out, cudaMemcpyHostToDevice, "biases to the GPU"))
        return -1;
    if (!g->blas) {
        k_forward<<<blocks(g->B * out), 128, 0, g->s>>>(g->w, g->b, g->act[i], g->act[i + 1], g->B, in, out, relu);
        return settle(g, "forward kernel");
    }
    if (blas_forward(g, g->act[i], g->act[i + 1], in, out))
        return -1;
    k_bias_relu<<<blocks(g->B * out), 128, 0, g->s>>>(g->b, g->act[i + 1], g->B, out, relu);
    return settle(g, "bias kernel");
}

extern "C" int mlp_gpu_backward(struct mlp_gpu *g, int i, const float *w, float *gw, float *gb, int64_t in,
                                int64_t out, bool relu_below)
{
    const float *x = g->act[i];
    float *t;

    if (copy(g, g->w, w, in * out, cudaMemcpyHostToDevice, "weights to the GPU") ||
        copy(g, g->gw, gw, in * out, cudaMemcpyHostToDevice, "weight gradient to the GPU") ||
        copy(g, g->gb, gb, out, cudaMemcpyHostToDevice, "bias gradient to the GPU"))
        return -1;
    k_grad_b<<<blocks(out), 128, 0, g->s>>>(g->dy, g->gb, g->B, out);
    if (!g->blas) {
        k_grad_w<<<blocks(out * in), 128, 0, g->s>>>(g->dy, x, g->gw, g->B, in, out);
        k_grad_x<<<blocks(g->B * in), 128, 0, g->s>>>(g->w, g->dy, x, g->dx, g->B, in, out, relu_below);
    } else {
        if (blas_backward(g, x, in, out))
            return -1;
        if (relu_below)
            k_relu_mask<<<blocks(g->B * in), 128, 0, g->s>>>(x, g->dx, g->B * in);
    }
    if (settle(g, "backward kernels") ||
        copy(g, gw, g->gw, in * out, cudaMemcpyDeviceToHost, "weight gradient from the GPU") ||
        copy(g, gb, g->gb, out, cudaMemcpyDeviceToHost, "bias gradient from the GPU"))
        return -1;
    t = g->dy; /* the input gradient is the next layer down's output gradient */
    g->dy = g->dx;
    g->dx = t;
    return 0;
}
