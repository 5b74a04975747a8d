/* test_swap.c - the NVMe swapper (offload/swap.c): data survives a round trip through io_uring, with
 * O_DIRECT wherever the file system takes it, and every failure (checksum, injected ENOSPC/EIO, end of file,
 * a disk that never answers) comes back through zs_swap_wait naming file and offset, with the swapper still
 * usable. Exits 77 when io_uring is unavailable here. The run directory is test_swap_dir.c's. */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"          /* defines: zs_test_report and the pass/fail counters */
#include "offload/swap.h"   /* defines: zs_swap_* */
#include "swap_fixture.h"   /* defines: disk_root, shm_root, why and the file helpers */

static char rank_dir[PATH_MAX];

static double now_s(void)
{
    struct timespec t;

    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* A swapper on a new file of the rank directory (or of dir). */
static int swap_new(struct zs_swap **s, const char *dir, uint32_t bs, uint32_t qd, bool verify, char *err,
                    size_t errlen)
{
    char name[32];

    snprintf(name, sizeof(name), "swap%d.bin", ++file_seq);
    return zs_swap_open(s, &(struct zs_swap_opts){dir ? dir : rank_dir, name, bs, qd, true, verify, 0}, err, errlen);
}

static int xfer_wait(struct zs_swap *s, bool write, uint64_t off, void *buf, size_t bytes)
{
    uint64_t t;
    int rc = write ? zs_swap_write(s, off, buf, bytes, &t) : zs_swap_read(s, off, buf, bytes, &t);

    return rc ? rc : zs_swap_wait(s, t);
}

/* ---------------------------------------------------------------- transfers */

/* Writes src as four transfers and reads into dst as four, waiting in scrambled orders. */
static const char *round_trip(struct zs_swap *s, char *src, char *dst, size_t bytes, double *wbw, double *rbw)
{
    static const int worder[4] = {2, 0, 3, 1}, rorder[4] = {3, 1, 0, 2};
    size_t part = bytes / 4;
    uint64_t t[4];
    double t0;
    int rc;

    t0 = now_s();
    for (int i = 0; i < 4; i++)
        if ((rc = zs_swap_write(s, i * part, src + i * part, part, &t[i])))
            return why("write %d: %s", i, zs_swap_error(s));
    for (int i = 0; i < 4; i++)
        if ((rc = zs_swap_wait(s, t[worder[i]])))
            return why("wait write %d: %s", worder[i], zs_swap_error(s));
    *wbw = (double)bytes / (now_s() - t0) / 1e9;
    memset(dst, 0, bytes);
    t0 = now_s();
    for (int i = 0; i < 4; i++)
        if ((rc = zs_swap_read(s, i * part, dst + i * part, part, &t[i])))
            return why("read %d: %s", i, zs_swap_error(s));
    for (int i = 0; i < 4; i++)
        if ((rc = zs_swap_wait(s, t[rorder[i]])))
            return why("wait read %d: %s", rorder[i], zs_swap_error(s));
    *rbw = (double)bytes / (now_s() - t0) / 1e9;
    return memcmp(src, dst, bytes) ? "data read back differs" : NULL;
}

/* Whether the file system under dir takes O_DIRECT: an aligned direct write to a scratch file there. */
static bool direct_supported(const char *dir, char *why_not, size_t len)
{
    char path[PATH_MAX + 32], *buf = alloc_aligned(4096);
    bool ok = false;
    int fd;

    snprintf(path, sizeof(path), "%s/direct-probe.bin", dir);
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT, 0600);
    if (fd >= 0 && buf) {
        memset(buf, 0, 4096);
        ok = pwrite(fd, buf, 4096, 0) == 4096;
    }
    snprintf(why_not, len, "%s", ok ? "" : strerror(errno));
    if (fd >= 0)
        close(fd);
    unlink(path);
    free(buf);
    return ok;
}

/* Where the file system takes O_DIRECT the swapper must use it, and say so; a swapper
 * that silently went buffered there would pass a test that accepts either. */
