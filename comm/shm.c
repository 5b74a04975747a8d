/* shm.c - node layout, the shared heap (MPI-3 shared windows) and the operation flags.
 * The heap's allocator is deterministic (first fit over an offset-sorted free list), so identical call
 * sequences on every rank of a node give identical offsets: rank r finds peer l's copy of its buffer at
 * peer_base[l] + (p - my_base). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <signal.h>
#include <unistd.h>

#include "base/error.h"
#include "comm.h" /* defines: zs_mpi_wait_timeout, ZS_TIMEOUT_DEFAULT */
#include "shm.h"
#include "base/test_hooks.h"

#define ZS_SHM_SEGMENT_MIN (64u << 20)
#define ZS_SHM_ALIGN 64

struct block {
    size_t off, size;
    struct block *next;
};

struct segment {
    MPI_Win win;
    char *base;          /* my part */
    char **peer;         /* every local rank's part, by local index */
    size_t size;
    struct block *free_list; /* offset-sorted */
    struct block *used;
};

/* The descriptor shares the ready flag's cache line: a peer polling the flag has it in hand. */
struct post_slot {
    uint64_t posted;
    struct zs_shm_desc desc;
} __attribute__((aligned(64)));

struct flags {
    struct post_slot post[ZS_SHM_FLAG_RING];
    uint64_t done[ZS_SHM_FLAG_RING];
    int64_t pid;    /* so a waiting peer can tell a slow rank from a dead one */
    uint64_t votes; /* heap votes entered: a timed-out vote names the ranks with fewer */
    uint64_t nccl_ops; /* NCCL operations queued: NCCL cannot say who has not arrived, these counts can */
};

/* ZS_TEST_SHM_FAULT: which local failure to fake, on which global rank, at which call. */
enum fault_site { FAULT_NONE, FAULT_ALLOC, FAULT_GROW };

struct zs_shm {
    MPI_Comm node;
    int32_t local_rank, local_size, nodes;
    int32_t *local_of;       /* global rank -> local index or -1 */
    int32_t *global_of;      /* local index -> global rank */
    struct segment *segs;
    int32_t nsegs;
    uint64_t heap_bytes;
    MPI_Win flag_win;
    void *flag_base;         /* the window; the flags start at the first 64-byte boundary in it */
    struct flags *mine;
    struct flags **peer_flags;
    int32_t world_rank;
    double timeout_s;        /* the watchdog's, for the heap's votes */
    enum fault_site fault;
    int64_t fault_at, nalloc, ngrow;
};

static void fault_from_env(struct zs_shm *s)
{
    const char *f = getenv(ZS_TEST_HOOK_SHM_FAULT);
    char site[8];
    long long at;
    int rank;

    if (!f || sscanf(f, "%7[a-z]:%lld:%d", site, &at, &rank) != 3 || rank != s->world_rank)
        return;
    s->fault = !strcmp(site, "alloc") ? FAULT_ALLOC : !strcmp(site, "grow") ? FAULT_GROW : FAULT_NONE;
    s->fault_at = at;
}

static bool fault_hit(struct zs_shm *s, enum fault_site site, int64_t n)
{
    return s->fault == site && s->fault_at == n;
}

