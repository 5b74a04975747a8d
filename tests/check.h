/* check.h - the few helpers every ZeroShard test shares: CHECK prints the failing line and counts it,
 * and the summary line "N passed, M failed" is what CI reads. */
#ifndef ZS_TEST_CHECK_H
#define ZS_TEST_CHECK_H

#include <stdio.h>

static int zs_test_pass, zs_test_fail;

#define CHECK(cond, ...)                                                                        \
    do {                                                                                        \
        if (cond) {                                                                             \
            zs_test_pass++;                                                                     \
        } else {                                                                                \
            zs_test_fail++;                                                                     \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                     \
            fprintf(stderr, __VA_ARGS__);                                                       \
            fputc('\n', stderr);                                                                \
        }                                                                                       \
    } while (0)

/* One named case: "ok - name", or "FAIL - name: why" when why is set. */
static inline void zs_test_report(const char *name, const char *why)
{
    if (why) {
        printf("FAIL - %s: %s\n", name, why);
        zs_test_fail++;
    } else {
        printf("ok - %s\n", name);
        zs_test_pass++;
    }
    fflush(stdout);
}

static inline int zs_test_summary(const char *name)
{
    printf("%s: %d passed, %d failed\n", name, zs_test_pass, zs_test_fail);
    return zs_test_fail ? 1 : 0;
}

#endif /* ZS_TEST_CHECK_H */
