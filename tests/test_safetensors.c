/* test_safetensors.c - the safetensors writer and reader: what the writer streams out reads back exactly
 * (F32, BF16, F16, empty and scalar tensors, metadata), the writer refuses to finish a file it was not given
 * every byte of (or could not write), and the reader refuses malformed headers naming the field. */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"        /* defines: CHECK, zs_test_summary */
#include "kernels/convert.h"      /* defines: zs_cvt_f32_bf16, zs_cvt_f32_f16 */
#include "ckpt/safetensors.h"  /* defines: zs_st_* */

static char err[2048];
static uint64_t file_bytes; /* what the writer said the sample file would hold */
static char dir[] = "/tmp/zs_st_test_XXXXXX";

/* Eight buffers in turn, so a test can hold a few paths at once. */
static const char *tmp_path(const char *name)
{
    static char path[8][PATH_MAX];
    static int next;
    char *p = path[next++ % 8];

    snprintf(p, PATH_MAX, "%s/%s", dir, name);
    return p;
}

static bool exists(const char *path)
{
    struct stat st;

    return stat(path, &st) == 0;
}

// ----------------------------------------------------------------------------------- writer -> reader

static const struct zs_st_tensor specs[] = {
    {.name = "w", .dtype = ZS_ST_F32, .ndim = 2, .shape = {3, 5}},
    {.name = "empty", .dtype = ZS_ST_F32, .ndim = 2, .shape = {0, 4}},
    {.name = "b.bf16", .dtype = ZS_ST_BF16, .ndim = 1, .shape = {7}},
    {.name = "s.f16", .dtype = ZS_ST_F16, .ndim = 0},
    {.name = "ids", .dtype = ZS_ST_I32, .ndim = 1, .shape = {3}},
};

static float fval(int i)
{
    return (float)(i * 37 % 101) / 7.0f - 3.0f;
}

/* Streams the tensors with appends of every size from 1 to 9 bytes, crossing tensor boundaries. */
static int write_sample(const char *path)
{
    static const char *const meta[] = {"format", "pt", "note", "h\xc3\xa9llo", NULL};
    unsigned char data[256];
    size_t n = 0;
    struct zs_st_writer *w;
    int rc;

    for (int i = 0; i < 15; i++, n += 4) {
        float v = fval(i);

        memcpy(data + n, &v, 4);
    }
    for (int i = 0; i < 7; i++, n += 2) {
        uint16_t h = zs_cvt_f32_bf16(fval(i + 20));

        memcpy(data + n, &h, 2);
    }
    uint16_t h = zs_cvt_f32_f16(0.333251953125f); /* representable in fp16 */
    memcpy(data + n, &h, 2);
    n += 2;
    for (int32_t i = 0; i < 3; i++, n += 4)
        memcpy(data + n, &i, 4);
    rc = zs_st_writer_open(&w, path, specs, 5, meta, err, sizeof(err));
    CHECK(rc == 0, "writer open: %s", err);
    if (rc)
        return rc;
    CHECK(exists(tmp_path("a.safetensors.tmp")) && !exists(path), "written under path.tmp until closed");
    for (size_t at = 0, k = 1; at < n; at += k, k = k % 9 + 1) {
        k = k < n - at ? k : n - at;
        if ((rc = zs_st_writer_append(w, data + at, k, err, sizeof(err)))) {
            CHECK(0, "append: %s", err);
            zs_st_writer_abort(w);
            return rc;
        }
    }
    file_bytes = zs_st_writer_file_bytes(w);
    rc = zs_st_writer_close(w, err, sizeof(err));
    CHECK(rc == 0, "writer close: %s", err);
    return rc;
}

