/* test_gpt_cuda_emu.cpp - zs-train-gpt's GPU code (examples/gpt/gpt_cuda.cu: its kernels, its row-major to
 * cuBLAS mapping, its walk over the units) run on the CPU through tests/cuda_emu, against the CPU passes
 * (passes_tmpl.h) on the same parameters and batch: the same io calls in the same order, the loss, every
 * tensor's gradient and the logits within 1e-4 of the tensor's largest value. Runs everywhere, GPU or not;
 * what it cannot see (timing, races between streams, the real cuBLAS) tests/gpt_device.sh checks on a GPU.
 * Parameters sit in unit buffers with gaps between the tensors (as the engine may place them), and every
 * tensor, LayerNorm weights and biases too, holds random values, so a misplaced offset or an unused bias shows.
 * Exits 0 (pass) or 1. */
#include "../examples/gpt/gpt_cuda.cu" /* the code under test, built against the stand-ins */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <string>
#include <vector>

/* ---------------------------------------------------------------- a host-memory io that records its calls */

struct host_io {
    std::vector<std::vector<float>> w, g;
    std::string trace;
};

static int io_fetch(void *arg, int32_t unit, const float **w)
{
    host_io *h = (host_io *)arg;
    h->trace += "F" + std::to_string(unit) + " ";
    *w = h->w[unit].data();
    return 0;
}

static int io_release(void *arg, int32_t unit)
{
    ((host_io *)arg)->trace += "R" + std::to_string(unit) + " ";
    return 0;
}

static int io_grad(void *arg, int32_t unit, float **g)
{
    host_io *h = (host_io *)arg;
    h->trace += "G" + std::to_string(unit) + " ";
    std::fill(h->g[unit].begin(), h->g[unit].end(), 0.0f);
    *g = h->g[unit].data();
    return 0;
}

static int io_grad_done(void *arg, int32_t unit)
{
    ((host_io *)arg)->trace += "D" + std::to_string(unit) + " ";
    return 0;
}

static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

static float uniform(uint64_t key) { return (float)((double)(mix(key) >> 11) / 9007199254740992.0 * 2.0 - 1.0); }

/* ---------------------------------------------------------------- one comparison */

static int failures;

/* |a - b| <= 1e-4 max|a| over n values (plus a floor for all-zero tensors) */
static void compare(const char *what, const float *a, const float *b, int64_t n)
{
    double amax = 0, d = 0;

    for (int64_t i = 0; i < n; i++) {
        amax = fmax(amax, fabs((double)a[i]));
        d = isnan(b[i]) || isnan(a[i]) ? INFINITY : fmax(d, fabs((double)a[i] - (double)b[i]));
    }
    bool ok = d <= 1e-4 * amax + 1e-12;
    if (!ok || getenv("ZS_TEST_VERBOSE"))
        printf("%s %s: max |cpu| %.3g, max |cpu - gpu| %.3g\n", ok ? "ok" : "FAIL", what, amax, d);
    failures += !ok;
}

struct setup {
    gpt_config cfg;
    int64_t max_batch, B;
};