static zs_status node_layout(struct zs_shm *s, MPI_Comm comm, int32_t fake)
{
    int rank, size, color, *node_of_rank;
    MPI_Group world_group, node_group;

    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    s->world_rank = rank;
    if (fake > 0) {
        color = rank / fake;
        if (MPI_Comm_split(comm, color, rank, &s->node) != MPI_SUCCESS)
            return zs_fail(ZS_ERR_COMM, "comm: could not split into fake nodes of %d ranks", fake);
    } else if (MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &s->node) != MPI_SUCCESS) {
        return zs_fail(ZS_ERR_COMM, "comm: could not find the ranks sharing this node");
    }
    MPI_Comm_rank(s->node, &s->local_rank);
    MPI_Comm_size(s->node, &s->local_size);
    s->local_of = malloc((size_t)size * sizeof(int32_t));
    node_of_rank = malloc((size_t)size * sizeof(int));
    if (!s->local_of || !node_of_rank) {
        free(node_of_rank);
        return zs_fail(ZS_ERR_NOMEM, "comm: out of memory");
    }
    /* Map every global rank to its local index (or -1): translate the node group into comm's ranks. */
    int *locals = malloc((size_t)s->local_size * sizeof(int)), *globals = malloc((size_t)s->local_size * sizeof(int));
    MPI_Comm_group(comm, &world_group);
    MPI_Comm_group(s->node, &node_group);
    for (int i = 0; i < s->local_size; i++)
        locals[i] = i;
    MPI_Group_translate_ranks(node_group, s->local_size, locals, world_group, globals);
    for (int g = 0; g < size; g++)
        s->local_of[g] = -1;
    for (int i = 0; i < s->local_size; i++)
        s->local_of[globals[i]] = i;
    s->global_of = globals;
    /* Count nodes: the lowest global rank of each node is its leader. */
    int leader = globals[0], is_leader = rank == leader;
    MPI_Allreduce(&is_leader, &s->nodes, 1, MPI_INT, MPI_SUM, comm);
    MPI_Group_free(&world_group);
    MPI_Group_free(&node_group);
    free(locals);
    free(node_of_rank);
    return ZS_OK;
}

static zs_status map_window(struct zs_shm *s, MPI_Win win, char *mine, char ***peers)
{
    (void)mine;
    *peers = calloc((size_t)s->local_size, sizeof(char *));
    if (!*peers)
        return zs_fail(ZS_ERR_NOMEM, "comm: out of memory");
    for (int l = 0; l < s->local_size; l++) {
        MPI_Aint sz;
        int disp;
        if (MPI_Win_shared_query(win, l, &sz, &disp, &(*peers)[l]) != MPI_SUCCESS)
            return zs_fail(ZS_ERR_COMM, "comm: cannot map local rank %d's shared memory", l);
    }
    MPI_Win_lock_all(MPI_MODE_NOCHECK, win);
    return ZS_OK;
}

/* Shared windows come 8-byte aligned; the flag slots want whole cache lines. */
static void *align64(void *p)
{
    return (void *)(((uintptr_t)p + 63) & ~(uintptr_t)63);
}

zs_status zs_shm_init(struct zs_shm **out, MPI_Comm comm, int32_t fake)
{
    struct zs_shm *s = calloc(1, sizeof(*s));
    char **peers = NULL;
    zs_status st;

    if (!s)
        return zs_fail(ZS_ERR_NOMEM, "comm: out of memory");
    s->timeout_s = ZS_TIMEOUT_DEFAULT;
    st = node_layout(s, comm, fake);
    fault_from_env(s);
    if (!st) {
        if (MPI_Win_allocate_shared((MPI_Aint)(sizeof(struct flags) + 64), 1, MPI_INFO_NULL, s->node,
                                    &s->flag_base, &s->flag_win) != MPI_SUCCESS)
            st = zs_fail(ZS_ERR_COMM, "comm: could not allocate the shared flags");
    }
    if (!st) {
        s->mine = align64(s->flag_base);
        memset(s->mine, 0, sizeof(*s->mine));
        s->mine->pid = (int64_t)getpid();
        st = map_window(s, s->flag_win, s->flag_base, &peers);
        for (int32_t l = 0; !st && l < s->local_size; l++) /* the same page offset in every process */
            peers[l] = (char *)align64(peers[l]);
        s->peer_flags = (struct flags **)peers;
        MPI_Barrier(s->node); /* every rank's flags are zeroed before anyone reads them */
    }
    if (st) {
        zs_shm_free(s);
        return st;
    }
    *out = s;
    return ZS_OK;
}

