/* test_exact_local.c - the deterministic sum's fast local passes (sharding/exact_local.c) against their
 * references, bit for bit, with the plain loops and (where the CPU has it) the AVX-512 ones: the in-place
 * fold of the counters on random counters, tops and agreed tops at awkward lengths, and the norm's squares
 * (the plain loop's bins, AVX-512's lane sums) against the per-value pieces on random values, subnormals,
 * zeros, the largest finite values and more than 2^16 squares of one exponent in one histogram bin (the
 * bins' flush), in adds of 1 to all the values. Prints "N passed, M failed". */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "sharding/exact_state.h"
#include "sharding/exact_local.h"

static uint64_t rng_state = 0x243f6a8885a308d3ULL;

static uint64_t rnd(void)
{
    uint64_t x = (rng_state += 0x9e3779b97f4a7c15ULL);
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* ---------------------------------------------------------------- the fold */

/* Counters as deposits leave them (|c0| < 2^30: a sum of up to 2^15 pieces below 2^16, with room), each
 * element's top band (-1: nothing yet; 127: the unit's non-finite mark) and an agreed top at or above it. */
static void fill_counters(int32_t *acc, int8_t *top, int8_t *agreed, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        uint64_t h = rnd();
        int t = (int)(h % 20) - 1, d = (int)((h >> 8) % 5);
        if (t == 18)
            t = 127;
        for (int k = 0; k < 3; k++)
            acc[i * 3 + k] = t < 0 ? 0 : (int32_t)(rnd() % (1u << 31)) - (1 << 30);
        top[i] = (int8_t)t;
        agreed[i] = (int8_t)(t == 127 ? 127 : t + d > 17 ? 17 : t + d);
    }
}

static void check_fold(int path, int64_t n)
{
    int32_t *a = malloc((size_t)(n ? n : 1) * 3 * sizeof(int32_t)), *b = malloc((size_t)(n ? n : 1) * 3 * sizeof(int32_t));
    int8_t *top = malloc((size_t)n + 1), *agreed = malloc((size_t)n + 1);

    fill_counters(a, top, agreed, n);
    memcpy(b, a, (size_t)n * 3 * sizeof(int32_t));
    zs_exact_fold(a, top, agreed, n, 0);
    zs_exact_fold(b, top, agreed, n, path);
    int64_t bad = -1;
    for (int64_t i = 0; i < n && bad < 0; i++)
        if (memcmp((char *)a + 8 * i, (char *)b + 8 * i, 8))
            bad = i;
    CHECK(bad < 0, "fold path %d, %lld elements: element %lld differs from the reference", path, (long long)n,
          (long long)bad);
    free(a);
    free(b);
    free(top);
    free(agreed);
}

/* ---------------------------------------------------------------- the squares */

/* The bands of every value through the reference and through the histogram, added in pieces of `step`
 * values (1: every add puts its value in lane 0, the worst case for the flush). */
static int sq_path = 1; /* the fast loop under test */

static void check_squares(const char *what, const float *f, int64_t n, int64_t step)
{
    uint64_t want[ZS_EXACT_SQ_BANDS] = {0}, got[ZS_EXACT_SQ_BANDS] = {0};
    static struct zs_xsq h;

    for (int64_t i = 0; i < n; i++)
        zs_xsq_add_ref(want, f[i]);
    zs_xsq_start(&h, sq_path);
    for (int64_t i = 0; i < n; i += step)
        zs_xsq_add(&h, f + i, n - i < step ? n - i : step, got);
    zs_xsq_end(&h, got);
    int b = 0;
    while (b < ZS_EXACT_SQ_BANDS && want[b] == got[b])
        b++;
    CHECK(b == ZS_EXACT_SQ_BANDS, "squares, path %d, %s (%lld values, adds of %lld): band %d is %llu, the reference's %llu",
          sq_path, what, (long long)n, (long long)step, b, b < ZS_EXACT_SQ_BANDS ? (unsigned long long)got[b] : 0ULL,
          b < ZS_EXACT_SQ_BANDS ? (unsigned long long)want[b] : 0ULL);
}

static float from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

static void squares_cases(void)
{
    int64_t n = 300000; /* more than 2^16 per lane of 4 */
    float *f = malloc((size_t)n * sizeof(float));
    const int64_t steps[] = {1, 7, 256, 1000, 4096, 300000};

    for (int64_t i = 0; i < n; i++) { /* any finite value of either sign */
        uint32_t u = (uint32_t)rnd();
        f[i] = from_bits((u & 0x7f800000u) == 0x7f800000u ? u & 0xbfffffffu : u);
    }
    for (int s = 0; s < 6; s++)
        check_squares("random finite values", f, n, steps[s]);
    for (int64_t i = 0; i < n; i++) /* subnormals, zeros of both signs, the least and largest values */
        f[i] = from_bits(i % 5 == 0 ? 0u : i % 5 == 1 ? 0x80000000u : i % 5 == 2 ? 0x7f7fffffu :
                         i % 5 == 3 ? (uint32_t)(rnd() & 0x807fffffu) : 1u);
    for (int s = 0; s < 6; s++)
        check_squares("subnormals, zeros, extremes", f, n, steps[s]);
    /* every exponent with all 24 significand bits set, so that each bin fills; one value per add (lane 0
     * only) for exponents 0-16, 254: every cut of the bands (they repeat every 16 exponents) at 2^16 + 1
     * squares would overflow a bin's sum between flushes */
    for (int e = 0; e < 255; e++) {
        for (int64_t i = 0; i < n; i++)
            f[i] = from_bits((uint32_t)e << 23 | 0x7fffffu | (i % 3 ? 0x80000000u : 0u));
        char what[64];
        snprintf(what, sizeof(what), "the largest significand at exponent %d", e);
        bool all = e <= 16 || e == 254;
        check_squares(what, f, all ? n : 70000, all ? 1 : 4096);
    }
    for (int64_t i = 0; i < n; i++) /* gradient-like: a few neighbouring exponents */
        f[i] = ldexpf((float)(rnd() % 2000000) - 1e6f, -40 + (int)(rnd() % 8));
    check_squares("gradient-like values", f, n, 256);
    free(f);
}

int main(void)
{
    const int64_t lengths[] = {0, 2, 16, 254, 256, 512, 528, 770, 1024, 4096 + 16, 100000};
    int best;

    unsetenv("ZS_EXACT_PATH");
    best = zs_exact_path();
    printf("fast loops: %s\n", best == 2 ? "plain and AVX-512" : "plain (no AVX-512 on this CPU)");
    for (int path = 1; path <= best; path++)
        for (size_t l = 0; l < sizeof(lengths) / sizeof(lengths[0]); l++)
            check_fold(path, lengths[l]);
    for (sq_path = 1; sq_path <= best; sq_path++)
        squares_cases();
    setenv("ZS_EXACT_PATH", "scalar", 1);
    CHECK(zs_exact_path() == 0, "ZS_EXACT_PATH=scalar gives path %d", zs_exact_path());
    setenv("ZS_EXACT_PATH", "plain", 1);
    CHECK(zs_exact_path() == 1, "ZS_EXACT_PATH=plain gives path %d", zs_exact_path());
    return zs_test_summary("test_exact_local");
}
