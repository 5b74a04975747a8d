/* mlp_gpu.h - the MLP example's arithmetic on a CUDA GPU (examples/mlp_cuda.cu), or its refusal where the
 * library was built without the CUDA backend (examples/mlp_nocuda.c). Host arrays in, host arrays out:
 * ZeroShard's buffers stay where the engine keeps them, the layers' products run on the GPU.
 *
 * Two ways to multiply. "exact" kernels visit the terms in the CPU loop's order with IEEE arithmetic and no
 * contraction, so a GPU run gives the CPU run's params-hash bit for bit (the oracle). "cublas" uses
 * cublasSgemm in pedantic math mode (no TF32): fast, but its blocked summation order differs from the
 * CPU's, so it is checked against the CPU loss to a tolerance, not by hash. */
#ifndef MLP_GPU_H
#define MLP_GPU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct mlp_gpu;

/* The GPU of this node-local rank (round robin), device arrays for nlayers + 1 activations of B x width
 * and the largest layer. NULL with the reason in err. */
struct mlp_gpu *mlp_gpu_open(int local_rank, int nlayers, int64_t B, int64_t width, bool cublas, char *err,
                             size_t errlen);
void mlp_gpu_close(struct mlp_gpu *g);
/* The last failure's text ("" if none). */
const char *mlp_gpu_error(const struct mlp_gpu *g);

/* Each returns 0, or -1 with mlp_gpu_error set. Activation i is layer i's input (0: the samples). */
int mlp_gpu_put_act(struct mlp_gpu *g, int i, const float *host, int64_t n);
int mlp_gpu_get_act(struct mlp_gpu *g, int i, float *host, int64_t n);
/* act[i+1] = relu?(b + act[i] W^T), W out x in, row-major. */
int mlp_gpu_forward(struct mlp_gpu *g, int i, const float *w, const float *b, int64_t in, int64_t out, bool relu);
/* The gradient of the layer's output, B x CLASSES, for the last layer's backward. */
int mlp_gpu_put_dy(struct mlp_gpu *g, const float *host, int64_t n);
/* gw += dy^T act[i], gb += sum over the batch of dy (host arrays, read and written back), then
 * dy = dy W masked by act[i] > 0 when relu_below. */
int mlp_gpu_backward(struct mlp_gpu *g, int i, const float *w, float *gw, float *gb, int64_t in, int64_t out,
                     bool relu_below);

#ifdef __cplusplus
}
#endif

#endif /* MLP_GPU_H */
