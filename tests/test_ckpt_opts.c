/* test_ckpt_opts.c - checkpoint tags, load flags and loads mid-training, the extra file, and a parameter's full
 * state (zs_param_read / zs_param_write); run under mpirun -np 2.
 * For each stage 0-3 and offload none/cpu/nvme (fp32) and two bf16 set-ups: 2 steps, a save under the tag
 * "checkpoint", steps 3 and 4, a partial evaluation pass (stage 3 keeps prefetched copies), then a load of
 * "checkpoint" and steps 3 and 4 again, which must give the uninterrupted run's parameters bit for bit. The
 * state read at step 3 (parameters, the reduced gradient before the step, both moments) must equal stage 0's
 * (whole state on every rank) bit for bit: the made-up gradients are exact in binary, so no stage rounds
 * differently. A write from rank 1 must show in the next fetch and carry into the next step. A one-rank world
 * loads the two-rank checkpoint and reads the same parameters. Then tags, no_latest, the load flags, a
 * directory without `latest`, and the extra file, including a failing write of it. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <mpi.h>

#include "check.h"
#include "zeroshard.h"

#define NPARAMS 4
static int accum; /* gradient_accumulation_steps of the set-up being run */
static const int64_t numel[NPARAMS] = {100, 37, 300, 50};
static const int32_t unit_of[NPARAMS] = {0, 0, 1, 2}; /* u2 (50 elements) stays whole at stage 3 */
#define NUNITS 3
#define TOTAL (100 + 37 + 300 + 50)

static int rank, world;
static char base[256];

struct setup {
    const char *name;
    int stage;
    const char *offload; /* none, cpu, nvme */
    const char *dtype;   /* fp32, bf16 */
    int accum;
};

static void init_values(void *arg, int32_t param, int64_t first, int64_t count, float *dst)
{
    (void)arg;
    for (int64_t i = 0; i < count; i++)
        dst[i] = (float)((param * 131 + first + i) % 97) / 128.0f - 0.375f;
}

static zs_status open_ctx(zs_ctx **ctx, const struct setup *s, MPI_Comm comm, int nranks, const char *extra)
{
    char json[4096], off[1200] = "";
    zs_init_opts o = {.config_json = json, .use_comm = 1, .comm = comm, .quiet = 1};
    zs_status st;

    if (!strcmp(s->offload, "cpu"))
        snprintf(off, sizeof(off), ", \"offload_optimizer\": {\"device\": \"cpu\"}%s",
                 s->stage == 3 ? ", \"offload_param\": {\"device\": \"cpu\"}" : "");
    else if (!strcmp(s->offload, "nvme"))
        snprintf(off, sizeof(off), ", \"sub_group_size\": 100, \"offload_optimizer\": {\"device\": \"nvme\", "
                 "\"nvme_path\": \"%s/nvme\"}%s%s%s", base, s->stage == 3 ? ", \"offload_param\": {\"device\": "
                 "\"nvme\", \"nvme_path\": \"" : "", s->stage == 3 ? base : "", s->stage == 3 ? "/nvme\"}" : "");
    snprintf(json, sizeof(json), "{\"train_batch_size\": %d, \"train_micro_batch_size_per_gpu\": 1, "
             "\"gradient_accumulation_steps\": %d, \"steps_per_print\": 0, %s%s"
             "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01, \"weight_decay\": 0.01}}, "
             "\"zero_optimization\": {\"stage\": %d, \"stage3_param_persistence_threshold\": 60, "
             "\"stage3_max_reuse_distance\": 1000000, \"stage3_prefetch_bucket_size\": 1000000%s}%s}",
             nranks * accum, accum, !strcmp(s->dtype, "bf16") ? "\"bf16\": {\"enabled\": true}, " : "",
             extra ? extra : "", s->stage, off, "");
    st = zs_init(ctx, &o);
    for (int32_t p = 0, unit = -1; !st && p < NPARAMS; p++) { /* a unit is filled before the next is added */
        char name[16];
        int32_t id;
        if (unit != unit_of[p]) {
            snprintf(name, sizeof(name), "u%d", unit_of[p]);
            st = zs_unit_add(*ctx, name, &unit);
        }
        snprintf(name, sizeof(name), "p%d", p);
        if (!st)
            st = zs_param_add_init(*ctx, unit, name, numel[p], init_values, NULL, &id);
    }
    return st ? st : zs_setup(*ctx);
}

