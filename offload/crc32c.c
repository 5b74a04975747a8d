/* crc32c.c - CRC32C (Castagnoli) for the swapper's per-block checksums: the SSE4.2 crc32 instruction
 * where the CPU has it, and a slice-by-8 table version that is both the fallback and the reference. */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "swap.h" /* defines: zs_crc32c, zs_crc32c_sw, zs_crc32c_hw */

#define CRC32C_POLY 0x82F63B78u /* 0x1EDC6F41 bit-reversed: the CRC runs LSB first, as the instruction does */

static uint32_t crc_table[8][256];
static bool crc_use_hw;
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;

        for (int k = 0; k < 8; k++)
            c = (c >> 1) ^ (CRC32C_POLY & (0u - (c & 1)));
        crc_table[0][i] = c;
    }
    /* table[k][i]: the CRC of byte i followed by k zero bytes, so eight bytes fold in one step */
    for (int k = 1; k < 8; k++)
        for (int i = 0; i < 256; i++)
            crc_table[k][i] = (crc_table[k - 1][i] >> 8) ^ crc_table[0][crc_table[k - 1][i] & 0xff];
#if defined(__x86_64__)
    __builtin_cpu_init(); /* a static library may run before libgcc's constructor has */
    crc_use_hw = __builtin_cpu_supports("sse4.2");
#endif
}

/* Raw (no pre/post inversion) slice-by-8 update. Bytes are assembled explicitly so the result does not
 * depend on host byte order or alignment. */
static uint32_t crc_update_sw(uint32_t crc, const unsigned char *p, size_t n)
{
    while (n >= 8) {
        crc ^= (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
        crc = crc_table[7][crc & 0xff] ^ crc_table[6][(crc >> 8) & 0xff] ^ crc_table[5][(crc >> 16) & 0xff] ^
              crc_table[4][crc >> 24] ^ crc_table[3][p[4]] ^ crc_table[2][p[5]] ^ crc_table[1][p[6]] ^
              crc_table[0][p[7]];
        p += 8;
        n -= 8;
    }
    while (n--)
        crc = (crc >> 8) ^ crc_table[0][(crc ^ *p++) & 0xff];
    return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) static uint32_t crc_update_hw(uint32_t crc, const unsigned char *p, size_t n)
{
    uint64_t c = crc;

    for (; n && ((uintptr_t)p & 7); n--)
        c = __builtin_ia32_crc32qi((uint32_t)c, *p++);
    for (; n >= 8; n -= 8, p += 8) {
        uint64_t v;

        memcpy(&v, p, 8); /* aligned here; memcpy keeps UBSan and strict aliasing quiet */
        c = __builtin_ia32_crc32di(c, v);
    }
    for (; n; n--)
        c = __builtin_ia32_crc32qi((uint32_t)c, *p++);
    return (uint32_t)c;
}
#endif

uint32_t zs_crc32c_sw(uint32_t crc, const void *buf, size_t bytes)
{
    pthread_once(&crc_once, crc_init);
    return ~crc_update_sw(~crc, buf, bytes);
}

bool zs_crc32c_hw(void)
{
    pthread_once(&crc_once, crc_init);
    return crc_use_hw;
}

uint32_t zs_crc32c(uint32_t crc, const void *buf, size_t bytes)
{
    pthread_once(&crc_once, crc_init);
#if defined(__x86_64__)
    if (crc_use_hw)
        return ~crc_update_hw(~crc, buf, bytes);
#endif
    return ~crc_update_sw(~crc, buf, bytes);
}
