#define _GNU_SOURCE
#include "network/seal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>

#define NONCE 12

struct fb_seal {
    EVP_CIPHER_CTX *ctx;
    uint64_t count;
    int sealing;
};

fb_seal_t *fb_seal_new(const unsigned char key[FB_SEAL_KEY], int sealing)
{
    fb_seal_t *s = calloc(1, sizeof(*s));
    const EVP_CIPHER *aead = EVP_aes_256_gcm();
    int ok;
    if (s == NULL)
        return NULL;
    s->sealing = sealing;
    s->ctx = EVP_CIPHER_CTX_new();
    if (s->ctx == NULL || aead == NULL) {
        fb_seal_free(s);
        return NULL;
    }
    ok = sealing ? EVP_EncryptInit_ex(s->ctx, aead, NULL, NULL, NULL)
                 : EVP_DecryptInit_ex(s->ctx, aead, NULL, NULL, NULL);
    ok = ok && EVP_CIPHER_CTX_ctrl(s->ctx, EVP_CTRL_GCM_SET_IVLEN, NONCE, NULL);
    ok = ok && (sealing ? EVP_EncryptInit_ex(s->ctx, NULL, NULL, key, NULL)
                        : EVP_DecryptInit_ex(s->ctx, NULL, NULL, key, NULL));
    if (!ok) {
        fb_seal_free(s);
        return NULL;
    }
    return s;
}

void fb_seal_free(fb_seal_t *s)
{
    if (s == NULL)
        return;
    EVP_CIPHER_CTX_free(s->ctx);        /* (clears the key schedule) */
    free(s);
}

uint64_t fb_seal_count(const fb_seal_t *s)
{
    return s->count;
}

static void put_u32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

/* The next record's nonce; the counter moves on whatever becomes of it. */
static void next_nonce(fb_seal_t *s, unsigned char nonce[NONCE])
{
    uint64_t n = s->count++;
    memset(nonce, 0, 4);
    put_u32(nonce + 4, (uint32_t)(n >> 32));
    put_u32(nonce + 8, (uint32_t)n);
}

int fb_seal_record(fb_seal_t *s, const struct iovec *iov, int iovcnt, size_t n,
                   unsigned char *out)
{
    unsigned char nonce[NONCE], *p = out + FB_SEAL_PREFIX;
    size_t left = n, take;
    int len;
    if (!s->sealing || n == 0 || n > FB_SEAL_MAX_RECORD)
        return -1;
    put_u32(out, (uint32_t)n);
    next_nonce(s, nonce);
    if (!EVP_EncryptInit_ex(s->ctx, NULL, NULL, NULL, nonce)
            || !EVP_EncryptUpdate(s->ctx, NULL, &len, out, FB_SEAL_PREFIX))
        return -1;
    for (int i = 0; i < iovcnt && left > 0; i++) {
        take = iov[i].iov_len < left ? iov[i].iov_len : left;
        if (take == 0)
            continue;
        if (!EVP_EncryptUpdate(s->ctx, p, &len, iov[i].iov_base, (int)take))
            return -1;
        p += len;
        left -= take;
    }
    if (left != 0 || !EVP_EncryptFinal_ex(s->ctx, p, &len))
        return -1;
    p += len;
    if (p != out + FB_SEAL_PREFIX + n
            || !EVP_CIPHER_CTX_ctrl(s->ctx, EVP_CTRL_GCM_GET_TAG, FB_SEAL_TAG, p))
        return -1;
    return 0;
}

long fb_seal_announced(const unsigned char prefix[FB_SEAL_PREFIX])
{
    uint32_t n = (uint32_t)prefix[0] << 24 | (uint32_t)prefix[1] << 16
                 | (uint32_t)prefix[2] << 8 | prefix[3];
    return n == 0 || n > FB_SEAL_MAX_RECORD ? -1 : (long)n;
}

