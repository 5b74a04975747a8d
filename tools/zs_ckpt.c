/* zs_ckpt.c - zs-ckpt: looks inside ZeroShard checkpoints (info, verify), turns one into safetensors
 * (export, in zs_ckpt_export.c) and prints safetensors files (st-dump). Needs no MPI or GPU.
 * Errors are one line on stderr with exit status 1; usage errors exit 2. */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt_format.h"  /* defines: zs_ckpt_resolve, zs_ckpt_manifest_load, zs_ckpt_verify_file */
#include "ckpt/safetensors.h"  /* defines: zs_st_open, zs_st_read_f32 */
#include "zs_ckpt.h"      /* defines: struct ckpt_export_opts, ckpt_tool_export */

#define DEFAULT_BUFFER (64u << 20)

int ckpt_tool_fail(const char *fmt, ...)
{
    va_list ap;

    fputs("zs-ckpt: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return 1;
}

int ckpt_tool_load(const char *dir, char *tag, size_t taglen, struct zs_ckpt_manifest *m)
{
    char err[1024];

    if (zs_ckpt_resolve(dir, tag, taglen, err, sizeof(err)) || zs_ckpt_manifest_load(m, tag, err, sizeof(err)))
        return ckpt_tool_fail("%s", err);
    return 0;
}

int ckpt_tool_verify(const struct zs_ckpt_manifest *m, const char *tag, bool loud)
{
    char err[1024];

    for (int32_t i = 0; i < m->nfiles; i++) {
        if (zs_ckpt_verify_file(m, tag, i, err, sizeof(err)))
            return ckpt_tool_fail("%s", err);
        if (loud)
            printf("ok %s/%s %llu bytes crc32c %08x\n", tag, m->files[i].name,
                   (unsigned long long)m->files[i].bytes, m->files[i].crc32c);
    }
    return 0;
}

// ----------------------------------------------------------------------------------- info, verify

static int cmd_info(const char *dir)
{
    struct zs_ckpt_manifest m;
    char tag[PATH_MAX];
    int64_t elems = 0;
    uint64_t bytes = 0;

    if (ckpt_tool_load(dir, tag, sizeof(tag), &m))
        return 1;
    for (int32_t i = 0; i < m.nparams; i++)
        elems += m.params[i].numel;
    for (int32_t i = 0; i < m.nfiles; i++)
        bytes += m.files[i].bytes;
    printf("tag: %s\nglobal_step: %lld\nmicro_step: %lld\nworld_size: %d\nstage: %d\nparam_dtype: %s\n"
           "optimizer: %s\nloss_scale: %g\nunits: %d\nparameters: %d (%lld elements)\nkinds:", tag,
           (long long)m.global_step, (long long)m.micro_step, m.world_size, m.stage, m.param_dtype, m.optimizer,
           m.scaler.scale, m.nunits, m.nparams, (long long)elems);
    for (int k = 0; k < ZS_CKPT_NKINDS; k++)
        if (m.has_kind[k])
            printf(" %s", zs_ckpt_kind_name(k));
    printf("\nsegments: %lld\nfiles: %d (%llu bytes)\n", (long long)m.nsegs, m.nfiles, (unsigned long long)bytes);
    for (int32_t i = 0; i < m.nfiles; i++)
        printf("  %s rank %d %llu bytes crc32c %08x\n", m.files[i].name, m.files[i].rank,
               (unsigned long long)m.files[i].bytes, m.files[i].crc32c);
    zs_ckpt_manifest_free(&m);
    return 0;
}

static int cmd_verify(const char *dir)
{
    struct zs_ckpt_manifest m;
    char tag[PATH_MAX];
    int rc;

    if (ckpt_tool_load(dir, tag, sizeof(tag), &m))
        return 1;
    rc = ckpt_tool_verify(&m, tag, true);
    if (!rc)
        printf("ok %s: %d files\n", tag, m.nfiles);
    zs_ckpt_manifest_free(&m);
    return rc;
}

// ----------------------------------------------------------------------------------- st-dump

static void dump_values(struct zs_st *st, const struct zs_st_tensor *t, int64_t nvals)
{
    float v[16];
    char err[512];
    int64_t n = nvals < t->numel ? nvals : t->numel;

    if (t->dtype != ZS_ST_F32 && t->dtype != ZS_ST_F16 && t->dtype != ZS_ST_BF16)
        return;
    printf("  values:");
    for (int64_t i = 0; i < n; i += 16) {
        int64_t k = n - i < 16 ? n - i : 16;

        if (zs_st_read_f32(st, t, i, k, v, err, sizeof(err))) {
            printf("\n");
            ckpt_tool_fail("%s", err);
            return;
        }
        for (int64_t j = 0; j < k; j++)
            printf(" %.9g", v[j]);
    }
    printf("\n");
}

static int cmd_st_dump(const char *path, int64_t nvals)
{
    struct zs_st *st;
    char err[1024];
    const char *key, *val;

    if (zs_st_open(&st, path, err, sizeof(err)))
        return ckpt_tool_fail("%s", err);
    printf("%s: %d tensors\n", path, zs_st_count(st));
    for (int i = 0; (val = zs_st_meta_get(st, i, &key)); i++)
        printf("metadata %s = %s\n", key, val);
    for (int i = 0; i < zs_st_count(st); i++) {
        const struct zs_st_tensor *t = zs_st_get(st, i);

        printf("%s %s [", t->name, zs_st_dtype_name(t->dtype));
        for (int d = 0; d < t->ndim; d++)
            printf("%s%lld", d ? ", " : "", (long long)t->shape[d]);
        printf("] offset %llu bytes %llu\n", (unsigned long long)t->offset, (unsigned long long)t->nbytes);
        if (nvals > 0)
            dump_values(st, t, nvals);
    }
    zs_st_close(st);
    return 0;
}

// ----------------------------------------------------------------------------------- command line

static void usage(void)
{
    printf("usage: zs-ckpt info DIR\n"
               "       zs-ckpt verify DIR\n"
               "       zs-ckpt export DIR OUT.safetensors [--dtype fp32|bf16] [--max-shard-size BYTES]\n"
               "                      [--buffer BYTES] [--no-verify]\n"
               "       zs-ckpt st-dump FILE.safetensors [--values N]\n"
               "  DIR is a tag directory (holding manifest.json) or a save directory with a 'latest' file.\n"
               "  export writes the fp32 master weights of every parameter, streaming through a buffer of\n"
               "  --buffer bytes (default 64MiB); --max-shard-size splits them into NAME-0000i-of-0000K.safetensors\n"
               "  files and NAME.safetensors.index.json. BYTES takes KB/MB/GB (1000s) or KiB/MiB/GiB (1024s).\n");
}

/* "123", "5GB", "64MiB" -> bytes. */
static int parse_bytes(const char *s, uint64_t *out)
{
    static const struct { const char *suffix; uint64_t mult; } units[] = {
        {"", 1}, {"B", 1}, {"KB", 1000}, {"MB", 1000000}, {"GB", 1000000000}, {"KiB", 1024}, {"MiB", 1 << 20},
        {"GiB", 1 << 30}};
    char *end;
    unsigned long long v;

    errno = 0;
    v = strtoull(s, &end, 10);
    if (errno || end == s || s[0] == '-')
        return -EINVAL;
    for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++)
        if (strcmp(end, units[i].suffix) == 0)
            return __builtin_mul_overflow((uint64_t)v, units[i].mult, out) ? -EINVAL : 0;
    return -EINVAL;
}