void zs_shm_free(struct zs_shm *s)
{
    if (!s)
        return;
    for (int32_t i = 0; i < s->nsegs; i++) {
        struct segment *g = &s->segs[i];
        for (struct block *b = g->free_list, *n; b; b = n) {
            n = b->next;
            free(b);
        }
        for (struct block *b = g->used, *n; b; b = n) {
            n = b->next;
            free(b);
        }
        MPI_Win_unlock_all(g->win);
        MPI_Win_free(&g->win);
        free(g->peer);
    }
    free(s->segs);
    if (s->peer_flags) {
        MPI_Win_unlock_all(s->flag_win);
        free(s->peer_flags);
    }
    if (s->flag_base)
        MPI_Win_free(&s->flag_win);
    if (s->node != MPI_COMM_NULL && s->node)
        MPI_Comm_free(&s->node);
    free(s->local_of);
    free(s->global_of);
    free(s);
}

int32_t zs_shm_local_size(const struct zs_shm *s) { return s->local_size; }
int32_t zs_shm_local_rank(const struct zs_shm *s) { return s->local_rank; }
int32_t zs_shm_nodes(const struct zs_shm *s) { return s->nodes; }
int32_t zs_shm_local_index(const struct zs_shm *s, int32_t g) { return s->local_of[g]; }
uint64_t zs_shm_heap_bytes(const struct zs_shm *s) { return s->heap_bytes; }

/* ---------------------------------------------------------------- heap */

static struct block *block_new(size_t off, size_t size, struct block *next)
{
    struct block *b = malloc(sizeof(*b));

    if (b) {
        b->off = off;
        b->size = size;
        b->next = next;
    }
    return b;
}

/* The node's verdict on one heap step: every rank says whether it can go on and what it found, and all
 * take the same branch. Without this a rank that failed alone would leave the heap's offsets different
 * from its peers' (zero copy then reads the wrong memory) or skip a collective the others are in. */
struct vote {
    int64_t refuse;   /* lowest local rank that cannot go on, INT64_MAX when none */
    int64_t need_lo, need_hi, fit_lo, fit_hi;
};

/* A vote that timed out: its message, with the local ranks that had not entered vote n. */
static zs_status vote_missing(const struct zs_shm *s, uint64_t n)
{
    char msg[768], who[256] = "";
    size_t k = 0;

    snprintf(msg, sizeof(msg), "%s", zs_last_error());
    for (int32_t l = 0; l < s->local_size && k < sizeof(who); l++)
        if (__atomic_load_n(&s->peer_flags[l]->votes, __ATOMIC_ACQUIRE) < n)
            k += (size_t)snprintf(who + k, sizeof(who) - k, "%s%d", k ? ", " : "", s->global_of[l]);
    return zs_fail(ZS_ERR_COMM, "%s; ranks not arrived: %s", msg, who[0] ? who : "none on this node");
}

static zs_status vote_agree(struct zs_shm *s, bool ok, size_t need, bool fit, struct vote *v)
{
    int64_t mine[5] = { ok ? INT64_MAX : s->local_rank, (int64_t)need, -(int64_t)need, fit, -(int64_t)fit };
    int64_t all[5];

    uint64_t n = __atomic_add_fetch(&s->mine->votes, 1, __ATOMIC_RELEASE);
    MPI_Request r;

    if (MPI_Iallreduce(mine, all, 5, MPI_INT64_T, MPI_MIN, s->node, &r) != MPI_SUCCESS)
        return zs_fail(ZS_ERR_COMM, "shared heap: the node's ranks could not agree on an allocation");
    if (zs_mpi_wait_timeout(&r, s->timeout_s, s->world_rank, "the shared heap's vote on an allocation", s))
        return vote_missing(s, n); /* the request stays posted: the program is expected to end the job */
    v->refuse = all[0];
    v->need_lo = all[1];
    v->need_hi = -all[2];
    v->fit_lo = all[3];
    v->fit_hi = -all[4];
    return ZS_OK;
}

