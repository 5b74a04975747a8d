/* error.c - last-error storage and logging. The library reports, the program decides what to do. */
#include <stdio.h>
#include <string.h>

#include "error.h"

static _Thread_local char zs_errbuf[1024];

zs_status zs_fail(zs_status st, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(zs_errbuf, sizeof(zs_errbuf), fmt, ap);
    va_end(ap);
    return st;
}

void zs_error_prefix(const char *fmt, ...)
{
    char prefix[512], old[sizeof(zs_errbuf)];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(prefix, sizeof(prefix), fmt, ap);
    va_end(ap);
    memcpy(old, zs_errbuf, sizeof(old));
    snprintf(zs_errbuf, sizeof(zs_errbuf), "%.500s: %.520s", prefix, old);
}

void zs_log(const char *fmt, ...)
{
    va_list ap;

    fputs("zeroshard: ", stdout);
    va_start(ap, fmt);
    vfprintf(stdout, fmt, ap);
    va_end(ap);
    fputc('\n', stdout);
    fflush(stdout);
}

const char *zs_last_error(void)
{
    return zs_errbuf[0] ? zs_errbuf : "no error";
}

const char *zs_status_str(zs_status s)
{
    switch (s) {
    case ZS_OK: return "ok";
    case ZS_ERR_INVALID: return "invalid argument";
    case ZS_ERR_CONFIG: return "config error";
    case ZS_ERR_NOMEM: return "out of memory";
    case ZS_ERR_COMM: return "communication error";
    case ZS_ERR_MISMATCH: return "ranks disagree";
    case ZS_ERR_IO: return "I/O error";
    case ZS_ERR_UNSUPPORTED: return "unsupported";
    }
    return "unknown status";
}
