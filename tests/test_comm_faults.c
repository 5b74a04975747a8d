/* test_comm_faults.c - the collectives at the edges the ordinary test never reaches: a slow operation
 * followed by a thousand quick ones, sequence numbers crossing 2^32, the MPI standard's smallest tag
 * limit, ranks that disagree on what they are doing, failures part-way, and failures on the way to the
 * shared heap. Run at 2 ranks: test_comm_faults CASE, with CASE one of
 * window, wrap, tags, mismatch, errors, heap. Every case is bounded by a watchdog, so that a hang is
 * a failure with a message rather than a stuck test. */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <mpi.h>

#include "check.h"
#include "comm/comm.h"

static int rank, world;

static void on_alarm(int sig)
{
    static const char msg[] = "FAIL: watchdog: no progress for 60 s (a hang)\n";

    (void)sig;
    if (write(2, msg, sizeof(msg) - 1) < 0)
        _exit(2);
    _exit(1);
}

static float value(int r, int64_t i, int op)
{
    uint32_t h = (uint32_t)(r * 2654435761u) ^ (uint32_t)(i * 40503u) ^ (uint32_t)(op * 97u);
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    return ((float)(h & 0xffffff) / 16777216.0f - 0.5f) * (float)(1 + (i % 7));
}

static void fill(float *buf, int64_t n, int op)
{
    for (int64_t i = 0; i < n; i++)
        buf[i] = value(rank, i, op);
}

/* Elements of this rank's reduce-scatter result (out[0..count)) that differ from the rank-order sum. */
static int64_t rs_wrong(const float *out, int64_t count, int op)
{
    int64_t bad = 0;

    for (int64_t i = 0; i < count; i++) {
        float want = value(0, (int64_t)rank * count + i, op);
        for (int r = 1; r < world; r++)
            want += value(r, (int64_t)rank * count + i, op);
        bad += memcmp(&out[i], &want, 4) != 0;
    }
    return bad;
}

/* The backend named; a forced layout (ZS_FAKE_NODE_SIZE) is kept. */
static struct zs_comm *open_comm(const char *mode)
{
    struct zs_comm_opts o;
    struct zs_comm *c = NULL;
    char err[256];

    CHECK(zs_comm_opts_from_env(&o, err, sizeof(err)) == 0, "%s", err);
    o.mode = !strcmp(mode, "mpi") ? ZS_COMM_MPI : ZS_COMM_SHM;
    CHECK(zs_comm_init(&c, MPI_COMM_WORLD, &o) == ZS_OK, "%s", zs_last_error());
    return c;
}

/* window: one reduce-scatter in one-element pieces (it advances a piece or two per call)
 * followed by ~1,100 small ones, each waited in turn, then the large one. Counting unfinished
 * operations let operation 1024 reuse operation 0's flag slot while it was still reading. */
static void case_window(void)
{
    const int64_t big = 2 << 20, small = 4;
    struct zs_comm *c = open_comm("shm");
    float *a = zs_comm_alloc(c, (size_t)(big * world) * 4), *b = zs_comm_alloc(c, (size_t)(small * world) * 4);
    float *res = malloc((size_t)big * 4);
    struct zs_comm_req *qa = NULL, *qb = NULL;
    int64_t bad = 0;

    fill(a, big * world, 1);
    CHECK(zs_comm_reduce_scatter(c, a, a + rank * big, big, 1.0f, &qa) == ZS_OK, "%s", zs_last_error());
    for (int k = 0; k < 1100; k++) {
        fill(b, small * world, 1000 + k);
        CHECK(zs_comm_reduce_scatter(c, b, b + rank * small, small, 1.0f, &qb) == ZS_OK &&
                  zs_comm_wait(c, qb) == ZS_OK, "op %d: %s", k, zs_last_error());
        bad += rs_wrong(b + rank * small, small, 1000 + k);
    }
    if (rank == 1) /* rank 0 finishes the large one first: it must still wait for rank 1's reads */
        usleep(200000);
    CHECK(zs_comm_wait(c, qa) == ZS_OK, "%s", zs_last_error());
    /* Once wait returns the buffer is the caller's: reuse it at once (a peer that still read it, because
     * a newer operation's done flag passed for this one's, now reads the new contents). */
    memcpy(res, a + rank * big, (size_t)big * 4);
    for (int64_t i = 0; i < big * world; i++)
        if (i / big != rank)
            a[i] = -1.0f;
    bad += rs_wrong(res, big, 1);
    CHECK(bad == 0, "window: %lld of %lld elements wrong", (long long)bad,
          (long long)(big + 1100 * small));
    MPI_Barrier(MPI_COMM_WORLD); /* the heap is released in step on every rank */
    free(res);
    zs_comm_release(c, b);
    zs_comm_release(c, a);
    zs_comm_free(c);
}

