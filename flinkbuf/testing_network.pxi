# Test hooks of the network layer (included by _testing.pyx): Python wrappers
# of the hooks the network extension declares in flinkbuf/network/_network.pxd
# (the wire format, one channel's credit and a gate's waiting list, the frame
# reader without a socket, sealed records), which it implements over the C it
# links: no C of the network layer is compiled into this module.

from libc.string cimport memcpy
from posix.uio cimport iovec

from flinkbuf.csrc.credit cimport *
from flinkbuf.csrc.frame_reader cimport *
from flinkbuf.csrc.seal cimport FB_SEAL_KEY, FB_SEAL_MAX_RECORD, FB_SEAL_OVERHEAD, fb_seal_t
from flinkbuf.csrc.wire cimport *
from flinkbuf.network._network cimport (credit_hooks, credit_hooks_t, frame_reader_hooks,
                                        frame_reader_hooks_t, seal_hooks, seal_hooks_t,
                                        wire_hooks, wire_hooks_t)

cdef const wire_hooks_t *_WIRE = wire_hooks()
cdef const credit_hooks_t *_CREDIT = credit_hooks()
cdef const frame_reader_hooks_t *_FRAMES = frame_reader_hooks()
cdef const seal_hooks_t *_SEAL = seal_hooks()

# ---- layer 4: the wire format ------------------------------------------------------

_MSG_NAMES = {FB_MSG_BUFFER: "buffer", FB_MSG_ERROR: "error",
              FB_MSG_PARTITION_REQUEST: "request", FB_MSG_CANCEL: "cancel",
              FB_MSG_CLOSE: "close", FB_MSG_ADD_CREDIT: "credit",
              FB_MSG_ADD_EVENT_CREDIT: "event_credit", FB_MSG_BUFFER_LENT: "lent",
              FB_MSG_RELEASE: "release", FB_MSG_HEARTBEAT_REQUEST: "heartbeat",
              FB_MSG_HEARTBEAT_RESPONSE: "heartbeat_response",
              FB_MSG_NEW_BUFFER_SIZE: "buffer_size"}
MIN_BUFFER_SIZE = FB_NET_MIN_BUFFER_SIZE


cdef tuple _frame_tuple(const fb_wire_frame_t *f, const char *frame, size_t used):
    """A decoded frame as a tuple (a buffer's payload: the ``used`` bytes at
    ``frame`` end with it)."""
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
    if msg == FB_MSG_HEARTBEAT_REQUEST or msg == FB_MSG_HEARTBEAT_RESPONSE:
        return (_MSG_NAMES[msg], f.u.heartbeat)
    if msg == FB_MSG_NEW_BUFFER_SIZE:
        return ("buffer_size", f.receiver_id, f.u.buffer_size)
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
        rc = _WIRE.decode(p + off, n - off, segment_size, &f, &used, err, sizeof(err))
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
    end = _WIRE.put_release(out, ids, len(segments))
    return out[:end - out]


cdef bytes _encode_buffer(tuple frame):
    cdef bytes a = bytes(frame[5])
    cdef bytearray out = bytearray(FB_NET_HEADER + FB_NET_BUFFER_FIELDS + len(a))
    cdef char *p = out
    _WIRE.put_buffer(p, frame[1], frame[2], frame[3], frame[4], len(a))
    out[FB_NET_HEADER + FB_NET_BUFFER_FIELDS:] = a
    return bytes(out)


def wire_encode(tuple frame):
    """One frame as the connection's encoders write it, from a tuple:
    ``("buffer", receiver, sequence, backlog, type, payload)``,
    ``("error", receiver, code, type_name, message)``,
    ``("request", receiver, subpartition, credit, partition_id)``,
    ``("cancel", receiver)``, ``("credit" | "event_credit", receiver, n)``,
    ``("close",)``, ``("lent", receiver, sequence, backlog, size, segment)``,
    ``("release", [segment, ...])`` (1 to FB_NET_MAX_RELEASE segments; the
    receiver id of a release is always 0xFFFFFFFF),
    ``("heartbeat" | "heartbeat_response", token)`` (connection-wide),
    ``("buffer_size", receiver, size)`` (any u32 size: the decoder checks it)."""
    cdef bytearray out
    cdef char *p
    cdef char *end
    cdef bytes a, b
    kind = frame[0]
    if kind == "release":
        return _encode_release(frame[1])
    if kind == "buffer":
        return _encode_buffer(frame)
    out = bytearray(FB_NET_HEADER + FB_NET_MAX_ERROR_BODY + FB_NET_MAX_CONTROL_FRAME)
    p = out
    if kind == "error":
        a = bytes(frame[3])
        b = bytes(frame[4])
        end = _WIRE.put_error_body(p + FB_NET_HEADER, frame[1], frame[2], a, len(a), b, len(b))
        _WIRE.put_header(p, end - (p + FB_NET_HEADER), FB_MSG_ERROR)
    elif kind == "request":
        a = bytes(frame[4])
        if len(a) > FB_NET_MAX_PARTITION_ID:
            raise ValueError("partition id too long")
        end = _WIRE.put_request(p, frame[1], frame[2], frame[3], a, len(a))
    elif kind == "cancel":
        end = _WIRE.put_cancel(p, frame[1])
    elif kind in ("credit", "event_credit"):
        end = _WIRE.put_credit(p, FB_MSG_ADD_CREDIT if kind == "credit"
                               else FB_MSG_ADD_EVENT_CREDIT, frame[1], frame[2])
    elif kind == "close":
        end = _WIRE.put_close(p)
    elif kind == "lent":
        end = _WIRE.put_lent(p, frame[1], frame[2], frame[3], frame[4], frame[5])
    elif kind in ("heartbeat", "heartbeat_response"):
        end = _WIRE.put_heartbeat(p, FB_MSG_HEARTBEAT_REQUEST if kind == "heartbeat"
                                  else FB_MSG_HEARTBEAT_RESPONSE, frame[1])
    elif kind == "buffer_size":
        end = _WIRE.put_buffer_size(p, frame[1], frame[2])
    else:
        raise ValueError(f"unknown frame kind {kind!r}")
    return bytes(out[:end - p])


