/* swap.c - the swapper's I/O engine: transfers cut into block_size I/Os on one io_uring, at most
 * queue_depth in flight, every completion checked (EAGAIN retried, short transfers resubmitted, failures
 * named by file and offset) and, with verify, each block's CRC32C recorded on write and checked on read. */
#include <errno.h>
#include <fcntl.h>
#include <liburing.h> /* defines: io_uring_submit_and_wait, io_uring_prep_{read,write}[_fixed] */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h" /* defines: zs_now_s */
#include "swap_impl.h" /* defines: struct zs_swap, swap_fail */

/* ---------------------------------------------------------------- the ring */

/* Submits everything prepared and, with wait_nr, waits for that many completions. A refused submit
 * (-EAGAIN/-EBUSY: the kernel is short of request memory) is retried after a pause. */
static int ring_enter(struct zs_swap *s, unsigned wait_nr)
{
    int rc, tries = 0;

    for (;;) {
        rc = io_uring_submit_and_wait(&s->ring, wait_nr);
        if (rc >= 0 && !io_uring_sq_ready(&s->ring))
            return 0;
        if (rc == -EINTR)
            continue;
        if ((rc >= 0 || rc == -EAGAIN || rc == -EBUSY) && tries++ < SWAP_RETRIES) {
            usleep(1000);
            continue;
        }
        s->broken = rc < 0 ? rc : -EIO;
        return swap_fail(s, s->broken, "%s: io_uring submit failed: %s", s->path, strerror(-s->broken));
    }
}

/* The registered buffer holding [p, p + len), or -1 (outside the region, or across two of its chunks). */
static int fixed_index(const struct zs_swap *s, const char *p, uint32_t len)
{
    uintptr_t q = (uintptr_t)p;

    if (!s->reg_bytes || q < s->reg_base || q - s->reg_base + len > s->reg_bytes)
        return -1;
    if ((q - s->reg_base) / SWAP_REG_CHUNK != (q - s->reg_base + len - 1) / SWAP_REG_CHUNK)
        return -1;
    return (int)((q - s->reg_base) / SWAP_REG_CHUNK);
}

static void io_defer(struct zs_swap *s, struct io_rec *r, int res)
{
    r->res = res;
    r->next = s->faulted;
    s->faulted = r;
}

/* Prepares r's (remaining) I/O, or, when an injected fault matches, queues its failure for the
 * completion path without touching the disk. */
static void io_issue(struct zs_swap *s, struct io_rec *r)
{
    struct fault *f = &s->fault[r->write];
    struct io_uring_sqe *sqe;
    int idx;

    if (f->err && r->off >= f->at && !f->hang) {
        io_defer(s, r, -f->err);
        f->err = 0;
        return;
    }
    /* The SQ has at least queue_depth entries and each record holds at most one, so this only fails if
     * prepared entries were not submitted; submit them and try once more. */
    sqe = io_uring_get_sqe(&s->ring);
    if (!sqe) {
        io_uring_submit(&s->ring);
        sqe = io_uring_get_sqe(&s->ring);
    }
    if (!sqe) {
        io_defer(s, r, -EBUSY);
        return;
    }
    idx = fixed_index(s, r->buf, r->len);
    if (f->hang && f->err && r->off >= f->at && s->hang_fd[0] >= 0) {
        /* a read from the empty pipe stands in for a hung disk: the kernel holds it until cancelled */
        io_uring_prep_read(sqe, s->hang_fd[0], r->buf, r->len, (uint64_t)-1);
        f->err = 0;
    } else if (r->write && idx >= 0)
        io_uring_prep_write_fixed(sqe, s->fd, r->buf, r->len, r->off, idx);
    else if (r->write)
        io_uring_prep_write(sqe, s->fd, r->buf, r->len, r->off);
    else if (idx >= 0)
        io_uring_prep_read_fixed(sqe, s->fd, r->buf, r->len, r->off, idx);
    else
        io_uring_prep_read(sqe, s->fd, r->buf, r->len, r->off);
    io_uring_sqe_set_data(sqe, r);
}

/* ---------------------------------------------------------------- completions */

