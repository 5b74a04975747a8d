/* test_ckpt_format.c - the checkpoint manifest and data files: a manifest built in code survives dump and
 * parse, element ranges read back across segment and file boundaries, and every malformed manifest, short
 * or corrupted data file and unsafe name is refused with a message naming the file and the field.
 * `test_ckpt_format --write-sample DIR` writes a sample checkpoint (and DIR/params.f32, the raw fp32
 * weights in manifest order) for the command-line tests. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>       /* defines: json_loads, for mutating manifests */

#include "check.h"         /* defines: CHECK, zs_test_summary */
#include "ckpt/ckpt_format.h"   /* defines: zs_ckpt_* */
#include "offload/swap.h"          /* defines: zs_crc32c */

static char err[2048];

// ----------------------------------------------------------------------------------- a checkpoint in code

struct pspec {
    int unit;
    const char *name;
    int ndim;
    int64_t shape[3];
};

/* Two units with an alignment gap, a scalar, and shards of unequal size. */
static const struct pspec small_params[] = {
    {0, "layer0.w", 2, {2, 3}}, {0, "layer0.b", 1, {3}}, {1, "layer1.w", 1, {5}}, {1, "layer1.scale", 0, {0}},
};
static const struct pspec sample_params[] = {
    {0, "embed.weight", 2, {37, 16}}, {1, "layers.0.w", 2, {16, 24}}, {1, "layers.0.b", 1, {24}},
    {2, "layers.1.w", 3, {4, 6, 5}}, {2, "layers.1.b", 1, {7}}, {2, "norm.g", 0, {0}}, {3, "head.weight", 2, {16, 9}},
};

/* snprintf of a path that must fit: the tests build paths in a short temporary directory. */
#define PATHF(buf, ...) ((size_t)snprintf(buf, sizeof(buf), __VA_ARGS__) < sizeof(buf) ? (void)0 : abort())

static char *dup_printf(const char *fmt, int v)
{
    char b[64];

    snprintf(b, sizeof(b), fmt, v);
    return strdup(b);
}

static float value(int unit, int kind, int64_t e)
{
    return (float)((unit * 7919 + kind * 104729 + e * 31) % 100003) / 1237.0f - 40.0f;
}

/* Parameters laid out with a 2-element gap after each; each unit split into `world` contiguous shards. */
static void build(struct zs_ckpt_manifest *m, const struct pspec *ps, int np, int nunits, int world, int nkinds)
{
    memset(m, 0, sizeof(*m));
    m->version = ZS_CKPT_VERSION;
    m->global_step = (1ll << 40) + 3; /* above 2^53 would not survive a double: this checks integer exactness */
    m->micro_step = (1ll << 41) + 7;
    m->world_size = world;
    m->stage = 3;
    m->param_dtype = strdup("bf16");
    m->optimizer = strdup("adamw");
    m->scaler = (struct zs_ckpt_scaler){65536.0, 2, 2, -1, 99};
    m->config_json = strdup("{\"train_batch_size\":8,\"zero_optimization\":{\"stage\":3}}");
    m->units = calloc((size_t)nunits, sizeof(*m->units));
    m->params = calloc((size_t)np, sizeof(*m->params));
    m->nunits = nunits;
    m->nparams = np;
    for (int i = 0; i < np; i++) {
        struct zs_ckpt_param *q = &m->params[i];
        struct zs_ckpt_unit *u = &m->units[ps[i].unit];

        q->name = strdup(ps[i].name);
        q->unit = ps[i].unit;
        q->ndim = ps[i].ndim;
        q->numel = 1;
        for (int d = 0; d < q->ndim; d++)
            q->numel *= q->shape[d] = ps[i].shape[d];
        if (!u->nparams++) {
            u->first_param = i;
            u->name = dup_printf("unit%d", ps[i].unit);
        }
        q->offset = u->numel + (u->nparams > 1 ? 2 : 0);
        u->numel = q->offset + q->numel;
    }
    m->files = calloc((size_t)world, sizeof(*m->files));
    m->nfiles = world;
    for (int r = 0; r < world; r++) {
        m->files[r].name = dup_printf("rank%05d.bin", r);
        m->files[r].rank = r;
    }
    m->segs = calloc((size_t)(nunits * nkinds * world), sizeof(*m->segs));
    for (int r = 0; r < world; r++)
        for (int u = 0; u < nunits; u++)
            for (int k = 0; k < nkinds; k++) {
                int64_t b = m->units[u].numel * r / world, e = m->units[u].numel * (r + 1) / world;

                if (e > b) {
                    m->segs[m->nsegs++] = (struct zs_ckpt_seg){u, k, r, b, e - b, m->files[r].bytes};
                    m->files[r].bytes += (uint64_t)(e - b) * 4;
                }
                m->has_kind[k] = true;
            }
}

