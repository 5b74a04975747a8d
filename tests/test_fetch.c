/* test_fetch.c - how stage 3 gathers parameters (sharding/fetch.c), seen through the live-parameter
 * bytes: prefetch of the next units along the previous iteration's order (stage3_prefetch_bucket_size),
 * the cap on gathered elements alive at once (stage3_max_live_parameters), and units kept gathered when
 * they come back soon (stage3_max_reuse_distance). Every fetch also checks the unit's values. Run under
 * mpirun at 1 and 2 ranks. */
#include <stdbool.h>
#include <stdlib.h>
#include <mpi.h>

#include "check.h"
#include "zeroshard.h"

/* Four units of W elements (16-element shards at 1-4 ranks, so no padding): unit i holds i + 1. The
 * walk is the engine's: forward 0-3, backward 3-0, so the order learned is 0 1 2 3 3 2 1 0. */
enum { UNITS = 4, W = 4800 };
#define UNIT_BYTES ((uint64_t)W * sizeof(float))

static int rank;

struct walk {
    zs_ctx *ctx;
    int32_t unit[UNITS];
};

static zs_status walk_open(struct walk *w, long long prefetch, long long max_live, long long reuse)
{
    char json[512];
    zs_init_opts o = { .config_json = json, .use_comm = 1, .comm = MPI_COMM_WORLD, .quiet = 1 };
    float *init = malloc(UNITS * W * sizeof(float)); /* read by zs_setup */
    int32_t p;
    zs_status st;

    if (!init)
        return ZS_ERR_NOMEM;
    snprintf(json, sizeof(json), "{\"train_micro_batch_size_per_gpu\": 1, \"optimizer\": {\"type\": \"SGD\", "
             "\"params\": {\"lr\": 1.0}}, \"zero_optimization\": {\"stage\": 3, "
             "\"stage3_param_persistence_threshold\": 0, \"stage3_prefetch_bucket_size\": %lld, "
             "\"stage3_max_live_parameters\": %lld, \"stage3_max_reuse_distance\": %lld}}", prefetch, max_live, reuse);
    st = zs_init(&w->ctx, &o);
    for (int i = 0; i < UNITS && !st; i++) {
        char name[8];
        snprintf(name, sizeof(name), "u%d", i);
        for (int k = 0; k < W; k++)
            init[i * W + k] = (float)(i + 1);
        st = zs_unit_add(w->ctx, name, &w->unit[i]);
        if (!st)
            st = zs_param_add(w->ctx, w->unit[i], "w", W, init + i * W, &p);
    }
    if (!st)
        st = zs_setup(w->ctx);
    free(init);
    return st;
}

/* Gathered parameter bytes alive now, in units. */
static double live_units(const struct walk *w)
{
    zs_memory_report m;

    if (zs_memory(w->ctx, &m) != ZS_OK)
        return -1;
    return (double)m.live_params / (double)UNIT_BYTES;
}

static double peak_units(const struct walk *w)
{
    zs_memory_report m;

    if (zs_memory(w->ctx, &m) != ZS_OK)
        return -1;
    return (double)m.peak_live_params / (double)UNIT_BYTES;
}

/* zs_unit_fetch, and the unit's values: a prefetched or kept copy must be the unit, whole. */
static zs_status fetch(struct walk *w, int i)
{
    float *data = NULL;
    zs_status st = zs_unit_fetch(w->ctx, w->unit[i], (void **)&data);

    for (int k = 0; !st && k < W; k++)
        if (data[k] != (float)(i + 1)) {
            CHECK(0, "unit %d element %d is %g after its fetch, expected %d", i, k, data[k], i + 1);
            break;
        }
    return st;
}

static zs_status release(struct walk *w, int i) { return zs_unit_release(w->ctx, w->unit[i]); }

/* The forward pass from unit `from` on, each unit fetched and released. */
static zs_status forward_from(struct walk *w, int from)
{
    zs_status st = ZS_OK;

    for (int i = from; i < UNITS && !st; i++) {
        st = fetch(w, i);
        if (!st)
            st = release(w, i);
    }
    return st;
}

