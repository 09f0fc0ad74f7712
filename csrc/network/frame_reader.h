/* The frame reader: frames in, assembled from a byte source that may stop
 * anywhere and go on later (msgpack's unpack_template.h: a context and a
 * step that stops and resumes at any byte; asyncpg's CoreProtocol).
 *
 * A reader context holds a staging buffer, the phase of the frame at hand,
 * the position in the staged bytes, and, for a buffer's body, where it goes
 * and how much of it is still to come.  fb_frame_read takes bytes from a
 * source (a receive callback that never waits) and says what it read: a
 * whole control frame, a buffer's header and fields (the caller then says
 * where its body goes: fb_frame_body_into, or fb_frame_skip_body), body
 * progress, a whole body, or why it stopped (no bytes now, the end of the
 * source, the source failed, a protocol violation).  Every check of the
 * bytes is wire.h's; a body goes straight from the source into the memory
 * the caller gave (a pool segment), with the next frame's first bytes in
 * the same receive.
 *
 * No socket, no locks, no clock, no allocation after fb_frame_reader_init:
 * one thread at a time steps a reader (the caller's to ensure), and the
 * same code runs for a connection's socket (network/reader.c) and for a
 * fuzz target fed arbitrary bytes cut at arbitrary points.
 *
 * Exported to: reader.c and direct.c (a connection's frames in), the
 * network extension's test hooks (flinkbuf/network/_network.pxd). */
#ifndef FLINKBUF_FRAME_READER_H
#define FLINKBUF_FRAME_READER_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "network/wire.h"

#define FB_FRAME_STAGING 65536       /* the staging buffer: the largest frame staged whole */
#define FB_FRAME_READ_AHEAD 2048     /* staged past what is needed: small frames share a
                                        receive, a buffer's body mostly lands in place */

/* What a source returns besides a count of bytes (> 0). */
enum {
    FB_SOURCE_EMPTY = 0,             /* nothing now */
    FB_SOURCE_END = -1,              /* the stream ended */
    FB_SOURCE_FAILED = -2            /* the stream failed (the source knows why) */
};

/* Receive what the source has now into the vectors, never waiting: the
 * bytes (> 0) or one of FB_SOURCE_*. */
typedef ssize_t (*fb_frame_source_t)(void *arg, struct iovec *iov, int iovcnt);

/* What fb_frame_read read. */
enum {
    FB_FRAME_NONE = 0,               /* nothing more now */
    FB_FRAME_CONTROL = 1,            /* a whole frame other than a buffer: r->frame, held
                                        (returned again) until fb_frame_next */
    FB_FRAME_BUFFER = 2,             /* a BUFFER_RESPONSE's fields: r->frame, held until
                                        fb_frame_body_into or fb_frame_skip_body */
    FB_FRAME_PROGRESS = 3,           /* bytes of a body came (or were dropped), not all */
    FB_FRAME_BODY = 4,               /* the body is whole where fb_frame_body_into said */
    FB_FRAME_SKIPPED = 5,            /* a dropped body is past */
    FB_FRAME_END = -1,               /* the source ended */
    FB_FRAME_FAILED = -2,            /* the source failed */
    FB_FRAME_BAD = -3                /* a protocol violation: r->err says which */
};

typedef struct fb_frame_reader {
    char *staging;                   /* FB_FRAME_STAGING bytes */
    size_t pos, end;                 /* the staged bytes not taken yet */
    int phase;                       /* (frame_reader.c) */
    int32_t segment_size;            /* what a buffer's size is checked against */
    fb_wire_head_t head;             /* the frame held */
    fb_wire_frame_t frame;           /* ... decoded; pointers into the staging buffer */
    char *body;                      /* where a body goes */
    size_t body_size, left;          /* its size, and the bytes still to come */
    char err[256];                   /* why FB_FRAME_BAD */
} fb_frame_reader_t;

/* A reader of frames whose buffers carry at most segment_size bytes: 0, or
 * -1 when out of memory. */
int fb_frame_reader_init(fb_frame_reader_t *r, int32_t segment_size);
void fb_frame_reader_free(fb_frame_reader_t *r);

/* Read from `source` as far as the frame at hand goes: see FB_FRAME_*.
 * After FB_FRAME_END, FB_FRAME_FAILED or FB_FRAME_BAD the context stays as
 * it was (fb_frame_mid says whether a frame was cut). */
int fb_frame_read(fb_frame_reader_t *r, fb_frame_source_t source, void *arg);
/* The control frame held is done with: the next read goes on past it. */
void fb_frame_next(fb_frame_reader_t *r);
/* The body of the buffer held goes to dst (r->frame.u.buffer.size bytes):
 * what is staged of it is copied now, the rest comes with the next reads. */
void fb_frame_body_into(fb_frame_reader_t *r, char *dst);
/* The body of the buffer held, or the rest of the body being read, is
 * dropped as it comes (its destination is not written any more). */
void fb_frame_skip_body(fb_frame_reader_t *r);
/* 1 while a body is being read into its destination. */
int fb_frame_in_body(const fb_frame_reader_t *r);
/* 1 when a frame is partly read (the source stopped inside it). */
int fb_frame_mid(const fb_frame_reader_t *r);
/* 1 when a whole frame (or a header the decoder refuses) is staged: the
 * next read needs no byte of the source. */
int fb_frame_staged_whole(const fb_frame_reader_t *r);
/* Forget whatever was half read (the stream is over). */
void fb_frame_reset(fb_frame_reader_t *r);

#endif
