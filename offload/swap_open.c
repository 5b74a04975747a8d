/* swap_open.c - the swapper's set-up and teardown: options checked, the file created (O_DIRECT where the
 * filesystem takes it), the io_uring made, the pinned region registered, the file reserved; and its queries. */
#include <errno.h>
#include <fcntl.h>
#include <liburing.h> /* defines: io_uring_queue_init, io_uring_register_buffers, io_uring_queue_exit */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "base/test_hooks.h" /* defines: ZS_TEST_HOOK_SWAP_BUFFERED */
#include "swap_impl.h" /* defines: struct zs_swap, swap_fail */

/* ---------------------------------------------------------------- open, register, close */

static int opts_check(const struct zs_swap_opts *o, char *err, size_t errlen)
{
    if (!o || !o->dir || !o->name)
        return zs_swap_msg(err, errlen, -EINVAL, "swap: need a directory and a file name");
    if (!*o->name || strchr(o->name, '/') || !strcmp(o->name, ".") || !strcmp(o->name, ".."))
        return zs_swap_msg(err, errlen, -EINVAL, "swap: file name '%s' must be a plain name inside %s", o->name,
                        o->dir);
    if (!o->block_size || o->block_size % SWAP_ALIGN || o->block_size > SWAP_MAX_BLOCK)
        return zs_swap_msg(err, errlen, -EINVAL, "swap: block_size %u must be a multiple of 4096 up to 1 GiB",
                        o->block_size);
    if (!o->queue_depth || o->queue_depth > SWAP_MAX_QD)
        return zs_swap_msg(err, errlen, -EINVAL, "swap: queue_depth %u must be 1..%u", o->queue_depth, SWAP_MAX_QD);
    return 0;
}

/* Test hook: ZS_TEST_SWAP_BUFFERED=1 makes every file behave as on a file system that refuses O_DIRECT
 * (buffered, and reported so), for tests of what callers do with the fallback (zs-bench swap must then
 * refuse its comparison with fio --direct=1). */
static bool test_no_direct(void)
{
    const char *v = getenv(ZS_TEST_HOOK_SWAP_BUFFERED);

    return v && !strcmp(v, "1");
}

/* Creates the file without O_DIRECT and asks for O_DIRECT afterwards with fcntl: an open with O_DIRECT
 * that the filesystem refuses can leave the file created, and O_EXCL would then refuse the retry. */