/* The backward pass and the step: zero gradients (zs_grad_get zeroes them), so the values stay i + 1. */
static zs_status backward_and_step(struct walk *w)
{
    zs_status st = ZS_OK;
    float *g;

    for (int i = UNITS - 1; i >= 0 && !st; i--) {
        st = fetch(w, i);
        if (!st)
            st = zs_grad_get(w->ctx, w->unit[i], &g);
        if (!st)
            st = zs_grad_ready(w->ctx, w->unit[i]);
        if (!st)
            st = release(w, i);
    }
    return st ? st : zs_step(w->ctx);
}

/* One iteration with no order known yet: afterwards the engine has the order to prefetch along. */
static zs_status learn_order(struct walk *w)
{
    zs_status st = forward_from(w, 0);

    return st ? st : backward_and_step(w);
}

/* With the order known, fetching unit 0 starts gathering the next units that fit the prefetch budget
 * (two units here), so three are alive; with no budget, only the one fetched. */
static void prefetch_case(long long budget, double want, const char *what)
{
    struct walk w;

    CHECK(walk_open(&w, budget, 1000000000, 0) == ZS_OK && learn_order(&w) == ZS_OK, "%s: %s", what, zs_last_error());
    CHECK(fetch(&w, 0) == ZS_OK, "%s: %s", what, zs_last_error());
    CHECK(live_units(&w) == want, "%s: %g units gathered after fetching unit 0, expected %g", what, live_units(&w),
          want);
    CHECK(release(&w, 0) == ZS_OK && forward_from(&w, 1) == ZS_OK && backward_and_step(&w) == ZS_OK, "%s: %s", what,
          zs_last_error());
    zs_finalize(w.ctx);
}

static void test_prefetch_gathers_next_units(void) { prefetch_case(2 * W, 3, "prefetch of two units"); }

static void test_prefetch_off_gathers_one(void) { prefetch_case(0, 1, "no prefetch"); }

/* A program that leaves the learned order gets no prefetch until the new order is learned. */
static void test_prefetch_stops_when_order_changes(void)
{
    struct walk w;

    CHECK(walk_open(&w, 2 * W, 1000000000, 0) == ZS_OK && learn_order(&w) == ZS_OK, "%s", zs_last_error());
    CHECK(fetch(&w, 1) == ZS_OK, "%s", zs_last_error());
    CHECK(live_units(&w) == 1, "out of order: %g units gathered, expected 1 (no prefetch)", live_units(&w));
    CHECK(release(&w, 1) == ZS_OK && forward_from(&w, 0) == ZS_OK && backward_and_step(&w) == ZS_OK, "%s",
          zs_last_error());
    zs_finalize(w.ctx);
}

/* A prefetch budget of three units under a cap of two: prefetch stops at the cap, and nothing in the
 * iteration ever has more than two units gathered. */
static void test_live_cap_bounds_prefetch(void)
{
    struct walk w;

    CHECK(walk_open(&w, 3 * W, 2 * W, 0) == ZS_OK && learn_order(&w) == ZS_OK, "%s", zs_last_error());
    CHECK(fetch(&w, 0) == ZS_OK, "%s", zs_last_error());
    CHECK(live_units(&w) == 2, "cap of two units: %g gathered after fetching unit 0", live_units(&w));
    CHECK(release(&w, 0) == ZS_OK && forward_from(&w, 1) == ZS_OK && backward_and_step(&w) == ZS_OK, "%s",
          zs_last_error());
    CHECK(peak_units(&w) == 2, "cap of two units: peak %g units gathered", peak_units(&w));
    zs_finalize(w.ctx);
}

/* A cap below one unit never refuses the program: two units it holds are both gathered, and nothing is
 * prefetched beside them. */
