/* test_engine.c - engine behaviour that needs several ranks: agreement checks at init and set-up
 * (a differing config or registration fails on every rank with the ranks named, never hangs), API
 * misuse errors, and per-rank memory against the ZeRO formulas. Run under mpirun -np 4 (and 3, 1). */
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <mpi.h>

#include "check.h"
#include "zeroshard.h"

static int rank, world;

static zs_status init_json(zs_ctx **ctx, const char *json)
{
    zs_init_opts o = { .config_json = json, .use_comm = 1, .comm = MPI_COMM_WORLD, .quiet = 1 };
    return zs_init(ctx, &o);
}

static void test_config_mismatch(void)
{
    char json[256];
    zs_ctx *ctx = NULL;
    zs_status st;

    snprintf(json, sizeof(json), "{\"train_micro_batch_size_per_gpu\": 2, \"zero_optimization\": {\"stage\": %d}}",
             rank == world - 1 ? 2 : 1);
    st = init_json(&ctx, json);
    CHECK(st == ZS_ERR_MISMATCH && ctx == NULL, "config mismatch gave %d: %s", st, zs_last_error());
    char want[64];
    snprintf(want, sizeof(want), "rank(s) %d", world - 1);
    CHECK(strstr(zs_last_error(), want) && strstr(zs_last_error(), "zero_optimization.stage 1 vs 2"),
          "message: %s", zs_last_error());
}

static void test_bad_config_on_one_rank(void)
{
    zs_ctx *ctx = NULL;
    const char *good = "{\"train_micro_batch_size_per_gpu\": 2}";
    const char *bad = "{\"train_micro_batch_size_per_gpu\": 2, \"zero_optimization\": {\"stage\": 7}}";
    zs_status st = init_json(&ctx, rank == 1 ? bad : good);

    CHECK(st == ZS_ERR_CONFIG && ctx == NULL, "bad config on rank 1 gave %d: %s", st, zs_last_error());
    CHECK(!strncmp(zs_last_error(), "rank 1: zero_optimization.stage", 31), "message: %s", zs_last_error());
}

static void test_registration_mismatch(void)
{
    zs_ctx *ctx = NULL;
    int32_t u, p;
    zs_status st = init_json(&ctx, "{\"train_micro_batch_size_per_gpu\": 2, \"zero_optimization\": {\"stage\": 3}}");

    CHECK(st == ZS_OK, "%s", zs_last_error());
    if (st)
        return;
    zs_unit_add(ctx, "block0", &u);
    zs_param_add(ctx, u, "w", 100, NULL, &p);
    if (rank == 1)
        zs_param_add(ctx, u, "extra", 7, NULL, &p);
    st = zs_setup(ctx);
    CHECK(st == ZS_ERR_MISMATCH, "registration mismatch gave %d: %s", st, zs_last_error());
    CHECK(strstr(zs_last_error(), "rank(s) 1 differ from rank 0"), "message: %s", zs_last_error());
    zs_finalize(ctx);
}

