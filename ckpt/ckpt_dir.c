/* ckpt_dir.c - the directory side of a checkpoint save, all on rank 0: the lock that keeps two jobs out of
 * one save directory, removing our own directories without ever following a link, and the order of fsyncs
 * and renames that makes a tag and then `latest` visible, so that `latest` names a complete checkpoint at
 * every instant and the order holds on every file system, not only journaled ones. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"       /* defines: zs_fail */
#include "base/test_hooks.h"
#include "ckpt_dir.h"
#include "ckpt_format.h" /* defines: ZS_CKPT_LATEST, ZS_CKPT_LOCK, zs_ckpt_read_latest */

#define REMOVE_DEPTH 4 /* our directories hold plain files; anything deeper is not ours to walk */

/* out = a/b; the caller checked that dir paths leave room for a tag and a file name. */
static void join(char *out, const char *a, const char *b)
{
    if (snprintf(out, PATH_MAX, "%s/%s", a, b) >= PATH_MAX)
        out[PATH_MAX - 1] = '\0';
}

/* dir/<tag><suffix> */
static void tag_path(char *out, const char *dir, const char *tag, const char *suffix)
{
    if (snprintf(out, PATH_MAX, "%s/%s%s", dir, tag, suffix) >= PATH_MAX)
        out[PATH_MAX - 1] = '\0';
}

// ----------------------------------------------------------------------------------- test hooks

static int hook_rank;
static long hook_count;

void zs_ckpt_hook_rank(int rank)
{
    hook_rank = rank;
    hook_count = 0; /* steps are counted within one save or load */
}

/* ZS_TEST_CKPT_TRACE=FILE appends "RANK STEP ARGS" for every step of a save before it is done (mkdir,
 * fsync, rename, exchange, link, write, remove, lock; and "load UNIT" for each unit a load reads), so a
 * test can check their order. ZS_TEST_CKPT_FAULT=RANK:ACTION:K acts on that rank's K-th step, counted from
 * 1 in each save or load:
 * kill (SIGKILL: a crash just before the step), stop (SIGSTOP: a job paused mid-save, holding the lock),
 * fail (the step fails with EIO) or enospc (with ENOSPC, as on a full disk). */
int zs_ckpt_event(const char *what, const char *a, const char *b)
{
    const char *trace = getenv(ZS_TEST_HOOK_CKPT_TRACE), *fault = getenv(ZS_TEST_HOOK_CKPT_FAULT);
    char action[16];
    long k;
    int r;

    hook_count++;
    if (trace && *trace) {
        FILE *f = fopen(trace, "ae");
        if (f) {
            fprintf(f, "%d %s %s%s%s\n", hook_rank, what, a, b ? " " : "", b ? b : "");
            fclose(f);
        }
    }
    if (!fault || sscanf(fault, "%d:%15[a-z]:%ld", &r, action, &k) != 3 || r != hook_rank || k != hook_count)
        return 0;
    if (!strcmp(action, "kill"))
        raise(SIGKILL);
    if (!strcmp(action, "stop"))
        raise(SIGSTOP);
    if (!strcmp(action, "fail"))
        return -EIO;
    return !strcmp(action, "enospc") ? -ENOSPC : 0;
}

// ----------------------------------------------------------------------------------- steps

static zs_status step_fail(int rc, const char *what, const char *path)
{
    return zs_fail(ZS_ERR_IO, "checkpoint: %s %s: %s", what, path, strerror(-rc));
}

