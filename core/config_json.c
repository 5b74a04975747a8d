/* config_json.c - the input side of the config reader: the file itself, then typed reads of jansson values
 * (ranges, "auto", unknown keys with did-you-mean) whose one-line messages start with the key path. */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"       /* defines: zs_config_read_file */
#include "config_json.h"

#define ZS_CONFIG_MAX_BYTES (64u << 20)

/* ---------------------------------------------------------------- the file */

/* Reads in chunks rather than trusting a size from fstat, so pipes and /dev/stdin work too. */
int zs_config_read_file(const char *path, char **text)
{
    size_t len = 0, cap = 4096, got;
    char *buf, *bigger;
    FILE *f;
    int rc = 0;

    if (!path || !text)
        return -EINVAL;
    *text = NULL;
    f = fopen(path, "rb");
    if (!f)
        return -errno;
    errno = 0;
    buf = malloc(cap);
    if (!buf) {
        rc = -ENOMEM;
        goto out_close;
    }
    while ((got = fread(buf + len, 1, cap - len - 1, f)) > 0) {
        len += got;
        if (len + 1 < cap)
            continue;
        if (cap >= ZS_CONFIG_MAX_BYTES) {
            rc = -EFBIG;
            goto out_free;
        }
        bigger = realloc(buf, cap * 2);
        if (!bigger) {
            rc = -ENOMEM;
            goto out_free;
        }
        buf = bigger;
        cap *= 2;
    }
    if (ferror(f))
        rc = errno ? -errno : -EIO; /* a directory opens fine and fails here with EISDIR */
    else if (memchr(buf, '\0', len))
        rc = -EINVAL; /* json_loads would stop at the NUL and judge only part of the file */
    if (!rc) {
        buf[len] = '\0';
        *text = buf;
        goto out_close;
    }
out_free:
    free(buf);
out_close:
    fclose(f);
    return rc;
}

/* ---------------------------------------------------------------- messages */

static void join_path(char *buf, size_t n, const char *path, const char *key)
{
    if (!path || !path[0])
        snprintf(buf, n, "%s", key ? key : "");
    else if (!key)
        snprintf(buf, n, "%s", path);
    else
        snprintf(buf, n, "%s.%s", path, key);
}

/* Keys and string values come from the user: keep the message on one line whatever they contain. */
static void vformat(char *buf, size_t n, const char *path, const char *key, const char *fmt, va_list ap)
{
    char where[256];
    int len;

    if (!buf || !n)
        return;
    join_path(where, sizeof(where), path, key);
    len = snprintf(buf, n, "%s: ", where);
    if (len >= 0 && (size_t)len < n)
        vsnprintf(buf + len, n - (size_t)len, fmt, ap);
    for (char *c = buf; *c; c++)
        if ((unsigned char)*c < 0x20)
            *c = '?';
}

int zs_cfg_fail(struct zs_cfg_parser *p, const char *path, const char *key, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vformat(p->err, p->errlen, path, key, fmt, ap);
    va_end(ap);
    return -EINVAL;
}

void zs_cfg_defer(struct zs_cfg_parser *p, const char *path, const char *key, const char *fmt, ...)
{
    va_list ap;

    if (p->deferred[0])
        return;
    va_start(ap, fmt);
    vformat(p->deferred, sizeof(p->deferred), path, key, fmt, ap);
    va_end(ap);
}

void zs_cfg_describe(const json_t *v, char *buf, size_t n)
{
    switch (json_typeof(v)) {
    case JSON_STRING:
        snprintf(buf, n, "\"%.40s%s\"", json_string_value(v), json_string_length(v) > 40 ? "..." : "");
        break;
    case JSON_INTEGER:
        snprintf(buf, n, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        break;
    case JSON_REAL:
        snprintf(buf, n, "%.15g", json_real_value(v));
        break;
    case JSON_TRUE:
        snprintf(buf, n, "true");
        break;
    case JSON_FALSE:
        snprintf(buf, n, "false");
        break;
    case JSON_NULL:
        snprintf(buf, n, "null");
        break;
    case JSON_OBJECT:
        snprintf(buf, n, "an object");
        break;
    case JSON_ARRAY:
        snprintf(buf, n, "an array");
        break;
    }
}

void zs_cfg_list_add(char *list, size_t n, const char *sep, const char *path, const char *key)
{
    size_t len = strlen(list);
    bool dot = path && path[0] && key;
    int w;

    if (len + 1 >= n)
        return;
    w = snprintf(list + len, n - len, "%s%s%s%s", len ? sep : "", path ? path : "", dot ? "." : "", key ? key : "");
    if (w >= 0 && (size_t)w >= n - len && n > 4)
        memcpy(list + n - 4, "...", 4);
}

/* ---------------------------------------------------------------- names */

bool zs_cfg_is_auto(const json_t *v)
{
    return json_is_string(v) && strcmp(json_string_value(v), "auto") == 0;
}

bool zs_cfg_in_list(const char *s, const char *const *list)
{
    for (; list && *list; list++)
        if (strcmp(s, *list) == 0)
            return true;
    return false;
}

bool zs_cfg_streq_nocase(const char *a, const char *b)
{
    for (; *a && *b; a++, b++)
        if (tolower((unsigned char)*a) != tolower((unsigned char)*b))
            return false;
    return *a == *b;
}

/* Levenshtein distance, ignoring case (a wrongly cased key is the commonest slip). */
static int edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    int row[65];

    if (la > 64 || lb > 64)
        return INT_MAX;
    for (size_t j = 0; j <= lb; j++)
        row[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        int diag = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int up = row[j];
            int sub = diag + (tolower((unsigned char)a[i - 1]) != tolower((unsigned char)b[j - 1]));
            int best = up + 1 < row[j - 1] + 1 ? up + 1 : row[j - 1] + 1;
            row[j] = sub < best ? sub : best;
            diag = up;
        }
    }
    return row[lb];
}

