/* ckpt_files.c - reading a checkpoint from disk: the manifest, element ranges of the data files (pread on
 * descriptors opened lazily and cached), whole-file checksums, and finding the tag through DIR/latest. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "offload/swap.h"          /* defines: zs_crc32c */
#include "ckpt_format.h"   /* defines: struct zs_ckpt_manifest, zs_ckpt_manifest_parse */

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "checkpoint data files are little-endian fp32 read in place: a big-endian host needs byte swaps here"
#endif

#define MANIFEST_MAX_BYTES (1ull << 30) /* far above any real manifest; stops a wrong file eating memory */
/* A manifest takes some 100 bytes per segment and per parameter, each of which covers at least 4 data
 * bytes: a real one stays far below this many bytes per data byte, plus a floor for tiny models. */
#define MANIFEST_PER_DATA_BYTE 64
#define MANIFEST_FLOOR (1ull << 20)
#define VERIFY_BUFFER (4u << 20)

/* Opens name inside dir read-only, refusing a symlink: a checkpoint names plain files of its own. */
static int open_in(const char *dir, const char *name, char *path, size_t pathlen, char *err, size_t errlen)
{
    int fd;

    if ((size_t)snprintf(path, pathlen, "%s/%s", dir, name) >= pathlen) {
        snprintf(err, errlen, "%s/%s: path too long", dir, name);
        return -1;
    }
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
    return fd;
}

/* Reads exactly n bytes at off; a short file is an error naming the offset where the data ran out. */
static int pread_full(int fd, void *buf, size_t n, uint64_t off, const char *path, char *err, size_t errlen)
{
    char *p = buf;

    while (n) {
        ssize_t r = pread(fd, p, n, (off_t)off);

        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            snprintf(err, errlen, "%s: read at byte offset %llu: %s", path, (unsigned long long)off,
                     r ? strerror(errno) : "unexpected end of file (file shorter than the manifest says)");
            return -1;
        }
        p += r, n -= (size_t)r, off += (uint64_t)r;
    }
    return 0;
}

/* The bytes of the regular files in dir other than the manifest: all the data a manifest can describe. */
static uint64_t data_bytes(const char *dir)
{
    uint64_t sum = 0;
    struct dirent *e;
    struct stat st;
    DIR *d = opendir(dir);

    if (!d)
        return 0;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ZS_CKPT_MANIFEST) && !fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) &&
            S_ISREG(st.st_mode))
            sum += (uint64_t)st.st_size;
    closedir(d);
    return sum;
}

int zs_ckpt_manifest_load(struct zs_ckpt_manifest *m, const char *tag_dir, char *err, size_t errlen)
{
    char path[PATH_MAX];
    struct stat st;
    char *text = NULL;
    uint64_t data = data_bytes(tag_dir), cap;
    int fd, rc = -1;

    memset(m, 0, sizeof(*m));
    fd = open_in(tag_dir, ZS_CKPT_MANIFEST, path, sizeof(path), err, errlen);
    if (fd < 0)
        return -1;
    cap = data > (MANIFEST_MAX_BYTES - MANIFEST_FLOOR) / MANIFEST_PER_DATA_BYTE
              ? MANIFEST_MAX_BYTES : MANIFEST_FLOOR + data * MANIFEST_PER_DATA_BYTE;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "%s: not a regular file", path);
        goto out;
    }
    if ((uint64_t)st.st_size > cap) { /* refused unread: every rank would parse it and size tables from it */
        snprintf(err, errlen, "%s: %llu bytes, more than a manifest of the %llu bytes of data files beside it can "
                 "need (at most %llu)", path, (unsigned long long)st.st_size, (unsigned long long)data,
                 (unsigned long long)cap);
        goto out;
    }
    text = malloc((size_t)st.st_size + 1);
    if (!text)
        snprintf(err, errlen, "%s: out of memory", path);
    else if (!pread_full(fd, text, (size_t)st.st_size, 0, path, err, errlen))
        rc = zs_ckpt_manifest_parse_bounded(m, text, (size_t)st.st_size, path, data, err, errlen);
out:
    free(text);
    close(fd);
    return rc;
}

// ----------------------------------------------------------------------------------- reader

struct zs_ckpt_reader {
    const struct zs_ckpt_manifest *m;
    char *dir;
    int *fds;          /* per file, -1 until first read */
    int64_t *order;    /* segment indices sorted by (unit, kind, begin) */
    int64_t *group;    /* order[group[g] .. group[g+1]) are the segments of unit g / NKINDS, kind g % NKINDS */
};

static int seg_cmp(const void *a, const void *b, void *ctx)
{
    const struct zs_ckpt_manifest *m = ctx;
    const struct zs_ckpt_seg *x = &m->segs[*(const int64_t *)a], *y = &m->segs[*(const int64_t *)b];
    int64_t kx = (int64_t)x->unit * ZS_CKPT_NKINDS + x->kind, ky = (int64_t)y->unit * ZS_CKPT_NKINDS + y->kind;

    if (kx != ky)
        return kx < ky ? -1 : 1;
    return (x->begin > y->begin) - (x->begin < y->begin);
}

