/* config_zeroshard.c - the ZeroShard-only "zeroshard" section of a config: the CPU threads and kernels that
 * run the sharded step, the collectives' backends, the watchdog, and deterministic mode. */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "config.h"      /* defines: struct zs_zeroshard_config */
#include "config_json.h" /* defines: zs_cfg_get_int, zs_cfg_fail, zs_cfg_in_list */

typedef struct zs_cfg_parser parser;

/* The section's string values, checked once every key is read. */
struct names {
    const char *kernel, *comm, *device, *device_comm, *flight_dir, *deterministic;
};

enum key_kind { KEY_INT, KEY_NUM, KEY_BOOL, KEY_STR };

#define IN_CFG(f) offsetof(struct zs_zeroshard_config, f)
#define IN_NAMES(f) offsetof(struct names, f)

/* Every key, in the order it is read (the first bad value is the one reported). DeepSpeed skips top-level
 * keys it does not know, so one file serves both runtimes. */
static const struct key {
    const char *name;
    enum key_kind kind;
    size_t off; /* into struct zs_zeroshard_config, or into struct names for KEY_STR */
    struct zs_cfg_spec spec; /* KEY_BOOL: .def is the default */
} keys[] = {
    {"cpu_threads", KEY_INT, IN_CFG(threads), {ZS_GE(0)}},
    {"kernel", KEY_STR, IN_NAMES(kernel), {.lo = 0}},
    {"bind_threads", KEY_BOOL, IN_CFG(bind), {.def = 1}},
    {"comm", KEY_STR, IN_NAMES(comm), {.lo = 0}},
    {"fake_node_size", KEY_INT, IN_CFG(fake_node_size), {ZS_GE(0)}},
    {"device_memory", KEY_INT, IN_CFG(device_memory), {ZS_GE(0)}},
    {"device", KEY_STR, IN_NAMES(device), {.lo = 0}},
    {"device_comm", KEY_STR, IN_NAMES(device_comm), {.lo = 0}},
    {"timeout_s", KEY_NUM, IN_CFG(timeout_s), {ZS_IN_OC(0, 1e9), .def = 600, .no_auto = true}},
    {"flight_dir", KEY_STR, IN_NAMES(flight_dir), {.lo = 0}},
    {"deterministic", KEY_STR, IN_NAMES(deterministic), {.lo = 0}},
    {"micro_shard_size", KEY_INT, IN_CFG(micro_shard_size), {ZS_GE(1), .def = 1}},
};

#define NKEYS (sizeof(keys) / sizeof(keys[0]))

/* The keys naming one of a few choices; the first is the default. */
static const char *const comm_backends[] = {"auto", "mpi", "shm", NULL};
static const char *const cpu_kernels[] = {"auto", "scalar", "avx2", "avx512", NULL};
static const char *const devices[] = {"cpu", "cuda", NULL};
static const char *const device_comms[] = {"auto", "nccl", "ordered", "staged", NULL};

static int check_keys(parser *p, json_t *sec)
{
    const char *known[NKEYS + 1];

    for (size_t i = 0; i < NKEYS; i++)
        known[i] = keys[i].name;
    known[NKEYS] = NULL;
    return zs_cfg_check_keys(p, sec, "zeroshard", known, NULL, NULL);
}

static int read_key(parser *p, json_t *sec, const struct key *k, struct zs_zeroshard_config *c, struct names *n)
{
    char *to = (k->kind == KEY_STR ? (char *)n : (char *)c) + k->off;

    switch (k->kind) {
    case KEY_INT:
        return zs_cfg_get_int(p, sec, "zeroshard", k->name, &k->spec, (int64_t *)to);
    case KEY_NUM:
        return zs_cfg_get_num(p, sec, "zeroshard", k->name, &k->spec, (double *)to);
    case KEY_BOOL:
        return zs_cfg_get_bool(p, sec, "zeroshard", k->name, k->spec.def != 0, false, (bool *)to);
    case KEY_STR:
        return zs_cfg_get_str(p, sec, "zeroshard", k->name, (const char **)to);
    }
    return -EINVAL;
}

