/* memory.c - what a rank holds, by category, next to what the ZeRO formulas predict (REFERENCE: with
 * Adam, 2+2+12 bytes a parameter for 16-bit training, 4+4+8 for fp32; stage 1 shards the optimizer
 * state, stage 2 the gradients too, stage 3 the parameters too), and the same figures predicted before
 * launching (zs_estimate_memory, the zs-estimate tool). */
#include <stddef.h>
#include <link.h>
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/error.h"
#include "kernels/optim.h" /* defines: zs_dtype_name */
#include "core/ctx.h"
#include "core/host_pool.h"
#include "core/memory.h"
#include "comm/comm_nccl.h" /* defines: zs_nccl_stage_bytes */
#include "offload/nvme_optim.h"
#include "sharding/sharding.h"
#include "runtime.h"

/* The formulas, per category, for psi parameters (of them `trained` not frozen) at n ranks; with hpZ over h ranks
 * (stage 3) ZeRO++'s secondary copy adds p x psi / h to the parameters. */
static void expect(const struct zs_config *cfg, uint64_t psi, uint64_t trained, uint64_t n, uint64_t h,
                   zs_memory_report *out)
{
    uint64_t p = zs_dtype_bytes(cfg->param_dtype), c = zs_dtype_bytes(cfg->comm_dtype);
    uint64_t k = zs_config_state_bytes(cfg);
    int stage = cfg->zero.stage;

    out->expect_params = stage == 3 ? p * psi / n + (h > 1 ? p * psi / h : 0) : p * psi;
    out->expect_grads = stage <= 1 ? p * trained : c * trained / n;
    out->expect_optimizer = stage == 0 ? k * trained : k * trained / n;
    out->formula = out->expect_params + out->expect_grads + out->expect_optimizer;
}

/* ---------------------------------------------------------------- the process around the engine */

/* VmRSS, VmHWM, RssFile and RssShmem from /proc/self/status (Linux; left 0 elsewhere). */
static void read_status(zs_memory_report *out)
{
    static const struct { const char *key; size_t off; } keys[] = {
        {"VmRSS:", offsetof(zs_memory_report, rss)}, {"VmHWM:", offsetof(zs_memory_report, peak_rss)},
        {"RssFile:", offsetof(zs_memory_report, rss_file)}, {"RssShmem:", offsetof(zs_memory_report, shared_peers)},
    };
    FILE *f = fopen("/proc/self/status", "re");
    char line[256];

    if (!f)
        return;
    while (fgets(line, sizeof(line), f))
        for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
            size_t n = strlen(keys[i].key);
            if (!strncmp(line, keys[i].key, n))
                *(uint64_t *)((char *)out + keys[i].off) = strtoull(line + n, NULL, 10) << 10; /* kB */
        }
    fclose(f);
}

/* The libraries' zero-initialised data (.bss: the part of each writable segment beyond the file's bytes, anonymous
 * memory) that is resident: each loaded object's segments from the dynamic loader, residency from mincore. Read by
 * the public queries only, not at every sample (it changes little once the libraries are loaded). */
static int lib_bss(struct dl_phdr_info *info, size_t size, void *arg)
{
    uint64_t *total = arg;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);

    (void)size;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_W) || ph->p_memsz <= ph->p_filesz)
            continue;
        uintptr_t lo = (info->dlpi_addr + ph->p_vaddr + ph->p_filesz + page - 1) & ~(page - 1);
        uintptr_t hi = (info->dlpi_addr + ph->p_vaddr + ph->p_memsz + page - 1) & ~(page - 1);
        for (uintptr_t at = lo; at < hi;) { /* in pieces, for a small residency vector */
            unsigned char v[4096];
            size_t n = (hi - at) / page < sizeof(v) ? (hi - at) / page : sizeof(v);
            if (mincore((void *)at, n * page, v))
                break;
            for (size_t k = 0; k < n; k++)
                *total += (v[k] & 1) ? page : 0;
            at += n * page;
        }
    }
    return 0;
}

static uint64_t read_lib_data(void)
{
    uint64_t total = 0;

    dl_iterate_phdr(lib_bss, &total);
    return total;
}

static void read_heap(zs_memory_report *out)
{
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
    struct mallinfo2 m = mallinfo2(); /* every arena: the bytes handed out, and the chunks mapped on their own */
    out->heap_in_use = (uint64_t)m.uordblks + (uint64_t)m.hblkhd;
    out->heap_free = (uint64_t)m.fordblks;
#else
    (void)out;
#endif
}

