# csrc/network/seal.h: sealed records (AES-256-GCM) and the sealed transport.

from flinkbuf.csrc.transport cimport fb_transport_t


cdef extern from "network/seal.h" nogil:
    enum:
        FB_SEAL_KEY
        FB_SEAL_MAX_RECORD
        FB_SEAL_OVERHEAD

    fb_transport_t *fb_transport_sealed(fb_transport_t *inner, const unsigned char *tx_key,
                                        const unsigned char *rx_key)