/* wrap: sequence numbers started 1,100 operations before 2^32 (ZS_TEST_COMM_SEQ, set by the
 * test's ctest entry); rank 1 is 300 ms late to the first operation past the old wrap point. With
 * 32-bit numbers that operation's flag slot still said "posted" from 1,024 operations before, and rank
 * 0 read rank 1's buffer before rank 1 had written it. */
static void case_wrap(void)
{
    const int64_t count = 1000;
    struct zs_comm *c = open_comm("shm");
    float *buf = zs_comm_alloc(c, (size_t)(count * world) * 4);
    struct zs_comm_req *q = NULL;
    int64_t bad = 0;

    for (int k = 0; k < 1110; k++) {
        if (k == 1100 && rank == 1)
            usleep(300000);
        fill(buf, count * world, k);
        CHECK(zs_comm_reduce_scatter(c, buf, buf + rank * count, count, 1.0f, &q) == ZS_OK &&
                  zs_comm_wait(c, q) == ZS_OK, "op %d: %s", k, zs_last_error());
        bad += rs_wrong(buf + rank * count, count, k);
    }
    CHECK(bad == 0, "wrap: %lld of %lld elements wrong across 2^32", (long long)bad,
          (long long)(1110 * count));
    zs_comm_release(c, buf);
    zs_comm_free(c);
}

/* tags: MPI_TAG_UB pretended to be 32767 (ZS_TEST_TAG_UB), pieces of 16 elements
 * (ZS_COMM_PIECE). With tags seq*4096 + piece modulo 32767, operation s+8 piece p had the tag of
 * operation s piece p+1; a 64-piece reduce-scatter (s) and eight small ones (s+1..s+8) are arranged so
 * that the two ranks post those two pieces in different orders, and the messages crossed. Two
 * arrangements: the small ones launched by rank 1 before the large one progresses and by rank 0 after;
 * and all launched by both, rank 1 holding the large one back (it launches first, before rank 0 can
 * answer its header) while it completes the small ones. */
static void tags_round(struct zs_comm *c, bool rank1_first)
{
    const int64_t big = 16 * 64, small = 32;
    float *a = malloc((size_t)(big * world) * 4), *s[8];
    struct zs_comm_req *qa = NULL, *qs[8];
    int64_t bad = 0;
    bool early = rank1_first ? true : rank == 1;

    fill(a, big * world, 7);
    for (int k = 0; k < 8; k++) {
        s[k] = malloc((size_t)(small * world) * 4);
        fill(s[k], small * world, 70 + k);
    }
    if (rank1_first && rank == 1)
        CHECK(zs_comm_reduce_scatter(c, a, a + rank * big, big, 1.0f, &qa) == ZS_OK, "%s", zs_last_error());
    MPI_Barrier(MPI_COMM_WORLD);
    if (!rank1_first || rank == 0)
        CHECK(zs_comm_reduce_scatter(c, a, a + rank * big, big, 1.0f, &qa) == ZS_OK, "%s", zs_last_error());
    for (int k = 0; early && k < 8; k++)
        CHECK(zs_comm_reduce_scatter(c, s[k], s[k] + rank * small, small, 1.0f, &qs[k]) == ZS_OK, "%s",
              zs_last_error());
    for (int k = 0; rank1_first && rank == 1 && k < 8; k++) {
        bool done = false;
        while (!done && zs_comm_test(c, qs[k], &done) == ZS_OK)
            ;
    }
    CHECK(zs_comm_wait(c, qa) == ZS_OK, "%s", zs_last_error());
    for (int k = 0; !early && k < 8; k++)
        CHECK(zs_comm_reduce_scatter(c, s[k], s[k] + rank * small, small, 1.0f, &qs[k]) == ZS_OK, "%s",
              zs_last_error());
    bad += rs_wrong(a + rank * big, big, 7);
    for (int k = 0; k < 8; k++) {
        CHECK(zs_comm_wait(c, qs[k]) == ZS_OK, "%s", zs_last_error());
        bad += rs_wrong(s[k] + rank * small, small, 70 + k);
        free(s[k]);
    }
    CHECK(bad == 0, "tags (arrangement %d): %lld of %lld elements wrong with MPI_TAG_UB 32767",
          rank1_first ? 2 : 1, (long long)bad, (long long)(big + 8 * small));
    free(a);
}

