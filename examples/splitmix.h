/* splitmix.h - the counter-based hash behind the examples' data, initial weights and sampling: every
 * value is a function of its coordinates, so each rank makes just what it needs, at any world size. */
#ifndef EX_SPLITMIX_H
#define EX_SPLITMIX_H

#include <stdint.h>

/* splitmix64's output function applied to x + the golden-ratio increment (uint64 arithmetic) */
static inline uint64_t ex_splitmix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

#endif /* EX_SPLITMIX_H */
