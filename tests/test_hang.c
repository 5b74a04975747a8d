/* test_hang.c - ranks that drift apart through the public API: one rank fetching unit 0 while
 * another fetches unit 1, and one rank skipping a step. Each must end in ZS_ERR_COMM on every rank
 * with one message naming both operations and both ranks, never mixed data or a hang; and a rank that
 * stops issuing collectives must be named by the others within ZS_TIMEOUT. Run at 2 ranks:
 * test_hang order|skip|behind. A SIGALRM backstop turns a hang into a failure with a message. */
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <mpi.h>

#include "check.h"
#include "zeroshard.h"

#define UNITS 2
#define NUMEL 1000 /* equal units: only the label tells their gathers apart */

static int rank, world;

static void on_alarm(int sig)
{
    static const char msg[] = "FAIL: backstop: no verdict in 60 s (a hang)\n";

    (void)sig;
    if (write(2, msg, sizeof(msg) - 1) < 0)
        _exit(2);
    _exit(1);
}

static zs_ctx *model(int stage, int32_t *units)
{
    char json[320];
    zs_init_opts o = {.config_json = json, .quiet = 1};
    zs_ctx *ctx = NULL;
    int32_t p;

    snprintf(json, sizeof(json), "{\"train_micro_batch_size_per_gpu\": 1, \"zero_optimization\": {\"stage\": %d, "
             "\"stage3_param_persistence_threshold\": 0}, \"gradient_accumulation_steps\": %d, \"optimizer\": {\"type\": \"SGD\", \"params\": {\"lr\": 0.1}}}",
             stage, stage == 3 ? 2 : 1);
    CHECK(zs_init(&ctx, &o) == ZS_OK, "%s", zs_last_error());
    for (int u = 0; ctx && u < UNITS; u++) {
        char name[16];
        snprintf(name, sizeof(name), "u%d", u);
        CHECK(zs_unit_add(ctx, name, &units[u]) == ZS_OK && zs_param_add(ctx, units[u], "w", NUMEL, NULL, &p) == ZS_OK,
              "%s", zs_last_error());
    }
    CHECK(ctx && zs_setup(ctx) == ZS_OK, "%s", zs_last_error());
    return ctx;
}

/* One micro-batch touching the units in `order`; the first failing call's status. */
static zs_status micro_batch(zs_ctx *ctx, const int32_t *units, const int *order)
{
    for (int i = 0; i < UNITS; i++) {
        int32_t u = units[order[i]];
        float *g;
        zs_status st = zs_unit_fetch(ctx, u, NULL);
        if (!st)
            st = zs_grad_get(ctx, u, &g);
        if (!st) {
            for (int k = 0; k < NUMEL; k++)
                g[k] += 0.001f * (float)(rank + 1);
            st = zs_grad_ready(ctx, u);
        }
        if (!st)
            st = zs_unit_release(ctx, u);
        if (st)
            return st;
    }
    return ZS_OK;
}

/* Both ranks' messages must name both operations' distinguishing parts and both ranks. */
static void expect_named(const char *what, zs_status st, const char *a, const char *b)
{
    const char *m = zs_last_error();

    CHECK(st == ZS_ERR_COMM, "%s: rank %d got status %d: %s", what, rank, st, m);
    CHECK(strstr(m, "differs between ranks") && strstr(m, "rank 0") && strstr(m, "rank 1") && strstr(m, a) &&
          strstr(m, b), "%s: rank %d: the message does not name both sides (%s / %s): %s", what, rank, a, b, m);
    if (st == ZS_ERR_COMM)
        printf("rank %d: %s: %s\n", rank, what, m);
}

/* Stage 3: rank 1 fetches its units in the other order. Same sizes, same kind: before labels, the two
 * gathers would have exchanged each other's data. */
static void case_order(void)
{
    int32_t units[UNITS];
    static const int fwd[UNITS] = {0, 1}, rev[UNITS] = {1, 0};
    zs_ctx *ctx = model(3, units);
    zs_status st;

    if (!ctx)
        return;
    st = micro_batch(ctx, units, rank == 1 ? rev : fwd);
    expect_named("order", st, "fetch of unit 0", "fetch of unit 1");
    zs_finalize(ctx);
}

/* Stage 3, two micro-batches a step: rank 1 leaves out the zs_step after its first micro-batch. Its next
 * gather carries micro-step 0 where rank 0's carries 1. */
static void case_skip(void)
{
    int32_t units[UNITS];
    static const int fwd[UNITS] = {0, 1};
    zs_ctx *ctx = model(3, units);
    zs_status st = ZS_OK;

    for (int mb = 0; ctx && mb < 6 && !st; mb++) {
        st = micro_batch(ctx, units, fwd);
        if (!st && !(rank == 1 && mb == 0))
            st = zs_step(ctx);
    }
    if (ctx)
        expect_named("skip", st, "micro-step 1", "micro-step 0");
    zs_finalize(ctx);
}

/* Stage 2: rank 1 stops issuing collectives after one step (it records its flight and sleeps past the
 * timeout) while rank 0 goes on: rank 0 must fail within ZS_TIMEOUT naming rank 1 as not arrived, and
 * zs-flight must name rank 1 as behind (tests/hang.sh runs it on the dumps). */
static void case_behind(void)
{
    int32_t units[UNITS];
    static const int fwd[UNITS] = {0, 1};
    zs_ctx *ctx = model(2, units);
    const char *tmo = getenv("ZS_TIMEOUT");
    zs_status st = ZS_OK;

    CHECK(tmo && atoi(tmo) > 0 && atoi(tmo) < 20, "run with a small ZS_TIMEOUT (seconds)");
    for (int step = 0; ctx && step < (rank == 1 ? 1 : 3) && !st; step++) {
        st = micro_batch(ctx, units, fwd);
        if (!st)
            st = zs_step(ctx);
    }
    if (ctx && rank == 1) {
        CHECK(st == ZS_OK, "rank 1: %s", zs_last_error());
        zs_flight_dump(ctx, "rank 1 left its loop early");
        sleep((unsigned)(tmo ? atoi(tmo) : 1) + 2);
    } else if (ctx) {
        const char *m = zs_last_error();
        CHECK(st == ZS_ERR_COMM && strstr(m, "timeout") && strstr(m, "ranks not arrived: 1"),
              "rank 0 got %d: %s", st, m);
        printf("rank %d: behind: %s\n", rank, m);
    }
    zs_finalize(ctx);
}

int main(int argc, char **argv)
{
    const char *c = argc > 1 ? argv[1] : "";

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    signal(SIGALRM, on_alarm);
    alarm(60);
    if (world != 2) {
        fprintf(stderr, "test_hang: run at 2 ranks\n");
        MPI_Finalize();
        return 2;
    }
    if (!strcmp(c, "order"))
        case_order();
    else if (!strcmp(c, "skip"))
        case_skip();
    else if (!strcmp(c, "behind"))
        case_behind();
    else
        CHECK(false, "unknown case '%s' (order, skip, behind)", c);
    printf("rank %d: %d passed, %d failed\n", rank, zs_test_pass, zs_test_fail);
    MPI_Finalize();
    return zs_test_fail ? 1 : 0;
}
