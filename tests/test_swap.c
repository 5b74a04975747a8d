/* test_swap.c - the NVMe swapper: the run directory refuses what it must (live owners, symlinks, missing
 * paths), data survives a round trip through io_uring, and every failure (checksum, injected ENOSPC/EIO,
 * end of file) comes back through zs_swap_wait naming file and offset, with the swapper still usable.
 * Exits 77 when io_uring is unavailable here. */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sched.h>
#include <string.h>

#include "check.h"  /* defines: zs_test_report and the pass/fail counters */
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "offload/swap.h" /* defines: zs_swap_*, zs_crc32c */

#define KiB 1024u
#define MiB (1024u * 1024u)
#define TMPFS_MAGIC_NUMBER 0x01021994

static char why_buf[2048];
static char disk_root[PATH_MAX], shm_root[PATH_MAX], rank_dir[PATH_MAX];
static int file_seq;

static const char *why(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static const char *why(const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(why_buf, sizeof(why_buf), fmt, ap);
    va_end(ap);
    return why_buf;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static void fill_random(void *p, size_t n)
{
    unsigned char *b = p;

    for (size_t i = 0; i < n; i++) {
        rng_state ^= rng_state << 13;
        rng_state ^= rng_state >> 7;
        rng_state ^= rng_state << 17;
        b[i] = (unsigned char)(rng_state >> 32);
    }
}

static void *alloc_aligned(size_t n)
{
    void *p = NULL;

    return posix_memalign(&p, 4096, n) ? NULL : p;
}

static double now_s(void)
{
    struct timespec t;

    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

static void rm_tree(const char *path)
{
    nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static bool exists(const char *path)
{
    struct stat st;

    return lstat(path, &st) == 0;
}

static int write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");

    if (!f)
        return -errno;
    fputs(text, f);
    return fclose(f) ? -errno : 0;
}

static void read_text(const char *path, char *buf, size_t len)
{
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, len - 1, f) : 0;

    buf[n] = '\0';
    if (f)
        fclose(f);
}

/* Start time of pid in clock ticks after boot (field 22 of /proc/<pid>/stat), 0 if it has none. */
static unsigned long long proc_start(long pid)
{
    char path[64], buf[1024], *p;
    unsigned long long t = 0;

    snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
    read_text(path, buf, sizeof(buf));
    p = strrchr(buf, ')');
    if (p && sscanf(p + 1, " %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %llu",
                    &t) != 1)
        t = 0;
    return t;
}

/* The owner record of pid as issue 11 item 8 defines it (host, boot id, pid namespace, pid, start
 * time), built here independently of swap_dir.c; host NULL: this host. */
static void owner_record(char *buf, size_t len, long pid, const char *host, unsigned long long start)
{
    char me[256] = "", boot[64], ns[64] = "";

    gethostname(me, sizeof(me) - 1);
    read_text("/proc/sys/kernel/random/boot_id", boot, sizeof(boot));
    boot[strcspn(boot, "\n")] = '\0';
    if (readlink("/proc/self/ns/pid", ns, sizeof(ns) - 1) < 0)
        ns[0] = '\0';
    snprintf(buf, len, "zeroshard-owner 1\nhost %s\nboot %s\npidns %s\npid %ld\nstart %llu\n", host ? host : me, boot,
             ns, pid, start);
}

/* A fresh empty directory below root for one directory test. */
static const char *subdir(const char *root, char *out, size_t outlen)
{
    if ((size_t)snprintf(out, outlen, "%s/d%d", root, ++file_seq) >= outlen)
        return "path too long";
    return mkdir(out, 0700) ? strerror(errno) : NULL;
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

/* ---------------------------------------------------------------- CRC32C */

static uint32_t crc_bitwise(uint32_t crc, const unsigned char *p, size_t n)
{
    crc = ~crc;
    while (n--) {
        crc ^= *p++;
        for (int k = 0; k < 8; k++)
            crc = crc & 1 ? (crc >> 1) ^ 0x82F63B78u : crc >> 1;
    }
    return ~crc;
}

static const char *test_crc_known(void)
{
    const char *s = "123456789";

    if (zs_crc32c(0, s, 9) != 0xE3069283u || zs_crc32c_sw(0, s, 9) != 0xE3069283u)
        return why("got %08x (fast) / %08x (table)", zs_crc32c(0, s, 9), zs_crc32c_sw(0, s, 9));
    if (zs_crc32c(zs_crc32c(0, s, 4), s + 4, 5) != 0xE3069283u)
        return "continuing from a partial CRC gives a different answer";
    if (zs_crc32c(0, s, 0) != 0 || crc_bitwise(0, (const unsigned char *)s, 9) != 0xE3069283u)
        return "empty input or bitwise reference wrong";
    return NULL;
}

static const char *test_crc_fast_vs_table(void)
{
    static const size_t lens[] = {0, 1, 7, 8, 9, 63, 64, 65, 4095, 4096, 4097, 100000};
    size_t n = MiB + 64;
    unsigned char *buf = malloc(n);
    const char *w = NULL;

    if (!buf)
        return "out of memory";
    fill_random(buf, n);
    for (size_t a = 0; a < 8 && !w; a++)
        for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]) && !w; i++) {
            uint32_t ref = crc_bitwise(0x1234u, buf + a, lens[i]);

            if (zs_crc32c(0x1234u, buf + a, lens[i]) != ref || zs_crc32c_sw(0x1234u, buf + a, lens[i]) != ref)
                w = why("offset %zu length %zu: fast %08x table %08x bitwise %08x", a, lens[i],
                        zs_crc32c(0x1234u, buf + a, lens[i]), zs_crc32c_sw(0x1234u, buf + a, lens[i]), ref);
        }
    if (!w && zs_crc32c(0, buf + 3, MiB) != zs_crc32c_sw(0, buf + 3, MiB))
        w = "1 MiB: instruction and table disagree";
    free(buf);
    printf("# crc32c: %s\n", zs_crc32c_hw() ? "SSE4.2 instruction" : "table (no SSE4.2)");
    return w;
}

