/* mm16.h - bf16 matrix products with fp32 accumulation for the transformer's bf16 training, through
 * oneDNN's matmul where the build found it (ZS_HAVE_DNNL) and the CPU runs it natively; a scalar reference
 * beside it for the tests. */
#ifndef GPT_MM16_H
#define GPT_MM16_H

#include <stdbool.h>
#include <stdint.h>

/* true when gpt_mm16 runs (oneDNN present and a bf16 matmul can be created on this CPU); otherwise the
 * program widens bf16 to fp32 and multiplies with sgemm. why (may be NULL) receives a one-line reason. */
bool gpt_mm16_available(const char **why);

/* Row-major C[M, N] = op(A)[M, K] @ op(B)[K, N] + beta * C, beta 0 or 1. A and B are bf16 bit patterns;
 * op(X) is X (ta/tb false) or X^T, with X stored row-major with leading dimension lda/ldb. Products of
 * two bf16 are exact in fp32 and are summed in fp32. Primitives are cached per (shape, transposes,
 * leading dimensions, beta). Where oneDNN refuses a shape, that product is widened for cblas_sgemm
 * (said once on stderr). */
void gpt_mm16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const uint16_t *A, int64_t lda, const uint16_t *B,
             int64_t ldb, float beta, float *C, int64_t ldc);

/* The obvious loops, same contract, summing in double (the tests' reference). */
void gpt_mm16_ref(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const uint16_t *A, int64_t lda,
                  const uint16_t *B, int64_t ldb, float beta, float *C, int64_t ldc);

/* dst[i] = src[i] rounded to bf16 (nearest, ties to even; NaN stays NaN), 16 lanes at a time (vmath.h),
 * threaded with OpenMP. */
void gpt_f32_to_bf16(uint16_t *dst, const float *src, int64_t n);

/* Frees the cached primitives (at exit; gpt_mm16 recreates what it needs). */
void gpt_mm16_free(void);

#endif /* GPT_MM16_H */
