/* test_exact.c - the exact gradient sum of zeroshard.deterministic on values that span 2^-44..2^30 and
 * both signs, so an element's top band rises part-way through a rank's micro-shards and ranks start from
 * different tops (at stage 0; at stage 3 each rank deposits its micro-shards in descending order, so its
 * first deposit, which sets the counters outright, holds its largest values). One SGD step (lr 1, parameters 0) leaves minus the reduced gradient in the parameters;
 * every element must equal, bit for bit, the sum the contract defines (sharding/exact.c): each summand
 * truncated toward zero below bit 16 (T - 2) of its element's grid, T the band of the element's largest
 * value, summed exactly (in 128-bit integers here), divided by the micro-shard count and rounded - at any
 * world size and at stages 0 and 3, in fp32. That sum must also lie within the contract's error bound of
 * the true sum (a quad-precision sum, exact for this range), and some elements (big pairs that cancel
 * beside a value 2^40 smaller) must differ from the true sum, so the truncation is seen to happen.
 * Prints "exact-hash H".
 * `test_exact misuse` (1 rank): zs_grad_ready refuses a gradient added after the last deposit and a
 * micro-batch with a micro-shard missing, naming the unit, and zs_setup refuses a window of more than
 * 2^15 micro-shards naming zeroshard.micro_shard_size.
 * `test_exact order S` (2+ ranks, stage S): two units of one size marked ready in the same order on every rank
 * train; in another order on rank 1 (whose sums would be matched crosswise by order alone, silently) every
 * rank's zs_step fails naming the mismatch, and the parameters keep their values. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <mpi.h>

#include "zeroshard.h"

#define N 1000      /* elements */
#define SHARDS 12   /* micro-shards of one sample in the global batch */

static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* Micro-shard j's gradient of element i: a random 24-bit mantissa and sign, below 2^top(j), where top(j)
 * rises from -20 to 30 with j (so a rank's top band rises as its shards arrive, by two bands over the
 * window); even elements sit at the top, odd ones anywhere from 2^-20 up. */
static float value(int64_t i, int64_t j)
{
    uint64_t h = mix((uint64_t)(i * SHARDS + j) + 77);
    int top = -20 + (int)(j * 50 / (SHARDS - 1));
    int e = i % 2 ? -20 + (int)(h % (uint64_t)(top + 21)) : top;
    float m = (float)((h >> 8) & 0xffffff) + 1.0f;

    if (i % 7 == 3) /* some elements cancel to nearly nothing */
        return (j % 2 ? -1.0f : 1.0f) * ldexpf(m, -20 - 24 + (int)(j / 2) % 3);
    if (i % 7 == 5) { /* pairs that cancel exactly, beside one value 2^40 below them: truncated away */
        uint64_t hp = mix((uint64_t)(i * SHARDS + j / 2 * 2) + 77);
        float mp = (float)((hp >> 8) & 0xffffff) + 1.0f;
        return j == SHARDS - 2 ? ldexpf(m, -20 - 24) : j == SHARDS - 1 ? 0.0f : (j % 2 ? -1.0f : 1.0f) * ldexpf(mp, 20 - 24);
    }
    return ((h >> 40) & 1 ? -1.0f : 1.0f) * ldexpf(m, e - 24);
}

/* The contract's sum of element i over the window: each summand truncated toward zero at the grid of
 * the element's top band, summed exactly, divided by the count and rounded as the library rounds (the
 * integer to double, divided, to fp32). *exact: the true sum in quad precision; *unit: the grid's unit. */
static float contract_sum(int64_t i, __float128 *exact, double *unit)
{
    int top = -1;
    __int128 v = 0;

    *exact = 0;
    for (int64_t j = 0; j < SHARDS; j++) {
        int e;
        float x = value(i, j);
        *exact += (__float128)x;
        if (x != 0.0f) {
            frexpf(x, &e); /* |x| < 2^e: the highest bit is bit e - 1 + 149 of the integer |x| 2^149 */
            top = (e - 1 + 149) / 16 > top ? (e - 1 + 149) / 16 : top;
        }
    }
    *unit = top < 0 ? 0.0 : ldexp(1.0, 16 * (top - 2) - 149);
    for (int64_t j = 0; j < SHARDS && top >= 0; j++)
        v += (__int128)((__float128)value(i, j) / (__float128)*unit); /* the conversion truncates toward zero */
    return (float)((double)v * *unit / (double)SHARDS);
}