/* "a", "b" or "c": the choices as the messages list them. */
static void list_choices(char *buf, size_t n, const char *const *choices)
{
    size_t len = 0;

    buf[0] = '\0';
    for (int i = 0; choices[i] && len < n; i++)
        len += (size_t)snprintf(buf + len, n - len, "%s\"%s\"", i == 0 ? "" : choices[i + 1] ? ", " : " or ",
                                choices[i]);
}

/* v (absent: the first choice) copied into dst with its NUL; the struct was zeroed, so the bytes after
 * the NUL are zero too. */
static int set_choice(parser *p, const char *key, const char *v, const char *const *choices, char *dst)
{
    char list[128];

    if (!v)
        v = choices[0];
    if (!zs_cfg_in_list(v, choices)) {
        list_choices(list, sizeof(list), choices);
        return zs_cfg_fail(p, "zeroshard", key, "expected %s, got \"%.40s\"", list, v);
    }
    memcpy(dst, v, strlen(v) + 1);
    return 0;
}

static int set_flight_dir(parser *p, struct zs_zeroshard_config *c, const char *dir)
{
    if (dir && strlen(dir) >= sizeof(c->flight_dir))
        return zs_cfg_fail(p, "zeroshard", "flight_dir", "longer than %zu bytes", sizeof(c->flight_dir) - 1);
    if (dir)
        memcpy(c->flight_dir, dir, strlen(dir) + 1);
    return 0;
}

static int set_deterministic(parser *p, struct zs_config *cfg, const char *det)
{
    struct zs_zeroshard_config *c = &cfg->zs;

    if (det && strcmp(det, "off") && strcmp(det, "world_size_invariant"))
        return zs_cfg_fail(p, "zeroshard", "deterministic", "expected \"off\" or \"world_size_invariant\", got \"%.40s\"",
                           det);
    c->deterministic = det && !strcmp(det, "world_size_invariant");
    if (!c->deterministic)
        return 0;
    if (cfg->micro_batch_size % c->micro_shard_size != 0)
        return zs_cfg_fail(p, "zeroshard", "micro_shard_size",
                           "%lld does not divide train_micro_batch_size_per_gpu %lld at this world size",
                           (long long)c->micro_shard_size, (long long)cfg->micro_batch_size);
    if (cfg->zero.quantized_weights || cfg->zero.quantized_gradients)
        return zs_cfg_fail(p, "zeroshard", "deterministic", "\"world_size_invariant\" needs exact sums and gathers: "
                           "zero_optimization.zero_quantized_weights and zero_optimization.zero_quantized_gradients "
                           "are lossy (set them to false)");
    /* the exact sum is scaled once, by the micro-shard count; a pre-division would round per rank */
    if (cfg->prescale_gradients || cfg->gradient_predivide_factor != 1.0)
        return zs_cfg_fail(p, "zeroshard", "deterministic",
                           "\"world_size_invariant\" does not implement prescale_gradients or "
                           "gradient_predivide_factor (set them to false and 1)");
    return 0;
}

int zs_cfg_parse_zeroshard(parser *p, struct zs_config *cfg, json_t *root)
{
    struct zs_zeroshard_config *c = &cfg->zs;
    struct names n = {0};
    json_t *sec;

    if (zs_cfg_get_obj(p, root, "", "zeroshard", &sec) || (sec && check_keys(p, sec)))
        return -EINVAL;
    for (size_t i = 0; i < NKEYS; i++)
        if (read_key(p, sec, &keys[i], c, &n))
            return -EINVAL;
    if (set_flight_dir(p, c, n.flight_dir) || set_deterministic(p, cfg, n.deterministic) ||
        set_choice(p, "comm", n.comm, comm_backends, c->comm) ||
        set_choice(p, "kernel", n.kernel, cpu_kernels, c->kernel) ||
        set_choice(p, "device", n.device, devices, c->device) ||
        set_choice(p, "device_comm", n.device_comm, device_comms, c->device_comm))
        return -EINVAL;
    /* NCCL's own reduce-scatter sums in its ring or tree order, which depends on the world size */
    if (c->deterministic && !strcmp(c->device_comm, "nccl"))
        return zs_cfg_fail(p, "zeroshard", "device_comm",
                           "\"nccl\" sums in NCCL's order, not bit-identical, and \"world_size_invariant\" "
                           "(zeroshard.deterministic) needs exact sums; use \"ordered\"");
    return 0;
}
