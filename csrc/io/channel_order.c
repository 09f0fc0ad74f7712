#include "io/channel_order.h"

#include <stdlib.h>
#include <string.h>

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

/* Four lanes: the rows cut into four runs, each counted and placed with a
 * table of its own, interleaved.  One table makes every row wait for the
 * previous one's increment (the same channel, the same counter in memory);
 * four independent chains run side by side.  The runs are placed one after
 * the other within a channel, so the order stays stable. */
#define LANES 4
#define LANES_MIN_ROWS 1024

#define LANE_COUNT(T)                                                              \
    do {                                                                           \
        const T *c = (const T *)channels;                                          \
        uint64_t lim = (uint64_t)num_channels;                                     \
        for (i = 0; i < m; i++) {                                                  \
            uint64_t c0 = (uint64_t)(int64_t)c[i];                                 \
            uint64_t c1 = (uint64_t)(int64_t)c[m + i];                             \
            uint64_t c2 = (uint64_t)(int64_t)c[2 * m + i];                         \
            uint64_t c3 = (uint64_t)(int64_t)c[3 * m + i];                         \
            if ((c0 >= lim) | (c1 >= lim) | (c2 >= lim) | (c3 >= lim))             \
                goto find_bad;                                                     \
            lane[c0]++;                                                            \
            lane[num_channels + c1]++;                                             \
            lane[2 * (size_t)num_channels + c2]++;                                 \
            lane[3 * (size_t)num_channels + c3]++;                                 \
        }                                                                          \
        for (i = LANES * m; i < n; i++) {                                          \
            uint64_t c3 = (uint64_t)(int64_t)c[i];                                 \
            if (c3 >= lim)                                                         \
                goto find_bad;                                                     \
            lane[3 * (size_t)num_channels + c3]++;                                 \
        }                                                                          \
    } while (0)

#define LANE_PLACE_TO(T, O)                                                        \
    do {                                                                           \
        const T *c = (const T *)channels;                                          \
        O *o = (O *)order;                                                         \
        size_t *n0 = lane, *n1 = lane + num_channels;                              \
        size_t *n2 = lane + 2 * (size_t)num_channels;                              \
        size_t *n3 = lane + 3 * (size_t)num_channels;                              \
        for (i = 0; i < m; i++) {                                                  \
            o[n0[c[i]]++] = (O)i;                                                  \
            o[n1[c[m + i]]++] = (O)(m + i);                                        \
            o[n2[c[2 * m + i]]++] = (O)(2 * m + i);                                \
            o[n3[c[3 * m + i]]++] = (O)(3 * m + i);                                \
        }                                                                          \
        for (i = LANES * m; i < n; i++)                                            \
            o[n3[c[i]]++] = (O)i;                                                  \
    } while (0)
#define LANE_PLACE(T)                                                              \
    do {                                                                           \
        if (order_width == 4)                                                      \
            LANE_PLACE_TO(T, int32_t);                                             \
        else                                                                       \
            LANE_PLACE_TO(T, int64_t);                                             \
    } while (0)

/* The first channel out of range, in input order (the lanes found one). */
#define FIND_BAD(T)                                                                \
    do {                                                                           \
        const T *c = (const T *)channels;                                          \
        for (i = 0; i < n; i++)                                                    \
            if ((uint64_t)(int64_t)c[i] >= (uint64_t)num_channels) {               \
                value = (int64_t)c[i];                                             \
                break;                                                             \
            }                                                                      \
    } while (0)

static void scatter_columns(const fb_column *columns, size_t num_columns,
                            const void *channels, int width, size_t n, int32_t num_channels,
                            const int64_t *counts, const size_t *lane, size_t *pos);

/* The arguments both entry points share, checked (`order` NULL: none). */
static int check_args(int width, size_t n, int32_t num_channels, const void *order,
                      int order_width, size_t *bad)
{
    if (num_channels < 1 || (width != 1 && width != 2 && width != 4 && width != 8)
            || (order != NULL && order_width != 4 && order_width != 8))
        return FB_EINVAL;
    if (order != NULL && order_width == 4 && n > (size_t)INT32_MAX) {
        if (bad != NULL)
            *bad = n;
        return FB_EINVAL;
    }
    return FB_OK;
}

/* Whether the four lanes serve: rows enough, and enough of them a channel. */
static int in_lanes(size_t n, int32_t num_channels)
{
    return n >= LANES_MIN_ROWS && n / LANES >= (size_t)num_channels;
}

/* With `columns` (num_columns of them), each column is scattered by the
 * lanes' slots as they are counted, and `order` (NULL: not wanted) is
 * placed only when asked for. */
