/* Rows grouped by channel: a stable counting sort of channel indices, what a
 * producer needs to cut a batch of rows into one piece per consumer.  No
 * Python API. */
#ifndef FLINKBUF_CHANNEL_ORDER_H
#define FLINKBUF_CHANNEL_ORDER_H

#include <stddef.h>
#include <stdint.h>

/* A column that fb_gather_by_channel gathers: `n` items of `itemsize` (at
 * least 1) bytes, item i at values + i * stride (any stride, negative or
 * zero too), gathered into the n contiguous items at `out`, which must not
 * overlap any input. */
typedef struct {
    const void *values;
    ptrdiff_t stride;
    size_t itemsize;
    void *out;
} fb_column;

/* For the `n` channel indices at `channels` (signed integers of `width`
 * 1, 2, 4 or 8 bytes, native byte order), each in [0, num_channels):
 * counts[c] is how many are c (num_channels int64s), and `order` (n
 * integers of `order_width`, 4 or 8 bytes) holds 0 .. n-1 sorted by their
 * channel, ascending, the indices of one channel in input order.
 *
 * Every channel is read and checked before anything is written.  Returns
 * FB_OK; FB_EINVAL, writing nothing, for a channel outside the range (then
 * *bad, if not NULL, is its index and *bad_channel, if not NULL, its value),
 * an unknown width, num_channels < 1, or an order_width of 4 with n beyond
 * INT32_MAX (then *bad is n); FB_ENOMEM if the table of num_channels
 * offsets could not be had. */
int fb_order_by_channel(const void *channels, int width, size_t n, int32_t num_channels,
                        void *order, int order_width, int64_t *counts, size_t *bad,
                        int64_t *bad_channel);

/* fb_order_by_channel, then every one of the `num_columns` columns gathered
 * in that order in the same call: out item k is values item order[k], so
 * that channel c's items are the counts[c] items of `out` from counts[0] +
 * ... + counts[c - 1] on, in input order (a stable counting sort of each
 * column by channel).  What a producer needs to cut a batch's columns into
 * one piece per consumer, in one pass per column.
 *
 * `order` may be NULL when only the columns are wanted: with enough rows
 * per channel (at least 1024 rows and 4 per channel) each column's items
 * then go straight to their channels' places (no order is made, none
 * read back).
 *
 * Returns what fb_order_by_channel returns, with its *bad and *bad_channel;
 * FB_EINVAL also for a column of itemsize 0; FB_ENOMEM if the working
 * tables could not be had.  On an error no column is written. */
int fb_gather_by_channel(const void *channels, int width, size_t n, int32_t num_channels,
                         void *order, int order_width, int64_t *counts,
                         const fb_column *columns, size_t num_columns, size_t *bad,
                         int64_t *bad_channel);

#endif