/* g[i] += v in the parameters' dtype (fp32 or bf16; every v here is exact in bf16 too). */
static void add_to(zs_ctx *ctx, void *g, int64_t i, float v)
{
    uint32_t bits;
    float cur;

    if (zs_param_dtype(ctx) == ZS_DTYPE_FP32) {
        ((float *)g)[i] += v;
        return;
    }
    bits = (uint32_t)((uint16_t *)g)[i] << 16;
    memcpy(&cur, &bits, 4);
    cur += v;
    memcpy(&bits, &cur, 4);
    ((uint16_t *)g)[i] = (uint16_t)(bits >> 16);
}

/* Made-up gradients of unit u's parameters, exact in binary (multiples of 1/64, small), different per rank,
 * micro-step and element. */
static void unit_grads(zs_ctx *ctx, int32_t u, void *g, int64_t micro)
{
    for (int32_t p = 0; p < NPARAMS; p++) {
        int64_t off;
        int32_t unit;
        zs_param_info(ctx, p, NULL, NULL, &unit, &off);
        for (int64_t i = 0; unit == u && i < numel[p]; i++)
            add_to(ctx, g, off + i, (float)((i * 7 + p * 3 + micro * 5 + rank * 11) % 13 - 6) / 64.0f);
    }
}

/* One micro-batch: every unit fetched, its gradients added and handed over, released. */
static zs_status grads_in(zs_ctx *ctx, int64_t micro)
{
    void *g = NULL;
    zs_status st = ZS_OK;

    for (int32_t u = 0; !st && u < NUNITS; u++) {
        if ((st = zs_unit_fetch(ctx, u, NULL)) || (st = zs_grad_buffer(ctx, u, &g)))
            break;
        unit_grads(ctx, u, g, micro);
        if (!(st = zs_grad_ready(ctx, u)))
            st = zs_unit_release(ctx, u);
    }
    return st;
}

/* One optimizer step (accum micro-batches); with grad set, the reduced gradients read before zs_step. */
static zs_status one_step(zs_ctx *ctx, float *grad)
{
    zs_step_stats s;
    zs_status st = ZS_OK;

    for (int m = 0; !st && m < accum; m++) {
        zs_stats(ctx, &s);
        st = grads_in(ctx, s.micro_step);
        for (int32_t p = 0, at = 0; !st && grad && m == accum - 1 && p < NPARAMS; at += (int32_t)numel[p++])
            st = zs_param_read(ctx, p, ZS_STATE_GRAD, grad + at);
        if (!st)
            st = zs_step(ctx);
    }
    return st;
}

/* Every parameter's working values as fp32, from fetches (not from zs_param_read). */
static zs_status fetched(zs_ctx *ctx, float *out)
{
    zs_status st = ZS_OK;

    for (int32_t p = 0, at = 0; !st && p < NPARAMS; at += (int32_t)numel[p++]) {
        void *d;
        st = zs_unit_fetch(ctx, unit_of[p], NULL);
        if (!st)
            st = zs_param_data(ctx, p, &d);
        for (int64_t i = 0; !st && i < numel[p]; i++) {
            if (zs_param_dtype(ctx) == ZS_DTYPE_FP32) {
                out[at + i] = ((float *)d)[i];
            } else {
                uint32_t bits = (uint32_t)((uint16_t *)d)[i] << 16;
                memcpy(&out[at + i], &bits, 4);
            }
        }
        if (!st)
            st = zs_unit_release(ctx, unit_of[p]);
    }
    return st;
}

static zs_status read_all(zs_ctx *ctx, enum zs_state which, float *out)
{
    zs_status st = ZS_OK;

    for (int32_t p = 0, at = 0; !st && p < NPARAMS; at += (int32_t)numel[p++])
        st = zs_param_read(ctx, p, which, out + at);
    return st;
}