static int run_case(const setup &s)
{
    const gpt_config *c = &s.cfg;
    gpt_layout lay;
    int64_t T = c->ctx, V = c->vocab, N = s.B * T;
    char err[256];
    int before = failures;

    if (gpt_layout_alloc(&lay, c))
        return 1;
    host_io cpu_io, gpu_io;
    for (int32_t u = 0; u < lay.nunits; u++) { /* tensors 5 elements apart: gaps the gradients must leave zero */
        int64_t at = 3;
        for (int32_t k = 0; k < gpt_unit_tensors(c, u); k++) {
            struct gpt_tensor_info t;
            gpt_tensor_info(c, u, k, &t);
            lay.off[u][k] = at;
            at += t.numel + 5;
        }
        lay.unit_numel[u] = at;
        std::vector<float> w((size_t)at, 0.0f);
        for (int32_t k = 0; k < gpt_unit_tensors(c, u); k++) {
            struct gpt_tensor_info t;
            gpt_tensor_info(c, u, k, &t);
            for (int64_t i = 0; i < t.numel; i++) {
                float r = uniform(((uint64_t)u << 40) ^ ((uint64_t)k << 32) ^ (uint64_t)i);
                w[(size_t)(lay.off[u][k] + i)] = t.init == GPT_INIT_ONE ? 1.0f + 0.2f * r : t.init == GPT_INIT_ZERO ? 0.1f * r
                                                                                                               : 0.1f * r;
            }
        }
        cpu_io.w.push_back(w);
        gpu_io.w.push_back(w);
        cpu_io.g.emplace_back((size_t)at, 0.0f);
        gpu_io.g.emplace_back((size_t)at, 0.0f);
    }
    std::vector<int32_t> in((size_t)N), tg((size_t)N);
    for (int64_t i = 0; i < N; i++) {
        in[(size_t)i] = (int32_t)(mix(2 * (uint64_t)i) % (uint64_t)V);
        tg[(size_t)i] = (int32_t)(mix(2 * (uint64_t)i + 1) % (uint64_t)V);
    }
    gpt_io_f32 cio = {&cpu_io, io_fetch, io_release, io_grad, io_grad_done, NULL};
    gpt_io_f32 gio = {&gpu_io, io_fetch, io_release, io_grad, io_grad_done, NULL};
    gpt_model_f32 m;
    gpt_gpu *g = gpt_gpu_open(0, c, &lay, s.max_batch, err, sizeof(err));
    if (!g || gpt_model_init_f32(&m, c, &lay, s.max_batch, 0)) {
        printf("FAIL: open: %s\n", g ? "CPU model" : err);
        return 1;
    }
    printf("layers %lld dim %lld heads %lld ctx %lld, %lld of %lld sequences:\n", (long long)c->layers,
           (long long)c->dim, (long long)c->heads, (long long)T, (long long)s.B, (long long)s.max_batch);
    /* training, with a gradient scale as fp16's loss scale gives it */
    double lc = 0, lg = 0;
    int rc = gpt_model_run_f32(&m, &cio, in.data(), tg.data(), s.B, 1, 2.0, &lc);
    int rg = gpt_gpu_run(g, &gio, in.data(), tg.data(), s.B, 1, 2.0, &lg);
    if (rc || rg) {
        printf("FAIL: run: cpu %d, gpu %d (%s)\n", rc, rg, gpt_gpu_error(g));
        return 1;
    }
    float fl[2] = {(float)lc, (float)lg};
    compare("loss", &fl[0], &fl[1], 1);
    if (cpu_io.trace != gpu_io.trace) {
        printf("FAIL: the io calls differ:\n cpu %s\n gpu %s\n", cpu_io.trace.c_str(), gpu_io.trace.c_str());
        failures++;
    }
    for (int32_t u = 0; u < lay.nunits; u++) {
        for (int32_t k = 0; k < gpt_unit_tensors(c, u); k++) {
            struct gpt_tensor_info t;
            gpt_tensor_info(c, u, k, &t);
            compare(t.name, cpu_io.g[(size_t)u].data() + lay.off[u][k], gpu_io.g[(size_t)u].data() + lay.off[u][k],
                    t.numel);
        }
        int64_t gaps = 0;
        for (float v : gpu_io.g[(size_t)u])
            gaps += v != 0.0f;
        for (int32_t k = 0; k < gpt_unit_tensors(c, u); k++) {
            struct gpt_tensor_info t;
            gpt_tensor_info(c, u, k, &t);
            for (int64_t i = 0; i < t.numel; i++)
                gaps -= gpu_io.g[(size_t)u][(size_t)(lay.off[u][k] + i)] != 0.0f;
        }
        if (gaps) {
            printf("FAIL: unit %d: %lld non-zero gradient values between its tensors\n", u, (long long)gaps);
            failures++;
        }
    }
    /* evaluation: the loss without a backward, then the logits without targets */
    cpu_io.trace.clear();
    gpu_io.trace.clear();
    rc = gpt_model_run_f32(&m, &cio, in.data(), tg.data(), s.B, 0, 1.0, &lc);
    rg = gpt_gpu_run(g, &gio, in.data(), tg.data(), s.B, 0, 1.0, &lg);
    fl[0] = (float)lc;
    fl[1] = (float)lg;
    compare("evaluation loss", &fl[0], &fl[1], 1);
    rc |= gpt_model_run_f32(&m, &cio, in.data(), NULL, s.B, 0, 1.0, NULL);
    rg |= gpt_gpu_run(g, &gio, in.data(), NULL, s.B, 0, 1.0, NULL);
    if (rc || rg || !gpt_gpu_logits(g) || cpu_io.trace != gpu_io.trace) {
        printf("FAIL: evaluation: cpu %d, gpu %d, io calls cpu %s gpu %s\n", rc, rg, cpu_io.trace.c_str(),
               gpu_io.trace.c_str());
        failures++;
    } else
        compare("logits", m.logits, gpt_gpu_logits(g), N * V);
    rg = gpt_gpu_run(g, &gio, in.data(), NULL, s.max_batch + 1, 0, 1.0, NULL);
    if (rg != -1 || !gpt_gpu_error(g)[0]) {
        printf("FAIL: a micro-batch above max_batch was not refused\n");
        failures++;
    }
    printf("%s\n", failures == before ? "ok" : "FAIL");
    gpt_gpu_close(g);
    gpt_model_free_f32(&m);
    gpt_layout_free(&lay);
    return 0;
}

int main(void)
{
    /* one warp per LayerNorm row with C below and above 32; softmax rows longer than a warp (ctx 40);
     * chunked column sums with a partial last chunk (N = 2 x 40 rows); a micro-batch below the maximum */
    const setup cases[] = {
        {{2, 32, 4, 16, 256}, 2, 2},
        {{1, 48, 3, 40, 256}, 3, 2},
    };
    for (const setup &s : cases)
        if (run_case(s))
            return 1;
    printf("gpt_cuda_emu: %d failures\n", failures);
    return failures ? 1 : 0;
}