static const char *check_direct(struct zs_swap *s, const char *dir, int want_direct)
{
    char path[PATH_MAX + 64], real[PATH_MAX];
    long flags;

    if (want_direct < 0)
        return NULL;
    if (zs_swap_direct(s) != want_direct)
        return why("O_DIRECT in effect: %d, expected %d (the file system %s it)", zs_swap_direct(s), want_direct,
                   want_direct ? "takes" : "refuses");
    snprintf(path, sizeof(path), "%s/swap%d.bin", dir, file_seq); /* the name swap_new picked */
    if (!realpath(path, real))
        return why("%s: %s", path, strerror(errno));
    flags = fd_flags_of(real);
    if (flags < 0)
        return why("no open descriptor for %s", real);
    if (!!(flags & O_DIRECT) != want_direct)
        return why("%s is open with flags 0%lo: O_DIRECT %s, but the swapper reports %s", real, flags,
                   flags & O_DIRECT ? "set" : "not set", want_direct ? "O_DIRECT" : "buffered");
    return NULL;
}

/* want_direct: 1 or 0 to require O_DIRECT to be in effect or not, -1 to accept either */
static const char *test_round_trip(const char *dir, size_t bytes, bool verify, int want_direct, const char *label)
{
    char *src = alloc_aligned(bytes), *dst = alloc_aligned(bytes), err[512];
    struct zs_swap *s = NULL;
    const char *w = "out of memory";
    double wbw = 0, rbw = 0;

    if (!src || !dst)
        goto out_free;
    fill_random(src, bytes);
    if (swap_new(&s, dir, MiB, 8, verify, err, sizeof(err))) {
        w = why("open: %s", err);
        goto out_free;
    }
    w = round_trip(s, src, dst, bytes, &wbw, &rbw);
    if (!w && zs_swap_buffer_bytes(s) == 0)
        w = "buffer_bytes reports nothing";
    if (!w)
        w = check_direct(s, dir ? dir : rank_dir, want_direct);
    printf("# %s: %zu MiB, 1 MiB blocks, QD 8, %s, verify %s: write %.2f GB/s, read %.2f GB/s\n", label,
           bytes / MiB, zs_swap_direct(s) ? "O_DIRECT" : "buffered (O_DIRECT refused)", verify ? "on" : "off",
           wbw, rbw);
    zs_swap_close(s);
out_free:
    free(src);
    free(dst);
    return w;
}

/* ramfs has no direct I/O at all (tmpfs gained it in Linux 6.6), so a file there takes the buffered
 * fallback. Mounting needs privileges; a child does it in its own mount namespace, so nothing leaks. */
static int fallback_child(const char *mnt)
{
    const char *w;

    if (unshare(CLONE_NEWNS) || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) ||
        mount("none", mnt, "ramfs", 0, "mode=0700")) {
        printf("skip: cannot mount ramfs in a private mount namespace (%s): the fallback case is skipped\n",
               strerror(errno));
        fflush(stdout);
        return 77;
    }
    w = test_round_trip(mnt, 4 * MiB, true, 0, "ramfs");
    if (w)
        printf("# ramfs: %s\n", w);
    fflush(stdout);
    return w ? 1 : 0;
}

static const char *test_buffered_fallback(void)
{
    char mnt[PATH_MAX];
    const char *w = subdir(disk_root, mnt, sizeof(mnt));
    int status;
    pid_t pid;

    if (w)
        return w;
    fflush(stdout);
    pid = fork();
    if (pid == 0)
        _exit(fallback_child(mnt));
    if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status))
        return "the child did not run to its end";
    return WEXITSTATUS(status) == 0 || WEXITSTATUS(status) == 77 ? NULL : "see the ramfs line above";
}

/* The cases that run alone, each for a ctest of its own: "ramfs", the buffered fallback, needs mount(2) in
 * a private namespace and exits 77 (a skip, not a pass) where this machine cannot; "hang" needs ZS_TIMEOUT. */
static const char *test_hang(void);