/* Whether `key` is one or more whole '_'-separated words of `name`: "threads" of "cpu_threads". */
static bool is_words_of(const char *key, const char *name)
{
    size_t lk = strlen(key), ln = strlen(name);

    for (size_t at = 0; at + lk <= ln; at++) {
        size_t i = 0;
        if ((at > 0 && name[at - 1] != '_') || (at + lk < ln && name[at + lk] != '_'))
            continue;
        while (i < lk && tolower((unsigned char)key[i]) == tolower((unsigned char)name[at + i]))
            i++;
        if (i == lk)
            return true;
    }
    return false;
}

/* Up to 3 edits, but no more than half the key's length: "foo" should not suggest "aio". Failing that, a
 * name the key is a whole-word part of ("threads" for "cpu_threads"), the shortest one, unless two tie. */
int zs_cfg_unknown_key(struct zs_cfg_parser *p, const char *path, const char *key,
                       const char *const *const *lists)
{
    int limit = (int)(strlen(key) / 2), bestd = INT_MAX;
    size_t bestlen = SIZE_MAX;
    const char *best = NULL, *part = NULL;
    bool tie = false;

    if (limit > 3)
        limit = 3;
    for (; *lists; lists++)
        for (const char *const *k = *lists; *k; k++) {
            int d = edit_distance(key, *k);
            if (d <= limit && d < bestd) {
                bestd = d;
                best = *k;
            }
            if (strlen(key) >= 3 && strlen(*k) <= bestlen && is_words_of(key, *k)) {
                tie = strlen(*k) == bestlen;
                bestlen = strlen(*k);
                part = *k;
            }
        }
    if (!best && !tie)
        best = part;
    if (best)
        return zs_cfg_fail(p, path, key, "unknown key (did you mean '%s'?)", best);
    return zs_cfg_fail(p, path, key, "unknown key");
}

int zs_cfg_check_keys(struct zs_cfg_parser *p, json_t *obj, const char *path, const char *const *known,
                      const char *const *other, const char *owner)
{
    const char *const *lists[] = {known, NULL};
    const char *key;
    json_t *v;

    json_object_foreach(obj, key, v) {
        if (key[0] == '_' || zs_cfg_in_list(key, known))
            continue;
        if (zs_cfg_in_list(key, other))
            return zs_cfg_fail(p, path, key, "not a parameter of %s", owner);
        return zs_cfg_unknown_key(p, path, key, lists);
    }
    return 0;
}

int zs_cfg_pick_alias(struct zs_cfg_parser *p, json_t *obj, const char *path, const char *a, const char *b,
                      const char **key)
{
    bool has_a = obj && json_object_get(obj, a), has_b = obj && json_object_get(obj, b);

    *key = has_b ? b : a;
    if (has_a && has_b)
        return zs_cfg_fail(p, path, b, "same setting as %s; give only one of them", a);
    return 0;
}

/* ---------------------------------------------------------------- typed values */

static void spec_what(const struct zs_cfg_spec *s, bool integer, char *buf, size_t n)
{
    const char *base = integer ? "an integer" : "a number";

    if (isinf(s->hi) && isinf(s->lo))
        snprintf(buf, n, "%s", base);
    else if (isinf(s->hi))
        snprintf(buf, n, "%s %s %g", base, s->lo_open ? ">" : ">=", s->lo);
    else if (integer)
        snprintf(buf, n, "%s %g..%g", base, s->lo, s->hi);
    else
        snprintf(buf, n, "%s in %c%g, %g%c", base, s->lo_open ? '(' : '[', s->lo, s->hi, s->hi_open ? ')' : ']');
}

static bool in_range(const struct zs_cfg_spec *s, double d)
{
    if (s->lo_open ? !(d > s->lo) : !(d >= s->lo))
        return false;
    return s->hi_open ? d < s->hi : d <= s->hi;
}

/* Configs write integers as 6.0e+07 or 1.000000e+09: a real with a whole value is an integer. */
static bool as_int(const json_t *v, int64_t *out)
{
    double d;

    if (json_is_integer(v)) {
        *out = json_integer_value(v);
        return true;
    }
    if (!json_is_real(v))
        return false;
    d = json_real_value(v);
    if (!(d >= -0x1p63 && d < 0x1p63) || d != floor(d))
        return false;
    *out = (int64_t)d;
    return true;
}

