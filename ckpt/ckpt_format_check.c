/* ckpt_format_check.c - the manifest's checks across tables, after each field has parsed: names unique,
 * parameters disjoint, segments covering every unit once per kind and disjoint in their files. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_format_impl.h" /* defines: struct mp, zs_ckpt_mp_fail */

// ----------------------------------------------------------------------------------- cross-checks

/* A range [begin, end) of something, grouped by (k1, k2): segment elements, segment bytes, parameters. */
struct span {
    int64_t k1, k2, begin, end, idx;
};

enum span_what { SPAN_SEG, SPAN_SEG_BYTES, SPAN_PARAM };

static int span_cmp(const void *a, const void *b)
{
    const struct span *x = a, *y = b;

    if (x->k1 != y->k1)
        return x->k1 < y->k1 ? -1 : 1;
    if (x->k2 != y->k2)
        return x->k2 < y->k2 ? -1 : 1;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    return (x->idx > y->idx) - (x->idx < y->idx);
}

static void span_path(const struct zs_ckpt_manifest *m, enum span_what w, int64_t idx, char *buf, size_t n)
{
    if (w == SPAN_PARAM)
        snprintf(buf, n, "units[%d].params[%lld]", m->params[idx].unit,
                 (long long)(idx - m->units[m->params[idx].unit].first_param));
    else
        snprintf(buf, n, "segments[%lld]", (long long)idx);
}

static struct span *spans_make(const struct zs_ckpt_manifest *m, enum span_what w, int64_t *n)
{
    struct span *s;

    *n = w == SPAN_PARAM ? m->nparams : m->nsegs;
    s = malloc((size_t)(*n ? *n : 1) * sizeof(*s));
    if (!s)
        return NULL;
    for (int64_t i = 0; i < *n; i++) {
        const struct zs_ckpt_seg *g = &m->segs[i];
        const struct zs_ckpt_param *q = &m->params[i];

        if (w == SPAN_PARAM)
            s[i] = (struct span){q->unit, 0, q->offset, q->offset + q->numel, i};
        else if (w == SPAN_SEG)
            s[i] = (struct span){g->unit, g->kind, g->begin, g->begin + g->count, i};
        else
            s[i] = (struct span){g->file, 0, (int64_t)g->offset, (int64_t)g->offset + 4 * g->count, i};
    }
    qsort(s, (size_t)*n, sizeof(*s), span_cmp);
    return s;
}

/* Parameters must not share elements, nor segments share file bytes. */
static int check_overlap(struct mp *p, const struct zs_ckpt_manifest *m, enum span_what w)
{
    static const char *const field[] = {"begin", "offset", "offset"};
    char a[64], b[64];
    int64_t n;
    struct span *s = spans_make(m, w, &n);
    int rc = 0;

    if (!s)
        return zs_ckpt_mp_fail(p, "", "", "out of memory");
    for (int64_t i = 1; i < n && !rc; i++) {
        if (s[i].k1 != s[i - 1].k1 || s[i].k2 != s[i - 1].k2 || s[i].begin >= s[i - 1].end)
            continue;
        span_path(m, w, s[i].idx, a, sizeof(a));
        span_path(m, w, s[i - 1].idx, b, sizeof(b));
        rc = zs_ckpt_mp_fail(p, a, field[w], "[%lld, %lld) overlaps %s [%lld, %lld)%s", (long long)s[i].begin,
                             (long long)s[i].end, b, (long long)s[i - 1].begin, (long long)s[i - 1].end,
                             w == SPAN_SEG_BYTES ? " in the same file" : "");
    }
    free(s);
    return rc;
}

/* For every unit and every kind present, the segments cover [0, numel) exactly once. */
static int check_coverage(struct mp *p, const struct zs_ckpt_manifest *m)
{
    char a[64], b[64];
    int64_t n, c = 0;
    struct span *s = spans_make(m, SPAN_SEG, &n);
    int rc = 0;

    if (!s)
        return zs_ckpt_mp_fail(p, "", "", "out of memory");
    for (int32_t u = 0; u < m->nunits && !rc; u++)
        for (int k = 0; k < ZS_CKPT_NKINDS && !rc; k++) {
            int64_t at = 0, prev = -1;

            if (!m->has_kind[k])
                continue;
            if (k != ZS_CKPT_PARAM && zs_ckpt_unit_frozen(m, u) && (c >= n || s[c].k1 != u || s[c].k2 != k))
                continue; /* a frozen unit has no optimizer state */
            for (; c < n && s[c].k1 == u && s[c].k2 == k && !rc; prev = s[c].idx, at = s[c].end, c++) {
                span_path(m, SPAN_SEG, s[c].idx, a, sizeof(a));
                span_path(m, SPAN_SEG, prev, b, sizeof(b));
                if (s[c].begin < at)
                    rc = zs_ckpt_mp_fail(p, a, "begin", "%lld overlaps %s (units[%d] %s elements up to %lld)",
                                         (long long)s[c].begin, b, u, zs_ckpt_kind_name(k), (long long)at);
                else if (s[c].begin > at)
                    rc = zs_ckpt_mp_fail(p, "segments", "", "units[%d] %s elements [%lld, %lld) are in no segment", u,
                                         zs_ckpt_kind_name(k), (long long)at, (long long)s[c].begin);
            }
            if (!rc && at < m->units[u].numel)
                rc = zs_ckpt_mp_fail(p, "segments", "", "units[%d] %s elements [%lld, %lld) are in no segment", u,
                                     zs_ckpt_kind_name(k), (long long)at, (long long)m->units[u].numel);
        }
    free(s);
    return rc;
}

struct named {
    const char *name;
    int64_t idx;
};

static int named_cmp(const void *a, const void *b)
{
    const struct named *x = a, *y = b;
    int c = strcmp(x->name, y->name);

    return c ? c : (x->idx > y->idx) - (x->idx < y->idx);
}

/* Parameter names and file names are unique. */
static int check_unique(struct mp *p, const struct zs_ckpt_manifest *m, bool files)
{
    int64_t n = files ? m->nfiles : m->nparams;
    struct named *v = malloc((size_t)(n ? n : 1) * sizeof(*v));
    char a[64], b[64];
    int rc = 0;

    if (!v)
        return zs_ckpt_mp_fail(p, "", "", "out of memory");
    for (int64_t i = 0; i < n; i++)
        v[i] = (struct named){files ? m->files[i].name : m->params[i].name, i};
    qsort(v, (size_t)n, sizeof(*v), named_cmp);
    for (int64_t i = 1; i < n && !rc; i++) {
        if (strcmp(v[i].name, v[i - 1].name) != 0)
            continue;
        if (files) {
            snprintf(a, sizeof(a), "files[%lld]", (long long)v[i].idx);
            snprintf(b, sizeof(b), "files[%lld]", (long long)v[i - 1].idx);
        } else {
            span_path(m, SPAN_PARAM, v[i].idx, a, sizeof(a));
            span_path(m, SPAN_PARAM, v[i - 1].idx, b, sizeof(b));
        }
        rc = zs_ckpt_mp_fail(p, a, "name", "'%s' duplicates %s.name", v[i].name, b);
    }
    free(v);
    return rc;
}

int zs_ckpt_manifest_check(struct mp *p, const struct zs_ckpt_manifest *m)
{
    return check_unique(p, m, false) || check_unique(p, m, true) || check_overlap(p, m, SPAN_PARAM) ||
           check_coverage(p, m) || check_overlap(p, m, SPAN_SEG_BYTES) ? -1 : 0;
}
