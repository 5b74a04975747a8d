/* bench_quant.c - zs-bench quant: kernels/quant.h's block quantization in GB/s of input read, beside memcpy of the
 * same bytes: the fast quantize, its scalar reference and the fast dequantize, interleaved rep by rep in one run.
 * The fast path's bits must be the reference's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"         /* defines: bench_now, bench_parse_*, bench_spread_of */
#include "kernels/quant.h" /* defines: zs_quantize, zs_quantize_ref, zs_dequantize */

const char bench_quant_usage[] = "[--size N] [--reps R] [--dtype fp32|bf16|fp16] [--block B]\n"
                                 "    defaults: 16M elements, 11 reps, fp32, blocks of 256";

enum { MEMCPY, QUANT, QUANT_REF, DEQUANT, FORMS };
static const char *const form_names[FORMS] = {"memcpy", "quantize", "quantize, reference", "dequantize"};
static const char *const dt_names[] = {"fp32", "bf16", "fp16"};

struct quant_args {
    int64_t n, block;
    int reps, dt;
};

static int set_option(void *arg, int which, const char *v)
{
    struct quant_args *a = arg;

    switch (which) {
    case 0: return bench_parse_count(v, &a->n);
    case 1: return bench_parse_int(v, BENCH_DEV_MAX_REPS, &a->reps);
    case 2:
        for (int d = 0; d < 3; d++)
            if (!strcmp(v, dt_names[d])) {
                a->dt = d;
                return 0;
            }
        return -1;
    default: return bench_parse_count(v, &a->block);
    }
}

struct bufs {
    void *x, *y, *copy;
    int8_t *q, *q2;
    float *s, *s2;
};

static double timed(int form, const struct quant_args *a, struct bufs *b, size_t bytes)
{
    double t0 = bench_now();

    if (form == MEMCPY)
        memcpy(b->copy, b->x, bytes);
    else if (form == QUANT)
        zs_quantize(b->x, a->dt, a->n, a->block, b->q, b->s);
    else if (form == QUANT_REF)
        zs_quantize_ref(b->x, a->dt, a->n, a->block, b->q2, b->s2);
    else
        zs_dequantize(b->q, b->s, a->n, a->block, b->y, a->dt);
    return bench_now() - t0;
}

static int measure(const struct quant_args *a)
{
    size_t es = a->dt ? 2 : 4, bytes = (size_t)a->n * es, nb = (size_t)zs_quant_blocks(a->n, a->block);
    struct bufs b = {bench_alloc(bytes), bench_alloc(bytes), bench_alloc(bytes), bench_alloc((size_t)a->n),
                     bench_alloc((size_t)a->n), bench_alloc(nb * 4), bench_alloc(nb * 4)};
    double *t = calloc((size_t)FORMS * (size_t)a->reps, sizeof(double)), gbs[FORMS];
    int rc = BENCH_FAIL;

    if (!b.x || !b.y || !b.copy || !b.q || !b.q2 || !b.s || !b.s2 || !t) {
        fprintf(stderr, "zs-bench quant: out of memory for %lld elements\n", (long long)a->n);
        goto out;
    }
    for (int64_t i = 0; i < a->n; i++) { /* bit patterns of ordinary values: |x| up to 2, every exponent below */
        uint32_t h = (uint32_t)(i * 2654435761u);
        float v = ((float)(h % 2001) - 1000.0f) * 2e-3f;
        if (a->dt == 0)
            ((float *)b.x)[i] = v;
        else
            ((uint16_t *)b.x)[i] = (uint16_t)(a->dt == 1 ? 0x3f80u ^ (h & 0x807fu) : 0x3c00u ^ (h & 0x83ffu));
    }
    for (int f = 0; f < FORMS; f++) /* warm-up: first touch */
        timed(f, a, &b, bytes);
    for (int r = 0; r < a->reps; r++)
        for (int f = 0; f < FORMS; f++)
            t[f * a->reps + r] = timed(f, a, &b, bytes);
    printf("%-20s %10s %6s %9s %8s %17s %5s\n", "form", "n", "dtype", "ms", "GB/s", "[min..max]", "reps");
    for (int f = 0; f < FORMS; f++) {
        struct bench_spread s = bench_spread_of(t + f * a->reps, a->reps);
        /* dequantize reads the int8 values and scales, and writes the dtype: counted as the input's bytes too */
        printf("%-20s %10lld %6s %9.3f %8.2f [%7.2f..%7.2f] %5d\n", form_names[f], (long long)a->n, dt_names[a->dt],
               s.median * 1e3, (double)bytes / s.median / 1e9, (double)bytes / s.max / 1e9, (double)bytes / s.min / 1e9,
               a->reps);
        gbs[f] = (double)bytes / s.median / 1e9;
    }
    bool same = !memcmp(b.q, b.q2, (size_t)a->n) && !memcmp(b.s, b.s2, nb * 4);
    printf("bench-quant dtype=%s n=%lld block=%lld memcpy_gbs=%.2f quantize_gbs=%.2f quantize_ref_gbs=%.2f "
           "dequantize_gbs=%.2f bits=%s\n", dt_names[a->dt], (long long)a->n, (long long)a->block, gbs[MEMCPY],
           gbs[QUANT], gbs[QUANT_REF], gbs[DEQUANT], same ? "same" : "DIFFER");
    rc = same ? BENCH_OK : BENCH_FAIL;
    if (!same)
        fprintf(stderr, "zs-bench quant: the fast path's bits are not the reference's\n");
out:
    bench_free(b.x); bench_free(b.y); bench_free(b.copy); bench_free(b.q); bench_free(b.q2); bench_free(b.s);
    bench_free(b.s2);
    free(t);
    return rc;
}

int bench_quant(int argc, char **argv)
{
    static const char *const names[] = {"--size", "--reps", "--dtype", "--block"};
    struct quant_args a = {.n = 16 << 20, .block = 256, .reps = 11};
    char cmd[1024];
    int rc = bench_parse_options("quant", argc, argv, names, 4, set_option, NULL, &a, true);

    if (rc)
        return rc < 0 ? BENCH_OK : rc;
    bench_cmdline(argc, argv, cmd, sizeof(cmd));
    printf("# %s\n# int8 block quantization (one fp32 scale per block of %lld), GB/s of input; the forms interleaved "
           "rep by rep; medians, [min..max] beside them; one thread\n", cmd, (long long)a.block);
    return measure(&a);
}
