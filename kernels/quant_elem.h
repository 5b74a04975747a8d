/* quant_elem.h - the per-element steps of kernels/quant.h's quantization, written once for the reference and
 * the fast path so both reach the same bits by the same float operations. Internal. */
#ifndef ZS_QUANT_ELEM_H
#define ZS_QUANT_ELEM_H

#include <stdint.h>

#include "convert.h" /* defines: zs_bits, zs_float, ZS_HD */

/* |x| as its bit pattern: non-negative floats order as their bits, and a NaN (any payload) outranks Inf. */
ZS_HD uint32_t zs_quant_absbits(float x)
{
    return zs_bits(x) & 0x7fffffffu;
}

/* A block's scale from the largest |x| bit pattern: max / 127 (NaN and Inf stay non-finite, 0 stays 0). */
ZS_HD float zs_quant_scale(uint32_t maxbits)
{
    return zs_float(maxbits) / 127.0f;
}

/* 1.5 * 2^23: adding and subtracting it rounds a float below 2^22 in magnitude to an integer, to nearest even
 * (the current rounding mode, which ZeroShard never changes), with plain adds that vectorize everywhere. */
#define ZS_QUANT_RNE 12582912.0f

/* One element's q. A zero or non-finite scale gives 0 (the scale alone carries the block's state). */
ZS_HD int8_t zs_quant_one(float x, float scale, int ok)
{
    float v = ok ? x / scale : 0.0f;

    v = v > 127.0f ? 127.0f : v;
    v = v < -127.0f ? -127.0f : v;
    v = v == v ? v : 0.0f; /* never NaN with ok, but keeps the conversion defined */
    return (int8_t)(int32_t)((v + ZS_QUANT_RNE) - ZS_QUANT_RNE);
}

/* Whether q = x / scale is defined: a finite, non-zero scale. */
ZS_HD int zs_quant_scale_ok(float scale)
{
    uint32_t a = zs_bits(scale) & 0x7fffffffu;

    return a != 0 && a < 0x7f800000u;
}

#endif /* ZS_QUANT_ELEM_H */
