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

/* Flags are kept per operation in a ring this long; more operations than this in flight wait. */
#define ZS_SHM_FLAG_RING 1024

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

/* Heap: collective over the node in the sense that every rank of the node makes the same calls in the
 * same order (the engine does), so blocks land at the same offsets; growing the heap creates a window
 * on the node communicator. */
void *zs_shm_alloc(struct zs_shm *s, size_t bytes);
void zs_shm_release(struct zs_shm *s, void *p);
uint64_t zs_shm_heap_bytes(const struct zs_shm *s);
/* The address of local peer l's copy of [p, p + bytes), or NULL when that range is not in the heap. */
const void *zs_shm_peer(const struct zs_shm *s, const void *p, size_t bytes, int32_t l);

/* Ready / done flags of operation `seq` (same numbering on every rank). */
void zs_shm_post(struct zs_shm *s, uint64_t seq);
bool zs_shm_all_posted(const struct zs_shm *s, uint64_t seq);
void zs_shm_done(struct zs_shm *s, uint64_t seq);
bool zs_shm_all_done(const struct zs_shm *s, uint64_t seq);

#endif /* ZS_SHM_H */
