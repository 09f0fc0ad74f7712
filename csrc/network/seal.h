/* Sealed records: authenticated encryption of a connection's byte stream
 * (AES-256-GCM through OpenSSL's libcrypto), and the sealed transport, which
 * wraps any other transport (transport.h) in it.
 *
 * A record is a 4-byte big-endian length n (1..FB_SEAL_MAX_RECORD), the n
 * bytes sealed, and a 16-byte tag.  The length is the associated data; the
 * nonce is the record's number in its direction (4 zero bytes, then a u64
 * big-endian counter from 0).  Each direction has its own key, derived from
 * the handshake (docs/PROTOCOL.md, section 2.2), so that a record replayed,
 * reordered, dropped, altered, reflected back or taken from another
 * connection fails its tag at the record where it happens, and nothing of
 * that record is given to the caller.
 *
 * fb_seal_* are pure (no I/O, no locks: fuzzable alone); the transport keeps
 * the records of both directions apart, so its reader and its writer may
 * run in two threads without a lock. */
#ifndef FLINKBUF_SEAL_H
#define FLINKBUF_SEAL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "network/transport.h"

#define FB_SEAL_KEY 32
#define FB_SEAL_TAG 16
#define FB_SEAL_PREFIX 4
#define FB_SEAL_MAX_RECORD (64 * 1024)     /* bytes sealed per record, at most */
#define FB_SEAL_OVERHEAD (FB_SEAL_PREFIX + FB_SEAL_TAG)

/* One direction's key and record counter. */
typedef struct fb_seal fb_seal_t;

/* A direction that seals (`sealing` 1) or opens (0) records with `key`: NULL
 * when out of memory or when libcrypto has no AES-256-GCM. */
fb_seal_t *fb_seal_new(const unsigned char key[FB_SEAL_KEY], int sealing);
void fb_seal_free(fb_seal_t *s);
/* Records sealed or opened so far (the next record's number). */
uint64_t fb_seal_count(const fb_seal_t *s);

/* Seal the first n (1..FB_SEAL_MAX_RECORD) bytes of the vectors into out
 * (FB_SEAL_OVERHEAD + n bytes): 0, or -1 if libcrypto failed. */
int fb_seal_record(fb_seal_t *s, const struct iovec *iov, int iovcnt, size_t n,
                   unsigned char *out);
/* The sealed length a record's prefix announces, or -1 when it is out of
 * range (0 or over FB_SEAL_MAX_RECORD). */
long fb_seal_announced(const unsigned char prefix[FB_SEAL_PREFIX]);
/* Open the whole record at rec (FB_SEAL_OVERHEAD + n bytes, n announced by
 * its prefix) into the vectors (room for n bytes, in order): 0, or -1 when
 * its tag does not match (the vectors then hold garbage, to be dropped).
 * Either way the record counts. */
int fb_seal_open(fb_seal_t *s, const unsigned char *rec, size_t n, const struct iovec *out,
                 int outcnt);

/* A transport that seals what it sends and opens what it receives over
 * `inner` (owned from here on, even when this fails: NULL, out of memory).
 * Its send takes a record's worth of the vectors at a time; when it cannot
 * send the whole record at once (EAGAIN with nowait), the record stays
 * pending and the caller must send the same bytes again (as with TLS
 * libraries).  Its receive gives only bytes of records whose tag matched;
 * a record that fails is -1 with errno EBADMSG (and every receive after),
 * a length out of range EPROTO, a stream that ends inside a record
 * ECONNRESET; fb_transport_why says which record and why.  A record not
 * whole yet is a partial unit (fb_transport_partial): the connection above
 * counts it as a frame half read, and a peer (or a relay) that stops
 * inside one stalls it as one that stops inside a frame. */
fb_transport_t *fb_transport_sealed(fb_transport_t *inner, const unsigned char tx_key[FB_SEAL_KEY],
                                    const unsigned char rx_key[FB_SEAL_KEY]);

#endif