static void test_round_trip(void)
{
    const char *path = tmp_path("a.safetensors");
    const struct zs_st_tensor *t;
    struct zs_st *st;
    float v[16];
    const char *key;
    struct stat sb;
    int ok = 1;

    if (write_sample(path))
        return;
    CHECK(!exists(tmp_path("a.safetensors.tmp")), "path.tmp left behind");
    CHECK(stat(path, &sb) == 0 && (uint64_t)sb.st_size == file_bytes, "file size %lld, writer said %llu",
          (long long)sb.st_size, (unsigned long long)file_bytes);
    if (zs_st_open(&st, path, err, sizeof(err))) {
        CHECK(0, "open: %s", err);
        return;
    }
    CHECK(zs_st_count(st) == 5, "count %d", zs_st_count(st));
    for (int i = 0; i < zs_st_count(st); i++)
        ok &= strcmp(zs_st_get(st, i)->name, specs[i].name) == 0;
    CHECK(ok, "tensors not in the order written");
    CHECK(zs_st_get(st, 0)->offset % 8 == 0, "data not 8-byte aligned: %llu",
          (unsigned long long)zs_st_get(st, 0)->offset);
    t = zs_st_find(st, "w");
    CHECK(t && t->ndim == 2 && t->shape[1] == 5 && t->numel == 15 && t->nbytes == 60, "w");
    CHECK(t && zs_st_read_f32(st, t, 0, 15, v, err, sizeof(err)) == 0, "%s", err);
    for (int i = 0; t && i < 15; i++)
        ok &= v[i] == fval(i);
    CHECK(t && zs_st_read_f32(st, t, 14, 1, v, err, sizeof(err)) == 0 && v[0] == fval(14), "last element");
    CHECK(ok, "F32 values differ");
    t = zs_st_find(st, "b.bf16");
    CHECK(t && zs_st_read_f32(st, t, 2, 5, v, err, sizeof(err)) == 0, "%s", err);
    for (int i = 0; t && i < 5; i++)
        ok &= zs_cvt_f32_bf16(v[i]) == zs_cvt_f32_bf16(fval(i + 22)) && zs_cvt_f32_bf16(v[i]) == zs_bits(v[i]) >> 16;
    CHECK(ok, "BF16 values differ");
    t = zs_st_find(st, "s.f16");
    CHECK(t && t->ndim == 0 && t->numel == 1 && zs_st_read_f32(st, t, 0, 1, v, err, sizeof(err)) == 0 &&
          v[0] == 0.333251953125f, "F16 scalar: %s", err);
    t = zs_st_find(st, "empty");
    CHECK(t && t->numel == 0 && t->nbytes == 0 && zs_st_read_f32(st, t, 0, 0, v, err, sizeof(err)) == 0, "empty");
    t = zs_st_find(st, "ids");
    CHECK(t && zs_st_read_f32(st, t, 0, 1, v, err, sizeof(err)) && strstr(err, "I32"), "I32 as fp32: %s", err);
    t = zs_st_find(st, "w");
    CHECK(zs_st_read_f32(st, t, 10, 6, v, err, sizeof(err)) && strstr(err, "\"w\""), "past the end: %s", err);
    CHECK(!zs_st_find(st, "nope") && !zs_st_get(st, 5) && !zs_st_get(st, -1), "absent lookups");
    CHECK(zs_st_meta_count(st) == 2 && strcmp(zs_st_meta_find(st, "note"), "h\xc3\xa9llo") == 0 &&
          zs_st_meta_get(st, 0, &key) && strcmp(key, "format") == 0, "metadata");
    zs_st_close(st);
}

// ----------------------------------------------------------------------------------- writer failures

