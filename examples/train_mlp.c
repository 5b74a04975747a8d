/* train_mlp.c - an MLP classifier on generated data, trained through ZeroShard under any config.
 * Every rank draws its micro-batches from one global sample stream, so a fixed train_batch_size sees
 * the same samples per step at any world size. Prints the loss per step and, last, `params-hash`. How a
 * layer reads its weights from the engine and hands its gradient back, in any dtype: mlp_layers.c. */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <mpi.h>

#include "common.h"
#include "mlp_gpu.h"
#include "mlp_layers.h" /* defines: struct layer, struct wide, mlp_layer_begin, mlp_grad_* */
#include "splitmix.h" /* defines: ex_splitmix64 */
#include "zeroshard.h"

#define IN_DIM 16
#define CLASSES 4

struct opts {
    struct ex_run_opts run;
    int64_t hidden, layers;
    int64_t epoch_batches; /* --epoch-batches: micro-batches per epoch (0: no epochs) */
    const char *device, *gemm; /* --device cpu|cuda, --gemm exact|cublas */
};

struct init_spec;

struct model {
    int nlayers;
    struct layer *l;
    struct init_spec *init; /* per layer, read by zs_setup */
    int64_t max_width;
};

/* ---------------------------------------------------------------- deterministic data */

/* uniform in [-1, 1) from (seed, a, b) */
static float unif(uint64_t seed, uint64_t a, uint64_t b)
{
    uint64_t h = ex_splitmix64(seed ^ ex_splitmix64(a * 0x100000001b3ULL + b));
    return (float)((double)(h >> 11) * (1.0 / 9007199254740992.0) * 2.0 - 1.0);
}

static void sample(uint64_t seed, uint64_t idx, float *x, int *label)
{
    float best = -INFINITY;

    for (int j = 0; j < IN_DIM; j++)
        x[j] = unif(seed, idx + 1, (uint64_t)j);
    for (int c = 0; c < CLASSES; c++) { /* a fixed random linear teacher decides the class */
        float s = 0.0f;
        for (int j = 0; j < IN_DIM; j++)
            s += unif(seed ^ 0x7eac4e5ULL, (uint64_t)c, (uint64_t)j) * x[j];
        if (s > best) {
            best = s;
            *label = c;
        }
    }
}

/* ---------------------------------------------------------------- model */

/* Initial values by element: He-uniform weights from a counter-based generator, zero biases. ZeroShard
 * asks each rank for just the elements it stores, so no rank ever holds the whole model. */
struct init_spec {
    uint64_t seed;
    int layer;
    float scale; /* 0: a bias */
};

static void init_values(void *arg, int32_t param, int64_t first, int64_t count, float *dst)
{
    const struct init_spec *sp = arg;

    (void)param;
    for (int64_t k = 0; k < count; k++)
        dst[k] = sp->scale == 0.0f ? 0.0f
                                   : sp->scale * unif(sp->seed ^ 0x5eedULL, (uint64_t)sp->layer, (uint64_t)(first + k));
}

static zs_status build_model(zs_ctx *ctx, const struct opts *o, struct model *m)
{
    zs_status st = ZS_OK;

    m->nlayers = (int)o->layers + 1;
    m->l = calloc((size_t)m->nlayers, sizeof(*m->l));
    m->init = calloc((size_t)m->nlayers, sizeof(*m->init));
    if (!m->l || !m->init)
        return ZS_ERR_NOMEM;
    m->max_width = o->hidden > IN_DIM ? o->hidden : IN_DIM;
    for (int i = 0; i < m->nlayers && !st; i++) {
        struct layer *L = &m->l[i];
        static struct init_spec zero_bias;
        char name[64];

        L->in = i == 0 ? IN_DIM : o->hidden;
        L->out = i == m->nlayers - 1 ? CLASSES : o->hidden;
        m->init[i] = (struct init_spec){ .seed = o->run.seed, .layer = i, .scale = sqrtf(2.0f / (float)L->in) };
        snprintf(name, sizeof(name), "layer%d", i);
        st = zs_unit_add(ctx, name, &L->unit);
        snprintf(name, sizeof(name), "layer%d.weight", i);
        if (!st)
            st = zs_param_add_init(ctx, L->unit, name, L->in * L->out, init_values, &m->init[i], &L->w);
        if (!st)
            st = zs_param_shape(ctx, L->w, 2, (const int64_t[]){L->out, L->in});
        snprintf(name, sizeof(name), "layer%d.bias", i);
        if (!st)
            st = zs_param_add_init(ctx, L->unit, name, L->out, init_values, &zero_bias, &L->b);
    }
    if (!st)
        st = zs_setup(ctx);
    return st;
}

