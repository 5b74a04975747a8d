/* data.c - the corpus as bytes (vocabulary 256) and the batches drawn from it.
 *
 * The exact rule, for anyone reproducing a run (a PyTorch twin, say):
 *   corpus   the bytes of every regular file under --data (a file alone, or a directory walked recursively,
 *            following links, files sorted by path with strcmp), concatenated with nothing between them.
 *            Default: the files of /usr/share/games/fortunes whose names do not end in .dat or .u8.
 *   split    train_len = len - len / 10: bytes [0, train_len) train, [train_len, len) validate.
 *   mix(x)   splitmix64: x += 0x9e3779b97f4a7c15; x = (x ^ x >> 30) * 0xbf58476d1ce4e5b9;
 *            x = (x ^ x >> 27) * 0x94d049bb133111eb; return x ^ x >> 31   (uint64 arithmetic)
 *   train    global sequence g (0 <= g < train_batch_size) of optimizer step s (0-based) starts at
 *            o = mix(mix(mix(seed) + s) + g) mod (train_len - T - 1); inputs are bytes [o, o + T), targets
 *            [o + 1, o + T + 1). Micro-step m of rank r (of W ranks, micro-batch B) takes the B sequences
 *            g = (m * W + r) * B + k, k = 0 .. B-1, so a step sees the same sequences at any world size.
 *   validate sequence j starts at train_len + (mix(mix(~seed) + j) mod (len - train_len - T - 1)).
 */
#include <errno.h>
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "data.h"
#include "../splitmix.h" /* defines: ex_splitmix64 (mix in the comment above) */

/* nftw has no user argument: the walk's list lives here for its duration */
static struct {
    char **paths;
    size_t n, cap;
    int skip_indexes;
} walk;

static int ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

static int collect(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
    (void)ftw;
    if (type != FTW_F || !S_ISREG(st->st_mode))
        return 0;
    if (walk.skip_indexes && (ends_with(path, ".dat") || ends_with(path, ".u8")))
        return 0;
    if (walk.n == walk.cap) {
        size_t cap = walk.cap ? 2 * walk.cap : 64;
        char **p = realloc(walk.paths, cap * sizeof(*p));
        if (!p)
            return -1;
        walk.paths = p;
        walk.cap = cap;
    }
    if (!(walk.paths[walk.n] = strdup(path)))
        return -1;
    walk.n++;
    return 0;
}

static int by_path(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int append_file(struct gpt_data *d, const char *path, char *err, int errlen)
{
    FILE *f = fopen(path, "rb");
    long n;
    uint8_t *p;

    if (!f || fseek(f, 0, SEEK_END) || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET)) {
        snprintf(err, (size_t)errlen, "%s: %s", path, strerror(errno));
        if (f)
            fclose(f);
        return -1;
    }
    p = realloc(d->bytes, (size_t)(d->len + n) + 1);
    if (!p || fread(p + d->len, 1, (size_t)n, f) != (size_t)n) {
        snprintf(err, (size_t)errlen, "%s: %s", path, p ? "short read" : "out of memory");
        if (p)
            d->bytes = p;
        fclose(f);
        return -1;
    }
    fclose(f);
    d->bytes = p;
    d->len += n;
    d->files++;
    return 0;
}

int gpt_data_load(struct gpt_data *d, const char *path, int64_t ctx, char *err, int errlen)
{
    int rc = 0;

    *d = (struct gpt_data){0};
    walk.paths = NULL;
    walk.n = walk.cap = 0;
    walk.skip_indexes = path == NULL;
    if (!path)
        path = GPT_DEFAULT_CORPUS;
    if (nftw(path, collect, 16, 0)) {
        snprintf(err, (size_t)errlen, "--data %s: %s", path, errno ? strerror(errno) : "cannot be walked");
        rc = -1;
    }
    qsort(walk.paths, walk.n, sizeof(char *), by_path);
    for (size_t i = 0; i < walk.n && !rc; i++)
        rc = append_file(d, walk.paths[i], err, errlen);
    for (size_t i = 0; i < walk.n; i++)
        free(walk.paths[i]);
    free(walk.paths);
    walk.paths = NULL;
    if (rc)
        goto out_free;
    d->train_len = d->len - d->len / 10;
    if (d->len - d->train_len < ctx + 2) {
        snprintf(err, (size_t)errlen, "--data %s: %lld bytes in %d files; the validation tenth needs more than --ctx "
                 "%lld + 1", path, (long long)d->len, d->files, (long long)ctx);
        rc = -1;
        goto out_free;
    }
    return 0;
out_free:
    gpt_data_free(d);
    return rc;
}

void gpt_data_free(struct gpt_data *d)
{
    free(d->bytes);
    *d = (struct gpt_data){0};
}

double gpt_data_entropy(const struct gpt_data *d)
{
    int64_t count[256] = {0};
    double h = 0;

    for (int64_t i = 0; i < d->len; i++)
        count[d->bytes[i]]++;
    for (int c = 0; c < 256; c++)
        if (count[c]) {
            double p = (double)count[c] / (double)d->len;
            h -= p * log(p);
        }
    return h;
}

void gpt_data_batch(const struct gpt_data *d, uint64_t seed, int64_t step, int64_t first, int64_t count, int64_t ctx,
                    int32_t *in, int32_t *targets)
{
    for (int64_t i = 0; i < count; i++) {
        uint64_t g = (uint64_t)(first + i), o;
        if (step >= 0)
            o = ex_splitmix64(ex_splitmix64(ex_splitmix64(seed) + (uint64_t)step) + g) %
                (uint64_t)(d->train_len - ctx - 1);
        else
            o = (uint64_t)d->train_len +
                ex_splitmix64(ex_splitmix64(~seed) + g) % (uint64_t)(d->len - d->train_len - ctx - 1);
        for (int64_t t = 0; t < ctx; t++) {
            in[i * ctx + t] = d->bytes[o + (uint64_t)t];
            targets[i * ctx + t] = d->bytes[o + (uint64_t)t + 1];
        }
    }
}
