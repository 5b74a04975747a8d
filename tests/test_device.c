/* test_device.c BACKEND - one device backend ("cpu", "separate" or "cuda") through the device interface:
 * memory comes back zero-filled, copies ordered across two streams by an event arrive intact, an event's
 * query says done once its stream is synchronized (on the separate device, not before: its streams are late),
 * a multi-tensor optimizer launch (every optimizer x dtype pair x SGD form, two steps, awkward lengths, more tensors
 * than one CUDA kernel takes, hostile values) gives the CPU scalar reference's bits in every array, and so
 * do the kernels around it (accumulate, scale, convert, zero, the norm's partials) per dtype, and the norm's
 * partials follow gradops.h's fixed order bit for bit at every segment and group boundary.
 * Exits 77 (skip) when the backend sees no device (no GPU, or no CUDA backend in this build). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "kernels/convert.h" /* defines: zs_float, zs_cvt_f32_bf16, zs_cvt_f32_f16, zs_elem_get, zs_elem_set */
#include "device/device.h"
#include "kernels/gradops.h" /* defines: zs_grad_accumulate, zs_grad_scale, zs_grad_convert, zs_grad_sumsq */
#include "kernels/threads.h"

static const zs_dtype pairs[][2] = {
    { ZS_DTYPE_FP32, ZS_DTYPE_FP32 }, { ZS_DTYPE_BF16, ZS_DTYPE_BF16 }, { ZS_DTYPE_BF16, ZS_DTYPE_FP32 },
    { ZS_DTYPE_FP16, ZS_DTYPE_FP16 }, { ZS_DTYPE_FP16, ZS_DTYPE_FP32 },
};
/* Lengths around the CUDA kernel's block of 1024 elements, an empty tensor, and 40 tensors in all (more
 * than the 32 one CUDA kernel takes). */
static const int64_t lengths[] = { 1, 0, 17, 1023, 1024, 1025, 4133, 70001 };
#define NLEN (int)(sizeof(lengths) / sizeof(lengths[0]))
#define NT 40

