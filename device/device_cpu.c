/* device_cpu.c - the CPU as the device: host memory, memcpy, and the optimizer kernels of kernels/ run
 * through the rank's thread pool. Work runs on the caller, in call order, so streams and events are
 * tokens and synchronizing is free. */
#include <stdlib.h>
#include <string.h>

#include "device.h"
#include "error.h"   /* defines: zs_fail */
#include "threads.h" /* defines: zs_pool_run */

/* Any non-NULL address serves as a stream or an event handle. */
static char cpu_token;

static int32_t cpu_count(void)
{
    return 1;
}

static zs_status cpu_open(struct zs_device *d, int32_t local_rank, int32_t local_size)
{
    d->ordinal = 0;
    return ZS_OK;
}

static void cpu_close(struct zs_device *d)
{
}

static void *cpu_alloc(struct zs_device *d, size_t bytes)
{
    void *p = NULL;
    size_t sz = bytes ? (bytes + 63) / 64 * 64 : 64;

    if (posix_memalign(&p, 64, sz))
        return NULL;
    memset(p, 0, sz);
    return p;
}

static void cpu_free(struct zs_device *d, void *p)
{
    free(p);
}

static zs_status cpu_copy(struct zs_device *d, void *dst, const void *src, size_t bytes, enum zs_copy_dir dir,
                          struct zs_dev_stream *s)
{
    if (bytes)
        memmove(dst, src, bytes);
    return ZS_OK;
}

static zs_status cpu_stream_create(struct zs_device *d, struct zs_dev_stream **s)
{
    *s = (struct zs_dev_stream *)&cpu_token;
    return ZS_OK;
}

static zs_status cpu_event_create(struct zs_device *d, struct zs_dev_event **e)
{
    *e = (struct zs_dev_event *)&cpu_token;
    return ZS_OK;
}

static void cpu_stream_free(struct zs_device *d, struct zs_dev_stream *s)
{
}

static void cpu_event_free(struct zs_device *d, struct zs_dev_event *e)
{
}

static zs_status cpu_stream_sync(struct zs_device *d, struct zs_dev_stream *s)
{
    return ZS_OK;
}

static zs_status cpu_event_record(struct zs_device *d, struct zs_dev_event *e, struct zs_dev_stream *s)
{
    return ZS_OK;
}

static zs_status cpu_stream_wait(struct zs_device *d, struct zs_dev_stream *s, struct zs_dev_event *e)
{
    return ZS_OK;
}

struct optim_job {
    zs_optim_fn fn;
    const struct zs_optim_step *step;
    const struct zs_optim_bufs *bufs;
};

static void optim_chunk(void *arg, int64_t begin, int64_t end)
{
    const struct optim_job *j = arg;

    j->fn(j->step, j->bufs, begin, end);
}

/* Tensor by tensor, each split over the pool in aligned chunks: the kernel is elementwise, so neither the
 * thread count nor the path changes a bit. */
static zs_status cpu_optim(struct zs_device *d, const struct zs_optim_launch *l, struct zs_dev_stream *s)
{
    struct optim_job job = { .fn = zs_optim_kernel(d->kpath, l->opt, l->pdt, l->gdt), .step = l->step };

    if (!job.fn)
        return zs_fail(ZS_ERR_UNSUPPORTED, "no %s kernel for %s with %s parameters and %s gradients",
                       zs_kpath_name(d->kpath), zs_kopt_name(l->opt), zs_dtype_name(l->pdt), zs_dtype_name(l->gdt));
    for (int32_t i = 0; i < l->count; i++) {
        job.bufs = &l->t[i].bufs;
        zs_pool_run(d->pool, optim_chunk, &job, l->t[i].n);
    }
    return ZS_OK;
}

const struct zs_device_ops zs_device_cpu_ops = {
    .name = "cpu", .count = cpu_count, .open = cpu_open, .close = cpu_close, .alloc = cpu_alloc, .free = cpu_free, .copy = cpu_copy,
    .stream_create = cpu_stream_create, .stream_free = cpu_stream_free, .stream_sync = cpu_stream_sync,
    .event_create = cpu_event_create, .event_free = cpu_event_free, .event_record = cpu_event_record,
    .stream_wait = cpu_stream_wait, .optim = cpu_optim,
};
