/* devplace.c - the rank near its GPU: from the device's PCI bus id (device/placement.c, hwloc) to the cores
 * its threads move to and the NUMA node its host pool is allocated on; the CPU keeps start_threads' placement. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"     /* defines: zs_fail, zs_log */
#include "device/placement.h" /* defines: zs_place_near_pci_here */
#include "core/ctx.h"
#include "core/ranks.h"
#include "runtime.h"

/* The node's ranks near the same cores (ranks whose GPUs hang off one package) split them: this rank's slice
 * index among them, and their count. Collective over the node. */
static zs_status near_share(struct zs_ctx *ctx, int32_t key, int32_t *index, int32_t *count)
{
    MPI_Comm node;
    MPI_Request q;
    int32_t *all = calloc((size_t)ctx->local_size, sizeof(int32_t));
    zs_status st = ZS_OK;

    *index = 0;
    *count = 1;
    if (!all)
        return zs_fail(ZS_ERR_NOMEM, "init: out of memory");
    if (MPI_Comm_split_type(ctx->parent, MPI_COMM_TYPE_SHARED, ctx->rank, MPI_INFO_NULL, &node) != MPI_SUCCESS) {
        free(all);
        return zs_fail(ZS_ERR_COMM, "init: could not find the ranks sharing this node");
    }
    if (MPI_Iallgather(&key, 1, MPI_INT32_T, all, 1, MPI_INT32_T, node, &q) != MPI_SUCCESS)
        st = zs_fail(ZS_ERR_COMM, "init: all-gather of the GPUs' places failed");
    else
        st = zs_vote_wait(ctx, &q, "the all-gather of the GPUs' places");
    for (int32_t r = 0; !st && r < ctx->local_size; r++) {
        *index += r < ctx->local_rank && all[r] == key;
        *count += r != ctx->local_rank && all[r] == key;
    }
    MPI_Comm_free(&node);
    free(all);
    return st;
}

/* On a GPU: its PCI bus id leads (hwloc) to the nearest cores and NUMA node; the rank's threads move there and
 * its host pool will be allocated there (offload.c). Where any of it is unknown the rank stays where
 * start_threads put it, with a warning: placement changes speed, never results. The CPU keeps its placement.
 * Collective over the node (every rank has the same device kind). */
zs_status zs_dev_place(struct zs_ctx *ctx)
{
    struct zs_device *d = &ctx->dev;
    char bus[64] = "", why[160] = "";
    hwloc_bitmap_t set;
    int numa = -1, rc = -ENODEV;
    int32_t index, count;
    zs_status st;

    ctx->place.numa = -1;
    if (d->host_access)
        return ZS_OK;
    set = hwloc_bitmap_alloc();
    if (!set)
        return zs_fail(ZS_ERR_NOMEM, "init: out of memory");
    if (!d->ops->pci_bus_id || d->ops->pci_bus_id(d, bus, sizeof(bus)))
        snprintf(why, sizeof(why), "the device names no PCI bus id");
    else if ((rc = zs_place_near_pci_here(bus, set, &numa)))
        snprintf(why, sizeof(why), "hwloc finds no cores near PCI %s (%s)", bus, strerror(-rc));
    st = near_share(ctx, rc ? -1 : hwloc_bitmap_first(set), &index, &count);
    if (!st && !rc) {
        char what[96], node[32] = "";
        if (numa >= 0)
            snprintf(node, sizeof(node), ", NUMA node %d", numa);
        snprintf(what, sizeof(what), "%s %d (PCI %.32s%s)", d->kind == ZS_DEV_CUDA ? "GPU" : "device", d->ordinal, bus,
                 node);
        rc = zs_pool_place(ctx->pool, set, index, count, what);
        if (rc)
            snprintf(why, sizeof(why), "the threads could not move near %s (%s)", what, strerror(-rc));
        ctx->place.numa = numa;
        snprintf(ctx->place.desc, sizeof(ctx->place.desc), "near %s: optimizer threads %s; host pool %s", what,
                 zs_pool_describe(ctx->pool), numa >= 0 ? "on that NUMA node" : "near those threads");
    }
    if (!st && why[0]) {
        snprintf(ctx->place.desc, sizeof(ctx->place.desc), "not placed near the device: %s", why);
        if (!ctx->quiet && d->kind == ZS_DEV_CUDA) /* the separate test device has no PCI link unless a test names one */
            zs_log("rank %d: warning: %s", ctx->rank, ctx->place.desc);
    }
    hwloc_bitmap_free(set);
    return st;
}

