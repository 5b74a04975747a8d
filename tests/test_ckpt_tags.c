/* test_ckpt_tags.c - checkpoint tags, no_latest, the extra file, the load flags and the world queries; run under
 * mpirun -np 2 (the model: ckpt_model.h). Unsafe tags are refused naming them; no_latest leaves `latest`
 * (also when the tag is replaced by hard links); a missing tag is an error naming it and a directory without
 * `latest` loads nothing; the extra file round-trips, its checksum is verified by a load, and a failing write
 * of it (a full disk, injected) fails the save on every rank and leaves `latest` and the directory as they
 * were. module_only, no_optimizer and no_scheduler against the running engine and the checkpoint; a load
 * after a micro-batch began, or inside an accumulation window, is refused naming the micro-step.
 * zs_step_counts_set: the counters a resumed foreign checkpoint carries on from. */
#include "ckpt_model.h"

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
    /* replacing a tag by hard links (where rename cannot exchange) with no_latest: `latest` comes back */
    setenv("ZS_TEST_CKPT_NO_EXCHANGE", "1", 1);
    o = (zs_ckpt_opts){.tag = "first", .no_latest = 1};
    CHECK(zs_checkpoint_save_opts(ctx, dir, &o) == ZS_OK && latest_is(dir, "second"),
          "no_latest replacing by links moved latest: %s", zs_last_error());
    unsetenv("ZS_TEST_CKPT_NO_EXCHANGE");

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
    /* the manifest's checksum covers it: a changed byte fails the load, naming the file */
    char path[512];
    FILE *c;
    snprintf(path, sizeof(path), "%s/with_extra/client_state.json", dir);
    MPI_Barrier(MPI_COMM_WORLD); /* every rank has read it */
    if (rank == 0 && (c = fopen(path, "r+"))) {
        fputc('[', c);
        fclose(c);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    zs_ckpt_opts lo = {.tag = "with_extra"};
    st = zs_checkpoint_load_opts(ctx, dir, &lo, NULL);
    CHECK(st == ZS_ERR_IO && strstr(zs_last_error(), "client_state.json"), "a corrupt extra file: %d %s", st,
          zs_last_error());
    if (rank == 0 && (c = fopen(path, "r+"))) {
        fputc('{', c);
        fclose(c);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    CHECK(zs_checkpoint_load_opts(ctx, dir, &lo, NULL) == ZS_OK, "the extra file restored: %s", zs_last_error());
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
    static const struct setup s = {"flags", 2, "none", "fp32", 2, 0};
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
    /* saved now, the optimizer's own count (1) differs from the step count (3): a load must restore it */
    static float next[TOTAL];
    zs_ckpt_opts fresh = {.tag = "fresh"};
    if (!st)
        st = zs_checkpoint_save_opts(ctx, dir, &fresh);
    if (!st)
        st = one_step(ctx, NULL);
    if (!st)
        st = read_all(ctx, ZS_STATE_PARAM, next);
    if (!st)
        st = zs_checkpoint_load_opts(ctx, dir, &fresh, NULL);
    if (!st)
        st = one_step(ctx, NULL);
    if (!st)
        st = read_all(ctx, ZS_STATE_PARAM, got);
    CHECK(!st && same(got, next, TOTAL), "the step after loading a checkpoint saved after no_optimizer (%s)",
          st ? zs_last_error() : "values differ");

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

    /* a load once a micro-batch has begun, and in the middle of an accumulation window, names the micro-step */
    void *g;
    st = zs_unit_fetch(ctx, 0, NULL);
    if (!st)
        st = zs_grad_buffer(ctx, 0, &g);
    CHECK(!st && zs_checkpoint_load_opts(ctx, dir, &o, NULL) == ZS_ERR_INVALID &&
          strstr(zs_last_error(), "micro-step 6 has begun"), "load after a zs_grad_buffer: %s", zs_last_error());
    for (int32_t u = 0; !st && u < NUNITS; u++) {
        if (u && !(st = zs_unit_fetch(ctx, u, NULL)))
            st = zs_grad_buffer(ctx, u, &g);
        if (!st && !(st = zs_grad_ready(ctx, u)))
            st = zs_unit_release(ctx, u);
    }
    if (!st)
        st = zs_step(ctx);
    if (!st)
        st = zs_checkpoint_load_opts(ctx, dir, &o, NULL);
    CHECK(st == ZS_ERR_INVALID && strstr(zs_last_error(), "micro-step 7"), "load mid-window: %s", zs_last_error());
    zs_finalize(ctx);
}

/* zs_mpi_comm_bytes, zs_world_info and zs_world_bcast, without a context. */
static zs_status write_all(zs_ctx *ctx, enum zs_state which, const float *in)
{
    zs_status st = ZS_OK;

    for (int32_t p = 0, at = 0; !st && p < NPARAMS; at += (int32_t)numel[p++])
        st = zs_param_write(ctx, p, which, in + at, 0);
    return st;
}

/* zs_step_counts_set: a run's whole state written back with zs_param_write and its counters set (what resuming
 * another format's checkpoint does) repeats the next step bit for bit, lr included; counters left at zero give
 * another step (Adam's bias correction, the warm-up). Misuse is refused naming the values. */
/* Step 2's state (parameters and moments) written back, the counts set to global step 2 with `steps` optimizer
 * and schedule steps, then one step; its stats in *stats. */
static zs_status step_from(zs_ctx *ctx, const float *p, const float *m, const float *v, int64_t steps,
                           zs_step_stats *stats)
{
    zs_status st = write_all(ctx, ZS_STATE_PARAM, p);

    if (!st)
        st = write_all(ctx, ZS_STATE_EXP_AVG, m);
    if (!st)
        st = write_all(ctx, ZS_STATE_EXP_AVG_SQ, v);
    if (!st)
        st = zs_step_counts_set(ctx, 2, steps, steps);
    if (!st)
        st = one_step(ctx, NULL);
    zs_stats(ctx, stats);
    return st;
}

static void test_counts(void)
{
    static const struct setup s = {"counts", 3, "none", "fp32", 2, 0};
    static const char sched[] = "\"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_min_lr\": 0, "
                                "\"warmup_max_lr\": 0.01, \"warmup_num_steps\": 10}}, ";
    static float p2[TOTAL], m2[TOTAL], v2[TOTAL], p3[TOTAL], got[TOTAL];
    zs_step_stats stats;
    double lr3;
    zs_ctx *ctx = NULL;
    zs_status st = open_ctx(&ctx, &s, MPI_COMM_WORLD, world, sched);

    for (int i = 0; !st && i < 2; i++)
        st = one_step(ctx, NULL);
    if (!st)
        st = read_all(ctx, ZS_STATE_PARAM, p2);
    if (!st)
        st = read_all(ctx, ZS_STATE_EXP_AVG, m2);
    if (!st)
        st = read_all(ctx, ZS_STATE_EXP_AVG_SQ, v2);
    if (!st)
        st = one_step(ctx, NULL);
    if (!st)
        st = read_all(ctx, ZS_STATE_PARAM, p3);
    zs_stats(ctx, &stats);
    lr3 = stats.lr;
    CHECK(!st, "counts: set-up and three steps: %s", zs_last_error());
    if (st) {
        zs_finalize(ctx);
        return;
    }
    /* step 3 again from step 2's state: first with the counters at zero (another step), then set */
    st = step_from(ctx, p2, m2, v2, 0, &stats);
    CHECK(!st && !read_all(ctx, ZS_STATE_PARAM, got) && !same(got, p3, TOTAL) && stats.lr != lr3,
          "counts (2, 0, 0): a step unlike step 3 (lr %g, step 3's %g): %s", stats.lr, lr3, zs_last_error());
    st = step_from(ctx, p2, m2, v2, 2, &stats);
    CHECK(!st && !read_all(ctx, ZS_STATE_PARAM, got) && same(got, p3, TOTAL) && stats.lr == lr3 &&
          stats.global_step == 3 && stats.micro_step == 3 * accum,
          "counts (2, 2, 2): step 3 again (lr %g, step 3's %g; step %lld, micro %lld): %s", stats.lr, lr3,
          (long long)stats.global_step, (long long)stats.micro_step, zs_last_error());
    /* -1 keeps a count */
    st = zs_step_counts_set(ctx, -1, -1, 7);
    zs_stats(ctx, &stats);
    CHECK(!st && stats.global_step == 3, "counts (-1, -1, 7): %s step %lld", zs_last_error(),
          (long long)stats.global_step);

    /* misuse */
    st = zs_step_counts_set(ctx, -2, 0, 0);
    CHECK(st == ZS_ERR_INVALID && strstr(zs_last_error(), "global_step -2"), "a negative step: %s", zs_last_error());
    st = zs_step_counts_set(ctx, 4, 5, 0);
    CHECK(st == ZS_ERR_INVALID && strstr(zs_last_error(), "optimizer_steps 5 is more than global_step 4"),
          "optimizer_steps above global_step: %s", zs_last_error());
    st = zs_step_counts_set(ctx, 4 + rank, 4, 4);
    CHECK(st == ZS_ERR_INVALID && strstr(zs_last_error(), "every rank passes the same counts"),
          "differing ranks: %s", zs_last_error());
    st = grads_in(ctx, 3 * accum);
    if (!st)
        st = zs_step(ctx);
    CHECK(!st, "a micro-batch: %s", zs_last_error());
    st = zs_step_counts_set(ctx, 4, 4, 4);
    CHECK(st == ZS_ERR_INVALID && strstr(zs_last_error(), "accumulation window (micro-batch 2 of 2"),
          "inside an accumulation window: %s", zs_last_error());
    CHECK(zs_step_counts_set(NULL, 1, 1, 1) == ZS_ERR_INVALID, "a NULL context");
    zs_finalize(ctx);
}

static void test_world(void)
{
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

int main(int argc, char **argv)
{
    static const struct setup s = {"tags", 1, "none", "fp32", 2, 0};
    char dir[400];
    zs_ctx *ctx = NULL;

    model_begin(&argc, &argv, "ckpt-tags");
    accum = 2;
    test_world();
    snprintf(dir, sizeof(dir), "%s/tags", base);
    if (open_ctx(&ctx, &s, MPI_COMM_WORLD, world, NULL) == ZS_OK) {
        test_tags(ctx, dir);
        test_extra(ctx, dir);
    }
    zs_finalize(ctx);
    snprintf(dir, sizeof(dir), "%s/flags", base);
    test_flags(dir);
    test_counts();
    return model_end("test_ckpt_tags");
}
