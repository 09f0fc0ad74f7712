/* Frames in: staged and decoded (wire.h), bodies received straight into
 * segments, and the reader thread's loop. */
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
#include <time.h>
#include <unistd.h>

/* Every receive is non-blocking: a thread that would wait for input waits in
 * its own poll (reader_main, read_until), beside its own wake-up, and a frame
 * half read stays with the connection (c->rx, the staging buffer) for
 * whoever reads next. */

/* Receive what the socket has now into dst (n bytes at most) and, past
 * them, into more (nmore bytes, or none): the bytes (> 0), 0 none now, or
 * -1 the connection failed. */
static ssize_t rx_recv(fb_conn_t *c, char *dst, size_t n, char *more, size_t nmore)
{
    ssize_t r;
    struct iovec iov[2] = {{dst, n}, {more, nmore}};
    for (;;) {
        r = c->t->ops->recv(c->t, iov, more != NULL && nmore > 0 ? 2 : 1);
        if (r > 0) {
            stat_add(&c->stats.bytes_in, r);
            c->rx_since = fb_monotonic_ns();
            return r;
        }
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 0;
        if (r == 0)
            conn_fail_peer_closed(c, mid_frame(c));
        else if (fb_transport_why(c->t) != NULL)
            conn_fail(c, FB_NET_ERR_CONNECTION, "%s", fb_transport_why(c->t));
        else
            conn_fail(c, FB_NET_ERR_CONNECTION, "reading from the connection failed: %s",
                      strerror(errno));
        return -1;
    }
}

/* At least n (<= RD_CAP) bytes staged: 1; 0 not yet; -1 the connection failed. */
static int rx_stage(fb_conn_t *c, size_t n)
{
    ssize_t r;
    size_t want;
    if (c->rd_end - c->rd_pos >= n)
        return 1;
    if (c->rd_pos > 0) {
        memmove(c->rd, c->rd + c->rd_pos, c->rd_end - c->rd_pos);
        c->rd_end -= c->rd_pos;
        c->rd_pos = 0;
    }
    while (c->rd_end < n) {
        want = (n > READ_AHEAD ? n : READ_AHEAD) - c->rd_end;
        if ((r = rx_recv(c, c->rd + c->rd_end, want, NULL, 0)) <= 0)
            return (int)r;
        c->rd_end += (size_t)r;
    }
    return 1;
}

/* The peer broke the protocol: tell it why (an ERROR_RESPONSE, then a
 * CLOSE_REQUEST, which the writer sends before it closes the socket), and
 * end the connection here now.  -1. */
int protocol_error(fb_conn_t *c, const char *fmt, ...)
{
    char msg[512], why[FB_NET_MAX_MESSAGE];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&c->mu);
    if (c->state == CONN_OPEN                    /* (a reader runs: so does the writer) */
            && ctl_error(c, FB_NET_ALL, FB_NET_ERR_PROTOCOL, "ProtocolError", msg) == FB_OK
            && (c->close_queued
                || ctl_push(c, FB_MSG_CLOSE, 0, NULL, 0) == FB_OK)) {
        c->close_queued = 1;
        c->close_on_send = 1;
    }
    pthread_mutex_unlock(&c->mu);
    snprintf(why, sizeof(why), "protocol error from the peer: %s", msg);
    if (!conn_end(c, FB_NET_ERR_PROTOCOL, why))
        close_socket(c);
    return -1;
}

/* The channel a BUFFER_RESPONSE (or BUFFER_LENT) is for, with a reference
 * and marked as being received into, and where its body goes (*item: for a
 * data buffer, the segment its credit stood for); NULL with *rc 0 to drop
 * the body (a channel that ended), or with *rc -1 on a protocol error. */
