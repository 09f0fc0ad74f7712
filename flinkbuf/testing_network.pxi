# Test hooks of the network layer (included by _testing.pyx).

# ---- layer 4: the wire format ------------------------------------------------------

_MSG_NAMES = {FB_MSG_BUFFER: "buffer", FB_MSG_ERROR: "error",
              FB_MSG_PARTITION_REQUEST: "request", FB_MSG_CANCEL: "cancel",
              FB_MSG_CLOSE: "close", FB_MSG_ADD_CREDIT: "credit",
              FB_MSG_ADD_EVENT_CREDIT: "event_credit", FB_MSG_BUFFER_LENT: "lent",
              FB_MSG_RELEASE: "release"}


cdef tuple _frame_tuple(const fb_wire_frame_t *f, const char *frame, size_t used):
    cdef uint8_t msg = f.msg
    if msg == FB_MSG_BUFFER:
        return ("buffer", f.receiver_id, f.u.buffer.sequence, f.u.buffer.backlog,
                f.u.buffer.type, frame[used - f.u.buffer.size:used])
    if msg == FB_MSG_ERROR:
        return ("error", f.receiver_id, f.u.error.code,
                f.u.error.type[:f.u.error.type_len], f.u.error.message[:f.u.error.message_len])
    if msg == FB_MSG_PARTITION_REQUEST:
        return ("request", f.receiver_id, f.u.request.subpartition, f.u.request.credit,
                f.u.request.partition_id[:f.u.request.id_len])
    if msg == FB_MSG_CANCEL:
        return ("cancel", f.receiver_id)
    if msg == FB_MSG_CLOSE:
        return ("close",)
    if msg == FB_MSG_BUFFER_LENT:
        return ("lent", f.receiver_id, f.u.lent.sequence, f.u.lent.backlog, f.u.lent.size,
                f.u.lent.segment)
    if msg == FB_MSG_RELEASE:
        return ("release", [fb_wire_release_segment(&f.u.release, k)
                            for k in range(f.u.release.count)])
    return (_MSG_NAMES[msg], f.receiver_id, f.u.credit)


def wire_decode(bytes data not None, int32_t segment_size):
    """Decode the frames at the start of ``data`` with the connection's
    decoder (no socket): ``(frames, used)``, each frame a tuple as
    :func:`wire_encode` takes; ``used`` bytes were whole frames, the rest is
    a frame's start.  A protocol violation raises ValueError with the reason
    a connection would give."""
    cdef const char *p = data
    cdef size_t n = <size_t>len(data), off = 0, used = 0
    cdef fb_wire_frame_t f
    cdef char err[256]
    cdef int rc
    cdef list frames = []
    while True:
        rc = fb_wire_decode(p + off, n - off, segment_size, &f, &used, err, sizeof(err))
        if rc == FB_WIRE_MORE:
            return frames, off
        if rc != FB_WIRE_OK:
            raise ValueError(err.decode("utf-8", "replace"))
        frames.append(_frame_tuple(&f, p + off, used))
        off += used


cdef bytes _encode_release(segments):
    cdef uint32_t ids[FB_NET_MAX_RELEASE]
    cdef char out[FB_NET_MAX_RELEASE_FRAME]
    cdef char *end
    cdef uint32_t k
    if not 1 <= len(segments) <= FB_NET_MAX_RELEASE:
        raise ValueError(f"a release names 1 to {FB_NET_MAX_RELEASE} segments")
    for k in range(len(segments)):
        ids[k] = segments[k]
    end = fb_wire_put_release(out, ids, len(segments))
    return out[:end - out]


def wire_encode(tuple frame):
    """One frame as the connection's encoders write it, from a tuple:
    ``("buffer", receiver, sequence, backlog, type, payload)``,
    ``("error", receiver, code, type_name, message)``,
    ``("request", receiver, subpartition, credit, partition_id)``,
    ``("cancel", receiver)``, ``("credit" | "event_credit", receiver, n)``,
    ``("close",)``, ``("lent", receiver, sequence, backlog, size, segment)``,
    ``("release", [segment, ...])`` (1 to FB_NET_MAX_RELEASE segments; the
    receiver id of a release is always 0xFFFFFFFF)."""
    cdef bytearray out
    cdef char *p
    cdef char *end
    cdef bytes a, b
    kind = frame[0]
    if kind == "release":
        return _encode_release(frame[1])
    if kind == "buffer":
        a = bytes(frame[5])
        out = bytearray(FB_NET_HEADER + FB_NET_BUFFER_FIELDS + len(a))
        p = out
        end = fb_wire_put_buffer(p, frame[1], frame[2], frame[3], frame[4], len(a))
        out[FB_NET_HEADER + FB_NET_BUFFER_FIELDS:] = a
        return bytes(out)
    out = bytearray(FB_NET_HEADER + FB_NET_MAX_ERROR_BODY + FB_NET_MAX_CONTROL_FRAME)
    p = out
    if kind == "error":
        a = bytes(frame[3])
        b = bytes(frame[4])
        end = fb_wire_put_error_body(p + FB_NET_HEADER, frame[1], frame[2], a, len(a), b, len(b))
        fb_wire_put_header(p, end - (p + FB_NET_HEADER), FB_MSG_ERROR)
    elif kind == "request":
        a = bytes(frame[4])
        if len(a) > FB_NET_MAX_PARTITION_ID:
            raise ValueError("partition id too long")
        end = fb_wire_put_request(p, frame[1], frame[2], frame[3], a, len(a))
    elif kind == "cancel":
        end = fb_wire_put_cancel(p, frame[1])
    elif kind in ("credit", "event_credit"):
        end = fb_wire_put_credit(p, FB_MSG_ADD_CREDIT if kind == "credit"
                                 else FB_MSG_ADD_EVENT_CREDIT, frame[1], frame[2])
    elif kind == "close":
        end = fb_wire_put_close(p)
    elif kind == "lent":
        end = fb_wire_put_lent(p, frame[1], frame[2], frame[3], frame[4], frame[5])
    else:
        raise ValueError(f"unknown frame kind {kind!r}")
    return bytes(out[:end - p])


