/* gradops.c - the CPU forms of gradops.h: what grads.c and step.c always did, in 256-element blocks
 * through fp32 for the 16-bit dtypes; the norm's reference, which defines its order, and its threaded form. */
#include <errno.h>
#include <stdlib.h>

#include "convert.h" /* defines: zs_cvt_to_f32, zs_cvt_from_f32 */
#include "gradops.h"
#include "threads.h" /* defines: zs_pool_run */

#define BLK 256

static void *at16(const void *base, int64_t i) { return (char *)(uintptr_t)base + (size_t)i * 2; }

void zs_grad_accumulate(void *dst, const void *src, zs_dtype dt, int64_t n)
{
    float a[BLK], b[BLK];

    if (dt == ZS_DTYPE_FP32) {
        float *d = dst;
        const float *s = src;
        for (int64_t i = 0; i < n; i++)
            d[i] += s[i];
        return;
    }
    for (int64_t i0 = 0; i0 < n; i0 += BLK) {
        int64_t k = n - i0 < BLK ? n - i0 : BLK;
        zs_cvt_to_f32(a, at16(dst, i0), (int)dt, k);
        zs_cvt_to_f32(b, at16(src, i0), (int)dt, k);
        for (int64_t i = 0; i < k; i++)
            a[i] += b[i];
        zs_cvt_from_f32(at16(dst, i0), (int)dt, a, k);
    }
}

void zs_grad_scale(void *x, zs_dtype dt, int64_t n, float f)
{
    float b[BLK];

    for (int64_t i0 = 0; i0 < n; i0 += BLK) {
        int64_t k = n - i0 < BLK ? n - i0 : BLK;
        void *p = (char *)x + (size_t)i0 * (dt == ZS_DTYPE_FP32 ? 4 : 2);
        zs_cvt_to_f32(b, p, (int)dt, k);
        for (int64_t i = 0; i < k; i++)
            b[i] *= f;
        zs_cvt_from_f32(p, (int)dt, b, k);
    }
}

/* ---------------------------------------------------------------- the norm (gradops.h: its order) */

double zs_grad_sumsq_seg(const void *x, zs_dtype dt, int64_t begin, int64_t end)
{
    float b[BLK];
    double s = 0.0;

    if (dt == ZS_DTYPE_FP32) {
        const float *f = x;
        for (int64_t i = begin; i < end; i++)
            s += (double)f[i] * (double)f[i];
        return s;
    }
    for (int64_t i0 = begin; i0 < end; i0 += BLK) {
        int64_t k = end - i0 < BLK ? end - i0 : BLK;
        zs_cvt_to_f32(b, at16(x, i0), (int)dt, k);
        for (int64_t i = 0; i < k; i++)
            s += (double)b[i] * (double)b[i];
    }
    return s;
}

double zs_grad_sumsq(const void *x, zs_dtype dt, int64_t n)
{
    const int64_t group = (int64_t)ZS_SUMSQ_SEG * ZS_SUMSQ_GROUP;
    double total = 0.0;

    for (int64_t g = 0; g < n; g += group) {
        double grp = 0.0;
        for (int64_t s = g; s < n && s < g + group; s += ZS_SUMSQ_SEG)
            grp += zs_grad_sumsq_seg(x, dt, s, s + ZS_SUMSQ_SEG < n ? s + ZS_SUMSQ_SEG : n);
        total += grp;
    }
    return total;
}

double zs_grad_sumsq_fold(const double *seg, int64_t nseg)
{
    double total = 0.0;

    for (int64_t g = 0; g < nseg; g += ZS_SUMSQ_GROUP) {
        double grp = 0.0;
        for (int64_t s = g; s < nseg && s < g + ZS_SUMSQ_GROUP; s++)
            grp += seg[s];
        total += grp;
    }
    return total;
}

/* The segments of every tensor, numbered one after another: tensor k's are first[k] .. first[k + 1] - 1. */
struct sumsq_job {
    const void *const *x;
    const int64_t *n;
    const int64_t *first;
    zs_dtype dt;
    double *seg;
};