static int write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    int rc = f && fputs(text, f) >= 0 ? 0 : -1;

    if (f && fclose(f))
        rc = -1;
    return rc;
}

/* Data files (crc32c filled in), manifest.json, and DIR/latest naming the tag. */
static int write_ckpt(struct zs_ckpt_manifest *m, const char *dir, const char *tag)
{
    char path[PATH_MAX], tdir[PATH_MAX];
    char *text;
    int rc;

    PATHF(tdir, "%s/%s", dir, tag);
    mkdir(dir, 0755);
    mkdir(tdir, 0755);
    for (int32_t f = 0; f < m->nfiles; f++) {
        FILE *fp;

        PATHF(path, "%s/%s", tdir, m->files[f].name);
        fp = fopen(path, "wb");
        if (!fp)
            return -1;
        m->files[f].crc32c = 0;
        for (int64_t i = 0; i < m->nsegs; i++) {
            const struct zs_ckpt_seg *s = &m->segs[i];

            for (int64_t e = 0; s->file == f && e < s->count; e++) {
                float v = value(s->unit, s->kind, s->begin + e);

                fwrite(&v, 4, 1, fp);
                m->files[f].crc32c = zs_crc32c(m->files[f].crc32c, &v, 4);
            }
        }
        if (fclose(fp))
            return -1;
    }
    text = zs_ckpt_manifest_dump(m);
    PATHF(path, "%s/%s", tdir, ZS_CKPT_MANIFEST);
    rc = text ? write_text(path, text) : -1;
    free(text);
    PATHF(path, "%s/%s", dir, ZS_CKPT_LATEST);
    PATHF(tdir, "%s\n", tag);
    return rc ? rc : write_text(path, tdir);
}

/* The sample for the command-line tests: a checkpoint of 3 ranks and the raw fp32 weights beside it. */
static int write_sample(const char *dir)
{
    struct zs_ckpt_manifest m;
    char path[PATH_MAX];
    FILE *f;
    int n = (int)(sizeof(sample_params) / sizeof(sample_params[0]));

    build(&m, sample_params, n, 4, 3, 3);
    m.global_step = 7;
    if (write_ckpt(&m, dir, "global_step7"))
        return 1;
    PATHF(path, "%s/params.f32", dir);
    f = fopen(path, "wb");
    for (int i = 0; f && i < m.nparams; i++)
        for (int64_t e = 0; e < m.params[i].numel; e++) {
            float v = value(m.params[i].unit, ZS_CKPT_PARAM, m.params[i].offset + e);

            fwrite(&v, 4, 1, f);
        }
    zs_ckpt_manifest_free(&m);
    return f && fclose(f) == 0 ? 0 : 1;
}

// ----------------------------------------------------------------------------------- round trip, reads

static void test_round_trip(struct zs_ckpt_manifest *m)
{
    struct zs_ckpt_manifest p;
    char *text = zs_ckpt_manifest_dump(m), *again;

    CHECK(text != NULL, "dump failed");
    if (!text)
        return;
    CHECK(zs_ckpt_manifest_parse(&p, text, strlen(text), "mem", err, sizeof(err)) == 0, "%s", err);
    CHECK(p.global_step == m->global_step && p.micro_step == m->micro_step, "64-bit steps changed");
    CHECK(p.scaler.scale == 65536.0 && p.scaler.last_overflow == -1 && p.scaler.iter == 99, "scaler changed");
    CHECK(p.nunits == m->nunits && p.nparams == m->nparams && p.nfiles == m->nfiles && p.nsegs == m->nsegs,
          "counts changed");
    CHECK(p.params[3].ndim == 0 && p.params[3].numel == 1 && strcmp(p.params[3].name, "layer1.scale") == 0,
          "scalar parameter changed");
    CHECK(p.files[1].crc32c == m->files[1].crc32c && p.files[1].bytes == m->files[1].bytes, "file entry changed");
    CHECK(p.config_json && strstr(p.config_json, "\"zero_optimization\""), "config lost");
    CHECK(p.has_kind[ZS_CKPT_EXP_AVG_SQ], "kinds lost");
    again = zs_ckpt_manifest_dump(&p);
    CHECK(again && strcmp(again, text) == 0, "dump of the parse differs from the first dump");
    CHECK(strstr(text, "\"crc32c\": \"") != NULL, "crc32c not a string");
    CHECK(strstr(text, "\"global_step\": 1099511627779") != NULL, "global_step not exact");
    free(again);
    free(text);
    zs_ckpt_manifest_free(&p);
}

