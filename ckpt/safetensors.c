/* safetensors.c - the safetensors reader: the whole header is validated up front (types, sizes, offsets
 * tiling the data exactly), so a later read can only fail on I/O, never on a malformed layout. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>       /* defines: json_loadb */

#include "kernels/convert.h"       /* defines: zs_cvt_f16_f32, zs_cvt_bf16_f32 */
#include "safetensors.h"   /* defines: struct zs_st_tensor */

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data are little-endian and read in place: a big-endian host needs byte swaps here"
#endif

static const char *const dtype_names[ZS_ST_NDTYPES] = {"F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8",
                                                       "U8", "BOOL"};
static const int dtype_sizes[ZS_ST_NDTYPES] = {8, 4, 2, 2, 8, 4, 2, 1, 1, 1};

struct zs_st {
    json_t *root;                 /* owns the strings that names and metadata point to */
    struct zs_st_tensor *tensors; /* in file order */
    const struct zs_st_tensor **by_name;
    int ntensors;
    const char **meta_keys, **meta_vals;
    int nmeta;
    uint64_t data_len;
    int fd;                       /* -1: in memory (mem) or header only (neither) */
    const unsigned char *mem;
    char *what;
};

const char *zs_st_dtype_name(enum zs_st_dtype d)
{
    return (unsigned)d < ZS_ST_NDTYPES ? dtype_names[d] : "?";
}

int zs_st_dtype_size(enum zs_st_dtype d)
{
    return (unsigned)d < ZS_ST_NDTYPES ? dtype_sizes[d] : 0;
}

int zs_st_msg(char *err, size_t errlen, int rc, const char *fmt, ...)
{
    va_list ap;

    if (err && errlen) {
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
        for (char *c = err; *c; c++) /* values quoted from the input must not break the one-line message */
            if ((unsigned char)*c < 0x20 || *c == 0x7f)
                *c = '?';
    }
    return rc;
}

/* A tensor name as it can appear in a one-line message: quotes and control characters replaced, cut at 64. */
static const char *printable(const char *name, char *buf, size_t len)
{
    size_t i = 0;

    for (; name[i] && i + 4 < len && i < 64; i++)
        buf[i] = (unsigned char)name[i] < 0x20 || name[i] == 0x7f || name[i] == '"' ? '?' : name[i];
    strcpy(buf + i, name[i] ? "..." : "");
    return buf;
}

// ----------------------------------------------------------------------------------- header

/* One tensor entry; t->offset holds the begin offset relative to the data until the layout is checked. */
static int parse_tensor(const char *what, const char *name, json_t *o, struct zs_st_tensor *t, char *err,
                        size_t errlen)
{
    char pn[80];
    const char *key, *ds;
    json_t *v, *shape = json_object_get(o, "shape"), *offs = json_object_get(o, "data_offsets");
    int64_t nbytes;

    printable(name, pn, sizeof(pn));
    if (!json_is_object(o))
        return zs_st_msg(err, errlen, -EINVAL, "%s: \"%s\": expected an object", what, pn);
    json_object_foreach(o, key, v)
        if (strcmp(key, "dtype") && strcmp(key, "shape") && strcmp(key, "data_offsets"))
            return zs_st_msg(err, errlen, -EINVAL, "%s: \"%s\".%.32s: unknown field", what, pn, key);
    ds = json_string_value(json_object_get(o, "dtype"));
    for (t->dtype = 0; ds && t->dtype < ZS_ST_NDTYPES && strcmp(ds, dtype_names[t->dtype]); t->dtype++)
        ;
    if (!ds || t->dtype == ZS_ST_NDTYPES)
        return zs_st_msg(err, errlen, -EINVAL, "%s: \"%s\".dtype: %s%.16s%s is not a known dtype", what, pn,
                       ds ? "'" : "", ds ? ds : "missing or not a string", ds ? "'" : "");
    if (!json_is_array(shape) || json_array_size(shape) > ZS_ST_MAX_DIMS)
        return zs_st_msg(err, errlen, -EINVAL, "%s: \"%s\".shape: not an array of at most %d dimensions", what, pn,
                       ZS_ST_MAX_DIMS);
    t->name = name;
    t->ndim = (int32_t)json_array_size(shape);
    nbytes = dtype_sizes[t->dtype];
    t->numel = 1;
    for (int32_t d = 0; d < t->ndim; d++) {
        v = json_array_get(shape, (size_t)d);
        if (!json_is_integer(v) || json_integer_value(v) < 0)
            return zs_st_msg(err, errlen, -EINVAL, "%s: \"%s\".shape[%d]: not a non-negative integer", what, pn, d);
        t->shape[d] = json_integer_value(v);
        if (__builtin_mul_overflow(t->numel, t->shape[d], &t->numel) ||
            __builtin_mul_overflow(nbytes, t->shape[d], &nbytes))
            return zs_st_msg(err, errlen, -EOVERFLOW, "%s: \"%s\".shape: size overflows 64 bits", what, pn);
    }
    t->nbytes = (uint64_t)nbytes;
    if (!json_is_array(offs) || json_array_size(offs) != 2 || !json_is_integer(json_array_get(offs, 0)) ||
        !json_is_integer(json_array_get(offs, 1)) || json_integer_value(json_array_get(offs, 0)) < 0 ||
        json_integer_value(json_array_get(offs, 1)) < json_integer_value(json_array_get(offs, 0)))
        return zs_st_msg(err, errlen, -EINVAL, "%s: \"%s\".data_offsets: not [begin, end] with 0 <= begin <= end",
                       what, pn);
    t->offset = (uint64_t)json_integer_value(json_array_get(offs, 0));
    if ((uint64_t)json_integer_value(json_array_get(offs, 1)) - t->offset != t->nbytes)
        return zs_st_msg(err, errlen, -EINVAL, "%s: \"%s\".data_offsets: [%llu, %lld] holds %llu bytes, but %lld "
                       "elements of %s need %llu", what, pn, (unsigned long long)t->offset,
                       (long long)json_integer_value(json_array_get(offs, 1)),
                       (unsigned long long)json_integer_value(json_array_get(offs, 1)) - t->offset,
                       (long long)t->numel, dtype_names[t->dtype], (unsigned long long)t->nbytes);
    return 0;
}

