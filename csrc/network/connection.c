#define _GNU_SOURCE
#include "network/connection.h"

#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "common/byteorder.h"
#include "common/clock.h"
#include "network/credit.h"
#include "network/wire.h"

#define RD_CAP 65536                /* the reader's staging buffer */
#define READ_AHEAD 2048             /* staged past what is needed: small frames share a recv,
                                       a buffer's body mostly lands straight in its segment */
#define CTL_CAP 65536               /* the writer's control-frame buffer */
#define IDMAP_SIZE (2 * FB_NET_MAX_CHANNELS)
#define NO_ID 0xFFFFFFFFu
#define RETRY_FIRST_NS 50000000LL   /* not-found requests: 50 ms, doubling ... */
#define RETRY_MAX_NS 1000000000LL   /* ... up to 1 s */
#define RX_YIELD 2                  /* read_step: left to the reader thread */
/* Where the frame being read is (c->rx_phase). */
enum { RX_FRAME, RX_BODY, RX_SKIP };
/* Control messages queued for the writer; past this the reader reads no more
 * requests until the writer sent some (a peer that floods us with requests
 * and does not read the answers is held back by TCP, not by our memory). */
#define CTL_MAX (2 * FB_NET_MAX_CHANNELS + 64)

/* In-channel states. */
enum { CH_NEW, CH_REQUESTED, CH_RETRY, CH_FINISHED, CH_FAILED, CH_CLOSED };
/* Connection states. */
enum { CONN_OPEN, CONN_ENDED };
/* Who reads the socket: nobody, the reader thread, or a consumer's thread
 * waiting on its gate (a direct read). */
enum { RD_NONE, RD_THREAD, RD_DIRECT, RD_CLEANUP };
/* After a direct read the reader thread leaves the socket alone this long:
 * the consumer is likely back for its next buffer by then. */
#define RD_LEND_NS 500000

/* ---- receiver id -> slot (linear probing, backward-shift deletion) ------ */

typedef struct idmap {
    uint32_t key[IDMAP_SIZE];   /* NO_ID: empty */
    int32_t slot[IDMAP_SIZE];
} idmap_t;

static inline uint32_t id_home(uint32_t id)
{
    return (id * 2654435761u) & (IDMAP_SIZE - 1);
}

static void idmap_init(idmap_t *m)
{
    size_t i;
    for (i = 0; i < IDMAP_SIZE; i++)
        m->key[i] = NO_ID;
}

static int32_t idmap_get(const idmap_t *m, uint32_t id)
{
    uint32_t i = id_home(id);
    if (id == NO_ID)
        return -1;
    while (m->key[i] != NO_ID) {
        if (m->key[i] == id)
            return m->slot[i];
        i = (i + 1) & (IDMAP_SIZE - 1);
    }
    return -1;
}

/* The table holds at most FB_NET_MAX_CHANNELS keys: never full. */
static void idmap_put(idmap_t *m, uint32_t id, int32_t slot)
{
    uint32_t i = id_home(id);
    while (m->key[i] != NO_ID && m->key[i] != id)
        i = (i + 1) & (IDMAP_SIZE - 1);
    m->key[i] = id;
    m->slot[i] = slot;
}

static void idmap_del(idmap_t *m, uint32_t id)
{
    uint32_t i = id_home(id), j, h;
    while (m->key[i] != id) {
        if (m->key[i] == NO_ID)
            return;
        i = (i + 1) & (IDMAP_SIZE - 1);
    }
    /* Shift back the entries after i whose home is not in (i, j]. */
    for (j = (i + 1) & (IDMAP_SIZE - 1); m->key[j] != NO_ID; j = (j + 1) & (IDMAP_SIZE - 1)) {
        h = id_home(m->key[j]);
        if (((j - h) & (IDMAP_SIZE - 1)) >= ((j - i) & (IDMAP_SIZE - 1))) {
            m->key[i] = m->key[j];
            m->slot[i] = m->slot[j];
            i = j;
        }
    }
    m->key[i] = NO_ID;
}

/* ---- structures ------------------------------------------------------------ */

typedef struct batch batch_t;       /* what the writer sends in one sendmsg */

typedef struct outchan {
    uint32_t receiver_id;
    int32_t slot;
    fb_subpart_t *sp;
    void *owner;
    fb_localpool_t *pool;       /* the partition's pool (NULL: unknown) */
    int pool_waiter;            /* this connection is the pool's waiter (pool_wait) */
    int32_t credit;
    int32_t event_credit;       /* events the reader may still take */
    uint32_t seq;
    int cancelled;
} outchan_t;

typedef struct ctl {
    struct ctl *next;
    uint8_t type;
    uint32_t receiver_id;       /* PARTITION_REQUEST, ADD_*CREDIT: the channel's, read when sent */
    uint32_t len;               /* a prebuilt body (ERROR_RESPONSE) */
    char body[];
} ctl_t;

struct fb_floating {
    pthread_mutex_t mu;
    fb_localpool_t *pool;
    fb_waitlist_t wl;           /* channels that want segments, oldest first */
    int refs;
};

struct fb_inchan {
    fb_conn_t *conn;
    int refs;
    uint32_t receiver_id;
    int32_t slot;
    char partition_id[FB_NET_MAX_PARTITION_ID];
    uint16_t id_len;
    uint32_t subpartition;
    fb_signal_t on_poll;
    fb_subpart_t queue;
    fb_localpool_t *exclusive;
    fb_floating_t *floating;
    /* under conn->mu (cr.wants: under floating->mu) */
    fb_credit_t cr;
    uint32_t next_seq;
    int state;
    int64_t request_deadline, retry_at, backoff_ns;
    int err_code;
    char err_type[FB_NET_MAX_ERROR_TYPE];
    char err_msg[FB_NET_MAX_MESSAGE];
    fb_item_t *failed_items;    /* what the queue held when the channel failed */
    int32_t nfailed_items;
    int64_t buffers_in, bytes_in;
};

