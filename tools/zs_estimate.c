/* zs_estimate.c - zs-estimate: per-rank memory of a ZeRO config before launching, like DeepSpeed's
 * estimate_zero3_model_states_mem_needs, from the same accounting the runtime reports at start.
 *
 *   zs-estimate --world N (--params P | --mlp HIDDEN,LAYERS | --units N1,N2,...) [--config FILE]
 *               [--stage S] [--dtype fp32|bf16|fp16] [--offload none|cpu|nvme] [--device cpu|cuda] [--json]
 *
 * --config defaults to AdamW at stage 3; --stage, --dtype, --offload and --device override it (offload sets both
 * offload_optimizer and, at stage 3, offload_param; device sets zeroshard.device). --params P models P parameters in units of at most
 * 2^24 elements; --mlp is examples/train_mlp.c's model (16 inputs, 4 classes). Needs no MPI. */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/config.h"     /* defines: zs_config_read_file */
#include "core/partition.h"  /* defines: ZS_PARAM_ALIGN */
#include "tools/zs_time_model.h" /* defines: zs_time_main */
#include "zeroshard.h"

#define MAX_UNITS (1 << 20)

struct est_args {
    int world, stage;         /* stage -1: the config's */
    int mics;                 /* --mics-shard-size (0: the config's) */
    int hpz;                  /* --hpz-partition-size (0: the config's) */
    const char *config, *dtype, *offload, *device;
    int64_t *units;
    int32_t nunits;
    bool json;
};

static void print_usage(FILE *f)
{
    fprintf(f, "usage: zs-estimate --world N (--params P | --mlp HIDDEN,LAYERS | --units N1,N2,...) [--config FILE]\n"
                    "                   [--stage S] [--dtype fp32|bf16|fp16] [--offload none|cpu|nvme] [--mics-shard-size G]\n"
                    "                   [--hpz-partition-size H] [--device cpu|cuda] [--json]\n"
                    "       zs-estimate --time ...   the step-time model (zs-estimate --time --help)\n");
}

static int usage(const char *why)
{
    fprintf(stderr, "zs-estimate: %s\n", why);
    print_usage(stderr);
    return 2;
}

static void help(void)
{
    print_usage(stdout);
    printf("Memory per rank of a ZeRO run, by category, before launching (no MPI, no GPU).\n"
           "  --world N          data-parallel ranks\n"
           "  --params P         a model of P parameters, in units of at most 2^24 elements\n"
           "  --mlp H,L          the units of zs-train-mlp --hidden H --layers L\n"
           "  --units N1,N2,...  your own units' element counts\n"
           "  --config FILE      a DeepSpeed config (default: AdamW at stage 3)\n"
           "  --stage S          ZeRO stage 0-3 (overrides the config's)\n"
           "  --dtype D          fp32, bf16 or fp16 parameters (overrides the config's)\n"
           "  --offload O        none, cpu or nvme: offload_optimizer and, at stage 3, offload_param\n"
           "  --device D         cpu or cuda: where the model states live (zeroshard.device; on cuda the gradient\n"
           "                     shard stays in GPU memory with the optimizer on NVMe, on cpu it goes to the file)\n"
           "  --mics-shard-size G  hybrid sharding: shards over groups of G ranks (zero_optimization.mics_shard_size)\n"
           "  --hpz-partition-size H  ZeRO++ hpZ at stage 3: a secondary parameter copy over groups of H ranks\n"
           "                     (zero_optimization.zero_hpz_partition_size)\n"
           "  --json             one JSON object instead of the table\n");
}

static int add_unit(struct est_args *a, int64_t n)
{
    if (n < 1 || a->nunits >= MAX_UNITS)
        return -1;
    if (!a->units && !(a->units = malloc(MAX_UNITS * sizeof(int64_t))))
        return -1;
    a->units[a->nunits++] = n;
    return 0;
}

