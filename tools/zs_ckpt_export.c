/* zs_ckpt_export.c - zs-ckpt export: the consolidated fp32 (or bf16) weights of a sharded checkpoint as
 * safetensors, in memory bounded by --buffer whatever the model size (DeepSpeed's zero_to_fp32 needs the
 * whole model in RAM). Sharded output follows the Hugging Face layout: NAME-0000i-of-0000K.safetensors and
 * NAME.safetensors.index.json. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>      /* defines: json_pack, json_dumps */

#include "ckpt/ckpt_format.h"  /* defines: zs_ckpt_reader_open, zs_ckpt_read_range */
#include "kernels/convert.h"      /* defines: zs_cvt_f32_bf16 */
#include "ckpt/safetensors.h"  /* defines: zs_st_writer_open, zs_st_writer_append */
#include "zs_ckpt.h"      /* defines: struct ckpt_export_opts, ckpt_tool_fail */

#define SUFFIX ".safetensors"

/* Parameters [first, first + count) of the manifest go to one file. */
struct shard {
    int32_t first, count;
    uint64_t bytes;
    char path[PATH_MAX];
};

/* Greedy, in manifest order: a parameter never straddles two files, and one larger than the limit gets a
 * file of its own. */
static struct shard *plan_shards(const struct zs_ckpt_manifest *m, int esize, uint64_t max, int *nshards)
{
    struct shard *s = calloc((size_t)m->nparams, sizeof(*s));
    int k = 0;

    if (!s)
        return NULL;
    for (int32_t i = 0; i < m->nparams; i++) {
        uint64_t b = (uint64_t)m->params[i].numel * (uint64_t)esize;

        if (k == 0 || (max && s[k - 1].bytes + b > max))
            s[k++].first = i;
        s[k - 1].count++;
        s[k - 1].bytes += b;
    }
    *nshards = k;
    return s;
}

/* OUT itself for one file; else model.safetensors -> model-00001-of-00003.safetensors. */
static int name_shards(struct shard *s, int k, const char *out)
{
    size_t n = strlen(out), sl = strlen(SUFFIX);
    int base = n > sl && strcmp(out + n - sl, SUFFIX) == 0 ? (int)(n - sl) : (int)n;

    for (int i = 0; i < k; i++) {
        int len = k == 1 ? snprintf(s[i].path, PATH_MAX, "%s", out)
                         : snprintf(s[i].path, PATH_MAX, "%.*s-%05d-of-%05d%s", base, out, i + 1, k, SUFFIX);

        if (len < 0 || len >= PATH_MAX)
            return ckpt_tool_fail("%s: output path too long", out);
    }
    return 0;
}

/* Streams one parameter through buf (at most `chunk` elements at a time), converting in place to bf16. */
static int copy_param(struct zs_ckpt_reader *r, const struct zs_ckpt_param *q, struct zs_st_writer *w, float *buf,
                      int64_t chunk, bool bf16)
{
    char err[1024];

    for (int64_t at = 0, n; at < q->numel; at += n) {
        n = q->numel - at < chunk ? q->numel - at : chunk;
        if (zs_ckpt_read_range(r, q->unit, ZS_CKPT_PARAM, q->offset + at, n, buf, err, sizeof(err)))
            return ckpt_tool_fail("%s", err);
        /* element i's two bytes land below element i's four: nothing unread is overwritten */
        for (int64_t i = 0; bf16 && i < n; i++) {
            uint16_t h = zs_cvt_f32_bf16(buf[i]);

            memcpy((char *)buf + 2 * i, &h, 2);
        }
        if (zs_st_writer_append(w, buf, (size_t)n * (bf16 ? 2 : 4), err, sizeof(err)))
            return ckpt_tool_fail("%s", err);
    }
    return 0;
}

static int write_shard(const struct zs_ckpt_manifest *m, struct zs_ckpt_reader *r, const struct shard *s,
                       const struct ckpt_export_opts *o, float *buf)
{
    struct zs_st_tensor *t = calloc((size_t)s->count, sizeof(*t));
    struct zs_st_writer *w = NULL;
    char step[32], err[1024];
    const char *meta[] = {"format", "pt", "global_step", step, "source", "zeroshard", NULL};
    int rc = 1;

    snprintf(step, sizeof(step), "%lld", (long long)m->global_step);
    if (!t)
        return ckpt_tool_fail("%s: out of memory", s->path);
    for (int32_t i = 0; i < s->count; i++) {
        const struct zs_ckpt_param *q = &m->params[s->first + i];

        t[i] = (struct zs_st_tensor){.name = q->name, .dtype = o->bf16 ? ZS_ST_BF16 : ZS_ST_F32, .ndim = q->ndim};
        memcpy(t[i].shape, q->shape, sizeof(t[i].shape));
    }
    if (zs_st_writer_open(&w, s->path, t, s->count, meta, err, sizeof(err))) {
        ckpt_tool_fail("%s", err);
        goto out;
    }
    for (int32_t i = 0; i < s->count; i++)
        if (copy_param(r, &m->params[s->first + i], w, buf, (int64_t)(o->buffer / 4), o->bf16)) {
            zs_st_writer_abort(w);
            goto out;
        }
    if (zs_st_writer_close(w, err, sizeof(err))) {
        ckpt_tool_fail("%s", err);
        goto out;
    }
    printf("wrote %s: %d tensors, %llu bytes of data\n", s->path, s->count, (unsigned long long)s->bytes);
    rc = 0;
out:
    free(t);
    return rc;
}

