/* swap_dir.c - the private per-rank run directory under nvme_path. Everything below nvme_path is reached
 * through directory fds opened O_NOFOLLOW, so a symlink planted in a shared scratch area can never
 * redirect our creates or deletes somewhere else. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "swap.h"

#define OWNER_FILE "owner"

int zs_swap_msg(char *err, size_t errlen, int rc, const char *fmt, ...)
{
    va_list ap;

    if (err && errlen) {
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return rc;
}

/* Unlinks the regular files (and symlinks, which unlinkat removes without following) directly inside
 * dfd. Subdirectories and other objects are not ours and are left for rmdir to complain about. */
static int dir_clear_files(int dfd)
{
    struct dirent *de;
    int rc = 0, fd;
    DIR *d;

    fd = dup(dfd);
    if (fd < 0)
        return -errno;
    d = fdopendir(fd);
    if (!d) {
        rc = -errno;
        close(fd);
        return rc;
    }
    while ((de = readdir(d))) {
        struct stat st;

        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        if (fstatat(dfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
            continue; /* vanished meanwhile */
        if (!S_ISREG(st.st_mode) && !S_ISLNK(st.st_mode))
            continue;
        if (unlinkat(dfd, de->d_name, 0) < 0 && errno != ENOENT && !rc)
            rc = -errno;
    }
    closedir(d); /* closes the dup, not dfd */
    return rc;
}

/* ---------------------------------------------------------------- the owner record
 * A pid alone names no process for sure: pids are reused, differ between pid namespaces, and mean nothing
 * on another host sharing the file system. The record therefore holds what makes a process unique, and
 * an owner counts as dead only where that can be checked: same host, same boot, same pid namespace, and
 * the pid gone or started at another time. Anything else is taken to be alive. */

#define OWNER_MAGIC "zeroshard-owner 1"
#define OWNER_HINT "if no run uses it any more, remove the directory"

struct owner {
    char host[256];
    char boot[64];               /* /proc/sys/kernel/random/boot_id */
    char pidns[64];              /* the link /proc/self/ns/pid: "pid:[4026531836]" */
    long pid;
    unsigned long long start;    /* field 22 of /proc/<pid>/stat: clock ticks after boot */
};

enum owner_state {
    OWNER_DEAD,                  /* checked: its pid is gone or belongs to a later process */
    OWNER_SELF,                  /* this very process (an earlier engine that failed before removing) */
    OWNER_ALIVE,                 /* checked: still running here */
    OWNER_ELSEWHERE,             /* another host, boot or pid namespace: cannot be checked, so alive */
};

/* The first line of a small file, without its newline; "unknown" where it cannot be read. */
static void read_first_line(const char *path, char *buf, size_t len)
{
    FILE *f = fopen(path, "re");

    if (!f || !fgets(buf, (int)len, f))
        snprintf(buf, len, "unknown");
    if (f)
        fclose(f);
    buf[strcspn(buf, "\n")] = '\0';
}

/* The start time of pid (field 22 of /proc/<pid>/stat; the name in field 2 may hold spaces and
 * parentheses, so count from the last ')'). -ENOENT when there is no such process. */
static int proc_start_time(long pid, unsigned long long *start)
{
    char path[64], buf[1024], *p;
    ssize_t n;
    int fd;

    snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return n < 0 ? -errno : -EIO;
    buf[n] = '\0';
    p = strrchr(buf, ')');
    if (!p)
        return -EIO;
    /* after ')' come field 3 (state) ... field 22 (starttime): skip 19 fields */
    for (int f = 0; f < 19 && p; f++)
        p = strchr(p + 2, ' ');
    if (!p || sscanf(p + 1, "%llu", start) != 1)
        return -EIO;
    return 0;
}

static int owner_self(struct owner *o)
{
    ssize_t n;

    memset(o, 0, sizeof(*o));
    if (gethostname(o->host, sizeof(o->host) - 1) < 0 || !o->host[0])
        snprintf(o->host, sizeof(o->host), "unknown");
    o->host[strcspn(o->host, " \t\n")] = '\0';
    read_first_line("/proc/sys/kernel/random/boot_id", o->boot, sizeof(o->boot));
    n = readlink("/proc/self/ns/pid", o->pidns, sizeof(o->pidns) - 1);
    if (n <= 0)
        snprintf(o->pidns, sizeof(o->pidns), "unknown");
    o->pid = (long)getpid();
    return proc_start_time(o->pid, &o->start);
}

/* One "key value" line into o; a bit of *seen per key. */
static int owner_field(char *line, struct owner *o, unsigned *seen)
{
    char key[16], val[256], extra;

    if (sscanf(line, "%15s %255s %c", key, val, &extra) != 2)
        return -EBADMSG;
    if (!strcmp(key, "host")) {
        snprintf(o->host, sizeof(o->host), "%s", val);
        *seen |= 1;
    } else if (!strcmp(key, "boot") && strlen(val) < sizeof(o->boot)) { /* fits, with its NUL */
        memcpy(o->boot, val, strlen(val) + 1);
        *seen |= 2;
    } else if (!strcmp(key, "pidns") && strlen(val) < sizeof(o->pidns)) {
        memcpy(o->pidns, val, strlen(val) + 1);
        *seen |= 4;
    } else if (!strcmp(key, "pid") && sscanf(val, "%ld%c", &o->pid, &extra) == 1 && o->pid > 0) {
        *seen |= 8;
    } else if (!strcmp(key, "start") && sscanf(val, "%llu%c", &o->start, &extra) == 1) {
        *seen |= 16;
    } else {
        return -EBADMSG;
    }
    return 0;
}

/* OWNER_MAGIC, then every key once: host, boot, pidns, pid, start. */
static int owner_parse(char *text, struct owner *o)
{
    char *save = NULL, *line;
    unsigned seen = 0;

    memset(o, 0, sizeof(*o));
    line = strtok_r(text, "\n", &save);
    if (!line || strcmp(line, OWNER_MAGIC))
        return -EBADMSG;
    while ((line = strtok_r(NULL, "\n", &save)))
        if (owner_field(line, o, &seen))
            return -EBADMSG;
    return seen == 31 ? 0 : -EBADMSG;
}

/* 0 with *o filled, -ENOENT when there is no record (a crash between mkdir and the record), -EBADMSG
 * when the file is not a record, or another -errno. */
static int owner_read(int dfd, struct owner *o)
{
    char buf[1024];
    ssize_t n;
    int fd;

    fd = openat(dfd, OWNER_FILE, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n < 0)
        return -errno;
    buf[n] = '\0';
    return n < (ssize_t)sizeof(buf) - 1 ? owner_parse(buf, o) : -EBADMSG;
}

static bool same_place(const struct owner *a, const struct owner *b)
{
    return !strcmp(a->host, b->host) && !strcmp(a->boot, b->boot) && !strcmp(a->pidns, b->pidns) &&
           strcmp(a->boot, "unknown") && strcmp(a->pidns, "unknown");
}

static enum owner_state owner_check(const struct owner *o, const struct owner *me)
{
    unsigned long long start;
    int rc;

    /* self first: a process knows its own record even where /proc hides the boot id or pid namespace */
    if (!strcmp(o->host, me->host) && !strcmp(o->boot, me->boot) && !strcmp(o->pidns, me->pidns) &&
        o->pid == me->pid && o->start == me->start)
        return OWNER_SELF;
    if (!same_place(o, me))
        return OWNER_ELSEWHERE;
    rc = proc_start_time(o->pid, &start);
    if (rc == -ENOENT && kill((pid_t)o->pid, 0) < 0 && errno == ESRCH)
        return OWNER_DEAD;
    if (rc == 0 && start != o->start) /* the pid now belongs to a later process */
        return OWNER_DEAD;
    return OWNER_ALIVE; /* running, or /proc unreadable: cannot tell */
}

static int owner_refuse(const char *path, const struct owner *o, const struct owner *me, enum owner_state state,
                        char *err, size_t errlen)
{
    if (state == OWNER_ALIVE)
        return zs_swap_msg(err, errlen, -EBUSY, "%s: in use by pid %ld on this host (%s, started %llu ticks after "
                           "boot); stop that run first", path, o->pid, o->host, o->start);
    return zs_swap_msg(err, errlen, -EBUSY, "%s: in use by pid %ld on host %s (boot %s, pid namespace %s), which "
                       "cannot be checked from host %s (boot %s, pid namespace %s); %s", path, o->pid, o->host,
                       o->boot, o->pidns, me->host, me->boot, me->pidns, OWNER_HINT);
}

/* Refuses a directory someone else could have prepared for us: wrong owner or writable by others. */
static int dir_check_private(int dfd, const char *path, char *err, size_t errlen)
{
    struct stat st;

    if (fstat(dfd, &st) < 0)
        return zs_swap_msg(err, errlen, -errno, "%s: %s", path, strerror(errno));
    if (st.st_uid != geteuid())
        return zs_swap_msg(err, errlen, -EPERM, "%s: owned by uid %u, not by this process (uid %u)", path,
                        (unsigned)st.st_uid, (unsigned)geteuid());
    if (st.st_mode & (S_IWGRP | S_IWOTH))
        return zs_swap_msg(err, errlen, -EPERM, "%s: writable by group or others (mode %04o)", path,
                        (unsigned)(st.st_mode & 07777));
    return 0;
}

/* A leftover directory: refuse it while its owner may live, otherwise empty it for reuse. */
static int dir_reclaim(int dfd, const char *path, const struct owner *me, bool *stale, char *err, size_t errlen)
{
    enum owner_state state = OWNER_DEAD;
    struct owner o;
    int rc = owner_read(dfd, &o);

    if (rc == -EBADMSG)
        return zs_swap_msg(err, errlen, -EBADMSG, "%s/%s: not an owner record of this ZeroShard (from another "
                           "version, damaged, or being written right now); %s", path, OWNER_FILE, OWNER_HINT);
    if (rc && rc != -ENOENT)
        return zs_swap_msg(err, errlen, rc, "%s/%s: %s", path, OWNER_FILE, strerror(-rc));
    if (!rc)
        state = owner_check(&o, me);
    if (state == OWNER_ALIVE || state == OWNER_ELSEWHERE)
        return owner_refuse(path, &o, me, state, err, errlen);
    rc = dir_clear_files(dfd);
    if (rc)
        return zs_swap_msg(err, errlen, rc, "%s: cannot clear the files of a stale run: %s", path, strerror(-rc));
    *stale = true;
    return 0;
}

/* The record goes out in one write to a file created O_EXCL: two runs racing for one directory cannot
 * both claim it. A record that could not be written whole is taken back. */
static int dir_write_owner(int dfd, const char *path, const struct owner *me, char *err, size_t errlen)
{
    char buf[512];
    int fd, n, rc = 0;

    n = snprintf(buf, sizeof(buf), OWNER_MAGIC "\nhost %s\nboot %s\npidns %s\npid %ld\nstart %llu\n", me->host,
                 me->boot, me->pidns, me->pid, me->start);
    if (n < 0 || (size_t)n >= sizeof(buf))
        return zs_swap_msg(err, errlen, -ENAMETOOLONG, "%s: the owner record does not fit", path);
    fd = openat(dfd, OWNER_FILE, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0 && errno == EEXIST) /* another process reclaimed the same directory between our steps */
        return zs_swap_msg(err, errlen, -EBUSY, "%s: claimed by another process meanwhile", path);
    if (fd < 0)
        return zs_swap_msg(err, errlen, -errno, "%s/%s: %s", path, OWNER_FILE, strerror(errno));
    if (write(fd, buf, (size_t)n) != n) {
        rc = zs_swap_msg(err, errlen, -EIO, "%s/%s: cannot write the owner record", path, OWNER_FILE);
        unlinkat(dfd, OWNER_FILE, 0);
    }
    close(fd);
    return rc;
}

/* Opens (creating if needed) name inside parent as a directory, never through a symlink. */
static int dir_open_rank(int parent, const char *name, const char *path, bool *existed, char *err, size_t errlen)
{
    struct stat st;
    int dfd, rc;

    *existed = false;
    if (mkdirat(parent, name, 0700) < 0) {
        if (errno != EEXIST)
            return zs_swap_msg(err, errlen, -errno, "%s: cannot create: %s", path, strerror(errno));
        *existed = true;
    }
    dfd = openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dfd >= 0)
        return dfd;
    rc = -errno;
    /* a symlink fails with ELOOP or, as O_DIRECTORY is checked first on some kernels, ENOTDIR */
    if ((rc == -ELOOP || rc == -ENOTDIR) && fstatat(parent, name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
        S_ISLNK(st.st_mode))
        return zs_swap_msg(err, errlen, -ELOOP, "%s: is a symbolic link; refusing to follow it", path);
    if (rc == -ENOTDIR)
        return zs_swap_msg(err, errlen, rc, "%s: exists and is not a directory", path);
    return zs_swap_msg(err, errlen, rc, "%s: %s", path, strerror(-rc));
}

int zs_swap_dir_create(const char *nvme_path, int rank, char *out, size_t outlen, bool *stale, char *err,
                       size_t errlen)
{
    char name[32], path[4096];
    struct owner me;
    bool existed = false;
    int parent, dfd, rc, n;

    *stale = false;
    if (out && outlen)
        out[0] = '\0'; /* a path only once the directory is ours: the caller removes what out names */
    if (!nvme_path || !*nvme_path || rank < 0 || !out)
        return zs_swap_msg(err, errlen, -EINVAL, "swap directory: need an nvme_path and a rank >= 0");
    snprintf(name, sizeof(name), "zeroshard-rank%d", rank);
    n = snprintf(path, sizeof(path), "%s/%s", nvme_path, name);
    if (n < 0 || (size_t)n >= sizeof(path) || (size_t)n >= outlen)
        return zs_swap_msg(err, errlen, -ENAMETOOLONG, "nvme_path '%s': path too long", nvme_path);
    rc = owner_self(&me);
    if (rc)
        return zs_swap_msg(err, errlen, rc, "swap directory: cannot read this process's start time from "
                           "/proc/self/stat: %s", strerror(-rc));

    /* nvme_path itself may be a symlink (a mount point alias); only what we create below it may not */
    parent = open(nvme_path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (parent < 0)
        return zs_swap_msg(err, errlen, -errno, "nvme_path '%s': %s", nvme_path, strerror(errno));
    dfd = dir_open_rank(parent, name, path, &existed, err, errlen);
    if (dfd < 0) {
        rc = dfd;
        goto out_close_parent;
    }
    if (!existed && fchmod(dfd, 0700) < 0) { /* whatever the umask took away, we need rwx */
        rc = zs_swap_msg(err, errlen, -errno, "%s: %s", path, strerror(errno));
        goto out_close_dir;
    }
    rc = dir_check_private(dfd, path, err, errlen);
    if (!rc && existed)
        rc = dir_reclaim(dfd, path, &me, stale, err, errlen);
    if (!rc)
        rc = dir_write_owner(dfd, path, &me, err, errlen);
    if (!rc)
        snprintf(out, outlen, "%s", path);
out_close_dir:
    close(dfd);
    if (rc && !existed) /* the empty directory we made; fails harmlessly if someone claimed it meanwhile */
        unlinkat(parent, name, AT_REMOVEDIR);
out_close_parent:
    close(parent);
    return rc;
}

int zs_swap_dir_remove(const char *dir)
{
    struct owner me, o;
    int dfd, rc;

    dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dfd < 0)
        return -errno;
    /* only a directory this process holds: never another run's files, whatever the caller passes */
    rc = owner_self(&me);
    if (!rc)
        rc = owner_read(dfd, &o);
    if (!rc && owner_check(&o, &me) != OWNER_SELF)
        rc = -EPERM;
    if (!rc)
        rc = dir_clear_files(dfd);
    close(dfd);
    if (rc)
        return rc;
    return rmdir(dir) < 0 ? -errno : 0;
}
