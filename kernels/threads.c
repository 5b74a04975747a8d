/* threads.c - the kernels' worker pool: threads start once, sleep on a condition variable between
 * calls, and each is bound (hwloc) to one core of this rank's share of the node, so ranks sharing a
 * node never fight over cores. Calls too small to pay for a wake-up run on the caller. */
#include <errno.h>
#include <hwloc.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "threads.h"

/* Below this many elements a call runs on the caller: waking workers costs more than it saves. */
#define ZS_POOL_MIN_PARALLEL (1 << 15)
#define ZS_POOL_ALIGN 16

struct worker {
    struct zs_pool *pool;
    int32_t index;
    pthread_t tid;
};

struct zs_pool {
    int32_t nthreads;
    struct worker *workers;
    pthread_mutex_t mu;
    pthread_cond_t start, done;
    uint64_t generation;
    int32_t remaining;
    bool stop;
    zs_pool_fn fn;
    void *arg;
    int64_t n;
    hwloc_topology_t topo;
    int32_t first_core, ncores;  /* this rank's share */
    bool bind;
    char desc[160];
};

static void chunk(const struct zs_pool *p, int32_t k, int64_t *begin, int64_t *end)
{
    int64_t per = (p->n + p->nthreads - 1) / p->nthreads;

    per = (per + ZS_POOL_ALIGN - 1) / ZS_POOL_ALIGN * ZS_POOL_ALIGN;
    *begin = (int64_t)k * per < p->n ? (int64_t)k * per : p->n;
    *end = *begin + per < p->n ? *begin + per : p->n;
}

/* Worker k (k >= 1) is pinned to one hardware thread of core first_core + k. The caller's thread (k = 0)
 * is the application's own: it gets the rank's whole share instead, because the threads it starts later
 * (BLAS, OpenMP) inherit its binding, and pinned to one core they would all share that core. */
static int bind_thread(struct zs_pool *p, int32_t k, pthread_t tid, bool self)
{
    int32_t lo = k ? k % p->ncores : 0, hi = k ? lo + 1 : p->ncores;
    hwloc_bitmap_t set;
    int rc = 0;

    if (!p->bind || !p->topo)
        return 0;
    set = hwloc_bitmap_alloc();
    if (!set)
        return -ENOMEM;
    for (int32_t c = lo; c < hi && !rc; c++) {
        hwloc_obj_t core = hwloc_get_obj_by_type(p->topo, HWLOC_OBJ_CORE, (unsigned)(p->first_core + c));

        if (!core || !core->cpuset)
            rc = -ENOENT;
        else
            hwloc_bitmap_or(set, set, core->cpuset);
    }
    if (!rc && k)
        hwloc_bitmap_singlify(set); /* one hardware thread, so the OS does not move a worker inside its core */
    if (!rc && (self ? hwloc_set_cpubind(p->topo, set, HWLOC_CPUBIND_THREAD)
                     : hwloc_set_thread_cpubind(p->topo, tid, set, 0)))
        rc = -errno;
    hwloc_bitmap_free(set);
    return rc;
}

static int bind_to_core(struct zs_pool *p, int32_t k)
{
    return bind_thread(p, k, pthread_self(), true);
}

static void *worker_main(void *argp)
{
    struct worker *w = argp;
    struct zs_pool *p = w->pool;
    uint64_t seen = 0;

    pthread_mutex_lock(&p->mu); /* zs_pool_place may move the share meanwhile */
    bind_to_core(p, w->index);
    pthread_mutex_unlock(&p->mu);
    for (;;) {
        int64_t begin, end;

        pthread_mutex_lock(&p->mu);
        while (p->generation == seen && !p->stop)
            pthread_cond_wait(&p->start, &p->mu);
        if (p->stop) {
            pthread_mutex_unlock(&p->mu);
            return NULL;
        }
        seen = p->generation;
        pthread_mutex_unlock(&p->mu);
        chunk(p, w->index, &begin, &end);
        if (begin < end)
            p->fn(p->arg, begin, end);
        pthread_mutex_lock(&p->mu);
        if (--p->remaining == 0)
            pthread_cond_signal(&p->done);
        pthread_mutex_unlock(&p->mu);
    }
}

/* This rank's cores: an equal, contiguous slice of the node's cores per local rank; with more ranks
 * than cores, ranks share cores round-robin. */
static void find_share(struct zs_pool *p, const struct zs_pool_opts *o)
{
    int32_t ls = o->local_size > 0 ? o->local_size : 1, lr = o->local_rank >= 0 ? o->local_rank : 0;
    int total = p->topo ? hwloc_get_nbobjs_by_type(p->topo, HWLOC_OBJ_CORE) : 0;

    if (total <= 0)
        total = 1;
    if (ls <= total) {
        p->first_core = (int32_t)((int64_t)lr * total / ls);
        p->ncores = (int32_t)((int64_t)(lr + 1) * total / ls) - p->first_core;
    } else {
        p->first_core = lr % total;
        p->ncores = 1;
    }
}

