/* exact_state.h - sharding/'s own: deterministic mode's state (zeroshard.deterministic "world_size_invariant"):
 * the exact gradient counters, their communicators, and the norm's exact sum of squares. */
#ifndef ZS_EXACT_STATE_H
#define ZS_EXACT_STATE_H

#include <stdbool.h>
#include <stdint.h>
#include <mpi.h>

#define ZS_EXACT_SQ_BANDS 22 /* 32-bit bands of the norm's exact sum of squares */

struct zs_comm;
struct zs_comm_req;

/* One unit's part: its counters start at element off * 3 of acc, its elements' top bands at element off of
 * top and vote. */
struct zs_exact_unit {
    int64_t off, deposits;          /* element offset; micro-shards deposited this window */
    bool bad;                       /* some deposited value was Inf or NaN */
    bool failed;                    /* its reduce-scatter ended with an error on every rank (err) */
    int32_t phase;                  /* at the boundary: which of the sum's collectives is in flight: */
    MPI_Request req;                /* the vote or the all-gather, */
    struct zs_comm_req *sumq;       /* or the sums' reduce-scatter */
};

struct zs_exact {
    struct zs_exact_unit *units;    /* one per unit, in the context's order */
    int32_t *acc;                   /* exact gradient counters, 3 per element, in sum's heap (the sums'
                                     * reduce-scatter reads local peers' in place) */
    int8_t *top;                    /* each element's top band this window, -1 before any nonzero value */
    int8_t *vote;                   /* the agreed top bands, every element (units vote while others sum) */
    int64_t numel;                  /* elements of acc, top and vote (the padded model) */
    MPI_Comm comm[2];               /* the tops' votes, stage 0's all-gathers */
    int32_t ncomm;                  /* of comm, duplicated so far */
    struct zs_comm *sum;            /* the sums' reduce-scatters (int64, zero-copy inside a node) */
    uint64_t sq[ZS_EXACT_SQ_BANDS]; /* the norm's exact counters, this rank's shards so far */
    bool anybad;                    /* some unit's agreed sum is not finite */
    uint64_t order;                 /* a hash of this window's zs_grad_ready order (units' sums start in it) */
    char err[640];                  /* the first sum of this window that every rank ended with an error */
};

#endif /* ZS_EXACT_STATE_H */
