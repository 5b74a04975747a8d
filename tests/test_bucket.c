/* test_bucket.c - where the gradient bucket (stages 2-3, sharding/grads.c) places each unit's slot: a
 * unit between zs_grad_get and zs_grad_ready keeps its slot when the bucket restarts, however many such
 * units there are and in whatever order they were registered; with no room left the error names one.
 * Run under mpirun at 1 and 3 ranks. */
#include <stdbool.h>
#include <string.h>
#include <mpi.h>

#include "check.h"
#include "zeroshard.h"

/* One slot's elements: divides among 1-4 ranks into 16-element shards, 3072 bytes (a 64-byte multiple),
 * so a bucket of K slots holds exactly K one-slot units (its slack, 64 bytes a unit, is under a slot). */
enum { N = 768 };

static int rank;

struct bucket {
    zs_ctx *ctx;
    int n;
    int32_t unit[16], param[16];
    int64_t size[16];
    float *grad[16];
};

/* Stage 2, SGD lr 1 from zero parameters, a bucket of `slots` slots; units named and sized as given
 * (sizes in slots). Unit i's gradient is i + 1 everywhere, so its parameters end at -(i + 1) exactly. */
static zs_status bucket_open(struct bucket *b, int slots, const char *const *names, const int *sizes, int n)
{
    char json[320];
    zs_init_opts o = { .config_json = json, .use_comm = 1, .comm = MPI_COMM_WORLD, .quiet = 1 };
    zs_status st;

    memset(b, 0, sizeof(*b));
    snprintf(json, sizeof(json), "{\"train_micro_batch_size_per_gpu\": 1, \"optimizer\": {\"type\": \"SGD\", "
             "\"params\": {\"lr\": 1.0}}, \"zero_optimization\": {\"stage\": 2, \"reduce_bucket_size\": %d}}",
             slots * N);
    st = zs_init(&b->ctx, &o);
    if (st)
        return st;
    b->n = n;
    for (int i = 0; i < n && !st; i++) {
        b->size[i] = (int64_t)sizes[i] * N;
        st = zs_unit_add(b->ctx, names[i], &b->unit[i]);
        if (!st)
            st = zs_param_add(b->ctx, b->unit[i], "w", b->size[i], NULL, &b->param[i]);
    }
    return st ? st : zs_setup(b->ctx);
}

/* zs_grad_get for unit i, filling its gradient at once: a later unit placed over this slot zeroes it. */
static zs_status get(struct bucket *b, int i)
{
    zs_status st = zs_grad_get(b->ctx, b->unit[i], &b->grad[i]);

    for (int64_t k = 0; !st && k < b->size[i]; k++)
        b->grad[i][k] = (float)(i + 1);
    return st;
}

static zs_status ready(struct bucket *b, int i) { return zs_grad_ready(b->ctx, b->unit[i]); }

/* zs_grad_get for fill[0], fill[1], ... in turn, so they take the bucket's slots in that order; every unit
 * but those in open[] is handed over at once (zs_grad_ready). */
static zs_status fill_slots(struct bucket *b, const int *fill, int n, const int *open, int nopen)
{
    zs_status st = ZS_OK;

    for (int s = 0; s < n && !st; s++) {
        bool keep = false;
        for (int k = 0; k < nopen; k++)
            keep |= fill[s] == open[k];
        st = get(b, fill[s]);
        if (!st && !keep)
            st = ready(b, fill[s]);
    }
    return st;
}

/* After the step: every unit's parameters are -(i + 1), none summed with another unit's gradient. */
static void check_params(struct bucket *b, const char *what)
{
    for (int i = 0; i < b->n; i++) {
        float *w = NULL;
        CHECK(zs_param_data(b->ctx, b->param[i], (void **)&w) == ZS_OK && w, "%s: %s", what, zs_last_error());
        for (int64_t k = 0; w && k < b->size[i]; k++)
            if (w[k] != -(float)(i + 1)) {
                CHECK(0, "%s: unit %d element %lld is %g, expected %d", what, i, (long long)k, w[k], -(i + 1));
                break;
            }
    }
}

/* One open slot: u0 stays open while u1 fills the rest of a two-slot bucket and u2 restarts it; u2 goes
 * around u0's slot instead of over it. (Found through the PyTorch front end: the next unit was placed over
 * the open slot and the two units' gradients summed into one buffer without a word.) */
static void test_open_slot_kept_at_restart(void)
{
    static const char *const names[] = {"u0", "u1", "u2"};
    static const int sizes[] = {1, 1, 1};
    struct bucket b;

    CHECK(bucket_open(&b, 2, names, sizes, 3) == ZS_OK, "%s", zs_last_error());
    CHECK(get(&b, 0) == ZS_OK && get(&b, 1) == ZS_OK && ready(&b, 1) == ZS_OK, "%s", zs_last_error());
    CHECK(get(&b, 2) == ZS_OK && ready(&b, 2) == ZS_OK, "%s", zs_last_error()); /* restarts the bucket */
    CHECK(ready(&b, 0) == ZS_OK && zs_step(b.ctx) == ZS_OK, "%s", zs_last_error());
    check_params(&b, "one open slot");
    zs_finalize(b.ctx);
}