static void test_live_cap_below_one_unit_still_fetches(void)
{
    struct walk w;

    CHECK(walk_open(&w, 3 * W, 1, 0) == ZS_OK && learn_order(&w) == ZS_OK, "%s", zs_last_error());
    CHECK(fetch(&w, 0) == ZS_OK && fetch(&w, 1) == ZS_OK, "%s", zs_last_error());
    CHECK(live_units(&w) == 2, "cap below a unit, two held: %g units gathered", live_units(&w));
    CHECK(release(&w, 0) == ZS_OK && release(&w, 1) == ZS_OK, "%s", zs_last_error());
    CHECK(live_units(&w) == 0, "cap below a unit, none held: %g units gathered", live_units(&w));
    CHECK(forward_from(&w, 2) == ZS_OK && backward_and_step(&w) == ZS_OK, "%s", zs_last_error());
    zs_finalize(w.ctx);
}

/* In the forward pass of the learned order, unit 1 comes back after 4W elements (units 2, 3, 3, 2), unit 2
 * after 2W (units 3, 3) and unit 3 after none: a released unit stays gathered when its distance is within
 * stage3_max_reuse_distance, and only then. */
static void reuse_case(long long reuse, double after2, double after3, const char *what)
{
    struct walk w;

    CHECK(walk_open(&w, 0, 1000000000, reuse) == ZS_OK && learn_order(&w) == ZS_OK, "%s: %s", what, zs_last_error());
    for (int i = 0; i < 3; i++)
        CHECK(fetch(&w, i) == ZS_OK && release(&w, i) == ZS_OK, "%s: %s", what, zs_last_error());
    CHECK(live_units(&w) == after2, "%s: %g units kept after releasing unit 2, expected %g", what, live_units(&w),
          after2);
    CHECK(fetch(&w, 3) == ZS_OK && release(&w, 3) == ZS_OK, "%s: %s", what, zs_last_error());
    CHECK(live_units(&w) == after3, "%s: %g units kept after releasing unit 3, expected %g", what, live_units(&w),
          after3);
    CHECK(backward_and_step(&w) == ZS_OK, "%s: %s", what, zs_last_error());
    zs_finalize(w.ctx);
}

static void test_reuse_keeps_units_within_distance(void) { reuse_case(2 * W, 1, 2, "reuse distance 2W"); }

static void test_reuse_drops_units_beyond_distance(void) { reuse_case(2 * W - 1, 0, 1, "reuse distance 2W - 1"); }

/* Every released unit would be kept (a reuse distance past the model), but the cap of two units frees a
 * kept one before a third is gathered. */
static void test_kept_units_freed_under_cap(void)
{
    struct walk w;

    CHECK(walk_open(&w, 0, 2 * W, 1000000000) == ZS_OK && learn_order(&w) == ZS_OK, "%s", zs_last_error());
    CHECK(fetch(&w, 0) == ZS_OK && release(&w, 0) == ZS_OK && fetch(&w, 1) == ZS_OK && release(&w, 1) == ZS_OK,
          "%s", zs_last_error());
    CHECK(live_units(&w) == 2, "two released units kept: %g gathered", live_units(&w));
    CHECK(fetch(&w, 2) == ZS_OK, "%s", zs_last_error());
    CHECK(live_units(&w) == 2, "a third unit under a cap of two: %g gathered", live_units(&w));
    CHECK(release(&w, 2) == ZS_OK && forward_from(&w, 3) == ZS_OK && backward_and_step(&w) == ZS_OK, "%s",
          zs_last_error());
    CHECK(peak_units(&w) == 2, "kept units under a cap of two: peak %g units gathered", peak_units(&w));
    zs_finalize(w.ctx);
}

int main(int argc, char **argv)
{
    int fails, any = 0;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    test_prefetch_gathers_next_units();
    test_prefetch_off_gathers_one();
    test_prefetch_stops_when_order_changes();
    test_live_cap_bounds_prefetch();
    test_live_cap_below_one_unit_still_fetches();
    test_reuse_keeps_units_within_distance();
    test_reuse_drops_units_beyond_distance();
    test_kept_units_freed_under_cap();
    fails = zs_test_fail;
    MPI_Allreduce(&fails, &any, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Finalize();
    if (rank == 0)
        zs_test_summary("test_fetch");
    return any ? 1 : 0;
}
