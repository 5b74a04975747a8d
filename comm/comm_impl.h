/* comm_impl.h - what the two halves of the collectives share: the request and comm structures, the tag
 * layout, and the functions of comm_guard.c (what keeps the ranks in step: the cross-rank check of every
 * operation, failures that free nothing still pending, the test hooks). Internal to comm/. */
#ifndef ZS_COMM_IMPL_H
#define ZS_COMM_IMPL_H

#include <stdbool.h>
#include <stdint.h>
#include <mpi.h>

#include "comm.h"
#include "shm.h" /* defines: ZS_SHM_FLAG_RING, struct zs_shm_desc */

#define ZS_COMM_PIECE_DEFAULT (1 << 18) /* elements per peer per piece: 1 MiB of fp32 */
#define ZS_COMM_AG_PIECE (1 << 24)      /* all-gather messages stay well inside int counts */
#define ZS_COMM_SLOTS 2                 /* reduce-scatter pieces in flight per request */
#define ZS_COMM_HOST_LEN 64             /* a host name as the watchdog prints it (longer ones cut) */
#define ZS_TAG_PIECES_MAX 4096
/* Every operation launched lies within this many sequence numbers of the oldest unfinished one (not
 * merely this many unfinished operations: one slow operation may be followed by thousands of quick
 * ones). Half the flag ring, so a slot is reused only when no rank can still read its old value; the
 * same window gives every operation in flight its own block of MPI tags. */
#define ZS_COMM_WINDOW (ZS_SHM_FLAG_RING / 2)

enum req_kind { REQ_RS, REQ_AG, REQ_AR };
enum req_stage { ST_CHECK, ST_RS_RUN, ST_RS_DRAIN, ST_AG_START, ST_AG_RUN, ST_AG_DRAIN, ST_DONE };

struct scratch {
    struct scratch *next;
    float *data;
};

struct rs_slot {
    bool active;
    int64_t off, len;
    struct scratch *tmp;  /* taken when the request is set up, so starting a piece cannot fail */
    int64_t piece;
    MPI_Request *mr; /* receive, send per peer reached by MPI */
    int nmr;
};

/* What a rank sends its remote peers before an operation's data: the MPI path's zs_shm_desc. */
struct op_header {
    uint64_t seq;
    struct zs_shm_desc d;
    int32_t node_bad, unused; /* ranks of the sender's node disagreed: the sender ends the operation */
};

struct zs_comm_req {
    struct zs_comm_req *next;
    enum req_kind kind;
    enum req_stage stage;
    uint64_t seq;          /* tag block and flag index, agreed by all ranks through call order; never wraps */
    struct op_header hdr;  /* this rank's side of the operation */
    struct op_header *hdr_in; /* one per remote peer, in rank order */
    MPI_Request *hreq;     /* header receives, then sends */
    int nremote;
    bool hdr_sent;
    bool local_check;      /* local peers' descriptors are compared through the shared flags */
    bool clean;            /* ended before any data was posted: nothing can still touch it */
    int32_t bad_peer;      /* a local peer (global rank) found to differ, or this rank when it failed; else -1 */
    const char *src;       /* reduce-scatter input: N chunks of count elements of dt_in */
    char *out, *gbuf;      /* its output (dt_out); the all-gather buffer (dt_out) */
    zs_dtype dt_in, dt_out;
    size_t esz_in, esz_out;
    int64_t count, next_off;
    int64_t piece;         /* elements per peer per piece: the comm's, halved for 8-byte elements */
    int64_t next_piece;
    float scale;
    struct rs_slot slot[ZS_COMM_SLOTS];
    MPI_Request *agr;
    int nagr;
    bool shm;              /* local peers are read from the shared heap */
    bool remote;           /* some peer is reached by MPI */
    bool posted_seen, copied;
    bool launched;
    const char **peer;     /* by global rank: that local peer's copy of the buffer, else NULL */
    zs_status err;
};

/* ZS_TEST_COMM_FAULT=SITE:SEQ:RANK[,...]: test hook making operation SEQ fail on global rank RANK at
 * SITE: "new" (before anything is set up), "attach" (finding peers' copies of the buffer) or
 * "progress" (the first advance after its data was posted, as a failing MPI call would); or, for the
 * watchdog's tests, stop the rank there with SIGSTOP ("stop") or kill it with SIGKILL ("die"). */
enum fault_site { FAULT_NONE, FAULT_NEW, FAULT_ATTACH, FAULT_PROGRESS, FAULT_STOP, FAULT_DIE };
#define ZS_COMM_FAULTS 4

struct comm_fault {
    enum fault_site site;
    uint64_t seq;
};

