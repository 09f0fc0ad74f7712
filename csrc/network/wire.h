/* The wire format of a connection (docs/PROTOCOL.md): frame constants, pure
 * encoders (values in, bytes out) and a pure decoder of staged bytes into a
 * tagged struct.  No I/O, no locks, no allocation, no channel pointers: the
 * decoder can be fuzzed on its own, and every check of what a peer sent
 * lives here.
 *
 * A frame is a 9-byte header (length u32 counting the header, magic u32,
 * message id u8) and a body; integers are big-endian.  Decoding is in two
 * steps, so that a BUFFER_RESPONSE's payload can go straight from the
 * socket into a pool segment: fb_wire_decode_header checks the header and
 * says how many body bytes must be staged (fb_wire_head_t.staged: the whole
 * body, or a buffer response's 17 fields), fb_wire_decode_body checks those
 * bytes.  fb_wire_decode does both on one contiguous frame. */
#ifndef FLINKBUF_WIRE_H
#define FLINKBUF_WIRE_H

#include <stddef.h>
#include <stdint.h>

#define FB_NET_MAGIC 0x46425546u          /* "FBUF" */
#define FB_NET_HEADER 9                   /* length u32, magic u32, id u8 */
#define FB_NET_BUFFER_FIELDS 17           /* receiver, sequence, backlog u32; type u8; size u32 */
#define FB_NET_REQUEST_FIELDS 14          /* receiver, subpartition, credit u32; id length u16 */
#define FB_NET_ERROR_FIELDS 11            /* receiver u32, code u8, type length u16, length u32 */
#define FB_NET_LENT_FIELDS 21             /* a buffer response's fields, then segment u32 */
#define FB_NET_MAX_RELEASE 1024           /* segments one RELEASE names */
#define FB_NET_MAX_CHANNELS 4096          /* per connection and direction */
#define FB_NET_MAX_PARTITION_ID 1024
#define FB_NET_MAX_ERROR_FRAME 65536
#define FB_NET_MAX_MESSAGE 4096           /* error text this side keeps */
#define FB_NET_MAX_ERROR_TYPE 128         /* error type name this side keeps (with its NUL) */
#define FB_NET_ALL 0xFFFFFFFFu            /* receiver id of a connection-wide error */
/* The largest control frame an encoder writes (a partition request). */
#define FB_NET_MAX_CONTROL_FRAME (FB_NET_HEADER + FB_NET_REQUEST_FIELDS + FB_NET_MAX_PARTITION_ID)
/* A RELEASE of FB_NET_MAX_RELEASE segments: receiver id, count, the segments. */
#define FB_NET_MAX_RELEASE_FRAME (FB_NET_HEADER + 8 + 4 * FB_NET_MAX_RELEASE)
/* A HEARTBEAT_REQUEST or HEARTBEAT_RESPONSE: receiver id (all), token. */
#define FB_NET_HEARTBEAT_FRAME (FB_NET_HEADER + 8)
/* A NEW_BUFFER_SIZE: receiver id, size. */
#define FB_NET_BUFFER_SIZE_FRAME (FB_NET_HEADER + 8)
/* The smallest buffer size a consumer may announce (or the segment size,
 * when that is smaller). */
#define FB_NET_MIN_BUFFER_SIZE 64

enum {
    FB_MSG_BUFFER = 0,
    FB_MSG_ERROR = 1,
    FB_MSG_PARTITION_REQUEST = 2,
    FB_MSG_CANCEL = 4,
    FB_MSG_CLOSE = 5,
    FB_MSG_ADD_CREDIT = 6,
    FB_MSG_ADD_EVENT_CREDIT = 7,
    FB_MSG_BUFFER_LENT = 8,       /* a data buffer in a segment of the sender's arena */
    FB_MSG_RELEASE = 9,           /* the receiver is done with these lent segments */
    FB_MSG_NEW_BUFFER_SIZE = 10,  /* buffer debloating: finish this channel's buffers at a size */
    FB_MSG_HEARTBEAT_REQUEST = 12,    /* are you there? (a connection's threads answer) */
    FB_MSG_HEARTBEAT_RESPONSE = 13    /* yes: the latest request's token */
};

/* A BUFFER_RESPONSE's data type. */
enum { FB_WIRE_DATA = 0, FB_WIRE_EVENT = 1 };

