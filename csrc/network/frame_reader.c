/* The frame reader (frame_reader.h). */
#include "network/frame_reader.h"

#include <stdlib.h>
#include <string.h>

/* Where the frame at hand is. */
enum {
    FR_FRAME,        /* at a frame's start, or in its staged part */
    FR_HELD,         /* a frame decoded and returned, not yet let go of */
    FR_BODY,         /* a buffer's body going to r->body */
    FR_SKIP          /* a buffer's body being dropped */
};

int fb_frame_reader_init(fb_frame_reader_t *r, int32_t segment_size)
{
    memset(r, 0, sizeof(*r));
    r->staging = malloc(FB_FRAME_STAGING);
    r->segment_size = segment_size;
    r->phase = FR_FRAME;
    return r->staging != NULL ? 0 : -1;
}

void fb_frame_reader_free(fb_frame_reader_t *r)
{
    free(r->staging);
    r->staging = NULL;
}

/* A source's answer as a reader's result (bytes: none of these). */
static int source_result(ssize_t n)
{
    return n == FB_SOURCE_EMPTY ? FB_FRAME_NONE
           : n == FB_SOURCE_END ? FB_FRAME_END : FB_FRAME_FAILED;
}

/* At least n (<= FB_FRAME_STAGING) bytes staged: 1, else what stopped it. */
static int stage(fb_frame_reader_t *r, size_t n, fb_frame_source_t source, void *arg)
{
    struct iovec iov;
    ssize_t got;
    if (r->end - r->pos >= n)
        return 1;
    if (r->pos > 0) {
        memmove(r->staging, r->staging + r->pos, r->end - r->pos);
        r->end -= r->pos;
        r->pos = 0;
    }
    while (r->end < n) {
        iov.iov_base = r->staging + r->end;
        iov.iov_len = (n > FB_FRAME_READ_AHEAD ? n : FB_FRAME_READ_AHEAD) - r->end;
        if ((got = source(arg, &iov, 1)) <= 0)
            return source_result(got);
        r->end += (size_t)got;
    }
    return 1;
}

/* Stage and decode the next frame: FB_FRAME_CONTROL or FB_FRAME_BUFFER
 * (held), or what stopped it. */
static int next_frame(fb_frame_reader_t *r, fb_frame_source_t source, void *arg)
{
    int rc;
    if ((rc = stage(r, FB_NET_HEADER, source, arg)) != 1)
        return rc;
    if (fb_wire_decode_header(r->staging + r->pos, r->segment_size, &r->head, r->err,
                              sizeof(r->err)) != FB_WIRE_OK)
        return FB_FRAME_BAD;
    /* (at most FB_NET_MAX_ERROR_FRAME: it fits the staging buffer) */
    if ((rc = stage(r, FB_NET_HEADER + (size_t)r->head.staged, source, arg)) != 1)
        return rc;
    if (fb_wire_decode_body(&r->head, r->staging + r->pos + FB_NET_HEADER, &r->frame, r->err,
                            sizeof(r->err)) != FB_WIRE_OK)
        return FB_FRAME_BAD;
    r->phase = FR_HELD;
    return r->frame.msg == FB_MSG_BUFFER ? FB_FRAME_BUFFER : FB_FRAME_CONTROL;
}

/* Receive more of the body: straight into its destination and, past it,
 * the next frame's first bytes into the staging buffer (empty by now: the
 * body took what was staged), so that one receive a frame suffices while
 * data streams. */
static int read_body(fb_frame_reader_t *r, fb_frame_source_t source, void *arg)
{
    struct iovec iov[2];
    ssize_t got;
    if (r->left == 0) {
        r->phase = FR_FRAME;
        return FB_FRAME_BODY;
    }
    r->pos = r->end = 0;
    iov[0].iov_base = r->body + (r->body_size - r->left);
    iov[0].iov_len = r->left;
    iov[1].iov_base = r->staging;
    iov[1].iov_len = FB_FRAME_READ_AHEAD;
    if ((got = source(arg, iov, 2)) <= 0)
        return source_result(got);
    if ((size_t)got > r->left) {
        r->end = (size_t)got - r->left;
        got = (ssize_t)r->left;
    }
    r->left -= (size_t)got;
    if (r->left > 0)
        return FB_FRAME_PROGRESS;
    r->phase = FR_FRAME;
    return FB_FRAME_BODY;
}

