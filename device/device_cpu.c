/* device_cpu.c - the CPU as the device: host memory, memcpy, and the optimizer kernels of kernels/ run
 * through the rank's thread pool. Work runs on the caller, in call order, so streams and events are
 * tokens and synchronizing is free. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"   /* defines: zs_fail */
#include "base/test_hooks.h"
#include "kernels/gradops.h" /* defines: zs_grad_accumulate, zs_grad_scale, zs_grad_sumsq_pool, zs_grad_convert */
#include "kernels/threads.h" /* defines: zs_pool_run */
#include "device.h"

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

static zs_status cpu_event_query(struct zs_device *d, struct zs_dev_event *e, bool *done)
{
    *done = true;
    return ZS_OK;
}

static zs_status cpu_event_sync(struct zs_device *d, struct zs_dev_event *e)
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
        job.step = l->t[i].step ? l->t[i].step : l->step;
        zs_pool_run(d->pool, optim_chunk, &job, l->t[i].n);
    }
    return ZS_OK;
}

static zs_status cpu_zero(struct zs_device *d, void *p, size_t bytes, struct zs_dev_stream *s)
{
    if (bytes)
        memset(p, 0, bytes);
    return ZS_OK;
}

static zs_status cpu_accumulate(struct zs_device *d, void *dst, const void *src, zs_dtype dt, int64_t n,
                                struct zs_dev_stream *s)
{
    zs_grad_accumulate(dst, src, dt, n);
    return ZS_OK;
}

static zs_status cpu_scale(struct zs_device *d, void *x, zs_dtype dt, int64_t n, float f, struct zs_dev_stream *s)
{
    zs_grad_scale(x, dt, n, f);
    return ZS_OK;
}

static zs_status cpu_convert(struct zs_device *d, void *dst, zs_dtype dt, const float *src, int64_t n,
                             struct zs_dev_stream *s)
{
    zs_grad_convert(dst, dt, src, n);
    return ZS_OK;
}

static zs_status cpu_sumsq(struct zs_device *d, const void *const *x, const int64_t *n, int32_t count, zs_dtype dt,
                           double *out, struct zs_dev_stream *s)
{
    if (zs_grad_sumsq_pool(d->pool, x, n, count, dt, out))
        return zs_fail(ZS_ERR_NOMEM, "the gradient norm: out of memory for its segment sums");
    return ZS_OK;
}

static zs_status cpu_host_register(struct zs_device *d, void *p, size_t bytes)
{
    return ZS_OK;
}

static void cpu_host_unregister(struct zs_device *d, void *p)
{
}

const struct zs_device_ops zs_device_cpu_ops = {
    .name = "cpu", .count = cpu_count, .open = cpu_open, .close = cpu_close, .alloc = cpu_alloc, .free = cpu_free, .copy = cpu_copy,
    .stream_create = cpu_stream_create, .stream_free = cpu_stream_free, .stream_sync = cpu_stream_sync,
    .event_create = cpu_event_create, .event_free = cpu_event_free, .event_record = cpu_event_record,
    .event_query = cpu_event_query, .event_sync = cpu_event_sync, .stream_wait = cpu_stream_wait, .optim = cpu_optim,
    .zero = cpu_zero, .accumulate = cpu_accumulate,
    .scale = cpu_scale, .convert = cpu_convert, .sumsq = cpu_sumsq, .host_register = cpu_host_register,
    .host_unregister = cpu_host_unregister,
};

/* ---------------------------------------------------------------- the separate CPU device (a test hook)
 * Host memory handed out at an address the host cannot dereference: bit 62 set, outside every canonical
 * x86-64 and AArch64 user address, so a load or store that skips the copy ops faults at once (and ASan
 * reports it), while the engine's pointer arithmetic inside a buffer still works. Its ops take the bit off;
 * copies also check their direction against where each side lives, as a GPU's would have to be right.
 *
 * Its streams are late, as a GPU's may be: the compute stream (NULL) runs each operation at once, but a
 * stream made by stream_create (the communication stream) keeps its copies queued until the host
 * synchronizes it, another stream waits for an event recorded after them, a second query finds such an event
 * pending (a GPU would get there by itself), or memory is freed (cudaFree waits for the device too). A consumer that
 * reads a collective's result without waiting for its event reads stale bytes, and the engine's oracle tests
 * catch it. Other operations on such a stream run its queue first. */

