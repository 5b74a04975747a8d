/* optim_dispatch.c - picks the optimizer kernel for a path, optimizer and dtype pair, detects which
 * paths the CPU runs, and names things for logs, the environment and the benchmark. */
#include <errno.h>
#include <string.h>

#include "convert.h"
#include "optim.h"

void zs_optim_table_scalar(zs_optim_fn tab[ZS_KOPT_COUNT][3][3]);
void zs_optim_table_avx2(zs_optim_fn tab[ZS_KOPT_COUNT][3][3]);
void zs_optim_table_avx512(zs_optim_fn tab[ZS_KOPT_COUNT][3][3]);

static const char *const path_names[ZS_KPATH_COUNT] = { "scalar", "avx2", "avx512" };
static const char *const opt_names[ZS_KOPT_COUNT] = { "adam", "adamw", "sgd", "lion", "adagrad" };

bool zs_kpath_supported(enum zs_kpath path)
{
    __builtin_cpu_init();
    switch (path) {
    case ZS_KPATH_SCALAR:
        return true;
    case ZS_KPATH_AVX2:
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case ZS_KPATH_AVX512:
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl");
    case ZS_KPATH_COUNT:
        break;
    }
    return false;
}

enum zs_kpath zs_kpath_best(void)
{
    if (zs_kpath_supported(ZS_KPATH_AVX512))
        return ZS_KPATH_AVX512;
    return zs_kpath_supported(ZS_KPATH_AVX2) ? ZS_KPATH_AVX2 : ZS_KPATH_SCALAR;
}

const char *zs_kpath_name(enum zs_kpath path)
{
    return path < ZS_KPATH_COUNT ? path_names[path] : "?";
}

int zs_kpath_parse(const char *name, enum zs_kpath *path)
{
    if (!strcmp(name, "auto")) {
        *path = zs_kpath_best();
        return 0;
    }
    for (int p = 0; p < ZS_KPATH_COUNT; p++) {
        if (strcmp(name, path_names[p]))
            continue;
        if (!zs_kpath_supported((enum zs_kpath)p))
            return -ENOTSUP;
        *path = (enum zs_kpath)p;
        return 0;
    }
    return -EINVAL;
}

const char *zs_kopt_name(enum zs_kopt opt)
{
    return opt < ZS_KOPT_COUNT ? opt_names[opt] : "?";
}

const char *zs_dtype_name(zs_dtype t)
{
    return t == ZS_DTYPE_BF16 ? "bf16" : t == ZS_DTYPE_FP16 ? "fp16" : "fp32";
}

zs_optim_fn zs_optim_kernel(enum zs_kpath path, enum zs_kopt opt, zs_dtype pdt, zs_dtype gdt)
{
    static zs_optim_fn tab[ZS_KPATH_COUNT][ZS_KOPT_COUNT][3][3];
    static int filled;

    if (!filled) { /* idempotent: a racing second fill writes the same pointers */
        zs_optim_table_scalar(tab[ZS_KPATH_SCALAR]);
        zs_optim_table_avx2(tab[ZS_KPATH_AVX2]);
        zs_optim_table_avx512(tab[ZS_KPATH_AVX512]);
        __atomic_store_n(&filled, 1, __ATOMIC_RELEASE);
    }
    if (path >= ZS_KPATH_COUNT || opt >= ZS_KOPT_COUNT || (unsigned)pdt > 2 || (unsigned)gdt > 2 ||
        !zs_kpath_supported(path))
        return NULL;
    return tab[path][opt][pdt][gdt];
}

int zs_optim_bytes_per_param(enum zs_kopt opt, zs_dtype pdt, zs_dtype gdt, bool momentum)
{
    int states = opt == ZS_KOPT_ADAM || opt == ZS_KOPT_ADAMW ? 2 : (opt == ZS_KOPT_SGD && !momentum) ? 0 : 1;
    int param = pdt == ZS_DTYPE_FP32 ? 8 : 8 + 2; /* fp32 read+write, or master read+write and a 16-bit write */
    int grad = gdt == ZS_DTYPE_FP32 ? 4 : 2;

    return param + grad + 8 * states;
}

uint16_t zs_f32_to_bf16(float f) { return zs_cvt_f32_bf16(f); }
float zs_bf16_to_f32(uint16_t h) { return zs_cvt_bf16_f32(h); }
uint16_t zs_f32_to_f16(float f) { return zs_cvt_f32_f16(f); }
float zs_f16_to_f32(uint16_t h) { return zs_cvt_f16_f32(h); }

double zs_sumsq_ref(const float *x, int64_t n)
{
    double acc = 0.0;

    for (int64_t i = 0; i < n; i++)
        acc += (double)x[i] * (double)x[i];
    return acc;
}
