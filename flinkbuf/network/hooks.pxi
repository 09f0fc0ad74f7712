# The network layer's test hooks (declared in _network.pxd): tables of the C
# functions of its pure units, for flinkbuf._testing.  Included by
# _network.pyx; nothing shipped calls them.

cdef wire_hooks_t _WIRE_HOOKS
_WIRE_HOOKS.decode = fb_wire_decode
_WIRE_HOOKS.put_header = fb_wire_put_header
_WIRE_HOOKS.put_buffer = fb_wire_put_buffer
_WIRE_HOOKS.put_request = fb_wire_put_request
_WIRE_HOOKS.put_credit = fb_wire_put_credit
_WIRE_HOOKS.put_cancel = fb_wire_put_cancel
_WIRE_HOOKS.put_close = fb_wire_put_close
_WIRE_HOOKS.put_lent = fb_wire_put_lent
_WIRE_HOOKS.put_release = fb_wire_put_release
_WIRE_HOOKS.put_heartbeat = fb_wire_put_heartbeat
_WIRE_HOOKS.put_buffer_size = fb_wire_put_buffer_size
_WIRE_HOOKS.put_error_body = fb_wire_put_error_body

cdef credit_hooks_t _CREDIT_HOOKS
_CREDIT_HOOKS.init = fb_credit_init
_CREDIT_HOOKS.free = fb_credit_free
_CREDIT_HOOKS.add_exclusive = fb_credit_add_exclusive
_CREDIT_HOOKS.hold = fb_credit_hold
_CREDIT_HOOKS.announce = fb_credit_announce
_CREDIT_HOOKS.unqueue = fb_credit_unqueue
_CREDIT_HOOKS.take_announcement = fb_credit_take_announcement
_CREDIT_HOOKS.take_initial = fb_credit_take_initial
_CREDIT_HOOKS.consume = fb_credit_consume
_CREDIT_HOOKS.release_all = fb_credit_release_all
_CREDIT_HOOKS.need = fb_credit_need
_CREDIT_HOOKS.counts = fb_credit_counts
_CREDIT_HOOKS.reset_events = fb_credit_reset_events
_CREDIT_HOOKS.event_arrives = fb_credit_event_arrives
_CREDIT_HOOKS.event_taken = fb_credit_event_taken
_CREDIT_HOOKS.take_event_grant = fb_credit_take_event_grant
_CREDIT_HOOKS.waitlist_want = fb_waitlist_want
_CREDIT_HOOKS.waitlist_pop = fb_waitlist_pop
_CREDIT_HOOKS.waitlist_took = fb_waitlist_took
_CREDIT_HOOKS.waitlist_remove = fb_waitlist_remove
_CREDIT_HOOKS.waitlist_free = fb_waitlist_free

cdef frame_reader_hooks_t _FRAME_READER_HOOKS
_FRAME_READER_HOOKS.init = fb_frame_reader_init
_FRAME_READER_HOOKS.free = fb_frame_reader_free
_FRAME_READER_HOOKS.read = fb_frame_read
_FRAME_READER_HOOKS.next = fb_frame_next
_FRAME_READER_HOOKS.body_into = fb_frame_body_into
_FRAME_READER_HOOKS.skip_body = fb_frame_skip_body
_FRAME_READER_HOOKS.mid = fb_frame_mid

cdef seal_hooks_t _SEAL_HOOKS
_SEAL_HOOKS.new = fb_seal_new
_SEAL_HOOKS.free = fb_seal_free
_SEAL_HOOKS.record = fb_seal_record


cdef const wire_hooks_t *wire_hooks() noexcept:
    return &_WIRE_HOOKS


cdef const credit_hooks_t *credit_hooks() noexcept:
    return &_CREDIT_HOOKS


cdef const frame_reader_hooks_t *frame_reader_hooks() noexcept:
    return &_FRAME_READER_HOOKS


cdef const seal_hooks_t *seal_hooks() noexcept:
    return &_SEAL_HOOKS