/* Resolves DIR through `latest` and loads the manifest it names. */
static int load(const char *dir, char *tag, size_t taglen, struct zs_ckpt_manifest *m)
{
    int rc = zs_ckpt_resolve(dir, tag, taglen, err, sizeof(err)) || zs_ckpt_manifest_load(m, tag, err, sizeof(err));

    CHECK(rc == 0 && strstr(tag, "/global_step1"), "load %s: %s", dir, err);
    return rc;
}

static void test_reads(const char *tag, const struct zs_ckpt_manifest *m)
{
    struct zs_ckpt_reader *r;
    char path[PATH_MAX];
    float buf[64];
    int ok = 1;

    CHECK(zs_ckpt_verify(m, tag, err, sizeof(err)) == 0, "%s", err);
    CHECK(zs_ckpt_reader_open(&r, m, tag, err, sizeof(err)) == 0, "%s", err);
    /* every start and length within each unit: crosses the rank boundaries in every way */
    for (int32_t u = 0; u < m->nunits; u++)
        for (int k = 0; k < ZS_CKPT_NKINDS; k++)
            for (int64_t b = 0; b <= m->units[u].numel; b++)
                for (int64_t n = 0; b + n <= m->units[u].numel; n++) {
                    if (zs_ckpt_read_range(r, u, k, b, n, buf, err, sizeof(err))) {
                        CHECK(0, "read u%d k%d [%lld,+%lld): %s", u, k, (long long)b, (long long)n, err);
                        ok = 0;
                        continue;
                    }
                    for (int64_t i = 0; i < n; i++)
                        ok &= buf[i] == value(u, k, b + i);
                }
    CHECK(ok, "values read back differ");
    CHECK(zs_ckpt_read_range(r, 0, 0, 5, m->units[0].numel, buf, err, sizeof(err)) && strstr(err, "outside"),
          "read past the unit: %s", err);
    CHECK(zs_ckpt_read_range(r, 9, 0, 0, 1, buf, err, sizeof(err)) && strstr(err, "units[9]"), "bad unit: %s", err);
    zs_ckpt_reader_close(r);
    CHECK(zs_ckpt_resolve(tag, path, sizeof(path), err, sizeof(err)) == 0 && strcmp(path, tag) == 0,
          "tag dir itself: %s", err);
}

/* A truncated file: the reader and verify both name it and the offset; a flipped byte: verify names crc32c. */
static void test_damaged_files(const char *tag, const struct zs_ckpt_manifest *m)
{
    struct zs_ckpt_reader *r;
    char path[PATH_MAX];
    float buf[64];
    FILE *f;
    int c;

    PATHF(path, "%s/rank00001.bin", tag);
    CHECK(truncate(path, (off_t)m->files[1].bytes - 8) == 0, "truncate: %s", strerror(errno));
    CHECK(zs_ckpt_verify(m, tag, err, sizeof(err)) && strstr(err, "rank00001.bin") && strstr(err, "byte offset"),
          "verify of a truncated file: %s", err);
    CHECK(zs_ckpt_reader_open(&r, m, tag, err, sizeof(err)) == 0, "%s", err);
    CHECK(zs_ckpt_read_range(r, 1, ZS_CKPT_EXP_AVG_SQ, 0, m->units[1].numel, buf, err, sizeof(err)) &&
          strstr(err, "rank00001.bin") && strstr(err, "byte offset"), "read of a truncated file: %s", err);
    CHECK(zs_ckpt_read_range(r, 0, ZS_CKPT_PARAM, 0, 2, buf, err, sizeof(err)) == 0, "rank 0 still reads: %s", err);
    zs_ckpt_reader_close(r);
    CHECK(truncate(path, (off_t)m->files[1].bytes) == 0, "extend: %s", strerror(errno)); /* zeros: crc differs */
    CHECK(zs_ckpt_verify(m, tag, err, sizeof(err)) && strstr(err, "rank00001.bin: crc32c"), "zeros: %s", err);
    PATHF(path, "%s/rank00000.bin", tag);
    f = fopen(path, "r+b");
    CHECK(f && fseek(f, 13, SEEK_SET) == 0 && (c = fgetc(f)) != EOF && fseek(f, 13, SEEK_SET) == 0 &&
          fputc(c ^ 0x10, f) != EOF && fclose(f) == 0, "flip a byte");
    CHECK(zs_ckpt_verify_file(m, tag, 0, err, sizeof(err)) && strstr(err, "rank00000.bin: crc32c 0x") &&
          strstr(err, "!= manifest 0x"), "flipped byte: %s", err);
    unlink(path);
    CHECK(zs_ckpt_verify(m, tag, err, sizeof(err)) && strstr(err, "rank00000.bin: cannot open"), "gone: %s", err);
}

