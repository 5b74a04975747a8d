/* clock.h - the monotonic clock every timing in the library reads (phase times, timeouts, the flight
 * recorder's stamps), as seconds in a double. */
#ifndef ZS_CLOCK_H
#define ZS_CLOCK_H

#include <time.h>

/* Seconds since an arbitrary fixed point; only differences mean anything. */
static inline double zs_now_s(void)
{
    struct timespec t;

    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

#endif /* ZS_CLOCK_H */
