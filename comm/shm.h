/* shm.h - the ranks of one node: who they are (real, or a forced layout for tests), a shared heap
 * whose blocks sit at the same offset in every rank's part (so a peer's copy of "the same buffer" is
 * found by offset), and per-operation ready/done flags in shared memory. */
#ifndef ZS_SHM_H
#define ZS_SHM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <mpi.h>

#include "zeroshard.h" /* defines: zs_status */

/* Flags are kept per operation in a ring this long. The collectives keep every operation in flight
 * within half a ring of the oldest unfinished one, so a slot is never reused while anyone reads it. */
#define ZS_SHM_FLAG_RING 1024

/* What one rank is doing in operation `seq`, published with its ready flag: the ranks of a node compare
 * these before any data moves, so a mismatch is an error rather than a silent mix of two operations. */
struct zs_shm_desc {
    uint64_t count;
    uint64_t heap_off; /* where the buffer sits in the heap (zs_shm_offset), or UINT64_MAX: a plain buffer */
    int32_t kind, dt_in, dt_out;
    int32_t failed;    /* this rank could not take part: every rank ends the operation with an error */
    int32_t purpose, unit; /* what the engine issued it for (enum zs_comm_purpose) and which unit, or -1 */
    int64_t step;      /* the engine's micro-step when it was issued: a rank that skipped zs_step differs */
};

struct zs_shm;

/* Splits `comm` into nodes: by shared memory, or, when fake_node_size > 0, into blocks of that many
 * consecutive ranks (to exercise the multi-node path on one machine). Collective over comm. */
zs_status zs_shm_init(struct zs_shm **s, MPI_Comm comm, int32_t fake_node_size);
void zs_shm_free(struct zs_shm *s);
int32_t zs_shm_local_size(const struct zs_shm *s);
int32_t zs_shm_local_rank(const struct zs_shm *s);
int32_t zs_shm_nodes(const struct zs_shm *s);
/* The local index of global rank g, or -1 when g is on another node. */
int32_t zs_shm_local_index(const struct zs_shm *s, int32_t g);

/* Heap: collective over the node: every rank of the node makes the same calls in the same order (the
 * engine does), so blocks land at the same offsets; growing the heap creates a window on the node
 * communicator. The ranks agree on every allocation before the heap changes: when any rank cannot
 * (local_ok false, say its memory budget refused, or its own bookkeeping failed), or they ask for
 * different sizes, every rank gets NULL, the error names the rank, and the heap stays as it was.
 * Test hook: ZS_TEST_SHM_FAULT=alloc:N:R (or grow:N:R) fails global rank R's N-th allocation (growth)
 * locally, as a failed malloc of its bookkeeping would. */
void *zs_shm_alloc(struct zs_shm *s, size_t bytes, bool local_ok);
void zs_shm_release(struct zs_shm *s, void *p);
uint64_t zs_shm_heap_bytes(const struct zs_shm *s);
/* The address of local peer l's copy of [p, p + bytes), or NULL when that range is not in the heap. */
const void *zs_shm_peer(const struct zs_shm *s, const void *p, size_t bytes, int32_t l);

/* Where p sits in the heap (segment index in the top 16 bits, offset below), or UINT64_MAX. */
uint64_t zs_shm_offset(const struct zs_shm *s, const void *p, size_t bytes);

/* Ready / done flags of operation `seq` (same numbering on every rank, never wrapping). post publishes
 * d (may be NULL) with the ready flag; zs_shm_peer_desc reads local peer l's, once all are posted. */
void zs_shm_post(struct zs_shm *s, uint64_t seq, const struct zs_shm_desc *d);
const struct zs_shm_desc *zs_shm_peer_desc(const struct zs_shm *s, uint64_t seq, int32_t l);
bool zs_shm_all_posted(const struct zs_shm *s, uint64_t seq);
void zs_shm_done(struct zs_shm *s, uint64_t seq);
bool zs_shm_all_done(const struct zs_shm *s, uint64_t seq);
/* For the watchdog's message: the global ranks of this node that have not posted (finished) seq. */
int32_t zs_shm_not_posted(const struct zs_shm *s, uint64_t seq, int32_t *out, int32_t max);
int32_t zs_shm_not_done(const struct zs_shm *s, uint64_t seq, int32_t *out, int32_t max);
void zs_shm_set_timeout(struct zs_shm *s, double timeout_s);
/* A local peer whose process has exited (its global rank, and its pid in *pid), or -1. */
int32_t zs_shm_gone(const struct zs_shm *s, int64_t *pid);
/* NCCL's operations, counted per rank as they are queued (comm_nccl.c): the global ranks of this node that
 * have queued fewer than this rank, for a timed-out NCCL wait's message. */
void zs_shm_nccl_count(struct zs_shm *s);
int32_t zs_shm_nccl_behind(const struct zs_shm *s, int32_t *out, int32_t max);

#endif /* ZS_SHM_H */
