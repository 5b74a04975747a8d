/* comm_quant.h - hierarchical collectives whose data crosses the node boundary as int8 blocks and fp32 scales
 * (kernels/quant.h; ZeRO++'s qwZ all-gather and qgZ reduce-scatter) and stays exact inside a node.
 *
 * Nodes are consecutive blocks of ranks of one size (mpirun's by-slot mapping, or ZS_FAKE_NODE_SIZE); any other
 * layout is refused at init. Two sub-communicators (MPI_Comm_split + zs_comm_init): the ranks of this node, and
 * the ranks of every node with this rank's local index (one per node, each its own node for the traffic count).
 * On one node both operations are the parent comm's exact collectives.
 *
 * all-gather: buf holds N chunks of `count` elements of dt (fp32, bf16, fp16); each rank's chunk r is its own.
 * The own chunk is quantized and all-gathered across nodes, dequantized (to dt) at the chunk's place, and the
 * node then all-gathers exactly: chunks of this node's ranks arrive bit for bit, the others as
 * dequantize(quantize(chunk)) (the same bits on every rank), within kernels/quant.h's bound.
 * reduce-scatter: buf holds N chunks of `count` of dt_in; rank r's result lands in out (dt_out, fp32 or dt_in).
 * The node's ranks first sum every chunk exactly in fp32, in rank order; each rank then quantizes its node's
 * partial sums meant for the other nodes and exchanges them with the ranks of its local index (an all-to-all);
 * the partials are summed in fp32 in node order (this node's own partial exact), times scale, rounded once to
 * dt_out. Deterministic run to run, but not equal to comm.h's exact reduction: the error per element is at most
 * the sum over the other nodes of their block scale * (1/2 + 2^-16), plus fp32 summation and the output's
 * rounding. out may be buf's chunk r (in place), as with comm.h's; buf stays untouched by the caller until the
 * wait.
 * Start, then wait: the start posts the first phase (nonblocking); the wait finishes it and runs the rest. */
#ifndef ZS_COMM_QUANT_H
#define ZS_COMM_QUANT_H

#include <stdint.h>

#include "comm.h"
#include "zeroshard.h" /* defines: zs_status, zs_dtype */

struct zs_qcomm;
struct zs_qcomm_req;

/* Collective over parent's ranks. block: elements per quantization block (0: ZS_QUANT_BLOCK_DEFAULT). */
zs_status zs_qcomm_init(struct zs_qcomm **qc, struct zs_comm *parent, int64_t block);
void zs_qcomm_free(struct zs_qcomm *qc);
/* Nodes and ranks per node, as found at init. */
int32_t zs_qcomm_nodes(const struct zs_qcomm *qc);
int32_t zs_qcomm_local_size(const struct zs_qcomm *qc);

zs_status zs_qcomm_all_gather(struct zs_qcomm *qc, void *buf, zs_dtype dt, int64_t count, struct zs_qcomm_req **req);
zs_status zs_qcomm_reduce_scatter(struct zs_qcomm *qc, const void *buf, zs_dtype dt_in, void *out, zs_dtype dt_out,
                                  int64_t count, float scale, struct zs_qcomm_req **req);
/* This rank cannot take part in the next all-gather it starts (say its chunk could not be read): the operation
 * still goes out on every phase, no data moves, and its wait returns an error on every rank, naming this rank in
 * the parent's numbering, instead of leaving the peers waiting (comm.h's zs_comm_fail_next, across both phases). */
void zs_qcomm_fail_next(struct zs_qcomm *qc);
/* Completes and frees req (an error still frees it, except buffers the network may still write). */
zs_status zs_qcomm_wait(struct zs_qcomm *qc, struct zs_qcomm_req *req);

#endif /* ZS_COMM_QUANT_H */
