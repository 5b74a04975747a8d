/* ckpt_opts.c - the checkpoint calls with options: tags other than global_step<N>, saving without moving
 * `latest`, an extra file published with the checkpoint, the load flags, and loading at any step boundary
 * (the state a running engine keeps between steps is reset first). The save and load themselves are in
 * ckpt.c. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"
#include "offload/swap.h"  /* defines: zs_crc32c */
#include "core/ctx.h"
#include "core/ranks.h"    /* defines: zs_agree */
#include "sharding/sharding.h" /* defines: zs_fetch_invalidate, zs_grads_zero */
#include "ckpt_dir.h"      /* defines: zs_ckpt_event */
#include "ckpt_format.h"   /* defines: ZS_CKPT_LATEST, ZS_CKPT_MANIFEST, ZS_CKPT_LOCK, zs_ckpt_resolve */
#include "ckpt_opts.h"

/* A name a checkpoint directory can hold without meaning something else: a plain file name that is not one
 * of the directory's own entries (`latest`, the save lock, a save's temporary or set-aside directory). */
static zs_status name_check(const char *name, const char *what, const char *who)
{
    size_t n = strlen(name);
    bool aside = n >= 4 && (!strcmp(name + n - 4, ".tmp") || !strcmp(name + n - 4, ".old"));

    if (!zs_ckpt_name_ok(name) || n > ZS_CKPT_TAG_MAX || !strcmp(name, ZS_CKPT_LATEST) ||
        !strcmp(name, ZS_CKPT_LOCK) || aside)
        return zs_fail(ZS_ERR_INVALID, "%s: %s '%.*s' is not a safe file name (not empty, no '/' or control "
                       "characters, not '.', '..', '%s' or '%s', not ending in .tmp or .old, at most %d bytes)",
                       who, what, ZS_CKPT_TAG_MAX + 8, name, ZS_CKPT_LATEST, ZS_CKPT_LOCK, ZS_CKPT_TAG_MAX);
    return ZS_OK;
}

/* The extra file must not take the name of a file the checkpoint itself holds. */
static zs_status extra_check(const zs_ckpt_opts *o, const char *who)
{
    unsigned r;
    char tail;
    zs_status st;

    if (!o->extra_name)
        return o->extra_bytes ? zs_fail(ZS_ERR_INVALID, "%s: extra_bytes without extra_name", who) : ZS_OK;
    st = name_check(o->extra_name, "extra_name", who);
    if (st)
        return st;
    if (!strcmp(o->extra_name, ZS_CKPT_MANIFEST) || sscanf(o->extra_name, "rank%5u.bi%c", &r, &tail) == 2)
        return zs_fail(ZS_ERR_INVALID, "%s: extra_name '%s' is the name of one of the checkpoint's own files", who,
                       o->extra_name);
    if (o->extra_bytes && !o->extra_data)
        return zs_fail(ZS_ERR_INVALID, "%s: extra_data is NULL for %zu bytes", who, o->extra_bytes);
    return ZS_OK;
}

zs_status zs_ckpt_write_extra(const char *tmp, const zs_ckpt_opts *o)
{
    char path[PATH_MAX];
    const char *p = o->extra_data;
    size_t left = o->extra_bytes;
    int rc, fd = -1;

    if (!o->extra_name)
        return ZS_OK;
    if (snprintf(path, sizeof(path), "%s/%s", tmp, o->extra_name) >= (int)sizeof(path))
        return zs_fail(ZS_ERR_INVALID, "checkpoint: %s/%s: path too long", tmp, o->extra_name);
    rc = zs_ckpt_event("write", path, NULL); /* test hook: a full disk here */
    if (!rc && (fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600)) < 0)
        rc = -errno;
    while (!rc && left) {
        ssize_t n = write(fd, p, left);
        if (n < 0 && errno != EINTR)
            rc = -errno;
        else if (n == 0)
            rc = -EIO;
        else if (n > 0) {
            p += n;
            left -= (size_t)n;
        }
    }
    if (!rc && fsync(fd))
        rc = -errno;
    if (fd >= 0 && close(fd) && !rc)
        rc = -errno;
    return rc ? zs_fail(ZS_ERR_IO, "checkpoint: cannot write the extra file %s: %s", path, strerror(-rc)) : ZS_OK;
}

zs_status zs_ckpt_manifest_extra(struct zs_ckpt_manifest *m, const zs_ckpt_opts *o)
{
    struct zs_ckpt_file *f;
    char *name;

    if (!o->extra_name)
        return ZS_OK;
    f = realloc(m->files, (size_t)(m->nfiles + 1) * sizeof(*f));
    if (f)
        m->files = f;
    name = f ? strdup(o->extra_name) : NULL;
    if (!name)
        return zs_fail(ZS_ERR_NOMEM, "checkpoint: out of memory for the manifest");
    /* written by rank 0; no segment points into it */
    f[m->nfiles++] = (struct zs_ckpt_file){.name = name, .rank = 0, .bytes = o->extra_bytes,
                                           .crc32c = zs_crc32c(0, o->extra_data, o->extra_bytes)};
    return ZS_OK;
}

