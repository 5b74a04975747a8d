/* mlp_nocuda.c - linked into the MLP example instead of mlp_cuda.cu when the CUDA backend is not built:
 * --device cuda is refused by name, never run on the CPU instead. */
#include <stdio.h>

#include "mlp_gpu.h"

struct mlp_gpu *mlp_gpu_open(int local_rank, int nlayers, int64_t B, int64_t width, bool cublas, char *err,
                             size_t errlen)
{
    snprintf(err, errlen, "this build has no CUDA backend (ZS_CUDA=OFF, or no CUDA compiler, cuBLAS or NCCL "
                          "at build time)");
    return NULL;
}

void mlp_gpu_close(struct mlp_gpu *g) {}
const char *mlp_gpu_error(const struct mlp_gpu *g) { return ""; }
int mlp_gpu_put_act(struct mlp_gpu *g, int i, const float *host, int64_t n) { return -1; }
int mlp_gpu_get_act(struct mlp_gpu *g, int i, float *host, int64_t n) { return -1; }
int mlp_gpu_forward(struct mlp_gpu *g, int i, const float *w, const float *b, int64_t in, int64_t out, bool relu)
{
    return -1;
}
int mlp_gpu_put_dy(struct mlp_gpu *g, const float *host, int64_t n) { return -1; }
int mlp_gpu_backward(struct mlp_gpu *g, int i, const float *w, float *gw, float *gb, int64_t in, int64_t out,
                     bool relu_below)
{
    return -1;
}