/* "auto": the program's value, else DeepSpeed's default, else an error naming what to supply. */
static int resolve_auto(struct zs_cfg_parser *p, const char *path, const char *key, const struct zs_cfg_spec *s,
                        double *out)
{
    if (s->no_auto)
        return zs_cfg_fail(p, path, key, "\"auto\" cannot be resolved here; give a value");
    if (s->has_autov) {
        *out = s->autov;
        return 0;
    }
    if (s->need)
        return zs_cfg_fail(p, path, key, "\"auto\" needs a value from the program (zs_auto_values.%s)", s->need);
    *out = s->def;
    return 0;
}

static int bad_value(struct zs_cfg_parser *p, json_t *v, const char *path, const char *key,
                     const struct zs_cfg_spec *s, bool integer)
{
    char what[80], got[64];

    spec_what(s, integer, what, sizeof(what));
    zs_cfg_describe(v, got, sizeof(got));
    return zs_cfg_fail(p, path, key, "expected %s, got %s", what, got);
}

int zs_cfg_num_value(struct zs_cfg_parser *p, json_t *v, const char *path, const char *key,
                     const struct zs_cfg_spec *s, double *out)
{
    if (!v) {
        *out = s->def;
        return s->required ? zs_cfg_fail(p, path, key, "missing") : 0;
    }
    if (zs_cfg_is_auto(v))
        return resolve_auto(p, path, key, s, out);
    if (!json_is_number(v) || !in_range(s, json_number_value(v)))
        return bad_value(p, v, path, key, s, false);
    *out = json_number_value(v);
    return 0;
}

int zs_cfg_get_num(struct zs_cfg_parser *p, json_t *obj, const char *path, const char *key,
                   const struct zs_cfg_spec *s, double *out)
{
    return zs_cfg_num_value(p, obj ? json_object_get(obj, key) : NULL, path, key, s, out);
}

int zs_cfg_get_int(struct zs_cfg_parser *p, json_t *obj, const char *path, const char *key,
                   const struct zs_cfg_spec *s, int64_t *out)
{
    json_t *v = obj ? json_object_get(obj, key) : NULL;
    double d = 0;

    *out = 0;
    if (!v || zs_cfg_is_auto(v)) {
        if (zs_cfg_num_value(p, v, path, key, s, &d))
            return -EINVAL;
        if (!(d >= -0x1p63 && d < 0x1p63))
            return zs_cfg_fail(p, path, key, "value %g is out of range", d);
        *out = (int64_t)d;
        return 0;
    }
    if (!as_int(v, out) || !in_range(s, (double)*out))
        return bad_value(p, v, path, key, s, true);
    return 0;
}

int zs_cfg_get_bool(struct zs_cfg_parser *p, json_t *obj, const char *path, const char *key, bool def,
                    bool auto_is_false, bool *out)
{
    json_t *v = obj ? json_object_get(obj, key) : NULL;
    char got[64];

    *out = def;
    if (!v)
        return 0;
    if (json_is_boolean(v)) {
        *out = json_is_true(v);
        return 0;
    }
    if (zs_cfg_is_auto(v)) {
        *out = false;
        return auto_is_false ? 0 : zs_cfg_fail(p, path, key, "\"auto\" cannot be resolved here; give a value");
    }
    zs_cfg_describe(v, got, sizeof(got));
    return zs_cfg_fail(p, path, key, "expected true or false, got %s", got);
}

int zs_cfg_get_str(struct zs_cfg_parser *p, json_t *obj, const char *path, const char *key, const char **out)
{
    json_t *v = obj ? json_object_get(obj, key) : NULL;
    char got[64];

    *out = NULL;
    if (!v || json_is_null(v))
        return 0;
    if (json_is_string(v)) {
        *out = json_string_value(v);
        return 0;
    }
    zs_cfg_describe(v, got, sizeof(got));
    return zs_cfg_fail(p, path, key, "expected a string, got %s", got);
}

int zs_cfg_get_obj(struct zs_cfg_parser *p, json_t *obj, const char *path, const char *key, json_t **out)
{
    json_t *v = obj ? json_object_get(obj, key) : NULL;
    char got[64];

    *out = NULL;
    if (!v || json_is_null(v))
        return 0;
    if (json_is_object(v)) {
        *out = v;
        return 0;
    }
    zs_cfg_describe(v, got, sizeof(got));
    return zs_cfg_fail(p, path, key, "expected an object, got %s", got);
}

int zs_cfg_check_gate(struct zs_cfg_parser *p, json_t *obj, const char *path, const struct zs_cfg_gate *g)
{
    const struct zs_cfg_spec s = {ZS_GE(g->lo), .def = (double)g->limit};
    int64_t n = 0;
    bool on = false;

    if (g->is_int ? zs_cfg_get_int(p, obj, path, g->key, &s, &n)
                  : zs_cfg_get_bool(p, obj, path, g->key, false, false, &on))
        return -EINVAL;
    if (g->is_int ? n > g->limit : on)
        zs_cfg_defer(p, path, g->key, "%s", g->what);
    return 0;
}
