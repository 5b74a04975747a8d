/* ckpt.c - collective checkpoints: every rank writes the slice of each unit that it would own in an
 * N-way partition (parameters as fp32 masters, and the optimizer's state arrays), rank 0 writes the
 * manifest (ckpt/ckpt_format.h) that maps unit element ranges to file byte ranges. Save goes through a
 * temporary directory that is fsynced and renamed into place, then `latest` is replaced (ckpt_dir.c), so
 * a crash leaves the previous checkpoint whole. Load works at any world size and stage: a rank reads just the
 * element ranges it now stores, from whichever files hold them. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"
#include "base/test_hooks.h"
#include "kernels/convert.h" /* defines: zs_cvt_from_f32 */
#include "kernels/optim.h" /* defines: zs_dtype_name */
#include "core/ctx.h"
#include "core/ranks.h"
#include "core/units.h"
#include "offload/nvme_optim.h"
#include "offload/swap.h" /* defines: zs_crc32c */
#include "sharding/sharding.h" /* defines: zs_fetch_invalidate */
#include "runtime/runtime.h"
#include "ckpt_dir.h"    /* defines: zs_ckpt_begin, zs_ckpt_publish, zs_ckpt_end, zs_ckpt_event */
#include "ckpt_format.h"
#include "ckpt_groups.h"  /* defines: zs_ckpt_groups_fill, zs_ckpt_groups_match, zs_ckpt_groups_apply */
#include "ckpt_opts.h"   /* defines: struct unit_view, zs_ckpt_save, zs_ckpt_load */
#include "safetensors.h"

#define CKPT_PATH 4096

/* out = a/b (a path under CKPT_PATH - 64 bytes, checked on entry, so this never truncates) */
static void join(char *out, const char *a, const char *b)
{
    if (snprintf(out, CKPT_PATH, "%s/%s", a, b) >= CKPT_PATH)
        out[CKPT_PATH - 1] = '\0';
}

/* The slice of unit u that rank r of the current world writes: [begin, begin + count) of its flat
 * elements (padding excluded). Hybrid sharding: the first shard group writes, the replicas nothing, so every
 * element is in the checkpoint once. */
static int64_t slice(const struct zs_ctx *ctx, int32_t u, int32_t r, int64_t *begin)
{
    const struct zs_unit *un = &ctx->units[u];
    int64_t b = zs_partition_begin(&un->part, r), n = un->part.shard;

    *begin = b;
    if (r >= ctx->shard_size || b >= un->numel)
        return 0;
    return b + n > un->numel ? un->numel - b : n;
}

/* ---------------------------------------------------------------- save */

struct file_out {
    int fd;
    uint64_t off;
    uint32_t crc;
    const char *path;
    int fault; /* -errno: the test hook's failure for the next write (ckpt_dir.c) */
};

static zs_status out_write(struct file_out *f, const void *buf, size_t bytes)
{
    const char *p = buf;

    f->crc = zs_crc32c(f->crc, buf, bytes);
    while (bytes) {
        ssize_t n = f->fault ? (errno = -f->fault, -1) : write(f->fd, p, bytes);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return zs_fail(ZS_ERR_IO, "checkpoint: %s: write at offset %llu failed: %s", f->path,
                           (unsigned long long)f->off, n < 0 ? strerror(errno) : "no progress");
        p += n;
        bytes -= (size_t)n;
        f->off += (uint64_t)n;
    }
    return ZS_OK;
}

/* Test hook: ZS_TEST_CKPT_CRASH=R:N makes rank R die (SIGKILL) halfway through writing its file of the
 * checkpoint at global step N, as a machine or process failure mid-save would. */
static void crash_hook(const struct zs_ctx *ctx, int32_t u)
{
    const char *c = getenv(ZS_TEST_HOOK_CKPT_CRASH);
    int r;
    long long step;

    if (c && sscanf(c, "%d:%lld", &r, &step) == 2 && r == ctx->rank && step == ctx->global_step &&
        u == ctx->nunits / 2)
        raise(SIGKILL);
}