static void test_writer_errors(void)
{
    const char *path = tmp_path("b.safetensors");
    struct zs_st_tensor two[] = {{.name = "x", .dtype = ZS_ST_F32, .ndim = 1, .shape = {2}},
                                 {.name = "x", .dtype = ZS_ST_F32, .ndim = 1, .shape = {2}}};
    struct zs_st_writer *w;
    float v[4] = {1, 2, 3, 4};
    pid_t pid;
    int status;

    CHECK(zs_st_writer_open(&w, path, two, 2, NULL, err, sizeof(err)) && strstr(err, "tensors[1].name"),
          "repeated name: %s", err);
    two[1].name = "__metadata__";
    CHECK(zs_st_writer_open(&w, path, two, 2, NULL, err, sizeof(err)) && strstr(err, "tensors[1].name"),
          "reserved name: %s", err);
    two[1] = (struct zs_st_tensor){.name = "y", .dtype = ZS_ST_F32, .ndim = 1, .shape = {-1}};
    CHECK(zs_st_writer_open(&w, path, two, 2, NULL, err, sizeof(err)) && strstr(err, "shape"), "negative: %s", err);
    CHECK(!exists(path) && !exists(tmp_path("b.safetensors.tmp")), "refused writer left files");

    CHECK(zs_st_writer_open(&w, path, two, 1, NULL, err, sizeof(err)) == 0, "%s", err);
    CHECK(zs_st_writer_append(w, v, 4, err, sizeof(err)) == 0, "%s", err);
    CHECK(zs_st_writer_close(w, err, sizeof(err)) && strstr(err, "4 of 8") && strstr(err, "b.safetensors"),
          "short file: %s", err);
    CHECK(!exists(path) && !exists(tmp_path("b.safetensors.tmp")), "short file left files");
    CHECK(zs_st_writer_open(&w, path, two, 1, NULL, err, sizeof(err)) == 0, "%s", err);
    CHECK(zs_st_writer_append(w, v, 12, err, sizeof(err)) && strstr(err, "more bytes"), "overrun: %s", err);
    CHECK(zs_st_writer_close(w, err, sizeof(err)) && !exists(path), "close after an overrun: %s", err);
    CHECK(zs_st_writer_open(&w, tmp_path("nodir/c.safetensors"), two, 1, NULL, err, sizeof(err)) &&
          strstr(err, "nodir/c.safetensors.tmp: cannot create"), "missing directory: %s", err);

    /* A write the file system refuses (here the file size limit: EFBIG, as ENOSPC would come) names the
     * file and offset. In a child, so the limit does not outlive the case. */
    two[0].shape[0] = 1 << 20;
    fflush(NULL);
    pid = fork();
    if (pid == 0) {
        struct rlimit rl = {4096, 4096};
        static float big[1 << 16];
        int rc = 0;

        signal(SIGXFSZ, SIG_IGN);
        setrlimit(RLIMIT_FSIZE, &rl);
        if (zs_st_writer_open(&w, path, two, 1, NULL, err, sizeof(err)))
            _exit(2);
        for (int i = 0; i < 16 && !rc; i++)
            rc = zs_st_writer_append(w, big, sizeof(big), err, sizeof(err));
        _exit(rc && strstr(err, "b.safetensors.tmp: write at byte offset") && strstr(err, "too large") &&
              zs_st_writer_close(w, err, sizeof(err)) && !exists(path) && !exists(tmp_path("b.safetensors.tmp"))
                  ? 0 : 1);
    }
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0,
          "a refused write (EFBIG) was not reported, or left files");
}

// ----------------------------------------------------------------------------------- malformed headers

/* A file image: 8-byte length, header padded to `hlen` (0: no padding), `data` bytes of zeros. */
static size_t image(unsigned char *buf, const char *json, uint64_t claim, size_t data)
{
    size_t n = strlen(json);

    for (int i = 0; i < 8; i++)
        buf[i] = (unsigned char)((claim ? claim : n) >> (8 * i));
    memcpy(buf + 8, json, n);
    memset(buf + 8 + n, 0, data);
    return 8 + n + data;
}

static void expect_bad(const char *json, uint64_t claim, size_t data, const char *what)
{
    static unsigned char buf[4096];
    size_t len = image(buf, json, claim, data);
    struct zs_st *st;
    int rc = zs_st_open_mem(&st, buf, len, "m.safetensors", err, sizeof(err));

    CHECK(rc < 0 && !st && strncmp(err, "m.safetensors: ", 15) == 0 && strstr(err, what),
          "%.60s: want '%s', got rc %d: %s", json, what, rc, err);
    if (!rc)
        zs_st_close(st);
}

#define T(name, dt, shape, b, e) "\"" name "\":{\"dtype\":\"" dt "\",\"shape\":" shape ",\"data_offsets\":[" #b "," #e "]}"