# ---- layer 4: credit (pure bookkeeping, csrc/network/credit.h) ------------------

cdef class CreditModel:
    """One remote channel's credit state (``fb_credit_t``), driven directly:
    the calls a connection makes under its lock, with no connection."""
    cdef fb_credit_t cr
    cdef bint ready

    def __cinit__(self, int32_t cap):
        if cap < 1 or cap > 1 << 20:
            raise ValueError("cap must be in [1, 2**20]")
        if fb_credit_init(&self.cr, cap) != FB_OK:
            fb_credit_free(&self.cr)
            raise MemoryError()
        self.ready = True

    def __dealloc__(self):
        if self.ready:
            fb_credit_free(&self.cr)

    def add_exclusive(self, int32_t index):
        return fb_credit_add_exclusive(&self.cr, index) == FB_OK

    def hold(self, int32_t index, bint floating):
        return bool(fb_credit_hold(&self.cr, index, floating))

    def announce(self, bint open, bint consumer_reads):
        return <int>fb_credit_announce(&self.cr, open, consumer_reads)

    def unqueue(self):
        fb_credit_unqueue(&self.cr)

    def take_announcement(self):
        return fb_credit_take_announcement(&self.cr)

    def take_initial(self):
        return fb_credit_take_initial(&self.cr)

    def consume(self):
        cdef int32_t index
        cdef int floating
        if fb_credit_consume(&self.cr, &index, &floating) < 0:
            return None
        return index, bool(floating)

    def release_all(self):
        cdef const int32_t *held
        cdef const uint8_t *floating
        cdef int32_t n, k
        fb_credit_release_all(&self.cr, &held, &floating, &n)
        return [(held[k], bool(floating[k])) for k in range(n)]

    def need(self, int32_t backlog):
        return fb_credit_need(&self.cr, backlog)

    def counts(self):
        cdef int32_t exclusive, floating
        fb_credit_counts(&self.cr, &exclusive, &floating)
        return exclusive, floating

    def set_backlog(self, int32_t backlog):
        self.cr.backlog = backlog

    def reset_events(self):
        fb_credit_reset_events(&self.cr)

    def event_arrives(self):
        return fb_credit_event_arrives(&self.cr) == 0

    def event_taken(self, bint open):
        return <int>fb_credit_event_taken(&self.cr, open)

    def take_event_grant(self, bint open):
        return fb_credit_take_event_grant(&self.cr, open)

    @property
    def state(self):
        """The fields, as a dict."""
        return dict(nheld=self.cr.nheld, cap=self.cr.cap, num_exclusive=self.cr.num_exclusive,
                    unannounced=self.cr.unannounced, queued=self.cr.queued,
                    deferred=self.cr.deferred, event_queued=self.cr.event_queued,
                    events_received=self.cr.events_received,
                    events_granted=self.cr.events_granted, events_taken=self.cr.events_taken,
                    wants=self.cr.wants)


CREDIT_ACTIONS = {FB_CREDIT_NOTHING: "nothing", FB_CREDIT_SEND: "send",
                  FB_CREDIT_BATCH: "batch", FB_CREDIT_DEFER: "defer",
                  FB_CREDIT_SEND_QUEUED: "send_queued"}
CREDIT_EVENT_WINDOW = FB_CREDIT_EVENT_WINDOW


cdef class WaitlistModel:
    """A gate's waiting list (``fb_waitlist_t``) over CreditModel objects."""
    cdef fb_waitlist_t wl
    cdef dict members           # address -> CreditModel (kept alive while listed)

    def __cinit__(self):
        self.wl.waiting = NULL
        self.wl.n = 0
        self.wl.cap = 0
        self.members = {}

    def __dealloc__(self):
        fb_waitlist_free(&self.wl)

    def want(self, CreditModel cr not None, int32_t need):
        if fb_waitlist_want(&self.wl, &cr.cr, need) != FB_OK:
            raise MemoryError()
        self.members[<size_t>&cr.cr] = cr

    def pop(self):
        cdef fb_credit_t *p = fb_waitlist_pop(&self.wl)
        return None if p == NULL else self.members[<size_t>p]

    def took(self, CreditModel cr not None):
        return bool(fb_waitlist_took(&self.wl, &cr.cr))

    def remove(self, CreditModel cr not None):
        fb_waitlist_remove(&self.wl, &cr.cr)

    def __len__(self):
        return self.wl.n


# ---- layer 4: the shared-memory transport ------------------------------------------

def shm_waits(Connection conn not None):
    """How the waits of ``conn``'s shared-memory transport went so far:
    ``{"waits", "looks", "looks_paid", "sleeps"}`` (csrc/network/shm.h's
    fb_shm_stats_t), or None over another transport."""
    return conn._shm_waits()
