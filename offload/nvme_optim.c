/* nvme_optim.c - the pipelined optimizer step over NVMe-resident state (ZeRO-Infinity's sub-groups):
 * while the kernel updates sub-group g in slot g%3, sub-group g+1 is being read into the next slot and
 * g-1 written back from the previous one, so the step is bounded by the disk, not disk plus compute. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "kernels/convert.h" /* defines: zs_cvt_from_f32 */
#include "core/ctx.h" /* defines: struct zs_ctx (its device: the shards' uploads) */
#include "core/units.h"
#include "nvme_optim.h"
#include "swap.h"
#include "base/test_hooks.h"

#define ZS_SLOTS 3

struct zs_nvme_optim {
    struct zs_swap *swap;
    char dir[512];
    int32_t ngroups;
    int32_t *first;          /* group g is units [first[g], first[g + 1]) */
    uint64_t *unit_off;      /* a unit's state region in the file */
    uint64_t *unit_bytes;    /* its bytes */
    uint64_t *group_off, *group_bytes;
    uint64_t *group_wbytes;  /* of a group's bytes, those the step writes back: its units' regions, then come
                              * their gradient shards, which the step only reads */
    uint64_t *grad_off, *grad_bytes; /* unit u's reduced gradient shard in the file (grad_bytes 0: in memory) */
    uint64_t *unit_state;    /* bytes of one state array of unit u, 4096-aligned */
    uint64_t *unit_param;    /* bytes of unit u's fp32 masters at the head of its region (the parameter shard
                              * itself with fp32 and offload_param nvme; 0: kept in memory), block-aligned so a
                              * fetch reads whole checksummed blocks */
    uint64_t *unit_work;     /* bytes of its 16-bit working shard after them (offload_param nvme), block-aligned */
    size_t slot_bytes;
    char *slot[ZS_SLOTS];
    int32_t nslots;          /* ZS_SLOTS, or the sub-groups when fewer: the pipeline uses slot g % 3 for group g */
    uint64_t file_bytes;
    /* Gradient shards on their way to the file during backward, each from a slot (the step's slots are idle
     * then): the write in flight from each slot, and the slot the next one takes. */
    uint64_t grad_ticket[ZS_SLOTS];
    int32_t grad_next;
    /* Stage-3 parameter shards read ahead of their fetch (offload_param.buffer_count buffers). */
    int32_t nring;
    size_t ring_bytes;
    struct ring_buf {
        char *buf;
        int32_t unit;        /* -1: free */
        uint64_t ticket;     /* the read in flight, 0 once waited for */
        uint64_t age;
        struct zs_dev_event *up; /* its last upload (dev set) */
        bool uploading;      /* that upload may still read buf: no read lands in it before it is done */
    } *ring;
    /* A device the host cannot read in place: a fetch uploads the shard from its buffer instead of copying it
     * (NULL on the CPU, where the gathered unit is host memory). */
    struct zs_device *dev;
    uint64_t clock;
    bool working;            /* the shards on disk are the working parameters, read at each fetch */
    zs_dtype pdt;            /* theirs */
    char desc[1536];         /* room for the directory (512), the registration note (256) and the rest */
};

static uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

static bool params_on_disk(const struct zs_config *cfg)
{
    return cfg->zero.stage == 3 && cfg->zero.offload_param.device == ZS_OFFLOAD_NVME;
}

/* fp32 masters in the swap file: the parameter shards themselves (offload_param nvme, fp32), or the
 * masters of 16-bit parameters, which stay with the optimizer state they are updated with. */
static bool master_on_disk(const struct zs_config *cfg, const struct zs_nvme_unit *un)
{
    bool fp32 = cfg->param_dtype == ZS_DTYPE_FP32;

    return (fp32 && params_on_disk(cfg) && un->sharded) || (!fp32 && !un->frozen); /* frozen: no masters */
}

/* A 16-bit working shard in the swap file after the masters (offload_param nvme): what a fetch reads, and what
 * the step's kernel writes the rounding of the updated masters into, in the same slot. */
static bool work_on_disk(const struct zs_config *cfg, const struct zs_nvme_unit *un)
{
    return cfg->param_dtype != ZS_DTYPE_FP32 && params_on_disk(cfg) && un->sharded;
}