// ----------------------------------------------------------------------------------- malformed manifests

/* The JSON value at a path like "segments[3].offset" (NULL when absent); parent and key (or index, when key
 * is empty) say where it sits. */
static json_t *walk(json_t *root, const char *path, json_t **parent, char *key, size_t *index)
{
    json_t *v = root;
    const char *p = path;

    while (*p && v) {
        size_t n = strcspn(p, ".[");

        *parent = v;
        if (n) {
            snprintf(key, 64, "%.*s", (int)n, p);
            v = json_object_get(v, key);
            p += n;
        } else if (*p == '[') {
            *index = strtoul(p + 1, (char **)&p, 10);
            key[0] = '\0';
            v = json_array_get(v, *index);
            p++;
        } else {
            p++;
        }
    }
    return v;
}

/* Sets (or with v NULL deletes) the value at path in the good manifest, parses, and expects an error that
 * contains `what` and `field`. */
static void expect_bad(const char *good, const char *path, json_t *v, const char *field, const char *what)
{
    json_t *root = json_loads(good, 0, NULL), *parent = NULL;
    struct zs_ckpt_manifest m;
    char key[64] = "";
    size_t index = 0;
    char *text;
    int rc;

    walk(root, path, &parent, key, &index);
    if (key[0])
        v ? json_object_set_new(parent, key, v) : json_object_del(parent, key);
    else
        json_array_set_new(parent, index, v);
    text = json_dumps(root, JSON_INDENT(1));
    rc = zs_ckpt_manifest_parse(&m, text, strlen(text), "ck/manifest.json", err, sizeof(err));
    CHECK(rc == -1 && strncmp(err, "ck/manifest.json: ", 18) == 0 && strstr(err, field) && strstr(err, what),
          "%s: want '%s' and '%s', got rc %d: %s", path, field, what, rc, err);
    if (!rc)
        zs_ckpt_manifest_free(&m);
    free(text);
    json_decref(root);
}

static void expect_bad_text(const char *text, size_t len, const char *what)
{
    struct zs_ckpt_manifest m;
    int rc = zs_ckpt_manifest_parse(&m, text, len, "ck/manifest.json", err, sizeof(err));

    CHECK(rc == -1 && strstr(err, what), "'%.20s': want '%s', got rc %d: %s", text, what, rc, err);
    if (!rc)
        zs_ckpt_manifest_free(&m);
}

