/* zs_config_check.c - zs-config-check [--world N] [--auto FIELD=V] FILE...: says for each DeepSpeed JSON config whether
 * ZeroShard accepts it and how it resolves, or names the key it cannot honour. Needs no MPI or GPU. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/config.h"  /* defines: zs_config_parse, zs_config_read_file */
#include "core/ctx.h"
#include "runtime/runtime.h"

static int check_file(const char *path, int world, const zs_auto_values *av)
{
    struct zs_config cfg;
    char err[1024];
    char *text;
    int rc;

    rc = zs_config_read_file(path, &text);
    if (rc) {
        printf("%s: error: cannot read: %s\n", path, strerror(-rc));
        return 1;
    }
    rc = zs_config_parse(&cfg, text, path, world, av, err, sizeof(err));
    free(text);
    if (rc) {
        printf("%s: error: %s\n", path, err);
        return 1;
    }
    printf("%s: ok (stage %d, optimizer %s, lr %g, micro %lld, gas %lld, train_batch %lld)\n", path, cfg.zero.stage,
           zs_optim_name(cfg.optim.type), cfg.optim.lr, (long long)cfg.micro_batch_size,
           (long long)cfg.grad_accum_steps, (long long)cfg.train_batch_size);
    if (cfg.warning[0])
        printf("%s: %s\n", path, cfg.warning);
    return 0;
}

static int parse_world(const char *s, int *world)
{
    char *end;
    long v;

    errno = 0;
    v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < 1 || v > 1 << 24)
        return -EINVAL;
    *world = (int)v;
    return 0;
}

/* --auto FIELD=VALUE stands in for what a trainer supplies for "auto" keys (zs_auto_values). */
static int parse_auto(const char *s, zs_auto_values *av)
{
    static const char *const names[] = {"micro_batch_size", "grad_accum_steps", "lr", "total_num_steps",
                                        "warmup_num_steps", "gradient_clipping", "beta1", "beta2", "eps",
                                        "weight_decay"};
    const char *eq = strchr(s, '=');
    char *end;
    double v;

    if (!eq)
        return -EINVAL;
    errno = 0;
    v = strtod(eq + 1, &end);
    if (errno || end == eq + 1 || *end || !(v > 0))
        return -EINVAL;
    for (int i = 0; i < (int)(sizeof(names) / sizeof(names[0])); i++) {
        if (strlen(names[i]) != (size_t)(eq - s) || strncmp(s, names[i], (size_t)(eq - s)) != 0)
            continue;
        switch (i) {
        case 0: av->micro_batch_size = (int64_t)v; break;
        case 1: av->grad_accum_steps = (int64_t)v; break;
        case 2: av->lr = v; break;
        case 3: av->total_num_steps = (int64_t)v; break;
        case 4: av->warmup_num_steps = (int64_t)v; break;
        case 5: av->gradient_clipping = v; break;
        case 6: av->beta1 = v; break;
        case 7: av->beta2 = v; break;
        case 8: av->eps = v; break;
        default: av->weight_decay = v; break;
        }
        return 0;
    }
    return -EINVAL;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: zs-config-check [--world N] [--auto FIELD=VALUE]... FILE...\n"
               "  checks each DeepSpeed JSON config against what ZeroShard runs (world size N, default 1).\n"
               "  --auto gives the value a trainer would supply for \"auto\" keys; FIELD is one of\n"
               "  micro_batch_size, grad_accum_steps, lr, total_num_steps, warmup_num_steps, gradient_clipping,\n"
               "  beta1, beta2, eps, weight_decay\n");
}

static bool is_option(const char *a, const char *name)
{
    size_t n = strlen(name);

    return strncmp(a, name, n) == 0 && (a[n] == '\0' || a[n] == '=');
}

/* Options are read first, wherever they appear, so every file is checked with the same settings. */
int main(int argc, char **argv)
{
    zs_auto_values av = {0};
    int world = 1, failed = 0, files = 0;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        bool world_opt = is_option(a, "--world");

        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            return 0;
        }
        if (!world_opt && !is_option(a, "--auto")) {
            files++;
            continue;
        }
        v = strchr(a, '=') ? strchr(a, '=') + 1 : (i + 1 < argc ? argv[++i] : "");
        if (world_opt ? parse_world(v, &world) : parse_auto(v, &av)) {
            fprintf(stderr, "zs-config-check: bad value for %.7s: '%s'\n", a, v);
            usage(stderr);
            return 2;
        }
    }
    if (!files) {
        usage(stderr);
        return 2;
    }
    for (int i = 1; i < argc; i++) {
        if (is_option(argv[i], "--world") || is_option(argv[i], "--auto")) {
            i += strchr(argv[i], '=') == NULL;
            continue;
        }
        failed |= check_file(argv[i], world, &av);
    }
    return failed ? 1 : 0;
}
