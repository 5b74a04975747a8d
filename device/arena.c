/* arena.c - the per-rank device arena: a few large device allocations carved into aligned blocks by a
 * first-fit sub-allocator that works on offsets only (so it is tested without any device). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"  /* defines: zs_fail */
#include "arena.h"
#include "device.h" /* defines: struct zs_device, its ops */

/* ---------------------------------------------------------------- the sub-allocator */

int zs_suballoc_init(struct zs_suballoc *a, uint64_t size, uint64_t align)
{
    memset(a, 0, sizeof(*a));
    if (!align || (align & (align - 1)) || size % align)
        return -EINVAL;
    a->size = size;
    a->align = align;
    if (!size)
        return 0;
    a->free = malloc(4 * sizeof(*a->free));
    if (!a->free)
        return -ENOMEM;
    a->cap = 4;
    a->free[0] = (struct zs_span){ 0, size };
    a->nfree = 1;
    return 0;
}

void zs_suballoc_fini(struct zs_suballoc *a)
{
    free(a->free);
    memset(a, 0, sizeof(*a));
}

int zs_suballoc_round(const struct zs_suballoc *a, uint64_t bytes, uint64_t *rounded)
{
    uint64_t mask = a->align - 1;

    if (!bytes)
        bytes = 1;
    if (bytes > UINT64_MAX - mask)
        return -EOVERFLOW;
    *rounded = (bytes + mask) & ~mask;
    return 0;
}

int zs_suballoc_alloc(struct zs_suballoc *a, uint64_t bytes, uint64_t *off)
{
    uint64_t need;
    int rc = zs_suballoc_round(a, bytes, &need);

    if (rc)
        return rc;
    for (int32_t i = 0; i < a->nfree; i++) {
        struct zs_span *s = &a->free[i];
        if (s->len < need)
            continue;
        *off = s->off;
        s->off += need;
        s->len -= need;
        if (!s->len) {
            memmove(s, s + 1, (size_t)(a->nfree - i - 1) * sizeof(*s));
            a->nfree--;
        }
        a->used += need;
        a->peak = a->used > a->peak ? a->used : a->peak;
        return 0;
    }
    return -ENOSPC;
}

static int grow(struct zs_suballoc *a)
{
    int32_t cap = a->cap ? a->cap * 2 : 4;
    struct zs_span *p;

    if (a->nfree < a->cap)
        return 0;
    p = realloc(a->free, (size_t)cap * sizeof(*p));
    if (!p)
        return -ENOMEM;
    a->free = p;
    a->cap = cap;
    return 0;
}

int zs_suballoc_free(struct zs_suballoc *a, uint64_t off, uint64_t bytes)
{
    uint64_t len;
    int32_t i = 0;
    int rc = zs_suballoc_round(a, bytes, &len);

    if (rc || off % a->align || off > a->size || len > a->size - off)
        return rc ? rc : -EINVAL;
    while (i < a->nfree && a->free[i].off < off)
        i++;
    /* the block may touch its free neighbours but never overlap them */
    if ((i > 0 && a->free[i - 1].off + a->free[i - 1].len > off) || (i < a->nfree && off + len > a->free[i].off))
        return -EINVAL;
    bool left = i > 0 && a->free[i - 1].off + a->free[i - 1].len == off;
    bool right = i < a->nfree && off + len == a->free[i].off;
    if (left && right) {
        a->free[i - 1].len += len + a->free[i].len;
        memmove(&a->free[i], &a->free[i + 1], (size_t)(a->nfree - i - 1) * sizeof(a->free[0]));
        a->nfree--;
    } else if (left) {
        a->free[i - 1].len += len;
    } else if (right) {
        a->free[i].off = off;
        a->free[i].len += len;
    } else {
        rc = grow(a);
        if (rc)
            return rc;
        memmove(&a->free[i + 1], &a->free[i], (size_t)(a->nfree - i) * sizeof(a->free[0]));
        a->free[i] = (struct zs_span){ off, len };
        a->nfree++;
    }
    a->used -= len;
    return 0;
}

uint64_t zs_suballoc_largest_free(const struct zs_suballoc *a)
{
    uint64_t m = 0;

    for (int32_t i = 0; i < a->nfree; i++)
        m = a->free[i].len > m ? a->free[i].len : m;
    return m;
}

/* ---------------------------------------------------------------- the device arena */