/* The contract's two errors, on a fresh context each (a refused ready leaves the micro-batch open). */
static int misuse(void)
{
    const char *json = "{\"train_batch_size\": 2, \"optimizer\": {\"type\": \"SGD\", \"params\": {\"lr\": 1.0}},"
                       " \"zeroshard\": {\"deterministic\": \"world_size_invariant\"}}";
    int bad = 0;

    for (int c = 0; c < 2; c++) {
        zs_init_opts o = {.config_json = json, .use_comm = 1, .comm = MPI_COMM_WORLD, .quiet = 1};
        zs_ctx *ctx = NULL;
        int32_t u, p;
        float *g;
        zs_status st;
        if (zs_init(&ctx, &o) || zs_unit_add(ctx, "u", &u) || zs_param_add(ctx, u, "w", 8, NULL, &p) ||
            zs_setup(ctx) || zs_grad_get(ctx, u, &g))
            return fprintf(stderr, "FAIL: set-up: %s\n", zs_last_error()), 1;
        g[3] = 1.0f;
        zs_grad_deposit(ctx, u); /* one of the micro-batch's two micro-shards */
        if (c == 1)
            g[5] = 2.0f; /* added, never deposited */
        st = zs_grad_ready(ctx, u);
        const char *want = c == 1 ? "gradient added after the last zs_grad_deposit" : "1 micro-shard gradients";
        int ok = st == ZS_ERR_INVALID && strstr(zs_last_error(), want) && strstr(zs_last_error(), "unit 'u'");
        printf("misuse %d: %s: %s\n", c, zs_last_error(), ok ? "ok" : "bad");
        bad += !ok;
        zs_finalize(ctx);
    }
    /* more micro-shards in a window than the integer sums can hold: refused at set-up, naming the key */
    zs_init_opts o = {.config_json = "{\"train_batch_size\": 40000, \"optimizer\": {\"type\": \"SGD\", \"params\": {\"lr\": 1.0}},"
                                     " \"zeroshard\": {\"deterministic\": \"world_size_invariant\"}}",
                      .use_comm = 1, .comm = MPI_COMM_WORLD, .quiet = 1};
    zs_ctx *ctx = NULL;
    int32_t u, p;
    zs_status st = zs_init(&ctx, &o);
    if (!st && !(st = zs_unit_add(ctx, "u", &u)) && !(st = zs_param_add(ctx, u, "w", 8, NULL, &p)))
        st = zs_setup(ctx);
    int ok = st != ZS_OK && strstr(zs_last_error(), "zeroshard.micro_shard_size") && strstr(zs_last_error(), "32768");
    printf("misuse 2: %s: %s\n", zs_last_error(), ok ? "ok" : "bad");
    bad += !ok;
    zs_finalize(ctx);
    return bad;
}

