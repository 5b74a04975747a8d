/* blascore.c - Debian's OpenBLAS (DYNAMIC_ARCH) picks its kernels by the cpuid model when it loads, and on
 * a model newer than the build knows (these machines' Xeons, family 6 model 207, under OpenBLAS 0.3.21) it
 * falls back to "Prescott", SSE3, whose sgemm runs several times slower than the CPU's AVX512 one. It reads
 * OPENBLAS_CORETYPE at load time, before main: hence a second start with it set. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cblas.h>  /* defines: openblas_get_corename */

#include "blascore.h"

/* OpenBLAS's name for the newest kernel set this CPU runs, or NULL */
static const char *core_for_cpu(void)
{
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512cd"))
        return __builtin_cpu_supports("avx512bf16") ? "Cooperlake" : "SkylakeX";
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return "Haswell";
    return NULL;
}

void gpt_blas_fix_core(char **argv)
{
    const char *core;

    if (getenv("OPENBLAS_CORETYPE") || strcmp(openblas_get_corename(), "Prescott") || !(core = core_for_cpu()))
        return;
    if (setenv("OPENBLAS_CORETYPE", core, 1))
        return;
    execv("/proc/self/exe", argv);
    fprintf(stderr, "zs-train-gpt: could not start again with OPENBLAS_CORETYPE=%s; OpenBLAS keeps its Prescott "
            "kernels\n", core);
    unsetenv("OPENBLAS_CORETYPE");
}

const char *gpt_blas_core(void)
{
    return openblas_get_corename();
}
