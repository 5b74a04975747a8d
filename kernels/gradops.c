/* gradops.c - the CPU forms of gradops.h: what grads.c and step.c always did, in 256-element blocks
 * through fp32 for the 16-bit dtypes. */
#include "convert.h" /* defines: zs_cvt_to_f32, zs_cvt_from_f32 */
#include "gradops.h"
#include "optim.h"   /* defines: zs_sumsq_ref */

#define BLK 256

static void *at16(const void *base, int64_t i) { return (char *)(uintptr_t)base + (size_t)i * 2; }

void zs_grad_accumulate(void *dst, const void *src, zs_dtype dt, int64_t n)
{
    float a[BLK], b[BLK];

    if (dt == ZS_DTYPE_FP32) {
        float *d = dst;
        const float *s = src;
        for (int64_t i = 0; i < n; i++)
            d[i] += s[i];
        return;
    }
    for (int64_t i0 = 0; i0 < n; i0 += BLK) {
        int64_t k = n - i0 < BLK ? n - i0 : BLK;
        zs_cvt_to_f32(a, at16(dst, i0), (int)dt, k);
        zs_cvt_to_f32(b, at16(src, i0), (int)dt, k);
        for (int64_t i = 0; i < k; i++)
            a[i] += b[i];
        zs_cvt_from_f32(at16(dst, i0), (int)dt, a, k);
    }
}

void zs_grad_scale(void *x, zs_dtype dt, int64_t n, float f)
{
    float b[BLK];

    for (int64_t i0 = 0; i0 < n; i0 += BLK) {
        int64_t k = n - i0 < BLK ? n - i0 : BLK;
        void *p = (char *)x + (size_t)i0 * (dt == ZS_DTYPE_FP32 ? 4 : 2);
        zs_cvt_to_f32(b, p, (int)dt, k);
        for (int64_t i = 0; i < k; i++)
            b[i] *= f;
        zs_cvt_from_f32(p, (int)dt, b, k);
    }
}

double zs_grad_sumsq(const void *x, zs_dtype dt, int64_t n)
{
    float b[BLK];
    double s = 0.0;

    if (dt == ZS_DTYPE_FP32)
        return zs_sumsq_ref(x, n);
    for (int64_t i0 = 0; i0 < n; i0 += BLK) {
        int64_t k = n - i0 < BLK ? n - i0 : BLK;
        zs_cvt_to_f32(b, at16(x, i0), (int)dt, k);
        for (int64_t i = 0; i < k; i++)
            s += (double)b[i] * (double)b[i];
    }
    return s;
}

void zs_grad_convert(void *dst, zs_dtype dt, const float *src, int64_t n)
{
    zs_cvt_from_f32(dst, (int)dt, src, n);
}
