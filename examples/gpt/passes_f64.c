/* passes_f64.c - the model's passes in double, for the gradient check's finite differences. */
#include "model.h"

#define GPT_REAL double
#define GPT_SUF(x) x##_f64
#define GPT_GEMM cblas_dgemm
#define GPT_SQRT sqrt
#define GPT_EXP exp
#define GPT_LOG log
#define GPT_TANH tanh
#define GPT_FAST 0
#define GPT_MM16 0
#include "passes_tmpl.h"
