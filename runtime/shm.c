/* shm.c - node layout, the shared heap (MPI-3 shared windows) and the operation flags.
 * The heap's allocator is deterministic (first fit over an offset-sorted free list), so identical call
 * sequences on every rank of a node give identical offsets: rank r finds peer l's copy of its buffer at
 * peer_base[l] + (p - my_base). */
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "shm.h"

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

struct flags {
    uint64_t posted[ZS_SHM_FLAG_RING];
    uint64_t done[ZS_SHM_FLAG_RING];
};

struct zs_shm {
    MPI_Comm node;
    int32_t local_rank, local_size, nodes;
    int32_t *local_of;       /* global rank -> local index or -1 */
    struct segment *segs;
    int32_t nsegs;
    uint64_t heap_bytes;
    MPI_Win flag_win;
    struct flags *mine;
    struct flags **peer_flags;
};

static zs_status node_layout(struct zs_shm *s, MPI_Comm comm, int32_t fake)
{
    int rank, size, color, *node_of_rank;
    MPI_Group world_group, node_group;

    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
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
    /* Count nodes: the lowest global rank of each node is its leader. */
    int leader = globals[0], is_leader = rank == leader;
    MPI_Allreduce(&is_leader, &s->nodes, 1, MPI_INT, MPI_SUM, comm);
    MPI_Group_free(&world_group);
    MPI_Group_free(&node_group);
    free(locals);
    free(globals);
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

zs_status zs_shm_init(struct zs_shm **out, MPI_Comm comm, int32_t fake)
{
    struct zs_shm *s = calloc(1, sizeof(*s));
    char **peers = NULL;
    zs_status st;

    if (!s)
        return zs_fail(ZS_ERR_NOMEM, "comm: out of memory");
    st = node_layout(s, comm, fake);
    if (!st) {
        if (MPI_Win_allocate_shared((MPI_Aint)sizeof(struct flags), 1, MPI_INFO_NULL, s->node, &s->mine,
                                    &s->flag_win) != MPI_SUCCESS)
            st = zs_fail(ZS_ERR_COMM, "comm: could not allocate the shared flags");
    }
    if (!st) {
        memset(s->mine, 0, sizeof(*s->mine));
        st = map_window(s, s->flag_win, (char *)s->mine, &peers);
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
    if (s->mine)
        MPI_Win_free(&s->flag_win);
    if (s->node != MPI_COMM_NULL && s->node)
        MPI_Comm_free(&s->node);
    free(s->local_of);
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

static int grow(struct zs_shm *s, size_t bytes)
{
    size_t size = bytes > ZS_SHM_SEGMENT_MIN ? bytes : ZS_SHM_SEGMENT_MIN;
    struct segment *segs = realloc(s->segs, (size_t)(s->nsegs + 1) * sizeof(*segs)), *g;
    char **peers;

    if (!segs)
        return -1;
    s->segs = segs;
    g = &segs[s->nsegs];
    memset(g, 0, sizeof(*g));
    if (MPI_Win_allocate_shared((MPI_Aint)size, 1, MPI_INFO_NULL, s->node, &g->base, &g->win) != MPI_SUCCESS)
        return -1;
    if (map_window(s, g->win, g->base, &peers)) {
        MPI_Win_free(&g->win);
        return -1;
    }
    g->peer = peers;
    g->size = size;
    g->free_list = block_new(0, size, NULL);
    s->nsegs++;
    s->heap_bytes += size;
    return g->free_list ? 0 : -1;
}

void *zs_shm_alloc(struct zs_shm *s, size_t bytes)
{
    size_t need = (bytes + ZS_SHM_ALIGN - 1) / ZS_SHM_ALIGN * ZS_SHM_ALIGN;

    if (need == 0)
        need = ZS_SHM_ALIGN;
    for (int pass = 0; pass < 2; pass++) {
        for (int32_t i = 0; i < s->nsegs; i++) {
            struct segment *g = &s->segs[i];
            for (struct block **pp = &g->free_list; *pp; pp = &(*pp)->next) {
                struct block *b = *pp;
                if (b->size < need)
                    continue;
                struct block *u = block_new(b->off, need, g->used);
                if (!u)
                    return NULL;
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
        }
        if (pass == 0 && grow(s, need))
            return NULL;
    }
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

void zs_shm_post(struct zs_shm *s, uint64_t seq)
{
    __atomic_store_n(&s->mine->posted[seq % ZS_SHM_FLAG_RING], seq + 1, __ATOMIC_RELEASE);
}

void zs_shm_done(struct zs_shm *s, uint64_t seq)
{
    __atomic_store_n(&s->mine->done[seq % ZS_SHM_FLAG_RING], seq + 1, __ATOMIC_RELEASE);
}

bool zs_shm_all_posted(const struct zs_shm *s, uint64_t seq)
{
    for (int32_t l = 0; l < s->local_size; l++)
        if (__atomic_load_n(&s->peer_flags[l]->posted[seq % ZS_SHM_FLAG_RING], __ATOMIC_ACQUIRE) < seq + 1)
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
