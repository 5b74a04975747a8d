/* hash.h - FNV-1a, for the cross-rank agreement hashes (config, registration, gradient order). */
#ifndef ZS_HASH_H
#define ZS_HASH_H

#include <stddef.h>
#include <stdint.h>

#define ZS_FNV_SEED 0xcbf29ce484222325ULL

static inline uint64_t zs_fnv1a(uint64_t h, const void *data, size_t n)
{
    const unsigned char *p = data;

    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

#endif /* ZS_HASH_H */
