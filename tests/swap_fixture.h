/* swap_fixture.h - what the swapper's tests share (test_swap.c, test_swap_dir.c, test_crc32c.c): scratch
 * directories on disk and on tmpfs, removed at the end, and small file and message helpers. */
#ifndef ZS_TEST_SWAP_FIXTURE_H
#define ZS_TEST_SWAP_FIXTURE_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>

#define KiB 1024u
#define MiB (1024u * 1024u)

/* disk_root: a fresh directory under the working directory (on disk, so O_DIRECT is exercised);
 * shm_root: one under /dev/shm where that is tmpfs, else "". */
extern char disk_root[PATH_MAX], shm_root[PATH_MAX];
extern int file_seq; /* numbers the directories and files the tests make, so none is reused */

int fixture_setup(void);
void fixture_cleanup(void);

/* A failing case's reason, formatted into one static buffer (the next call overwrites it). */
const char *why(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void fill_random(void *p, size_t n);
void *alloc_aligned(size_t n); /* 4096-byte aligned, for O_DIRECT */
void rm_tree(const char *path);
bool exists(const char *path);
int write_file(const char *path, const char *text);
void read_text(const char *path, char *buf, size_t len);
/* The open flags (from fdinfo) of this process's descriptor for path, -1 when it has none. */
long fd_flags_of(const char *path);
/* A fresh empty directory below root for one case: NULL, or why not. */
const char *subdir(const char *root, char *out, size_t outlen);

#endif /* ZS_TEST_SWAP_FIXTURE_H */