struct sep_copy_op {
    void *dst;
    const void *src;
    size_t bytes;
};

struct sep_stream {
    struct sep_copy_op *q;      /* queued, not yet run: operations ran .. queued-1 */
    size_t cap;
    uint64_t queued, ran;
};

struct sep_event {
    struct sep_stream *s;       /* NULL: recorded on the compute stream, complete at once */
    uint64_t at;                /* the stream's work up to here */
    uint32_t polls;             /* queries that found it pending since it was recorded */
};

struct sep_state {
    struct sep_stream **streams;
    int32_t n, cap;
};

/* Runs s's queued copies up to (not including) operation `to`. */
static void sep_run(struct sep_stream *s, uint64_t to)
{
    uint64_t k, left;

    if (!s || to <= s->ran)
        return;
    k = (to < s->queued ? to : s->queued) - s->ran;
    for (uint64_t i = 0; i < k; i++)
        memmove(s->q[i].dst, s->q[i].src, s->q[i].bytes);
    left = s->queued - s->ran - k;
    memmove(s->q, s->q + k, (size_t)left * sizeof(*s->q));
    s->ran += k;
}

static void sep_drain(struct sep_stream *s)
{
    if (s)
        sep_run(s, s->queued);
}

static void sep_drain_all(struct zs_device *d)
{
    struct sep_state *st = d->priv;

    for (int32_t i = 0; st && i < st->n; i++)
        sep_drain(st->streams[i]);
}

static zs_status sep_open(struct zs_device *d, int32_t local_rank, int32_t local_size)
{
    d->priv = calloc(1, sizeof(struct sep_state));
    if (!d->priv)
        return zs_fail(ZS_ERR_NOMEM, "separate test device: out of memory");
    return cpu_open(d, local_rank, local_size);
}

static void sep_close(struct zs_device *d)
{
    struct sep_state *st = d->priv;

    if (st) {
        sep_drain_all(d);
        free(st->streams);
        free(st);
    }
    d->priv = NULL;
}

static zs_status sep_stream_create(struct zs_device *d, struct zs_dev_stream **out)
{
    struct sep_state *st = d->priv;
    struct sep_stream *s;

    if (st->n == st->cap) {
        int32_t cap = st->cap ? 2 * st->cap : 4;
        struct sep_stream **g = realloc(st->streams, (size_t)cap * sizeof(*g));
        if (!g)
            return zs_fail(ZS_ERR_NOMEM, "separate test device: out of memory");
        st->streams = g;
        st->cap = cap;
    }
    s = calloc(1, sizeof(*s));
    if (!s)
        return zs_fail(ZS_ERR_NOMEM, "separate test device: out of memory");
    st->streams[st->n++] = s;
    *out = (struct zs_dev_stream *)s;
    return ZS_OK;
}

static void sep_stream_free(struct zs_device *d, struct zs_dev_stream *h)
{
    struct sep_state *st = d->priv;
    struct sep_stream *s = (struct sep_stream *)h;

    if (!s)
        return;
    sep_drain(s);
    for (int32_t i = 0; i < st->n; i++)
        if (st->streams[i] == s) {
            st->streams[i] = st->streams[--st->n];
            break;
        }
    free(s->q);
    free(s);
}

static zs_status sep_stream_sync(struct zs_device *d, struct zs_dev_stream *s)
{
    sep_drain((struct sep_stream *)s);
    return ZS_OK;
}

static zs_status sep_event_create(struct zs_device *d, struct zs_dev_event **e)
{
    *e = calloc(1, sizeof(struct sep_event));
    return *e ? ZS_OK : zs_fail(ZS_ERR_NOMEM, "separate test device: out of memory");
}