static int run_one_case(const char *name)
{
    char mnt[PATH_MAX];
    const char *w = NULL;
    int rc = 1, status;
    pid_t pid;

    if (!strcmp(name, "ramfs")) {
        w = subdir(disk_root, mnt, sizeof(mnt));
        fflush(stdout);
        pid = w ? -1 : fork();
        if (pid == 0)
            _exit(fallback_child(mnt));
        rc = pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) ? WEXITSTATUS(status) : 1;
    } else if (!strcmp(name, "hang")) {
        w = test_hang();
        rc = w ? 1 : 0;
    } else {
        printf("usage: test_swap [ramfs|hang]\n");
        rc = 2;
    }
    printf("%s - %s%s%s\n", rc == 0 ? "ok" : rc == 77 ? "skip" : "FAIL", name, w ? ": " : "", w ? w : "");
    zs_swap_dir_remove(rank_dir);
    fixture_cleanup();
    return rc;
}

static const char *test_registered(void)
{
    size_t region = 64 * MiB, half = region / 2;
    char *buf = alloc_aligned(region), *outside = alloc_aligned(4 * MiB), err[512];
    struct zs_swap *s = NULL;
    const char *w = "out of memory";
    double wbw, rbw;
    int rc;

    if (!buf || !outside)
        goto out_free;
    fill_random(buf, half);
    fill_random(outside, 4 * MiB);
    if (swap_new(&s, NULL, MiB, 8, true, err, sizeof(err))) {
        w = why("open: %s", err);
        goto out_free;
    }
    rc = zs_swap_register(s, buf, region);
    if (rc)
        printf("# registration refused, falling back to unregistered transfers: %s\n", zs_swap_error(s));
    else
        printf("# 64 MiB region registered with io_uring (read_fixed/write_fixed)\n");
    if (rc ? zs_swap_registered(s) : !zs_swap_registered(s)) {
        w = "zs_swap_registered disagrees with the result of zs_swap_register";
        goto out_close;
    }
    w = round_trip(s, buf, buf + half, half, &wbw, &rbw);
    /* a buffer outside the region goes the plain way through the same swapper */
    if (!w && (xfer_wait(s, true, half, outside, 4 * MiB) || xfer_wait(s, false, half, buf + half, 4 * MiB)))
        w = why("outside the region: %s", zs_swap_error(s));
    if (!w && memcmp(outside, buf + half, 4 * MiB))
        w = "outside the region: data differs";
    if (!w && zs_swap_registered(s) && zs_swap_register(s, buf, region) != -EBUSY)
        w = "a second registration was accepted";
out_close:
    zs_swap_close(s);
out_free:
    free(buf);
    free(outside);
    return w;
}

/* A read running past what was written: the short piece is resubmitted for its remainder, which then
 * reads 0 bytes, an unexpected end of file. */
static const char *test_short_and_eof(void)
{
    uint32_t bs = 64 * KiB;
    size_t n = 3 * bs + 4096;
    char *src = alloc_aligned(4 * bs), *dst = alloc_aligned(4 * bs), err[512], want[64];
    struct zs_swap *s = NULL, *v = NULL;
    const char *w = "out of memory";
    int rc;

    if (!src || !dst)
        goto out_free;
    fill_random(src, 4 * bs);
    if (swap_new(&s, NULL, bs, 4, false, err, sizeof(err)) || swap_new(&v, NULL, bs, 4, true, err, sizeof(err))) {
        w = why("open: %s", err);
        goto out_close;
    }
    w = NULL;
    if (xfer_wait(s, true, 0, src, n) || xfer_wait(s, false, 0, dst, n) || memcmp(src, dst, n))
        w = why("3 blocks + 4 KiB: %s", zs_swap_error(s));
    snprintf(want, sizeof(want), "end of file at offset %zu", n);
    if (!w && ((rc = xfer_wait(s, false, 0, dst, 4 * bs)) != -EIO || !strstr(zs_swap_error(s), want)))
        w = why("read past the end: rc %d: %s", rc, zs_swap_error(s));
    if (!w && ((rc = xfer_wait(s, false, 8 * bs, dst, bs)) != -EIO || !strstr(zs_swap_error(s), "offset 524288")))
        w = why("read beyond the end: rc %d: %s", rc, zs_swap_error(s));
    /* with verify the same mistakes are caught before any I/O */
    if (!w && (xfer_wait(v, true, 0, src, n) || xfer_wait(v, false, 0, dst, n) || memcmp(src, dst, n)))
        w = why("verify, 3 blocks + 4 KiB: %s", zs_swap_error(v));
    if (!w && (rc = xfer_wait(v, false, 0, dst, 4 * bs)) != -EINVAL)
        w = why("verify, read of a partly written block: rc %d: %s", rc, zs_swap_error(v));
    if (!w && ((rc = xfer_wait(v, false, 5 * bs, dst, bs)) != -EIO || !strstr(zs_swap_error(v), "never written")))
        w = why("verify, unwritten block: rc %d: %s", rc, zs_swap_error(v));
out_close:
    zs_swap_close(s);
    zs_swap_close(v);
out_free:
    free(src);
    free(dst);
    return w;
}

