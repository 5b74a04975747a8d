/* device.c - opens the device backend a config names. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h" /* defines: zs_fail, zs_error_prefix */
#include "base/test_hooks.h"
#include "device.h"

zs_status zs_device_open(struct zs_device *d, const char *name, const char *key, struct zs_pool *pool,
                         enum zs_kpath kpath, int32_t local_rank, int32_t local_size)
{
    zs_status st;

    memset(d, 0, sizeof(*d));
    d->pool = pool;
    d->kpath = kpath;
    if (!strcmp(name, "cpu")) {
        const char *t = getenv(ZS_TEST_HOOK_DEVICE);
        d->kind = ZS_DEV_CPU;
        d->host_access = !t || strcmp(t, "separate") != 0;
        d->ops = d->host_access ? &zs_device_cpu_ops : &zs_device_separate_ops;
    } else if (!strcmp(name, "cuda")) {
        d->kind = ZS_DEV_CUDA;
        d->ops = &zs_device_cuda_ops;
    } else {
        return zs_fail(ZS_ERR_CONFIG, "%s: expected \"cpu\" or \"cuda\", got \"%.40s\"", key, name);
    }
    st = d->ops->open(d, local_rank, local_size);
    if (st) {
        zs_error_prefix("%s: \"%s\"", key, name);
        d->ops = NULL;
    }
    return st;
}

void zs_device_close(struct zs_device *d)
{
    if (d->ops)
        d->ops->close(d);
    d->ops = NULL;
}

zs_status zs_device_copy(struct zs_device *d, void *dst, bool dst_dev, const void *src, bool src_dev, size_t bytes)
{
    enum zs_copy_dir dir = dst_dev ? (src_dev ? ZS_COPY_D2D : ZS_COPY_H2D) : ZS_COPY_D2H;
    zs_status st;

    if (!bytes)
        return ZS_OK;
    if (!dst_dev && !src_dev) {
        memmove(dst, src, bytes);
        return ZS_OK;
    }
    st = d->ops->copy(d, dst, src, bytes, dir, d->compute);
    /* host memory on either side may be read or reused as soon as this returns */
    if (!st && dir != ZS_COPY_D2D)
        st = d->ops->stream_sync(d, d->compute);
    if (st)
        zs_error_prefix("device %s", dir == ZS_COPY_H2D ? "copy up" : dir == ZS_COPY_D2H ? "copy down" : "copy");
    return st;
}
