/* What the units of a connection share: its state, its constants and the
 * functions one unit calls in another (connection.c: tables, control queue
 * and lifecycle; inchan.c: in-channels and their credit; reader.c: frames
 * in; direct.c: reads by a waiting thread; writer.c: frames out).  Private
 * to csrc/network: nothing outside includes it.  No Python API. */
#ifndef FLINKBUF_CONNECTION_INTERNAL_H
#define FLINKBUF_CONNECTION_INTERNAL_H

#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/uio.h>

#include "common/clock.h"
#include "network/connection.h"
#include "network/credit.h"
#include "network/lease.h"
#include "network/transport.h"
#include "network/wire.h"

#define RD_CAP 65536                /* the reader's staging buffer */
#define READ_AHEAD 2048             /* staged past what is needed: small frames share a recv,
                                       a buffer's body mostly lands straight in its segment */
#define CTL_CAP 65536               /* the writer's control-frame buffer */
#define RELEASE_BATCH 256           /* segments per RELEASE: one fits FB_NET_MAX_CONTROL_FRAME */
#define IDMAP_SIZE (2 * FB_NET_MAX_CHANNELS)
#define NO_ID 0xFFFFFFFFu
#define RETRY_FIRST_NS 50000000LL   /* not-found requests: 50 ms, doubling ... */
#define RETRY_MAX_NS 1000000000LL   /* ... up to 1 s */
#define RX_YIELD 2                  /* read_step: left to the reader thread */
/* Partition requests a peer may send: REQUEST_BURST at once (a gate of as
 * many channels as a connection carries), then REQUEST_RATE a second. */
#define REQUEST_RATE 10000
#define REQUEST_BURST FB_NET_MAX_CHANNELS
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
    int lends;                  /* its buffers are lent, not copied (lend.c) */
    fb_owner_ref_t *ref;        /* keeps owner (and pool) alive while a buffer is lent */
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
    int32_t kept_busy;          /* kept segments on their way back (lend.c) */
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
    int64_t rq_tat;              /* the budget of partition requests (reader.c) */
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
    /* Lending (lend.c).  Producer: buffers of lend_np go to the peer as
     * BUFFER_LENT, recorded in `lent` (under mu) until released, or until
     * the peer process (peer_pidfd) ended.  Consumer: the peer's arena
     * (lease), and the recycled segments the next RELEASE names. */
    const fb_netpool_t *lend_np;
    fb_lent_t lent;
    int peer_pidfd;
    fb_lease_t *lease;
    pthread_mutex_t rel_mu;      /* a leaf lock */
    uint32_t *rel;
    int32_t nrel;
};

static inline void stat_add(int64_t *counter, int64_t n)
{
    __atomic_add_fetch(counter, n, __ATOMIC_RELAXED);
}

static inline char *segment_of(fb_localpool_t *pool, int32_t index)
{
    return fb_segment_address(pool->net, index);
}

static inline void copy_text(char *dst, size_t cap, const char *src, size_t n)
{
    if (cap == 0)
        return;
    if (n >= cap)
        n = cap - 1;
    memcpy(dst, src, n);
    dst[n] = '\0';
}

static inline int holds_buffers(const fb_inchan_t *ch)
{
    return ch->state == CH_NEW || ch->state == CH_REQUESTED || ch->state == CH_RETRY;
}

/* A frame is half read (its rest is coming). */
static inline int mid_frame(const fb_conn_t *c)
{
    return c->rx_phase != RX_FRAME || c->rd_end > c->rd_pos;
}

#pragma GCC visibility push(hidden)

/* idmap (connection.c) */
void idmap_init(idmap_t *m);
int32_t idmap_get(const idmap_t *m, uint32_t id);
void idmap_put(idmap_t *m, uint32_t id, int32_t slot);
void idmap_del(idmap_t *m, uint32_t id);