// ----------------------------------------------------------------------------------- save

zs_status zs_checkpoint_save_opts(zs_ctx *ctx, const char *dir, const zs_ckpt_opts *opts)
{
    static const zs_ckpt_opts none;
    const zs_ckpt_opts *o = opts ? opts : &none;
    zs_status st;

    if (!ctx || !dir)
        return zs_fail(ZS_ERR_INVALID, "zs_checkpoint_save: NULL argument");
    st = o->tag ? name_check(o->tag, "tag", "zs_checkpoint_save") : ZS_OK;
    if (!st)
        st = extra_check(o, "zs_checkpoint_save");
    if (!st && (o->module_only || o->no_optimizer || o->no_scheduler))
        st = zs_fail(ZS_ERR_INVALID, "zs_checkpoint_save: module_only, no_optimizer and no_scheduler are load flags");
    return st ? st : zs_ckpt_save(ctx, dir, o);
}

zs_status zs_checkpoint_save(zs_ctx *ctx, const char *dir)
{
    return zs_checkpoint_save_opts(ctx, dir, NULL);
}

// ----------------------------------------------------------------------------------- load

/* A step boundary: no accumulation window open, no micro-batch begun, no unit held. */
static zs_status boundary_check(const struct zs_ctx *ctx)
{
    if (!ctx->set_up)
        return zs_fail(ZS_ERR_INVALID, "zs_checkpoint_load: call zs_setup first");
    if (ctx->window_micro != 0)
        return zs_fail(ZS_ERR_INVALID, "zs_checkpoint_load: in the middle of an accumulation window (micro-step "
                       "%lld, %lld of %lld per step stepped); load after zs_step's boundary",
                       (long long)ctx->micro_step, (long long)ctx->window_micro,
                       (long long)ctx->cfg.grad_accum_steps);
    for (int32_t u = 0; u < ctx->nunits; u++) {
        const struct zs_unit *un = &ctx->units[u];
        if (un->grad_state != ZS_GRAD_IDLE || un->ready_micro == ctx->micro_step)
            return zs_fail(ZS_ERR_INVALID, "zs_checkpoint_load: micro-step %lld has begun (unit '%s' has "
                           "gradients); load before the micro-batch's first zs_grad_buffer or after its zs_step",
                           (long long)ctx->micro_step, un->name);
    }
    for (int32_t u = 0; u < ctx->nunits; u++)
        if (ctx->units[u].fetched > 0)
            return zs_fail(ZS_ERR_INVALID, "zs_checkpoint_load: unit '%s' is fetched; release every unit first",
                           ctx->units[u].name);
    return ZS_OK;
}

/* What the engine keeps between steps, computed from the parameters being replaced: stage 3's gathered
 * copies, the gradients (and the exact sums), which micro-batch each unit last reported. */
static zs_status boundary_reset(struct zs_ctx *ctx)
{
    zs_status st = zs_fetch_invalidate(ctx, -1, "zs_checkpoint_load");

    if (!st)
        st = zs_grads_zero(ctx);
    for (int32_t u = 0; u < ctx->nunits; u++)
        ctx->units[u].ready_micro = -1;
    return st;
}

/* dir/<tag>, or dir/latest's tag (dir itself when it holds a manifest); *found 0 when no tag was asked for
 * and there is no `latest`. */
static zs_status load_path(const char *dir, const zs_ckpt_opts *o, char *path, size_t len, bool *found)
{
    char err[1024];
    struct stat sb;

    *found = true;
    if (o->tag) {
        if ((size_t)snprintf(path, len, "%s/%s", dir, o->tag) >= len)
            return zs_fail(ZS_ERR_INVALID, "zs_checkpoint_load: %s/%s: path too long", dir, o->tag);
        if (stat(path, &sb))
            return zs_fail(ZS_ERR_IO, "zs_checkpoint_load: no checkpoint %s: %s", path, strerror(errno));
        if (!S_ISDIR(sb.st_mode))
            return zs_fail(ZS_ERR_IO, "zs_checkpoint_load: no checkpoint %s: not a directory", path);
        return ZS_OK;
    }
    if ((size_t)snprintf(path, len, "%s/%s", dir, ZS_CKPT_MANIFEST) >= len)
        return zs_fail(ZS_ERR_INVALID, "zs_checkpoint_load: %s: path too long", dir);
    if (stat(path, &sb)) {
        snprintf(path, len, "%s/%s", dir, ZS_CKPT_LATEST);
        if (lstat(path, &sb) && errno == ENOENT) {
            *found = false;
            return ZS_OK;
        }
    }
    if (zs_ckpt_resolve(dir, path, len, err, sizeof(err)))
        return zs_fail(ZS_ERR_IO, "checkpoint: %s", err);
    return ZS_OK;
}