static int parse_meta(struct zs_st *st, json_t *o, char *err, size_t errlen)
{
    const char *key;
    json_t *v;
    int i = 0;

    if (!json_is_object(o))
        return zs_st_msg(err, errlen, -EINVAL, "%s: __metadata__: expected an object", st->what);
    st->meta_keys = calloc(json_object_size(o) + 1, sizeof(*st->meta_keys));
    st->meta_vals = calloc(json_object_size(o) + 1, sizeof(*st->meta_vals));
    if (!st->meta_keys || !st->meta_vals)
        return zs_st_msg(err, errlen, -ENOMEM, "%s: out of memory", st->what);
    json_object_foreach(o, key, v) {
        char pk[80];

        if (!json_is_string(v))
            return zs_st_msg(err, errlen, -EINVAL, "%s: __metadata__.%s: expected a string", st->what,
                           printable(key, pk, sizeof(pk)));
        st->meta_keys[i] = key;
        st->meta_vals[i++] = json_string_value(v);
    }
    st->nmeta = i;
    return 0;
}

static int cmp_offset(const void *a, const void *b)
{
    const struct zs_st_tensor *x = a, *y = b;

    if (x->offset != y->offset)
        return x->offset < y->offset ? -1 : 1;
    return (x->nbytes > y->nbytes) - (x->nbytes < y->nbytes);
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp((*(const struct zs_st_tensor *const *)a)->name, (*(const struct zs_st_tensor *const *)b)->name);
}

/* The data must be tiled exactly: sorted by offset, each tensor starts where the previous one ended. */
static int check_layout(struct zs_st *st, uint64_t data_start, char *err, size_t errlen)
{
    uint64_t at = 0;
    char pn[80], pp[80];

    qsort(st->tensors, (size_t)st->ntensors, sizeof(*st->tensors), cmp_offset);
    for (int i = 0; i < st->ntensors; i++) {
        struct zs_st_tensor *t = &st->tensors[i];

        if (t->offset != at)
            return zs_st_msg(err, errlen, -EINVAL, "%s: \"%s\".data_offsets: begins at %llu, %s %s%s%s ends at %llu",
                           st->what, printable(t->name, pn, sizeof(pn)), (unsigned long long)t->offset,
                           t->offset > at ? "leaving a gap:" : "overlapping:", i ? "\"" : "the start of data",
                           i ? printable(st->tensors[i - 1].name, pp, sizeof(pp)) : "", i ? "\"" : "",
                           (unsigned long long)at);
        at += t->nbytes;
        t->offset += data_start;
    }
    if (at != st->data_len)
        return zs_st_msg(err, errlen, -EINVAL, "%s: data_offsets: tensors end at byte %llu of the data, but the "
                       "file holds %llu bytes of data", st->what, (unsigned long long)at,
                       (unsigned long long)st->data_len);
    for (int i = 0; i < st->ntensors; i++)
        st->by_name[i] = &st->tensors[i];
    qsort(st->by_name, (size_t)st->ntensors, sizeof(*st->by_name), cmp_name);
    return 0;
}