struct zs_comm {
    MPI_Comm comm;
    int32_t rank, size;
    int64_t piece;
    int tag_ub, tag_pieces; /* tags: ZS_COMM_WINDOW blocks of tag_pieces (header + pieces) */
    uint64_t seq;
    uint64_t moves;        /* stages and pieces completed: a wait that sees it grow spins again (base/backoff.h) */
    int32_t in_flight;
    bool fail_next;        /* zs_comm_fail_next: publish the next operation as failed */
    zs_status broken;      /* an operation failed after posting data: its peers cannot be trusted to match */
    char broken_why[1024];
    bool broken_dumped;    /* the flight recorder was written for that failure */
    struct comm_fault fault[ZS_COMM_FAULTS];
    bool faults;           /* any test fault planted on this rank */
    int32_t nremote;       /* ranks reached only by MPI (not on this rank's node) */
    struct scratch *free_scratch;
    uint64_t scratch_bytes;
    struct zs_comm_req *active;
    struct zs_comm_req *dead; /* failed with sends or receives still pending: kept, never freed */
    struct zs_shm *shm;    /* NULL with the MPI backend */
    char desc[160];
    double timeout_s;      /* the watchdog's deadline for any one wait */
    int32_t next_purpose, next_unit; /* zs_comm_label_next, for the next operation only */
    int64_t step;          /* zs_comm_set_step */
    struct zs_flight *flight; /* this rank's flight recorder (NULL: none) */
    int32_t name_base, name_stride; /* zs_comm_opts: how errors name this comm's ranks */
    char (*hosts)[ZS_COMM_HOST_LEN]; /* each rank's host (MPI_Get_processor_name): the watchdog names a lost host */
};

/* Comm rank j as the watchdog's messages name it (the program's rank, for a comm over some of its ranks). */
static inline int32_t zs_comm_rank_name(const struct zs_comm *c, int32_t j)
{
    return c->name_stride > 0 && j >= 0 ? c->name_base + j * c->name_stride : j;
}

/* One wait's watchdog: when it began, when the peers' liveness was last checked. */
struct zs_watch {
    double start, live_at;
    uint32_t polls;
};

/* Operations in flight differ modulo ZS_COMM_WINDOW, so their blocks never overlap; an operation and
 * the one a window later share a block, but every rank posts the older one's messages first, and MPI
 * matches messages of one source, tag and communicator in the order they were posted. Pieces of one
 * operation that share a tag are ordered the same way. */
static inline int header_tag(const struct zs_comm *c, uint64_t seq)
{
    return (int)(seq % ZS_COMM_WINDOW * (uint64_t)c->tag_pieces);
}

static inline int piece_tag(const struct zs_comm *c, uint64_t seq, int64_t piece)
{
    return header_tag(c, seq) + 1 + (int)((uint64_t)piece % (uint64_t)(c->tag_pieces - 1));
}

/* comm_watch.c */
void zs_watch_start(struct zs_watch *w);
/* Called on every poll of a wait for q: ZS_OK, or ZS_ERR_COMM once the deadline passed or a local peer
 * has exited, with the message set and the comm marked broken. */
zs_status zs_comm_watch(struct zs_comm *c, struct zs_watch *w, struct zs_comm_req *q);
/* Waits for a nonblocking MPI call (the blocking helpers) under the watchdog. */
zs_status zs_comm_mpi_wait(struct zs_comm *c, MPI_Request *r, const char *what);
void zs_comm_op_text(char *b, size_t n, const struct zs_comm *c, const struct zs_comm_req *q);

/* comm_guard.c */
zs_status zs_comm_mpi_fail(int rc, const char *what, int peer);
void zs_comm_hooks_from_env(struct zs_comm *c);
bool zs_comm_fault_find(struct zs_comm *c, enum fault_site site, uint64_t seq);

/* True (once) when the test hook says operation seq fails here; one test when no hook is set. */
static inline bool zs_comm_fault_hit(struct zs_comm *c, enum fault_site site, uint64_t seq)
{
    return c->faults && zs_comm_fault_find(c, site, seq);
}
zs_status zs_comm_tags_plan(struct zs_comm *c);
const char *zs_comm_kind_name(int32_t kind);
bool zs_comm_is_remote(const struct zs_comm *c, int32_t j);
zs_status zs_comm_post_headers(struct zs_comm *c, struct zs_comm_req *q);
zs_status zs_comm_check_progress(struct zs_comm *c, struct zs_comm_req *q, bool *done);
bool zs_comm_req_quiesce(struct zs_comm_req *q);
zs_status zs_comm_broken_fail(const struct zs_comm *c);
void zs_comm_mark_broken(struct zs_comm *c, zs_status st);

/* comm_pieces.c */
bool zs_comm_is_local(const struct zs_comm_req *q, int32_t j);
struct scratch *zs_comm_scratch_get(struct zs_comm *c);
void zs_comm_scratch_put(struct zs_comm *c, struct scratch *s);
/* One pass over q's reduce-scatter pieces (block: until each is in); zs_comm_rs_finished once all are. */
zs_status zs_comm_rs_progress(struct zs_comm *c, struct zs_comm_req *q, bool block);
bool zs_comm_rs_finished(const struct zs_comm_req *q);
int64_t zs_comm_ag_pieces(const struct zs_comm_req *q);
zs_status zs_comm_ag_start(struct zs_comm *c, struct zs_comm_req *q, uint64_t seq);
zs_status zs_comm_ag_progress(struct zs_comm *c, struct zs_comm_req *q, uint64_t seq, bool block, bool *done);
void zs_comm_local_reduce(struct zs_comm_req *q);

/* comm_req.c */
/* Frees the failed requests whose sends and receives have all ended since. */
void zs_comm_reap_dead(struct zs_comm *c);

/* comm.c: adds bytes this rank sends to global rank peer of c to the process's traffic (zs_comm_traffic);
 * header: an operation's check header (counted apart). */
void zs_comm_count(const struct zs_comm *c, int32_t peer, uint64_t bytes);
void zs_comm_count_header(uint64_t bytes);

#endif /* ZS_COMM_IMPL_H */