static void sep_event_free(struct zs_device *d, struct zs_dev_event *e)
{
    free(e);
}

static zs_status sep_event_record(struct zs_device *d, struct zs_dev_event *h, struct zs_dev_stream *s)
{
    struct sep_event *e = (struct sep_event *)h;

    e->s = (struct sep_stream *)s;
    e->at = e->s ? e->s->queued : 0;
    e->polls = 0;
    return ZS_OK;
}

/* Not done while the event's work is queued. The first query leaves it queued, so a consumer that reads after
 * one "not done" without waiting still reads stale bytes; a later one runs it, as a GPU gets through its queue by
 * itself, so a host that keeps polling sees the event done (a query that never ran anything would leave a
 * polling loop, hybrid sharding's sum across the groups, spinning until its deadline). */
static zs_status sep_event_query(struct zs_device *d, struct zs_dev_event *h, bool *done)
{
    struct sep_event *e = (struct sep_event *)h;

    *done = !e->s || e->s->ran >= e->at;
    if (!*done && ++e->polls > 1)
        sep_run(e->s, e->at);
    return ZS_OK;
}

static zs_status sep_event_sync(struct zs_device *d, struct zs_dev_event *h)
{
    const struct sep_event *e = (const struct sep_event *)h;

    if (e->s)
        sep_run(e->s, e->at);
    return ZS_OK;
}

/* The waiting stream could only run later than the host does here: the event's work is run now. */
static zs_status sep_stream_wait(struct zs_device *d, struct zs_dev_stream *s, struct zs_dev_event *h)
{
    return sep_event_sync(d, h);
}

static zs_status sep_enqueue(struct sep_stream *s, void *dst, const void *src, size_t bytes)
{
    size_t n = (size_t)(s->queued - s->ran);

    if (n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 16;
        struct sep_copy_op *g = realloc(s->q, cap * sizeof(*g));
        if (!g)
            return zs_fail(ZS_ERR_NOMEM, "separate test device: out of memory");
        s->q = g;
        s->cap = cap;
    }
    s->q[n] = (struct sep_copy_op){ .dst = dst, .src = src, .bytes = bytes };
    s->queued++;
    return ZS_OK;
}

#define SEP_TAG ((uintptr_t)1 << 62)

static bool sep_tagged(const void *p) { return ((uintptr_t)p & SEP_TAG) != 0; }
static void *sep_host(const void *p) { return (void *)((uintptr_t)p & ~SEP_TAG); }

/* 256-byte aligned and zero-filled, as cudaMalloc's memory (the device arena's blocks inherit the alignment). */
static void *sep_alloc(struct zs_device *d, size_t bytes)
{
    void *p = NULL;
    size_t sz = bytes ? (bytes + 255) / 256 * 256 : 256;

    if (posix_memalign(&p, 256, sz))
        return NULL;
    memset(p, 0, sz);
    return (void *)((uintptr_t)p | SEP_TAG);
}

static void sep_free(struct zs_device *d, void *p)
{
    sep_drain_all(d);
    free(sep_host(p));
}

static zs_status sep_copy(struct zs_device *d, void *dst, const void *src, size_t bytes, enum zs_copy_dir dir,
                          struct zs_dev_stream *s)
{
    bool want_dst = dir != ZS_COPY_D2H, want_src = dir != ZS_COPY_H2D;
    static const char *const names[] = { "host to device", "device to host", "device to device" };

    if (bytes && (sep_tagged(dst) != want_dst || sep_tagged(src) != want_src))
        return zs_fail(ZS_ERR_INVALID, "separate test device: a %s copy from %s to %s memory", names[dir],
                       sep_tagged(src) ? "device" : "host", sep_tagged(dst) ? "device" : "host");
    if (s && bytes)
        return sep_enqueue((struct sep_stream *)s, sep_host(dst), sep_host(src), bytes);
    return cpu_copy(d, sep_host(dst), sep_host(src), bytes, dir, s);
}

