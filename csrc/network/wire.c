#include "network/wire.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/byteorder.h"

static int bad(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    if (errlen > 0) {
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return FB_WIRE_BAD;
}

/* The body sizes a message may have: [min, max]. */
static int body_bounds(uint8_t msg, int32_t segment_size, uint32_t *min, uint32_t *max)
{
    switch (msg) {
    case FB_MSG_BUFFER:
        *min = FB_NET_BUFFER_FIELDS;
        *max = FB_NET_BUFFER_FIELDS + (uint32_t)(segment_size > 0 ? segment_size : 0);
        return 1;
    case FB_MSG_ERROR:
        *min = FB_NET_ERROR_FIELDS;
        *max = FB_NET_MAX_ERROR_FRAME - FB_NET_HEADER;
        return 1;
    case FB_MSG_PARTITION_REQUEST:
        *min = FB_NET_REQUEST_FIELDS;
        *max = FB_NET_REQUEST_FIELDS + FB_NET_MAX_PARTITION_ID;
        return 1;
    case FB_MSG_CANCEL:
        *min = *max = 4;
        return 1;
    case FB_MSG_ADD_CREDIT:
    case FB_MSG_ADD_EVENT_CREDIT:
    case FB_MSG_HEARTBEAT_REQUEST:
    case FB_MSG_HEARTBEAT_RESPONSE:
    case FB_MSG_NEW_BUFFER_SIZE:
        *min = *max = 8;
        return 1;
    case FB_MSG_CLOSE:
        *min = *max = 0;
        return 1;
    case FB_MSG_BUFFER_LENT:
        *min = *max = FB_NET_LENT_FIELDS;
        return 1;
    case FB_MSG_RELEASE:          /* a count of 0 passes here, to be refused by its name */
        *min = 8;
        *max = 8 + 4 * FB_NET_MAX_RELEASE;
        return 1;
    default:
        return 0;
    }
}

int fb_wire_decode_header(const char *p, int32_t segment_size, fb_wire_head_t *h, char *err,
                          size_t errlen)
{
    uint32_t len = fb_load_u32(p, 1), magic = fb_load_u32(p + 4, 1), min, max;
    uint8_t msg = (uint8_t)p[8];
    if (magic != FB_NET_MAGIC)
        return bad(err, errlen, "wrong magic number 0x%08x", magic);
    if (len < FB_NET_HEADER)
        return bad(err, errlen, "frame length %u", len);
    if (!body_bounds(msg, segment_size, &min, &max))
        return bad(err, errlen, "unknown message id %u", msg);
    h->msg = msg;
    h->body = len - FB_NET_HEADER;
    if (h->body < min || h->body > max) {
        switch (msg) {
        case FB_MSG_BUFFER:
            return bad(err, errlen, "buffer response frame of %u bytes (segment size %d)", len,
                       segment_size);
        case FB_MSG_ERROR:
            return bad(err, errlen, "error response frame of %u bytes", len);
        case FB_MSG_PARTITION_REQUEST:
            return bad(err, errlen, "partition request frame of %u bytes", len);
        case FB_MSG_CLOSE:
            return bad(err, errlen, "close request of %u bytes", len);
        case FB_MSG_BUFFER_LENT:
            return bad(err, errlen, "buffer lent frame of %u bytes", len);
        case FB_MSG_RELEASE:
            return bad(err, errlen, "release frame of %u bytes", len);
        case FB_MSG_HEARTBEAT_REQUEST:
        case FB_MSG_HEARTBEAT_RESPONSE:
            return bad(err, errlen, "heartbeat frame of %u bytes", len);
        case FB_MSG_NEW_BUFFER_SIZE:
            return bad(err, errlen, "new buffer size frame of %u bytes", len);
        default:
            return bad(err, errlen, "frame of %u bytes for message %u", len, msg);
        }
    }
    h->staged = msg == FB_MSG_BUFFER ? FB_NET_BUFFER_FIELDS : h->body;
    h->segment_size = segment_size;
    return FB_WIRE_OK;
}

static int decode_buffer(const fb_wire_head_t *h, const char *p, fb_wire_frame_t *f, char *err,
                         size_t errlen)
{
    uint32_t size = fb_load_u32(p + 13, 1);
    f->receiver_id = fb_load_u32(p, 1);
    f->u.buffer.sequence = fb_load_u32(p + 4, 1);
    f->u.buffer.backlog = (int32_t)(fb_load_u32(p + 8, 1) & INT32_MAX);
    f->u.buffer.type = (uint8_t)p[12];
    f->u.buffer.size = size;
    if (size != h->body - FB_NET_BUFFER_FIELDS)
        return bad(err, errlen, "buffer response of %u bytes in a frame for %u", size,
                   h->body - FB_NET_BUFFER_FIELDS);
    if (f->u.buffer.type > FB_WIRE_EVENT)
        return bad(err, errlen, "unknown buffer data type %u", f->u.buffer.type);
    if (f->u.buffer.type == FB_WIRE_DATA && size == 0)
        return bad(err, errlen, "an empty data buffer");
    return FB_WIRE_OK;
}

static int decode_error(const fb_wire_head_t *h, const char *p, fb_wire_frame_t *f, char *err,
                        size_t errlen)
{
    uint16_t tl = fb_load_u16(p + 5, 1);
    uint32_t ml;
    f->receiver_id = fb_load_u32(p, 1);
    f->u.error.code = (uint8_t)p[4];
    if ((uint32_t)FB_NET_ERROR_FIELDS + tl > h->body)
        return bad(err, errlen, "malformed error response");
    ml = fb_load_u32(p + 7 + tl, 1);
    if ((uint64_t)FB_NET_ERROR_FIELDS + tl + ml != h->body)
        return bad(err, errlen, "malformed error response");
    f->u.error.type = p + 7;
    f->u.error.type_len = tl;
    f->u.error.message = p + FB_NET_ERROR_FIELDS + tl;
    f->u.error.message_len = ml;
    return FB_WIRE_OK;
}

static int decode_request(const fb_wire_head_t *h, const char *p, fb_wire_frame_t *f, char *err,
                          size_t errlen)
{
    uint32_t credit = fb_load_u32(p + 8, 1);
    uint16_t idl = fb_load_u16(p + 12, 1);
    f->receiver_id = fb_load_u32(p, 1);
    f->u.request.subpartition = fb_load_u32(p + 4, 1);
    if ((uint32_t)FB_NET_REQUEST_FIELDS + idl != h->body)
        return bad(err, errlen, "malformed partition request");
    if (f->receiver_id == FB_NET_ALL)
        return bad(err, errlen, "receiver id 0x%08x is reserved", f->receiver_id);
    if (credit > INT32_MAX)
        return bad(err, errlen, "initial credit %u", credit);
    f->u.request.credit = (int32_t)credit;
    f->u.request.partition_id = p + FB_NET_REQUEST_FIELDS;
    f->u.request.id_len = idl;
    return FB_WIRE_OK;
}

static int decode_lent(const fb_wire_head_t *h, const char *p, fb_wire_frame_t *f, char *err,
                       size_t errlen)
{
    uint8_t type = (uint8_t)p[12];
    uint32_t size = fb_load_u32(p + 13, 1);
    f->receiver_id = fb_load_u32(p, 1);
    f->u.lent.sequence = fb_load_u32(p + 4, 1);
    f->u.lent.backlog = (int32_t)(fb_load_u32(p + 8, 1) & INT32_MAX);
    f->u.lent.size = size;
    f->u.lent.segment = fb_load_u32(p + 17, 1);
    if (type != FB_WIRE_DATA)
        return bad(err, errlen, "a lent buffer of data type %u (only data buffers are lent)",
                   type);
    if (size > (uint32_t)(h->segment_size > 0 ? h->segment_size : 0))
        return bad(err, errlen, "a lent buffer of %u bytes (segment size %d)", size,
                   h->segment_size);
    if (size == 0)
        return bad(err, errlen, "an empty data buffer");
    return FB_WIRE_OK;
}

static int decode_release(const fb_wire_head_t *h, const char *p, fb_wire_frame_t *f, char *err,
                          size_t errlen)
{
    uint32_t count = fb_load_u32(p + 4, 1);
    f->receiver_id = fb_load_u32(p, 1);
    if (f->receiver_id != FB_NET_ALL)
        return bad(err, errlen, "a release for receiver id 0x%08x (it is connection-wide)",
                   f->receiver_id);
    if (count == 0 || count > FB_NET_MAX_RELEASE)
        return bad(err, errlen, "a release of %u segments", count);
    if (h->body != 8 + 4 * count)
        return bad(err, errlen, "a release of %u segments in a body of %u bytes", count,
                   h->body);
    f->u.release.count = count;
    f->u.release.segments = p + 8;
    return FB_WIRE_OK;
}

static int decode_heartbeat(const char *p, fb_wire_frame_t *f, char *err, size_t errlen)
{
    f->receiver_id = fb_load_u32(p, 1);
    f->u.heartbeat = fb_load_u32(p + 4, 1);
    if (f->receiver_id != FB_NET_ALL)
        return bad(err, errlen, "a heartbeat for receiver id 0x%08x (it is connection-wide)",
                   f->receiver_id);
    if (f->u.heartbeat == 0)
        return bad(err, errlen, "a heartbeat of token 0");
    return FB_WIRE_OK;
}

static int decode_buffer_size(const fb_wire_head_t *h, const char *p, fb_wire_frame_t *f,
                              char *err, size_t errlen)
{
    uint32_t size = fb_load_u32(p + 4, 1);
    int32_t min = fb_wire_min_buffer_size(h->segment_size);
    f->receiver_id = fb_load_u32(p, 1);
    if (min < 1 || size < (uint32_t)min || size > (uint32_t)h->segment_size)
        return bad(err, errlen, "buffer size %u outside %d..%d", size, min, h->segment_size);
    f->u.buffer_size = (int32_t)size;
    return FB_WIRE_OK;
}

int fb_wire_decode_body(const fb_wire_head_t *h, const char *p, fb_wire_frame_t *f, char *err,
                        size_t errlen)
{
    uint32_t n;
    memset(f, 0, sizeof(*f));
    f->msg = h->msg;
    switch (h->msg) {
    case FB_MSG_BUFFER:
        return decode_buffer(h, p, f, err, errlen);
    case FB_MSG_ERROR:
        return decode_error(h, p, f, err, errlen);
    case FB_MSG_PARTITION_REQUEST:
        return decode_request(h, p, f, err, errlen);
    case FB_MSG_CANCEL:
        f->receiver_id = fb_load_u32(p, 1);
        return FB_WIRE_OK;
    case FB_MSG_ADD_CREDIT:
    case FB_MSG_ADD_EVENT_CREDIT:
        f->receiver_id = fb_load_u32(p, 1);
        n = fb_load_u32(p + 4, 1);
        if (n == 0 || n > INT32_MAX)
            return bad(err, errlen, "credit of %u", n);
        f->u.credit = (int32_t)n;
        return FB_WIRE_OK;
    case FB_MSG_CLOSE:
        return FB_WIRE_OK;
    case FB_MSG_BUFFER_LENT:
        return decode_lent(h, p, f, err, errlen);
    case FB_MSG_RELEASE:
        return decode_release(h, p, f, err, errlen);
    case FB_MSG_HEARTBEAT_REQUEST:
    case FB_MSG_HEARTBEAT_RESPONSE:
        return decode_heartbeat(p, f, err, errlen);
    case FB_MSG_NEW_BUFFER_SIZE:
        return decode_buffer_size(h, p, f, err, errlen);
    default:            /* a header fb_wire_decode_header did not pass */
        return bad(err, errlen, "unknown message id %u", h->msg);
    }
}

int fb_wire_decode(const char *p, size_t n, int32_t segment_size, fb_wire_frame_t *f,
                   size_t *used, char *err, size_t errlen)
{
    fb_wire_head_t h;
    int rc;
    if (n < FB_NET_HEADER)
        return FB_WIRE_MORE;
    if ((rc = fb_wire_decode_header(p, segment_size, &h, err, errlen)) != FB_WIRE_OK)
        return rc;
    if (n - FB_NET_HEADER < h.staged)
        return FB_WIRE_MORE;
    if ((rc = fb_wire_decode_body(&h, p + FB_NET_HEADER, f, err, errlen)) != FB_WIRE_OK)
        return rc;
    if (n - FB_NET_HEADER < h.body)
        return FB_WIRE_MORE;
    *used = FB_NET_HEADER + (size_t)h.body;
    return FB_WIRE_OK;
}

/* ---- encoding ----------------------------------------------------------------- */

char *fb_wire_put_header(char *p, uint32_t body_len, uint8_t msg)
{
    fb_store_u32(p, body_len + FB_NET_HEADER, 1);
    fb_store_u32(p + 4, FB_NET_MAGIC, 1);
    p[8] = (char)msg;
    return p + FB_NET_HEADER;
}

/* A BUFFER_RESPONSE's fields, which a BUFFER_LENT's start with. */
static char *put_buffer_fields(char *p, uint32_t receiver_id, uint32_t sequence, int32_t backlog,
                               uint8_t type, uint32_t size)
{
    fb_store_u32(p, receiver_id, 1);
    fb_store_u32(p + 4, sequence, 1);
    fb_store_u32(p + 8, (uint32_t)(backlog < 0 ? 0 : backlog), 1);
    p[12] = (char)type;
    fb_store_u32(p + 13, size, 1);
    return p + FB_NET_BUFFER_FIELDS;
}

char *fb_wire_put_buffer(char *p, uint32_t receiver_id, uint32_t sequence, int32_t backlog,
                         uint8_t type, uint32_t size)
{
    p = fb_wire_put_header(p, FB_NET_BUFFER_FIELDS + size, FB_MSG_BUFFER);
    return put_buffer_fields(p, receiver_id, sequence, backlog, type, size);
}

char *fb_wire_put_lent(char *p, uint32_t receiver_id, uint32_t sequence, int32_t backlog,
                       uint32_t size, uint32_t segment)
{
    p = fb_wire_put_header(p, FB_NET_LENT_FIELDS, FB_MSG_BUFFER_LENT);
    p = put_buffer_fields(p, receiver_id, sequence, backlog, FB_WIRE_DATA, size);
    fb_store_u32(p, segment, 1);
    return p + 4;
}

char *fb_wire_put_release(char *p, const uint32_t *segments, uint32_t count)
{
    uint32_t k;
    p = fb_wire_put_header(p, 8 + 4 * count, FB_MSG_RELEASE);
    fb_store_u32(p, FB_NET_ALL, 1);
    fb_store_u32(p + 4, count, 1);
    for (k = 0; k < count; k++)
        fb_store_u32(p + 8 + 4 * (size_t)k, segments[k], 1);
    return p + 8 + 4 * (size_t)count;
}

char *fb_wire_put_request(char *p, uint32_t receiver_id, uint32_t subpartition, int32_t credit,
                          const char *partition_id, uint16_t id_len)
{
    if (id_len > FB_NET_MAX_PARTITION_ID)
        id_len = FB_NET_MAX_PARTITION_ID;
    p = fb_wire_put_header(p, FB_NET_REQUEST_FIELDS + (uint32_t)id_len,
                           FB_MSG_PARTITION_REQUEST);
    fb_store_u32(p, receiver_id, 1);
    fb_store_u32(p + 4, subpartition, 1);
    fb_store_u32(p + 8, (uint32_t)(credit < 0 ? 0 : credit), 1);
    fb_store_u16(p + 12, id_len, 1);
    memcpy(p + FB_NET_REQUEST_FIELDS, partition_id, id_len);
    return p + FB_NET_REQUEST_FIELDS + id_len;
}

char *fb_wire_put_credit(char *p, uint8_t msg, uint32_t receiver_id, int32_t n)
{
    p = fb_wire_put_header(p, 8, msg);
    fb_store_u32(p, receiver_id, 1);
    fb_store_u32(p + 4, (uint32_t)n, 1);
    return p + 8;
}

char *fb_wire_put_cancel(char *p, uint32_t receiver_id)
{
    p = fb_wire_put_header(p, 4, FB_MSG_CANCEL);
    fb_store_u32(p, receiver_id, 1);
    return p + 4;
}

char *fb_wire_put_close(char *p)
{
    return fb_wire_put_header(p, 0, FB_MSG_CLOSE);
}

char *fb_wire_put_heartbeat(char *p, uint8_t msg, uint32_t token)
{
    p = fb_wire_put_header(p, 8, msg);
    fb_store_u32(p, FB_NET_ALL, 1);
    fb_store_u32(p + 4, token, 1);
    return p + 8;
}

char *fb_wire_put_buffer_size(char *p, uint32_t receiver_id, uint32_t size)
{
    p = fb_wire_put_header(p, 8, FB_MSG_NEW_BUFFER_SIZE);
    fb_store_u32(p, receiver_id, 1);
    fb_store_u32(p + 4, size, 1);
    return p + 8;
}

char *fb_wire_put_error_body(char *p, uint32_t receiver_id, uint8_t code, const char *type,
                             size_t type_len, const char *message, size_t message_len)
{
    if (type_len > FB_NET_MAX_ERROR_TYPE - 1)
        type_len = FB_NET_MAX_ERROR_TYPE - 1;
    if (message_len > FB_NET_MAX_MESSAGE - 1)
        message_len = FB_NET_MAX_MESSAGE - 1;
    fb_store_u32(p, receiver_id, 1);
    p[4] = (char)code;
    fb_store_u16(p + 5, (uint16_t)type_len, 1);
    memcpy(p + 7, type, type_len);
    fb_store_u32(p + 7 + type_len, (uint32_t)message_len, 1);
    memcpy(p + FB_NET_ERROR_FIELDS + type_len, message, message_len);
    return p + FB_NET_ERROR_FIELDS + type_len + message_len;
}