/* Everything a set-up's run leaves for the cross-stage comparison. */
struct record {
    float grad3[TOTAL], param3[TOTAL], m3[TOTAL], v3[TOTAL], after_write[TOTAL];
};

static bool same(const float *a, const float *b, int64_t n) { return !memcmp(a, b, (size_t)n * sizeof(float)); }

static void run_setup(const struct setup *s, struct record *rec, const struct record *ref)
{
    zs_ctx *ctx = NULL;
    char dir[400];
    static float f2[TOTAL], f2w[TOTAL], f3[TOTAL], f4[TOTAL], again[TOTAL], w[TOTAL], got[TOTAL], before[TOTAL];
    zs_ckpt_opts o = {.tag = "checkpoint"};
    zs_step_stats stats;
    int loaded = -1;
    zs_status st;

    snprintf(dir, sizeof(dir), "%s/%s", base, s->name);
    accum = s->accum;
    st = open_ctx(&ctx, s, MPI_COMM_WORLD, world, NULL);
    CHECK(!st, "%s: set-up: %s", s->name, zs_last_error());
    if (st)
        return;
    st = one_step(ctx, NULL);
    if (!st)
        st = one_step(ctx, NULL);
    if (!st)
        st = zs_checkpoint_save_opts(ctx, dir, &o);
    CHECK(!st, "%s: two steps and the save: %s", s->name, zs_last_error());
    CHECK(!strcmp(zs_checkpoint_tag(ctx), "checkpoint"), "%s: tag after the save '%s'", s->name,
          zs_checkpoint_tag(ctx));
    if (!st)
        st = read_all(ctx, ZS_STATE_PARAM, f2);
    if (!st)
        st = fetched(ctx, f2w);
    if (!st)
        st = one_step(ctx, rec->grad3);
    if (!st)
        st = read_all(ctx, ZS_STATE_PARAM, rec->param3);
    if (!st)
        st = read_all(ctx, ZS_STATE_EXP_AVG, rec->m3);
    if (!st)
        st = read_all(ctx, ZS_STATE_EXP_AVG_SQ, rec->v3);
    if (!st)
        st = read_all(ctx, ZS_STATE_PARAM, f3);
    /* after 3 steps, the step-2 checkpoint; step 3 again gives the same state */
    if (!st)
        st = zs_checkpoint_load_opts(ctx, dir, &o, &loaded);
    if (!st)
        st = one_step(ctx, NULL);
    if (!st)
        st = read_all(ctx, ZS_STATE_PARAM, got);
    CHECK(!st && same(got, f3, TOTAL), "%s: step 3 after loading at step 3 differs (%s)", s->name,
          st ? zs_last_error() : "values");
    if (!st)
        st = one_step(ctx, NULL);
    if (!st)
        st = read_all(ctx, ZS_STATE_PARAM, f4);
    CHECK(!st, "%s: steps 3 and 4 and their reads: %s", s->name, zs_last_error());
    if (st)
        goto out_finalize;
    /* an evaluation pass that stops after the first unit: stage 3 has prefetched the next ones */
    st = zs_unit_fetch(ctx, 0, NULL);
    if (!st)
        st = zs_unit_release(ctx, 0);
    if (!st)
        st = zs_checkpoint_load_opts(ctx, dir, &o, &loaded);
    CHECK(!st && loaded == 1, "%s: load mid-training: %s", s->name, st ? zs_last_error() : "loaded");
    zs_stats(ctx, &stats);
    CHECK(stats.global_step == 2 && stats.micro_step == 2 * accum, "%s: after the load step %lld micro %lld",
          s->name, (long long)stats.global_step, (long long)stats.micro_step);
    if (!st)
        st = fetched(ctx, got);
    CHECK(!st && same(got, f2w, TOTAL), "%s: a fetch right after the load does not show step 2's parameters (%s)",
          s->name, st ? zs_last_error() : "values");
    if (!st)
        st = one_step(ctx, NULL);
    if (!st)
        st = one_step(ctx, NULL);
    if (!st)
        st = read_all(ctx, ZS_STATE_PARAM, again);
    CHECK(!st && same(again, f4, TOTAL), "%s: steps 3-4 after the load differ from the uninterrupted run's (%s)",
          s->name, st ? zs_last_error() : "values");

    /* step 5 starts a window whose evaluation pass stops after unit 0 (stage 3 prefetches unit 1); rank 1
     * writes p2 (unit 1) and every rank fetches it; then a step from there */
    if (!st)
        st = one_step(ctx, NULL);
    if (!st)
        st = read_all(ctx, ZS_STATE_PARAM, before);
    if (!st)
        st = zs_unit_fetch(ctx, 0, NULL);
    if (!st)
        st = zs_unit_release(ctx, 0);
    for (int i = 0; i < TOTAL; i++)
        w[i] = rank == 1 ? (float)(i % 29) / 32.0f - 0.25f : NAN;
    if (!st)
        st = zs_param_write(ctx, 2, ZS_STATE_PARAM, rank == 1 ? w : NULL, 1);
    for (int i = 0; i < TOTAL; i++)
        w[i] = (float)(i % 29) / 32.0f - 0.25f; /* what rank 1 sent (exact in bf16 too) */
    if (!st)
        st = fetched(ctx, got);
    CHECK(!st && same(got + numel[0] + numel[1], w, numel[2]), "%s: the fetch after the write does not show it (%s)",
          s->name, st ? zs_last_error() : "values");
    if (!st)
        st = read_all(ctx, ZS_STATE_PARAM, got);
    memcpy(before + numel[0] + numel[1], w, (size_t)numel[2] * sizeof(float));
    CHECK(!st && same(got, before, TOTAL), "%s: the masters after the write (%s)", s->name,
          st ? zs_last_error() : "values");
    /* rank 0 writes p3's exp_avg (unit 2, whole on every rank at stage 3): read back, then in the next step */
    for (int i = 0; i < numel[3]; i++)
        w[i] = (float)(i % 5) / 1024.0f;
    if (!st)
        st = zs_param_write(ctx, 3, ZS_STATE_EXP_AVG, rank == 0 ? w : NULL, 0);
    if (!st)
        st = zs_param_read(ctx, 3, ZS_STATE_EXP_AVG, got);
    CHECK(!st && same(got, w, numel[3]), "%s: exp_avg written and read back (%s)", s->name,
          st ? zs_last_error() : "values");
    if (!st)
        st = one_step(ctx, NULL);
    if (!st)
        st = read_all(ctx, ZS_STATE_PARAM, rec->after_write);
    CHECK(!st, "%s: the step after the write: %s", s->name, zs_last_error());
    if (ref) {
        CHECK(same(rec->grad3, ref->grad3, TOTAL), "%s: reduced gradient at step 3 != the reference's", s->name);
        CHECK(same(rec->param3, ref->param3, TOTAL), "%s: parameters at step 3 != the reference's", s->name);
        CHECK(same(rec->m3, ref->m3, TOTAL), "%s: exp_avg at step 3 != the reference's", s->name);
        CHECK(same(rec->v3, ref->v3, TOTAL), "%s: exp_avg_sq at step 3 != the reference's", s->name);
        CHECK(same(rec->after_write, ref->after_write, TOTAL), "%s: the step after the write != the reference's",
              s->name);
    }
out_finalize:
    zs_finalize(ctx);

    /* a world of one rank loads the two-rank checkpoint */
    MPI_Comm solo;
    MPI_Comm_split(MPI_COMM_WORLD, rank, 0, &solo);
    if (rank == 0) {
        st = open_ctx(&ctx, s, solo, 1, NULL);
        if (!st)
            st = zs_checkpoint_load_opts(ctx, dir, &o, &loaded);
        if (!st)
            st = read_all(ctx, ZS_STATE_PARAM, got);
        CHECK(!st && same(got, f2, TOTAL), "%s: one rank loading the two-rank checkpoint (%s)", s->name,
              st ? zs_last_error() : "values differ");
        zs_finalize(ctx);
    }
    MPI_Comm_free(&solo);
    MPI_Barrier(MPI_COMM_WORLD);
}

