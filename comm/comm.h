/* comm.h - the collective interface the engine uses: nonblocking reduce-scatter, all-gather and
 * all-reduce (fp32, bf16, fp16 with fp32 accumulation) with a fixed summation order, plus the blocking
 * helpers init needs.
 * Determinism contract: element i of a reduction is ((x_0 + x_1) + ... + x_{N-1}) * scale, summed in
 * rank order, whatever the size, piece size or backend; all-reduce is reduce-scatter followed by
 * all-gather, bit for bit. Later backends (shared memory, NCCL) implement the same contract. */
#ifndef ZS_COMM_H
#define ZS_COMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <mpi.h>

#include "zeroshard.h" /* defines: zs_status */

struct zs_comm;
struct zs_comm_req;

/* Backends: MPI point-to-point between every pair of ranks, or shared memory between the ranks of a
 * node (zero-copy for buffers from zs_comm_alloc) with MPI point-to-point to ranks on other nodes. */
enum zs_comm_mode { ZS_COMM_AUTO, ZS_COMM_MPI, ZS_COMM_SHM };

/* Ten minutes, NCCL's default: long enough for a slow checkpoint or a swapped-in unit on one rank, short
 * enough that a stopped job is noticed the same hour. */
#define ZS_TIMEOUT_DEFAULT 600.0

struct zs_comm_opts {
    enum zs_comm_mode mode;
    int32_t fake_node_size; /* > 0: pretend every block of this many consecutive ranks is a node */
    double timeout_s;       /* how long any wait may last (0: ZS_TIMEOUT_DEFAULT) */
    bool timeout_env;       /* timeout_s came from ZS_TIMEOUT (which overrides the config) */
    const char *flight_dir; /* the flight recorder's directory (NULL: ZS_FLIGHT_DIR or the default) */
    const char *name;       /* a second comm of the same ranks: its flight file is flight-rankN-NAME.txt */
    /* A comm over some of the program's ranks (hybrid sharding's group and replicas): its rank j is named in
     * errors as rank name_base + j * name_stride of the program (name_stride 0: as its own rank j). */
    int32_t name_base, name_stride;
};

/* Reads ZS_COMM (auto, mpi, shm), ZS_FAKE_NODE_SIZE and ZS_TIMEOUT (seconds, > 0); 0, or -EINVAL naming
 * the bad variable in err. */
int zs_comm_opts_from_env(struct zs_comm_opts *o, char *err, size_t errlen);

/* Collective over parent. opts may be NULL (automatic). */
zs_status zs_comm_init(struct zs_comm **c, MPI_Comm parent, const struct zs_comm_opts *opts);
/* "mpi", "shm" (one node) or "shm+mpi" (several nodes), with the node layout, for the start-up line. */
const char *zs_comm_describe(const struct zs_comm *c);
/* Memory for buffers that collectives read from other ranks: from the node's shared heap with the shm
 * backend (every rank must make the same calls in the same order), else plain aligned memory.
 * Zero-filled. zs_comm_release frees it. */
void *zs_comm_alloc(struct zs_comm *c, size_t bytes);
/* The same, when this rank may already know it cannot allocate (local_ok false: its memory budget said
 * no). The ranks of a node agree before the shared heap changes: if any cannot, every rank gets NULL
 * (the error names the rank; none is set on the rank that refused, which has its own reason). */
void *zs_comm_alloc_agreed(struct zs_comm *c, size_t bytes, bool local_ok);
void zs_comm_release(struct zs_comm *c, void *p);
void zs_comm_free(struct zs_comm *c);
int32_t zs_comm_rank(const struct zs_comm *c);
int32_t zs_comm_size(const struct zs_comm *c);
MPI_Comm zs_comm_mpi(const struct zs_comm *c);
/* Bytes of scratch the backend holds now (communication buffers), for the memory report. */
uint64_t zs_comm_scratch_bytes(const struct zs_comm *c);
/* Whether zs_comm_alloc_agreed's buffers are in the node's shared heap (else the C heap). */
bool zs_comm_shared(const struct zs_comm *c);
/* Ranks on this rank's node (real or forced layout). */
int32_t zs_comm_local_size(const struct zs_comm *c);
int32_t zs_comm_local_rank(const struct zs_comm *c);

/* buf holds N chunks of `count` elements; rank r's result (sum over ranks of chunk r, times scale)
 * lands in out[0..count). out may be buf + r*count (in place). */
zs_status zs_comm_reduce_scatter(struct zs_comm *c, const float *buf, float *out, int64_t count,
                                 float scale, struct zs_comm_req **req);
/* buf holds N chunks of `count`; this rank's chunk buf + r*count is sent to every rank, and every
 * other chunk is filled from its owner. */
zs_status zs_comm_all_gather(struct zs_comm *c, float *buf, int64_t count, struct zs_comm_req **req);
/* buf holds N chunks of `count`; every chunk becomes the scaled sum (reduce-scatter + all-gather). */
zs_status zs_comm_all_reduce(struct zs_comm *c, float *buf, int64_t count, float scale,
                             struct zs_comm_req **req);

/* The same with 16-bit data: inputs of dt_in (fp32, bf16 or fp16) are summed in fp32, in rank order, and
 * the scaled sum is written as dt_out (fp32, or dt_in rounded to nearest even). All-gather and
 * all-reduce keep their dtype. */
zs_status zs_comm_reduce_scatter_dt(struct zs_comm *c, const void *buf, zs_dtype dt_in, void *out, zs_dtype dt_out,
                                    int64_t count, float scale, struct zs_comm_req **req);
