/* test_swap_dir.c - the swapper's run directory (offload/swap_dir.c): created private with an owner
 * record, a dead owner's leftover reclaimed, and refused without deleting anything when the owner may be
 * alive (a live pid, another host or boot, an unreadable record), or the path is a symlink, not private,
 * missing or unwritable. "chmod" alone runs the permission-bit case (77 as root). */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"        /* defines: zs_test_report and the pass/fail counters */
#include "offload/swap.h" /* defines: zs_swap_dir_create, zs_swap_dir_remove */
#include "swap_fixture.h" /* defines: disk_root, subdir, why and the file helpers */

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

/* The owner record of pid as the swapper writes it (host, boot id, pid namespace, pid, start time), built
 * here independently of swap_dir.c; host NULL: this host. */
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

/* A live pid that started at another time than the recorded one is a reused pid; the
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

/* An owner on another host (a shared file system) or from another boot cannot be
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

/* A record that does not parse (a bare pid of the old format, junk, a truncated one)
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

/* Removal takes only a directory this process holds, whatever path it is given. */
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

/* "chmod" alone, for a ctest of its own: 77 (a skip) as root, which bypasses permission bits. */
static int run_chmod_case(void)
{
    const char *w = NULL;
    int rc;

    if (geteuid() == 0) {
        printf("skip: running as root, which bypasses permission bits: the chmod 0500 case cannot run\n");
        rc = 77;
    } else {
        w = test_dir_unwritable();
        rc = w ? 1 : 0;
    }
    printf("%s - chmod%s%s\n", rc == 0 ? "ok" : rc == 77 ? "skip" : "FAIL", w ? ": " : "", w ? w : "");
    return rc;
}

int main(int argc, char **argv)
{
    int rc;

    if (argc > 1 && strcmp(argv[1], "chmod")) {
        printf("usage: test_swap_dir [chmod]\n");
        return 2;
    }
    if (fixture_setup())
        return 1;
    if (argc > 1) {
        rc = run_chmod_case();
        fixture_cleanup();
        return rc;
    }
    zs_test_report("run directory created 0700 with owner pid, removed", test_dir_create_remove());
    zs_test_report("stale run directory of a dead pid cleared", test_dir_stale());
    zs_test_report("run directory of a live pid refused with -EBUSY", test_dir_live_owner());
    zs_test_report("a reused pid (other start time) is taken over", test_dir_reused_pid());
    zs_test_report("an owner on another host or boot is refused", test_dir_other_host());
    zs_test_report("an unparseable owner record is a clear error", test_dir_garbage_owner());
    zs_test_report("dir_remove refuses a directory it does not hold", test_dir_remove_not_ours());
    zs_test_report("symlink at the run directory refused, not followed", test_dir_symlink());
    zs_test_report("group-writable run directory or a file in its place refused", test_dir_not_private());
    zs_test_report("missing or non-directory nvme_path named in the error", test_dir_missing());
    zs_test_report("unwritable nvme_path refused", test_dir_unwritable());
    fixture_cleanup();
    printf("%d passed, %d failed\n", zs_test_pass, zs_test_fail);
    return zs_test_fail ? 1 : 0;
}