# ---- layer 4: the frame reader, fed bytes cut anywhere (no socket) -----------------

cdef struct _Chunks:
    const char *data
    size_t n                # the stream's bytes
    size_t pos              # given so far
    size_t stop             # what the source has now: data[pos:stop]


cdef ssize_t _chunk_source(void *arg, iovec *iov, int iovcnt) noexcept nogil:
    """The frame reader's source over a stream cut into chunks: what the
    current chunk still has, then nothing (the next chunk comes with the
    next read), and the end after the last."""
    cdef _Chunks *s = <_Chunks *>arg
    cdef size_t got = 0, take
    cdef int k
    if s.pos >= s.stop:
        return FB_SOURCE_END if s.pos >= s.n else FB_SOURCE_EMPTY
    for k in range(iovcnt):
        take = iov[k].iov_len
        if take > s.stop - s.pos:
            take = s.stop - s.pos
        memcpy(iov[k].iov_base, s.data + s.pos, take)
        s.pos += take
        got += take
        if s.pos >= s.stop:
            break
    return <ssize_t>got


cdef tuple _buffer_fields(const fb_wire_frame_t *f):
    return ("buffer", f.receiver_id, f.u.buffer.sequence, f.u.buffer.backlog, f.u.buffer.type)


cdef list _read_chunk(fb_frame_reader_t *r, _Chunks *src, frozenset skip, list held):
    """Read what the current chunk gives: the frames it completes (a
    buffer's body dropped for a receiver in ``skip``: payload None).
    ``held``: the buffer whose body is on its way ([fields, body]).  Raises
    ValueError on a protocol violation; returns at the chunk's end."""
    cdef list frames = []
    cdef int ev
    cdef bytearray body
    while True:
        ev = _FRAMES.read(r, _chunk_source, src)
        if ev == FB_FRAME_CONTROL:
            frames.append(_frame_tuple(&r.frame, NULL, 0))
            _FRAMES.next(r)
        elif ev == FB_FRAME_BUFFER:
            fields = _buffer_fields(&r.frame)
            if r.frame.receiver_id in skip:
                held[:] = [fields, None]
                _FRAMES.skip_body(r)
            else:
                body = bytearray(r.frame.u.buffer.size)
                held[:] = [fields, body]
                _FRAMES.body_into(r, body)          # (the bytearray is kept in `held`)
        elif ev == FB_FRAME_BODY or ev == FB_FRAME_SKIPPED:
            fields, body_obj = held
            frames.append((*fields, None if body_obj is None else bytes(body_obj)))
            held[:] = []
        elif ev == FB_FRAME_BAD:
            raise ValueError(r.err.decode("utf-8", "replace"))
        elif ev != FB_FRAME_PROGRESS:
            return frames                           # NONE (the chunk's end), END


def frame_read(bytes stream not None, int32_t segment_size, cuts=(), skip=()):
    """Feed ``stream`` to a connection's frame reader (no socket) in chunks
    cut at the offsets ``cuts``: ``(frames, mid)``, the frames it read
    whole (tuples as :func:`wire_decode` gives; a buffer of a receiver id in
    ``skip`` has its body dropped as it comes: payload None), and whether
    the stream ended inside a frame.  A protocol violation raises
    ValueError with the reason a connection would give."""
    cdef fb_frame_reader_t r
    cdef _Chunks src
    cdef list frames = [], held = []
    cdef frozenset skipped = frozenset(skip)
    bounds = sorted({int(c) for c in cuts if 0 < int(c) < len(stream)}) + [len(stream)]
    if _FRAMES.init(&r, segment_size) != 0:
        raise MemoryError()
    src.data = stream
    src.n = len(stream)
    src.pos = 0
    try:
        for stop in bounds:
            src.stop = stop
            frames += _read_chunk(&r, &src, skipped, held)
        return frames, bool(_FRAMES.mid(&r))
    finally:
        _FRAMES.free(&r)