static void test_misuse(void)
{
    zs_ctx *ctx = NULL;
    int32_t u, p;
    float *g;

    CHECK(init_json(&ctx, "{\"train_micro_batch_size_per_gpu\": 1}") == ZS_OK, "%s", zs_last_error());
    if (!ctx)
        return;
    CHECK(zs_unit_fetch(ctx, 0, NULL) == ZS_ERR_INVALID && strstr(zs_last_error(), "zs_setup"), "%s", zs_last_error());
    zs_unit_add(ctx, "empty", &u);
    CHECK(zs_param_add(ctx, u, "nothing", 0, NULL, &p) == ZS_ERR_INVALID && strstr(zs_last_error(), "'nothing' has 0"),
          "zero-size param: %s", zs_last_error());
    CHECK(zs_setup(ctx) == ZS_ERR_INVALID && strstr(zs_last_error(), "unit 'empty' has no parameters"),
          "zero-size unit: %s", zs_last_error());
    zs_finalize(ctx);

    CHECK(init_json(&ctx, "{\"train_micro_batch_size_per_gpu\": 1}") == ZS_OK, "%s", zs_last_error());
    zs_unit_add(ctx, "a", &u);
    zs_param_add(ctx, u, "w", 5, NULL, &p);
    CHECK(zs_setup(ctx) == ZS_OK, "%s", zs_last_error());
    CHECK(zs_grad_ready(ctx, u) == ZS_ERR_INVALID && strstr(zs_last_error(), "zs_grad_get first"), "%s", zs_last_error());
    CHECK(zs_step(ctx) == ZS_ERR_INVALID && strstr(zs_last_error(), "unit 'a' had no zs_grad_ready"), "%s",
          zs_last_error());
    CHECK(zs_grad_get(ctx, u, &g) == ZS_OK && zs_grad_ready(ctx, u) == ZS_OK, "%s", zs_last_error());
    CHECK(zs_grad_get(ctx, u, &g) == ZS_ERR_INVALID && strstr(zs_last_error(), "already marked ready"), "%s",
          zs_last_error());
    CHECK(zs_unit_release(ctx, u) == ZS_ERR_INVALID && strstr(zs_last_error(), "not fetched"), "%s", zs_last_error());
    CHECK(zs_unit_fetch(ctx, 9, NULL) == ZS_ERR_INVALID && strstr(zs_last_error(), "no unit 9"), "%s", zs_last_error());
    void *stream = &stream;
    CHECK(zs_cuda_stream(ctx, &stream) == ZS_ERR_UNSUPPORTED && !stream &&
          strstr(zs_last_error(), "zeroshard.device is \"cpu\""), "zs_cuda_stream on the CPU: %s", zs_last_error());
    zs_finalize(ctx);
}

static double rel(uint64_t a, uint64_t b) { return b ? (double)a / (double)b : (a ? 1e9 : 1.0); }

/* The memory tests' config: AdamW, one sample a micro-batch, the stage, bf16 or fp32, extra zero_optimization
 * keys and extra top-level sections (each starting with a comma). */
static void memory_json(char *json, size_t n, int stage, bool bf16, const char *zero_keys, const char *sections)
{
    snprintf(json, n,
             "{\"train_micro_batch_size_per_gpu\": 1, \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-3}},"
             " \"zero_optimization\": {\"stage\": %d, \"stage3_param_persistence_threshold\": 0%s}%s%s}", stage, zero_keys,
             sections, bf16 ? ", \"bf16\": {\"enabled\": true}" : "");
}

/* Two training iterations of the units (one gradient value each, deposited in deterministic mode). */
static void two_iterations(zs_ctx *ctx, const int32_t *units, int n, bool bf16, bool det)
{
    void *g;

    for (int it = 0; it < 2; it++) { /* the second iteration runs with a trace: prefetch and reuse */
        for (int i = 0; i < n; i++)
            CHECK(zs_unit_fetch(ctx, units[i], NULL) == ZS_OK && zs_unit_release(ctx, units[i]) == ZS_OK, "%s",
                  zs_last_error());
        for (int i = n - 1; i >= 0; i--) {
            CHECK(zs_unit_fetch(ctx, units[i], NULL) == ZS_OK && zs_grad_buffer(ctx, units[i], &g) == ZS_OK, "%s",
                  zs_last_error());
            if (bf16)
                ((uint16_t *)g)[0] = 0x3f80; /* 1.0 */
            else
                ((float *)g)[0] = 1.0f;
            CHECK(!det || zs_grad_deposit(ctx, units[i]) == ZS_OK, "%s", zs_last_error());
            CHECK(zs_grad_ready(ctx, units[i]) == ZS_OK && zs_unit_release(ctx, units[i]) == ZS_OK, "%s",
                  zs_last_error());
        }
        CHECK(zs_step(ctx) == ZS_OK, "%s", zs_last_error());
    }
}

/* Deterministic mode: the gradient memory measured is what zs_estimate_memory predicts, and both are the
 * gradients as the stage keeps them, plus (stages 2-3) the whole buffer the program fills, plus the exact
 * sum's 14 bytes an element (counters, own and agreed top bands). */
