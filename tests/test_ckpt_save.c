/* test_ckpt_save.c - a context whose state is inconsistent refuses to go on; run under mpirun -np 2.
 * A step that fails part-way (a swap read error injected into the pipelined NVMe step
 * through ZS_TEST_SWAP_FAULT: the first sub-group is stepped, the next is not) leaves the context broken:
 * zs_checkpoint_save refuses, naming the step and the error, and a good checkpoint of the same tag stays
 * byte for byte as it was.
 * A load that fails part-way (ZS_TEST_CKPT_FAULT fails the second unit's read) leaves the
 * context unusable, not half loaded: zs_step and zs_checkpoint_save refuse, naming the load, until a load
 * succeeds; a global_step whose micro-step count (x gradient_accumulation_steps) overflows is refused
 * before anything changes. */
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

#define NUNITS 3
#define NUMEL 300

static int rank;
static char base[256], ck[300], ck2[300], ck3[300], nvme[300];

static void init_values(void *arg, int32_t param, int64_t first, int64_t count, float *dst)
{
    for (int64_t i = 0; i < count; i++)
        dst[i] = (float)((param * 131 + first + i) % 97) / 97.0f - 0.5f;
}

/* Three units of NUMEL elements; with sub_group_size 100 each is a sub-group of the NVMe step. */
static zs_status open_ctx(zs_ctx **ctx, bool on_nvme, int accumulation)
{
    char json[1024];
    zs_init_opts o = {.config_json = json, .use_comm = 1, .comm = MPI_COMM_WORLD, .quiet = 1};
    zs_status st;

    snprintf(json, sizeof(json), "{\"train_batch_size\": %d, \"train_micro_batch_size_per_gpu\": 1, "
             "\"steps_per_print\": 0, \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01}}, "
             "\"zero_optimization\": {\"stage\": 2, \"sub_group_size\": 100%s%s%s}}", 2 * accumulation,
             on_nvme ? ", \"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"" : "", on_nvme ? nvme : "",
             on_nvme ? "\"}" : "");
    st = zs_init(ctx, &o);
    for (int32_t u = 0; !st && u < NUNITS; u++) {
        char name[16];
        int32_t unit, p;

        snprintf(name, sizeof(name), "u%d", u);
        st = zs_unit_add(*ctx, name, &unit);
        snprintf(name, sizeof(name), "u%d.w", u);
        if (!st)
            st = zs_param_add_init(*ctx, unit, name, NUMEL, init_values, NULL, &p);
    }
    return st ? st : zs_setup(*ctx);
}

/* One micro-batch of made-up gradients, then zs_step. */
static zs_status micro_step(zs_ctx *ctx)
{
    zs_status st = ZS_OK;

    for (int32_t u = 0; !st && u < NUNITS; u++) {
        float *g;

        st = zs_unit_fetch(ctx, u, NULL);
        if (!st)
            st = zs_grad_get(ctx, u, &g);
        for (int i = 0; !st && i < NUMEL; i++)
            g[i] += 0.01f * (float)((i % 7) - 3);
        if (!st)
            st = zs_grad_ready(ctx, u);
        if (!st)
            st = zs_unit_release(ctx, u);
    }
    return st ? st : zs_step(ctx);
}

/* The bytes of a tag directory's files (rank 0), to tell whether anything touched them. */
static char *snapshot(const char *tagdir, size_t *len)
{
    static const char *const names[] = {"manifest.json", "rank00000.bin", "rank00001.bin", NULL};
    char path[512], *all = NULL;

    *len = 0;
    for (int i = 0; names[i]; i++) {
        FILE *f;
        long n;

        snprintf(path, sizeof(path), "%s/%s", tagdir, names[i]);
        f = fopen(path, "rb");
        if (!f || fseek(f, 0, SEEK_END) || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET)) {
            if (f)
                fclose(f);
            continue;
        }
        all = realloc(all, *len + (size_t)n);
        if (all && fread(all + *len, 1, (size_t)n, f) == (size_t)n)
            *len += (size_t)n;
        fclose(f);
    }
    return all;
}

static bool exists(const char *path)
{
    struct stat sb;

    return lstat(path, &sb) == 0;
}

/* Item 11: a good global_step0, then a run whose first step fails part-way tries to save over it. */
static void test_save_after_failed_step(void)
{
    zs_ctx *ctx = NULL;
    char tag[512], tmp[512], *before = NULL, *after = NULL;
    size_t nb = 0, na = 0;
    zs_status st;

    snprintf(tag, sizeof(tag), "%s/global_step0", ck);
    snprintf(tmp, sizeof(tmp), "%s/global_step0.tmp", ck);
    st = open_ctx(&ctx, true, 1);
    CHECK(!st, "set-up: %s", zs_last_error());
    if (!st)
        CHECK(zs_checkpoint_save(ctx, ck) == ZS_OK, "the good save: %s", zs_last_error());
    zs_finalize(ctx);
    if (rank == 0)
        before = snapshot(tag, &nb);

    setenv("ZS_TEST_SWAP_FAULT", "read:EIO:1", 1); /* sub-group 0 (at offset 0) reads, sub-group 1 fails */
    st = open_ctx(&ctx, true, 1);
    unsetenv("ZS_TEST_SWAP_FAULT");
    CHECK(!st, "set-up with the fault: %s", zs_last_error());
    if (st)
        return;
    st = micro_step(ctx);
    CHECK(st != ZS_OK && strstr(zs_last_error(), "Input/output error"), "the step should fail: %d %s", st,
          zs_last_error());
    st = zs_checkpoint_save(ctx, ck);
    if (rank == 0)
        printf("save after the failed step: %s: %s\n", zs_status_str(st), st ? zs_last_error() : "saved");
    CHECK(st == ZS_ERR_INVALID && strstr(zs_last_error(), "checkpoint save refused: step 1 failed part-way (") &&
          strstr(zs_last_error(), "Input/output error") && strstr(zs_last_error(), "the state is inconsistent"),
          "save after a failed step: %d %s", st, zs_last_error());
    CHECK(zs_step(ctx) == ZS_ERR_INVALID && strstr(zs_last_error(), "step 1 failed part-way"), "step: %s",
          zs_last_error());
    zs_finalize(ctx);
    if (rank == 0) {
        after = snapshot(tag, &na);
        CHECK(nb > 0 && na == nb && !memcmp(before, after, nb) && !exists(tmp),
              "the good checkpoint %s changed (%zu -> %zu bytes) or %s is left", tag, nb, na, tmp);
    }
    free(before);
    free(after);
}

