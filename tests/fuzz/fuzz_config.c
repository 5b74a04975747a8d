/* fuzz_config.c - fuzzes the DeepSpeed-style config reader: any bytes are either refused with a one-line
 * message, or accepted into a config whose batch sizes multiply out and whose stage and dtypes are in
 * range; the same text read twice gives the same struct (the engine hashes it across ranks). The world
 * size (1-4) comes from the input's length, so batch-size arithmetic meets every one. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/config.h" /* defines: zs_config_parse, struct zs_config */
#include "fuzz.h"   /* defines: zs_fuzz_config */

static void broken(const char *what, const char *detail)
{
    fprintf(stderr, "config reader: %s: %s\n", what, detail);
    abort();
}

int zs_fuzz_config(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1), err[1024], err2[1024];
    struct zs_config *a = malloc(sizeof(*a)), *b = malloc(sizeof(*b));
    int world = (int)(size % 4) + 1, rc, rc2, ok = 0;

    if (!text || !a || !b)
        goto out;
    memcpy(text, data, size);
    text[size] = '\0'; /* the reader takes a C string: an embedded NUL ends the text there */
    rc = zs_config_parse(a, text, "fuzz.json", world, NULL, err, sizeof(err));
    rc2 = zs_config_parse(b, text, "fuzz.json", world, NULL, err2, sizeof(err2));
    if (rc != rc2 || (rc && strcmp(err, err2)))
        broken("two reads of one text disagree", err);
    if (rc) {
        if (rc != -EINVAL || !err[0] || strchr(err, '\n'))
            broken("a refusal without a one-line message", err);
        goto out;
    }
    if (memcmp(a, b, sizeof(*a)))
        broken("two reads of one text give different structs", text);
    if (a->zero.stage < 0 || a->zero.stage > 3)
        broken("stage out of range", text);
    if (a->micro_batch_size < 1 || a->grad_accum_steps < 1 ||
        a->train_batch_size != a->micro_batch_size * a->grad_accum_steps * (int64_t)world)
        broken("batch sizes do not multiply out", text);
    ok = 1;
out:
    free(text);
    free(a);
    free(b);
    return ok;
}
