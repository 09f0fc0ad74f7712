/* Frames out: batches of control frames (the consumer's side's requests,
 * credit and releases, errors, heartbeats) and served buffers (what the
 * producer's side takes) in one send, by the writer thread or
 * (caller_sends) by a producer's thread. */
#define _GNU_SOURCE
#include "network/writer_internal.h"
#include "network/consumer_internal.h"
#include "network/lifecycle_internal.h"
#include "network/producer_internal.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Drop the first n bytes of an iovec array (after a partial send): *iov moves
 * past the vectors sent in full, the next one starts where the send stopped.
 * Returns the vectors left. */
static int iov_advance(struct iovec **iov, int iovcnt, size_t n)
{
    struct iovec *v = *iov;
    while (iovcnt > 0 && n >= v->iov_len) {
        n -= v->iov_len;
        v++;
        iovcnt--;
    }
    if (iovcnt > 0) {
        v->iov_base = (char *)v->iov_base + n;
        v->iov_len -= n;
    }
    *iov = v;
    return iovcnt;
}

/* Send the iovecs, advancing *iov and *iovcnt past what went; with
 * `nowait`, only what the transport takes now.  0 all went, 1 some
 * is left, -1 the connection failed (or writing failed before). */
static int send_iov(fb_conn_t *c, struct iovec **iov, int *iovcnt, int nowait)
{
    ssize_t r;
    if (write_failed(c))
        return -1;
    while (*iovcnt > 0) {
        r = c->t->ops->send(c->t, *iov, *iovcnt, nowait);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            if (nowait && (errno == EAGAIN || errno == EWOULDBLOCK))
                return 1;
            conn_write_failed(c, errno);
            return -1;
        }
        stat_add(&c->stats.bytes_out, r);
        *iovcnt = iov_advance(iov, *iovcnt, (size_t)r);
    }
    return 0;
}

static int send_all(fb_conn_t *c, struct iovec *iov, int iovcnt)
{
    return send_iov(c, &iov, &iovcnt, 0);
}

#define BATCH_FRAMES 16
#define BATCH_BYTES (256 * 1024)

/* What the writer sends in one sendmsg. */
struct batch {
    int32_t nframes;
    int niov;
    size_t bytes;
    size_t ctl_used;            /* bytes of c->ctlbuf taken by control frames */
    int ctl_full;               /* control frames are waiting for the next batch */
    int close_now;
    int64_t frames_out;         /* control frames */
    /* (fields above are reset for every batch) */
    frame_t frames[BATCH_FRAMES];
    struct iovec iov[2 * BATCH_FRAMES + 8];
};

batch_t *batch_new(void)
{
    return malloc(sizeof(batch_t));
}

static void batch_iov(batch_t *b, void *base, size_t len)
{
    b->iov[b->niov].iov_base = base;
    b->iov[b->niov++].iov_len = len;
    b->bytes += len;
}

/* A control message's frame at p (mu held); returns the end of it.  Credit
 * and requests are read from their channel now (consumer.c): an ADD_CREDIT
 * carries all the credit gathered by the time it is written. */
static char *put_control(fb_conn_t *c, ctl_t *m, char *p, int *close_now)
{
    switch (m->type) {
    case FB_MSG_ADD_CREDIT:
    case FB_MSG_ADD_EVENT_CREDIT:
    case FB_MSG_PARTITION_REQUEST:
    case FB_MSG_NEW_BUFFER_SIZE:
        return consumer_put_control_locked(c, m, p);
    case FB_MSG_CANCEL:
        return fb_wire_put_cancel(p, m->receiver_id);
    case FB_MSG_CLOSE:
        *close_now = 1;
        return fb_wire_put_close(p);
    default:                        /* a prebuilt body */
        p = fb_wire_put_header(p, m->len, m->type);
        memcpy(p, m->body, m->len);
        return p + m->len;
    }
}