/* ---------------------------------------------------------------- tags, flags, extra */

static bool latest_is(const char *dir, const char *want)
{
    char path[512], buf[300] = "";
    FILE *f;

    snprintf(path, sizeof(path), "%s/latest", dir);
    f = fopen(path, "r");
    if (!f)
        return want == NULL;
    if (!fgets(buf, sizeof(buf), f))
        buf[0] = '\0';
    fclose(f);
    buf[strcspn(buf, "\n")] = '\0';
    return want && !strcmp(buf, want);
}

static void test_tags(zs_ctx *ctx, const char *dir)
{
    static const char *const bad[] = {"a/b", "..", ".", "", "latest", "x.tmp", "save.lock", NULL};
    char long_tag[260];
    zs_ckpt_opts o = {0};
    zs_status st;

    for (int i = 0; bad[i]; i++) {
        o.tag = bad[i];
        st = zs_checkpoint_save_opts(ctx, dir, &o);
        CHECK(st == ZS_ERR_INVALID && strstr(zs_last_error(), "tag '") && strstr(zs_last_error(), bad[i]),
              "save with tag '%s': %d %s", bad[i], st, zs_last_error());
        st = zs_checkpoint_load_opts(ctx, dir, &o, NULL);
        CHECK(st == ZS_ERR_INVALID && strstr(zs_last_error(), "is not a safe file name"), "load with tag '%s': %s",
              bad[i], zs_last_error());
    }
    memset(long_tag, 'a', 201);
    long_tag[201] = '\0';
    o.tag = long_tag;
    CHECK(zs_checkpoint_save_opts(ctx, dir, &o) == ZS_ERR_INVALID, "a 201-byte tag");
    long_tag[200] = '\0';
    CHECK(zs_checkpoint_save_opts(ctx, dir, &o) == ZS_OK, "a 200-byte tag: %s", zs_last_error());

    /* no_latest: `latest` stays on what it named */
    o = (zs_ckpt_opts){.tag = "first"};
    CHECK(zs_checkpoint_save_opts(ctx, dir, &o) == ZS_OK && latest_is(dir, "first"), "save 'first'");
    o = (zs_ckpt_opts){.tag = "second", .no_latest = 1};
    CHECK(zs_checkpoint_save_opts(ctx, dir, &o) == ZS_OK && latest_is(dir, "first"),
          "no_latest moved latest: %s", zs_last_error());
    o.no_latest = 0; /* the same tag again: replaced, now latest */
    CHECK(zs_checkpoint_save_opts(ctx, dir, &o) == ZS_OK && latest_is(dir, "second"), "save 'second' again");

    /* a missing tag, and a directory without `latest` */
    o = (zs_ckpt_opts){.tag = "nowhere"};
    st = zs_checkpoint_load_opts(ctx, dir, &o, NULL);
    CHECK(st == ZS_ERR_IO && strstr(zs_last_error(), "/nowhere"), "missing tag: %d %s", st, zs_last_error());
    char empty[400];
    int loaded = -1;
    snprintf(empty, sizeof(empty), "%s/empty", base);
    if (rank == 0)
        mkdir(empty, 0755);
    MPI_Barrier(MPI_COMM_WORLD);
    st = zs_checkpoint_load_opts(ctx, empty, NULL, &loaded);
    CHECK(st == ZS_OK && loaded == 0, "a directory without latest: %d %s loaded %d", st, zs_last_error(), loaded);
    st = zs_checkpoint_load(ctx, empty);
    CHECK(st == ZS_ERR_IO && strstr(zs_last_error(), "not a checkpoint"), "zs_checkpoint_load there: %s",
          zs_last_error());
}