static int parse_root(struct zs_st *st, uint64_t data_start, char *err, size_t errlen)
{
    size_t n = json_object_size(st->root);
    const char *key;
    json_t *v;

    st->tensors = calloc(n + 1, sizeof(*st->tensors));
    st->by_name = calloc(n + 1, sizeof(*st->by_name));
    if (!st->tensors || !st->by_name || n > INT32_MAX)
        return zs_st_msg(err, errlen, -ENOMEM, "%s: out of memory for %zu tensors", st->what, n);
    json_object_foreach(st->root, key, v) {
        int rc = strcmp(key, "__metadata__") == 0
                     ? parse_meta(st, v, err, errlen)
                     : (key[0] ? parse_tensor(st->what, key, v, &st->tensors[st->ntensors++], err, errlen)
                               : zs_st_msg(err, errlen, -EINVAL, "%s: \"\": empty tensor name", st->what));
        if (rc)
            return rc;
    }
    return check_layout(st, data_start, err, errlen);
}

static int st_new(struct zs_st **st, const char *what, int fd, const void *mem, char *err, size_t errlen)
{
    *st = calloc(1, sizeof(**st));
    if (*st)
        (*st)->what = strdup(what ? what : "safetensors");
    if (!*st || !(*st)->what) {
        free(*st);
        *st = NULL;
        return zs_st_msg(err, errlen, -ENOMEM, "%s: out of memory", what);
    }
    (*st)->fd = fd;
    (*st)->mem = mem;
    return 0;
}

/* Parses into a fresh struct; on failure it is freed (the fd with it: the caller hands it over). */
static int st_parse(struct zs_st **out, const char *json, size_t len, uint64_t data_len, const char *what, int fd,
                    const void *mem, char *err, size_t errlen)
{
    struct zs_st *st;
    json_error_t je;
    int rc = st_new(&st, what, fd, mem, err, errlen);

    *out = NULL;
    if (rc) {
        if (fd >= 0)
            close(fd);
        return rc;
    }
    st->data_len = data_len;
    st->root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &je);
    if (!st->root)
        rc = zs_st_msg(err, errlen, -EINVAL, "%s: header: invalid JSON at byte %d: %s", st->what, je.position, je.text);
    else if (!json_is_object(st->root))
        rc = zs_st_msg(err, errlen, -EINVAL, "%s: header: not a JSON object", st->what);
    else
        rc = parse_root(st, 8 + (uint64_t)len, err, errlen);
    if (rc)
        zs_st_close(st);
    else
        *out = st;
    return rc;
}

int zs_st_parse_header(struct zs_st **st, const char *json, size_t len, uint64_t data_len, const char *what,
                       char *err, size_t errlen)
{
    return st_parse(st, json, len, data_len, what, -1, NULL, err, errlen);
}

/* The 8-byte length must leave room for itself inside the file and stay under the format's limit. */
static int check_prefix(const unsigned char *p8, uint64_t file_size, const char *what, uint64_t *n, char *err,
                        size_t errlen)
{
    *n = 0;
    for (int i = 7; i >= 0; i--)
        *n = *n << 8 | p8[i];
    if (*n > ZS_ST_MAX_HEADER)
        return zs_st_msg(err, errlen, -EINVAL, "%s: header length %llu exceeds the %llu-byte limit", what,
                       (unsigned long long)*n, ZS_ST_MAX_HEADER);
    if (*n > file_size - 8)
        return zs_st_msg(err, errlen, -EINVAL, "%s: header length %llu runs past the end of the file (%llu bytes)",
                       what, (unsigned long long)*n, (unsigned long long)file_size);
    return 0;
}

int zs_st_open_mem(struct zs_st **st, const void *buf, size_t len, const char *what, char *err, size_t errlen)
{
    uint64_t n;
    int rc;

    *st = NULL;
    what = what ? what : "safetensors";
    if (len < 8)
        return zs_st_msg(err, errlen, -EINVAL, "%s: %zu bytes: too short for the 8-byte header length", what, len);
    rc = check_prefix(buf, len, what, &n, err, errlen);
    return rc ? rc : st_parse(st, (const char *)buf + 8, (size_t)n, len - 8 - n, what, -1, buf, err, errlen);
}

int zs_st_open(struct zs_st **st, const char *path, char *err, size_t errlen)
{
    unsigned char p8[8];
    struct stat sb;
    char *json;
    uint64_t n = 0;
    int fd, rc;

    *st = NULL;
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return zs_st_msg(err, errlen, -errno, "%s: cannot open: %s", path, strerror(errno));
    if (fstat(fd, &sb) || !S_ISREG(sb.st_mode) || sb.st_size < 8)
        rc = zs_st_msg(err, errlen, -EINVAL, "%s: not a regular file of at least 8 bytes", path);
    else if (pread(fd, p8, 8, 0) != 8)
        rc = zs_st_msg(err, errlen, -EIO, "%s: cannot read the header length", path);
    else
        rc = check_prefix(p8, (uint64_t)sb.st_size, path, &n, err, errlen);
    json = rc ? NULL : malloc(n ? (size_t)n : 1);
    if (!rc && !json)
        rc = zs_st_msg(err, errlen, -ENOMEM, "%s: out of memory for a %llu-byte header", path, (unsigned long long)n);
    else if (!rc && pread(fd, json, (size_t)n, 8) != (ssize_t)n)
        rc = zs_st_msg(err, errlen, -EIO, "%s: short read of the %llu-byte header", path, (unsigned long long)n);
    if (rc) {
        free(json);
        close(fd);
        return rc;
    }
    rc = st_parse(st, json, (size_t)n, (uint64_t)sb.st_size - 8 - n, path, fd, NULL, err, errlen); /* owns fd */
    free(json);
    return rc;
}

