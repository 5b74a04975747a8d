/* ckpt_format_impl.h - what the manifest parser (ckpt_format.c) shares with its cross-checks
 * (ckpt_format_check.c). Internal to ckpt/ckpt_format*.c. */
#ifndef ZS_CKPT_FORMAT_IMPL_H
#define ZS_CKPT_FORMAT_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "ckpt_format.h" /* defines: struct zs_ckpt_manifest */


/* One parse: where messages go and what they are prefixed with, and the data bytes the files declare
 * (every unit element and every segment needs 4 of them: what bounds the tables before they are made). */
struct mp {
    const char *what;
    char *err;
    size_t errlen;
    uint64_t data_bytes;
};

/* Writes "<what>: <path>.<key>: <message>" into p->err (control characters replaced) and returns -1. */
int zs_ckpt_mp_fail(struct mp *p, const char *path, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* The checks across tables: parameter and file names unique, parameters disjoint, for every unit and kind
 * present the segments covering [0, numel) exactly once, and segments disjoint in their files. 0 or -1. */
int zs_ckpt_manifest_check(struct mp *p, const struct zs_ckpt_manifest *m);

#endif /* ZS_CKPT_FORMAT_IMPL_H */