static void test_bad_manifests(const char *good)
{
    char *cut = strdup(good);

    expect_bad(good, "segments[1].offset", json_integer(1 << 20), "segments[1].offset", "beyond file rank00000.bin");
    expect_bad(good, "segments[6].begin", json_integer(3), "segments[6].begin", "overlaps segments[0]");
    expect_bad(good, "segments[1].count", json_integer(3), "segments", "units[0] exp_avg elements [3, 5) are in no");
    expect_bad(good, "segments[0].kind", json_string("momentum"), "segments[0].kind", "unknown kind");
    expect_bad(good, "segments[0].unit", json_integer(2), "segments[0].unit", "out of range");
    expect_bad(good, "segments[0].file", json_string("0"), "segments[0].file", "expected an integer");
    expect_bad(good, "units[0].params[0].shape", json_pack("[i,i]", 4, 2), "units[0].params[0].shape", "product");
    expect_bad(good, "units[0].params[0].shape", json_pack("[i,i,i,i,i,i,i,i,i]", 1, 1, 1, 1, 1, 1, 1, 1, 6),
               "units[0].params[0].shape", "at most 8");
    expect_bad(good, "units[1].params[0].name", json_string("layer0.w"), "units[1].params[0].name", "duplicates");
    expect_bad(good, "units[0].params[1].offset", json_integer(5), "units[0].params[1].offset", "overlaps");
    expect_bad(good, "units[0].params[1].numel", json_integer(99), "units[0].params[1].numel", "out of range");
    expect_bad(good, "units[0].params[1].name", json_string("a\tb"), "units[0].params[1].name", "control");
    expect_bad(good, "units[0].params", json_array(), "units[0].params", "elements");
    expect_bad(good, "files[0].name", json_string("../x"), "files[0].name", "not a plain file name");
    expect_bad(good, "files[1].name", json_string("rank00000.bin"), "files[1].name", "duplicates files[0]");
    expect_bad(good, "files[0].crc32c", json_string("1A2B3C4D"), "files[0].crc32c", "hex");
    expect_bad(good, "files[0].rank", json_integer(2), "files[0].rank", "out of range [0, 1]");
    expect_bad(good, "files[0].bytes", json_integer(-1), "files[0].bytes", "out of range");
    expect_bad(good, "format", json_string("deepspeed"), "format", "zeroshard-checkpoint");
    expect_bad(good, "version", json_integer(2), "version", "out of range [1, 1]");
    expect_bad(good, "stage", json_integer(4), "stage", "out of range");
    expect_bad(good, "param_dtype", json_string("fp8"), "param_dtype", "fp32, bf16 or fp16");
    expect_bad(good, "loss_scaler.scale", json_real(-1), "loss_scaler.scale", "positive");
    expect_bad(good, "loss_scaler.iter", json_true(), "loss_scaler.iter", "got a boolean");
    expect_bad(good, "world_size", NULL, "world_size", "missing");
    expect_bad(good, "config", json_integer(1), "config", "expected an object");
    expect_bad(good, "extra", json_integer(1), "extra", "unknown field");
    expect_bad(good, "segments[2].extra", json_integer(1), "segments[2].extra", "unknown field");
    expect_bad(good, "units[1]", json_integer(1), "units[1]", "expected an object, got an integer");
    expect_bad_text("[1, 2]", 6, "(top level): expected an object, got an array");
    expect_bad_text("nul", 3, "invalid JSON");
    expect_bad_text("", 0, "invalid JSON");
    expect_bad_text("{\"global_step\": 99999999999999999999}", 37, "invalid JSON");
    expect_bad_text("{\"a\": 1, \"a\": 2}", 16, "invalid JSON");
    for (size_t n = 0; n < strlen(good); n += 7) /* every truncation is refused, never read past */
        expect_bad_text(cut, n, "ck/manifest.json: ");
    free(cut);
}

/* A hostile manifest is bounded by the data it describes before any table is made from
 * it (one unit element or segment per 4 data bytes; at most so many manifest bytes per data byte), and
 * its steps are consistent. */
