/* zs_time_cli.c - zs-estimate --time's options, config reading and output (text table or --json); the model
 * itself is zs_time_model.c. Defaults describe one H100 SXM node (docs/scale.md gives the sources). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/config.h"    /* defines: zs_config_read_file */
#include "kernels/optim.h"  /* defines: zs_optim_bytes_per_param */
#include "tools/zs_time_model.h"

#define MAX_GPU_COUNTS 64

struct tm_args {
    struct zs_tm_in in;
    const char *config, *dtype, *optimizer;
    double micro_batch, seq;   /* -1: the config's, or 1 */
    int overlap;               /* -1: the config's, or on at stage 3 */
    int gpus[MAX_GPU_COUNTS], ngpus;
    bool json, have_model;
};

static const char usage_text[] =
    "usage: zs-estimate --time (--params P | --gpt LAYERS,DIM,CTX[,VOCAB] | --mlp HIDDEN,LAYERS) [--config FILE]\n"
    "         [--stage S] [--dtype fp32|bf16|fp16] [--micro-batch B] [--seq L] [--gas N] [--recompute]\n"
    "         [--overlap 0|1] [--mics N] [--hpz N] [--quant-weights] [--quant-grads] [--quant-block N]\n"
    "         [--offload none|cpu|nvme] [--flops F] [--intra-bw GB/s] [--inter-bw GB/s] [--pcie-bw GB/s]\n"
    "         [--nvme-bw GB/s] [--mem-bw GB/s] [--host-bw GB/s] [--intra-lat us] [--inter-lat us]\n"
    "         [--ranks-per-node K] [--cores C] [--max-live N] [--max-reuse N] [--gpus N1,N2,...] [--json]\n";

static int bad(const char *flag, const char *what)
{
    fprintf(stderr, "zs-estimate: %s: %s\n", flag, what);
    fputs(usage_text, stderr);
    return 2;
}

static void help(void)
{
    fputs(usage_text, stdout);
    puts("Predicted seconds per optimizer step: compute, exposed communication, offload, optimizer (docs/scale.md).\n"
         "  --params P / --gpt L,D,CTX[,V] / --mlp H,L   the model (GPT: 12*L*D^2 + (V+CTX)*D, V default 50257)\n"
         "  --micro-batch B, --seq L, --gas N   tokens per rank per micro-batch B*L (GPT: L = CTX), accumulation\n"
         "  --recompute          activation recomputation: compute x 4/3\n"
         "  --overlap 0|1        overlap_comm (default: the config's, else on at stage 3 only, as ZeroShard)\n"
         "  --mics N, --hpz N    mics_shard_size, zero_hpz_partition_size\n"
         "  --quant-weights, --quant-grads, --quant-block N   int8 across nodes, one fp32 scale per N (256)\n"
         "  --flops F            achieved FLOP/s per GPU (4e14: 40% of an H100 SXM's 989 TFLOP/s bf16 dense)\n"
         "  --intra-bw 360       GB/s per GPU inside a node (NVLink 4: 450 GB/s a direction, ~80% reached)\n"
         "  --inter-bw 400       GB/s per node across nodes (8 x 400 Gb/s InfiniBand NDR)\n"
         "  --pcie-bw 50, --nvme-bw 25, --mem-bw 3350, --host-bw 100   GB/s (PCIe 5 x16, node NVMe, HBM3, DDR5)\n"
         "  --intra-lat 5, --inter-lat 10   microseconds per ring step\n"
         "  --ranks-per-node 8, --cores C (C cores shared by a node's ranks; 0: one device each)\n"
         "  --max-live N, --max-reuse N   stage3_max_live_parameters, stage3_max_reuse_distance (1e9 each)\n"
         "  --gpus LIST          GPU counts (default 1,2,4,...,1024)");
}

/* A positive number, or an error naming the flag. */
static int number(const char *flag, const char *v, double lo, double hi, double *out)
{
    char *end;
    double x = strtod(v, &end);

    if (end == v || *end || !(x >= lo && x <= hi))
        return bad(flag, "not a number in range");
    *out = x;
    return 0;
}

static int integer(const char *flag, const char *v, int lo, int hi, int *out)
{
    double x;
    int rc = number(flag, v, lo, hi, &x);

    if (!rc && x != floor(x))
        return bad(flag, "not an integer");
    if (!rc)
        *out = (int)x;
    return rc;
}

