/* test_crc32c.c - the CRC32C that guards swapped blocks and checkpoint files (offload/crc32c.c): the
 * SSE4.2 instruction path and the table path against a bitwise reference, at every alignment. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "check.h"        /* defines: zs_test_report and the pass/fail counters */
#include "offload/swap.h" /* defines: zs_crc32c, zs_crc32c_sw, zs_crc32c_hw */
#include "swap_fixture.h" /* defines: why, fill_random, MiB */

static uint32_t crc_bitwise(uint32_t crc, const unsigned char *p, size_t n)
{
    crc = ~crc;
    while (n--) {
        crc ^= *p++;
        for (int k = 0; k < 8; k++)
            crc = crc & 1 ? (crc >> 1) ^ 0x82F63B78u : crc >> 1;
    }
    return ~crc;
}

static const char *test_crc_known(void)
{
    const char *s = "123456789";

    if (zs_crc32c(0, s, 9) != 0xE3069283u || zs_crc32c_sw(0, s, 9) != 0xE3069283u)
        return why("got %08x (fast) / %08x (table)", zs_crc32c(0, s, 9), zs_crc32c_sw(0, s, 9));
    if (zs_crc32c(zs_crc32c(0, s, 4), s + 4, 5) != 0xE3069283u)
        return "continuing from a partial CRC gives a different answer";
    if (zs_crc32c(0, s, 0) != 0 || crc_bitwise(0, (const unsigned char *)s, 9) != 0xE3069283u)
        return "empty input or bitwise reference wrong";
    return NULL;
}

static const char *test_crc_fast_vs_table(void)
{
    static const size_t lens[] = {0, 1, 7, 8, 9, 63, 64, 65, 4095, 4096, 4097, 100000};
    size_t n = MiB + 64;
    unsigned char *buf = malloc(n);
    const char *w = NULL;

    if (!buf)
        return "out of memory";
    fill_random(buf, n);
    for (size_t a = 0; a < 8 && !w; a++)
        for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]) && !w; i++) {
            uint32_t ref = crc_bitwise(0x1234u, buf + a, lens[i]);

            if (zs_crc32c(0x1234u, buf + a, lens[i]) != ref || zs_crc32c_sw(0x1234u, buf + a, lens[i]) != ref)
                w = why("offset %zu length %zu: fast %08x table %08x bitwise %08x", a, lens[i],
                        zs_crc32c(0x1234u, buf + a, lens[i]), zs_crc32c_sw(0x1234u, buf + a, lens[i]), ref);
        }
    if (!w && zs_crc32c(0, buf + 3, MiB) != zs_crc32c_sw(0, buf + 3, MiB))
        w = "1 MiB: instruction and table disagree";
    free(buf);
    printf("# crc32c: %s\n", zs_crc32c_hw() ? "SSE4.2 instruction" : "table (no SSE4.2)");
    return w;
}

int main(void)
{
    zs_test_report("crc32c known answer and continuation", test_crc_known());
    zs_test_report("crc32c instruction equals table equals bitwise", test_crc_fast_vs_table());
    printf("%d passed, %d failed\n", zs_test_pass, zs_test_fail);
    return zs_test_fail ? 1 : 0;
}