static void case_tags(void)
{
    struct zs_comm *c = open_comm("mpi");

    tags_round(c, false);
    tags_round(c, true);
    zs_comm_free(c);
    /* A limit too small for a header and a piece per operation in flight: refused at start, by name. */
    setenv("ZS_TEST_TAG_UB", "600", 1);
    c = NULL;
    CHECK(zs_comm_init(&c, MPI_COMM_WORLD, NULL) != ZS_OK && strstr(zs_last_error(), "MPI_TAG_UB is 600"),
          "MPI_TAG_UB 600: init should refuse: %s", c ? "it started" : zs_last_error());
    if (rank == 0)
        printf("MPI_TAG_UB 600: %s\n", zs_last_error());
    unsetenv("ZS_TEST_TAG_UB");
}

/* Waits both; both must fail, with a message naming the mismatch. */
static void expect_both_fail(struct zs_comm *c, struct zs_comm_req *q1, struct zs_comm_req *q2, const char *what)
{
    zs_status s1 = zs_comm_wait(c, q1);
    char msg[512];

    snprintf(msg, sizeof(msg), "%s", zs_last_error());
    zs_status s2 = zs_comm_wait(c, q2);
    CHECK(s1 != ZS_OK && s2 != ZS_OK, "%s: rank %d completed without an error (%d %d)", what, rank,
          (int)s1, (int)s2);
    CHECK(s1 == ZS_OK || world > 2 || (strstr(msg, "rank 0") && strstr(msg, "rank 1")),
          "%s: the error names both ranks: %s", what, msg);
    if (rank == 0)
        printf("%s: %s\n", what, s1 ? msg : "(no error)");
}

/* Launching can already report the mismatch (when the peer's descriptor is there); waiting reports it
 * otherwise. Either way the request is finished with. */
static zs_status launch_rs(struct zs_comm *c, float *buf, zs_dtype dt, int64_t count, struct zs_comm_req **q)
{
    zs_status st = zs_comm_reduce_scatter_dt(c, buf, dt, buf, dt, count, 1.0f, q);

    if (st)
        *q = NULL;
    return st;
}

static zs_status wait_or(struct zs_comm *c, struct zs_comm_req *q, zs_status launched)
{
    return q ? zs_comm_wait(c, q) : launched;
}

/* A correct reduction on a fresh heap buffer after a failure: the comm (and the heap) still usable and
 * in step on every rank. */
static void check_still_usable(struct zs_comm *c, const char *after)
{
    const int64_t count = 777;
    float *buf = zs_comm_alloc(c, (size_t)(count * world) * 4);
    struct zs_comm_req *q = NULL;

    CHECK(buf != NULL, "after %s: the next allocation failed: %s", after, zs_last_error());
    if (!buf)
        return;
    fill(buf, count * world, 99);
    CHECK(zs_comm_reduce_scatter(c, buf, buf + rank * count, count, 1.0f, &q) == ZS_OK &&
              zs_comm_wait(c, q) == ZS_OK, "after %s: %s", after, zs_last_error());
    CHECK(rs_wrong(buf + rank * count, count, 99) == 0, "after %s: wrong sums", after);
    zs_comm_release(c, buf);
}

