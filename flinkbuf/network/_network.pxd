# Layer 4 as one extension module: connections and remote input channels,
# and the hooks the network layer's tests drive it by.
from libc.stdint cimport int32_t, uint8_t, uint16_t, uint32_t
from posix.uio cimport iovec

from flinkbuf.buffer._buffer cimport LocalBufferPool
from flinkbuf.csrc.connection cimport fb_conn_t, fb_floating_t, fb_inchan_t
from flinkbuf.csrc.credit cimport fb_credit_action_t, fb_credit_t, fb_waitlist_t
from flinkbuf.csrc.frame_reader cimport fb_frame_reader_t, fb_frame_source_t
from flinkbuf.csrc.seal cimport fb_seal_t
from flinkbuf.csrc.transport cimport fb_transport_t
from flinkbuf.csrc.wire cimport fb_wire_frame_t
from flinkbuf.io._io cimport InputChannel


cdef class Connection:
    cdef fb_conn_t *_c
    cdef object _lookup         # partition_id -> ResultPartition or None
    cdef str _local             # this side's address, for messages
    cdef str _peer              # the peer's server address
    cdef str _transport         # "unix", "tcp" or "shm"
    cdef bint _sealed           # frames sealed (AES-256-GCM), both ways
    cdef fb_transport_t *_shm   # the shared-memory transport under it, or NULL
    cdef int _check(self) except -1
    cdef object _error(self)
    cdef dict _shm_waits(self)  # test hook: how its shared-memory waits went


cdef class FloatingBuffers:
    cdef fb_floating_t *_f
    cdef LocalBufferPool _pool
    @staticmethod
    cdef FloatingBuffers _make(LocalBufferPool pool)


cdef class RemoteInputChannel(InputChannel):
    cdef fb_inchan_t *_c
    cdef Connection _conn
    cdef LocalBufferPool _exclusive
    cdef FloatingBuffers _floating
    cdef str _partition_id
    cdef uint32_t _subpartition
    cdef tuple _error_info(self)


# ---- test hooks ------------------------------------------------------------------
# The C of the layer's pure units, which only this extension links, as
# tables of its functions (csrc/network/<unit>.h documents each): the
# testing module (flinkbuf/testing_network.pxi) drives them through these,
# with no copy of its own, and nothing shipped calls them.

ctypedef struct wire_hooks_t:       # wire.h: the wire format
    int (*decode)(const char *p, size_t n, int32_t segment_size, fb_wire_frame_t *f,
                  size_t *used, char *err, size_t errlen) noexcept nogil
    char *(*put_header)(char *p, uint32_t body_len, uint8_t msg) noexcept nogil
    char *(*put_buffer)(char *p, uint32_t receiver_id, uint32_t sequence, int32_t backlog,
                        uint8_t type, uint32_t size) noexcept nogil
    char *(*put_request)(char *p, uint32_t receiver_id, uint32_t subpartition, int32_t credit,
                         const char *partition_id, uint16_t id_len) noexcept nogil
    char *(*put_credit)(char *p, uint8_t msg, uint32_t receiver_id, int32_t n) noexcept nogil
    char *(*put_cancel)(char *p, uint32_t receiver_id) noexcept nogil
    char *(*put_close)(char *p) noexcept nogil
    char *(*put_lent)(char *p, uint32_t receiver_id, uint32_t sequence, int32_t backlog,
                      uint32_t size, uint32_t segment) noexcept nogil
    char *(*put_release)(char *p, const uint32_t *segments, uint32_t count) noexcept nogil
    char *(*put_heartbeat)(char *p, uint8_t msg, uint32_t token) noexcept nogil
    char *(*put_buffer_size)(char *p, uint32_t receiver_id, uint32_t size) noexcept nogil
    char *(*put_error_body)(char *p, uint32_t receiver_id, uint8_t code, const char *type,
                            size_t type_len, const char *message,
                            size_t message_len) noexcept nogil

ctypedef struct credit_hooks_t:     # credit.h: one channel's credit, a gate's waiting list
    int (*init)(fb_credit_t *cr, int32_t cap) noexcept nogil
    void (*free)(fb_credit_t *cr) noexcept nogil
    int (*add_exclusive)(fb_credit_t *cr, int32_t index) noexcept nogil
    int (*hold)(fb_credit_t *cr, int32_t index, int floating) noexcept nogil
    fb_credit_action_t (*announce)(fb_credit_t *cr, int open, int consumer_reads) noexcept nogil
    void (*unqueue)(fb_credit_t *cr) noexcept nogil
    int32_t (*take_announcement)(fb_credit_t *cr) noexcept nogil
    int32_t (*take_initial)(fb_credit_t *cr) noexcept nogil
    int (*consume)(fb_credit_t *cr, int32_t *index, int *floating) noexcept nogil
    void (*release_all)(fb_credit_t *cr, const int32_t **held, const uint8_t **floating,
                        int32_t *n) noexcept nogil
    int32_t (*need)(fb_credit_t *cr, int32_t backlog) noexcept nogil
    void (*counts)(const fb_credit_t *cr, int32_t *exclusive, int32_t *floating) noexcept nogil
    void (*reset_events)(fb_credit_t *cr) noexcept nogil
    int (*event_arrives)(fb_credit_t *cr) noexcept nogil
    fb_credit_action_t (*event_taken)(fb_credit_t *cr, int open) noexcept nogil
    int32_t (*take_event_grant)(fb_credit_t *cr, int open) noexcept nogil
    int (*waitlist_want)(fb_waitlist_t *wl, fb_credit_t *cr, int32_t need) noexcept nogil
    fb_credit_t *(*waitlist_pop)(fb_waitlist_t *wl) noexcept nogil
    int (*waitlist_took)(fb_waitlist_t *wl, fb_credit_t *cr) noexcept nogil
    void (*waitlist_remove)(fb_waitlist_t *wl, fb_credit_t *cr) noexcept nogil
    void (*waitlist_free)(fb_waitlist_t *wl) noexcept nogil

ctypedef struct frame_reader_hooks_t:   # frame_reader.h: frames in, without a socket
    int (*init)(fb_frame_reader_t *r, int32_t segment_size) noexcept nogil
    void (*free)(fb_frame_reader_t *r) noexcept nogil
    int (*read)(fb_frame_reader_t *r, fb_frame_source_t source, void *arg) noexcept nogil
    void (*next)(fb_frame_reader_t *r) noexcept nogil
    void (*body_into)(fb_frame_reader_t *r, char *dst) noexcept nogil
    void (*skip_body)(fb_frame_reader_t *r) noexcept nogil
    int (*mid)(const fb_frame_reader_t *r) noexcept nogil

ctypedef struct seal_hooks_t:       # seal.h: sealed records (AES-256-GCM)
    fb_seal_t *(*new)(const unsigned char *key, int sealing) noexcept nogil
    void (*free)(fb_seal_t *s) noexcept nogil
    int (*record)(fb_seal_t *s, const iovec *iov, int iovcnt, size_t n,
                  unsigned char *out) noexcept nogil

cdef const wire_hooks_t *wire_hooks() noexcept
cdef const credit_hooks_t *credit_hooks() noexcept
cdef const frame_reader_hooks_t *frame_reader_hooks() noexcept
cdef const seal_hooks_t *seal_hooks() noexcept
