/* ckpt_groups.h - what a save records and a load checks and restores of the parameter groups and frozen
 * parameters (ckpt_groups.c); the manifest's side is in ckpt_format.h. */
#ifndef ZS_CKPT_GROUPS_H
#define ZS_CKPT_GROUPS_H

#include "core/ctx.h"    /* defines: struct zs_ctx */
#include "ckpt_format.h" /* defines: struct zs_ckpt_manifest */

/* Every parameter's group and frozen flag into m->params, and the groups' values (as zs_group_set left them)
 * into m->groups (malloc'd; none when the run has only the config's values). */
zs_status zs_ckpt_groups_fill(const struct zs_ctx *ctx, struct zs_ckpt_manifest *m);
/* A parameter whose group or frozen flag differs from the checkpoint's, or another number of groups, is an
 * error naming it. */
zs_status zs_ckpt_groups_match(const struct zs_ctx *ctx, const struct zs_ckpt_manifest *m, const char *where);
/* The groups' values (and last lr) come back, as torch's optimizer.load_state_dict restores param_groups. */
zs_status zs_ckpt_groups_apply(struct zs_ctx *ctx, const struct zs_ckpt_manifest *m);

#endif /* ZS_CKPT_GROUPS_H */
