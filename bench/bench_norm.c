/* bench_norm.c - zs-bench norm: the gradient norm's squares over one large fp32 tensor, in GB/s read: the
 * sequential left-to-right sum the CPU ran before the fixed order (one thread), the fixed order's scalar
 * reference (one thread), and the device's form of it (the CPU: segments over the pool's threads; a GPU: the
 * kernels), interleaved rep by rep in one run. The device's result must have the reference's bits. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"           /* defines: bench_now, bench_parse_*, bench_spread_of */
#include "device/device.h"   /* defines: zs_device_open, the sumsq op */
#include "kernels/gradops.h" /* defines: zs_grad_sumsq */
#include "kernels/optim.h"   /* defines: zs_sumsq_ref (the sequential order) */
#include "kernels/threads.h" /* defines: zs_pool_create */

const char bench_norm_usage[] = "[--device cpu|cuda] [--size N] [--reps R] [--threads T]\n"
                                "    defaults: cpu, 64M fp32 elements, 11 reps, every online core (cpu only)";

enum { SEQUENTIAL, REFERENCE, DEVICE, FORMS };
static const char *const form_names[FORMS] = {"sequential (before)", "fixed order, scalar", "fixed order, device"};

/* One form's seconds; *sum its result. */
static double timed(int form, struct zs_device *d, const float *h, const void *dx, int64_t n, double *sum,
                    zs_status *st)
{
    double t0 = bench_now();

    if (form == SEQUENTIAL)
        *sum = zs_sumsq_ref(h, n);
    else if (form == REFERENCE)
        *sum = zs_grad_sumsq(h, ZS_DTYPE_FP32, n);
    else
        *st = d->ops->sumsq(d, &dx, &n, 1, ZS_DTYPE_FP32, sum, NULL);
    return bench_now() - t0;
}

static int measure(struct zs_device *d, const struct bench_dev_args *a)
{
    size_t bytes = (size_t)a->n * sizeof(float);
    float *h = bench_alloc(bytes);
    void *dx = d->host_access ? (void *)h : d->ops->alloc(d, bytes);
    double *t = calloc((size_t)FORMS * a->reps, sizeof(double)), sum[FORMS] = {0};
    zs_status st = ZS_OK;
    int rc = BENCH_FAIL;

    if (!h || !dx || !t) {
        fprintf(stderr, "zs-bench norm: out of memory for %lld elements\n", (long long)a->n);
        goto out;
    }
    for (int64_t i = 0; i < a->n; i++)
        h[i] = (float)((i * 2654435761u) % 2001) * 1e-3f - 1.0f;
    if (dx != h)
        st = zs_device_copy(d, dx, true, h, false, bytes);
    for (int f = 0; f < FORMS && !st; f++) /* warm-up: first touch, thread start, kernel load */
        timed(f, d, h, dx, a->n, &sum[f], &st);
    for (int r = 0; r < a->reps && !st; r++)
        for (int f = 0; f < FORMS && !st; f++)
            t[f * a->reps + r] = timed(f, d, h, dx, a->n, &sum[f], &st);
    if (st) {
        fprintf(stderr, "zs-bench norm: %s\n", zs_last_error());
        goto out;
    }
    printf("%-20s %10s %9s %8s %17s %5s\n", "form", "n", "ms", "GB/s", "[min..max]", "reps");
    for (int f = 0; f < FORMS; f++) {
        struct bench_spread s = bench_spread_of(t + f * a->reps, a->reps);
        printf("%-20s %10lld %9.3f %8.2f [%7.2f..%7.2f] %5d\n", form_names[f], (long long)a->n, s.median * 1e3,
               (double)bytes / s.median / 1e9, (double)bytes / s.max / 1e9, (double)bytes / s.min / 1e9, a->reps);
        t[f] = (double)bytes / s.median / 1e9; /* the sorted samples are spent: keep the median's GB/s */
    }
    bool same = !memcmp(&sum[DEVICE], &sum[REFERENCE], sizeof(double));
    printf("bench-norm device=%s n=%lld sequential_gbs=%.2f reference_gbs=%.2f device_gbs=%.2f speedup=%.2f "
           "bits=%s\n", a->device, (long long)a->n, t[SEQUENTIAL], t[REFERENCE], t[DEVICE], t[DEVICE] / t[SEQUENTIAL],
           same ? "same" : "DIFFER");
    rc = same ? BENCH_OK : BENCH_FAIL;
    if (!same)
        fprintf(stderr, "zs-bench norm: the device's %.17g is not the reference's %.17g\n", sum[DEVICE], sum[REFERENCE]);
out:
    if (dx && dx != h)
        d->ops->free(d, dx);
    bench_free(h);
    free(t);
    return rc;
}

int bench_norm(int argc, char **argv)
{
    struct bench_dev_args a = { .device = "cpu", .n = 64 << 20, .reps = 11 };
    struct zs_pool *pool = NULL;
    struct zs_device d;
    char cmd[1024];
    int rc = bench_parse_options("norm", argc, argv, bench_dev_option_names, 4, bench_dev_set_option,
                                 NULL, &a, true);

    if (rc)
        return rc < 0 ? BENCH_OK : rc;
    if (zs_pool_create(&pool, &(struct zs_pool_opts){ .threads = a.threads, .local_size = 1 }, NULL, 0))
        return BENCH_FAIL;
    if (zs_device_open(&d, a.device, "--device", pool, zs_kpath_best(), 0, 1)) {
        bool none = !strcmp(a.device, "cuda") && zs_device_cuda_ops.count() <= 0;
        printf("%s: %s\n", none ? "SKIP" : "FAIL", zs_last_error());
        zs_pool_free(pool);
        return none ? 77 : BENCH_FAIL;
    }
    bench_cmdline(argc, argv, cmd, sizeof(cmd));
    printf("# %s\n# the norm's squares of one fp32 tensor, GB/s read; the three forms interleaved rep by rep; "
           "medians, [min..max] beside them; device threads: %s\n", cmd,
           d.kind == ZS_DEV_CPU ? zs_pool_describe(pool) : "the GPU's");
    rc = measure(&d, &a);
    zs_device_close(&d);
    zs_pool_free(pool);
    return rc;
}