/* Where in unit u's region a fetch reads the working shard, and how many bytes (0: not on disk). */
static uint64_t fetch_bytes(const struct zs_nvme_optim *n, int32_t u, uint64_t *at)
{
    *at = n->unit_work[u] ? n->unit_param[u] : 0;
    return !n->working ? 0 : n->unit_work[u] ? n->unit_work[u] : n->pdt == ZS_DTYPE_FP32 ? n->unit_param[u] : 0;
}

static void free_layout(struct zs_nvme_optim *n)
{
    free(n->first);
    free(n->unit_off);
    free(n->unit_bytes);
    free(n->group_wbytes);
    free(n->grad_off);
    free(n->grad_bytes);
    free(n->unit_state);
    free(n->group_off);
    free(n->group_bytes);
    free(n->unit_param);
    free(n->unit_work);
    free(n->ring);
}

/* The file's regions and sub-groups for these units, and what the pool needs: ZS_SLOTS slots of the largest
 * sub-group (one per sub-group when there are fewer), and with offload_param nvme buffer_count read-ahead
 * buffers of the largest unit's working shard. A sub-group is its units' regions, then their gradient shards
 * when those live in the file too (read with the state, never written back by the step). */
static zs_status layout(struct zs_nvme_optim *n, const struct zs_config *cfg, int32_t nunits,
                        const struct zs_nvme_unit *units, size_t *pool_bytes)
{
    uint64_t block = (uint64_t)cfg->aio.block_size, off = 0, group_elems = 0;
    int64_t limit = cfg->zero.sub_group_size;
    int k = zs_config_state_arrays(cfg);

    n->first = calloc((size_t)nunits + 1, sizeof(int32_t));
    n->unit_off = calloc((size_t)nunits, sizeof(uint64_t));
    n->unit_bytes = calloc((size_t)nunits, sizeof(uint64_t));
    n->unit_state = calloc((size_t)nunits, sizeof(uint64_t));
    n->group_off = calloc((size_t)nunits, sizeof(uint64_t));
    n->group_bytes = calloc((size_t)nunits, sizeof(uint64_t));
    n->group_wbytes = calloc((size_t)nunits, sizeof(uint64_t));
    n->grad_off = calloc((size_t)nunits, sizeof(uint64_t));
    n->grad_bytes = calloc((size_t)nunits, sizeof(uint64_t));
    n->unit_param = calloc((size_t)nunits, sizeof(uint64_t));
    n->unit_work = calloc((size_t)nunits, sizeof(uint64_t));
    if (!n->first || !n->unit_off || !n->unit_bytes || !n->unit_state || !n->group_off || !n->group_bytes ||
        !n->group_wbytes || !n->grad_off || !n->grad_bytes || !n->unit_param || !n->unit_work)
        return zs_fail(ZS_ERR_NOMEM, "offload: out of memory");
    /* Units join the current sub-group while it stays within sub_group_size elements (0: one unit each);
     * a unit larger than that is a sub-group of its own. Regions are block-aligned for the checksums.
     * With offload_param nvme a sharded unit's region starts with its parameter shard (fp32), or its masters
     * and then its 16-bit shard. */
    for (int32_t u = 0; u < nunits; u++) {
        int64_t sh = units[u].shard;
        if (master_on_disk(cfg, &units[u]))
            n->unit_param[u] = align_up((uint64_t)sh * 4, block);
        if (work_on_disk(cfg, &units[u]))
            n->unit_work[u] = align_up((uint64_t)sh * zs_dtype_bytes(cfg->param_dtype), block);
        if (!units[u].frozen)
            n->grad_bytes[u] = align_up((uint64_t)sh * units[u].grad_elem, block);
        int arrays = units[u].frozen ? 0 : k; /* a frozen unit has no optimizer state */
        n->unit_bytes[u] = n->unit_param[u] + n->unit_work[u] +
                           align_up(align_up((uint64_t)sh * 4, 4096) * (uint64_t)arrays, block);
        bool counts = n->unit_bytes[u] || !units[u].frozen; /* a frozen unit with nothing in the file does not */
        if (u == 0 || (counts && group_elems + (uint64_t)sh > (uint64_t)limit)) {
            n->first[n->ngroups++] = u;
            group_elems = 0;
        }
        n->unit_state[u] = arrays ? align_up((uint64_t)sh * 4, 4096) : 0;
        group_elems += counts ? (uint64_t)sh : 0;
    }
    n->first[n->ngroups] = nunits;
    for (int32_t g = 0; g < n->ngroups; g++) {
        n->group_off[g] = off;
        for (int32_t u = n->first[g]; u < n->first[g + 1]; u++) {
            n->unit_off[u] = off;
            off += n->unit_bytes[u];
        }
        n->group_wbytes[g] = off - n->group_off[g];
        for (int32_t u = n->first[g]; u < n->first[g + 1]; u++) {
            n->grad_off[u] = off;
            off += n->grad_bytes[u];
        }
        n->group_bytes[g] = off - n->group_off[g];
        n->slot_bytes = n->group_bytes[g] > n->slot_bytes ? n->group_bytes[g] : n->slot_bytes;
    }
    n->file_bytes = off;
    n->working = params_on_disk(cfg);
    n->pdt = cfg->param_dtype;
    for (int32_t u = 0; u < nunits; u++) {
        uint64_t at, b = fetch_bytes(n, u, &at);
        n->ring_bytes = b > n->ring_bytes ? b : n->ring_bytes;
    }
    if (n->ring_bytes && n->working) {
        n->nring = (int32_t)cfg->zero.offload_param.buffer_count;
        n->ring = calloc((size_t)n->nring, sizeof(*n->ring));
        if (!n->ring)
            return zs_fail(ZS_ERR_NOMEM, "offload: out of memory");
    }
    n->nslots = n->ngroups < ZS_SLOTS ? n->ngroups : ZS_SLOTS;
    *pool_bytes = (size_t)n->nslots * n->slot_bytes + (size_t)n->nring * n->ring_bytes;
    return ZS_OK;
}

