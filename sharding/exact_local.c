/* exact_local.c - two local passes of the deterministic sum (sharding/exact.c) with fast loops: the fold of
 * the counters into one int64 per element, and the norm's exact sum of squares; each beside its reference. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "exact_local.h"
#ifdef XFAST
#include <immintrin.h>
#endif

#define XK 3  /* counters per element */
#define XW 16 /* bits per band */
#define SQ_FLUSH (1 << 16) /* adds per histogram bin: 2^16 squares below 2^48 stay below 2^64 */
#define SQ_LANE_FLUSH ((int64_t)1 << 32) /* adds per vector lane: 2^32 pieces below 2^32 */

typedef int64_t i64_alias __attribute__((may_alias)); /* a folded sum, where the counters were */

int zs_exact_path(void)
{
    const char *e = getenv("ZS_EXACT_PATH");

    if (e && !strcmp(e, "scalar"))
        return 0;
    if (e && !strcmp(e, "plain"))
        return 1;
#ifdef XFAST
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
        return 2;
#endif
    return 1;
}

/* ---------------------------------------------------------------- the fold
 * An element's counters move down by d = agreed - own top, the lowest d dropping out (an element with no
 * nonzero value has zero counters, whatever d). */

/* The reference, one element at a time. */
static void fold_ref(const int32_t *c, const int8_t *top, const int8_t *agreed, int64_t *v, int64_t k)
{
    for (int64_t i = 0; i < k; i++) {
        int64_t c0 = c[i * XK], c1 = c[i * XK + 1], c2 = c[i * XK + 2];
        int32_t d = agreed[i] - top[i];
        /* |v| < S 2^48 <= 2^63: multiplied, as a left shift of a negative value is undefined */
        int64_t v0 = c0 * ((int64_t)1 << (2 * XW)) + c1 * ((int64_t)1 << XW) + c2, v1 = c0 * ((int64_t)1 << XW) + c1;
        v[i] = d == 0 ? v0 : d == 1 ? v1 : d == 2 ? c0 : 0;
    }
}

/* The same sums in an order the compiler turns into lanes: v0 = v1 2^16 + c2 is the reference's v0. */
static inline __attribute__((always_inline)) void fold_body(const int32_t *restrict c, const int8_t *restrict top,
                                                            const int8_t *restrict agreed, i64_alias *restrict v,
                                                            int64_t k)
{
    for (int64_t i = 0; i < k; i++) {
        int64_t c0 = c[i * XK], c1 = c[i * XK + 1], c2 = c[i * XK + 2];
        int32_t d = agreed[i] - top[i];
        int64_t v1 = c0 * ((int64_t)1 << XW) + c1, v0 = v1 * ((int64_t)1 << XW) + c2;
        v[i] = d == 0 ? v0 : d == 1 ? v1 : d == 2 ? c0 : 0;
    }
}

static void fold_plain(const int32_t *restrict c, const int8_t *restrict top, const int8_t *restrict agreed,
                       i64_alias *restrict v, int64_t k)
{
    fold_body(c, top, agreed, v, k);
}

#ifdef XFAST
XFAST_TARGET
static void fold_avx512(const int32_t *restrict c, const int8_t *restrict top, const int8_t *restrict agreed,
                        i64_alias *restrict v, int64_t k)
{
    fold_body(c, top, agreed, v, k);
}
#endif

/* In place, a chunk at a time: chunk [i0, i0 + k)'s sums take bytes [8 i0, 8 (i0 + k)) of the counters,
 * all of which belong to elements of this chunk or earlier. While those bytes reach into the chunk's own
 * counters (2 k > i0: the first two chunks), the chunk is copied out first; later chunks write below
 * their counters, straight from them. */
void zs_exact_fold(int32_t *acc, const int8_t *top, const int8_t *agreed, int64_t n, int path)
{
    int32_t c[256 * XK];
    int64_t v[256];

    for (int64_t i0 = 0; i0 < n; i0 += 256) {
        int64_t k = n - i0 < 256 ? n - i0 : 256;
        i64_alias *out = (i64_alias *)(void *)((char *)acc + i0 * (int64_t)sizeof(int64_t));
        const int32_t *in = acc + i0 * XK;
        if (path == 0 || 2 * k > i0) {
            memcpy(c, in, (size_t)k * XK * sizeof(int32_t));
            in = c;
        }
        if (path == 0) {
            fold_ref(c, top + i0, agreed + i0, v, k);
            memcpy(out, v, (size_t)k * sizeof(int64_t));
        }
#ifdef XFAST
        else if (path == 2)
            fold_avx512(in, top + i0, agreed + i0, out, k);
#endif
        else
            fold_plain(in, top + i0, agreed + i0, out, k);
    }
}

