/* memory.c - the accounted allocator: device memory (or the device's arena), the shared heap collectives read
 * in place, the host pool; the device budget that admits each device allocation; the bucket's sizing. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "base/error.h"
#include "comm/comm.h" /* defines: zs_comm_alloc_agreed, zs_comm_release */
#include "ctx.h"
#include "host_pool.h" /* defines: zs_host_pool_alloc */
#include "memory.h"

/* The counters change under mem_lock, for the memory watcher's thread: bytes (negative: freed) in category cat,
 * of them `host` in the host pool and `shared` in the node's shared heap. */
static void count(struct zs_ctx *ctx, enum zs_mem_cat cat, int64_t bytes, int64_t host, int64_t shared)
{
    pthread_mutex_lock(&ctx->mem_lock);
    ctx->mem[cat] += (uint64_t)bytes;
    ctx->mem_host += (uint64_t)host;
    ctx->mem_shared += (uint64_t)shared;
    if (cat == ZS_MEM_LIVE && ctx->mem[cat] > ctx->peak_live)
        ctx->peak_live = ctx->mem[cat];
    pthread_mutex_unlock(&ctx->mem_lock);
}

/* p (NULL: a failed allocation) counted in its category; the peak of the gathered units is kept too. */
static void *counted(struct zs_ctx *ctx, enum zs_mem_cat cat, void *p, uint64_t bytes)
{
    if (p)
        count(ctx, cat, (int64_t)bytes, 0, 0);
    return p;
}

/* From the device arena where the device has one (setup.c: open_arena), else one device allocation. */
static void *device_alloc(struct zs_ctx *ctx, enum zs_mem_cat cat, uint64_t bytes, enum zs_mem_fill fill)
{
    void *p;

    if (!zs_budget_admit(ctx, bytes, zs_mem_cat_names[cat]))
        return NULL;
    if (ctx->dev_arena.open) {
        p = zs_dev_arena_alloc(&ctx->dev_arena, (int32_t)cat, bytes, fill == ZS_FILL_ZERO);
        ctx->over_budget = !p; /* the arena's message names the region and the sizes */
    } else {
        p = ctx->dev.ops->alloc(&ctx->dev, (size_t)bytes);
    }
    return counted(ctx, cat, p, bytes);
}

void *zs_mem_alloc(struct zs_ctx *ctx, enum zs_mem_cat cat, uint64_t bytes)
{
    return device_alloc(ctx, cat, bytes, ZS_FILL_ZERO);
}

void *zs_mem_alloc_fill(struct zs_ctx *ctx, struct zs_comm *comm, enum zs_mem_cat cat, uint64_t bytes,
                        enum zs_mem_fill fill)
{
    if (!ctx->dev.host_access) /* peers reach device buffers through the collectives' staging, not in place */
        return device_alloc(ctx, cat, bytes, fill);
    /* The budget is this rank's; the shared heap is the node's: a refusal here is put to the node, so
     * that no peer allocates (or grows the heap, a collective) without this rank. */
    bool admitted = zs_budget_admit(ctx, bytes, zs_mem_cat_names[cat]);
    void *p = zs_comm_alloc_agreed(comm, (size_t)bytes, admitted);

    if (p)
        count(ctx, cat, (int64_t)bytes, 0, zs_comm_shared(comm) ? (int64_t)bytes : 0);
    return p;
}

void *zs_mem_alloc_on(struct zs_ctx *ctx, struct zs_comm *comm, enum zs_mem_cat cat, uint64_t bytes)
{
    return zs_mem_alloc_fill(ctx, comm, cat, bytes, ZS_FILL_ZERO);
}

void *zs_mem_alloc_comm(struct zs_ctx *ctx, enum zs_mem_cat cat, uint64_t bytes)
{
    return zs_mem_alloc_on(ctx, ctx->comm, cat, bytes);
}

void zs_mem_free_on(struct zs_ctx *ctx, struct zs_comm *comm, enum zs_mem_cat cat, void *p, uint64_t bytes)
{
    if (!p)
        return;
    if (!ctx->dev.host_access) {
        zs_mem_free(ctx, cat, p, bytes);
        return;
    }
    zs_comm_release(comm, p);
    count(ctx, cat, -(int64_t)bytes, 0, zs_comm_shared(comm) ? -(int64_t)bytes : 0);
}

void zs_mem_free_comm(struct zs_ctx *ctx, enum zs_mem_cat cat, void *p, uint64_t bytes)
{
    zs_mem_free_on(ctx, ctx->comm, cat, p, bytes);
}