fb_inchan_t *buffer_target(fb_conn_t *c, uint32_t id, uint32_t seq, uint8_t type,
                                  uint32_t size, fb_item_t *item, int *rc)
{
    int32_t slot, index;
    int floating;
    fb_inchan_t *ch;
    fb_localpool_t *pool;
    *rc = 0;
    pthread_mutex_lock(&c->mu);
    slot = in_lookup(c, id);
    ch = slot >= 0 ? c->ins[slot] : NULL;
    if (ch == NULL || ch->state != CH_REQUESTED) {
        uint32_t issued = c->next_receiver_id;
        pthread_mutex_unlock(&c->mu);
        if (id == 0 || id >= issued)
            *rc = protocol_error(c, "a buffer for receiver id %u, which was never issued", id);
        return NULL;
    }
    if (seq != ch->next_seq) {
        uint32_t expected = ch->next_seq;
        pthread_mutex_unlock(&c->mu);
        *rc = protocol_error(c, "sequence gap on receiver id %u: got %u, expected %u", id, seq,
                             expected);
        return NULL;
    }
    if (type == 0 && ch->cr.nheld == 0) {
        pthread_mutex_unlock(&c->mu);
        *rc = protocol_error(c, "a data buffer without credit on receiver id %u", id);
        return NULL;
    }
    if (type == 1 && fb_credit_event_arrives(&ch->cr) < 0) {
        pthread_mutex_unlock(&c->mu);
        *rc = protocol_error(c, "more than %d events outstanding on receiver id %u",
                             FB_NET_EVENT_WINDOW, id);
        return NULL;
    }
    ch->next_seq++;
    item->data = NULL;
    item->pool = NULL;
    item->index = -1;
    item->kind = type == 0 ? FB_ITEM_DATA : FB_ITEM_EVENT;
    item->size = (int32_t)size;
    if (type == 0) {                /* into one of the buffers the channel holds */
        fb_credit_consume(&ch->cr, &index, &floating);
        pool = floating ? ch->floating->pool : ch->exclusive;
        item->data = segment_of(pool, index);
        item->pool = pool;
        item->index = index;
    }
    if (type == 0)                  /* a close waits for (or aborts) this receive */
        c->recv_busy = ch;
    inchan_incref(ch);
    pthread_mutex_unlock(&c->mu);
    return ch;
}

/* A body arrived (received: 0) or not (-1): queue the item for the
 * consumer if the channel still reads, else give it back; then borrow
 * floating buffers for the sender's backlog.  Both happen before the
 * receive is marked done: a close waits for that, so the pools are alive. */
void buffer_deliver(fb_conn_t *c, fb_inchan_t *ch, fb_item_t *item, int received,
                    int32_t backlog)
{
    int delivered = 0;
    int last = item->kind == FB_ITEM_EVENT && item->size == 1 && item->data != NULL
               && received == 0 && item->data[0] == 0;     /* EndOfPartition */
    int open;
    pthread_mutex_lock(&c->mu);
    open = received == 0 && ch->state == CH_REQUESTED;
    if (open && last)
        ch->state = CH_FINISHED;
    pthread_mutex_unlock(&c->mu);
    /* Queued with no connection lock held: the consumer it wakes takes that
     * lock at once (to recycle).  A close or failure meanwhile terminates the
     * queue, which then refuses the item (or hands it back with the rest). */
    if (open && fb_subpart_add(&ch->queue, *item, last) == FB_OK) {
        pthread_mutex_lock(&c->mu);
        ch->cr.backlog = backlog;
        ch->buffers_in += item->kind == FB_ITEM_DATA;
        ch->bytes_in += item->size;
        pthread_mutex_unlock(&c->mu);
        item->data = NULL;          /* the queue has it */
        delivered = 1;
    }
    if (item->data != NULL)
        fb_item_dispose(item);
    if (delivered && item->kind == FB_ITEM_DATA)
        want_buffers(ch, backlog);
    pthread_mutex_lock(&c->mu);
    if (c->recv_busy == ch) {
        c->recv_busy = NULL;
        __atomic_store_n(&c->recv_abort, 0, __ATOMIC_RELEASE);
        pthread_cond_broadcast(&c->cv);
    }
    pthread_mutex_unlock(&c->mu);
}

/* Drop the rest of a body (a channel that ended): 1 done, 0 not yet, -1. */
static int rx_skip(fb_conn_t *c)
{
    size_t have = c->rd_end - c->rd_pos;
    ssize_t r;
    if (have > c->rx_left)
        have = c->rx_left;
    c->rd_pos += have;
    c->rx_left -= have;
    while (c->rx_left > 0) {
        c->rd_pos = c->rd_end = 0;
        r = rx_recv(c, c->rd, c->rx_left < RD_CAP ? c->rx_left : RD_CAP, NULL, 0);
        if (r <= 0)
            return (int)r;
        c->rx_left -= (size_t)r;
    }
    c->rx_phase = RX_FRAME;
    return 1;
}