/* Two units of N elements, gradients 1 (unit a) and 2 (unit b); swap: rank 1 marks b ready before a. */
static int order_case(int rank, int stage, int swap)
{
    char json[512];
    zs_ctx *ctx = NULL;
    int32_t u[2], p[2];
    zs_status st;
    int bad = 0;

    snprintf(json, sizeof(json),
             "{\"train_batch_size\": %d, \"optimizer\": {\"type\": \"SGD\", \"params\": {\"lr\": 1.0}},"
             " \"zero_optimization\": {\"stage\": %d, \"stage3_param_persistence_threshold\": 0},"
             " \"zeroshard\": {\"deterministic\": \"world_size_invariant\"}}", SHARDS, stage);
    zs_init_opts o = {.config_json = json, .use_comm = 1, .comm = MPI_COMM_WORLD, .quiet = 1};
    if ((st = zs_init(&ctx, &o)) || (st = zs_unit_add(ctx, "a", &u[0])) || (st = zs_param_add(ctx, u[0], "wa", N, NULL, &p[0])) ||
        (st = zs_unit_add(ctx, "b", &u[1])) || (st = zs_param_add(ctx, u[1], "wb", N, NULL, &p[1])) || (st = zs_setup(ctx)))
        return fprintf(stderr, "FAIL: order: set-up: %s\n", zs_last_error()), 1;
    int64_t B = zs_micro_batch_size(ctx);
    for (int k = 0; k < 2 && !st; k++) {
        void *g;
        if ((st = zs_unit_fetch(ctx, u[k], NULL)))
            break;
        for (int64_t q = 0; q < B && !st; q++) {
            if (!(st = zs_grad_buffer(ctx, u[k], &g))) {
                for (int64_t i = 0; i < N; i++)
                    ((float *)g)[i] = (float)(k + 1);
                st = zs_grad_deposit(ctx, u[k]);
            }
        }
    }
    int first = swap && rank == 1 ? 1 : 0;
    if (!st)
        st = zs_grad_ready(ctx, u[first]);
    if (!st)
        st = zs_grad_ready(ctx, u[1 - first]);
    for (int k = 0; k < 2 && !st; k++)
        st = zs_unit_release(ctx, u[k]);
    if (st)
        return fprintf(stderr, "FAIL: order: backward: %s\n", zs_last_error()), 1;
    st = zs_step(ctx);
    /* the sums' reduce-scatters carry their unit: the collectives' cross-rank check names the mismatch, and
     * the ready order's hash (for sums matched by order alone) stands behind it */
    int refused = st != ZS_OK && (strstr(zs_last_error(), "another order") != NULL ||
                                  strstr(zs_last_error(), "differs between ranks") != NULL);
    if (swap != refused) {
        fprintf(stderr, "FAIL: order: rank %d, ready order %s: zs_step %s (%s)\n", rank, swap ? "swapped" : "alike",
                st ? "failed" : "passed", st ? zs_last_error() : "");
        bad++;
    }
    for (int k = 0; k < 2; k++) { /* SGD from 0 with lr 1: -(k + 1) after a step, still 0 after a refused one */
        void *w;
        if (zs_unit_fetch(ctx, u[k], NULL) || zs_param_data(ctx, p[k], &w)) {
            fprintf(stderr, "FAIL: order: rank %d: reading unit %d: %s\n", rank, k, zs_last_error());
            bad++;
            break;
        }
        float want = swap ? 0.0f : -(float)(k + 1);
        for (int64_t i = 0; i < N; i++)
            if (((float *)w)[i] != want) {
                fprintf(stderr, "FAIL: order: rank %d: unit %d element %lld is %g, not %g\n", rank, k, (long long)i,
                        (double)((float *)w)[i], (double)want);
                bad++;
                break;
            }
        zs_unit_release(ctx, u[k]);
    }
    if (rank == 0 && !bad)
        printf("order stage %d, %s: %s\n", stage, swap ? "rank 1 swapped" : "alike", swap ? zs_last_error() : "trained");
    zs_finalize(ctx);
    return bad;
}

