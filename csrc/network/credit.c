#include "network/credit.h"

#include <stdlib.h>
#include <string.h>

int fb_credit_init(fb_credit_t *cr, int32_t cap)
{
    memset(cr, 0, sizeof(*cr));
    cr->cap = cap;
    cr->limit = cap;
    cr->events_granted = FB_CREDIT_EVENT_WINDOW;
    cr->held = malloc(sizeof(int32_t) * (size_t)cap);
    cr->held_floating = malloc((size_t)cap);
    return cr->held != NULL && cr->held_floating != NULL ? FB_OK : FB_ENOMEM;
}

void fb_credit_free(fb_credit_t *cr)
{
    free(cr->held);
    free(cr->held_floating);
    cr->held = NULL;
    cr->held_floating = NULL;
    cr->nheld = cr->nkept = cr->cap = 0;
}

int fb_credit_add_exclusive(fb_credit_t *cr, int32_t index)
{
    if (cr->nheld + cr->nkept >= cr->cap)
        return FB_ESTATE;
    cr->held[cr->nheld] = index;
    cr->held_floating[cr->nheld++] = 0;
    cr->num_exclusive++;
    return FB_OK;
}

int fb_credit_hold(fb_credit_t *cr, int32_t index, int floating)
{
    if (cr->nheld + cr->nkept >= cr->cap)
        return 0;
    cr->held[cr->nheld] = index;
    cr->held_floating[cr->nheld++] = (uint8_t)(floating != 0);
    cr->unannounced++;
    return 1;
}

/* The sender would soon run out: half the held segments are unannounced,
 * or it knows of at most one free one. */
static int urgent(const fb_credit_t *cr)
{
    return cr->unannounced * 2 >= cr->cap || cr->nheld - cr->unannounced <= 1;
}

fb_credit_action_t fb_credit_announce(fb_credit_t *cr, int open, int consumer_reads)
{
    if (cr->queued && cr->deferred && urgent(cr)) {
        cr->deferred = 0;
        return FB_CREDIT_SEND_QUEUED;
    }
    if (cr->queued || !open)
        return FB_CREDIT_NOTHING;
    cr->queued = 1;
    /* A consumer that reads the socket itself sends it with its next read,
     * unless the sender is about to run out: no wake-up of the writer, and
     * several buffers' credit in one frame. */
    if (consumer_reads && !urgent(cr)) {
        cr->deferred = 1;
        return FB_CREDIT_DEFER;
    }
    /* A sender that streams is better served by the writer batching credit
     * than by a system call in the consumer's thread. */
    return cr->backlog > 0 ? FB_CREDIT_BATCH : FB_CREDIT_SEND;
}

void fb_credit_unqueue(fb_credit_t *cr)
{
    cr->queued = 0;
    cr->deferred = 0;
}

int32_t fb_credit_take_announcement(fb_credit_t *cr)
{
    int32_t n = cr->unannounced;
    cr->unannounced = 0;
    cr->queued = 0;
    cr->deferred = 0;
    return n;
}

int32_t fb_credit_take_initial(fb_credit_t *cr)
{
    cr->unannounced = 0;
    return cr->nheld;
}

int fb_credit_consume(fb_credit_t *cr, int32_t *index, int *floating)
{
    if (cr->nheld == 0)
        return -1;
    cr->nheld--;
    *index = cr->held[cr->nheld];
    *floating = cr->held_floating[cr->nheld];
    return 0;
}

void fb_credit_keep(fb_credit_t *cr, int32_t index, int floating)
{
    int32_t at = cr->cap - ++cr->nkept;
    cr->held[at] = index;
    cr->held_floating[at] = (uint8_t)(floating != 0);
}

int fb_credit_unkeep(fb_credit_t *cr, int32_t *index, int *floating)
{
    int32_t at = cr->cap - cr->nkept;
    if (cr->nkept == 0)
        return -1;
    cr->nkept--;
    *index = cr->held[at];
    *floating = cr->held_floating[at];
    return 0;
}

void fb_credit_release_all(fb_credit_t *cr, const int32_t **held, const uint8_t **floating,
                           int32_t *n)
{
    int32_t kept_at = cr->cap - cr->nkept;
    memmove(cr->held + cr->nheld, cr->held + kept_at, sizeof(int32_t) * (size_t)cr->nkept);
    memmove(cr->held_floating + cr->nheld, cr->held_floating + kept_at, (size_t)cr->nkept);
    *held = cr->held;
    *floating = cr->held_floating;
    *n = cr->nheld + cr->nkept;
    cr->nheld = cr->nkept = 0;
    cr->unannounced = 0;
}

