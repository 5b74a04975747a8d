/* test_plan.c - the memory plan against what set-up really allocates and what zs_estimate_memory predicts,
 * both held to a reference written here from the ZeRO arithmetic, per category in bytes: every stage x
 * offload none/cpu/nvme x fp32/bf16, and deterministic mode. Run under mpirun (1 and 3 ranks). */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <mpi.h>

#include "check.h"
#include "core/ctx.h" /* defines: struct zs_ctx (its plan and accounted memory) */

#define NUNITS 4
/* Around the persistence threshold (2000): two units stay whole at stage 3; 37 is smaller than 3 shards. */
static const int64_t sizes[NUNITS] = { 1000, 37, 65536, 5000 };
static int rank, world;
static char dir[64] = "/tmp/zs_test_plan_XXXXXX";

struct want {
    uint64_t cat[ZS_MEM_NCAT];
    uint64_t host; /* bytes in the host pool, swap slots aside */
};

/* The reference: Adam(W) keeps m and v, 16-bit parameters fp32 masters; stage 1 shards the optimizer state,
 * stage 2 the gradients, stage 3 the parameters of units at or above the threshold; NVMe holds what offload
 * nvme sends there. */
static struct want reference(int stage, int off, bool bf16, bool det)
{
    struct want w = { 0 };
    uint64_t p = bf16 ? 2 : 4, total = 0, largest = 0;

    for (int u = 0; u < NUNITS; u++) {
        uint64_t per = (uint64_t)(sizes[u] + world - 1) / (uint64_t)world;
        uint64_t sh = (per + 15) / 16 * 16, pad = sh * (uint64_t)world, opt = stage == 0 ? pad : sh;
        bool sharded = stage == 3 && sizes[u] >= 2000;
        uint64_t states = (bf16 ? 3 : 2) * 4 * opt; /* masters, m, v */
        total += pad;
        largest = pad > largest ? pad : largest;
        if (sharded && off == 2) {
            /* the shard in the swap file (16-bit: with its fp32 masters) */
        } else {
            w.cat[ZS_MEM_PARAMS] += p * (sharded ? sh : pad);
            w.host += sharded && off == 1 ? p * sh : 0;
        }
        /* stages 2-3 with the optimizer on NVMe (CPU device, not deterministic): the gradient shard in the swap
         * file too (ZeRO-Infinity) */
        w.cat[ZS_MEM_GRADS] += stage <= 1 ? p * pad : stage >= 2 && off == 2 && !det ? 0 : p * sh;
        if (det)
            w.cat[ZS_MEM_GRADS] += (stage >= 2 ? p * pad : 0) + 14 * pad;
        if (off != 2) {
            w.cat[ZS_MEM_MASTER] += bf16 ? 4 * opt : 0;
            w.cat[ZS_MEM_OPTIM] += 2 * 4 * opt;
            w.host += off == 1 ? states : 0;
        }
    }
    if (stage >= 2 && !det) { /* reduce_bucket_size 3000, at least the largest unit; 64 bytes slack a unit */
        uint64_t cap = total < 3000 ? total : 3000;
        w.cat[ZS_MEM_BUFFERS] = p * (cap < largest ? largest : cap) + 64 * NUNITS;
    }
    return w;
}

static zs_status open_engine(zs_ctx **ctx, const char *json)
{
    zs_init_opts o = { .config_json = json, .use_comm = 1, .comm = MPI_COMM_WORLD, .quiet = 1 };
    zs_status st = zs_init(ctx, &o);

    for (int u = 0; !st && u < NUNITS; u++) {
        char name[16];
        int32_t unit, param;
        snprintf(name, sizeof(name), "u%d", u);
        st = zs_unit_add(*ctx, name, &unit);
        if (!st)
            st = zs_param_add(*ctx, unit, name, sizes[u], NULL, &param);
    }
    return st ? st : zs_setup(*ctx);
}