static uint64_t sub0(uint64_t a, uint64_t b) { return a > b ? a - b : 0; }

/* The engine's counters at one moment (ctx's, read on the engine's thread or copied under mem_lock). */
struct counts {
    uint64_t mem[ZS_MEM_NCAT];
    uint64_t peak_live, host, shared, scratch;
    int64_t step;
};

/* The figures that change as the engine runs, from its counters; then the process's, read now. See
 * zs_memory_report's last fields for how they add up. */
static void figures(const struct zs_ctx *ctx, const struct counts *c, zs_memory_report *out)
{
    uint64_t all = 0;

    for (int k = 0; k < ZS_MEM_NCAT; k++)
        all += c->mem[k];
    out->params = c->mem[ZS_MEM_PARAMS];
    out->grads = c->mem[ZS_MEM_GRADS];
    out->master = c->mem[ZS_MEM_MASTER];
    out->optimizer = c->mem[ZS_MEM_OPTIM] + c->mem[ZS_MEM_MASTER];
    out->comm_buffers = c->mem[ZS_MEM_BUFFERS] + c->scratch;
    out->swap_buffers = c->mem[ZS_MEM_SWAP];
    out->buffers = out->comm_buffers + out->swap_buffers;
    out->live_params = c->mem[ZS_MEM_LIVE];
    out->peak_live_params = c->peak_live;
    out->host = c->host;
    out->shared_heap = c->shared;
    out->pool_free = sub0(out->pinned_pool, c->host);
    out->step = c->step;
    uint64_t pool_rss = ctx->host && zs_host_pool_pinned(ctx->host) ? out->pool_free : 0; /* else untouched */
    /* On the CPU device the engine's device memory is the C heap; a GPU's is not in this process's RSS. The
     * comms' scratch is C heap. */
    uint64_t heap = c->scratch + (ctx->dev.host_access ? sub0(all, c->host + c->shared) : 0);
    out->engine_rss = (ctx->dev.host_access ? all : c->host + c->shared) + c->scratch + pool_rss;
    read_status(out); /* shared_peers holds RssShmem until the line below */
    read_heap(out);
    out->heap_other = sub0(out->heap_in_use, heap);
    out->shared_peers = sub0(out->shared_peers, c->shared);
    out->other = (int64_t)out->rss - (int64_t)(out->engine_rss + out->heap_other + out->heap_free +
                                               out->shared_peers + out->rss_file + out->lib_data);
}

/* The libraries' data, read now, into a report of another moment (it does not change once they are loaded). */
static void add_lib_data(zs_memory_report *out)
{
    out->lib_data = read_lib_data();
    out->other -= (int64_t)out->lib_data;
}

/* ---------------------------------------------------------------- the watcher */

/* A thread that samples the RSS every millisecond from zs_setup to zs_finalize: the highest moment of a step
 * is often inside the program's own work (autograd's gradient of a tied embedding, summed from its two uses),
 * between engine calls. It takes the engine's counters under mem_lock and reads the rest itself. */
struct zs_mem_watch {
    pthread_t tid;
    pthread_mutex_t lock; /* guards stop */
    pthread_cond_t wake;
    bool stop;
    zs_memory_report base; /* what does not change after set-up */
    struct zs_ctx *ctx;
};

#define ZS_WATCH_PERIOD_NS 1000000L

static void *watch_main(void *arg)
{
    struct zs_mem_watch *w = arg;
    struct zs_ctx *ctx = w->ctx;

    pthread_mutex_lock(&w->lock);
    while (!w->stop) {
        struct timespec t;
        clock_gettime(CLOCK_REALTIME, &t);
        t.tv_nsec += ZS_WATCH_PERIOD_NS;
        if (t.tv_nsec >= 1000000000L) {
            t.tv_sec++;
            t.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&w->wake, &w->lock, &t);
        if (w->stop)
            break;
        pthread_mutex_unlock(&w->lock);
        uint64_t rss = zs_mem_rss(ctx);
        struct counts c;
        pthread_mutex_lock(&ctx->mem_lock);
        bool higher = rss > ctx->peak_rss_seen;
        memcpy(c.mem, ctx->mem, sizeof(c.mem));
        c.peak_live = ctx->peak_live;
        c.host = ctx->mem_host;
        c.shared = ctx->mem_shared;
        c.scratch = ctx->mem_scratch;
        c.step = ctx->mem_step;
        pthread_mutex_unlock(&ctx->mem_lock);
        if (higher) {
            zs_memory_report r = w->base;
            figures(ctx, &c, &r);
            pthread_mutex_lock(&ctx->mem_lock);
            if (rss > ctx->peak_rss_seen) {
                ctx->peak_rss_seen = rss;
                ctx->peak_report = r;
            }
            pthread_mutex_unlock(&ctx->mem_lock);
        }
        pthread_mutex_lock(&w->lock);
    }
    pthread_mutex_unlock(&w->lock);
    return NULL;
}

