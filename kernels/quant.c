/* quant.c - the scalar reference of kernels/quant.h's block quantization (one element at a time, through
 * convert.h's zs_elem_get / zs_elem_set), and the public entry points, which take the fast path. */
#include <stdint.h>

#include "convert.h"    /* defines: zs_elem_get, zs_elem_set */
#include "quant.h"
#include "quant_elem.h" /* defines: zs_quant_absbits, zs_quant_scale, zs_quant_one */

/* quant_fast.c */
void zs_quantize_fast(const void *x, int dt, int64_t n, int64_t block, int8_t *q, float *scale);
void zs_dequantize_fast(const int8_t *q, const float *scale, int64_t n, int64_t block, void *y, int dt);
void zs_dequantize_add_fast(const int8_t *q, const float *scale, int64_t n, int64_t block, float *acc);

void zs_quantize_ref(const void *x, int dt, int64_t n, int64_t block, int8_t *q, float *scale)
{
    for (int64_t b0 = 0; b0 < n; b0 += block) {
        int64_t end = n - b0 < block ? n : b0 + block;
        uint32_t m = 0;

        for (int64_t i = b0; i < end; i++) {
            uint32_t a = zs_quant_absbits(zs_elem_get(x, i, dt));
            if (a > m)
                m = a;
        }
        float s = zs_quant_scale(m);
        scale[b0 / block] = s;
        for (int64_t i = b0; i < end; i++)
            q[i] = zs_quant_one(zs_elem_get(x, i, dt), s, zs_quant_scale_ok(s));
    }
}

void zs_dequantize_ref(const int8_t *q, const float *scale, int64_t n, int64_t block, void *y, int dt)
{
    for (int64_t i = 0; i < n; i++)
        zs_elem_set(y, i, dt, (float)q[i] * scale[i / block]);
}

void zs_dequantize_add_ref(const int8_t *q, const float *scale, int64_t n, int64_t block, float *acc)
{
    for (int64_t i = 0; i < n; i++)
        acc[i] += (float)q[i] * scale[i / block];
}

void zs_quantize(const void *x, int dt, int64_t n, int64_t block, int8_t *q, float *scale)
{
    zs_quantize_fast(x, dt, n, block, q, scale);
}

void zs_dequantize(const int8_t *q, const float *scale, int64_t n, int64_t block, void *y, int dt)
{
    zs_dequantize_fast(q, scale, n, block, y, dt);
}

void zs_dequantize_add(const int8_t *q, const float *scale, int64_t n, int64_t block, float *acc)
{
    zs_dequantize_add_fast(q, scale, n, block, acc);
}
