/* Flink's proportional redistribution of excess network buffers. */
#ifndef FLINKBUF_REDISTRIBUTION_H
#define FLINKBUF_REDISTRIBUTION_H

#include <stddef.h>
#include <stdint.h>

/* Pool sizes after redistributing avail = total - required excess segments.
 *
 * mins[i] <= maxs[i] per pool, pools in creation order. out[i] receives
 * mins[i] + share_i where cap_i = min(avail, maxs[i] - mins[i]),
 * to_distribute = min(avail, sum cap) and share_i is the cumulative-floor
 * share to_distribute * (cap_1 + ... + cap_i) / sum cap minus the shares
 * already given.  All arithmetic is 64-bit; with n <= 2^31 pools of
 * caps < 2^31 the products stay below 2^93 and are done in 128 bits. */
void fb_redistribute(int64_t avail, size_t n, const int64_t *mins, const int64_t *maxs,
                     int64_t *out);

#endif