static zs_status write_rank_file(struct zs_ctx *ctx, const char *tmp, uint64_t *bytes, uint32_t *crc)
{
    char path[CKPT_PATH];
    struct file_out f = {.path = path};
    int k = zs_config_state_arrays(&ctx->cfg);
    zs_status st = ZS_OK;

    char name[32];
    snprintf(name, sizeof(name), "rank%05d.bin", ctx->rank);
    join(path, tmp, name);
    f.fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (f.fd < 0)
        return zs_fail(ZS_ERR_IO, "checkpoint: cannot create %s: %s", path, strerror(errno));
    f.fault = zs_ckpt_event("write", path, NULL);
    for (int32_t u = 0; u < ctx->nunits && !st; u++) {
        struct unit_view v;
        int64_t begin, count = slice(ctx, u, ctx->rank, &begin);
        crash_hook(ctx, u);
        if (!count)
            continue;
        st = zs_ckpt_view_unit(ctx, u, &v);
        if (!st)
            st = out_write(&f, v.p + (begin - v.p_base), (size_t)count * sizeof(float)); /* fp32 masters */
        if (!st && k >= 1 && !ctx->units[u].frozen)
            st = out_write(&f, v.s1 + (begin - v.s_base), (size_t)count * sizeof(float));
        if (!st && k >= 2 && !ctx->units[u].frozen)
            st = out_write(&f, v.s2 + (begin - v.s_base), (size_t)count * sizeof(float));
        zs_ckpt_view_done(ctx, &v, false);
    }
    if (!st && fsync(f.fd))
        st = zs_fail(ZS_ERR_IO, "checkpoint: fsync %s: %s", path, strerror(errno));
    if (close(f.fd) && !st)
        st = zs_fail(ZS_ERR_IO, "checkpoint: close %s: %s", path, strerror(errno));
    *bytes = f.off;
    *crc = f.crc;
    return st;
}

