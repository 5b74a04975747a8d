/* flight.c - the flight recorder's ring and its dump (see flight.h). The ring costs two clock reads and
 * a 64-byte store per collective; the dump is text, one line per entry, oldest first. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h" /* defines: zs_now_s */
#include "base/error.h"
#include "comm/comm.h"
#include "flight.h"
#include "comm/shm.h" /* defines: struct zs_shm_desc */

enum entry_state { ENTRY_RUNNING, ENTRY_DONE, ENTRY_FAILED };

struct entry {
    const char *call;   /* an engine call's name, or NULL for a collective */
    uint64_t seq, count, bytes;
    int64_t step;
    int32_t kind, purpose, unit, state;
    double t0, t1;
};

struct zs_flight {
    struct entry ring[ZS_FLIGHT_RING];
    uint64_t n;         /* entries ever recorded; the newest is ring[(n - 1) % ZS_FLIGHT_RING] */
    int32_t rank, world;
    double epoch;
    char dir[512];
    char name[32];      /* "" or "-NAME": a second communicator's recorder */
};

static volatile sig_atomic_t usr1;

static void on_usr1(int sig)
{
    (void)sig;
    usr1 = 1;
}

bool zs_flight_signalled(void)
{
    if (!usr1)
        return false;
    usr1 = 0;
    return true;
}

/* The launcher's job id, so that two jobs on one machine do not write over each other's dumps. */
static void default_dir(char *b, size_t n)
{
    static const char *const vars[] = {"SLURM_JOB_ID", "PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid", NULL};
    const char *id = NULL;
    char clean[64];
    size_t k = 0;

    for (int i = 0; vars[i] && !id; i++)
        if (getenv(vars[i]) && *getenv(vars[i]))
            id = getenv(vars[i]);
    if (!id) {
        snprintf(b, n, "/tmp/zeroshard-flight-%ld", (long)getppid());
        return;
    }
    for (; *id && k + 1 < sizeof(clean); id++) /* a namespace like "prterun-host-123@1" is not a file name */
        clean[k++] = (*id >= '0' && *id <= '9') || (*id >= 'a' && *id <= 'z') || (*id >= 'A' && *id <= 'Z') ||
                     *id == '-' || *id == '_' ? *id : '_';
    clean[k] = '\0';
    snprintf(b, n, "/tmp/zeroshard-flight-%s", clean);
}

struct zs_flight *zs_flight_new(int32_t rank, int32_t world, const char *cfg_dir)
{
    struct zs_flight *f = calloc(1, sizeof(*f));
    const char *env = getenv("ZS_FLIGHT_DIR");
    struct sigaction old;

    if (!f)
        return NULL;
    f->rank = rank;
    f->world = world;
    f->epoch = zs_now_s();
    if (env && *env)
        snprintf(f->dir, sizeof(f->dir), "%s", env);
    else if (cfg_dir && *cfg_dir)
        snprintf(f->dir, sizeof(f->dir), "%s", cfg_dir);
    else
        default_dir(f->dir, sizeof(f->dir));
    /* a program's own SIGUSR1 handler wins: the recorder still dumps on timeouts and errors */
    if (sigaction(SIGUSR1, NULL, &old) == 0 && old.sa_handler == SIG_DFL && !(old.sa_flags & SA_SIGINFO)) {
        struct sigaction sa = {0};
        sa.sa_handler = on_usr1;
        sa.sa_flags = SA_RESTART;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGUSR1, &sa, NULL);
    }
    return f;
}

void zs_flight_set_name(struct zs_flight *f, const char *name)
{
    if (f && name && *name)
        snprintf(f->name, sizeof(f->name), "-%.30s", name);
}

void zs_flight_free(struct zs_flight *f)
{
    free(f);
}

const char *zs_flight_dir(const struct zs_flight *f)
{
    return f ? f->dir : "";
}

static struct entry *entry_new(struct zs_flight *f)
{
    struct entry *e = &f->ring[f->n++ % ZS_FLIGHT_RING];

    memset(e, 0, sizeof(*e));
    e->t0 = zs_now_s() - f->epoch;
    return e;
}

