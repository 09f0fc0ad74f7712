# Hooks for the tests and the benchmarks: nothing here is public API, and no
# shipped module needs it.  One extension that cimports the layers' contracts
# (their .pxd files) like any other module would.

from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t

from flinkbuf.buffer._buffer cimport Buffer, LocalBufferPool, NetworkBufferPool
from flinkbuf.csrc.clock cimport fb_monotonic_ns
from flinkbuf.csrc.credit cimport *
from flinkbuf.csrc.pool cimport FB_NO_CHANNEL
from flinkbuf.csrc.status cimport FB_OK
from flinkbuf.csrc.wire cimport *
from flinkbuf.io._io cimport ResultPartition, _serialize_event
from flinkbuf.serialization._serialization cimport (FULL_BUFFER, FULL_RECORD, RecordDeserializer,
                                                  RecordSerializer, is_no_record)
from flinkbuf.serialization.codecs.dict_shadow cimport *


# ---- layer 1 -------------------------------------------------------------------

def set_ref_count(Buffer buffer not None, Py_ssize_t count):
    """Set a live buffer's reference count (>= 1), to reach the limits
    without 2**63 calls to retain()."""
    buffer._check()
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    buffer._refcnt = count


def make_read_only(Buffer buffer not None):
    """Make a live buffer read-only, as a buffer lent by another process is
    (its memory stays writable: the tests check that nothing writes it)."""
    buffer._check()
    buffer._readonly = True
    return buffer


def redistribute_now(NetworkBufferPool pool not None):
    """Run one redistribution of ``pool``'s local pools (normally automatic)."""
    pool._redistribute_now()


def c_request_recycle_loop(LocalBufferPool pool not None, Py_ssize_t iterations):
    """Request+recycle pairs in C without the GIL, through the pool's ops
    (as code in other extension modules calls them); ns per pair."""
    cdef int32_t index
    cdef Py_ssize_t i
    cdef int64_t t0, t1
    cdef int rc = FB_OK
    with nogil:
        t0 = fb_monotonic_ns()
        for i in range(iterations):
            rc = pool._c.ops.request(&pool._c, FB_NO_CHANNEL, &index)
            if rc != FB_OK:
                break
            pool._c.ops.recycle(&pool._c, index)
        t1 = fb_monotonic_ns()
    if rc != FB_OK:
        raise RuntimeError("pool had no buffer for the benchmark loop")
    return (t1 - t0) / <double>(iterations if iterations > 0 else 1)


# ---- layer 2 -------------------------------------------------------------------

def stage_general(value, codec="typed"):
    """The staged record (prefix and payload) as the general
    encoder writes it, bypassing the fast paths of serialize_record."""
    cdef RecordSerializer ser = RecordSerializer(codec)
    ser._serialize_general(value)
    return ser._record_bytes()


def stage(value, codec="typed"):
    """The staged record as serialize_record writes it."""
    cdef RecordSerializer ser = RecordSerializer(codec)
    ser._serialize_record(value)
    return ser._record_bytes()




def dict_shadow(keys):
    """What the shadow of CPython's dict table that decoding
    keeps for a large dict (codec_typed.pyx) makes of ``keys``, distinct
    keys inserted in order: ``(table size, slots visited)``."""
    cdef fb_shadow s
    cdef Py_ssize_t same
    cdef Py_hash_t h
    cdef int r = 0
    fb_shadow_init(&s)
    try:
        for k in keys:
            h = PyObject_Hash(k)
            r = fb_shadow_before(&s, type(k) is str, 1 << 32)
            if r == 0:
                r = fb_shadow_after(&s, h, True, &same, 0)
            if r:
                raise MemoryError()
        return s.size, s.probes
    finally:
        fb_shadow_free(&s)


def c_round_trip(RecordSerializer ser not None, RecordDeserializer des not None,
                  pool, list records, bint keep=True):
    """Move ``records`` through ``ser`` into
    buffers from ``pool`` and out of ``des`` with the C-level contract only,
    as a RecordWriter and an InputGate do.  Returns the records read (with
    ``keep``), else how many were read."""
    cdef list out = []
    cdef Py_ssize_t count = 0
    cdef Buffer buf = pool.request_buffer()
    cdef int flags
    cdef object r
    if buf is None:
        raise RuntimeError("the pool has no buffer")
    try:
        for r in records:
            ser._serialize_record(r)
            while True:
                flags = ser._copy_to_buffer(buf)
                if flags & FULL_BUFFER:
                    des._feed(buf)
                    buf = None
                    while True:
                        r = des._next_record()
                        if is_no_record(r):
                            break
                        count += 1
                        if keep:
                            out.append(r)
                    buf = pool.request_buffer()
                    if buf is None:
                        raise RuntimeError("the pool has no buffer")
                if flags & FULL_RECORD:
                    break
        des._feed(buf)
        buf = None
        while True:
            r = des._next_record()
            if is_no_record(r):
                break
            count += 1
            if keep:
                out.append(r)
    finally:
        if buf is not None:
            buf._release()
    return out if keep else count


# ---- layer 3 -------------------------------------------------------------------

def serialize_event(event):
    """The bytes a user event travels as (to build event buffers by hand)."""
    return _serialize_event(event)


def attach_reader(ResultPartition partition not None):
    """Count a reader in another process on ``partition``, as a connection
    that serves one of its subpartitions does (until detach_reader)."""
    partition._check_initialised()
    partition._reader_attached()


def detach_reader(ResultPartition partition not None):
    """That reader is done (as the connection says when it ends the
    subpartition's channel)."""
    if partition._readers <= 0:
        raise ValueError("no reader is attached")
    partition._reader_detached()


def num_readers(ResultPartition partition not None):
    """Readers in other processes that hold ``partition`` now."""
    return partition._readers


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
