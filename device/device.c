/* device.c - opens the device backend a config names. */
#include <stdlib.h>
#include <string.h>

#include "device.h"
#include "error.h" /* defines: zs_fail, zs_error_prefix */
#include "base/test_hooks.h"

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
