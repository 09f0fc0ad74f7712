# csrc/network/credit.h: a remote input channel's held segments and credit
# (pure bookkeeping, no locks, no I/O).
from libc.stdint cimport int32_t, uint8_t, uint32_t


cdef extern from "network/credit.h" nogil:
    enum:
        FB_CREDIT_EVENT_WINDOW

    ctypedef enum fb_credit_action_t:
        FB_CREDIT_NOTHING
        FB_CREDIT_SEND
        FB_CREDIT_BATCH
        FB_CREDIT_DEFER
        FB_CREDIT_SEND_QUEUED

    ctypedef struct fb_credit_t:
        int32_t nheld
        int32_t cap
        int32_t num_exclusive
        int32_t unannounced
        int32_t backlog
        int32_t wants
        uint8_t queued
        uint8_t deferred
        uint8_t event_queued
        uint32_t events_received
        uint32_t events_granted
        int32_t events_taken

    int fb_credit_init(fb_credit_t *cr, int32_t cap)
    void fb_credit_free(fb_credit_t *cr)
    int fb_credit_add_exclusive(fb_credit_t *cr, int32_t index)
    int fb_credit_hold(fb_credit_t *cr, int32_t index, int floating)
    fb_credit_action_t fb_credit_announce(fb_credit_t *cr, int open, int consumer_reads)
    void fb_credit_unqueue(fb_credit_t *cr)
    int32_t fb_credit_take_announcement(fb_credit_t *cr)
    int32_t fb_credit_take_initial(fb_credit_t *cr)
    int fb_credit_consume(fb_credit_t *cr, int32_t *index, int *floating)
    void fb_credit_release_all(fb_credit_t *cr, const int32_t **held, const uint8_t **floating,
                               int32_t *n)
    int32_t fb_credit_need(fb_credit_t *cr, int32_t backlog)
    void fb_credit_counts(const fb_credit_t *cr, int32_t *exclusive, int32_t *floating)
    void fb_credit_reset_events(fb_credit_t *cr)
    int fb_credit_event_arrives(fb_credit_t *cr)
    fb_credit_action_t fb_credit_event_taken(fb_credit_t *cr, int open)
    void fb_credit_event_unqueue(fb_credit_t *cr)
    int32_t fb_credit_take_event_grant(fb_credit_t *cr, int open)

    ctypedef struct fb_waitlist_t:
        fb_credit_t **waiting
        int32_t n
        int32_t cap

    int fb_waitlist_want(fb_waitlist_t *wl, fb_credit_t *cr, int32_t need)
    fb_credit_t *fb_waitlist_pop(fb_waitlist_t *wl)
    int fb_waitlist_took(fb_waitlist_t *wl, fb_credit_t *cr)
    void fb_waitlist_remove(fb_waitlist_t *wl, fb_credit_t *cr)
    void fb_waitlist_free(fb_waitlist_t *wl)