static int64_t align_up(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

/* examples/train_mlp.c: layer i holds weight (out x in) then bias, the bias aligned as zs_param_add does */
static int mlp_units(struct est_args *a, int64_t hidden, int64_t layers)
{
    for (int64_t i = 0; i <= layers; i++) {
        int64_t in = i == 0 ? 16 : hidden, out = i == layers ? 4 : hidden;
        if (add_unit(a, align_up(in * out, ZS_PARAM_ALIGN) + out))
            return -1;
    }
    return 0;
}

static int parse(struct est_args *a, int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        char *end;
        if (!strcmp(o, "--help") || !strcmp(o, "-h")) {
            help();
            return -1;
        }
        if (!strcmp(o, "--json")) {
            a->json = true;
            continue;
        }
        if (!v)
            return usage("an option needs a value");
        i++;
        if (!strcmp(o, "--world")) {
            a->world = (int)strtol(v, &end, 10);
            if (*end || a->world < 1)
                return usage("--world: a positive integer");
        } else if (!strcmp(o, "--mics-shard-size")) {
            a->mics = (int)strtol(v, &end, 10);
            if (*end || a->mics < 1)
                return usage("--mics-shard-size: a positive integer that divides --world");
        } else if (!strcmp(o, "--hpz-partition-size")) {
            a->hpz = (int)strtol(v, &end, 10);
            if (*end || a->hpz < 1)
                return usage("--hpz-partition-size: a positive integer that divides the shard group");
        } else if (!strcmp(o, "--stage")) {
            a->stage = (int)strtol(v, &end, 10);
            if (*end || a->stage < 0 || a->stage > 3)
                return usage("--stage: 0, 1, 2 or 3");
        } else if (!strcmp(o, "--params")) {
            double p = strtod(v, &end);
            if (*end || p < 1 || p > 1e15)
                return usage("--params: a count such as 7e9");
            for (int64_t left = (int64_t)p; left > 0; left -= (int64_t)1 << 24)
                if (add_unit(a, left < ((int64_t)1 << 24) ? left : ((int64_t)1 << 24)))
                    return usage("--params: too many units");
        } else if (!strcmp(o, "--mlp")) {
            long long h, l;
            if (sscanf(v, "%lld,%lld", &h, &l) != 2 || h < 1 || l < 0 || mlp_units(a, h, l))
                return usage("--mlp: HIDDEN,LAYERS");
        } else if (!strcmp(o, "--units")) {
            for (char *s = (char *)v; *s; s = *end ? end + 1 : end)
                if (add_unit(a, strtoll(s, &end, 10)) || (*end && *end != ','))
                    return usage("--units: a comma-separated list of positive sizes");
        } else if (!strcmp(o, "--config")) {
            a->config = v;
        } else if (!strcmp(o, "--dtype")) {
            if (strcmp(v, "fp32") && strcmp(v, "bf16") && strcmp(v, "fp16"))
                return usage("--dtype: fp32, bf16 or fp16");
            a->dtype = v;
        } else if (!strcmp(o, "--offload")) {
            if (strcmp(v, "none") && strcmp(v, "cpu") && strcmp(v, "nvme"))
                return usage("--offload: none, cpu or nvme");
            a->offload = v;
        } else if (!strcmp(o, "--device")) {
            if (strcmp(v, "cpu") && strcmp(v, "cuda"))
                return usage("--device: cpu or cuda");
            a->device = v;
        } else {
            return usage("unknown option");
        }
    }
    if (!a->world || !a->nunits)
        return usage("--world and one of --params, --mlp, --units are required");
    return 0;
}

static json_t *section(json_t *root, const char *name)
{
    json_t *s = json_object_get(root, name);

    if (!json_is_object(s)) {
        s = json_object();
        json_object_set_new(root, name, s);
    }
    return s;
}

/* The config text with the command line's overrides applied. */
static char *config_text(const struct est_args *a)
{
    static const char defaults[] = "{\"train_micro_batch_size_per_gpu\": 1, \"optimizer\": {\"type\": \"AdamW\", "
                                   "\"params\": {\"lr\": 1e-4}}, \"zero_optimization\": {\"stage\": 3}}";
    char *text = NULL, *out;
    json_error_t jerr;
    json_t *root, *z;

    if (a->config && zs_config_read_file(a->config, &text)) {
        fprintf(stderr, "zs-estimate: cannot read %s\n", a->config);
        return NULL;
    }
    root = json_loads(text ? text : defaults, 0, &jerr);
    free(text);
    if (!root) {
        fprintf(stderr, "zs-estimate: %s: line %d: %s\n", a->config ? a->config : "<defaults>", jerr.line, jerr.text);
        return NULL;
    }
    z = section(root, "zero_optimization");
    if (a->stage >= 0)
        json_object_set_new(z, "stage", json_integer(a->stage));
    if (a->mics > 0)
        json_object_set_new(z, "mics_shard_size", json_integer(a->mics));
    if (a->hpz > 0)
        json_object_set_new(z, "zero_hpz_partition_size", json_integer(a->hpz));
    if (a->dtype) {
        json_object_del(root, "fp16");
        json_object_del(root, "bf16");
        json_object_del(root, "bfloat16");
        if (strcmp(a->dtype, "fp32"))
            json_object_set_new(section(root, a->dtype), "enabled", json_true());
    }
    if (a->offload) {
        int stage = (int)json_integer_value(json_object_get(z, "stage"));
        json_object_del(z, "offload_optimizer");
        json_object_del(z, "offload_param");
        if (strcmp(a->offload, "none")) {
            json_t *o = json_pack("{s:s, s:s}", "device", a->offload, "nvme_path", "/nvme");
            json_object_set(z, "offload_optimizer", o);
            if (stage == 3)
                json_object_set(z, "offload_param", o);
            json_decref(o);
        }
    }
    if (a->device)
        json_object_set_new(section(root, "zeroshard"), "device", json_string(a->device));
    out = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    return out;
}