static const char *test_checksum(void)
{
    uint32_t bs = 64 * KiB;
    char *src = alloc_aligned(4 * bs), *dst = alloc_aligned(4 * bs), err[512], path[PATH_MAX + 32];
    char junk[4096];
    struct zs_swap *s = NULL;
    const char *w = "out of memory";
    int rc, fd;

    if (!src || !dst)
        goto out_free;
    fill_random(src, 4 * bs);
    snprintf(path, sizeof(path), "%s/swap%d.bin", rank_dir, file_seq + 1); /* the name swap_new picks */
    if (swap_new(&s, NULL, bs, 4, true, err, sizeof(err))) {
        w = why("open: %s", err);
        goto out_free;
    }
    w = NULL;
    if (xfer_wait(s, true, 0, src, 4 * bs))
        w = why("write: %s", zs_swap_error(s));
    fd = open(path, O_WRONLY);
    memset(junk, 0x5a, sizeof(junk));
    if (!w && (fd < 0 || pwrite(fd, junk, sizeof(junk), 2 * bs + 8192) != (ssize_t)sizeof(junk)))
        w = why("corrupting %s: %s", path, strerror(errno));
    if (fd >= 0)
        close(fd);
    if (!w && ((rc = xfer_wait(s, false, 0, dst, 4 * bs)) != -EBADMSG ||
               !strstr(zs_swap_error(s), "checksum mismatch in block at offset 131072") ||
               !strstr(zs_swap_error(s), path)))
        w = why("rc %d: %s", rc, zs_swap_error(s));
    if (!w && (xfer_wait(s, false, bs, dst, bs) || memcmp(dst, src + bs, bs)))
        w = why("an intact block: %s", zs_swap_error(s));
    zs_swap_close(s);
out_free:
    free(src);
    free(dst);
    return w;
}