zs_status zs_nvme_optim_plan(struct zs_ctx *ctx, struct zs_nvme_optim **out, size_t *pool_bytes)
{
    struct zs_nvme_optim *n = calloc(1, sizeof(*n));
    struct zs_nvme_unit *units = calloc((size_t)ctx->nunits, sizeof(*units));
    zs_status st;

    if (!n || !units) {
        free(n);
        free(units);
        return zs_fail(ZS_ERR_NOMEM, "offload: out of memory");
    }
    for (int32_t u = 0; u < ctx->nunits; u++)
        units[u] = (struct zs_nvme_unit){.shard = ctx->units[u].part.shard, .frozen = ctx->units[u].frozen,
                                         .sharded = zs_unit_is_sharded(ctx, &ctx->units[u]),
                                         .grad_elem = ctx->plan.grads_nvme ? (uint32_t)ctx->csz : 0};
    st = layout(n, &ctx->cfg, ctx->nunits, units, pool_bytes);
    free(units);
    if (st) {
        zs_nvme_optim_close(n, ctx->rank, true);
        return st;
    }
    *out = n;
    return ZS_OK;
}

zs_status zs_nvme_optim_size(const struct zs_config *cfg, int32_t nunits, const struct zs_nvme_unit *units,
                             uint64_t *pool_bytes, uint64_t *file_bytes, uint64_t *param_bytes)
{
    struct zs_nvme_optim n;
    size_t pool = 0;

    memset(&n, 0, sizeof(n));
    zs_status st = layout(&n, cfg, nunits, units, &pool);
    *pool_bytes = pool;
    *file_bytes = n.file_bytes;
    *param_bytes = st ? 0 : zs_nvme_optim_param_bytes(&n, nunits);
    free_layout(&n);
    return st;
}

static zs_status io_fail(struct zs_nvme_optim *n, int rc, const char *what)
{
    return zs_fail(rc == -ENOSPC || rc == -EIO || rc == -EBADMSG ? ZS_ERR_IO : ZS_ERR_IO, "offload: %s: %s", what,
                   n->swap ? zs_swap_error(n->swap) : strerror(-rc));
}