/* Four whole segments from element b of x at once, each its own chain left to right: the same additions as
 * zs_grad_sumsq_seg's, but four independent chains keep the core's adders busy where one chain waits for
 * each add's result. */
static void sumsq_seg4(const void *x, zs_dtype dt, int64_t b, double *out)
{
    float v[4][BLK];
    double a0 = 0.0, a1 = 0.0, a2 = 0.0, a3 = 0.0;

    for (int64_t i0 = 0; i0 < ZS_SUMSQ_SEG; i0 += BLK) {
        const float *p[4];
        for (int q = 0; q < 4; q++) {
            int64_t at = b + q * ZS_SUMSQ_SEG + i0;
            if (dt == ZS_DTYPE_FP32) {
                p[q] = (const float *)x + at;
            } else {
                zs_cvt_to_f32(v[q], at16(x, at), (int)dt, BLK);
                p[q] = v[q];
            }
        }
        for (int64_t i = 0; i < BLK; i++) {
            a0 += (double)p[0][i] * (double)p[0][i];
            a1 += (double)p[1][i] * (double)p[1][i];
            a2 += (double)p[2][i] * (double)p[2][i];
            a3 += (double)p[3][i] * (double)p[3][i];
        }
    }
    out[0] = a0;
    out[1] = a1;
    out[2] = a2;
    out[3] = a3;
}

/* The pool splits elements, ZS_SUMSQ_SEG per segment: a chunk computes the segments that start inside it, so
 * every segment is computed once whatever the thread count, and the pool's small-call cut-off counts elements. */
static void sumsq_chunk(void *arg, int64_t begin, int64_t end)
{
    const struct sumsq_job *j = arg;
    int64_t s = (begin + ZS_SUMSQ_SEG - 1) / ZS_SUMSQ_SEG, last = (end + ZS_SUMSQ_SEG - 1) / ZS_SUMSQ_SEG;
    int32_t k = 0;

    while (s < last) {
        while (s >= j->first[k + 1]) /* tensors without segments are stepped over */
            k++;
        int64_t b = (s - j->first[k]) * ZS_SUMSQ_SEG, e = b + ZS_SUMSQ_SEG < j->n[k] ? b + ZS_SUMSQ_SEG : j->n[k];
        if (s + 4 <= last && b + 4 * ZS_SUMSQ_SEG <= j->n[k]) { /* four whole segments of one tensor */
            sumsq_seg4(j->x[k], j->dt, b, j->seg + s);
            s += 4;
            continue;
        }
        j->seg[s++] = zs_grad_sumsq_seg(j->x[k], j->dt, b, e);
    }
}

int zs_grad_sumsq_pool(struct zs_pool *pool, const void *const *x, const int64_t *n, int32_t count, zs_dtype dt,
                       double *out)
{
    int64_t *first = malloc(((size_t)count + 1) * sizeof(*first));
    struct sumsq_job j = { .x = x, .n = n, .first = first, .dt = dt };

    if (!first)
        return -ENOMEM;
    first[0] = 0;
    for (int32_t k = 0; k < count; k++)
        first[k + 1] = first[k] + (n[k] + ZS_SUMSQ_SEG - 1) / ZS_SUMSQ_SEG;
    j.seg = malloc((size_t)(first[count] ? first[count] : 1) * sizeof(double));
    if (!j.seg) {
        free(first);
        return -ENOMEM;
    }
    if (pool)
        zs_pool_run(pool, sumsq_chunk, &j, first[count] * ZS_SUMSQ_SEG);
    else
        sumsq_chunk(&j, 0, first[count] * ZS_SUMSQ_SEG);
    for (int32_t k = 0; k < count; k++)
        out[k] = zs_grad_sumsq_fold(j.seg + first[k], first[k + 1] - first[k]);
    free(j.seg);
    free(first);
    return 0;
}

void zs_grad_convert(void *dst, zs_dtype dt, const float *src, int64_t n)
{
    zs_cvt_from_f32(dst, (int)dt, src, n);
}
