/* test_devpath.c DEVICE [scale] - the engine's data path on a device the host cannot read in place, against the CPU
 * device, bit for bit. DEVICE is "separate" (the separate CPU test device: ZS_TEST_DEVICE=separate, memory
 * at addresses the host faults on, so any engine access that skips a copy crashes) or "cuda" (the GPU;
 * 77, a skip, where none is visible). For stages 0-3 x offload_optimizer none/cpu/nvme x fp32/bf16/fp16 (with
 * gradient accumulation, clipping, prescaled gradients and parameter offload in some; at stage 3 also
 * ZeRO-Infinity's offload_param nvme, the shards fetched from the swap file), a small model trains
 * on both and the parameters and every step's gradient norm must hash alike; checkpoints cross over (the
 * device's loaded on the CPU and the CPU's on the device) and the runs continue alike. Run under mpirun at
 * 1-4 ranks: ranks share the one device, so the engine uses the host-staged collectives. "scale" (an even number
 * of ranks; ZS_FAKE_NODE_SIZE for nodes) runs hybrid sharding and the quantized collectives instead (scale_cases). */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <mpi.h>

#include "check.h"
#include "kernels/convert.h" /* defines: zs_cvt_to_f32, zs_cvt_from_f32 */
#include "zeroshard.h"

static int rank, world;
static const char *devname; /* "separate" or "cuda" */
static bool scale;          /* hybrid sharding and the quantized collectives (scale_cases) instead */
static char dir[256];       /* checkpoints */

/* Three units of awkward sizes (padding at every world size), the last one small. */
static const int64_t sizes[][2] = { { 37, 100 }, { 1000, 5 }, { 3, 1 } };
#define NU 3

struct run {
    zs_ctx *ctx;
    int32_t unit[NU], param[NU][2];
    uint64_t norms; /* FNV-1a of every step's gradient norm */
};

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;

    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ULL;
    return h;
}

static float hashf(uint64_t k)
{
    k = (k ^ (k >> 31)) * 0x7fb5d329728ea185ULL;
    k = (k ^ (k >> 27)) * 0x81dadef4bc2dd44dULL;
    return (float)((k >> 40) & 0xffffff) / 16777216.0f - 0.5f;
}

static void init_values(void *arg, int32_t param, int64_t first, int64_t count, float *dst)
{
    for (int64_t i = 0; i < count; i++)
        dst[i] = hashf(((uint64_t)param << 32) + (uint64_t)(first + i));
}

/* offload: 0 none, 1 cpu (with offload_param cpu at stage 3), 2 nvme (the optimizer state in swap files
 * under dir/nvme; offload_param cpu at stage 3 too), 3 (stage 3) nvme for both, the parameter shards in the
 * same swap file */
static bool cfg_json(char *out, size_t len, const char *device, int stage, int offload, const char *dtype, int gas,
                     bool prescale, const char *zextra)
{
    char prec[160] = "", opt[400], param[400];

    if (!strcmp(dtype, "bf16"))
        snprintf(prec, sizeof(prec), "\"bf16\": {\"enabled\": true},");
    else if (!strcmp(dtype, "fp16"))
        snprintf(prec, sizeof(prec), "\"fp16\": {\"enabled\": true, \"loss_scale\": 0, \"initial_scale_power\": 8},");
    if (offload >= 2)
        snprintf(opt, sizeof(opt), "{\"device\": \"nvme\", \"nvme_path\": \"%s/nvme\"}", dir);
    else
        snprintf(opt, sizeof(opt), "{\"device\": \"%s\"}", offload ? "cpu" : "none");
    /* two read-ahead buffers for three units: each buffer is read into again while its last upload may still
     * be queued, and a fetch can find none free */
    snprintf(param, sizeof(param), "{\"device\": \"nvme\", \"nvme_path\": \"%s/nvme\", \"buffer_count\": 2}", dir);
    return snprintf(out, len,
                    "{\"train_micro_batch_size_per_gpu\": 1, \"gradient_accumulation_steps\": %d, "
                    "\"gradient_clipping\": 0.05, \"prescale_gradients\": %s, %s"
                    "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01, \"weight_decay\": 0.01}},"
                    "\"zero_optimization\": {\"stage\": %d, \"reduce_bucket_size\": 1200, "
                    "\"stage3_param_persistence_threshold\": 0, \"offload_optimizer\": %s%s%s%s},"
                    "\"zeroshard\": {\"device\": \"%s\"}}",
                    gas, prescale ? "true" : "false", prec, stage, opt,
                    offload && stage == 3 ? ", \"offload_param\": " : "", offload && stage == 3 ? offload == 3 ? param :
                    "{\"device\": \"cpu\"}" : "", zextra, !strcmp(device, "cuda") ? "cuda" : "cpu") < (int)len;
}

