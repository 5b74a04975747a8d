/* arena.h - a rank's device memory as a few large regions, sized once from the engine's memory plan and carved
 * into aligned blocks, instead of one device allocation per buffer (cudaMalloc is slow and synchronizing, and a
 * GPU's allocator fragments). Used for devices the host cannot read in place (CUDA, the separate test device). */
#ifndef ZS_ARENA_H
#define ZS_ARENA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "zeroshard.h" /* defines: zs_status */

struct zs_device;

/* ---------------------------------------------------------------- the sub-allocator (offsets only)
 * First fit over a sorted list of free spans; a free coalesces with its neighbours. Every block starts at a
 * multiple of `align` from the region's start and takes a multiple of `align` bytes. */

struct zs_span {
    uint64_t off, len;
};

struct zs_suballoc {
    uint64_t size, align;
    struct zs_span *free;     /* sorted by offset, never adjacent (merged) */
    int32_t nfree, cap;
    uint64_t used, peak;      /* bytes handed out (rounded), now and at most */
};

/* 0, -EINVAL (align not a power of two, or size not a multiple of it) or -ENOMEM. */
int zs_suballoc_init(struct zs_suballoc *a, uint64_t size, uint64_t align);
void zs_suballoc_fini(struct zs_suballoc *a);
/* The rounded size of a request: -EOVERFLOW where rounding up wraps. 0 bytes take one aligned block. */
int zs_suballoc_round(const struct zs_suballoc *a, uint64_t bytes, uint64_t *rounded);
/* 0 and *off, -ENOSPC (no free span holds it), -EOVERFLOW or -ENOMEM (the free list could not grow). */
int zs_suballoc_alloc(struct zs_suballoc *a, uint64_t bytes, uint64_t *off);
/* Gives back a block of `bytes` (as asked at alloc) at off: -EINVAL where it is misaligned, outside the region or
 * overlaps free space (a double free), -ENOMEM where the list could not grow. */
int zs_suballoc_free(struct zs_suballoc *a, uint64_t off, uint64_t bytes);
uint64_t zs_suballoc_largest_free(const struct zs_suballoc *a);

/* ---------------------------------------------------------------- the device arena */

#define ZS_ARENA_ALIGN 256     /* cudaMalloc's own alignment: any vector load of the kernels stays aligned */
#define ZS_ARENA_REGIONS 8

struct zs_dev_region {
    const char *name;          /* what the plan sized it for, for the messages ("gradients") */
    char *base;                /* device memory, NULL when the plan gave it no bytes */
    struct zs_suballoc sa;
};

struct zs_dev_arena {
    struct zs_device *dev;
    struct zs_dev_region r[ZS_ARENA_REGIONS];
    uint64_t zeroed[ZS_ARENA_REGIONS]; /* bytes zero-filled in each region since open (what the tests read) */
    int32_t n;
    bool open;
};

/* One device allocation per region of bytes[i] (rounded to the alignment; 0: none), names[i] naming it.
 * On failure nothing stays allocated and the message names the region and its size. */
zs_status zs_dev_arena_open(struct zs_dev_arena *a, struct zs_device *d, const uint64_t *bytes,
                            const char *const *names, int32_t n);
/* A block of region i; zero-filled (on the device's compute stream) when `zero`, else holding whatever its last
 * owner left, for a caller that writes every byte before anything reads it. NULL with the message naming the
 * region, the request and what is left, when the plan did not provide for it. */
void *zs_dev_arena_alloc(struct zs_dev_arena *a, int32_t i, uint64_t bytes, bool zero);
/* Gives back a block; an address outside region i or a double free is an error (an engine bug). */
zs_status zs_dev_arena_free(struct zs_dev_arena *a, int32_t i, void *p, uint64_t bytes);
/* Frees the regions (every block with them). */
void zs_dev_arena_close(struct zs_dev_arena *a);
/* Bytes of device memory the regions hold, and handed out now. */
uint64_t zs_dev_arena_size(const struct zs_dev_arena *a);
uint64_t zs_dev_arena_used(const struct zs_dev_arena *a);

#endif /* ZS_ARENA_H */