/* ERROR_RESPONSE codes, and why a channel or connection failed. */
enum {
    FB_NET_ERR_PRODUCER_FAILED = 1,
    FB_NET_ERR_NOT_FOUND = 2,
    FB_NET_ERR_RELEASED = 3,
    FB_NET_ERR_PROTOCOL = 4,
    FB_NET_ERR_REFUSED = 5,
    /* not on the wire: */
    FB_NET_ERR_CONNECTION = 16,   /* the connection dropped or stalled */
    FB_NET_ERR_CLOSED = 17        /* this side closed it */
};

/* Results of the decoder. */
enum {
    FB_WIRE_OK = 0,
    FB_WIRE_MORE = 1,             /* fb_wire_decode: the frame is not all there yet */
    FB_WIRE_BAD = -1              /* a protocol violation; the reason is in err */
};

/* A checked header. */
typedef struct fb_wire_head {
    uint8_t msg;                  /* FB_MSG_* */
    uint32_t body;                /* body bytes after the header */
    uint32_t staged;              /* of them, what fb_wire_decode_body reads */
    int32_t segment_size;         /* what a buffer's size is checked against */
} fb_wire_head_t;

/* A decoded frame.  Pointers point into the bytes decoded (no copy). */
typedef struct fb_wire_buffer {   /* BUFFER_RESPONSE: its `size` payload bytes follow */
    uint32_t sequence;
    int32_t backlog;
    uint8_t type;                 /* FB_WIRE_DATA or FB_WIRE_EVENT */
    uint32_t size;
} fb_wire_buffer_t;

typedef struct fb_wire_error {    /* ERROR_RESPONSE */
    uint8_t code;
    const char *type;
    uint16_t type_len;
    const char *message;
    uint32_t message_len;
} fb_wire_error_t;

typedef struct fb_wire_request {  /* PARTITION_REQUEST */
    uint32_t subpartition;
    int32_t credit;
    const char *partition_id;
    uint16_t id_len;
} fb_wire_request_t;

typedef struct fb_wire_lent {     /* BUFFER_LENT: a data buffer, no payload follows */
    uint32_t sequence;
    int32_t backlog;
    uint32_t size;                /* bytes of the segment that hold the buffer */
    uint32_t segment;             /* unchecked: the arena's mapper checks its range */
} fb_wire_lent_t;

typedef struct fb_wire_release {  /* RELEASE (receiver id FB_NET_ALL) */
    uint32_t count;               /* 1..FB_NET_MAX_RELEASE */
    const char *segments;         /* count big-endian u32: fb_wire_release_segment */
} fb_wire_release_t;

typedef union fb_wire_body {
    fb_wire_buffer_t buffer;
    fb_wire_error_t error;
    fb_wire_request_t request;
    fb_wire_lent_t lent;
    fb_wire_release_t release;
    int32_t credit;               /* ADD_CREDIT, ADD_EVENT_CREDIT: > 0 */
    int32_t buffer_size;          /* NEW_BUFFER_SIZE: min(FB_NET_MIN_BUFFER_SIZE, segment
                                     size) .. segment size */
    uint32_t heartbeat;           /* HEARTBEAT_REQUEST, HEARTBEAT_RESPONSE: the token, > 0 */
} fb_wire_body_t;

typedef struct fb_wire_frame {
    uint8_t msg;                  /* FB_MSG_* */
    uint32_t receiver_id;         /* every message but CLOSE_REQUEST */
    fb_wire_body_t u;
} fb_wire_frame_t;

/* ---- decoding ---------------------------------------------------------------- */

/* Check the FB_NET_HEADER bytes at p (buffers carry at most segment_size
 * bytes): FB_WIRE_OK and *h, or FB_WIRE_BAD with why in err. */
int fb_wire_decode_header(const char *p, int32_t segment_size, fb_wire_head_t *h, char *err,
                          size_t errlen);
/* Check h->staged body bytes at p: FB_WIRE_OK and *f, or FB_WIRE_BAD with
 * why in err. */
int fb_wire_decode_body(const fb_wire_head_t *h, const char *p, fb_wire_frame_t *f, char *err,
                        size_t errlen);
