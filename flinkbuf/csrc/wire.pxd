# csrc/network/wire.h: the wire format (docs/PROTOCOL.md): frame constants,
# pure encoders and a pure decoder of staged bytes.
from libc.stdint cimport int32_t, uint8_t, uint16_t, uint32_t


cdef extern from "network/wire.h" nogil:
    enum:
        FB_NET_MAGIC
        FB_NET_HEADER
        FB_NET_BUFFER_FIELDS
        FB_NET_LENT_FIELDS
        FB_NET_MAX_RELEASE
        FB_NET_MAX_RELEASE_FRAME
        FB_NET_HEARTBEAT_FRAME
        FB_NET_BUFFER_SIZE_FRAME
        FB_NET_MIN_BUFFER_SIZE
        FB_NET_MAX_CHANNELS
        FB_NET_MAX_PARTITION_ID
        FB_NET_MAX_ERROR_FRAME
        FB_NET_MAX_MESSAGE
        FB_NET_MAX_ERROR_TYPE
        FB_NET_MAX_CONTROL_FRAME
        FB_NET_MAX_ERROR_BODY
        FB_NET_ALL
        FB_MSG_BUFFER
        FB_MSG_ERROR
        FB_MSG_PARTITION_REQUEST
        FB_MSG_CANCEL
        FB_MSG_CLOSE
        FB_MSG_ADD_CREDIT
        FB_MSG_ADD_EVENT_CREDIT
        FB_MSG_BUFFER_LENT
        FB_MSG_RELEASE
        FB_MSG_NEW_BUFFER_SIZE
        FB_MSG_HEARTBEAT_REQUEST
        FB_MSG_HEARTBEAT_RESPONSE
        FB_WIRE_DATA
        FB_WIRE_EVENT
        FB_NET_ERR_PRODUCER_FAILED
        FB_NET_ERR_NOT_FOUND
        FB_NET_ERR_RELEASED
        FB_NET_ERR_PROTOCOL
        FB_NET_ERR_REFUSED
        FB_NET_ERR_CONNECTION
        FB_NET_ERR_CLOSED
        FB_WIRE_OK
        FB_WIRE_MORE
        FB_WIRE_BAD

    ctypedef struct fb_wire_buffer_t:
        uint32_t sequence
        int32_t backlog
        uint8_t type
        uint32_t size

    ctypedef struct fb_wire_error_t:
        uint8_t code
        const char *type
        uint16_t type_len
        const char *message
        uint32_t message_len

    ctypedef struct fb_wire_request_t:
        uint32_t subpartition
        int32_t credit
        const char *partition_id
        uint16_t id_len

    ctypedef struct fb_wire_lent_t:
        uint32_t sequence
        int32_t backlog
        uint32_t size
        uint32_t segment

    ctypedef struct fb_wire_release_t:
        uint32_t count
        const char *segments

    ctypedef union fb_wire_body_t:
        fb_wire_buffer_t buffer
        fb_wire_error_t error
        fb_wire_request_t request
        fb_wire_lent_t lent
        fb_wire_release_t release
        int32_t credit
        int32_t buffer_size
        uint32_t heartbeat

    ctypedef struct fb_wire_frame_t:
        uint8_t msg
        uint32_t receiver_id
        fb_wire_body_t u

    int fb_wire_decode(const char *p, size_t n, int32_t segment_size, fb_wire_frame_t *f,
                       size_t *used, char *err, size_t errlen)
    char *fb_wire_put_header(char *p, uint32_t body_len, uint8_t msg)
    char *fb_wire_put_buffer(char *p, uint32_t receiver_id, uint32_t sequence, int32_t backlog,
                             uint8_t type, uint32_t size)
    char *fb_wire_put_request(char *p, uint32_t receiver_id, uint32_t subpartition,
                              int32_t credit, const char *partition_id, uint16_t id_len)
    char *fb_wire_put_credit(char *p, uint8_t msg, uint32_t receiver_id, int32_t n)
    char *fb_wire_put_cancel(char *p, uint32_t receiver_id)
    char *fb_wire_put_close(char *p)
    char *fb_wire_put_heartbeat(char *p, uint8_t msg, uint32_t token)
    char *fb_wire_put_buffer_size(char *p, uint32_t receiver_id, uint32_t size)
    int32_t fb_wire_min_buffer_size(int32_t segment_size)
    char *fb_wire_put_lent(char *p, uint32_t receiver_id, uint32_t sequence, int32_t backlog,
                           uint32_t size, uint32_t segment)
    char *fb_wire_put_release(char *p, const uint32_t *segments, uint32_t count)
    uint32_t fb_wire_release_segment(const fb_wire_release_t *r, uint32_t k)
    char *fb_wire_put_error_body(char *p, uint32_t receiver_id, uint8_t code, const char *type,
                                 size_t type_len, const char *message, size_t message_len)