/* ---------------------------------------------------------------- the run directory */

static const char *test_dir_create_remove(void)
{
    char sub[PATH_MAX], out[PATH_MAX], want[PATH_MAX + 32], p[PATH_MAX + 64], err[512], got[1024], rec[1024];
    const char *w = subdir(disk_root, sub, sizeof(sub));
    bool stale = true;
    struct stat st;
    int rc;

    if (w)
        return w;
    rc = zs_swap_dir_create(sub, 3, out, sizeof(out), &stale, err, sizeof(err));
    snprintf(want, sizeof(want), "%s/zeroshard-rank3", sub);
    if (rc || stale || strcmp(out, want))
        return why("rc %d stale %d path %s: %s", rc, stale, out, err);
    if (stat(out, &st) || !S_ISDIR(st.st_mode) || (st.st_mode & 0777) != 0700)
        return why("mode %o", (unsigned)st.st_mode);
    snprintf(p, sizeof(p), "%s/owner", out);
    read_text(p, got, sizeof(got));
    owner_record(rec, sizeof(rec), (long)getpid(), NULL, proc_start((long)getpid()));
    if (strcmp(got, rec))
        return why("owner record:\n%s\nexpected:\n%s", got, rec);
    snprintf(p, sizeof(p), "%s/swap.bin", out);
    write_file(p, "data");
    rc = zs_swap_dir_remove(out);
    if (rc || exists(out))
        return why("remove: rc %d, still there: %d", rc, exists(out));
    return NULL;
}

/* A pid that is certainly dead: a child that has exited and been reaped. */
static pid_t dead_pid(void)
{
    pid_t pid = fork();

    if (pid == 0)
        _exit(0);
    if (pid > 0)
        waitpid(pid, NULL, 0);
    return pid;
}

/* Plants a leftover rank directory with an owner record and a junk file. */
static const char *plant_rank_dir(const char *sub, const char *record, char *rdir, size_t len)
{
    char p[PATH_MAX + 64];

    if ((size_t)snprintf(rdir, len, "%s/zeroshard-rank0", sub) >= len)
        return "path too long";
    if (mkdir(rdir, 0700))
        return strerror(errno);
    snprintf(p, sizeof(p), "%s/owner", rdir);
    write_file(p, record);
    snprintf(p, sizeof(p), "%s/junk.bin", rdir);
    write_file(p, "junk");
    return NULL;
}

