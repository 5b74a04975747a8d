/* test_norm.c - the gradient norm's scratch on the emulated GPU (tests/cuda_emu): the first norm allocates its
 * scratch and keeps it (the device's free memory drops and stays down), a norm of the same or a smaller launch
 * allocates nothing (no cudaMalloc, a device-wide sync, per step), a larger one grows it, and every result
 * keeps the CPU reference's bits. The order itself is test_device.c's. */
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h> /* defines: cudaMemGetInfo (tests/cuda_emu's) */

#include "check.h"
#include "device/device.h"
#include "kernels/gradops.h" /* defines: zs_grad_sumsq, ZS_SUMSQ_SEG */
#include "kernels/threads.h"

static struct zs_device dev;

static size_t dev_free(void)
{
    size_t f = 0, t = 0;

    return cudaMemGetInfo(&f, &t) == cudaSuccess ? f : 0;
}

/* count tensors of n fp32 values each (k + 1 scaled), the device's partials against the reference's */
static void norm_of(int32_t count, int64_t n, const char *what)
{
    float *h = malloc((size_t)n * 4);
    void **d = calloc((size_t)count, sizeof(*d));
    int64_t *len = malloc((size_t)count * sizeof(*len));
    double *got = calloc((size_t)count, sizeof(double));
    bool ok = h && d && len && got;

    for (int64_t i = 0; ok && i < n; i++)
        h[i] = (float)(i % 1013) * 0.001f - 0.5f;
    for (int32_t k = 0; ok && k < count; k++) {
        len[k] = n;
        d[k] = dev.ops->alloc(&dev, (size_t)n * 4);
        ok = d[k] && !dev.ops->copy(&dev, d[k], h, (size_t)n * 4, ZS_COPY_H2D, NULL);
    }
    CHECK(ok && !dev.ops->sumsq(&dev, (const void *const *)d, len, count, ZS_DTYPE_FP32, got, NULL), "%s: %s", what,
          zs_last_error());
    double want = zs_grad_sumsq(h, ZS_DTYPE_FP32, n);
    for (int32_t k = 0; ok && k < count; k++)
        CHECK(!memcmp(&got[k], &want, sizeof(double)), "%s, tensor %d: %.17g, the reference %.17g", what, k, got[k], want);
    for (int32_t k = 0; d && k < count; k++)
        if (d[k])
            dev.ops->free(&dev, d[k]);
    free(h);
    free(d);
    free(len);
    free(got);
}

int main(void)
{
    struct zs_pool *pool = NULL;
    struct zs_pool_opts po = { .threads = 1, .local_size = 1 };

    if (zs_pool_create(&pool, &po, NULL, 0))
        return 1;
    if (zs_device_open(&dev, "cuda", "test_norm", pool, zs_kpath_best(), 0, 1)) {
        printf("FAIL: the emulated GPU did not open: %s\n", zs_last_error());
        zs_pool_free(pool);
        return 1;
    }
    size_t before = dev_free();
    norm_of(3, 5 * ZS_SUMSQ_SEG + 7, "the first norm");
    size_t kept = dev_free();
    CHECK(kept < before, "the norm's scratch is not kept: %zu bytes free before the first norm, %zu after", before, kept);
    norm_of(3, 5 * ZS_SUMSQ_SEG + 7, "the same norm again");
    CHECK(dev_free() == kept, "the same norm again changed the free memory: %zu, then %zu", kept, dev_free());
    norm_of(2, 100, "a smaller norm");
    CHECK(dev_free() == kept, "a smaller norm changed the free memory: %zu, then %zu", kept, dev_free());
    norm_of(40, 20 * ZS_SUMSQ_SEG, "a larger norm");
    CHECK(dev_free() < kept, "a larger norm did not grow the scratch: %zu free, %zu before", dev_free(), kept);
    zs_device_close(&dev);
    CHECK(dev_free() == before, "the scratch outlives the device's close: %zu free, %zu before the first norm",
          dev_free(), before);
    zs_pool_free(pool);
    return zs_test_summary("norm scratch");
}