/* One frame at the start of the n bytes at p: FB_WIRE_OK with its length in
 * *used (a buffer's payload at p + *used - size), FB_WIRE_MORE when the n
 * bytes end before it does, or FB_WIRE_BAD with why in err. */
int fb_wire_decode(const char *p, size_t n, int32_t segment_size, fb_wire_frame_t *f,
                   size_t *used, char *err, size_t errlen);

/* The length field of the header at p (checked by fb_wire_decode_header). */
static inline uint32_t fb_wire_frame_length(const char *p)
{
    const unsigned char *u = (const unsigned char *)p;
    return (uint32_t)u[0] << 24 | (uint32_t)u[1] << 16 | (uint32_t)u[2] << 8 | u[3];
}

/* Segment k (< r->count) of a decoded RELEASE. */
static inline uint32_t fb_wire_release_segment(const fb_wire_release_t *r, uint32_t k)
{
    const unsigned char *u = (const unsigned char *)r->segments + 4 * (size_t)k;
    return (uint32_t)u[0] << 24 | (uint32_t)u[1] << 16 | (uint32_t)u[2] << 8 | u[3];
}

/* ---- encoding (each returns the end of what it wrote) ------------------------------ */

char *fb_wire_put_header(char *p, uint32_t body_len, uint8_t msg);
/* A BUFFER_RESPONSE's header and fields (FB_NET_HEADER + FB_NET_BUFFER_FIELDS
 * bytes); its `size` payload bytes follow. */
char *fb_wire_put_buffer(char *p, uint32_t receiver_id, uint32_t sequence, int32_t backlog,
                         uint8_t type, uint32_t size);
/* At most FB_NET_MAX_CONTROL_FRAME bytes (id_len <= FB_NET_MAX_PARTITION_ID). */
char *fb_wire_put_request(char *p, uint32_t receiver_id, uint32_t subpartition, int32_t credit,
                          const char *partition_id, uint16_t id_len);
/* ADD_CREDIT or ADD_EVENT_CREDIT. */
char *fb_wire_put_credit(char *p, uint8_t msg, uint32_t receiver_id, int32_t n);
char *fb_wire_put_cancel(char *p, uint32_t receiver_id);
char *fb_wire_put_close(char *p);
/* HEARTBEAT_REQUEST or HEARTBEAT_RESPONSE (FB_NET_HEARTBEAT_FRAME bytes). */
char *fb_wire_put_heartbeat(char *p, uint8_t msg, uint32_t token);
/* A NEW_BUFFER_SIZE (FB_NET_BUFFER_SIZE_FRAME bytes); the size is the
 * caller's to check. */
char *fb_wire_put_buffer_size(char *p, uint32_t receiver_id, uint32_t size);
/* The smallest buffer size a consumer may announce for segments of
 * segment_size bytes (the largest is segment_size). */
static inline int32_t fb_wire_min_buffer_size(int32_t segment_size)
{
    return segment_size < FB_NET_MIN_BUFFER_SIZE ? segment_size : FB_NET_MIN_BUFFER_SIZE;
}
/* A BUFFER_LENT (FB_NET_HEADER + FB_NET_LENT_FIELDS bytes): a data buffer of
 * `size` bytes in segment `segment` of this side's arena. */
char *fb_wire_put_lent(char *p, uint32_t receiver_id, uint32_t sequence, int32_t backlog,
                       uint32_t size, uint32_t segment);
/* A RELEASE of count (1..FB_NET_MAX_RELEASE: the caller's to ensure)
 * segments; at most FB_NET_MAX_RELEASE_FRAME bytes. */
char *fb_wire_put_release(char *p, const uint32_t *segments, uint32_t count);
/* An ERROR_RESPONSE's body only (for a queue that stores bodies): the type
 * name and the message are cut to what this side keeps; at most
 * FB_NET_ERROR_FIELDS + FB_NET_MAX_ERROR_TYPE + FB_NET_MAX_MESSAGE bytes. */
char *fb_wire_put_error_body(char *p, uint32_t receiver_id, uint8_t code, const char *type,
                             size_t type_len, const char *message, size_t message_len);
#define FB_NET_MAX_ERROR_BODY (FB_NET_ERROR_FIELDS + FB_NET_MAX_ERROR_TYPE + FB_NET_MAX_MESSAGE)

#endif