static void test_memory_det(int stage, const char *dtype)
{
    bool bf16 = !strcmp(dtype, "bf16");
    enum { UNITS = 3 };
    static const int64_t sizes[UNITS] = {5001, 70000, 333};
    char json[512];
    zs_ctx *ctx = NULL;
    int32_t units[UNITS], p;
    zs_memory_report m, e;

    memory_json(json, sizeof(json), stage, bf16, "", ", \"zeroshard\": {\"deterministic\": \"world_size_invariant\"}");
    CHECK(init_json(&ctx, json) == ZS_OK, "%s", zs_last_error());
    if (!ctx)
        return;
    for (int i = 0; i < UNITS; i++) {
        char name[32];
        snprintf(name, sizeof(name), "u%d", i);
        zs_unit_add(ctx, name, &units[i]);
        zs_param_add(ctx, units[i], "w", sizes[i], NULL, &p);
    }
    CHECK(zs_setup(ctx) == ZS_OK, "%s", zs_last_error());
    two_iterations(ctx, units, UNITS, bf16, true);
    CHECK(zs_memory(ctx, &m) == ZS_OK && zs_estimate_memory(json, world, UNITS, sizes, &e) == ZS_OK, "%s",
          zs_last_error());
    uint64_t want = 0, psz = bf16 ? 2 : 4;
    for (int i = 0; i < UNITS; i++) {
        uint64_t sh = (uint64_t)((sizes[i] + world - 1) / world + 15) / 16 * 16, pad = sh * (uint64_t)world; /* 16s */
        want += (stage <= 1 ? psz * pad : psz * sh + psz * pad) /* comm dtype: the parameters' */ + 14 * pad;
    }
    if (rank == 0)
        printf("deterministic stage %d %s world %d: grads %llu, estimate %llu, expected %llu\n", stage, dtype, world,
               (unsigned long long)m.grads, (unsigned long long)e.grads, (unsigned long long)want);
    CHECK(m.grads == want && e.grads == want && e.params == m.params && e.optimizer == m.optimizer,
          "deterministic stage %d %s: grads measured %llu, estimated %llu, expected %llu", stage, dtype,
          (unsigned long long)m.grads, (unsigned long long)e.grads, (unsigned long long)want);
    zs_finalize(ctx);
}

/* One full training iteration, then persistent bytes against the ZeRO formulas for AdamW: in total and
 * per category (fp32: 4+4+8 bytes a parameter; bf16: 2+2+12), and against zs_estimate_memory. */