/* The engine on `device` ("cpu", "separate" or "cuda"), the model registered and set up. */
static zs_status run_open(struct run *r, const char *device, const char *json)
{
    zs_init_opts o = { .config_json = json, .use_comm = 1, .comm = MPI_COMM_WORLD, .quiet = 1 };
    zs_status st;

    memset(r, 0, sizeof(*r));
    r->norms = 0xcbf29ce484222325ULL;
    if (!strcmp(device, "separate"))
        setenv("ZS_TEST_DEVICE", "separate", 1);
    else
        unsetenv("ZS_TEST_DEVICE");
    st = zs_init(&r->ctx, &o);
    unsetenv("ZS_TEST_DEVICE");
    for (int u = 0; !st && u < NU; u++) {
        char name[32];
        snprintf(name, sizeof(name), "unit%d", u);
        st = zs_unit_add(r->ctx, name, &r->unit[u]);
        for (int k = 0; !st && k < 2; k++) {
            snprintf(name, sizeof(name), "unit%d.p%d", u, k);
            st = zs_param_add_init(r->ctx, r->unit[u], name, sizes[u][k], init_values, NULL, &r->param[u][k]);
        }
    }
    if (!st)
        st = zs_setup(r->ctx);
    return st;
}

/* Unit u's fetched parameters in fp32 on the host (n elements, the unit's flat layout). */
static zs_status unit_values(struct run *r, int u, float *vals, int64_t *n)
{
    zs_dtype dt = zs_param_dtype(r->ctx);
    size_t esz = dt == ZS_DTYPE_FP32 ? 4 : 2;
    int64_t off;
    void *p = NULL, *raw;
    zs_status st = zs_param_info(r->ctx, r->param[u][1], NULL, NULL, NULL, &off);

    *n = off + sizes[u][1];
    raw = malloc((size_t)*n * esz);
    if (!st)
        st = zs_param_data(r->ctx, r->param[u][0], &p); /* the unit's element 0 */
    if (!st)
        st = zs_copy_to_host(r->ctx, raw, p, (size_t)*n * esz);
    if (!st)
        zs_cvt_to_f32(vals, raw, (int)dt, *n);
    free(raw);
    return st;
}

/* One micro-batch: forward fetches in unit order, backward in reverse adds a gradient that depends on the
 * parameters, the rank and the micro-step into the engine's buffer through host copies. */
static zs_status micro_batch(struct run *r, int64_t micro)
{
    zs_dtype dt = zs_param_dtype(r->ctx);
    size_t esz = dt == ZS_DTYPE_FP32 ? 4 : 2;
    float vals[1100], g[1100];
    unsigned char raw[1100 * 4];
    zs_step_stats s;
    zs_status st = ZS_OK;

    for (int u = 0; !st && u < NU; u++) {
        st = zs_unit_fetch(r->ctx, r->unit[u], NULL);
        if (!st)
            st = zs_unit_release(r->ctx, r->unit[u]);
    }
    zs_stats(r->ctx, &s);
    for (int u = NU - 1; !st && u >= 0; u--) {
        int64_t n;
        void *gb = NULL;
        st = zs_unit_fetch(r->ctx, r->unit[u], NULL);
        if (!st)
            st = unit_values(r, u, vals, &n);
        if (!st)
            st = zs_grad_buffer(r->ctx, r->unit[u], &gb);
        if (!st)
            st = zs_copy_to_host(r->ctx, raw, gb, (size_t)n * esz);
        if (st)
            break;
        zs_cvt_to_f32(g, raw, (int)dt, n);
        for (int64_t i = 0; i < n; i++) {
            float t = hashf(((uint64_t)micro << 40) ^ ((uint64_t)rank << 32) ^ (uint64_t)(u * 4096 + i));
            g[i] += (vals[i] - t) * (float)s.loss_scale;
        }
        zs_cvt_from_f32(raw, (int)dt, g, n);
        st = zs_copy_from_host(r->ctx, gb, raw, (size_t)n * esz);
        if (!st)
            st = zs_grad_ready(r->ctx, r->unit[u]);
        if (!st)
            st = zs_unit_release(r->ctx, r->unit[u]);
    }
    if (!st)
        st = zs_step(r->ctx);
    if (!st && zs_stats(r->ctx, &s) == ZS_OK && s.stepped)
        r->norms = fnv(r->norms, &s.grad_norm, sizeof(s.grad_norm));
    return st;
}