static int order_in_lanes(const void *channels, int width, size_t n, int32_t num_channels,
                          void *order, int order_width, int64_t *counts,
                          const fb_column *columns, size_t num_columns, size_t *bad,
                          int64_t *bad_channel)
{
    size_t i, m = n / LANES, start = 0, k, *lane, *pos;
    int64_t value = 0;
    int32_t ch;
    /* the lanes' first slots, and (with columns) a copy a scatter moves on */
    lane = calloc((size_t)(num_columns ? 2 : 1) * LANES * (size_t)num_channels, sizeof *lane);
    if (lane == NULL)
        return FB_ENOMEM;
    pos = lane + (size_t)LANES * (size_t)num_channels;
    switch (width) {
    case 1: LANE_COUNT(int8_t); break;
    case 2: LANE_COUNT(int16_t); break;
    case 4: LANE_COUNT(int32_t); break;
    default: LANE_COUNT(int64_t); break;
    }
    /* counts out, then each lane's first slot within its channel */
    for (ch = 0; ch < num_channels; ch++) {
        int64_t total = 0;
        for (k = 0; k < LANES; k++) {
            size_t count = lane[k * (size_t)num_channels + (size_t)ch];
            lane[k * (size_t)num_channels + (size_t)ch] = start;
            start += count;
            total += (int64_t)count;
        }
        counts[ch] = total;
    }
    scatter_columns(columns, num_columns, channels, width, n, num_channels, counts, lane,
                    pos);
    if (order != NULL) {
        switch (width) {
        case 1: LANE_PLACE(int8_t); break;
        case 2: LANE_PLACE(int16_t); break;
        case 4: LANE_PLACE(int32_t); break;
        default: LANE_PLACE(int64_t); break;
        }
    }
    free(lane);
    return FB_OK;

find_bad:
    free(lane);
    switch (width) {
    case 1: FIND_BAD(int8_t); break;
    case 2: FIND_BAD(int16_t); break;
    case 4: FIND_BAD(int32_t); break;
    default: FIND_BAD(int64_t); break;
    }
    if (bad != NULL)
        *bad = i;
    if (bad_channel != NULL)
        *bad_channel = value;
    return FB_EINVAL;
}

