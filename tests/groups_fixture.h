/* groups_fixture.h - what test_groups.c shares with its model (groups_fixture.c). */
#ifndef ZS_TEST_GROUPS_FIXTURE_H
#define ZS_TEST_GROUPS_FIXTURE_H

#include <stdbool.h>
#include <stdint.h>
#include <mpi.h>

#include "zeroshard.h"

extern int rank, world;
extern MPI_Comm run_comm;     /* the ranks a model runs on (MPI_COMM_WORLD, or fewer for a checkpoint's saver) */
extern bool same_grads;       /* every rank the same gradients, of few bits: the mean is exact at any world size */
extern bool deterministic;    /* zeroshard.deterministic, one micro-shard per micro-batch */
extern const char *device;    /* argv[1]: "cuda" in the build against the CUDA emulator */
extern char scratch[256];     /* a directory for the NVMe and checkpoint cases, shared by the ranks */

enum { NP = 7, MAXN = 96, STEPS = 4, SET_AFTER = 2 };
/* Groups change inside units (so inside a rank's shard), at unit ends and across alignment gaps. Unit 3 is
 * frozen in the frozen cases, and left out of the model in MODEL_NO_FROZEN. */
extern const int64_t sizes[NP];
extern const int32_t unit_of[NP], group_of[NP];
extern const char *const opt_name[];
#define CFG_LR 0.02 /* the config's lr the schedule's ratio divides by */

enum opt { OPT_ADAMW, OPT_ADAM, OPT_SGD };
enum model { MODEL_ALL, MODEL_FROZEN, MODEL_NO_FROZEN };
/* What a misuse case breaks before zs_setup (MISUSE_NONE: nothing). */
enum misuse { MISUSE_NONE, MISUSE_MIXED, MISUSE_RANKS, MISUSE_MOMENTUM };

struct run {
    enum opt opt;
    enum model model;
    int stage;
    const char *offload; /* "none", "cpu", "nvme"; "+params": offload_param too (stage 3) */
    bool separate;       /* the separate test device: the offloaded step from a device */
    enum misuse misuse;
    bool bf16;           /* bf16 training (fp32 masters for the trainable units only) */
};

struct model_ctx {
    zs_ctx *ctx;
    int32_t unit[4], param[NP];
};

uint16_t to_bf16(float f);
float from_bf16(uint16_t h);
zs_group_opts group_opts(enum opt o, int g); /* groups 1 and 2 (group 0 is the config's) */
zs_group_opts group_change(void);            /* what zs_group_set changes in group 1 after SET_AFTER steps */
bool in_model(enum model m, int j);
int nunits_of(enum model m);
bool frozen_param(enum model m, int j);
float init_value(int j, int64_t i);
float grad_value(int r, int k, int j, int64_t i); /* rank r's, at step k, of element i of parameter j */
void config_json(const struct run *r, char *json, size_t len);
zs_status model_open(struct model_ctx *m, const struct run *r);          /* zs_init .. zs_setup on run_comm */
zs_status model_step(struct model_ctx *m, const struct run *r, int k);   /* one micro-batch and zs_step */
zs_status model_read(struct model_ctx *m, const struct run *r, float out[NP][MAXN]); /* gathered, as fp32 */

#endif /* ZS_TEST_GROUPS_FIXTURE_H */