void zs_mem_free(struct zs_ctx *ctx, enum zs_mem_cat cat, void *p, uint64_t bytes)
{
    if (!p)
        return;
    if (!ctx->dev_arena.open)
        ctx->dev.ops->free(&ctx->dev, p);
    else if (zs_dev_arena_free(&ctx->dev_arena, (int32_t)cat, p, bytes) && !ctx->quiet)
        zs_log("rank %d: warning: %s", ctx->rank, zs_last_error()); /* an engine bug; the arena frees it at finalize */
    count(ctx, cat, -(int64_t)bytes, 0, 0);
}

void *zs_mem_alloc_host(struct zs_ctx *ctx, enum zs_mem_cat cat, uint64_t bytes)
{
    void *p = zs_host_pool_alloc(ctx->host, bytes);

    if (p)
        count(ctx, cat, (int64_t)bytes, (int64_t)bytes, 0);
    return p;
}

/* 1.50 GiB, 12.0 MiB, 44.0 KiB: enough digits to compare a need with a budget. */
const char *zs_mem_human(uint64_t b, char *buf, size_t len)
{
    if (b >= (1ull << 30))
        snprintf(buf, len, "%.2f GiB", (double)b / (double)(1ull << 30));
    else if (b >= (1ull << 20))
        snprintf(buf, len, "%.1f MiB", (double)b / (double)(1ull << 20));
    else
        snprintf(buf, len, "%.1f KiB", (double)b / 1024.0);
    return buf;
}

bool zs_budget_admit(struct zs_ctx *ctx, uint64_t bytes, const char *what)
{
    uint64_t used = 0;

    ctx->over_budget = false;
    if (!ctx->device_budget)
        return true;
    for (int c = 0; c < ZS_MEM_NCAT; c++)
        used += ctx->mem[c];
    used -= ctx->mem_host;
    if (used + bytes <= ctx->device_budget)
        return true;
    char h1[32], h2[32], h3[32];
    ctx->over_budget = true;
    zs_fail(ZS_ERR_NOMEM, "out of device memory: %s need %s more, %s of the %s budget are in use "
            "(lower stage3_max_live_parameters or stage3_prefetch_bucket_size)", what, zs_mem_human(bytes, h1, sizeof(h1)),
            zs_mem_human(used, h2, sizeof(h2)), zs_mem_human(ctx->device_budget, h3, sizeof(h3)));
    return false;
}

/* ---------------------------------------------------------------- RSS samples */

/* RSS from /proc/self/statm (pages, second field): one pread of a file kept open. */
uint64_t zs_mem_rss(struct zs_ctx *ctx)
{
    char b[128];
    unsigned long long size, res;

    if (ctx->statm == 0) {
        int fd = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
        ctx->statm = fd >= 0 ? fd + 1 : -1;
    }
    if (ctx->statm < 0)
        return 0;
    ssize_t n = pread(ctx->statm - 1, b, sizeof(b) - 1, 0);
    if (n <= 0)
        return 0;
    b[n] = 0;
    if (sscanf(b, "%llu %llu", &size, &res) != 2)
        return 0;
    return (uint64_t)res * (uint64_t)sysconf(_SC_PAGESIZE);
}

void zs_mem_sample(struct zs_ctx *ctx)
{
    zs_memory_report r;

    pthread_mutex_lock(&ctx->mem_lock);
    ctx->mem_step = ctx->global_step;
    ctx->mem_scratch = ctx->comm ? zs_comm_scratch_bytes(ctx->comm) : 0;
    pthread_mutex_unlock(&ctx->mem_lock);
    if (ctx->watch) /* the watcher samples every millisecond: no /proc read on the engine's calls */
        return;
    uint64_t rss = zs_mem_rss(ctx);
    pthread_mutex_lock(&ctx->mem_lock);
    bool higher = rss > ctx->peak_rss_seen;
    pthread_mutex_unlock(&ctx->mem_lock);
    if (!higher || !ctx->mem_snapshot || ctx->mem_snapshot(ctx, &r)) /* read outside the lock: /proc, mallinfo2 */
        return;
    pthread_mutex_lock(&ctx->mem_lock);
    if (rss > ctx->peak_rss_seen) { /* the watcher may have seen a higher one meanwhile */
        ctx->peak_rss_seen = rss;
        ctx->peak_report = r;
    }
    pthread_mutex_unlock(&ctx->mem_lock);
}

void zs_mem_sample_close(struct zs_ctx *ctx)
{
    if (ctx->statm > 0)
        close(ctx->statm - 1);
    ctx->statm = -1;
}