/* Writes text to path through path.tmp, fsync and rename, as the shards are. */
static int write_small_file(const char *path, const char *text)
{
    char tmp[PATH_MAX + 32];
    size_t n = strlen(text);
    int fd, rc = 0;

    if ((size_t)snprintf(tmp, sizeof(tmp), "%s.tmp", path) >= sizeof(tmp))
        return ckpt_tool_fail("%s: path too long", path);
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0)
        return ckpt_tool_fail("%s: cannot create: %s", tmp, strerror(errno));
    if (write(fd, text, n) != (ssize_t)n || fsync(fd))
        rc = ckpt_tool_fail("%s: write: %s", tmp, strerror(errno));
    if (close(fd) && !rc)
        rc = ckpt_tool_fail("%s: close: %s", tmp, strerror(errno));
    if (!rc && rename(tmp, path))
        rc = ckpt_tool_fail("%s: rename: %s", path, strerror(errno));
    if (rc)
        unlink(tmp);
    return rc;
}

/* {"metadata": {"total_size": N}, "weight_map": {name: file}}, file names relative to the index. */
static int write_index(const struct zs_ckpt_manifest *m, const struct shard *s, int k, const char *out)
{
    json_t *map = json_object(), *root;
    uint64_t total = 0;
    char path[PATH_MAX], *text, *tmp;
    int rc;

    for (int i = 0; i < k; i++) {
        const char *slash = strrchr(s[i].path, '/');

        total += s[i].bytes;
        for (int32_t j = 0; j < s[i].count; j++)
            json_object_set_new(map, m->params[s[i].first + j].name, json_string(slash ? slash + 1 : s[i].path));
    }
    root = json_pack("{s:{s:I}, s:o}", "metadata", "total_size", (json_int_t)total, "weight_map", map);
    text = root ? json_dumps(root, JSON_INDENT(2)) : NULL;
    if (text && (tmp = realloc(text, strlen(text) + 2)))
        text = strcat(tmp, "\n");
    json_decref(root);
    if ((size_t)snprintf(path, sizeof(path), "%s.index.json", out) >= sizeof(path))
        rc = ckpt_tool_fail("%s: path too long", out);
    else
        rc = text ? write_small_file(path, text) : ckpt_tool_fail("%s: out of memory", path);
    free(text);
    if (!rc)
        printf("wrote %s: %d files, %llu bytes of data\n", path, k, (unsigned long long)total);
    return rc;
}

int ckpt_tool_export(const struct ckpt_export_opts *o)
{
    struct zs_ckpt_manifest m;
    struct zs_ckpt_reader *r = NULL;
    struct shard *s = NULL;
    char tag[PATH_MAX], err[1024];
    float *buf = NULL;
    int k = 0, rc = 1;

    if (ckpt_tool_load(o->dir, tag, sizeof(tag), &m))
        return 1;
    if (o->verify && ckpt_tool_verify(&m, tag, false))
        goto out;
    s = plan_shards(&m, o->bf16 ? 2 : 4, o->max_shard, &k);
    buf = malloc(o->buffer & ~(size_t)3);
    if (!s || !buf) {
        ckpt_tool_fail("%s: out of memory (--buffer %zu)", o->out, o->buffer);
        goto out;
    }
    if (name_shards(s, k, o->out))
        goto out;
    if (zs_ckpt_reader_open(&r, &m, tag, err, sizeof(err))) {
        ckpt_tool_fail("%s", err);
        goto out;
    }
    for (int i = 0; i < k; i++)
        if (write_shard(&m, r, &s[i], o, buf))
            goto out;
    rc = k > 1 ? write_index(&m, s, k, o->out) : 0;
    if (!rc)
        printf("exported %d parameters of %s (global_step %lld) as %s\n", m.nparams, tag,
               (long long)m.global_step, o->bf16 ? "bf16" : "fp32");
out:
    zs_ckpt_reader_close(r);
    free(buf);
    free(s);
    zs_ckpt_manifest_free(&m);
    return rc;
}