# ---- layer 4: sealed records -----------------------------------------------------------

cdef class Sealer:
    """One direction's sealing (``fb_seal_t``, csrc/network/seal.h): records
    as a sealed connection sends them, numbered from 0, for a test's peer
    that speaks the protocol by hand."""
    cdef fb_seal_t *s

    def __cinit__(self, bytes key not None):
        if len(key) != FB_SEAL_KEY:
            raise ValueError(f"a key is {FB_SEAL_KEY} bytes")
        self.s = _SEAL.new(key, 1)
        if self.s == NULL:
            raise MemoryError()

    def __dealloc__(self):
        if self.s != NULL:
            _SEAL.free(self.s)

    def seal(self, bytes data not None):
        """``data`` (1 to FB_SEAL_MAX_RECORD bytes) as the next record."""
        cdef iovec v
        cdef bytearray out
        if not 1 <= len(data) <= FB_SEAL_MAX_RECORD:
            raise ValueError(f"a record seals 1 to {FB_SEAL_MAX_RECORD} bytes")
        out = bytearray(FB_SEAL_OVERHEAD + len(data))
        v.iov_base = <char *>data
        v.iov_len = len(data)
        if _SEAL.record(self.s, &v, 1, len(data), <unsigned char *><char *>out) != 0:
            raise RuntimeError("sealing failed")
        return bytes(out)


# ---- layer 4: credit (pure bookkeeping, csrc/network/credit.h) ------------------

cdef class CreditModel:
    """One remote channel's credit state (``fb_credit_t``), driven directly:
    the calls a connection makes under its lock, with no connection."""
    cdef fb_credit_t cr
    cdef bint ready

    def __cinit__(self, int32_t cap):
        if cap < 1 or cap > 1 << 20:
            raise ValueError("cap must be in [1, 2**20]")
        if _CREDIT.init(&self.cr, cap) != FB_OK:
            _CREDIT.free(&self.cr)
            raise MemoryError()
        self.ready = True

    def __dealloc__(self):
        if self.ready:
            _CREDIT.free(&self.cr)

    def add_exclusive(self, int32_t index):
        return _CREDIT.add_exclusive(&self.cr, index) == FB_OK

    def hold(self, int32_t index, bint floating):
        return bool(_CREDIT.hold(&self.cr, index, floating))

    def announce(self, bint open, bint consumer_reads):
        return <int>_CREDIT.announce(&self.cr, open, consumer_reads)

    def unqueue(self):
        _CREDIT.unqueue(&self.cr)

    def take_announcement(self):
        return _CREDIT.take_announcement(&self.cr)

    def take_initial(self):
        return _CREDIT.take_initial(&self.cr)

    def consume(self):
        cdef int32_t index
        cdef int floating
        if _CREDIT.consume(&self.cr, &index, &floating) < 0:
            return None
        return index, bool(floating)

    def release_all(self):
        cdef const int32_t *held
        cdef const uint8_t *floating
        cdef int32_t n, k
        _CREDIT.release_all(&self.cr, &held, &floating, &n)
        return [(held[k], bool(floating[k])) for k in range(n)]

    def need(self, int32_t backlog):
        return _CREDIT.need(&self.cr, backlog)

    def counts(self):
        cdef int32_t exclusive, floating
        _CREDIT.counts(&self.cr, &exclusive, &floating)
        return exclusive, floating

    def set_backlog(self, int32_t backlog):
        self.cr.backlog = backlog

    def reset_events(self):
        _CREDIT.reset_events(&self.cr)

    def event_arrives(self):
        return _CREDIT.event_arrives(&self.cr) == 0

    def event_taken(self, bint open):
        return <int>_CREDIT.event_taken(&self.cr, open)

    def take_event_grant(self, bint open):
        return _CREDIT.take_event_grant(&self.cr, open)

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
        _CREDIT.waitlist_free(&self.wl)

    def want(self, CreditModel cr not None, int32_t need):
        if _CREDIT.waitlist_want(&self.wl, &cr.cr, need) != FB_OK:
            raise MemoryError()
        self.members[<size_t>&cr.cr] = cr

    def pop(self):
        cdef fb_credit_t *p = _CREDIT.waitlist_pop(&self.wl)
        return None if p == NULL else self.members[<size_t>p]

    def took(self, CreditModel cr not None):
        return bool(_CREDIT.waitlist_took(&self.wl, &cr.cr))

    def remove(self, CreditModel cr not None):
        _CREDIT.waitlist_remove(&self.wl, &cr.cr)

    def __len__(self):
        return self.wl.n


# ---- layer 4: the shared-memory transport ------------------------------------------

def shm_waits(Connection conn not None):
    """How the waits of ``conn``'s shared-memory transport went so far:
    ``{"waits", "looks", "looks_paid", "sleeps"}`` (csrc/network/shm.h's
    fb_shm_stats_t), or None over another transport."""
    return conn._shm_waits()