int zs_ckpt_reader_open(struct zs_ckpt_reader **rp, const struct zs_ckpt_manifest *m, const char *tag_dir,
                        char *err, size_t errlen)
{
    struct zs_ckpt_reader *r = calloc(1, sizeof(*r));
    size_t ngroups = (size_t)m->nunits * ZS_CKPT_NKINDS + 1;

    *rp = NULL;
    if (r) {
        r->m = m;
        r->dir = strdup(tag_dir);
        r->fds = malloc((size_t)(m->nfiles ? m->nfiles : 1) * sizeof(*r->fds));
        r->order = malloc((size_t)(m->nsegs ? m->nsegs : 1) * sizeof(*r->order));
        r->group = calloc(ngroups, sizeof(*r->group));
    }
    if (!r || !r->dir || !r->fds || !r->order || !r->group) {
        snprintf(err, errlen, "%s: out of memory for the checkpoint reader", tag_dir);
        zs_ckpt_reader_close(r);
        return -1;
    }
    for (int32_t i = 0; i < m->nfiles; i++)
        r->fds[i] = -1;
    for (int64_t i = 0; i < m->nsegs; i++)
        r->order[i] = i;
    qsort_r(r->order, (size_t)m->nsegs, sizeof(*r->order), seg_cmp, (void *)m);
    /* counting pass, then prefix sums: group[g] becomes the first position of group g */
    for (int64_t i = 0; i < m->nsegs; i++)
        r->group[(size_t)m->segs[i].unit * ZS_CKPT_NKINDS + (size_t)m->segs[i].kind + 1]++;
    for (size_t g = 1; g < ngroups; g++)
        r->group[g] += r->group[g - 1];
    *rp = r;
    return 0;
}

static int reader_fd(struct zs_ckpt_reader *r, int32_t file, char *path, size_t pathlen, char *err, size_t errlen)
{
    if ((size_t)snprintf(path, pathlen, "%s/%s", r->dir, r->m->files[file].name) >= pathlen)
        path[pathlen - 1] = '\0';
    if (r->fds[file] < 0)
        r->fds[file] = open_in(r->dir, r->m->files[file].name, path, pathlen, err, errlen);
    return r->fds[file];
}

int zs_ckpt_read_range(struct zs_ckpt_reader *r, int32_t unit, int kind, int64_t begin, int64_t count, float *dst,
                       char *err, size_t errlen)
{
    const struct zs_ckpt_manifest *m = r->m;
    int64_t lo, hi, end = begin + count;
    char path[PATH_MAX];

    if (unit < 0 || unit >= m->nunits || kind < 0 || kind >= ZS_CKPT_NKINDS || begin < 0 || count < 0 ||
        begin > m->units[unit].numel || count > m->units[unit].numel - begin) {
        snprintf(err, errlen, "%s: read of units[%d] kind %d elements [%lld, +%lld) is outside the checkpoint",
                 r->dir, unit, kind, (long long)begin, (long long)count);
        return -1;
    }
    lo = r->group[(size_t)unit * ZS_CKPT_NKINDS + (size_t)kind];
    hi = r->group[(size_t)unit * ZS_CKPT_NKINDS + (size_t)kind + 1];
    /* binary search: the last segment that starts at or before begin */
    for (int64_t a = lo, b = hi; a < b;) {
        int64_t mid = a + (b - a) / 2;

        if (m->segs[r->order[mid]].begin <= begin)
            lo = mid, a = mid + 1;
        else
            b = mid;
    }
    for (int64_t at = begin, i = lo; at < end; i++) {
        const struct zs_ckpt_seg *s = i < hi ? &m->segs[r->order[i]] : NULL;
        int64_t n;
        int fd;

        if (!s || s->begin > at || s->begin + s->count <= at) {
            snprintf(err, errlen, "%s: units[%d] %s element %lld is in no segment of the manifest", r->dir, unit,
                     zs_ckpt_kind_name(kind), (long long)at);
            return -1;
        }
        n = (s->begin + s->count < end ? s->begin + s->count : end) - at;
        fd = reader_fd(r, s->file, path, sizeof(path), err, errlen);
        if (fd < 0 || pread_full(fd, dst + (at - begin), (size_t)n * 4, s->offset + (uint64_t)(at - s->begin) * 4,
                                 path, err, errlen))
            return -1;
        at += n;
    }
    return 0;
}

void zs_ckpt_reader_close(struct zs_ckpt_reader *r)
{
    if (!r)
        return;
    for (int32_t i = 0; r->fds && i < r->m->nfiles; i++)
        if (r->fds[i] >= 0)
            close(r->fds[i]);
    free(r->fds);
    free(r->order);
    free(r->group);
    free(r->dir);
    free(r);
}

