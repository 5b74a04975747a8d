/* safetensors_write.c - the streaming safetensors writer: the header is fixed from the tensor sizes before
 * any data, so a model of any size goes out through a bounded buffer; the file appears under its name
 * only once complete and on disk (path.tmp, fsync, rename, fsync of the directory). */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>       /* defines: json_object, json_dumps */

#include "safetensors.h"   /* defines: struct zs_st_tensor, zs_st_dtype_size */

struct zs_st_writer {
    int fd;
    char *path, *tmp;
    uint64_t header_bytes;   /* 8 + padded JSON */
    uint64_t data_bytes;     /* promised by the header */
    uint64_t written;        /* data bytes appended so far */
    bool failed;             /* an append failed: the file cannot be completed */
};

/* One header entry; *at advances past the tensor's bytes. */
static int add_tensor(json_t *root, const char *path, int i, const struct zs_st_tensor *t, uint64_t *at,
                      char *err, size_t errlen)
{
    json_t *o, *shape;
    int64_t nbytes = zs_st_dtype_size(t->dtype);
    bool bad = false;

    if (!t->name || !t->name[0] || strcmp(t->name, "__metadata__") == 0 || json_object_get(root, t->name))
        return zs_st_msg(err, errlen, -EINVAL, "%s: tensors[%d].name: missing, reserved or repeated", path, i);
    if (!nbytes || t->ndim < 0 || t->ndim > ZS_ST_MAX_DIMS)
        return zs_st_msg(err, errlen, -EINVAL, "%s: tensors[%d] (%s): bad dtype %d or ndim %d", path, i, t->name,
                      (int)t->dtype, t->ndim);
    shape = json_array();
    for (int32_t d = 0; d < t->ndim; d++) {
        if (t->shape[d] < 0 || __builtin_mul_overflow(nbytes, t->shape[d], &nbytes))
            bad = true;
        else if (json_array_append_new(shape, json_integer(t->shape[d])))
            bad = true;
    }
    if (bad || (uint64_t)nbytes > (uint64_t)INT64_MAX - *at) {
        json_decref(shape);
        return zs_st_msg(err, errlen, -EOVERFLOW, "%s: tensors[%d] (%s).shape: negative or too large", path, i,
                      t->name);
    }
    o = json_pack("{s:s, s:o, s:[I, I]}", "dtype", zs_st_dtype_name(t->dtype), "shape", shape, "data_offsets",
                  (json_int_t)*at, (json_int_t)(*at + (uint64_t)nbytes));
    if (!o || json_object_set_new(root, t->name, o))
        return zs_st_msg(err, errlen, -EINVAL, "%s: tensors[%d].name: not valid UTF-8 (or out of memory)", path, i);
    *at += (uint64_t)nbytes;
    return 0;
}

static int add_meta(json_t *root, const char *path, const char *const *meta, char *err, size_t errlen)
{
    json_t *o = json_object();

    if (json_object_set_new(root, "__metadata__", o))
        return zs_st_msg(err, errlen, -ENOMEM, "%s: out of memory", path);
    for (int i = 0; meta[i]; i += 2)
        if (!meta[i + 1] || json_object_set_new(o, meta[i], json_string(meta[i + 1])))
            return zs_st_msg(err, errlen, -EINVAL, "%s: __metadata__.%s: value missing or not valid UTF-8", path,
                          meta[i]);
    return 0;
}

static int write_full(struct zs_st_writer *w, const void *buf, size_t n, uint64_t off, char *err, size_t errlen)
{
    const char *p = buf;

    while (n) {
        ssize_t r = write(w->fd, p, n);

        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            w->failed = true;
            return zs_st_msg(err, errlen, -errno, "%s: write at byte offset %llu: %s", w->tmp, (unsigned long long)off,
                          strerror(errno));
        }
        p += r, n -= (size_t)r, off += (uint64_t)r;
    }
    return 0;
}

