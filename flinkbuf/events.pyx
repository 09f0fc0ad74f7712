# In-band events: EndOfPartition and user events.  Included by _io.pyx.
#
# On the wire an event is one byte of kind, then for a user event the typed
# codec's encoding of its payload.  Local channels queue these bytes as they
# are; remote channels (layer 4) frame them the same way.

cdef enum:
    _EV_END_OF_PARTITION = 0
    _EV_USER = 1


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
    before and after it."""
    __slots__ = ("payload",)

    def __init__(self, payload=None):
        self.payload = payload

    def __eq__(self, other):
        if type(other) is not UserEvent:
            return NotImplemented
        return self.payload == (<object>other).payload

    def __hash__(self):
        return hash((UserEvent, self.payload))

    def __repr__(self):
        return f"UserEvent({self.payload!r})"


cdef bytes _serialize_event(object event):
    if type(event) is not UserEvent:
        raise TypeError(f"only UserEvent travels in-band, got {type(event).__name__}")
    return bytes([_EV_USER]) + _typed_encode(event.payload)


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
