/* test_quant.c - kernels/quant.h: the fast path against the scalar reference bit for bit (quantize, dequantize
 * to each dtype, dequantize-add) over lengths around the block size, three input dtypes and value kinds
 * (random, zeros, huge, tiny, non-finite); the error bound the header states; non-finite blocks give NaN. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "kernels/convert.h"
#include "kernels/quant.h"

enum kind { K_RANDOM, K_ZEROS, K_HUGE, K_TINY, K_NONFINITE, K_KINDS };
static const char *kind_name[] = {"random", "zeros", "huge", "tiny", "non-finite"};
static const char *dt_name[] = {"fp32", "bf16", "fp16"};

static uint64_t rng = 88172645463325252ull;
static double uniform(void) /* xorshift64, [-1, 1) */
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) / 4503599627370496.0 - 1.0;
}

static float value(enum kind k, int dt, int64_t i, int64_t n)
{
    float big = dt == 2 ? 65504.0f : dt == 1 ? 3.0e38f : 3.4e38f;
    switch (k) {
    case K_ZEROS:
        return i % 3 == 0 ? -0.0f : 0.0f;
    case K_HUGE:
        return (float)(uniform() * big);
    case K_TINY: /* subnormals of the dtype and just above */
        return (float)(uniform() * (dt == 2 ? 1.2e-7 : 2e-38));
    case K_NONFINITE:
        if (i == n / 2)
            return i % 2 ? -INFINITY : INFINITY;
        if (i == n - 1)
            return NAN;
        return (float)(uniform() * 3.0);
    default:
        return (float)(uniform() * exp2(8.0 * uniform())); /* a spread of magnitudes within a block */
    }
}

static size_t esz(int dt) { return dt == 0 ? 4 : 2; }

/* Half an ulp of dtype dt at v (0 for fp32: the bound's fp32 part is in the scale term). */
static double half_ulp(int dt, double v)
{
    if (dt == 0 || v == 0)
        return dt == 2 ? ldexp(1, -25) : 0;
    int e;
    frexp(v, &e);
    int mant = dt == 1 ? 8 : 11;
    if (dt == 2 && e < -13)
        e = -13; /* fp16 subnormals: fixed spacing 2^-24 */
    return ldexp(1, e - mant - 1);
}

static int one_case(int64_t n, int64_t block, int dt, enum kind k)
{
    int64_t nb = zs_quant_blocks(n, block), bad = 0;
    void *x = malloc((size_t)n * esz(dt) + 1);
    int8_t *q1 = malloc((size_t)n + 1), *q2 = malloc((size_t)n + 1);
    float *s1 = malloc((size_t)nb * 4 + 4), *s2 = malloc((size_t)nb * 4 + 4);
    float *a1 = malloc((size_t)n * 4 + 4), *a2 = malloc((size_t)n * 4 + 4);
    char *y1 = malloc((size_t)n * 4 + 4), *y2 = malloc((size_t)n * 4 + 4);
    char what[160];

    snprintf(what, sizeof(what), "n %lld block %lld %s %s", (long long)n, (long long)block, dt_name[dt], kind_name[k]);
    for (int64_t i = 0; i < n; i++)
        zs_elem_set(x, i, dt, value(k, dt, i, n));
    memset(q1, 0x55, (size_t)n + 1);
    memset(q2, 0x33, (size_t)n + 1);
    zs_quantize_ref(x, dt, n, block, q1, s1);
    zs_quantize(x, dt, n, block, q2, s2);
    CHECK(memcmp(q1, q2, (size_t)n) == 0 && memcmp(s1, s2, (size_t)nb * 4) == 0, "%s: quantize differs", what);
    for (int odt = 0; odt < 3; odt++) {
        zs_dequantize_ref(q1, s1, n, block, y1, odt);
        zs_dequantize(q1, s1, n, block, y2, odt);
        CHECK(memcmp(y1, y2, (size_t)n * esz(odt)) == 0, "%s: dequantize to %s differs", what, dt_name[odt]);
        for (int64_t i = 0; i < n; i++) { /* the bound, or NaN across a non-finite block */
            float s = s1[i / block];
            double xi = zs_elem_get(x, i, dt), yi = zs_elem_get(y1, i, odt);
            float xr;
            bool ok;
            zs_elem_set(&xr, 0, 0, (float)xi);
            if (odt != 0) { /* a value within a scale of the output dtype's range may round to Inf there: outside the
                             * bound's scope */
                _Alignas(float) char h[4];
                zs_elem_set(h, 0, odt, (float)(fabs(xi) + (double)s));
                xr = zs_elem_get(h, 0, odt);
            }
            if (isfinite(s) && !isfinite(xr))
                continue;
            if (!isfinite(s))
                ok = isnan(yi);
            else if (s >= ldexp(1, -126))
                ok = fabs(xi - yi) <= (double)s * (0.5 + ldexp(1, -16)) + half_ulp(odt, yi);
            else
                ok = fabs(xi - yi) <= 2 * fabs((double)s * 127) + half_ulp(odt, yi);
            if (!ok && bad++ < 3)
                fprintf(stderr, "%s -> %s: element %lld: %.9g came back %.9g (scale %.9g)\n", what, dt_name[odt],
                        (long long)i, xi, yi, (double)s);
            if (!isfinite(yi) && isfinite(s))
                bad++;
        }
    }
    for (int64_t i = 0; i < n; i++)
        a1[i] = a2[i] = (float)uniform();
    zs_dequantize_add_ref(q1, s1, n, block, a1);
    zs_dequantize_add(q1, s1, n, block, a2);
    CHECK(memcmp(a1, a2, (size_t)n * 4) == 0, "%s: dequantize-add differs", what);
    CHECK(bad == 0, "%s: %lld elements outside the bound", what, (long long)bad);
    if (k == K_NONFINITE && n / 2 < n - 1) {
        CHECK(!isfinite(s1[(n / 2) / block]) && isnan(s1[(n - 1) / block]), "%s: non-finite scales %g %g", what,
              (double)s1[(n / 2) / block], (double)s1[(n - 1) / block]);
    }
    if (k == K_ZEROS)
        for (int64_t b = 0; b < nb; b++)
            CHECK(s1[b] == 0 && zs_bits(s1[b]) == 0, "%s: block %lld scale %g", what, (long long)b, (double)s1[b]);
    free(x); free(q1); free(q2); free(s1); free(s2); free(a1); free(a2); free(y1); free(y2);
    return 0;
}

int main(void)
{
    const int64_t blocks[] = {256, 1, 3, 3000};

    for (size_t bi = 0; bi < sizeof(blocks) / sizeof(blocks[0]); bi++) {
        int64_t B = blocks[bi];
        const int64_t lens[] = {0, 1, B - 1, B, B + 1, 9 * B + 7};
        for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++)
            for (int dt = 0; dt < 3; dt++)
                for (int k = 0; k < K_KINDS; k++)
                    if (lens[li] >= 0)
                        one_case(lens[li], B, dt, (enum kind)k);
    }
    /* The worked example: block [-1, 0.5, 0.25]: scale 1/127, q = -127, 64 (63.5 to even), 32 (31.75). */
    float x[3] = {-1.0f, 0.5f, 0.25f}, s;
    int8_t q[3];
    zs_quantize(x, 0, 3, 256, q, &s);
    CHECK(s == 1.0f / 127.0f && q[0] == -127 && q[1] == 64 && q[2] == 32, "worked example: %g %d %d %d", (double)s,
          q[0], q[1], q[2]);
    return zs_test_summary("quant");
}
