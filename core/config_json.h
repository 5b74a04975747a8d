/* config_json.h - private to core/config*.c: typed reads of jansson values that name the key path
 * in every message, "auto" resolution, unknown-key checks with did-you-mean. */
#ifndef ZS_CONFIG_JSON_H
#define ZS_CONFIG_JSON_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>    /* defines: json_t */

#include "zeroshard.h"  /* defines: zs_auto_values */

/* One parse: the first hard error goes to err; the first feature ZeroShard cannot run yet is held in
 * `deferred` and reported only when the config is otherwise valid, so a user fixes real mistakes first. */
struct zs_cfg_parser {
    char *err;
    size_t errlen;
    char deferred[512];
    zs_auto_values av;     /* all zero when the program supplied none */
    char program[1024];    /* sections left to the training program */
    char noeffect[1024];   /* keys accepted that change nothing here */
    char notes[256];       /* other remarks, '; '-separated */
};

/* What a numeric key accepts. Always give a range with one of the ZS_* macros below. */
struct zs_cfg_spec {
    double lo, hi;          /* hi = INFINITY: no upper bound */
    bool lo_open, hi_open;  /* the bound itself is excluded */
    double def;             /* value when absent, and for "auto" unless one of the next fields says otherwise */
    bool required;          /* absent is an error */
    bool no_auto;           /* "auto" means nothing for this key */
    bool has_autov;         /* the program supplied the value "auto" stands for */
    double autov;
    const char *need;       /* zs_auto_values field "auto" needs when the key has no default */
};

#define ZS_ANY .lo = -INFINITY, .hi = INFINITY
#define ZS_GE(x) .lo = (x), .hi = INFINITY
#define ZS_GT(x) .lo = (x), .lo_open = true, .hi = INFINITY
#define ZS_IN(a, b) .lo = (a), .hi = (b)
#define ZS_IN_CO(a, b) .lo = (a), .hi = (b), .hi_open = true
#define ZS_IN_OC(a, b) .lo = (a), .lo_open = true, .hi = (b)

#if defined(__GNUC__)
#define ZS_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define ZS_PRINTF(f, a)
#endif

/* Both return -EINVAL so callers can `return zs_cfg_fail(...)`. `path` may be "" (top level). */
int zs_cfg_fail(struct zs_cfg_parser *p, const char *path, const char *key, const char *fmt, ...) ZS_PRINTF(4, 5);
void zs_cfg_defer(struct zs_cfg_parser *p, const char *path, const char *key, const char *fmt, ...) ZS_PRINTF(4, 5);

/* Readers: `obj` may be NULL (an absent section: every key takes its default). Return 0 or -EINVAL. */
int zs_cfg_get_int(struct zs_cfg_parser *p, json_t *obj, const char *path, const char *key,
                   const struct zs_cfg_spec *s, int64_t *out);
int zs_cfg_get_num(struct zs_cfg_parser *p, json_t *obj, const char *path, const char *key,
                   const struct zs_cfg_spec *s, double *out);
int zs_cfg_num_value(struct zs_cfg_parser *p, json_t *v, const char *path, const char *key,
                     const struct zs_cfg_spec *s, double *out);
int zs_cfg_get_bool(struct zs_cfg_parser *p, json_t *obj, const char *path, const char *key, bool def,
                    bool auto_is_false, bool *out);
int zs_cfg_get_str(struct zs_cfg_parser *p, json_t *obj, const char *path, const char *key, const char **out);
int zs_cfg_get_obj(struct zs_cfg_parser *p, json_t *obj, const char *path, const char *key, json_t **out);

/* Keys starting with '_' are comments. A key in `other` (may be NULL) is "not a parameter of <owner>". */
int zs_cfg_check_keys(struct zs_cfg_parser *p, json_t *obj, const char *path, const char *const *known,
                      const char *const *other, const char *owner);
int zs_cfg_unknown_key(struct zs_cfg_parser *p, const char *path, const char *key,
                       const char *const *const *lists);
/* Of two spellings of one key, the one present (a if neither); an error when both are. */
int zs_cfg_pick_alias(struct zs_cfg_parser *p, json_t *obj, const char *path, const char *a, const char *b,
                      const char **key);

/* A switch ZeroShard cannot honour when on: a bool refused when true, or an integer refused above `limit`
 * (integers must be >= lo). The refusal is deferred (see struct zs_cfg_parser). */
struct zs_cfg_gate {
    const char *key;
    bool is_int;
    double lo;
    int64_t limit;
    const char *what;
};
int zs_cfg_check_gate(struct zs_cfg_parser *p, json_t *obj, const char *path, const struct zs_cfg_gate *g);

/* The sections parsed outside config.c: zero_optimization and aio (config_zero.c), the ZeroShard-only
 * "zeroshard" (config_zeroshard.c), optimizer and scheduler (config_optim.c). */
struct zs_config;
int zs_cfg_parse_zero(struct zs_cfg_parser *p, struct zs_config *cfg, json_t *root);
int zs_cfg_parse_zeroshard(struct zs_cfg_parser *p, struct zs_config *cfg, json_t *root);
int zs_cfg_parse_optimizer(struct zs_cfg_parser *p, struct zs_config *cfg, json_t *root);
int zs_cfg_parse_scheduler(struct zs_cfg_parser *p, struct zs_config *cfg, json_t *root);

bool zs_cfg_is_auto(const json_t *v);
bool zs_cfg_in_list(const char *s, const char *const *list);
bool zs_cfg_streq_nocase(const char *a, const char *b);
void zs_cfg_describe(const json_t *v, char *buf, size_t n);
/* Appends "path.key" (or text when key is NULL) to a ', '-separated list; truncates with "...". */
void zs_cfg_list_add(char *list, size_t n, const char *sep, const char *path, const char *key);

#endif /* ZS_CONFIG_JSON_H */