/* Plants the record of pid (on this host, with start time start) and asks for the directory: *reclaimed
 * when it was taken over (junk gone, the record now ours), else the error is in err and junk.bin is
 * checked to have survived. */
static const char *claim_planted(const char *record, bool *reclaimed, int *rc, char *err, size_t errlen)
{
    char sub[PATH_MAX], rdir[PATH_MAX], out[PATH_MAX], p[PATH_MAX + 64], got[1024], rec[1024];
    const char *w = subdir(disk_root, sub, sizeof(sub));
    bool stale = false;

    if (w || (w = plant_rank_dir(sub, record, rdir, sizeof(rdir))))
        return w;
    *rc = zs_swap_dir_create(sub, 0, out, sizeof(out), &stale, err, errlen);
    snprintf(p, sizeof(p), "%s/junk.bin", rdir);
    *reclaimed = *rc == 0;
    if (*rc) {
        if (out[0])
            return why("refused (rc %d) but the path was handed out for removal: %s", *rc, out);
        return exists(p) ? NULL : why("refused (rc %d: %s) and the owner's files were removed", *rc, err);
    }
    if (!stale || exists(p))
        return why("reclaimed: stale %d, junk file still there %d", stale, exists(p));
    snprintf(p, sizeof(p), "%s/owner", rdir);
    read_text(p, got, sizeof(got));
    owner_record(rec, sizeof(rec), (long)getpid(), NULL, proc_start((long)getpid()));
    if (strcmp(got, rec))
        return why("the record after reclaim is not ours:\n%s", got);
    return zs_swap_dir_remove(out) ? "remove failed" : NULL;
}

static const char *test_dir_stale(void)
{
    char sub[PATH_MAX], rdir[PATH_MAX], out[PATH_MAX], p[PATH_MAX + 64], victim[PATH_MAX + 64], err[512];
    char rec[1024];
    const char *w = subdir(disk_root, sub, sizeof(sub));
    pid_t pid = dead_pid();
    bool stale = false;
    int rc;

    if (w || pid < 0)
        return w ? w : "fork failed";
    if (kill(pid, 0) == 0)
        return why("pid %ld still alive", (long)pid);
    owner_record(rec, sizeof(rec), (long)pid, NULL, 12345);
    w = plant_rank_dir(sub, rec, rdir, sizeof(rdir));
    if (w)
        return w;
    /* a symlink inside must go without its target going with it */
    snprintf(victim, sizeof(victim), "%s/victim", sub);
    write_file(victim, "keep me");
    snprintf(p, sizeof(p), "%s/link", rdir);
    if (symlink(victim, p))
        return strerror(errno);
    rc = zs_swap_dir_create(sub, 0, out, sizeof(out), &stale, err, sizeof(err));
    if (rc || !stale)
        return why("rc %d stale %d: %s", rc, stale, err);
    snprintf(p, sizeof(p), "%s/junk.bin", rdir);
    if (exists(p))
        return "junk file of the dead run still there";
    snprintf(p, sizeof(p), "%s/link", rdir);
    if (exists(p) || !exists(victim))
        return "symlink not removed, or its target removed";
    return zs_swap_dir_remove(out) ? "remove failed" : NULL;
}

static const char *test_dir_live_owner(void)
{
    long pid = (long)getppid(); /* our parent is alive and is not us */
    char rec[1024], want[64], err[512];
    bool reclaimed;
    const char *w;
    int rc;

    owner_record(rec, sizeof(rec), pid, NULL, proc_start(pid));
    w = claim_planted(rec, &reclaimed, &rc, err, sizeof(err));
    snprintf(want, sizeof(want), "in use by pid %ld on this host", pid);
    if (!w && (reclaimed || rc != -EBUSY || !strstr(err, want) || !strstr(err, "zeroshard-rank0")))
        w = why("rc %d: %s", rc, err);
    printf("# live owner: %s\n", err);
    return w;
}

/* issue 11 item 8: a live pid that started at another time than the recorded one is a reused pid; the
 * record's process is dead and the directory is taken over. */
