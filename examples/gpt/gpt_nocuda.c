/* gpt_nocuda.c - linked into zs-train-gpt instead of gpt_cuda.cu when the CUDA backend is not built:
 * --device cuda is refused by name, never run on the CPU instead. */
#include <stdio.h>

#include "gpt_cuda.h"

struct gpt_gpu *gpt_gpu_open(int local_rank, const struct gpt_config *cfg, const struct gpt_layout *lay,
                             int64_t max_batch, char *err, size_t errlen)
{
    snprintf(err, errlen, "this build has no CUDA backend (ZS_CUDA=OFF, or no CUDA compiler, cuBLAS or NCCL "
                          "at build time)");
    return NULL;
}

void gpt_gpu_close(struct gpt_gpu *g) {}
const char *gpt_gpu_error(const struct gpt_gpu *g) { return ""; }

int gpt_gpu_run(struct gpt_gpu *g, const struct gpt_io_f32 *io, const int32_t *in, const int32_t *targets,
                int64_t B, int train, double grad_scale, double *loss)
{
    return -1;
}

const float *gpt_gpu_logits(const struct gpt_gpu *g) { return NULL; }