// ----------------------------------------------------------------------------------- verify, resolve

int zs_ckpt_verify_file(const struct zs_ckpt_manifest *m, const char *tag_dir, int32_t file, char *err,
                        size_t errlen)
{
    const struct zs_ckpt_file *f = &m->files[file];
    char path[PATH_MAX];
    struct stat st;
    unsigned char *buf = NULL;
    uint32_t crc = 0;
    int fd, rc = -1;

    fd = open_in(tag_dir, f->name, path, sizeof(path), err, errlen);
    if (fd < 0)
        return -1;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "%s: not a regular file", path);
        goto out;
    }
    if ((uint64_t)st.st_size != f->bytes) {
        snprintf(err, errlen, "%s: %s at byte offset %llu: manifest says %llu bytes", path,
                 (uint64_t)st.st_size < f->bytes ? "ends" : "goes on", (unsigned long long)st.st_size,
                 (unsigned long long)f->bytes);
        goto out;
    }
    buf = malloc(VERIFY_BUFFER);
    if (!buf) {
        snprintf(err, errlen, "%s: out of memory", path);
        goto out;
    }
    for (uint64_t off = 0; off < f->bytes;) {
        size_t n = f->bytes - off < VERIFY_BUFFER ? (size_t)(f->bytes - off) : VERIFY_BUFFER;

        if (pread_full(fd, buf, n, off, path, err, errlen))
            goto out;
        crc = zs_crc32c(crc, buf, n);
        off += n;
    }
    if (crc != f->crc32c) {
        snprintf(err, errlen, "%s: crc32c 0x%08x != manifest 0x%08x", path, crc, f->crc32c);
        goto out;
    }
    rc = 0;
out:
    free(buf);
    close(fd);
    return rc;
}

int zs_ckpt_verify(const struct zs_ckpt_manifest *m, const char *tag_dir, char *err, size_t errlen)
{
    for (int32_t i = 0; i < m->nfiles; i++)
        if (zs_ckpt_verify_file(m, tag_dir, i, err, errlen))
            return -1;
    return 0;
}

/* DIR/latest holds a tag name, perhaps with a trailing newline; anything that could leave DIR is refused. */
int zs_ckpt_read_latest(const char *dir, char *tag, size_t taglen, char *err, size_t errlen)
{
    char path[PATH_MAX];
    ssize_t n;
    int fd = open_in(dir, ZS_CKPT_LATEST, path, sizeof(path), err, errlen);

    if (fd < 0) {
        snprintf(err, errlen, "%s: not a checkpoint: neither %s nor %s found", dir, ZS_CKPT_MANIFEST, ZS_CKPT_LATEST);
        return -1;
    }
    n = read(fd, tag, taglen);
    close(fd);
    if (n < 0 || (size_t)n >= taglen) {
        snprintf(err, errlen, "%s: %s", path, n < 0 ? strerror(errno) : "longer than a tag name can be");
        return -1;
    }
    tag[n] = '\0';
    if (n > 0 && tag[n - 1] == '\n')
        tag[--n] = '\0';
    if (strlen(tag) != (size_t)n || !zs_ckpt_name_ok(tag)) {
        snprintf(err, errlen, "%s: '%.64s' is not a plain tag name", path, tag);
        return -1;
    }
    return 0;
}

int zs_ckpt_resolve(const char *dir, char *out, size_t outlen, char *err, size_t errlen)
{
    char path[PATH_MAX], tag[NAME_MAX + 2];
    struct stat st;

    if ((size_t)snprintf(path, sizeof(path), "%s/%s", dir, ZS_CKPT_MANIFEST) >= sizeof(path)) {
        snprintf(err, errlen, "%s: path too long", dir);
        return -1;
    }
    if (stat(path, &st) == 0) {
        if ((size_t)snprintf(out, outlen, "%s", dir) < outlen)
            return 0;
        snprintf(err, errlen, "%s: path too long", dir);
        return -1;
    }
    if (zs_ckpt_read_latest(dir, tag, sizeof(tag), err, errlen))
        return -1;
    if ((size_t)snprintf(out, outlen, "%s/%s", dir, tag) >= outlen) {
        snprintf(err, errlen, "%s/%s: path too long", dir, tag);
        return -1;
    }
    if ((size_t)snprintf(path, sizeof(path), "%s/%s", out, ZS_CKPT_MANIFEST) >= sizeof(path) || stat(path, &st)) {
        snprintf(err, errlen, "%s/%s names tag '%s', but %s/%s: %s", dir, ZS_CKPT_LATEST, tag, out, ZS_CKPT_MANIFEST,
                 strerror(errno));
        return -1;
    }
    return 0;
}
