/* train_gpt.c - zs-train-gpt: a GPT-2-style byte-level transformer trained through ZeroShard under any
 * DeepSpeed-style config. One unit per block plus the embeddings and the final LayerNorm; prints the loss
 * per step, validation loss, a generated sample and, last, `params-hash`. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cblas.h>  /* defines: openblas_set_num_threads */
#include <hwloc.h>  /* defines: hwloc_get_nbobjs_by_type (the node's cores) */
#include <mpi.h>
#include <omp.h>

#include "../common.h"
#include "../splitmix.h" /* defines: ex_splitmix64 */
#include "blascore.h" /* defines: gpt_blas_fix_core, gpt_blas_core */
#include "data.h"
#include "gpt_cuda.h" /* defines: gpt_gpu_open, gpt_gpu_run (--device cuda) */
#include "mm16.h"  /* defines: gpt_mm16_available */
#include "model.h"
#include "vmath.h" /* defines: gpt_vmath (bf16 widening and accumulation, 16 lanes at a time) */
#include "zeroshard.h"

struct opts {
    struct ex_run_opts run;
    const char *data, *metrics, *device, *prompt;
    int64_t layers, dim, heads, ctx, val_every, val_batches, sample, top_k;
    uint64_t sample_seed;
    double temperature, top_p;
    int recompute;
};

struct tensor_init {
    struct gpt_tensor_info info;
    uint64_t seed;
    int32_t unit, k;
};

/* The program's view of the engine: fetched units widened to fp32 when the parameters are 16-bit, and
 * fp32 gradient scratch folded into the engine's buffer when a unit is complete. Two slots, since the
 * embedding unit is live (head) while the final LayerNorm is. With bf16 products (mm16) the blocks'
 * weight matrices stay in the engine's bf16 buffer (io_fetched16) and only the rest is widened. */
struct engine_io {
    zs_ctx *ctx;
    const struct gpt_config *cfg;
    const struct gpt_layout *lay;
    zs_dtype dt;
    bool mm16;
    const uint16_t *raw[2];
    float *w[2], *g[2];
    bool not_last; /* deterministic mode: a micro-shard before the micro-batch's last (deposit, no ready) */
};

static int slot(int32_t unit) { return unit == GPT_UNIT_EMBED ? 0 : 1; }

static int io_fetch(void *arg, int32_t unit, const float **w)
{
    struct engine_io *e = arg;
    void *data;
    zs_status st = zs_unit_fetch(e->ctx, unit, &data);

    if (st)
        return (int)st;
    if (e->dt == ZS_DTYPE_FP32) {
        *w = data;
        return 0;
    }
    float *dst = e->w[slot(unit)];
    const uint16_t *src = data;
    bool block = unit != GPT_UNIT_EMBED && unit != GPT_UNIT_LNF(e->cfg);
    for (int32_t k = 0; k < gpt_unit_tensors(e->cfg, unit); k++) {
        struct gpt_tensor_info t;
        gpt_tensor_info(e->cfg, unit, k, &t);
        if (e->mm16 && block && t.ndim == 2) /* read in bf16 by the products, never widened */
            continue;
        if (e->dt == ZS_DTYPE_BF16)
            gpt_vmath()->from_bf16(dst + e->lay->off[unit][k], src + e->lay->off[unit][k], t.numel);
        else
            for (int64_t i = e->lay->off[unit][k]; i < e->lay->off[unit][k] + t.numel; i++)
                dst[i] = ex_h2f(e->dt, src[i]);
    }
    e->raw[slot(unit)] = src;
    *w = dst;
    return 0;
}

static const uint16_t *io_fetched16(void *arg, int32_t unit)
{
    struct engine_io *e = arg;

    return e->mm16 ? e->raw[slot(unit)] : NULL;
}

static int io_release(void *arg, int32_t unit)
{
    return (int)zs_unit_release(((struct engine_io *)arg)->ctx, unit);
}

static int io_grad(void *arg, int32_t unit, float **g)
{
    struct engine_io *e = arg;

    *g = e->g[slot(unit)];
    memset(*g, 0, (size_t)e->lay->unit_numel[unit] * sizeof(float));
    return 0;
}