void zs_st_close(struct zs_st *st)
{
    if (!st)
        return;
    if (st->fd >= 0)
        close(st->fd);
    json_decref(st->root);
    free(st->tensors);
    free(st->by_name);
    free(st->meta_keys);
    free(st->meta_vals);
    free(st->what);
    free(st);
}

// ----------------------------------------------------------------------------------- lookups, reads

int zs_st_count(const struct zs_st *st)
{
    return st->ntensors;
}

const struct zs_st_tensor *zs_st_get(const struct zs_st *st, int i)
{
    return i >= 0 && i < st->ntensors ? &st->tensors[i] : NULL;
}

const struct zs_st_tensor *zs_st_find(const struct zs_st *st, const char *name)
{
    struct zs_st_tensor key = {.name = name};
    const struct zs_st_tensor *kp = &key, **hit;

    hit = bsearch(&kp, st->by_name, (size_t)st->ntensors, sizeof(*st->by_name), cmp_name);
    return hit ? *hit : NULL;
}

int zs_st_meta_count(const struct zs_st *st)
{
    return st->nmeta;
}

const char *zs_st_meta_get(const struct zs_st *st, int i, const char **key)
{
    if (i < 0 || i >= st->nmeta)
        return NULL;
    *key = st->meta_keys[i];
    return st->meta_vals[i];
}

const char *zs_st_meta_find(const struct zs_st *st, const char *key)
{
    for (int i = 0; i < st->nmeta; i++)
        if (strcmp(st->meta_keys[i], key) == 0)
            return st->meta_vals[i];
    return NULL;
}

static int read_bytes(struct zs_st *st, void *dst, size_t n, uint64_t off, char *err, size_t errlen)
{
    char *p = dst;

    if (st->mem) {
        memcpy(dst, st->mem + off, n);
        return 0;
    }
    while (n) {
        ssize_t r = st->fd < 0 ? -1 : pread(st->fd, p, n, (off_t)off);

        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return zs_st_msg(err, errlen, r ? -EIO : -ENODATA, "%s: read at byte offset %llu: %s", st->what,
                           (unsigned long long)off, st->fd < 0 ? "no file behind this header" :
                           r ? strerror(errno) : "unexpected end of file");
        p += r, n -= (size_t)r, off += (uint64_t)r;
    }
    return 0;
}

int zs_st_read_f32(struct zs_st *st, const struct zs_st_tensor *t, int64_t first, int64_t count, float *dst,
                   char *err, size_t errlen)
{
    uintptr_t tp = (uintptr_t)t, lo = (uintptr_t)st->tensors, hi = (uintptr_t)(st->tensors + st->ntensors);
    uint16_t half[4096];
    char pn[80];

    if (tp < lo || tp >= hi)
        return zs_st_msg(err, errlen, -EINVAL, "%s: tensor not from this file", st->what);
    if (first < 0 || count < 0 || first > t->numel || count > t->numel - first)
        return zs_st_msg(err, errlen, -EINVAL, "%s: \"%s\": elements [%lld, +%lld) outside its %lld", st->what,
                       printable(t->name, pn, sizeof(pn)), (long long)first, (long long)count, (long long)t->numel);
    if (t->dtype == ZS_ST_F32)
        return read_bytes(st, dst, (size_t)count * 4, t->offset + (uint64_t)first * 4, err, errlen);
    if (t->dtype != ZS_ST_F16 && t->dtype != ZS_ST_BF16)
        return zs_st_msg(err, errlen, -ENOTSUP, "%s: \"%s\": dtype %s is not read as fp32", st->what,
                       printable(t->name, pn, sizeof(pn)), dtype_names[t->dtype]);
    for (int64_t done = 0; done < count;) {
        int64_t n = count - done < 4096 ? count - done : 4096;
        int rc = read_bytes(st, half, (size_t)n * 2, t->offset + (uint64_t)(first + done) * 2, err, errlen);

        if (rc)
            return rc;
        for (int64_t i = 0; i < n; i++)
            dst[done + i] = t->dtype == ZS_ST_F16 ? zs_cvt_f16_f32(half[i]) : zs_cvt_bf16_f32(half[i]);
        done += n;
    }
    return 0;
}