/* connection.c */
void notify_writer(fb_conn_t *c, int32_t slot);
void writer_kick(fb_conn_t *c, int how);
void inchan_incref(fb_inchan_t *ch);
void ctl_free_list(ctl_t *m);
int ctl_push_quiet(fb_conn_t *c, uint8_t type, uint32_t receiver_id, const char *body,
                   uint32_t len, int quiet);
int ctl_push(fb_conn_t *c, uint8_t type, uint32_t receiver_id, const char *body,
             uint32_t len);
int ctl_error(fb_conn_t *c, uint32_t receiver_id, int code, const char *type,
              const char *msg);
void inchan_fail_locked(fb_conn_t *c, fb_inchan_t *ch, int code, const char *type,
                        const char *msg);
void outchan_free_slot(fb_conn_t *c, outchan_t *oc);
void outchan_end(fb_conn_t *c, outchan_t *oc, int release);
void close_socket(fb_conn_t *c);
int conn_end(fb_conn_t *c, int code, const char *msg);
void conn_fail(fb_conn_t *c, int code, const char *fmt, ...);
void conn_write_failed(fb_conn_t *c, int err);
int write_failed(fb_conn_t *c);
void conn_fail_peer_closed(fb_conn_t *c, int mid_frame);
void end_served_channels(fb_conn_t *c);
int32_t in_lookup(fb_conn_t *c, uint32_t id);
void conn_hold(void *arg);
void conn_release(void *arg);

/* lend.c */
int lend_locked(fb_conn_t *c, outchan_t *oc, const fb_item_t *item);

/* A consumer's thread reads the socket, or did a moment ago (the lend): what
 * it leaves for the writer (credit, releases) goes out with its next read. */
static inline int consumer_reads(fb_conn_t *c)
{
    return __atomic_load_n(&c->rd_owner, __ATOMIC_RELAXED) == RD_DIRECT
           || fb_monotonic_ns() < __atomic_load_n(&c->rd_lent_until, __ATOMIC_RELAXED);
}

/* Control frames wait to be written: messages, or releases (unlocked look). */
static inline int control_waits(fb_conn_t *c)
{
    return __atomic_load_n(&c->nctl, __ATOMIC_RELAXED) > 0
           || __atomic_load_n(&c->nrel, __ATOMIC_RELAXED) > 0;
}
char *put_releases_locked(fb_conn_t *c, char *p, char *end, int *more);
int read_lent(fb_conn_t *c, const fb_wire_frame_t *f);
int read_release(fb_conn_t *c, const fb_wire_frame_t *f);
void lending_detach(fb_conn_t *c);
void lending_end(fb_conn_t *c);

/* inchan.c */
void want_buffers(fb_inchan_t *ch, int32_t backlog);
/* A lent buffer of ch was recycled: a segment its credit kept aside goes
 * back, and with it the credit (no lock held). */
void inchan_return_kept(fb_inchan_t *ch);

/* reader.c */
int protocol_error(fb_conn_t *c, const char *fmt, ...);
fb_inchan_t *buffer_target(fb_conn_t *c, uint32_t id, uint32_t seq, uint8_t type,
                          uint32_t size, fb_item_t *item, int *rc);
void buffer_deliver(fb_conn_t *c, fb_inchan_t *ch, fb_item_t *item, int received,
                    int32_t backlog);
int read_step(fb_conn_t *c);
int wait_ms(const fb_conn_t *c, int64_t deadline, int64_t now);
int stalled(fb_conn_t *c, int64_t now);
int frame_staged(const fb_conn_t *c);
void rd_give_back(fb_conn_t *c);
int poll_input(fb_conn_t *c, int wake_fd, int ms);
void *reader_main(void *arg);

/* direct.c */
int direct_read(void *arg, void *g, int64_t deadline_ns);
int pool_wait(void *arg, void *lp, int64_t deadline_ns);

/* writer.c */
batch_t *batch_new(void);
int flush_pending(fb_conn_t *c, int send);
void conn_ready(void *arg);
void *writer_main(void *arg);

#pragma GCC visibility pop

#endif