/* ---------------------------------------------------------------- the norm's squares
 * A square of an fp32 value is an integer multiple of 2^-298 below 2^256 with at most 48 significant bits.
 * Cut at fixed bit positions (bit 0 = 2^-350) into 32-bit bands, each band's pieces summed in a uint64 (all
 * positive; 2^32 squares per rank before one could wrap), the sum over all elements and ranks is exact
 * whatever the shard ranges. The bands' contents (not only the value they stand for) are a function of
 * the set of values: every value adds its own pieces, and the norm rounds the bands as they are. */

void zs_xsq_add_ref(uint64_t *c, float f)
{
    double q = (double)f * (double)f;
    uint64_t u, m;
    uint32_t e;

    if (q == 0.0)
        return;
    memcpy(&u, &q, sizeof(u));
    e = (uint32_t)(u >> 52);
    m = ((u & 0xfffffffffffffULL) | 0x10000000000000ULL) >> 5; /* the 5 low bits are zero: 48 significant */
    int32_t s = (int32_t)e - 1075 + ZS_XSQ_BIAS + 5;            /* bit position of m's lowest bit, >= 0 */
    unsigned __int128 v = (unsigned __int128)m << (s % 32);
    int32_t b = s / 32;
    c[b] += (uint64_t)(v & 0xffffffffu);
    c[b + 1] += (uint64_t)((v >> 32) & 0xffffffffu);
    c[b + 2] += (uint64_t)(v >> 64);
}

/* The histogram. A value of biased exponent e and significand m (e = 0: exponent 1, no implicit bit) has
 * the square m^2 2^(2 max(e, 1) - 300): in the bands, m^2 shifted left by p = 2 max(e, 1) + 50, its lowest
 * bit in band p / 32 at r = p % 32. The pieces the reference adds are m^2's bits below k = 32 - r (shifted
 * up by r) to that band, bits [k, k + 32) to the next, the rest (k < 16 only) to the one after. So each bin
 * sums m^2 and its parts below the two cuts, k and k + 32; the differences give the sums of the pieces. */
static void sq_cuts(uint32_t e, uint32_t *band, uint32_t *r)
{
    uint32_t p = 2 * (e ? e : 1) + 50;

    *band = p / 32;
    *r = p % 32;
}

void zs_xsq_start(struct zs_xsq *h, int path)
{
    h->path = path;
    h->rounds = 0;
    memset(h->lane, 0, sizeof(h->lane));
    if (path == 2)
        return;
    memset(h->bin, 0, sizeof(h->bin));
    for (uint32_t e = 0; e < 256; e++) {
        uint32_t b, r, k;
        sq_cuts(e, &b, &r);
        k = 32 - r;
        h->mask[e][0] = ((uint64_t)1 << k) - 1;
        h->mask[e][1] = k + 32 >= 64 ? ~(uint64_t)0 : ((uint64_t)1 << (k + 32)) - 1;
    }
}

/* Empties the bins (or the lanes) into the bands. */
static void sq_flush(struct zs_xsq *h, uint64_t *sq)
{
    h->rounds = 0;
    if (h->path == 2) {
        for (int32_t b = 0; b < ZS_XSQ_BANDS; b++)
            for (int32_t l = 0; l < 8; l++) {
                sq[b] += h->lane[b][l];
                h->lane[b][l] = 0;
            }
        return;
    }
    for (int32_t l = 0; l < ZS_XSQ_LANES; l++)
        for (uint32_t e = 0; e < 256; e++) {
            uint64_t *s = h->bin[l][e], whole = s[0], lo = s[1], mid = s[2];
            uint32_t b, r, k;
            if (!whole) /* every part is a sum of parts of nonnegative squares */
                continue;
            sq_cuts(e, &b, &r);
            k = 32 - r;
            sq[b] += lo << r;          /* below 2^16 2^k: no bit lost */
            sq[b + 1] += (mid - lo) >> k; /* each piece below 2^32, exactly divisible */
            if (k < 16)
                sq[b + 2] += (whole - mid) >> (k + 32);
            s[0] = s[1] = s[2] = 0;
        }
}

#ifdef XFAST
/* Eight values a vector: each lane's three pieces (the reference's own, from m^2 and p as above) are added
 * to the bands they belong to, in that lane's sum of each band; one pass per band that a live lane of the
 * vector starts in, between the least and the greatest of the 256-value chunk. */
