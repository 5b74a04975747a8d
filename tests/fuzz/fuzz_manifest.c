/* fuzz_manifest.c - fuzzes the checkpoint manifest parser: any bytes are either refused with a message
 * that starts with the manifest's name, or accepted; an accepted manifest dumps to JSON that parses back
 * and dumps identically, and the reader's range lookups stay inside it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt_format.h" /* defines: zs_ckpt_manifest_parse, zs_ckpt_manifest_dump */
#include "fuzz.h"        /* defines: zs_fuzz_manifest */

#define WHAT "fuzz/manifest.json"

static void refused_properly(const char *err)
{
    if (strncmp(err, WHAT ": ", sizeof(WHAT) + 1) != 0 || strlen(err) <= sizeof(WHAT) + 1 || strchr(err, '\n')) {
        fprintf(stderr, "bad refusal message: '%s'\n", err);
        abort();
    }
}

/* Lookups over the segment index; the files do not exist, so each read stops at its first open. */
static void exercise_reader(const struct zs_ckpt_manifest *m)
{
    struct zs_ckpt_reader *r;
    char err[512];
    float v[4];

    if (zs_ckpt_reader_open(&r, m, "/nonexistent-zs-fuzz", err, sizeof(err)))
        return;
    for (int32_t u = 0; u < m->nunits && u < 8; u++)
        for (int k = 0; k < ZS_CKPT_NKINDS; k++) {
            int64_t n = m->units[u].numel;

            zs_ckpt_read_range(r, u, k, n / 2, n - n / 2 < 4 ? n - n / 2 : 4, v, err, sizeof(err));
            zs_ckpt_read_range(r, u, k, n, 1, v, err, sizeof(err)); /* past the end: refused */
        }
    zs_ckpt_reader_close(r);
}

int zs_fuzz_manifest(const uint8_t *data, size_t size)
{
    struct zs_ckpt_manifest m, again;
    char err[1024] = "";
    char *text, *text2;

    if (zs_ckpt_manifest_parse(&m, (const char *)data, size, WHAT, err, sizeof(err))) {
        refused_properly(err);
        return 0;
    }
    text = zs_ckpt_manifest_dump(&m);
    if (!text || zs_ckpt_manifest_parse(&again, text, strlen(text), WHAT, err, sizeof(err))) {
        fprintf(stderr, "an accepted manifest does not dump and parse back: %s\n", err);
        abort();
    }
    text2 = zs_ckpt_manifest_dump(&again);
    if (!text2 || strcmp(text, text2) != 0) {
        fprintf(stderr, "dump of the re-parsed manifest differs\n");
        abort();
    }
    exercise_reader(&m);
    free(text);
    free(text2);
    zs_ckpt_manifest_free(&again);
    zs_ckpt_manifest_free(&m);
    return 1;
}