/* The heartbeat frames due (mu held): an answer, and a request. */
static char *put_heartbeats_locked(fb_conn_t *c, batch_t *b, char *p)
{
    if (c->pong_token != 0) {
        p = fb_wire_put_heartbeat(p, FB_MSG_HEARTBEAT_RESPONSE, c->pong_token);
        c->pong_token = 0;
        b->frames_out++;
    }
    if (c->ping_queued) {
        p = fb_wire_put_heartbeat(p, FB_MSG_HEARTBEAT_REQUEST, c->ping_token);
        c->ping_queued = 0;
        __atomic_store_n(&c->ping_written, c->ping_token, __ATOMIC_RELEASE);
        b->frames_out++;
    }
    return p;
}

/* Append the queued control frames to the batch's control area (mu held
 * by the caller).  Messages that do not fit stay queued for the next batch;
 * the ones taken are returned for ctl_free_list once unlocked. */
static ctl_t *take_control_locked(fb_conn_t *c, batch_t *b)
{
    ctl_t *m, *taken = NULL, **tail = &taken;
    char *p = c->ctlbuf + b->ctl_used, *end;
    if (CTL_CAP - b->ctl_used >= 2 * FB_NET_HEARTBEAT_FRAME)
        p = put_heartbeats_locked(c, b, p);
    /* Segments of the peer's we recycled go first: before a CLOSE_REQUEST
     * (after which the peer reads nothing), and before the credit they free. */
    if (c->rel != NULL) {
        int more;
        end = consumer_put_releases_locked(c, p, c->ctlbuf + CTL_CAP, &more);
        b->frames_out += end > p;
        p = end;
        if (more) {
            notify_writer(c, 0);
            b->ctl_full = 1;
        }
    }
    while (!b->ctl_full && (m = c->ctl_head) != NULL) {
        if ((size_t)(p - c->ctlbuf) + CTL_FRAME_ROOM + m->len > CTL_CAP) {
            notify_writer(c, 0);             /* the rest in the next batch */
            b->ctl_full = 1;
            break;
        }
        c->ctl_head = m->next;
        if (c->ctl_head == NULL)
            c->ctl_tail = NULL;
        __atomic_store_n(&c->nctl, c->nctl - 1, __ATOMIC_RELAXED);
        if (c->nctl + 1 >= CTL_MAX)
            pthread_cond_broadcast(&c->cv);    /* a reader may wait for room */
        end = put_control(c, m, p, &b->close_now);
        b->frames_out += end > p;
        p = end;
        m->next = NULL;
        *tail = m;
        tail = &m->next;
    }
    if (p > c->ctlbuf + b->ctl_used) {
        batch_iov(b, c->ctlbuf + b->ctl_used, (size_t)(p - (c->ctlbuf + b->ctl_used)));
        b->ctl_used = (size_t)(p - c->ctlbuf);
    }
    return taken;
}

/* Add what a served channel may send now to the batch: one buffer (or
 * event), as the producer's side takes it. */
static void take_buffer(fb_conn_t *c, batch_t *b, int32_t slot)
{
    frame_t *fr = &b->frames[b->nframes];
    if (!producer_take(c, slot, fr))
        return;
    b->nframes++;
    if (fr->lent) {
        batch_iov(b, fr->hdr, FB_NET_HEADER + FB_NET_LENT_FIELDS);
        return;
    }
    batch_iov(b, fr->hdr, FB_NET_HEADER + FB_NET_BUFFER_FIELDS);
    if (fr->item.size)
        batch_iov(b, fr->item.data, (size_t)fr->item.size);
}

static void finish_batch(fb_conn_t *c, batch_t *b, ctl_t *taken, int rc);

static int send_batch(fb_conn_t *c, batch_t *b, ctl_t *taken)
{
    int rc = b->niov ? send_all(c, b->iov, b->niov) : 0;
    finish_batch(c, b, taken, rc);
    return rc;
}

