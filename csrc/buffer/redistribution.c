#include "buffer/redistribution.h"

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

void fb_redistribute(int64_t avail, size_t n, const int64_t *mins, const int64_t *maxs,
                     int64_t *out)
{
    size_t i;
    int64_t total_cap = 0, to_distribute, used = 0, given = 0;

    for (i = 0; i < n; i++)
        out[i] = mins[i];
    if (avail <= 0)
        return;
    for (i = 0; i < n; i++)
        total_cap += min64(avail, maxs[i] - mins[i]);
    if (total_cap == 0)
        return;
    to_distribute = min64(avail, total_cap);
    for (i = 0; i < n; i++) {
        int64_t cap = min64(avail, maxs[i] - mins[i]);
        int64_t share;
        if (cap == 0)
            continue;
        used += cap;
        /* to_distribute * used can exceed 2^63 (10^4 pools of 2^31-1). */
        share = (int64_t)((__int128)to_distribute * used / total_cap) - given;
        given += share;
        out[i] = mins[i] + share;
    }
}
