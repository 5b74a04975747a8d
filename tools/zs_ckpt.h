/* zs_ckpt.h - what the zs-ckpt command files share: the export options and the error line. */
#ifndef ZS_CKPT_TOOL_H
#define ZS_CKPT_TOOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ckpt/ckpt_format.h" /* defines: struct zs_ckpt_manifest */

struct ckpt_export_opts {
    const char *dir, *out;
    bool bf16;           /* else fp32 */
    uint64_t max_shard;  /* bytes of tensor data per file; 0: one file */
    size_t buffer;       /* bytes read from the checkpoint at a time */
    bool verify;         /* check the data files' checksums first */
};

/* Prints "zs-ckpt: <message>" on stderr and returns 1, the exit status of a failed command. */
int ckpt_tool_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Resolves DIR (or DIR/latest) and loads its manifest; tag receives the tag directory. 0 or 1 (reported). */
int ckpt_tool_load(const char *dir, char *tag, size_t taglen, struct zs_ckpt_manifest *m);
/* Checks every data file's size and checksum, printing "ok" lines when `loud`. 0 or 1 (reported). */
int ckpt_tool_verify(const struct zs_ckpt_manifest *m, const char *tag, bool loud);
int ckpt_tool_export(const struct ckpt_export_opts *o);

#endif /* ZS_CKPT_TOOL_H */
