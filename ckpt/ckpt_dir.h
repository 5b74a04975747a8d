/* ckpt_dir.h - the directory side of a checkpoint save, done by rank 0: the lock that keeps two jobs out of
 * one save directory, the temporary tag directory, and the order of renames and fsyncs that makes a tag and
 * then `latest` visible (ckpt/ckpt_dir.c). Internal to ckpt/ckpt.c. */
#ifndef ZS_CKPT_DIR_H
#define ZS_CKPT_DIR_H

#include <stdbool.h>
#include <stddef.h>

#include "zeroshard.h" /* defines: zs_status */

/* Test hooks for every step below and for the data files' writes (documented in ckpt_dir.c): records the
 * step, then returns 0, or -errno when the hook fails this step; it may also stop or kill the process.
 * zs_ckpt_hook_rank, at the start of each save or load, tells them which rank this process is. */
void zs_ckpt_hook_rank(int rank);
int zs_ckpt_event(const char *what, const char *a, const char *b);

/* Save start: creates dir when missing (and makes that durable in its parent), takes the save lock
 * (*lock_fd, held until zs_ckpt_end), finishes a publish a crash interrupted, clears leftovers of this
 * tag and creates the empty temporary directory dir/<tag>.tmp. */
zs_status zs_ckpt_begin(const char *dir, const char *tag, int *lock_fd);
/* Writes text to path (created, fsynced). */
zs_status zs_ckpt_write_file(const char *path, const char *text);
/* The temporary directory is complete (files and manifest fsynced): makes it the tag and points `latest`
 * at it (unless no_latest). `latest` names a complete checkpoint at every instant; a failure rolls back. */
zs_status zs_ckpt_publish(const char *dir, const char *tag, bool no_latest);
/* Save end: when the save failed, removes the temporary directory (unless `latest` names it: see the
 * fallback in ckpt_dir.c); releases the lock. */
void zs_ckpt_end(const char *dir, const char *tag, int lock_fd, bool failed);

#endif /* ZS_CKPT_DIR_H */
