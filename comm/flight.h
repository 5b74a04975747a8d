/* flight.h - the flight recorder: each rank's last ZS_FLIGHT_RING collectives and engine calls (what,
 * unit, sequence number, bytes, start and end), written to DIR/flight-rank<R>.txt on a timeout, on a
 * failed collective and on SIGUSR1, for tools/zs_flight.c to line up. Internal: the library only. */
#ifndef ZS_FLIGHT_H
#define ZS_FLIGHT_H

#include <stdbool.h>
#include <stdint.h>

#include "zeroshard.h" /* defines: zs_status */

#define ZS_FLIGHT_RING 512

struct zs_comm;
struct zs_flight;

/* The directory: ZS_FLIGHT_DIR, else the config's (may be NULL or ""), else /tmp/zeroshard-flight-<job>.
 * Installs the SIGUSR1 handler unless the program has its own. NULL on allocation failure (then
 * nothing is recorded). */
struct zs_flight *zs_flight_new(int32_t rank, int32_t world, const char *cfg_dir);
void zs_flight_free(struct zs_flight *f);
/* The recorder of a second communicator writes flight-rankN-NAME.txt (NAME: letters, digits, '-', '_'). */
void zs_flight_set_name(struct zs_flight *f, const char *name);
const char *zs_flight_dir(const struct zs_flight *f);

/* The collectives' entries: one per operation, from launch to completion. */
void zs_flight_op_start(struct zs_flight *f, uint64_t seq, int32_t kind,
                        const void *desc, uint64_t bytes);
void zs_flight_op_end(struct zs_flight *f, uint64_t seq, zs_status st);
/* An engine call (zs_unit_fetch, zs_step, ...) on unit (-1: none), at micro-step step. */
void zs_flight_call(struct zs_flight *f, const char *call, int32_t unit, int64_t step);

/* The SIGUSR1 handler only sets a flag (async-signal-safe); the dump happens here, at the rank's next
 * collective or wait poll. */
bool zs_flight_signalled(void);
/* Writes the ring (atomically: a temporary file renamed over the last dump). Best effort: a failure
 * to write is reported on stderr, never returned, so it cannot hide the error being recorded. */
void zs_flight_write(struct zs_flight *f, const char *why);

#endif /* ZS_FLIGHT_H */