/* Device memory only: a host pointer here is an engine bug a GPU would fault on. */
static zs_status sep_check(const void *p, const char *what)
{
    if (p && !sep_tagged(p))
        return zs_fail(ZS_ERR_INVALID, "separate test device: %s given host memory", what);
    return ZS_OK;
}

/* Every non-empty tensor's arrays must be device memory. */
static zs_status sep_check_bufs(const struct zs_optim_bufs *b)
{
    const void *p[5] = { b->param, b->grad, b->master, b->s1, b->s2 };

    for (int k = 0; k < 5; k++)
        if (sep_check(p[k], "the optimizer"))
            return ZS_ERR_INVALID;
    return ZS_OK;
}

static zs_status sep_optim(struct zs_device *d, const struct zs_optim_launch *l, struct zs_dev_stream *s)
{
    struct zs_optim_tensor *t = calloc((size_t)(l->count ? l->count : 1), sizeof(*t));
    struct zs_optim_launch h = *l;
    zs_status st = ZS_OK;

    if (!t)
        return zs_fail(ZS_ERR_NOMEM, "separate test device: out of memory");
    sep_drain((struct sep_stream *)s);
    for (int32_t i = 0; i < l->count && !st; i++) {
        const struct zs_optim_bufs *b = &l->t[i].bufs;
        t[i] = l->t[i];
        if (!l->t[i].n)
            continue;
        st = sep_check_bufs(b);
        t[i].bufs.param = sep_host(b->param);
        t[i].bufs.grad = sep_host(b->grad);
        t[i].bufs.master = sep_host(b->master);
        t[i].bufs.s1 = sep_host(b->s1);
        t[i].bufs.s2 = sep_host(b->s2);
    }
    h.t = t;
    if (!st)
        st = cpu_optim(d, &h, s);
    free(t);
    return st;
}

static zs_status sep_zero(struct zs_device *d, void *p, size_t bytes, struct zs_dev_stream *s)
{
    if (sep_check(p, "zero"))
        return ZS_ERR_INVALID;
    sep_drain((struct sep_stream *)s);
    return cpu_zero(d, sep_host(p), bytes, s);
}

static zs_status sep_accumulate(struct zs_device *d, void *dst, const void *src, zs_dtype dt, int64_t n,
                                struct zs_dev_stream *s)
{
    if (sep_check(dst, "accumulate") || sep_check(src, "accumulate"))
        return ZS_ERR_INVALID;
    sep_drain((struct sep_stream *)s);
    return cpu_accumulate(d, sep_host(dst), sep_host(src), dt, n, s);
}

static zs_status sep_scale(struct zs_device *d, void *x, zs_dtype dt, int64_t n, float f, struct zs_dev_stream *s)
{
    if (sep_check(x, "scale"))
        return ZS_ERR_INVALID;
    sep_drain((struct sep_stream *)s);
    return cpu_scale(d, sep_host(x), dt, n, f, s);
}

static zs_status sep_convert(struct zs_device *d, void *dst, zs_dtype dt, const float *src, int64_t n,
                             struct zs_dev_stream *s)
{
    if (sep_check(dst, "convert") || sep_check(src, "convert"))
        return ZS_ERR_INVALID;
    sep_drain((struct sep_stream *)s);
    return cpu_convert(d, sep_host(dst), dt, sep_host(src), n, s);
}

static zs_status sep_sumsq(struct zs_device *d, const void *const *x, const int64_t *n, int32_t count, zs_dtype dt,
                           double *out, struct zs_dev_stream *s)
{
    const void **h = malloc((size_t)(count > 0 ? count : 1) * sizeof(*h));
    zs_status st = h ? ZS_OK : zs_fail(ZS_ERR_NOMEM, "separate test device: out of memory");

    sep_drain((struct sep_stream *)s);
    for (int32_t k = 0; !st && k < count; k++) {
        if (n[k] && sep_check(x[k], "sumsq"))
            st = ZS_ERR_INVALID;
        h[k] = sep_host(x[k]);
    }
    if (!st)
        st = cpu_sumsq(d, h, n, count, dt, out, s);
    free(h);
    return st;
}

