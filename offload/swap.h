/* swap.h - the NVMe swapper: one file per rank under a private run directory, read and written through
 * io_uring with O_DIRECT, aligned (and, where the memlock limit allows, registered) buffers, a bounded
 * queue depth, short transfers resubmitted, EAGAIN retried, and a CRC32C per block verified on read.
 * Every error names the file, the byte offset and the errno. Functions return 0 or -errno.
 * Transfers go straight between the caller's buffer and the file (no staging copy), so the caller keeps
 * the buffer alive and unmodified until zs_swap_wait returns for its ticket. A swapper is used by one
 * thread at a time. */
#ifndef ZS_SWAP_H
#define ZS_SWAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct zs_swap;

struct zs_swap_opts {
    const char *dir;          /* directory from zs_swap_dir_create */
    const char *name;         /* file name inside it (created O_EXCL, 0600) */
    uint32_t block_size;      /* bytes per I/O (aio.block_size), a multiple of 4096 */
    uint32_t queue_depth;     /* I/Os in flight (aio.queue_depth) */
    bool direct;              /* O_DIRECT (falls back to buffered I/O, reported, where the fs refuses it) */
    bool verify;              /* keep a CRC32C per block and check it on every read */
    double timeout_s;         /* zeroshard.timeout_s / ZS_TIMEOUT: the longest a wait goes without a
                               * completion (0: 600 s); then -ETIMEDOUT and the swapper is broken */
};

/* Creates nvme_path/zeroshard-rank<R> (mode 0700, never through a symlink) holding an owner record: host,
 * boot id, pid namespace, pid and the process's start time. A leftover directory whose owner is dead
 * (checked on this host and boot: its pid gone or started at another time) is cleared (and *stale set);
 * one whose owner is alive, or lives where it cannot be checked (another host or boot, a shared file
 * system), is -EBUSY naming host and pid; an unreadable record is -EBADMSG. out receives the path only
 * once the directory is this run's (it is "" after a failure), so a caller that removes what out names
 * never removes another run's directory. */
int zs_swap_dir_create(const char *nvme_path, int rank, char *out, size_t outlen, bool *stale, char *err,
                       size_t errlen);
/* Removes the files zs_swap created in dir (regular files and symlinks, never followed) and the
 * directory itself, only if its owner record names this process (-EPERM otherwise, nothing touched). */
int zs_swap_dir_remove(const char *dir);

/* Creates dir/name and an io_uring of queue_depth entries. No io_uring is an error ("io_uring
 * unavailable: ..."), never a silent fallback. Where the filesystem refuses O_DIRECT the file is used
 * buffered and zs_swap_direct() says so, for the caller to report. */
int zs_swap_open(struct zs_swap **s, const struct zs_swap_opts *o, char *err, size_t errlen);
/* Waits for every transfer still in flight, then frees everything (the file stays, see dir_remove). */
void zs_swap_close(struct zs_swap *s);
/* Registers one caller-owned region (the pinned pool) with io_uring; transfers lying wholly inside it
 * then use read_fixed/write_fixed. Call it before any transfer. On failure (typically ENOMEM/EPERM from
 * RLIMIT_MEMLOCK) the swapper keeps working unregistered and the -errno is returned, with the reason in
 * zs_swap_error, for the caller to report. The region must outlive the swapper. */
int zs_swap_register(struct zs_swap *s, void *buf, size_t bytes);
/* Preallocates bytes of file (posix_fallocate): first-pass writes then run at full speed, and a disk
 * too small fails here, naming the file, instead of mid-step. */
int zs_swap_reserve(struct zs_swap *s, uint64_t bytes);
/* Bytes of bookkeeping the swapper holds (rings, I/O records, checksum table), for the memory report.
 * There is no staging: transfers use the caller's aligned buffers directly. */
uint64_t zs_swap_buffer_bytes(const struct zs_swap *s);
bool zs_swap_registered(const struct zs_swap *s); /* buffers registered with io_uring (read/write_fixed) */
bool zs_swap_direct(const struct zs_swap *s);     /* O_DIRECT in effect */

