/* copy.h - a copy for large buffers that will not be read again soon by this core: non-temporal stores
 * skip the read-for-ownership of every destination line, which saves a third of the memory traffic. */
#ifndef ZS_COPY_H
#define ZS_COPY_H

#include <stddef.h>

/* Below this many bytes a plain memcpy wins (the data stays in cache for the next reader). */
#define ZS_STREAM_MIN_BYTES (1u << 20)

/* Copies bytes from src to dst (non-overlapping); uses streaming stores when the CPU has AVX2 and the
 * copy is at least ZS_STREAM_MIN_BYTES, else memcpy. */
void zs_copy_stream(void *dst, const void *src, size_t bytes);

#endif /* ZS_COPY_H */
