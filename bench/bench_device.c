/* bench_device.c - zs-bench device: the fused AdamW step through the device interface (device/device.h)
 * against the same device's device-to-device copy, interleaved rep by rep in one run. On a GPU this is the
 * CUDA kernel against cudaMemcpy D2D (the goal: ratio >= 0.90); on the CPU the pool's kernel against
 * memmove (one thread, so the CPU ratio says little). Bandwidth counts bytes read plus written: AdamW fp32 28 B/param, a copy 2 B per byte. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"   /* defines: bench_now, bench_parse_*, bench_spread_of */
#include "device/device.h"  /* defines: zs_device_open, struct zs_optim_launch */
#include "kernels/threads.h" /* defines: zs_pool_create */

const char bench_device_usage[] = "[--device cpu|cuda] [--size N] [--reps R] [--threads T]\n"
                                  "    defaults: cpu, 64M parameters, 20 reps, every online core (cpu only)";

/* Seconds of one call followed by a wait for the device to finish it. */
static double timed_sync(struct zs_device *d, zs_status (*call)(struct zs_device *d, void *arg), void *arg,
                         zs_status *st)
{
    double t0 = bench_now();

    *st = call(d, arg);
    if (!*st)
        *st = d->ops->stream_sync(d, NULL);
    return bench_now() - t0;
}

struct bufs {
    float *p, *g, *m, *v, *copy_src, *copy_dst;
    size_t bytes; /* of one fp32 array */
    struct zs_optim_launch l;
};

static zs_status run_optim(struct zs_device *d, void *arg)
{
    struct bufs *b = arg;

    return d->ops->optim(d, &b->l, NULL);
}

/* As many bytes moved as the AdamW step: 7 arrays' worth read or written = 3.5 arrays copied. */
static zs_status run_copy(struct zs_device *d, void *arg)
{
    struct bufs *b = arg;

    return d->ops->copy(d, b->copy_dst, b->copy_src, b->bytes * 7 / 2, ZS_COPY_D2D, NULL);
}

static int measure(struct zs_device *d, const struct bench_dev_args *a)
{
    struct zs_optim_step s = { .lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .one_minus_beta1 = 0.1f,
                               .one_minus_beta2 = 0.001f, .eps = 1e-8f, .step_size = 1e-3f, .inv_sqrt_bc2 = 1.0f,
                               .decay = 1e-5f, .grad_scale = 1.0f };
    struct zs_optim_tensor t;
    struct bufs b = { .bytes = (size_t)a->n * sizeof(float) };
    float **arrays[] = { &b.p, &b.g, &b.m, &b.v, &b.copy_src, &b.copy_dst };
    double *tk = calloc((size_t)a->reps, sizeof(double)), *tc = calloc((size_t)a->reps, sizeof(double));
    double *ratio = calloc((size_t)a->reps, sizeof(double));
    struct bench_spread k, c, q;
    zs_status st = ZS_OK;
    int rc = BENCH_FAIL;

    b.p = d->ops->alloc(d, b.bytes);
    b.g = d->ops->alloc(d, b.bytes);
    b.m = d->ops->alloc(d, b.bytes);
    b.v = d->ops->alloc(d, b.bytes);
    b.copy_src = d->ops->alloc(d, b.bytes * 7 / 2);
    b.copy_dst = d->ops->alloc(d, b.bytes * 7 / 2);
    if (!tk || !tc || !ratio || !b.p || !b.g || !b.m || !b.v || !b.copy_src || !b.copy_dst) {
        fprintf(stderr, "zs-bench device: out of memory for %lld parameters\n", (long long)a->n);
        goto out;
    }
    t = (struct zs_optim_tensor){ .bufs = { .param = b.p, .grad = b.g, .s1 = b.m, .s2 = b.v }, .n = a->n };
    b.l = (struct zs_optim_launch){ .opt = ZS_KOPT_ADAMW, .pdt = ZS_DTYPE_FP32, .gdt = ZS_DTYPE_FP32, .step = &s,
                                    .t = &t, .count = 1 };
    timed_sync(d, run_optim, &b, &st); /* warm-up: first-touch, kernel load */
    if (!st)
        timed_sync(d, run_copy, &b, &st);
    for (int r = 0; r < a->reps && !st; r++) {
        tk[r] = timed_sync(d, run_optim, &b, &st);
        if (!st)
            tc[r] = timed_sync(d, run_copy, &b, &st);
        ratio[r] = tc[r] / tk[r]; /* equal bytes: kernel GB/s over copy GB/s */
    }
    if (st) {
        fprintf(stderr, "zs-bench device: %s\n", zs_last_error());
        goto out;
    }
    k = bench_spread_of(tk, a->reps);
    c = bench_spread_of(tc, a->reps);
    q = bench_spread_of(ratio, a->reps);
    double bytes = 28.0 * (double)a->n;
    printf("%-6s %10s %9s %8s %15s %9s %15s %6s %13s %5s\n", "device", "n", "ms/step", "GB/s", "[min..max]",
           "copy GB/s", "[min..max]", "ratio", "[min..max]", "reps");
    printf("%-6s %10lld %9.3f %8.1f [%6.1f..%6.1f] %9.1f [%6.1f..%6.1f] %6.3f [%5.3f..%5.3f] %5d\n", a->device,
           (long long)a->n, k.median * 1e3, bytes / k.median / 1e9, bytes / k.max / 1e9, bytes / k.min / 1e9,
           bytes / c.median / 1e9, bytes / c.max / 1e9, bytes / c.min / 1e9, q.median, q.min, q.max, a->reps);
    printf("bench-device device=%s n=%lld adamw_gbs=%.2f copy_gbs=%.2f ratio=%.4f\n", a->device, (long long)a->n,
           bytes / k.median / 1e9, bytes / c.median / 1e9, q.median);
    rc = BENCH_OK;
out:
    for (size_t i = 0; i < sizeof(arrays) / sizeof(arrays[0]); i++)
        if (*arrays[i])
            d->ops->free(d, *arrays[i]);
    free(tk);
    free(tc);
    free(ratio);
    return rc;
}

int bench_device(int argc, char **argv)
{
    struct bench_dev_args a = { .device = "cpu", .n = 64 << 20, .reps = 20 };
    struct zs_pool *pool = NULL;
    struct zs_device d;
    char cmd[1024];
    int rc = bench_parse_options("device", argc, argv, bench_dev_option_names, 4, bench_dev_set_option,
                                 NULL, &a, true);

    if (rc)
        return rc < 0 ? BENCH_OK : rc;
    if (strcmp(a.device, "cpu") == 0 && zs_pool_create(&pool, &(struct zs_pool_opts){ .threads = a.threads,
                                                                                       .local_size = 1 }, NULL, 0))
        return BENCH_FAIL;
    if (zs_device_open(&d, a.device, "--device", pool, zs_kpath_best(), 0, 1)) {
        bool none = !strcmp(a.device, "cuda") && zs_device_cuda_ops.count() <= 0;
        printf("%s: %s\n", none ? "SKIP" : "FAIL", zs_last_error());
        zs_pool_free(pool);
        return none ? 77 : BENCH_FAIL;
    }
    bench_cmdline(argc, argv, cmd, sizeof(cmd));
    printf("# %s\n# AdamW fp32, one tensor, through the device interface; reference: the device's D2D copy of the "
           "same bytes (28 B/param), interleaved rep by rep; medians, [min..max] beside them\n", cmd);
    rc = measure(&d, &a);
    zs_device_close(&d);
    zs_pool_free(pool);
    return rc;
}