/* Softmax cross-entropy of B rows of logits z: the batch mean loss, and into dlog the gradient of each
 * micro-shard's mean (ms rows; ms = B outside deterministic mode) times lscale (fp16: backward runs on
 * loss x scale; 1 otherwise); each micro-shard's mean loss into shard_loss when it is given. On the host
 * for --device cuda too: the GPU's expf and logf round differently from the C library's. */
static double softmax_xent(const float *logits, const int *labels, int64_t B, int64_t ms, float lscale, float *dlog,
                           double *shard_loss)
{
    double total = 0.0;

    for (int64_t k = 0; k < B; k++) {
        if (shard_loss && k % ms == 0)
            shard_loss[k / ms] = 0.0;
        const float *z = logits + k * CLASSES;
        float mx = z[0], sum = 0.0f;
        for (int c = 1; c < CLASSES; c++)
            mx = z[c] > mx ? z[c] : mx;
        for (int c = 0; c < CLASSES; c++)
            sum += expf(z[c] - mx);
        total += (double)(logf(sum) + mx - z[labels[k]]);
        if (shard_loss)
            shard_loss[k / ms] += (double)(logf(sum) + mx - z[labels[k]]) / (double)ms;
        for (int c = 0; c < CLASSES; c++)
            dlog[k * CLASSES + c] = (expf(z[c] - mx) / sum - (c == labels[k] ? 1.0f : 0.0f)) / (float)ms * lscale;
    }
    return total / (double)B;
}

/* Layer L's weight and bias gradients of rows [k0, k1), added into gw and gb. */
static void weight_grads(const struct layer *L, const float *act, const float *dlog, int64_t k0, int64_t k1,
                         float *gw, float *gb)
{
    for (int64_t k = k0; k < k1; k++) {
        const float *x = act + k * L->in, *dy = dlog + k * L->out;
        for (int64_t r = 0; r < L->out; r++) {
            gb[r] += dy[r];
            for (int64_t c = 0; c < L->in; c++)
                gw[r * L->in + c] += dy[r] * x[c];
        }
    }
}

/* One micro-batch: forward through fetched units, loss, backward in reverse unit order.
 * acts[i] holds layer i's input for the whole batch. Returns the mean loss. With
 * zeroshard.deterministic the weight gradients come per micro-shard (ms rows, each the mean over its
 * rows), each handed over by zs_grad_deposit, so no sum here depends on how many rows this rank has;
 * otherwise ms = B and the deposit does nothing. */