void zs_flight_op_start(struct zs_flight *f, uint64_t seq, int32_t kind, const void *desc,
                        uint64_t bytes)
{
    const struct zs_shm_desc *d = desc;
    struct entry *e;

    if (!f)
        return;
    e = entry_new(f);
    *e = (struct entry){.seq = seq, .count = d->count, .bytes = bytes, .step = d->step, .kind = kind,
                        .purpose = d->purpose, .unit = d->unit, .state = ENTRY_RUNNING, .t0 = e->t0};
}

/* The entry of operation seq, if still in the ring (the newest entries are searched first). */
void zs_flight_op_end(struct zs_flight *f, uint64_t seq, zs_status st)
{
    if (!f)
        return;
    for (uint64_t i = 0; i < f->n && i < ZS_FLIGHT_RING; i++) {
        struct entry *e = &f->ring[(f->n - 1 - i) % ZS_FLIGHT_RING];
        if (!e->call && e->seq == seq && e->state == ENTRY_RUNNING) {
            e->state = st ? ENTRY_FAILED : ENTRY_DONE;
            e->t1 = zs_now_s() - f->epoch;
            return;
        }
    }
}

void zs_flight_call(struct zs_flight *f, const char *call, int32_t unit, int64_t step)
{
    struct entry *e;

    if (!f)
        return;
    e = entry_new(f);
    e->call = call;
    e->unit = unit;
    e->step = step;
    e->state = ENTRY_DONE;
    e->t1 = e->t0;
}

static const char *kind_text(int32_t k)
{
    return k == 0 ? "reduce-scatter" : k == 1 ? "all-gather" : k == 2 ? "all-reduce" : "?";
}

static const char *state_text(int32_t s)
{
    return s == ENTRY_RUNNING ? "running" : s == ENTRY_DONE ? "done" : "failed";
}

static void entry_write(FILE *o, const struct entry *e)
{
    if (e->call)
        fprintf(o, "call - %s - %d %lld - - %.6f %.6f done\n", e->call, e->unit, (long long)e->step, e->t0, e->t1);
    else
        fprintf(o, "op %llu %s %s %d %lld %llu %llu %.6f %.6f %s\n", (unsigned long long)e->seq, kind_text(e->kind),
                zs_comm_purpose_name(e->purpose), e->unit, (long long)e->step, (unsigned long long)e->count,
                (unsigned long long)e->bytes, e->t0, e->state == ENTRY_RUNNING ? -1.0 : e->t1, state_text(e->state));
}

void zs_flight_write(struct zs_flight *f, const char *why)
{
    char path[640], tmp[660], reason[1024];
    uint64_t first;
    FILE *o;

    if (!f)
        return;
    if (mkdir(f->dir, 0700) != 0 && errno != EEXIST)
        goto fail;
    snprintf(path, sizeof(path), "%s/flight-rank%d%s.txt", f->dir, f->rank, f->name);
    snprintf(tmp, sizeof(tmp), "%s.tmp%ld", path, (long)getpid());
    o = fopen(tmp, "w");
    if (!o)
        goto fail;
    snprintf(reason, sizeof(reason), "%s", why ? why : "");
    for (char *p = reason; *p; p++)
        if (*p == '\n')
            *p = ' ';
    fprintf(o, "# zeroshard flight recorder: rank %d of %d, pid %ld, at %.6f s\n# why: %s\n", f->rank, f->world,
            (long)getpid(), zs_now_s() - f->epoch, reason);
    fprintf(o, "# type seq kind purpose unit step count bytes start_s end_s state\n");
    first = f->n > ZS_FLIGHT_RING ? f->n - ZS_FLIGHT_RING : 0;
    for (uint64_t i = first; i < f->n; i++)
        entry_write(o, &f->ring[i % ZS_FLIGHT_RING]);
    if (fclose(o) != 0 || rename(tmp, path) != 0) {
        unlink(tmp);
        goto fail;
    }
    return;
fail:
    fprintf(stderr, "zeroshard: rank %d: flight recorder: cannot write to %s: %s\n", f->rank, f->dir, strerror(errno));
}