int fb_seal_open(fb_seal_t *s, const unsigned char *rec, size_t n, const struct iovec *out,
                 int outcnt)
{
    unsigned char nonce[NONCE], tag[FB_SEAL_TAG], sink[256];
    const unsigned char *p = rec + FB_SEAL_PREFIX;
    size_t left = n, take;
    int len;
    if (s->sealing || n == 0 || n > FB_SEAL_MAX_RECORD || fb_seal_announced(rec) != (long)n)
        return -1;
    next_nonce(s, nonce);
    if (!EVP_DecryptInit_ex(s->ctx, NULL, NULL, NULL, nonce)
            || !EVP_DecryptUpdate(s->ctx, NULL, &len, rec, FB_SEAL_PREFIX))
        return -1;
    for (int i = 0; i < outcnt && left > 0; i++) {
        take = out[i].iov_len < left ? out[i].iov_len : left;
        if (take == 0)
            continue;
        if (!EVP_DecryptUpdate(s->ctx, out[i].iov_base, &len, p, (int)take))
            return -1;
        p += take;
        left -= take;
    }
    if (left != 0)
        return -1;
    memcpy(tag, rec + FB_SEAL_PREFIX + n, FB_SEAL_TAG);
    if (!EVP_CIPHER_CTX_ctrl(s->ctx, EVP_CTRL_GCM_SET_TAG, FB_SEAL_TAG, tag))
        return -1;
    return EVP_DecryptFinal_ex(s->ctx, sink, &len) > 0 ? 0 : -1;
}

/* ---- the sealed transport ---------------------------------------------------------- */

#define RECORD_MAX (FB_SEAL_OVERHEAD + FB_SEAL_MAX_RECORD)
#define IN_CAP (4 * RECORD_MAX)            /* few moves of a partial record to the front */
#define OUT_CAP (2 * RECORD_MAX)
/* A vector this long (a buffer's body) is sealed as records of its own, so
 * that the receiver opens it straight into the segment it goes to instead
 * of into a staging area and copying it on; shorter ones (frame headers,
 * control frames, small buffers) share a record, since a record's own cost
 * (its tag, its set-up) is about that of copying a few KiB. */
#define SEAL_ALONE 4096
#define RECORD_IOV 64

typedef struct sealed {
    fb_transport_t base;
    fb_transport_t *inner;
    /* the writer's: sealed records on their way */
    fb_seal_t *tx;
    unsigned char *out;
    size_t out_len, out_sent, out_plain;
    /* the reader's: records received, opened bytes not taken yet */
    fb_seal_t *rx;
    unsigned char *in;
    size_t in_pos, in_end;
    unsigned char *plain;
    size_t plain_pos, plain_end;
    int rx_errno;                   /* set once: every receive after fails alike */
    int ready;                      /* (atomic) input waits here: for wait(), which may
                                     * run beside the thread that receives */
    char why[192];
} sealed_t;

/* The next record's worth of the vectors from (*i, *off) on, gathered into
 * rec (moving the cursor past it): its length, 0 when none is left.  A long
 * vector makes records alone; short ones share one, up to the next long one. */
static size_t next_record(const struct iovec *iov, int iovcnt, int *i, size_t *off,
                          struct iovec *rec, int *reccnt)
{
    size_t n = 0, take, left;
    *reccnt = 0;
    while (*i < iovcnt && *reccnt < RECORD_IOV) {
        left = iov[*i].iov_len - *off;
        if (left == 0) {
            ++*i;
            *off = 0;
            continue;
        }
        if (iov[*i].iov_len >= SEAL_ALONE && n > 0)
            break;                      /* a long one starts a record of its own */
        take = left < FB_SEAL_MAX_RECORD - n ? left : FB_SEAL_MAX_RECORD - n;
        rec[*reccnt].iov_base = (char *)iov[*i].iov_base + *off;
        rec[(*reccnt)++].iov_len = take;
        n += take;
        *off += take;
        if (iov[*i].iov_len >= SEAL_ALONE || n == FB_SEAL_MAX_RECORD)
            break;
    }
    return n;
}

/* Seal records of the vectors into s->out while they fit: the plain bytes
 * taken, or -1 if libcrypto failed. */
