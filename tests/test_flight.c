/* test_flight.c - the flight recorder alone (no MPI): a ring that has wrapped dumps its newest entries
 * oldest first, and one SIGUSR1 asks for exactly one dump however often the ranks poll. test_flight ring|signal */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "comm/flight.h"

#define POLLS 1000 /* polls after each signal: a flag left set would dump at every one */

static char dir[] = "/tmp/zs-test-flight-XXXXXX";

static void remove_dir(void)
{
    char path[sizeof(dir) + 32];

    snprintf(path, sizeof(path), "%s/flight-rank0.txt", dir);
    unlink(path);
    rmdir(dir);
}

/* Entry k of the dump is an engine call on unit k: the units read back say which entries it holds, in
 * which order. Returns how many entries were read; *in_order is false at the first unit out of order. */
static long read_units(long first, bool *in_order)
{
    char path[sizeof(dir) + 32], line[256];
    long n = 0;
    FILE *f;

    snprintf(path, sizeof(path), "%s/flight-rank0.txt", dir);
    f = fopen(path, "r");
    *in_order = f != NULL;
    while (f && fgets(line, sizeof(line), f)) {
        int unit;
        if (line[0] == '#')
            continue;
        if (sscanf(line, "call - fetch - %d", &unit) != 1 || unit != first + n)
            *in_order = false;
        n++;
    }
    if (f)
        fclose(f);
    return n;
}

/* Two and a half times round the ring: the dump must be the last ZS_FLIGHT_RING calls, oldest first. */
static void case_ring(struct zs_flight *f)
{
    const long total = ZS_FLIGHT_RING * 5 / 2;
    bool in_order;
    long n;

    for (long k = 0; k < total; k++)
        zs_flight_call(f, "fetch", (int32_t)k, k);
    zs_flight_write(f, "test");
    n = read_units(total - ZS_FLIGHT_RING, &in_order);
    CHECK(n == ZS_FLIGHT_RING, "the dump of a wrapped ring holds %ld entries, not %d", n, ZS_FLIGHT_RING);
    CHECK(in_order, "the dump of a wrapped ring is not calls %ld..%ld oldest first", total - ZS_FLIGHT_RING,
          total - 1);
}

/* What the collectives' waits do at each poll (comm_watch.c): dump when a signal asked for it. */
static int poll_dumps(struct zs_flight *f)
{
    int dumps = 0;

    for (int i = 0; i < POLLS; i++)
        if (zs_flight_signalled()) {
            zs_flight_write(f, "SIGUSR1");
            dumps++;
        }
    return dumps;
}

static void case_signal(struct zs_flight *f)
{
    int before = poll_dumps(f), first, second;

    kill(getpid(), SIGUSR1); /* delivered before kill returns: this process has one thread */
    first = poll_dumps(f);
    kill(getpid(), SIGUSR1);
    second = poll_dumps(f);
    CHECK(before == 0, "%d dumps before any signal", before);
    CHECK(first == 1, "one SIGUSR1 gave %d dumps over %d polls", first, POLLS);
    CHECK(second == 1, "a second SIGUSR1 gave %d more dumps over %d polls", second, POLLS);
}

int main(int argc, char **argv)
{
    const char *which = argc > 1 ? argv[1] : "";
    struct zs_flight *f;

    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    unsetenv("ZS_FLIGHT_DIR"); /* it would override the directory given here */
    f = zs_flight_new(0, 1, dir);
    CHECK(f != NULL, "zs_flight_new failed");
    if (f && !strcmp(which, "ring"))
        case_ring(f);
    else if (f && !strcmp(which, "signal"))
        case_signal(f);
    else
        CHECK(0, "unknown case '%s' (ring, signal)", which);
    zs_flight_free(f);
    remove_dir();
    return zs_test_summary(which);
}
