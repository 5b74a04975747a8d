/* quant.h - block-wise symmetric int8 quantization of fp32 / bf16 / fp16 arrays (ZeRO++'s qwZ and qgZ), for
 * the collectives that cross the node boundary as int8 blocks and one fp32 scale per block.
 *
 * Blocks of `block` consecutive elements (the last may be short). A block's scale is max|x| / 127 in fp32
 * (0 for an all-zero block); q = x / scale rounded to nearest even and clamped to [-127, 127]; the value
 * back is x' = q * scale in fp32, stored as the output dtype with kernels/convert.h's rounding.
 * The bound, per element, for a block whose scale is a normal float (max|x| >= 2^-119):
 *     |x - x'| <= scale * (1/2 + 2^-16)  (+ half an ulp of the output dtype at x' for bf16 / fp16 output);
 * the 2^-16 covers the rounding of the scale, of x / scale and of q * scale. A smaller max gives a subnormal
 * scale and only |x - x'| <= 2 max|x|.
 * Non-finite input: a block holding an Inf or a NaN gets a non-finite scale (max|x| is taken on the bit
 * patterns, so a NaN outranks an Inf), every q of that block is 0, and dequantizing gives NaN (0 * Inf,
 * 0 * NaN) for the whole block: a gradient overflow still reaches fp16's overflow check as non-finite.
 * The fast path (quant_fast.c, vectorized) and the scalar reference (quant.c) give the same bits. */
#ifndef ZS_QUANT_H
#define ZS_QUANT_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ZS_QUANT_BLOCK_DEFAULT 256

/* Blocks (scales) for n elements. */
static inline int64_t zs_quant_blocks(int64_t n, int64_t block)
{
    return (n + block - 1) / block;
}

/* x: n elements of dtype dt (0 fp32, 1 bf16, 2 fp16 as in zeroshard.h) -> q[n], scale[zs_quant_blocks(n, block)].
 * block >= 1. */
void zs_quantize(const void *x, int dt, int64_t n, int64_t block, int8_t *q, float *scale);
/* q, scale -> y: n elements of dtype dt. */
void zs_dequantize(const int8_t *q, const float *scale, int64_t n, int64_t block, void *y, int dt);
/* acc[i] += q[i] * scale (fp32, one rounding each): the quantized reduce-scatter's sum. */
void zs_dequantize_add(const int8_t *q, const float *scale, int64_t n, int64_t block, float *acc);

/* The scalar references (the definition of the bits the fast paths must give). */
void zs_quantize_ref(const void *x, int dt, int64_t n, int64_t block, int8_t *q, float *scale);
void zs_dequantize_ref(const int8_t *q, const float *scale, int64_t n, int64_t block, void *y, int dt);
void zs_dequantize_add_ref(const int8_t *q, const float *scale, int64_t n, int64_t block, float *acc);

#ifdef __cplusplus
}
#endif

#endif /* ZS_QUANT_H */
