/* comm.c - the collectives: reduce-scatter, all-gather and all-reduce on fp32, nonblocking, summed
 * here in rank order so results never depend on the transport. Peers on this rank's node are read
 * straight from the shared heap (zero copy) when the buffer lives there; every other peer is reached by
 * MPI point-to-point in pipelined pieces. Progress is explicit: every engine call tests the requests.
 * This file: the comm's options, set-up, memory and blocking helpers; the requests and their progress are
 * in comm_req.c, the pieces' sums and copies in comm_pieces.c. */
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "kernels/convert.h" /* defines: zs_cvt_* (16-bit inputs are summed in fp32) */
#include "kernels/copy.h"    /* defines: zs_copy_stream */
#include "comm.h"
#include "comm_impl.h" /* defines: struct zs_comm, struct zs_comm_req, piece_tag, zs_comm_check_progress */
#include "comm/flight.h" /* defines: zs_flight_op_start, zs_flight_op_end, zs_flight_write */
#include "shm.h"

int zs_comm_opts_from_env(struct zs_comm_opts *o, char *err, size_t errlen)
{
    const char *mode = getenv("ZS_COMM"), *fake = getenv("ZS_FAKE_NODE_SIZE"), *tmo = getenv("ZS_TIMEOUT");

    memset(o, 0, sizeof(*o));
    if (mode && *mode) {
        if (!strcmp(mode, "auto"))
            o->mode = ZS_COMM_AUTO;
        else if (!strcmp(mode, "mpi"))
            o->mode = ZS_COMM_MPI;
        else if (!strcmp(mode, "shm"))
            o->mode = ZS_COMM_SHM;
        else {
            snprintf(err, errlen, "ZS_COMM: unknown backend '%s' (auto, mpi, shm)", mode);
            return -EINVAL;
        }
    }
    if (fake && *fake) {
        char *end;
        long v = strtol(fake, &end, 10);
        if (*end || v < 1 || v > 1 << 20) {
            snprintf(err, errlen, "ZS_FAKE_NODE_SIZE: expected a rank count >= 1, got '%s'", fake);
            return -EINVAL;
        }
        o->fake_node_size = (int32_t)v;
    }
    if (tmo && *tmo) {
        char *end;
        double v = strtod(tmo, &end);
        if (*end || !(v > 0) || v > 1e9) {
            snprintf(err, errlen, "ZS_TIMEOUT: expected seconds > 0, got '%s'", tmo);
            return -EINVAL;
        }
        o->timeout_s = v;
        o->timeout_env = true;
    }
    return 0;
}

/* Every rank's host name, so that a timeout names the host whose ranks did not arrive. */
static zs_status gather_hosts(struct zs_comm *c)
{
    char name[MPI_MAX_PROCESSOR_NAME] = "", me[ZS_COMM_HOST_LEN] = "";
    int len = 0, rc;

    if (MPI_Get_processor_name(name, &len) == MPI_SUCCESS)
        snprintf(me, sizeof(me), "%s", name);
    c->hosts = calloc((size_t)c->size, sizeof(*c->hosts));
    if (!c->hosts)
        return zs_fail(ZS_ERR_NOMEM, "comm: out of memory (host names of %d ranks)", c->size);
    rc = MPI_Allgather(me, ZS_COMM_HOST_LEN, MPI_CHAR, c->hosts, ZS_COMM_HOST_LEN, MPI_CHAR, c->comm);
    return rc == MPI_SUCCESS ? ZS_OK : zs_comm_mpi_fail(rc, "MPI_Allgather (host names)", -1);
}