static int io_grad_done(void *arg, int32_t unit)
{
    struct engine_io *e = arg;
    const float *g = e->g[slot(unit)];
    void *buf;
    zs_status st = zs_grad_buffer(e->ctx, unit, &buf);

    if (st)
        return (int)st;
    if (e->dt == ZS_DTYPE_BF16)
        gpt_vmath()->add_bf16(buf, g, e->lay->unit_numel[unit]);
    else
        for (int64_t i = 0; i < e->lay->unit_numel[unit]; i++) {
            if (e->dt == ZS_DTYPE_FP32)
                ((float *)buf)[i] += g[i];
            else
                ((uint16_t *)buf)[i] = ex_f2h(e->dt, ex_h2f(e->dt, ((uint16_t *)buf)[i]) + g[i]);
        }
    if ((st = zs_grad_deposit(e->ctx, unit)) || e->not_last) /* the deposit: a no-op in the normal mode */
        return (int)st;
    return (int)zs_grad_ready(e->ctx, unit);
}

static void init_values(void *arg, int32_t param, int64_t first, int64_t count, float *dst)
{
    const struct tensor_init *t = arg;

    (void)param;
    for (int64_t i = 0; i < count; i++)
        dst[i] = gpt_init_value(&t->info, t->seed, t->unit, t->k, first + i);
}

/* Registers every tensor (unit by unit) and reads back where the engine put each one. */
static zs_status register_model(zs_ctx *ctx, const struct gpt_config *cfg, uint64_t seed, struct tensor_init *ti,
                                struct gpt_layout *lay)
{
    zs_status st = ZS_OK;
    int32_t n = 0, unit, param;

    for (int32_t u = 0; u < lay->nunits && !st; u++) {
        char name[32];
        snprintf(name, sizeof(name), u == GPT_UNIT_EMBED ? "embed" : u == GPT_UNIT_LNF(cfg) ? "ln_f" : "h.%d",
                 u - 1);
        if ((st = zs_unit_add(ctx, name, &unit)))
            break;
        for (int32_t k = 0; k < gpt_unit_tensors(cfg, u) && !st; k++, n++) {
            struct tensor_init *t = &ti[n];
            int64_t off;
            *t = (struct tensor_init){.seed = seed, .unit = u, .k = k};
            gpt_tensor_info(cfg, u, k, &t->info);
            if (!(st = zs_param_add_init(ctx, unit, t->info.name, t->info.numel, init_values, t, &param)) &&
                !(st = zs_param_shape(ctx, param, t->info.ndim, t->info.dims)) &&
                !(st = zs_param_info(ctx, param, NULL, NULL, NULL, &off))) {
                lay->off[u][k] = off;
                lay->unit_numel[u] = off + t->info.numel;
            }
        }
    }
    return st;
}

/* ---------------------------------------------------------------- threads */

/* BLAS and OpenMP get this rank's share of the node's cores, the share the optimizer's pool takes, so
 * ranks on one node never oversubscribe it. */
/* This rank's share of the node's cores, by the same rule as zs_init's thread pool (kernels/threads.c):
 * local rank r of L on C cores gets cores [r*C/L, (r+1)*C/L), at least one. */
static int core_share(void)
{
    MPI_Comm node;
    int local = 1, lrank = 0, cores = 1;
    hwloc_topology_t topo;

    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    MPI_Comm_size(node, &local);
    MPI_Comm_rank(node, &lrank);
    MPI_Comm_free(&node);
    if (!hwloc_topology_init(&topo)) {
        if (!hwloc_topology_load(topo))
            cores = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE);
        hwloc_topology_destroy(topo);
    }
    if (local > cores)
        return 1;
    return (int)((int64_t)(lrank + 1) * cores / local - (int64_t)lrank * cores / local);
}

/* BLAS and OpenMP threads for the model's compute. Called after zs_init, which binds this thread to the
 * rank's share of cores (widening mpirun's one-core binding of small jobs): the threads started here
 * inherit that binding. OpenMP starts its threads at the first parallel region, hence the empty one;
 * OpenBLAS starts the threads it lacks in openblas_set_num_threads. */