static void config(char *json, size_t len, int stage, int off, bool bf16, bool det)
{
    char opt[160] = "", par[160] = "";

    if (off == 1) {
        snprintf(opt, sizeof(opt), ", \"offload_optimizer\": {\"device\": \"cpu\"}");
        snprintf(par, sizeof(par), ", \"offload_param\": {\"device\": \"cpu\"}");
    } else if (off == 2) {
        snprintf(opt, sizeof(opt), ", \"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"%s\"}", dir);
        snprintf(par, sizeof(par), ", \"offload_param\": {\"device\": \"nvme\", \"nvme_path\": \"%s\"}", dir);
    }
    snprintf(json, len,
             "{\"train_micro_batch_size_per_gpu\": 1, \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01}},"
             "%s \"zero_optimization\": {\"stage\": %d, \"reduce_bucket_size\": 3000,"
             " \"stage3_param_persistence_threshold\": 2000, \"stage3_max_live_parameters\": 3000%s%s}%s}",
             bf16 ? "\"bf16\": {\"enabled\": true}," : "", stage, opt, stage == 3 ? par : "",
             det ? ", \"zeroshard\": {\"deterministic\": \"world_size_invariant\"}" : "");
}

static void check_case(int stage, int off, bool bf16, bool det)
{
    static const char *const offs[] = { "none", "cpu", "nvme" };
    struct want w = reference(stage, off, bf16, det);
    char json[1024], name[96];
    zs_memory_report est;
    zs_ctx *ctx = NULL;
    zs_status st;

    snprintf(name, sizeof(name), "stage %d offload %s %s%s", stage, offs[off], bf16 ? "bf16" : "fp32",
             det ? " deterministic" : "");
    config(json, sizeof(json), stage, off, bf16, det);
    st = open_engine(&ctx, json);
    CHECK(st == ZS_OK, "%s: %s", name, zs_last_error());
    if (!st) {
        for (int c = ZS_MEM_PARAMS; c <= ZS_MEM_BUFFERS; c++) {
            CHECK(ctx->mem[c] == w.cat[c], "%s: set-up allocated %llu bytes of %s, the reference %llu", name,
                  (unsigned long long)ctx->mem[c], zs_mem_cat_names[c], (unsigned long long)w.cat[c]);
            CHECK(ctx->plan.cat[c] == w.cat[c], "%s: the plan has %llu bytes of %s, the reference %llu", name,
                  (unsigned long long)ctx->plan.cat[c], zs_mem_cat_names[c], (unsigned long long)w.cat[c]);
        }
        CHECK(ctx->mem_host - ctx->mem[ZS_MEM_SWAP] == w.host && ctx->plan.home[ZS_HOME_HOST] == w.host,
              "%s: host pool holds %llu bytes besides swap slots, the plan %llu, the reference %llu", name,
              (unsigned long long)(ctx->mem_host - ctx->mem[ZS_MEM_SWAP]),
              (unsigned long long)ctx->plan.home[ZS_HOME_HOST], (unsigned long long)w.host);
    }
    zs_finalize(ctx);
    st = zs_estimate_memory(json, world, NUNITS, sizes, &est);
    CHECK(st == ZS_OK, "%s: estimate: %s", name, zs_last_error());
    CHECK(est.params == w.cat[ZS_MEM_PARAMS] && est.grads == w.cat[ZS_MEM_GRADS] &&
              est.master == w.cat[ZS_MEM_MASTER] && est.optimizer == w.cat[ZS_MEM_MASTER] + w.cat[ZS_MEM_OPTIM] &&
              est.comm_buffers == w.cat[ZS_MEM_BUFFERS],
          "%s: the estimate (params %llu, grads %llu, masters %llu, optimizer %llu, bucket %llu) is not the reference",
          name, (unsigned long long)est.params, (unsigned long long)est.grads, (unsigned long long)est.master,
          (unsigned long long)est.optimizer, (unsigned long long)est.comm_buffers);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (rank == 0 && !mkdtemp(dir))
        perror("mkdtemp");
    MPI_Bcast(dir, sizeof(dir), MPI_CHAR, 0, MPI_COMM_WORLD);
    for (int stage = 0; stage <= 3; stage++) {
        for (int off = 0; off <= (stage ? 2 : 0); off++) { /* offloads need stage 1 or above */
            check_case(stage, off, false, false);
            check_case(stage, off, true, false);
        }
        check_case(stage, 0, false, true);
    }
    int failed = zs_test_fail, any = 0;
    MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0)
        rmdir(dir);
    MPI_Finalize();
    if (rank == 0)
        return zs_test_summary("plan") || any;
    return failed ? 1 : 0;
}