/* Adds a segment of at least `bytes`. Local bookkeeping is prepared first and the node votes before
 * the window (a collective) is created, and again after mapping it, so either every rank has the new
 * segment or none has. */
static zs_status grow(struct zs_shm *s, size_t bytes)
{
    size_t size = bytes > ZS_SHM_SEGMENT_MIN ? bytes : ZS_SHM_SEGMENT_MIN;
    struct segment *segs = realloc(s->segs, (size_t)(s->nsegs + 1) * sizeof(*segs)), *g;
    struct block *all = NULL;
    struct vote v = {0};
    char **peers = NULL;
    bool ok;
    zs_status st;

    if (segs)
        s->segs = segs; /* only capacity: nsegs says what exists */
    if (segs && !fault_hit(s, FAULT_GROW, s->ngrow))
        all = block_new(0, size, NULL);
    s->ngrow++;
    st = vote_agree(s, all != NULL, size, true, &v);
    if (!st && v.refuse != INT64_MAX)
        st = zs_fail(ZS_ERR_NOMEM, "shared heap: local rank %lld could not grow the heap by %zu bytes; no rank "
                     "did", (long long)v.refuse, size);
    if (st)
        goto out_free_block;
    g = &s->segs[s->nsegs];
    memset(g, 0, sizeof(*g));
    /* one line more than asked: the window comes 8-byte aligned, and every block must start on a cache line
     * (ZS_SHM_ALIGN), in every process: a program's kernels (PyTorch's BLAS among them) may take another path,
     * and round differently, for a parameter that is not 64-byte aligned */
    ok = MPI_Win_allocate_shared((MPI_Aint)(size + ZS_SHM_ALIGN), 1, MPI_INFO_NULL, s->node, &g->base,
                                 &g->win) == MPI_SUCCESS;
    if (ok && map_window(s, g->win, g->base, &peers)) {
        free(peers);
        peers = NULL;
        ok = false;
    }
    if (ok) { /* the same page offset in every process, so the same blocks */
        g->base = align64(g->base);
        for (int32_t l = 0; l < s->local_size; l++)
            peers[l] = (char *)align64(peers[l]);
    }
    st = vote_agree(s, ok, size, true, &v);
    if (!st && v.refuse != INT64_MAX)
        st = zs_fail(ZS_ERR_COMM, "shared heap: local rank %lld could not map a %zu-byte segment; no rank kept "
                     "it", (long long)v.refuse, size);
    if (st) {
        if (peers) {
            MPI_Win_unlock_all(g->win);
            free(peers);
        }
        if (g->base)
            MPI_Win_free(&g->win);
        goto out_free_block;
    }
    g->peer = peers;
    g->size = size;
    g->free_list = all;
    s->nsegs++;
    s->heap_bytes += size;
    return ZS_OK;

out_free_block:
    free(all);
    return st;
}

/* First fit over the segments in order: the same answer on every rank whose heap is the same. */
static struct block **find_fit(struct zs_shm *s, size_t need, struct segment **seg)
{
    for (int32_t i = 0; i < s->nsegs; i++)
        for (struct block **pp = &s->segs[i].free_list; *pp; pp = &(*pp)->next)
            if ((*pp)->size >= need) {
                *seg = &s->segs[i];
                return pp;
            }
    return NULL;
}

/* Takes `need` bytes from the front of free block *pp, recording them in u. */
static void *take(struct segment *g, struct block **pp, struct block *u, size_t need)
{
    struct block *b = *pp;

    u->off = b->off;
    u->size = need;
    u->next = g->used;
    g->used = u;
    b->off += need;
    b->size -= need;
    if (b->size == 0) {
        *pp = b->next;
        free(b);
    }
    memset(g->base + u->off, 0, need);
    return g->base + u->off;
}