struct cmdline {
    const char *pos[3];
    int npos;
    struct ckpt_export_opts ex;
    int64_t values;
    bool export_opts, values_opt; /* given: they are refused by the commands they mean nothing to */
};

/* One option; *i moves past its value. 0, or -1 for a bad option or value. */
static int parse_option(struct cmdline *c, int argc, char **argv, int *i)
{
    const char *a = argv[*i], *eq = strchr(a, '='), *v;
    size_t n = eq ? (size_t)(eq - a) : strlen(a);
    bool is_values = n == 8 && strncmp(a, "--values", n) == 0;
    uint64_t x;

    c->values_opt |= is_values;
    c->export_opts |= !is_values;
    if (strcmp(a, "--no-verify") == 0) {
        c->ex.verify = false;
        return 0;
    }
    v = eq ? eq + 1 : (*i + 1 < argc ? argv[++*i] : NULL);
    if (!v)
        return -1;
    if (n == 7 && strncmp(a, "--dtype", n) == 0 && (strcmp(v, "fp32") == 0 || strcmp(v, "bf16") == 0))
        c->ex.bf16 = strcmp(v, "bf16") == 0;
    else if (n == 16 && strncmp(a, "--max-shard-size", n) == 0 && !parse_bytes(v, &x) && x > 0)
        c->ex.max_shard = x;
    else if (n == 8 && strncmp(a, "--buffer", n) == 0 && !parse_bytes(v, &x) && x >= 4 && x <= SIZE_MAX / 2)
        c->ex.buffer = (size_t)x;
    else if (n == 8 && strncmp(a, "--values", n) == 0 && !parse_bytes(v, &x) && x <= INT64_MAX)
        c->values = (int64_t)x;
    else
        return -1;
    return 0;
}

static int parse_cmdline(struct cmdline *c, int argc, char **argv)
{
    *c = (struct cmdline){.ex = {.buffer = DEFAULT_BUFFER, .verify = true}};
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        int opt = i;

        if (strncmp(a, "--", 2) == 0) {
            if (parse_option(c, argc, argv, &i)) {
                fprintf(stderr, "zs-ckpt: bad option or value: %s%s%s (see zs-ckpt --help)\n", a, i > opt ? " " : "",
                        i > opt ? argv[i] : "");
                return -1;
            }
        } else if (c->npos < 3) {
            c->pos[c->npos++] = a;
        } else {
            fprintf(stderr, "zs-ckpt: unexpected argument: %s (see zs-ckpt --help)\n", a);
            return -1;
        }
    }
    return 0;
}

int main(int argc, char **argv)
{
    const char *cmd = argc > 1 ? argv[1] : "";
    struct cmdline c;

    if (strcmp(cmd, "-h") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "help") == 0) {
        usage();
        return 0;
    }
    if (parse_cmdline(&c, argc, argv))
        return 2;
    if (strcmp(cmd, "info") == 0 && c.npos == 1 && !c.export_opts && !c.values_opt)
        return cmd_info(c.pos[0]);
    if (strcmp(cmd, "verify") == 0 && c.npos == 1 && !c.export_opts && !c.values_opt)
        return cmd_verify(c.pos[0]);
    if (strcmp(cmd, "st-dump") == 0 && c.npos == 1 && !c.export_opts)
        return cmd_st_dump(c.pos[0], c.values);
    if (strcmp(cmd, "export") == 0 && c.npos == 2 && !c.values_opt) {
        c.ex.dir = c.pos[0];
        c.ex.out = c.pos[1];
        return ckpt_tool_export(&c.ex);
    }
    fprintf(stderr, "zs-ckpt: usage: zs-ckpt info|verify DIR, export DIR OUT [options], st-dump FILE "
                    "[--values N] (see zs-ckpt --help)\n");
    return 2;
}
