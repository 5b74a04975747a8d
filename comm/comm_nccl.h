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

#include <stdint.h>
#include <mpi.h>

#include "zeroshard.h" /* defines: zs_status, zs_dtype */

struct zs_nccl;

enum zs_nccl_mode { ZS_NCCL_FAST, ZS_NCCL_ORDERED };

/* Collective over comm. The calling thread's current CUDA device is the rank's GPU (device_cuda.c picks it
 * from the node-local rank). libnccl is loaded here, at run time, so a build with the CUDA backend still
 * runs where NCCL is absent; its absence, or two ranks on one GPU, is an error naming the cause. */
zs_status zs_nccl_init(struct zs_nccl **n, MPI_Comm comm, enum zs_nccl_mode mode);
void zs_nccl_free(struct zs_nccl *n);
/* The communication stream (a cudaStream_t). Work queued here starts after what the compute stream had
 * queued when the collective was called (an event orders them); zs_nccl_sync waits for all of it. */
void *zs_nccl_stream(struct zs_nccl *n);
zs_status zs_nccl_sync(struct zs_nccl *n);

/* buf: N chunks of count elements of dt_in; out: rank r's chunk of the sum, times scale, as dt_out (fp32 or
 * dt_in). FAST mode sums 16-bit inputs in fp32 (widened first) and rounds once to dt_out. after: a
 * cudaStream_t whose queued work the collective waits for (NULL: none). */
zs_status zs_nccl_reduce_scatter(struct zs_nccl *n, const void *buf, zs_dtype dt_in, void *out, zs_dtype dt_out,
                                 int64_t count, float scale, void *after);
/* buf: N chunks of count elements of dt; this rank's chunk goes to every rank. */
zs_status zs_nccl_all_gather(struct zs_nccl *n, void *buf, zs_dtype dt, int64_t count, void *after);
zs_status zs_nccl_all_reduce(struct zs_nccl *n, void *buf, zs_dtype dt, int64_t count, float scale, void *after);

#endif /* ZS_COMM_NCCL_H */
