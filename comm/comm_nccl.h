/* comm_nccl.h - the NCCL transport for buffers in GPU memory (built with the CUDA backend): a communicator
 * bootstrapped over MPI, reduce-scatter and all-gather queued on its own communication stream. Two
 * reductions: ZS_NCCL_FAST is NCCL's own reduce-scatter (its summation order, the fastest), and
 * ZS_NCCL_ORDERED moves the chunks with grouped send/recv and sums them in rank order with
 * kernels/comm_cuda.cu, so a GPU reduction gives comm/comm.c's bits. All-reduce is reduce-scatter then
 * all-gather, as on the CPU, so stage 0 equals stages 1-3. The engine (comm/coll.c) uses the ordered mode
 * when every rank has a GPU of its own, the fast one when zeroshard.device_comm says "nccl" (comm_nccl_none.c
 * stands in without the CUDA backend). */
#ifndef ZS_COMM_NCCL_H
#define ZS_COMM_NCCL_H

#include <stddef.h>
#include <stdint.h>
#include <mpi.h>

#include "zeroshard.h" /* defines: zs_status, zs_dtype */

struct zs_nccl;
struct zs_comm;

enum zs_nccl_mode { ZS_NCCL_FAST, ZS_NCCL_ORDERED };

/* Collective over comm. The calling thread's current CUDA device is the rank's GPU (device_cuda.c picks it
 * from the node-local rank). libnccl is loaded here, at run time, so a build with the CUDA backend still
 * runs where NCCL is absent; its absence, or two ranks on one GPU, is an error naming the cause. watch (may
 * be NULL: ZS_TIMEOUT_DEFAULT, no ranks named) is the CPU collectives' comm of the same ranks: its timeout
 * is every NCCL wait's, its node's shared memory counts each rank's NCCL operations and tells a dead peer.
 * No wait lasts longer than the timeout: then, on an asynchronous NCCL error, or when a peer on this node
 * has exited, the communicator is aborted and the error names the operation, how long it waited and the
 * node's ranks that had not queued it; every later call fails, and zs_nccl_free aborts instead of waiting.
 * A failure of the set-up on one rank (no libnccl, rank 0's ncclGetUniqueId, its stream, events or staging
 * buffer) fails it on every rank at once, the others naming that rank, before any rank enters NCCL's own
 * set-up (which, blocking before NCCL 2.14, has no deadline). */
zs_status zs_nccl_init(struct zs_nccl **n, MPI_Comm comm, enum zs_nccl_mode mode, struct zs_comm *watch);
/* Collective over comm: whether two ranks share a GPU, by the (PCI bus id, host) pairs of the ranks' current
 * devices, whatever each rank's CUDA_VISIBLE_DEVICES: the first such ranks in *a < *b and their GPU in gpu,
 * or *a = *b = -1 when every rank has a GPU of its own. Under watch's deadline, as zs_nccl_init's exchanges. */
zs_status zs_nccl_shared_gpu(MPI_Comm comm, struct zs_comm *watch, int32_t *a, int32_t *b, char *gpu, size_t len);
void zs_nccl_free(struct zs_nccl *n);
/* The communication stream (a cudaStream_t). Work queued here starts after what the compute stream had
 * queued when the collective was called (an event orders them); zs_nccl_sync waits for all of it. */
void *zs_nccl_stream(struct zs_nccl *n);
zs_status zs_nccl_sync(struct zs_nccl *n);
/* For a caller polling its own event on the stream, after it said not ready: the deadline counted from
 * `since` (zs_now_s), the asynchronous error and the node's liveness, as zs_nccl_sync checks them. */
zs_status zs_nccl_poll(struct zs_nccl *n, double since, const char *what);

/* The staging buffer, allocated once at set-up and counted in the memory plan: nranks pieces of
 * zs_nccl_piece_bytes, ZS_NCCL_STAGE_BYTES shared among the ranks, each piece kept within 64 KiB .. 4 MiB so a
 * send is neither tiny nor the buffer large on a few ranks (ZS_TEST_NCCL_PIECE sets the piece in tests). The
 * ordered mode, and the nccl mode's 16-bit inputs, walk their chunks in pieces of that size. */
#define ZS_NCCL_STAGE_BYTES ((uint64_t)32 << 20)
size_t zs_nccl_piece_bytes(int32_t nranks);
uint64_t zs_nccl_stage_bytes(int32_t nranks);

/* The piece without the test knob (comm_nccl_none.c's too). */
static inline size_t zs_nccl_piece_default(int32_t nranks)
{
    uint64_t p = ZS_NCCL_STAGE_BYTES / (uint64_t)(nranks > 0 ? nranks : 1) / 256 * 256;

    return (size_t)(p < (64u << 10) ? (64u << 10) : p > (4u << 20) ? (4u << 20) : p);
}

/* buf: N chunks of count elements of dt_in; out: rank r's chunk of the sum, times scale, as dt_out (fp32 or
 * dt_in). FAST mode sums 16-bit inputs in fp32 (widened first) and rounds once to dt_out. after: a
 * cudaStream_t whose queued work the collective waits for (NULL: none). */
zs_status zs_nccl_reduce_scatter(struct zs_nccl *n, const void *buf, zs_dtype dt_in, void *out, zs_dtype dt_out,
                                 int64_t count, float scale, void *after);
/* buf: N chunks of count elements of dt; this rank's chunk goes to every rank. */
zs_status zs_nccl_all_gather(struct zs_nccl *n, void *buf, zs_dtype dt, int64_t count, void *after);
zs_status zs_nccl_all_reduce(struct zs_nccl *n, void *buf, zs_dtype dt, int64_t count, float scale, void *after);

#endif /* ZS_COMM_NCCL_H */
