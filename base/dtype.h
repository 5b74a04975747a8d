/* dtype.h - the training dtypes' element sizes, and addressing an element of a buffer of them. */
#ifndef ZS_DTYPE_H
#define ZS_DTYPE_H

#include <stddef.h>
#include <stdint.h>

#include "zeroshard.h" /* defines: zs_dtype */

/* Bytes of one element: fp32 is 4, fp16 and bf16 are 2. */
static inline uint64_t zs_dtype_bytes(zs_dtype t) { return t == ZS_DTYPE_FP32 ? 4 : 2; }

/* Element i of a buffer of esz-byte elements. */
static inline void *zs_at(void *base, int64_t i, size_t esz) { return (char *)base + (size_t)i * esz; }

#endif /* ZS_DTYPE_H */