static const char *test_dir_reused_pid(void)
{
    long pid = (long)getppid();
    char rec[1024], err[512];
    bool reclaimed;
    const char *w;
    int rc;

    owner_record(rec, sizeof(rec), pid, NULL, proc_start(pid) + 1);
    w = claim_planted(rec, &reclaimed, &rc, err, sizeof(err));
    return w ? w : reclaimed ? NULL : why("not taken over: rc %d: %s", rc, err);
}

/* issue 11 item 8: an owner on another host (a shared file system) or from another boot cannot be
 * checked from here: refused even with a pid that is dead here, naming host and pid and the way out. */
static const char *test_dir_other_host(void)
{
    char rec[1024], err[512], *b;
    long pid = (long)dead_pid();
    bool reclaimed;
    const char *w;
    int rc;

    owner_record(rec, sizeof(rec), pid, "zs-test-elsewhere", 777);
    w = claim_planted(rec, &reclaimed, &rc, err, sizeof(err));
    if (!w && (reclaimed || rc != -EBUSY || !strstr(err, "pid") || !strstr(err, "host zs-test-elsewhere") ||
               !strstr(err, "remove the directory")))
        w = why("another host: rc %d: %s", rc, err);
    printf("# another host: %s\n", err);
    if (w)
        return w;
    owner_record(rec, sizeof(rec), pid, NULL, 777);
    b = strstr(rec, "boot ") + 5;
    *b = *b == '0' ? '1' : '0'; /* the same host, another boot id */
    w = claim_planted(rec, &reclaimed, &rc, err, sizeof(err));
    if (!w && (reclaimed || rc != -EBUSY || !strstr(err, "cannot be checked")))
        w = why("another boot: rc %d: %s", rc, err);
    return w;
}

/* issue 11 item 8: a record that does not parse (a bare pid of the old format, junk, a truncated one)
 * is an error saying what to do, never a reason to delete. */
static const char *test_dir_garbage_owner(void)
{
    static const char *const bad[] = {"12345\n", "\x01\x02garbage", "",
                                      "zeroshard-owner 1\nhost h\nboot b\npidns p\npid 12\n"};
    char err[512];
    bool reclaimed;
    const char *w = NULL;
    int rc;

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]) && !w; i++) {
        w = claim_planted(bad[i], &reclaimed, &rc, err, sizeof(err));
        if (!w && (reclaimed || rc != -EBADMSG || !strstr(err, "owner: not an owner record") ||
                   !strstr(err, "remove the directory")))
            w = why("record %zu: rc %d: %s", i, rc, err);
    }
    printf("# garbage record: %s\n", err);
    return w;
}

/* issue 11 item 7: removal takes only a directory this process holds, whatever path it is given. */
static const char *test_dir_remove_not_ours(void)
{
    char sub[PATH_MAX], rdir[PATH_MAX], p[PATH_MAX + 64], rec[1024];
    const char *w = subdir(disk_root, sub, sizeof(sub));
    long pid = (long)getppid();
    int rc;

    owner_record(rec, sizeof(rec), pid, NULL, proc_start(pid));
    if (w || (w = plant_rank_dir(sub, rec, rdir, sizeof(rdir))))
        return w;
    rc = zs_swap_dir_remove(rdir);
    snprintf(p, sizeof(p), "%s/junk.bin", rdir);
    if (rc != -EPERM || !exists(p))
        return why("removing another process's directory: rc %d, its file %s", rc, exists(p) ? "kept" : "deleted");
    return NULL;
}

static const char *test_dir_symlink(void)
{
    char sub[PATH_MAX], target[PATH_MAX + 16], rdir[PATH_MAX + 32], p[PATH_MAX + 64], out[PATH_MAX], err[512];
    const char *w = subdir(disk_root, sub, sizeof(sub));
    bool stale = false;
    int rc;

    if (w)
        return w;
    snprintf(target, sizeof(target), "%s/elsewhere", sub);
    mkdir(target, 0700);
    snprintf(p, sizeof(p), "%s/precious", target);
    write_file(p, "do not delete");
    snprintf(rdir, sizeof(rdir), "%s/zeroshard-rank0", sub);
    if (symlink(target, rdir))
        return strerror(errno);
    rc = zs_swap_dir_create(sub, 0, out, sizeof(out), &stale, err, sizeof(err));
    if (rc != -ELOOP || !strstr(err, rdir))
        return why("rc %d: %s", rc, err);
    if (!exists(p))
        return "followed the symlink and deleted the target's file";
    snprintf(p, sizeof(p), "%s/owner", target);
    return exists(p) ? "wrote an owner file through the symlink" : NULL;
}

