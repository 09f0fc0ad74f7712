#include "io/channel_order.h"

#include <stdlib.h>

#include "common/status.h"

/* The count pass: one loop per channel width, stopping at the first channel
 * out of range (an unsigned compare also catches negatives). */
#define COUNT(T)                                                                   \
    do {                                                                           \
        const T *c = (const T *)channels;                                          \
        for (i = 0; i < n; i++) {                                                  \
            if ((uint64_t)(int64_t)c[i] >= (uint64_t)num_channels) {               \
                value = (int64_t)c[i];                                             \
                goto out_of_range;                                                 \
            }                                                                      \
            next[c[i]]++;                                                          \
        }                                                                          \
    } while (0)

/* The placing pass: each index to the next free slot of its channel. */
#define PLACE_TO(T, O)                                                             \
    do {                                                                           \
        const T *c = (const T *)channels;                                          \
        O *o = (O *)order;                                                         \
        for (i = 0; i < n; i++)                                                    \
            o[next[c[i]]++] = (O)i;                                                \
    } while (0)
#define PLACE(T)                                                                   \
    do {                                                                           \
        if (order_width == 4)                                                      \
            PLACE_TO(T, int32_t);                                                  \
        else                                                                       \
            PLACE_TO(T, int64_t);                                                  \
    } while (0)

int fb_order_by_channel(const void *channels, int width, size_t n, int32_t num_channels,
                        void *order, int order_width, int64_t *counts, size_t *bad,
                        int64_t *bad_channel)
{
    size_t i, *next;
    size_t start = 0, count;
    int64_t value = 0;
    int32_t ch;
    if (num_channels < 1 || (width != 1 && width != 2 && width != 4 && width != 8)
            || (order_width != 4 && order_width != 8))
        return FB_EINVAL;
    if (order_width == 4 && n > (size_t)INT32_MAX) {
        if (bad != NULL)
            *bad = n;
        return FB_EINVAL;
    }
    next = calloc((size_t)num_channels, sizeof *next);
    if (next == NULL)
        return FB_ENOMEM;
    switch (width) {
    case 1: COUNT(int8_t); break;
    case 2: COUNT(int16_t); break;
    case 4: COUNT(int32_t); break;
    default: COUNT(int64_t); break;
    }
    /* counts out, then each channel's first slot */
    for (ch = 0; ch < num_channels; ch++) {
        count = next[ch];
        counts[ch] = (int64_t)count;
        next[ch] = start;
        start += count;
    }
    switch (width) {
    case 1: PLACE(int8_t); break;
    case 2: PLACE(int16_t); break;
    case 4: PLACE(int32_t); break;
    default: PLACE(int64_t); break;
    }
    free(next);
    return FB_OK;

out_of_range:
    free(next);
    if (bad != NULL)
        *bad = i;
    if (bad_channel != NULL)
        *bad_channel = value;
    return FB_EINVAL;
}
