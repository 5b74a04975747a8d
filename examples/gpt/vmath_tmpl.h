/* vmath_tmpl.h - the body of vmath.h's functions, written once; vmath.c includes it twice, for the baseline
 * ISA and under an AVX512 target pragma, with VM_SUF naming the copy. No include guard on purpose. Every
 * helper is inlined into its caller, so each copy is compiled wholly for its own ISA. */

#define VM_INL static inline __attribute__((always_inline))

/* ---------------------------------------------------------------- 16 lanes: load, store, fold */

/* n (<= 16) elements of p, the other lanes fill */
VM_INL vf VM_SUF(load_part)(const float *p, int64_t n, float fill)
{
    float t[VN];

    if (n == VN)
        return vload(p);
    for (int i = 0; i < VN; i++)
        t[i] = i < n ? p[i] : fill;
    return vload(t);
}

VM_INL void VM_SUF(store_part)(float *p, vf x, int64_t n)
{
    float t[VN];

    if (n == VN) {
        vstore(p, x);
        return;
    }
    memcpy(t, &x, sizeof(t));
    memcpy(p, t, (size_t)n * sizeof(float));
}

/* lane 0 + lane 1 + ... + lane 15, left to right */
VM_INL float VM_SUF(fold_sum)(vf x)
{
    float s = x[0];

    for (int i = 1; i < VN; i++)
        s += x[i];
    return s;
}

VM_INL float VM_SUF(fold_max)(vf x)
{
    float m = x[0];

    for (int i = 1; i < VN; i++)
        m = x[i] > m ? x[i] : m;
    return m;
}

/* ---------------------------------------------------------------- exp */

/* exp(x) = 2^n e^r, n = round(x / ln 2), r = x - n ln 2 in [-ln2/2, ln2/2] (ln 2 split in two so n ln2_hi
 * is exact), e^r by its Taylor polynomial to r^7 (truncation below 1e-8 relative). n comes from the bits
 * of x / ln 2 + 1.5 * 2^23, which rounds to the nearest integer, with no float-to-int conversion. */
VM_INL vf VM_SUF(vexp)(vf x)
{
    const float magic = 12582912.0f; /* 1.5 * 2^23 */
    vi under = x < -87.33654f;       /* below ln(2^-126): 0 */
    x = vsel(x > 88.0f, splat(88.0f), x);
    x = vsel(under, splat(0.0f), x);
    vf t = x * 1.44269504f + magic;
    vf n = t - magic;
    vu e = ((vu)t - (vu)splat(magic) + 127u) << 23;
    vf r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    vf p = splat(1.0f / 5040);
    p = p * r + 1.0f / 720;
    p = p * r + 1.0f / 120;
    p = p * r + 1.0f / 24;
    p = p * r + 1.0f / 6;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    return vsel(under, splat(0.0f), p * (vf)e);
}

static void VM_SUF(exp_array)(float *y, const float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i += VN) {
        int64_t k = n - i < VN ? n - i : VN;
        VM_SUF(store_part)(y + i, VM_SUF(vexp)(VM_SUF(load_part)(x + i, k, 0)), k);
    }
}

/* ---------------------------------------------------------------- GELU, tanh form */

/* e = exp(-2u), u = k (x + 0.044715 x^3): 0.5 (1 + tanh u) = 1 / (1 + e), which loses nothing to
 * cancellation on either side, and 1 - tanh^2 u = 4 s (1 - s) with 1 - s = e s. */
VM_INL vf VM_SUF(gelu_e)(vf v)
{
    vf u = (v + (v * v * v) * 0.044715f) * 0.7978845608f;
    return VM_SUF(vexp)(u * -2.0f);
}

VM_INL vf VM_SUF(gelu1)(vf v)
{
    return v / (VM_SUF(gelu_e)(v) + 1.0f);
}

VM_INL vf VM_SUF(dgelu1)(vf d, vf v)
{
    vf e = VM_SUF(gelu_e)(v), s = 1.0f / (e + 1.0f);
    vf k = ((v * v) * 0.134145f + 1.0f) * 0.7978845608f; /* du/dv */
    return d * (s + (v * 2.0f) * (s * (e * s)) * k);
}

