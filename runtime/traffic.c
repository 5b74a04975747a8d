/* traffic.c - zs_traffic: the process's collective bytes across and inside the node boundary, as comm/ counts
 * them, for the examples' traffic line and the scale benchmarks. */
#include <stdint.h>

#include "base/error.h"
#include "comm/comm.h" /* defines: zs_comm_traffic */
#include "zeroshard.h"

zs_status zs_traffic(const zs_ctx *ctx, uint64_t *cross_node_bytes, uint64_t *intra_node_bytes)
{
    (void)ctx; /* the counter is process-wide: every comm adds to it */
    if (!cross_node_bytes || !intra_node_bytes)
        return zs_fail(ZS_ERR_INVALID, "zs_traffic: NULL argument");
    zs_comm_traffic(cross_node_bytes, intra_node_bytes, NULL);
    return ZS_OK;
}