struct fb_conn {
    fb_transport_t *t;          /* the byte stream */
    int32_t segment_size;
    int io_timeout_ms;
    fb_conn_callbacks_t cb;
    pthread_mutex_t mu;
    pthread_cond_t cv;           /* recv_busy cleared, close request sent */
    fb_gate_t out;               /* the writer's ready ring: 0 control, 1.. served slots */
    int state;
    int err_code;
    char err_msg[FB_NET_MAX_MESSAGE];
    outchan_t *outs[FB_NET_MAX_CHANNELS + 1];
    int32_t free_outs[FB_NET_MAX_CHANNELS], nfree_outs;
    idmap_t out_ids;
    fb_inchan_t *ins[FB_NET_MAX_CHANNELS];
    int32_t free_ins[FB_NET_MAX_CHANNELS], nfree_ins;
    idmap_t in_ids;
    uint32_t next_receiver_id;
    int32_t num_retrying;
    ctl_t *ctl_head, *ctl_tail;
    int32_t nctl;                /* messages queued */
    int close_queued, close_sent;
    int close_on_send;           /* the socket closes once the CLOSE_REQUEST went */
    fb_inchan_t *recv_busy;      /* the reader receives into this channel's segment */
    int recv_abort;              /* atomic: that channel closes, let go of the segment */
    pthread_t reader, writer;
    int started;
    /* Who writes to the socket: the writer thread, or (caller_sends) a
     * producer's thread whose add found the writer idle.  send_mu is held
     * while a batch is gathered and sent; order: send_mu -> mu.  A batch a
     * producer's thread could not send whole without blocking waits in
     * `pending` (with its control messages in pending_taken) for the
     * writer thread, which sends it before anything else. */
    pthread_mutex_t send_mu;
    int caller_sends;
    fb_gate_hook_t hook;
    batch_t *direct, *pending;
    struct ctl *pending_taken;
    int refs;
    fb_conn_stats_t stats;
    /* the reader's staging buffer */
    char *rd;
    size_t rd_pos, rd_end;
    /* The frame being read, which belongs to the connection, not to the
     * thread that started it (whoever holds the read right goes on). */
    int rx_phase;                /* RX_FRAME: at a frame's start or in its staged part */
    fb_inchan_t *rx_ch;          /* RX_BODY: the channel received into (a reference) ... */
    fb_item_t rx_item;           /* ... and where its body goes */
    int32_t rx_backlog;
    size_t rx_left;              /* RX_BODY, RX_SKIP: body bytes still to come */
    int64_t rx_since;            /* when the last byte came */
    /* The right to read the socket (rd_mu): the reader thread takes it when
     * the socket is readable and nobody has it; a consumer's thread waiting
     * on its gate takes it when it is free, receives what comes itself
     * (no hand-off from the reader thread, no wake-up of it) and, when it
     * leaves with its data, lends the socket for RD_LEND_NS before the
     * reader thread reads it again.  Order: never another lock under rd_mu. */
    pthread_mutex_t rd_mu;
    pthread_cond_t rd_cv;        /* the reader thread parks here */
    pthread_cond_t rd_done_cv;   /* a closer waits here for a direct reader to leave */
    int rd_owner;
    int rd_stop;                 /* the connection ended: nobody reads anymore */
    int direct_reads;            /* consumers may read the socket themselves */
    int64_t rd_lent_until;
    int direct_wake_fd;          /* an eventfd that wakes a direct reader's poll */
    int thread_wake_fd;          /* an eventfd that wakes the reader thread's poll */
    int write_errno;             /* atomic: writing failed as the peer went (conn_write_failed) */
    int rd_thread_polls;         /* the reader thread polls with no time limit */
    /* the writer's control frames */
    char *ctlbuf;
};

static inline void stat_add(int64_t *counter, int64_t n)
{
    __atomic_add_fetch(counter, n, __ATOMIC_RELAXED);
}

/* ---- small helpers ------------------------------------------------------------ */

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

static void copy_text(char *dst, size_t cap, const char *src, size_t n)
{
    if (cap == 0)
        return;
    if (n >= cap)
        n = cap - 1;
    memcpy(dst, src, n);
    dst[n] = '\0';
}

static inline char *segment_of(fb_localpool_t *pool, int32_t index)
{
    return fb_segment_address(pool->net, index);
}

static void notify_writer(fb_conn_t *c, int32_t slot)
{
    fb_gate_notify(&c->out, slot);
}

static void conn_ready(void *arg);
static void conn_hold(void *arg);
static void conn_release(void *arg);
static int pool_wait(void *arg, void *lp, int64_t deadline_ns);

/* Control messages were queued (no lock held): with caller_sends (and `how`
 * 1) this thread sends them now if the writer thread is idle (conn_ready),
 * else (`how` 2) the writer thread is woken. */
static void writer_kick(fb_conn_t *c, int how)
{
    if (c->caller_sends && how == 1) {
        fb_gate_mark(&c->out, 0);
        conn_ready(c);
    } else {
        notify_writer(c, 0);
    }
}

static void inchan_incref(fb_inchan_t *ch)
{
    __atomic_add_fetch(&ch->refs, 1, __ATOMIC_ACQ_REL);
}

/* Free control messages (no lock needed: they are values). */
static void ctl_free_list(ctl_t *m)
{
    ctl_t *next;
    for (; m != NULL; m = next) {
        next = m->next;
        free(m);
    }
}

/* Queue a control message (mu held); the writer sends them in order.  A
 * quiet push leaves waking the writer to the caller, once it has unlocked
 * (woken under mu, the writer would at once block on it). */
static int ctl_push_quiet(fb_conn_t *c, uint8_t type, uint32_t receiver_id, const char *body,
                          uint32_t len, int quiet)
{
    ctl_t *m = malloc(sizeof(ctl_t) + len);
    if (m == NULL)
        return FB_ENOMEM;
    m->next = NULL;
    m->type = type;
    m->receiver_id = receiver_id;
    m->len = len;
    if (len)
        memcpy(m->body, body, len);
    if (c->ctl_tail)
        c->ctl_tail->next = m;
    else
        c->ctl_head = m;
    c->ctl_tail = m;
    c->nctl++;
    if (!quiet)
        notify_writer(c, 0);
    return FB_OK;
}

static int ctl_push(fb_conn_t *c, uint8_t type, uint32_t receiver_id, const char *body,
                    uint32_t len)
{
    return ctl_push_quiet(c, type, receiver_id, body, len, 0);
}

/* An ERROR_RESPONSE body: code, type name, message. */
static int ctl_error(fb_conn_t *c, uint32_t receiver_id, int code, const char *type,
                     const char *msg)
{
    char body[FB_NET_MAX_ERROR_BODY];
    char *end = fb_wire_put_error_body(body, receiver_id, (uint8_t)code, type, strlen(type), msg,
                                       strlen(msg));
    return ctl_push(c, FB_MSG_ERROR, receiver_id, body, (uint32_t)(end - body));
}

/* ---- in-channel credit ---------------------------------------------------------------- */

/* A consumer's thread reads the socket, or did a moment ago (the lend). */
static int consumer_reads(fb_conn_t *c)
{
    return __atomic_load_n(&c->rd_owner, __ATOMIC_RELAXED) == RD_DIRECT
           || fb_monotonic_ns() < __atomic_load_n(&c->rd_lent_until, __ATOMIC_RELAXED);
}

