/* passes_f32.c - the model's passes in float, for training. */
#include "model.h"

#define GPT_REAL float
#define GPT_SUF(x) x##_f32
#define GPT_GEMM cblas_sgemm
#define GPT_SQRT sqrtf
#define GPT_EXP expf
#define GPT_LOG logf
#define GPT_TANH tanhf
#define GPT_FAST 1 /* attention through sgemm, vmath.h kernels */
#define GPT_MM16 1 /* bf16 matrix products (mm16.h) where the io offers bf16 storage */
#include "passes_tmpl.h"
