# csrc/network/transport.h: the byte stream under a connection (a socket;
# the shared-memory transport is shm.pxd).


cdef extern from "network/transport.h" nogil:
    ctypedef struct fb_transport_t:
        pass

    fb_transport_t *fb_transport_socket(int fd)