/* Act on a credit decision (mu held): queue the message it calls for.
 * Returns how the caller (unlocked) is to wake the writer (writer_kick), or 0. */
static int credit_act(fb_conn_t *c, fb_inchan_t *ch, fb_credit_action_t a, uint8_t msg)
{
    if (a == FB_CREDIT_NOTHING)
        return 0;
    if (a == FB_CREDIT_SEND_QUEUED)
        return 1;
    if (ctl_push_quiet(c, msg, ch->receiver_id, NULL, 0, 1) != FB_OK) {
        if (msg == FB_MSG_ADD_CREDIT)
            fb_credit_unqueue(&ch->cr);
        else
            fb_credit_event_unqueue(&ch->cr);
        return 0;
    }
    return a == FB_CREDIT_DEFER ? 0 : a == FB_CREDIT_BATCH ? 2 : 1;
}

static inline int holds_buffers(const fb_inchan_t *ch)
{
    return ch->state == CH_NEW || ch->state == CH_REQUESTED || ch->state == CH_RETRY;
}

/* The channel reads, and its credit may be announced now (mu held). */
static inline int credit_open(const fb_conn_t *c, const fb_inchan_t *ch)
{
    return ch->state == CH_REQUESTED && c->state == CONN_OPEN;
}

/* A segment (exclusive, or floating) for `ch` to hold for its sender, as
 * one more credit, while the channel still reads (no lock held): 1 if the
 * channel took it. */
static int hold_for_sender(fb_inchan_t *ch, int32_t index, int floating)
{
    fb_conn_t *c = ch->conn;
    int kept = 0, wake = 0;
    pthread_mutex_lock(&c->mu);
    if (holds_buffers(ch) && fb_credit_hold(&ch->cr, index, floating)) {
        wake = credit_act(c, ch, fb_credit_announce(&ch->cr, credit_open(c, ch),
                                                    consumer_reads(c)), FB_MSG_ADD_CREDIT);
        kept = 1;
    }
    pthread_mutex_unlock(&c->mu);
    if (wake)
        writer_kick(c, wake);
    return kept;
}

/* An exclusive segment recycled by the consumer goes back to its channel. */
static int exclusive_hook(void *arg, fb_localpool_t *lp, int32_t index)
{
    (void)lp;
    return hold_for_sender(arg, index, 0);
}

static inline fb_inchan_t *inchan_of(fb_credit_t *cr)
{
    return (fb_inchan_t *)((char *)cr - offsetof(fb_inchan_t, cr));
}

/* A floating segment recycled by a consumer: lent to the channel that has
 * waited longest, or back to the gate's pool. */
static int floating_hook(void *arg, fb_localpool_t *lp, int32_t index)
{
    fb_floating_t *f = arg;
    fb_credit_t *cr;
    fb_inchan_t *ch;
    int kept;
    (void)lp;
    for (;;) {
        pthread_mutex_lock(&f->mu);
        cr = fb_waitlist_pop(&f->wl);
        ch = cr != NULL ? inchan_of(cr) : NULL;
        if (ch != NULL)
            inchan_incref(ch);      /* a channel on the list is alive (its close removes it) */
        pthread_mutex_unlock(&f->mu);
        if (ch == NULL)
            return 0;
        kept = hold_for_sender(ch, index, 1);
        fb_inchan_decref(ch);
        if (kept)
            return 1;
    }
}

/* The sender has `backlog` buffers more: hold backlog + exclusive buffers for
 * it, borrowing floating ones (no lock held). */
static void want_buffers(fb_inchan_t *ch, int32_t backlog)
{
    fb_conn_t *c = ch->conn;
    fb_floating_t *f = ch->floating;
    int32_t need, index;
    int take;
    if (f == NULL || backlog <= 0)
        return;
    pthread_mutex_lock(&c->mu);
    need = holds_buffers(ch) ? fb_credit_need(&ch->cr, backlog) : 0;
    pthread_mutex_unlock(&c->mu);
    if (need <= 0)
        return;
    pthread_mutex_lock(&f->mu);
    take = fb_waitlist_want(&f->wl, &ch->cr, need) == FB_OK;
    pthread_mutex_unlock(&f->mu);
    /* Registered first, then asked the pool: a recycle in between finds us
     * waiting, so no buffer goes back to the pool unnoticed. */
    while (take) {
        pthread_mutex_lock(&f->mu);
        take = ch->cr.wants > 0;
        pthread_mutex_unlock(&f->mu);
        if (!take || f->pool->ops->request(f->pool, FB_NO_CHANNEL, &index) != FB_OK)
            return;
        pthread_mutex_lock(&f->mu);
        take = fb_waitlist_took(&f->wl, &ch->cr);
        pthread_mutex_unlock(&f->mu);
        if (!take || !hold_for_sender(ch, index, 1)) {
            f->pool->ops->recycle(f->pool, index);     /* to whoever waits, or the pool */
            return;
        }
    }
}

/* ---- failing and ending channels ------------------------------------------------------ */

/* Fail an in-channel (mu held): its consumer raises.  What the channel holds
 * (buffers for the sender, items not read) stays with it until its close,
 * which runs in the consumer's thread while the pools are certainly alive:
 * given back from here, it could reach a pool the consumer, woken by the
 * failure, has freed meanwhile. */
static void inchan_fail_locked(fb_conn_t *c, fb_inchan_t *ch, int code, const char *type,
                               const char *msg)
{
    if (!holds_buffers(ch))
        return;
    if (ch->state == CH_RETRY)
        c->num_retrying--;
    ch->state = CH_FAILED;
    ch->err_code = code;
    copy_text(ch->err_type, sizeof(ch->err_type), type, strlen(type));
    copy_text(ch->err_msg, sizeof(ch->err_msg), msg, strlen(msg));
    ch->nfailed_items = fb_subpart_terminate(&ch->queue, FB_SP_FAILED, &ch->failed_items);
}

static void outchan_free_slot(fb_conn_t *c, outchan_t *oc)
{
    idmap_del(&c->out_ids, oc->receiver_id);
    c->outs[oc->slot] = NULL;
    c->free_outs[c->nfree_outs++] = oc->slot;
}

/* End a served channel whose slot was freed (no lock held): the reader over
 * there is gone, so the subpartition is released (`release`), or it was
 * read to the end; either way the owner reference goes. */