static zs_status train(struct run *r, int64_t from, int64_t micro_batches)
{
    zs_status st = ZS_OK;

    for (int64_t m = from; !st && m < from + micro_batches; m++)
        st = micro_batch(r, m);
    return st;
}

/* Every parameter's working values, byte for byte, and the norms seen. */
static zs_status params_hash(struct run *r, uint64_t *h)
{
    float vals[1100];
    int64_t n;
    zs_status st = ZS_OK;

    *h = r->norms;
    for (int u = 0; !st && u < NU; u++) {
        st = zs_unit_fetch(r->ctx, r->unit[u], NULL);
        if (!st)
            st = unit_values(r, u, vals, &n);
        if (!st)
            *h = fnv(*h, vals, (size_t)n * sizeof(float));
        if (!st)
            st = zs_unit_release(r->ctx, r->unit[u]);
    }
    return st;
}

static void run_close(struct run *r)
{
    zs_finalize(r->ctx);
    r->ctx = NULL;
}

/* Trains on `device` for `micro` micro-batches (after loading `load` when given), saves to `save` when
 * given, and returns the hash. */
static zs_status session(const char *device, const char *json, const char *load, int64_t from, int64_t micro,
                         const char *save, uint64_t *h)
{
    struct run r;
    zs_status st = run_open(&r, device, json);

    if (!st && load)
        st = zs_checkpoint_load(r.ctx, load);
    if (!st)
        st = train(&r, from, micro);
    if (!st && save)
        st = zs_checkpoint_save(r.ctx, save);
    if (!st)
        st = params_hash(&r, h);
    if (r.ctx)
        run_close(&r);
    return st;
}

/* What the engine refuses on a device the host cannot read in place: zs_init fails, naming the key. */
static void check_refusals(void)
{
    static const char *const key = "zeroshard.deterministic";
    char json[1024];
    struct run r;
    zs_status st;

    snprintf(json, sizeof(json), "{\"train_micro_batch_size_per_gpu\": 1, \"zero_optimization\": {\"stage\": 0}, "
             "\"zeroshard\": {\"device\": \"%s\", \"deterministic\": \"world_size_invariant\"}}",
             !strcmp(devname, "cuda") ? "cuda" : "cpu");
    st = run_open(&r, devname, json);
    CHECK(st == ZS_ERR_UNSUPPORTED && strstr(zs_last_error(), key), "refusal: status %d, \"%s\" should name %s",
          (int)st, zs_last_error(), key);
    if (r.ctx)
        zs_finalize(r.ctx);
}

/* zeroshard.device_comm and ZS_DEVICE_COMM: an unknown value, and a NCCL mode on a device that is not a GPU,
 * fail zs_init naming the key; "staged" is taken on the separate device (its transport anyway). */
