/* ckpt_dump.c - serialises a checkpoint manifest to the JSON that ckpt_format.c parses, members in the
 * documented order, 64-bit integers exact and doubles round-trippable (jansson prints 17 digits). */
#include <stdbool.h>
#include <stdio.h>

#include <jansson.h>       /* defines: json_object, json_dumps */

#include "ckpt_format.h"   /* defines: struct zs_ckpt_manifest */
#include "ckpt_format_impl.h" /* defines: zs_ckpt_groups_dump, zs_ckpt_param_group_dump */

/* json_object_set_new that remembers a failure, so a dump is built without a check per member. */
static void put(json_t *obj, const char *key, json_t *v, bool *bad)
{
    if (!v || json_object_set_new(obj, key, v))
        *bad = true;
}

static void append(json_t *arr, json_t *v, bool *bad)
{
    if (!v || json_array_append_new(arr, v))
        *bad = true;
}

static json_t *dump_scaler(const struct zs_ckpt_scaler *s, bool *bad)
{
    json_t *o = json_object();

    put(o, "scale", json_real(s->scale), bad);
    put(o, "skipped_steps", json_integer(s->skipped_steps), bad);
    put(o, "hysteresis", json_integer(s->hysteresis), bad);
    put(o, "last_overflow", json_integer(s->last_overflow), bad);
    put(o, "iter", json_integer(s->iter), bad);
    return o;
}

static json_t *dump_units(const struct zs_ckpt_manifest *m, bool *bad)
{
    json_t *units = json_array();

    for (int32_t i = 0; i < m->nunits; i++) {
        const struct zs_ckpt_unit *u = &m->units[i];
        json_t *o = json_object(), *params = json_array();

        for (int32_t j = 0; j < u->nparams; j++) {
            const struct zs_ckpt_param *q = &m->params[u->first_param + j];
            json_t *po = json_object(), *shape = json_array();

            for (int32_t d = 0; d < q->ndim; d++)
                append(shape, json_integer(q->shape[d]), bad);
            put(po, "name", json_string(q->name), bad);
            put(po, "offset", json_integer(q->offset), bad);
            put(po, "numel", json_integer(q->numel), bad);
            put(po, "shape", shape, bad);
            if (zs_ckpt_param_group_dump(po, q))
                *bad = true;
            append(params, po, bad);
        }
        put(o, "name", json_string(u->name), bad);
        put(o, "numel", json_integer(u->numel), bad);
        put(o, "params", params, bad);
        append(units, o, bad);
    }
    return units;
}

static json_t *dump_files(const struct zs_ckpt_manifest *m, bool *bad)
{
    json_t *files = json_array();

    for (int32_t i = 0; i < m->nfiles; i++) {
        const struct zs_ckpt_file *f = &m->files[i];
        json_t *o = json_object();
        char crc[9];

        snprintf(crc, sizeof(crc), "%08x", f->crc32c);
        put(o, "name", json_string(f->name), bad);
        put(o, "rank", json_integer(f->rank), bad);
        put(o, "bytes", json_integer((json_int_t)f->bytes), bad);
        put(o, "crc32c", json_string(crc), bad);
        append(files, o, bad);
    }
    return files;
}

static json_t *dump_segs(const struct zs_ckpt_manifest *m, bool *bad)
{
    json_t *segs = json_array();

    for (int64_t i = 0; i < m->nsegs; i++) {
        const struct zs_ckpt_seg *s = &m->segs[i];
        json_t *o = json_object();

        put(o, "unit", json_integer(s->unit), bad);
        put(o, "kind", json_string(zs_ckpt_kind_name(s->kind)), bad);
        put(o, "begin", json_integer(s->begin), bad);
        put(o, "count", json_integer(s->count), bad);
        put(o, "file", json_integer(s->file), bad);
        put(o, "offset", json_integer((json_int_t)s->offset), bad);
        append(segs, o, bad);
    }
    return segs;
}

/* Members are added in the documented order; jansson keeps insertion order when dumping. */
char *zs_ckpt_manifest_dump(const struct zs_ckpt_manifest *m)
{
    json_t *root = json_object();
    bool bad = false;
    char *text = NULL;

    put(root, "format", json_string(ZS_CKPT_FORMAT), &bad);
    put(root, "version", json_integer(ZS_CKPT_VERSION), &bad);
    put(root, "global_step", json_integer(m->global_step), &bad);
    put(root, "micro_step", json_integer(m->micro_step), &bad);
    put(root, "world_size", json_integer(m->world_size), &bad);
    put(root, "stage", json_integer(m->stage), &bad);
    put(root, "param_dtype", json_string(m->param_dtype ? m->param_dtype : "fp32"), &bad);
    put(root, "optimizer", json_string(m->optimizer ? m->optimizer : ""), &bad);
    put(root, "loss_scaler", dump_scaler(&m->scaler, &bad), &bad);
    /* only where a load with no_optimizer or no_scheduler set them apart from the step count */
    if (m->optim_steps >= 0 && m->optim_steps != m->global_step - m->scaler.skipped_steps)
        put(root, "optimizer_steps", json_integer(m->optim_steps), &bad);
    if (m->sched_steps >= 0 && m->sched_steps != m->global_step - m->scaler.skipped_steps)
        put(root, "schedule_steps", json_integer(m->sched_steps), &bad);
    if (m->config_json) { /* text that is not a JSON object would give a manifest the parser refuses */
        json_t *cfg = json_loads(m->config_json, 0, NULL);

        put(root, "config", json_is_object(cfg) ? cfg : NULL, &bad);
        if (cfg && !json_is_object(cfg))
            json_decref(cfg);
    }
    if (m->ngroups)
        put(root, "groups", zs_ckpt_groups_dump(m), &bad);
    put(root, "units", dump_units(m, &bad), &bad);
    put(root, "files", dump_files(m, &bad), &bad);
    put(root, "segments", dump_segs(m, &bad), &bad);
    if (root && !bad)
        text = json_dumps(root, JSON_INDENT(1));
    json_decref(root);
    return text;
}
