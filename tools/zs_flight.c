/* zs_flight.c - zs-flight DIR: lines up the ranks' flight recorders (DIR/flight-rank<R>.txt, written on a
 * timeout, a failed collective or SIGUSR1) and names the first divergence: two ranks that issued different
 * operations at the same sequence number, else the rank that is behind (its last operation is older
 * than the others'), else ranks that wrote no record. Exit status 0: no divergence found; 1: one was
 * named; 2: the directory could not be read. */
#include <dirent.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_RANKS 4096

struct op {
    unsigned long long seq, count, bytes;
    long long step;
    int unit;
    char kind[24], purpose[16], state[12];
};

struct rank_rec {
    bool present;
    int world;
    struct op *ops;
    int nops, cap;
    char why[1024];
};

static struct rank_rec *recs;
static int nranks; /* highest rank seen + 1, or the world size a header gave */

static int add_op(struct rank_rec *r, const struct op *o)
{
    if (r->nops == r->cap) {
        int cap = r->cap ? 2 * r->cap : 256;
        struct op *p = realloc(r->ops, (size_t)cap * sizeof(*p));
        if (!p)
            return -1;
        r->ops = p;
        r->cap = cap;
    }
    r->ops[r->nops++] = *o;
    return 0;
}

/* One file: its header names the rank and world; "op" lines are the collectives (calls are context). */
static int read_file(const char *path)
{
    FILE *f = fopen(path, "r");
    char line[1024];
    int rank = -1, world = 0;

    if (!f)
        return -1;
    while (fgets(line, sizeof(line), f)) {
        struct op o = {0};
        if (sscanf(line, "# zeroshard flight recorder: rank %d of %d", &rank, &world) == 2) {
            if (rank < 0 || rank >= MAX_RANKS || world < 1 || world > MAX_RANKS)
                break;
            if (world > nranks)
                nranks = world;
            recs[rank].present = true;
            recs[rank].world = world;
            continue;
        }
        if (rank >= 0 && !strncmp(line, "# why: ", 7)) {
            snprintf(recs[rank].why, sizeof(recs[rank].why), "%s", line + 7);
            recs[rank].why[strcspn(recs[rank].why, "\n")] = '\0';
            continue;
        }
        if (rank < 0 || strncmp(line, "op ", 3))
            continue;
        if (sscanf(line, "op %llu %23s %15s %d %lld %llu %llu %*f %*f %11s", &o.seq, o.kind, o.purpose, &o.unit,
                   &o.step, &o.count, &o.bytes, o.state) == 8 && add_op(&recs[rank], &o)) {
            fclose(f);
            return -1;
        }
    }
    fclose(f);
    return rank >= 0 ? 0 : -1;
}

static const struct op *find(const struct rank_rec *r, unsigned long long seq)
{
    for (int i = r->nops - 1; i >= 0; i--)
        if (r->ops[i].seq == seq)
            return &r->ops[i];
    return NULL;
}

static bool same(const struct op *a, const struct op *b)
{
    return !strcmp(a->kind, b->kind) && !strcmp(a->purpose, b->purpose) && a->unit == b->unit && a->step == b->step &&
           a->count == b->count;
}

static void op_text(char *b, size_t n, const struct op *o)
{
    char unit[24] = "";

    if (o->unit >= 0)
        snprintf(unit, sizeof(unit), " of unit %d", o->unit);
    snprintf(b, n, "operation %llu: %s (%s%s) of %llu elements at micro-step %lld, %s", o->seq, o->kind, o->purpose,
             unit, o->count, o->step, o->state);
}

/* Different operations at one sequence number: the first such number among those every rank still holds. */
static bool first_mismatch(unsigned long long lo, unsigned long long hi)
{
    for (unsigned long long s = lo; s <= hi; s++) {
        const struct op *ref = NULL;
        int rref = -1;
        for (int r = 0; r < nranks; r++) {
            const struct op *o = recs[r].present ? find(&recs[r], s) : NULL;
            char a[256], b[256];
            if (!o)
                continue;
            if (!ref) {
                ref = o;
                rref = r;
                continue;
            }
            if (same(ref, o))
                continue;
            op_text(a, sizeof(a), ref);
            op_text(b, sizeof(b), o);
            printf("divergence at operation %llu: rank %d issued %s; rank %d issued %s\n", s, rref, a, r, b);
            return true;
        }
    }
    return false;
}