static void check_device_comm(void)
{
    static const struct {
        const char *cfg, *env, *key; /* key NULL: accepted */
        bool gpu_too;
    } cases[] = {
        { "nccl", NULL, "zeroshard.device_comm: \"nccl\" needs zeroshard.device \"cuda\"", false },
        { "ordered", NULL, "zeroshard.device_comm: \"ordered\" needs zeroshard.device \"cuda\"", false },
        { "staged", NULL, NULL, false },
        { "auto", "fast", "ZS_DEVICE_COMM: expected \"auto\", \"nccl\", \"ordered\" or \"staged\"", true },
    };
    const char *saved = getenv("ZS_DEVICE_COMM");
    char keep[32] = "", json[512];

    if (saved)
        snprintf(keep, sizeof(keep), "%s", saved);
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        struct run r;
        zs_status st;
        if (!cases[k].gpu_too && strcmp(devname, "separate"))
            continue;
        if (cases[k].env)
            setenv("ZS_DEVICE_COMM", cases[k].env, 1);
        else
            unsetenv("ZS_DEVICE_COMM");
        snprintf(json, sizeof(json), "{\"train_micro_batch_size_per_gpu\": 1, \"zeroshard\": {\"device\": \"%s\", "
                 "\"device_comm\": \"%s\"}}", !strcmp(devname, "cuda") ? "cuda" : "cpu", cases[k].cfg);
        st = run_open(&r, devname, json);
        if (cases[k].key)
            CHECK(st == ZS_ERR_CONFIG && strstr(zs_last_error(), cases[k].key),
                  "device_comm %s (env %s): status %d, \"%s\" should name %s", cases[k].cfg,
                  cases[k].env ? cases[k].env : "unset", (int)st, zs_last_error(), cases[k].key);
        else
            CHECK(st == ZS_OK, "device_comm %s: %s", cases[k].cfg, zs_last_error());
        if (r.ctx)
            zs_finalize(r.ctx);
    }
    if (keep[0])
        setenv("ZS_DEVICE_COMM", keep, 1);
    else
        unsetenv("ZS_DEVICE_COMM");
}

/* zextra: more zero_optimization keys (", \"key\": value"); tag: what they are, for the case's name */
static void one_case(int stage, int offload, const char *dtype, int gas, bool prescale, const char *zextra,
                     const char *tag)
{
    char json[1536], name[160], why[600] = "", dref[300], ddev[300];
    uint64_t href = 0, hdev = 0, hx1 = 0, hx2 = 0;
    zs_status st;
    static int ncase;

    snprintf(name, sizeof(name), "stage %d offload %s %s gas %d%s%s%s", stage,
             offload == 3 ? "nvme, offload_param nvme" : offload == 2 ? "nvme" : offload ? "cpu" : "none", dtype, gas,
             prescale ? " prescale" : "", tag[0] ? " " : "", tag);
    ncase++; /* each case's checkpoints in folders of their own */
    snprintf(dref, sizeof(dref), "%s/ref_%d", dir, ncase);
    snprintf(ddev, sizeof(ddev), "%s/dev_%d", dir, ncase);
    if (!cfg_json(json, sizeof(json), "cpu", stage, offload, dtype, gas, prescale, zextra))
        return zs_test_report(name, "config too long");
    st = session("cpu", json, NULL, 0, 4 * gas, dref, &href);
    if (st)
        snprintf(why, sizeof(why), "cpu run: %s", zs_last_error());
    cfg_json(json, sizeof(json), devname, stage, offload, dtype, gas, prescale, zextra);
    if (!st && (st = session(devname, json, NULL, 0, 4 * gas, ddev, &hdev)))
        snprintf(why, sizeof(why), "%s run: %s", devname, zs_last_error());
    if (!st && href != hdev)
        snprintf(why, sizeof(why), "params-hash %016llx on %s, %016llx on cpu", (unsigned long long)hdev, devname,
                 (unsigned long long)href);
    /* crossed over: the CPU's checkpoint continued on the device, the device's on the CPU */
    if (!st && !why[0] && (st = session(devname, json, dref, 4 * gas, 2 * gas, NULL, &hx1)))
        snprintf(why, sizeof(why), "%s run from the cpu checkpoint: %s", devname, zs_last_error());
    cfg_json(json, sizeof(json), "cpu", stage, offload, dtype, gas, prescale, zextra);
    if (!st && !why[0] && (st = session("cpu", json, ddev, 4 * gas, 2 * gas, NULL, &hx2)))
        snprintf(why, sizeof(why), "cpu run from the %s checkpoint: %s", devname, zs_last_error());
    if (!st && !why[0] && hx1 != hx2)
        snprintf(why, sizeof(why), "after the crossed checkpoints: %016llx on %s, %016llx on cpu",
                 (unsigned long long)hx1, devname, (unsigned long long)hx2);
    if (rank == 0)
        zs_test_report(name, why[0] ? why : NULL);
    else if (why[0])
        zs_test_fail++;
}

