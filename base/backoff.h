/* backoff.h - how a wait on another process polls: a short spin, then short sleeps, never sched_yield.
 * On a loaded machine Linux's scheduler (EEVDF) puts a task that yields behind every busy task on its core, a
 * time slice each, and each further yield pushes it back again: a rank that yields while its peer works comes
 * back milliseconds after the peer delivered, at every exchange (a 2-rank run of 3000 small steps, 1 s alone,
 * took 67 s beside 4 busy processes on 2 cores while its waits yielded, 6 s once they slept). A task that
 * sleeps is woken ahead of the busy ones. The spin first keeps a quiet exchange, which completes in
 * microseconds, off the system call. */
#ifndef ZS_BACKOFF_H
#define ZS_BACKOFF_H

#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "base/clock.h" /* defines: zs_now_s */

#define ZS_BACKOFF_SPIN_S 30e-6   /* spin this long before the first sleep */
#define ZS_BACKOFF_SHORT_S 5e-3   /* short sleeps for this long; a wait longer than that has a rank behind */
#define ZS_BACKOFF_SHORT_NS 1000  /* asked for; the kernel's timer slack makes it about 50-80 us */
#define ZS_BACKOFF_LONG_NS 100000

/* One wait's state: ZS_BACKOFF_INIT when the wait starts. */
struct zs_backoff {
    uint32_t polls;
    bool sleeping;
    double start;
    uint64_t progress;
};

#define ZS_BACKOFF_INIT { 0, false, 0.0, 0 }

static inline void zs_backoff_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield" ::: "memory");
#endif
}

/* Called after each poll that found nothing: spins at first (reading the clock every 16 polls, as a poll is
 * far cheaper than a microsecond), then sleeps. `progress` is a count that grows as the awaited work moves on
 * (pieces or stages done; 0 where there is none): when it has changed, the wait spins again before it sleeps,
 * so a long operation of many quick exchanges is not slowed by the sleeps of one slow one. */
static inline void zs_backoff(struct zs_backoff *b, uint64_t progress)
{
    struct timespec ts = { 0, ZS_BACKOFF_SHORT_NS };

    if (progress != b->progress) {
        b->progress = progress;
        b->polls = 0;
        b->sleeping = false;
    }
    if (b->polls++ == 0)
        b->start = zs_now_s();
    if (!b->sleeping) {
        if (b->polls % 16 || zs_now_s() - b->start < ZS_BACKOFF_SPIN_S) {
            zs_backoff_cpu_relax();
            return;
        }
        b->sleeping = true;
    }
    if (zs_now_s() - b->start >= ZS_BACKOFF_SHORT_S)
        ts.tv_nsec = ZS_BACKOFF_LONG_NS;
    nanosleep(&ts, NULL);
}

#endif /* ZS_BACKOFF_H */