void zs_mem_watch_start(struct zs_ctx *ctx)
{
    struct zs_mem_watch *w;

    if (ctx->watch || !zs_mem_rss(ctx) || !(w = calloc(1, sizeof(*w)))) /* no /proc: nothing to watch */
        return;
    w->ctx = ctx;
    zs_mem_snapshot(ctx, &w->base);
    pthread_mutex_init(&w->lock, NULL);
    pthread_cond_init(&w->wake, NULL);
    if (pthread_create(&w->tid, NULL, watch_main, w)) {
        pthread_cond_destroy(&w->wake);
        pthread_mutex_destroy(&w->lock);
        free(w);
        return;
    }
    ctx->watch = w;
}

void zs_mem_watch_stop(struct zs_ctx *ctx)
{
    struct zs_mem_watch *w = ctx->watch;

    if (!w)
        return;
    pthread_mutex_lock(&w->lock);
    w->stop = true;
    pthread_cond_signal(&w->wake);
    pthread_mutex_unlock(&w->lock);
    pthread_join(w->tid, NULL);
    pthread_cond_destroy(&w->wake);
    pthread_mutex_destroy(&w->lock);
    free(w);
    ctx->watch = NULL;
}

zs_status zs_memory_peak(const zs_ctx *ctx, zs_memory_report *out)
{
    if (!ctx || !out)
        return zs_fail(ZS_ERR_INVALID, "zs_memory_peak: NULL argument");
    pthread_mutex_lock((pthread_mutex_t *)&ctx->mem_lock);
    bool seen = ctx->peak_rss_seen != 0;
    if (seen)
        *out = ctx->peak_report;
    pthread_mutex_unlock((pthread_mutex_t *)&ctx->mem_lock);
    if (!seen)
        return zs_memory(ctx, out);
    zs_memory_report now = {0};
    read_status(&now);
    out->peak_rss = now.peak_rss;
    add_lib_data(out);
    return ZS_OK;
}

zs_status zs_memory(const zs_ctx *ctx, zs_memory_report *out)
{
    zs_status st = zs_mem_snapshot(ctx, out);

    if (!st)
        add_lib_data(out);
    return st;
}

zs_status zs_mem_snapshot(const struct zs_ctx *ctx, zs_memory_report *out)
{
    if (!ctx || !out)
        return zs_fail(ZS_ERR_INVALID, "zs_memory: NULL argument");
    memset(out, 0, sizeof(*out));
    out->rank = ctx->rank;
    out->world = ctx->world;
    out->stage = ctx->cfg.zero.stage;
    out->dtype = ctx->pdt;
    out->prefetch_cap = ctx->plan.live_bytes;
    out->pinned_pool = zs_host_pool_size(ctx->host);
    out->device_budget = ctx->device_budget;
    out->numel = ctx->numel;
    out->numel_padded = ctx->numel_padded;
    out->nvme = zs_nvme_optim_file_bytes(ctx->nvme);
    out->nccl_staging = ctx->coll.nccl ? zs_nccl_stage_bytes(ctx->world) : 0;
    out->shard_size = ctx->shard_size;
    out->hpz_size = ctx->hpz_size;
    out->hpz_secondary = ctx->plan.hpz_bytes;
    expect(&ctx->cfg, ctx->numel, ctx->plan.numel_trained, (uint64_t)ctx->shard_size, (uint64_t)ctx->hpz_size, out);
    /* the engine's thread reads its own counters without the lock: only it writes them */
    struct counts c = {.peak_live = ctx->peak_live, .host = ctx->mem_host, .shared = ctx->mem_shared,
                       .scratch = zs_comm_scratch_bytes(ctx->comm) + zs_exact_scratch_bytes(ctx),
                       .step = ctx->global_step};
    memcpy(c.mem, ctx->mem, sizeof(c.mem));
    figures(ctx, &c, out);
    return ZS_OK;
}

static const char *mib(uint64_t b, char *buf, size_t len)
{
    snprintf(buf, len, "%.2f MiB", (double)b / (double)(1 << 20));
    return buf;
}