/* Past one node, on the device against the CPU device: hybrid sharding (shard groups of half the ranks; its
 * collectives host-staged) and ZeRO++'s quantized collectives (host-staged on the device, with the CPU's
 * quantization), across the nodes ZS_FAKE_NODE_SIZE forces. The same bits, as every device path. */
static void scale_cases(void)
{
    static const char *const qw = ", \"zero_quantized_weights\": true", *qg = ", \"zero_quantized_gradients\": true";
    char hybrid[64], both[128];

    snprintf(hybrid, sizeof(hybrid), ", \"mics_shard_size\": %d", world / 2);
    snprintf(both, sizeof(both), "%s%s", qw, qg);
    one_case(1, 0, "fp32", 1, false, hybrid, "hybrid");
    one_case(2, 1, "bf16", 2, false, hybrid, "hybrid");
    one_case(3, 0, "fp32", 2, false, hybrid, "hybrid");
    one_case(3, 0, "fp16", 1, false, hybrid, "hybrid");
    one_case(2, 0, "fp32", 2, false, qg, "quantized gradients");
    one_case(3, 0, "fp32", 1, false, both, "quantized weights and gradients");
    one_case(3, 1, "bf16", 2, false, both, "quantized weights and gradients");
    one_case(3, 0, "fp16", 1, false, qw, "quantized weights");
}

int main(int argc, char **argv)
{
    int provided;

    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    devname = argc > 1 ? argv[1] : "separate";
    scale = argc > 2 && !strcmp(argv[2], "scale");
    if ((strcmp(devname, "separate") && strcmp(devname, "cuda")) || (argc > 2 && !scale) ||
        (scale && (world < 2 || world % 2))) {
        if (rank == 0)
            fprintf(stderr, "usage: test_devpath separate|cuda [scale (an even number of ranks)]\n");
        MPI_Finalize();
        return 2;
    }
    if (!strcmp(devname, "cuda")) { /* a GPU, or skip */
        zs_ctx *c = NULL;
        zs_init_opts o = { .config_json = "{\"train_micro_batch_size_per_gpu\": 1, \"zeroshard\": {\"device\": \"cuda\"}}",
                           .use_comm = 1, .comm = MPI_COMM_WORLD, .quiet = 1 };
        if (zs_init(&c, &o)) {
            if (rank == 0)
                printf("SKIP: %s\n", zs_last_error());
            MPI_Finalize();
            return 77;
        }
        zs_finalize(c);
    }
    if (rank == 0) {
        snprintf(dir, sizeof(dir), "%s/zs_devpath_XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
        if (!mkdtemp(dir))
            dir[0] = 0;
        char nv[300];
        snprintf(nv, sizeof(nv), "%s/nvme", dir);
        if (dir[0] && mkdir(nv, 0700))
            dir[0] = 0;
    }
    MPI_Bcast(dir, sizeof(dir), MPI_CHAR, 0, MPI_COMM_WORLD);
    CHECK(dir[0], "mkdtemp");
    if (dir[0] && scale) {
        scale_cases();
    } else {
        if (dir[0])
            check_refusals();
        check_device_comm();
    }
    static const char *const dtypes[] = { "fp32", "bf16", "fp16" };
    for (int stage = 0; dir[0] && !scale && stage <= 3; stage++)
        for (int off = 0; off <= (stage == 3 ? 3 : stage > 0 ? 2 : 0); off++) /* offload needs stage 1-3 */
            for (int d = 0; d < 3; d++)
                one_case(stage, off, dtypes[d], d == 1 ? 2 : 1, stage == 2 && d == 0, "", "");
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0 && dir[0]) {
        char cmd[300];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
        if (system(cmd))
            fprintf(stderr, "could not remove %s\n", dir);
    }
    int fails = zs_test_fail, all = 0;
    MPI_Allreduce(&fails, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0)
        zs_test_summary(world > 1 ? "test_devpath (several ranks)" : "test_devpath");
    MPI_Finalize();
    return all ? 1 : 0;
}