static void outchan_end(fb_conn_t *c, outchan_t *oc, int release)
{
    fb_item_t *items = NULL;
    int32_t n;
    fb_subpart_disconnect(oc->sp, &c->out);
    if (oc->pool_waiter)
        oc->pool->ops->clear_waiter(oc->pool, c);
    if (release) {
        n = fb_subpart_terminate(oc->sp, FB_SP_RELEASED, &items);
        if (n > 0)
            fb_items_dispose(items, n);
    }
    c->cb.release_owner(c->cb.ctx, oc->owner);
    free(oc);
}

/* The connection ended (any thread, no lock held): every channel on it
 * fails or ends, the socket shuts down, the writer wakes. */
/* The socket goes: both directions shut, the writer stops.  Idempotent. */
static void close_socket(fb_conn_t *c)
{
    c->t->ops->shutdown(c->t);
    fb_gate_close(&c->out);
}

/* End the connection (if it is open) with why: every in-channel fails,
 * nobody reads any more.  1 if this ended it and the socket stays open for
 * the writer to send what is queued (close_on_send): it closes the socket
 * once the CLOSE_REQUEST went (finish_batch). */
static int conn_end(fb_conn_t *c, int code, const char *msg)
{
    int32_t k;
    int deferred;
    uint64_t one = 1;
    pthread_mutex_lock(&c->mu);
    if (c->state != CONN_OPEN) {
        pthread_mutex_unlock(&c->mu);
        return 0;
    }
    c->state = CONN_ENDED;
    c->err_code = code;
    copy_text(c->err_msg, sizeof(c->err_msg), msg, strlen(msg));
    for (k = 0; k < FB_NET_MAX_CHANNELS; k++)
        if (c->ins[k] != NULL)
            inchan_fail_locked(c, c->ins[k], code, "", msg);
    /* The served channels end in the writer thread as it stops (it may be
     * sending their segments now: their owners must outlive that). */
    deferred = c->close_on_send && !c->close_sent;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    pthread_mutex_lock(&c->rd_mu);
    __atomic_store_n(&c->rd_stop, 1, __ATOMIC_RELAXED);   /* (read unlocked by a reader mid-frame) */
    pthread_cond_broadcast(&c->rd_cv);
    pthread_cond_broadcast(&c->rd_done_cv);
    if (deferred) {           /* no shutdown wakes the polls: these do */
        (void)!write(c->thread_wake_fd, &one, sizeof(one));
        (void)!write(c->direct_wake_fd, &one, sizeof(one));
    }
    pthread_mutex_unlock(&c->rd_mu);
    return deferred;
}

/* An error and a CLOSE_REQUEST are still to go before the socket closes
 * (the writer closes it once they went, the reader thread a second later). */
static int close_pending(fb_conn_t *c)
{
    int pending;
    pthread_mutex_lock(&c->mu);
    pending = c->close_on_send && !c->close_sent;
    pthread_mutex_unlock(&c->mu);
    return pending;
}

static void conn_fail(fb_conn_t *c, int code, const char *fmt, ...)
{
    char msg[FB_NET_MAX_MESSAGE];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (!conn_end(c, code, msg) && !close_pending(c))
        close_socket(c);
}

static void conn_write_failed(fb_conn_t *c, int err)
{
    uint64_t one = 1;
    if (err != EPIPE && err != ECONNRESET && err != ENOTCONN) {
        conn_fail(c, FB_NET_ERR_CONNECTION, "writing to the connection failed: %s",
                  strerror(err));
        return;
    }
    if (__atomic_exchange_n(&c->write_errno, err, __ATOMIC_ACQ_REL) != 0)
        return;
    pthread_mutex_lock(&c->rd_mu);
    __atomic_store_n(&c->rd_lent_until, 0, __ATOMIC_RELAXED);
    pthread_cond_broadcast(&c->rd_cv);
    if (!c->rd_stop)
        (void)!write(c->thread_wake_fd, &one, sizeof(one));
    pthread_mutex_unlock(&c->rd_mu);
}

static int write_failed(fb_conn_t *c)
{
    return __atomic_load_n(&c->write_errno, __ATOMIC_ACQUIRE) != 0;
}

/* The peer closed the connection (a read found the end of the stream). */
static void conn_fail_peer_closed(fb_conn_t *c, int mid_frame)
{
    int err = __atomic_load_n(&c->write_errno, __ATOMIC_ACQUIRE);
    conn_fail(c, FB_NET_ERR_CONNECTION, "the peer closed the connection%s%s%s",
              mid_frame ? " in the middle of a frame" : "",
              err ? " (and writing to it failed: " : "", err ? strerror(err) : "");
}

/* End every served channel left (the connection ended and the writer is not
 * sending anymore): their readers are gone, so their subpartitions are
 * released. */
static int flush_pending(fb_conn_t *c, int send);

static void end_served_channels(fb_conn_t *c)
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

/* ---- the reader -------------------------------------------------------------------- */

/* Every receive is non-blocking: a thread that would wait for input waits in
 * its own poll (reader_main, read_until), beside its own wake-up, and a frame
 * half read stays with the connection (c->rx, the staging buffer) for
 * whoever reads next. */

static inline int mid_frame(const fb_conn_t *c)
{
    return c->rx_phase != RX_FRAME || c->rd_end > c->rd_pos;
}

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
static int protocol_error(fb_conn_t *c, const char *fmt, ...)
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

static int32_t in_lookup(fb_conn_t *c, uint32_t id)
{
    return idmap_get(&c->in_ids, id);
}

/* The channel a BUFFER_RESPONSE is for, with a reference and marked as
 * being received into, and where its body goes (*item); NULL with *rc 0 to
 * drop the body (a channel that ended), or with *rc -1 on a protocol error. */