/* The state starts at zero, as in memory: write the zeroed first slot over every group's region. */
static zs_status zero_fill(struct zs_nvme_optim *n)
{
    for (int32_t g = 0; g < n->ngroups; g++) {
        uint64_t t;
        int rc = zs_swap_write(n->swap, n->group_off[g], n->slot[0], n->group_bytes[g], &t);
        if (!rc)
            rc = zs_swap_wait(n->swap, t);
        if (rc)
            return io_fail(n, rc, "initialising the optimizer state file");
    }
    return ZS_OK;
}

/* Test hook, for fault-injection tests of the whole program: ZS_TEST_SWAP_FAULT=write:ENOSPC:OFFSET
 * (or read:EIO:OFFSET) makes that I/O of the optimizer swap file fail as a real one would;
 * read:HANG:OFFSET (or write:) makes it never complete, as on a hung disk, for the watchdog. */
static void fault_hook(struct zs_nvme_optim *n)
{
    const char *f = getenv(ZS_TEST_HOOK_SWAP_FAULT);
    char kind[8], name[16];
    unsigned long long at;

    if (!f || sscanf(f, "%7[a-z]:%15[A-Z]:%llu", kind, name, &at) != 3)
        return;
    int err = !strcmp(name, "ENOSPC") ? ENOSPC : !strcmp(name, "EIO") ? EIO : EFAULT;
    if (!strcmp(name, "HANG"))
        zs_swap_inject_hang(n->swap, !strcmp(kind, "write"), at);
    else
        zs_swap_inject_fault(n->swap, !strcmp(kind, "write"), at, err);
}

zs_status zs_nvme_optim_open(struct zs_ctx *ctx, struct zs_nvme_optim *n, char *slots)
{
    const struct zs_offload_config *o = &ctx->cfg.zero.offload_optimizer;
    struct zs_swap_opts so = { .name = "optimizer.swap", .block_size = (uint32_t)ctx->cfg.aio.block_size,
                               .queue_depth = (uint32_t)ctx->cfg.aio.queue_depth, .direct = true, .verify = true };
    char err[512], reg[256] = "registered buffers";
    bool stale = false;
    struct zs_comm_opts co;
    int rc;

    /* the watchdog's deadline, as the comm gets it: ZS_TIMEOUT overrides zeroshard.timeout_s */
    so.timeout_s = ctx->cfg.zs.timeout_s;
    if (zs_comm_opts_from_env(&co, err, sizeof(err)) == 0 && co.timeout_env)
        so.timeout_s = co.timeout_s;
    for (int s = 0; s < n->nslots; s++)
        n->slot[s] = slots + (size_t)s * n->slot_bytes;
    for (int32_t i = 0; i < n->nring; i++) {
        n->ring[i].buf = slots + (size_t)n->nslots * n->slot_bytes + (size_t)i * n->ring_bytes;
        n->ring[i].unit = -1;
    }
    if (!ctx->dev.host_access && n->nring) {
        n->dev = &ctx->dev;
        for (int32_t i = 0; i < n->nring; i++) {
            zs_status st = n->dev->ops->event_create(n->dev, &n->ring[i].up);
            if (st) {
                zs_error_prefix("zs_setup: offload_param nvme, the uploads' events");
                return st;
            }
        }
    }
    rc = zs_swap_dir_create(o->nvme_path, ctx->rank, n->dir, sizeof(n->dir), &stale, err, sizeof(err));
    if (rc)
        return zs_fail(ZS_ERR_IO, "zero_optimization.offload_optimizer.nvme_path: %s", err);
    so.dir = n->dir;
    rc = zs_swap_open(&n->swap, &so, err, sizeof(err));
    if (rc)
        return zs_fail(ZS_ERR_IO, "offload: %s", err);
    rc = zs_swap_reserve(n->swap, n->file_bytes);
    if (rc)
        return io_fail(n, rc, "reserving the optimizer state file");
    fault_hook(n);
    if (zs_swap_register(n->swap, slots, (size_t)n->nslots * n->slot_bytes + (size_t)n->nring * n->ring_bytes))
        snprintf(reg, sizeof(reg), "unregistered buffers (%s)", zs_swap_error(n->swap));
    snprintf(n->desc, sizeof(n->desc), "%s/optimizer.swap%s, %.1f MiB in %d sub-group%s, %s, %s, CRC32C per %u-byte block%s",
             n->dir, n->nring ? " (with the parameter shards)" : "", (double)n->file_bytes / (1 << 20), n->ngroups,
             n->ngroups == 1 ? "" : "s",
             zs_swap_direct(n->swap) ? "O_DIRECT" : "buffered (the filesystem refused O_DIRECT)", reg, so.block_size,
             stale ? "; a stale directory from a dead run was cleared" : "");
    return zero_fill(n);
}