static int model_shape(struct tm_args *a, const char *o, const char *v)
{
    long long l, d, ctx, vocab = 50257, h;
    struct zs_tm_in *in = &a->in;

    if (!strcmp(o, "--params")) {
        if (number(o, v, 1, 1e15, &in->params))
            return 2;
        in->units = (int)ceil(in->params / (1 << 24));
        in->flops_per_token = 6 * in->params;
    } else if (!strcmp(o, "--gpt")) {
        int nf = sscanf(v, "%lld,%lld,%lld,%lld", &l, &d, &ctx, &vocab);
        if (nf < 3 || l < 1 || d < 1 || ctx < 1 || vocab < 1 || l > 100000 || d > 1000000 || ctx > 10000000)
            return bad(o, "LAYERS,DIM,CTX[,VOCAB], all positive");
        in->params = 12.0 * l * d * d + (double)(vocab + ctx) * d;
        in->units = (int)l + 2;
        in->flops_per_token = 6 * in->params + 12.0 * l * d * ctx; /* attention's scores (PaLM, appendix B) */
        if (a->seq < 0)
            a->seq = (double)ctx;
    } else {
        if (sscanf(v, "%lld,%lld", &h, &l) != 2 || h < 1 || l < 0 || h > 10000000)
            return bad(o, "HIDDEN,LAYERS");
        in->params = 0;
        for (long long i = 0; i <= l; i++) /* examples/train_mlp.c: 16 inputs, 4 classes */
            in->params += (double)((i ? h : 16) + 1) * (i == l ? 4 : h);
        in->units = (int)l + 1;
        in->flops_per_token = 6 * in->params;
    }
    a->have_model = true;
    return 0;
}

static int gpu_list(struct tm_args *a, const char *v)
{
    char *end;

    a->ngpus = 0;
    for (const char *s = v; *s; s = *end ? end + 1 : end) {
        long n = strtol(s, &end, 10);
        if (end == s || n < 1 || n > 1 << 20 || (*end && *end != ',') || a->ngpus == MAX_GPU_COUNTS)
            return bad("--gpus", "a comma-separated list of positive GPU counts");
        a->gpus[a->ngpus++] = (int)n;
    }
    return a->ngpus ? 0 : bad("--gpus", "empty list");
}

/* Options taking a rate in GB/s, or a latency in microseconds: the field they set and its scale. */
static double *rate_field(struct zs_tm_in *in, const char *o, double *scale)
{
    static const char *const names[] = {"--intra-bw", "--inter-bw", "--pcie-bw", "--nvme-bw",
                                        "--mem-bw",   "--host-bw",  "--intra-lat", "--inter-lat"};
    double *f[] = {&in->intra_bw, &in->inter_bw, &in->pcie_bw, &in->nvme_bw,
                   &in->mem_bw,   &in->host_bw,  &in->intra_lat, &in->inter_lat};

    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (!strcmp(o, names[i])) {
            *scale = i < 6 ? 1e9 : 1e-6;
            return f[i];
        }
    return NULL;
}

/* Options taking one number in a range: integers (whole) into an int, the rest into a double. */
static const struct num_opt {
    const char *name;
    double lo, hi;
    bool whole;
} num_opts[] = {
    {"--stage", 0, 3, true},
    {"--overlap", 0, 1, true},
    {"--micro-batch", 1, 1e9, false},
    {"--seq", 1, 1e9, false},
    {"--gas", 1, 1 << 20, true},
    {"--mics", 1, 1 << 20, true},
    {"--hpz", 1, 1 << 20, true},
    {"--quant-block", 1, 1 << 20, true},
    {"--flops", 1, 1e20, false},
    {"--ranks-per-node", 1, 1 << 16, true},
    {"--cores", 0, 1 << 16, false},
    {"--max-live", 0, 1e18, false},
    {"--max-reuse", 0, 1e18, false},
};

static int num_option(struct tm_args *a, size_t i, const char *v)
{
    struct zs_tm_in *in = &a->in;
    void *dst[] = {&in->stage, &a->overlap, &a->micro_batch, &a->seq, &in->gas, &in->mics, &in->hpz,
                   &in->quant_block, &in->flops, &in->ranks_per_node, &in->cores, &in->max_live, &in->max_reuse};
    const struct num_opt *n = &num_opts[i];

    _Static_assert(sizeof(dst) / sizeof(dst[0]) == sizeof(num_opts) / sizeof(num_opts[0]), "a target an option");
    return n->whole ? integer(n->name, v, (int)n->lo, (int)n->hi, dst[i]) : number(n->name, v, n->lo, n->hi, dst[i]);
}