/* The 8-byte length and the JSON, padded with spaces so the data start 8-byte aligned. */
static int write_header(struct zs_st_writer *w, json_t *root, char *err, size_t errlen)
{
    char *json = json_dumps(root, JSON_COMPACT);
    size_t len = json ? strlen(json) : 0, padded = (len + 7) & ~(size_t)7;
    unsigned char *buf = json ? malloc(8 + padded) : NULL;
    int rc;

    if (!buf) {
        free(json);
        return zs_st_msg(err, errlen, -ENOMEM, "%s: out of memory for the header", w->path);
    }
    for (int i = 0; i < 8; i++)
        buf[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    memcpy(buf + 8, json, len);
    memset(buf + 8 + len, ' ', padded - len);
    w->header_bytes = 8 + padded;
    rc = padded > ZS_ST_MAX_HEADER ? zs_st_msg(err, errlen, -E2BIG, "%s: header of %zu bytes exceeds the format's "
                                            "limit", w->path, padded)
                                   : write_full(w, buf, 8 + padded, 0, err, errlen);
    free(buf);
    free(json);
    return rc;
}

static void writer_free(struct zs_st_writer *w)
{
    if (w->fd >= 0)
        close(w->fd);
    free(w->path);
    free(w->tmp);
    free(w);
}

int zs_st_writer_open(struct zs_st_writer **wp, const char *path, const struct zs_st_tensor *tensors, int n,
                      const char *const *meta, char *err, size_t errlen)
{
    struct zs_st_writer *w = calloc(1, sizeof(*w));
    json_t *root = json_object();
    int rc = 0;

    *wp = NULL;
    if (w)
        w->fd = -1;
    if (!w || !root || !(w->path = strdup(path)) || asprintf(&w->tmp, "%s.tmp", path) < 0) {
        if (w)
            w->tmp = NULL; /* asprintf leaves it undefined on failure */
        rc = zs_st_msg(err, errlen, -ENOMEM, "%s: out of memory", path);
    }
    if (!rc && meta && meta[0])
        rc = add_meta(root, path, meta, err, errlen);
    for (int i = 0; !rc && i < n; i++)
        rc = add_tensor(root, path, i, &tensors[i], &w->data_bytes, err, errlen);
    if (!rc) {
        w->fd = open(w->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
        rc = w->fd < 0 ? zs_st_msg(err, errlen, -errno, "%s: cannot create: %s", w->tmp, strerror(errno))
                       : write_header(w, root, err, errlen);
        if (rc && w->fd >= 0)
            unlink(w->tmp);
    }
    json_decref(root);
    if (rc) {
        if (w)
            writer_free(w);
        return rc;
    }
    *wp = w;
    return 0;
}

int zs_st_writer_append(struct zs_st_writer *w, const void *data, size_t bytes, char *err, size_t errlen)
{
    int rc;

    if (w->failed)
        return zs_st_msg(err, errlen, -EIO, "%s: an earlier write failed", w->tmp);
    if (bytes > w->data_bytes - w->written) {
        w->failed = true;
        return zs_st_msg(err, errlen, -EINVAL, "%s: %zu more bytes than the header promised (%llu of %llu written)",
                      w->path, bytes, (unsigned long long)w->written, (unsigned long long)w->data_bytes);
    }
    rc = write_full(w, data, bytes, w->header_bytes + w->written, err, errlen);
    if (!rc)
        w->written += bytes;
    return rc;
}

/* The rename is durable only once the directory entry is on disk too. */
static int sync_dir(const char *path, char *err, size_t errlen)
{
    const char *slash = strrchr(path, '/');
    char *dir = slash ? strndup(path, slash == path ? 1 : (size_t)(slash - path)) : strdup(".");
    int fd = dir ? open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1, rc = 0;

    if (fd < 0 || (fsync(fd) && errno != EINVAL))
        rc = zs_st_msg(err, errlen, -errno, "%s: cannot sync the directory after the rename: %s", path,
                    strerror(errno));
    if (fd >= 0)
        close(fd);
    free(dir);
    return rc;
}

int zs_st_writer_close(struct zs_st_writer *w, char *err, size_t errlen)
{
    int rc = 0, fd = w->fd;

    if (w->failed || w->written != w->data_bytes)
        rc = zs_st_msg(err, errlen, -EIO, "%s: incomplete: %llu of %llu tensor bytes written%s", w->path,
                    (unsigned long long)w->written, (unsigned long long)w->data_bytes,
                    w->failed ? " before an error" : "");
    else if (fsync(fd))
        rc = zs_st_msg(err, errlen, -errno, "%s: fsync: %s", w->tmp, strerror(errno));
    w->fd = -1;
    if (close(fd) && !rc)
        rc = zs_st_msg(err, errlen, -errno, "%s: close: %s", w->tmp, strerror(errno));
    if (!rc && rename(w->tmp, w->path))
        rc = zs_st_msg(err, errlen, -errno, "%s: rename from %s: %s", w->path, w->tmp, strerror(errno));
    if (rc)
        unlink(w->tmp);
    else
        rc = sync_dir(w->path, err, errlen);
    writer_free(w);
    return rc;
}

void zs_st_writer_abort(struct zs_st_writer *w)
{
    if (!w)
        return;
    unlink(w->tmp);
    writer_free(w);
}

uint64_t zs_st_writer_file_bytes(const struct zs_st_writer *w)
{
    return w->header_bytes + w->data_bytes;
}