/* Item 14: a load failing at its second unit; then a load that works. */
static void test_failed_load(void)
{
    zs_ctx *ctx = NULL;
    char tag[512], *before = NULL, *after = NULL;
    size_t nb = 0, na = 0;
    zs_status st = open_ctx(&ctx, false, 1);

    CHECK(!st, "set-up: %s", zs_last_error());
    if (st)
        return;
    snprintf(tag, sizeof(tag), "%s/global_step0", ck);
    if (rank == 0)
        before = snapshot(tag, &nb);
    setenv("ZS_TEST_CKPT_FAULT", "0:fail:2", 1);
    st = zs_checkpoint_load(ctx, ck);
    unsetenv("ZS_TEST_CKPT_FAULT");
    CHECK(st != ZS_OK && strstr(zs_last_error(), "reading unit 'u1': Input/output error"), "load: %d %s", st,
          zs_last_error());
    st = zs_step(ctx);
    if (rank == 0)
        printf("step after the failed load: %s: %s\n", zs_status_str(st), st ? zs_last_error() : "stepped");
    CHECK(st == ZS_ERR_INVALID && strstr(zs_last_error(), "checkpoint load from ") &&
          strstr(zs_last_error(), "failed part-way"), "step after a failed load: %d %s", st, zs_last_error());
    st = zs_checkpoint_save(ctx, ck);
    CHECK(st == ZS_ERR_INVALID && strstr(zs_last_error(), "checkpoint save refused: checkpoint load from "),
          "save after a failed load: %d %s", st, zs_last_error());
    if (rank == 0) {
        after = snapshot(tag, &na);
        CHECK(nb > 0 && na == nb && !memcmp(before, after, nb), "the checkpoint changed");
    }
    st = zs_checkpoint_load(ctx, ck);
    CHECK(st == ZS_OK, "a load that works: %s", zs_last_error());
    CHECK(micro_step(ctx) == ZS_OK, "a step after it: %s", zs_last_error());
    zs_finalize(ctx);
    free(before);
    free(after);
}

/* global_step 2^62 in a copy of the checkpoint, micro_step 0: fewer micro-batches than steps, refused. */
static void test_step_overflow(void)
{
    zs_ctx *ctx = NULL;
    char cmd[1024], path[512];
    zs_status st;

    if (rank == 0) {
        snprintf(cmd, sizeof(cmd), "cp -r %s %s && sed -i 's/\"global_step\": 0,/\"global_step\": 4611686018427387904,/' "
                 "%s/global_step0/manifest.json", ck, ck2, ck2);
        CHECK(system(cmd) == 0, "%s", cmd);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    st = open_ctx(&ctx, false, 4);
    CHECK(!st, "set-up: %s", zs_last_error());
    if (st)
        return;
    st = zs_checkpoint_load(ctx, ck2);
    if (rank == 0)
        printf("load of global_step 2^62, micro_step 0: %s: %s\n", zs_status_str(st), st ? zs_last_error() : "loaded");
    CHECK(st != ZS_OK && strstr(zs_last_error(), "micro_step: 0 is less than global_step 4611686018427387904"),
          "load: %d %s", st, zs_last_error());
    st = zs_checkpoint_save(ctx, ck3); /* refused before anything changed: still usable */
    CHECK(st == ZS_OK, "save after the refused load: %s", zs_last_error());
    snprintf(path, sizeof(path), "%s/global_step0/manifest.json", ck3);
    if (rank == 0)
        CHECK(exists(path), "%s missing", path);
    zs_finalize(ctx);
}

int main(int argc, char **argv)
{
    char cmd[600];

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    snprintf(base, sizeof(base), "ckpt_save_XXXXXX");
    if (rank == 0 && !mkdtemp(base))
        base[0] = '\0';
    MPI_Bcast(base, sizeof(base), MPI_CHAR, 0, MPI_COMM_WORLD);
    if (!base[0]) {
        fprintf(stderr, "cannot create a scratch directory\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    snprintf(ck, sizeof(ck), "%s/ck", base);
    snprintf(ck2, sizeof(ck2), "%s/ck2", base);
    snprintf(ck3, sizeof(ck3), "%s/ck3", base);
    snprintf(nvme, sizeof(nvme), "%s/nvme", base);
    if (rank == 0)
        mkdir(nvme, 0755);
    MPI_Barrier(MPI_COMM_WORLD);
    test_save_after_failed_step();
    test_failed_load();
    test_step_overflow();
    MPI_Barrier(MPI_COMM_WORLD);
    int failed = zs_test_fail, any = 0;
    MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0) {
        snprintf(cmd, sizeof(cmd), "rm -rf %s", base);
        if (system(cmd))
            fprintf(stderr, "could not remove %s\n", base);
    }
    int rc = rank == 0 ? zs_test_summary("ckpt_save") : 0;
    MPI_Finalize();
    return rc || any ? 1 : 0;
}
