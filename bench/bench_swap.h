/* bench_swap.h - zs-bench swap's parts, internal to it: the arguments, helpers, output and driver
 * (bench_swap.c), the bandwidth against fio (bench_swap_bw.c), the optimizer step over NVMe (bench_swap_step.c). */
#ifndef ZS_BENCH_SWAP_H
#define ZS_BENCH_SWAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "offload/swap.h" /* defines: struct zs_swap */

#define XFER_BYTES ((int64_t)64 << 20) /* one transfer: what one zs_swap_write/read call moves */
#define MAX_BUFS 16
#define SLOTS 3 /* as offload/nvme_optim.c */

enum op { OP_WRITE_NEW, OP_WRITE, OP_READ, OP_COUNT };
enum impl { IMPL_ZS, IMPL_FIO, IMPL_COUNT };
enum step_impl { STEP_MEM, STEP_DISK, STEP_NVME, STEP_COUNT };

extern const char *const swap_op_names[OP_COUNT];
extern const char *const swap_impl_names[IMPL_COUNT];
extern const char *const swap_step_names[STEP_COUNT];

struct swap_args {
    const char *dir;
    int64_t size, block_size, step_n, step_group;
    int queue_depth, reps;
    bool verify, fio, require_fio, step;
};

struct swap_bench {
    const struct swap_args *a;
    char run_dir[512], fio_path[600], fio_file[1200], fio_json[600], fio_version[64]; /* fio_file: escaped */
    bool have_fio, stale;
    bool direct;  /* the bandwidth swapper runs O_DIRECT */
    bool unlike;  /* it fell back to buffered I/O: no comparison with fio --direct=1 */
    struct zs_swap *sw;
    char *buf; /* nbuf transfers of xfer bytes, one registered region */
    size_t xfer;
    int nbuf;
    char reg[512]; /* "registered", or why not */
    double secs[IMPL_COUNT][OP_COUNT]; /* best of the reps; INFINITY: not measured */
    double step_secs[STEP_COUNT];
    int64_t step_n;
};

#define UNLIKE_WHY "zeroshard fell back to buffered I/O here (the file system refused O_DIRECT) and fio runs " \
                   "--direct=1: the page cache against the disk is not a like-for-like comparison"

/* helpers (bench_swap.c) */
uint64_t swap_align_up(uint64_t x, uint64_t a);
/* 2 MiB-aligned, transparent huge pages asked for (direct I/O wants page-aligned buffers); NULL on failure;
 * free(). */
void *swap_page_alloc(size_t bytes);
/* Whether bytes fit in 80% of the physical memory. */
bool swap_fits_in_memory(double bytes);
/* Prints the swapper's last error (sw, or the bandwidth swapper when NULL). */
void swap_report(const struct swap_bench *b, struct zs_swap *sw);
double swap_gbs(const struct swap_bench *b, double secs);
void swap_keep_best(double *best, double t);

/* the bandwidth against fio (bench_swap_bw.c) */
void swap_fio_escape(char *dst, size_t len, const char *src);
void swap_fio_probe(struct swap_bench *b);
int swap_bw_open(struct swap_bench *b);
void swap_bw_close(struct swap_bench *b);
int swap_bw_check_like(struct swap_bench *b);
int swap_bw_run(struct swap_bench *b);
const char *swap_io_mode(const struct swap_bench *b, enum impl m);

/* the optimizer step over NVMe (bench_swap_step.c): timed and printed; step_n set when it ran */
int swap_step_bench(struct swap_bench *b);

#endif /* ZS_BENCH_SWAP_H */