static fb_inchan_t *buffer_target(fb_conn_t *c, uint32_t id, uint32_t seq, uint8_t type,
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
static void buffer_deliver(fb_conn_t *c, fb_inchan_t *ch, fb_item_t *item, int received,
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
            && idmap_get(&c->out_ids, id) < 0 && (oc = calloc(1, sizeof(*oc))) != NULL) {
        slot = c->free_outs[--c->nfree_outs];
        oc->receiver_id = id;
        oc->slot = slot;
        oc->sp = sp;
        oc->owner = owner;
        oc->pool = pool;
        oc->credit = credit;
        oc->event_credit = FB_NET_EVENT_WINDOW;
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

/* Read and act on what the socket has now, as far as the frame at hand
 * goes, without waiting: 1 a frame was handled; 0 the socket has nothing
 * more now (in the middle of a frame, or at its start); RX_YIELD a thread
 * reading on others' behalf (a direct reader) met a partition request it
 * cannot take now (the control queue is full: it leaves it to the reader
 * thread, which waits for room); -1 the connection failed. */
static int read_step(fb_conn_t *c)
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
static int wait_ms(const fb_conn_t *c, int64_t deadline, int64_t now)
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
static int stalled(fb_conn_t *c, int64_t now)
{
    if (!mid_frame(c) || now - c->rx_since < (int64_t)c->io_timeout_ms * 1000000)
        return 0;
    conn_fail(c, FB_NET_ERR_CONNECTION,
              "the peer stalled in the middle of a frame for %d ms", c->io_timeout_ms);
    return 1;
}

/* A whole frame (or a header the decoder refuses) is staged. */
static int frame_staged(const fb_conn_t *c)
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
static void rd_give_back(fb_conn_t *c)
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
static int poll_input(fb_conn_t *c, int wake_fd, int ms)
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
        if (__atomic_load_n(&c->nctl, __ATOMIC_RELAXED) > 0)
            notify_writer(c, 0);         /* credit a consumer left for its next read */
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

static void *reader_main(void *arg)
{
    fb_conn_t *c = arg;
    reader_loop(c);
    await_close_sent(c);
    return NULL;
}

static void direct_wake(void *arg)
{
    fb_conn_t *c = arg;
    uint64_t one = 1;
    (void)!write(c->direct_wake_fd, &one, sizeof(one));
}

/* What a thread reading the socket for itself waits for: its gate to have
 * data, or its pool a buffer (begin registers the wake, as in exchange.h). */
typedef struct waiting {
    int (*begin)(void *target, void (*wake)(void *), void *arg);
    void (*end)(void *target);
    int (*ready)(void *target);
    void *target;
} waiting_t;

/* This thread reads the connection itself while nobody else does, until
 * `w` is ready or the deadline passes: every frame it reads is handled as
 * the reader thread would handle it (buffers for any channel, credit and
 * requests for served partitions, whose sends it makes itself), and adds
 * from other threads wake it through direct_wake_fd.  It never waits on
 * the connection past its own deadline: a frame half read when it leaves
 * stays with the connection for the reader thread, and a request that
 * would wait for room in the control queue is left to the reader thread
 * too.  When it leaves with data it lends the socket for RD_LEND_NS.  1 if
 * it waited or read, 0 if the socket was not free (or was handed back at
 * once: the caller sleeps on its own condition then). */
static int read_until(fb_conn_t *c, const waiting_t *w, int64_t deadline_ns)
{
    int served = 0, r = 0, ms;
    int64_t now;
    pthread_mutex_lock(&c->rd_mu);
    if (c->rd_stop || c->rd_owner != RD_NONE || !c->direct_reads) {
        pthread_mutex_unlock(&c->rd_mu);
        return 0;
    }
    __atomic_store_n(&c->rd_owner, RD_DIRECT, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&c->rd_mu);
    if (!w->begin(w->target, direct_wake, c)) {
        served = 1;
        for (;;) {
            if ((r = read_step(c)) == 1) {
                stat_add(&c->stats.frames_in_direct, 1);
                if (w->ready(w->target))
                    break;
                continue;
            }
            if (r != 0)
                break;
            now = fb_monotonic_ns();
            if (now >= deadline_ns || stalled(c, now))
                break;
            if (__atomic_load_n(&c->nctl, __ATOMIC_RELAXED) > 0 && c->caller_sends) {
                fb_gate_mark(&c->out, 0);  /* deferred credit goes out before the wait */
                conn_ready(c);
            }
            ms = wait_ms(c, deadline_ns, now);
            if (poll_input(c, c->direct_wake_fd, ms) < 0 && errno != EINTR)
                break;
            if (w->ready(w->target))
                break;
        }
        /* A frame staged whole would wait for no input: the reader thread
         * would not see it.  What is staged now is a frame's start only. */
        while (r >= 0 && r != RX_YIELD && c->rx_phase == RX_FRAME && frame_staged(c))
            if ((r = read_step(c)) == 1)
                stat_add(&c->stats.frames_in_direct, 1);
    }
    w->end(w->target);
    pthread_mutex_lock(&c->rd_mu);
    if (r == RX_YIELD)
        served = 0;
    if (served)
        __atomic_store_n(&c->rd_lent_until, fb_monotonic_ns() + RD_LEND_NS, __ATOMIC_RELAXED);
    if ((served || r == RX_YIELD) && c->rd_thread_polls) {
        /* with no time limit: let it see the lend, or take over */
        uint64_t one = 1;
        c->rd_thread_polls = 0;
        /* under rd_mu: a close waits for it before the descriptor goes */
        (void)!write(c->thread_wake_fd, &one, sizeof(one));
    }
    rd_give_back(c);
    return served;
}

static int gate_begin(void *g, void (*wake)(void *), void *arg)
{
    return fb_gate_direct_begin(g, wake, arg);
}

static void gate_end(void *g)
{
    fb_gate_direct_end(g);
}

static int gate_ready(void *g)
{
    return fb_gate_ready(g);
}

/* The lender of a remote channel's gate (fb_lender_t.serve): the
 * consumer's thread, waiting for its gate, receives from the connection
 * itself (read_until). */
static int direct_read(void *arg, void *g, int64_t deadline_ns)
{
    fb_inchan_t *ch = arg;
    waiting_t w = {gate_begin, gate_end, gate_ready, g};
    return read_until(ch->conn, &w, deadline_ns);
}

static int pool_begin(void *lp, void (*wake)(void *), void *arg)
{
    return ((fb_localpool_t *)lp)->ops->direct_begin(lp, wake, arg);
}

static void pool_end(void *lp)
{
    ((fb_localpool_t *)lp)->ops->direct_end(lp);
}

static int pool_ready(void *lp)
{
    return ((fb_localpool_t *)lp)->ops->ready(lp);
}

/* The lender of a served partition's pool (fb_lender_t.serve): a producer
 * waiting for a buffer reads the connection itself (read_until), so that
 * credit arrives, and the buffers go out and come back, in its own thread. */
static int pool_wait(void *arg, void *lp, int64_t deadline_ns)
{
    waiting_t w = {pool_begin, pool_end, pool_ready, lp};
    return read_until(arg, &w, deadline_ns);
}

/* ---- the writer ------------------------------------------------------------------------ */

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
    char hdr[FB_NET_HEADER + FB_NET_BUFFER_FIELDS];
    fb_item_t item;
    outchan_t *ended;           /* the channel this frame ends (its last item), or NULL */
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
    while ((m = c->ctl_head) != NULL) {
        if ((size_t)(p - c->ctlbuf) + FB_NET_MAX_CONTROL_FRAME + m->len > CTL_CAP) {
            notify_writer(c, 0);             /* the rest in the next batch */
            b->ctl_full = 1;
            break;
        }
        c->ctl_head = m->next;
        if (c->ctl_head == NULL)
            c->ctl_tail = NULL;
        if (c->nctl-- >= CTL_MAX)
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
    rc = fb_subpart_poll_credit(oc->sp, oc->credit, oc->event_credit, &fr->item, &last);
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
    if (fr->item.kind == FB_ITEM_DATA)
        oc->credit--;
    else
        oc->event_credit--;
    fb_wire_put_buffer(fr->hdr, oc->receiver_id, oc->seq++, fb_subpart_backlog(oc->sp),
                       fr->item.kind == FB_ITEM_DATA ? FB_WIRE_DATA : FB_WIRE_EVENT,
                       (uint32_t)fr->item.size);
    fr->ended = NULL;
    if (last) {                      /* its last item: the channel ends once it is sent */
        outchan_free_slot(c, oc);
        fr->ended = oc;
    }
    pthread_mutex_unlock(&c->mu);
    b->nframes++;
    batch_iov(b, fr->hdr, sizeof(fr->hdr));
    if (fr->item.size)
        batch_iov(b, fr->item.data, (size_t)fr->item.size);
}

/* Send the batch (one sendmsg when the socket takes it), then give the sent
 * segments back and end the channels whose last item went. */
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

/* The gate hook (caller_sends): a producer's add made a served subpartition
 * ready.  If the writer thread is idle, this thread sends what is ready
 * itself, without blocking (it may hold the GIL): no hand-off to the writer
 * thread and no wake-up of it.  Otherwise, or if the socket would block,
 * the writer thread is woken to do it. */
static void conn_ready(void *arg)
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

static void conn_hold(void *arg)
{
    fb_conn_incref(arg);
}

static void conn_release(void *arg)
{
    fb_conn_decref(arg);
}

/* The writer thread: wait for a ready slot, gather a batch, send it. */
static void *writer_main(void *arg)
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

/* ---- connection lifecycle --------------------------------------------------------------- */

fb_conn_t *fb_conn_new(fb_transport_t *t, int32_t segment_size, const fb_conn_callbacks_t *cb,
                       double io_timeout)
{
    fb_conn_t *c = calloc(1, sizeof(*c));
    int32_t k;
    if (c == NULL) {
        t->ops->destroy(t);
        return NULL;
    }
    c->rd = malloc(RD_CAP);
    c->ctlbuf = malloc(CTL_CAP);
    c->direct_wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    c->thread_wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (c->rd == NULL || c->ctlbuf == NULL || c->direct_wake_fd < 0
            || c->thread_wake_fd < 0
            || fb_gate_init(&c->out, FB_NET_MAX_CHANNELS + 1) != FB_OK)
        goto fail;
    c->direct = malloc(sizeof(batch_t));
    if (c->direct == NULL)
        goto fail_gate;
    if (pthread_mutex_init(&c->mu, NULL) != 0)
        goto fail_gate;
    if (pthread_mutex_init(&c->send_mu, NULL) != 0) {
        pthread_mutex_destroy(&c->mu);
        goto fail_gate;
    }
    if (fb_cond_init(&c->cv) != 0) {
        pthread_mutex_destroy(&c->send_mu);
        pthread_mutex_destroy(&c->mu);
        goto fail_gate;
    }
    if (pthread_mutex_init(&c->rd_mu, NULL) != 0 || fb_cond_init(&c->rd_cv) != 0
            || fb_cond_init(&c->rd_done_cv) != 0) {
        /* (none of these fails on Linux with default attributes) */
        pthread_cond_destroy(&c->cv);
        pthread_mutex_destroy(&c->send_mu);
        pthread_mutex_destroy(&c->mu);
        goto fail_gate;
    }
    c->direct_reads = 1;
    c->t = t;
    c->segment_size = segment_size;
    c->io_timeout_ms = io_timeout > 0 && io_timeout < 2e6 ? (int)(io_timeout * 1000) : 2000000000;
    c->cb = *cb;
    c->refs = 1;
    c->next_receiver_id = 1;
    for (k = 0; k < FB_NET_MAX_CHANNELS; k++) {
        c->free_outs[k] = FB_NET_MAX_CHANNELS - k;     /* slots 1..MAX, lowest first */
        c->free_ins[k] = FB_NET_MAX_CHANNELS - 1 - k;
    }
    c->nfree_outs = c->nfree_ins = FB_NET_MAX_CHANNELS;
    idmap_init(&c->out_ids);
    idmap_init(&c->in_ids);
    return c;
fail_gate:
    free(c->direct);
    fb_gate_free(&c->out);
fail:
    if (c->direct_wake_fd >= 0)
        close(c->direct_wake_fd);
    if (c->thread_wake_fd >= 0)
        close(c->thread_wake_fd);
    free(c->rd);
    free(c->ctlbuf);
    free(c);
    t->ops->destroy(t);
    return NULL;
}

void fb_conn_set_direct_reads(fb_conn_t *c, int on)
{
    pthread_mutex_lock(&c->rd_mu);
    c->direct_reads = on;
    pthread_mutex_unlock(&c->rd_mu);
}

void fb_conn_set_caller_sends(fb_conn_t *c, int on)
{
    c->caller_sends = on != 0;
    c->hook.ready = conn_ready;
    c->hook.hold = conn_hold;
    c->hook.release = conn_release;
    c->hook.arg = c;
    c->out.hook = on ? &c->hook : NULL;
}

int fb_conn_start(fb_conn_t *c)
{
    if (pthread_create(&c->reader, NULL, reader_main, c) != 0)
        return FB_ENOMEM;
    if (pthread_create(&c->writer, NULL, writer_main, c) != 0) {
        conn_fail(c, FB_NET_ERR_CLOSED, "cannot start the connection's threads");
        pthread_join(c->reader, NULL);
        return FB_ENOMEM;
    }
    c->started = 1;
    return FB_OK;
}

void fb_conn_close(fb_conn_t *c)
{
    int64_t deadline;
    pthread_mutex_lock(&c->mu);
    if (c->state == CONN_OPEN && c->started && !c->close_queued) {
        c->close_queued = 1;
        ctl_push(c, FB_MSG_CLOSE, 0, NULL, 0);
        deadline = fb_deadline_after(1.0);
        while (!c->close_sent && c->state == CONN_OPEN && fb_monotonic_ns() < deadline)
            fb_cond_wait_until(&c->cv, &c->mu, deadline);
    }
    pthread_mutex_unlock(&c->mu);
    conn_fail(c, FB_NET_ERR_CLOSED, "the connection was closed");
    if (c->started) {
        pthread_join(c->reader, NULL);
        pthread_join(c->writer, NULL);
        c->started = 0;
    }
    pthread_mutex_lock(&c->rd_mu);          /* a consumer's thread reading it leaves */
    while (c->rd_owner != RD_NONE)
        pthread_cond_wait(&c->rd_done_cv, &c->rd_mu);
    pthread_mutex_unlock(&c->rd_mu);
    end_served_channels(c);     /* the writer ended them, unless it never ran */
    if (c->direct_wake_fd >= 0) {  /* the threads are gone: the descriptors go now */
        c->t->ops->close(c->t);
        close(c->direct_wake_fd);
        c->direct_wake_fd = -1;
        close(c->thread_wake_fd);
        c->thread_wake_fd = -1;
    }
}

void fb_conn_incref(fb_conn_t *c)
{
    __atomic_add_fetch(&c->refs, 1, __ATOMIC_ACQ_REL);
}

void fb_conn_decref(fb_conn_t *c)
{
    if (__atomic_sub_fetch(&c->refs, 1, __ATOMIC_ACQ_REL) != 0)
        return;
    fb_conn_close(c);
    ctl_free_list(c->ctl_head);     /* holds no channel: a channel holds this connection */
    fb_gate_free(&c->out);
    pthread_cond_destroy(&c->cv);
    pthread_cond_destroy(&c->rd_cv);
    pthread_cond_destroy(&c->rd_done_cv);
    pthread_mutex_destroy(&c->rd_mu);
    pthread_mutex_destroy(&c->send_mu);
    pthread_mutex_destroy(&c->mu);
    c->t->ops->destroy(c->t);
    free(c->direct);
    free(c->rd);
    free(c->ctlbuf);
    free(c);
}

int fb_conn_is_open(fb_conn_t *c)
{
    int open;
    pthread_mutex_lock(&c->mu);
    open = c->state == CONN_OPEN;
    pthread_mutex_unlock(&c->mu);
    return open;
}

int fb_conn_error(fb_conn_t *c, char *buf, size_t len)
{
    int code;
    pthread_mutex_lock(&c->mu);
    code = c->state == CONN_OPEN ? 0 : c->err_code;
    copy_text(buf, len, c->err_msg, strlen(c->err_msg));
    pthread_mutex_unlock(&c->mu);
    return code;
}

void fb_conn_stats(fb_conn_t *c, fb_conn_stats_t *out)
{
    out->bytes_in = __atomic_load_n(&c->stats.bytes_in, __ATOMIC_RELAXED);
    out->bytes_out = __atomic_load_n(&c->stats.bytes_out, __ATOMIC_RELAXED);
    out->frames_in = __atomic_load_n(&c->stats.frames_in, __ATOMIC_RELAXED);
    out->frames_out = __atomic_load_n(&c->stats.frames_out, __ATOMIC_RELAXED);
    out->buffers_in = __atomic_load_n(&c->stats.buffers_in, __ATOMIC_RELAXED);
    out->buffers_out = __atomic_load_n(&c->stats.buffers_out, __ATOMIC_RELAXED);
    out->frames_in_direct = __atomic_load_n(&c->stats.frames_in_direct, __ATOMIC_RELAXED);
}

int32_t fb_conn_num_channels(fb_conn_t *c)
{
    int32_t n;
    pthread_mutex_lock(&c->mu);
    n = 2 * FB_NET_MAX_CHANNELS - c->nfree_ins - c->nfree_outs;
    pthread_mutex_unlock(&c->mu);
    return n;
}

/* ---- floating buffers ------------------------------------------------------------------------ */

fb_floating_t *fb_floating_new(fb_localpool_t *pool)
{
    fb_floating_t *f = calloc(1, sizeof(*f));
    if (f == NULL)
        return NULL;
    if (pthread_mutex_init(&f->mu, NULL) != 0) {
        free(f);
        return NULL;
    }
    f->pool = pool;
    f->refs = 1;
    pool->ops->set_recycle_hook(pool, floating_hook, f);
    return f;
}

static void floating_incref(fb_floating_t *f)
{
    __atomic_add_fetch(&f->refs, 1, __ATOMIC_ACQ_REL);
}

void fb_floating_detach(fb_floating_t *f)
{
    fb_localpool_t *pool = f->pool;
    pool->ops->set_recycle_hook(pool, NULL, NULL);
}

void fb_floating_decref(fb_floating_t *f)
{
    if (f == NULL || __atomic_sub_fetch(&f->refs, 1, __ATOMIC_ACQ_REL) != 0)
        return;
    pthread_mutex_destroy(&f->mu);
    fb_waitlist_free(&f->wl);
    free(f);
}

/* ---- in-channels ------------------------------------------------------------------------------ */

fb_inchan_t *fb_inchan_new(fb_conn_t *c, const char *partition_id, size_t len,
                           uint32_t subpartition, fb_localpool_t *exclusive,
                           fb_floating_t *floating, int64_t request_deadline_ns)
{
    fb_inchan_t *ch;
    int64_t cap;
    if (len > FB_NET_MAX_PARTITION_ID)
        return NULL;
    ch = calloc(1, sizeof(*ch));
    if (ch == NULL)
        return NULL;
    cap = (int64_t)exclusive->max_buffers + (floating != NULL ? floating->pool->max_buffers : 0);
    if (cap > 1 << 20 || cap < 1)
        cap = 1 << 20;                /* unbounded pools: more than a channel can hold */
    if (fb_credit_init(&ch->cr, (int32_t)cap) != FB_OK
            || fb_signal_init(&ch->on_poll) != FB_OK)
        goto fail;
    if (fb_subpart_init(&ch->queue, &ch->on_poll) != FB_OK) {
        fb_signal_free(&ch->on_poll);
        goto fail;
    }
    memcpy(ch->partition_id, partition_id, len);
    ch->id_len = (uint16_t)len;
    ch->subpartition = subpartition;
    ch->exclusive = exclusive;
    ch->floating = floating;
    if (floating)
        floating_incref(floating);
    ch->conn = c;
    fb_conn_incref(c);
    ch->refs = 1;
    ch->slot = -1;
    ch->state = CH_NEW;
    ch->request_deadline = request_deadline_ns;
    ch->backoff_ns = RETRY_FIRST_NS;
    return ch;
fail:
    fb_credit_free(&ch->cr);
    free(ch);
    return NULL;
}

int fb_inchan_add_exclusive(fb_inchan_t *ch, int32_t index)
{
    int rc = FB_OK;
    pthread_mutex_lock(&ch->conn->mu);
    rc = ch->state != CH_NEW ? FB_ESTATE : fb_credit_add_exclusive(&ch->cr, index);
    pthread_mutex_unlock(&ch->conn->mu);
    return rc;
}

int fb_inchan_open(fb_inchan_t *ch)
{
    fb_conn_t *c = ch->conn;
    int rc = FB_OK;
    ch->exclusive->ops->set_recycle_hook(ch->exclusive, exclusive_hook, ch);
    pthread_mutex_lock(&c->mu);
    if (ch->state != CH_NEW)
        rc = FB_ESTATE;
    else if (c->state != CONN_OPEN)
        rc = FB_ECLOSED;
    else if (c->nfree_ins == 0 || c->next_receiver_id == FB_NET_ALL)
        rc = FB_EINVAL;
    if (rc == FB_OK) {
        ch->slot = c->free_ins[--c->nfree_ins];
        ch->receiver_id = c->next_receiver_id++;
        c->ins[ch->slot] = ch;
        idmap_put(&c->in_ids, ch->receiver_id, ch->slot);
        inchan_incref(ch);                   /* the connection's */
        ch->state = CH_REQUESTED;
        if (ctl_push(c, FB_MSG_PARTITION_REQUEST, ch->receiver_id, NULL, 0) != FB_OK)
            rc = FB_ENOMEM;                  /* the channel stays: close() cleans up */
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

fb_subpart_t *fb_inchan_queue(fb_inchan_t *ch)
{
    return &ch->queue;
}

void fb_inchan_close(fb_inchan_t *ch)
{
    fb_conn_t *c = ch->conn;
    fb_item_t *items = NULL;
    const int32_t *held;
    const uint8_t *floating;
    int32_t n, k, nheld;
    int registered = 0;
    pthread_mutex_lock(&c->mu);
    if (ch->state == CH_CLOSED) {
        pthread_mutex_unlock(&c->mu);
        return;
    }
    if ((ch->state == CH_REQUESTED || ch->state == CH_RETRY) && c->state == CONN_OPEN)
        ctl_push(c, FB_MSG_CANCEL, ch->receiver_id, NULL, 0);
    if (ch->state == CH_RETRY)
        c->num_retrying--;
    /* (control messages queued for it find no channel when written) */
    if (ch->slot >= 0 && c->ins[ch->slot] == ch) {
        idmap_del(&c->in_ids, ch->receiver_id);
        c->ins[ch->slot] = NULL;
        c->free_ins[c->nfree_ins++] = ch->slot;
        registered = 1;
    }
    ch->state = CH_CLOSED;
    while (c->recv_busy == ch) {
        /* The reader receives into one of our segments: have it let go now
         * (a stalled peer must not hold this close up). */
        uint64_t one = 1;
        __atomic_store_n(&c->recv_abort, 1, __ATOMIC_RELEASE);
        (void)!write(c->thread_wake_fd, &one, sizeof(one));
        (void)!write(c->direct_wake_fd, &one, sizeof(one));
        pthread_cond_wait(&c->cv, &c->mu);
    }
    fb_credit_release_all(&ch->cr, &held, &floating, &nheld);   /* closed: none held after */
    pthread_mutex_unlock(&c->mu);
    /* Everything the channel holds goes back now, in the closing thread,
     * while the pools certainly exist (no connection lock held: a floating
     * segment may be lent on to a channel of this connection). */
    ch->exclusive->ops->set_recycle_hook(ch->exclusive, NULL, NULL);
    if (ch->floating) {
        pthread_mutex_lock(&ch->floating->mu);
        fb_waitlist_remove(&ch->floating->wl, &ch->cr);
        pthread_mutex_unlock(&ch->floating->mu);
    }
    for (k = 0; k < nheld; k++) {
        fb_localpool_t *pool = floating[k] ? ch->floating->pool : ch->exclusive;
        pool->ops->recycle(pool, held[k]);
    }
    if (ch->nfailed_items > 0) {
        fb_items_dispose(ch->failed_items, ch->nfailed_items);
        ch->nfailed_items = 0;
        ch->failed_items = NULL;
    }
    n = fb_subpart_terminate(&ch->queue, FB_SP_RELEASED, &items);
    if (n > 0)
        fb_items_dispose(items, n);
    if (registered)
        fb_inchan_decref(ch);                /* the connection's */
}

static void inchan_hold(void *arg)
{
    inchan_incref(arg);
}

static void inchan_release(void *arg)
{
    fb_inchan_decref(arg);
}

int fb_inchan_attach_reader(fb_inchan_t *ch, fb_gate_t *g)
{
    fb_lender_t r = {direct_read, inchan_hold, inchan_release, ch};
    return fb_gate_set_reader(g, &r);
}

void fb_inchan_detach_reader(fb_inchan_t *ch, fb_gate_t *g)
{
    fb_gate_clear_reader(g, ch);
}

void fb_inchan_decref(fb_inchan_t *ch)
{
    if (__atomic_sub_fetch(&ch->refs, 1, __ATOMIC_ACQ_REL) != 0)
        return;
    fb_subpart_free(&ch->queue);
    fb_signal_free(&ch->on_poll);
    fb_floating_decref(ch->floating);
    fb_conn_decref(ch->conn);
    fb_credit_free(&ch->cr);
    free(ch);
}

void fb_inchan_event_taken(fb_inchan_t *ch)
{
    fb_conn_t *c = ch->conn;
    int wake = 0;
    pthread_mutex_lock(&c->mu);
    wake = credit_act(c, ch, fb_credit_event_taken(&ch->cr, credit_open(c, ch)),
                      FB_MSG_ADD_EVENT_CREDIT);
    pthread_mutex_unlock(&c->mu);
    if (wake)
        writer_kick(c, wake);
}

int fb_inchan_error(fb_inchan_t *ch, char *type, size_t tlen, char *message, size_t mlen)
{
    int code;
    pthread_mutex_lock(&ch->conn->mu);
    code = ch->state == CH_FAILED ? ch->err_code : 0;
    copy_text(type, tlen, ch->err_type, strlen(ch->err_type));
    copy_text(message, mlen, ch->err_msg, strlen(ch->err_msg));
    pthread_mutex_unlock(&ch->conn->mu);
    return code;
}

uint32_t fb_inchan_receiver_id(fb_inchan_t *ch)
{
    return ch->receiver_id;
}

void fb_inchan_stats(fb_inchan_t *ch, fb_inchan_stats_t *out)
{
    pthread_mutex_lock(&ch->conn->mu);
    fb_credit_counts(&ch->cr, &out->exclusive_available, &out->floating_available);
    out->exclusive_total = ch->cr.num_exclusive;
    out->backlog = ch->cr.backlog;
    out->buffers_in = ch->buffers_in;
    out->bytes_in = ch->bytes_in;
    pthread_mutex_unlock(&ch->conn->mu);
}
