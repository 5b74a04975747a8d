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

/* The pid in the owner file, or 0 when there is none or it does not parse (a crash mid-write). */
static long dir_read_owner(int dfd)
{
    char buf[32];
    ssize_t n;
    long pid;
    int fd;

    fd = openat(dfd, OWNER_FILE, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return 0;
    n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    pid = strtol(buf, NULL, 10);
    return pid > 0 ? pid : 0;
}

static bool pid_alive(long pid)
{
    /* EPERM: the process exists but belongs to someone else; still alive */
    return kill((pid_t)pid, 0) == 0 || errno == EPERM;
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

/* A leftover directory: refuse it while its owner lives, otherwise empty it for reuse. */
static int dir_reclaim(int dfd, const char *path, bool *stale, char *err, size_t errlen)
{
    long pid = dir_read_owner(dfd);
    int rc;

    /* our own pid: an earlier engine of this process that failed before removing its directory */
    if (pid && pid != getpid() && pid_alive(pid))
        return zs_swap_msg(err, errlen, -EBUSY, "%s: in use by pid %ld", path, pid);
    rc = dir_clear_files(dfd);
    if (rc)
        return zs_swap_msg(err, errlen, rc, "%s: cannot clear the files of a stale run: %s", path, strerror(-rc));
    *stale = true;
    return 0;
}

static int dir_write_owner(int dfd, const char *path, char *err, size_t errlen)
{
    char buf[32];
    int fd, n, rc = 0;

    fd = openat(dfd, OWNER_FILE, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0 && errno == EEXIST) /* another process reclaimed the same directory between our steps */
        return zs_swap_msg(err, errlen, -EBUSY, "%s: claimed by another process meanwhile", path);
    if (fd < 0)
        return zs_swap_msg(err, errlen, -errno, "%s/%s: %s", path, OWNER_FILE, strerror(errno));
    n = snprintf(buf, sizeof(buf), "%ld\n", (long)getpid());
    if (write(fd, buf, (size_t)n) != n)
        rc = zs_swap_msg(err, errlen, -EIO, "%s/%s: cannot write the owner pid", path, OWNER_FILE);
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
    char name[32];
    bool existed;
    int parent, dfd, rc;

    *stale = false;
    if (!nvme_path || !*nvme_path || rank < 0 || !out)
        return zs_swap_msg(err, errlen, -EINVAL, "swap directory: need an nvme_path and a rank >= 0");
    snprintf(name, sizeof(name), "zeroshard-rank%d", rank);
    if ((size_t)snprintf(out, outlen, "%s/%s", nvme_path, name) >= outlen)
        return zs_swap_msg(err, errlen, -ENAMETOOLONG, "nvme_path '%s': path too long", nvme_path);

    /* nvme_path itself may be a symlink (a mount point alias); only what we create below it may not */
    parent = open(nvme_path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (parent < 0)
        return zs_swap_msg(err, errlen, -errno, "nvme_path '%s': %s", nvme_path, strerror(errno));
    dfd = dir_open_rank(parent, name, out, &existed, err, errlen);
    if (dfd < 0) {
        rc = dfd;
        goto out_close_parent;
    }
    if (!existed && fchmod(dfd, 0700) < 0) { /* whatever the umask took away, we need rwx */
        rc = zs_swap_msg(err, errlen, -errno, "%s: %s", out, strerror(errno));
        goto out_close_dir;
    }
    rc = dir_check_private(dfd, out, err, errlen);
    if (!rc && existed)
        rc = dir_reclaim(dfd, out, stale, err, errlen);
    if (!rc)
        rc = dir_write_owner(dfd, out, err, errlen);
out_close_dir:
    close(dfd);
out_close_parent:
    close(parent);
    return rc;
}

int zs_swap_dir_remove(const char *dir)
{
    int dfd, rc;

    dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dfd < 0)
        return -errno;
    rc = dir_clear_files(dfd);
    close(dfd);
    if (rc)
        return rc;
    return rmdir(dir) < 0 ? -errno : 0;
}