/* The manifest, from the registration and the layout every rank wrote by. */
static zs_status build_manifest(struct zs_ctx *ctx, struct zs_ckpt_manifest *m, const uint64_t *bytes,
                                const uint32_t *crc)
{
    int k = zs_config_state_arrays(&ctx->cfg);
    int64_t nsegs = 0;

    memset(m, 0, sizeof(*m));
    m->version = ZS_CKPT_VERSION;
    m->global_step = ctx->global_step;
    m->micro_step = ctx->micro_step;
    m->world_size = ctx->world;
    m->stage = ctx->cfg.zero.stage;
    m->param_dtype = (char *)zs_dtype_name(ctx->pdt);
    m->optimizer = (char *)zs_optim_name(ctx->cfg.optim.type);
    m->scaler = (struct zs_ckpt_scaler){.scale = ctx->scaler.scale, .skipped_steps = ctx->skipped_steps,
                                        .hysteresis = ctx->scaler.cur_hysteresis,
                                        .last_overflow = ctx->scaler.last_overflow_iter, .iter = ctx->scaler.cur_iter};
    m->config_json = ctx->config_text;
    m->optim_steps = ctx->optim_steps;
    m->sched_steps = ctx->sched_steps;
    m->nunits = ctx->nunits;
    m->nparams = ctx->nparams;
    m->nfiles = ctx->world;
    m->units = calloc((size_t)ctx->nunits, sizeof(*m->units));
    m->params = calloc((size_t)ctx->nparams, sizeof(*m->params));
    m->files = calloc((size_t)ctx->world, sizeof(*m->files));
    m->segs = calloc((size_t)ctx->nunits * (size_t)ctx->world * (size_t)(1 + k), sizeof(*m->segs));
    if (!m->units || !m->params || !m->files || !m->segs)
        return zs_fail(ZS_ERR_NOMEM, "checkpoint: out of memory for the manifest");
    for (int32_t u = 0; u < ctx->nunits; u++)
        m->units[u] = (struct zs_ckpt_unit){.name = ctx->units[u].name, .numel = ctx->units[u].numel,
                                            .first_param = ctx->units[u].first_param,
                                            .nparams = ctx->units[u].nparams};
    for (int32_t p = 0; p < ctx->nparams; p++) {
        const struct zs_param_rec *pr = &ctx->params[p];
        struct zs_ckpt_param *mp = &m->params[p];
        *mp = (struct zs_ckpt_param){.name = pr->name, .unit = pr->unit, .offset = pr->offset, .numel = pr->numel,
                                     .ndim = pr->ndim ? pr->ndim : 1};
        if (pr->ndim)
            memcpy(mp->shape, pr->shape, sizeof(mp->shape));
        else
            mp->shape[0] = pr->numel;
    }
    for (int32_t r = 0; r < ctx->world; r++) {
        uint64_t off = 0;
        m->files[r].rank = r;
        m->files[r].bytes = bytes[r];
        m->files[r].crc32c = crc[r];
        m->files[r].name = malloc(32);
        if (!m->files[r].name)
            return zs_fail(ZS_ERR_NOMEM, "checkpoint: out of memory for the manifest");
        snprintf(m->files[r].name, 32, "rank%05d.bin", r);
        for (int32_t u = 0; u < ctx->nunits; u++) {
            int64_t begin, count = slice(ctx, u, r, &begin);
            for (int kind = 0; count && kind <= (ctx->units[u].frozen ? 0 : k); kind++) {
                m->segs[nsegs++] = (struct zs_ckpt_seg){.unit = u, .kind = kind, .file = r, .begin = begin,
                                                        .count = count, .offset = off};
                off += (uint64_t)count * sizeof(float);
            }
        }
        if (off != bytes[r])
            return zs_fail(ZS_ERR_IO, "checkpoint: rank %d wrote %llu bytes, the layout says %llu", r,
                           (unsigned long long)bytes[r], (unsigned long long)off);
    }
    m->nsegs = nsegs;
    for (int kind = 0; kind <= k; kind++)
        m->has_kind[kind] = true;
    return zs_ckpt_groups_fill(ctx, m);
}

static void manifest_release(struct zs_ckpt_manifest *m)
{
    for (int32_t r = 0; r < m->nfiles && m->files; r++)
        free(m->files[r].name);
    free(m->units);
    free(m->params);
    free(m->files);
    free(m->segs);
    free(m->groups);
}

/* Rank 0: the manifest into the temporary directory, which then becomes the tag, and `latest` names it. */
static zs_status publish(struct zs_ctx *ctx, const char *dir, const char *tag, const char *tmp, const uint64_t *bytes,
                         const uint32_t *crc, const zs_ckpt_opts *o)
{
    struct zs_ckpt_manifest m = {0};
    char path[CKPT_PATH];
    char *text = NULL;
    zs_status st = zs_ckpt_write_extra(tmp, o); /* before the manifest: published with it or not at all */

    if (!st)
        st = build_manifest(ctx, &m, bytes, crc);
    if (!st)
        st = zs_ckpt_manifest_extra(&m, o);
    if (!st && !(text = zs_ckpt_manifest_dump(&m)))
        st = zs_fail(ZS_ERR_NOMEM, "checkpoint: out of memory writing the manifest");
    manifest_release(&m);
    join(path, tmp, ZS_CKPT_MANIFEST);
    if (!st)
        st = zs_ckpt_write_file(path, text);
    free(text);
    return st ? st : zs_ckpt_publish(dir, tag, o->no_latest);
}