int main(int argc, char **argv)
{
    int rank, world, stage = argc > 1 ? (argv[1][0] - '0') : 0, bad = 0;
    char json[512];
    zs_ctx *ctx = NULL;
    int32_t u, p;
    zs_status st;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (argc > 1 && !strcmp(argv[1], "misuse")) {
        bad = misuse();
        MPI_Finalize();
        return bad ? 1 : 0;
    }
    if (argc > 2 && !strcmp(argv[1], "order")) {
        int s = argv[2][0] - '0';
        bad = order_case(rank, s, 0) + order_case(rank, s, 1);
        MPI_Finalize();
        return bad ? 1 : 0;
    }
    snprintf(json, sizeof(json),
             "{\"train_batch_size\": %d, \"gradient_accumulation_steps\": 1, \"steps_per_print\": 0,"
             " \"optimizer\": {\"type\": \"SGD\", \"params\": {\"lr\": 1.0}},"
             " \"zero_optimization\": {\"stage\": %d, \"stage3_param_persistence_threshold\": 0},"
             " \"zeroshard\": {\"deterministic\": \"world_size_invariant\", \"micro_shard_size\": 1}}",
             SHARDS, stage);
    zs_init_opts o = {.config_json = json, .use_comm = 1, .comm = MPI_COMM_WORLD, .quiet = 1};
    if ((st = zs_init(&ctx, &o)) || (st = zs_unit_add(ctx, "u", &u)) ||
        (st = zs_param_add(ctx, u, "w", N, NULL, &p)) || (st = zs_setup(ctx)))
        goto fail;
    int64_t B = zs_micro_batch_size(ctx);
    void *g;
    if ((st = zs_unit_fetch(ctx, u, NULL)))
        goto fail;
    for (int64_t q = 0; q < B; q++) { /* this rank's contiguous micro-shards, in either order */
        int64_t j = stage == 0 ? rank * B + q : (rank + 1) * B - 1 - q;
        if ((st = zs_grad_buffer(ctx, u, &g)))
            goto fail;
        for (int64_t i = 0; i < N; i++)
            ((float *)g)[i] = value(i, j);
        if ((st = zs_grad_deposit(ctx, u)))
            goto fail;
    }
    if ((st = zs_grad_ready(ctx, u)) || (st = zs_unit_release(ctx, u)) || (st = zs_step(ctx)))
        goto fail;
    void *w;
    int truncated = 0, bounds = 0;
    uint64_t hash = 0xcbf29ce484222325ULL;
    if ((st = zs_unit_fetch(ctx, u, NULL)) || (st = zs_param_data(ctx, p, &w)))
        goto fail;
    for (int64_t i = 0; i < N; i++) {
        __float128 s;
        double unit;
        /* SGD's 0 - 1 * g: a zero sum leaves +0 */
        float want = 0.0f - contract_sum(i, &s, &unit), got = ((float *)w)[i];
        float rounded = 0.0f - (float)((double)s / (double)SHARDS);
        /* the bound: below SHARDS grid units from the true sum, and a unit is at most 2^-32 of the
         * largest summand */
        double maxabs = 0.0;
        for (int64_t j = 0; j < SHARDS; j++)
            maxabs = fabs((double)value(i, j)) > maxabs ? fabs((double)value(i, j)) : maxabs;
        __float128 err = (__float128)want * -SHARDS - s; /* want's own rounding: within half an ulp of it */
        double allowed = SHARDS * unit + fabs((double)want) * SHARDS * 0x1p-24;
        if ((double)(err < 0 ? -err : err) > allowed || unit > 0x1p-32 * maxabs * 2)
            bounds++;
        uint32_t a, b;
        memcpy(&a, &want, 4);
        memcpy(&b, &got, 4);
        if (a != b && bad++ < 5 && rank == 0)
            fprintf(stderr, "FAIL: element %lld: %a, the contract's sum / %d gives %a\n", (long long)i, (double)got,
                    SHARDS, (double)want);
        truncated += want != rounded;
        hash = (hash ^ b) * 0x100000001b3ULL;
    }
    if ((st = zs_unit_release(ctx, u)))
        goto fail;
    if (rank == 0)
        printf("exact-hash %016llx stage %d np %d: %d of %d elements differ from the contract's sum; %d differ "
               "from the true sum rounded (truncation), %d outside the error bound\n",
               (unsigned long long)hash, stage, world, bad, N, truncated, bounds);
    zs_finalize(ctx);
    MPI_Finalize();
    return bad || bounds || truncated == 0 ? 1 : 0;
fail:
    fprintf(stderr, "FAIL: rank %d: %s\n", rank, zs_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
}
