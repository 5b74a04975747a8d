/* convert.h - fp32 <-> bf16 / fp16 conversions written with integer and exact float operations only,
 * so the scalar and vectorized builds of the kernels produce the same bits, subnormals included
 * (hardware converters such as AVX512_BF16 flush subnormal inputs, so they are not used). */
#ifndef ZS_CONVERT_H
#define ZS_CONVERT_H

#include <stdint.h>
#include <string.h>

/* The scalar forms are compiled by gcc and by nvcc (the CUDA kernels share them, and with them their bits). */
#ifdef __CUDACC__
#define ZS_HD static __host__ __device__ __forceinline__
#else
#define ZS_HD static inline __attribute__((always_inline))
#endif

ZS_HD uint32_t zs_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
ZS_HD float zs_float(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

ZS_HD float zs_cvt_bf16_f32(uint16_t h) { return zs_float((uint32_t)h << 16); }

/* Round to nearest even on the upper 16 bits; a NaN keeps its sign and top payload and is made quiet. */
ZS_HD uint16_t zs_cvt_f32_bf16(float f)
{
    uint32_t u = zs_bits(f);
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t nan = (u >> 16) | 0x40u;

    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

/* Exact: every fp16 value is an fp32 value. Subnormals are rebuilt by one exact subtraction. */
ZS_HD float zs_cvt_f16_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t em = (uint32_t)(h & 0x7fffu) << 13;
    uint32_t exp = em & 0x0f800000u;
    uint32_t normal = em + (112u << 23);                 /* rebias 15 -> 127 */
    uint32_t infnan = normal + (112u << 23);             /* exponent 31 -> 255, payload kept */
    uint32_t sub = zs_bits(zs_float(em + (113u << 23)) - 6.103515625e-05f); /* (2^-14 + m 2^-24) - 2^-14 */
    uint32_t r = exp == 0x0f800000u ? infnan : (exp == 0 ? sub : normal);

    return zs_float(r | sign);
}

/* Round to nearest even. Results below 2^-14 come from one float addition that rounds on the fp16
 * subnormal grid; |f| >= 65520 becomes Inf; a NaN stays a quiet NaN with its top payload bits. */
ZS_HD uint16_t zs_cvt_f32_f16(float f)
{
    uint32_t u = zs_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu;
    uint32_t big = a > 0x7f800000u ? 0x7e00u | ((a >> 13) & 0x3ffu) : 0x7c00u;
    uint32_t sub = zs_bits(zs_float(a) + 0.5f) - 0x3f000000u;
    uint32_t nrm = (a + 0xc8000fffu + ((a >> 13) & 1u)) >> 13; /* rebias 127 -> 15, round half to even */
    uint32_t r = a >= 0x47800000u ? big : (a < 0x38800000u ? sub : nrm);

    return (uint16_t)(r | sign);
}

/* Element i of an array of dtype dt (0 fp32, 1 bf16, 2 fp16, as in zeroshard.h) in fp32, exactly; and an fp32
 * value stored there, rounded to nearest even. */
ZS_HD float zs_elem_get(const void *p, int64_t i, int dt)
{
    if (dt == 1)
        return zs_cvt_bf16_f32(((const uint16_t *)p)[i]);
    if (dt == 2)
        return zs_cvt_f16_f32(((const uint16_t *)p)[i]);
    return ((const float *)p)[i];
}

ZS_HD void zs_elem_set(void *p, int64_t i, int dt, float v)
{
    if (dt == 1)
        ((uint16_t *)p)[i] = zs_cvt_f32_bf16(v);
    else if (dt == 2)
        ((uint16_t *)p)[i] = zs_cvt_f32_f16(v);
    else
        ((float *)p)[i] = v;
}

/* Arrays: n elements of dtype dt (ZS_DTYPE_FP32 = 0, BF16 = 1, FP16 = 2 as in zeroshard.h) to and from
 * fp32. To fp32 is exact; from fp32 rounds to nearest even. */
static inline void zs_cvt_to_f32(float *dst, const void *src, int dt, int64_t n)
{
    const uint16_t *h = (const uint16_t *)src;

    if (dt == 0)
        memcpy(dst, src, (size_t)n * sizeof(float));
    else if (dt == 1)
        for (int64_t i = 0; i < n; i++)
            dst[i] = zs_cvt_bf16_f32(h[i]);
    else
        for (int64_t i = 0; i < n; i++)
            dst[i] = zs_cvt_f16_f32(h[i]);
}

static inline void zs_cvt_from_f32(void *dst, int dt, const float *src, int64_t n)
{
    uint16_t *h = (uint16_t *)dst;

    if (dt == 0)
        memcpy(dst, src, (size_t)n * sizeof(float));
    else if (dt == 1)
        for (int64_t i = 0; i < n; i++)
            h[i] = zs_cvt_f32_bf16(src[i]);
    else
        for (int64_t i = 0; i < n; i++)
            h[i] = zs_cvt_f32_f16(src[i]);
}

#endif /* ZS_CONVERT_H */
