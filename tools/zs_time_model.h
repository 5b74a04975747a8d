/* zs_time_model.h - zs-estimate --time: a step-time model of a ZeRO run (compute, exposed communication,
 * offload, optimizer) from the model's shape, the ZeRO settings and the machine's rates; docs/scale.md
 * writes its formulas down. */
#ifndef ZS_TIME_MODEL_H
#define ZS_TIME_MODEL_H

#include <stdbool.h>
#include <stddef.h>

enum zs_tm_offload { ZS_TM_OFFLOAD_NONE, ZS_TM_OFFLOAD_CPU, ZS_TM_OFFLOAD_NVME };

/* One run's inputs. Rates in bytes/s and FLOP/s, latencies in seconds. */
struct zs_tm_in {
    double params;             /* parameter count */
    int units;                 /* gather/reduce units (layers): the first of a phase is never hidden */
    double flops_per_token;    /* forward + backward, without recomputation */
    double tokens;             /* per rank per micro-batch: micro-batch x sequence */
    int gas, stage, mics, hpz; /* mics/hpz 0: off */
    bool quant_weights, quant_grads, recompute, overlap;
    int quant_block;             /* elements per int8 block (one fp32 scale each) */
    int pbytes, gbytes, opt_bpp; /* parameter, reduced-gradient bytes; optimizer bytes moved per parameter */
    int state_bytes;             /* fp32 master + optimizer states per parameter (NVMe swapping) */
    enum zs_tm_offload offload;
    double flops, intra_bw, inter_bw, pcie_bw, nvme_bw, mem_bw, host_bw, intra_lat, inter_lat;
    int ranks_per_node;
    double cores; /* cores a node's ranks share (fractions: a loaded machine's share); 0: one device each */
    double max_live, max_reuse; /* stage3_max_live_parameters, stage3_max_reuse_distance (elements) */
};

/* One GPU count's prediction, seconds per optimizer step. */
struct zs_tm_out {
    int gpus, nodes;
    double compute, comm_exposed, comm_total, offload, optimizer, step;
    double cross_bytes; /* bytes crossing one node's boundary (one way) per step */
    double tflops;      /* achieved model TFLOP/s per GPU */
};

/* 0, or -1 with why in err (this GPU count cannot run the settings, e.g. a shard size that does not
 * divide it). */
int zs_tm_predict(const struct zs_tm_in *in, int gpus, struct zs_tm_out *out, char *err, size_t errlen);

/* zs-estimate --time: its own options (argv holds --time somewhere); the process exit code. */
int zs_time_main(int argc, char **argv);

#endif
