/* quant_fast.c - kernels/quant.h's block quantization as loops GCC vectorizes (compiled -O3): per block, the
 * input widened to fp32 in a stack tile, an integer max over the bit patterns, then one quantizing pass;
 * the same float operations as the reference in quant.c (quant_elem.h), so the same bits. Each entry point is
 * cloned for AVX2 (chosen at load time where the CPU has it; the unsigned max needs SSE4.1 to vectorize) and the
 * baseline; no fused multiply-add either way (-ffp-contract=off). */
#include <stdint.h>

#include "convert.h"    /* defines: zs_cvt_bf16_f32, zs_cvt_f16_f32, zs_cvt_f32_bf16, zs_cvt_f32_f16 */
#include "quant.h"
#include "quant_elem.h" /* defines: zs_quant_absbits, zs_quant_scale, zs_quant_one */

void zs_quantize_fast(const void *x, int dt, int64_t n, int64_t block, int8_t *q, float *scale);
void zs_dequantize_fast(const int8_t *q, const float *scale, int64_t n, int64_t block, void *y, int dt);
void zs_dequantize_add_fast(const int8_t *q, const float *scale, int64_t n, int64_t block, float *acc);

#if !defined(ZS_QUANT_CLONES) && defined(__clang__) && __clang_major__ < 16
#define ZS_QUANT_CLONES /* clang 14/15 emit no resolver for a clone set defined but not called in its own file */
#endif
#ifndef ZS_QUANT_CLONES /* -DZS_QUANT_CLONES= builds the baseline alone (how its bits were checked) */
#define ZS_QUANT_CLONES __attribute__((target_clones("avx2", "default")))
#endif
#define TILE 1024 /* elements widened at a time: a block longer than this is walked in tiles twice */

static void widen(float *t, const void *x, int dt, int64_t off, int64_t len)
{
    const uint16_t *h = (const uint16_t *)x + off;
    const float *f = (const float *)x + off;

    if (dt == 1)
        for (int64_t i = 0; i < len; i++)
            t[i] = zs_cvt_bf16_f32(h[i]);
    else if (dt == 2)
        for (int64_t i = 0; i < len; i++)
            t[i] = zs_cvt_f16_f32(h[i]);
    else
        for (int64_t i = 0; i < len; i++)
            t[i] = f[i];
}

static uint32_t tile_max(const float *t, int64_t len, uint32_t m)
{
    for (int64_t i = 0; i < len; i++) {
        uint32_t a = zs_quant_absbits(t[i]);
        m = a > m ? a : m;
    }
    return m;
}

static void tile_quant(int8_t *q, const float *t, int64_t len, float s, int ok)
{
    for (int64_t i = 0; i < len; i++)
        q[i] = zs_quant_one(t[i], s, ok);
}

ZS_QUANT_CLONES void zs_quantize_fast(const void *x, int dt, int64_t n, int64_t block, int8_t *q, float *scale)
{
    float t[TILE];

    for (int64_t b0 = 0; b0 < n; b0 += block) {
        int64_t end = n - b0 < block ? n : b0 + block;
        uint32_t m = 0;

        for (int64_t o = b0; o < end; o += TILE) {
            int64_t len = end - o < TILE ? end - o : TILE;
            widen(t, x, dt, o, len);
            m = tile_max(t, len, m);
        }
        float s = zs_quant_scale(m);
        int ok = zs_quant_scale_ok(s);
        scale[b0 / block] = s;
        for (int64_t o = b0; o < end; o += TILE) {
            int64_t len = end - o < TILE ? end - o : TILE;
            if (end - b0 > TILE || o != b0) /* a block within one tile is still in t */
                widen(t, x, dt, o, len);
            tile_quant(q + o, t, len, s, ok);
        }
    }
}

ZS_QUANT_CLONES void zs_dequantize_fast(const int8_t *q, const float *scale, int64_t n, int64_t block, void *y, int dt)
{
    uint16_t *h = (uint16_t *)y;
    float *f = (float *)y;

    for (int64_t b0 = 0; b0 < n; b0 += block) {
        int64_t end = n - b0 < block ? n : b0 + block;
        float s = scale[b0 / block];

        if (dt == 1)
            for (int64_t i = b0; i < end; i++)
                h[i] = zs_cvt_f32_bf16((float)q[i] * s);
        else if (dt == 2)
            for (int64_t i = b0; i < end; i++)
                h[i] = zs_cvt_f32_f16((float)q[i] * s);
        else
            for (int64_t i = b0; i < end; i++)
                f[i] = (float)q[i] * s;
    }
}

ZS_QUANT_CLONES void zs_dequantize_add_fast(const int8_t *q, const float *scale, int64_t n, int64_t block, float *acc)
{
    for (int64_t b0 = 0; b0 < n; b0 += block) {
        int64_t end = n - b0 < block ? n : b0 + block;
        float s = scale[b0 / block];

        for (int64_t i = b0; i < end; i++)
            acc[i] += (float)q[i] * s;
    }
}