/* Asynchronous transfers between memory and the file at byte offset off. buf, off and bytes must be
 * multiples of 4096 (the caller pads). A transfer is split into block_size I/Os; at most queue_depth are
 * in flight across all transfers: the call issues what fits and returns at once; the rest is issued as
 * completions free records (in zs_swap_progress, zs_swap_wait, or any later call). *ticket (never 0) identifies the transfer for zs_swap_wait;
 * up to 1024 transfers may be outstanding (-EBUSY beyond). With verify, off must be a multiple of
 * block_size; a write records each block's CRC32C when it is queued, and a read must cover each block
 * exactly as it was last written (a block never written, or whose last write failed, is -EIO at
 * submission). Waiting for a write before reading the same blocks is the caller's job. */
int zs_swap_write(struct zs_swap *s, uint64_t off, const void *buf, size_t bytes, uint64_t *ticket);
int zs_swap_read(struct zs_swap *s, uint64_t off, void *buf, size_t bytes, uint64_t *ticket);
/* Reaps whatever has completed and issues more of the queued transfers, without waiting: call it now
 * and then while computing, so the disk stays busy. 0 or -errno (a broken ring). */
int zs_swap_progress(struct zs_swap *s);
/* Waits until the transfer is complete (0) or failed (-errno, message in zs_swap_error). A read whose
 * block checksum does not match fails with -EBADMSG naming file and offset. A failed transfer has still
 * finished all its I/Os; the swapper stays usable. Each ticket is waited for once (-EINVAL after). */
int zs_swap_wait(struct zs_swap *s, uint64_t ticket);
/* After a timeout (-ETIMEDOUT naming the file, read/write, offset and bytes of the oldest I/O, the time
 * waited and zeroshard.timeout_s / ZS_TIMEOUT) every call fails at once with that message, and the
 * kernel may still write into the buffers of the I/Os it holds: while this is true, the caller must
 * never free or reuse them (leaking them is the safe choice on this fatal path). */
bool zs_swap_in_flight(const struct zs_swap *s);
/* Seconds spent in zs_swap_wait since the swapper was opened. */
double zs_swap_waited(const struct zs_swap *s);
/* Waits for every outstanding transfer; returns the error of the oldest one that failed. */
int zs_swap_wait_all(struct zs_swap *s);
const char *zs_swap_error(const struct zs_swap *s);

/* The three-slot pipeline of an optimizer step over groups kept on disk (ZeRO-Infinity's sub-groups):
 * at(arg, g, &off, &bytes, &wbytes) places group g in the file; it is paged into slot[g % 3], and while fn(arg,
 * g, slot) computes on it, group g+1 is read into the next slot and g-1's first wbytes (at most bytes: what the
 * step changed) are written back from the previous one.
 * fn returns 0, or a positive code that stops the pipeline and is returned. Otherwise 0, or the -errno of
 * the first failed transfer (zs_swap_error names file and offset). Nothing is in flight on return. */
typedef void (*zs_swap_group_at)(void *arg, int32_t g, uint64_t *off, size_t *bytes, size_t *wbytes);
typedef int (*zs_swap_group_fn)(void *arg, int32_t g, char *slot);
int zs_swap_pipeline(struct zs_swap *s, int32_t ngroups, char *const slot[3], zs_swap_group_at at,
                     zs_swap_group_fn fn, void *arg);

/* Test hook: the next I/O of kind `write` (or read) that starts at or after byte offset `at` fails with
 * -err instead of reaching the disk (err = ENOSPC, EIO, ...), through the same completion path as a real
 * failure. One fault per kind, used up when it fires; err 0 clears the fault of that kind. */
void zs_swap_inject_fault(struct zs_swap *s, bool write, uint64_t at, int err);
/* Test hook: the next such I/O is sent to a pipe nobody writes and never completes (a hung disk), for
 * tests of the timeout. 0, or -errno when the pipe cannot be made. */
int zs_swap_inject_hang(struct zs_swap *s, bool write, uint64_t at);

/* Formats a message into err (when given) and returns rc: how the swapper's functions report. */
int zs_swap_msg(char *err, size_t errlen, int rc, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* CRC32C (Castagnoli) of buf, continuing from crc (start with 0): "123456789" gives 0xE3069283. */
uint32_t zs_crc32c(uint32_t crc, const void *buf, size_t bytes);
/* The same by table lookup only: the fallback, and the reference the tests hold zs_crc32c to. */
uint32_t zs_crc32c_sw(uint32_t crc, const void *buf, size_t bytes);
bool zs_crc32c_hw(void); /* zs_crc32c uses the SSE4.2 crc32 instruction on this CPU */

#endif /* ZS_SWAP_H */