static void VM_SUF(gelu_forward)(float *y, const float *x, int64_t n)
{
    VM_CHUNKS(n, i, k)
        VM_SUF(store_part)(y + i, VM_SUF(gelu1)(VM_SUF(load_part)(x + i, k, 0)), k);
}

static void VM_SUF(gelu_backward)(float *d, const float *x, int64_t n)
{
    VM_CHUNKS(n, i, k)
        VM_SUF(store_part)(d + i, VM_SUF(dgelu1)(VM_SUF(load_part)(d + i, k, 0), VM_SUF(load_part)(x + i, k, 0)), k);
}

/* ---------------------------------------------------------------- rows: softmax and cross-entropy */

/* the lanes of a row's i-th vector: 16, or what is left */
#define VM_LEFT(n, i) ((n) - (i) < VN ? (n) - (i) : VN)

/* the row's maximum; tail lanes -inf */
VM_INL float VM_SUF(row_max)(const float *a, int64_t n)
{
    vf m = splat(-INFINITY);

    for (int64_t i = 0; i < n; i += VN)
        m = vmax(m, VM_SUF(load_part)(a + i, VM_LEFT(n, i), -INFINITY));
    return VM_SUF(fold_max)(m);
}

/* sum of exp(a - mx) over the row (tail lanes exp(-inf) = 0), each exp written to out unless out is NULL */
VM_INL float VM_SUF(row_expsum)(float *out, const float *a, int64_t n, float mx)
{
    vf s = splat(0.0f);

    for (int64_t i = 0; i < n; i += VN) {
        vf e = VM_SUF(vexp)(VM_SUF(load_part)(a + i, VM_LEFT(n, i), -INFINITY) - mx);
        s += e;
        if (out)
            VM_SUF(store_part)(out + i, e, VM_LEFT(n, i));
    }
    return VM_SUF(fold_sum)(s);
}

/* a[0..n) = a / div * f */
VM_INL void VM_SUF(row_scale)(float *a, int64_t n, float div, float f)
{
    for (int64_t i = 0; i < n; i += VN)
        VM_SUF(store_part)(a + i, VM_SUF(load_part)(a + i, VM_LEFT(n, i), 0) / div * f, VM_LEFT(n, i));
}

static void VM_SUF(softmax_causal)(float *a, int64_t n, int64_t len)
{
    float mx = VM_SUF(row_max)(a, n);

    VM_SUF(row_scale)(a, n, VM_SUF(row_expsum)(a, a, n, mx), 1.0f);
    memset(a + n, 0, (size_t)(len - n) * sizeof(float));
}

static void VM_SUF(softmax_backward)(float *d, const float *p, int64_t n, int64_t len, float scale)
{
    vf acc = splat(0.0f);

    for (int64_t i = 0; i < n; i += VN)
        acc += VM_SUF(load_part)(p + i, VM_LEFT(n, i), 0) * VM_SUF(load_part)(d + i, VM_LEFT(n, i), 0);
    float dot = VM_SUF(fold_sum)(acc);
    for (int64_t i = 0; i < n; i += VN) {
        vf pi = VM_SUF(load_part)(p + i, VM_LEFT(n, i), 0), di = VM_SUF(load_part)(d + i, VM_LEFT(n, i), 0);
        VM_SUF(store_part)(d + i, pi * (di - dot) * scale, VM_LEFT(n, i));
    }
    memset(d + n, 0, (size_t)(len - n) * sizeof(float));
}

static double VM_SUF(xent)(float *z, int64_t n, int32_t target, float f)
{
    float mx = VM_SUF(row_max)(z, n), zt = z[target];
    float sum = VM_SUF(row_expsum)(f != 0 ? z : NULL, z, n, mx);
    double loss = (double)(logf(sum) + mx - zt);

    if (f != 0) {
        VM_SUF(row_scale)(z, n, sum, f);
        z[target] -= f;
    }
    return loss;
}

