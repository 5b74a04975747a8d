/* consumer.c - a program outside the tree that links the installed libzeroshard: one tiny model,
 * two steps at stage 3, prints the resulting first parameter. */
#include <stdio.h>
#include <zeroshard.h>

int main(void)
{
    const char *cfg = "{\"train_micro_batch_size_per_gpu\": 1, \"zero_optimization\": {\"stage\": 3,"
                      " \"stage3_param_persistence_threshold\": 0},"
                      " \"optimizer\": {\"type\": \"SGD\", \"params\": {\"lr\": 0.5}}}";
    zs_init_opts o = { .config_json = cfg, .quiet = 1 };
    float init[3] = { 1.0f, 2.0f, 3.0f }, *g, *w;
    zs_ctx *ctx;
    int32_t u, p;

    if (zs_init(&ctx, &o) || zs_unit_add(ctx, "only", &u) || zs_param_add(ctx, u, "w", 3, init, &p) ||
        zs_setup(ctx)) {
        fprintf(stderr, "zeroshard: error: %s\n", zs_last_error());
        return 1;
    }
    for (int step = 0; step < 2; step++) {
        if (zs_unit_fetch(ctx, u, NULL) || zs_grad_get(ctx, u, &g))
            return 1;
        g[0] += 1.0f; /* d/dw0 of w0: every rank contributes 1, the mean is 1 */
        if (zs_grad_ready(ctx, u) || zs_unit_release(ctx, u) || zs_step(ctx))
            return 1;
    }
    if (zs_unit_fetch(ctx, u, (void **)&w))
        return 1;
    printf("consumer: world %d w0 %g\n", zs_world_size(ctx), w[0]); /* 1 - 0.5 - 0.5 = 0 */
    int ok = w[0] == 0.0f && w[1] == 2.0f;
    zs_unit_release(ctx, u);
    zs_finalize(ctx);
    return ok ? 0 : 1;
}
