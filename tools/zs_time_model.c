/* zs_time_model.c - the step-time model behind zs-estimate --time: ring (alpha-beta) collectives placed on
 * nodes, per-phase overlap with compute, optimizer at memory bandwidth, offload over PCIe and NVMe. The
 * formulas, their inputs and their validation are in docs/scale.md. */
#include <math.h>
#include <stdio.h>

#include "core/plan.h" /* defines: zs_layout_check */
#include "tools/zs_time_model.h"

/* One collective's time and the bytes it sends across one node's boundary. */
struct coll {
    double t, cross;
};

struct place {
    int n, k, m; /* ranks, ranks per node, nodes */
};

static struct coll coll_add(struct coll a, struct coll b, double times)
{
    return (struct coll){a.t + times * b.t, a.cross + times * b.cross};
}

/* Latency-bound ring steps of a phase: ZeroShard runs one collective per unit, each paying every step. */
static double steps(const struct zs_tm_in *in, int ring_steps)
{
    return (double)ring_steps * (in->units > 0 ? in->units : 1);
}

/* A ring collective over q consecutive ranks moving factor * (q-1)/q of S bytes per rank (1: reduce-scatter or
 * all-gather, 2: all-reduce). Inside a node it runs at intra_bw; across nodes every rank's flow passes one
 * node boundary, shrunk by qfac where that crossing is quantized. */
static struct coll ring(const struct zs_tm_in *in, const struct place *p, double S, int q, int factor, double qfac)
{
    if (q <= 1 || S <= 0) /* one rank, or nothing left to gather (units kept for reuse) */
        return (struct coll){0, 0};
    double per = factor * (double)(q - 1) / q * S;
    if (q <= p->k)
        return (struct coll){steps(in, factor * (q - 1)) * in->intra_lat + per / in->intra_bw, 0};
    double x = per * qfac;
    return (struct coll){steps(in, factor * (q - 1)) * in->inter_lat + fmax(per / in->intra_bw, x / in->inter_bw), x};
}

/* Hybrid sharding's gradient sum across the n/g groups of each rank's shard (S/g bytes). Groups of at least a
 * node: every rank's ring crosses the boundary, k of them per node. Groups inside a node: the node's copies
 * sum locally, then the nodes all-reduce the whole gradient. */
static struct coll cross_group(const struct zs_tm_in *in, const struct place *p, double S, int g, double qfac)
{
    int r = p->n / g;
    if (r <= 1)
        return (struct coll){0, 0};
    if (g >= p->k) {
        double per = 2.0 * (r - 1) / r * S / g, x = p->k * per * qfac;
        return (struct coll){steps(in, 2 * (r - 1)) * in->inter_lat + fmax(per / in->intra_bw, x / in->inter_bw), x};
    }
    int l = p->k / g;
    struct coll local = l > 1 ? (struct coll){steps(in, 2 * (l - 1)) * in->intra_lat + 2.0 * (l - 1) / l * S / g / in->intra_bw, 0}
                              : (struct coll){0, 0};
    if (p->m <= 1)
        return local;
    double x = 2.0 * (p->m - 1) / p->m * S * qfac;
    return coll_add(local, (struct coll){steps(in, 2 * (p->m - 1)) * in->inter_lat + x / in->inter_bw, x}, 1);
}

/* Exposed part of `comm` spread over the units of a phase whose compute is c: with overlap the units
 * pipeline (gather of unit i+1 during compute of unit i), so the first unit's share always waits and the
 * rest only where communication outlasts compute. */
static double exposed(const struct zs_tm_in *in, double comm, double c)
{
    if (!in->overlap || comm <= 0)
        return comm;
    double u = in->units > 0 ? in->units : 1;
    return comm / u + (u - 1) / u * fmax(0, comm - c);
}

static int fail(char *err, size_t errlen, const char *why, int a, int b)
{
    snprintf(err, errlen, why, a, b);
    return -1;
}

/* The shard group g and the backward's gather group h for n ranks, or -1 with why: first what the engine refuses
 * at that world size (its own check, core/plan.h), then the node layout the model needs. */
static int groups(const struct zs_tm_in *in, const struct place *p, int *g, int *h, char *err, size_t errlen)
{
    struct zs_layout_keys k = {.stage = in->stage, .mics = in->mics > 0 ? in->mics : -1, .hpz = in->hpz,
                               .quant_weights = in->quant_weights, .quant_grads = in->quant_grads};

    if (zs_layout_check(&k, p->n, err, errlen))
        return -1;
    *g = in->mics > 0 && in->mics < p->n ? in->mics : p->n;
    if (*g % p->k && p->k % *g)
        return fail(err, errlen, "mics_shard_size %d neither divides nor is a multiple of %d ranks per node", *g,
                    p->k);
    *h = in->stage == 3 && in->hpz > 0 && in->hpz < *g ? in->hpz : *g; /* equal to the group: off, as the engine */
    return 0;
}

