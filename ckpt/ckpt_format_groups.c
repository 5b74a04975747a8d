/* ckpt_format_groups.c - parameter groups and frozen parameters in a checkpoint manifest: the root's "groups"
 * and each parameter's "group" and "frozen", parsed, checked and dumped (the engine's side: ckpt_groups.c). */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "ckpt_format_impl.h" /* defines: struct mp, zs_ckpt_mp_fail */

#define GROUP_SET_BITS 0x7fu /* the zs_group_field bits */

bool zs_ckpt_unit_frozen(const struct zs_ckpt_manifest *m, int32_t u)
{
    const struct zs_ckpt_unit *un = &m->units[u];

    for (int32_t j = 0; j < un->nparams; j++)
        if (!m->params[un->first_param + j].frozen)
            return false;
    return un->nparams > 0;
}

/* ---------------------------------------------------------------- the manifest */

int zs_ckpt_param_group_parse(struct mp *p, json_t *o, const char *path, const struct zs_ckpt_manifest *m,
                              struct zs_ckpt_param *q)
{
    json_t *g = json_object_get(o, "group"), *f = json_object_get(o, "frozen");
    int32_t ng = m && m->ngroups ? m->ngroups : 1;

    q->group = 0;
    q->frozen = false;
    if (g && (!json_is_integer(g) || json_integer_value(g) < 0 || json_integer_value(g) >= ng))
        return zs_ckpt_mp_fail(p, path, "group", "not a group index below %d", ng);
    if (f && !json_is_boolean(f))
        return zs_ckpt_mp_fail(p, path, "frozen", "not true or false");
    q->group = g ? (int32_t)json_integer_value(g) : 0;
    q->frozen = f && json_is_true(f);
    return 0;
}

static int number(struct mp *p, json_t *o, const char *path, const char *key, bool required, double *out)
{
    json_t *v = json_object_get(o, key);

    if (!v && !required)
        return 0;
    if (!json_is_number(v) || !isfinite(json_number_value(v)))
        return zs_ckpt_mp_fail(p, path, key, "%s", v ? "not a finite number" : "missing");
    *out = json_number_value(v);
    return 0;
}

static int parse_group(struct mp *p, json_t *o, const char *path, struct zs_ckpt_group *g)
{
    static const char *const fields[] = {"set", "lr", "weight_decay", "betas", "eps", "momentum", "dampening",
                                         "nesterov", "lr_used", NULL};
    json_t *set = json_object_get(o, "set"), *betas = json_object_get(o, "betas"), *nest;
    const char *k;
    json_t *v;

    if (!json_is_object(o))
        return zs_ckpt_mp_fail(p, path, "", "not an object");
    json_object_foreach(o, k, v) {
        int i = 0;
        while (fields[i] && strcmp(fields[i], k))
            i++;
        if (!fields[i])
            return zs_ckpt_mp_fail(p, path, k, "unknown member");
    }
    if (!json_is_integer(set) || json_integer_value(set) < 0 || (json_integer_value(set) & ~(json_int_t)GROUP_SET_BITS))
        return zs_ckpt_mp_fail(p, path, "set", "not a set of group field bits (0 to %u)", GROUP_SET_BITS);
    g->set = (uint32_t)json_integer_value(set);
    if (!json_is_array(betas) || json_array_size(betas) != 2 || !json_is_number(json_array_get(betas, 0)) ||
        !json_is_number(json_array_get(betas, 1)))
        return zs_ckpt_mp_fail(p, path, "betas", "not [beta1, beta2]");
    g->beta1 = json_number_value(json_array_get(betas, 0));
    g->beta2 = json_number_value(json_array_get(betas, 1));
    nest = json_object_get(o, "nesterov");
    if (!json_is_boolean(nest))
        return zs_ckpt_mp_fail(p, path, "nesterov", "not true or false");
    g->nesterov = json_is_true(nest);
    g->stepped = json_object_get(o, "lr_used") != NULL;
    return number(p, o, path, "lr", true, &g->lr) || number(p, o, path, "weight_decay", true, &g->weight_decay) ||
           number(p, o, path, "eps", true, &g->eps) || number(p, o, path, "momentum", true, &g->momentum) ||
           number(p, o, path, "dampening", true, &g->dampening) ||
           number(p, o, path, "lr_used", false, &g->lr_used) ? -1 : 0;
}

int zs_ckpt_groups_parse(struct mp *p, json_t *root, struct zs_ckpt_manifest *m)
{
    json_t *a = json_object_get(root, "groups");
    char path[48];
    size_t n;

    if (!a)
        return 0;
    if (!json_is_array(a) || (n = json_array_size(a)) < 1 || n > 65536)
        return zs_ckpt_mp_fail(p, "", "groups", "not an array of 1 to 65536 groups");
    m->groups = calloc(n, sizeof(*m->groups));
    if (!m->groups)
        return zs_ckpt_mp_fail(p, "", "groups", "out of memory");
    m->ngroups = (int32_t)n;
    for (size_t i = 0; i < n; i++) {
        snprintf(path, sizeof(path), "groups[%zu]", i);
        if (parse_group(p, json_array_get(a, i), path, &m->groups[i]))
            return -1;
    }
    return 0;
}

int zs_ckpt_param_group_dump(json_t *po, const struct zs_ckpt_param *q)
{
    /* only what differs from the defaults: a run without groups writes the manifest it always did */
    if (q->group && json_object_set_new(po, "group", json_integer(q->group)))
        return -1;
    if (q->frozen && json_object_set_new(po, "frozen", json_true()))
        return -1;
    return 0;
}

json_t *zs_ckpt_groups_dump(const struct zs_ckpt_manifest *m)
{
    json_t *a = json_array();
    bool bad = !a;

    for (int32_t i = 0; i < m->ngroups && !bad; i++) {
        const struct zs_ckpt_group *g = &m->groups[i];
        json_t *o = json_pack("{s:I, s:f, s:f, s:[f, f], s:f, s:f, s:f, s:b}", "set", (json_int_t)g->set, "lr", g->lr,
                              "weight_decay", g->weight_decay, "betas", g->beta1, g->beta2, "eps", g->eps,
                              "momentum", g->momentum, "dampening", g->dampening, "nesterov", (int)g->nesterov);
        bad = !o || (g->stepped && json_object_set_new(o, "lr_used", json_real(g->lr_used))) ||
              json_array_append_new(a, o);
    }
    if (bad) {
        json_decref(a);
        return NULL;
    }
    return a;
}

