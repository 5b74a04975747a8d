/* test_gpt_mm16.c - the bf16 matrix products of zs-train-gpt (examples/gpt/mm16.c) against the scalar
 * reference, for every transpose pattern and shape kind the model uses (a linear layer's forward, its
 * input gradient and its accumulated weight gradient, the tied head's three products), at a width whose
 * sizes are not multiples of any SIMD block, plus a padded leading dimension; the same product twice gives
 * the same bits (run to run, same threads); fp32 -> bf16 rounding is bit-exact against a reference that
 * picks the nearer neighbour in double (ties to even).
 *
 * Tolerance: both sides multiply the same bf16 inputs, whose products are exact in fp32, so the only
 * difference is the fp32 summation order of the K terms (and of the accumulated C). The standard bound for
 * a K-term fp32 sum in any order is K * u * sum |a_ik * b_kj| with u = 2^-24; the test allows twice that
 * plus u * |C_old|. A wrong stride, transpose or dropped accumulation is off by O(|terms|). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mm16.h"

static uint64_t rng = 88172645463325252ull;

static double uniform(void) /* xorshift64, in [0, 1) */
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) * (1.0 / 9007199254740992.0);
}

static float bf(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;

    memcpy(&f, &u, 4);
    return f;
}

static uint16_t bf16_random(void)
{
    uint32_t u;
    float f = (float)(2 * uniform() - 1);

    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
}

static int failures;

/* C = op(A) @ op(B) + beta * C against the reference, inputs of stored shape [ar, ld] */
static void check_product(const char *what, bool ta, bool tb, int64_t M, int64_t N, int64_t K, int64_t pad,
                          float beta)
{
    int64_t lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
    int64_t arows = ta ? K : M, brows = tb ? N : K;
    uint16_t *A = malloc((size_t)(arows * lda) * 2), *B = malloc((size_t)(brows * ldb) * 2);
    float *C = malloc((size_t)(M * ldc) * 4), *R = malloc((size_t)(M * ldc) * 4), *C2 = malloc((size_t)(M * ldc) * 4);
    double worst = 0;
    int bad = 0;

    for (int64_t i = 0; i < arows * lda; i++)
        A[i] = bf16_random();
    for (int64_t i = 0; i < brows * ldb; i++)
        B[i] = bf16_random();
    for (int64_t i = 0; i < M * ldc; i++)
        C[i] = R[i] = C2[i] = (float)(2 * uniform() - 1);
    gpt_mm16(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc);
    gpt_mm16(ta, tb, M, N, K, A, lda, B, ldb, beta, C2, ldc);
    gpt_mm16_ref(ta, tb, M, N, K, A, lda, B, ldb, beta, R, ldc);
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double mag = 0, old = beta != 0 ? fabs((double)C2[i * ldc + j]) : 0;
            for (int64_t k = 0; k < K; k++)
                mag += fabs((double)bf(ta ? A[k * lda + i] : A[i * lda + k]) * bf(tb ? B[j * ldb + k] : B[k * ldb + j]));
            double tol = 2.0 * (double)K * 0x1p-24 * mag + 0x1p-24 * old + 1e-30;
            double err = fabs((double)C[i * ldc + j] - (double)R[i * ldc + j]);
            worst = fmax(worst, err / tol);
            bad += err > tol;
            bad += memcmp(&C[i * ldc + j], &C2[i * ldc + j], 4) != 0;
        }
    printf("%-34s ta %d tb %d M %3lld N %3lld K %3lld ld+%lld beta %g: worst error / tolerance %.3f%s\n", what, ta, tb,
           (long long)M, (long long)N, (long long)K, (long long)pad, beta, worst, bad ? "  FAIL" : "");
    failures += bad > 0;
    free(A);
    free(B);
    free(C);
    free(C2);
    free(R);
}

/* the nearer bf16 of f in double, ties to the even pattern; NaN any quiet NaN */
static uint16_t round_ref(float f)
{
    uint32_t u;

    memcpy(&u, &f, 4);
    if (isnan(f))
        return 0x7fc0;
    uint16_t lo = (uint16_t)(u >> 16), hi = (uint16_t)(lo + 1);
    if ((u & 0xffff) == 0)
        return lo;
    /* past the largest finite bf16 the upper neighbour is infinity, which rounding treats as 2^128 */
    double up = (hi & 0x7fff) == 0x7f80 ? (f < 0 ? -0x1p128 : 0x1p128) : (double)bf(hi);
    double dl = fabs((double)f - (double)bf(lo)), dh = fabs((double)f - up);
    if (dl != dh)
        return dl < dh ? lo : hi;
    return (lo & 1) ? hi : lo;
}

static void check_rounding(void)
{
    enum { n = 1 << 16 };
    static float src[n];
    static uint16_t got[n];
    int bad = 0;

    for (int i = 0; i < n; i++) {
        uint32_t u = (uint32_t)(uniform() * 4294967296.0);
        if (i < 4096) /* ties and near-ties: low half 0x8000 +- 1 */
            u = (u & 0xffff0000u) | (uint32_t)(0x7fff + i % 3);
        memcpy(&src[i], &u, 4);
    }
    src[0] = INFINITY, src[1] = -INFINITY, src[2] = NAN, src[3] = 0x1.fffffep127f, src[4] = -0.0f, src[5] = 1e-40f;
    gpt_f32_to_bf16(got, src, n);
    for (int i = 0; i < n; i++) {
        uint16_t want = round_ref(src[i]);
        bool ok = isnan(src[i]) ? isnan(bf(got[i])) : got[i] == want;
        if (!ok && bad++ < 5)
            printf("round %a: got 0x%04x want 0x%04x\n", (double)src[i], got[i], want);
    }
    printf("fp32 -> bf16 rounding, %d values (ties, overflow, NaN, subnormal): %d wrong%s\n", n, bad, bad ? "  FAIL" : "");
    failures += bad > 0;
}

int main(void)
{
    const char *why;
    bool native = gpt_mm16_available(&why);
    /* C = 40 (not a multiple of 16 or 32), rows N = 2 sequences of 19, vocabulary 256 */
    const int64_t C = 40, R = 38, V = 256;
    const int64_t lin[4][2] = {{C, 3 * C}, {C, C}, {C, 4 * C}, {4 * C, C}}; /* (in, out) of the block's linears */

    printf("backend: %s (%s)\n", native ? "oneDNN" : "widened sgemm", why);
    check_rounding();
    for (int i = 0; i < 4; i++) {
        int64_t in = lin[i][0], out = lin[i][1];
        check_product("linear forward y = x W", false, false, R, out, in, 0, 0);
        check_product("linear backward dx = dy W^T", false, true, R, in, out, 0, 0);
        check_product("linear backward dW += x^T dy", true, false, in, out, R, 0, 1);
    }
    check_product("head logits = x wte^T", false, true, R, V, C, 0, 0);
    check_product("head backward dx = dlogits wte", false, false, R, C, V, 0, 0);
    check_product("head backward dwte += dlogits^T x", true, false, V, C, R, 0, 1);
    check_product("strided (leading dimension + 3)", true, true, 17, 23, 29, 3, 1);
    check_product("larger (bench-sized rows)", false, false, 512, 3 * 64, 64, 0, 0);
    gpt_mm16_free();
    printf("%s\n", failures ? "FAIL" : "PASS");
    return failures ? 1 : 0;
}