static ssize_t seal_out(sealed_t *s, const struct iovec *iov, int iovcnt)
{
    struct iovec rec[RECORD_IOV];
    int i = 0, reccnt;
    size_t off = 0, n, taken = 0;
    s->out_len = 0;
    for (;;) {
        n = next_record(iov, iovcnt, &i, &off, rec, &reccnt);
        if (n == 0 || s->out_len + FB_SEAL_OVERHEAD + n > OUT_CAP)
            break;
        if (fb_seal_record(s->tx, rec, reccnt, n, s->out + s->out_len) != 0)
            return -1;
        s->out_len += FB_SEAL_OVERHEAD + n;
        taken += n;
    }
    return (ssize_t)taken;
}

static ssize_t sealed_send(fb_transport_t *t, const struct iovec *iov, int iovcnt, int nowait)
{
    sealed_t *s = (sealed_t *)t;
    struct iovec rest;
    ssize_t r;
    if (s->out_len == 0) {
        r = seal_out(s, iov, iovcnt);
        if (r < 0) {
            s->out_len = 0;
            errno = EIO;
            return -1;
        }
        if (r == 0)
            return 0;
        s->out_sent = 0;
        s->out_plain = (size_t)r;
    }
    while (s->out_sent < s->out_len) {
        rest.iov_base = s->out + s->out_sent;
        rest.iov_len = s->out_len - s->out_sent;
        r = s->inner->ops->send(s->inner, &rest, 1, nowait);
        if (r < 0)
            return -1;                  /* EAGAIN: pending; the same bytes come again */
        s->out_sent += (size_t)r;
    }
    s->out_len = 0;
    return (ssize_t)s->out_plain;
}

static ssize_t rx_fail(sealed_t *s, int err, const char *fmt, unsigned long long record)
{
    snprintf(s->why, sizeof(s->why), fmt, record);
    s->rx_errno = err;
    errno = err;
    return -1;
}

/* A whole record at s->in + s->in_pos: its sealed length, 0 not yet, -1 bad prefix. */
static long whole_record(sealed_t *s)
{
    size_t have = s->in_end - s->in_pos;
    long n;
    if (have < FB_SEAL_PREFIX)
        return 0;
    n = fb_seal_announced(s->in + s->in_pos);
    if (n < 0)
        return -1;
    return have >= FB_SEAL_OVERHEAD + (size_t)n ? n : 0;
}

static size_t give_plain(sealed_t *s, const struct iovec *iov, int iovcnt)
{
    size_t given = 0, take;
    for (int i = 0; i < iovcnt && s->plain_pos < s->plain_end; i++) {
        take = s->plain_end - s->plain_pos;
        if (take > iov[i].iov_len)
            take = iov[i].iov_len;
        memcpy(iov[i].iov_base, s->plain + s->plain_pos, take);
        s->plain_pos += take;
        given += take;
    }
    return given;
}

static int sealed_pending(fb_transport_t *t)
{
    sealed_t *s = (sealed_t *)t;
    return s->rx_errno || s->plain_pos < s->plain_end || whole_record(s) != 0;
}

/* Bytes of a record whose rest is still to come. */
static int sealed_partial(fb_transport_t *t)
{
    sealed_t *s = (sealed_t *)t;
    return s->in_end > s->in_pos && whole_record(s) == 0;
}

static ssize_t recv_records(sealed_t *s, struct iovec *iov, int iovcnt);

static ssize_t sealed_recv(fb_transport_t *t, struct iovec *iov, int iovcnt)
{
    sealed_t *s = (sealed_t *)t;
    ssize_t r = recv_records(s, iov, iovcnt);
    int err = errno;
    __atomic_store_n(&s->ready, sealed_pending(t), __ATOMIC_RELEASE);
    errno = err;
    return r;
}

