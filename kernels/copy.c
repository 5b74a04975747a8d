/* copy.c - streaming copies for the collectives' large local transfers. */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "copy.h"

__attribute__((target("avx2"))) static void copy_nt_avx2(char *dst, const char *src, size_t bytes)
{
    size_t head = (32 - ((uintptr_t)dst & 31)) & 31, i;

    if (bytes < head + 32) {
        memcpy(dst, src, bytes);
        return;
    }
    memcpy(dst, src, head);
    dst += head;
    src += head;
    bytes -= head;
    for (i = 0; i + 32 <= bytes; i += 32)
        _mm256_stream_si256((__m256i *)(dst + i), _mm256_loadu_si256((const __m256i *)(src + i)));
    memcpy(dst + i, src + i, bytes - i);
    _mm_sfence(); /* streaming stores are weakly ordered: finish them before anyone is told */
}

static int have_avx2(void)
{
    static int avx2 = -1;

    if (avx2 < 0) {
        __builtin_cpu_init();
        avx2 = __builtin_cpu_supports("avx2");
    }
    return avx2;
}

void zs_copy_stream(void *dst, const void *src, size_t bytes)
{
    if (bytes >= ZS_STREAM_MIN_BYTES && have_avx2())
        copy_nt_avx2(dst, src, bytes);
    else
        memcpy(dst, src, bytes);
}