/* mismatch: the same place in the call order, different operations. Rank 0 reduce-scatters A then
 * all-gathers B, rank 1 the reverse (2,000 wrong elements on the MPI path, no error); then a dtype and
 * a count that differ; then (shared memory only) a heap buffer against a plain one, which went down
 * two different paths and deadlocked. */
static void case_mismatch(const char *mode)
{
    const int64_t count = 1000;
    struct zs_comm *c = open_comm(mode);
    float *a = zs_comm_alloc(c, (size_t)(count * world) * 4), *b = zs_comm_alloc(c, (size_t)(count * world) * 4);
    float *plain = malloc((size_t)(count * world) * 4);
    struct zs_comm_req *q1 = NULL, *q2 = NULL;
    zs_status l1, l2;
    char what[64];

    fill(a, count * world, 1);
    fill(b, count * world, 2);
    if (rank == 0) {
        l1 = zs_comm_reduce_scatter(c, a, a + rank * count, count, 1.0f, &q1);
        l2 = zs_comm_all_gather(c, b, count, &q2);
    } else {
        l1 = zs_comm_all_gather(c, b, count, &q1);
        l2 = zs_comm_reduce_scatter(c, a, a + rank * count, count, 1.0f, &q2);
    }
    snprintf(what, sizeof(what), "%s kinds swapped", mode);
    if (!l1 && !l2)
        expect_both_fail(c, q1, q2, what);
    else
        CHECK((l1 || zs_comm_wait(c, q1)) && (l2 || zs_comm_wait(c, q2)), "%s: an operation completed", what);

    l1 = launch_rs(c, a, rank == 0 ? ZS_DTYPE_FP32 : ZS_DTYPE_BF16, count, &q1);
    snprintf(what, sizeof(what), "%s dtype fp32/bf16", mode);
    CHECK(wait_or(c, q1, l1) != ZS_OK, "%s: rank %d: no error", what, rank);
    if (rank == 0)
        printf("%s: %s\n", what, zs_last_error());
    l1 = launch_rs(c, a, ZS_DTYPE_FP32, count + rank, &q1);
    snprintf(what, sizeof(what), "%s count 1000/1001", mode);
    CHECK(wait_or(c, q1, l1) != ZS_OK, "%s: rank %d: no error", what, rank);
    if (rank == 0)
        printf("%s: %s\n", what, zs_last_error());
    int local = zs_comm_local_size(c), most = 0;
    MPI_Allreduce(&local, &most, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD); /* every rank takes part, or none */
    if (most > 1) {
        fill(plain, count * world, 3);
        fill(a, count * world, 3);
        l1 = launch_rs(c, rank == 0 ? a : plain, ZS_DTYPE_FP32, count, &q1);
        snprintf(what, sizeof(what), "%s heap/plain buffer", mode);
        CHECK(wait_or(c, q1, l1) != ZS_OK, "%s: rank %d: no error", what, rank);
        if (rank == 0)
            printf("%s: %s\n", what, zs_last_error());
    }
    check_still_usable(c, what);
    free(plain);
    zs_comm_release(c, b);
    zs_comm_release(c, a);
    zs_comm_free(c);
}

/* errors, part one: operation 1 fails in progress on both ranks (ZS_TEST_COMM_FAULT), on rank 0
 * while it waits on operation 0, an all-gather into a plain buffer whose receive from rank 1 is posted
 * but not matched (rank 1 has not progressed yet). The wait must fail, and afterwards the network must
 * not write into the buffer: the request used to be freed with the receive still posted. Only then
 * does rank 1 progress and send. */
