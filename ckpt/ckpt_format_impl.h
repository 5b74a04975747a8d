/* ckpt_format_impl.h - what the manifest parser (ckpt_format.c) shares with its cross-checks
 * (ckpt_format_check.c). Internal to ckpt/ckpt_format*.c. */
#ifndef ZS_CKPT_FORMAT_IMPL_H
#define ZS_CKPT_FORMAT_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>      /* defines: json_t */

#include "ckpt_format.h" /* defines: struct zs_ckpt_manifest */


/* One parse: where messages go and what they are prefixed with, and the data bytes the files declare
 * (every unit element and every segment needs 4 of them: what bounds the tables before they are made). */
struct mp {
    const char *what;
    char *err;
    size_t errlen;
    uint64_t data_bytes;
    const struct zs_ckpt_manifest *m; /* what is parsed so far (the groups, for the parameters' group ids) */
};

/* Writes "<what>: <path>.<key>: <message>" into p->err (control characters replaced) and returns -1. */
int zs_ckpt_mp_fail(struct mp *p, const char *path, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* The checks across tables: parameter and file names unique, parameters disjoint, for every unit and kind
 * present the segments covering [0, numel) exactly once, and segments disjoint in their files. 0 or -1. */
int zs_ckpt_manifest_check(struct mp *p, const struct zs_ckpt_manifest *m);

/* ckpt_groups.c: a parameter object's optional "group" and "frozen" (after the groups are parsed), and the
 * root's optional "groups". 0 or -1. */
int zs_ckpt_param_group_parse(struct mp *p, json_t *o, const char *path, const struct zs_ckpt_manifest *m,
                              struct zs_ckpt_param *q);
int zs_ckpt_groups_parse(struct mp *p, json_t *root, struct zs_ckpt_manifest *m);
/* Their dump: the parameter's members into po, the root's "groups" (NULL when m has none). */
int zs_ckpt_param_group_dump(json_t *po, const struct zs_ckpt_param *q);
json_t *zs_ckpt_groups_dump(const struct zs_ckpt_manifest *m);

#endif /* ZS_CKPT_FORMAT_IMPL_H */