/* Every rank must find the same: a shared directory seen differently is an error, not a silent split. */
static zs_status agree_found(struct zs_ctx *ctx, bool *found)
{
    double n = *found ? 1.0 : 0.0;
    zs_status st = zs_allreduce_sum(ctx, &n, 1);

    if (!st && n != 0.0 && n != (double)ctx->world)
        st = zs_fail(ZS_ERR_IO, "zs_checkpoint_load: %g of %d ranks see a `latest` file; the checkpoint directory "
                     "must be the same on every rank", n, ctx->world);
    *found = n != 0.0;
    return st;
}

zs_status zs_checkpoint_load_opts(zs_ctx *ctx, const char *dir, const zs_ckpt_opts *opts, int *loaded)
{
    static const zs_ckpt_opts none;
    const zs_ckpt_opts *o = opts ? opts : &none;
    char path[PATH_MAX];
    const char *base;
    bool found = false;
    zs_status st;

    if (loaded)
        *loaded = 0;
    if (!ctx || !dir)
        return zs_fail(ZS_ERR_INVALID, "zs_checkpoint_load: NULL argument");
    st = boundary_check(ctx);
    if (!st && o->tag)
        st = name_check(o->tag, "tag", "zs_checkpoint_load");
    if (!st && (o->no_latest || o->extra_name))
        st = zs_fail(ZS_ERR_INVALID, "zs_checkpoint_load: no_latest and extra_name are save options (read the "
                     "extra file with zs_checkpoint_extra)");
    if (!st)
        st = load_path(dir, o, path, sizeof(path), &found);
    st = zs_agree(ctx, st);
    if (!st)
        st = agree_found(ctx, &found);
    if (st || !found)
        return st;
    st = zs_agree(ctx, boundary_reset(ctx));
    if (!st)
        st = zs_ckpt_load(ctx, path, o);
    if (st)
        return st;
    base = strrchr(path, '/');
    base = base ? base + 1 : path;
    if (strlen(base) < sizeof(ctx->ckpt_tag)) /* a tag directory given as dir may have any name */
        memcpy(ctx->ckpt_tag, base, strlen(base) + 1);
    if (loaded)
        *loaded = 1;
    return ZS_OK;
}

zs_status zs_checkpoint_load(zs_ctx *ctx, const char *dir)
{
    int loaded = 0;
    zs_status st = zs_checkpoint_load_opts(ctx, dir, NULL, &loaded);

    if (!st && !loaded) /* the plain form keeps its contract: a directory without a checkpoint is an error */
        return zs_fail(ZS_ERR_IO, "checkpoint: %s: not a checkpoint: neither %s nor %s found", dir, ZS_CKPT_MANIFEST,
                       ZS_CKPT_LATEST);
    return st;
}

// ----------------------------------------------------------------------------------- queries

zs_status zs_checkpoint_extra(zs_ctx *ctx, const char *dir, const char *tag, const char *name, void *buf,
                              size_t *bytes)
{
    char tagdir[PATH_MAX], path[PATH_MAX], err[1024];
    struct stat sb;
    size_t want, got = 0;
    int fd;

    if (!ctx || !dir || !name || !bytes)
        return zs_fail(ZS_ERR_INVALID, "zs_checkpoint_extra: NULL argument");
    want = *bytes;
    *bytes = 0;
    if (name_check(name, "name", "zs_checkpoint_extra") || (tag && name_check(tag, "tag", "zs_checkpoint_extra")))
        return ZS_ERR_INVALID;
    if (!tag && ctx->ckpt_tag[0])
        tag = ctx->ckpt_tag;
    if (tag)
        snprintf(tagdir, sizeof(tagdir), "%s/%s", dir, tag);
    else if (zs_ckpt_resolve(dir, tagdir, sizeof(tagdir), err, sizeof(err)))
        return zs_fail(ZS_ERR_IO, "zs_checkpoint_extra: %s", err);
    if ((size_t)snprintf(path, sizeof(path), "%s/%s", tagdir, name) >= sizeof(path))
        return zs_fail(ZS_ERR_INVALID, "zs_checkpoint_extra: %s/%s: path too long", tagdir, name);
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0 && errno == ENOENT)
        return ZS_OK; /* the checkpoint has none */
    if (fd < 0 || fstat(fd, &sb)) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        return zs_fail(ZS_ERR_IO, "zs_checkpoint_extra: %s: %s", path, strerror(e));
    }
    if (!buf) {
        close(fd);
        *bytes = (size_t)sb.st_size;
        return ZS_OK;
    }
    while (got < want) {
        ssize_t n = read(fd, (char *)buf + got, want - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            int e = errno;
            close(fd);
            return zs_fail(ZS_ERR_IO, "zs_checkpoint_extra: %s: read at offset %zu: %s", path, got, strerror(e));
        }
        if (n == 0)
            break;
        got += (size_t)n;
    }
    close(fd);
    *bytes = got;
    return ZS_OK;
}

const char *zs_checkpoint_tag(const zs_ctx *ctx)
{
    return ctx ? ctx->ckpt_tag : "";
}