/* Drop more of a body: what is staged of it, then what the source has. */
static int skip_body(fb_frame_reader_t *r, fb_frame_source_t source, void *arg)
{
    struct iovec iov;
    size_t have = r->end - r->pos;
    ssize_t got;
    if (have > r->left)
        have = r->left;
    r->pos += have;
    r->left -= have;
    if (r->left > 0) {
        r->pos = r->end = 0;
        iov.iov_base = r->staging;
        iov.iov_len = r->left < FB_FRAME_STAGING ? r->left : FB_FRAME_STAGING;
        if ((got = source(arg, &iov, 1)) <= 0)
            return source_result(got);
        r->left -= (size_t)got;
        if (r->left > 0)
            return FB_FRAME_PROGRESS;
    }
    r->phase = FR_FRAME;
    return FB_FRAME_SKIPPED;
}

int fb_frame_read(fb_frame_reader_t *r, fb_frame_source_t source, void *arg)
{
    switch (r->phase) {
    case FR_BODY:
        return read_body(r, source, arg);
    case FR_SKIP:
        return skip_body(r, source, arg);
    case FR_HELD:
        return r->frame.msg == FB_MSG_BUFFER ? FB_FRAME_BUFFER : FB_FRAME_CONTROL;
    default:
        return next_frame(r, source, arg);
    }
}

/* The held frame's staged bytes are taken. */
static void take_held(fb_frame_reader_t *r)
{
    r->pos += FB_NET_HEADER + (size_t)r->head.staged;
}

void fb_frame_next(fb_frame_reader_t *r)
{
    if (r->phase != FR_HELD || r->frame.msg == FB_MSG_BUFFER)
        return;
    take_held(r);
    r->phase = FR_FRAME;
}

void fb_frame_body_into(fb_frame_reader_t *r, char *dst)
{
    size_t have;
    if (r->phase != FR_HELD || r->frame.msg != FB_MSG_BUFFER)
        return;
    take_held(r);
    r->body = dst;
    r->body_size = r->left = r->frame.u.buffer.size;
    have = r->end - r->pos;
    if (have > r->left)
        have = r->left;
    memcpy(dst, r->staging + r->pos, have);
    r->pos += have;
    r->left -= have;
    r->phase = FR_BODY;
}

void fb_frame_skip_body(fb_frame_reader_t *r)
{
    if (r->phase == FR_HELD && r->frame.msg == FB_MSG_BUFFER) {
        take_held(r);
        r->left = r->frame.u.buffer.size;
    } else if (r->phase != FR_BODY) {
        return;
    }
    r->body = NULL;
    r->phase = FR_SKIP;
}

int fb_frame_in_body(const fb_frame_reader_t *r)
{
    return r->phase == FR_BODY;
}

int fb_frame_mid(const fb_frame_reader_t *r)
{
    return r->phase != FR_FRAME || r->end > r->pos;
}

int fb_frame_staged_whole(const fb_frame_reader_t *r)
{
    size_t have = r->end - r->pos;
    uint32_t len;
    if ((r->phase != FR_FRAME && r->phase != FR_HELD) || have < FB_NET_HEADER)
        return 0;
    len = fb_wire_frame_length(r->staging + r->pos);
    return have >= len || len < FB_NET_HEADER;
}

void fb_frame_reset(fb_frame_reader_t *r)
{
    r->phase = FR_FRAME;
    r->pos = r->end = 0;
    r->body = NULL;
    r->left = 0;
}