static void describe(struct zs_pool *p, const char *near)
{
    snprintf(p->desc, sizeof(p->desc), "%d thread%s on core%s %d-%d of %d%s%s", p->nthreads, p->nthreads > 1 ? "s" : "",
             p->ncores > 1 ? "s" : "", p->first_core, p->first_core + p->ncores - 1,
             p->topo ? hwloc_get_nbobjs_by_type(p->topo, HWLOC_OBJ_CORE) : 1, p->bind ? ", bound" : ", unbound", near);
}

int zs_pool_create(struct zs_pool **out, const struct zs_pool_opts *o, char *warning, int warnlen)
{
    struct zs_pool *p = calloc(1, sizeof(*p));
    int rc;

    if (warning && warnlen > 0)
        warning[0] = '\0';
    if (!p)
        return -ENOMEM;
    if (hwloc_topology_init(&p->topo) || hwloc_topology_load(p->topo)) {
        if (warning)
            snprintf(warning, (size_t)warnlen, "hwloc could not read the topology; threads are not bound");
        if (p->topo)
            hwloc_topology_destroy(p->topo);
        p->topo = NULL;
    }
    find_share(p, o);
    p->bind = o->bind && p->topo;
    p->nthreads = o->threads > 0 ? o->threads : p->ncores;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->start, NULL);
    pthread_cond_init(&p->done, NULL);
    rc = bind_to_core(p, 0);
    if (rc && warning)
        snprintf(warning, (size_t)warnlen, "could not bind to core %d (%s); threads run unbound", p->first_core,
                 strerror(-rc));
    p->workers = calloc((size_t)p->nthreads, sizeof(*p->workers));
    if (!p->workers) {
        zs_pool_free(p);
        return -ENOMEM;
    }
    for (int32_t k = 1; k < p->nthreads; k++) {
        p->workers[k].pool = p;
        p->workers[k].index = k;
        rc = pthread_create(&p->workers[k].tid, NULL, worker_main, &p->workers[k]);
        if (rc) {
            p->nthreads = k; /* the ones started are joined by free */
            zs_pool_free(p);
            return -rc;
        }
    }
    describe(p, "");
    *out = p;
    return 0;
}

int zs_pool_place(struct zs_pool *p, hwloc_const_cpuset_t near, int32_t index, int32_t count, const char *what)
{
    int total = p->topo ? hwloc_get_nbobjs_by_type(p->topo, HWLOC_OBJ_CORE) : 0, first = -1, n = 0, rc = 0;
    char tail[96];

    if (!p->topo || !p->bind)
        return 0;
    for (int c = 0; c < total; c++) {
        hwloc_obj_t core = hwloc_get_obj_by_type(p->topo, HWLOC_OBJ_CORE, (unsigned)c);
        if (!core || !core->cpuset || !hwloc_bitmap_isincluded(core->cpuset, near))
            continue;
        if (first >= 0 && c != first + n)
            return -ERANGE; /* not one run of cores in hwloc's order: the share arithmetic needs one */
        first = first < 0 ? c : first;
        n++;
    }
    if (!n)
        return -ENOENT;
    count = count > 0 ? count : 1;
    index = index >= 0 ? index % count : 0;
    pthread_mutex_lock(&p->mu);
    if (count <= n) {
        p->first_core = first + (int32_t)((int64_t)index * n / count);
        p->ncores = first + (int32_t)((int64_t)(index + 1) * n / count) - p->first_core;
    } else { /* more ranks near this GPU than cores: they share them round robin */
        p->first_core = first + index % n;
        p->ncores = 1;
    }
    rc = bind_to_core(p, 0);
    for (int32_t k = 1; k < p->nthreads && !rc; k++)
        rc = bind_thread(p, k, p->workers[k].tid, false);
    snprintf(tail, sizeof(tail), ", near %s", what);
    describe(p, tail);
    pthread_mutex_unlock(&p->mu);
    return rc;
}

void zs_pool_free(struct zs_pool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->stop = true;
    pthread_cond_broadcast(&p->start);
    pthread_mutex_unlock(&p->mu);
    for (int32_t k = 1; p->workers && k < p->nthreads; k++)
        pthread_join(p->workers[k].tid, NULL);
    free(p->workers);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->start);
    pthread_cond_destroy(&p->done);
    if (p->topo)
        hwloc_topology_destroy(p->topo);
    free(p);
}

int32_t zs_pool_threads(const struct zs_pool *p) { return p->nthreads; }
const char *zs_pool_describe(const struct zs_pool *p) { return p->desc; }

void zs_pool_run(struct zs_pool *p, zs_pool_fn fn, void *arg, int64_t n)
{
    int64_t begin, end;

    if (n <= 0)
        return;
    if (p->nthreads == 1 || n < ZS_POOL_MIN_PARALLEL) {
        fn(arg, 0, n);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->arg = arg;
    p->n = n;
    p->remaining = p->nthreads - 1;
    p->generation++;
    pthread_cond_broadcast(&p->start);
    pthread_mutex_unlock(&p->mu);
    chunk(p, 0, &begin, &end);
    if (begin < end)
        fn(arg, begin, end);
    pthread_mutex_lock(&p->mu);
    while (p->remaining > 0)
        pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
