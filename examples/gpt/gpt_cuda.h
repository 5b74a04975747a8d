/* gpt_cuda.h - zs-train-gpt's transformer on a CUDA GPU (gpt_cuda.cu), or its refusal where the library was
 * built without the CUDA backend (gpt_nocuda.c). ZeroShard's buffers stay where the engine keeps them (on
 * the host): each fetched unit's parameters go up to the GPU, the layers run there (cuBLAS for the matrix
 * products, fp32 throughout: 16-bit parameters arrive widened), each unit's gradient comes back down and is
 * handed to the engine through the same gpt_io_f32 calls as the CPU passes (passes_tmpl.h).
 *
 * cuBLAS sums in its own blocked order and the GPU's expf, tanhf and logf round differently from the C
 * library's, so a GPU run follows the CPU run to a tolerance (tests/gpt_device.sh), not bit for bit. */
#ifndef GPT_CUDA_H
#define GPT_CUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct gpt_config;
struct gpt_layout;
struct gpt_io_f32;
struct gpt_gpu;

/* The GPU of this node-local rank (round robin: ranks beyond the GPU count share one), with the
 * activations of max_batch sequences. NULL with the reason in err. */
struct gpt_gpu *gpt_gpu_open(int local_rank, const struct gpt_config *cfg, const struct gpt_layout *lay,
                             int64_t max_batch, char *err, size_t errlen);
void gpt_gpu_close(struct gpt_gpu *g);
/* The last CUDA or cuBLAS failure's text ("" if none). */
const char *gpt_gpu_error(const struct gpt_gpu *g);

/* gpt_model_run_f32 on the GPU: the same arguments, units fetched, released and handed over in the same
 * order. Returns 0, the io's code, or -1 with gpt_gpu_error set. */
int gpt_gpu_run(struct gpt_gpu *g, const struct gpt_io_f32 *io, const int32_t *in, const int32_t *targets,
                int64_t B, int train, double grad_scale, double *loss);
/* After a run without targets: its logits [B, ctx, vocab] in host memory (NULL before any). */
const float *gpt_gpu_logits(const struct gpt_gpu *g);

#ifdef __cplusplus
}
#endif

#endif /* GPT_CUDA_H */