zs_status zs_dev_arena_open(struct zs_dev_arena *a, struct zs_device *d, const uint64_t *bytes,
                            const char *const *names, int32_t n)
{
    memset(a, 0, sizeof(*a));
    if (n < 0 || n > ZS_ARENA_REGIONS)
        return zs_fail(ZS_ERR_INVALID, "device arena: %d regions (at most %d)", n, ZS_ARENA_REGIONS);
    a->dev = d;
    a->n = n;
    a->open = true;
    for (int32_t i = 0; i < n; i++) {
        struct zs_dev_region *r = &a->r[i];
        uint64_t sz = 0;
        r->name = names[i];
        if (bytes[i] && bytes[i] > UINT64_MAX - (ZS_ARENA_ALIGN - 1)) {
            zs_dev_arena_close(a);
            return zs_fail(ZS_ERR_INVALID, "device arena: the %s region's %llu bytes overflow", names[i],
                           (unsigned long long)bytes[i]);
        }
        sz = (bytes[i] + ZS_ARENA_ALIGN - 1) / ZS_ARENA_ALIGN * ZS_ARENA_ALIGN;
        if (zs_suballoc_init(&r->sa, sz, ZS_ARENA_ALIGN)) {
            zs_dev_arena_close(a);
            return zs_fail(ZS_ERR_NOMEM, "device arena: out of host memory for the %s region's free list", names[i]);
        }
        if (!sz)
            continue;
        r->base = d->ops->alloc(d, (size_t)sz);
        if (!r->base) {
            zs_dev_arena_close(a);
            return zs_fail(ZS_ERR_NOMEM, "device arena: the device (%s) could not allocate the %s region of %llu bytes",
                           d->ops->name, names[i], (unsigned long long)sz);
        }
    }
    return ZS_OK;
}

void *zs_dev_arena_alloc(struct zs_dev_arena *a, int32_t i, uint64_t bytes, bool zero)
{
    struct zs_dev_region *r;
    uint64_t off = 0, rounded = 0;
    int rc;

    if (i < 0 || i >= a->n) {
        zs_fail(ZS_ERR_INVALID, "device arena: no region %d", i);
        return NULL;
    }
    r = &a->r[i];
    rc = zs_suballoc_alloc(&r->sa, bytes, &off);
    if (rc) {
        zs_suballoc_round(&r->sa, bytes, &rounded);
        zs_fail(ZS_ERR_NOMEM, "device arena: %llu bytes (%llu aligned) do not fit the %s region sized by the memory "
                "plan: %llu bytes, %llu in use, largest free block %llu%s", (unsigned long long)bytes,
                (unsigned long long)rounded, r->name, (unsigned long long)r->sa.size, (unsigned long long)r->sa.used,
                (unsigned long long)zs_suballoc_largest_free(&r->sa), rc == -ENOMEM ? " (out of host memory)" : "");
        return NULL;
    }
    void *p = r->base + off;
    if (!zero)
        return p;
    /* a block given back and handed out again holds its last owner's bytes */
    zs_status st = a->dev->ops->zero(a->dev, p, (size_t)bytes, a->dev->compute);
    a->zeroed[i] += st ? 0 : bytes;
    if (st) {
        zs_suballoc_free(&r->sa, off, bytes);
        zs_error_prefix("device arena: zero-filling %llu bytes of the %s region", (unsigned long long)bytes, r->name);
        return NULL;
    }
    return p;
}

zs_status zs_dev_arena_free(struct zs_dev_arena *a, int32_t i, void *p, uint64_t bytes)
{
    struct zs_dev_region *r = i >= 0 && i < a->n ? &a->r[i] : NULL;
    char *c = p;

    if (!r || !r->base || c < r->base || c >= r->base + r->sa.size ||
        zs_suballoc_free(&r->sa, (uint64_t)(c - r->base), bytes))
        return zs_fail(ZS_ERR_INVALID, "device arena: freeing %llu bytes at %p: not a block of the %s region",
                       (unsigned long long)bytes, p, r ? r->name : "(no such)");
    return ZS_OK;
}

void zs_dev_arena_close(struct zs_dev_arena *a)
{
    for (int32_t i = 0; i < a->n; i++) {
        if (a->r[i].base)
            a->dev->ops->free(a->dev, a->r[i].base);
        zs_suballoc_fini(&a->r[i].sa);
    }
    memset(a, 0, sizeof(*a));
}

uint64_t zs_dev_arena_size(const struct zs_dev_arena *a)
{
    uint64_t s = 0;

    for (int32_t i = 0; i < a->n; i++)
        s += a->r[i].sa.size;
    return s;
}

uint64_t zs_dev_arena_used(const struct zs_dev_arena *a)
{
    uint64_t s = 0;

    for (int32_t i = 0; i < a->n; i++)
        s += a->r[i].sa.used;
    return s;
}