static int option(struct tm_args *a, const char *o, const char *v)
{
    struct zs_tm_in *in = &a->in;
    double scale = 1, x, *rate = rate_field(in, o, &scale);

    for (size_t i = 0; i < sizeof(num_opts) / sizeof(num_opts[0]); i++)
        if (!strcmp(o, num_opts[i].name))
            return num_option(a, i, v);
    if (rate) {
        if (number(o, v, scale < 1 ? 0 : 1e-9, 1e9, &x))
            return 2;
        *rate = x * scale;
    } else if (!strcmp(o, "--params") || !strcmp(o, "--gpt") || !strcmp(o, "--mlp")) {
        return model_shape(a, o, v);
    } else if (!strcmp(o, "--config")) {
        a->config = v;
    } else if (!strcmp(o, "--dtype")) {
        if (strcmp(v, "fp32") && strcmp(v, "bf16") && strcmp(v, "fp16"))
            return bad(o, "fp32, bf16 or fp16");
        a->dtype = v;
    } else if (!strcmp(o, "--offload")) {
        if (strcmp(v, "none") && strcmp(v, "cpu") && strcmp(v, "nvme"))
            return bad(o, "none, cpu or nvme");
        in->offload = !strcmp(v, "cpu") ? ZS_TM_OFFLOAD_CPU : !strcmp(v, "nvme") ? ZS_TM_OFFLOAD_NVME : 0;
    } else if (!strcmp(o, "--gpus")) {
        return gpu_list(a, v);
    } else {
        return bad(o, "unknown option");
    }
    return 0;
}

static const char *const flag_options[] = {"--time", "--json", "--recompute", "--quant-weights", "--quant-grads"};

static int parse(struct tm_args *a, int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        bool *flags[] = {NULL, &a->json, &a->in.recompute, &a->in.quant_weights, &a->in.quant_grads};
        size_t f = 0, nf = sizeof(flag_options) / sizeof(flag_options[0]);
        if (!strcmp(o, "--help") || !strcmp(o, "-h")) {
            help();
            return -1;
        }
        while (f < nf && strcmp(o, flag_options[f]))
            f++;
        if (f < nf) {
            if (flags[f])
                *flags[f] = true;
            continue;
        }
        if (i + 1 >= argc)
            return bad(o, "needs a value");
        int rc = option(a, o, argv[++i]);
        if (rc)
            return rc;
    }
    return a->have_model ? 0 : bad("--time", "needs a model: --params, --gpt or --mlp");
}

// ---------------------------------------------------------------------------- the config's settings

static json_t *jpath(json_t *root, const char *a, const char *b)
{
    json_t *x = json_object_get(root, a);
    return b ? json_object_get(x, b) : x;
}

static void take_int(json_t *v, int *dst)
{
    if (json_is_integer(v) && *dst < 0)
        *dst = (int)json_integer_value(v);
}

static enum zs_kopt optimizer_kind(const char *type)
{
    static const char *const names[] = {"adam", "adamw", "sgd", "lion", "adagrad"};

    for (int i = 0; type && i < ZS_KOPT_COUNT; i++)
        if (!strcasecmp(type, names[i]))
            return (enum zs_kopt)i;
    return ZS_KOPT_ADAMW;
}

