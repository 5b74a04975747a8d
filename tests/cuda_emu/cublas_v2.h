/* cublas_v2.h (tests/cuda_emu) - the cuBLAS calls of examples/gpt/gpt_cuda.cu as plain loops, written from
 * cuBLAS's documented column-major definition (C = alpha op(A) op(B) + beta C, op(A) m x k, element (i, l)
 * of A at A[i + l lda], of A^T at A[l + i lda]), so the emulated run also checks gpt_cuda.cu's mapping of
 * its row-major products onto them. Sums in double: the reference is as exact as it can cheaply be. A call is
 * queued on the handle's stream (cublasSetStream) like a kernel, the scalars read at the call. */
#ifndef ZS_CUDA_EMU_CUBLAS_H
#define ZS_CUDA_EMU_CUBLAS_H

#include "cuda_runtime.h"

enum cublasStatus_t { CUBLAS_STATUS_SUCCESS = 0, CUBLAS_STATUS_INVALID_VALUE = 7 };
enum cublasOperation_t { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 };
enum cublasMath_t { CUBLAS_DEFAULT_MATH = 0, CUBLAS_PEDANTIC_MATH = 2 };
struct emu_blas {
    cudaStream_t stream;
};
typedef struct emu_blas *cublasHandle_t;

static inline cublasStatus_t cublasCreate(cublasHandle_t *h)
{
    *h = (cublasHandle_t)calloc(1, sizeof(emu_blas));
    return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasDestroy(cublasHandle_t h)
{
    free(h);
    return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasSetMathMode(cublasHandle_t, cublasMath_t) { return CUBLAS_STATUS_SUCCESS; }
static inline cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s)
{
    h->stream = s;
    return CUBLAS_STATUS_SUCCESS;
}

static inline float emu_at(const float *X, cublasOperation_t op, int i, int l, int ld)
{
    return op == CUBLAS_OP_N ? X[i + (size_t)l * ld] : X[l + (size_t)i * ld];
}

static inline cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb,
                                                       int m, int n, int k, const float *alpha, const float *A,
                                                       int lda, long long sa, const float *B, int ldb, long long sb,
                                                       const float *beta, float *C, int ldc, long long sc, int batch)
{
    /* the leading dimensions cuBLAS requires: at least the stored matrix's row count */
    if (m < 0 || n < 0 || k < 0 || batch < 0 || ldc < m || lda < (ta == CUBLAS_OP_N ? m : k) ||
        ldb < (tb == CUBLAS_OP_N ? k : n) || lda < 1 || ldb < 1 || ldc < 1)
        return CUBLAS_STATUS_INVALID_VALUE;
    float al = *alpha, be = *beta;
    emu_enqueue(h->stream, [=]() {
    for (int b = 0; b < batch; b++)
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) {
                double s = 0;
                for (int l = 0; l < k; l++)
                    s += (double)emu_at(A + b * sa, ta, i, l, lda) * emu_at(B + b * sb, tb, l, j, ldb);
                float *c = C + b * sc + i + (size_t)j * ldc;
                *c = (float)(al * s + (be == 0.0f ? 0.0 : (double)be * *c)); /* beta 0: C not read */
            }
    });
    return CUBLAS_STATUS_SUCCESS;
}

static inline cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                         int k, const float *alpha, const float *A, int lda, const float *B, int ldb,
                                         const float *beta, float *C, int ldc)
{
    return cublasSgemmStridedBatched(h, ta, tb, m, n, k, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc, 0, 1);
}

#endif /* ZS_CUDA_EMU_CUBLAS_H */