bool zs_nvme_optim_close(struct zs_nvme_optim *n, int rank, bool quiet)
{
    bool held;

    (void)rank;
    (void)quiet;
    if (!n)
        return false;
    held = zs_swap_in_flight(n->swap);
    if (n->swap)
        zs_swap_close(n->swap);
    /* n->dir is set only once the directory is ours (a refused run has ""), and dir_remove checks the
     * owner record again: a run refused at set-up never removes the live owner's files */
    if (n->dir[0])
        zs_swap_dir_remove(n->dir); /* a clean exit leaves nothing behind */
    for (int32_t i = 0; n->dev && n->ring && i < n->nring; i++)
        if (n->ring[i].up) /* an upload still queued finishes first: CUDA frees a pending event once it is done */
            n->dev->ops->event_free(n->dev, n->ring[i].up);
    free_layout(n);
    free(n);
    return held;
}

const char *zs_nvme_optim_describe(const struct zs_nvme_optim *n)
{
    return n->desc;
}

uint64_t zs_nvme_optim_file_bytes(const struct zs_nvme_optim *n)
{
    return n ? n->file_bytes : 0;
}

uint64_t zs_nvme_optim_param_bytes(const struct zs_nvme_optim *n, int32_t nunits)
{
    uint64_t b = 0, at;

    for (int32_t u = 0; n && u < nunits; u++)
        b += fetch_bytes(n, u, &at);
    return b;
}

uint64_t zs_nvme_optim_grad_bytes(const struct zs_nvme_optim *n, int32_t nunits)
{
    uint64_t b = 0;

    for (int32_t u = 0; n && u < nunits; u++)
        b += n->grad_bytes[u];
    return b;
}

/* Elements the kernel runs between two looks at the disk: small enough that the swapper issues the next
 * I/Os long before the queue drains, large enough that the pool's threads stay busy. */
#define ZS_STEP_CHUNK (1 << 20)

struct step_job {
    struct zs_ctx *ctx;
    struct zs_nvme_optim *n;
    zs_unit_state_fn fn;
    void *arg;
};

static void group_at(void *arg, int32_t g, uint64_t *off, size_t *bytes, size_t *wbytes)
{
    const struct step_job *j = arg;

    *off = j->n->group_off[g];
    *bytes = j->n->group_bytes[g];
    *wbytes = j->n->group_wbytes[g];
}

/* Unit u's arrays in its region paged in at `region`: masters (NULL unless on disk), 16-bit working shard
 * (NULL unless on disk), then the optimizer's state. */
static void unit_arrays(const struct zs_nvme_optim *n, int32_t u, char *region, float **p, void **w, float **s1,
                        float **s2)
{
    *p = n->unit_param[u] ? (float *)region : NULL;
    *w = n->unit_work[u] ? region + n->unit_param[u] : NULL;
    *s1 = (float *)(region + n->unit_param[u] + n->unit_work[u]);
    *s2 = (float *)((char *)*s1 + n->unit_state[u]);
}

/* The kernel over one sub-group in its slot, in chunks with a look at the disk between them. Returns a
 * zs_status (positive) to stop the pipeline. */
static int run_group(void *arg, int32_t g, char *base)
{
    const struct step_job *j = arg;
    struct zs_nvme_optim *n = j->n;

    for (int32_t u = n->first[g]; u < n->first[g + 1]; u++) {
        float *p, *s1, *s2;
        void *w, *grad = n->grad_bytes[u] ? base + (n->grad_off[u] - n->group_off[g]) : NULL;
        unit_arrays(n, u, base + (n->unit_off[u] - n->group_off[g]), &p, &w, &s1, &s2);
        int64_t len = j->ctx->units[u].frozen ? 0 : j->ctx->units[u].part.shard;
        for (int64_t b = 0; b < len; b += ZS_STEP_CHUNK) {
            j->fn(j->ctx, u, p, w, s1, s2, grad, b, b + ZS_STEP_CHUNK < len ? b + ZS_STEP_CHUNK : len, j->arg);
            int rc = zs_swap_progress(n->swap);
            if (rc)
                return io_fail(n, rc, "optimizer step");
        }
    }
    return ZS_OK;
}

