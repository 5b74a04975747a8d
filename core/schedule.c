/* schedule.c - learning-rate schedules with DeepSpeed's exact formulas (see lr_schedules.py):
 * warmup steps are clamped to at least 2, "log" warmup is log(it+1)/log(warmup). */
#include <math.h>

#include "schedule.h"

static double warmup_gamma(const struct zs_sched_config *s, int64_t it, int64_t warm)
{
    if (s->warmup_type == ZS_WARMUP_LINEAR)
        return (double)it / (double)warm;
    return log((double)it + 1.0) / log((double)warm);
}

static double warmup_lr(const struct zs_sched_config *s, int64_t it)
{
    int64_t warm = s->warmup_num_steps < 2 ? 2 : s->warmup_num_steps;
    double delta = s->warmup_max_lr - s->warmup_min_lr;
    double gamma;

    if (it < 0)
        return s->warmup_min_lr;
    if (it < warm)
        gamma = warmup_gamma(s, it, warm);
    else if (s->type == ZS_SCHED_WARMUP_DECAY_LR) {
        double span = (double)(s->total_num_steps - warm);
        gamma = (double)(s->total_num_steps - it) / (span < 1.0 ? 1.0 : span);
        if (gamma < 0.0)
            gamma = 0.0;
    } else
        gamma = 1.0;
    return s->warmup_min_lr + delta * gamma;
}

static double cosine_ratio(const struct zs_sched_config *s, int64_t it)
{
    int64_t warm = s->warmup_num_steps < 2 ? 2 : s->warmup_num_steps;
    double ratio;

    if (it < 0)
        return 0.0;
    if (it < warm) {
        ratio = warmup_gamma(s, it, warm);
        return s->warmup_min_ratio + ratio * (1.0 - s->warmup_min_ratio);
    }
    double real_step = (double)(it - warm + 1);
    double real_total = (double)(s->total_num_steps - warm);

    if (real_total < 1.0) /* DeepSpeed divides by zero here; the config check warns, we stay finite */
        real_total = 1.0;
    ratio = (1.0 + cos(M_PI * real_step / real_total)) / 2.0;
    ratio = s->cos_min_ratio + (1.0 - s->cos_min_ratio) * ratio;
    return ratio < 0.0 ? 0.0 : ratio;
}

double zs_schedule_lr(const struct zs_sched_config *s, double base_lr, int64_t step)
{
    int64_t it = step - 2;

    switch (s->type) {
    case ZS_SCHED_WARMUP_LR:
    case ZS_SCHED_WARMUP_DECAY_LR:
        return warmup_lr(s, it);
    case ZS_SCHED_WARMUP_COSINE_LR:
        return base_lr * cosine_ratio(s, it);
    case ZS_SCHED_NONE:
        break;
    }
    return base_lr;
}
