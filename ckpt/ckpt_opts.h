/* ckpt_opts.h - what ckpt/ckpt.c (a save, a load) and ckpt/ckpt_view.c (a unit's state in place) share with
 * the checkpoint options (ckpt/ckpt_opts.c) and a parameter's full state (ckpt/param_state.c). Internal. */
#ifndef ZS_CKPT_OPTS_H
#define ZS_CKPT_OPTS_H

#include <stdbool.h>
#include <stdint.h>

#include "core/ctx.h" /* defines: struct zs_ctx */
#include "ckpt_format.h" /* defines: struct zs_ckpt_manifest */

#define ZS_CKPT_TAG_MAX 200 /* bytes of a tag name (zs_ckpt_opts.tag) */

/* Where this rank's state of unit u lives: p, the fp32 parameters a checkpoint holds (the working
 * parameters with fp32 training, the masters with 16-bit), elements [p_base, p_base + p_count) of the
 * unit; with 16-bit training also the working copy `work`, [w_base, w_base + w_count); and the state
 * arrays from s_base. From the swap file's first slot when the masters or state live on NVMe. */
struct unit_view {
    float *p, *s1, *s2;
    void *work;
    int64_t p_base, p_count, w_base, w_count, s_base;
    bool on_disk, p_disk, w_disk; /* the state, p and work, from the swap file */
    /* a device the host cannot read in place: host copies of the arrays above that live there */
    struct { void *host, *dev; size_t bytes; } copy[5];
    int ncopy;
};

/* Opens unit u's view (host copies of device arrays, the swap file's region paged in); zs_ckpt_view_done
 * ends it, copying the host copies back when write_back (a swapped region is written by zs_nvme_unit_store). */
zs_status zs_ckpt_view_unit(struct zs_ctx *ctx, int32_t u, struct unit_view *v);
zs_status zs_ckpt_view_done(struct zs_ctx *ctx, struct unit_view *v, bool write_back);
/* New parameter values (fp32, vals[0] = unit element w_base, w_count of them) into the view: the working
 * parameters (rounded when 16-bit) and the masters. */
void zs_ckpt_apply_params(struct zs_ctx *ctx, const struct unit_view *v, const float *vals);

/* Collective. The save under opts' tag (checked by the caller), publishing opts' extra file with it. */
zs_status zs_ckpt_save(struct zs_ctx *ctx, const char *dir, const zs_ckpt_opts *o);
/* Collective. Loads the tag directory `tag` (a path) at a step boundary the caller made ready, as the flags say. */
zs_status zs_ckpt_load(struct zs_ctx *ctx, const char *tag, const zs_ckpt_opts *o);
/* Rank 0, inside a save: writes o's extra file (if any) into the temporary directory tmp, fsynced. */
zs_status zs_ckpt_write_extra(const char *tmp, const zs_ckpt_opts *o);
/* Lists o's extra file (if any) among the manifest's files, with its checksum, so a load verifies it. */
zs_status zs_ckpt_manifest_extra(struct zs_ckpt_manifest *m, const zs_ckpt_opts *o);

#endif /* ZS_CKPT_OPTS_H */