static unsigned long long last_seq(const struct rank_rec *r)
{
    unsigned long long m = 0;

    for (int i = 0; i < r->nops; i++)
        m = r->ops[i].seq > m ? r->ops[i].seq : m;
    return m;
}

/* The ranks whose newest operation is older than the newest anyone issued. */
static bool behind(void)
{
    unsigned long long lo = UINT64_MAX, hi = 0;
    int ahead = -1;
    bool found = false;

    for (int r = 0; r < nranks; r++) {
        if (!recs[r].present || !recs[r].nops)
            continue;
        unsigned long long l = last_seq(&recs[r]);
        lo = l < lo ? l : lo;
        if (l > hi || ahead < 0) {
            hi = l;
            ahead = r;
        }
    }
    if (ahead < 0 || lo == hi)
        return false;
    for (int r = 0; r < nranks; r++) {
        char a[256], b[256];
        if (!recs[r].present || !recs[r].nops || last_seq(&recs[r]) != lo)
            continue;
        op_text(a, sizeof(a), find(&recs[r], lo));
        const struct op *next = find(&recs[ahead], lo + 1);
        if (next)
            op_text(b, sizeof(b), next);
        else
            snprintf(b, sizeof(b), "operation %llu", lo + 1);
        printf("rank %d is behind: its last %s; rank %d went on to operation %llu (next expected: %s)\n", r, a, ahead,
               hi, b);
        found = true;
    }
    return found;
}

int main(int argc, char **argv)
{
    unsigned long long lo = 0, hi = 0;
    struct dirent *e;
    bool any = false, verdict;
    DIR *d;

    if (argc != 2 || !strcmp(argv[1], "--help")) {
        fprintf(stderr, "usage: zs-flight DIR\nLines up DIR/flight-rank<R>.txt and names the first divergence.\n");
        return argc == 2 ? 0 : 2;
    }
    recs = calloc(MAX_RANKS, sizeof(*recs));
    d = opendir(argv[1]);
    if (!recs || !d) {
        fprintf(stderr, "zs-flight: %s: cannot read the directory\n", argv[1]);
        return 2;
    }
    while ((e = readdir(d))) {
        char path[4096];
        int r;
        if (sscanf(e->d_name, "flight-rank%d.txt", &r) != 1 || strstr(e->d_name, ".tmp"))
            continue;
        snprintf(path, sizeof(path), "%s/%s", argv[1], e->d_name);
        if (read_file(path) == 0)
            any = true;
        else
            fprintf(stderr, "zs-flight: %s: unreadable, skipped\n", path);
    }
    closedir(d);
    if (!any) {
        fprintf(stderr, "zs-flight: %s: no flight-rank<R>.txt files\n", argv[1]);
        return 2;
    }
    for (int r = 0; r < nranks; r++) {
        if (!recs[r].present)
            continue;
        printf("rank %d: %d operations recorded, last %llu; why: %s\n", r, recs[r].nops, last_seq(&recs[r]),
               recs[r].why);
        if (!recs[r].nops)
            continue;
        unsigned long long first = recs[r].ops[0].seq, l = last_seq(&recs[r]);
        lo = first > lo ? first : lo; /* older operations have left some rank's ring */
        hi = l > hi ? l : hi;
    }
    verdict = first_mismatch(lo, hi) || behind();
    for (int r = 0; r < nranks; r++)
        if (!recs[r].present) {
            printf("rank %d wrote no record (it died, or was stopped, before it could)\n", r);
            verdict = true;
        }
    if (!verdict)
        printf("no divergence: every rank issued the same operations, up to %llu\n", hi);
    return verdict ? 1 : 0;
}