zs_status zs_nvme_optim_step(struct zs_ctx *ctx, struct zs_nvme_optim *n, zs_unit_state_fn fn, void *arg)
{
    struct step_job job = {ctx, n, fn, arg};
    zs_status st;
    int rc;

    /* The step rewrites the parameter shards: shards read ahead before it would be stale. It reads the
     * gradient shards: every write of them lands first. */
    st = zs_nvme_param_drop(n);
    if (!st)
        st = zs_nvme_grads_settle(n);
    if (st)
        return st;
    rc = zs_swap_pipeline(n->swap, n->ngroups, n->slot, group_at, run_group, &job);
    return rc > 0 ? (zs_status)rc : rc < 0 ? io_fail(n, rc, "optimizer step") : ZS_OK;
}

/* ---------------------------------------------------------------- one unit at a time (checkpoints) */

/* The slots are the gradient writes' during backward, and slot 0 is these calls' outside a step: a call that
 * takes it waits for the gradient writes first. */
static uint64_t unit_region(const struct zs_nvme_optim *n, int32_t u)
{
    return n->unit_bytes[u];
}

zs_status zs_nvme_unit_load(struct zs_nvme_optim *n, int32_t u, float **p, void **w, float **s1, float **s2)
{
    uint64_t t;
    zs_status st = zs_nvme_param_drop(n);
    int rc;

    if (!st)
        st = zs_nvme_grads_settle(n);
    if (st)
        return st;
    unit_arrays(n, u, n->slot[0], p, w, s1, s2);
    if (!unit_region(n, u)) /* a frozen unit with nothing in the file */
        return ZS_OK;
    rc = zs_swap_read(n->swap, n->unit_off[u], n->slot[0], unit_region(n, u), &t);
    if (!rc)
        rc = zs_swap_wait(n->swap, t);
    return rc ? io_fail(n, rc, "reading a unit's optimizer state") : ZS_OK;
}

zs_status zs_nvme_unit_store(struct zs_nvme_optim *n, int32_t u)
{
    uint64_t t;
    int rc = 0;

    if (!unit_region(n, u))
        return ZS_OK; /* (zs_nvme_unit_load settled the gradient writes before it filled slot 0) */
    rc = zs_swap_write(n->swap, n->unit_off[u], n->slot[0], unit_region(n, u), &t);
    if (!rc)
        rc = zs_swap_wait(n->swap, t);
    return rc ? io_fail(n, rc, "writing a unit's optimizer state") : ZS_OK;
}

/* ---------------------------------------------------------------- stage-3 parameter shards */

static zs_status ring_settle(struct zs_nvme_optim *n, struct ring_buf *b, const char *what)
{
    int rc = 0;

    if (b->ticket)
        rc = zs_swap_wait(n->swap, b->ticket);
    b->ticket = 0;
    if (rc) {
        b->unit = -1;
        return io_fail(n, rc, what);
    }
    return ZS_OK;
}

double zs_nvme_waited(const struct zs_nvme_optim *n)
{
    return n ? zs_swap_waited(n->swap) : 0.0;
}

zs_status zs_nvme_param_drop(struct zs_nvme_optim *n)
{
    zs_status st = ZS_OK;

    for (int32_t i = 0; i < n->nring; i++) {
        zs_status s2 = ring_settle(n, &n->ring[i], "reading a parameter shard ahead");
        st = st ? st : s2;
        n->ring[i].unit = -1;
    }
    return st;
}

/* Whether b may be read into: its last upload to the device is done (wait: waited for first, which waits
 * for what its stream held before it, not for anything queued after). */