static zs_status micro_batch(zs_ctx *ctx, const struct model *m, const struct opts *o, uint64_t first,
                             int64_t B, float **acts, float *dlog, float *dbuf, const struct wide *wd, double *loss,
                             double *shard_loss)
{
    int64_t ms = zs_micro_shard_size(ctx) ? zs_micro_shard_size(ctx) : B;
    zs_status st;
    int labels[4096];
    zs_step_stats ss;
    float lscale;

    zs_stats(ctx, &ss);
    lscale = (float)ss.loss_scale; /* fp16: backward runs on loss x scale; 1 otherwise */

    for (int64_t k = 0; k < B; k++)
        sample(o->run.seed, first + (uint64_t)k, acts[0] + k * IN_DIM, &labels[k]);
    for (int i = 0; i < m->nlayers; i++) {
        const struct layer *L = &m->l[i];
        const float *w, *b;
        if ((st = mlp_layer_begin(ctx, L, wd, &w, &b)))
            return st;
        for (int64_t k = 0; k < B; k++) {
            const float *x = acts[i] + k * L->in;
            float *y = acts[i + 1] + k * L->out;
            for (int64_t r = 0; r < L->out; r++) {
                float s = b[r];
                for (int64_t c = 0; c < L->in; c++)
                    s += w[r * L->in + c] * x[c];
                y[r] = (i < m->nlayers - 1 && s < 0.0f) ? 0.0f : s;
            }
        }
        if ((st = zs_unit_release(ctx, L->unit)))
            return st;
    }
    *loss = softmax_xent(acts[m->nlayers], labels, B, ms, lscale, dlog, shard_loss);
    for (int i = m->nlayers - 1; i >= 0; i--) {
        const struct layer *L = &m->l[i];
        struct grad_view v;
        if ((st = mlp_grad_begin(ctx, L, wd, &v)))
            return st;
        const float *w = v.w;
        for (int64_t k0 = 0; k0 < B; k0 += ms) {
            mlp_grad_open(L, wd, &v);
            weight_grads(L, acts[i], dlog, k0, k0 + ms, v.gw, v.gb);
            if ((st = mlp_grad_close(ctx, L, wd, &v)))
                return st;
        }
        for (int64_t k = 0; k < B; k++) {
            const float *x = acts[i] + k * L->in, *dy = dlog + k * L->out;
            float *dx = dbuf + k * L->in;
            for (int64_t c = 0; c < L->in; c++) {
                float s = 0.0f;
                for (int64_t r = 0; r < L->out; r++)
                    s += w[r * L->in + c] * dy[r];
                dx[c] = (i > 0 && x[c] <= 0.0f) ? 0.0f : s; /* ReLU of the layer below */
            }
        }
        memcpy(dlog, dbuf, (size_t)(B * L->in) * sizeof(float));
        if ((st = mlp_grad_end(ctx, L)))
            return st;
    }
    return ZS_OK;
}

/* The same micro-batch with the layers' products on the GPU (mlp_gpu.h): ZeroShard's buffers stay on the
 * host, each fetched layer goes up, each gradient comes back down and is handed over as on the CPU. The
 * loss runs on the host (softmax_xent). Fails with ZS_ERR_UNSUPPORTED and mlp_gpu_error set on a CUDA error. */
static zs_status micro_batch_gpu(zs_ctx *ctx, const struct model *m, const struct opts *o, uint64_t first,
                                 int64_t B, float **acts, float *dlog, const struct wide *wd, struct mlp_gpu *g,
                                 double *loss)
{
    zs_status st;
    int labels[4096];
    zs_step_stats ss;

    zs_stats(ctx, &ss);
    for (int64_t k = 0; k < B; k++)
        sample(o->run.seed, first + (uint64_t)k, acts[0] + k * IN_DIM, &labels[k]);
    if (mlp_gpu_put_act(g, 0, acts[0], B * IN_DIM))
        return ZS_ERR_UNSUPPORTED;
    for (int i = 0; i < m->nlayers; i++) {
        const struct layer *L = &m->l[i];
        const float *w, *b;
        if ((st = mlp_layer_begin(ctx, L, wd, &w, &b)))
            return st;
        if (mlp_gpu_forward(g, i, w, b, L->in, L->out, i < m->nlayers - 1))
            return ZS_ERR_UNSUPPORTED;
        if ((st = zs_unit_release(ctx, L->unit)))
            return st;
    }
    if (mlp_gpu_get_act(g, m->nlayers, acts[m->nlayers], B * CLASSES))
        return ZS_ERR_UNSUPPORTED;
    *loss = softmax_xent(acts[m->nlayers], labels, B, B, (float)ss.loss_scale, dlog, NULL);
    if (mlp_gpu_put_dy(g, dlog, B * CLASSES))
        return ZS_ERR_UNSUPPORTED;
    for (int i = m->nlayers - 1; i >= 0; i--) {
        const struct layer *L = &m->l[i];
        struct grad_view v;
        if ((st = mlp_grad_begin(ctx, L, wd, &v)))
            return st;
        mlp_grad_open(L, wd, &v);
        if (mlp_gpu_backward(g, i, v.w, v.gw, v.gb, L->in, L->out, i > 0))
            return ZS_ERR_UNSUPPORTED;
        if ((st = mlp_grad_close(ctx, L, wd, &v)) || (st = mlp_grad_end(ctx, L)))
            return st;
    }
    return ZS_OK;
}