static void case_errors_pending(void)
{
    const int64_t count = 64;
    struct zs_comm *c;
    float *buf = malloc((size_t)(count * world) * 4), *other = malloc((size_t)(count * world) * 4);
    struct zs_comm_req *q0 = NULL, *q1 = NULL;
    int64_t touched = 0;
    bool done = false;

    setenv("ZS_TEST_COMM_FAULT", "progress:1:0,progress:1:1", 1);
    c = open_comm("mpi");
    unsetenv("ZS_TEST_COMM_FAULT");
    fill(buf, count * world, 5);
    fill(other, count * world, 6);
    CHECK(zs_comm_all_gather(c, buf, count, &q0) == ZS_OK, "%s", zs_last_error());
    /* the fault may fire in the launch's own first progress (the check passed at once): failing there is
     * failing in progress too */
    zs_status l1 = zs_comm_reduce_scatter(c, other, other + rank * count, count, 1.0f, &q1);
    if (rank == 0) {
        /* Under load rank 1's part of operation 0 can arrive before rank 0 waits, and operation 0 then
         * completes as it should: the posted-but-unmatched receive did not arise this run, which is said. */
        if (zs_comm_wait(c, q0) == ZS_OK)
            printf("operation 0 completed before operation 1 failed (its receive was matched in time)\n");
        else
            printf("wait after a failure elsewhere: %s\n", zs_last_error());
        CHECK(l1 != ZS_OK || zs_comm_wait(c, q1) != ZS_OK, "rank 0: the failed operation should report its failure");
        memset(buf, 0x5a, (size_t)(count * world) * 4); /* after the error the buffer is the caller's again */
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 1) { /* only now: rank 1's send finds rank 0's receive, if that is still posted */
        for (long i = 0; i < 1000000 && !done; i++)
            if (zs_comm_test(c, q0, &done))
                break;
        zs_comm_wait(c, q0);
        if (l1 == ZS_OK)
            zs_comm_wait(c, q1); /* may complete: rank 0's part was posted before it failed */
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
        unsigned char *p = (unsigned char *)buf;
        for (size_t i = 0; i < (size_t)(count * world) * 4; i++)
            touched += p[i] != 0x5a;
        CHECK(touched == 0, "errors: %lld bytes of a buffer written by the network after "
              "zs_comm_wait returned an error", (long long)touched);
        bool refused = zs_comm_all_gather(c, buf, count, &q0) != ZS_OK;
        CHECK(refused, "rank 0: the comm should refuse work after a failure with messages posted");
        printf("after the failure: %s\n", zs_last_error());
    }
    zs_comm_free(c);
    free(buf);
    free(other);
}

/* errors, part two: operation 3 fails on both ranks, at different points of its set-up (rank 0
 * finding peers, rank 1 before anything). Taking the sequence number before the step that can fail made
 * rank 0's numbers run one ahead of rank 1's, and the next operation hung or mixed. */
static void case_errors_drift(const char *mode)
{
    const int64_t count = 500;
    struct zs_comm *c;
    float *buf;
    struct zs_comm_req *q = NULL;
    int64_t bad = 0;

    setenv("ZS_TEST_COMM_FAULT", "attach:3:0,new:3:1", 1);
    c = open_comm(mode);
    unsetenv("ZS_TEST_COMM_FAULT");
    buf = zs_comm_alloc(c, (size_t)(count * world) * 4);
    for (int k = 0; k < 8; k++) {
        fill(buf, count * world, 40 + k);
        zs_status st = zs_comm_reduce_scatter(c, buf, buf + rank * count, count, 1.0f, &q);
        if (k == 3) {
            CHECK(st != ZS_OK, "%s: the planted set-up failure did not fail", mode);
            continue;
        }
        CHECK(st == ZS_OK && zs_comm_wait(c, q) == ZS_OK, "%s drift: op %d: %s", mode, k,
              zs_last_error());
        bad += rs_wrong(buf + rank * count, count, 40 + k);
    }
    CHECK(bad == 0, "%s drift: %lld elements wrong after a failed set-up", mode, (long long)bad);
    zs_comm_release(c, buf);
    zs_comm_free(c);
}

/* heap: one rank's allocation fails (ZS_TEST_SHM_FAULT: its bookkeeping, or the growth of the
 * heap), or its budget refuses (local_ok false): every rank must get NULL, none may hang in the heap's
 * collective growth, and the heaps must still agree afterwards (a zero-copy reduction comes out right,
 * and the descriptors compare heap offsets). Then a rank that cannot take part in a gather. */
