# csrc/network/seal.h: sealed records (AES-256-GCM) and the sealed transport.

from posix.uio cimport iovec

from flinkbuf.csrc.transport cimport fb_transport_t


cdef extern from "network/seal.h" nogil:
    enum:
        FB_SEAL_KEY
        FB_SEAL_MAX_RECORD
        FB_SEAL_OVERHEAD

    ctypedef struct fb_seal_t

    fb_seal_t *fb_seal_new(const unsigned char *key, int sealing)
    void fb_seal_free(fb_seal_t *s)
    int fb_seal_record(fb_seal_t *s, const iovec *iov, int iovcnt, size_t n, unsigned char *out)
    fb_transport_t *fb_transport_sealed(fb_transport_t *inner, const unsigned char *tx_key,
                                        const unsigned char *rx_key)