/* The body being received ends: delivered (received 0) or not (-1). */
static void rx_finish(fb_conn_t *c, int received)
{
    fb_inchan_t *ch = c->rx_ch;
    if (received == 0) {
        stat_add(&c->stats.frames_in, 1);
        if (c->rx_item.kind == FB_ITEM_DATA)
            stat_add(&c->stats.buffers_in, 1);
    }
    c->rx_ch = NULL;
    c->rx_phase = RX_FRAME;
    buffer_deliver(c, ch, &c->rx_item, received, c->rx_backlog);
    fb_inchan_decref(ch);
}

/* A closing channel takes its segment back: the rest of the body is dropped. */
static void rx_abort(fb_conn_t *c)
{
    fb_inchan_t *ch = c->rx_ch;
    fb_item_dispose(&c->rx_item);
    c->rx_item.data = NULL;
    pthread_mutex_lock(&c->mu);
    c->recv_busy = NULL;
    __atomic_store_n(&c->recv_abort, 0, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    c->rx_ch = NULL;
    c->rx_phase = RX_SKIP;
    fb_inchan_decref(ch);
}

/* Receive the rest of a body into its item: 1 done, 0 not yet, -1.  The
 * rest goes straight into the segment and, in the same call, what follows
 * it (the next frame's header) into the staging buffer, which is empty by
 * now: one system call per frame while data streams. */
static int rx_body(fb_conn_t *c)
{
    ssize_t r;
    while (c->rx_left > 0) {
        if (c->rx_item.kind == FB_ITEM_DATA
                && __atomic_load_n(&c->recv_abort, __ATOMIC_ACQUIRE)) {
            rx_abort(c);
            return rx_skip(c);
        }
        c->rd_pos = c->rd_end = 0;
        r = rx_recv(c, c->rx_item.data + (c->rx_item.size - (int32_t)c->rx_left), c->rx_left,
                    c->rd, READ_AHEAD);
        if (r < 0)
            rx_finish(c, -1);
        if (r <= 0)
            return (int)r;
        if ((size_t)r > c->rx_left) {
            c->rd_end = (size_t)r - c->rx_left;
            r = (ssize_t)c->rx_left;
        }
        c->rx_left -= (size_t)r;
    }
    rx_finish(c, 0);
    return 1;
}

/* A BUFFER_RESPONSE's fields were read: its body goes to its channel (what
 * is staged now, the rest as it comes), or is dropped.  As rx_body. */
static int rx_buffer(fb_conn_t *c, const fb_wire_frame_t *f)
{
    uint32_t size = f->u.buffer.size;
    size_t have;
    int rc;
    fb_item_t item;
    fb_inchan_t *ch = buffer_target(c, f->receiver_id, f->u.buffer.sequence, f->u.buffer.type,
                                    size, &item, &rc);
    if (ch == NULL) {
        if (rc < 0)
            return -1;
        c->rx_left = size;                  /* a channel that ended */
        c->rx_phase = RX_SKIP;
        return rx_skip(c);
    }
    c->rx_ch = ch;
    c->rx_item = item;
    c->rx_backlog = f->u.buffer.backlog;
    c->rx_left = size;
    c->rx_phase = RX_BODY;
    if (item.kind == FB_ITEM_EVENT && (c->rx_item.data = malloc(size ? size : 1)) == NULL) {
        conn_fail(c, FB_NET_ERR_CONNECTION, "out of memory for an event of %u bytes", size);
        rx_finish(c, -1);
        return -1;
    }
    have = c->rd_end - c->rd_pos;
    if (have > size)
        have = size;
    memcpy(c->rx_item.data, c->rd + c->rd_pos, have);
    c->rd_pos += have;
    c->rx_left -= have;
    return rx_body(c);
}

/* After the connection ended, the frame half read goes: its segment back. */
static void rx_drop(fb_conn_t *c)
{
    if (c->rx_phase == RX_BODY)
        rx_finish(c, -1);
    c->rx_phase = RX_FRAME;
    c->rd_pos = c->rd_end = 0;
}

static int read_error(fb_conn_t *c, const fb_wire_frame_t *f)
{
    uint32_t id = f->receiver_id;
    int code = f->u.error.code;
    int32_t slot;
    fb_inchan_t *ch;
    char type[FB_NET_MAX_ERROR_TYPE], msg[FB_NET_MAX_MESSAGE];
    copy_text(type, sizeof(type), f->u.error.type, f->u.error.type_len);
    copy_text(msg, sizeof(msg), f->u.error.message, f->u.error.message_len);
    if (id == FB_NET_ALL) {
        conn_fail(c, code == FB_NET_ERR_PROTOCOL ? FB_NET_ERR_PROTOCOL : FB_NET_ERR_CONNECTION,
                  "the peer ended the connection: %s", msg);
        return -1;
    }
    pthread_mutex_lock(&c->mu);
    slot = in_lookup(c, id);
    ch = slot >= 0 ? c->ins[slot] : NULL;
    if (ch != NULL && ch->state == CH_REQUESTED) {
        int64_t now = fb_monotonic_ns();
        if (code == FB_NET_ERR_NOT_FOUND && now + ch->backoff_ns < ch->request_deadline) {
            ch->state = CH_RETRY;
            ch->retry_at = now + ch->backoff_ns;
            ch->backoff_ns = ch->backoff_ns * 2 > RETRY_MAX_NS ? RETRY_MAX_NS
                                                              : ch->backoff_ns * 2;
            c->num_retrying++;
            notify_writer(c, 0);          /* recompute its wake-up */
        } else {
            if (code < FB_NET_ERR_PRODUCER_FAILED || code > FB_NET_ERR_REFUSED)
                code = FB_NET_ERR_REFUSED;
            inchan_fail_locked(c, ch, code, type, msg);
        }
    }
    pthread_mutex_unlock(&c->mu);
    return 0;
}

static int read_partition_request(fb_conn_t *c, const fb_wire_frame_t *f)
{
    uint32_t id = f->receiver_id, sub = f->u.request.subpartition;
    int32_t credit = f->u.request.credit;
    uint16_t idl = f->u.request.id_len;
    int rc;
    int32_t slot;
    fb_subpart_t *sp = NULL;
    void *owner = NULL;
    fb_localpool_t *pool = NULL;
    outchan_t *oc;
    char pid[FB_NET_MAX_PARTITION_ID], err[512];
    memcpy(pid, f->u.request.partition_id, idl);
    pthread_mutex_lock(&c->mu);
    /* The peer does not read our answers: the reader thread waits for room
     * (a direct reader left such a request to it, read_step). */
    while (c->nctl >= CTL_MAX && c->state == CONN_OPEN && c->rd_owner == RD_THREAD)
        pthread_cond_wait(&c->cv, &c->mu);
    rc = c->state != CONN_OPEN ? -1
         : idmap_get(&c->out_ids, id) >= 0 ? 1
         : c->nfree_outs == 0 ? 2 : 0;
    if (rc == 1)
        ctl_error(c, id, FB_NET_ERR_REFUSED, "ValueError", "the receiver id is in use");
    else if (rc == 2)
        ctl_error(c, id, FB_NET_ERR_REFUSED, "ValueError",
                  "too many channels on this connection");
    pthread_mutex_unlock(&c->mu);
    if (rc)
        return 0;
    err[0] = '\0';
    rc = c->cb.find_subpartition(c->cb.ctx, pid, idl, sub, &sp, &owner, &pool, err,
                                 sizeof(err));
    pthread_mutex_lock(&c->mu);
    if (rc == 0 && c->state == CONN_OPEN && c->nfree_outs > 0
            && idmap_get(&c->out_ids, id) < 0 && (oc = calloc(1, sizeof(*oc))) != NULL
            && ((oc->ref = fb_owner_ref_new(owner, c->cb.release_owner, c->cb.ctx)) != NULL
                || (free(oc), 0))) {
        slot = c->free_outs[--c->nfree_outs];
        oc->receiver_id = id;
        oc->slot = slot;
        oc->sp = sp;
        oc->owner = owner;
        oc->pool = pool;
        oc->credit = credit;
        oc->event_credit = FB_NET_EVENT_WINDOW;
        oc->lends = c->lend_np != NULL && pool != NULL && pool->net == c->lend_np;
        if (fb_subpart_connect(sp, &c->out, slot) == FB_OK) {
            /* The producer waiting for a buffer of this pool reads this
             * connection itself (pool_wait), if no other connection does. */
            if (pool != NULL && c->direct_reads && c->caller_sends) {
                fb_lender_t w = {pool_wait, conn_hold, conn_release, c};
                oc->pool_waiter = pool->ops->set_waiter(pool, &w);
            }
            c->outs[slot] = oc;
            idmap_put(&c->out_ids, id, slot);
            pthread_mutex_unlock(&c->mu);
            return 0;
        }
        c->free_outs[c->nfree_outs++] = slot;
        free(oc->ref);                /* (its owner reference is dropped below) */
        free(oc);
        rc = FB_NET_ERR_REFUSED;
        snprintf(err, sizeof(err), "subpartition %u of partition %.*s already has a reader "
                 "or was released", sub, (int)(idl > 200 ? 200 : idl), pid);
    } else if (rc == 0) {
        rc = FB_NET_ERR_REFUSED;
        snprintf(err, sizeof(err), "the request cannot be served now");
    }
    if (c->state == CONN_OPEN)
        ctl_error(c, id, rc, rc == FB_NET_ERR_NOT_FOUND ? "PartitionNotFoundError" : "ValueError",
                  err);
    pthread_mutex_unlock(&c->mu);
    if (owner != NULL)
        c->cb.release_owner(c->cb.ctx, owner);
    return 0;
}

/* A credit grant or a cancel for a served channel. */
static int read_credit(fb_conn_t *c, const fb_wire_frame_t *f)
{
    uint8_t msg = f->msg;
    uint32_t id = f->receiver_id;
    int32_t n = f->u.credit, slot;
    int wake = 0;
        pthread_mutex_lock(&c->mu);
    slot = idmap_get(&c->out_ids, id);
    if (slot >= 0) {
        outchan_t *oc = c->outs[slot];
        /* The writer parks a channel only for want of credit: a grant
         * on top of credit it still had changes nothing for it. */
        wake = msg == FB_MSG_CANCEL
               || ((msg == FB_MSG_ADD_CREDIT ? oc->credit : oc->event_credit) <= 0
                   && fb_subpart_size(oc->sp) > 0);
        if (msg == FB_MSG_CANCEL) {
            oc->cancelled = 1;
        } else if (msg == FB_MSG_ADD_EVENT_CREDIT) {
            if ((int64_t)oc->event_credit + n > FB_NET_EVENT_WINDOW) {
                pthread_mutex_unlock(&c->mu);
                return protocol_error(c, "event credit beyond the window on receiver id %u",
                                      id);
            }
            oc->event_credit += n;
        } else if ((int64_t)oc->credit + n > INT32_MAX) {
            pthread_mutex_unlock(&c->mu);
            return protocol_error(c, "credit overflow on receiver id %u", id);
        } else {
            oc->credit += n;
        }
    }
    pthread_mutex_unlock(&c->mu);
    if (wake && c->caller_sends
            && __atomic_load_n(&c->rd_owner, __ATOMIC_RELAXED) == RD_DIRECT) {
        fb_gate_mark(&c->out, slot);   /* a thread reading for itself sends too */
        conn_ready(c);
    } else if (wake) {
        notify_writer(c, slot);
    }
    stat_add(&c->stats.frames_in, 1);
    return 0;
}

/* How long the next partition request must wait within the peer's budget
 * (0: it goes now, and is counted).  A request costs this side a lookup in
 * the caller's code and an answer; a peer that sends more than the budget
 * finds its frames waiting in its socket (GCRA: rq_tat is when the budget
 * is full again). */
static int64_t request_wait_ns(fb_conn_t *c, int64_t now)
{
    const int64_t interval = 1000000000LL / REQUEST_RATE;
    int64_t tat = c->rq_tat > now ? c->rq_tat : now;
    if (tat - now > (int64_t)REQUEST_BURST * interval)
        return tat - now - (int64_t)REQUEST_BURST * interval;
    c->rq_tat = tat + interval;
    return 0;
}

/* Read and act on what the socket has now, as far as the frame at hand
 * goes, without waiting: 1 a frame was handled; 0 the socket has nothing
 * more now (in the middle of a frame, or at its start); RX_YIELD a thread
 * reading on others' behalf (a direct reader) met a partition request it
 * cannot take now (the control queue is full: it leaves it to the reader
 * thread, which waits for room); -1 the connection failed. */
int read_step(fb_conn_t *c)
{
    fb_wire_head_t h;
    fb_wire_frame_t f;
    char err[256];
    int r;
    if (c->rx_phase == RX_BODY)
        return rx_body(c);
    if (c->rx_phase == RX_SKIP)
        return rx_skip(c);
    if ((r = rx_stage(c, FB_NET_HEADER)) <= 0)
        return r;
    if (fb_wire_decode_header(c->rd + c->rd_pos, c->segment_size, &h, err, sizeof(err)) < 0)
        return protocol_error(c, "%s", err);
    if ((r = rx_stage(c, FB_NET_HEADER + (size_t)h.staged)) <= 0)   /* at most RD_CAP */
        return r;
    if (fb_wire_decode_body(&h, c->rd + c->rd_pos + FB_NET_HEADER, &f, err, sizeof(err)) < 0)
        return protocol_error(c, "%s", err);
    if (f.msg == FB_MSG_PARTITION_REQUEST && c->rd_owner == RD_DIRECT
            && __atomic_load_n(&c->nctl, __ATOMIC_RELAXED) >= CTL_MAX)
        return RX_YIELD;
    if (f.msg == FB_MSG_PARTITION_REQUEST) {
        int64_t wait;
        while ((wait = request_wait_ns(c, fb_monotonic_ns())) > 0) {
            struct timespec ts = {0, wait < 1000000 ? (long)wait : 1000000L};
            if (c->rd_owner == RD_DIRECT)
                return RX_YIELD;          /* the reader thread waits, not a consumer */
            if (__atomic_load_n(&c->rd_stop, __ATOMIC_RELAXED))
                return 0;
            nanosleep(&ts, NULL);
        }
    }
    c->rd_pos += FB_NET_HEADER + (size_t)h.staged;  /* f points into the staging buffer */
    switch (f.msg) {
    case FB_MSG_BUFFER:
        return rx_buffer(c, &f);
    case FB_MSG_ERROR:
        r = read_error(c, &f);
        break;
    case FB_MSG_PARTITION_REQUEST:
        r = read_partition_request(c, &f);
        break;
    case FB_MSG_BUFFER_LENT:
        r = read_lent(c, &f);
        break;
    case FB_MSG_RELEASE:
        r = read_release(c, &f);
        break;
    case FB_MSG_CLOSE:
        conn_fail(c, FB_NET_ERR_CONNECTION, "the peer closed the connection");
        return -1;
    default:
        r = read_credit(c, &f);
        break;
    }
    return r < 0 ? -1 : 1;
}

/* Read frames while the socket has them: as read_step, never 1. */
static int read_available(fb_conn_t *c)
{
    int r;
    while ((r = read_step(c)) == 1)
        ;
    return r;
}

/* How long a wait for input may last, in ms for poll (-1: no limit): up to
 * `deadline` (FB_WAIT_FOREVER: none) and, in the middle of a frame, up to
 * the I/O timeout since its last byte came.  0 when the peer stalled. */
int wait_ms(const fb_conn_t *c, int64_t deadline, int64_t now)
{
    int64_t left;
    if (mid_frame(c)) {
        int64_t stall = c->rx_since + (int64_t)c->io_timeout_ms * 1000000;
        if (stall < deadline)
            deadline = stall;
    }
    if (deadline == FB_WAIT_FOREVER)
        return -1;
    left = deadline - now;
    if (left <= 0)
        return 0;
    return left >= (int64_t)INT32_MAX * 1000000 ? INT32_MAX : (int)((left + 999999) / 1000000);
}

/* In the middle of a frame, no byte came for the I/O timeout: 1 (the
 * connection failed). */
int stalled(fb_conn_t *c, int64_t now)
{
    if (!mid_frame(c) || now - c->rx_since < (int64_t)c->io_timeout_ms * 1000000)
        return 0;
    conn_fail(c, FB_NET_ERR_CONNECTION,
              "the peer stalled in the middle of a frame for %d ms", c->io_timeout_ms);
    return 1;
}

/* A whole frame (or a header the decoder refuses) is staged. */
int frame_staged(const fb_conn_t *c)
{
    size_t have = c->rd_end - c->rd_pos;
    uint32_t len;
    if (have < FB_NET_HEADER)
        return 0;
    len = fb_wire_frame_length(c->rd + c->rd_pos);
    return have >= len || len < FB_NET_HEADER;
}

/* Give the socket's read right back (rd_mu held by the caller, and
 * released here).  After the connection ended, the last holder drops the
 * frame half read. */
void rd_give_back(fb_conn_t *c)
{
    int drop = c->rd_stop;
    if (drop)
        __atomic_store_n(&c->rd_owner, RD_CLEANUP, __ATOMIC_RELAXED);
    else
        __atomic_store_n(&c->rd_owner, RD_NONE, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&c->rd_mu);
    if (!drop)
        return;
    rx_drop(c);
    pthread_mutex_lock(&c->rd_mu);
    __atomic_store_n(&c->rd_owner, RD_NONE, __ATOMIC_RELAXED);
    pthread_cond_broadcast(&c->rd_done_cv);
    pthread_mutex_unlock(&c->rd_mu);
}

/* Wait up to ms (-1: no limit) for input on the socket or a wake-up on the
 * eventfd wake_fd (drained): poll's result. */
int poll_input(fb_conn_t *c, int wake_fd, int ms)
{
    return c->t->ops->wait(c->t, FB_TRANSPORT_READABLE, wake_fd, ms);
}

/* The reader thread's loop, until the connection ends. */
static void reader_loop(fb_conn_t *c)
{
    int64_t now;
    int r, ms;
    for (;;) {
        pthread_mutex_lock(&c->rd_mu);
        for (;;) {
            if (c->rd_stop && c->rd_owner == RD_NONE) {
                /* The frame half read goes (a thread reading now drops it
                 * itself as it gives the socket back). */
                __atomic_store_n(&c->rd_owner, RD_THREAD, __ATOMIC_RELAXED);
                rd_give_back(c);
                return;
            }
            if (c->rd_stop) {
                pthread_mutex_unlock(&c->rd_mu);
                return;
            }
            if (c->rd_owner == RD_NONE && fb_monotonic_ns() >= c->rd_lent_until)
                break;
            fb_cond_wait_until(&c->rd_cv, &c->rd_mu, c->rd_owner == RD_NONE
                               ? c->rd_lent_until : fb_monotonic_ns() + RD_LEND_NS);
        }
        __atomic_store_n(&c->rd_owner, RD_THREAD, __ATOMIC_RELAXED);
        pthread_mutex_unlock(&c->rd_mu);
        if (control_waits(c))
            notify_writer(c, 0);         /* what a consumer left for its next read */
        r = read_available(c);
        /* In the middle of a frame the rest is coming: wait for it holding
         * the socket (a closing channel's abort and a shutdown wake this). */
        while (r == 0 && mid_frame(c) && !__atomic_load_n(&c->rd_stop, __ATOMIC_RELAXED)
               && !stalled(c, now = fb_monotonic_ns())) {
            if (poll_input(c, c->thread_wake_fd, wait_ms(c, FB_WAIT_FOREVER, now)) < 0
                    && errno != EINTR)
                break;
            r = read_available(c);
        }
        now = fb_monotonic_ns();
        if (r == 0 && stalled(c, now))
            r = -1;
        /* Nothing more now: wait for input without the socket's read right,
         * so that a consumer's thread can take it meanwhile (a shutdown
         * wakes this).  While the socket is lent, no longer than the lend:
         * credit the consumer deferred goes out when the reader thread
         * takes over; in the middle of a frame, no longer than the I/O
         * timeout since its last byte. */
        pthread_mutex_lock(&c->rd_mu);
        ms = wait_ms(c, c->rd_lent_until > now ? c->rd_lent_until : FB_WAIT_FOREVER, now);
        c->rd_thread_polls = r == 0 && ms < 0;
        rd_give_back(c);
        if (r < 0)
            return;
        while (poll_input(c, c->thread_wake_fd, ms) < 0 && errno == EINTR)
            ;
        pthread_mutex_lock(&c->rd_mu);
        c->rd_thread_polls = 0;
        pthread_mutex_unlock(&c->rd_mu);
    }
}

/* After a protocol error the writer sends the error and a CLOSE_REQUEST,
 * then closes the socket; a peer that does not read gets a second for it. */
static void await_close_sent(fb_conn_t *c)
{
    int64_t deadline = fb_deadline_after(1.0);
    int pending;
    pthread_mutex_lock(&c->mu);
    while (c->close_on_send && !c->close_sent && fb_monotonic_ns() < deadline)
        fb_cond_wait_until(&c->cv, &c->mu, deadline);
    pending = c->close_on_send;
    pthread_mutex_unlock(&c->mu);
    if (pending)
        close_socket(c);
}

void *reader_main(void *arg)
{
    fb_conn_t *c = arg;
    reader_loop(c);
    await_close_sent(c);
    return NULL;
}
