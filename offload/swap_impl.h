/* swap_impl.h - the swapper's state, shared by its I/O engine (swap.c) and its set-up and queries
 * (swap_open.c). Internal to offload/swap*.c. */
#ifndef ZS_SWAP_IMPL_H
#define ZS_SWAP_IMPL_H

#include <liburing.h> /* defines: struct io_uring */
#include <stdbool.h>
#include <stdint.h>

#include "swap.h" /* defines: zs_swap_msg, zs_crc32c */

#define SWAP_ALIGN 4096u
#define SWAP_TICKETS 1024u          /* outstanding transfers; slot = ticket % SWAP_TICKETS */
#define SWAP_MAX_QD 4096u
#define SWAP_MAX_BLOCK (1u << 30)
#define SWAP_REG_CHUNK (1ull << 30) /* the kernel takes at most 1 GiB per registered buffer */
#define SWAP_RETRIES 1000           /* consecutive -EAGAIN on one I/O (or refused submits) before giving up */
#define BLOCK_FAILED UINT32_MAX     /* blk.len: the block's last write failed, its CRC means nothing */
#define SWAP_TIMEOUT_DEFAULT 600.0  /* the comm's default (ZS_TIMEOUT_DEFAULT), for a caller that gives none */
#define SWAP_POLL_NS 100000000L     /* one bounded wait for a completion: 0.1 s, then the deadline is checked */

/* One I/O in flight; its address is the SQE's user_data. off0/buf0/len0 stay the whole I/O (what the
 * CRC covers); off/buf/len shrink as short transfers are resubmitted. */
struct io_rec {
    struct io_rec *next; /* free list, or the queue of injected failures */
    uint64_t ticket;
    uint64_t off0, off;
    char *buf0, *buf;
    uint32_t len0, len;
    uint32_t retries;
    int res; /* an injected failure's result */
    bool write;
    bool busy; /* issued and not completed: what a timeout names and must not reuse */
};

struct xfer {
    uint64_t id;
    uint32_t pending; /* I/Os issued and not completed yet */
    char *buf;        /* the whole transfer; I/Os are issued from it as records come free */
    uint64_t off;
    size_t bytes, issued;
    bool write;
    bool active;      /* issued and not yet waited on */
    int err;          /* the first failure; the others of the transfer add nothing the caller can use */
    char *msg;
};

struct blk {
    uint32_t crc, len; /* len 0: never written */
};

struct fault {
    uint64_t at;
    int err;
    bool hang; /* the I/O is sent to a pipe nobody writes, so it never completes */
};

struct zs_swap {
    double waited;  /* seconds spent in zs_swap_wait, for the step-time breakdown */
    struct io_uring ring;
    int fd;
    uint32_t block_size, qd;
    bool direct, verify;
    int broken; /* the ring failed or a wait timed out: every later call returns it with the first message */
    double timeout_s; /* the watchdog: the longest a wait may go without a completion */
    int hang_fd[2];   /* the test hook's pipe (-1 when unused) */
    struct io_rec *recs, *free_recs, *faulted;
    uint32_t inflight; /* records in use, injected failures included */
    uint64_t next_ticket;
    struct xfer xfers[SWAP_TICKETS];
    struct blk *blocks;
    size_t nblocks;
    uintptr_t reg_base;
    size_t reg_bytes;
    struct fault fault[2]; /* [false] reads, [true] writes */
    char path[4096];
    char err[1024];
};

#define swap_fail(s, rc, ...) zs_swap_msg((s)->err, sizeof((s)->err), (rc), __VA_ARGS__)

#endif /* ZS_SWAP_IMPL_H */