zs_status zs_ckpt_save(struct zs_ctx *ctx, const char *dir, const zs_ckpt_opts *o)
{
    char tag[ZS_CKPT_TAG_MAX + 1], tmp[CKPT_PATH];
    uint64_t bytes = 0, *all_bytes = NULL;
    uint32_t crc = 0, *all_crc = NULL;
    int lock_fd = -1;
    zs_status st = ZS_OK;

    if (!ctx->set_up)
        return zs_fail(ZS_ERR_INVALID, "zs_checkpoint_save: call zs_setup first");
    if (ctx->window_micro != 0)
        return zs_fail(ZS_ERR_INVALID, "zs_checkpoint_save: in the middle of an accumulation window (micro-step "
                       "%lld, %lld of its window stepped); save after the step", (long long)ctx->micro_step,
                       (long long)ctx->window_micro);
    if (o->tag)
        snprintf(tag, sizeof(tag), "%s", o->tag);
    else
        snprintf(tag, sizeof(tag), "global_step%lld", (long long)ctx->global_step);
    if (strlen(dir) + sizeof(tag) + 64 > CKPT_PATH)
        return zs_fail(ZS_ERR_INVALID, "zs_checkpoint_save: path %s too long", dir);
    zs_ckpt_hook_rank(ctx->rank);
    /* A half-applied step would be written with valid checksums, over a good checkpoint of the same tag. */
    if (ctx->broken)
        st = zs_fail(ZS_ERR_INVALID, "checkpoint save refused: %s; the state is inconsistent", ctx->broken_why);
    st = zs_agree(ctx, st);
    if (st)
        return st;
    char name[sizeof(tag) + 8];
    snprintf(name, sizeof(name), "%s.tmp", tag);
    join(tmp, dir, name);
    if (ctx->rank == 0)
        st = zs_ckpt_begin(dir, tag, &lock_fd);
    st = zs_agree(ctx, st);
    if (!st)
        st = zs_agree(ctx, write_rank_file(ctx, tmp, &bytes, &crc));
    all_bytes = calloc((size_t)ctx->world, sizeof(*all_bytes));
    all_crc = calloc((size_t)ctx->world, sizeof(*all_crc));
    if (!st) /* the sizes and checksums travel by the watched collectives: a rank lost here cannot hang rank 0 */
        st = zs_agree(ctx, all_bytes && all_crc ? ZS_OK : zs_fail(ZS_ERR_NOMEM, "checkpoint: out of memory"));
    if (!st && !(st = zs_comm_allgather_bytes(ctx->comm, &bytes, all_bytes, (int32_t)sizeof(bytes))) &&
        !(st = zs_comm_allgather_bytes(ctx->comm, &crc, all_crc, (int32_t)sizeof(crc)))) {
        if (ctx->rank == 0)
            st = publish(ctx, dir, tag, tmp, all_bytes, all_crc, o);
        st = zs_agree(ctx, st);
    }
    free(all_bytes);
    free(all_crc);
    if (ctx->rank == 0) /* after every rank has stopped writing: a failed save leaves no <tag>.tmp */
        zs_ckpt_end(dir, tag, lock_fd, st != ZS_OK);
    if (!st)
        snprintf(ctx->ckpt_tag, sizeof(ctx->ckpt_tag), "%s", tag);
    if (!st && ctx->rank == 0 && !ctx->quiet)
        zs_log("checkpoint: saved %s/%s", dir, tag);
    return st;
}

/* ---------------------------------------------------------------- load */