static zs_status ring_idle(struct zs_nvme_optim *n, struct ring_buf *b, bool wait, bool *idle)
{
    zs_status st;

    *idle = !b->uploading;
    if (*idle)
        return ZS_OK;
    if (wait) {
        st = n->dev->ops->event_sync(n->dev, b->up);
        *idle = !st;
    } else {
        st = n->dev->ops->event_query(n->dev, b->up, idle);
    }
    if (st) {
        zs_error_prefix("offload: waiting for the upload of a parameter shard");
        return st;
    }
    b->uploading = !*idle;
    return ZS_OK;
}

static struct ring_buf *ring_find(struct zs_nvme_optim *n, int32_t u)
{
    for (int32_t i = 0; i < n->nring; i++)
        if (n->ring[i].unit == u)
            return &n->ring[i];
    return NULL;
}

/* A free buffer whose last upload is done, or (evict = true) one made free: a buffer still uploading, waited
 * for (rather than dropping a shard read ahead, which its fetch would then read again), else the oldest read
 * ahead, settled and dropped. NULL when none is free and !evict. */
static struct ring_buf *ring_take(struct zs_nvme_optim *n, bool evict, zs_status *st)
{
    struct ring_buf *old = NULL, *busy = NULL;
    bool idle;

    *st = ZS_OK;
    for (int32_t i = 0; i < n->nring; i++) {
        struct ring_buf *b = &n->ring[i];
        if (b->unit >= 0) { /* holds a read ahead: never uploading, that comes after its fetch took it */
            old = !old || b->age < old->age ? b : old;
            continue;
        }
        if ((*st = ring_idle(n, b, false, &idle)))
            return NULL;
        if (idle)
            return b;
        busy = busy ? busy : b;
    }
    if (!evict || (!busy && !old))
        return NULL;
    if (busy) {
        *st = ring_idle(n, busy, true, &idle);
        return *st ? NULL : busy;
    }
    *st = ring_settle(n, old, "reading a parameter shard ahead");
    old->unit = -1;
    return *st ? NULL : old;
}

static zs_status ring_issue(struct zs_nvme_optim *n, struct ring_buf *b, int32_t u)
{
    uint64_t at, bytes = fetch_bytes(n, u, &at);
    int rc = zs_swap_read(n->swap, n->unit_off[u] + at, b->buf, bytes, &b->ticket);

    if (rc) {
        b->ticket = 0;
        return io_fail(n, rc, "reading a parameter shard");
    }
    b->unit = u;
    b->age = ++n->clock;
    return ZS_OK;
}

bool zs_nvme_params_in_file(const struct zs_nvme_optim *n, int32_t u)
{
    return n && n->unit_param[u] + n->unit_work[u] != 0;
}

bool zs_nvme_param_on_disk(const struct zs_nvme_optim *n, int32_t u)
{
    uint64_t at;

    return n && fetch_bytes(n, u, &at) != 0;
}

zs_status zs_nvme_param_ahead(struct zs_nvme_optim *n, int32_t u, bool *queued)
{
    struct ring_buf *b;
    zs_status st;

    *queued = false;
    if (!zs_nvme_param_on_disk(n, u) || ring_find(n, u))
        return ZS_OK;
    b = ring_take(n, false, &st);
    if (!b)
        return ZS_OK;
    st = ring_issue(n, b, u);
    *queued = !st;
    return st;
}

/* b's shard up to dst (device memory) on s, the stream that reads dst next: behind what s holds, so it cannot
 * land in a gathered block while s still reads the unit that had the block before, and before what s is given
 * next (the gather). Asynchronous: b stays busy until its event says the copy is done. */
static zs_status ring_upload(struct zs_nvme_optim *n, struct ring_buf *b, void *dst, size_t bytes,
                             struct zs_dev_stream *s)
{
    struct zs_device *d = n->dev;
    zs_status st = d->ops->copy(d, dst, b->buf, bytes, ZS_COPY_H2D, s);

    if (!st)
        st = d->ops->event_record(d, b->up, s);
    if (st) {
        zs_error_prefix("offload: uploading a parameter shard");
        return st;
    }
    b->uploading = true;
    return ZS_OK;
}