static void test_extra(zs_ctx *ctx, const char *dir)
{
    static const char text[] = "{\"client\": \"state\", \"epoch\": 3}";
    char trace[400], buf[128], line[1024], fault[64];
    zs_ckpt_opts o = {.tag = "with_extra", .extra_name = "client_state.json", .extra_data = text,
                      .extra_bytes = sizeof(text)};
    size_t n = 0;
    long k = 0, step = 0;
    FILE *f;
    zs_status st;

    snprintf(trace, sizeof(trace), "%s/trace.txt", base);
    setenv("ZS_TEST_CKPT_TRACE", trace, 1);
    st = zs_checkpoint_save_opts(ctx, dir, &o);
    unsetenv("ZS_TEST_CKPT_TRACE");
    CHECK(!st, "save with an extra file: %s", zs_last_error());
    CHECK(zs_checkpoint_extra(ctx, dir, "with_extra", "client_state.json", NULL, &n) == ZS_OK && n == sizeof(text),
          "extra size %zu: %s", n, zs_last_error());
    n = sizeof(buf);
    CHECK(zs_checkpoint_extra(ctx, dir, NULL, "client_state.json", buf, &n) == ZS_OK && n == sizeof(text) &&
          !memcmp(buf, text, n), "extra bytes (%zu)", n);
    n = 5;
    CHECK(zs_checkpoint_extra(ctx, dir, "first", "client_state.json", NULL, &n) == ZS_OK && n == 0,
          "a checkpoint without the extra file: %zu", n);
    o.extra_name = "manifest.json";
    CHECK(zs_checkpoint_save_opts(ctx, dir, &o) == ZS_ERR_INVALID, "extra named manifest.json");
    o.extra_name = "client_state.json";

    /* rank 0's step number of the extra file's write, from the trace of the save above */
    f = rank == 0 ? fopen(trace, "r") : NULL;
    while (f && fgets(line, sizeof(line), f)) {
        if (strncmp(line, "0 ", 2))
            continue;
        step++;
        if (strstr(line, " write ") && strstr(line, "client_state.json"))
            k = step;
    }
    if (f)
        fclose(f);
    MPI_Bcast(&k, 1, MPI_LONG, 0, MPI_COMM_WORLD);
    CHECK(k > 0, "the extra file's write is not in the trace");
    snprintf(fault, sizeof(fault), "0:enospc:%ld", k);
    setenv("ZS_TEST_CKPT_FAULT", fault, 1);
    o.tag = "full_disk";
    st = zs_checkpoint_save_opts(ctx, dir, &o);
    unsetenv("ZS_TEST_CKPT_FAULT");
    if (rank == 0)
        printf("a failing extra write: %s: %s\n", zs_status_str(st), zs_last_error());
    CHECK(st == ZS_ERR_IO && strstr(zs_last_error(), "client_state.json") &&
          strstr(zs_last_error(), "No space left on device"), "every rank returns the error naming the file: %d %s",
          st, zs_last_error());
    char tmp[512];
    MPI_Barrier(MPI_COMM_WORLD); /* rank 0 clears the failed save after every rank has its verdict */
    snprintf(tmp, sizeof(tmp), "%s/full_disk", dir);
    CHECK(latest_is(dir, "with_extra") && access(tmp, F_OK) != 0, "the failed save moved latest or left its tag");
    snprintf(tmp, sizeof(tmp), "%s/full_disk.tmp", dir);
    CHECK(access(tmp, F_OK) != 0, "the failed save left %s", tmp);
}