int32_t fb_credit_need(fb_credit_t *cr, int32_t backlog)
{
    int64_t need = (int64_t)backlog + cr->num_exclusive - cr->nheld;
    if (need > cr->cap - cr->nheld - cr->nkept)
        need = cr->cap - cr->nheld - cr->nkept;
    return need > 0 ? (int32_t)need : 0;
}

int32_t fb_credit_room(const fb_credit_t *cr, int32_t waiting)
{
    int64_t free = (int64_t)cr->cap - cr->nheld - cr->nkept;
    int64_t room;
    if (cr->limit >= cr->cap)           /* no bound: only the array's room */
        return free > 0 ? (int32_t)free : 0;
    /* A lent buffer that waits has a kept segment already: count the
     * larger of the two, not both. */
    room = (int64_t)cr->limit - cr->nheld - (waiting > cr->nkept ? waiting : cr->nkept);
    if (room > free)
        room = free;
    return room > 0 ? (int32_t)room : 0;
}

void fb_credit_set_limit(fb_credit_t *cr, int32_t n)
{
    /* (read without the channel's lock by fb_inchan_buffer_taken) */
    __atomic_store_n(&cr->limit, n >= 1 && n < cr->cap ? n : cr->cap, __ATOMIC_RELAXED);
}

void fb_credit_counts(const fb_credit_t *cr, int32_t *exclusive, int32_t *floating)
{
    int32_t k, fl = 0;
    for (k = 0; k < cr->nheld; k++)
        fl += cr->held_floating[k];
    *exclusive = cr->nheld - fl;
    *floating = fl;
}

void fb_credit_reset_events(fb_credit_t *cr)
{
    cr->events_received = 0;
    cr->events_granted = FB_CREDIT_EVENT_WINDOW;
    cr->events_taken = 0;
}

int fb_credit_event_arrives(fb_credit_t *cr)
{
    if (cr->events_received == cr->events_granted)
        return -1;
    cr->events_received++;
    return 0;
}

fb_credit_action_t fb_credit_event_taken(fb_credit_t *cr, int open)
{
    cr->events_taken++;
    if (cr->event_queued || !open)
        return FB_CREDIT_NOTHING;
    cr->event_queued = 1;
    return FB_CREDIT_SEND;
}

void fb_credit_event_unqueue(fb_credit_t *cr)
{
    cr->event_queued = 0;
}

int32_t fb_credit_take_event_grant(fb_credit_t *cr, int open)
{
    int32_t n = open ? cr->events_taken : 0;
    if (n > 0)
        cr->events_granted += (uint32_t)n;
    cr->events_taken = 0;
    cr->event_queued = 0;
    return n;
}

/* ---- waiting list ---------------------------------------------------------------- */

int fb_waitlist_want(fb_waitlist_t *wl, fb_credit_t *cr, int32_t need)
{
    if (cr->wants >= need)
        return FB_OK;
    if (cr->wants == 0) {
        if (wl->n == wl->cap) {
            int32_t cap = wl->cap ? 2 * wl->cap : 16;
            fb_credit_t **w = realloc(wl->waiting, sizeof(*w) * (size_t)cap);
            if (w == NULL)
                return FB_ENOMEM;
            wl->waiting = w;
            wl->cap = cap;
        }
        wl->waiting[wl->n++] = cr;
    }
    cr->wants = need;
    return FB_OK;
}

static void drop_at(fb_waitlist_t *wl, int32_t k)
{
    memmove(wl->waiting + k, wl->waiting + k + 1, sizeof(*wl->waiting) * (size_t)(wl->n - k - 1));
    wl->n--;
}

fb_credit_t *fb_waitlist_pop(fb_waitlist_t *wl)
{
    fb_credit_t *cr;
    if (wl->n == 0)
        return NULL;
    cr = wl->waiting[0];
    if (--cr->wants <= 0) {
        cr->wants = 0;
        drop_at(wl, 0);
    }
    return cr;
}

int fb_waitlist_took(fb_waitlist_t *wl, fb_credit_t *cr)
{
    if (cr->wants <= 0)
        return 0;
    if (--cr->wants == 0)
        fb_waitlist_remove(wl, cr);
    return 1;
}

void fb_waitlist_remove(fb_waitlist_t *wl, fb_credit_t *cr)
{
    int32_t k;
    for (k = 0; k < wl->n; k++)
        if (wl->waiting[k] == cr) {
            drop_at(wl, k);
            break;
        }
    cr->wants = 0;
}

void fb_waitlist_free(fb_waitlist_t *wl)
{
    free(wl->waiting);
    wl->waiting = NULL;
    wl->n = wl->cap = 0;
}