/* A leftover that others could have written into is not ours to reuse, whoever its owner was. */
static const char *test_dir_not_private(void)
{
    char sub[PATH_MAX], rdir[PATH_MAX], out[PATH_MAX], err[512], rec[1024];
    const char *w = subdir(disk_root, sub, sizeof(sub));
    bool stale = false;
    int rc;

    owner_record(rec, sizeof(rec), (long)dead_pid(), NULL, 1);
    if (w || (w = plant_rank_dir(sub, rec, rdir, sizeof(rdir))))
        return w;
    chmod(rdir, 0770);
    rc = zs_swap_dir_create(sub, 0, out, sizeof(out), &stale, err, sizeof(err));
    if (rc != -EPERM || !strstr(err, "writable by group or others") || !strstr(err, rdir))
        return why("group-writable: rc %d: %s", rc, err);
    rm_tree(rdir);
    write_file(rdir, "a regular file where the directory should be");
    rc = zs_swap_dir_create(sub, 0, out, sizeof(out), &stale, err, sizeof(err));
    if (rc != -ENOTDIR || !strstr(err, "not a directory") || !strstr(err, rdir))
        return why("regular file: rc %d: %s", rc, err);
    return NULL;
}

static const char *test_dir_missing(void)
{
    char sub[PATH_MAX], path[PATH_MAX + 16], out[PATH_MAX], err[512];
    const char *w = subdir(disk_root, sub, sizeof(sub));
    bool stale;
    int rc;

    if (w)
        return w;
    snprintf(path, sizeof(path), "%s/nope", sub);
    rc = zs_swap_dir_create(path, 0, out, sizeof(out), &stale, err, sizeof(err));
    if (rc != -ENOENT || !strstr(err, path) || !strstr(err, "nvme_path"))
        return why("missing: rc %d: %s", rc, err);
    write_file(path, "a file");
    rc = zs_swap_dir_create(path, 0, out, sizeof(out), &stale, err, sizeof(err));
    if (rc != -ENOTDIR || !strstr(err, path))
        return why("a file: rc %d: %s", rc, err);
    return NULL;
}

/* Root ignores permission bits, so an unwritable place for everyone is a procfs directory. */
static const char *test_dir_unwritable(void)
{
    char out[PATH_MAX], err[512], sub[PATH_MAX];
    const char *w;
    bool stale;
    int rc;

    rc = zs_swap_dir_create("/proc/self", 0, out, sizeof(out), &stale, err, sizeof(err));
    if (rc >= 0 || !strstr(err, "/proc/self/zeroshard-rank0"))
        return why("/proc/self: rc %d: %s", rc, err);
    if (geteuid() == 0) {
        printf("# running as root: the chmod 0500 case is skipped (root bypasses permissions)\n");
        return NULL;
    }
    w = subdir(disk_root, sub, sizeof(sub));
    if (w)
        return w;
    chmod(sub, 0500);
    rc = zs_swap_dir_create(sub, 0, out, sizeof(out), &stale, err, sizeof(err));
    chmod(sub, 0700);
    return rc == -EACCES && strstr(err, sub) ? NULL : why("mode 0500: rc %d: %s", rc, err);
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

/* The swapper's own file descriptor for path, looked up in /proc/self/fd: its open flags from fdinfo,
 * -1 when not found. Holds the swapper to what it reports, not only to its word. */
static long fd_flags_of(const char *path)
{
    char link[64], target[PATH_MAX + 1], info[1024], *f;
    long flags = -1;

    for (int fd = 3; fd < 1024 && flags < 0; fd++) {
        ssize_t n;

        snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
        n = readlink(link, target, sizeof(target) - 1);
        if (n < 0)
            continue;
        target[n] = '\0';
        if (strcmp(target, path))
            continue;
        snprintf(link, sizeof(link), "/proc/self/fdinfo/%d", fd);
        read_text(link, info, sizeof(info));
        f = strstr(info, "flags:");
        if (f)
            flags = strtol(f + 6, NULL, 8);
    }
    return flags;
}

/* issue 11 item 20: where the file system takes O_DIRECT the swapper must use it, and say so; a swapper
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

/* The cases that can be skipped, each alone for a ctest of its own (issue 11, skips): 77 where this machine
 * cannot run the case, so ctest shows a skip rather than a pass. "ramfs": the buffered fallback (needs
 * mount(2) in a private namespace); "chmod": an unwritable nvme_path by permission bits (not as root). */
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
    } else if (!strcmp(name, "chmod") && geteuid() == 0) {
        printf("skip: running as root, which bypasses permission bits: the chmod 0500 case cannot run\n");
        rc = 77;
    } else if (!strcmp(name, "chmod")) {
        w = test_dir_unwritable();
        rc = w ? 1 : 0;
    } else if (!strcmp(name, "hang")) {
        w = test_hang();
        rc = w ? 1 : 0;
    } else {
        printf("usage: test_swap [ramfs|chmod|hang]\n");
        rc = 2;
    }
    printf("%s - %s%s%s\n", rc == 0 ? "ok" : rc == 77 ? "skip" : "FAIL", name, w ? ": " : "", w ? w : "");
    zs_swap_dir_remove(rank_dir);
    rm_tree(disk_root);
    if (shm_root[0])
        rm_tree(shm_root);
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