int zs_tm_predict(const struct zs_tm_in *in, int gpus, struct zs_tm_out *out, char *err, size_t errlen)
{
    struct place p = {.n = gpus, .k = in->ranks_per_node < gpus ? in->ranks_per_node : gpus};
    int g, h;

    if (p.n % p.k)
        return fail(err, errlen, "%d GPUs are not whole nodes of %d", p.n, p.k);
    p.m = p.n / p.k;
    if (groups(in, &p, &g, &h, err, errlen))
        return -1;
    double qw = in->quant_weights ? (1.0 + 4.0 / in->quant_block) / in->pbytes : 1.0;
    double qg = in->quant_grads ? (1.0 + 4.0 / in->quant_block) / in->gbytes : 1.0;
    double Sp = in->params * in->pbytes, Sg = in->params * in->gbytes;
    int shard = in->stage >= 1 ? g : 1;

    /* compute: the node's cores shared by its ranks when there are fewer cores than ranks */
    double rate = in->flops * (in->cores > 0 && in->cores < p.k ? in->cores / p.k : 1.0);
    double model_flops = in->flops_per_token * in->tokens;
    double c = model_flops * (in->recompute ? 4.0 / 3.0 : 1.0) / rate, c_f = model_flops / 3.0 / rate;
    double c_b = c - c_f;

    /* collectives of every micro-batch, of the window's last micro-batch, and of the step */
    struct coll none = {0, 0}, ag_f = none, ag_f_next = none, ag_b = none, rs_micro = none, red_window = none,
                step = none;
    if (in->stage == 3) {
        /* units released within stage3_max_reuse_distance elements of their next use stay gathered (up to
         * stage3_max_live_parameters): forward's last units into backward, backward's last into the window's
         * next forward; a unit's distance to its next use is twice the elements after it */
        double keep = fmin(1.0, fmin(in->max_reuse / 2, in->max_live) / in->params);
        ag_f = ring(in, &p, Sp, g, 1, qw);
        ag_f_next = ring(in, &p, Sp * (1 - keep), g, 1, qw);
        ag_b = ring(in, &p, Sp * (1 - keep), h, 1, qw);
    }
    if (in->stage >= 2)
        rs_micro = ring(in, &p, Sg, g, 1, qg);
    else if (in->stage == 1)
        red_window = ring(in, &p, Sg, g, 1, qg);
    else
        red_window = ring(in, &p, Sg, p.n, 2, qg);
    if (in->stage == 1 || in->stage == 2)
        step = ring(in, &p, Sp, g, 1, qw); /* the updated shards gathered after the optimizer */
    if (in->stage >= 1)
        step = coll_add(step, cross_group(in, &p, Sg, g, qg), 1);

    double G = in->gas;
    struct coll total = coll_add(coll_add(coll_add(ag_f, ag_f_next, G - 1), ag_b, G), rs_micro, G);
    total = coll_add(coll_add(total, red_window, 1), step, 1);
    double exp = exposed(in, ag_f.t, c_f) + (G - 1) * exposed(in, ag_f_next.t, c_f) +
                 (G - 1) * exposed(in, ag_b.t + rs_micro.t, c_b) +
                 exposed(in, ag_b.t + rs_micro.t + red_window.t, c_b) + step.t;

    /* optimizer over the rank's shard; offload: gradients down and parameters up the rank's PCIe link,
     * stage 3's parameter shards up for each gather, NVMe shared by the node's ranks */
    double mine = in->params / shard, off = 0;
    double opt = in->opt_bpp * mine / (in->offload == ZS_TM_OFFLOAD_NONE ? in->mem_bw : in->host_bw);
    if (in->offload != ZS_TM_OFFLOAD_NONE) {
        off = mine * (in->gbytes + in->pbytes) / in->pcie_bw;
        if (in->stage == 3)
            off += G * 2 * in->params / g * in->pbytes / in->pcie_bw;
    }
    if (in->offload == ZS_TM_OFFLOAD_NVME)
        off += p.k * 2.0 * mine * in->state_bytes / in->nvme_bw;

    *out = (struct zs_tm_out){.gpus = p.n, .nodes = p.m, .compute = G * c, .comm_exposed = exp,
                              .comm_total = total.t, .offload = off, .optimizer = opt, .cross_bytes = total.cross};
    out->step = out->compute + out->comm_exposed + out->offload + out->optimizer;
    out->tflops = G * model_flops / out->step / 1e12;
    return 0;
}