/* After a batch went (rc 0) or failed: its control messages are freed, its
 * segments go back, the channels whose last item went end. */
static void finish_batch(fb_conn_t *c, batch_t *b, ctl_t *taken, int rc)
{
    int32_t k, buffers = 0;
    ctl_free_list(taken);
    for (k = 0; k < b->nframes; k++) {
        buffers += b->frames[k].item.kind == FB_ITEM_DATA;
        if (!b->frames[k].lent)            /* a lent one comes back with its RELEASE */
            fb_item_dispose(&b->frames[k].item);
        if (b->frames[k].ended != NULL)
            outchan_end(c, b->frames[k].ended, 0);
    }
    if (rc == 0) {
        stat_add(&c->stats.frames_out, b->frames_out + b->nframes);
        stat_add(&c->stats.buffers_out, buffers);
    }
    if (b->close_now) {
        int close_now;
        pthread_mutex_lock(&c->mu);
        c->close_sent = 1;
        /* (still open: the protocol error is being recorded, and closes it) */
        close_now = c->close_on_send && c->state != CONN_OPEN;
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&c->mu);
        if (close_now)             /* the error before it went: the socket goes now */
            close_socket(c);
    }
}

/* Gather a batch starting with `slot`: whatever else is ready now (up to
 * BATCH_FRAMES buffers, BATCH_BYTES, and the control frames) goes into one
 * send: a credit announcement goes out with the data beside it, and small
 * buffers share a system call.  send_mu held; the control messages taken
 * are returned (freed once the batch went). */
static ctl_t *gather(fb_conn_t *c, batch_t *b, int32_t slot)
{
    ctl_t *taken = NULL, *more;
    memset(b, 0, offsetof(batch_t, frames));
    do {
        if (slot == 0) {
            pthread_mutex_lock(&c->mu);
            more = take_control_locked(c, b);
            pthread_mutex_unlock(&c->mu);
            if (more != NULL) {          /* keep them for freeing after the send */
                ctl_t *t = more;
                while (t->next != NULL)
                    t = t->next;
                t->next = taken;
                taken = more;
            }
        } else {
            take_buffer(c, b, slot);
        }
    } while (b->nframes < BATCH_FRAMES && b->bytes < BATCH_BYTES && !b->close_now
             && !b->ctl_full && b->niov < (int)(sizeof(b->iov) / sizeof(b->iov[0])) - 2
             && fb_gate_wait(&c->out, 0, &slot) == FB_OK);
    return taken;
}

/* Send what the socket takes now without blocking: 0 all of it, 1 some is
 * left (the iovecs advanced past what went), -1 the connection failed. */
static int send_nowait(fb_conn_t *c, batch_t *b)
{
    struct iovec *iov = b->iov;
    int iovcnt = b->niov;
    int rc = send_iov(c, &iov, &iovcnt, 1);
    if (rc == 1) {
        memmove(b->iov, iov, sizeof(*iov) * (size_t)iovcnt);
        b->niov = iovcnt;
    }
    return rc;
}

/* The batch a producer's thread left (send_mu held, no GIL: blocking is
 * fine here): sent whole, or given back if the connection failed. */
static int flush_pending(fb_conn_t *c, int send)
{
    batch_t *b = c->pending;
    int rc;
    if (b == NULL)
        return 0;
    rc = send ? send_all(c, b->iov, b->niov) : -1;
    c->pending = NULL;
    finish_batch(c, b, c->pending_taken, rc);
    c->pending_taken = NULL;
    return rc;
}