static const char *test_faults(void)
{
    uint32_t bs = 64 * KiB;
    char *src = alloc_aligned(4 * bs), *dst = alloc_aligned(4 * bs), err[512];
    struct zs_swap *s = NULL;
    const char *w = "out of memory";
    uint64_t t[2];
    int rc;

    if (!src || !dst)
        goto out_free;
    fill_random(src, 4 * bs);
    if (swap_new(&s, NULL, bs, 4, true, err, sizeof(err))) {
        w = why("open: %s", err);
        goto out_free;
    }
    w = NULL;
    zs_swap_inject_fault(s, true, 2 * bs, ENOSPC);
    rc = xfer_wait(s, true, 0, src, 4 * bs);
    if (rc != -ENOSPC || !strstr(zs_swap_error(s), "write at offset 131072 (65536 bytes) failed: No space left") ||
        !strstr(zs_swap_error(s), rank_dir))
        w = why("injected ENOSPC: rc %d: %s", rc, zs_swap_error(s));
    if (!w && ((rc = xfer_wait(s, false, 0, dst, 4 * bs)) != -EIO || !strstr(zs_swap_error(s), "last write")))
        w = why("reading a block whose write failed: rc %d: %s", rc, zs_swap_error(s));
    zs_swap_inject_fault(s, true, 0, 0);
    if (!w && (xfer_wait(s, true, 0, src, 4 * bs) || xfer_wait(s, false, 0, dst, 4 * bs) || memcmp(src, dst, 4 * bs)))
        w = why("after the fault: %s", zs_swap_error(s));
    zs_swap_inject_fault(s, false, bs, EIO);
    if (!w && ((rc = xfer_wait(s, false, 0, dst, 4 * bs)) != -EIO ||
               !strstr(zs_swap_error(s), "read at offset 65536 (65536 bytes) failed: Input/output error")))
        w = why("injected EIO: rc %d: %s", rc, zs_swap_error(s));
    zs_swap_inject_fault(s, false, 0, EAGAIN); /* retried, never seen */
    memset(dst, 0, 4 * bs);
    if (!w && (xfer_wait(s, false, 0, dst, 4 * bs) || memcmp(src, dst, 4 * bs)))
        w = why("after EIO, with an EAGAIN: %s", zs_swap_error(s));
    /* wait_all reports the failed one of two outstanding transfers */
    zs_swap_inject_fault(s, false, 3 * bs, EIO);
    if (!w && (zs_swap_read(s, 0, dst, 2 * bs, &t[0]) || zs_swap_read(s, 2 * bs, dst + 2 * bs, 2 * bs, &t[1])))
        w = why("two reads: %s", zs_swap_error(s));
    if (!w && ((rc = zs_swap_wait_all(s)) != -EIO || !strstr(zs_swap_error(s), "offset 196608")))
        w = why("wait_all: rc %d: %s", rc, zs_swap_error(s));
    zs_swap_close(s);
out_free:
    free(src);
    free(dst);
    return w;
}

/* A wait on a disk that never answers ends after the deadline (ZS_TIMEOUT seconds, set by the
 * ctest) with -ETIMEDOUT naming file, read, offset and bytes of the hung I/O; every later call fails at once
 * with the same message; close does not block. The hung buffer is leaked on purpose (the kernel holds it). */
static const char *test_hang(void)
{
    uint32_t bs = 64 * KiB;
    char *buf = alloc_aligned(4 * bs), err[512], first[1024];
    const char *tmo = getenv("ZS_TIMEOUT"), *w = NULL;
    struct zs_swap *s = NULL;
    uint64_t t;
    int rc;

    if (!buf || !tmo || atof(tmo) <= 0 || atof(tmo) > 10)
        return "run with ZS_TIMEOUT of 1..10 seconds";
    memset(buf, 7, 4 * bs);
    if (zs_swap_open(&s, &(struct zs_swap_opts){rank_dir, "hang.bin", bs, 4, true, true, atof(tmo)}, err,
                     sizeof(err)))
        return why("open: %s", err);
    if (xfer_wait(s, true, 0, buf, 4 * bs))
        w = why("write: %s", zs_swap_error(s));
    if (!w && zs_swap_inject_hang(s, false, 2 * bs))
        w = why("hang hook: %s", zs_swap_error(s));
    rc = w ? 0 : xfer_wait(s, false, 0, buf, 4 * bs);
    printf("# hung read: rc %d: %s\n", rc, zs_swap_error(s));
    if (!w && (rc != -ETIMEDOUT || !strstr(zs_swap_error(s), "hang.bin: timeout: read at offset 131072 (65536 bytes)") ||
               !strstr(zs_swap_error(s), "zeroshard.timeout_s / ZS_TIMEOUT")))
        w = why("hung read: rc %d: %s", rc, zs_swap_error(s));
    snprintf(first, sizeof(first), "%s", zs_swap_error(s));
    if (!w && ((rc = zs_swap_read(s, 0, buf, bs, &t)) != -ETIMEDOUT || strcmp(first, zs_swap_error(s))))
        w = why("a later read: rc %d: %s", rc, zs_swap_error(s));
    if (!w && (rc = zs_swap_wait_all(s)) != -ETIMEDOUT)
        w = why("wait_all after the timeout: rc %d: %s", rc, zs_swap_error(s));
    if (!w && !zs_swap_in_flight(s))
        w = "the hung I/O is not reported in flight";
    zs_swap_close(s);
    /* buf is deliberately not freed: the kernel may still hold the hung read into it */
    return w;
}

