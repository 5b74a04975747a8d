/* swap_fixture.c - the scratch directories and helpers of the swapper's tests (see swap_fixture.h). */
#include <errno.h>
#include <ftw.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "swap_fixture.h"

#define TMPFS_MAGIC_NUMBER 0x01021994

char disk_root[PATH_MAX], shm_root[PATH_MAX];
int file_seq;

static char why_buf[2048];
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

const char *why(const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(why_buf, sizeof(why_buf), fmt, ap);
    va_end(ap);
    return why_buf;
}

void fill_random(void *p, size_t n)
{
    unsigned char *b = p;

    for (size_t i = 0; i < n; i++) {
        rng_state ^= rng_state << 13;
        rng_state ^= rng_state >> 7;
        rng_state ^= rng_state << 17;
        b[i] = (unsigned char)(rng_state >> 32);
    }
}

void *alloc_aligned(size_t n)
{
    void *p = NULL;

    return posix_memalign(&p, 4096, n) ? NULL : p;
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

void rm_tree(const char *path)
{
    nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

bool exists(const char *path)
{
    struct stat st;

    return lstat(path, &st) == 0;
}

int write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");

    if (!f)
        return -errno;
    fputs(text, f);
    return fclose(f) ? -errno : 0;
}

void read_text(const char *path, char *buf, size_t len)
{
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, len - 1, f) : 0;

    buf[n] = '\0';
    if (f)
        fclose(f);
}

const char *subdir(const char *root, char *out, size_t outlen)
{
    if ((size_t)snprintf(out, outlen, "%s/d%d", root, ++file_seq) >= outlen)
        return "path too long";
    return mkdir(out, 0700) ? strerror(errno) : NULL;
}

/* Found in /proc/self/fd, so a test holds the swapper to the flags its descriptor really has, not only
 * to its word. */
long fd_flags_of(const char *path)
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

static bool is_tmpfs(const char *path)
{
    struct statfs f;

    return statfs(path, &f) == 0 && f.f_type == TMPFS_MAGIC_NUMBER;
}

int fixture_setup(void)
{
    char cwd[PATH_MAX];

    if (!getcwd(cwd, sizeof(cwd)) || (size_t)snprintf(disk_root, sizeof(disk_root), "%s/zs-swap-XXXXXX", cwd) >=
                                         sizeof(disk_root) || !mkdtemp(disk_root)) {
        printf("cannot create a test directory under the working directory: %s\n", strerror(errno));
        return -1;
    }
    snprintf(shm_root, sizeof(shm_root), "/dev/shm/zs-swap-XXXXXX");
    if (!is_tmpfs("/dev/shm") || !mkdtemp(shm_root))
        shm_root[0] = '\0';
    return 0;
}

void fixture_cleanup(void)
{
    rm_tree(disk_root);
    if (shm_root[0])
        rm_tree(shm_root);
}