static zs_status match_model(struct zs_ctx *ctx, const struct zs_ckpt_manifest *m, const char *where)
{
    int k = zs_config_state_arrays(&ctx->cfg);

    if (m->nunits != ctx->nunits || m->nparams != ctx->nparams)
        return zs_fail(ZS_ERR_MISMATCH, "checkpoint %s: a different model: %d units and %d parameters, the program "
                       "registered %d and %d", where, m->nunits, m->nparams, ctx->nunits, ctx->nparams);
    for (int32_t u = 0; u < m->nunits; u++)
        if (strcmp(m->units[u].name, ctx->units[u].name) || m->units[u].numel != ctx->units[u].numel)
            return zs_fail(ZS_ERR_MISMATCH, "checkpoint %s: units[%d] is '%s' of %lld elements, the program's unit "
                           "%d is '%s' of %lld", where, u, m->units[u].name, (long long)m->units[u].numel, u,
                           ctx->units[u].name, (long long)ctx->units[u].numel);
    for (int32_t p = 0; p < m->nparams; p++) {
        const struct zs_param_rec *pr = &ctx->params[p];
        if (strcmp(m->params[p].name, pr->name) || m->params[p].numel != pr->numel ||
            m->params[p].offset != pr->offset || m->params[p].unit != pr->unit)
            return zs_fail(ZS_ERR_MISMATCH, "checkpoint %s: params[%d] is '%s' (%lld elements), the program's "
                           "parameter %d is '%s' (%lld elements)", where, p, m->params[p].name,
                           (long long)m->params[p].numel, p, pr->name, (long long)pr->numel);
    }
    if (strcasecmp(m->optimizer, zs_optim_name(ctx->cfg.optim.type)))
        return zs_fail(ZS_ERR_MISMATCH, "checkpoint %s: optimizer '%s', the config's is '%s' (its state would not "
                       "fit)", where, m->optimizer, zs_optim_name(ctx->cfg.optim.type));
    zs_status st = zs_ckpt_groups_match(ctx, m, where);
    if (st)
        return st;
    for (int kind = 1; kind <= k; kind++)
        if (!m->has_kind[kind])
            return zs_fail(ZS_ERR_MISMATCH, "checkpoint %s: no '%s' state, which the optimizer needs", where,
                           zs_ckpt_kind_name(kind));
    return ZS_OK;
}

static zs_status read_into(struct zs_ckpt_reader *rd, int32_t u, int kind, int64_t begin, int64_t count, float *dst,
                           int64_t numel)
{
    char err[1024];
    int64_t n = begin >= numel ? 0 : begin + count > numel ? numel - begin : count;

    memset(dst, 0, (size_t)count * sizeof(float)); /* padding past the unit's end stays zero */
    if (n > 0 && zs_ckpt_read_range(rd, u, kind, begin, n, dst, err, sizeof(err)))
        return zs_fail(ZS_ERR_IO, "checkpoint: %s", err);
    return ZS_OK;
}

static zs_status load_unit(struct zs_ctx *ctx, struct zs_ckpt_reader *rd, int32_t u, const zs_ckpt_opts *o)
{
    struct zs_unit *un = &ctx->units[u];
    struct unit_view v;
    int k = zs_config_state_arrays(&ctx->cfg);
    int64_t sn = zs_plan_opt_elems(ctx->cfg.zero.stage, &un->part);
    zs_status st = zs_ckpt_view_unit(ctx, u, &v);
    float *vals = NULL;
    int rc = zs_ckpt_event("load", un->name, NULL); /* test hook: a read error part-way through a load */

    if (!st && rc)
        st = zs_fail(ZS_ERR_IO, "checkpoint: reading unit '%s': %s", un->name, strerror(-rc));
    if (!st && !(vals = malloc((size_t)v.w_count * sizeof(float))))
        st = zs_fail(ZS_ERR_NOMEM, "checkpoint: out of memory loading unit '%s'", un->name);
    if (!st)
        st = read_into(rd, u, ZS_CKPT_PARAM, v.w_base, v.w_count, vals, un->numel);
    if (!st)
        zs_ckpt_apply_params(ctx, &v, vals);
    free(vals);
    for (int i = 1; !st && o->no_optimizer && !o->module_only && i <= k; i++) /* fresh moments */
        memset(i == 1 ? v.s1 : v.s2, 0, (size_t)sn * sizeof(float));
    if (o->module_only || o->no_optimizer)
        k = 0; /* the moments are not read: kept (module_only) or zero */
    if (!st && k >= 1 && !un->frozen)
        st = read_into(rd, u, ZS_CKPT_EXP_AVG, v.s_base, sn, v.s1, un->numel);
    if (!st && k >= 2 && !un->frozen)
        st = read_into(rd, u, ZS_CKPT_EXP_AVG_SQ, v.s_base, sn, v.s2, un->numel);
    zs_status up = zs_ckpt_view_done(ctx, &v, !st);
    if (!st)
        st = up;
    if (!st && v.on_disk)
        st = zs_nvme_unit_store(ctx->nvme, u);
    return st;
}