static double gib(uint64_t b) { return (double)b / (double)(1ull << 30); }

int main(int argc, char **argv)
{
    struct est_args a = {.stage = -1};
    zs_memory_report r;
    char *text;
    int rc;

    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--time")) /* the step-time model: its own options */
            return zs_time_main(argc, argv);
    rc = parse(&a, argc, argv);
    if (rc)
        return rc < 0 ? 0 : rc; /* -1: --help printed */
    text = config_text(&a);
    if (!text)
        return 1;
    if (zs_estimate_memory(text, a.world, a.nunits, a.units, &r)) {
        fprintf(stderr, "zs-estimate: %s\n", zs_last_error());
        free(text);
        free(a.units);
        return 1;
    }
    uint64_t device = r.params + r.grads + r.optimizer + r.buffers + r.prefetch_cap + r.nccl_staging - r.host;
    static const char *const dt[] = {"fp32", "bf16", "fp16"};
    if (a.json) {
        printf("{\"estimate\": {\"world\": %d, \"shard_size\": %d, \"stage\": %d, \"dtype\": \"%s\", \"numel\": %" PRIu64 ", "
               "\"params\": %" PRIu64 ", \"grads\": %" PRIu64 ", \"optimizer\": %" PRIu64 ", \"master\": %" PRIu64
               ", \"buffers\": %" PRIu64 ", \"comm_buffers\": %" PRIu64 ", \"swap_buffers\": %" PRIu64
               ", \"prefetch_cap\": %" PRIu64 ", \"host\": %" PRIu64 ", \"nvme\": %" PRIu64
               ", \"nccl_staging\": %" PRIu64 ", \"formula\": %" PRIu64 ", \"device\": %" PRIu64 ", \"hpz_size\": %d"
               ", \"hpz_secondary\": %" PRIu64 "}}\n",
               r.world, r.shard_size, r.stage, dt[r.dtype], r.numel, r.params, r.grads, r.optimizer, r.master, r.buffers,
               r.comm_buffers, r.swap_buffers, r.prefetch_cap, r.host, r.nvme, r.nccl_staging, r.formula, device, r.hpz_size, r.hpz_secondary);
    } else {
        if (r.shard_size < r.world) /* hybrid: the formula's N is the shard group's size */
            printf("%" PRIu64 " parameters, %d ranks, shard group of %d, ZeRO stage %d, %s; per rank (N = %d):\n",
                   r.numel, r.world, r.shard_size, r.stage, dt[r.dtype], r.shard_size);
        else
            printf("%" PRIu64 " parameters, %d ranks, ZeRO stage %d, %s; per rank:\n", r.numel, r.world, r.stage,
                   dt[r.dtype]);
        printf("  parameters     %10.3f GiB   (ZeRO formula %.3f)\n", gib(r.params), gib(r.expect_params));
        if (r.hpz_size)
            printf("   of which hpZ  %10.3f GiB   (secondary copy over %d ranks; ZeRO++: psz x Psi / %d)\n",
                   gib(r.hpz_secondary), r.hpz_size, r.hpz_size);
        printf("  gradients      %10.3f GiB   (ZeRO formula %.3f%s)\n", gib(r.grads), gib(r.expect_grads),
               !r.grads && r.expect_grads && r.swap_buffers ? "; on NVMe with the optimizer state" : "");
        printf("  optimizer      %10.3f GiB   (ZeRO formula %.3f; fp32 masters %.3f)\n", gib(r.optimizer),
               gib(r.expect_optimizer), gib(r.master));
        printf("  grad bucket    %10.3f GiB\n", gib(r.comm_buffers));
        if (r.swap_buffers)
            printf("  swap buffers   %10.3f GiB   (host pool: 3 slots of the largest sub-group (sub_group_size), and "
                   "offload_param's read-ahead)\n", gib(r.swap_buffers));
        if (r.stage == 3)
            printf("  gathered cap   %10.3f GiB   (stage3_max_live_parameters, at least the largest unit)\n",
                   gib(r.prefetch_cap));
        if (r.nccl_staging)
            printf("  NCCL staging   %10.3f GiB   (fixed: ranks x piece, wherever NCCL may carry the collectives)\n",
                   gib(r.nccl_staging));
        printf("  => device %.3f GiB, pinned host %.3f GiB, NVMe %.3f GiB (collective scratch not included)\n",
               gib(device), gib(r.host), gib(r.nvme));
    }
    free(text);
    free(a.units);
    return 0;
}
