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
#include "blascore.h" /* defines: gpt_blas_fix_core, gpt_blas_core */
#include "data.h"
#include "engine_io.h" /* defines: gpt_engine_io, gpt_register_model */
#include "gpt_cuda.h" /* defines: gpt_gpu_open, gpt_gpu_run (--device cuda) */
#include "mm16.h"  /* defines: gpt_mm16_available */
#include "model.h"
#include "sample.h" /* defines: gpt_sample_text */
#include "zeroshard.h"

struct opts {
    struct ex_run_opts run;
    const char *data, *metrics, *device, *prompt;
    int64_t layers, dim, heads, ctx, val_every, val_batches, sample, top_k, rep_window;
    uint64_t sample_seed;
    double temperature, top_p, rep_penalty;
    int recompute;
};

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

/* The values no flag's own parser can judge: 0, or -1 with the error printed. */
static int check_args(const struct opts *o)
{
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
    if (!(o->rep_penalty >= 0) || o->rep_window < 1) {
        fprintf(stderr, "zeroshard: error: %s: expected 0 or more (penalty) and 1 or more (window), got %g and %lld\n",
                o->rep_window < 1 ? "--repetition-window" : "--repetition-penalty", o->rep_penalty,
                (long long)o->rep_window);
        return -1;
    }
    return 0;
}

static int parse_args(int argc, char **argv, struct opts *o)
{
    *o = (struct opts){.run = {.steps = 100, .micro = 8, .lr = 1e-3, .seed = 1}, .layers = 4, .dim = 128,
                       .heads = 4, .ctx = 64, .val_every = 50, .val_batches = 4, .sample = 200, .temperature = 0.8,
                       .top_p = 1, .rep_penalty = 1.5, .rep_window = 16, .sample_seed = 1, .device = "cpu",
                       .prompt = ""};
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
        {"--repetition-penalty", CLI_NUM, &o->rep_penalty,
         "a byte repeated r times in a row (or r bytes of whitespace) loses X (r / window)^2 times the logits' "
         "spread, 0 = off (default 1.5)"},
        {"--repetition-window", CLI_INT, &o->rep_window, "the run at which a penalty above 1 makes its bytes the "
                                                         "least likely (default 16)"},
        {"--prompt", CLI_TEXT, &o->prompt, "text the sample continues, printed before it (default: none)"},
        {"--sample-seed", CLI_U64, &o->sample_seed, "sampling seed (default 1)"},
        {"--metrics", CLI_STR, &o->metrics, "write one JSON line per step to FILE"},
        {"--recompute", CLI_SWITCH, &o->recompute, "activation checkpointing: keep block inputs, redo forward"},
        {"--device", CLI_STR, &o->device, "cpu or cuda: where the layers run, cuda with cuBLAS (default cpu)"},
    };
    int rc = ex_parse(argc, argv, &o->run, own, (int)(sizeof(own) / sizeof(own[0])), usage);

    return rc ? rc : check_args(o);
}

/* ---------------------------------------------------------------- validation and sampling */