/* The step counts, the loss scale and the schedule's position from the manifest, as the flags say. A save is
 * taken at a boundary, so the window starts empty; micro_step is the manifest's own count (after a window
 * ended early it is not global_step x gradient_accumulation_steps, and an older manifest's is that product). */
static void load_counters(struct zs_ctx *ctx, const struct zs_ckpt_manifest *m, const zs_ckpt_opts *o)
{
    int64_t updates = m->global_step - m->scaler.skipped_steps;
    int64_t optim = m->optim_steps >= 0 ? m->optim_steps : updates;
    int64_t sched = m->sched_steps >= 0 ? m->sched_steps : updates;

    if (o->module_only)
        return;
    ctx->global_step = m->global_step;
    ctx->skipped_steps = m->scaler.skipped_steps;
    ctx->micro_step = m->micro_step;
    ctx->window_micro = 0;
    ctx->optim_steps = o->no_optimizer ? 0 : optim; /* fresh moments start Adam's count again */
    if (!o->no_scheduler)
        ctx->sched_steps = sched;
    if (ctx->scaler.dynamic && !strcmp(m->param_dtype, "fp16")) { /* the dynamic scale carries on */
        ctx->scaler.scale = m->scaler.scale;
        ctx->scaler.cur_hysteresis = m->scaler.hysteresis;
        ctx->scaler.last_overflow_iter = m->scaler.last_overflow;
        ctx->scaler.cur_iter = m->scaler.iter;
        ctx->stats.loss_scale = m->scaler.scale;
    }
    ctx->stats.global_step = ctx->global_step;
    ctx->stats.micro_step = ctx->micro_step;
}

zs_status zs_ckpt_load(struct zs_ctx *ctx, const char *tag, const zs_ckpt_opts *o)
{
    struct zs_ckpt_manifest m;
    struct zs_ckpt_reader *rd = NULL;
    char err[1024];
    zs_status st = ZS_OK;

    memset(&m, 0, sizeof(m));
    if (zs_ckpt_manifest_load(&m, tag, err, sizeof(err)))
        st = zs_fail(ZS_ERR_IO, "checkpoint: %s", err);
    if (!st)
        st = match_model(ctx, &m, tag);
    /* Every file's checksum is checked before anything is used, each file by one rank. */
    for (int32_t f = ctx->rank; !st && f < m.nfiles; f += ctx->world)
        if (zs_ckpt_verify_file(&m, tag, f, err, sizeof(err)))
            st = zs_fail(ZS_ERR_IO, "checkpoint: %s", err);
    st = zs_agree(ctx, st);
    if (st) { /* nothing changed yet: the context is as it was */
        zs_ckpt_manifest_free(&m);
        return st;
    }
    zs_ckpt_hook_rank(ctx->rank);
    if (zs_ckpt_reader_open(&rd, &m, tag, err, sizeof(err)))
        st = zs_fail(ZS_ERR_IO, "checkpoint: %s", err);
    for (int32_t u = 0; !st && u < ctx->nunits; u++)
        st = load_unit(ctx, rd, u, o);
    zs_ckpt_reader_close(rd);
    st = zs_agree(ctx, st);
    if (st) { /* some units hold the checkpoint's state and others not: unusable until a load succeeds */
        zs_ctx_break(ctx, "checkpoint load from %s failed part-way (%s)", tag, zs_last_error());
    } else if (!o->module_only && !o->no_optimizer) { /* the groups' values are the optimizer's state */
        st = zs_ckpt_groups_apply(ctx, &m); /* allocation only: fails before anything else changes */
    }
    if (!st) {
        ctx->broken = false;
        load_counters(ctx, &m, o);
        if (ctx->rank == 0 && !ctx->quiet)
            zs_log("checkpoint: loaded %s (step %lld, saved by %d ranks at stage %d)", tag, (long long)m.global_step,
                   m.world_size, m.stage);
    }
    zs_ckpt_manifest_free(&m);
    return st;
}