void *zs_shm_alloc(struct zs_shm *s, size_t bytes, bool local_ok)
{
    size_t need = (bytes + ZS_SHM_ALIGN - 1) / ZS_SHM_ALIGN * ZS_SHM_ALIGN;
    struct segment *g = NULL;
    struct block **pp, *u = NULL;
    struct vote v = {0};
    zs_status st;

    if (need == 0)
        need = ZS_SHM_ALIGN;
    pp = find_fit(s, need, &g);
    if (local_ok && !fault_hit(s, FAULT_ALLOC, s->nalloc))
        u = block_new(0, 0, NULL);
    s->nalloc++;
    st = vote_agree(s, u != NULL, need, pp != NULL, &v);
    if (st)
        goto out_free;
    if (v.refuse != INT64_MAX) {
        if (local_ok) /* a rank that refused has its own reason, already recorded */
            zs_fail(ZS_ERR_NOMEM, "shared heap: local rank %lld could not allocate %zu bytes; no rank did",
                    (long long)v.refuse, need);
        goto out_free;
    }
    if (v.need_lo != v.need_hi || v.fit_lo != v.fit_hi) {
        zs_fail(ZS_ERR_INVALID, "shared heap: the node's ranks asked for %lld to %lld bytes and %s; every rank "
                "must make the same allocations in the same order", (long long)v.need_lo, (long long)v.need_hi,
                v.fit_lo != v.fit_hi ? "their heaps differ" : "their heaps agree");
        goto out_free;
    }
    if (!pp) { /* no rank has room: grow together, then the same first fit finds the new segment */
        if (grow(s, need))
            goto out_free;
        pp = find_fit(s, need, &g);
    }
    return take(g, pp, u, need);

out_free:
    free(u);
    return NULL;
}

void zs_shm_release(struct zs_shm *s, void *p)
{
    for (int32_t i = 0; p && i < s->nsegs; i++) {
        struct segment *g = &s->segs[i];
        if ((char *)p < g->base || (char *)p >= g->base + g->size)
            continue;
        size_t off = (size_t)((char *)p - g->base);
        for (struct block **pp = &g->used; *pp; pp = &(*pp)->next) {
            struct block *u = *pp, **fp = &g->free_list;
            if (u->off != off)
                continue;
            *pp = u->next;
            while (*fp && (*fp)->off < u->off) /* insert sorted, then merge neighbours */
                fp = &(*fp)->next;
            u->next = *fp;
            *fp = u;
            if (u->next && u->off + u->size == u->next->off) {
                struct block *n = u->next;
                u->size += n->size;
                u->next = n->next;
                free(n);
            }
            for (struct block *prev = g->free_list; prev && prev != u; prev = prev->next)
                if (prev->next == u && prev->off + prev->size == u->off) {
                    prev->size += u->size;
                    prev->next = u->next;
                    free(u);
                    break;
                }
            return;
        }
    }
}

const void *zs_shm_peer(const struct zs_shm *s, const void *p, size_t bytes, int32_t l)
{
    for (int32_t i = 0; i < s->nsegs; i++) {
        const struct segment *g = &s->segs[i];
        if ((const char *)p >= g->base && (const char *)p + bytes <= g->base + g->size)
            return g->peer[l] + ((const char *)p - g->base);
    }
    return NULL;
}

/* ---------------------------------------------------------------- flags */

uint64_t zs_shm_offset(const struct zs_shm *s, const void *p, size_t bytes)
{
    for (int32_t i = 0; i < s->nsegs; i++) {
        const struct segment *g = &s->segs[i];
        if ((const char *)p >= g->base && (const char *)p + bytes <= g->base + g->size)
            return (uint64_t)i << 48 | (uint64_t)((const char *)p - g->base);
    }
    return UINT64_MAX;
}

void zs_shm_post(struct zs_shm *s, uint64_t seq, const struct zs_shm_desc *d)
{
    if (d)
        s->mine->post[seq % ZS_SHM_FLAG_RING].desc = *d; /* published by the release store below */
    __atomic_store_n(&s->mine->post[seq % ZS_SHM_FLAG_RING].posted, seq + 1, __ATOMIC_RELEASE);
}

