# In-band events: EndOfPartition and user events.  Included by _io.pyx.
#
# On the wire an event is one byte of kind, then for a user event the typed
# codec's encoding of its payload.  Local channels queue these bytes as they
# are; remote channels (layer 4) frame them the same way.

cdef enum:
    _EV_END_OF_PARTITION = 0
    _EV_USER = 1

# User events a subpartition holds before its consumer takes them; a
# broadcast_event waits (backpressure) while a consumer has this many, so
# stalled consumers bound events as they bound records.
cdef int32_t _MAX_EVENTS = 8
MAX_QUEUED_EVENTS = _MAX_EVENTS


class Event:
    """Base of the events that travel in-band, between records."""
    __slots__ = ()


class _EndOfPartitionType(Event):
    """The last item of every subpartition; consumed by the input gate."""
    __slots__ = ()

    def __repr__(self):
        return "END_OF_PARTITION"

    def __reduce__(self):
        return "END_OF_PARTITION"


END_OF_PARTITION = _EndOfPartitionType()
cdef object _END_OF_PARTITION = END_OF_PARTITION
cdef bytes _END_OF_PARTITION_BYTES = bytes([_EV_END_OF_PARTITION])


class UserEvent(Event):
    """An application event with a ``payload`` the typed codec can encode
    (None, bool, int, float, str, bytes, tuples, lists, dicts, numpy
    arrays).  ``RecordWriter.broadcast_event`` sends it to every consumer,
    which meets it in its input gate exactly between the records emitted
    before and after it.

    Immutable and final (what distinguishes your events goes into the
    payload: a subclass would not survive the trip).  Events are equal when
    their payloads are, and hashable when the payload is, like a tuple."""
    __slots__ = ("_payload",)

    def __new__(cls, payload=None):
        self = object.__new__(cls)
        object.__setattr__(self, "_payload", payload)
        return self

    @classmethod
    def __init_subclass__(cls, **kwargs):
        raise TypeError("UserEvent cannot be subclassed: only its payload travels to the "
                        "consumers, so put what distinguishes your events there")

    @property
    def payload(self):
        """What the event carries (read-only)."""
        return self._payload

    def __setattr__(self, name, value):
        raise AttributeError(f"UserEvent is immutable: cannot set {name!r}")

    def __delattr__(self, name):
        raise AttributeError(f"UserEvent is immutable: cannot delete {name!r}")

    def __eq__(self, other):
        if type(other) is not UserEvent:
            return NotImplemented
        mine = self._payload
        theirs = (<object>other)._payload
        return mine is theirs or bool(mine == theirs)

    def __hash__(self):
        try:
            return hash((UserEvent, self._payload))
        except TypeError as exc:
            raise TypeError(f"unhashable UserEvent: its payload ({type(self._payload).__name__}) "
                            "is not hashable") from exc

    def __reduce__(self):
        return (UserEvent, (self._payload,))

    def __repr__(self):
        return f"UserEvent({self._payload!r})"


cdef bytes _serialize_event(object event):
    if type(event) is not UserEvent:
        raise TypeError(f"only UserEvent travels in-band, got {type(event).__name__}")
    return bytes([_EV_USER]) + _typed_encode(event._payload)


cdef object _deserialize_event(object data):
    """The Event an event item carries.  Channels hand events over as the
    bytes above; anything else (a remote channel's bug) is refused with
    CorruptRecordError rather than read as bytes."""
    if type(data) is not bytes:
        raise CorruptRecordError(
            f"an event must arrive as bytes, got {type(data).__name__}")
    cdef bytes b = <bytes>data
    if len(b) == 0:
        raise CorruptRecordError("empty event")
    cdef int kind = b[0]
    if kind == _EV_END_OF_PARTITION and len(b) == 1:
        return _END_OF_PARTITION
    if kind == _EV_USER:
        return UserEvent(_typed_decode(memoryview(b)[1:]))
    raise CorruptRecordError(f"unknown event kind {kind} ({len(b)} bytes)")