zs_status zs_comm_all_gather_dt(struct zs_comm *c, void *buf, zs_dtype dt, int64_t count, struct zs_comm_req **req);
zs_status zs_comm_all_reduce_dt(struct zs_comm *c, void *buf, zs_dtype dt, int64_t count, float scale,
                                struct zs_comm_req **req);

/* Integer sums, for the deterministic mode's exact gradient sums (sharding/exact.c): int64 elements added
 * modulo 2^64, so that every order, backend and number of ranks gives the same bits. The same layout and
 * in-place rule as zs_comm_reduce_scatter; ZS_COMM_INT64 is the dtype its descriptor carries. */
#define ZS_COMM_INT64 ((zs_dtype)8)
zs_status zs_comm_reduce_scatter_i64(struct zs_comm *c, const int64_t *buf, int64_t *out, int64_t count,
                                     struct zs_comm_req **req);

/* What the engine issued an operation for: carried in its descriptor, compared across ranks before any
 * data moves, and named in errors and the flight recorder. */
enum zs_comm_purpose {
    ZS_PURPOSE_NONE,
    ZS_PURPOSE_FETCH,   /* stage 3: gathering a unit's parameters */
    ZS_PURPOSE_GRAD,    /* reducing a unit's gradients */
    ZS_PURPOSE_GATHER,  /* stages 1-2: the step's gather of updated parameters */
    ZS_PURPOSE_NORM,    /* the step's gradient-norm exchange */
    ZS_PURPOSE_SETUP,   /* start-up exchanges */
    ZS_PURPOSE_PREEMPT, /* the vote on stopping (zs_preempt_requested) */
    ZS_PURPOSE_PROGRAM, /* the program's own sums (zs_allreduce_sum) */
};
const char *zs_comm_purpose_name(int32_t p);

/* The next operation launched is for `what` on `unit` (-1: none). The step is sticky: every operation
 * from now on carries it, so ranks at different micro-steps disagree at their next operation. */
void zs_comm_label_next(struct zs_comm *c, enum zs_comm_purpose what, int32_t unit);
void zs_comm_set_step(struct zs_comm *c, int64_t step);

/* This rank cannot take part in the next operation it launches (say its input could not be read): the
 * operation still takes its place in the call order and tells every peer, no data moves, and its wait
 * returns an error on every rank instead of leaving the peers waiting. */
void zs_comm_fail_next(struct zs_comm *c);

/* Every operation is checked across ranks before its data moves: a different kind, dtype or count at
 * the same place in the call order, or a shared-heap buffer on one rank of a node and a plain one (or
 * another heap offset) on another, ends it with an error on every rank naming both sides. An error
 * after data was posted leaves the comm unusable (later calls say why); nothing the network or a peer
 * may still write is freed. */

/* Every wait (zs_comm_wait, the window, the blocking helpers) ends after opts.timeout_s with ZS_ERR_COMM
 * and one message naming the operation, how long it waited and the ranks that had not arrived; and
 * sooner, naming the rank, when a peer on this node has exited. The comm is unusable afterwards. */

/* Whether an operation failed after its data was posted, leaving c unusable (an operation that every rank
 * agreed to end before any data moved, such as one that differed between ranks, leaves it usable). */
bool zs_comm_broken(const struct zs_comm *c);

/* Advances every outstanding request of c (explicit progress: the engine calls this from its API). */
zs_status zs_comm_progress(struct zs_comm *c);
zs_status zs_comm_test(struct zs_comm *c, struct zs_comm_req *req, bool *done);
/* Completes and frees req. */
zs_status zs_comm_wait(struct zs_comm *c, struct zs_comm_req *req);

/* Blocking helpers for set-up and statistics, under the watchdog. allgather_bytes is an operation like
 * the others (checked across ranks, labelled with zs_comm_label_next), so a rank that reaches it while
 * another issues something else gets an error naming both. */
zs_status zs_comm_bcast(struct zs_comm *c, void *buf, int64_t bytes, int32_t root);
zs_status zs_comm_allgather_bytes(struct zs_comm *c, const void *mine, void *all, int32_t bytes);
/* Waits for a nonblocking MPI call for at most timeout_s (for exchanges outside the collectives: the
 * start-up votes, the shared heap's); with live (may be NULL), also until a rank of that node exits. */
struct zs_shm;
zs_status zs_mpi_wait_timeout(MPI_Request *r, double timeout_s, int32_t rank, const char *what,
                              const struct zs_shm *live);
/* The flight recorder (flight.h) of this rank; zs_comm_flight_dump writes it now. */
struct zs_flight *zs_comm_flight(const struct zs_comm *c);
void zs_comm_flight_dump(struct zs_comm *c, const char *why);

/* The process's traffic: bytes of collective payload this rank handed to ranks on other nodes
 * (cross_node) and on its own node (intra_node), summed over every zs_comm of the process since it
 * started; a rank's node is the layout of the comm that carried the bytes (real or forced; the MPI
 * backend puts every rank on a node of its own). MPI sends are counted where they are posted; a
 * shared-memory peer's read of this rank's buffer (or this rank's write into the peer's) counts as
 * sent by this rank. The operations' check headers (sizeof(struct op_header) per remote peer) are
 * counted apart in *header_bytes (may be NULL); set-up broadcasts and NCCL's transfers are not counted. */
void zs_comm_traffic(uint64_t *cross_node, uint64_t *intra_node, uint64_t *header_bytes);

#endif /* ZS_COMM_H */