static zs_status fsync_dir(const char *dir)
{
    int rc = zs_ckpt_event("fsync", dir, NULL), fd = -1;

    if (!rc && (fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0)
        rc = -errno;
    if (!rc && fsync(fd))
        rc = -errno;
    if (fd >= 0)
        close(fd);
    return rc ? step_fail(rc, "fsync", dir) : ZS_OK;
}

/* The parent of a directory we created: its entry is only durable once the parent is fsynced. */
static zs_status fsync_parent(const char *path)
{
    char parent[PATH_MAX];
    char *slash;

    snprintf(parent, sizeof(parent), "%s", path);
    while ((slash = strrchr(parent, '/')) && slash != parent && !slash[1]) /* "a/b/" is a/b */
        *slash = '\0';
    slash = strrchr(parent, '/');
    if (!slash)
        snprintf(parent, sizeof(parent), ".");
    else
        slash[slash == parent] = '\0'; /* "/x" has the parent "/" */
    return fsync_dir(parent);
}

static zs_status make_dir(const char *path, mode_t mode)
{
    int rc = zs_ckpt_event("mkdir", path, NULL);

    if (!rc && mkdir(path, mode))
        rc = -errno;
    return rc ? zs_fail(ZS_ERR_IO, "checkpoint: cannot create %s: %s", path, strerror(-rc)) : ZS_OK;
}

static zs_status move(const char *from, const char *to, bool exchange, int *err)
{
    int rc = zs_ckpt_event(exchange ? "exchange" : "rename", from, to);

    if (!rc && (exchange ? renameat2(AT_FDCWD, from, AT_FDCWD, to, RENAME_EXCHANGE) : rename(from, to)))
        rc = -errno;
    if (err)
        *err = rc;
    return rc ? zs_fail(ZS_ERR_IO, "checkpoint: cannot %s %s and %s: %s", exchange ? "exchange" : "rename", from, to,
                        strerror(-rc))
              : ZS_OK;
}

zs_status zs_ckpt_write_file(const char *path, const char *text)
{
    size_t len = strlen(text), done = 0;
    int rc = zs_ckpt_event("write", path, NULL), fd = -1;

    if (!rc && (fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600)) < 0)
        rc = -errno;
    while (!rc && done < len) {
        ssize_t n = write(fd, text + done, len - done);

        if (n < 0 && errno != EINTR)
            rc = -errno;
        else if (n == 0)
            rc = -EIO;
        else if (n > 0)
            done += (size_t)n;
    }
    if (!rc && fsync(fd))
        rc = -errno;
    if (fd >= 0 && close(fd) && !rc)
        rc = -errno;
    return rc ? zs_fail(ZS_ERR_IO, "checkpoint: cannot write %s: %s", path, strerror(-rc)) : ZS_OK;
}

/* Removes `name` inside `at`: a file or a link is unlinked (a link is never followed, wherever it points),
 * a directory is emptied the same way and removed. Best effort: what cannot go stays. */
static void remove_at(int at, const char *name, int depth)
{
    struct dirent *e;
    DIR *d;
    int fd;

    if (!unlinkat(at, name, 0) || errno == ENOENT || (errno != EISDIR && errno != EPERM) || depth > REMOVE_DEPTH)
        return;
    fd = openat(at, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return;
    d = fdopendir(fd);
    if (!d) {
        close(fd);
        return;
    }
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            remove_at(dirfd(d), e->d_name, depth + 1);
    closedir(d);
    unlinkat(at, name, AT_REMOVEDIR);
}

static void remove_tree(const char *path)
{
    struct stat sb;

    if (fstatat(AT_FDCWD, path, &sb, AT_SYMLINK_NOFOLLOW) && errno == ENOENT)
        return; /* nothing to do: no step to trace */
    zs_ckpt_event("remove", path, NULL);
    remove_at(AT_FDCWD, path, 0);
}

/* `latest` := name: a new file renamed over it, then the directory fsynced, so it never names a tag whose
 * own rename is not yet durable (the tag's rename is fsynced before this is called). */
static zs_status set_latest(const char *dir, const char *name)
{
    char tmp[PATH_MAX], final[PATH_MAX], text[NAME_MAX + 2];
    zs_status st;

    join(tmp, dir, ZS_CKPT_LATEST ".tmp");
    join(final, dir, ZS_CKPT_LATEST);
    snprintf(text, sizeof(text), "%s\n", name);
    st = zs_ckpt_write_file(tmp, text);
    if (!st)
        st = move(tmp, final, false, NULL);
    if (st) {
        unlink(tmp);
        return st;
    }
    return fsync_dir(dir);
}

/* Whether `latest` names dir/<tag><suffix>. */
static bool latest_is(const char *dir, const char *tag, const char *suffix)
{
    char name[NAME_MAX + 2], want[NAME_MAX + 2], err[256];

    snprintf(want, sizeof(want), "%s%s", tag, suffix);
    return !zs_ckpt_read_latest(dir, name, sizeof(name), err, sizeof(err)) && !strcmp(name, want);
}

// ----------------------------------------------------------------------------------- the lock

/* An flock on dir/save.lock for the whole save, recording who holds it: two jobs saving into one
 * directory would share the temporary names and clear each other's files. The lock goes with the
 * process, so a crashed job never leaves it held. */
static zs_status take_lock(const char *dir, int *lock_fd)
{
    char path[PATH_MAX], owner[256] = "", host[128] = "?";
    ssize_t n;
    int fd, e;

    join(path, dir, ZS_CKPT_LOCK);
    fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0)
        return zs_fail(ZS_ERR_IO, "checkpoint: cannot open the save lock %s: %s", path, strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB)) {
        e = errno;
        n = pread(fd, owner, sizeof(owner) - 1, 0);
        close(fd);
        owner[n > 0 ? n : 0] = '\0';
        for (char *c = owner; *c; c++)
            if ((unsigned char)*c < 0x20 || *c == 0x7f)
                *c = *c == '\n' && !c[1] ? '\0' : '?';
        if (e != EWOULDBLOCK)
            return zs_fail(ZS_ERR_IO, "checkpoint: cannot lock %s: %s", path, strerror(e));
        return zs_fail(ZS_ERR_IO, "checkpoint: %s is locked by another job saving into it (%s, lock file %s); two "
                       "jobs must not save into one directory", dir, owner[0] ? owner : "it recorded no owner", path);
    }
    gethostname(host, sizeof(host));
    host[sizeof(host) - 1] = '\0';
    n = snprintf(owner, sizeof(owner), "host %s pid %d\n", host, (int)getpid());
    if (ftruncate(fd, 0) || pwrite(fd, owner, (size_t)n, 0) != n) {
        e = errno;
        close(fd);
        return zs_fail(ZS_ERR_IO, "checkpoint: cannot write the save lock %s: %s", path, strerror(e));
    }
    *lock_fd = fd;
    return zs_ckpt_event("lock", dir, NULL) ? zs_fail(ZS_ERR_IO, "checkpoint: lock %s: injected failure", path)
                                            : ZS_OK;
}