#undef VM_LEFT

/* ---------------------------------------------------------------- bf16 (integer rounding: exact, path-free) */

/* nearest, ties to even; NaN stays a (quiet) NaN: as mm16.c's f32_to_bf16 */
VM_INL vh VM_SUF(bf16_round)(vf x)
{
    vu u = (vu)x;
    vi nan = (vi)((u & 0x7fffffffu) > 0x7f800000u);
    vu r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, q = (u >> 16) | 0x40u;
    return __builtin_convertvector((vu)(((vi)q & nan) | ((vi)r & ~nan)), vh);
}

VM_INL vf VM_SUF(bf16_widen)(vh h)
{
    return (vf)(__builtin_convertvector(h, vu) << 16);
}

VM_INL vh VM_SUF(hload_part)(const uint16_t *p, int64_t n)
{
    uint16_t t[VN] = {0};

    if (n == VN)
        return hload(p);
    memcpy(t, p, (size_t)n * sizeof(uint16_t));
    return hload(t);
}

VM_INL void VM_SUF(hstore_part)(uint16_t *p, vh x, int64_t n)
{
    uint16_t t[VN];

    if (n == VN) {
        hstore(p, x);
        return;
    }
    memcpy(t, &x, sizeof(t));
    memcpy(p, t, (size_t)n * sizeof(uint16_t));
}

static void VM_SUF(to_bf16)(uint16_t *dst, const float *src, int64_t n)
{
    VM_CHUNKS(n, i, k)
        VM_SUF(hstore_part)(dst + i, VM_SUF(bf16_round)(VM_SUF(load_part)(src + i, k, 0)), k);
}

static void VM_SUF(from_bf16)(float *dst, const uint16_t *src, int64_t n)
{
    VM_CHUNKS(n, i, k)
        VM_SUF(store_part)(dst + i, VM_SUF(bf16_widen)(VM_SUF(hload_part)(src + i, k)), k);
}

static void VM_SUF(add_bf16)(uint16_t *h, const float *g, int64_t n)
{
    VM_CHUNKS(n, i, k) {
        vf sum = VM_SUF(bf16_widen)(VM_SUF(hload_part)(h + i, k)) + VM_SUF(load_part)(g + i, k, 0);
        VM_SUF(hstore_part)(h + i, VM_SUF(bf16_round)(sum), k);
    }
}

/* GELU fused with the rounding of its result for the next bf16 matrix product (one pass, not two) */
static void VM_SUF(gelu_forward16)(uint16_t *h, const float *x, int64_t n)
{
    VM_CHUNKS(n, i, k)
        VM_SUF(hstore_part)(h + i, VM_SUF(bf16_round)(VM_SUF(gelu1)(VM_SUF(load_part)(x + i, k, 0))), k);
}

static void VM_SUF(gelu_backward16)(float *d, uint16_t *h, const float *x, int64_t n)
{
    VM_CHUNKS(n, i, k) {
        vf r = VM_SUF(dgelu1)(VM_SUF(load_part)(d + i, k, 0), VM_SUF(load_part)(x + i, k, 0));
        VM_SUF(store_part)(d + i, r, k);
        VM_SUF(hstore_part)(h + i, VM_SUF(bf16_round)(r), k);
    }
}

static const struct gpt_vmath VM_SUF(ops) = {
    .exp = VM_SUF(exp_array),
    .gelu_forward = VM_SUF(gelu_forward),
    .gelu_backward = VM_SUF(gelu_backward),
    .gelu_forward16 = VM_SUF(gelu_forward16),
    .gelu_backward16 = VM_SUF(gelu_backward16),
    .softmax_causal = VM_SUF(softmax_causal),
    .softmax_backward = VM_SUF(softmax_backward),
    .xent = VM_SUF(xent),
    .to_bf16 = VM_SUF(to_bf16),
    .from_bf16 = VM_SUF(from_bf16),
    .add_bf16 = VM_SUF(add_bf16),
};

#undef VM_INL
