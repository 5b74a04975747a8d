/* exact_local.h - the deterministic sum's local passes that have fast loops beside their reference (the fold
 * of the counters, the norm's exact squares), apart from sharding/exact.c so that tests can hold them equal. */
#ifndef ZS_EXACT_LOCAL_H
#define ZS_EXACT_LOCAL_H

#include <stdint.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define XFAST 1
/* Loops where every lane has its own shift count, table index or selection (AVX-512); gcc's -O2 cost model
 * would leave them scalar. */
#ifdef __clang__
#define XFAST_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
#else
#define XFAST_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq"), optimize("vect-cost-model=dynamic")))
#endif
#endif

#define ZS_XSQ_BIAS 350 /* the norm's bands: bit 0 is 2^-350 */
#define ZS_XSQ_LANES 4  /* histogram copies used in turn, so that equal exponents do not wait on each other */
#define ZS_XSQ_BANDS 22 /* the bands a square's pieces reach (ZS_EXACT_SQ_BANDS) */

/* The norm's squares, binned by fp32 exponent: per lane and biased exponent e, the sums of m^2 (m the
 * 24-bit significand), of its part below the bands' first cut, and of its part below the second. */
struct zs_xsq {
    uint64_t bin[ZS_XSQ_LANES][256][3];
    uint64_t mask[256][2]; /* the two cuts of exponent e's m^2 */
    uint64_t lane[ZS_XSQ_BANDS][8]; /* AVX-512: each band's pieces summed per vector lane instead */
    int64_t rounds;        /* adds per lane since the bins or lanes were last emptied */
    int path;              /* 2: the lanes, else the bins */
};

/* The loops a process runs: 0 the references, 1 the plain loops, 2 AVX-512 where the CPU has it;
 * ZS_EXACT_PATH=scalar or plain forces 0 or 1. */
int zs_exact_path(void);

/* Folds n elements' counters (3 int32 each, aligned to the tops in top) into one int64 each, in place,
 * aligned to the agreed tops. */
void zs_exact_fold(int32_t *acc, const int8_t *top, const int8_t *agreed, int64_t n, int path);

/* The reference: adds the 32-bit pieces of f^2 2^350 to the bands c. */
void zs_xsq_add_ref(uint64_t *c, float f);

/* The fast loops: start (path 2 AVX-512, else the plain histogram), add any number of values, end (what
 * they hold moved into the bands sq, which then hold what zs_xsq_add_ref of every value would have added,
 * modulo 2^64 as those do). */
void zs_xsq_start(struct zs_xsq *h, int path);
void zs_xsq_add(struct zs_xsq *h, const float *f, int64_t n, uint64_t *sq);
void zs_xsq_end(struct zs_xsq *h, uint64_t *sq);

#endif
