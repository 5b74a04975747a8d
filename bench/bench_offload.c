/* bench_offload.c - zs-bench offload: ZeRO-Offload's optimizer step from the device (zeroshard.device, stage
 * 2, offload_optimizer cpu: the reduced gradients down, the CPU kernels' AdamW, the parameters up) against
 * the device's own host<->device copy of the same bytes, pinned, interleaved rep by rep in one run. On a GPU
 * the copy is the PCIe bound the step cannot beat; the ratio copy/step says how close it comes. On the CPU
 * (a copy is memcpy, the state never moves) it only checks the plumbing. One rank. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <mpi.h>

#include "bench.h"   /* defines: bench_now, bench_parse_*, bench_spread_of */
#include "device/device.h"  /* defines: zs_device_open, the copy ops */
#include "zeroshard.h"

const char bench_offload_usage[] = "[--device cpu|cuda] [--size N] [--reps R] [--dtype fp32|bf16]\n"
                                   "    defaults: cpu, 16M parameters, 10 reps, fp32";

#define UNITS 8

struct offload_args {
    const char *device, *dtype;
    int64_t n;
    int reps;
};

static const char *const option_names[] = {"--device", "--size", "--reps", "--dtype"};

static int set_option(void *arg, int which, const char *v)
{
    struct offload_args *a = arg;

    switch (which) {
    case 0: return bench_parse_device(v, &a->device);
    case 1: return bench_parse_count(v, &a->n);
    case 2: return bench_parse_int(v, 1000, &a->reps);
    default:
        if (strcmp(v, "fp32") && strcmp(v, "bf16"))
            return -EINVAL;
        a->dtype = v;
        return 0;
    }
}

static zs_status engine_open(const struct offload_args *a, zs_ctx **ctx, int32_t *units)
{
    char json[512];
    zs_init_opts o = { .config_json = json, .quiet = 1 };
    zs_status st;

    snprintf(json, sizeof(json),
             "{\"train_micro_batch_size_per_gpu\": 1, %s \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-4}},"
             "\"zero_optimization\": {\"stage\": 2, \"offload_optimizer\": {\"device\": \"cpu\"}},"
             "\"zeroshard\": {\"device\": \"%s\"}}",
             strcmp(a->dtype, "bf16") ? "" : "\"bf16\": {\"enabled\": true},", a->device);
    st = zs_init(ctx, &o);
    for (int u = 0; !st && u < UNITS; u++) {
        char name[32];
        int32_t p;
        snprintf(name, sizeof(name), "u%d", u);
        st = zs_unit_add(*ctx, name, &units[u]);
        if (!st)
            st = zs_param_add(*ctx, units[u], name, a->n / UNITS, NULL, &p);
    }
    return st ? st : zs_setup(*ctx);
}

static zs_status one_step(zs_ctx *ctx, const int32_t *units, double *optim_s)
{
    zs_step_stats s;
    zs_status st = ZS_OK;

    for (int u = UNITS - 1; !st && u >= 0; u--) {
        void *g;
        st = zs_grad_buffer(ctx, units[u], &g);
        if (!st)
            st = zs_grad_ready(ctx, units[u]);
    }
    if (!st)
        st = zs_step(ctx);
    if (!st)
        st = zs_stats(ctx, &s);
    *optim_s = st ? 0.0 : s.time_optimizer;
    return st;
}

/* The bytes the offloaded step moves (gradients and parameters down, parameters up), by the device's own
 * copies between pinned host memory and device memory. */
static zs_status copy_round(struct zs_device *d, void *dev, void *host, size_t down, size_t up)
{
    zs_status st = d->ops->copy(d, host, dev, down, ZS_COPY_D2H, NULL);

    if (!st)
        st = d->ops->copy(d, dev, host, up, ZS_COPY_H2D, NULL);
    return st ? st : d->ops->stream_sync(d, NULL);
}

int bench_offload(int argc, char **argv)
{
    struct offload_args a = { .device = "cpu", .dtype = "fp32", .n = 16 << 20, .reps = 10 };
    double tstep[1000], toptim[1000], tcopy[1000], ratio[1000];
    int32_t units[UNITS];
    struct zs_device dev = { 0 };
    zs_ctx *ctx = NULL;
    void *dbuf = NULL, *hbuf = NULL;
    int rc = bench_parse_options("offload", argc, argv, option_names, 4, set_option, NULL, &a, true);
    zs_status st;

    if (rc)
        return rc < 0 ? BENCH_OK : rc;
    if (a.n < UNITS * 16)
        a.n = UNITS * 16;
    MPI_Init(&argc, &argv);
    size_t psz = strcmp(a.dtype, "bf16") ? 4 : 2, n = (size_t)(a.n / UNITS) * UNITS;
    size_t down = n * psz * 2, up = n * psz; /* gradients (the parameters' dtype at stage 2) and parameters */
    st = engine_open(&a, &ctx, units);
    if (!st)
        st = zs_device_open(&dev, a.device, "--device", NULL, ZS_KPATH_SCALAR, 0, 1);
    if (!st && !(dbuf = dev.ops->alloc(&dev, down)))
        st = ZS_ERR_NOMEM;
    if (!st && posix_memalign(&hbuf, 4096, down))
        st = ZS_ERR_NOMEM;
    if (!st)
        st = dev.ops->host_register(&dev, hbuf, down);
    for (int r = 0; !st && r <= a.reps; r++) { /* rep 0 warms up */
        double t0 = bench_now(), t1, t2;
        st = one_step(ctx, units, &toptim[r ? r - 1 : 0]);
        t1 = bench_now();
        if (!st)
            st = copy_round(&dev, dbuf, hbuf, down, up);
        t2 = bench_now();
        if (r) {
            tstep[r - 1] = t1 - t0;
            tcopy[r - 1] = t2 - t1;
            ratio[r - 1] = toptim[r - 1] > 0 ? tcopy[r - 1] / toptim[r - 1] : 0;
        }
    }
    if (st) {
        fprintf(stderr, "zs-bench offload: %s\n", zs_last_error());
    } else {
        struct bench_spread s = bench_spread_of(tstep, a.reps), o = bench_spread_of(toptim, a.reps);
        struct bench_spread c = bench_spread_of(tcopy, a.reps), q = bench_spread_of(ratio, a.reps);
        double bytes = (double)(down + up);
        printf("%-6s %-5s %10s %9s %12s %11s %9s %15s\n", "device", "dtype", "n", "step ms", "optimizer ms",
               "copy ms", "copy GB/s", "copy/optimizer");
        printf("%-6s %-5s %10zu %9.2f %12.2f %11.2f %9.2f %6.3f [%.3f..%.3f]\n", a.device, a.dtype, n,
               s.median * 1e3, o.median * 1e3, c.median * 1e3, bytes / c.median / 1e9, q.median, q.min, q.max);
        printf("bench-offload device=%s dtype=%s n=%zu step_ms=%.3f optim_ms=%.3f copy_ms=%.3f copy_gbs=%.2f "
               "ratio=%.4f\n", a.device, a.dtype, n, s.median * 1e3, o.median * 1e3, c.median * 1e3,
               bytes / c.median / 1e9, q.median);
    }
    if (hbuf && dev.ops)
        dev.ops->host_unregister(&dev, hbuf);
    free(hbuf);
    if (dbuf)
        dev.ops->free(&dev, dbuf);
    zs_device_close(&dev);
    zs_finalize(ctx);
    MPI_Finalize();
    return st ? BENCH_FAIL : BENCH_OK;
}