static ssize_t recv_records(sealed_t *s, struct iovec *iov, int iovcnt)
{
    struct iovec room, out[9];
    size_t cap, given;
    long n;
    ssize_t r;
    int k;
    if (s->rx_errno) {
        errno = s->rx_errno;
        return -1;
    }
    if (s->plain_pos < s->plain_end)
        return (ssize_t)give_plain(s, iov, iovcnt);
    while ((n = whole_record(s)) == 0) {
        if (s->in_pos > 0 && s->in_end + RECORD_MAX > IN_CAP) {
            memmove(s->in, s->in + s->in_pos, s->in_end - s->in_pos);
            s->in_end -= s->in_pos;
            s->in_pos = 0;
        }
        room.iov_base = s->in + s->in_end;
        room.iov_len = IN_CAP - s->in_end;
        r = s->inner->ops->recv(s->inner, &room, 1);
        if (r == 0 && s->in_end > s->in_pos)
            return rx_fail(s, ECONNRESET, "the connection ended inside sealed record %llu",
                           (unsigned long long)fb_seal_count(s->rx));
        if (r <= 0)
            return r;                   /* the end, EAGAIN or the inner error */
        s->in_end += (size_t)r;
    }
    if (n < 0)
        return rx_fail(s, EPROTO, "sealed record %llu announces a length out of range",
                       (unsigned long long)fb_seal_count(s->rx));
    /* Open straight into the caller's vectors; what does not fit waits in plain. */
    cap = 0;
    for (k = 0; k < iovcnt && k < 8; k++) {
        out[k] = iov[k];
        cap += iov[k].iov_len;
    }
    given = cap < (size_t)n ? cap : (size_t)n;
    out[k].iov_base = s->plain;
    out[k].iov_len = (size_t)n - given;
    if (fb_seal_open(s->rx, s->in + s->in_pos, (size_t)n, out, k + 1) != 0)
        return rx_fail(s, EBADMSG, "sealed record %llu failed its integrity check: altered, "
                       "replayed, reordered or dropped on the way, or sealed with another key",
                       (unsigned long long)(fb_seal_count(s->rx) - 1));
    s->in_pos += FB_SEAL_OVERHEAD + (size_t)n;
    if (s->in_pos == s->in_end)
        s->in_pos = s->in_end = 0;
    s->plain_pos = 0;
    s->plain_end = (size_t)n - given;
    return (ssize_t)given;
}

static int sealed_wait(fb_transport_t *t, int events, int wake_fd, int ms)
{
    sealed_t *s = (sealed_t *)t;
    if ((events & FB_TRANSPORT_READABLE) && __atomic_load_n(&s->ready, __ATOMIC_ACQUIRE))
        return 1;                       /* ready without the stream */
    return s->inner->ops->wait(s->inner, events, wake_fd, ms);
}

static void sealed_shutdown(fb_transport_t *t)
{
    sealed_t *s = (sealed_t *)t;
    s->inner->ops->shutdown(s->inner);
}

static void sealed_close(fb_transport_t *t)
{
    sealed_t *s = (sealed_t *)t;
    s->inner->ops->close(s->inner);
}

static const char *sealed_why(fb_transport_t *t)
{
    sealed_t *s = (sealed_t *)t;
    return s->rx_errno ? s->why : fb_transport_why(s->inner);
}

static void sealed_destroy(fb_transport_t *t)
{
    sealed_t *s = (sealed_t *)t;
    s->inner->ops->destroy(s->inner);
    fb_seal_free(s->tx);
    fb_seal_free(s->rx);
    free(s->out);
    free(s->in);
    free(s->plain);
    free(s);
}

static const fb_transport_ops_t SEALED_OPS = {
    sealed_send, sealed_recv, sealed_wait, sealed_shutdown, sealed_close, sealed_destroy,
    sealed_why, sealed_pending, sealed_partial,
};

fb_transport_t *fb_transport_sealed(fb_transport_t *inner, const unsigned char tx_key[FB_SEAL_KEY],
                                    const unsigned char rx_key[FB_SEAL_KEY])
{
    sealed_t *s = calloc(1, sizeof(*s));
    if (s != NULL) {
        s->base.ops = &SEALED_OPS;
        s->inner = inner;
        s->tx = fb_seal_new(tx_key, 1);
        s->rx = fb_seal_new(rx_key, 0);
        s->out = malloc(OUT_CAP);
        s->in = malloc(IN_CAP);
        s->plain = malloc(FB_SEAL_MAX_RECORD);
        if (s->tx && s->rx && s->out && s->in && s->plain)
            return &s->base;
        sealed_destroy(&s->base);       /* (destroys inner too) */
        return NULL;
    }
    inner->ops->destroy(inner);
    return NULL;
}