void zs_shm_done(struct zs_shm *s, uint64_t seq)
{
    __atomic_store_n(&s->mine->done[seq % ZS_SHM_FLAG_RING], seq + 1, __ATOMIC_RELEASE);
}

const struct zs_shm_desc *zs_shm_peer_desc(const struct zs_shm *s, uint64_t seq, int32_t l)
{
    return &s->peer_flags[l]->post[seq % ZS_SHM_FLAG_RING].desc;
}

bool zs_shm_all_posted(const struct zs_shm *s, uint64_t seq)
{
    for (int32_t l = 0; l < s->local_size; l++)
        if (__atomic_load_n(&s->peer_flags[l]->post[seq % ZS_SHM_FLAG_RING].posted, __ATOMIC_ACQUIRE) < seq + 1)
            return false;
    return true;
}

bool zs_shm_all_done(const struct zs_shm *s, uint64_t seq)
{
    for (int32_t l = 0; l < s->local_size; l++)
        if (__atomic_load_n(&s->peer_flags[l]->done[seq % ZS_SHM_FLAG_RING], __ATOMIC_ACQUIRE) < seq + 1)
            return false;
    return true;
}

/* ---------------------------------------------------------------- who is missing */

static int32_t not_flagged(const struct zs_shm *s, uint64_t seq, bool done, int32_t *out, int32_t max)
{
    int32_t n = 0;

    for (int32_t l = 0; l < s->local_size && n < max; l++) {
        const struct flags *f = s->peer_flags[l];
        uint64_t v = done ? __atomic_load_n(&f->done[seq % ZS_SHM_FLAG_RING], __ATOMIC_ACQUIRE)
                          : __atomic_load_n(&f->post[seq % ZS_SHM_FLAG_RING].posted, __ATOMIC_ACQUIRE);
        if (v < seq + 1)
            out[n++] = s->global_of[l];
    }
    return n;
}

int32_t zs_shm_not_posted(const struct zs_shm *s, uint64_t seq, int32_t *out, int32_t max)
{
    return not_flagged(s, seq, false, out, max);
}

int32_t zs_shm_not_done(const struct zs_shm *s, uint64_t seq, int32_t *out, int32_t max)
{
    return not_flagged(s, seq, true, out, max);
}

/* A process that is gone cannot be waited for. kill(pid, 0) is enough on one node: every rank of a
 * node shares its pid namespace (the shared window needs one machine), and mpirun's daemon reaps its
 * children at once, so a dead rank does not linger as a zombie with a live pid. */
int32_t zs_shm_gone(const struct zs_shm *s, int64_t *pid)
{
    for (int32_t l = 0; l < s->local_size; l++) {
        int64_t p = s->peer_flags[l]->pid;
        if (l != s->local_rank && p > 0 && kill((pid_t)p, 0) != 0 && errno == ESRCH) {
            *pid = p;
            return s->global_of[l];
        }
    }
    return -1;
}

void zs_shm_set_timeout(struct zs_shm *s, double timeout_s)
{
    s->timeout_s = timeout_s;
}

void zs_shm_nccl_count(struct zs_shm *s)
{
    __atomic_add_fetch(&s->mine->nccl_ops, 1, __ATOMIC_RELEASE);
}

int32_t zs_shm_nccl_behind(const struct zs_shm *s, int32_t *out, int32_t max)
{
    uint64_t mine = __atomic_load_n(&s->mine->nccl_ops, __ATOMIC_ACQUIRE);
    int32_t n = 0;

    for (int32_t l = 0; l < s->local_size && n < max; l++)
        if (__atomic_load_n(&s->peer_flags[l]->nccl_ops, __ATOMIC_ACQUIRE) < mine)
            out[n++] = s->global_of[l];
    return n;
}