static int32_t sep_count(void)
{
    return 1;
}

/* Pinned host ranges, as the CUDA runtime keeps them: an overlapping registration is refused, an unregister
 * must name a registered start. */
#define SEP_PINS 64
static struct { const char *p; size_t n; } sep_pins[SEP_PINS];
static int sep_npins, sep_bad_unpin;

static zs_status sep_host_register(struct zs_device *d, void *p, size_t bytes)
{
    const char *c = p, *hook = getenv(ZS_TEST_HOOK_PIN_FAIL);

    if (!p || !bytes || sep_tagged(p))
        return zs_fail(ZS_ERR_INVALID, "separate test device: pinning %zu bytes at %p, which is not host memory", bytes, p);
    if (hook && *hook && strcmp(hook, "0"))
        return zs_fail(ZS_ERR_NOMEM, "separate test device: pinning %zu bytes refused (ZS_TEST_PIN_FAIL)", bytes);
    for (int i = 0; i < sep_npins; i++)
        if (c < sep_pins[i].p + sep_pins[i].n && sep_pins[i].p < c + bytes)
            return zs_fail(ZS_ERR_INVALID, "separate test device: %zu bytes at %p overlap a pinned range", bytes, p);
    if (sep_npins == SEP_PINS)
        return zs_fail(ZS_ERR_NOMEM, "separate test device: more than %d pinned ranges", SEP_PINS);
    sep_pins[sep_npins].p = c;
    sep_pins[sep_npins++].n = bytes;
    return ZS_OK;
}

static void sep_host_unregister(struct zs_device *d, void *p)
{
    for (int i = 0; i < sep_npins; i++)
        if (sep_pins[i].p == p) {
            sep_pins[i] = sep_pins[--sep_npins];
            return;
        }
    sep_bad_unpin = 1;
}

bool zs_device_separate_pinned(const void *p, size_t bytes)
{
    const char *c = p;

    for (int i = 0; i < sep_npins; i++)
        if (c >= sep_pins[i].p && bytes <= sep_pins[i].n && (size_t)(c - sep_pins[i].p) <= sep_pins[i].n - bytes)
            return true;
    return false;
}

int zs_device_separate_pin_count(void)
{
    return sep_bad_unpin ? -1 : sep_npins;
}

/* A test may name a PCI bus id for the device (ZS_TEST_DEVICE_PCI), to drive the placement near it. */
static zs_status sep_pci_bus_id(struct zs_device *d, char *buf, size_t len)
{
    const char *id = getenv(ZS_TEST_HOOK_DEVICE_PCI);

    if (!id || !*id)
        return zs_fail(ZS_ERR_UNSUPPORTED, "separate test device: no PCI bus id (ZS_TEST_DEVICE_PCI)");
    snprintf(buf, len, "%s", id);
    return ZS_OK;
}

const struct zs_device_ops zs_device_separate_ops = {
    .name = "cpu (separate test device)", .count = sep_count, .open = sep_open, .close = sep_close,
    .alloc = sep_alloc, .free = sep_free, .copy = sep_copy, .stream_create = sep_stream_create,
    .stream_free = sep_stream_free, .stream_sync = sep_stream_sync, .event_create = sep_event_create,
    .event_free = sep_event_free, .event_record = sep_event_record, .event_query = sep_event_query,
    .event_sync = sep_event_sync, .stream_wait = sep_stream_wait,
    .optim = sep_optim, .zero = sep_zero, .accumulate = sep_accumulate, .scale = sep_scale, .convert = sep_convert,
    .sumsq = sep_sumsq, .host_register = sep_host_register, .host_unregister = sep_host_unregister,
    .pci_bus_id = sep_pci_bus_id,
};