static void test_bad_headers(void)
{
    const char *path = tmp_path("short.safetensors"), *hdr = "{" T("a", "BF16", "[1]", 0, 2) "}";
    unsigned char buf[64];
    struct zs_st *st;
    FILE *f;

    expect_bad("{" T("a", "F32", "[2]", 0, 8) "}", 1000, 8, "runs past the end of the file");
    expect_bad("{" T("a", "F32", "[2]", 0, 8) "}", 200000000, 8, "exceeds the 100000000-byte limit");
    expect_bad("{" T("a", "F32", "[1]", 0, 4) "," T("b", "F32", "[1]", 8, 12) "}", 0, 12,
               "\"b\".data_offsets: begins at 8, leaving a gap");
    expect_bad("{" T("a", "F32", "[1]", 0, 4) "," T("b", "F16", "[2]", 2, 6) "}", 0, 6, "\"b\".data_offsets: begins "
               "at 2, overlapping");
    expect_bad("{" T("a", "F32", "[1]", 4, 8) "}", 0, 8, "\"a\".data_offsets: begins at 4, leaving a gap: the start");
    expect_bad("{" T("a", "F32", "[2]", 0, 4) "}", 0, 4, "\"a\".data_offsets: [0, 4] holds 4 bytes, but 2 elements");
    expect_bad("{" T("a", "F12", "[2]", 0, 8) "}", 0, 8, "\"a\".dtype: 'F12' is not a known dtype");
    expect_bad("{" T("a", "F32", "[2]", 0, 8) "}", 0, 12, "data_offsets: tensors end at byte 8");
    expect_bad("{" T("a", "F32", "[4294967296,4294967296,16]", 0, 8) "}", 0, 8, "\"a\".shape: size overflows");
    expect_bad("{" T("a", "F32", "[-2]", 0, 8) "}", 0, 8, "\"a\".shape[0]: not a non-negative integer");
    expect_bad("{" T("a", "F32", "[1,1,1,1,1,1,1,1,1]", 0, 4) "}", 0, 4, "\"a\".shape: not an array of at most 8");
    expect_bad("{" T("a", "F32", "[1]", 8, 4) "}", 0, 4, "\"a\".data_offsets: not [begin, end]");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":1}}", 0, 4, "\"a\".x: unknown");
    expect_bad("{\"a\":[1]}", 0, 0, "\"a\": expected an object");
    expect_bad("{\"__metadata__\":{\"k\":1}}", 0, 0, "__metadata__.k: expected a string");
    expect_bad("{\"\xff\":1}", 0, 0, "header: invalid JSON");
    expect_bad("{\"a\":", 0, 0, "header: invalid JSON");
    expect_bad("[]", 0, 0, "header: not a JSON object");
    expect_bad("{" T("a", "F32", "[1]", 0, 4) "," T("a", "F32", "[1]", 4, 8) "}", 0, 8, "header: invalid JSON");
    expect_bad("{" T("a\\n\\\"b", "F32", "[2]", 0, 4) "}", 0, 4, "\"a??b\".data_offsets"); /* one line */
    memset(buf, 0, sizeof(buf));
    CHECK(zs_st_open_mem(&st, buf, 5, "m", err, sizeof(err)) && strstr(err, "too short"), "5 bytes: %s", err);

    /* the same refusals through a file: a header length beyond the end */
    f = fopen(path, "wb");
    fwrite(buf, 1, image(buf, "{}", 4000, 0), f);
    fclose(f);
    CHECK(zs_st_open(&st, path, err, sizeof(err)) && strstr(err, "short.safetensors: header length 4000 runs past"),
          "file: %s", err);
    CHECK(zs_st_open(&st, tmp_path("missing"), err, sizeof(err)) == -ENOENT && strstr(err, "missing: cannot open"),
          "missing file: %s", err);
    /* a header-only parse is valid but has no data to read */
    CHECK(zs_st_parse_header(&st, hdr, strlen(hdr), 2, "hdr", err, sizeof(err)) == 0, "%s", err);
    if (st) {
        float v;

        CHECK(zs_st_read_f32(st, zs_st_get(st, 0), 0, 1, &v, err, sizeof(err)) && strstr(err, "no file"), "%s", err);
        zs_st_close(st);
    }
}

int main(void)
{
    char cmd[PATH_MAX + 16];

    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_round_trip();
    test_writer_errors();
    test_bad_headers();
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    if (system(cmd))
        fprintf(stderr, "could not remove %s\n", dir);
    return zs_test_summary("safetensors");
}
