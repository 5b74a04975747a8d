/* error.h - the thread-local last-error message behind zs_last_error(), and rank-0 logging. */
#ifndef ZS_ERROR_H
#define ZS_ERROR_H

#include <stdarg.h>

#include "zeroshard.h" /* defines: zs_status */

/* Records a one-line message and returns `st`, so call sites read `return zs_fail(ZS_ERR_X, ...)`. */
zs_status zs_fail(zs_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prefixes the current message with "<what>: " (keeps the original cause). */
void zs_error_prefix(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Prints "zeroshard: <msg>" to stdout. */
void zs_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif /* ZS_ERROR_H */