/* ---------------------------------------------------------------- safetensors import */

/* The tensor of parameter pr, checked against its shape, for elements [w_base, w_end) of its unit. */
static zs_status import_param(struct zs_st *st, const struct zs_param_rec *pr, float *vals, int64_t w_base,
                              int64_t w_end, const char *path)
{
    const struct zs_st_tensor *t = zs_st_find(st, pr->name);
    int32_t ndim = pr->ndim ? pr->ndim : 1;
    const int64_t *shape = pr->ndim ? pr->shape : &pr->numel;
    int64_t lo = pr->offset > w_base ? pr->offset : w_base;
    int64_t hi = pr->offset + pr->numel < w_end ? pr->offset + pr->numel : w_end;
    char err[512];

    if (!t)
        return zs_fail(ZS_ERR_MISMATCH, "%s: no tensor '%s' for the registered parameter", path, pr->name);
    if (t->ndim != ndim || memcmp(t->shape, shape, (size_t)ndim * sizeof(int64_t)))
        return zs_fail(ZS_ERR_MISMATCH, "%s: tensor '%s' has %d dimensions (first %lld), the parameter %d (first %lld)",
                       path, pr->name, t->ndim, t->ndim ? (long long)t->shape[0] : 0LL, ndim, (long long)shape[0]);
    if (lo < hi && zs_st_read_f32(st, t, lo - pr->offset, hi - lo, vals + (lo - w_base), err, sizeof(err)))
        return zs_fail(ZS_ERR_IO, "%s", err);
    return ZS_OK;
}

zs_status zs_import_safetensors(zs_ctx *ctx, const char *path)
{
    struct zs_st *st = NULL;
    char err[512];
    zs_status s = ZS_OK;

    if (!ctx || !path)
        return zs_fail(ZS_ERR_INVALID, "zs_import_safetensors: NULL argument");
    if (!ctx->set_up || ctx->micro_step != 0)
        return zs_fail(ZS_ERR_INVALID, "zs_import_safetensors: call it after zs_setup and before training");
    if (zs_st_open(&st, path, err, sizeof(err)))
        s = zs_fail(ZS_ERR_IO, "%s", err);
    for (int i = 0; !s && i < zs_st_count(st); i++) { /* strict: every tensor names a parameter */
        const char *name = zs_st_get(st, i)->name;
        int32_t p = 0;
        while (p < ctx->nparams && strcmp(ctx->params[p].name, name))
            p++;
        if (p == ctx->nparams)
            s = zs_fail(ZS_ERR_MISMATCH, "%s: tensor '%s' matches no registered parameter", path, name);
    }
    if (!s) /* gathered copies and hpZ secondary slices would keep the values replaced here */
        s = zs_agree(ctx, zs_fetch_invalidate(ctx, -1, "zs_import_safetensors"));
    for (int32_t u = 0; !s && u < ctx->nunits; u++) {
        struct zs_unit *un = &ctx->units[u];
        struct unit_view v;
        float *vals = NULL;
        s = zs_ckpt_view_unit(ctx, u, &v);
        if (!s && !(vals = calloc((size_t)v.w_count, sizeof(float))))
            s = zs_fail(ZS_ERR_NOMEM, "%s: out of memory for unit '%s'", path, un->name);
        for (int32_t i = 0; !s && i < un->nparams; i++)
            s = import_param(st, &ctx->params[un->first_param + i], vals, v.w_base, v.w_base + v.w_count, path);
        if (!s)
            zs_ckpt_apply_params(ctx, &v, vals);
        free(vals);
        zs_status up = zs_ckpt_view_done(ctx, &v, !s);
        if (!s)
            s = up;
        if (!s && v.on_disk)
            s = zs_nvme_unit_store(ctx->nvme, u);
    }
    zs_st_close(st);
    s = zs_agree(ctx, s);
    if (!s && ctx->rank == 0 && !ctx->quiet)
        zs_log("initialised %d parameters from %s", ctx->nparams, path);
    return s;
}