zs_status zs_comm_init(struct zs_comm **out, MPI_Comm parent, const struct zs_comm_opts *opts)
{
    struct zs_comm_opts none = {0};
    struct zs_comm *c = calloc(1, sizeof(*c));
    int rc, flag = 0, *ub = NULL;
    const char *env = getenv("ZS_COMM_PIECE");
    zs_status st;

    if (!opts)
        opts = &none;
    if (!c)
        return zs_fail(ZS_ERR_NOMEM, "comm: out of memory");
    rc = MPI_Comm_dup(parent, &c->comm);
    if (rc != MPI_SUCCESS) {
        free(c);
        return zs_comm_mpi_fail(rc, "MPI_Comm_dup", -1);
    }
    MPI_Comm_set_errhandler(c->comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(c->comm, &c->rank);
    MPI_Comm_size(c->comm, &c->size);
    c->name_base = opts->name_base;
    c->name_stride = opts->name_stride;
    MPI_Comm_get_attr(c->comm, MPI_TAG_UB, &ub, &flag);
    c->tag_ub = (flag && ub && *ub > 0) ? *ub : 32767;
    c->piece = ZS_COMM_PIECE_DEFAULT;
    c->timeout_s = opts->timeout_s > 0 ? opts->timeout_s : ZS_TIMEOUT_DEFAULT;
    c->next_unit = -1;
    c->flight = zs_flight_new(c->rank, c->size, opts->flight_dir);
    zs_flight_set_name(c->flight, opts->name);
    if (env && atoll(env) > 0)
        c->piece = atoll(env);
    zs_comm_hooks_from_env(c);
    st = zs_comm_tags_plan(c);
    if (!st)
        st = gather_hosts(c);
    if (!st && opts->mode != ZS_COMM_MPI && !(st = zs_shm_init(&c->shm, c->comm, opts->fake_node_size)))
        zs_shm_set_timeout(c->shm, c->timeout_s);
    if (st) {
        zs_flight_free(c->flight);
        MPI_Comm_free(&c->comm);
        free(c->hosts);
        free(c);
        return st;
    }
    for (int32_t j = 0; j < c->size; j++)
        c->nremote += zs_comm_is_remote(c, j);
    if (!c->shm)
        snprintf(c->desc, sizeof(c->desc), "mpi (point-to-point between all %d ranks)", c->size);
    else if (zs_shm_nodes(c->shm) == 1)
        snprintf(c->desc, sizeof(c->desc), "shm (one node of %d ranks%s)", c->size,
                 opts->fake_node_size ? ", forced" : "");
    else
        snprintf(c->desc, sizeof(c->desc), "shm+mpi (%d nodes%s, shared memory inside, MPI between)",
                 zs_shm_nodes(c->shm), opts->fake_node_size ? " forced by ZS_FAKE_NODE_SIZE" : "");
    *out = c;
    return ZS_OK;
}

void zs_comm_free(struct zs_comm *c)
{
    if (!c)
        return;
    while (c->active)
        zs_comm_wait(c, c->active);
    zs_comm_reap_dead(c);
    while (c->free_scratch) {
        struct scratch *s = c->free_scratch;
        c->free_scratch = s->next;
        free(s->data);
        free(s);
    }
    zs_shm_free(c->shm);
    zs_flight_free(c->flight);
    MPI_Comm_free(&c->comm);
    free(c->hosts);
    free(c);
}

struct zs_flight *zs_comm_flight(const struct zs_comm *c)
{
    return c ? c->flight : NULL;
}

void zs_comm_flight_dump(struct zs_comm *c, const char *why)
{
    if (c)
        zs_flight_write(c->flight, why);
}


int32_t zs_comm_rank(const struct zs_comm *c) { return c->rank; }
int32_t zs_comm_size(const struct zs_comm *c) { return c->size; }
MPI_Comm zs_comm_mpi(const struct zs_comm *c) { return c->comm; }
const char *zs_comm_describe(const struct zs_comm *c) { return c->desc; }
int32_t zs_comm_local_size(const struct zs_comm *c) { return c->shm ? zs_shm_local_size(c->shm) : 1; }
int32_t zs_comm_local_rank(const struct zs_comm *c) { return c->shm ? zs_shm_local_rank(c->shm) : 0; }

bool zs_comm_broken(const struct zs_comm *c)
{
    return c->broken != ZS_OK;
}

uint64_t zs_comm_scratch_bytes(const struct zs_comm *c)
{
    return c->scratch_bytes;
}

bool zs_comm_shared(const struct zs_comm *c)
{
    return c && c->shm;
}

void *zs_comm_alloc_agreed(struct zs_comm *c, size_t bytes, bool local_ok)
{
    void *p = NULL;
    size_t sz = (bytes + 63) / 64 * 64;

    if (c->shm)
        return zs_shm_alloc(c->shm, bytes, local_ok);
    if (!local_ok)
        return NULL;
    if (posix_memalign(&p, 64, sz ? sz : 64)) {
        zs_fail(ZS_ERR_NOMEM, "comm: out of memory for a %zu-byte buffer", bytes);
        return NULL;
    }
    memset(p, 0, sz);
    return p;
}

void *zs_comm_alloc(struct zs_comm *c, size_t bytes)
{
    return zs_comm_alloc_agreed(c, bytes, true);
}

void zs_comm_release(struct zs_comm *c, void *p)
{
    if (!p)
        return;
    if (c->shm)
        zs_shm_release(c->shm, p);
    else
        free(p);
}

/* ---------------------------------------------------------------- blocking helpers */

zs_status zs_comm_bcast(struct zs_comm *c, void *buf, int64_t bytes, int32_t root)
{
    char *p = buf, what[96];

    if (c->broken)
        return zs_comm_broken_fail(c);
    while (bytes > 0) {
        int len = bytes > (1 << 30) ? (1 << 30) : (int)bytes;
        MPI_Request r;
        int rc = MPI_Ibcast(p, len, MPI_BYTE, root, c->comm, &r);
        if (rc != MPI_SUCCESS)
            return zs_comm_mpi_fail(rc, "broadcast", root);
        snprintf(what, sizeof(what), "a broadcast of %d bytes from rank %d", len, root);
        zs_status st = zs_comm_mpi_wait(c, &r, what);
        if (st)
            return st;
        p += len;
        bytes -= len;
    }
    return ZS_OK;
}

/* Through the checked all-gather, on 4-byte words: every rank's share padded to whole words. */
zs_status zs_comm_allgather_bytes(struct zs_comm *c, const void *mine, void *all, int32_t bytes)
{
    int64_t words = ((int64_t)bytes + 3) / 4;
    float *buf = calloc((size_t)(words * c->size), sizeof(float));
    struct zs_comm_req *q = NULL;
    zs_status st;

    if (!buf)
        return zs_fail(ZS_ERR_NOMEM, "comm: out of memory");
    memcpy(buf + (size_t)c->rank * (size_t)words, mine, (size_t)bytes);
    st = zs_comm_all_gather(c, buf, words, &q);
    if (!st)
        st = zs_comm_wait(c, q);
    for (int32_t r = 0; !st && r < c->size; r++)
        memcpy((char *)all + (size_t)r * (size_t)bytes, buf + (size_t)r * (size_t)words, (size_t)bytes);
    if (!c->broken) /* else the network may still write into it: kept, like the request */
        free(buf);
    return st;
}

/* ---------------------------------------------------------------- traffic */

/* Process-wide, so every comm of the process (the engine's, sub-communicators) adds to one sum; relaxed
 * atomics since a program may drive two comms from two threads. */
static uint64_t traffic_cross, traffic_intra, traffic_header;

void zs_comm_count(const struct zs_comm *c, int32_t peer, uint64_t bytes)
{
    uint64_t *to = zs_comm_is_remote(c, peer) ? &traffic_cross : &traffic_intra;

    __atomic_fetch_add(to, bytes, __ATOMIC_RELAXED);
}

void zs_comm_count_header(uint64_t bytes)
{
    __atomic_fetch_add(&traffic_header, bytes, __ATOMIC_RELAXED);
}

void zs_comm_traffic(uint64_t *cross_node, uint64_t *intra_node, uint64_t *header_bytes)
{
    *cross_node = __atomic_load_n(&traffic_cross, __ATOMIC_RELAXED);
    *intra_node = __atomic_load_n(&traffic_intra, __ATOMIC_RELAXED);
    if (header_bytes)
        *header_bytes = __atomic_load_n(&traffic_header, __ATOMIC_RELAXED);
}