XFAST_TARGET
static void sq_avx512(uint64_t (*lane)[8], const float *f, int64_t k)
{
    const __m512i c1 = _mm512_set1_epi64(1), c31 = _mm512_set1_epi64(31), c32 = _mm512_set1_epi64(32),
                  c50 = _mm512_set1_epi64(50), low32 = _mm512_set1_epi64(0xffffffff), exp = _mm512_set1_epi64(0xff),
                  sig = _mm512_set1_epi64(0x7fffff), hidden = _mm512_set1_epi64(0x800000);
    __m512i d[3][32], band[32];
    __mmask8 live[32];
    __m512i lo = _mm512_set1_epi64(31), hi = _mm512_setzero_si512();

    for (int64_t v = 0; v * 8 < k; v++) {
        int64_t left = k - v * 8;
        __mmask8 in = left >= 8 ? 0xff : (__mmask8)((1u << left) - 1);
        __m512i u = _mm512_cvtepu32_epi64(_mm256_maskz_loadu_epi32(in, f + v * 8));
        __m512i e = _mm512_and_si512(_mm512_srli_epi64(u, 23), exp), m = _mm512_and_si512(u, sig);
        m = _mm512_mask_or_epi64(m, _mm512_test_epi64_mask(e, e), m, hidden);
        __m512i q = _mm512_mul_epu32(m, m);
        __m512i p = _mm512_add_epi64(_mm512_slli_epi64(_mm512_max_epu64(e, c1), 1), c50);
        __m512i r = _mm512_and_si512(p, c31), kk = _mm512_sub_epi64(c32, r);
        band[v] = _mm512_srli_epi64(p, 5);
        d[0][v] = _mm512_and_si512(_mm512_sllv_epi64(q, r), low32);
        d[1][v] = _mm512_and_si512(_mm512_srlv_epi64(q, kk), low32);
        d[2][v] = _mm512_srlv_epi64(q, _mm512_add_epi64(kk, c32)); /* a count of 64 gives 0 */
        live[v] = _mm512_test_epi64_mask(q, q);
        lo = _mm512_mask_min_epu64(lo, live[v], lo, band[v]);
        hi = _mm512_mask_max_epu64(hi, live[v], hi, band[v]);
    }
    uint64_t bmin = _mm512_reduce_min_epu64(lo), bmax = _mm512_reduce_max_epu64(hi);
    for (uint64_t b = bmin; b <= bmax; b++) {
        __m512i a0 = _mm512_loadu_si512(lane[b]), a1 = _mm512_loadu_si512(lane[b + 1]),
                a2 = _mm512_loadu_si512(lane[b + 2]), at = _mm512_set1_epi64((int64_t)b);
        for (int64_t v = 0; v * 8 < k; v++) {
            __mmask8 here = _mm512_mask_cmpeq_epu64_mask(live[v], band[v], at);
            a0 = _mm512_mask_add_epi64(a0, here, a0, d[0][v]);
            a1 = _mm512_mask_add_epi64(a1, here, a1, d[1][v]);
            a2 = _mm512_mask_add_epi64(a2, here, a2, d[2][v]);
        }
        _mm512_storeu_si512(lane[b], a0);
        _mm512_storeu_si512(lane[b + 1], a1);
        _mm512_storeu_si512(lane[b + 2], a2);
    }
}
#endif

void zs_xsq_add(struct zs_xsq *h, const float *f, int64_t n, uint64_t *sq)
{
#ifdef XFAST
    if (h->path == 2) {
        for (int64_t i0 = 0; i0 < n; i0 += 256) {
            int64_t k = n - i0 < 256 ? n - i0 : 256;
            if (h->rounds + (k + 7) / 8 > SQ_LANE_FLUSH)
                sq_flush(h, sq);
            h->rounds += (k + 7) / 8;
            sq_avx512(h->lane, f + i0, k);
        }
        return;
    }
#endif
    for (int64_t i0 = 0; i0 < n; i0 += 1024) {
        int64_t k = n - i0 < 1024 ? n - i0 : 1024, per = (k + ZS_XSQ_LANES - 1) / ZS_XSQ_LANES;
        if (h->rounds + per > SQ_FLUSH)
            sq_flush(h, sq);
        h->rounds += per; /* lane l takes elements l, l + LANES, ...: at most per of them */
        for (int64_t i = 0; i < k; i++) {
            uint32_t u;
            memcpy(&u, &f[i0 + i], sizeof(u));
            uint32_t e = (u >> 23) & 0xffu;
            uint64_t m = (u & 0x7fffffu) | (e ? 0x800000u : 0u), q = m * m; /* below 2^48 */
            uint64_t *s = h->bin[i % ZS_XSQ_LANES][e];
            s[0] += q;
            s[1] += q & h->mask[e][0];
            s[2] += q & h->mask[e][1];
        }
    }
}

void zs_xsq_end(struct zs_xsq *h, uint64_t *sq)
{
    sq_flush(h, sq);
}