static double ratio(uint64_t a, uint64_t b) { return b ? (double)a / (double)b : 0.0; }

/* "12.00 MiB", or with state on NVMe "0.02 MiB + 301.72 MiB on NVMe": what the ZeRO formula counts is
 * the sum, wherever it lives. */
static const char *placed(uint64_t ram, uint64_t disk, char *buf, size_t len)
{
    if (!disk)
        return mib(ram, buf, len);
    snprintf(buf, len, "%.2f MiB + %.2f MiB on NVMe", (double)ram / (double)(1 << 20),
             (double)disk / (double)(1 << 20));
    return buf;
}

void zs_memory_log(const struct zs_ctx *ctx)
{
    zs_memory_report r;
    char a[7][64];

    if (ctx->rank != 0 || ctx->quiet || zs_memory(ctx, &r))
        return;
    uint64_t dp = zs_nvme_optim_param_bytes(ctx->nvme, ctx->nunits), dg = zs_nvme_optim_grad_bytes(ctx->nvme, ctx->nunits);
    uint64_t dopt = r.nvme - dp - dg;
    char grp[160] = "";
    int gl;
    if (r.shard_size < r.world) /* hybrid: the formula's N is the shard group's size */
        gl = snprintf(grp, sizeof(grp), ", shard group of %d; ZeRO formula with N = %d", r.shard_size, r.shard_size);
    else
        gl = snprintf(grp, sizeof(grp), "; ZeRO formula");
    if (r.hpz_size && gl > 0 && (size_t)gl < sizeof(grp)) /* hpZ: its secondary copy is a term of params */
        snprintf(grp + gl, sizeof(grp) - (size_t)gl, " + hpZ's %s secondary copy over %d", mib(r.hpz_secondary,
                 a[0], 64), r.hpz_size);
    zs_log("memory per rank (rank 0, stage %d, %s, %d ranks%s and ratio "
           "in brackets): params %s [%s %.3f], grads %s [%s %.3f], optimizer %s (fp32 masters %s) [%s %.3f]",
           r.stage, zs_dtype_name(r.dtype), r.world, grp, placed(r.params, dp, a[0], 64), mib(r.expect_params, a[1], 64),
           ratio(r.params + dp, r.expect_params), placed(r.grads, dg, a[2], 64), mib(r.expect_grads, a[3], 64),
           ratio(r.grads + dg, r.expect_grads), placed(r.optimizer, dopt, a[4], 64), mib(r.master, a[5], 64),
           mib(r.expect_optimizer, a[6], 64), ratio(r.optimizer + dopt, r.expect_optimizer));
    zs_log("buffers per rank: communication %s, stage-3 gathered cap %s, pinned host pool %s (swap buffers %s), "
           "on NVMe %s%s%s", mib(r.comm_buffers, a[0], 64), mib(r.prefetch_cap, a[1], 64), mib(r.pinned_pool, a[2], 64),
           mib(r.swap_buffers, a[3], 64), mib(r.nvme, a[4], 64), r.nccl_staging ? ", NCCL staging " : "",
           r.nccl_staging ? mib(r.nccl_staging, a[5], 64) : "");
}

/* After the first step, rank 0: the report at the highest RSS sampled, every byte of it named. */
void zs_memory_peak_log(const struct zs_ctx *ctx)
{
    zs_memory_report r;
    char a[12][32], eng[400];
#define H(b, i) zs_mem_human((b), a[i], sizeof(a[i]))

    if (ctx->rank != 0 || ctx->quiet || zs_memory_peak(ctx, &r) || !r.rss)
        return;
    if (ctx->dev.host_access)
        snprintf(eng, sizeof(eng), "the engine %s (params %s, grads %s, optimizer %s, gathered %s, communication %s, "
                 "swap buffers %s, host pool unused %s)", H(r.engine_rss, 0), H(r.params, 1), H(r.grads, 2),
                 H(r.optimizer, 3), H(r.live_params, 4), H(r.comm_buffers, 5), H(r.swap_buffers, 6),
                 H(ctx->host && zs_host_pool_pinned(ctx->host) ? r.pool_free : 0, 7));
    else
        snprintf(eng, sizeof(eng), "the engine's host memory %s (host pool and staging; its device memory is apart)",
                 H(r.engine_rss, 0));
    zs_log("memory at the highest RSS sampled so far (rank 0, %lld optimizer steps done): RSS %s = %s + C heap "
           "beyond the engine %s "
           "(a front end's tensors: activations, autograd's gradients, stand-ins; MPI) + its free memory kept %s + "
           "peers' shared buffers %s + mapped files (code) %s + libraries' data %s + other (Python's objects, stacks) "
           "%s%s; high-water mark %s", (long long)r.step, H(r.rss, 8), eng, H(r.heap_other, 9), H(r.heap_free, 3),
           H(r.shared_peers, 10), H(r.rss_file, 11), H(r.lib_data, 4), r.other < 0 ? "-" : "",
           H((uint64_t)(r.other < 0 ? -r.other : r.other), 1), H(r.peak_rss, 2));
#undef H
}

