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
#include "splitmix.h" /* defines: ex_splitmix64 */
#include "zeroshard.h"

#define IN_DIM 16
#define CLASSES 4

struct opts {
    struct ex_run_opts run;
    int64_t hidden, layers;
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
    zs_status st;
    int labels[4096];
    double total = 0.0;
    zs_step_stats ss;
    float lscale;
    int64_t ms = zs_micro_shard_size(ctx) ? zs_micro_shard_size(ctx) : B;

    zs_stats(ctx, &ss);
    lscale = (float)ss.loss_scale; /* fp16: backward runs on loss x scale; 1 otherwise */

    for (int64_t k = 0; k < B; k++)
        sample(o->run.seed, first + (uint64_t)k, acts[0] + k * IN_DIM, &labels[k]);
    for (int i = 0; i < m->nlayers; i++) {
        const struct layer *L = &m->l[i];
        void *wp, *bp;
        if ((st = zs_unit_fetch(ctx, L->unit, NULL)) || (st = zs_param_data(ctx, L->w, &wp)) ||
            (st = zs_param_data(ctx, L->b, &bp)))
            return st;
        const float *w = widen(wd, wp, L->in * L->out, wd->w), *b = widen(wd, bp, L->out, wd->b);
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
    for (int64_t k = 0; k < B; k++) { /* softmax cross-entropy, gradient of the (micro-shard's) mean */
        if (k % ms == 0)
            shard_loss[k / ms] = 0.0;
        const float *z = acts[m->nlayers] + k * CLASSES;
        float mx = z[0], sum = 0.0f;
        for (int c = 1; c < CLASSES; c++)
            mx = z[c] > mx ? z[c] : mx;
        for (int c = 0; c < CLASSES; c++)
            sum += expf(z[c] - mx);
        total += (double)(logf(sum) + mx - z[labels[k]]);
        shard_loss[k / ms] += (double)(logf(sum) + mx - z[labels[k]]) / (double)ms;
        for (int c = 0; c < CLASSES; c++)
            dlog[k * CLASSES + c] = (expf(z[c] - mx) / sum - (c == labels[k] ? 1.0f : 0.0f)) / (float)ms * lscale;
    }
    *loss = total / (double)B;
    for (int i = m->nlayers - 1; i >= 0; i--) {
        const struct layer *L = &m->l[i];
        void *wp, *gp;
        float *g, *gw, *gb;
        int64_t woff, boff;
        if ((st = zs_unit_fetch(ctx, L->unit, NULL)) || (st = zs_param_data(ctx, L->w, &wp)) ||
            (st = zs_grad_buffer(ctx, L->unit, &gp)) || (st = zs_param_info(ctx, L->w, NULL, NULL, NULL, &woff)) ||
            (st = zs_param_info(ctx, L->b, NULL, NULL, NULL, &boff)))
            return st;
        const float *w = widen(wd, wp, L->in * L->out, wd->w);
        for (int64_t k0 = 0; k0 < B; k0 += ms) {
            if (wd->dt == ZS_DTYPE_FP32) { /* straight into the buffer */
                g = gp;
                gw = g + woff;
                gb = g + boff;
            } else {
                gw = wd->gw;
                gb = wd->gb;
                memset(gw, 0, (size_t)(L->in * L->out) * sizeof(float));
                memset(gb, 0, (size_t)L->out * sizeof(float));
            }
            weight_grads(L, acts[i], dlog, k0, k0 + ms, gw, gb);
            if (wd->dt != ZS_DTYPE_FP32) {
                fold_grad(wd, (uint16_t *)gp + woff, gw, L->in * L->out);
                fold_grad(wd, (uint16_t *)gp + boff, gb, L->out);
            }
            if ((st = zs_grad_deposit(ctx, L->unit)))
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
        if ((st = zs_grad_ready(ctx, L->unit)) || (st = zs_unit_release(ctx, L->unit)))
            return st;
    }
    return ZS_OK;
}

static const char usage[] = "usage: mpirun -np N zs-train-mlp --config FILE [options]\n"
                            "Trains an MLP classifier on generated data through ZeroShard. Defaults: --steps 20, --seed 1.\n" EX_AUTO_HELP;

static int parse_args(int argc, char **argv, struct opts *o)
{
    *o = (struct opts){.run = {.steps = 20, .seed = 1, .micro = 8, .lr = 1e-3}, .hidden = 64, .layers = 2};
    const struct cli_flag own[] = {
        {"--hidden", CLI_INT, &o->hidden, "hidden width (default 64)"},
        {"--layers", CLI_INT, &o->layers, "hidden layers (default 2)"},
    };
    int rc = ex_parse(argc, argv, &o->run, own, (int)(sizeof(own) / sizeof(own[0])), usage);

    if (rc)
        return rc;
    if (o->hidden < 1 || o->layers < 0) {
        fprintf(stderr, "zeroshard: error: --hidden must be positive and --layers non-negative\n");
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

    zs_step_stats at;
    zs_stats(ctx, &at);
    /* --steps N trains until global step N: a run resumed from a checkpoint carries on where it stopped,
     * drawing the same samples the uninterrupted run would have. */
    for (int64_t step = at.global_step; step < o.run.steps && !rc; step++) {
        double sum = 0.0, loss, all = 0.0, t0 = MPI_Wtime();
        for (int64_t mb = 0; mb < gas && !rc; mb++) {
            uint64_t first = (uint64_t)(((step * gas + mb) * world + rank) * B);
            st = micro_batch(ctx, &m, &o, first, B, acts, dlog, dbuf, &wd, &loss, shard_loss + mb * per);
            if (!st)
                st = zs_step(ctx);
            if (st)
                rc = ex_die("train", st);
            sum += loss;
        }
        if (rc)
            break;
        MPI_Allreduce(&sum, &all, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
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
        if (o.run.save_dir && ((o.run.save_every && s.global_step % o.run.save_every == 0) || last) &&
            (st = zs_checkpoint_save(ctx, o.run.save_dir)))
            rc = ex_die("save", st);
    }
    if (!rc) {
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
    free(dbuf);
    free(shard_loss);
    free(wd.w);
    free(wd.gw);
    free(wd.b);
    free(wd.gb);
    free(m.l);
    free(m.init);
    if (rc)
        MPI_Abort(MPI_COMM_WORLD, rc);
    zs_finalize(ctx);
    MPI_Finalize();
    return 0;
}
