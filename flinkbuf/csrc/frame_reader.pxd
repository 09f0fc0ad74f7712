# csrc/network/frame_reader.h: frames in, assembled from a byte source that
# may stop anywhere (no socket, no locks, no clock).
from libc.stdint cimport int32_t
from posix.uio cimport iovec

from flinkbuf.csrc.wire cimport fb_wire_frame_t


cdef extern from "network/frame_reader.h" nogil:
    enum:
        FB_FRAME_STAGING
        FB_FRAME_READ_AHEAD
        FB_SOURCE_EMPTY
        FB_SOURCE_END
        FB_SOURCE_FAILED
        FB_FRAME_NONE
        FB_FRAME_CONTROL
        FB_FRAME_BUFFER
        FB_FRAME_PROGRESS
        FB_FRAME_BODY
        FB_FRAME_SKIPPED
        FB_FRAME_END
        FB_FRAME_FAILED
        FB_FRAME_BAD

    ctypedef ssize_t (*fb_frame_source_t)(void *arg, iovec *iov, int iovcnt) noexcept

    ctypedef struct fb_frame_reader_t:
        int32_t segment_size
        fb_wire_frame_t frame
        char err[256]

    int fb_frame_reader_init(fb_frame_reader_t *r, int32_t segment_size)
    void fb_frame_reader_free(fb_frame_reader_t *r)
    int fb_frame_read(fb_frame_reader_t *r, fb_frame_source_t source, void *arg)
    void fb_frame_next(fb_frame_reader_t *r)
    void fb_frame_body_into(fb_frame_reader_t *r, char *dst)
    void fb_frame_skip_body(fb_frame_reader_t *r)
    int fb_frame_in_body(const fb_frame_reader_t *r)
    int fb_frame_mid(const fb_frame_reader_t *r)
    int fb_frame_staged_whole(const fb_frame_reader_t *r)
    void fb_frame_reset(fb_frame_reader_t *r)