/* ---------------------------------------------------------------- the estimator */

/* The plan's totals, for units of these sizes under this config, before any rank starts. */
zs_status zs_estimate_memory(const char *config_json, int32_t world, int32_t nunits, const int64_t *unit_numel,
                             zs_memory_report *out)
{
    struct zs_config cfg;
    struct zs_plan p;
    char err[768];

    if (!config_json || !unit_numel || !out || world < 1 || nunits < 1)
        return zs_fail(ZS_ERR_INVALID, "zs_estimate_memory: bad argument");
    memset(&cfg, 0, sizeof(cfg));
    if (zs_config_parse(&cfg, config_json, "<config>", world, NULL, err, sizeof(err)))
        return zs_fail(ZS_ERR_CONFIG, "%s", err);
    struct zs_layout_keys k = {.stage = cfg.zero.stage, .mics = cfg.zero.mics_shard_size,
                               .hpz = cfg.zero.hpz_partition_size, .quant_weights = cfg.zero.quantized_weights,
                               .quant_grads = cfg.zero.quantized_gradients};
    zs_status st = zs_layout_check(&k, world, err, sizeof(err)); /* what the engine would refuse at zs_init */
    if (st)
        return zs_fail(st, "%s", err);
    zs_plan_init(&p, &cfg, zs_placement_of(&cfg), world);
    struct zs_nvme_unit *nu = calloc((size_t)nunits, sizeof(*nu)); /* for the swap file's layout */
    if (!nu)
        return zs_fail(ZS_ERR_NOMEM, "zs_estimate_memory: out of memory");
    for (int32_t u = 0; u < nunits; u++) {
        struct zs_plan_unit pu;
        if (zs_plan_add(&p, unit_numel[u], false) || zs_plan_unit(&p, unit_numel[u], false, &pu)) {
            free(nu);
            return zs_fail(ZS_ERR_INVALID, "zs_estimate_memory: unit %d: bad size %lld", u, (long long)unit_numel[u]);
        }
        nu[u] = (struct zs_nvme_unit){.shard = pu.part.shard, .sharded = pu.sharded,
                                      .grad_elem = p.grads_nvme ? (uint32_t)p.csz : 0};
    }
    zs_plan_finish(&p);
    uint64_t swap = 0, file = p.home[ZS_HOME_NVME], on_disk_params = 0;
    if (cfg.zero.offload_optimizer.device == ZS_OFFLOAD_NVME)
        st = zs_nvme_optim_size(&cfg, nunits, nu, &swap, &file, &on_disk_params);
    free(nu);
    if (st)
        return st;
    memset(out, 0, sizeof(*out));
    out->world = world;
    out->stage = cfg.zero.stage;
    out->dtype = cfg.param_dtype;
    out->params = p.cat[ZS_MEM_PARAMS];
    out->grads = p.cat[ZS_MEM_GRADS];
    out->master = p.cat[ZS_MEM_MASTER];
    out->optimizer = p.cat[ZS_MEM_MASTER] + p.cat[ZS_MEM_OPTIM];
    out->comm_buffers = p.cat[ZS_MEM_BUFFERS];
    out->swap_buffers = swap;
    out->buffers = out->comm_buffers + swap;
    out->prefetch_cap = p.live_bytes;
    out->host = out->pinned_pool = p.host_pool + swap; /* as offload.c sizes it: the offloaded state and the slots */
    out->nvme = file;
    out->nccl_staging = p.nccl_stage_bytes;
    out->numel = p.numel;
    out->numel_padded = p.numel_padded;
    out->shard_size = p.world;
    out->hpz_size = p.hpz;
    out->hpz_secondary = p.hpz_bytes;
    expect(&cfg, p.numel, p.numel, (uint64_t)p.world, (uint64_t)p.hpz, out);
    return ZS_OK;
}
