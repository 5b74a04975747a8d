/* train_mlp.c - an MLP classifier on generated data, trained through ZeroShard under any config.
 * Every rank draws its micro-batches from one global sample stream, so a fixed train_batch_size sees
 * the same samples per step at any world size. Prints the loss per step and, last, `params-hash`. */
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
#include "splitmix.h" /* defines: ex_splitmix64 */
#include "zeroshard.h"

#define IN_DIM 16
#define CLASSES 4

struct opts {
    struct ex_run_opts run;
    int64_t hidden, layers;
    const char *device, *gemm; /* --device cpu|cuda, --gemm exact|cublas */
};

struct layer {
    int32_t unit, w, b;
    int64_t in, out;
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

/* ---------------------------------------------------------------- 16-bit parameters
 * With bf16 or fp16 training ZeroShard hands out 16-bit parameters and gradient buffers. This example
 * computes in fp32: it widens the fetched weights into a scratch buffer, builds the micro-batch gradient
 * in fp32 and adds it into the 16-bit buffer, rounding to nearest even. */

struct wide {
    zs_dtype dt;
    float *w, *b, *gw, *gb; /* scratch, the largest layer's size */
};

/* fp32 view of n parameters: the data itself (fp32) or a widened copy in scratch. */
static const float *widen(const struct wide *wd, const void *p, int64_t n, float *scratch)
{
    if (wd->dt == ZS_DTYPE_FP32)
        return p;
    for (int64_t i = 0; i < n; i++)
        scratch[i] = ex_h2f(wd->dt, ((const uint16_t *)p)[i]);
    return scratch;
}

static void fold_grad(const struct wide *wd, void *g16, const float *g, int64_t n)
{
    uint16_t *h = g16;

    for (int64_t i = 0; i < n; i++)
        h[i] = ex_f2h(wd->dt, ex_h2f(wd->dt, h[i]) + g[i]);
}

/* A layer's forward begins: its unit fetched, its weights and biases as fp32 (widened if 16-bit). */
static zs_status layer_begin(zs_ctx *ctx, const struct layer *L, const struct wide *wd, const float **w,
                             const float **b)
{
    zs_status st;
    void *wp, *bp;

    if ((st = zs_unit_fetch(ctx, L->unit, NULL)) || (st = zs_param_data(ctx, L->w, &wp)) ||
        (st = zs_param_data(ctx, L->b, &bp)))
        return st;
    *w = widen(wd, wp, L->in * L->out, wd->w);
    *b = widen(wd, bp, L->out, wd->b);
    return ZS_OK;
}

/* A layer's backward begins: its unit fetched, its fp32 weights (widened if 16-bit) in v->w, its gradient
 * buffer and the offsets of its weight and bias in it. */
struct grad_view {
    void *gp;
    const float *w;
    float *gw, *gb;
    int64_t woff, boff;
};

static zs_status grad_begin(zs_ctx *ctx, const struct layer *L, const struct wide *wd, struct grad_view *v)
{
    zs_status st;
    void *wp;

    if ((st = zs_unit_fetch(ctx, L->unit, NULL)) || (st = zs_param_data(ctx, L->w, &wp)) ||
        (st = zs_grad_buffer(ctx, L->unit, &v->gp)) || (st = zs_param_info(ctx, L->w, NULL, NULL, NULL, &v->woff)) ||
        (st = zs_param_info(ctx, L->b, NULL, NULL, NULL, &v->boff)))
        return st;
    v->w = widen(wd, wp, L->in * L->out, wd->w);
    return ZS_OK;
}

/* A piece of the layer's gradient (the whole micro-batch, or one micro-shard in deterministic mode) opens
 * its fp32 arrays: the buffer itself (fp32) or zeroed scratch (16-bit)... */
static void grad_open(const struct layer *L, const struct wide *wd, struct grad_view *v)
{
    if (wd->dt == ZS_DTYPE_FP32) { /* straight into the buffer */
        v->gw = (float *)v->gp + v->woff;
        v->gb = (float *)v->gp + v->boff;
    } else {
        v->gw = wd->gw;
        v->gb = wd->gb;
        memset(v->gw, 0, (size_t)(L->in * L->out) * sizeof(float));
        memset(v->gb, 0, (size_t)L->out * sizeof(float));
    }
}

/* ... and closes: a 16-bit piece rounded into the buffer, then handed to zs_grad_deposit (nothing outside
 * deterministic mode). */
static zs_status grad_close(zs_ctx *ctx, const struct layer *L, const struct wide *wd, const struct grad_view *v)
{
    if (wd->dt != ZS_DTYPE_FP32) {
        fold_grad(wd, (uint16_t *)v->gp + v->woff, v->gw, L->in * L->out);
        fold_grad(wd, (uint16_t *)v->gp + v->boff, v->gb, L->out);
    }
    return zs_grad_deposit(ctx, L->unit);
}

/* The layer's backward ends: the unit handed over and released. */
static zs_status grad_end(zs_ctx *ctx, const struct layer *L)
{
    zs_status st;

    if ((st = zs_grad_ready(ctx, L->unit)) || (st = zs_unit_release(ctx, L->unit)))
        return st;
    return ZS_OK;
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
        if ((st = layer_begin(ctx, L, wd, &w, &b)))
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
        if ((st = grad_begin(ctx, L, wd, &v)))
            return st;
        const float *w = v.w;
        for (int64_t k0 = 0; k0 < B; k0 += ms) {
            grad_open(L, wd, &v);
            weight_grads(L, acts[i], dlog, k0, k0 + ms, v.gw, v.gb);
            if ((st = grad_close(ctx, L, wd, &v)))
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
        if ((st = grad_end(ctx, L)))
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
        if ((st = layer_begin(ctx, L, wd, &w, &b)))
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
        if ((st = grad_begin(ctx, L, wd, &v)))
            return st;
        grad_open(L, wd, &v);
        if (mlp_gpu_backward(g, i, v.w, v.gw, v.gb, L->in, L->out, i > 0))
            return ZS_ERR_UNSUPPORTED;
        if ((st = grad_close(ctx, L, wd, &v)) || (st = grad_end(ctx, L)))
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
    };
    int rc = ex_parse(argc, argv, &o->run, own, (int)(sizeof(own) / sizeof(own[0])), usage);

    if (rc)
        return rc;
    if (o->hidden < 1 || o->layers < 0) {
        fprintf(stderr, "zeroshard: error: --hidden must be positive and --layers non-negative\n");
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

int main(int argc, char **argv)
{
    struct opts o;
    struct model m = {0};
    zs_ctx *ctx = NULL;
    zs_init_opts io = {0};
    zs_status st;
    int rank, world, rc = 0;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if ((rc = parse_args(argc, argv, &o))) {
        MPI_Finalize();
        return rc > 0 ? 0 : 2;
    }
    io.config_path = o.run.config;
    io.auto_values = ex_auto_values(&o.run);
    io.quiet = o.run.quiet;
    const char *what = "setup";
    st = zs_init(&ctx, &io);
    if (!st)
        st = build_model(ctx, &o, &m);
    if (!st && o.run.load) {
        what = "load";
        st = zs_checkpoint_load(ctx, o.run.load);
    }
    if (!st && o.run.init_from) {
        what = "init-from";
        st = zs_import_safetensors(ctx, o.run.init_from);
    }
    if (st == ZS_ERR_COMM) { /* a peer may be gone or stuck: a clean shutdown could wait for it */
        ex_die(what, st);
        ex_abort(ctx, 1);
    }
    if (st) {
        if (rank == 0)
            ex_die(what, st);
        zs_finalize(ctx);
        free(m.l);
        free(m.init);
        MPI_Finalize();
        return 1;
    }
    if (o.run.memory_json)
        ex_print_memory(ctx, rank, world);

    if (ex_engine_on_gpu(ctx, rank)) {
        zs_finalize(ctx);
        MPI_Finalize();
        return 1;
    }
    int64_t B = zs_micro_batch_size(ctx), gas = zs_grad_accum_steps(ctx);
    int64_t per = zs_micro_shard_size(ctx) ? B / zs_micro_shard_size(ctx) : 1; /* micro-shards a micro-batch */
    if (B > 4096) {
        if (rank == 0)
            fprintf(stderr, "zeroshard: error: train_micro_batch_size_per_gpu %lld is above this example's 4096\n",
                    (long long)B);
        zs_finalize(ctx);
        MPI_Finalize();
        return 1;
    }
    float **acts = calloc((size_t)m.nlayers + 1, sizeof(float *));
    float *dlog = malloc((size_t)(B * m.max_width) * sizeof(float));
    float *dbuf = malloc((size_t)(B * m.max_width) * sizeof(float));
    double *shard_loss = malloc((size_t)(gas * per) * sizeof(double));
    for (int i = 0; i <= m.nlayers; i++)
        acts[i] = malloc((size_t)(B * m.max_width) * sizeof(float));
    struct wide wd = {.dt = zs_param_dtype(ctx)};
    if (wd.dt != ZS_DTYPE_FP32) {
        size_t big = (size_t)(m.max_width * m.max_width);
        wd.w = malloc(big * sizeof(float));
        wd.gw = malloc(big * sizeof(float));
        wd.b = malloc((size_t)m.max_width * sizeof(float));
        wd.gb = malloc((size_t)m.max_width * sizeof(float));
    }

    struct mlp_gpu *gpu = NULL;
    bool agreed = false; /* every rank knows rc: no abort needed */
    if (!strcmp(o.device, "cuda") && zs_micro_shard_size(ctx)) { /* the same on every rank */
        if (rank == 0)
            fprintf(stderr, "zeroshard: error: --device cuda does not implement zeroshard.deterministic "
                    "\"world_size_invariant\" (its backward sums the whole micro-batch at once)\n");
        rc = 1, agreed = true;
    } else if (!strcmp(o.device, "cuda")) { /* every rank opens its GPU, or none goes on */
        int ok, all_ok;
        gpu = open_gpu(&o, &m, B, rank);
        ok = gpu != NULL;
        MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
        if (!all_ok)
            rc = 1, agreed = true;
    }

    zs_step_stats at;
    bool preempted = false;
    zs_stats(ctx, &at);
    ex_preempt_enable(ctx, &o.run);
    /* --steps N trains until global step N: a run resumed from a checkpoint carries on where it stopped,
     * drawing the same samples the uninterrupted run would have. */
    for (int64_t step = at.global_step; step < o.run.steps && !rc; step++) {
        double sum = 0.0, loss, all = 0.0, t0 = MPI_Wtime();
        for (int64_t mb = 0; mb < gas && !rc; mb++) {
            uint64_t first = (uint64_t)(((step * gas + mb) * world + rank) * B);
            st = gpu ? micro_batch_gpu(ctx, &m, &o, first, B, acts, dlog, &wd, gpu, &loss)
                     : micro_batch(ctx, &m, &o, first, B, acts, dlog, dbuf, &wd, &loss, shard_loss + mb * per);
            if (!st)
                st = zs_step(ctx);
            if (st && gpu && mlp_gpu_error(gpu)[0]) {
                fprintf(stderr, "zeroshard: error: rank %d: --device cuda: %s\n", rank, mlp_gpu_error(gpu));
                rc = 1;
            } else if (st)
                rc = ex_die("train", st);
            sum += loss;
        }
        if (rc)
            break;
        all = sum; /* summed under the watchdog: a rank that stopped cannot hang this one here */
        if ((st = zs_allreduce_sum(ctx, &all, 1))) {
            rc = ex_die("loss", st);
            break;
        }
        double mean = all / (double)(world * gas);
        if (zs_micro_shard_size(ctx)) /* the world-size-independent mean, in the global micro-shard order */
            mean = ex_det_loss(shard_loss, gas, per, world);
        zs_step_stats s;
        zs_stats(ctx, &s);
        if (rank == 0)
            printf("step %lld loss %.6f lr %.6g grad_norm %.6f time %.3fs clip_coef %.6g loss_scale %g%s\n",
                   (long long)s.global_step, mean, s.lr, s.grad_norm, MPI_Wtime() - t0,
                   s.clip_coef, s.loss_scale, s.skipped ? " skipped" : "");
        fflush(stdout);
        bool last = step + 1 == o.run.steps;
        bool save = o.run.save_dir && ((o.run.save_every && s.global_step % o.run.save_every == 0) || last);
        if (save && (st = zs_checkpoint_save(ctx, o.run.save_dir)))
            rc = ex_die("save", st);
        if (!rc && ex_preempted(ctx, &o.run, save, rank, &rc)) {
            preempted = true;
            break;
        }
    }
    if (!rc && !preempted) {
        uint64_t h;
        st = ex_params_hash(ctx, &h, o.run.dump, rank);
        if (st)
            rc = ex_die("params-hash", st);
        else if (rank == 0)
            printf("params-hash %016llx\n", (unsigned long long)h);
    }
    for (int i = 0; i <= m.nlayers; i++)
        free(acts[i]);
    free(acts);
    free(dlog);
    free(shard_loss);
    free(dbuf);
    free(wd.w);
    free(wd.gw);
    free(wd.b);
    free(wd.gb);
    mlp_gpu_close(gpu);
    free(m.l);
    free(m.init);
    if (rc && !agreed)
        ex_abort(ctx, rc);
    zs_finalize(ctx);
    MPI_Finalize();
    return rc ? 1 : 0;
}