/* Settings the command line left open, from the DeepSpeed config. */
static int read_config(struct tm_args *a, bool *momentum)
{
    struct zs_tm_in *in = &a->in;
    char *text = NULL;
    json_error_t jerr;
    json_t *root;

    if (zs_config_read_file(a->config, &text)) {
        fprintf(stderr, "zs-estimate: --config: cannot read %s\n", a->config);
        return 1;
    }
    root = json_loads(text, 0, &jerr);
    free(text);
    if (!root) {
        fprintf(stderr, "zs-estimate: %s: line %d: %s\n", a->config, jerr.line, jerr.text);
        return 1;
    }
    json_t *z = json_object_get(root, "zero_optimization"), *v;
    take_int(json_object_get(z, "stage"), &in->stage);
    take_int(json_object_get(z, "mics_shard_size"), &in->mics);
    take_int(json_object_get(z, "zero_hpz_partition_size"), &in->hpz);
    take_int(json_object_get(root, "gradient_accumulation_steps"), &in->gas);
    if (in->max_live < 0 && json_is_number(v = json_object_get(z, "stage3_max_live_parameters")))
        in->max_live = json_number_value(v);
    if (in->max_reuse < 0 && json_is_number(v = json_object_get(z, "stage3_max_reuse_distance")))
        in->max_reuse = json_number_value(v);
    if (json_is_true(json_object_get(z, "zero_quantized_weights")))
        in->quant_weights = true;
    if (json_is_true(json_object_get(z, "zero_quantized_gradients")))
        in->quant_grads = true;
    if (a->overlap < 0 && json_is_boolean(v = json_object_get(z, "overlap_comm")))
        a->overlap = json_is_true(v);
    if (a->micro_batch < 0 && json_is_integer(v = json_object_get(root, "train_micro_batch_size_per_gpu")))
        a->micro_batch = (double)json_integer_value(v);
    v = jpath(z, "offload_optimizer", "device");
    if (!a->in.offload && json_is_string(v))
        in->offload = !strcmp(json_string_value(v), "cpu") ? ZS_TM_OFFLOAD_CPU
                      : !strcmp(json_string_value(v), "nvme") ? ZS_TM_OFFLOAD_NVME : ZS_TM_OFFLOAD_NONE;
    if (!a->dtype)
        a->dtype = json_is_true(jpath(root, "bf16", "enabled")) ? "bf16"
                   : json_is_true(jpath(root, "fp16", "enabled")) ? "fp16" : NULL;
    if (!a->optimizer && json_is_string(v = jpath(root, "optimizer", "type")))
        a->optimizer = strdup(json_string_value(v));
    v = json_object_get(jpath(root, "optimizer", "params"), "momentum");
    *momentum = !json_is_number(v) || json_number_value(v) > 0;
    json_decref(root);
    return 0;
}

/* Defaults for what neither the command line nor the config set, then the byte sizes. */
static int finish_inputs(struct tm_args *a)
{
    struct zs_tm_in *in = &a->in;
    bool momentum = true;

    if (a->config && read_config(a, &momentum))
        return 1;
    in->stage = in->stage < 0 ? 3 : in->stage;
    in->gas = in->gas < 1 ? 1 : in->gas;
    in->mics = in->mics < 0 ? 0 : in->mics;
    in->hpz = in->hpz < 0 ? 0 : in->hpz;
    in->overlap = a->overlap < 0 ? in->stage == 3 : a->overlap;
    in->max_live = in->max_live < 0 ? 1e9 : in->max_live; /* ZeroShard's defaults, as DeepSpeed's */
    in->max_reuse = in->max_reuse < 0 ? 1e9 : in->max_reuse;
    in->tokens = (a->micro_batch < 0 ? 1 : a->micro_batch) * (a->seq < 0 ? 1 : a->seq);
    zs_dtype dt = !a->dtype || !strcmp(a->dtype, "fp32") ? ZS_DTYPE_FP32
                  : !strcmp(a->dtype, "bf16")            ? ZS_DTYPE_BF16 : ZS_DTYPE_FP16;
    enum zs_kopt opt = optimizer_kind(a->optimizer);
    in->pbytes = in->gbytes = dt == ZS_DTYPE_FP32 ? 4 : 2;
    in->opt_bpp = zs_optim_bytes_per_param(opt, dt, dt, momentum);
    int states = opt == ZS_KOPT_ADAM || opt == ZS_KOPT_ADAMW ? 2 : (opt == ZS_KOPT_SGD && !momentum) ? 0 : 1;
    in->state_bytes = 4 * (1 + states);
    if (in->quant_weights && in->stage != 3)
        return bad("--quant-weights", "zero_quantized_weights quantizes stage 3's gathers: needs stage 3");
    if (in->mics && in->stage == 0)
        return bad("--mics", "mics_shard_size shards: needs stage 1-3");
    if (in->hpz && in->stage != 3)
        return bad("--hpz", "zero_hpz_partition_size is stage 3's secondary copy: needs stage 3");
    return 0;
}

// ---------------------------------------------------------------------------- output

