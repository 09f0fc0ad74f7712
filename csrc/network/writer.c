/* Frames out: batches of control frames and served buffers in one send,
 * by the writer thread or (caller_sends) by a producer's thread. */
#define _GNU_SOURCE
#include "network/connection_internal.h"

#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
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

/* One buffer response of a batch. */
typedef struct frame {
    char hdr[FB_NET_HEADER + FB_NET_LENT_FIELDS];   /* (longer than a BUFFER_RESPONSE's) */
    fb_item_t item;
    outchan_t *ended;           /* the channel this frame ends (its last item), or NULL */
    int lent;                   /* a BUFFER_LENT: the segment stays out until released */
} frame_t;

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

/* A batch for a connection's sender (fb_conn_new: the producers'). */
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
 * and requests are read from their channel now: an ADD_CREDIT carries all
 * the credit gathered by the time it is written. */
static char *put_control(fb_conn_t *c, ctl_t *m, char *p, int *close_now)
{
    int32_t slot, n;
    fb_inchan_t *ch = NULL;
    if (m->type == FB_MSG_ADD_CREDIT || m->type == FB_MSG_ADD_EVENT_CREDIT
            || m->type == FB_MSG_PARTITION_REQUEST) {
        slot = in_lookup(c, m->receiver_id);
        if (slot < 0)
            return p;                /* the channel closed meanwhile */
        ch = c->ins[slot];
    }
    switch (m->type) {
    case FB_MSG_ADD_CREDIT:
        n = ch->state == CH_REQUESTED ? fb_credit_take_announcement(&ch->cr) : 0;
        fb_credit_unqueue(&ch->cr);
        return n > 0 ? fb_wire_put_credit(p, FB_MSG_ADD_CREDIT, ch->receiver_id, n) : p;
    case FB_MSG_ADD_EVENT_CREDIT:
        n = fb_credit_take_event_grant(&ch->cr, ch->state == CH_REQUESTED);
        return n > 0 ? fb_wire_put_credit(p, FB_MSG_ADD_EVENT_CREDIT, ch->receiver_id, n) : p;
    case FB_MSG_PARTITION_REQUEST:
        if (ch->state != CH_REQUESTED)
            return p;
        n = fb_credit_take_initial(&ch->cr);      /* every buffer held: credit */
        return fb_wire_put_request(p, ch->receiver_id, ch->subpartition, n, ch->partition_id,
                                   ch->id_len);
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

/* Append the queued control frames to the batch's control area (mu held
 * by the caller).  Messages that do not fit stay queued for the next batch;
 * the ones taken are returned for ctl_free_list once unlocked. */
static ctl_t *take_control_locked(fb_conn_t *c, batch_t *b)
{
    ctl_t *m, *taken = NULL, **tail = &taken;
    char *p = c->ctlbuf + b->ctl_used, *end;
    /* Segments of the peer's we recycled go first: before a CLOSE_REQUEST
     * (after which the peer reads nothing), and before the credit they free. */
    if (c->rel != NULL) {
        int more;
        end = put_releases_locked(c, p, c->ctlbuf + CTL_CAP, &more);
        b->frames_out += end > p;
        p = end;
        if (more) {
            notify_writer(c, 0);
            b->ctl_full = 1;
        }
    }
    while (!b->ctl_full && (m = c->ctl_head) != NULL) {
        if ((size_t)(p - c->ctlbuf) + FB_NET_MAX_CONTROL_FRAME + m->len > CTL_CAP) {
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
 * event).  A channel that failed, was released or cancelled ends here. */
static void take_buffer(fb_conn_t *c, batch_t *b, int32_t slot)
{
    outchan_t *oc;
    frame_t *fr;
    int rc, last = 0;
    pthread_mutex_lock(&c->mu);
    oc = c->outs[slot];
    if (oc == NULL) {
        pthread_mutex_unlock(&c->mu);
        return;
    }
    if (oc->cancelled) {
        outchan_free_slot(c, oc);
        pthread_mutex_unlock(&c->mu);
        outchan_end(c, oc, 1);
        return;
    }
    fr = &b->frames[b->nframes];
    rc = fb_subpart_poll_credit(oc->sp, oc->credit, oc->event_credit,
                                &fr->item, &last);
    if (rc == FB_EMPTY) {
        pthread_mutex_unlock(&c->mu);
        return;
    }
    if (rc != FB_OK) {
        /* The producer failed, or released its partition: tell the reader
         * (after what this batch sends for it: the error is queued). */
        char type[FB_NET_MAX_ERROR_TYPE] = "", msg[FB_NET_MAX_MESSAGE] = "the partition was released";
        uint32_t id = oc->receiver_id;
        outchan_free_slot(c, oc);
        pthread_mutex_unlock(&c->mu);
        if (rc == FB_EFAILED)
            c->cb.describe_failure(c->cb.ctx, oc->owner, type, sizeof(type), msg, sizeof(msg));
        pthread_mutex_lock(&c->mu);
        if (c->state == CONN_OPEN)
            ctl_error(c, id, rc == FB_EFAILED ? FB_NET_ERR_PRODUCER_FAILED : FB_NET_ERR_RELEASED,
                      type, msg);
        pthread_mutex_unlock(&c->mu);
        outchan_end(c, oc, 0);
        return;
    }
    fr->lent = oc->lends && lend_locked(c, oc, &fr->item);
    if (fr->lent)
        fb_wire_put_lent(fr->hdr, oc->receiver_id, oc->seq++, fb_subpart_backlog(oc->sp),
                         (uint32_t)fr->item.size, (uint32_t)fr->item.index);
    else
        fb_wire_put_buffer(fr->hdr, oc->receiver_id, oc->seq++, fb_subpart_backlog(oc->sp),
                           fr->item.kind == FB_ITEM_DATA ? FB_WIRE_DATA : FB_WIRE_EVENT,
                           (uint32_t)fr->item.size);
    if (fr->item.kind != FB_ITEM_DATA)
        oc->event_credit--;
    else
        oc->credit--;                /* lent or copied: a credit each */
    fr->ended = NULL;
    if (last) {                      /* its last item: the channel ends once it is sent */
        outchan_free_slot(c, oc);
        fr->ended = oc;
    }
    pthread_mutex_unlock(&c->mu);
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

/* Requests whose retry time came: queue them again (mu held); the next
 * deadline, or FB_WAIT_FOREVER. */
static int64_t due_retries_locked(fb_conn_t *c)
{
    int64_t now = fb_monotonic_ns(), next = FB_WAIT_FOREVER;
    int32_t k;
    if (c->num_retrying == 0)
        return next;
    for (k = 0; k < FB_NET_MAX_CHANNELS; k++) {
        fb_inchan_t *ch = c->ins[k];
        if (ch == NULL || ch->state != CH_RETRY)
            continue;
        if (ch->retry_at <= now) {
            ch->state = CH_REQUESTED;
            ch->next_seq = 0;
            fb_credit_reset_events(&ch->cr);
            c->num_retrying--;
            ctl_push(c, FB_MSG_PARTITION_REQUEST, ch->receiver_id, NULL, 0);
        } else if (ch->retry_at < next) {
            next = ch->retry_at;
        }
    }
    return next;
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
int flush_pending(fb_conn_t *c, int send)
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

/* The gate hook (caller_sends): a producer's add made a served subpartition
 * ready.  If the writer thread is idle, this thread sends what is ready
 * itself, without blocking (it may hold the GIL): no hand-off to the writer
 * thread and no wake-up of it.  Otherwise, or if the socket would block,
 * the writer thread is woken to do it. */
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

/* The writer thread: wait for a ready slot, gather a batch, send it. */
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
        deadline = due_retries_locked(c);
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
