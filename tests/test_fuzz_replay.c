/* test_fuzz_replay.c - the fuzz targets replayed deterministically over the seed corpora, without libFuzzer:
 * every seed is accepted, and every truncation and a set of single-byte changes of it run through the
 * parsers without a crash or a broken invariant (under the sanitizers in the ASan build).
 * Usage: test_fuzz_replay manifest DIR safetensors DIR config DIR */
#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"        /* defines: CHECK, zs_test_summary */
#include "fuzz/fuzz.h"    /* defines: zs_fuzz_manifest, zs_fuzz_safetensors, zs_fuzz_config */

typedef int (*fuzz_fn)(const uint8_t *, size_t);

static uint8_t *read_all(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    uint8_t *buf = NULL;
    long len;

    if (f && fseek(f, 0, SEEK_END) == 0 && (len = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
        (buf = malloc((size_t)len + 1)) && fread(buf, 1, (size_t)len, f) == (size_t)len)
        *n = (size_t)len;
    else
        free(buf), buf = NULL;
    if (f)
        fclose(f);
    return buf;
}

/* Byte values that steer a JSON or length parser somewhere new. */
static const uint8_t swaps[] = {0x00, 0xff, '"', '0', '9', '-', '[', ']', '{', '}', ',', ':', 'e', '\\', 0x80};

static void replay(const char *path, fuzz_fn fn)
{
    size_t n = 0;
    uint8_t *seed = read_all(path, &n), *m;
    long runs = 0;

    CHECK(seed != NULL, "cannot read %s", path);
    if (!seed)
        return;
    CHECK(fn(seed, n) == 1, "seed %s is refused", path);
    for (size_t len = 0; len < n; len++, runs++) { /* a fresh buffer of exactly len bytes: ASan sees overreads */
        m = malloc(len ? len : 1);
        memcpy(m, seed, len);
        fn(m, len);
        free(m);
    }
    /* per byte: two bit flips and three replacements, the table walked so each position sees others */
    m = malloc(n);
    for (size_t i = 0; i < n; i++)
        for (size_t k = 0; k < 5; k++, runs++) {
            uint8_t b = k == 0 ? seed[i] ^ 0x01 : k == 1 ? seed[i] ^ 0x80 : swaps[(i * 3 + k) % sizeof(swaps)];

            memcpy(m, seed, n);
            m[i] = b == seed[i] ? (uint8_t)(b ^ 0x02) : b;
            fn(m, n);
        }
    free(m);
    free(seed);
    printf("ok - %s: %ld mutations\n", path, runs);
}

static int replay_dir(const char *dir, fuzz_fn fn)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    char path[PATH_MAX];
    int files = 0;

    CHECK(d != NULL, "cannot open %s", dir);
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        replay(path, fn);
        files++;
    }
    if (d)
        closedir(d);
    CHECK(files > 0, "no seeds in %s", dir);
    return files;
}

int main(int argc, char **argv)
{
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "manifest") == 0)
            replay_dir(argv[i + 1], zs_fuzz_manifest);
        else if (strcmp(argv[i], "safetensors") == 0)
            replay_dir(argv[i + 1], zs_fuzz_safetensors);
        else if (strcmp(argv[i], "config") == 0)
            replay_dir(argv[i + 1], zs_fuzz_config);
        else
            CHECK(0, "unknown target %s", argv[i]);
    }
    CHECK(argc >= 3, "usage: test_fuzz_replay manifest DIR safetensors DIR");
    return zs_test_summary("fuzz_replay");
}
