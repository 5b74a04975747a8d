/* ckpt_format.c - the checkpoint manifest: strict parsing (every field typed, ranged and cross-checked, each
 * error naming the manifest and the JSON field path; the checks across tables in ckpt_format_check.c). */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>       /* defines: json_loadb, json_dumps */

#include "ckpt_format_impl.h" /* defines: struct mp, zs_ckpt_manifest_check */

#define MANIFEST_MAX_BYTES (1ull << 30) /* far above any real manifest; stops a wrong file eating memory */

static const char *const kind_names[ZS_CKPT_NKINDS] = {"param", "exp_avg", "exp_avg_sq"};

const char *zs_ckpt_kind_name(int kind)
{
    return kind >= 0 && kind < ZS_CKPT_NKINDS ? kind_names[kind] : "?";
}

bool zs_ckpt_name_ok(const char *name)
{
    if (!name || !name[0] || strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
        return false;
    for (const unsigned char *c = (const unsigned char *)name; *c; c++)
        if (*c == '/' || *c < 0x20 || *c == 0x7f)
            return false;
    return true;
}

// ----------------------------------------------------------------------------------- typed field reads

int zs_ckpt_mp_fail(struct mp *p, const char *path, const char *key, const char *fmt, ...)
{
    va_list ap;
    int n;

    if (!p->err || !p->errlen)
        return -1;
    n = snprintf(p->err, p->errlen, "%s: %s%s%s%s", p->what, path, path[0] && key[0] ? "." : "", key,
                 path[0] || key[0] ? ": " : "");
    if (n >= 0 && (size_t)n < p->errlen) {
        va_start(ap, fmt);
        vsnprintf(p->err + n, p->errlen - (size_t)n, fmt, ap);
        va_end(ap);
    }
    for (char *c = p->err; *c; c++) /* values quoted from the input must not break the one-line message */
        if ((unsigned char)*c < 0x20 || *c == 0x7f)
            *c = '?';
    return -1;
}

static const char *type_name(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a real number";
    case JSON_TRUE: case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

/* The member `key` of obj, which must have JSON type `type`. An absent optional member gives NULL with
 * *rc 0; anything else wrong gives NULL with *rc -1 and the message. */
static json_t *mp_get(struct mp *p, json_t *obj, const char *path, const char *key, json_type type, bool required,
                      int *rc)
{
    static const char *const want[] = {"an object", "an array", "a string", "an integer", "a number"};
    json_t *v = json_object_get(obj, key);

    *rc = 0;
    if (!v) {
        if (required)
            *rc = zs_ckpt_mp_fail(p, path, key, "missing");
        return NULL;
    }
    if (json_typeof(v) == type || (type == JSON_REAL && json_is_number(v)))
        return v;
    *rc = zs_ckpt_mp_fail(p, path, key, "expected %s, got %s", want[type <= JSON_REAL ? type : 0], type_name(v));
    return NULL;
}

static int mp_int(struct mp *p, json_t *obj, const char *path, const char *key, int64_t lo, int64_t hi,
                  int64_t *out)
{
    int rc;
    json_t *v = mp_get(p, obj, path, key, JSON_INTEGER, true, &rc);
    json_int_t x;

    if (!v)
        return rc;
    x = json_integer_value(v);
    if (x < lo || x > hi)
        return zs_ckpt_mp_fail(p, path, key, "%lld is out of range [%lld, %lld]", (long long)x, (long long)lo,
                               (long long)hi);
    *out = x;
    return 0;
}

static int mp_i32(struct mp *p, json_t *obj, const char *path, const char *key, int64_t lo, int64_t hi, int32_t *out)
{
    int64_t v;

    if (mp_int(p, obj, path, key, lo, hi, &v))
        return -1;
    *out = (int32_t)v;
    return 0;
}

/* A non-empty string without control characters (names end up in one-line messages), copied to *out. */
static int mp_str(struct mp *p, json_t *obj, const char *path, const char *key, char **out)
{
    int rc;
    json_t *v = mp_get(p, obj, path, key, JSON_STRING, true, &rc);
    const char *s;

    if (!v)
        return rc;
    s = json_string_value(v);
    if (!s[0])
        return zs_ckpt_mp_fail(p, path, key, "empty string");
    for (const unsigned char *c = (const unsigned char *)s; *c; c++)
        if (*c < 0x20 || *c == 0x7f)
            return zs_ckpt_mp_fail(p, path, key, "control character 0x%02x in string", *c);
    *out = strdup(s);
    return *out ? 0 : zs_ckpt_mp_fail(p, path, key, "out of memory");
}

/* Unknown members are refused: a misspelt field must not silently read as absent. */
static int mp_known(struct mp *p, json_t *obj, const char *path, const char *const *names)
{
    const char *key;
    json_t *v;

    json_object_foreach(obj, key, v) {
        const char *const *n = names;

        while (*n && strcmp(*n, key) != 0)
            n++;
        if (!*n)
            return zs_ckpt_mp_fail(p, path, key, "unknown field");
    }
    return 0;
}

/* The array member `key`, with at least `min` elements. */
static json_t *mp_array(struct mp *p, json_t *obj, const char *path, const char *key, size_t min, size_t *n)
{
    int rc;
    json_t *a = mp_get(p, obj, path, key, JSON_ARRAY, true, &rc);

    if (!a)
        return NULL;
    *n = json_array_size(a);
    if (*n < min || *n > INT32_MAX) {
        zs_ckpt_mp_fail(p, path, key, "%zu elements, expected %zu to %d", *n, min, INT32_MAX);
        return NULL;
    }
    return a;
}

/* The root's array `key` (at least one element, at most one per 4 data bytes when bounded) and a zeroed
 * table of as many entries of elsize bytes. */
static void *mp_table(struct mp *p, json_t *root, const char *key, size_t elsize, bool bounded, json_t **a,
                      size_t *n)
{
    void *t;

    *a = mp_array(p, root, "", key, 1, n);
    if (!*a)
        return NULL;
    if (bounded && *n > p->data_bytes / 4) {
        zs_ckpt_mp_fail(p, "", key, "%zu entries, more than the files' %llu bytes of data can hold", *n,
                        (unsigned long long)p->data_bytes);
        return NULL;
    }
    t = calloc(*n, elsize);
    if (!t)
        zs_ckpt_mp_fail(p, "", key, "out of memory");
    return t;
}

static json_t *mp_elem(struct mp *p, json_t *a, const char *key, size_t i, char *path, size_t pathlen)
{
    json_t *v = json_array_get(a, i);

    snprintf(path, pathlen, "%s[%zu]", key, i);
    if (!json_is_object(v)) {
        zs_ckpt_mp_fail(p, path, "", "expected an object, got %s", type_name(v));
        return NULL;
    }
    return v;
}

// ----------------------------------------------------------------------------------- sections

static int parse_scaler(struct mp *p, json_t *root, struct zs_ckpt_scaler *s)
{
    static const char *const fields[] = {"scale", "skipped_steps", "hysteresis", "last_overflow", "iter", NULL};
    const char *path = "loss_scaler";
    int rc;
    json_t *o = mp_get(p, root, "", path, JSON_OBJECT, true, &rc), *v;

    if (!o)
        return rc;
    if (mp_known(p, o, path, fields))
        return -1;
    v = mp_get(p, o, path, "scale", JSON_REAL, true, &rc);
    if (!v)
        return rc;
    s->scale = json_number_value(v);
    if (!isfinite(s->scale) || s->scale <= 0)
        return zs_ckpt_mp_fail(p, path, "scale", "%g is not a positive finite number", s->scale);
    return mp_int(p, o, path, "skipped_steps", 0, INT64_MAX, &s->skipped_steps) ||
           mp_int(p, o, path, "hysteresis", 0, INT64_MAX, &s->hysteresis) ||
           mp_int(p, o, path, "last_overflow", -1, INT64_MAX, &s->last_overflow) ||
           mp_int(p, o, path, "iter", 0, INT64_MAX, &s->iter) ? -1 : 0;
}

static int parse_param(struct mp *p, json_t *o, const char *path, int32_t unit, const struct zs_ckpt_unit *u,
                       struct zs_ckpt_param *q)
{
    static const char *const fields[] = {"name", "offset", "numel", "shape", "group", "frozen", NULL};
    json_t *shape;
    size_t nd;
    int64_t prod = 1;

    q->unit = unit;
    if (mp_known(p, o, path, fields) || mp_str(p, o, path, "name", &q->name) ||
        mp_int(p, o, path, "offset", 0, u->numel - 1, &q->offset) ||
        mp_int(p, o, path, "numel", 1, u->numel - q->offset, &q->numel) ||
        zs_ckpt_param_group_parse(p, o, path, p->m, q))
        return -1;
    shape = mp_array(p, o, path, "shape", 0, &nd);
    if (!shape)
        return -1;
    if (nd > ZS_CKPT_MAX_DIMS)
        return zs_ckpt_mp_fail(p, path, "shape", "%zu dimensions, at most %d", nd, ZS_CKPT_MAX_DIMS);
    q->ndim = (int32_t)nd;
    for (size_t d = 0; d < nd; d++) {
        json_t *v = json_array_get(shape, d);

        if (!json_is_integer(v) || json_integer_value(v) < 0)
            return zs_ckpt_mp_fail(p, path, "shape", "element %zu is not a non-negative integer", d);
        q->shape[d] = json_integer_value(v);
        if (__builtin_mul_overflow(prod, q->shape[d], &prod))
            return zs_ckpt_mp_fail(p, path, "shape", "element product overflows");
    }
    if (prod != q->numel)
        return zs_ckpt_mp_fail(p, path, "shape", "element product %lld != numel %lld", (long long)prod,
                               (long long)q->numel);
    return 0;
}

/* Units first (their param arrays sized), then one flat params array filled unit by unit. */
static int parse_units(struct mp *p, json_t *root, struct zs_ckpt_manifest *m)
{
    static const char *const fields[] = {"name", "numel", "params", NULL};
    char path[64], key[80], ppath[96];
    size_t n, total = 0;
    uint64_t elements = 0;
    json_t *a, *o, *pa;

    if (!(m->units = mp_table(p, root, "units", sizeof(*m->units), true, &a, &n)))
        return -1;
    m->nunits = (int32_t)n;
    for (size_t i = 0; i < n; i++) {
        struct zs_ckpt_unit *u = &m->units[i];
        size_t np;

        if (!(o = mp_elem(p, a, "units", i, path, sizeof(path))) || mp_known(p, o, path, fields) ||
            mp_str(p, o, path, "name", &u->name) || mp_int(p, o, path, "numel", 1, INT64_MAX / 4, &u->numel) ||
            !mp_array(p, o, path, "params", 1, &np))
            return -1;
        if (np > (size_t)INT32_MAX - total)
            return zs_ckpt_mp_fail(p, path, "params", "more than %d parameters in all", INT32_MAX);
        elements += (uint64_t)u->numel; /* no overflow: numel <= INT64_MAX / 4, and at most 2^31 units */
        if (elements > p->data_bytes / 4)
            return zs_ckpt_mp_fail(p, path, "numel", "the units up to here have %llu elements, more than the "
                                   "files' %llu bytes of data can hold", (unsigned long long)elements,
                                   (unsigned long long)p->data_bytes);
        if (total + np > elements)
            return zs_ckpt_mp_fail(p, path, "params", "%zu parameters in all, more than the units' %llu elements",
                                   total + np, (unsigned long long)elements);
        u->first_param = (int32_t)total;
        u->nparams = (int32_t)np;
        total += np;
    }
    m->params = calloc(total, sizeof(*m->params));
    if (!m->params)
        return zs_ckpt_mp_fail(p, "", "units", "out of memory");
    m->nparams = (int32_t)total;
    for (size_t i = 0; i < n; i++) {
        const struct zs_ckpt_unit *u = &m->units[i];

        snprintf(key, sizeof(key), "units[%zu].params", i);
        pa = json_object_get(json_array_get(a, i), "params");
        for (int32_t j = 0; j < u->nparams; j++) {
            if (!(o = mp_elem(p, pa, key, (size_t)j, ppath, sizeof(ppath))) ||
                parse_param(p, o, ppath, (int32_t)i, u, &m->params[u->first_param + j]))
                return -1;
        }
    }
    return 0;
}

static int parse_crc(struct mp *p, json_t *o, const char *path, uint32_t *crc)
{
    int rc;
    json_t *v = mp_get(p, o, path, "crc32c", JSON_STRING, true, &rc);
    const char *s;

    if (!v)
        return rc;
    s = json_string_value(v);
    if (strlen(s) != 8 || strspn(s, "0123456789abcdef") != 8)
        return zs_ckpt_mp_fail(p, path, "crc32c", "'%.16s' is not 8 lower-case hex digits", s);
    *crc = (uint32_t)strtoul(s, NULL, 16);
    return 0;
}

static int parse_files(struct mp *p, json_t *root, struct zs_ckpt_manifest *m)
{
    static const char *const fields[] = {"name", "rank", "bytes", "crc32c", NULL};
    char path[64];
    size_t n;
    json_t *a, *o;
    int64_t bytes;

    if (!(m->files = mp_table(p, root, "files", sizeof(*m->files), false, &a, &n)))
        return -1;
    m->nfiles = (int32_t)n;
    for (size_t i = 0; i < n; i++) {
        struct zs_ckpt_file *f = &m->files[i];

        if (!(o = mp_elem(p, a, "files", i, path, sizeof(path))) || mp_known(p, o, path, fields) ||
            mp_str(p, o, path, "name", &f->name) || mp_i32(p, o, path, "rank", 0, m->world_size - 1, &f->rank) ||
            mp_int(p, o, path, "bytes", 0, INT64_MAX, &bytes) || parse_crc(p, o, path, &f->crc32c))
            return -1;
        if (!zs_ckpt_name_ok(f->name))
            return zs_ckpt_mp_fail(p, path, "name", "'%s' is not a plain file name", f->name);
        f->bytes = (uint64_t)bytes;
    }
    return 0;
}

static int parse_kind(struct mp *p, json_t *o, const char *path, int32_t *kind)
{
    int rc;
    json_t *v = mp_get(p, o, path, "kind", JSON_STRING, true, &rc);

    if (!v)
        return rc;
    for (int k = 0; k < ZS_CKPT_NKINDS; k++)
        if (strcmp(json_string_value(v), kind_names[k]) == 0) {
            *kind = k;
            return 0;
        }
    return zs_ckpt_mp_fail(p, path, "kind", "unknown kind '%.32s' (param, exp_avg, exp_avg_sq)", json_string_value(v));
}

static int parse_segs(struct mp *p, json_t *root, struct zs_ckpt_manifest *m)
{
    static const char *const fields[] = {"unit", "kind", "begin", "count", "file", "offset", NULL};
    char path[64];
    size_t n;
    json_t *a, *o;
    int64_t off;

    if (!(m->segs = mp_table(p, root, "segments", sizeof(*m->segs), true, &a, &n)))
        return -1;
    m->nsegs = (int64_t)n;
    for (size_t i = 0; i < n; i++) {
        struct zs_ckpt_seg *s = &m->segs[i];
        const struct zs_ckpt_file *f;
        int64_t numel;

        if (!(o = mp_elem(p, a, "segments", i, path, sizeof(path))) || mp_known(p, o, path, fields) ||
            mp_i32(p, o, path, "unit", 0, m->nunits - 1, &s->unit) || parse_kind(p, o, path, &s->kind) ||
            mp_i32(p, o, path, "file", 0, m->nfiles - 1, &s->file))
            return -1;
        numel = m->units[s->unit].numel;
        if (mp_int(p, o, path, "begin", 0, numel - 1, &s->begin) ||
            mp_int(p, o, path, "count", 1, numel - s->begin, &s->count) ||
            mp_int(p, o, path, "offset", 0, INT64_MAX, &off))
            return -1;
        s->offset = (uint64_t)off;
        f = &m->files[s->file];
        if (f->bytes < (uint64_t)s->count * 4 || s->offset > f->bytes - (uint64_t)s->count * 4)
            return zs_ckpt_mp_fail(p, path, "offset", "%llu + %llu bytes beyond file %s (%llu bytes)",
                                   (unsigned long long)s->offset, (unsigned long long)s->count * 4, f->name,
                                   (unsigned long long)f->bytes);
        m->has_kind[s->kind] = true;
    }
    return 0;
}

// ----------------------------------------------------------------------------------- parse, load, free

/* The data bytes that bound the tables: what the files declare, and no more than the caller knows the tag
 * directory to hold (a file shorter than declared is reported by name when it is read or verified). */
static int check_data(struct mp *p, const struct zs_ckpt_manifest *m)
{
    uint64_t sum = 0;

    for (int32_t i = 0; i < m->nfiles; i++)
        sum = m->files[i].bytes > UINT64_MAX - sum ? UINT64_MAX : sum + m->files[i].bytes;
    if (sum < p->data_bytes)
        p->data_bytes = sum;
    return 0;
}

/* Optional, so that older manifests still load: -1 when absent. */
static int parse_counts(struct mp *p, json_t *root, struct zs_ckpt_manifest *m)
{
    m->optim_steps = m->sched_steps = -1;
    return (json_object_get(root, "optimizer_steps") &&
            mp_int(p, root, "", "optimizer_steps", 0, m->global_step, &m->optim_steps)) ||
           (json_object_get(root, "schedule_steps") &&
            mp_int(p, root, "", "schedule_steps", 0, m->global_step, &m->sched_steps)) ? -1 : 0;
}

static int parse_root(struct mp *p, json_t *root, struct zs_ckpt_manifest *m)
{
    static const char *const fields[] = {"format", "version", "global_step", "micro_step", "world_size", "stage",
        "param_dtype", "optimizer", "loss_scaler", "optimizer_steps", "schedule_steps", "config", "groups", "units",
        "files", "segments", NULL};
    int rc;
    json_t *v;

    if (mp_known(p, root, "", fields))
        return -1;
    if (!(v = mp_get(p, root, "", "format", JSON_STRING, true, &rc)))
        return rc;
    if (strcmp(json_string_value(v), ZS_CKPT_FORMAT) != 0)
        return zs_ckpt_mp_fail(p, "", "format", "'%.64s' is not '%s'", json_string_value(v), ZS_CKPT_FORMAT);
    if (mp_i32(p, root, "", "version", ZS_CKPT_VERSION, ZS_CKPT_VERSION, &m->version) ||
        mp_int(p, root, "", "global_step", 0, INT64_MAX, &m->global_step) ||
        mp_int(p, root, "", "micro_step", 0, INT64_MAX, &m->micro_step) ||
        mp_i32(p, root, "", "world_size", 1, INT32_MAX, &m->world_size) ||
        mp_i32(p, root, "", "stage", 0, 3, &m->stage) || mp_str(p, root, "", "param_dtype", &m->param_dtype) ||
        mp_str(p, root, "", "optimizer", &m->optimizer))
        return -1;
    if (strcmp(m->param_dtype, "fp32") && strcmp(m->param_dtype, "bf16") && strcmp(m->param_dtype, "fp16"))
        return zs_ckpt_mp_fail(p, "", "param_dtype", "'%s' is not fp32, bf16 or fp16", m->param_dtype);
    if (parse_scaler(p, root, &m->scaler))
        return -1;
    if (m->scaler.skipped_steps > m->global_step)
        return zs_ckpt_mp_fail(p, "loss_scaler", "skipped_steps", "%lld is more than global_step %lld (skipped "
                               "steps are counted in it)", (long long)m->scaler.skipped_steps,
                               (long long)m->global_step);
    /* a load restores micro_step as written (a window may have ended early, so it is no multiple of the steps) */
    if (m->micro_step < m->global_step)
        return zs_ckpt_mp_fail(p, "", "micro_step", "%lld is less than global_step %lld (every step takes at least "
                               "one micro-batch)", (long long)m->micro_step, (long long)m->global_step);
    if (parse_counts(p, root, m))
        return -1;
    if ((v = mp_get(p, root, "", "config", JSON_OBJECT, false, &rc)) &&
        !(m->config_json = json_dumps(v, JSON_COMPACT)))
        return zs_ckpt_mp_fail(p, "", "config", "out of memory");
    /* files first: what they declare bounds the unit and segment tables; groups before the parameters */
    p->m = m;
    if (rc || zs_ckpt_groups_parse(p, root, m) || parse_files(p, root, m) || check_data(p, m) || parse_units(p, root, m) || parse_segs(p, root, m))
        return -1;
    if (!m->has_kind[ZS_CKPT_PARAM])
        return zs_ckpt_mp_fail(p, "segments", "", "no segment of kind param");
    return zs_ckpt_manifest_check(p, m);
}

int zs_ckpt_manifest_parse_bounded(struct zs_ckpt_manifest *m, const char *text, size_t len, const char *what,
                                   uint64_t data_bytes, char *err, size_t errlen)
{
    struct mp p = {what ? what : "manifest", err, errlen, data_bytes, NULL};
    json_error_t je;
    json_t *root;
    int rc;

    memset(m, 0, sizeof(*m));
    root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return zs_ckpt_mp_fail(&p, "", "", "invalid JSON at line %d column %d: %s", je.line, je.column, je.text);
    rc = json_is_object(root) ? parse_root(&p, root, m)
                              : zs_ckpt_mp_fail(&p, "(top level)", "", "expected an object, got %s", type_name(root));
    json_decref(root);
    if (rc)
        zs_ckpt_manifest_free(m);
    return rc;
}

int zs_ckpt_manifest_parse(struct zs_ckpt_manifest *m, const char *text, size_t len, const char *what, char *err,
                           size_t errlen)
{
    return zs_ckpt_manifest_parse_bounded(m, text, len, what, UINT64_MAX, err, errlen);
}

void zs_ckpt_manifest_free(struct zs_ckpt_manifest *m)
{
    for (int32_t i = 0; m->units && i < m->nunits; i++)
        free(m->units[i].name);
    for (int32_t i = 0; m->params && i < m->nparams; i++)
        free(m->params[i].name);
    for (int32_t i = 0; m->files && i < m->nfiles; i++)
        free(m->files[i].name);
    free(m->units);
    free(m->params);
    free(m->files);
    free(m->segs);
    free(m->groups);
    free(m->param_dtype);
    free(m->optimizer);
    free(m->config_json);
    memset(m, 0, sizeof(*m));
}