int fb_order_by_channel(const void *channels, int width, size_t n, int32_t num_channels,
                        void *order, int order_width, int64_t *counts, size_t *bad,
                        int64_t *bad_channel)
{
    size_t i, *next;
    size_t start = 0, count;
    int64_t value = 0;
    int32_t ch;
    if (order == NULL)
        return FB_EINVAL;
    if (check_args(width, n, num_channels, order, order_width, bad) != FB_OK)
        return FB_EINVAL;
    if (in_lanes(n, num_channels))
        return order_in_lanes(channels, width, n, num_channels, order, order_width, counts,
                              NULL, 0, bad, bad_channel);
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

/* Gathering: out item k is item order[k] of the column, for items of SIZE
 * bytes (a constant for the common widths: one load and one store each). */
#define GATHER_TO(O, SIZE)                                                         \
    do {                                                                           \
        const O *ix = (const O *)order;                                            \
        for (i = 0; i < n; i++)                                                    \
            memcpy(dst + i * (SIZE), src + (ptrdiff_t)ix[i] * stride, (SIZE));     \
    } while (0)
#define GATHER(SIZE)                                                               \
    do {                                                                           \
        if (order_width == 4)                                                      \
            GATHER_TO(int32_t, SIZE);                                              \
        else                                                                       \
            GATHER_TO(int64_t, SIZE);                                              \
    } while (0)

static void gather_column(const fb_column *column, const void *order, int order_width,
                          size_t n)
{
    const char *src = (const char *)column->values;
    char *dst = (char *)column->out;
    ptrdiff_t stride = column->stride;
    size_t i, size = column->itemsize;
    switch (size) {
    case 1: GATHER(1); break;
    case 2: GATHER(2); break;
    case 4: GATHER(4); break;
    case 8: GATHER(8); break;
    case 16: GATHER(16); break;
    default: GATHER(size); break;
    }
}

/* Scattering: item i of a column to the next free slot of its row's channel
 * in the lane of row i (the lanes' slots as LANE_PLACE_TO uses them), for
 * channels of type T and items of SIZE bytes: the source read in order, no
 * order array written or read. */
#define SCATTER_TO(T, SIZE)                                                        \
    do {                                                                           \
        const T *c = (const T *)channels;                                          \
        size_t *n0 = pos, *n1 = pos + num_channels;                                \
        size_t *n2 = pos + 2 * (size_t)num_channels;                               \
        size_t *n3 = pos + 3 * (size_t)num_channels;                               \
        const char *s0 = src, *s1 = src + (ptrdiff_t)m * stride;                   \
        const char *s2 = src + 2 * (ptrdiff_t)m * stride;                          \
        const char *s3 = src + 3 * (ptrdiff_t)m * stride;                          \
        for (i = 0; i < m; i++) {                                                  \
            memcpy(dst + n0[c[i]]++ * (SIZE), s0, (SIZE));                         \
            memcpy(dst + n1[c[m + i]]++ * (SIZE), s1, (SIZE));                     \
            memcpy(dst + n2[c[2 * m + i]]++ * (SIZE), s2, (SIZE));                 \
            memcpy(dst + n3[c[3 * m + i]]++ * (SIZE), s3, (SIZE));                 \
            s0 += stride; s1 += stride; s2 += stride; s3 += stride;                \
        }                                                                          \
        for (i = LANES * m; i < n; i++)                                            \
            memcpy(dst + n3[c[i]]++ * (SIZE), src + (ptrdiff_t)i * stride, (SIZE));  \
    } while (0)
#define SCATTER(SIZE)                                                              \
    do {                                                                           \
        switch (width) {                                                           \
        case 1: SCATTER_TO(int8_t, SIZE); break;                                   \
        case 2: SCATTER_TO(int16_t, SIZE); break;                                  \
        case 4: SCATTER_TO(int32_t, SIZE); break;                                  \
        default: SCATTER_TO(int64_t, SIZE); break;                                 \
        }                                                                          \
    } while (0)

static void scatter_column(const fb_column *column, const void *channels, int width,
                           size_t n, int32_t num_channels, const size_t *lane, size_t *pos)
{
    const char *src = (const char *)column->values;
    char *dst = (char *)column->out;
    ptrdiff_t stride = column->stride;
    size_t i, m = n / LANES, size = column->itemsize;
    memcpy(pos, lane, (size_t)LANES * (size_t)num_channels * sizeof *pos);
    switch (size) {
    case 1: SCATTER(1); break;
    case 2: SCATTER(2); break;
    case 4: SCATTER(4); break;
    case 8: SCATTER(8); break;
    case 16: SCATTER(16); break;
    default: SCATTER(size); break;
    }
}

/* Few channels: one pass over the rows per channel, the channel's items
 * written in place with no counter in memory: each row writes its item at
 * the channel's next slot and moves the slot on only when the row is the
 * channel's, so a slot ends up holding its row's item (another row's item
 * written there first is overwritten); past the channel's last slot the
 * writes go to a spare.  Nothing outside the channel's slots is written. */
#define COMPRESS_MAX 4
#define COMPRESS_TO(T, SIZE)                                                       \
    do {                                                                           \
        const T *c = (const T *)channels;                                          \
        for (ch = 0; ch < num_channels; ch++) {                                    \
            size_t p = start, end = start + (size_t)counts[ch];                    \
            for (i = 0; i < n; i++) {                                              \
                char *d = p < end ? dst + p * (SIZE) : spare;                      \
                memcpy(d, src + (ptrdiff_t)i * stride, (SIZE));                    \
                p += c[i] == (T)ch;                                                \
            }                                                                      \
            start = end;                                                           \
        }                                                                          \
    } while (0)
#define COMPRESS(SIZE)                                                             \
    do {                                                                           \
        switch (width) {                                                           \
        case 1: COMPRESS_TO(int8_t, SIZE); break;                                  \
        case 2: COMPRESS_TO(int16_t, SIZE); break;                                 \
        case 4: COMPRESS_TO(int32_t, SIZE); break;                                 \
        default: COMPRESS_TO(int64_t, SIZE); break;                                \
        }                                                                          \
    } while (0)

/* Returns 0, writing nothing, for an item size it does not take. */
static int compress_column(const fb_column *column, const void *channels, int width,
                           size_t n, int32_t num_channels, const int64_t *counts)
{
    const char *src = (const char *)column->values;
    char *dst = (char *)column->out;
    char spare[16];
    ptrdiff_t stride = column->stride;
    size_t i, start = 0;
    int32_t ch;
    switch (column->itemsize) {
    case 4: COMPRESS(4); return 1;
    case 8: COMPRESS(8); return 1;
    case 16: COMPRESS(16); return 1;
    default: return 0;
    }
}

static void scatter_columns(const fb_column *columns, size_t num_columns,
                            const void *channels, int width, size_t n, int32_t num_channels,
                            const int64_t *counts, const size_t *lane, size_t *pos)
{
    size_t k;
    for (k = 0; k < num_columns; k++)
        if (num_channels > COMPRESS_MAX
                || !compress_column(&columns[k], channels, width, n, num_channels, counts))
            scatter_column(&columns[k], channels, width, n, num_channels, lane, pos);
}

int fb_gather_by_channel(const void *channels, int width, size_t n, int32_t num_channels,
                         void *order, int order_width, int64_t *counts,
                         const fb_column *columns, size_t num_columns, size_t *bad,
                         int64_t *bad_channel)
{
    size_t k;
    int rc;
    void *own = NULL;
    for (k = 0; k < num_columns; k++)
        if (columns[k].itemsize == 0)
            return FB_EINVAL;
    if (check_args(width, n, num_channels, order, order_width, bad) != FB_OK)
        return FB_EINVAL;
    if (in_lanes(n, num_channels))
        return order_in_lanes(channels, width, n, num_channels, order, order_width, counts,
                              columns, num_columns, bad, bad_channel);
    if (order == NULL) {        /* few rows or many channels: order, then gather */
        own = malloc(n ? n * sizeof(int64_t) : 1);
        if (own == NULL)
            return FB_ENOMEM;
        order = own;
        order_width = 8;
    }
    rc = fb_order_by_channel(channels, width, n, num_channels, order, order_width, counts,
                             bad, bad_channel);
    if (rc == FB_OK)
        for (k = 0; k < num_columns; k++)
            gather_column(&columns[k], order, order_width, n);
    free(own);
    return rc;
}