static void print_row(const struct zs_tm_out *o, bool json, bool first)
{
    if (json)
        printf("%s{\"gpus\": %d, \"nodes\": %d, \"compute_s\": %.9g, \"comm_exposed_s\": %.9g, \"offload_s\": %.9g, "
               "\"optimizer_s\": %.9g, \"step_s\": %.9g, \"comm_total_s\": %.9g, \"cross_node_bytes\": %.9g, "
               "\"tflops_per_gpu\": %.6g}",
               first ? "" : ", ", o->gpus, o->nodes, o->compute, o->comm_exposed, o->offload, o->optimizer, o->step,
               o->comm_total, o->cross_bytes, o->tflops);
    else
        printf("%6d %5d %11.4g %11.4g %9.4g %9.4g %10.4g %11.4g %12.4g %9.4g\n", o->gpus, o->nodes, o->compute,
               o->comm_exposed, o->offload, o->optimizer, o->step, o->comm_total, o->cross_bytes / 1e9, o->tflops);
}

static void print_header(const struct tm_args *a)
{
    const struct zs_tm_in *in = &a->in;
    static const char *const off[] = {"none", "cpu", "nvme"};

    if (a->json) {
        printf("{\"time_model\": {\"params\": %.9g, \"units\": %d, \"flops_per_token\": %.9g, \"tokens\": %.9g, "
               "\"gas\": %d, \"stage\": %d, \"mics\": %d, \"hpz\": %d, \"quant_weights\": %s, \"quant_grads\": %s, "
               "\"overlap\": %s, \"offload\": \"%s\", \"param_bytes\": %d, \"optimizer_bytes_per_param\": %d, "
               "\"rows\": [",
               in->params, in->units, in->flops_per_token, in->tokens, in->gas, in->stage, in->mics, in->hpz,
               in->quant_weights ? "true" : "false", in->quant_grads ? "true" : "false",
               in->overlap ? "true" : "false", off[in->offload], in->pbytes, in->opt_bpp);
        return;
    }
    printf("%.4g parameters, ZeRO stage %d, %d-byte parameters, %.6g tokens x %d micro-batches per rank, overlap %s",
           in->params, in->stage, in->pbytes, in->tokens, in->gas, in->overlap ? "on" : "off");
    if (in->mics || in->hpz || in->quant_weights || in->quant_grads)
        printf(", mics %d, hpz %d, int8 weights %s, int8 gradients %s", in->mics, in->hpz,
               in->quant_weights ? "on" : "off", in->quant_grads ? "on" : "off");
    printf("\nseconds per step (exposed: not hidden behind compute; cross-node: bytes out of one node per step)\n");
    printf("%6s %5s %11s %11s %9s %9s %10s %11s %12s %9s\n", "gpus", "nodes", "compute", "comm-exp", "offload",
           "optimizer", "step", "comm-total", "cross-GB", "TFLOP/s");
}

int zs_time_main(int argc, char **argv)
{
    struct tm_args a = {.micro_batch = -1, .seq = -1, .overlap = -1,
                        .in = {.stage = -1, .gas = -1, .mics = -1, .hpz = -1, .quant_block = 256,
                               .flops = 4e14, .intra_bw = 360e9, .inter_bw = 400e9, .pcie_bw = 50e9,
                               .nvme_bw = 25e9, .mem_bw = 3350e9, .host_bw = 100e9, .intra_lat = 5e-6,
                               .inter_lat = 10e-6, .ranks_per_node = 8, .max_live = -1, .max_reuse = -1}};
    int rc = parse(&a, argc, argv);
    bool first = true;
    char err[400];

    if (!rc)
        rc = finish_inputs(&a);
    if (rc)
        goto out;
    if (!a.ngpus)
        for (int n = 1; n <= 1024; n *= 2)
            a.gpus[a.ngpus++] = n;
    print_header(&a);
    for (int i = 0; i < a.ngpus; i++) {
        struct zs_tm_out o;
        if (zs_tm_predict(&a.in, a.gpus[i], &o, err, sizeof(err))) {
            if (a.json)
                printf("%s{\"gpus\": %d, \"refused\": \"%s\"}", first ? "" : ", ", a.gpus[i], err);
            else
                printf("%6d  refused: %s\n", a.gpus[i], err);
            first = false;
            continue;
        }
        print_row(&o, a.json, first);
        first = false;
    }
    if (a.json)
        printf("]}}\n");
out:
    free((char *)a.optimizer);
    return rc < 0 ? 0 : rc;
}
