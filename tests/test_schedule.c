/* test_schedule.c - learning-rate schedules against values computed by hand from DeepSpeed's formulas.
 * Step t (1-based) uses scheduler iteration t - 2; iteration -1 is the value set at construction. */
#include <math.h>

#include "check.h"
#include "core/schedule.h"

#define NEAR(a, b) (fabs((a) - (b)) <= 1e-12 + 1e-9 * fabs(b))

int main(void)
{
    struct zs_sched_config s = { .type = ZS_SCHED_WARMUP_LR, .warmup_min_lr = 0.0, .warmup_max_lr = 0.01,
                                 .warmup_num_steps = 10, .warmup_type = ZS_WARMUP_LOG };
    double v;

    CHECK(zs_schedule_lr(&s, 0.5, 1) == 0.0, "WarmupLR step 1 uses min lr");
    CHECK(zs_schedule_lr(&s, 0.5, 2) == 0.0, "WarmupLR iteration 0: log(1) = 0");
    v = zs_schedule_lr(&s, 0.5, 3); /* 0.01 * ln 2 / ln 10 */
    CHECK(NEAR(v, 0.01 * 0.69314718055994531 / 2.3025850929940457), "WarmupLR log it 1: %.17g", v);
    CHECK(NEAR(zs_schedule_lr(&s, 0.5, 12), 0.01), "WarmupLR after warm-up holds max");
    CHECK(NEAR(zs_schedule_lr(&s, 0.5, 1000), 0.01), "WarmupLR holds max");
    s.warmup_type = ZS_WARMUP_LINEAR;
    s.warmup_min_lr = 0.001;
    v = zs_schedule_lr(&s, 0.5, 3); /* 0.001 + 0.009 * 1/10 */
    CHECK(NEAR(v, 0.0019), "WarmupLR linear it 1: %.17g", v);
    CHECK(NEAR(zs_schedule_lr(&s, 0.5, 1), 0.001), "WarmupLR linear step 1: min");
    s.warmup_num_steps = 0; /* clamped to 2 as in DeepSpeed */
    CHECK(NEAR(zs_schedule_lr(&s, 0.5, 3), 0.001 + 0.009 * 0.5), "warm-up 0 behaves as 2");

    s = (struct zs_sched_config){ .type = ZS_SCHED_WARMUP_DECAY_LR, .warmup_min_lr = 0.0, .warmup_max_lr = 0.01,
                                  .warmup_num_steps = 10, .total_num_steps = 20, .warmup_type = ZS_WARMUP_LINEAR };
    CHECK(NEAR(zs_schedule_lr(&s, 0.5, 7), 0.005), "WarmupDecayLR linear warm-up it 5");
    CHECK(NEAR(zs_schedule_lr(&s, 0.5, 12), 0.01), "WarmupDecayLR it 10: (20-10)/(20-10)");
    CHECK(NEAR(zs_schedule_lr(&s, 0.5, 17), 0.005), "WarmupDecayLR it 15: 5/10");
    CHECK(NEAR(zs_schedule_lr(&s, 0.5, 22), 0.0), "WarmupDecayLR it 20: 0");
    CHECK(zs_schedule_lr(&s, 0.5, 40) == 0.0, "WarmupDecayLR never negative");

    s = (struct zs_sched_config){ .type = ZS_SCHED_WARMUP_COSINE_LR, .warmup_num_steps = 10, .total_num_steps = 20,
                                  .warmup_min_ratio = 0.0, .cos_min_ratio = 1e-4, .warmup_type = ZS_WARMUP_LOG };
    CHECK(zs_schedule_lr(&s, 0.1, 1) == 0.0, "WarmupCosineLR before start: 0");
    v = zs_schedule_lr(&s, 0.1, 3);
    CHECK(NEAR(v, 0.1 * 0.69314718055994531 / 2.3025850929940457), "WarmupCosineLR log warm-up: %.17g", v);
    v = zs_schedule_lr(&s, 0.1, 12); /* real step 1 of 10: (1 + cos(pi/10)) / 2 = 0.97552825814757682 */
    CHECK(NEAR(v, 0.1 * (1e-4 + (1.0 - 1e-4) * 0.97552825814757682)), "WarmupCosineLR it 10: %.17g", v);
    v = zs_schedule_lr(&s, 0.1, 21); /* real step 10 of 10: cos(pi) = -1 -> ratio cos_min_ratio */
    CHECK(NEAR(v, 0.1 * 1e-4), "WarmupCosineLR end: %.17g", v);
    s.warmup_min_ratio = 0.5;
    s.warmup_type = ZS_WARMUP_LINEAR;
    CHECK(NEAR(zs_schedule_lr(&s, 0.1, 7), 0.1 * (0.5 + 0.5 * 0.5)), "WarmupCosineLR linear with min ratio");

    s = (struct zs_sched_config){ .type = ZS_SCHED_NONE };
    CHECK(zs_schedule_lr(&s, 0.25, 1) == 0.25 && zs_schedule_lr(&s, 0.25, 99) == 0.25, "no schedule: constant");
    return zs_test_summary("test_schedule");
}