/* (No hand-off to the writer thread and no wake-up of it while it idles.) */
void conn_ready(void *arg)
{
    fb_conn_t *c = arg;
    batch_t *b;
    ctl_t *taken;
    int32_t slot;
    int rc;
    if (pthread_mutex_trylock(&c->send_mu) != 0) {
        fb_gate_wake(&c->out);            /* the writer thread (or another sender) is at it */
        return;
    }
    b = c->direct;                        /* NULL only while a batch is pending */
    if (c->pending != NULL || b == NULL || fb_gate_wait(&c->out, 0, &slot) != FB_OK) {
        pthread_mutex_unlock(&c->send_mu);
        fb_gate_wake(&c->out);
        return;
    }
    for (;;) {                            /* batch after batch while the socket takes them */
        taken = gather(c, b, slot);
        rc = b->niov ? send_nowait(c, b) : 0;
        if (rc == 1) {
            c->pending = b;               /* the rest for the writer thread */
            c->pending_taken = taken;
            c->direct = NULL;
            break;
        }
        finish_batch(c, b, taken, rc);
        if (rc < 0 || fb_gate_wait(&c->out, 0, &slot) != FB_OK)
            break;
    }
    pthread_mutex_unlock(&c->send_mu);
    if (rc == 1)
        notify_writer(c, 0);
    else
        fb_gate_wake(&c->out);            /* what did not fit in this batch */
}

void end_served_channels(fb_conn_t *c)
{
    outchan_t **ended;
    int32_t n = 0, k;
    /* A producer's thread sending now finishes first; a batch it left
     * unsent goes back (the connection has ended: it is not sent). */
    pthread_mutex_lock(&c->send_mu);
    if (c->pending != NULL) {
        batch_t *spare = c->pending;
        flush_pending(c, 0);
        if (c->direct == NULL)
            c->direct = spare;
    }
    pthread_mutex_unlock(&c->send_mu);
    ended = malloc(sizeof(outchan_t *) * FB_NET_MAX_CHANNELS);
    pthread_mutex_lock(&c->mu);
    for (k = 1; k <= FB_NET_MAX_CHANNELS; k++)
        if (c->outs[k] != NULL) {
            if (ended == NULL) {        /* no memory: one at a time, unlocking between */
                outchan_t *oc = c->outs[k];
                outchan_free_slot(c, oc);
                pthread_mutex_unlock(&c->mu);
                outchan_end(c, oc, 1);
                pthread_mutex_lock(&c->mu);
                continue;
            }
            ended[n++] = c->outs[k];
            outchan_free_slot(c, c->outs[k]);
        }
    pthread_mutex_unlock(&c->mu);
    for (k = 0; k < n; k++)
        outchan_end(c, ended[k], 1);
    free(ended);
}

void *writer_main(void *arg)
{
    fb_conn_t *c = arg;
    int32_t slot;
    int64_t deadline;
    int rc;
    batch_t *b = malloc(sizeof(batch_t));
    ctl_t *taken;
    if (b == NULL) {
        conn_fail(c, FB_NET_ERR_CLOSED, "out of memory for the connection's writer");
        return NULL;
    }
    for (;;) {
        pthread_mutex_lock(&c->mu);
        deadline = consumer_due_locked(c);
        pthread_mutex_unlock(&c->mu);
        rc = fb_gate_wait(&c->out, deadline, &slot);
        if (rc == FB_ECLOSED)
            break;
        if (rc != FB_OK)
            continue;
        pthread_mutex_lock(&c->send_mu);
        if (c->pending != NULL) {
            batch_t *spare = c->pending;
            rc = flush_pending(c, 1);
            if (c->direct == NULL)
                c->direct = spare;        /* the producers' batch is free again */
            if (rc < 0 && !write_failed(c)) {
                pthread_mutex_unlock(&c->send_mu);
                break;
            }
        }
        /* After a write failed as the peer went, batches are dropped (their
         * segments go back) until the reader ends the connection. */
        taken = gather(c, b, slot);
        rc = send_batch(c, b, taken);
        pthread_mutex_unlock(&c->send_mu);
        if (rc < 0 && !write_failed(c))
            break;
    }
    free(b);
    conn_fail(c, FB_NET_ERR_CLOSED, "the connection was closed");   /* if it was not */
    end_served_channels(c);
    return NULL;
}