/* A bucket of one slot that u0 holds open: u1 cannot be placed, and the error names u0. */
static void test_open_slot_no_room_names_it(void)
{
    static const char *const names[] = {"u0", "u1"};
    static const int sizes[] = {1, 1};
    struct bucket b;
    zs_status st;

    CHECK(bucket_open(&b, 1, names, sizes, 2) == ZS_OK, "%s", zs_last_error());
    CHECK(get(&b, 0) == ZS_OK, "%s", zs_last_error());
    st = zs_grad_get(b.ctx, b.unit[1], &b.grad[1]);
    CHECK(st == ZS_ERR_INVALID && strstr(zs_last_error(), "first: 'u0'"), "open slot overwritten: %d %s", st,
          zs_last_error());
    zs_finalize(b.ctx);
}

/* Three open slots with a free slot between each when the bucket restarts, their units registered in the
 * reverse of their place in the bucket (z, y, x at slots 4, 2, 0 of 8):
 *   slot  0 1 2 3 4 5 6 7
 *         x a y b z c d e     x, y, z open; a-e handed over
 * The restart (f) walks past x to slot 1; "big" (two slots), placed from slot 2, walks past y and then z,
 * which comes before y in unit order, to slots 5-6; g takes slot 7. A placement that skipped the walk,
 * or stopped after one pass over the units, would zero one of x, y, z's gradients. */
static void test_three_open_slots_with_gaps(void)
{
    enum { Z, Y, X, A, B, C, D, E, F, BIG, G, NUNITS };
    static const char *const names[] = {"z", "y", "x", "a", "b", "c", "d", "e", "f", "big", "g"};
    static const int sizes[] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 1};
    static const int fill[] = {X, A, Y, B, Z, C, D, E}, open[] = {X, Y, Z}; /* slots 0-7, in order */
    struct bucket b;

    CHECK(bucket_open(&b, 8, names, sizes, NUNITS) == ZS_OK, "%s", zs_last_error());
    CHECK(fill_slots(&b, fill, 8, open, 3) == ZS_OK, "filling the bucket: %s", zs_last_error());
    CHECK(get(&b, F) == ZS_OK && ready(&b, F) == ZS_OK, "the restart: %s", zs_last_error());
    CHECK(get(&b, BIG) == ZS_OK && ready(&b, BIG) == ZS_OK, "two slots among the open ones: %s", zs_last_error());
    CHECK(get(&b, G) == ZS_OK && ready(&b, G) == ZS_OK, "the last slot: %s", zs_last_error());
    CHECK(ready(&b, X) == ZS_OK && ready(&b, Y) == ZS_OK && ready(&b, Z) == ZS_OK, "%s", zs_last_error());
    CHECK(zs_step(b.ctx) == ZS_OK, "%s", zs_last_error());
    check_params(&b, "three open slots");
    zs_finalize(b.ctx);
}

/* The same three open slots in a bucket of six: no two free slots side by side, so "big" gets an error
 * naming the first open unit in unit order (z), and the open units' gradients are untouched. */
static void test_three_open_slots_no_room(void)
{
    enum { Z, Y, X, A, B, C, BIG, NUNITS };
    static const char *const names[] = {"z", "y", "x", "a", "b", "c", "big"};
    static const int sizes[] = {1, 1, 1, 1, 1, 1, 2};
    static const int fill[] = {X, A, Y, B, Z, C}, open[] = {X, Y, Z};
    struct bucket b;
    zs_status st;

    CHECK(bucket_open(&b, 6, names, sizes, NUNITS) == ZS_OK, "%s", zs_last_error());
    CHECK(fill_slots(&b, fill, 6, open, 3) == ZS_OK, "filling the bucket: %s", zs_last_error());
    st = zs_grad_get(b.ctx, b.unit[BIG], &b.grad[BIG]);
    CHECK(st == ZS_ERR_INVALID && strstr(zs_last_error(), "unit 'big' needs") &&
              strstr(zs_last_error(), "first: 'z'"), "no room among three open slots: %d %s", st, zs_last_error());
    for (int i = Z; i <= X; i++)
        for (int64_t k = 0; k < b.size[i]; k++)
            if (b.grad[i][k] != (float)(i + 1)) {
                CHECK(0, "open unit %d element %lld is %g after a refused placement", i, (long long)k, b.grad[i][k]);
                break;
            }
    zs_finalize(b.ctx);
}

int main(int argc, char **argv)
{
    int fails, any = 0;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    test_open_slot_kept_at_restart();
    test_open_slot_no_room_names_it();
    test_three_open_slots_with_gaps();
    test_three_open_slots_no_room();
    fails = zs_test_fail;
    MPI_Allreduce(&fails, &any, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Finalize();
    if (rank == 0)
        zs_test_summary("test_bucket");
    return any ? 1 : 0;
}