static const char *test_refusals(void)
{
    char *buf = alloc_aligned(4 * MiB), err[512];
    struct zs_swap *s = NULL, *t = NULL;
    struct zs_swap_opts o = {rank_dir, "refusals.bin", 64 * KiB, 4, true, true, 0};
    const char *w = NULL;
    uint64_t tk;
    int rc;

    if (!buf)
        return "out of memory";
    if (zs_swap_open(&s, &o, err, sizeof(err))) {
        free(buf);
        return why("open: %s", err);
    }
    if ((rc = zs_swap_open(&t, &o, err, sizeof(err))) != -EEXIST || !strstr(err, "refusals.bin"))
        w = why("existing file: rc %d: %s", rc, err);
    o.name = "../escape.bin";
    if (!w && (rc = zs_swap_open(&t, &o, err, sizeof(err))) != -EINVAL)
        w = why("name with a slash: rc %d: %s", rc, err);
    o = (struct zs_swap_opts){rank_dir, "x.bin", 1000, 4, true, true, 0};
    if (!w && zs_swap_open(&t, &o, err, sizeof(err)) != -EINVAL)
        w = "block_size 1000 accepted";
    o = (struct zs_swap_opts){rank_dir, "x.bin", 4096, 0, true, true, 0};
    if (!w && zs_swap_open(&t, &o, err, sizeof(err)) != -EINVAL)
        w = "queue_depth 0 accepted";
    if (!w && ((rc = zs_swap_write(s, 0, buf + 512, 4096, &tk)) != -EINVAL || !strstr(zs_swap_error(s), "4096")))
        w = why("misaligned buffer: rc %d: %s", rc, zs_swap_error(s));
    if (!w && zs_swap_write(s, 0, buf, 1000, &tk) != -EINVAL)
        w = "size 1000 accepted";
    if (!w && zs_swap_write(s, 512, buf, 4096, &tk) != -EINVAL)
        w = "offset 512 accepted";
    if (!w && ((rc = zs_swap_write(s, 4096, buf, 4096, &tk)) != -EINVAL || !strstr(zs_swap_error(s), "block")))
        w = why("verify, offset inside a block: rc %d: %s", rc, zs_swap_error(s));
    if (!w && zs_swap_wait(s, 12345) != -EINVAL)
        w = "waiting on a ticket never issued";
    if (!w && (zs_swap_write(s, 0, buf, 4096, &tk) || zs_swap_wait(s, tk) || zs_swap_wait(s, tk) != -EINVAL))
        w = why("waiting twice: %s", zs_swap_error(s));
    zs_swap_close(s);
    free(buf);
    return w;
}

/* 1024 outstanding transfers fill the ticket table; the next is refused until they are waited on. And
 * closing with transfers in flight waits for them (ASan would see the buffer freed under the kernel). */
static const char *test_ticket_table(void)
{
    char *buf = alloc_aligned(4 * MiB), err[512];
    struct zs_swap *s = NULL;
    const char *w = NULL;
    uint64_t tk;
    int rc = 0;

    if (!buf)
        return "out of memory";
    fill_random(buf, 4 * MiB);
    if (swap_new(&s, NULL, 4096, 8, false, err, sizeof(err))) {
        free(buf);
        return why("open: %s", err);
    }
    for (int i = 0; i < 1024 && !rc; i++)
        rc = zs_swap_write(s, (uint64_t)i * 4096, buf + (size_t)i * 4096, 4096, &tk);
    if (rc)
        w = why("write: %s", zs_swap_error(s));
    if (!w && (rc = zs_swap_write(s, 0, buf, 4096, &tk)) != -EBUSY)
        w = why("the 1025th outstanding transfer: rc %d", rc);
    if (!w && zs_swap_wait_all(s))
        w = why("wait_all: %s", zs_swap_error(s));
    for (int i = 0; i < 3 && !w; i++)
        if (zs_swap_write(s, (uint64_t)i * MiB, buf + (size_t)i * MiB, MiB, &tk))
            w = why("after wait_all: %s", zs_swap_error(s));
    zs_swap_close(s);
    free(buf);
    return w;
}
/* ---------------------------------------------------------------- main */