static void start_compute_threads(void)
{
    int share = core_share();

    openblas_set_num_threads(share);
    omp_set_num_threads(share);
#pragma omp parallel
    {
        (void)0;
    }
}

/* ---------------------------------------------------------------- command line */

static const char usage[] = "usage: mpirun -np N zs-train-gpt --config FILE [options]\n"
                            "Trains a GPT-2-style byte-level transformer through ZeroShard. Defaults: --steps 100, --seed 1.\n" EX_AUTO_HELP;

static int parse_args(int argc, char **argv, struct opts *o)
{
    *o = (struct opts){.run = {.steps = 100, .micro = 8, .lr = 1e-3, .seed = 1}, .layers = 4, .dim = 128,
                       .heads = 4, .ctx = 64, .val_every = 50, .val_batches = 4, .sample = 200, .temperature = 0.8,
                       .top_p = 1, .sample_seed = 1, .device = "cpu", .prompt = ""};
    const struct cli_flag own[] = {
        {"--layers", CLI_INT, &o->layers, "transformer blocks (default 4)"},
        {"--dim", CLI_INT, &o->dim, "model width (default 128)"},
        {"--heads", CLI_INT, &o->heads, "attention heads, dividing --dim (default 4)"},
        {"--ctx", CLI_INT, &o->ctx, "context length in bytes (default 64)"},
        {"--data", CLI_STR, &o->data, "text FILE or DIR (default: " GPT_DEFAULT_CORPUS " text files)"},
        {"--val-every", CLI_INT, &o->val_every, "validation loss every N steps, 0 = only at the end (default 50)"},
        {"--val-batches", CLI_INT, &o->val_batches, "global batches of held-out data per validation (default 4)"},
        {"--sample", CLI_INT, &o->sample, "bytes of text to generate at the end, 0 = none (default 200)"},
        {"--temperature", CLI_NUM, &o->temperature, "sampling temperature (default 0.8)"},
        {"--top-k", CLI_INT, &o->top_k, "sample only from the K likeliest bytes, 0 = all 256 (default 0)"},
        {"--top-p", CLI_NUM, &o->top_p, "nucleus: sample only from the likeliest bytes whose probabilities sum to P, "
                                        "0 < P <= 1 (default 1 = all)"},
        {"--prompt", CLI_TEXT, &o->prompt, "text the sample continues, printed before it (default: none)"},
        {"--sample-seed", CLI_U64, &o->sample_seed, "sampling seed (default 1)"},
        {"--metrics", CLI_STR, &o->metrics, "write one JSON line per step to FILE"},
        {"--recompute", CLI_SWITCH, &o->recompute, "activation checkpointing: keep block inputs, redo forward"},
        {"--device", CLI_STR, &o->device, "cpu or cuda: where the layers run, cuda with cuBLAS (default cpu)"},
    };
    int rc = ex_parse(argc, argv, &o->run, own, (int)(sizeof(own) / sizeof(own[0])), usage);

    if (rc)
        return rc;
    if (o->val_every < 0 || o->val_batches < 1 || o->sample < 0 || o->temperature <= 0) {
        fprintf(stderr, "zeroshard: error: --val-every and --sample must be >= 0, --val-batches and --temperature "
                        "positive\n");
        return -1;
    }
    if (strcmp(o->device, "cpu") && strcmp(o->device, "cuda")) {
        fprintf(stderr, "zeroshard: error: --device: expected cpu or cuda, got \"%s\"\n", o->device);
        return -1;
    }
    if (!strcmp(o->device, "cuda") && o->recompute) {
        fprintf(stderr, "zeroshard: error: --device cuda does not implement --recompute (it keeps every block's "
                        "activations on the GPU)\n");
        return -1;
    }
    if (o->top_k < 0 || o->top_k > 256) {
        fprintf(stderr, "zeroshard: error: --top-k: expected 0 (all bytes) to 256, got %lld\n", (long long)o->top_k);
        return -1;
    }
    if (!(o->top_p > 0 && o->top_p <= 1)) {
        fprintf(stderr, "zeroshard: error: --top-p: expected a probability above 0 and at most 1, got %g\n", o->top_p);
        return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------- validation and sampling */

struct run {
    zs_ctx *ctx;
    struct engine_io *eio;
    struct gpt_model_f32 model;
    struct gpt_gpu *gpu; /* --device cuda, else NULL */
    struct gpt_io_f32 io;
    struct gpt_data data;
    int32_t *in, *tg;
    int64_t B, gas;
    int rank, world;
    bool preempted; /* SIGTERM: stopped after a step, checkpoint saved */
};

/* One pass of the model (gpt_model_run_f32's arguments) on the CPU or the GPU; a CUDA failure is printed
 * here, by name, and returned as ZS_ERR_UNSUPPORTED. */
static int model_run(struct run *r, const int32_t *in, const int32_t *tg, int64_t B, int train, double scale,
                     double *loss)
{
    if (!r->gpu)
        return gpt_model_run_f32(&r->model, &r->io, in, tg, B, train, scale, loss);
    int rc = gpt_gpu_run(r->gpu, &r->io, in, tg, B, train, scale, loss);
    if (rc && gpt_gpu_error(r->gpu)[0]) {
        fprintf(stderr, "zeroshard: error: rank %d: --device cuda: %s\n", r->rank, gpt_gpu_error(r->gpu));
        return (int)ZS_ERR_UNSUPPORTED;
    }
    return rc;
}

/* The mean loss over val_batches global batches of fixed held-out sequences. Collective. */
static int validate(struct run *r, const struct opts *o, double *loss)
{
    double sum = 0, all = 0, l;
    int64_t per = r->gas * o->val_batches;

    for (int64_t m = 0; m < per; m++) {
        gpt_data_batch(&r->data, o->run.seed, -1, (m * r->world + r->rank) * r->B, r->B, o->ctx, r->in, r->tg);
        int rc = model_run(r, r->in, r->tg, r->B, 0, 1.0, &l);
        if (rc)
            return rc;
        sum += l;
    }
    all = sum;
    zs_status st = zs_allreduce_sum(r->ctx, &all, 1);
    if (st)
        return (int)st;
    *loss = all / (double)(per * r->world);
    return 0;
}

static double uniform01(uint64_t seed, uint64_t i)
{
    return (double)(ex_splitmix64((seed - 1) * 0x9e3779b97f4a7c15ULL + i) >> 11) * (1.0 / 9007199254740992.0);
}

/* Top-k: zeroes the weight of every byte outside the k likeliest (ties go to the lower byte, so the set is
 * always exactly k). The rare tail is where a small model's misspellings come from. */
static void keep_top_k(const float *z, double *p, int64_t k)
{
    for (int c = 0; c < 256 && k > 0 && k < 256; c++) {
        int64_t above = 0;
        for (int d = 0; d < 256; d++)
            above += z[d] > z[c] || (z[d] == z[c] && d < c);
        if (above >= k)
            p[c] = 0;
    }
}

/* Top-p (nucleus): keeps the likeliest bytes, in top-k's order, until their share of the weight reaches
 * top_p, and zeroes the rest; the likeliest byte always stays. A cut that adapts to the model's certainty:
 * after "th" few bytes are kept, after a space many. */
static void keep_top_p(const float *z, double *p, double top_p)
{
    double total = 0, kept = 0;
    int order[256];

    if (top_p >= 1)
        return;
    for (int c = 0; c < 256; c++) {
        int above = 0;
        for (int d = 0; d < 256; d++)
            above += z[d] > z[c] || (z[d] == z[c] && d < c);
        order[above] = c;
        total += p[c];
    }
    int k = 0;
    while (k < 256 && (k == 0 || kept < top_p * total))
        kept += p[order[k++]];
    for (; k < 256; k++)
        p[order[k]] = 0;
}

static void print_byte(uint8_t c)
{
    putchar(c == '\n' || c == '\t' || (c >= 32 && c < 127) ? c : '?');
}

/* Generates o->sample bytes after a newline and the prompt, each from the last ctx bytes and a uniform draw
 * indexed by its position in the text (so a prompt that is an earlier sample's beginning continues it
 * byte for byte); every rank computes the same (the units are collective), rank 0 prints the prompt and
 * the bytes generated, bytes other than printable ASCII, newline and tab (the fortunes indent their
 * attributions with tabs) shown as '?'. */
static int sample_text(struct run *r, const struct opts *o)
{
    int64_t T = o->ctx, V = 256, plen = (int64_t)strlen(o->prompt), n = 1 + plen;
    uint8_t *text = calloc((size_t)(o->sample + n), 1);
    double p[256];

    if (!text)
        return (int)ZS_ERR_NOMEM;
    text[0] = '\n';
    memcpy(text + 1, o->prompt, (size_t)plen);
    for (int64_t i = 0; i < o->sample; i++, n++) {
        int64_t start = n > T ? n - T : 0, len = n - start;
        for (int64_t t = 0; t < T; t++)
            r->in[t] = t < len ? text[start + t] : 0;
        int rc = model_run(r, r->in, NULL, 1, 0, 1.0, NULL);
        if (rc) {
            free(text);
            return rc;
        }
        const float *z = (r->gpu ? gpt_gpu_logits(r->gpu) : r->model.logits) + (len - 1) * V;
        double mx = z[0], sum = 0, u = uniform01(o->sample_seed, (uint64_t)n), acc = 0;
        for (int c = 1; c < V; c++)
            mx = z[c] > mx ? z[c] : mx;
        for (int c = 0; c < V; c++)
            p[c] = exp(((double)z[c] - mx) / o->temperature);
        keep_top_k(z, p, o->top_k);
        keep_top_p(z, p, o->top_p);
        for (int c = 0; c < V; c++)
            sum += p[c];
        int pick = V - 1;
        for (int c = 0; c < V; c++)
            if ((acc += p[c] / sum) > u) {
                pick = c;
                break;
            }
        text[n] = (uint8_t)pick;
    }
    if (r->rank == 0) {
        printf("sample (%lld bytes, temperature %g, top-k %lld, top-p %g, seed %llu%s):\n", (long long)o->sample,
               o->temperature, (long long)(o->top_k ? o->top_k : V), o->top_p, (unsigned long long)o->sample_seed,
               plen ? ", after the prompt" : "");
        for (int64_t i = 1; i < n; i++)
            print_byte(text[i]);
        printf("\n--- end of sample\n");
    }
    free(text);
    return 0;
}

/* ---------------------------------------------------------------- training */

/* Deterministic mode: each micro-batch is one forward and backward per micro-shard (ms sequences, the
 * loss their mean), each gradient deposited whole, so no sum depends on how many sequences this rank
 * has; the loss is the mean over the step's micro-shards in their global order. */
static int train_step_det(struct run *r, const struct opts *o, int64_t step, int64_t ms, double *loss)
{
    int64_t per = r->B / ms;
    double *l = malloc((size_t)(r->gas * per) * sizeof(double));
    zs_step_stats s;
    int rc = l ? 0 : (int)ZS_ERR_NOMEM;

    for (int64_t m = 0; m < r->gas && !rc; m++) {
        zs_stats(r->ctx, &s);
        for (int64_t j = 0; j < per && !rc; j++) {
            gpt_data_batch(&r->data, o->run.seed, step, (m * r->world + r->rank) * r->B + j * ms, ms, o->ctx, r->in,
                           r->tg);
            r->eio->not_last = j + 1 < per;
            rc = model_run(r, r->in, r->tg, ms, 1, s.loss_scale, &l[m * per + j]);
        }
        if (!rc)
            rc = (int)zs_step(r->ctx);
    }
    if (!rc)
        *loss = ex_det_loss(l, r->gas, per, r->world);
    free(l);
    return rc;
}

/* One optimizer step: gas micro-batches of this rank's slice of the global batch. */
static int train_step(struct run *r, const struct opts *o, int64_t step, double *loss)
{
    double sum = 0, l;
    zs_step_stats s;

    if (zs_micro_shard_size(r->ctx))
        return train_step_det(r, o, step, zs_micro_shard_size(r->ctx), loss);
    for (int64_t m = 0; m < r->gas; m++) {
        zs_stats(r->ctx, &s); /* fp16: backward runs on loss x scale; 1 otherwise */
        gpt_data_batch(&r->data, o->run.seed, step, (m * r->world + r->rank) * r->B, r->B, o->ctx, r->in, r->tg);
        int rc = model_run(r, r->in, r->tg, r->B, 1, s.loss_scale, &l);
        if (rc || (rc = (int)zs_step(r->ctx)))
            return rc;
        sum += l;
    }
    *loss = sum; /* under the watchdog, like every other exchange */
    zs_status st = zs_allreduce_sum(r->ctx, loss, 1);
    if (st)
        return (int)st;
    *loss /= (double)(r->gas * r->world);
    return 0;
}

static void report_step(const struct run *r, const struct opts *o, FILE *metrics, double loss, double secs,
                        double val)
{
    zs_step_stats s;
    zs_stats(r->ctx, &s);
    double tokens = (double)(r->B * r->gas * r->world * o->ctx);
    double comm = s.time_fetch + s.time_reduce + s.time_gather, compute = secs - comm - s.time_optimizer;

    if (r->rank != 0)
        return;
    printf("step %lld loss %.4f lr %.3g grad_norm %.3f loss_scale %g tok/s %.0f time %.3fs (compute %.3f comm-wait "
           "%.3f optimizer %.3f swap %.3f)%s",
           (long long)s.global_step, loss, s.lr, s.grad_norm, s.loss_scale, tokens / secs, secs,
           compute > 0 ? compute : 0, comm, s.time_optimizer, s.time_swap, s.skipped ? " skipped" : "");
    if (val >= 0)
        printf(" val_loss %.4f", val);
    printf("\n");
    fflush(stdout);
    if (metrics) {
        fprintf(metrics, "{\"step\": %lld, \"loss\": %.6f, \"lr\": %.6g, \"grad_norm\": %.6f, \"loss_scale\": %g, "
                         "\"tokens_per_s\": %.1f, \"time\": %.6f, \"compute\": %.6f, \"comm_wait\": %.6f, "
                         "\"optimizer\": %.6f, \"swap\": %.6f, \"skipped\": %d",
                (long long)s.global_step, loss, s.lr, s.grad_norm, s.loss_scale, tokens / secs, secs,
                compute > 0 ? compute : 0, comm, s.time_optimizer, s.time_swap, s.skipped);
        if (val >= 0)
            fprintf(metrics, ", \"val_loss\": %.6f", val);
        fprintf(metrics, "}\n");
        fflush(metrics);
    }
}

static int train(struct run *r, const struct opts *o)
{
    FILE *metrics = NULL;
    zs_step_stats at;
    int rc = 0;

    if (o->metrics && r->rank == 0 && !(metrics = fopen(o->metrics, "w"))) {
        fprintf(stderr, "zeroshard: error: --metrics %s: cannot be written\n", o->metrics);
        return 1;
    }
    zs_stats(r->ctx, &at);
    /* a fresh run that trains nothing saves its initial weights: what a twin (tests/gpt_torch.py) starts from */
    if (o->run.save_dir && !o->run.load && at.global_step >= o->run.steps &&
        (rc = (int)zs_checkpoint_save(r->ctx, o->run.save_dir)))
        ex_die("save", (zs_status)rc);
    /* --steps N trains until global step N: a resumed run draws what the uninterrupted one would have */
    for (int64_t step = at.global_step; step < o->run.steps && !rc; step++) {
        double loss, val = -1, t0 = MPI_Wtime();
        zs_step_stats s;
        if ((rc = train_step(r, o, step, &loss))) {
            ex_die("train", (zs_status)rc);
            break;
        }
        double secs = MPI_Wtime() - t0;
        zs_stats(r->ctx, &s);
        bool last = step + 1 == o->run.steps;
        if (((o->val_every && s.global_step % o->val_every == 0) || last) && (rc = validate(r, o, &val))) {
            ex_die("validate", (zs_status)rc);
            break;
        }
        report_step(r, o, metrics, loss, secs, val);
        bool save = o->run.save_dir && ((o->run.save_every && s.global_step % o->run.save_every == 0) || last);
        if (save && (rc = (int)zs_checkpoint_save(r->ctx, o->run.save_dir)))
            ex_die("save", (zs_status)rc);
        if (!rc && ex_preempted(r->ctx, &o->run, save, r->rank, &rc)) {
            r->preempted = true;
            break;
        }
    }
    if (metrics)
        fclose(metrics);
    return rc;
}

/* --device cuda: every rank opens the GPU of its node-local rank, or none goes on (each failing rank says
 * why). 0, or 1 on every rank alike. */
static int open_gpu(struct run *r, const struct gpt_config *cfg, const struct gpt_layout *lay)
{
    MPI_Comm node;
    int local = 0, ok, all_ok;
    char err[256];

    if (zs_micro_shard_size(r->ctx)) { /* the same on every rank */
        if (r->rank == 0)
            fprintf(stderr, "zeroshard: error: --device cuda does not implement zeroshard.deterministic "
                            "\"world_size_invariant\" (cuBLAS's sums depend on the shapes it is given)\n");
        return 1;
    }
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, r->rank, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &local);
    MPI_Comm_free(&node);
    r->gpu = gpt_gpu_open(local, cfg, lay, r->B, err, sizeof(err));
    if (!r->gpu)
        fprintf(stderr, "zeroshard: error: rank %d: --device cuda: %s\n", r->rank, err);
    ok = r->gpu != NULL;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (all_ok && r->rank == 0)
        printf("device: cuda, fp32 layers with cuBLAS products%s\n",
               zs_param_dtype(r->ctx) == ZS_DTYPE_FP32 ? "" : " (16-bit parameters widened to fp32)");
    return all_ok ? 0 : 1;
}

/* Everything after MPI_Init and the flags: returns the exit code. */
static int run_program(const struct opts *o, int rank, int world)
{
    struct gpt_config cfg = {.layers = o->layers, .dim = o->dim, .heads = o->heads, .ctx = o->ctx, .vocab = 256};
    struct gpt_layout lay = {0};
    struct engine_io eio = {0};
    struct run r = {.rank = rank, .world = world, .eio = &eio};
    struct tensor_init *ti = NULL;
    zs_init_opts io = {.config_path = o->run.config, .quiet = o->run.quiet};
    char err[512];
    const char *what = "setup";
    zs_status st = ZS_OK;
    int rc = 1;

    if (gpt_config_check(&cfg, err, sizeof(err)) || gpt_data_load(&r.data, o->data, o->ctx, err, sizeof(err))) {
        if (rank == 0)
            fprintf(stderr, "zeroshard: error: %s\n", err);
        return 2;
    }
    io.auto_values = ex_auto_values(&o->run);
    ti = calloc((size_t)(gpt_unit_count(&cfg) * GPT_MAX_TENSORS), sizeof(*ti));
    if (!ti || gpt_layout_alloc(&lay, &cfg))
        goto out;
    st = zs_init(&r.ctx, &io);
    if (!st)
        start_compute_threads();
    if (!st && !(st = register_model(r.ctx, &cfg, o->run.seed, ti, &lay)))
        st = zs_setup(r.ctx);
    if (!st && o->run.load) {
        what = "load";
        st = zs_checkpoint_load(r.ctx, o->run.load);
    }
    if (!st && o->run.init_from) {
        what = "init-from";
        st = zs_import_safetensors(r.ctx, o->run.init_from);
    }
    if (st) {
        if (rank == 0 || st == ZS_ERR_COMM)
            ex_die(what, st);
        if (st == ZS_ERR_COMM) /* a peer may be gone or stuck: a clean shutdown could wait for it */
            goto out_abort;
        goto out;
    }
    if (ex_engine_on_gpu(r.ctx, rank))
        goto out;
    r.B = zs_micro_batch_size(r.ctx);
    r.gas = zs_grad_accum_steps(r.ctx);
    eio = (struct engine_io){.ctx = r.ctx, .cfg = &cfg, .lay = &lay, .dt = zs_param_dtype(r.ctx)};
    if (!strcmp(o->device, "cuda") && open_gpu(&r, &cfg, &lay))
        goto out; /* rc 1 on every rank */
    if (rank == 0 && !r.gpu)
        printf("fp32 matrix products: OpenBLAS, %s kernels\n", gpt_blas_core());
    if (eio.dt == ZS_DTYPE_BF16 && !r.gpu) {
        const char *why;
        eio.mm16 = gpt_mm16_available(&why);
        if (rank == 0)
            printf("bf16 matrix products: %s%s\n", eio.mm16 ? "bf16 x bf16 -> fp32 sums through " : "widened to fp32 "
                   "for sgemm: ", why);
    }
    /* slot 0 holds only the embedding unit, slot 1 any other: at 1.9 billion parameters a block is 315 MB
     * of fp32 and the embeddings 3 MB, so sizing both by the largest unit would waste a block per rank */
    int64_t big = 0;
    for (int32_t u = 0; u < lay.nunits; u++)
        big = u != GPT_UNIT_EMBED && lay.unit_numel[u] > big ? lay.unit_numel[u] : big;
    for (int i = 0; i < 2; i++) {
        size_t bytes = (size_t)(i == slot(GPT_UNIT_EMBED) ? lay.unit_numel[GPT_UNIT_EMBED] : big) * sizeof(float);
        eio.g[i] = malloc(bytes);
        eio.w[i] = eio.dt == ZS_DTYPE_FP32 ? NULL : malloc(bytes);
    }
    r.io = (struct gpt_io_f32){&eio, io_fetch, io_release, io_grad, io_grad_done, io_fetched16};
    r.in = malloc((size_t)(r.B * o->ctx) * sizeof(int32_t));
    r.tg = malloc((size_t)(r.B * o->ctx) * sizeof(int32_t));
    if (!r.in || !r.tg || !eio.g[0] || !eio.g[1] || (eio.dt != ZS_DTYPE_FP32 && (!eio.w[0] || !eio.w[1])) ||
        (!r.gpu && gpt_model_init_f32(&r.model, &cfg, &lay, r.B, o->recompute))) {
        fprintf(stderr, "zeroshard: error: rank %d: out of memory for activations (micro-batch %lld)\n", rank,
                (long long)r.B);
        goto out;
    }
    if (o->run.memory_json)
        ex_print_memory(r.ctx, rank, world);
    if (rank == 0)
        printf("model: %lld parameters (%lld layers, dim %lld, %lld heads, ctx %lld)%s; corpus: %lld bytes in %d "
               "files, train %lld, validation %lld; unigram entropy %.4f nats/byte (%.4f bits)\n",
               (long long)gpt_param_count(&cfg), (long long)cfg.layers, (long long)cfg.dim, (long long)cfg.heads,
               (long long)cfg.ctx, o->recompute ? ", recompute" : "", (long long)r.data.len, r.data.files,
               (long long)r.data.train_len, (long long)(r.data.len - r.data.train_len), gpt_data_entropy(&r.data),
               gpt_data_entropy(&r.data) / log(2.0));
    ex_preempt_enable(r.ctx, &o->run);
    if (train(&r, o))
        goto out_abort;
    if (r.preempted) { /* saved: the relaunch with --load carries on from here */
        rc = 0;
        goto out;
    }
    if (o->sample && sample_text(&r, o))
        goto out_abort;
    uint64_t h;
    if ((st = ex_params_hash(r.ctx, &h, o->run.dump, rank))) {
        ex_die("params-hash", st);
        goto out_abort;
    }
    if (rank == 0)
        printf("params-hash %016llx\n", (unsigned long long)h);
    rc = 0;
    goto out;
out_abort:
    rc = -1;
out:
    gpt_model_free_f32(&r.model);
    gpt_gpu_close(r.gpu);
    gpt_mm16_free();
    for (int i = 0; i < 2; i++) {
        free(eio.g[i]);
        free(eio.w[i]);
    }
    free(r.in);
    free(r.tg);
    free(ti);
    gpt_layout_free(&lay);
    gpt_data_free(&r.data);
    if (rc < 0) /* a failure on one rank mid-training leaves the others in a collective */
        ex_abort(r.ctx, 1);
    zs_finalize(r.ctx);
    return rc;
}

int main(int argc, char **argv)
{
    struct opts o;
    int rank, world, rc;

    gpt_blas_fix_core(argv);
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    rc = parse_args(argc, argv, &o);
    if (rc) {
        MPI_Finalize();
        return rc > 0 ? 0 : 2;
    }
    rc = run_program(&o, rank, world);
    MPI_Finalize();
    return rc;
}