/* --device cuda: the GPU of this node-local rank, or NULL with the reason printed (rank 0). */
static struct mlp_gpu *open_gpu(const struct opts *o, const struct model *m, int64_t B, int rank)
{
    MPI_Comm node;
    int local = 0;
    char err[256];
    struct mlp_gpu *g;

    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &local);
    MPI_Comm_free(&node);
    g = mlp_gpu_open(local, m->nlayers, B, m->max_width, !strcmp(o->gemm, "cublas"), err, sizeof(err));
    if (!g)
        fprintf(stderr, "zeroshard: error: rank %d: --device cuda: %s\n", rank, err);
    return g;
}

static const char usage[] = "usage: mpirun -np N zs-train-mlp --config FILE [options]\n"
                            "Trains an MLP classifier on generated data through ZeroShard. Defaults: --steps 20, --seed 1.\n" EX_AUTO_HELP;

static int parse_args(int argc, char **argv, struct opts *o)
{
    *o = (struct opts){.run = {.steps = 20, .seed = 1, .micro = 8, .lr = 1e-3}, .hidden = 64, .layers = 2,
                       .device = "cpu", .gemm = "exact"};
    const struct cli_flag own[] = {
        {"--hidden", CLI_INT, &o->hidden, "hidden width (default 64)"},
        {"--layers", CLI_INT, &o->layers, "hidden layers (default 2)"},
        {"--device", CLI_STR, &o->device, "cpu or cuda: where the layers' products run (default cpu)"},
        {"--gemm", CLI_STR, &o->gemm, "with --device cuda: exact (the CPU's bits) or cublas (default exact)"},
        {"--epoch-batches", CLI_INT, &o->epoch_batches, "micro-batches per epoch (per rank): an epoch's last "
         "accumulation window ends at its last micro-batch (zs_window_end), short when the count is not a "
         "multiple of gradient_accumulation_steps (default 0: no epochs)"},
    };
    int rc = ex_parse(argc, argv, &o->run, own, (int)(sizeof(own) / sizeof(own[0])), usage);

    if (rc)
        return rc;
    if (o->hidden < 1 || o->layers < 0 || o->epoch_batches < 0) {
        fprintf(stderr, "zeroshard: error: --hidden must be positive, --layers and --epoch-batches non-negative\n");
        return -1;
    }
    if (strcmp(o->device, "cpu") && strcmp(o->device, "cuda")) {
        fprintf(stderr, "zeroshard: error: --device: expected cpu or cuda, got \"%s\"\n", o->device);
        return -1;
    }
    if (strcmp(o->gemm, "exact") && strcmp(o->gemm, "cublas")) {
        fprintf(stderr, "zeroshard: error: --gemm: expected exact or cublas, got \"%s\"\n", o->gemm);
        return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------- the run */

/* One rank's run: the engine, the model, the buffers its micro-batches work in and, with --device cuda,
 * its GPU. */
struct run {
    zs_ctx *ctx;
    const struct opts *o;
    struct model m;
    int rank, world;
    int64_t B, gas, per; /* per: micro-shards in a micro-batch (deterministic mode), else 1 */
    float **acts;        /* nlayers + 1 activations, each B x max_width */
    float *dlog, *dbuf;
    double *shard_loss; /* gas x per losses of one step */
    struct wide wd;
    struct mlp_gpu *gpu;
};

/* zs_init, the model, then --load or --init-from: ZS_OK or the failure, with *what naming the stage. */
static zs_status open_engine(struct run *r, const char **what)
{
    zs_init_opts io = {.config_path = r->o->run.config, .auto_values = ex_auto_values(&r->o->run),
                       .quiet = r->o->run.quiet};
    zs_status st;

    *what = "setup";
    if ((st = zs_init(&r->ctx, &io)) || (st = build_model(r->ctx, r->o, &r->m)))
        return st;
    *what = "load";
    if (r->o->run.load && (st = zs_checkpoint_load(r->ctx, r->o->run.load)))
        return st;
    *what = "init-from";
    if (r->o->run.init_from && (st = zs_import_safetensors(r->ctx, r->o->run.init_from)))
        return st;
    return ZS_OK;
}

/* The engine's shapes this example cannot run: printed by rank 0 (the same on every rank). */
static bool engine_unsupported(const struct run *r)
{
    int64_t B = zs_micro_batch_size(r->ctx);

    if (ex_engine_on_gpu(r->ctx, r->rank))
        return true;
    if (B <= 4096) /* micro_batch's label array */
        return false;
    if (r->rank == 0)
        fprintf(stderr, "zeroshard: error: train_micro_batch_size_per_gpu %lld is above this example's 4096\n",
                (long long)B);
    return true;
}

static float *alloc_floats(int64_t n)
{
    return malloc((size_t)n * sizeof(float));
}

/* The micro-batch buffers, sized by the engine's micro-batch; 0, or -1 with every buffer freed by
 * free_buffers. */
static int alloc_buffers(struct run *r)
{
    int64_t mw = r->m.max_width, area = r->B * mw;

    r->per = zs_micro_shard_size(r->ctx) ? r->B / zs_micro_shard_size(r->ctx) : 1;
    r->wd.dt = zs_param_dtype(r->ctx);
    r->acts = calloc((size_t)r->m.nlayers + 1, sizeof(float *));
    r->dlog = alloc_floats(area);
    r->dbuf = alloc_floats(area);
    r->shard_loss = malloc((size_t)(r->gas * r->per) * sizeof(double));
    if (!r->acts || !r->dlog || !r->dbuf || !r->shard_loss)
        return -1;
    for (int i = 0; i <= r->m.nlayers; i++)
        if (!(r->acts[i] = alloc_floats(area)))
            return -1;
    if (r->wd.dt == ZS_DTYPE_FP32) /* the engine's buffers are read and written as they are */
        return 0;
    r->wd.w = alloc_floats(mw * mw);
    r->wd.gw = alloc_floats(mw * mw);
    r->wd.b = alloc_floats(mw);
    r->wd.gb = alloc_floats(mw);
    return r->wd.w && r->wd.gw && r->wd.b && r->wd.gb ? 0 : -1;
}

static void free_buffers(struct run *r)
{
    for (int i = 0; r->acts && i <= r->m.nlayers; i++)
        free(r->acts[i]);
    free(r->acts);
    free(r->dlog);
    free(r->dbuf);
    free(r->shard_loss);
    free(r->wd.w);
    free(r->wd.gw);
    free(r->wd.b);
    free(r->wd.gb);
}

/* --device cuda: every rank opens its GPU, or none goes on; 0, or 1 on every rank alike. */
static int open_device(struct run *r)
{
    int ok, all_ok;

    if (strcmp(r->o->device, "cuda"))
        return 0;
    if (zs_micro_shard_size(r->ctx)) { /* the same on every rank */
        if (r->rank == 0)
            fprintf(stderr, "zeroshard: error: --device cuda does not implement zeroshard.deterministic "
                    "\"world_size_invariant\" (its backward sums the whole micro-batch at once)\n");
        return 1;
    }
    r->gpu = open_gpu(r->o, &r->m, r->B, r->rank);
    ok = r->gpu != NULL;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return all_ok ? 0 : 1;
}

/* Optimizer step `step`'s window: its micro-batch count, and into *mb0 the global index of its first. gas
 * micro-batches, except with --epoch-batches N, where each epoch's windows restart at its first micro-batch
 * and its last holds what is left of the N (as Accelerate and the Trainer cut them). Step numbers map to
 * windows alone, so a run resumed from a checkpoint draws what the straight run drew. */
static int64_t step_window(const struct run *r, int64_t step, int64_t *mb0)
{
    int64_t n = r->o->epoch_batches, windows, w;

    if (n == 0) {
        *mb0 = step * r->gas;
        return r->gas;
    }
    windows = (n + r->gas - 1) / r->gas; /* per epoch */
    w = step % windows;
    *mb0 = step / windows * n + w * r->gas;
    return n - w * r->gas < r->gas ? n - w * r->gas : r->gas;
}

/* One optimizer step: a window of micro-batches of this rank's slice of the global sample stream, then the
 * mean loss over every rank. 0, or the exit code with the failure printed. */
static int train_step(struct run *r, int64_t step, double *mean)
{
    double sum = 0.0, loss = 0.0;
    int64_t mb0, count = step_window(r, step, &mb0);
    zs_status st = ZS_OK;

    for (int64_t mb = 0; mb < count; mb++) {
        uint64_t first = (uint64_t)(((mb0 + mb) * r->world + r->rank) * r->B);
        /* an epoch's last micro-batch ends its window, before its first zs_grad_ready: as a framework does
         * (a window that is full already is left as it is) */
        if (r->o->epoch_batches && (mb0 + mb + 1) % r->o->epoch_batches == 0 && (st = zs_window_end(r->ctx)))
            return ex_die("window end", st);
        st = r->gpu ? micro_batch_gpu(r->ctx, &r->m, r->o, first, r->B, r->acts, r->dlog, &r->wd, r->gpu, &loss)
                    : micro_batch(r->ctx, &r->m, r->o, first, r->B, r->acts, r->dlog, r->dbuf, &r->wd, &loss,
                                  r->shard_loss + mb * r->per);
        if (!st)
            st = zs_step(r->ctx);
        if (st && r->gpu && mlp_gpu_error(r->gpu)[0]) {
            fprintf(stderr, "zeroshard: error: rank %d: --device cuda: %s\n", r->rank, mlp_gpu_error(r->gpu));
            return 1;
        }
        if (st)
            return ex_die("train", st);
        sum += loss;
    }
    *mean = sum; /* summed under the watchdog: a rank that stopped cannot hang this one here */
    if ((st = zs_allreduce_sum(r->ctx, mean, 1)))
        return ex_die("loss", st);
    *mean /= (double)(r->world * count);
    if (zs_micro_shard_size(r->ctx)) /* the world-size-independent mean, in the global micro-shard order */
        *mean = ex_det_loss(r->shard_loss, count, r->per, r->world);
    return 0;
}

/* --steps N trains until global step N: a run resumed from a checkpoint carries on where it stopped,
 * drawing the same samples the uninterrupted run would have. 0, or the exit code; *preempted when the
 * ranks stopped on SIGTERM (checkpoint saved). */
static int train(struct run *r, bool *preempted)
{
    const struct ex_run_opts *ro = &r->o->run;
    zs_step_stats at, s;
    int rc = 0;

    struct ex_traffic tr;

    zs_stats(r->ctx, &at);
    ex_traffic_start(r->ctx, &tr);
    ex_preempt_enable(r->ctx, ro);
    for (int64_t step = at.global_step; step < ro->steps && !rc; step++) {
        double mean, t0 = MPI_Wtime();
        if ((rc = train_step(r, step, &mean)))
            break;
        zs_stats(r->ctx, &s);
        if ((!s.stepped && !s.skipped) || s.global_step != step + 1 || s.window_step != 0) { /* a window ends in a step */
            fprintf(stderr, "zeroshard: error: rank %d: window %lld: its last zs_step left global step %lld and "
                    "%lld micro-batches in the window\n", r->rank, (long long)step + 1, (long long)s.global_step,
                    (long long)s.window_step);
            rc = 1;
            break;
        }
        if (r->rank == 0)
            printf("step %lld loss %.6f lr %.6g grad_norm %.6f time %.3fs clip_coef %.6g loss_scale %g%s\n",
                   (long long)s.global_step, mean, s.lr, s.grad_norm, MPI_Wtime() - t0, s.clip_coef,
                   s.loss_scale, s.skipped ? " skipped" : "");
        fflush(stdout);
        bool last = step + 1 == ro->steps;
        bool save = ro->save_dir && ((ro->save_every && s.global_step % ro->save_every == 0) || last);
        zs_status st = save ? zs_checkpoint_save(r->ctx, ro->save_dir) : ZS_OK;
        if (st)
            rc = ex_die("save", st);
        if (!rc && ex_preempted(r->ctx, ro, save, r->rank, &rc))
            *preempted = true;
        if (*preempted)
            break;
    }
    if (!rc)
        ex_traffic_print(r->ctx, &tr, r->rank, r->world);
    return rc;
}

static int print_params_hash(const struct run *r)
{
    uint64_t h;
    zs_status st = ex_params_hash(r->ctx, &h, r->o->run.dump, r->rank);

    if (st)
        return ex_die("params-hash", st);
    if (r->rank == 0)
        printf("params-hash %016llx\n", (unsigned long long)h);
    return 0;
}

int main(int argc, char **argv)
{
    struct opts o;
    struct run r = {.o = &o};
    const char *what;
    bool abort_peers = false; /* a failure the other ranks may not know of: they could wait for this one */
    bool preempted = false;
    zs_status st;
    int rc;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &r.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &r.world);
    if ((rc = parse_args(argc, argv, &o))) {
        rc = rc > 0 ? 0 : 2;
        goto out_mpi;
    }
    rc = 1;
    if ((st = open_engine(&r, &what))) {
        if (r.rank == 0 || st == ZS_ERR_COMM)
            ex_die(what, st);
        abort_peers = st == ZS_ERR_COMM; /* a peer may be gone or stuck: a clean shutdown could wait for it */
        goto out_engine;
    }
    if (o.run.memory_json)
        ex_print_memory(r.ctx, r.rank, r.world);
    if (engine_unsupported(&r))
        goto out_engine;
    r.B = zs_micro_batch_size(r.ctx);
    r.gas = zs_grad_accum_steps(r.ctx);
    if (alloc_buffers(&r)) {
        fprintf(stderr, "zeroshard: error: rank %d: out of memory for activations (micro-batch %lld)\n", r.rank,
                (long long)r.B);
        abort_peers = true;
        goto out_buffers;
    }
    if (open_device(&r))
        goto out_gpu; /* rc 1 on every rank */
    rc = train(&r, &preempted);
    if (!rc && !preempted)
        rc = print_params_hash(&r);
    abort_peers = rc != 0;
out_gpu:
    mlp_gpu_close(r.gpu);
out_buffers:
    free_buffers(&r);
out_engine:
    free(r.m.l);
    free(r.m.init);
    if (abort_peers)
        ex_abort(r.ctx, rc);
    zs_finalize(r.ctx);
    rc = rc ? 1 : 0;
out_mpi:
    MPI_Finalize();
    return rc;
}