static void test_bounds(const char *good, const char *dir)
{
    static const char one[] = "{\"format\":\"zeroshard-checkpoint\",\"version\":1,\"global_step\":0,\"micro_step\":0,"
        "\"world_size\":1,\"stage\":0,\"param_dtype\":\"fp32\",\"optimizer\":\"sgd\",\"loss_scaler\":{\"scale\":1.0,"
        "\"skipped_steps\":0,\"hysteresis\":2,\"last_overflow\":-1,\"iter\":0},\"files\":[{\"name\":\"rank00000.bin\","
        "\"rank\":0,\"bytes\":4,\"crc32c\":\"00000000\"}],";
    char text[2048], path[PATH_MAX];
    struct zs_ckpt_manifest m;
    FILE *f;
    int rc;

    expect_bad(good, "loss_scaler.skipped_steps", json_integer((1ll << 40) + 4), "loss_scaler.skipped_steps",
               "more than global_step 1099511627779");
    expect_bad(good, "micro_step", json_integer(5), "micro_step", "5 is less than global_step 1099511627779");
    snprintf(text, sizeof(text), "%s\"units\":[{\"name\":\"u\",\"numel\":1,\"params\":[{\"name\":\"s\",\"offset\":0,"
             "\"numel\":1,\"shape\":[]}]}],\"segments\":[{},{}]}", one);
    expect_bad_text(text, strlen(text), "segments: 2 entries, more than the files' 4 bytes of data can hold");
    snprintf(text, sizeof(text), "%s\"units\":[{\"name\":\"u\",\"numel\":1000000,\"params\":[{\"name\":\"s\","
             "\"offset\":0,\"numel\":1000000,\"shape\":[]}]}],\"segments\":[]}", one);
    expect_bad_text(text, strlen(text), "units[0].numel: the units up to here have 1000000 elements, more than the "
                    "files' 4 bytes");
    snprintf(text, sizeof(text), "%s\"units\":[{\"name\":\"u\",\"numel\":1,\"params\":[{\"name\":\"s\",\"offset\":0,"
             "\"numel\":1,\"shape\":[]},{\"name\":\"t\",\"offset\":0,\"numel\":1,\"shape\":[]}]}],\"segments\":[]}", one);
    expect_bad_text(text, strlen(text), "units[0].params: 2 parameters in all, more than the units' 1 elements");
    rc = zs_ckpt_manifest_parse_bounded(&m, good, strlen(good), "ck/manifest.json", 8, err, sizeof(err));
    CHECK(rc == -1 && strstr(err, "ck/manifest.json: units[0].numel: ") &&
          strstr(err, "more than the files' 8 bytes of data can hold"),
          "declared files larger than the directory's: rc %d: %s", rc, err);
    if (!rc)
        zs_ckpt_manifest_free(&m);
    /* a valid manifest padded with 2 MiB of blanks, beside a few hundred bytes of data: refused unread */
    PATHF(path, "%s/global_step1/%s", dir, ZS_CKPT_MANIFEST);
    f = fopen(path, "a");
    for (int i = 0; f && i < 2 << 20; i += 64)
        fputs("                                                                \n", f);
    if (f)
        fclose(f);
    PATHF(path, "%s/global_step1", dir);
    rc = zs_ckpt_manifest_load(&m, path, err, sizeof(err));
    CHECK(rc == -1 && strstr(err, "manifest.json: ") && strstr(err, "more than a manifest of the") &&
          strstr(err, "bytes of data files beside it can need"), "a padded manifest: rc %d: %s", rc, err);
    if (!rc)
        zs_ckpt_manifest_free(&m);
}

static void test_resolve(const char *dir)
{
    static const char *const bad[] = {"../x\n", ".\n", "..", "a/b", "\n", "", "tag\nmore", NULL};
    char path[PATH_MAX], out[PATH_MAX];

    PATHF(path, "%s/%s", dir, ZS_CKPT_LATEST);
    for (int i = 0; bad[i]; i++) {
        write_text(path, bad[i]);
        CHECK(zs_ckpt_resolve(dir, out, sizeof(out), err, sizeof(err)) && strstr(err, "latest"),
              "latest '%s' accepted: %s", bad[i], err);
    }
    write_text(path, "global_step99");
    CHECK(zs_ckpt_resolve(dir, out, sizeof(out), err, sizeof(err)) && strstr(err, "global_step99"),
          "latest naming a missing tag: %s", err);
    write_text(path, "global_step1");
    CHECK(zs_ckpt_resolve(dir, out, sizeof(out), err, sizeof(err)) == 0, "no newline: %s", err);
    unlink(path);
    CHECK(zs_ckpt_resolve(dir, out, sizeof(out), err, sizeof(err)) && strstr(err, "not a checkpoint"),
          "neither manifest nor latest: %s", err);
}

int main(int argc, char **argv)
{
    struct zs_ckpt_manifest m, loaded;
    char dir[] = "/tmp/zs_ckpt_test_XXXXXX", cmd[PATH_MAX + 16], tag[PATH_MAX];
    char *good;

    if (argc == 3 && strcmp(argv[1], "--write-sample") == 0)
        return write_sample(argv[2]);
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    build(&m, small_params, 4, 2, 2, 3);
    test_round_trip(&m);
    CHECK(write_ckpt(&m, dir, "global_step1") == 0, "write checkpoint");
    if (load(dir, tag, sizeof(tag), &loaded) == 0) {
        test_reads(tag, &loaded);
        test_damaged_files(tag, &loaded);
        zs_ckpt_manifest_free(&loaded);
    }
    good = zs_ckpt_manifest_dump(&m);
    test_bad_manifests(good);
    test_bounds(good, dir);
    test_resolve(dir);
    free(good);
    zs_ckpt_manifest_free(&m);
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    if (system(cmd))
        fprintf(stderr, "could not remove %s\n", dir);
    return zs_test_summary("ckpt_format");
}