static void xfer_fail(struct xfer *x, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void xfer_fail(struct xfer *x, int rc, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;

    if (x->err)
        return;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    x->err = rc;
    x->msg = strdup(msg); /* NULL is survivable: zs_swap_wait then gives a shorter message */
}

static void io_fail(struct zs_swap *s, struct xfer *x, struct io_rec *r, int rc, const char *why)
{
    xfer_fail(x, rc, "%s: %s at offset %llu (%u bytes) failed: %s", s->path, r->write ? "write" : "read",
              (unsigned long long)r->off, r->len, why);
    if (r->write && s->verify)
        s->blocks[r->off0 / s->block_size].len = BLOCK_FAILED;
}

static void io_verify(struct zs_swap *s, struct xfer *x, const struct io_rec *r)
{
    const struct blk *b = &s->blocks[r->off0 / s->block_size];
    uint32_t got = zs_crc32c(0, r->buf0, r->len0);

    if (got != b->crc)
        xfer_fail(x, -EBADMSG, "%s: checksum mismatch in block at offset %llu (expected %08x, got %08x)",
                  s->path, (unsigned long long)r->off0, b->crc, got);
}

static void io_complete(struct zs_swap *s, struct io_rec *r, int res)
{
    struct xfer *x = &s->xfers[r->ticket % SWAP_TICKETS];
    char why[64];

    if ((res == -EAGAIN || res == -EINTR) && r->retries++ < SWAP_RETRIES) {
        io_issue(s, r);
        return;
    }
    if (res > 0 && (uint32_t)res < r->len) {
        r->off += (uint32_t)res;
        r->buf += res;
        r->len -= (uint32_t)res;
        r->retries = 0;
        io_issue(s, r);
        return;
    }
    if (res < 0) {
        io_fail(s, x, r, res, strerror(-res));
    } else if (res == 0) {
        snprintf(why, sizeof(why), "%s at offset %llu", r->write ? "no progress" : "unexpected end of file",
                 (unsigned long long)r->off);
        io_fail(s, x, r, -EIO, why);
    } else if (!r->write && s->verify) {
        io_verify(s, x, r);
    }
    x->pending--;
    r->busy = false;
    r->next = s->free_recs;
    s->free_recs = r;
    s->inflight--;
}

/* The oldest I/O in flight (lowest ticket, then offset): what a timeout names. */
static const struct io_rec *oldest_busy(const struct zs_swap *s)
{
    const struct io_rec *o = NULL;

    for (uint32_t i = 0; i < s->qd; i++) {
        const struct io_rec *r = &s->recs[i];
        if (r->busy && (!o || r->ticket < o->ticket || (r->ticket == o->ticket && r->off < o->off)))
            o = r;
    }
    return o;
}

/* The watchdog expired: the kernel still holds the I/Os and may yet write into their buffers, so the
 * swapper is broken for good (nothing is reaped, freed or reused after this; see zs_swap_close). */
static int swap_timeout(struct zs_swap *s, double waited)
{
    const struct io_rec *r = oldest_busy(s);

    s->broken = -ETIMEDOUT;
    if (!r)
        return swap_fail(s, s->broken, "%s: timeout: no I/O completed in %.1f s (zeroshard.timeout_s / ZS_TIMEOUT "
                         "= %g)", s->path, waited, s->timeout_s);
    return swap_fail(s, s->broken, "%s: timeout: %s at offset %llu (%u bytes) did not complete in %.1f s "
                     "(zeroshard.timeout_s / ZS_TIMEOUT = %g); %u I/O%s in flight, the swapper is unusable",
                     s->path, r->write ? "write" : "read", (unsigned long long)r->off, r->len, waited,
                     s->timeout_s, s->inflight, s->inflight == 1 ? "" : "s");
}

/* Submits what is prepared and waits for one completion, in short bounded waits, for at most timeout_s:
 * a disk that never answers (a hung NFS server or NVMe device) ends in a named error, not a hang. */
static int ring_wait(struct zs_swap *s)
{
    struct __kernel_timespec ts = {.tv_sec = 0, .tv_nsec = SWAP_POLL_NS};
    struct io_uring_cqe *cqe;
    double t0 = zs_now_s();
    int rc;

    rc = ring_enter(s, 0);
    if (rc)
        return rc;
    for (;;) {
        rc = io_uring_wait_cqe_timeout(&s->ring, &cqe, &ts);
        if (rc == 0)
            return 0;
        if (rc != -ETIME && rc != -EINTR && rc != -EAGAIN) {
            s->broken = rc;
            return swap_fail(s, rc, "%s: io_uring wait failed: %s", s->path, strerror(-rc));
        }
        if (zs_now_s() - t0 >= s->timeout_s)
            return swap_timeout(s, zs_now_s() - t0);
    }
}

/* Completes what is ready; with wait, first blocks until something is. Injected failures complete
 * first, without entering the kernel. */
static void pump(struct zs_swap *s);

static int swap_reap(struct zs_swap *s, bool wait)
{
    struct io_uring_cqe *cqe;
    struct io_rec *r, *next;
    unsigned head, n = 0;
    int rc;

    if (s->broken)
        return s->broken;
    if (s->faulted) {
        r = s->faulted;
        s->faulted = NULL;
        for (; r; r = next) {
            next = r->next;
            io_complete(s, r, r->res);
        }
        return io_uring_sq_ready(&s->ring) ? ring_enter(s, 0) : 0;
    }
    if (wait && !s->inflight) { /* bookkeeping gone wrong: waiting would hang forever */
        s->broken = -EIO;
        return swap_fail(s, -EIO, "%s: internal error: waiting with no I/O in flight", s->path);
    }
    if (wait) {
        rc = ring_wait(s);
        if (rc)
            return rc;
    }
    io_uring_for_each_cqe(&s->ring, head, cqe) {
        io_complete(s, io_uring_cqe_get_data(cqe), cqe->res);
        n++;
    }
    io_uring_cq_advance(&s->ring, n);
    pump(s); /* records came free: issue the next I/Os of the transfers still queued */
    /* resubmissions prepared above go out now, not whenever the caller next enters the swapper */
    return io_uring_sq_ready(&s->ring) ? ring_enter(s, 0) : 0;
}

/* ---------------------------------------------------------------- checksums */

static int blk_reserve(struct zs_swap *s, uint64_t end)
{
    uint64_t need = (end + s->block_size - 1) / s->block_size;
    size_t n = s->nblocks ? s->nblocks : 64;
    struct blk *b;

    if (need <= s->nblocks)
        return 0;
    while (n < need)
        n *= 2;
    b = realloc(s->blocks, n * sizeof(*b));
    if (!b)
        return swap_fail(s, -ENOMEM, "%s: no memory for the checksums of %zu blocks", s->path, n);
    memset(b + s->nblocks, 0, (n - s->nblocks) * sizeof(*b));
    s->blocks = b;
    s->nblocks = n;
    return 0;
}

/* A read can only be verified against a CRC of exactly the bytes it reads. */
static int blk_check_read(struct zs_swap *s, uint64_t off, size_t bytes)
{
    for (uint64_t o = off; o < off + bytes; o += s->block_size) {
        uint32_t len = off + bytes - o < s->block_size ? (uint32_t)(off + bytes - o) : s->block_size;
        const struct blk *b = o / s->block_size < s->nblocks ? &s->blocks[o / s->block_size] : NULL;

        if (!b || !b->len)
            return swap_fail(s, -EIO, "%s: read at offset %llu: block at offset %llu never written", s->path,
                             (unsigned long long)off, (unsigned long long)o);
        if (b->len == BLOCK_FAILED)
            return swap_fail(s, -EIO, "%s: read at offset %llu: the last write of the block at offset %llu failed",
                             s->path, (unsigned long long)off, (unsigned long long)o);
        if (b->len != len)
            return swap_fail(s, -EINVAL,
                             "%s: read of %u bytes of the block at offset %llu, which was written with %u bytes "
                             "(verify checks whole written extents)",
                             s->path, len, (unsigned long long)o, b->len);
    }
    return 0;
}

/* ---------------------------------------------------------------- transfers */

static int xfer_check(struct zs_swap *s, bool write, uint64_t off, const void *buf, size_t bytes)
{
    const char *kind = write ? "write" : "read";

    if (s->broken) /* s->err still holds the first message: a later call repeats it, fast */
        return s->broken;
    if (!buf || (uintptr_t)buf % SWAP_ALIGN || bytes % SWAP_ALIGN || off % SWAP_ALIGN)
        return swap_fail(s, -EINVAL,
                         "%s: %s of %zu bytes at offset %llu (buffer %p): buffer address, size and offset "
                         "must be multiples of 4096",
                         s->path, kind, bytes, (unsigned long long)off, buf);
    if (bytes > (uint64_t)INT64_MAX || off > (uint64_t)INT64_MAX - bytes)
        return swap_fail(s, -EFBIG, "%s: %s at offset %llu: beyond the largest file offset", s->path, kind,
                         (unsigned long long)off);
    if (s->verify && off % s->block_size)
        return swap_fail(s, -EINVAL, "%s: %s at offset %llu: with verify, transfers start on a block boundary "
                         "(block_size %u)", s->path, kind, (unsigned long long)off, s->block_size);
    if (s->xfers[s->next_ticket % SWAP_TICKETS].active)
        return swap_fail(s, -EBUSY, "%s: %u transfers not waited on; wait for some first", s->path,
                         SWAP_TICKETS);
    if (!s->verify || !bytes)
        return 0;
    return write ? blk_reserve(s, off + bytes) : blk_check_read(s, off, bytes);
}

/* Issues I/Os of queued transfers, oldest first, while records are free; never waits. Transfers larger
 * than queue_depth blocks thus keep the disk busy across calls (each reap issues more) instead of
 * blocking the caller until the tail of a transfer is in flight. */
static void pump(struct zs_swap *s)
{
    uint64_t lo = s->next_ticket > SWAP_TICKETS ? s->next_ticket - SWAP_TICKETS : 1;

    for (uint64_t t = lo; t < s->next_ticket && s->free_recs && !s->broken; t++) {
        struct xfer *x = &s->xfers[t % SWAP_TICKETS];
        if (!x->active || x->id != t)
            continue;
        while (x->issued < x->bytes && s->free_recs) {
            uint32_t len = x->bytes - x->issued < s->block_size ? (uint32_t)(x->bytes - x->issued) : s->block_size;
            struct io_rec *r = s->free_recs;
            s->free_recs = r->next;
            s->inflight++;
            *r = (struct io_rec){.ticket = t, .off0 = x->off + x->issued, .off = x->off + x->issued,
                                 .buf0 = x->buf + x->issued, .buf = x->buf + x->issued, .len0 = len, .len = len,
                                 .write = x->write, .busy = true};
            if (x->write && s->verify)
                s->blocks[r->off0 / s->block_size] = (struct blk){zs_crc32c(0, r->buf0, len), len};
            x->pending++;
            x->issued += len;
            io_issue(s, r);
        }
    }
}

/* Queues the transfer and issues as much of it as the free records allow. The only failure past the
 * checks is a broken ring, after which nothing can be reaped; the kernel finishes or cancels what it
 * holds when the ring is closed. */
static int swap_xfer(struct zs_swap *s, bool write, uint64_t off, char *buf, size_t bytes, uint64_t *ticket)
{
    struct xfer *x;
    uint64_t id;
    int rc;

    *ticket = 0;
    rc = xfer_check(s, write, off, buf, bytes);
    if (rc)
        return rc;
    id = s->next_ticket++;
    x = &s->xfers[id % SWAP_TICKETS];
    *x = (struct xfer){.id = id, .active = true, .buf = buf, .off = off, .bytes = bytes, .write = write};
    pump(s);
    rc = io_uring_sq_ready(&s->ring) ? ring_enter(s, 0) : 0;
    if (rc)
        return rc;
    *ticket = id;
    return 0;
}

int zs_swap_progress(struct zs_swap *s)
{
    return swap_reap(s, false);
}

int zs_swap_write(struct zs_swap *s, uint64_t off, const void *buf, size_t bytes, uint64_t *ticket)
{
    /* the cast only lets reads and writes share one record type; writes never store through it */
    return swap_xfer(s, true, off, (char *)(uintptr_t)buf, bytes, ticket);
}

int zs_swap_read(struct zs_swap *s, uint64_t off, void *buf, size_t bytes, uint64_t *ticket)
{
    return swap_xfer(s, false, off, buf, bytes, ticket);
}

static int swap_wait(struct zs_swap *s, uint64_t ticket);

int zs_swap_wait(struct zs_swap *s, uint64_t ticket)
{
    double t0 = zs_now_s();
    int rc = swap_wait(s, ticket);

    s->waited += zs_now_s() - t0;
    return rc;
}

double zs_swap_waited(const struct zs_swap *s)
{
    return s ? s->waited : 0.0;
}

static int swap_wait(struct zs_swap *s, uint64_t ticket)
{
    struct xfer *x = &s->xfers[ticket % SWAP_TICKETS];
    int rc;

    if (s->broken)
        return s->broken;
    if (!ticket || !x->active || x->id != ticket)
        return swap_fail(s, -EINVAL, "%s: ticket %llu: no such transfer outstanding (never issued, or already "
                         "waited on)", s->path, (unsigned long long)ticket);
    for (;;) {
        pump(s);
        if (!x->pending && x->issued >= x->bytes)
            break;
        rc = swap_reap(s, true);
        if (rc)
            return rc;
    }
    rc = x->err;
    if (rc && x->msg)
        swap_fail(s, rc, "%s", x->msg);
    else if (rc)
        swap_fail(s, rc, "%s: transfer %llu failed: %s", s->path, (unsigned long long)ticket, strerror(-rc));
    free(x->msg);
    *x = (struct xfer){0};
    return rc;
}

int zs_swap_wait_all(struct zs_swap *s)
{
    uint64_t lo = s->next_ticket > SWAP_TICKETS ? s->next_ticket - SWAP_TICKETS : 1;
    char first_msg[sizeof(s->err)];
    int rc, first = 0;

    /* a live ticket t blocks the issue of t + SWAP_TICKETS, so every live one is in [lo, next_ticket) */
    for (uint64_t t = lo; t < s->next_ticket; t++) {
        if (!s->xfers[t % SWAP_TICKETS].active || s->xfers[t % SWAP_TICKETS].id != t)
            continue;
        rc = zs_swap_wait(s, t);
        if (rc && !first) {
            first = rc;
            memcpy(first_msg, s->err, sizeof(first_msg));
        }
    }
    if (first)
        memcpy(s->err, first_msg, sizeof(first_msg));
    return first;
}

void zs_swap_inject_fault(struct zs_swap *s, bool write, uint64_t at, int err)
{
    s->fault[write] = (struct fault){.at = at, .err = err < 0 ? -err : err};
}

int zs_swap_inject_hang(struct zs_swap *s, bool write, uint64_t at)
{
    if (s->hang_fd[0] < 0 && pipe2(s->hang_fd, O_CLOEXEC))
        return swap_fail(s, -errno, "%s: test hook: pipe: %s", s->path, strerror(errno));
    s->fault[write] = (struct fault){.at = at, .err = ETIMEDOUT, .hang = true};
    return 0;
}

/* ---------------------------------------------------------------- the step pipeline */

int zs_swap_pipeline(struct zs_swap *s, int32_t ngroups, char *const slot[3], zs_swap_group_at at,
                     zs_swap_group_fn fn, void *arg)
{
    uint64_t rd[3] = {0}, wr[3] = {0}, off;
    size_t bytes, wbytes;
    int rc = 0, stop = 0, rc2;

    if (ngroups > 0) {
        at(arg, 0, &off, &bytes, &wbytes);
        rc = zs_swap_read(s, off, slot[0], bytes, &rd[0]);
    }
    for (int32_t g = 0; !rc && !stop && g < ngroups; g++) {
        int k = g % 3, nk = (g + 1) % 3;
        rc = zs_swap_wait(s, rd[k]);
        rd[k] = 0;
        if (rc)
            break;
        if (g + 1 < ngroups) { /* the next slot's last write must land before it is refilled */
            if (wr[nk] && (rc = zs_swap_wait(s, wr[nk])) != 0)
                break;
            wr[nk] = 0;
            at(arg, g + 1, &off, &bytes, &wbytes);
            rc = zs_swap_read(s, off, slot[nk], bytes, &rd[nk]);
            if (rc)
                break;
        }
        stop = fn(arg, g, slot[k]);
        if (stop)
            break;
        at(arg, g, &off, &bytes, &wbytes);
        rc = wbytes ? zs_swap_write(s, off, slot[k], wbytes, &wr[k]) : 0;
    }
    rc2 = zs_swap_wait_all(s); /* nothing stays in flight, whatever happened */
    return stop ? stop : rc ? rc : rc2;
}
