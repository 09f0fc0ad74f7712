/* Result codes of every csrc unit: 0 is success, the rest say why not.
 * Callers turn them into exceptions in one place per extension module. */
#ifndef FLINKBUF_STATUS_H
#define FLINKBUF_STATUS_H

enum {
    FB_OK = 0,
    FB_EMPTY = 1,          /* a non-blocking call found nothing */
    FB_ETIMEDOUT = 2,      /* the deadline passed */
    FB_EDESTROYED = 3,     /* the pool (or its network pool) was destroyed */
    FB_EINSUFFICIENT = 4,  /* required buffers would exceed the total */
    FB_EINVAL = 5,         /* a bad argument */
    FB_ESTATE = 6,         /* not valid in this state (a segment not out, a finished queue) */
    FB_ENOMEM = 7,         /* out of memory */
    FB_ERELEASED = 8,      /* the consumer released the subpartition */
    FB_EFAILED = 9,        /* the producer failed */
    FB_ECLOSED = 10        /* the gate (or connection) was closed */
};

#endif