struct run {
    zs_ctx *ctx;
    struct gpt_config cfg;
    struct gpt_layout lay;
    struct tensor_init *ti; /* read by zs_setup's initializers */
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

/* gpt_next_logits for the sampler: one pass on the CPU or the GPU, the logits after in[len - 1]. */
static int next_logits(void *arg, const int32_t *in, int64_t len, const float **z)
{
    struct run *r = arg;
    int rc = model_run(r, in, NULL, 1, 0, 1.0, NULL);

    *z = (r->gpu ? gpt_gpu_logits(r->gpu) : r->model.logits) + (len - 1) * 256;
    return rc;
}

/* The sample after training: every rank computes the same (the units are collective), rank 0 prints it. */
static int sample_text(struct run *r, const struct opts *o)
{
    struct gpt_sampler s = {.ctx = o->ctx, .length = o->sample, .temperature = o->temperature, .top_k = o->top_k,
                            .top_p = o->top_p, .repetition_penalty = o->rep_penalty,
                            .repetition_window = o->rep_window, .seed = o->sample_seed, .prompt = o->prompt};

    return gpt_sample_text(&s, next_logits, r, r->in, r->rank == 0);
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
    struct ex_traffic tr;

    zs_stats(r->ctx, &at);
    ex_traffic_start(r->ctx, &tr);
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
    if (!rc)
        ex_traffic_print(r->ctx, &tr, r->rank, r->world);
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

/* zs_init, the model's tensors, zs_setup, then --load or --init-from: ZS_OK or the failure, with *what
 * naming the stage. */
static zs_status open_engine(struct run *r, const struct opts *o, const char **what)
{
    zs_init_opts io = {.config_path = o->run.config, .auto_values = ex_auto_values(&o->run),
                       .quiet = o->run.quiet};
    zs_status st;

    *what = "setup";
    if ((st = zs_init(&r->ctx, &io)))
        return st;
    start_compute_threads();
    if ((st = gpt_register_model(r->ctx, &r->cfg, o->run.seed, r->ti, &r->lay)) || (st = zs_setup(r->ctx)))
        return st;
    *what = "load";
    if (o->run.load && (st = zs_checkpoint_load(r->ctx, o->run.load)))
        return st;
    *what = "init-from";
    if (o->run.init_from && (st = zs_import_safetensors(r->ctx, o->run.init_from)))
        return st;
    return ZS_OK;
}

/* Where the matrix products run, printed by rank 0: cuBLAS (--device cuda, opened here) or OpenBLAS, and
 * with bf16 parameters whether the blocks' products read them as they are. 0, or 1 on every rank alike. */
static int open_products(struct run *r, const struct opts *o, struct engine_io *eio)
{
    const char *why;

    if (!strcmp(o->device, "cuda"))
        return open_gpu(r, &r->cfg, &r->lay);
    if (r->rank == 0)
        printf("fp32 matrix products: OpenBLAS, %s kernels\n", gpt_blas_core());
    if (eio->dt != ZS_DTYPE_BF16)
        return 0;
    eio->mm16 = gpt_mm16_available(&why);
    if (r->rank == 0)
        printf("bf16 matrix products: %s%s\n", eio->mm16 ? "bf16 x bf16 -> fp32 sums through " : "widened to fp32 "
               "for sgemm: ", why);
    return 0;
}

/* The buffers training works in: engine_io's fp32 slots, the batch's bytes and, on the CPU, the model's
 * activations. 0, or -1 (free_buffers frees what was allocated). */
static int alloc_buffers(struct run *r, const struct opts *o, struct engine_io *eio)
{
    const struct gpt_layout *lay = &r->lay;
    int64_t big = 0;

    /* slot 0 holds only the embedding unit, slot 1 any other: at 1.9 billion parameters a block is 315 MB
     * of fp32 and the embeddings 3 MB, so sizing both by the largest unit would waste a block per rank */
    for (int32_t u = 0; u < lay->nunits; u++)
        big = u != GPT_UNIT_EMBED && lay->unit_numel[u] > big ? lay->unit_numel[u] : big;
    for (int i = 0; i < 2; i++) {
        int64_t numel = i == gpt_io_slot(GPT_UNIT_EMBED) ? lay->unit_numel[GPT_UNIT_EMBED] : big;
        size_t bytes = (size_t)numel * sizeof(float);
        if (!(eio->g[i] = malloc(bytes)) || (eio->dt != ZS_DTYPE_FP32 && !(eio->w[i] = malloc(bytes))))
            return -1;
    }
    r->io = gpt_engine_io(eio);
    r->in = malloc((size_t)(r->B * o->ctx) * sizeof(int32_t));
    r->tg = malloc((size_t)(r->B * o->ctx) * sizeof(int32_t));
    if (!r->in || !r->tg || (!r->gpu && gpt_model_init_f32(&r->model, &r->cfg, lay, r->B, o->recompute)))
        return -1;
    return 0;
}

static void free_buffers(struct run *r, struct engine_io *eio)
{
    gpt_model_free_f32(&r->model);
    gpt_gpu_close(r->gpu);
    gpt_mm16_free();
    for (int i = 0; i < 2; i++) {
        free(eio->g[i]);
        free(eio->w[i]);
    }
    free(r->in);
    free(r->tg);
}

static void print_model(const struct run *r, const struct opts *o)
{
    const struct gpt_config *cfg = &r->cfg;
    const struct gpt_data *d = &r->data;

    printf("model: %lld parameters (%lld layers, dim %lld, %lld heads, ctx %lld)%s; corpus: %lld bytes in %d "
           "files, train %lld, validation %lld; unigram entropy %.4f nats/byte (%.4f bits)\n",
           (long long)gpt_param_count(cfg), (long long)cfg->layers, (long long)cfg->dim, (long long)cfg->heads,
           (long long)cfg->ctx, o->recompute ? ", recompute" : "", (long long)d->len, d->files,
           (long long)d->train_len, (long long)(d->len - d->train_len), gpt_data_entropy(d),
           gpt_data_entropy(d) / log(2.0));
}

/* After training: the sample and the params-hash. 0, or the failure (printed). */
static int finish(struct run *r, const struct opts *o)
{
    uint64_t h;
    zs_status st;

    if (o->sample && sample_text(r, o))
        return 1;
    if ((st = ex_params_hash(r->ctx, &h, o->run.dump, r->rank)))
        return ex_die("params-hash", st);
    if (r->rank == 0)
        printf("params-hash %016llx\n", (unsigned long long)h);
    return 0;
}

/* Everything after MPI_Init and the flags: returns the exit code. */
static int run_program(const struct opts *o, int rank, int world)
{
    struct engine_io eio = {0};
    struct run r = {.rank = rank, .world = world, .eio = &eio,
                    .cfg = {.layers = o->layers, .dim = o->dim, .heads = o->heads, .ctx = o->ctx, .vocab = 256}};
    char err[512];
    const char *what;
    zs_status st;
    int rc = 1;

    if (gpt_config_check(&r.cfg, err, sizeof(err)) || gpt_data_load(&r.data, o->data, o->ctx, err, sizeof(err))) {
        if (rank == 0)
            fprintf(stderr, "zeroshard: error: %s\n", err);
        return 2;
    }
    r.ti = calloc((size_t)(gpt_unit_count(&r.cfg) * GPT_MAX_TENSORS), sizeof(*r.ti));
    if (!r.ti || gpt_layout_alloc(&r.lay, &r.cfg))
        goto out;
    if ((st = open_engine(&r, o, &what))) {
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
    eio = (struct engine_io){.ctx = r.ctx, .cfg = &r.cfg, .lay = &r.lay, .dt = zs_param_dtype(r.ctx)};
    if (open_products(&r, o, &eio))
        goto out; /* rc 1 on every rank */
    if (alloc_buffers(&r, o, &eio)) {
        fprintf(stderr, "zeroshard: error: rank %d: out of memory for activations (micro-batch %lld)\n", rank,
                (long long)r.B);
        goto out;
    }
    if (o->run.memory_json)
        ex_print_memory(r.ctx, rank, world);
    if (rank == 0)
        print_model(&r, o);
    ex_preempt_enable(r.ctx, &o->run);
    if (train(&r, o) || (!r.preempted && finish(&r, o)))
        goto out_abort;
    rc = 0; /* preempted: saved, and the relaunch with --load carries on from here */
    goto out;
out_abort:
    rc = -1;
out:
    free_buffers(&r, &eio);
    free(r.ti);
    gpt_layout_free(&r.lay);
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