static void heap_round(struct zs_comm *c, const char *what, size_t bytes, bool local_ok)
{
    void *p = zs_comm_alloc_agreed(c, bytes, local_ok);
    int got = p != NULL, all = 0;

    MPI_Allreduce(&got, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    CHECK(all == 0, "heap %s: %d of %d ranks got memory; all must fail together", what, all, world);
    if (rank == 0)
        printf("heap %s: %s\n", what, all == 0 ? zs_last_error() : "(some ranks allocated)");
    if (p)
        zs_comm_release(c, p);
    check_still_usable(c, what);
}

/* only: "", or one of alloc, grow, budget (to run one part alone) */
static void case_heap(const char *only)
{
    struct zs_comm *c;
    float *keep;

    if (*only && strcmp(only, "alloc"))
        goto grow;
    setenv("ZS_TEST_SHM_FAULT", "alloc:1:1", 1); /* rank 1's second allocation */
    c = open_comm("shm");
    unsetenv("ZS_TEST_SHM_FAULT");
    keep = zs_comm_alloc(c, 1 << 20);
    heap_round(c, "rank 1's bookkeeping", 1 << 16, true);
    zs_comm_release(c, keep);
    zs_comm_free(c);

grow:
    if (*only && strcmp(only, "grow"))
        goto budget;
    setenv("ZS_TEST_SHM_FAULT", "grow:1:1", 1); /* rank 1's second growth of the heap */
    c = open_comm("shm");
    unsetenv("ZS_TEST_SHM_FAULT");
    keep = zs_comm_alloc(c, 1 << 20);
    heap_round(c, "rank 1's heap growth", (size_t)80 << 20, true);
    zs_comm_release(c, keep);
    zs_comm_free(c);

budget:
    if (*only && strcmp(only, "budget"))
        return;
    c = open_comm("shm");
    heap_round(c, "rank 1's budget, growing", (size_t)1 << 20, rank != 1); /* the first allocation grows */
    heap_round(c, "rank 1's budget, in place", (size_t)1 << 16, rank != 1);
    zs_comm_free(c);
}

/* A rank that cannot join a gather (its shard could not be read): every rank's wait fails. */
static void case_fail_next(const char *mode)
{
    const int64_t count = 300;
    struct zs_comm *c = open_comm(mode);
    float *buf = zs_comm_alloc(c, (size_t)(count * world) * 4);
    struct zs_comm_req *q = NULL;
    zs_status st;

    if (rank == 1)
        zs_comm_fail_next(c);
    st = zs_comm_all_gather(c, buf, count, &q);
    if (!st)
        st = zs_comm_wait(c, q);
    CHECK(st != ZS_OK, "%s fail_next: rank %d's gather completed", mode, rank);
    CHECK(st == ZS_OK || strstr(zs_last_error(), "rank 1 could not take part"), "%s: %s", mode, zs_last_error());
    if (rank == 0)
        printf("%s gather with rank 1 out: %s\n", mode, zs_last_error());
    check_still_usable(c, "a gather without rank 1");
    zs_comm_release(c, buf);
    zs_comm_free(c);
}

int main(int argc, char **argv)
{
    const char *which = argc > 1 ? argv[1] : "";

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    signal(SIGALRM, on_alarm);
    alarm(60);
    if (!strcmp(which, "window"))
        case_window();
    else if (!strcmp(which, "wrap"))
        case_wrap();
    else if (!strcmp(which, "tags"))
        case_tags();
    else if (!strcmp(which, "mismatch")) {
        case_mismatch("mpi");
        case_mismatch("shm");
    } else if (!strcmp(which, "errors")) {
        case_errors_drift("mpi");
        case_errors_drift("shm");
        case_errors_pending();
    } else if (!strcmp(which, "heap")) {
        const char *only = argc > 2 ? argv[2] : "";
        case_heap(only);
        if (!*only || !strcmp(only, "fail_next")) {
            case_fail_next("mpi");
            case_fail_next("shm");
        }
    } else {
        CHECK(0, "unknown case '%s' (window, wrap, tags, mismatch, errors, heap)", which);
    }
    int fails = zs_test_fail, any = 0;
    MPI_Allreduce(&fails, &any, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Finalize();
    if (rank == 0)
        printf("(all ranks: %d failed checks)\n", any);
    return any ? 1 : zs_test_summary(which);
}