zs_status zs_nvme_param_read(struct zs_nvme_optim *n, int32_t u, void *dst, size_t bytes, struct zs_dev_stream *s)
{
    struct ring_buf *b = ring_find(n, u);
    zs_status st = ZS_OK;

    if (!b) {
        b = ring_take(n, true, &st);
        if (!b)
            return st ? st : zs_fail(ZS_ERR_INVALID, "offload: no parameter read-ahead buffer");
        st = ring_issue(n, b, u);
    }
    if (!st) /* the host's one wait: the data from the disk, which the copy below reads */
        st = ring_settle(n, b, "reading a parameter shard");
    if (!st && n->dev)
        st = ring_upload(n, b, dst, bytes, s);
    else if (!st)
        memcpy(dst, b->buf, bytes);
    b->unit = -1;
    return st;
}

zs_status zs_nvme_param_write(struct zs_nvme_optim *n, int32_t u, const float *src, int64_t count)
{
    char *buf = n->slot[0]; /* outside a step the slots are free */
    size_t head = n->unit_param[u] + n->unit_work[u];
    zs_status st = zs_nvme_param_drop(n);
    uint64_t t;
    int rc;

    if (!st)
        st = zs_nvme_grads_settle(n);
    if (st)
        return st;
    memset(buf, 0, head);
    if (n->unit_param[u])
        memcpy(buf, src, (size_t)count * sizeof(float));
    if (n->unit_work[u]) /* rounded as set-up rounds the working copy in memory */
        zs_cvt_from_f32(buf + n->unit_param[u], (int)n->pdt, src, count);
    rc = zs_swap_write(n->swap, n->unit_off[u], buf, head, &t);
    if (!rc)
        rc = zs_swap_wait(n->swap, t);
    return rc ? io_fail(n, rc, "writing a parameter shard") : ZS_OK;
}

/* ---------------------------------------------------------------- gradient shards (ZeRO-Infinity) */

bool zs_nvme_grads_on_disk(const struct zs_nvme_optim *n, int32_t u)
{
    return n && n->grad_bytes[u] != 0;
}

zs_status zs_nvme_grads_settle(struct zs_nvme_optim *n)
{
    int rc = 0;

    for (int s = 0; n && s < ZS_SLOTS; s++) {
        int r = n->grad_ticket[s] ? zs_swap_wait(n->swap, n->grad_ticket[s]) : 0;
        n->grad_ticket[s] = 0;
        rc = rc ? rc : r;
    }
    return rc ? io_fail(n, rc, "writing a gradient shard") : ZS_OK;
}

/* Read from the file synchronously into buf (the caller's slot). */
static zs_status grad_read(struct zs_nvme_optim *n, int32_t u, char *buf)
{
    uint64_t t;
    int rc = zs_swap_read(n->swap, n->grad_off[u], buf, n->grad_bytes[u], &t);

    if (!rc)
        rc = zs_swap_wait(n->swap, t);
    return rc ? io_fail(n, rc, "reading a gradient shard") : ZS_OK;
}

zs_status zs_nvme_grad_slot(struct zs_nvme_optim *n, int32_t u, bool load, void **buf)
{
    int32_t s = n->grad_next;
    int rc = n->grad_ticket[s] ? zs_swap_wait(n->swap, n->grad_ticket[s]) : 0;

    n->grad_ticket[s] = 0;
    if (rc)
        return io_fail(n, rc, "writing a gradient shard");
    *buf = n->slot[s];
    return load ? grad_read(n, u, n->slot[s]) : ZS_OK;
}

zs_status zs_nvme_grad_write(struct zs_nvme_optim *n, int32_t u, const void *buf)
{
    int32_t s = n->grad_next;
    int rc;

    if (buf != n->slot[s])
        return zs_fail(ZS_ERR_INVALID, "offload: a gradient shard written from outside its slot");
    rc = zs_swap_write(n->swap, n->grad_off[u], buf, n->grad_bytes[u], &n->grad_ticket[s]);
    if (rc) {
        n->grad_ticket[s] = 0;
        return io_fail(n, rc, "writing a gradient shard");
    }
    n->grad_next = (s + 1) % n->nslots;
    return ZS_OK;
}

zs_status zs_nvme_grad_read(struct zs_nvme_optim *n, int32_t u, void **buf)
{
    zs_status st = zs_nvme_grads_settle(n);

    *buf = n->slot[0];
    return st ? st : grad_read(n, u, n->slot[0]);
}