// ----------------------------------------------------------------------------------- replacing a tag

/* Where the file system cannot exchange two names (RENAME_EXCHANGE: NFS, kernels before 3.15, ...), an
 * existing tag is replaced by name: `latest` first names the complete temporary directory, the old tag
 * moves aside to <tag>.old, the tag is rebuilt from hard links to the temporary directory's files, and
 * only then does `latest` name it again. A crash at any point leaves `latest` naming a complete
 * directory; the next save finishes the job (zs_ckpt_begin). This is the part after the move aside. */
static zs_status relink_tag(const char *dir, const char *tag, const char *then_latest)
{
    char tmp[PATH_MAX], final[PATH_MAX], from[PATH_MAX], to[PATH_MAX], old[PATH_MAX];
    struct dirent *e;
    zs_status st;
    DIR *d;

    tag_path(tmp, dir, tag, ".tmp");
    tag_path(final, dir, tag, "");
    tag_path(old, dir, tag, ".old");
    remove_tree(final); /* a copy a crash left half made */
    st = make_dir(final, 0700);
    if (st)
        return st;
    d = opendir(tmp);
    if (!d)
        return zs_fail(ZS_ERR_IO, "checkpoint: cannot read %s: %s", tmp, strerror(errno));
    while (!st && (e = readdir(d))) {
        struct stat sb;
        int rc;

        if (e->d_type != DT_REG && (e->d_type != DT_UNKNOWN || /* some file systems leave the type out */
                                    fstatat(dirfd(d), e->d_name, &sb, AT_SYMLINK_NOFOLLOW) || !S_ISREG(sb.st_mode)))
            continue;
        join(from, tmp, e->d_name);
        join(to, final, e->d_name);
        rc = zs_ckpt_event("link", from, to);
        if (!rc && link(from, to))
            rc = -errno;
        if (rc)
            st = zs_fail(ZS_ERR_IO, "checkpoint: cannot link %s to %s: %s", to, from, strerror(-rc));
    }
    closedir(d);
    if (!st)
        st = fsync_dir(final);
    if (!st)
        st = fsync_dir(dir);
    if (!st)
        st = then_latest ? set_latest(dir, then_latest) : set_latest(dir, tag);
    if (st)
        return st;
    remove_tree(old);
    remove_tree(tmp);
    return ZS_OK;
}

static void remove_latest(const char *dir)
{
    char path[PATH_MAX];

    join(path, dir, ZS_CKPT_LATEST);
    if (!zs_ckpt_event("remove", path, NULL))
        unlink(path);
}

/* Undoes replace_by_links after a failure, keeping `latest` on a complete directory throughout: it names
 * the temporary directory while the old tag moves back, then what it named before. */
static void unreplace(const char *dir, const char *tag, const char *prev, bool moved)
{
    char tmpname[NAME_MAX + 1], final[PATH_MAX], old[PATH_MAX];

    snprintf(tmpname, sizeof(tmpname), "%s.tmp", tag);
    tag_path(final, dir, tag, "");
    tag_path(old, dir, tag, ".old");
    if (moved) {
        if (set_latest(dir, tmpname))
            return; /* `latest` stays on the temporary directory, which zs_ckpt_end then keeps */
        remove_tree(final);
        if (move(old, final, false, NULL) || fsync_dir(dir))
            return;
    }
    if (prev[0])
        set_latest(dir, prev);
    else
        remove_latest(dir);
}