/* The scratch directories, and this rank's run directory on disk under which the swap files go. */
static int setup(void)
{
    char err[512];
    bool stale;

    if (fixture_setup())
        return -1;
    if (zs_swap_dir_create(disk_root, 0, rank_dir, sizeof(rank_dir), &stale, err, sizeof(err))) {
        printf("cannot create the rank directory: %s\n", err);
        fixture_cleanup();
        return -1;
    }
    return 0;
}

/* Exits 77 (skip) when this kernel or sandbox has no io_uring. */
static void skip_without_io_uring(void)
{
    struct zs_swap *s;
    char err[512];
    int rc = swap_new(&s, NULL, MiB, 8, false, err, sizeof(err));

    if (!rc) {
        zs_swap_close(s);
        return;
    }
    printf("%s: %s\n", strstr(err, "io_uring unavailable") ? "skip" : "FAIL - open", err);
    zs_swap_dir_remove(rank_dir);
    fixture_cleanup();
    exit(strstr(err, "io_uring unavailable") ? 77 : 1);
}

/* 1 where the file system under dir takes O_DIRECT (then the swapper must use it), -1 where it does not
 * (then either is accepted, and the ramfs case checks the fallback). */
static int want_direct_in(const char *dir, const char *label)
{
    char why_not[128];

    if (direct_supported(dir, why_not, sizeof(why_not)))
        return 1;
    printf("# %s: the file system refuses O_DIRECT (%s): the swapper's O_DIRECT is not demanded there\n", label,
           why_not);
    return -1;
}

int main(int argc, char **argv)
{
    int disk_direct;

    if (setup())
        return 1;
    skip_without_io_uring();
    if (argc > 1)
        return run_one_case(argv[1]);
    disk_direct = want_direct_in(rank_dir, "disk");
    zs_test_report("64 MiB round trip on disk, verify, out-of-order waits, O_DIRECT where the disk takes it",
                   test_round_trip(NULL, 64 * MiB, true, disk_direct, "disk"));
    zs_test_report("64 MiB round trip on disk, no verify", test_round_trip(NULL, 64 * MiB, false, disk_direct, "disk"));
    if (shm_root[0])
        zs_test_report("8 MiB round trip on tmpfs (O_DIRECT where tmpfs takes it)",
                       test_round_trip(shm_root, 8 * MiB, true, want_direct_in(shm_root, "tmpfs"), "tmpfs"));
    else
        printf("# no tmpfs at /dev/shm: the tmpfs round trip is skipped\n");
    zs_test_report("buffered fallback where the filesystem refuses O_DIRECT (ramfs)", test_buffered_fallback());
    zs_test_report("registered 64 MiB region (or reported fallback)", test_registered());
    zs_test_report("short read resubmitted, end of file is -EIO", test_short_and_eof());
    zs_test_report("corrupted block is -EBADMSG naming its offset", test_checksum());
    zs_test_report("injected ENOSPC/EIO reported, swapper usable after", test_faults());
    zs_test_report("bad arguments refused with messages", test_refusals());
    zs_test_report("ticket table full is -EBUSY; close waits", test_ticket_table());
    zs_swap_dir_remove(rank_dir);
    fixture_cleanup();
    printf("%d passed, %d failed\n", zs_test_pass, zs_test_fail);
    return zs_test_fail ? 1 : 0;
}