/* module_only, no_optimizer, no_scheduler against the running engine and the checkpoint (step 2). */
static void test_flags(const char *dir)
{
    static const struct setup s = {"flags", 2, "none", "fp32", 2};
    static const char sched[] = "\"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_min_lr\": 0, "
                                "\"warmup_max_lr\": 0.01, \"warmup_num_steps\": 10}}, ";
    static float p2[TOTAL], m2[TOTAL], m3[TOTAL], got[TOTAL], zero[TOTAL];
    zs_ckpt_opts o = {.tag = "two"};
    zs_step_stats stats;
    double lr4, lr3;
    zs_ctx *ctx = NULL;
    zs_status st = open_ctx(&ctx, &s, MPI_COMM_WORLD, world, sched);

    if (!st)
        st = one_step(ctx, NULL);
    if (!st)
        st = one_step(ctx, NULL);
    if (!st)
        st = zs_checkpoint_save_opts(ctx, dir, &o);
    if (!st)
        st = read_all(ctx, ZS_STATE_PARAM, p2);
    if (!st)
        st = read_all(ctx, ZS_STATE_EXP_AVG, m2);
    if (!st)
        st = one_step(ctx, NULL);
    zs_stats(ctx, &stats);
    lr3 = stats.lr;
    if (!st)
        st = read_all(ctx, ZS_STATE_EXP_AVG, m3);
    CHECK(!st, "flags: set-up and three steps: %s", zs_last_error());
    if (st) {
        zs_finalize(ctx);
        return;
    }
    o.module_only = 1;
    st = zs_checkpoint_load_opts(ctx, dir, &o, NULL);
    zs_stats(ctx, &stats);
    CHECK(!st && stats.global_step == 3, "module_only keeps the step count: %s %lld", zs_last_error(),
          (long long)stats.global_step);
    CHECK(!read_all(ctx, ZS_STATE_PARAM, got) && same(got, p2, TOTAL), "module_only: the parameters of step 2");
    CHECK(!read_all(ctx, ZS_STATE_EXP_AVG, got) && same(got, m3, TOTAL), "module_only: the running moments");

    o = (zs_ckpt_opts){.tag = "two", .no_optimizer = 1};
    st = zs_checkpoint_load_opts(ctx, dir, &o, NULL);
    zs_stats(ctx, &stats);
    CHECK(!st && stats.global_step == 2, "no_optimizer: step count of the checkpoint: %lld",
          (long long)stats.global_step);
    CHECK(!read_all(ctx, ZS_STATE_EXP_AVG, got) && same(got, zero, TOTAL) &&
          !read_all(ctx, ZS_STATE_EXP_AVG_SQ, got) && same(got, zero, TOTAL), "no_optimizer: moments not zero");
    CHECK(!read_all(ctx, ZS_STATE_PARAM, got) && same(got, p2, TOTAL), "no_optimizer: the parameters of step 2");
    /* fresh moments restart Adam's count: the first update is lr * g / |g| (bias-corrected), not ~3 lr */
    double most = 0.0;
    st = one_step(ctx, NULL);
    zs_stats(ctx, &stats);
    if (!st)
        st = read_all(ctx, ZS_STATE_PARAM, got);
    for (int i = 0; !st && i < TOTAL; i++)
        most = fmax(most, fabs((double)got[i] - (double)p2[i]));
    CHECK(!st && most > 0.9 * stats.lr && most < 1.1 * stats.lr, "no_optimizer: the step after it moved a parameter "
          "by %g at lr %g (%s)", most, stats.lr, zs_last_error());

    o = (zs_ckpt_opts){.tag = "two"};
    st = zs_checkpoint_load_opts(ctx, dir, &o, NULL); /* the full state of step 2, schedule at 2 */
    CHECK(!st && !read_all(ctx, ZS_STATE_EXP_AVG, got) && same(got, m2, TOTAL), "a full load: the moments");
    if (!st)
        st = one_step(ctx, NULL);
    zs_stats(ctx, &stats);
    CHECK(!st && stats.lr == lr3, "a full load: step 3's lr %g, the first run's %g", stats.lr, lr3);
    lr4 = 0;
    /* no_scheduler at step 3: the schedule stays at 3, so the next step uses step 4's lr */
    o.no_scheduler = 1;
    if (!st)
        st = zs_checkpoint_load_opts(ctx, dir, &o, NULL);
    if (!st)
        st = one_step(ctx, NULL);
    zs_stats(ctx, &stats);
    lr4 = stats.lr;
    CHECK(!st && stats.global_step == 3 && lr4 > lr3, "no_scheduler: step %lld lr %g after lr %g (%s)",
          (long long)stats.global_step, lr4, lr3, zs_last_error());

    /* a load in the middle of an accumulation window names the micro-step */
    st = grads_in(ctx, 0);
    if (!st)
        st = zs_step(ctx);
    if (!st)
        st = zs_checkpoint_load_opts(ctx, dir, &o, NULL);
    CHECK(st == ZS_ERR_INVALID && strstr(zs_last_error(), "micro-step 7"), "load mid-window: %s", zs_last_error());
    zs_finalize(ctx);
}

