/* test_quant_cuda.c - the GPU twins of kernels/quant.h (kernels/quant_cuda.cu) against the scalar reference bit for
 * bit: quantize (int8 values and scales), dequantize to each dtype and dequantize-add, over lengths around the block
 * size, three dtypes and ordinary, zero, huge, tiny and non-finite values. Built against the CUDA emulator
 * (test_quant_cuda_emu, every CI run) and, where the backend is built, the real one (77 without a GPU). */
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "device/device.h"
#include "kernels/convert.h"
#include "kernels/quant.h"

static struct zs_device dev;

static size_t esz(int dt) { return dt == 0 ? 4 : 2; }

/* Value i of case c: ordinary values mostly, with zeros, huge, tiny, Inf and NaN among them. */
static float value(uint64_t c, int64_t i)
{
    uint64_t k = (c * 0x9e3779b97f4a7c15ULL) ^ ((uint64_t)i * 0xbf58476d1ce4e5b9ULL);
    k ^= k >> 29;
    switch (c % 4 == 0 ? k % 64 : 10) {
    case 0: return NAN;
    case 1: return -INFINITY;
    case 2: return 3.0e38f;
    case 3: return 1e-40f;
    case 4: return 0.0f;
    default: return (float)((k >> 20) & 0xfffff) / 524288.0f - 1.0f;
    }
}

static void *dev_put(const void *h, size_t bytes)
{
    void *d = dev.ops->alloc(&dev, bytes ? bytes : 4);

    if (d && bytes && dev.ops->copy(&dev, d, h, bytes, ZS_COPY_H2D, dev.compute))
        return NULL;
    return d;
}

static bool get(void *h, const void *d, size_t bytes)
{
    return (!bytes || !dev.ops->copy(&dev, h, d, bytes, ZS_COPY_D2H, dev.compute)) && !dev.ops->stream_sync(&dev, dev.compute);
}

/* NaN equals NaN whatever its payload (a GPU writes its own canonical NaN). */
static bool same(const void *a, const void *b, int dt, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        float x = zs_elem_get(a, i, dt), y = zs_elem_get(b, i, dt);
        if (memcmp((const char *)a + i * (int64_t)esz(dt), (const char *)b + i * (int64_t)esz(dt), esz(dt)) &&
            !(x != x && y != y))
            return false;
    }
    return true;
}

static void one_case(uint64_t c, int64_t n, int64_t block, int dt)
{
    int64_t nb = zs_quant_blocks(n, block);
    size_t xb = (size_t)n * esz(dt);
    char *x = malloc(xb + 4), *y1 = malloc((size_t)n * 4 + 4), *y2 = malloc((size_t)n * 4 + 4);
    int8_t *q1 = malloc((size_t)n + 1), *q2 = malloc((size_t)n + 1);
    float *s1 = malloc((size_t)nb * 4 + 4), *s2 = malloc((size_t)nb * 4 + 4);
    float *a1 = malloc((size_t)n * 4 + 4), *a2 = malloc((size_t)n * 4 + 4);

    for (int64_t i = 0; i < n; i++) {
        zs_elem_set(x, i, dt, value(c, i));
        a1[i] = (float)i * 0.5f;
    }
    zs_quantize_ref(x, dt, n, block, q1, s1);
    void *dx = dev_put(x, xb), *dq = dev.ops->alloc(&dev, (size_t)n + 4), *ds = dev.ops->alloc(&dev, (size_t)nb * 4 + 4);
    void *dy = dev.ops->alloc(&dev, (size_t)n * 4 + 4), *da = dev_put(a1, (size_t)n * 4);
    CHECK(dx && dq && ds && dy && da, "device allocation");
    if (dx && dq && ds && dy && da) {
        int e = zs_cuda_quantize(dx, dt, n, block, dq, ds, dev.compute);
        CHECK(!e && get(q2, dq, (size_t)n) && get(s2, ds, (size_t)nb * 4) && !memcmp(q1, q2, (size_t)n) &&
              same(s1, s2, 0, nb), "quantize, case %llu, n %lld, block %lld, dtype %d: error %d", (unsigned long long)c,
              (long long)n, (long long)block, dt, e);
        for (int odt = 0; odt < 3; odt++) {
            zs_dequantize_ref(q1, s1, n, block, y1, odt);
            e = zs_cuda_dequantize(dq, ds, n, block, dy, odt, dev.compute);
            CHECK(!e && get(y2, dy, (size_t)n * esz(odt)) && same(y1, y2, odt, n),
                  "dequantize, case %llu, n %lld, dtype %d: error %d", (unsigned long long)c, (long long)n, odt, e);
        }
        memcpy(a2, a1, (size_t)n * 4);
        zs_dequantize_add_ref(q1, s1, n, block, a1);
        e = zs_cuda_dequantize_add(dq, ds, n, block, da, dev.compute);
        CHECK(!e && get(y2, da, (size_t)n * 4) && same(a1, y2, 0, n), "dequantize-add, case %llu, n %lld: error %d",
              (unsigned long long)c, (long long)n, e);
    }
    void *dp[] = {dx, dq, ds, dy, da};
    for (int i = 0; i < 5; i++)
        if (dp[i])
            dev.ops->free(&dev, dp[i]);
    free(x); free(y1); free(y2); free(q1); free(q2); free(s1); free(s2); free(a1); free(a2);
}

int main(void)
{
    static const int64_t blocks[] = {256, 3, 1000};
    uint64_t c = 0;

    if (zs_device_open(&dev, "cuda", "test_quant_cuda", NULL, ZS_KPATH_SCALAR, 0, 1)) {
        printf("SKIP: no CUDA device: %s\n", zs_last_error());
        zs_device_close(&dev);
        return 77;
    }
    for (size_t b = 0; b < sizeof(blocks) / sizeof(blocks[0]); b++) {
        int64_t B = blocks[b];
        const int64_t lens[] = {0, 1, B - 1, B, B + 1, 5 * B + 3};
        for (size_t l = 0; l < sizeof(lens) / sizeof(lens[0]); l++)
            for (int dt = 0; dt < 3; dt++)
                for (int k = 0; k < 4; k++)
                    one_case(++c, lens[l], B, dt);
    }
    zs_device_close(&dev);
    return zs_test_summary("quant_cuda");
}
