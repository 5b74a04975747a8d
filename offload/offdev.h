/* offdev.h - offload/'s own: the staging of the offloaded optimizer from a device the host cannot read in place,
 * shared by offload_dev.c (set-up, gradients down during backward) and offload_step.c (the step). */
#ifndef ZS_OFFDEV_H
#define ZS_OFFDEV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "device/device.h" /* defines: struct zs_dev_stream, struct zs_dev_event */

/* ZeRO-Offload from a device the host cannot read in place (offload/offload_dev.c): pinned host staging of
 * two parameter slots, then every unit's gradients (grad_at: offsets after the slots); a copy stream down and
 * one up, so that the CPU steps one unit while the next comes down and the previous goes up. */
struct zs_offdev {
    void *buf;
    bool pinned;                     /* the device took buf's pin (else it stays pageable) */
    size_t bytes, slot;
    size_t *grad_at;
    bool *grad_down;                 /* this window's gradients of the unit are queued down */
    struct zs_dev_stream *down, *up;
    struct zs_dev_event *ev_grad, *ev_up[2], *ev_done;
    int32_t k;                       /* optimizer state on NVMe: slices stepped this step (slot k % 2) */
    zs_status st;                    /* and the first failure among them */
};

#endif /* ZS_OFFDEV_H */