/* Removes the scratch directory; the verdict is any rank's failure. */
static int finish(void)
{
    int failed = zs_test_fail, any = 0;
    char cmd[600];

    MPI_Barrier(MPI_COMM_WORLD);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", base);
    if (rank == 0 && base[0] && system(cmd))
        fprintf(stderr, "could not remove %s\n", base);
    MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0)
        zs_test_summary("test_ckpt_opts");
    MPI_Finalize();
    return any ? 1 : 0;
}

int main(int argc, char **argv)
{
    static const struct setup setups[] = {
        {"s0", 0, "none", "fp32", 2},      {"s1", 1, "none", "fp32", 2},     {"s2", 2, "none", "fp32", 2},
        {"s3", 3, "none", "fp32", 2},      {"s2cpu", 2, "cpu", "fp32", 2},   {"s3cpu", 3, "cpu", "fp32", 2},
        {"s3nvme", 3, "nvme", "fp32", 2},  {"s1bf16", 1, "none", "bf16", 2}, {"s3bf16", 3, "cpu", "bf16", 2},
        {"s0acc1", 0, "none", "fp32", 1},  {"s3acc1", 3, "none", "fp32", 1}, {"s2nvme1", 2, "nvme", "fp32", 1},
    };
    static struct record recs[sizeof(setups) / sizeof(setups[0])];
    const char *only = argc > 1 ? argv[1] : NULL;
    char dir[400];
    zs_ctx *ctx = NULL;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (rank == 0) {
        snprintf(base, sizeof(base), "/tmp/zs-ckpt-opts-XXXXXX");
        if (!mkdtemp(base))
            base[0] = '\0';
    }
    MPI_Bcast(base, sizeof(base), MPI_CHAR, 0, MPI_COMM_WORLD);
    snprintf(dir, sizeof(dir), "%s/nvme", base);
    if (rank == 0)
        mkdir(dir, 0700);
    MPI_Barrier(MPI_COMM_WORLD);
    for (size_t i = 0; i < sizeof(setups) / sizeof(setups[0]); i++) {
        const struct record *ref = NULL;
        if (only && strcmp(only, setups[i].name))
            continue;
        for (size_t j = 0; j < i && !only; j++) /* the first set-up of the same dtype and accumulation */
            if (!strcmp(setups[j].dtype, setups[i].dtype) && setups[j].accum == setups[i].accum) {
                ref = &recs[j];
                break;
            }
        run_setup(&setups[i], &recs[i], ref);
    }
    if (!only) { /* the world queries, without a context */
        int32_t r = -1, n = -1, lr = -1, ln = -1;
        char word[16] = "";
        CHECK(zs_mpi_comm_bytes() == (int32_t)sizeof(MPI_Comm), "zs_mpi_comm_bytes %d", zs_mpi_comm_bytes());
        CHECK(zs_world_info(&r, &n, &lr, &ln) == ZS_OK && r == rank && n == world && ln >= 1 && lr >= 0 && lr < ln,
              "zs_world_info: %d of %d, %d of %d on the node", r, n, lr, ln);
        if (rank == world - 1)
            snprintf(word, sizeof(word), "rendezvous");
        CHECK(zs_world_bcast(word, sizeof(word), world - 1) == ZS_OK && !strcmp(word, "rendezvous"),
              "zs_world_bcast: '%s'", word);
        CHECK(zs_world_bcast(word, 4, world) == ZS_ERR_INVALID, "zs_world_bcast from a rank that is not");
    }
    if (!only) {
        static const struct setup s = {"tags", 1, "none", "fp32", 2};
        accum = 2;
        snprintf(dir, sizeof(dir), "%s/tags", base);
        if (open_ctx(&ctx, &s, MPI_COMM_WORLD, world, NULL) == ZS_OK) {
            test_tags(ctx, dir);
            test_extra(ctx, dir);
        }
        zs_finalize(ctx);
        snprintf(dir, sizeof(dir), "%s/flags", base);
        test_flags(dir);
    }
    return finish();
}