/* issue 14: a wait on a disk that never answers ends after the deadline (ZS_TIMEOUT seconds, set by the
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

static bool is_tmpfs(const char *path)
{
    struct statfs f;

    return statfs(path, &f) == 0 && f.f_type == TMPFS_MAGIC_NUMBER;
}

static int setup(void)
{
    char cwd[PATH_MAX], err[512];
    bool stale;

    if (!getcwd(cwd, sizeof(cwd)) || (size_t)snprintf(disk_root, sizeof(disk_root), "%s/zs-swap-XXXXXX", cwd) >=
                                         sizeof(disk_root) || !mkdtemp(disk_root)) {
        printf("cannot create a test directory under the working directory: %s\n", strerror(errno));
        return -1;
    }
    snprintf(shm_root, sizeof(shm_root), "/dev/shm/zs-swap-XXXXXX");
    if (!is_tmpfs("/dev/shm") || !mkdtemp(shm_root))
        shm_root[0] = '\0';
    if (zs_swap_dir_create(disk_root, 0, rank_dir, sizeof(rank_dir), &stale, err, sizeof(err))) {
        printf("cannot create the rank directory: %s\n", err);
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
    rm_tree(disk_root);
    if (shm_root[0])
        rm_tree(shm_root);
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
    zs_test_report("crc32c known answer and continuation", test_crc_known());
    zs_test_report("crc32c instruction equals table equals bitwise", test_crc_fast_vs_table());
    zs_test_report("run directory created 0700 with owner pid, removed", test_dir_create_remove());
    zs_test_report("stale run directory of a dead pid cleared", test_dir_stale());
    zs_test_report("run directory of a live pid refused with -EBUSY", test_dir_live_owner());
    zs_test_report("issue 11 item 8: a reused pid (other start time) is taken over", test_dir_reused_pid());
    zs_test_report("issue 11 item 8: an owner on another host or boot is refused", test_dir_other_host());
    zs_test_report("issue 11 item 8: an unparseable owner record is a clear error", test_dir_garbage_owner());
    zs_test_report("issue 11 item 7: dir_remove refuses a directory it does not hold", test_dir_remove_not_ours());
    zs_test_report("symlink at the run directory refused, not followed", test_dir_symlink());
    zs_test_report("group-writable run directory or a file in its place refused", test_dir_not_private());
    zs_test_report("missing or non-directory nvme_path named in the error", test_dir_missing());
    zs_test_report("unwritable nvme_path refused", test_dir_unwritable());
    disk_direct = want_direct_in(rank_dir, "disk");
    zs_test_report("issue 11 item 20: 64 MiB round trip on disk, verify, out-of-order waits, O_DIRECT where the disk takes it",
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
    rm_tree(disk_root);
    if (shm_root[0])
        rm_tree(shm_root);
    printf("%d passed, %d failed\n", zs_test_pass, zs_test_fail);
    return zs_test_fail ? 1 : 0;
}