static int file_create(struct zs_swap *s, const struct zs_swap_opts *o, char *err, size_t errlen)
{
    bool direct = o->direct && !test_no_direct();
    int dfd, fl, rc = 0;

    dfd = open(o->dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dfd < 0)
        return zs_swap_msg(err, errlen, -errno, "%s: %s", o->dir, strerror(errno));
    s->fd = openat(dfd, o->name, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (s->fd < 0) {
        rc = zs_swap_msg(err, errlen, -errno, "%s: %s", s->path, strerror(errno));
        goto out_close_dir;
    }
    fl = fcntl(s->fd, F_GETFL);
    if (direct && fl >= 0 && fcntl(s->fd, F_SETFL, fl | O_DIRECT) == 0)
        s->direct = true;
    else if (direct && errno != EINVAL) /* EINVAL: the filesystem has no direct I/O; go buffered */
        rc = zs_swap_msg(err, errlen, -errno, "%s: cannot enable O_DIRECT: %s", s->path, strerror(errno));
    if (rc) {
        close(s->fd);
        s->fd = -1;
        unlinkat(dfd, o->name, 0);
    }
out_close_dir:
    close(dfd);
    return rc;
}

int zs_swap_open(struct zs_swap **out, const struct zs_swap_opts *o, char *err, size_t errlen)
{
    struct zs_swap *s;
    int rc;

    *out = NULL;
    rc = opts_check(o, err, errlen);
    if (rc)
        return rc;
    s = calloc(1, sizeof(*s));
    if (!s)
        return zs_swap_msg(err, errlen, -ENOMEM, "swap: out of memory");
    s->fd = -1;
    s->hang_fd[0] = s->hang_fd[1] = -1;
    s->timeout_s = o->timeout_s > 0 ? o->timeout_s : SWAP_TIMEOUT_DEFAULT;
    s->block_size = o->block_size;
    s->qd = o->queue_depth;
    s->verify = o->verify;
    s->next_ticket = 1;
    if ((size_t)snprintf(s->path, sizeof(s->path), "%s/%s", o->dir, o->name) >= sizeof(s->path)) {
        rc = zs_swap_msg(err, errlen, -ENAMETOOLONG, "swap: path %s/%s too long", o->dir, o->name);
        goto out_free;
    }
    s->recs = calloc(s->qd, sizeof(*s->recs));
    if (!s->recs) {
        rc = zs_swap_msg(err, errlen, -ENOMEM, "swap: out of memory");
        goto out_free;
    }
    for (uint32_t i = 0; i < s->qd; i++)
        s->recs[i].next = i + 1 < s->qd ? &s->recs[i + 1] : NULL;
    s->free_recs = s->recs;
    /* the SQ gets queue_depth entries and the CQ twice that, so completions can never overflow */
    rc = io_uring_queue_init(s->qd, &s->ring, 0);
    if (rc < 0) {
        rc = zs_swap_msg(err, errlen, rc, "io_uring unavailable: %s", strerror(-rc));
        goto out_free;
    }
    rc = file_create(s, o, err, errlen);
    if (rc)
        goto out_exit_ring;
    *out = s;
    return 0;

out_exit_ring:
    io_uring_queue_exit(&s->ring);
out_free:
    free(s->recs);
    free(s);
    return rc;
}

int zs_swap_register(struct zs_swap *s, void *buf, size_t bytes)
{
    size_t n = (bytes + SWAP_REG_CHUNK - 1) / SWAP_REG_CHUNK;
    char limit[32] = "unlimited";
    struct iovec *iov;
    struct rlimit rl;
    int rc;

    if (!buf || !bytes)
        return swap_fail(s, -EINVAL, "%s: register: empty region", s->path);
    if (s->reg_bytes || s->inflight)
        return swap_fail(s, -EBUSY, "%s: register: only one region, before any transfer", s->path);
    iov = calloc(n, sizeof(*iov));
    if (!iov)
        return swap_fail(s, -ENOMEM, "%s: register: out of memory", s->path);
    for (size_t i = 0; i < n; i++)
        iov[i] = (struct iovec){(char *)buf + i * SWAP_REG_CHUNK,
                                bytes - i * SWAP_REG_CHUNK < SWAP_REG_CHUNK ? bytes - i * SWAP_REG_CHUNK
                                                                            : SWAP_REG_CHUNK};
    rc = io_uring_register_buffers(&s->ring, iov, (unsigned)n);
    free(iov);
    if (rc < 0) {
        if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
            snprintf(limit, sizeof(limit), "%llu bytes", (unsigned long long)rl.rlim_cur);
        return swap_fail(s, rc, "%s: registering %zu bytes of buffers with io_uring failed: %s (RLIMIT_MEMLOCK %s); "
                         "transfers go unregistered", s->path, bytes, strerror(-rc), limit);
    }
    s->reg_base = (uintptr_t)buf;
    s->reg_bytes = bytes;
    return 0;
}

void zs_swap_close(struct zs_swap *s)
{
    if (!s)
        return;
    zs_swap_wait_all(s); /* returns at once when broken: close never waits past the deadline either */
    for (uint32_t i = 0; i < SWAP_TICKETS; i++) /* only a broken ring leaves any */
        free(s->xfers[i].msg);
    /* Closing the ring does not block: the kernel cancels what it holds in the background (a hung
     * device's I/O may still land later). The caller's buffers of those I/Os must therefore never be
     * freed or reused after a timeout (zs_swap_in_flight); the records are leaked with them. */
    io_uring_queue_exit(&s->ring); /* also drops the buffer registration */
    close(s->fd);
    if (s->hang_fd[0] >= 0) {
        close(s->hang_fd[0]);
        close(s->hang_fd[1]);
    }
    free(s->blocks);
    if (!s->inflight)
        free(s->recs);
    free(s);
}

uint64_t zs_swap_buffer_bytes(const struct zs_swap *s)
{
    /* SQ and CQ rings share one mapping on current kernels: count the larger, plus the SQE array */
    uint64_t rings = s->ring.sq.ring_sz > s->ring.cq.ring_sz ? s->ring.sq.ring_sz : s->ring.cq.ring_sz;

    return sizeof(*s) + (uint64_t)s->qd * sizeof(*s->recs) + s->nblocks * sizeof(*s->blocks) + rings +
           (uint64_t)s->ring.sq.ring_entries * sizeof(struct io_uring_sqe);
}

bool zs_swap_registered(const struct zs_swap *s)
{
    return s->reg_bytes != 0;
}

bool zs_swap_in_flight(const struct zs_swap *s)
{
    return s && s->inflight != 0;
}

bool zs_swap_direct(const struct zs_swap *s)
{
    return s->direct;
}

const char *zs_swap_error(const struct zs_swap *s)
{
    return s->err[0] ? s->err : "no error";
}

/* Preallocates the file: ext4 serialises writes that extend a file, so a swap file laid out up front
 * writes at full speed from the first pass (and a full disk shows up here, at set-up, not mid-step). */
int zs_swap_reserve(struct zs_swap *s, uint64_t bytes)
{
    int rc = posix_fallocate(s->fd, 0, (off_t)bytes);

    if (rc)
        return swap_fail(s, -rc, "%s: cannot reserve %llu bytes: %s", s->path, (unsigned long long)bytes,
                         strerror(rc));
    return 0;
}