static void test_memory(int stage, const char *dtype)
{
    bool bf16 = !strcmp(dtype, "bf16");
    enum { UNITS = 4, W = 262000, B = 144 };
    char json[512];
    zs_ctx *ctx = NULL;
    int32_t units[UNITS], p;
    zs_memory_report m;
    float *w = calloc(W, sizeof(float));

    memory_json(json, sizeof(json), stage, bf16,
                ", \"reduce_bucket_size\": 1, \"stage3_max_live_parameters\": 600000, \"stage3_prefetch_bucket_size\": 300000",
                "");
    CHECK(init_json(&ctx, json) == ZS_OK, "%s", zs_last_error());
    if (!ctx) {
        free(w);
        return;
    }
    for (int i = 0; i < UNITS; i++) {
        char name[32];
        snprintf(name, sizeof(name), "block%d", i);
        zs_unit_add(ctx, name, &units[i]);
        zs_param_add(ctx, units[i], "w", W, w, &p);
        zs_param_add(ctx, units[i], "b", B, NULL, &p);
    }
    CHECK(zs_setup(ctx) == ZS_OK, "%s", zs_last_error());
    two_iterations(ctx, units, UNITS, bf16, false);
    CHECK(zs_memory(ctx, &m) == ZS_OK, "%s", zs_last_error());
    uint64_t persistent = m.params + m.grads + m.optimizer;
    double ratio = (double)persistent / (double)m.formula;
    if (rank == 0)
        printf("stage %d %s world %d: params %llu grads %llu optimizer %llu (masters %llu) buffers %llu | formula %llu "
               "ratio %.4f (params %.4f grads %.4f optimizer %.4f) peak live %llu\n", stage, dtype, world,
               (unsigned long long)m.params, (unsigned long long)m.grads, (unsigned long long)m.optimizer,
               (unsigned long long)m.master, (unsigned long long)m.buffers, (unsigned long long)m.formula, ratio,
               rel(m.params, m.expect_params), rel(m.grads, m.expect_grads), rel(m.optimizer, m.expect_optimizer),
               (unsigned long long)m.peak_live_params);
    CHECK(ratio > 0.95 && ratio < 1.05, "stage %d %s: persistent %llu vs formula %llu (ratio %.4f)", stage, dtype,
          (unsigned long long)persistent, (unsigned long long)m.formula, ratio);
    CHECK(fabs(rel(m.params, m.expect_params) - 1) < 0.05 && fabs(rel(m.grads, m.expect_grads) - 1) < 0.05 &&
              fabs(rel(m.optimizer, m.expect_optimizer) - 1) < 0.05,
          "stage %d %s: a category is off its formula", stage, dtype);
    CHECK(llabs((long long)m.formula - (long long)((uint64_t)(bf16 ? (stage == 0 ? 16 : stage == 1 ? 4 * world + 12 : stage == 2 ? 2 * world + 14 : 16)
                                       : (stage == 0 ? 16 : stage == 1 ? 8 * world + 8 : stage == 2 ? 4 * world + 12 : 16)) *
                            (uint64_t)UNITS * (W + B) / (uint64_t)(stage == 0 ? 1 : world))) <= 8, /* rounding */
          "stage %d %s: formula %llu is not the ZeRO paper's", stage, dtype, (unsigned long long)m.formula);
    /* the estimator, from the config and the unit sizes alone, predicts the same model states */
    zs_memory_report e;
    int64_t sizes[UNITS];
    for (int i = 0; i < UNITS; i++)
        sizes[i] = W + B;
    CHECK(zs_estimate_memory(json, world, UNITS, sizes, &e) == ZS_OK, "%s", zs_last_error());
    CHECK(e.params == m.params && e.grads == m.grads && e.optimizer == m.optimizer && e.formula == m.formula,
          "stage %d %s: estimate params %llu grads %llu optimizer %llu, measured %llu %llu %llu", stage, dtype,
          (unsigned long long)e.params, (unsigned long long)e.grads, (unsigned long long)e.optimizer,
          (unsigned long long)m.params, (unsigned long long)m.grads, (unsigned long long)m.optimizer);
    CHECK(e.buffers <= m.comm_buffers && rel(e.buffers + e.params + e.grads + e.optimizer,
                                             m.comm_buffers + m.params + m.grads + m.optimizer) > 0.95,
          "stage %d %s: estimated bucket %llu, measured communication buffers %llu", stage, dtype,
          (unsigned long long)e.buffers, (unsigned long long)m.comm_buffers);
    CHECK(m.numel == (uint64_t)UNITS * (W + B), "numel %llu", (unsigned long long)m.numel);
    if (stage == 3) /* a cap above one unit: never more than the cap gathered at once */
        CHECK(m.peak_live_params <= 600000 * 4, "peak live %llu above stage3_max_live_parameters",
              (unsigned long long)m.peak_live_params);
    if (stage >= 2) /* the bucket holds one unit (reduce_bucket_size 1 is raised to the largest unit) */
        CHECK(m.buffers >= (uint64_t)(W + B) * (bf16 ? 2 : 4), "buffers %llu", (unsigned long long)m.buffers);
    zs_finalize(ctx);
    free(w);
}

int main(int argc, char **argv)
{
    int fails, any = 0;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    test_misuse();
    if (world >= 2) {
        test_config_mismatch();
        test_bad_config_on_one_rank();
        test_registration_mismatch();
    }
    for (int stage = 0; stage <= 3; stage++) {
        test_memory(stage, "fp32");
        test_memory(stage, "bf16");
        test_memory_det(stage, "fp32");
        test_memory_det(stage, "bf16");
    }
    fails = zs_test_fail;
    MPI_Allreduce(&fails, &any, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Finalize();
    return any ? (zs_test_summary("test_engine"), 1) : zs_test_summary("test_engine");
}
