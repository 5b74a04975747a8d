/* fuzz_safetensors.c - fuzzes the safetensors reader on whole file images: any bytes are either refused
 * with a message naming the file, or accepted with tensors that tile the data exactly, can be found by
 * name, and read as fp32 where their dtype allows. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"         /* defines: zs_fuzz_safetensors */
#include "ckpt/safetensors.h"  /* defines: zs_st_open_mem, zs_st_read_f32 */

#define WHAT "fuzz.safetensors"

static void fail(const char *why)
{
    fprintf(stderr, "%s\n", why);
    abort();
}

static void check_tensor(struct zs_st *st, const struct zs_st_tensor *t, uint64_t *at)
{
    float v[64];
    char err[512];
    int64_t n = t->numel < 64 ? t->numel : 64;
    bool readable = t->dtype == ZS_ST_F32 || t->dtype == ZS_ST_F16 || t->dtype == ZS_ST_BF16;

    if (t->offset != *at || t->nbytes != (uint64_t)t->numel * (uint64_t)zs_st_dtype_size(t->dtype))
        fail("accepted tensors do not tile the data");
    *at += t->nbytes;
    if (zs_st_find(st, t->name) != t)
        fail("a tensor is not found by its name");
    if ((zs_st_read_f32(st, t, 0, n, v, err, sizeof(err)) == 0) != readable ||
        (zs_st_read_f32(st, t, t->numel - n, n, v, err, sizeof(err)) == 0) != readable)
        fail("fp32 read of an accepted tensor");
    if (zs_st_read_f32(st, t, t->numel, 1, v, err, sizeof(err)) == 0)
        fail("a read past the end was accepted");
}

int zs_fuzz_safetensors(const uint8_t *data, size_t size)
{
    struct zs_st *st;
    char err[1024] = "";
    const char *key;
    uint64_t at = 0;

    if (zs_st_open_mem(&st, data, size, WHAT, err, sizeof(err))) {
        if (strncmp(err, WHAT ": ", sizeof(WHAT) + 1) != 0 || strchr(err, '\n'))
            fail(err);
        return 0;
    }
    for (int i = 7; i >= 0; i--) /* the data start right after the header */
        at = at << 8 | data[i];
    at += 8;
    for (int i = 0; i < zs_st_count(st); i++)
        check_tensor(st, zs_st_get(st, i), &at);
    if (at != size)
        fail("accepted tensors do not reach the end of the file");
    for (int i = 0; i < zs_st_meta_count(st); i++)
        if (!zs_st_meta_get(st, i, &key) || zs_st_meta_find(st, key) == NULL)
            fail("metadata lookup");
    zs_st_close(st);
    return 1;
}