static zs_status replace_by_links(const char *dir, const char *tag, bool no_latest)
{
    char tmpname[NAME_MAX + 1], prev[NAME_MAX + 2] = "", err[256], final[PATH_MAX], old[PATH_MAX];
    char first[1024];
    bool moved = false;
    zs_status st;

    snprintf(tmpname, sizeof(tmpname), "%s.tmp", tag);
    tag_path(final, dir, tag, "");
    tag_path(old, dir, tag, ".old");
    if (zs_ckpt_read_latest(dir, prev, sizeof(prev), err, sizeof(err)))
        prev[0] = '\0';
    st = set_latest(dir, tmpname);
    if (!st && !(st = move(final, old, false, NULL))) {
        moved = true;
        st = fsync_dir(dir);
    }
    /* no_latest: `latest` goes back to what it named (a crash before that leaves it on this tag) */
    if (!st)
        st = relink_tag(dir, tag, no_latest && prev[0] ? prev : NULL);
    if (!st && no_latest && !prev[0])
        remove_latest(dir);
    if (st) {
        snprintf(first, sizeof(first), "%s", zs_last_error()); /* the cause, not a roll-back step's */
        unreplace(dir, tag, prev, moved);
        st = zs_fail(st, "%s", first);
    }
    return st;
}

zs_status zs_ckpt_publish(const char *dir, const char *tag, bool no_latest)
{
    char tmp[PATH_MAX], final[PATH_MAX];
    const char *force = getenv(ZS_TEST_HOOK_CKPT_NO_EXCHANGE); /* test hook: the fallback where exchange works */
    struct stat sb;
    zs_status st;
    int rc;

    tag_path(tmp, dir, tag, ".tmp");
    tag_path(final, dir, tag, "");
    st = fsync_dir(tmp);
    if (st)
        return st;
    if (fstatat(AT_FDCWD, final, &sb, AT_SYMLINK_NOFOLLOW) && errno == ENOENT) {
        st = move(tmp, final, false, NULL); /* a new tag: one atomic rename */
    } else if (force && *force) {
        return replace_by_links(dir, tag, no_latest);
    } else {
        /* Saving a tag again: the two directories swap names in one step, so the tag is the old or the new
         * checkpoint at every instant, never missing; the old one is then removed under the temporary name. */
        st = move(tmp, final, true, &rc);
        if (st && (rc == -EINVAL || rc == -ENOSYS || rc == -EOPNOTSUPP))
            return replace_by_links(dir, tag, no_latest);
    }
    if (!st)
        st = fsync_dir(dir); /* the tag's rename is durable before `latest` can name it */
    if (!st && !no_latest)
        st = set_latest(dir, tag);
    if (!st)
        remove_tree(tmp); /* after an exchange: the previous checkpoint of this tag */
    return st;
}

// ----------------------------------------------------------------------------------- begin, end

zs_status zs_ckpt_begin(const char *dir, const char *tag, int *lock_fd)
{
    char name[NAME_MAX + 2], err[256], path[PATH_MAX], tmp[PATH_MAX];
    size_t n;
    zs_status st = ZS_OK;

    *lock_fd = -1;
    if (mkdir(dir, 0755) == 0) { /* made by us: durable in its parent before anything goes in */
        zs_ckpt_event("mkdir", dir, NULL);
        st = fsync_parent(dir);
    } else if (errno != EEXIST) {
        st = zs_fail(ZS_ERR_IO, "checkpoint: cannot create %s: %s", dir, strerror(errno));
    }
    if (!st)
        st = take_lock(dir, lock_fd);
    if (st)
        return st;
    /* A fallback publish that a crash interrupted leaves `latest` on <tag>.tmp: finish it first, since
     * clearing leftovers below would otherwise remove what `latest` names. */
    if (!zs_ckpt_read_latest(dir, name, sizeof(name), err, sizeof(err)) && (n = strlen(name)) > 4 &&
        !strcmp(name + n - 4, ".tmp")) {
        name[n - 4] = '\0';
        st = relink_tag(dir, name, NULL);
        if (st)
            return st;
    }
    tag_path(path, dir, tag, ".old");
    remove_tree(path);
    tag_path(tmp, dir, tag, ".tmp");
    remove_tree(tmp); /* a crashed save's leftover is cleared, never mixed in */
    st = make_dir(tmp, 0700);
    return st ? st : fsync_dir(dir);
}

void zs_ckpt_end(const char *dir, const char *tag, int lock_fd, bool failed)
{
    char tmp[PATH_MAX];

    if (lock_fd < 0)
        return; /* never locked: nothing here is ours to clear */
    tag_path(tmp, dir, tag, ".tmp");
    if (failed && !latest_is(dir, tag, ".tmp"))
        remove_tree(tmp);
    close(lock_fd);
}
