/* schedule.h - DeepSpeed's learning-rate schedules (WarmupLR, WarmupDecayLR, WarmupCosineLR). */
#ifndef ZS_SCHEDULE_H
#define ZS_SCHEDULE_H

#include <stdint.h>

#include "config.h" /* defines: struct zs_sched_config */

/* The learning rate of optimizer step `step` (1-based). DeepSpeed sets the lr at construction
 * (iteration -1) and advances the scheduler after every optimizer step, so step t uses iteration t-2. */
double zs_schedule_lr(const struct zs_sched_config *s, double base_lr, int64_t step);

#endif /* ZS_SCHEDULE_H */
