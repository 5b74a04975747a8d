/* test_cuda_stream.c - the program's stream as the engine's (zs_cuda_set_stream, zs_cuda_device,
 * zs_cuda_synchronize), which the PyTorch front end hands torch's current stream through, on the emulated GPU
 * (its streams run queued work as late as CUDA allows, so a missing order shows as stale values).
 * A one-unit model steps; the optimizer's kernels are then queued, not run, on the engine's stream. The program
 * hands over its own stream and reads the parameters through a copy on it: they must be the stepped ones, as
 * in a run that kept the engine's stream (the hand-over orders the new stream after the old). Then: the
 * engine computes on the handed stream (zs_cuda_stream), NULL gives the engine's own back, the ordinal is the
 * rank's, zs_cuda_synchronize returns, and on the CPU device each call is refused naming zeroshard.device. */
#include <string.h>
#include <cuda_runtime_api.h>
#include <mpi.h>

#include "check.h"
#include "zeroshard.h"

#define N 1000

static const char *cfg_json(const char *device)
{
    static char b[512];

    snprintf(b, sizeof(b), "{\"train_micro_batch_size_per_gpu\": 1, \"zero_optimization\": {\"stage\": 2}, "
             "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.1}}, \"zeroshard\": {\"device\": \"%s\"}}",
             device);
    return b;
}

static zs_ctx *start(const char *device, int32_t *unit)
{
    static float init[N];
    zs_init_opts o = { .config_json = cfg_json(device), .use_comm = 1, .comm = MPI_COMM_WORLD, .quiet = 1 };
    zs_ctx *ctx = NULL;
    int32_t param;

    for (int i = 0; i < N; i++)
        init[i] = (float)(i % 17) * 0.25f - 2.0f;
    CHECK(zs_init(&ctx, &o) == ZS_OK, "%s", zs_last_error());
    CHECK(zs_unit_add(ctx, "u", unit) == ZS_OK, "%s", zs_last_error());
    CHECK(zs_param_add(ctx, *unit, "w", N, init, &param) == ZS_OK, "%s", zs_last_error());
    CHECK(zs_setup(ctx) == ZS_OK, "%s", zs_last_error());
    return ctx;
}

/* One step with gradient g[i] = i - N/2, then the parameters as the host sees them through a copy on the
 * compute stream, after handing the engine `stream` (NULL: none) between the step and the read. */
static void step_and_read(void *stream, float *out)
{
    static float g[N];
    int32_t unit;
    zs_ctx *ctx = start("cuda", &unit);
    void *buf = NULL, *s = NULL;

    for (int i = 0; i < N; i++)
        g[i] = (float)(i - N / 2);
    CHECK(zs_grad_buffer(ctx, unit, &buf) == ZS_OK, "%s", zs_last_error());
    CHECK(zs_copy_from_host(ctx, buf, g, sizeof(g)) == ZS_OK, "%s", zs_last_error());
    CHECK(zs_grad_ready(ctx, unit) == ZS_OK, "%s", zs_last_error());
    CHECK(zs_step(ctx) == ZS_OK, "%s", zs_last_error());
    if (stream) {
        CHECK(zs_cuda_set_stream(ctx, stream) == ZS_OK, "%s", zs_last_error());
        CHECK(zs_cuda_stream(ctx, &s) == ZS_OK && s == stream, "%s", zs_last_error());
    }
    CHECK(zs_unit_fetch(ctx, unit, &buf) == ZS_OK, "%s", zs_last_error());
    CHECK(zs_copy_to_host(ctx, out, buf, N * sizeof(float)) == ZS_OK, "%s", zs_last_error());
    CHECK(zs_unit_release(ctx, unit) == ZS_OK, "%s", zs_last_error());
    CHECK(zs_cuda_synchronize(ctx) == ZS_OK, "%s", zs_last_error());
    if (stream) {
        void *own = NULL;
        CHECK(zs_cuda_set_stream(ctx, NULL) == ZS_OK, "%s", zs_last_error());
        CHECK(zs_cuda_stream(ctx, &own) == ZS_OK && own != stream && own != NULL, "%s", zs_last_error());
    }
    CHECK(zs_finalize(ctx) == ZS_OK, "%s", zs_last_error());
}

int main(void)
{
    static float kept[N], handed[N];
    cudaStream_t mine;
    int32_t ordinal = -2, unit;
    int rank, moved = 0;
    zs_ctx *cpu;

    MPI_Init(NULL, NULL);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    CHECK(cudaStreamCreateWithFlags(&mine, cudaStreamNonBlocking) == cudaSuccess, "%s", zs_last_error());
    step_and_read(NULL, kept);
    step_and_read(mine, handed);
    for (int i = 0; i < N; i++)
        moved += kept[i] != (float)(i % 17) * 0.25f - 2.0f;
    CHECK(moved > N / 2, "%s", zs_last_error()); /* the step changed the parameters */
    CHECK(memcmp(kept, handed, sizeof(kept)) == 0, "%s", zs_last_error());

    {
        zs_ctx *ctx = start("cuda", &unit);
        int n = 0;
        CHECK(zs_cuda_device(ctx, &ordinal) == ZS_OK, "%s", zs_last_error());
        CHECK(cudaGetDeviceCount(&n) == cudaSuccess && ordinal == 0 % n, "%s", zs_last_error());
        CHECK(zs_finalize(ctx) == ZS_OK, "%s", zs_last_error());
    }
    cpu = start("cpu", &unit);
    CHECK(zs_cuda_set_stream(cpu, mine) == ZS_ERR_UNSUPPORTED && strstr(zs_last_error(), "zeroshard.device"), "%s", zs_last_error());
    CHECK(zs_cuda_device(cpu, &ordinal) == ZS_ERR_UNSUPPORTED && ordinal == -1, "%s", zs_last_error());
    CHECK(zs_cuda_synchronize(cpu) == ZS_ERR_UNSUPPORTED, "%s", zs_last_error());
    CHECK(zs_finalize(cpu) == ZS_OK, "%s", zs_last_error());
    CHECK(cudaStreamDestroy(mine) == cudaSuccess, "%s", zs_last_error());
    if (rank == 0)
        printf("cuda_stream: the handed stream reads the stepped parameters (%d of %d moved), bit for bit as the "
               "engine's own\n", moved, N);
    MPI_Finalize();
    return zs_test_summary("cuda_stream");
}