static uint64_t rng = 0x2545f4914f6cdd1dULL;
static uint32_t next32(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

/* Mostly ordinary values, with NaN, Inf, subnormals, huge and tiny ones. */
static float hostile(void)
{
    switch (next32() % 48) {
    case 0: return NAN;
    case 1: return -INFINITY;
    case 2: return zs_float(next32() & 0x807fffffu);
    case 3: return 3.0e38f;
    case 4: return -1.5e-38f;
    case 5: return -0.0f;
    default: return (float)(next32() & 0xffffff) / 8388608.0f - 1.0f;
    }
}

/* One tensor's arrays on the host (the reference's) and on the device (NULL entries where unused). */
struct tensor {
    int64_t n;
    void *h[5], *d[5];  /* param, grad, master, s1, s2 */
    size_t bytes[5];
};

static struct zs_device dev;

static void *dev_put(const void *h, size_t bytes)
{
    void *d = dev.ops->alloc(&dev, bytes);

    if (d && dev.ops->copy(&dev, d, h, bytes, ZS_COPY_H2D, NULL))
        return NULL;
    return d;
}

static void tensor_make(struct tensor *t, int64_t n, zs_dtype pdt, zs_dtype gdt, bool states)
{
    size_t psz = pdt == ZS_DTYPE_FP32 ? 4 : 2, gsz = gdt == ZS_DTYPE_FP32 ? 4 : 2;

    memset(t, 0, sizeof(*t));
    t->n = n;
    t->bytes[0] = (size_t)n * psz;
    t->bytes[1] = (size_t)n * gsz;
    t->bytes[2] = pdt == ZS_DTYPE_FP32 ? 0 : (size_t)n * 4;
    t->bytes[3] = t->bytes[4] = states ? (size_t)n * 4 : 0;
    for (int k = 0; k < 5; k++) {
        if (!t->bytes[k] && k != 0 && k != 1)
            continue;
        t->h[k] = malloc(t->bytes[k] + 4);
    }
    for (int64_t i = 0; i < n; i++) {
        float p = hostile(), g = hostile();
        if (pdt == ZS_DTYPE_FP32)
            ((float *)t->h[0])[i] = p;
        else
            ((uint16_t *)t->h[0])[i] = pdt == ZS_DTYPE_BF16 ? zs_cvt_f32_bf16(p) : zs_cvt_f32_f16(p);
        if (gdt == ZS_DTYPE_FP32)
            ((float *)t->h[1])[i] = g;
        else
            ((uint16_t *)t->h[1])[i] = gdt == ZS_DTYPE_BF16 ? zs_cvt_f32_bf16(g) : zs_cvt_f32_f16(g);
        if (t->h[2])
            ((float *)t->h[2])[i] = p;
        if (t->h[3]) {
            ((float *)t->h[3])[i] = hostile();
            ((float *)t->h[4])[i] = fabsf(hostile());
        }
    }
    for (int k = 0; k < 5; k++)
        if (t->h[k])
            t->d[k] = dev_put(t->h[k], t->bytes[k]);
}

static void tensor_free(struct tensor *t)
{
    for (int k = 0; k < 5; k++) {
        free(t->h[k]);
        if (t->d[k])
            dev.ops->free(&dev, t->d[k]);
    }
}

static struct zs_optim_bufs bufs_of(void *const a[5])
{
    return (struct zs_optim_bufs){ .param = a[0], .grad = a[1], .master = a[2], .s1 = a[3], .s2 = a[4] };
}

/* Every array the device wrote, against the reference's; the first difference is named. */
static void compare(const struct tensor *t, const char *what)
{
    static const char *const names[5] = { "param", "grad", "master", "s1", "s2" };

    for (int k = 0; k < 5; k++) {
        if (!t->h[k] || !t->bytes[k])
            continue;
        unsigned char *back = malloc(t->bytes[k]);
        bool ok = back && !dev.ops->copy(&dev, back, t->d[k], t->bytes[k], ZS_COPY_D2H, NULL) &&
                  !dev.ops->stream_sync(&dev, NULL);
        size_t at = 0;
        while (ok && at < t->bytes[k] && back[at] == ((unsigned char *)t->h[k])[at])
            at++;
        CHECK(ok && at == t->bytes[k], "%s, n %lld: %s differs from the scalar reference at byte %zu", what,
              (long long)t->n, names[k], at);
        free(back);
    }
}

static struct zs_optim_step step_of(int form, int rep)
{
    return (struct zs_optim_step){ .lr = 0.01f, .beta1 = 0.9f, .beta2 = 0.999f, .one_minus_beta1 = 0.1f,
                                   .one_minus_beta2 = 0.001f, .eps = 1e-8f, .weight_decay = 0.01f,
                                   .step_size = 0.0123f, .inv_sqrt_bc2 = 1.7f, .decay = 1e-4f,
                                   .grad_scale = rep ? 0.5f : 1.0f, .momentum = 0.9f, .dampening_c = 0.8f,
                                   .nesterov = form == 2, .first = rep == 0 };
}

/* One optimizer, dtype pair and form (SGD: 0 no momentum buffer, 1 momentum, 2 Nesterov): NT tensors in
 * one launch, two steps, against the scalar kernel run tensor by tensor on the host copies. */
static void t_optim(enum zs_kopt opt, zs_dtype pdt, zs_dtype gdt, int form)
{
    struct tensor t[NT];
    struct zs_optim_tensor lt[NT];
    zs_optim_fn ref = zs_optim_kernel(ZS_KPATH_SCALAR, opt, pdt, gdt);
    bool states = !(opt == ZS_KOPT_SGD && form == 0);
    char what[96];

    snprintf(what, sizeof(what), "%s %s/%s form %d", zs_kopt_name(opt), zs_dtype_name(pdt), zs_dtype_name(gdt), form);
    for (int i = 0; i < NT; i++) {
        tensor_make(&t[i], lengths[i % NLEN], pdt, gdt, states);
        lt[i] = (struct zs_optim_tensor){ .bufs = bufs_of(t[i].d), .n = t[i].n };
    }
    for (int rep = 0; rep < 2; rep++) {
        struct zs_optim_step s = step_of(form, rep);
        struct zs_optim_launch l = { .opt = opt, .pdt = pdt, .gdt = gdt, .step = &s, .t = lt, .count = NT };
        for (int i = 0; i < NT; i++) {
            struct zs_optim_bufs b = bufs_of(t[i].h);
            ref(&s, &b, 0, t[i].n);
        }
        zs_status st = dev.ops->optim(&dev, &l, NULL);
        CHECK(st == ZS_OK, "%s: launch failed: %s", what, zs_last_error());
    }
    for (int i = 0; i < NT; i++) {
        compare(&t[i], what);
        tensor_free(&t[i]);
    }
}

/* Zero-filled memory; H2D on one stream, D2D on a second once an event says the first is done, D2H. */
static void t_memory_streams(void)
{
    enum { N = 1 << 20 };
    unsigned char *h = malloc(N), *back = calloc(1, N);
    struct zs_dev_stream *s1 = NULL, *s2 = NULL;
    struct zs_dev_event *e = NULL;
    void *a = dev.ops->alloc(&dev, N), *b = dev.ops->alloc(&dev, N);
    bool ok;

    CHECK(a && b && h && back, "allocation failed");
    if (!a || !b || !h || !back)
        goto out;
    ok = !dev.ops->copy(&dev, back, a, N, ZS_COPY_D2H, NULL) && !dev.ops->stream_sync(&dev, NULL);
    for (size_t i = 0; ok && i < N; i++)
        ok = back[i] == 0;
    CHECK(ok, "device memory is not zero-filled");
    for (size_t i = 0; i < N; i++)
        h[i] = (unsigned char)(next32() | 1);
    ok = !dev.ops->stream_create(&dev, &s1) && !dev.ops->stream_create(&dev, &s2) &&
         !dev.ops->event_create(&dev, &e) && !dev.ops->copy(&dev, a, h, N, ZS_COPY_H2D, s1) &&
         !dev.ops->event_record(&dev, e, s1) && !dev.ops->stream_wait(&dev, s2, e) &&
         !dev.ops->copy(&dev, b, a, N, ZS_COPY_D2D, s2) && !dev.ops->copy(&dev, back, b, N, ZS_COPY_D2H, s2) &&
         !dev.ops->stream_sync(&dev, s2);
    CHECK(ok, "stream/event/copy call failed: %s", zs_last_error());
    CHECK(ok && !memcmp(h, back, N), "H2D -> event -> D2D -> D2H did not bring the bytes back");
out:
    if (e)
        dev.ops->event_free(&dev, e);
    if (s1)
        dev.ops->stream_free(&dev, s1);
    if (s2)
        dev.ops->stream_free(&dev, s2);
    if (a)
        dev.ops->free(&dev, a);
    if (b)
        dev.ops->free(&dev, b);
    free(h);
    free(back);
}

/* An event says when a created stream's copy has landed: done after the stream is synchronized, or after the
 * host waited for the event itself (event_sync, with no stream synchronized: what offload/nvme_optim.c does before
 * a read-ahead buffer takes a new read). The separate test device runs such copies late, so there the copy has
 * not landed (and the event is not done) before a sync or a wait: what makes a forgotten wait in the engine show
 * up in devpath_separate. */
static void t_event_query(bool late)
{
    enum { N = 4096 };
    unsigned char h[N], back[N] = { 0 };
    struct zs_dev_stream *s = NULL;
    struct zs_dev_event *e = NULL;
    void *a = dev.ops->alloc(&dev, N);
    bool ok, done = false, early = true;

    for (size_t i = 0; i < N; i++)
        h[i] = (unsigned char)(next32() | 1);
    ok = a && !dev.ops->stream_create(&dev, &s) && !dev.ops->event_create(&dev, &e) &&
         !dev.ops->copy(&dev, a, h, N, ZS_COPY_H2D, s) && !dev.ops->event_record(&dev, e, s);
    if (ok && late) {
        ok = !dev.ops->event_query(&dev, e, &early) &&
             !dev.ops->copy(&dev, back, a, N, ZS_COPY_D2H, NULL); /* the compute stream, without waiting */
        CHECK(ok && !early && back[0] == 0, "separate device: a created stream's copy landed before any wait");
    }
    ok = ok && !dev.ops->stream_wait(&dev, NULL, e) && !dev.ops->stream_sync(&dev, s) &&
         !dev.ops->event_query(&dev, e, &done) && !dev.ops->copy(&dev, back, a, N, ZS_COPY_D2H, NULL) &&
         !dev.ops->stream_sync(&dev, NULL);
    CHECK(ok && done && !memcmp(h, back, N), "event not done, or the bytes wrong, after the stream's sync: %s",
          ok ? "bytes" : zs_last_error());
    for (size_t i = 0; i < N; i++)
        h[i] = (unsigned char)(h[i] + 1);
    done = false;
    ok = ok && !dev.ops->copy(&dev, a, h, N, ZS_COPY_H2D, s) && !dev.ops->event_record(&dev, e, s) &&
         !dev.ops->event_sync(&dev, e) && !dev.ops->event_query(&dev, e, &done) &&
         !dev.ops->copy(&dev, back, a, N, ZS_COPY_D2H, NULL) && !dev.ops->stream_sync(&dev, NULL);
    CHECK(ok && done && !memcmp(h, back, N), "event not done, or the bytes wrong, after the host waited for it: %s",
          ok ? "bytes" : zs_last_error());
    if (e)
        dev.ops->event_free(&dev, e);
    if (s)
        dev.ops->stream_free(&dev, s);
    if (a)
        dev.ops->free(&dev, a);
}

/* n values of gen() as dtype dt on the host (fp32, or rounded to the 16-bit dtype by zs_elem_set). */
static void *array_of(zs_dtype dt, int64_t n, float (*gen)(void))
{
    unsigned char *h = malloc((size_t)n * (dt == ZS_DTYPE_FP32 ? 4 : 2) + 4);

    for (int64_t i = 0; h && i < n; i++)
        zs_elem_set(h, i, dt, gen());
    return h;
}

static void *hostile_array(zs_dtype dt, int64_t n)
{
    return array_of(dt, n, hostile);
}

/* n elements of device memory at d equal the host's at h, byte for byte. */
static bool same_bytes(const void *d, const void *h, size_t bytes)
{
    unsigned char *back = malloc(bytes + 1);
    bool ok = back && !dev.ops->copy(&dev, back, d, bytes, ZS_COPY_D2H, NULL) && !dev.ops->stream_sync(&dev, NULL) &&
              !memcmp(back, h, bytes);

    free(back);
    return ok;
}

/* The kernels around the optimizer (kernels/gradops.h) for one dtype, every length, against their CPU forms:
 * accumulate, scale, convert from fp32, zero-fill, and the norm's partials of all lengths in one call. */
static void t_gradops(zs_dtype dt)
{
    size_t esz = dt == ZS_DTYPE_FP32 ? 4 : 2;
    const void *dx[NLEN];
    int64_t n[NLEN];
    double want[NLEN], got[NLEN];
    void *keep[NLEN] = { 0 }, *keep_h[NLEN] = { 0 };
    const char *dn = zs_dtype_name(dt);

    for (int k = 0; k < NLEN; k++) {
        size_t b = (size_t)lengths[k] * esz;
        void *a = hostile_array(dt, lengths[k]), *c = hostile_array(dt, lengths[k]);
        float *f = hostile_array(ZS_DTYPE_FP32, lengths[k]);
        void *da = dev_put(a, b), *dc = dev_put(c, b), *df = dev_put(f, (size_t)lengths[k] * 4);
        void *conv = malloc(b + 4), *dconv = dev.ops->alloc(&dev, b);
        CHECK(a && c && f && da && dc && df && conv && dconv, "%s: allocation failed", dn);
        if (!a || !c || !f || !da || !dc || !df || !conv || !dconv)
            return;
        zs_grad_accumulate(a, c, dt, lengths[k]);
        CHECK(!dev.ops->accumulate(&dev, da, dc, dt, lengths[k], NULL) && same_bytes(da, a, b),
              "%s accumulate, n %lld: differs from the CPU form", dn, (long long)lengths[k]);
        zs_grad_scale(a, dt, lengths[k], 0.3f);
        CHECK(!dev.ops->scale(&dev, da, dt, lengths[k], 0.3f, NULL) && same_bytes(da, a, b),
              "%s scale, n %lld: differs from the CPU form", dn, (long long)lengths[k]);
        zs_grad_convert(conv, dt, f, lengths[k]);
        CHECK(!dev.ops->convert(&dev, dconv, dt, df, lengths[k], NULL) && same_bytes(dconv, conv, b),
              "%s convert, n %lld: differs from the CPU form", dn, (long long)lengths[k]);
        memset(c, 0, b);
        CHECK(!dev.ops->zero(&dev, dc, b, NULL) && same_bytes(dc, c, b), "%s zero, n %lld", dn, (long long)lengths[k]);
        /* the partials: of the scaled values, finite ones only for some lengths, Inf/NaN kept for others */
        dx[k] = da;
        n[k] = lengths[k];
        want[k] = zs_grad_sumsq(a, dt, lengths[k]);
        keep[k] = da;
        keep_h[k] = a;
        free(c);
        free(f);
        free(conv);
        dev.ops->free(&dev, dc);
        dev.ops->free(&dev, df);
        dev.ops->free(&dev, dconv);
    }
    CHECK(!dev.ops->sumsq(&dev, dx, n, NLEN, dt, got, NULL), "%s sumsq failed: %s", dn, zs_last_error());
    for (int k = 0; k < NLEN; k++) {
        CHECK(!memcmp(&got[k], &want[k], sizeof(double)), "%s sumsq, n %lld: %.17g, the CPU form %.17g", dn,
              (long long)n[k], got[k], want[k]);
        dev.ops->free(&dev, keep[k]);
        free(keep_h[k]);
    }
}

/* The norm's order as gradops.h states it, spelled out here on its own: segments of ZS_SUMSQ_SEG elements,
 * each summed left to right in double; the segments of each group of ZS_SUMSQ_GROUP folded left to right; the
 * groups folded left to right. The reference, the CPU's pooled form and the device must all give its bits. */
static double order_sumsq(const void *x, zs_dtype dt, int64_t n)
{
    const int64_t group = (int64_t)ZS_SUMSQ_SEG * ZS_SUMSQ_GROUP;
    double total = 0.0;

    for (int64_t g = 0; g < n; g += group) {
        double grp = 0.0;
        for (int64_t s = g; s < n && s < g + group; s += ZS_SUMSQ_SEG) {
            double seg = 0.0;
            for (int64_t i = s; i < n && i < s + ZS_SUMSQ_SEG; i++) {
                double v = (double)zs_elem_get(x, i, (int)dt);
                seg += v * v;
            }
            grp += seg;
        }
        total += grp;
    }
    return total;
}

/* A finite value over a wide range of magnitudes (2^-12 .. 2^7), so that any other order of the additions
 * rounds differently. */
static float spread(void)
{
    float v = ldexpf((float)(next32() & 0xffffff) / 16777216.0f + 0.5f, (int)(next32() % 20) - 12);

    return next32() & 1 ? -v : v;
}

/* Lengths at the segment and group boundaries, all in one call: the reference, and the device (the CPU's pooled
 * form on cpu and separate, the kernels on cuda) give the order's bits for each tensor. */
static void t_norm_order(zs_dtype dt)
{
    const int64_t S = ZS_SUMSQ_SEG, G = (int64_t)ZS_SUMSQ_SEG * ZS_SUMSQ_GROUP;
    const int64_t len[] = { 0, 1, S - 1, S, S + 1, 17 * S + 5, G - 1, G, G + S + 1, 2 * G + 3 };
    enum { NL = sizeof(len) / sizeof(len[0]) };
    size_t esz = dt == ZS_DTYPE_FP32 ? 4 : 2;
    void *h[NL], *d[NL];
    const void *dx[NL];
    double got[NL];
    const char *dn = zs_dtype_name(dt);
    bool ok = true;

    for (int k = 0; k < NL; k++) {
        h[k] = array_of(dt, len[k], spread);
        d[k] = h[k] ? dev_put(h[k], (size_t)len[k] * esz) : NULL;
        dx[k] = d[k];
        ok = ok && d[k];
    }
    CHECK(ok, "%s: allocation failed", dn);
    CHECK(ok && !dev.ops->sumsq(&dev, dx, len, NL, dt, got, NULL), "%s sumsq failed: %s", dn, zs_last_error());
    for (int k = 0; ok && k < NL; k++) {
        double want = order_sumsq(h[k], dt, len[k]), ref = zs_grad_sumsq(h[k], dt, len[k]);
        CHECK(!memcmp(&ref, &want, sizeof(double)), "%s reference, n %lld: %.17g, the fixed order %.17g", dn,
              (long long)len[k], ref, want);
        CHECK(!memcmp(&got[k], &want, sizeof(double)), "%s sumsq on the device, n %lld: %.17g, the fixed order %.17g",
              dn, (long long)len[k], got[k], want);
    }
    for (int k = 0; k < NL; k++) {
        if (d[k])
            dev.ops->free(&dev, d[k]);
        free(h[k]);
    }
}

int main(int argc, char **argv)
{
    const char *arg = argc > 1 ? argv[1] : "cpu";
    const char *name = !strcmp(arg, "separate") ? "cpu" : arg;
    const struct zs_device_ops *ops = !strcmp(name, "cuda") ? &zs_device_cuda_ops : &zs_device_cpu_ops;
    struct zs_pool *pool = NULL;
    struct zs_pool_opts po = { .threads = 2, .local_size = 1 };

    if (zs_pool_create(&pool, &po, NULL, 0))
        return 1;
    if (!strcmp(arg, "separate")) /* the CPU's kernels behind the separate test device's copies */
        setenv("ZS_TEST_DEVICE", "separate", 1);
    if (zs_device_open(&dev, name, "test_device", pool, zs_kpath_best(), 0, 1)) {
        bool none = ops->count() <= 0;
        printf("%s: %s device did not open: %s\n", none ? "SKIP" : "FAIL", name, zs_last_error());
        zs_pool_free(pool);
        return none ? 77 : 1;
    }
    /* the program's stream (zs_cuda_stream): the GPU opens one, the CPU has none */
    CHECK((dev.compute != NULL) == (dev.kind == ZS_DEV_CUDA), "%s: compute stream %p", name, (void *)dev.compute);
    t_memory_streams();
    t_event_query(!strcmp(arg, "separate"));
    for (int dt = 0; dt < 3; dt++)
        t_gradops((zs_dtype)dt);
    for (int dt = 0; dt < 3; dt++)
        t_norm_order((zs_dtype)dt);
    for (int opt = 0; opt < ZS_KOPT_COUNT; opt++)
        for (size_t p = 0; p < sizeof(pairs) / sizeof(pairs[0]); p++)
            for (int form = 0; form < (opt == ZS_KOPT_SGD ? 3 : 1); form++)
                t_optim((enum zs_kopt)opt, pairs[p][0], pairs[p][1], form);
    zs_device_close(&dev);
    zs_pool_free(pool);
    return zs_test_summary(arg);
}
